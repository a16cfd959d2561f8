//! Running spate's own binaries in test namespaces and reading what they print.

use std::collections::HashMap;
use std::time::Duration;

use crate::netns::Netns;
use crate::process::Proc;

/// A spate app running inside a namespace.
#[derive(Debug)]
pub struct SpateApp {
    /// The process guard.
    pub proc: Proc,
}

impl SpateApp {
    /// Starts `bin` (a path from `CARGO_BIN_EXE_*`) in `ns` and waits for
    /// its `ready` line.
    pub fn start(ns: &Netns, bin: &str, args: &[String], ready: &str) -> SpateApp {
        let mut proc = ns.spawn("app", bin, args, Duration::from_secs(600)).expect("start spate app");
        if !proc.wait_for_output(ready, Duration::from_secs(60)) {
            panic!("{bin} did not print {ready:?}; its output:\n{}", proc.output());
        }
        SpateApp { proc }
    }

    /// Stops it with SIGINT (it must exit 0 within 10 s) and returns its
    /// final counters.
    pub fn stop(mut self) -> (HashMap<String, u64>, String) {
        let status = self.proc.stop_with(libc::SIGINT, Duration::from_secs(10));
        let out = self.proc.output();
        assert!(status.is_some_and(|s| s.success()), "exit status {status:?}; output:\n{out}");
        (parse_counters(&out), out)
    }
}

/// Reads `Group: Name=value ...` lines (the final summary) into
/// `Group.Name -> value`; the last occurrence wins.
pub fn parse_counters(out: &str) -> HashMap<String, u64> {
    let mut map = HashMap::new();
    let tail = out.rsplit("spate: final counters").next().unwrap_or("");
    for line in tail.lines() {
        let Some((group, rest)) = line.split_once(": ") else {
            continue;
        };
        if group.contains(' ') {
            continue;
        }
        for word in rest.split_whitespace() {
            if let Some((k, v)) = word.split_once('=')
                && let Ok(v) = v.parse()
            {
                map.insert(format!("{group}.{k}"), v);
            }
        }
    }
    map
}

/// A counter of the port line in the final counters (`Port NAME: key=N`),
/// 0 when absent.
pub fn port_counter(out: &str, key: &str) -> u64 {
    let tail = out.rsplit("spate: final counters").next().unwrap_or("");
    tail.lines()
        .filter(|l| l.starts_with("Port "))
        .flat_map(|l| l.split_whitespace())
        .find_map(|w| w.strip_prefix(&format!("{key}="))?.parse().ok())
        .unwrap_or(0)
}

/// A counter from a parsed summary (0 when absent: zero counters are not printed).
pub fn counter(map: &HashMap<String, u64>, name: &str) -> u64 {
    map.get(name).copied().unwrap_or(0)
}

/// What `spate-relay` did to one direction's frames (its final line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayLeg {
    /// UDP frames dropped on purpose.
    pub dropped: u64,
    /// UDP frames seen (forwarded or dropped).
    pub udp: u64,
    /// UDP frames sent at once, overtaking delayed ones.
    pub reordered: u64,
    /// Frames its ingress capture lost before it saw them.
    pub missed: u64,
}

/// Stops `spate-relay` with SIGINT (it must exit 0) and reads its final
/// counts: `(a->b, b->a)`.
pub fn stop_relay(p: &mut Proc) -> (RelayLeg, RelayLeg) {
    let status = p.stop_with(libc::SIGINT, Duration::from_secs(10));
    let out = p.output();
    assert!(status.is_some_and(|s| s.success()), "relay exit {status:?}: {out}");
    let line = out.lines().find(|l| l.contains("a->b forwarded=")).unwrap_or_else(|| panic!("no counts: {out}"));
    println!("relay: {line}");
    let field = |part: &str, key: &str| -> u64 {
        part.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{key}=")))
            .and_then(|v| v.trim_end_matches(';').parse().ok())
            .unwrap_or_else(|| panic!("{key} in {line}"))
    };
    let leg = |part: &str| RelayLeg {
        dropped: field(part, "dropped"),
        udp: field(part, "udp"),
        reordered: field(part, "reordered"),
        missed: field(part, "missed"),
    };
    let (ab, ba) = line.split_once("b->a").unwrap_or_else(|| panic!("no b->a in {line}"));
    (leg(ab), leg(ba))
}

/// The frames of a capture file (pcap or pcapng) as `tcpdump -r -xx -tt`
/// prints them: each with its time in seconds.
pub fn capture_frames(file: &std::path::Path) -> Vec<(f64, Vec<u8>)> {
    let out = std::process::Command::new("tcpdump")
        .args(["-r", &file.display().to_string(), "-nn", "-xx", "-tt"])
        .output()
        .expect("tcpdump");
    assert!(out.status.success(), "tcpdump -r {}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
    let mut all: Vec<(f64, Vec<u8>)> = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some((_, hex)) = line.trim_start().strip_prefix("0x").and_then(|l| l.split_once(':')) {
            let bytes = hex
                .split_whitespace()
                .flat_map(|w| (0..w.len()).step_by(2).map(move |i| u8::from_str_radix(&w[i..i + 2], 16).expect("hex")));
            all.last_mut().expect("a frame's header line first").1.extend(bytes);
        } else if !line.starts_with(char::is_whitespace) {
            let t: f64 = line.split(' ').next().and_then(|t| t.parse().ok()).expect("a time first");
            all.push((t, Vec::new()));
        }
    }
    all
}

/// Starts `spate-dump` (`bin`) writing `file` (removed with the process)
/// with `args`, and waits until its capture is attached.
pub fn start_dump(bin: &str, file: &std::path::Path, args: &[&str]) -> crate::process::Proc {
    let mut all: Vec<String> = vec!["-w".into(), file.display().to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    let log = std::path::PathBuf::from(format!("/tmp/{}.log", crate::names::unique("spate-dump-")));
    let mut p =
        crate::process::Proc::spawn("spate-dump", bin, &all, &log, Duration::from_secs(120)).expect("spate-dump");
    p.remove_on_drop(file);
    p
}

/// `n` datagrams of `len` bytes from a kernel socket on 198.18.0.1 to an
/// echo at 198.18.0.2:7, each after `gap` of quiet (an adaptive lcore is
/// asleep by then): each must come back equal. Run it on a thread of the
/// client's namespace.
pub fn echo_after_gaps(n: u8, len: usize, gap: Duration) {
    let s = std::net::UdpSocket::bind("198.18.0.1:0").expect("client socket");
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = vec![0u8; len + 1];
    for i in 0..n {
        std::thread::sleep(gap);
        s.send_to(&vec![i; len], "198.18.0.2:7").unwrap();
        let (got, _) = s.recv_from(&mut buf).unwrap_or_else(|e| panic!("datagram {i} after an idle gap: {e}"));
        assert_eq!(&buf[..got], &vec![i; len][..], "datagram {i} came back different");
    }
}

//! Sharing a NIC with the kernel, side by side in one run: delivered
//! datagrams per CPU-second on a veth, spate on `net_af_xdp` (its own XDP
//! program) against spate on `net_af_packet` against the kernel's own
//! socket.
//!
//! `dpdk-testpmd txonly` in a peer namespace, its forwarding core on CPU 1,
//! sends 64-byte frames (UDP to 198.18.0.2:9) through `net_af_packet` on
//! `vB`; the receiver reads them on `vA` in its own namespace, on CPU 0:
//! `spate-sink` (adaptive polling, the lcore reading run-to-completion)
//! on each PMD, and `benches/c/plain_sink.c` (`recvmmsg`, 32 per call) on
//! the kernel's socket with the address on `vA`. spate's lcore sleeps as
//! soon as it finds nothing (`--poll-idle-us 0`): at the rate one CPU of
//! this guest sends, an lcore polling 50 us idle never sleeps, and its CPU
//! would say nothing of the work. `net_af_xdp` runs twice: as spate sets
//! it up on a veth (copy mode: `busy_budget=0`) and with the PMD's default
//! `busy_budget=64` (each empty receive asks the kernel to busy-poll the
//! device: a system call). Over each window (the
//! source sending for `--seconds`, then a moment to drain), the datagrams
//! the receiver got (spate's `UdpInDatagrams`, the namespace's
//! `/proc/net/snmp`) over the CPU it took: every thread of the receiving
//! process (`/proc/PID/task/*/schedstat`) plus every CPU's softirq time
//! (`/proc/stat`), where the kernel's side of all three runs (the veth's
//! receive, the XDP program and its copy to the XDP socket, the packet
//! socket's ring, the UDP socket). The source's own CPU is not counted.
//! The sides take turns for `--rounds` (3); the medians and ratios, with
//! the CPU model.
//!
//! `cargo bench --bench af_xdp -- [--quick] [--rounds N] [--seconds S]`

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use spate_apps::quic::threads_cpu_seconds;
use spate_testkit::stats::median_and_spread;
use spate_testkit::testpmd::{SPATE_MAC, TestPmd, TestPmdBuilder, txonly_args};
use spate_testkit::{Netns, Proc, cpu_model, kernel_peer, unique, veth};

const SINK: &str = env!("CARGO_BIN_EXE_spate-sink");

/// A receiver: spate-sink on a device, or the kernel's socket.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Side {
    Spate(&'static str, &'static str),
    Kernel,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Spate(name, _) => name,
            Side::Kernel => "kernel socket (recvmmsg)",
        }
    }
}

const SIDES: [Side; 4] = [
    Side::Spate("spate on net_af_xdp", "net_af_xdp0,iface=vA"),
    Side::Spate("spate on net_af_xdp, busy_budget=64", "net_af_xdp0,iface=vA,busy_budget=64"),
    Side::Spate("spate on net_af_packet", "net_af_packet0,iface=vA"),
    Side::Kernel,
];

/// One window: datagrams received, CPU seconds (receiver + softirq), of
/// which softirq, and the wall seconds the source sent.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    datagrams: f64,
    cpu: f64,
    softirq: f64,
    sent: f64,
    secs: f64,
}

/// Every CPU's softirq time, in seconds (`/proc/stat`'s 7th column).
fn softirq_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: f64 =
        stat.lines().next().and_then(|l| l.split_whitespace().nth(7)).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

/// The process a guard's `pid` ends up running: its launchers (`timeout`,
/// `ip netns exec`, `setpriv`) exec or fork into it, so the last of the
/// line of first children.
fn leaf(pid: u32) -> u32 {
    let mut p = pid;
    for _ in 0..8 {
        let children = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        match children.split_whitespace().next().and_then(|c| c.parse().ok()) {
            Some(c) => p = c,
            None => break,
        }
    }
    p
}

/// `benches/c/plain_sink.c` built with plain gcc.
fn plain_sink() -> PathBuf {
    let bin = std::env::temp_dir().join(format!("spate-afxdp-plain-sink-{}", std::process::id()));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/c/plain_sink.c");
    let o = Command::new("/usr/bin/gcc").args(["-O2", "-Wall", "-o"]).arg(&bin).arg(&src).output().expect("gcc");
    assert!(o.status.success(), "gcc plain_sink.c: {}", String::from_utf8_lossy(&o.stderr));
    bin
}

/// The source: testpmd txonly on `net_af_packet` over `vB`, interactive.
fn source(peer: &Netns) -> TestPmd {
    let mut pmd = TestPmdBuilder::new("0,1", 0)
        .in_netns(peer)
        .vdev("net_af_packet0,iface=vB")
        .interactive()
        .args(txonly_args(64))
        .args(["--total-num-mbufs=8192"])
        .limit(Duration::from_secs(1800))
        .spawn("afxdp-src")
        .expect("testpmd on net_af_packet");
    pmd.wait_prompt(Duration::from_secs(60)).expect("the source's prompt");
    pmd
}

/// `UdpInDatagrams` of the spate stack named `name`.
fn spate_delivered(name: &str) -> f64 {
    let mut s = UnixStream::connect(format!("/run/spate/{name}.sock")).expect("the control endpoint");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"{\"op\": \"snapshot\"}\n").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    let at = line.find("\"UdpInDatagrams\":").expect("the counter") + "\"UdpInDatagrams\":".len();
    line[at..].split(|c: char| !c.is_ascii_digit()).find(|s| !s.is_empty()).unwrap().parse().unwrap()
}

/// One window of `side`: the receiver started, the source sending for
/// `secs`, the receiver's count and CPU before and after.
fn round(side: Side, spate: &Netns, src: &mut TestPmd, sink_bin: &Path, secs: u64) -> Window {
    let name = unique("afxdp-");
    let (mut rx, count): (Proc, Box<dyn Fn() -> f64>) = match side {
        Side::Spate(_, dev) => {
            let args: Vec<String> = [
                "--vdev",
                dev,
                "--ip",
                "198.18.0.2/24",
                "--lcores",
                "0",
                "--poll",
                "adaptive",
                "--poll-idle-us",
                "0",
                "--interval",
                "0",
                "--name",
                &name,
            ]
            .map(String::from)
            .to_vec();
            let mut p = spate.spawn("sink", SINK, &args, Duration::from_secs(600)).expect("spate-sink");
            assert!(p.wait_for_output("spate-sink: port 9", Duration::from_secs(60)), "{}", p.output());
            let n = name.clone();
            (p, Box::new(move || spate_delivered(&n)))
        }
        Side::Kernel => {
            let args = ["-c".to_string(), "0".into(), sink_bin.display().to_string(), "1000000000000".into()];
            let mut p = spate.spawn("plain-sink", "/usr/bin/taskset", &args, Duration::from_secs(600)).unwrap();
            assert!(p.wait_for_output("READY", Duration::from_secs(30)), "{}", p.output());
            let ns = spate.name().to_string();
            (p, Box::new(move || spate_testkit::kernel_udp_counters(&ns)["InDatagrams"] as f64))
        }
    };
    std::thread::sleep(Duration::from_millis(500));
    let pid = leaf(rx.pid());
    let (d0, c0, s0) = (count(), threads_cpu_seconds(Some(pid)), softirq_seconds());
    src.command("start", "packet forwarding - ports=").expect("start the source");
    let t = std::time::Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let out = src.command("stop", "Done.").expect("stop the source");
    let wall = t.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(300));
    let (d1, c1, s1) = (count(), threads_cpu_seconds(Some(pid)), softirq_seconds());
    rx.stop();
    let sent = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("TX-packets:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    Window { datagrams: d1 - d0, cpu: (c1 - c0) + (s1 - s0), softirq: s1 - s0, sent, secs: wall }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let opt = |k: &str| args.iter().position(|a| a == k).and_then(|i| args.get(i + 1)?.parse::<u64>().ok());
    let rounds = opt("--rounds").unwrap_or(if quick { 1 } else { 3 });
    let secs = opt("--seconds").unwrap_or(if quick { 2 } else { 4 });

    let spate = Netns::new("afxdp");
    let peer = Netns::new("afxdp-peer");
    veth(&spate, "vA", &peer, "vB");
    spate.must(&["ip", "link", "set", "vA", "address", SPATE_MAC]);
    kernel_peer(&peer, "vB");
    let sink_bin = plain_sink();
    let mut src = source(&peer);

    let sides = SIDES;
    let mut got: Vec<Vec<Window>> = vec![Vec::new(); sides.len()];
    for r in 0..rounds {
        for (i, side) in sides.iter().enumerate() {
            // The kernel's side holds the address on vA; spate's do not.
            if *side == Side::Kernel {
                spate.must(&["ip", "addr", "add", "198.18.0.2/24", "dev", "vA"]);
            }
            let w = round(*side, &spate, &mut src, &sink_bin, secs);
            if *side == Side::Kernel {
                spate.must(&["ip", "addr", "del", "198.18.0.2/24", "dev", "vA"]);
            }
            eprintln!(
                "round {}: {}: {:.0} datagrams of {:.0} sent in {:.1} s, {:.2} CPU-s ({:.2} softirq)",
                r + 1,
                side.name(),
                w.datagrams,
                w.sent,
                w.secs,
                w.cpu,
                w.softirq
            );
            got[i].push(w);
        }
    }
    drop(src);
    let _ = std::fs::remove_file(&sink_bin);

    println!("CPU: {} ({} CPUs)", cpu_model(), std::thread::available_parallelism().map_or(0, |n| n.get()));
    println!(
        "64-byte datagrams from dpdk-testpmd txonly (net_af_packet on a veth, CPU 1) to a receiver on CPU 0; \
         CPU = the receiving process + every CPU's softirq; median of {rounds} round(s) of {secs} s (min-max)"
    );
    println!(
        "| receiver | delivered /s | of sent | CPU-s per s (softirq) | datagrams per CPU-second | vs net_af_packet |"
    );
    println!("|---|---|---|---|---|---|");
    let per_cpu = |w: &Window| w.datagrams / w.cpu.max(1e-9);
    let packet = median_and_spread(&got[2].iter().map(per_cpu).collect::<Vec<_>>()).0;
    for (i, side) in sides.iter().enumerate() {
        let v: Vec<f64> = got[i].iter().map(per_cpu).collect();
        let (m, lo, hi) = median_and_spread(&v);
        let rate = median_and_spread(&got[i].iter().map(|w| w.datagrams / w.secs).collect::<Vec<_>>()).0;
        let share = median_and_spread(&got[i].iter().map(|w| w.datagrams / w.sent.max(1.0)).collect::<Vec<_>>()).0;
        let cpu = median_and_spread(&got[i].iter().map(|w| w.cpu / w.secs).collect::<Vec<_>>()).0;
        let soft = median_and_spread(&got[i].iter().map(|w| w.softirq / w.secs).collect::<Vec<_>>()).0;
        println!(
            "| {} | {:.0} | {:.0}% | {:.2} ({:.2}) | {:.0} ({:.0}-{:.0}) | {:.2}x |",
            side.name(),
            rate,
            share * 100.0,
            cpu,
            soft,
            m,
            lo,
            hi,
            m / packet
        );
    }
}

//! `spate-dump` capturing from a running `spate-echo` (on
//! `net_af_packet`, echoing a kernel peer in its namespace): `tcpdump -r`
//! and `tshark` read its pcapng file, and its frames are, byte for byte,
//! the ones `tcpdump` captured on the kernel's side of the link, with
//! their direction, interface and nanosecond timestamps; a capture whose
//! client is killed detaches (the stack's snapshot says so, and a new one
//! attaches); one capture at a time; a user other than root is refused;
//! a capture's duration holds under a flood.

use std::path::Path;
use std::time::{Duration, Instant};

use spate::control::{self, Client};
use spate_testkit::{Proc, SpateApp, capture_frames, device_lock, spate_and_kernel, start_dump, unique};

const ECHO: &str = env!("CARGO_BIN_EXE_spate-echo");
const DUMP: &str = env!("CARGO_BIN_EXE_spate-dump");

/// The stack's attached capture, as its snapshot says.
fn attached(endpoint: &Path) -> Option<u64> {
    let s = Client::connect(endpoint).unwrap().snapshot().unwrap();
    s.capture.map(|c| c.captured)
}

fn dump(args: &[&str], file: &Path) -> Proc {
    start_dump(DUMP, file, args)
}

#[test]
fn spate_dump_writes_what_the_kernel_sent_and_received() {
    let _serial = device_lock();
    let (spate_ns, kernel) = spate_and_kernel("dump");
    let name = unique("dump-");
    let args: Vec<String> =
        ["--vdev", "net_af_packet0,iface=vA", "--ip", "198.18.0.2/24", "--ip6", "fd00::2/64", "--lcores", "0"]
            .into_iter()
            .chain(["--interval", "0", "--name", &name])
            .map(String::from)
            .collect();
    let echo = SpateApp::start(&spate_ns, ECHO, &args, "UDP echo on");
    let endpoint = control::find(Path::new("/run/spate"), None, Some(&name)).unwrap();
    // Neighbours first, so that the captures hold only the datagrams.
    kernel.must(&["ping", "-c", "1", "-W", "5", "198.18.0.2"]);
    kernel.must(&["ping", "-c", "1", "-W", "5", "fd00::2"]);

    // The kernel's view: tcpdump on its end of the link.
    // Requests and replies over both families.
    const N: u32 = 40;
    let count = (2 * N).to_string();
    let kfile = std::env::temp_dir().join(format!("{}.pcap", unique("spate-dump-kernel-")));
    let mut ktcpdump = kernel
        .spawn(
            "tcpdump",
            "tcpdump",
            &["-i", "vB", "-U", "--immediate-mode", "-c", &count, "-w", kfile.to_str().unwrap(), "udp port 7"]
                .map(String::from),
            Duration::from_secs(120),
        )
        .unwrap();
    ktcpdump.remove_on_drop(&kfile);
    assert!(ktcpdump.wait_for_output("listening on vB", Duration::from_secs(10)), "{}", ktcpdump.output());

    // spate's view: every frame of the echo service (requests and
    // replies), over both families.
    let sfile = std::env::temp_dir().join(format!("{}.pcapng", unique("spate-dump-")));
    let mut sdump = dump(&["--name", &name, "-c", &count, "udp", "port", "7"], &sfile);
    assert!(sdump.wait_for_output("capturing from", Duration::from_secs(10)), "{}", sdump.output());
    assert_eq!(attached(&endpoint), Some(0), "attached, nothing copied yet");

    let echoed = kernel.run(|| {
        let mut back = 0;
        for (bind, to) in [("198.18.0.1:0", "198.18.0.2:7"), ("[fd00::1]:0", "[fd00::2]:7")] {
            let s = std::net::UdpSocket::bind(bind).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
            let mut buf = [0u8; 2048];
            for i in 0..N / 2 {
                // Sizes from 1 byte to a full frame.
                let len = 1 + (i as usize * 97) % 1400;
                let payload: Vec<u8> = (0..len).map(|k| (k as u32 ^ i) as u8).collect();
                s.send_to(&payload, to).unwrap();
                if s.recv_from(&mut buf).is_ok_and(|(n, _)| buf[..n] == payload[..]) {
                    back += 1;
                }
            }
        }
        back
    });
    assert_eq!(echoed, N, "echoed");
    assert!(sdump.wait_exit(Duration::from_secs(20)), "spate-dump did not stop after -c:\n{}", sdump.output());
    assert!(sdump.exited() && sdump.output().contains(&format!("{} frames written", 2 * N)), "{}", sdump.output());
    // tcpdump stops by itself after as many frames (-c), however long a
    // loaded machine keeps it from reading them (a fixed wait lost frames).
    assert!(ktcpdump.wait_exit(Duration::from_secs(20)), "tcpdump did not stop after -c:\n{}", ktcpdump.output());

    let (spate, kernel_frames) = (capture_frames(&sfile), capture_frames(&kfile));
    assert_eq!(spate.len(), 2 * N as usize, "{}", sdump.output());
    let mut a: Vec<&Vec<u8>> = spate.iter().map(|(_, f)| f).collect();
    let mut b: Vec<&Vec<u8>> = kernel_frames.iter().map(|(_, f)| f).collect();
    a.sort();
    b.sort();
    if a != b {
        let only_spate: Vec<&&Vec<u8>> = a.iter().filter(|f| !b.contains(f)).collect();
        let only_kernel: Vec<&&Vec<u8>> = b.iter().filter(|f| !a.contains(f)).collect();
        panic!(
            "spate-dump's {} frames differ from the kernel's {}: only spate-dump's {:02x?}, only the kernel's {:02x?}",
            a.len(),
            b.len(),
            only_spate.iter().map(|f| &f[..f.len().min(64)]).collect::<Vec<_>>(),
            only_kernel.iter().map(|f| &f[..f.len().min(64)]).collect::<Vec<_>>()
        );
    }
    // Each frame within 50 ms of the kernel's time for it, in nanoseconds
    // (read as microseconds, they would be 1,000 times off).
    for (t, f) in &spate {
        let (kt, _) = kernel_frames.iter().find(|(_, k)| k == f).unwrap();
        assert!((t - kt).abs() < 0.05, "spate {t} kernel {kt}");
    }

    // tshark: direction, interface, resolution.
    let out = std::process::Command::new("/usr/bin/tshark")
        .args(["-r", sfile.to_str().unwrap(), "-T", "fields", "-E", "separator=,"])
        .args(["-e", "frame.interface_name", "-e", "frame.packet_flags_direction", "-e", "udp.dstport"])
        .args(["-e", "frame.time_epoch"])
        .output()
        .expect("tshark");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    let (mut inbound, mut outbound) = (0, 0);
    for line in text.lines() {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(f[0], "net_af_packet0", "{line}");
        // pcapng's flags: 1 inbound, 2 outbound (tshark prints them in hex).
        let direction = u32::from_str_radix(f[1].trim_start_matches("0x"), 16).unwrap();
        match (direction, f[2]) {
            (1, "7") => inbound += 1,
            (2, p) if p != "7" => outbound += 1,
            _ => panic!("direction and port disagree: {line}"),
        }
        // Nine decimals: nanoseconds.
        assert_eq!(f[3].split_once('.').map(|(_, d)| d.len()), Some(9), "{line}");
    }
    assert_eq!((inbound, outbound), (N, N), "{text}");

    // A capture whose client is killed detaches; then another attaches.
    let file2 = std::env::temp_dir().join(format!("{}.pcapng", unique("spate-dump-killed-")));
    let mut killed = dump(&["--name", &name], &file2);
    assert!(killed.wait_for_output("capturing from", Duration::from_secs(10)), "{}", killed.output());
    assert!(attached(&endpoint).is_some());
    // One at a time.
    let file3 = std::env::temp_dir().join(format!("{}.pcapng", unique("spate-dump-busy-")));
    let mut busy = dump(&["--name", &name], &file3);
    assert!(busy.wait_exit(Duration::from_secs(10)));
    assert!(busy.output().contains("attached already"), "{}", busy.output());
    kernel.must(&["ping", "-c", "3", "-i", "0.2", "198.18.0.2"]);
    let copied = attached(&endpoint).unwrap();
    assert!(copied >= 6, "pings and replies copied: {copied}");
    killed.stop_with(libc::SIGKILL, Duration::from_secs(5));
    let until = Instant::now() + Duration::from_secs(10);
    while attached(&endpoint).is_some() {
        assert!(Instant::now() < until, "the capture stayed attached after its client was killed");
        kernel.must(&["ping", "-c", "1", "-W", "1", "198.18.0.2"]);
    }
    let file4 = std::env::temp_dir().join(format!("{}.pcapng", unique("spate-dump-again-")));
    let mut again = dump(&["--name", &name, "-c", "2", "icmp"], &file4);
    assert!(again.wait_for_output("capturing from", Duration::from_secs(10)), "{}", again.output());
    kernel.must(&["ping", "-c", "1", "-W", "5", "198.18.0.2"]);
    assert!(again.wait_exit(Duration::from_secs(10)), "{}", again.output());
    assert_eq!(capture_frames(&file4).len(), 2);

    // A user who is not root is refused by the socket's mode; a bad
    // filter is refused before anything attaches.
    let refused = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "timeout", "20", DUMP, "--name", &name])
        .args(["-w", "/dev/null"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && text.contains("Permission denied"), "{text}");
    let bad = std::process::Command::new(DUMP)
        .args(["--name", &name, "-w", "/dev/null", "udp", "port", "x"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && text.contains("filter"), "{text}");
    assert_eq!(attached(&endpoint), None);

    // Under a flood, --duration still ends the capture on time (the
    // stack looks for the client's word while records keep coming).
    let file5 = std::env::temp_dir().join(format!("{}.pcapng", unique("spate-dump-flood-")));
    let flood = kernel.thread(|| {
        let s = std::net::UdpSocket::bind("198.18.0.1:0").unwrap();
        let until = Instant::now() + Duration::from_secs(6);
        let mut sent = 0u64;
        while Instant::now() < until {
            for _ in 0..64 {
                let _ = s.send_to(&[0u8; 18], "198.18.0.2:9");
            }
            sent += 64;
        }
        sent
    });
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let mut timed = dump(&["--name", &name, "--duration", "1", "-s", "64"], &file5);
    assert!(timed.wait_exit(Duration::from_secs(4)), "--duration 1 under a flood:\n{}", timed.output());
    let took = started.elapsed();
    assert!(timed.output().contains("frames written"), "{}", timed.output());
    let sent = flood.join().unwrap();
    assert!(took < Duration::from_secs(4) && sent > 10_000, "{took:?}, {sent} sent");

    let (counters, out) = echo.stop();
    assert_eq!(counters.get("Udp.InDatagrams"), Some(&(N as u64 / 2)), "{out}");
}

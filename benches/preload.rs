//! An unmodified C program under spate-run against the same binary on the
//! kernel's sockets, side by side in one run.
//!
//! - Datagrams per CPU-second: `benches/c/plain_sink.c` (socket, bind,
//!   `recvmmsg`, 32 per call, every payload byte read) takes 64-byte
//!   datagrams from `dpdk-testpmd txonly`. The CPU counted is the whole
//!   sink process's (`getrusage`: under libspate-preload its reading
//!   thread and spate's lcore) plus every CPU's softirq time
//!   (`/proc/stat`), on both sides. Under libspate-preload the source is
//!   a vhost-user pair into `net_virtio_user`. On the kernel the sink is
//!   pinned to CPU 1, away from testpmd's forwarding core on CPU 0 and
//!   the NET_RX that runs there, and the source is fed two ways:
//!   - through a veth (testpmd on `net_af_packet` at the far end), whose
//!     frames the kernel takes in its NET_RX softirq as it would a NIC's:
//!     the count the target is measured against;
//!   - through a TAP device, whose writes run the kernel's receive path
//!     in the writer's context, not in softirq: counted without it (which
//!     favours the kernel) and with the writer's whole system time (its
//!     copy too, which favours spate).
//!
//!   Each feed runs 3 times, taking turns; the medians, datagrams per
//!   call, what the kernel's socket dropped, the share of NET_RX that ran
//!   on its sink's CPU, and the ratios (target: at least 5x).
//! - Latency: `benches/c/plain_echo.c`, a blocking `recvfrom`/`sendto`
//!   echo, pinned to CPU 0, on a veth: under spate-run (net_pcap on the
//!   veth, adaptive polling on lcore 1) and on the kernel's socket (the
//!   veth end holding spate's address). The kernel peer in the other
//!   namespace, pinned to CPU 1, sends one 64-byte datagram at a time and
//!   times each round trip: p50, p99 and p99.9 of each run, 3 runs each
//!   taking turns, the medians (target: spate's p99.9 no worse than the
//!   kernel's). Then the echo under spate-run idles for 3 s: its CPU
//!   share (target: under 1%).
//!
//! `cargo bench --bench preload -- [--quick]` (an install of libspate at
//! `target/c-api-release`, `cargo xtask install --prefix
//! target/c-api-release`, or `SPATE_C_PREFIX`).

use spate_testkit::stats::median;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use spate_testkit::testpmd::{SPATE_MAC, txonly_source, txonly_tap_source, txonly_veth_source};
use spate_testkit::{Netns, Proc, pin_to_cpu, spate_and_kernel, unique_socket_path};

/// The release install the preload comes from.
fn prefix() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let p = std::env::var_os("SPATE_C_PREFIX").map(PathBuf::from).unwrap_or_else(|| root.join("target/c-api-release"));
    assert!(
        p.join("lib/libspate-preload.so").exists(),
        "no release install at {}: cargo xtask install --prefix target/c-api-release",
        p.display()
    );
    p
}

/// `benches/c/NAME.c` built with plain gcc.
fn build(name: &str) -> PathBuf {
    let bin = std::env::temp_dir().join(format!("spate-{name}-{}", std::process::id()));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../benches/c/{name}.c"));
    let o = Command::new("/usr/bin/gcc").args(["-O2", "-g", "-Wall", "-o"]).arg(&bin).arg(&src).output().expect("gcc");
    assert!(o.status.success(), "gcc {name}.c: {}", String::from_utf8_lossy(&o.stderr));
    bin
}

/// A field `key=V` of the sink's result line.
fn field(out: &str, key: &str) -> f64 {
    let line = out.lines().find(|l| l.starts_with("sink datagrams=")).unwrap_or_else(|| panic!("no result: {out}"));
    line.split_whitespace().find_map(|w| w.strip_prefix(key)).and_then(|v| v.parse().ok()).unwrap()
}

/// One sink run.
struct Round {
    datagrams: f64,
    /// The CPU counted, in ns: the sink process's (every thread) plus
    /// every CPU's softirq time, on both sides.
    cpu_ns: f64,
    /// For the kernel: the source's system time in the sink's window (its
    /// TAP writes, inside which the kernel's receive path runs), in ns.
    source_sys_ns: f64,
    wall_ns: f64,
    /// Datagrams the kernel dropped at the socket over the whole run
    /// (none for spate, whose drops this run does not read).
    dropped: Option<u64>,
    /// The sink's `recvmmsg` calls.
    calls: f64,
    /// For the kernel: the share of the machine's NET_RX softirqs in the
    /// sink's window that ran on the sink's CPU (where their ticks would
    /// also count as the sink's own time).
    net_rx_on_sink: Option<f64>,
}

impl Round {
    fn per_cpu_second(&self, with_source_sys: bool) -> f64 {
        self.datagrams / ((self.cpu_ns + if with_source_sys { self.source_sys_ns } else { 0.0 }) / 1e9)
    }
}

/// The system time of the `dpdk-testpmd` processes in namespace `ns`, in
/// seconds.
fn testpmd_sys(ns: &Netns) -> f64 {
    let pids = Command::new("ip").args(["netns", "pids", ns.name()]).output().expect("ip netns pids");
    String::from_utf8_lossy(&pids.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .filter(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "dpdk-testpmd"))
        .map(|p| process_times(p).1)
        .sum()
}

/// Where a sink run's datagrams come from, and so whose CPU counts.
#[derive(Clone, Copy, PartialEq)]
enum Feed {
    /// The preload over a vhost-user pair from testpmd: the sink process
    /// (reader and lcore) and softirq.
    Spate,
    /// Kernel sockets behind a TAP device testpmd writes: the sink process
    /// and softirq; the receive path runs in the writes (reported apart).
    Tap,
    /// Kernel sockets behind a veth whose other end testpmd sends on
    /// through `net_af_packet`: the sink process and softirq, in which the
    /// receive path runs, as it does from a NIC.
    Veth,
}

/// The NET_RX softirqs each CPU ran so far (`/proc/softirqs`).
fn net_rx_per_cpu() -> Vec<u64> {
    let text = std::fs::read_to_string("/proc/softirqs").unwrap_or_default();
    let line = text.lines().find(|l| l.trim_start().starts_with("NET_RX:")).unwrap_or_default();
    line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect()
}

/// The CPU the kernel's sink is pinned to: not testpmd's forwarding core
/// (CPU 0), where the veth's NET_RX runs, so that no softirq tick lands in
/// the sink's own time and is counted twice (getrusage and `/proc/stat`).
const KERNEL_SINK_CPU: usize = 1;

/// One sink run.
fn sink_round(feed: Feed, sink: &Path, n: u64) -> Round {
    let mut source_sys = 0.0;
    let mut dropped = None;
    let mut net_rx_on_sink = None;
    let out = if feed == Feed::Spate {
        let sock = unique_socket_path("spate-preload-bench");
        let mut source = txonly_source(&sock, 64, Duration::from_secs(120), false);
        let args = format!(
            "--vdev net_virtio_user0,path={},queues=1,queue_size=1024,mac={SPATE_MAC} --lcores 1 --poll adaptive --ip 198.18.0.2/24 \
             --mbufs 16383",
            sock.display()
        );
        let o = Command::new(sink)
            .arg(n.to_string())
            .env("LD_PRELOAD", prefix().join("lib/libspate-preload.so"))
            .env("SPATE_ARGS", args)
            .output()
            .expect("the sink");
        source.finish();
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(o.status.success(), "sink under the preload: {text}{}", String::from_utf8_lossy(&o.stderr));
        text
    } else {
        // The sink's namespace holds spate's MAC and address on `spt0` (a
        // TAP device) or `vA` (a veth end, the source's namespace kept
        // until the run's end).
        let (ns, mut source, _peer) = if feed == Feed::Tap {
            let ns = Netns::new("pl-bench-tap");
            let source = txonly_tap_source(&ns, "spt0", 64, Duration::from_secs(120));
            ns.must(&["ip", "link", "set", "spt0", "address", SPATE_MAC]);
            ns.must(&["ip", "addr", "add", "198.18.0.2/24", "dev", "spt0"]);
            ns.must(&["ip", "link", "set", "spt0", "up"]);
            (ns, source, None)
        } else {
            let (ns, peer) = spate_and_kernel("pl-bench-veth");
            ns.must(&["ip", "addr", "add", "198.18.0.2/24", "dev", "vA"]);
            let source = txonly_veth_source(&peer, "vB", 64, Duration::from_secs(120));
            (ns, source, Some(peer))
        };
        // testpmd's system time holds the kernel's receive path only when
        // it writes a TAP device in the sink's namespace.
        let source_sys_now = || if feed == Feed::Tap { testpmd_sys(&ns) } else { 0.0 };
        let (s0, e0, r0, t0) = (source_sys_now(), ns.udp_counter("InErrors"), net_rx_per_cpu(), Instant::now());
        let cpu = KERNEL_SINK_CPU.to_string();
        let o = Command::new("timeout")
            .args(["120", "ip", "netns", "exec", ns.name(), "/usr/bin/taskset", "-c", &cpu])
            .arg(sink)
            .arg(n.to_string())
            .output()
            .expect("the sink");
        let (s1, e1, r1, secs) =
            (source_sys_now(), ns.udp_counter("InErrors"), net_rx_per_cpu(), t0.elapsed().as_secs_f64());
        let ran: Vec<u64> = r1.iter().zip(&r0).map(|(b, a)| b.saturating_sub(*a)).collect();
        let all = ran.iter().sum::<u64>().max(1);
        net_rx_on_sink = Some(ran.get(KERNEL_SINK_CPU).copied().unwrap_or(0) as f64 / all as f64);
        source.finish();
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(o.status.success(), "sink on the kernel: {text}{}", String::from_utf8_lossy(&o.stderr));
        // The source's system time over the sink's run, scaled to its
        // window (first datagram to last).
        source_sys = (s1 - s0) * 1e9 * (field(&text, "wall_ns=") / 1e9 / secs).min(1.0);
        dropped = Some(e1.saturating_sub(e0));
        text
    };
    Round {
        datagrams: field(&out, "datagrams="),
        cpu_ns: field(&out, "process_ns=") + field(&out, "softirq_ns="),
        source_sys_ns: source_sys,
        wall_ns: field(&out, "wall_ns="),
        calls: field(&out, "calls="),
        dropped,
        net_rx_on_sink,
    }
}

/// The p50, p99 and p99.9 of `rounds` round trips of one 64-byte datagram
/// from the kernel's namespace to 198.18.0.2:7, in microseconds.
fn round_trips(kernel: &Netns, rounds: usize) -> [f64; 3] {
    kernel.run(move || {
        let _ = pin_to_cpu(1);
        let s = UdpSocket::bind("198.18.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let payload = [7u8; 64];
        let mut buf = [0u8; 128];
        // Warm the path (ARP, caches) first.
        for _ in 0..200 {
            s.send_to(&payload, "198.18.0.2:7").unwrap();
            let _ = s.recv_from(&mut buf);
        }
        let mut rtt = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let t = Instant::now();
            s.send_to(&payload, "198.18.0.2:7").unwrap();
            let (n, _) = s.recv_from(&mut buf).expect("the echo answers");
            rtt.push(t.elapsed().as_secs_f64() * 1e6);
            assert_eq!(n, 64);
        }
        rtt.sort_by(f64::total_cmp);
        let at = |q: f64| rtt[((rtt.len() as f64 * q) as usize).min(rtt.len() - 1)];
        [at(0.5), at(0.99), at(0.999)]
    })
}

/// The echo, pinned to CPU 0, under spate-run or on the kernel, in
/// `ns`; running once it said READY.
fn start_echo(ns: &Netns, echo: &Path, spate: bool) -> Proc {
    let mut args: Vec<String> = vec!["-c".into(), "0".into()];
    if spate {
        args.push(prefix().join("bin/spate-run").display().to_string());
        args.extend(
            ["--vdev", "net_af_packet0,iface=vA", "--lcores", "1", "--poll", "adaptive", "--mbufs", "4095", "--"]
                .map(String::from),
        );
    } else {
        ns.must(&["ip", "addr", "add", "198.18.0.2/24", "dev", "vA"]);
    }
    args.push(echo.display().to_string());
    let mut p = ns.spawn("plain-echo", "/usr/bin/taskset", &args, Duration::from_secs(300)).unwrap();
    assert!(p.wait_for_output("READY", Duration::from_secs(60)), "the echo:\n{}", p.output());
    p
}

/// User and system time of process `pid` (every thread), in seconds.
fn process_times(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    // utime and stime: fields 14 and 15, the 12th and 13th after the name
    // (field 3, the state, first); in clock ticks, 100 a second on Linux.
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) / 100.0;
    (ticks(11), ticks(12))
}

/// CPU time of process `pid` (every thread), in seconds.
fn process_cpu(pid: u32) -> f64 {
    let (u, s) = process_times(pid);
    u + s
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let (n, rounds, trips) = if quick { (500_000, 3, 5_000) } else { (2_000_000, 3, 20_000) };
    println!("CPU: {}", spate_testkit::cpu_model());
    let sink = build("plain_sink");
    let echo = build("plain_echo");

    // Datagrams per CPU-second.
    let (mut sp, mut tap, mut veth) = (vec![], vec![], vec![]);
    for _ in 0..rounds {
        sp.push(sink_round(Feed::Spate, &sink, n));
        veth.push(sink_round(Feed::Veth, &sink, n));
        tap.push(sink_round(Feed::Tap, &sink, n));
    }
    println!(
        "plain_sink (recvmmsg, 64-byte datagrams from dpdk-testpmd txonly, {n} per round): datagrams per CPU-second"
    );
    println!(
        "| sockets | fed by | CPU counted | per CPU-second, each round | median | datagrams/s (median) | CPUs (median) | \
         datagrams per call (median) | dropped at the socket (each round) | NET_RX on the sink's CPU (most) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let rows: [(&str, &str, &str, &Vec<Round>, bool); 4] = [
        ("spate (spate-run's preload)", "vhost-user", "the sink process (reader and lcore) and softirq", &sp, false),
        ("kernel", "veth (`net_af_packet`)", "the sink process and softirq (the receive path)", &veth, false),
        ("kernel", "TAP", "the sink process and softirq", &tap, false),
        ("kernel", "TAP", "the sink process, softirq and the source's TAP writes (system time)", &tap, true),
    ];
    let mut medians = vec![];
    for (name, fed, counted, v, sys) in rows {
        let each: Vec<String> = v.iter().map(|r| format!("{:.0}", r.per_cpu_second(sys))).collect();
        let m = median(&v.iter().map(|r| r.per_cpu_second(sys)).collect::<Vec<_>>());
        medians.push(m);
        let cpus = median(
            &v.iter().map(|r| (r.cpu_ns + if sys { r.source_sys_ns } else { 0.0 }) / r.wall_ns).collect::<Vec<_>>(),
        );
        let dropped: Vec<String> = v.iter().map(|r| r.dropped.map_or("-".into(), |d| d.to_string())).collect();
        let on_sink = v
            .iter()
            .filter_map(|r| r.net_rx_on_sink)
            .reduce(f64::max)
            .map_or("-".into(), |s| format!("{:.1}%", s * 100.0));
        println!(
            "| {name} | {fed} | {counted} | {} | {m:.0} | {:.0} | {cpus:.2} | {:.1} | {} | {on_sink} |",
            each.join(", "),
            median(&v.iter().map(|r| r.datagrams / (r.wall_ns / 1e9)).collect::<Vec<_>>()),
            median(&v.iter().map(|r| r.datagrams / r.calls.max(1.0)).collect::<Vec<_>>()),
            dropped.join(", "),
        );
    }
    println!(
        "spate over the kernel, datagrams per CPU-second (target: at least 5x): {:.1}x against the kernel fed by a \
         veth (its receive path in softirq); fed by TAP, {:.1}x against the sink and softirq, {:.1}x with the receive \
         path run in the source's writes",
        medians[0] / medians[1],
        medians[0] / medians[2],
        medians[0] / medians[3]
    );

    // Latency, one datagram at a time.
    let mut lat: [Vec<[f64; 3]>; 2] = [vec![], vec![]];
    let mut idle = 0.0;
    for run in 0..3 {
        for (i, spate) in [true, false].into_iter().enumerate() {
            let (ns, kernel) = spate_and_kernel("pl-echo");
            let mut p = start_echo(&ns, &echo, spate);
            lat[i].push(round_trips(&kernel, trips));
            if spate && run == 0 {
                let pid: u32 = p
                    .output()
                    .lines()
                    .find_map(|l| l.strip_prefix("pid "))
                    .and_then(|v| v.trim().parse().ok())
                    .expect("the echo's pid");
                let c0 = process_cpu(pid);
                std::thread::sleep(Duration::from_secs(3));
                idle = (process_cpu(pid) - c0) / 3.0 * 100.0;
            }
            p.stop();
        }
    }
    println!("plain_echo, one 64-byte datagram at a time over a veth, {trips} round trips per run (microseconds)");
    println!("| sockets | p50 | p99 | p99.9 | p99.9 of each run |");
    println!("|---|---|---|---|---|");
    for (i, name) in ["spate (spate-run, adaptive polling)", "kernel"].iter().enumerate() {
        let col = |k: usize| median(&lat[i].iter().map(|r| r[k]).collect::<Vec<_>>());
        let each: Vec<String> = lat[i].iter().map(|r| format!("{:.1}", r[2])).collect();
        println!("| {name} | {:.1} | {:.1} | {:.1} | {} |", col(0), col(1), col(2), each.join(", "));
    }
    println!("the echo under spate-run, idle for 3 s: {idle:.2}% of a CPU (target: under 1%)");
    let _ = std::fs::remove_file(&sink);
    let _ = std::fs::remove_file(&echo);
}

//! The side-by-side packets-per-second harness: one dpdk-testpmd `txonly`
//! source (one core) on a vhost-user pair feeds, one after another, the
//! ceiling (`dpdk-testpmd rxonly --record-core-cycles`), `spate-sink
//! --reader lcore` and `spate-sink --reader thread`; then the Linux kernel
//! is measured the seeds' way (`iperf3 -u -b 0 -l 16` over loopback, one
//! stream, pinned) and with a `recvmmsg` sink fed 64-byte frames through a
//! TAP device. It prints one table, sweeps the frame size for spate against
//! the ceiling, reconciles what testpmd sent with what spate delivered and
//! counted as dropped, and writes the table as JSON and a PNG plot.
//!
//! ```text
//! cargo bench --bench pps -- [--quick] [--out DIR (target/pps)]
//! ```
//! `--quick` finishes in under a minute. `--queues-table` instead puts a
//! 2-queue virtio_user port on 2 lcores beside a 1-queue one on 1;
//! `--poll-table` `spate-sink --poll busy` beside `--poll adaptive`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use plotters::prelude::*;
use serde_json::{Value, json};
use spate_testkit::process::Proc;
use spate_testkit::testpmd::{SPATE_MAC, rxonly, txonly_args, txonly_source_on_queues};
use spate_testkit::{FwdStats, Netns, TestPmd, TestPmdBuilder, unique, unique_socket_path};

const SINK: &str = env!("CARGO_BIN_EXE_spate-sink");
const RING: u16 = 1024;
const FRAMES: [usize; 4] = [64, 256, 1024, 1518];

#[derive(Debug, Clone, Copy)]
struct Timing {
    warmup: u64,
    seconds: u64,
}

/// One measured receiver.
#[derive(Debug, Clone, Default)]
struct Point {
    name: String,
    frame: usize,
    pps: f64,
    /// CPU cycles per datagram (busy cycles; for the kernel, from CPU time).
    cycles: Option<f64>,
    /// CPU ns per datagram (spate thread mode: lcore busy + reader CPU).
    ns: Option<f64>,
    /// Share dropped at the receiver.
    drops: f64,
    note: String,
}

/// What spate-sink's JSON lines said over the measured window.
#[derive(Debug, Default)]
struct SinkWindow {
    delivered: u64,
    secs: f64,
    busy_cycles: u64,
    cpu_ns: f64,
    dropped: u64,
}

/// Sums the interval lines with traffic, leaving out the first `warmup`
/// seconds of them and the last one (traffic stopped during it).
fn sink_window(text: &str, warmup: u64) -> SinkWindow {
    let lines: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["delivered"].as_u64().is_some_and(|d| d > 0))
        .collect();
    let mut w = SinkWindow::default();
    let mut skipped = 0.0;
    for v in lines.iter().take(lines.len().saturating_sub(1)) {
        let secs = v["secs"].as_f64().unwrap_or(0.0);
        if skipped < warmup as f64 {
            skipped += secs;
            continue;
        }
        let d = v["delivered"].as_u64().unwrap_or(0);
        w.delivered += d;
        w.secs += secs;
        w.busy_cycles += v["busy_cycles"].as_u64().unwrap_or(0);
        w.cpu_ns += v["cpu_ns_per_dgram"].as_f64().unwrap_or(0.0) * d as f64;
        w.dropped += v["drops"].as_object().map(|m| m.values().filter_map(Value::as_u64).sum::<u64>()).unwrap_or(0);
    }
    w
}

/// sent = port received = frames = delivered + counted drops, per run.
#[derive(Debug, Default, Clone)]
struct Reconciliation {
    what: String,
    sent: u64,
    frames: u64,
    consumed: u64,
    drops: u64,
}

impl Reconciliation {
    fn balanced(&self) -> bool {
        self.sent == self.frames && self.frames == self.consumed + self.drops
    }
}

/// The interactive source, switched between frame sizes.
struct Source {
    pmd: TestPmd,
    sock: PathBuf,
    frame: usize,
}

impl Source {
    fn new(sock: &Path) -> Source {
        Source::on_queues(sock, 1)
    }

    /// One forwarding core sending 64-byte frames on every one of `queues`.
    fn on_queues(sock: &Path, queues: usize) -> Source {
        let pmd = txonly_source_on_queues(sock, 64, queues, Duration::from_secs(900), true);
        Source { pmd, sock: sock.to_path_buf(), frame: 64 }
    }

    fn frame(&mut self, frame: usize) {
        if frame != self.frame {
            self.pmd.command(&format!("set txpkts {frame}"), "testpmd> ").expect("set txpkts");
            self.frame = frame;
        }
    }

    fn start(&mut self) {
        self.pmd.command("start", "packet forwarding - ports=").expect("start the source");
    }

    /// Stops it; what it sent since `start`.
    fn stop(&mut self) -> u64 {
        let out = self.pmd.command("stop", "Done.").expect("stop the source");
        FwdStats::parse(&out).map(|s| s.tx).unwrap_or(0)
    }
}

/// The ceiling at `frame` bytes, and the TSC rate testpmd counted with.
fn ceiling(src: &mut Source, frame: usize, t: Timing) -> (Point, Option<f64>) {
    src.frame(frame);
    src.start();
    let r = rxonly(&src.sock, RING, t.warmup, t.seconds);
    src.stop();
    let p = Point {
        name: "dpdk-testpmd rxonly (ceiling)".into(),
        frame,
        pps: r.pps,
        cycles: Some(r.cycles),
        ns: None,
        drops: r.drop_share,
        note: String::new(),
    };
    (p, r.hz)
}

/// Runs spate-sink with `args` while `src` sends for the warm-up and the
/// measured seconds; what the sink printed and what the source sent.
fn run_sink(src: &mut Source, args: &[String], t: Timing) -> (String, u64) {
    let log = PathBuf::from(format!("/tmp/{}.log", unique("spate-pps-sink-")));
    let mut sink = Proc::spawn("spate-sink", SINK, args, &log, Duration::from_secs(300)).expect("start spate-sink");
    assert!(sink.wait_for_output("spate-sink: port 9", Duration::from_secs(60)), "{}", sink.output());
    std::thread::sleep(Duration::from_millis(300));
    src.start();
    std::thread::sleep(Duration::from_secs(t.warmup + t.seconds));
    let sent = src.stop();
    std::thread::sleep(Duration::from_millis(500));
    let status = sink.stop();
    let text = sink.output();
    assert!(status.is_some_and(|s| s.success()), "spate-sink failed:\n{text}");
    (text, sent)
}

/// spate-sink on the virtio-user side, lcore 1 polling.
fn spate(src: &mut Source, frame: usize, thread: bool, extra: &[&str], t: Timing) -> (Point, Reconciliation) {
    src.frame(frame);
    let mut args: Vec<String> = [
        "--vdev",
        &format!("net_virtio_user0,path={},queues=1,queue_size={RING},mac={SPATE_MAC}", src.sock.display()),
        "--ip",
        "198.18.0.2/24",
        "--lcores",
        "1",
        "--json",
        "--interval",
        "0.5",
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    if thread {
        // The reader shares CPU 0 with the source: its buffer holds a
        // scheduler slice's worth of datagrams.
        args.extend(
            ["--reader", "thread", "--reader-cpus", "0", "--rcvbuf", "140000000", "--mbufs", "131071"]
                .map(String::from),
        );
    }
    let (text, sent) = run_sink(src, &args, t);
    let w = sink_window(&text, t.warmup);
    let summary = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["summary"] == true)
        .unwrap_or_else(|| panic!("no summary:\n{text}"));
    let rec = Reconciliation {
        what: format!("spate-sink --reader {} ({frame} B)", if thread { "thread" } else { "lcore" }),
        sent,
        frames: summary["rx_frames"].as_u64().unwrap_or(0),
        consumed: summary["consumed"].as_u64().unwrap_or(0),
        drops: summary["drops"].as_object().map(|m| m.values().filter_map(Value::as_u64).sum()).unwrap_or(0),
    };
    let delivered = w.delivered.max(1) as f64;
    let point = Point {
        name: if thread { "spate-sink --reader thread" } else { "spate-sink --reader lcore" }.into(),
        frame,
        pps: w.delivered as f64 / w.secs.max(1e-9),
        cycles: (!thread).then(|| w.busy_cycles as f64 / delivered),
        ns: Some(w.cpu_ns / delivered),
        drops: w.dropped as f64 / (w.delivered + w.dropped).max(1) as f64,
        note: String::new(),
    };
    (point, rec)
}

/// A multi-queue virtio port against a one-queue one: one dpdk-testpmd
/// `txonly --txonly-multi-flow` core (CPU 0) sends 64-byte frames on every
/// queue of a vhost-user port, and spate-sink polls each queue with an
/// lcore of its own (`--rss off`: nothing steered, as device steering does
/// with unfragmented datagrams), 1 queue on lcore 1 against 2 on lcores 0
/// and 1. This machine has 2 vCPUs: with 2 queues one lcore shares CPU 0
/// with the source, so the figure shows what the second queue costs and
/// what an oversubscribed vCPU does to it, not how 2 queues scale on 2
/// free cores (the pipeline's scale table models that).
fn queues_table(t: Timing) {
    println!("Multi-queue virtio_user, 64-byte frames, testpmd txonly (one core, CPU 0) on every queue:");
    println!("| queues = lcores | sent Mpps | delivered Mpps | busy cycles per datagram (all lcores) | dropped |");
    println!("|---|---|---|---|---|");
    for queues in [1usize, 2] {
        let sock = unique_socket_path("ppsq");
        let mut src = Source::on_queues(&sock, queues);
        let lcores = if queues == 1 { "1" } else { "0-1" };
        let args: Vec<String> = [
            "--vdev",
            &format!("net_virtio_user0,path={},queues={queues},queue_size={RING},mac={SPATE_MAC}", sock.display()),
            "--ip",
            "198.18.0.2/24",
            "--lcores",
            lcores,
            "--rss",
            "off",
            "--sockets",
            &queues.to_string(),
            "--json",
            "--interval",
            "0.5",
        ]
        .map(String::from)
        .to_vec();
        let (text, sent) = run_sink(&mut src, &args, t);
        let w = sink_window(&text, t.warmup);
        let secs = (t.warmup + t.seconds) as f64;
        println!(
            "| {queues} | {:.2} (over {secs:.0} s) | {:.2} | {:.0} | {:.1}% |",
            sent as f64 / secs / 1e6,
            w.delivered as f64 / w.secs.max(1e-9) / 1e6,
            w.busy_cycles as f64 / w.delivered.max(1) as f64,
            100.0 * w.dropped as f64 / (w.delivered + w.dropped).max(1) as f64
        );
    }
}

/// The seeds' method: iperf3 UDP, 16-byte datagrams, unlimited rate, one
/// stream over loopback, client on CPU 0 and server on CPU 1.
fn kernel_iperf3(t: Timing, hz: f64) -> Point {
    let ns = Netns::new("pps-k");
    let mut server = ns
        .spawn(
            "iperf3-s",
            "iperf3",
            &["-s", "-1", "-A", "1", "--forceflush"].map(String::from),
            Duration::from_secs(120),
        )
        .expect("iperf3 -s");
    assert!(server.wait_for_output("Server listening", Duration::from_secs(10)), "{}", server.output());
    let secs = (t.warmup + t.seconds).to_string();
    let out = ns.exec(&["iperf3", "-c", "127.0.0.1", "-u", "-b", "0", "-l", "16", "-t", &secs, "-A", "0", "--json"]);
    server.stop();
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("iperf3 JSON: {e}\n{}", String::from_utf8_lossy(&out.stdout)));
    let sum = &v["end"]["sum"];
    let seconds = sum["seconds"].as_f64().unwrap_or(1.0);
    let packets = sum["packets"].as_f64().unwrap_or(0.0);
    let lost = sum["lost_packets"].as_f64().unwrap_or(0.0);
    let received = (packets - lost).max(1.0);
    let cpu = v["end"]["cpu_utilization_percent"]["remote_total"].as_f64().unwrap_or(100.0) / 100.0;
    let ns_per = cpu * seconds * 1e9 / received;
    Point {
        name: "Linux: iperf3 -u -b 0 -l 16, loopback".into(),
        frame: 16 + 8 + 20 + 14,
        pps: received / seconds,
        cycles: Some(ns_per * hz / 1e9),
        ns: Some(ns_per),
        drops: lost / packets.max(1.0),
        note: format!("receiver at {:.0}% of a core", cpu * 100.0),
    }
}

/// 64-byte frames written into a TAP device by testpmd (CPU 0) reach a
/// kernel UDP socket read with `recvmmsg` by a thread on CPU 1.
fn kernel_tap(t: Timing, hz: f64) -> Point {
    let ns = Netns::new("pps-tap");
    let mut pmd = TestPmdBuilder::new("0,1", 1)
        .in_netns(&ns)
        .interactive()
        .vdev("net_tap0,iface=spt0")
        .args(txonly_args(64))
        .args(["--total-num-mbufs=8192"])
        .limit(Duration::from_secs(300))
        .spawn("tap-src")
        .expect("testpmd on a TAP device");
    pmd.wait_prompt(Duration::from_secs(30)).expect("prompt");
    ns.must(&["ip", "link", "set", "spt0", "address", SPATE_MAC]);
    ns.must(&["ip", "addr", "add", "198.18.0.2/24", "dev", "spt0"]);
    ns.must(&["ip", "link", "set", "spt0", "up"]);
    let count = Arc::new(AtomicU64::new(0));
    let cpu = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (c, cp, st) = (count.clone(), cpu.clone(), stop.clone());
    let sink = ns.thread(move || {
        let _ = spate::dpdk::lcore::set_affinity(&[1]);
        let s = std::net::UdpSocket::bind("0.0.0.0:9").expect("bind 0.0.0.0:9");
        let _ = spate_testkit::set_recv_buffer(&s, 64 << 20);
        s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let mut bufs = vec![[0u8; 2048]; 64];
        let mut sum = 0u64;
        while !st.load(Ordering::Relaxed) {
            if let Ok(n) = spate_testkit::recvmmsg(&s, &mut bufs) {
                for b in &bufs[..n] {
                    sum = sum.wrapping_add(b[..18].iter().map(|&x| x as u64).sum::<u64>());
                }
                c.fetch_add(n as u64, Ordering::Relaxed);
                cp.store(spate::dpdk::lcore::thread_cpu_ns(), Ordering::Relaxed);
            }
        }
        std::hint::black_box(sum);
    });
    let snmp = |ns: &Netns| -> (u64, u64) {
        let m = spate_testkit::kernel_udp_counters(ns.name());
        (m["InDatagrams"], m["RcvbufErrors"])
    };
    pmd.command("start", "packet forwarding - ports=").expect("start");
    std::thread::sleep(Duration::from_secs(t.warmup));
    let (n0, c0, k0, t0) = (count.load(Ordering::Relaxed), cpu.load(Ordering::Relaxed), snmp(&ns), Instant::now());
    std::thread::sleep(Duration::from_secs(t.seconds));
    let (n1, c1, k1) = (count.load(Ordering::Relaxed), cpu.load(Ordering::Relaxed), snmp(&ns));
    let secs = t0.elapsed().as_secs_f64();
    let _ = pmd.command("stop", "Done.");
    stop.store(true, Ordering::Relaxed);
    let _ = sink.join();
    let _ = pmd.command("quit", "Bye");
    let got = (n1 - n0).max(1) as f64;
    let ns_per = (c1 - c0) as f64 / got;
    let dropped = (k1.1 - k0.1) as f64;
    Point {
        name: "Linux: recvmmsg sink, TAP".into(),
        frame: 64,
        pps: got / secs,
        cycles: Some(ns_per * hz / 1e9),
        ns: Some(ns_per),
        drops: dropped / (got + dropped),
        note: "sink thread only; the kernel's receive path runs in testpmd's write".into(),
    }
}

fn fmt(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into())
}

/// `spate-sink --reader lcore` at 64 bytes, `--poll busy` and `--poll
/// adaptive` taking turns, three rounds each: under load adaptive polling
/// never sleeps, and must cost nothing.
fn poll_table(src: &mut Source, t: Timing) {
    let mut rounds: [Vec<Point>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..3 {
        for (i, mode) in ["busy", "adaptive"].iter().enumerate() {
            let (p, _) = spate(src, 64, false, &["--poll", mode], t);
            rounds[i].push(p);
        }
    }
    let median = |v: &mut Vec<Point>| {
        v.sort_by(|a, b| a.pps.total_cmp(&b.pps));
        v[v.len() / 2].clone()
    };
    let (busy, adaptive) = (median(&mut rounds[0]), median(&mut rounds[1]));
    println!(
        "spate-sink --reader lcore, 64-byte frames from testpmd txonly over vhost-user (median of 3 alternating rounds)"
    );
    println!("CPU: {}", spate_testkit::cpu_model());
    println!("| poll | Mpps | cycles/datagram |");
    println!("|---|---|---|");
    for (name, p) in [("busy", &busy), ("adaptive", &adaptive)] {
        println!("| {name} | {:.3} | {} |", p.pps / 1e6, fmt(p.cycles));
    }
    println!(
        "| adaptive / busy | {:.3} | {} |",
        adaptive.pps / busy.pps,
        match (adaptive.cycles, busy.cycles) {
            (Some(a), Some(b)) => format!("{:.3}", a / b),
            _ => "-".into(),
        }
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let quick = args.iter().any(|a| a == "--quick");
    // The benchmarks are spate-apps' targets, run in apps/: the default
    // output goes to the workspace's target/.
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("apps/ sits in the workspace");
    let out_dir = flag("--out").map(PathBuf::from).unwrap_or_else(|| workspace.join("target/pps"));
    let t = if quick { Timing { warmup: 1, seconds: 1 } } else { Timing { warmup: 2, seconds: 5 } };
    let _ = env_logger::builder().filter_level(log::LevelFilter::Warn).try_init();
    if !spate::dpdk::eal::hugepages_available() {
        eprintln!("the pps harness needs hugepages: run `cargo xtask setup` as root");
        std::process::exit(2);
    }
    if args.iter().any(|a| a == "--queues-table") {
        queues_table(t);
        return;
    }
    let started = Instant::now();
    let mut hz = 0.0;
    let sock = unique_socket_path("pps");
    let mut src = Source::new(&sock);
    if args.iter().any(|a| a == "--poll-table") {
        poll_table(&mut src, t);
        return;
    }
    if args.iter().any(|a| a == "--sink-only") {
        // For a profiler: spate-sink alone at 64 bytes.
        let (p, r) = spate(&mut src, 64, false, &[], t);
        println!("{:.2} Mpps, {} cycles/datagram; {:?}", p.pps / 1e6, fmt(p.cycles), r);
        return;
    }
    let mut points = Vec::new();
    let mut recs = Vec::new();
    for frame in FRAMES {
        eprintln!("pps: {frame}-byte frames");
        let (c, tsc) = ceiling(&mut src, frame, t);
        hz = tsc.expect("testpmd reports its TSC rate");
        points.push(c);
        let (p, r) = spate(&mut src, frame, false, &[], t);
        points.push(p);
        recs.push(r);
    }
    let (p, r) = spate(&mut src, 64, true, &[], t);
    points.push(p);
    recs.push(r);
    let _ = src.pmd.command("quit", "Bye");
    drop(src);
    eprintln!("pps: the Linux kernel");
    let iperf3 = kernel_iperf3(t, hz);
    let tap = kernel_tap(t, hz);
    points.push(iperf3.clone());
    points.push(tap.clone());

    let at = |name: &str, frame: usize| points.iter().find(|p| p.name.starts_with(name) && p.frame == frame).cloned();
    let ceil64 = at("dpdk-testpmd", 64).unwrap();
    let lcore64 = at("spate-sink --reader lcore", 64).unwrap();
    let thread64 = at("spate-sink --reader thread", 64).unwrap();
    let kernel_per_core = iperf3.pps / (iperf3.ns.unwrap_or(1e9) * iperf3.pps / 1e9).max(1e-9);

    println!();
    println!(
        "receive, one core, 64-byte frames unless said (hz {:.0} MHz, {:.0} s)",
        hz / 1e6,
        started.elapsed().as_secs_f64()
    );
    println!(
        "| receiver | frame B | Mpps | cycles/datagram | ns CPU/datagram | dropped | vs ceiling (pps / cycles) | vs kernel per core |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for p in points.iter().filter(|p| p.frame == 64 || p.name.starts_with("Linux")) {
        let vs_ceiling = if p.name.starts_with("spate") {
            format!(
                "{:.3} / {}",
                p.pps / ceil64.pps,
                p.cycles.map(|c| format!("{:.3}", c / ceil64.cycles.unwrap())).unwrap_or("-".into())
            )
        } else {
            String::new()
        };
        let vs_kernel =
            if p.name.starts_with("spate") { format!("{:.1}x", p.pps / kernel_per_core) } else { String::new() };
        println!(
            "| {} | {} | {:.2} | {} | {} | {:.3}% | {vs_ceiling} | {vs_kernel} |",
            p.name,
            p.frame,
            p.pps / 1e6,
            fmt(p.cycles),
            fmt(p.ns),
            p.drops * 100.0
        );
    }
    println!();
    println!("frame-size sweep, spate-sink --reader lcore against the ceiling");
    println!("| frame B | ceiling Mpps | spate Mpps | ratio | ceiling cycles | spate cycles | ratio |");
    println!("|---|---|---|---|---|---|---|");
    for frame in FRAMES {
        let (c, s) = (at("dpdk-testpmd", frame).unwrap(), at("spate-sink --reader lcore", frame).unwrap());
        println!(
            "| {frame} | {:.2} | {:.2} | {:.3} | {} | {} | {:.3} |",
            c.pps / 1e6,
            s.pps / 1e6,
            s.pps / c.pps,
            fmt(c.cycles),
            fmt(s.cycles),
            s.cycles.unwrap_or(0.0) / c.cycles.unwrap_or(1.0)
        );
    }
    println!();
    for r in &recs {
        println!(
            "reconciliation {}: sent {} = frames {} = consumed {} + counted drops {}: {}",
            r.what,
            r.sent,
            r.frames,
            r.consumed,
            r.drops,
            if r.balanced() { "balanced" } else { "NOT balanced" }
        );
    }
    println!(
        "Linux kernel per core (iperf3 receiver): {:.2} Mpps; {}; TAP sink: {}",
        kernel_per_core / 1e6,
        iperf3.note,
        tap.note
    );
    let rtc_pps = lcore64.pps / ceil64.pps;
    let rtc_cyc = lcore64.cycles.unwrap() / ceil64.cycles.unwrap();
    let thread_ratio = thread64.ns.unwrap() / lcore64.ns.unwrap();
    let vs_kernel = lcore64.pps / kernel_per_core;
    let verdict = |ok: bool| if ok { "met" } else { "missed" };
    println!(
        "targets: RTC >= 0.7 of the ceiling ({rtc_pps:.3}: {}), <= 1.5x its cycles ({rtc_cyc:.3}: {}); \
         thread <= 2x RTC CPU/datagram ({thread_ratio:.3}: {}, drops {:.3}%: {}); >= 10x the kernel per core ({vs_kernel:.1}x: {})",
        verdict(rtc_pps >= 0.7),
        verdict(rtc_cyc <= 1.5),
        verdict(thread_ratio <= 2.0),
        thread64.drops * 100.0,
        if thread64.drops < 0.01 { "under 1%" } else { "over 1%, the figure does not count" },
        verdict(vs_kernel >= 10.0)
    );

    std::fs::create_dir_all(&out_dir).expect("output directory");
    let json = json!({
        "bench": "pps",
        "quick": quick,
        "tsc_hz": hz,
        "points": points.iter().map(|p| json!({
            "receiver": p.name, "frame": p.frame, "pps": p.pps, "cycles_per_dgram": p.cycles,
            "cpu_ns_per_dgram": p.ns, "drop_share": p.drops, "note": p.note,
        })).collect::<Vec<_>>(),
        "reconciliation": recs.iter().map(|r| json!({
            "run": r.what, "sent": r.sent, "frames": r.frames, "consumed": r.consumed, "drops": r.drops,
            "balanced": r.balanced(),
        })).collect::<Vec<_>>(),
        "ratios": {"rtc_pps_vs_ceiling": rtc_pps, "rtc_cycles_vs_ceiling": rtc_cyc,
                   "thread_vs_rtc_cpu": thread_ratio, "rtc_vs_kernel_per_core": vs_kernel},
    });
    let json_path = out_dir.join("pps.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&json).unwrap()).expect("write JSON");
    let png = out_dir.join("pps.png");
    match plot(&png, &points, kernel_per_core) {
        Ok(()) => println!("wrote {} and {}", json_path.display(), png.display()),
        Err(e) => {
            eprintln!("plot: {e}");
            std::process::exit(1);
        }
    }
}

/// Packets per second against frame size: the ceiling and spate, and the
/// kernel's per-core rate as a line.
fn plot(path: &Path, points: &[Point], kernel: f64) -> Result<(), Box<dyn std::error::Error>> {
    let font = std::fs::read("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
        .map_err(|e| format!("DejaVuSans.ttf ({e}): apt-get install fonts-dejavu-core"))?;
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font).map_err(|_| "bad font")?;
    let root = BitMapBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = points.iter().map(|p| p.pps).fold(0.0, f64::max) / 1e6 * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption("spate receive rate against frame size (one core)", ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..1600f64, 0f64..max)?;
    chart.configure_mesh().x_desc("frame bytes").y_desc("Mpps").label_style(("sans-serif", 16)).draw()?;
    let series = |name: &str| -> Vec<(f64, f64)> {
        points.iter().filter(|p| p.name.starts_with(name)).map(|p| (p.frame as f64, p.pps / 1e6)).collect()
    };
    for (name, label, color) in [
        ("dpdk-testpmd", "dpdk-testpmd rxonly (ceiling)", BLUE),
        ("spate-sink --reader lcore", "spate-sink, run-to-completion", RED),
    ] {
        let data = series(name);
        chart
            .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(data.into_iter().map(|(x, y)| Circle::new((x, y), 4, color.filled())))?;
    }
    let k = kernel / 1e6;
    chart
        .draw_series(LineSeries::new(vec![(0.0, k), (1600.0, k)], BLACK.stroke_width(1)))?
        .label("Linux kernel per core (iperf3, 58-byte frames)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()?;
    root.present()?;
    Ok(())
}

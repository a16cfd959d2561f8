//! Single-core receive: dpdk-testpmd `txonly` (64-byte UDP frames) over a
//! vhost-user pair into spate on `net_virtio_user`, consumed by a
//! run-to-completion sink that reads every payload byte of every datagram
//! it counts; side by side in one run with `dpdk-testpmd rxonly` in the
//! same place. Prints delivered datagrams per second, busy cycles per
//! datagram for both, and the reconciliation sent = delivered + counted
//! drops.
//!
//! `cargo bench --bench stack_rx -- [--quick] [--rounds N] [--seconds S] [--json PATH]`

use spate_testkit::stats::median;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spate::{Counter, DatagramBatch, LcoreCtx, PortSpec, Stack, StackConfig, UdpSocket};
use spate_testkit::testpmd::{SPATE_MAC, rxonly, txonly_source};
use spate_testkit::{FwdStats, TestPmd, unique, unique_socket_path};

const RING: u16 = 1024;

#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    pps: f64,
    cycles: f64,
    /// Share of the datagrams queued or refused at the socket that were
    /// refused (its receive buffer full), over the measured seconds.
    drop_share: f64,
}

struct Reconciliation {
    sent: u64,
    port_rx: u64,
    frames: u64,
    delivered: u64,
    drops: u64,
}

/// The 64-byte txonly source.
fn generator(sock: &Path, limit: Duration, interactive: bool) -> TestPmd {
    txonly_source(sock, 64, limit, interactive)
}

fn testpmd_rxonly(sock: &Path, warmup: u64, seconds: u64) -> Sample {
    let mut source = generator(sock, Duration::from_secs(warmup + seconds + 60), false);
    let r = rxonly(sock, RING, warmup, seconds);
    source.finish();
    Sample { pps: r.pps, cycles: r.cycles, drop_share: r.drop_share }
}

/// spate on the vhost-user pair, polling lcore 1.
fn spate_stack(sock: &std::path::Path, mempool_size: u32, reader_nap_us: u32) -> Stack {
    let spec = PortSpec::new(&format!(
        "{},path={},queues=1,queue_size={RING},mac={SPATE_MAC}",
        unique("net_virtio_user"),
        sock.display()
    ))
    .addr("198.18.0.2/24")
    .unwrap();
    let cfg = StackConfig {
        lcores: "1".into(),
        ports: vec![spec],
        rx_desc: RING,
        tx_desc: RING,
        mempool_size,
        memory_mb: 1024,
        reader_nap_us,
        stop_on_signal: false,
        announce: false,
        ..StackConfig::default()
    };
    Stack::new(cfg).expect("stack")
}

/// Stops the interactive source and lets spate drain; the exact totals.
fn reconcile(source: &mut TestPmd, stack: &Stack) -> Reconciliation {
    let out = source.command("stop", "Done.").expect("stop the source");
    let sent = FwdStats::parse(&out).map(|s| s.tx).unwrap_or(0);
    let mut last = u64::MAX;
    while stack.counters()[Counter::RxFrames] != last {
        last = stack.counters()[Counter::RxFrames];
        std::thread::sleep(Duration::from_millis(200));
    }
    let c = stack.counters();
    Reconciliation {
        sent,
        port_rx: stack.port_stats()[0].1.ipackets,
        frames: c[Counter::RxFrames],
        delivered: c[Counter::RxDelivered],
        drops: c.rx_drops() + stack.port_stats()[0].1.imissed,
    }
}

fn spate_sink(sock: &Path, warmup: u64, seconds: u64) -> (Sample, Reconciliation) {
    let mut source = generator(sock, Duration::from_secs(warmup + seconds + 60), true);
    let stack = spate_stack(sock, 16383, 0);
    let sockt = Arc::new(UdpSocket::builder(&stack).recv_buffer_size(4 << 20).bind("0.0.0.0:9").unwrap());
    sockt.set_nonblocking(true).unwrap();
    let consumed = Arc::new(AtomicU64::new(0));
    let bytes_sum = Arc::new(AtomicU64::new(0));
    let (s, c, b) = (sockt.clone(), consumed.clone(), bytes_sum.clone());
    let running = stack
        .spawn(move |_| {
            let (s, c, b) = (s.clone(), c.clone(), b.clone());
            let mut batch = DatagramBatch::with_capacity(64);
            let (mut n, mut sum) = (0u64, 0u64);
            move |ctx: &mut LcoreCtx<'_>| {
                // The burst's datagrams where the lcore staged them, then
                // what the queue holds, if the lcore queued any.
                ctx.recv_staged(|_, staged| staged.move_to(&mut batch));
                if !ctx.ready().is_empty() {
                    let _ = s.recv_batch(&mut batch, 64);
                }
                if !batch.is_empty() {
                    for d in batch.iter() {
                        sum = sum.wrapping_add(read_every_byte(d.data()));
                        n += 1;
                    }
                    batch.clear();
                    c.store(n, Ordering::Relaxed);
                    b.store(sum, Ordering::Relaxed);
                }
            }
        })
        .expect("spawn");
    source.command("start", "packet forwarding - ports=").expect("start the source");
    std::thread::sleep(Duration::from_secs(warmup));
    let (busy0, _) = stack.lcore_load(0);
    let n0 = consumed.load(Ordering::Relaxed);
    let c0 = stack.counters();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds));
    let (busy1, loops1) = stack.lcore_load(0);
    let n1 = consumed.load(Ordering::Relaxed);
    let c1 = stack.counters();
    eprintln!("spate: {} loop iterations, {:.1} datagrams per iteration", loops1, n1 as f64 / loops1.max(1) as f64);
    let secs = t0.elapsed().as_secs_f64();
    let queued = c1[Counter::RxDelivered] - c0[Counter::RxDelivered];
    let dropped = c1[Counter::RxRcvbufFull] - c0[Counter::RxRcvbufFull];
    let sample = Sample {
        pps: (n1 - n0) as f64 / secs,
        cycles: (busy1 - busy0) as f64 / (n1 - n0).max(1) as f64,
        drop_share: dropped as f64 / (queued + dropped).max(1) as f64,
    };

    // Reconcile: stop the source (the link stays up), let spate drain,
    // compare totals.
    let rec = reconcile(&mut source, &stack);
    running.stop();
    let _ = source.command("quit", "Bye");
    std::hint::black_box(bytes_sum.load(Ordering::Relaxed));
    (sample, rec)
}

/// CPU per delivered datagram in thread mode, and the share dropped.
#[derive(Debug, Clone, Copy, Default)]
struct ThreadSample {
    /// Polling lcore busy ns + reader thread CPU ns, per delivered datagram.
    ns: f64,
    /// Of that, the reader's.
    reader_ns: f64,
    /// Socket drops / datagrams that reached the socket, in the window.
    drop_share: f64,
    pps: f64,
}

/// The sink as an application thread: the lcore polls and queues, a thread
/// pinned to the other CPU (the generator's) blocks in `recv_batch`, reads
/// every byte, and measures its own CPU time.
fn spate_thread_sink(sock: &Path, warmup: u64, seconds: u64) -> (ThreadSample, Reconciliation) {
    let mut source = generator(sock, Duration::from_secs(warmup + seconds + 60), true);
    // Room for 60,000 datagrams: the reader shares its CPU with the
    // generator and is off it for a scheduler slice at a time.
    let stack = spate_stack(sock, 131071, 20);
    let rcvbuf = 60_000 * stack.datagram_truesize();
    let sockt = Arc::new(UdpSocket::builder(&stack).recv_buffer_size(rcvbuf).bind("0.0.0.0:9").unwrap());
    sockt.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let running = stack.spawn_polling().expect("spawn");
    // The reader publishes (datagrams, its CPU ns) when `phase` moves.
    let phase = Arc::new(AtomicU64::new(0));
    let marks: Arc<[AtomicU64; 4]> = Arc::new(Default::default());
    let (s, ph, mk) = (sockt.clone(), phase.clone(), marks.clone());
    let reader = std::thread::spawn(move || {
        let _ = spate::dpdk::lcore::set_affinity(&[0]);
        let mut batch = DatagramBatch::with_capacity(64);
        let (mut n, mut sum, mut seen) = (0u64, 0u64, 0u64);
        loop {
            if let Ok(got) = s.recv_batch(&mut batch, 64) {
                for d in batch.iter() {
                    sum = sum.wrapping_add(read_every_byte(d.data()));
                }
                n += got as u64;
                batch.clear();
            }
            let p = ph.load(Ordering::Acquire);
            if p != seen {
                if p >= 3 {
                    return sum;
                }
                let at = 2 * (p as usize - 1);
                mk[at].store(n, Ordering::Relaxed);
                mk[at + 1].store(spate::dpdk::lcore::thread_cpu_ns(), Ordering::Release);
                seen = p;
            }
        }
    });
    let sample_phase = |p: u64| {
        phase.store(p, Ordering::Release);
        let deadline = Instant::now() + Duration::from_secs(5);
        while marks[2 * (p as usize - 1) + 1].load(Ordering::Acquire) == 0 {
            assert!(Instant::now() < deadline, "the reader did not answer");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    source.command("start", "packet forwarding - ports=").expect("start the source");
    std::thread::sleep(Duration::from_secs(warmup));
    let (busy0, _) = stack.lcore_load(0);
    let c0 = stack.counters();
    sample_phase(1);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds));
    let (busy1, loops1) = stack.lcore_load(0);
    let c1 = stack.counters();
    sample_phase(2);
    eprintln!(
        "thread sink: {} loop iterations, {:.1} datagrams per iteration, {} reader wake-ups",
        loops1,
        c1[Counter::RxDelivered] as f64 / loops1.max(1) as f64,
        sockt.reader_wakeups()
    );
    let secs = t0.elapsed().as_secs_f64();
    let rec = reconcile(&mut source, &stack);
    phase.store(3, Ordering::Release);
    std::hint::black_box(reader.join().expect("reader"));
    running.stop();
    let _ = source.command("quit", "Bye");
    let delivered = (marks[2].load(Ordering::Relaxed) - marks[0].load(Ordering::Relaxed)).max(1) as f64;
    let reader_ns = (marks[3].load(Ordering::Relaxed) - marks[1].load(Ordering::Relaxed)) as f64;
    let poll_ns = (busy1 - busy0) as f64 * 1e9 / stack.tsc_hz() as f64;
    let queued = c1[Counter::RxDelivered] - c0[Counter::RxDelivered];
    let dropped = c1[Counter::RxRcvbufFull] - c0[Counter::RxRcvbufFull];
    let sample = ThreadSample {
        ns: (poll_ns + reader_ns) / delivered,
        reader_ns: reader_ns / delivered,
        drop_share: dropped as f64 / (queued + dropped).max(1) as f64,
        pps: delivered / secs,
    };
    (sample, rec)
}

/// Reads every byte of `data`, eight at a time.
#[inline]
fn read_every_byte(data: &[u8]) -> u64 {
    let mut chunks = data.chunks_exact(8);
    let mut acc = 0u64;
    for c in &mut chunks {
        acc = acc.wrapping_add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
    }
    for &b in chunks.remainder() {
        acc = acc.wrapping_add(b as u64);
    }
    acc
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let quick = args.iter().any(|a| a == "--quick");
    let rounds: usize = flag("--rounds").and_then(|v| v.parse().ok()).unwrap_or(if quick { 1 } else { 3 });
    let seconds: u64 = flag("--seconds").and_then(|v| v.parse().ok()).unwrap_or(if quick { 3 } else { 5 });
    let warmup = 2;
    let _ = env_logger::builder().filter_level(log::LevelFilter::Warn).try_init();
    if !spate::dpdk::eal::hugepages_available() {
        eprintln!("stack_rx needs hugepages: run `cargo xtask setup` as root");
        std::process::exit(2);
    }
    let sock = unique_socket_path("rxbench");
    let (mut t_pps, mut t_cyc, mut s_pps, mut s_cyc) = (vec![], vec![], vec![], vec![]);
    let mut recs = Vec::new();
    let (mut th_ns, mut th_reader, mut th_drop, mut th_pps, mut rtc_ns) = (vec![], vec![], vec![], vec![], vec![]);
    let mut rtc_drop = vec![];
    let mut th_recs = Vec::new();
    if args.iter().any(|a| a == "--thread-only") {
        // For a profiler: the thread-mode sink alone.
        let (th, _) = spate_thread_sink(&sock, warmup, seconds);
        println!("thread sink {:.1} ns/datagram (reader {:.1}), {:.2} Mpps", th.ns, th.reader_ns, th.pps / 1e6);
        return;
    }
    for round in 0..rounds {
        let t = testpmd_rxonly(&sock, warmup, seconds);
        let (s, rec) = spate_sink(&sock, warmup, seconds);
        let (th, th_rec) = spate_thread_sink(&sock, warmup, seconds);
        let hz = spate::dpdk::lcore::tsc_hz() as f64;
        eprintln!(
            "round {}: thread sink {:.1} ns/datagram (reader {:.1}), {:.2} Mpps, {:.3}% dropped | RTC {:.1} ns",
            round + 1,
            th.ns,
            th.reader_ns,
            th.pps / 1e6,
            th.drop_share * 100.0,
            s.cycles * 1e9 / hz
        );
        th_ns.push(th.ns);
        th_reader.push(th.reader_ns);
        th_drop.push(th.drop_share);
        th_pps.push(th.pps);
        rtc_ns.push(s.cycles * 1e9 / hz);
        rtc_drop.push(s.drop_share);
        th_recs.push(th_rec);
        eprintln!(
            "round {}: testpmd rxonly {:.2} Mpps {:.1} cyc | spate {:.2} Mpps {:.1} cyc",
            round + 1,
            t.pps / 1e6,
            t.cycles,
            s.pps / 1e6,
            s.cycles
        );
        t_pps.push(t.pps);
        t_cyc.push(t.cycles);
        s_pps.push(s.pps);
        s_cyc.push(s.cycles);
        recs.push(rec);
    }
    let (tp, tc, sp, sc) = (median(&t_pps), median(&t_cyc), median(&s_pps), median(&s_cyc));
    println!();
    println!(
        "single-core receive, 64-byte UDP frames over a vhost-user pair, median of {rounds} round(s) of {seconds} s"
    );
    println!(
        "| receiver                                  | delivered Mpps | busy cycles/datagram | ratio to rxonly (pps / cycles) |"
    );
    println!(
        "|-------------------------------------------|----------------|----------------------|--------------------------------|"
    );
    println!(
        "| dpdk-testpmd rxonly                       | {:>14.2} | {:>20.1} | 1.000 / 1.000                  |",
        tp / 1e6,
        tc
    );
    println!(
        "| spate sink, run-to-completion             | {:>14.2} | {:>20.1} | {:.3} / {:.3}                  |",
        sp / 1e6,
        sc,
        sp / tp,
        sc / tc
    );
    println!(
        "targets: rate >= 0.6 of rxonly ({}), cycles <= 2x rxonly ({})",
        if sp / tp >= 0.6 { "met" } else { "missed" },
        if sc / tc <= 2.0 { "met" } else { "missed" }
    );
    let (tn, tr, td, tp2, rn) =
        (median(&th_ns), median(&th_reader), median(&th_drop), median(&th_pps), median(&rtc_ns));
    println!();
    println!("thread mode: CPU per delivered datagram, median of {rounds} round(s)");
    println!("| sink | ns/datagram | of which reader thread | delivered Mpps | dropped at the socket | ratio to RTC |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| run-to-completion (lcore busy) | {rn:.1} | | {:.2} | {:.3}% | 1.000 |",
        sp / 1e6,
        median(&rtc_drop) * 100.0
    );
    println!(
        "| reader thread (lcore busy + reader CPU) | {tn:.1} | {tr:.1} | {:.2} | {:.3}% | {:.3} |",
        tp2 / 1e6,
        td * 100.0,
        tn / rn
    );
    println!(
        "target: thread mode <= 2x RTC ({}), counted only with drops < 1% ({})",
        if tn / rn <= 2.0 { "met" } else { "missed" },
        if td < 0.01 { "drops under 1%" } else { "drops over 1%: the figure does not count" }
    );
    let tr_last = &th_recs[th_recs.len() - 1];
    println!(
        "thread-mode reconciliation (last round): sent {} = port received {} = frames {} = delivered {} + counted drops {}: {}",
        tr_last.sent,
        tr_last.port_rx,
        tr_last.frames,
        tr_last.delivered,
        tr_last.drops,
        if tr_last.sent == tr_last.port_rx
            && tr_last.port_rx == tr_last.frames
            && tr_last.frames == tr_last.delivered + tr_last.drops
        {
            "balanced"
        } else {
            "NOT balanced"
        }
    );
    let r = &recs[recs.len() - 1];
    println!(
        "reconciliation (last round): testpmd sent {} = spate port received {} = frames {} = delivered {} + counted drops {}: {}",
        r.sent,
        r.port_rx,
        r.frames,
        r.delivered,
        r.drops,
        if r.sent == r.port_rx && r.port_rx == r.frames && r.frames == r.delivered + r.drops {
            "balanced"
        } else {
            "NOT balanced"
        }
    );
    if let Some(path) = flag("--json") {
        let body = format!(
            "{{\"bench\":\"stack_rx\",\"rounds\":{rounds},\"seconds\":{seconds},\"testpmd_rxonly\":{{\"pps\":{tp:.0},\"cycles\":{tc:.2}}},\
             \"spate\":{{\"pps\":{sp:.0},\"cycles\":{sc:.2}}},\
             \"thread\":{{\"ns\":{tn:.2},\"reader_ns\":{tr:.2},\"drop_share\":{td:.5},\"pps\":{tp2:.0},\"rtc_ns\":{rn:.2}}}}}\n"
        );
        std::fs::write(&path, body).expect("write JSON");
    }
}

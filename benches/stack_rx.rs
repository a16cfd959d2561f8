//! Single-core receive: dpdk-testpmd `txonly` (64-byte UDP frames) over a
//! vhost-user pair into spate on `net_virtio_user`, consumed by a
//! run-to-completion sink that reads every payload byte of every datagram
//! it counts; side by side in one run with `dpdk-testpmd rxonly` in the
//! same place. Prints delivered datagrams per second, busy cycles per
//! datagram for both, and the reconciliation sent = delivered + counted
//! drops.
//!
//! `cargo bench --bench stack_rx -- [--quick] [--rounds N] [--seconds S] [--json PATH]`

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spate_stack::{Counter, DatagramBatch, LcoreCtx, PortSpec, Stack, StackConfig, UdpSocket};
use spate_testkit::testpmd::pps_samples;
use spate_testkit::{FwdStats, TestPmd, TestPmdBuilder, unique, unique_socket_path};

const RING: u16 = 1024;
const SPATE_MAC: &str = "02:53:50:41:54:45";

#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    pps: f64,
    cycles: f64,
}

struct Reconciliation {
    sent: u64,
    port_rx: u64,
    frames: u64,
    delivered: u64,
    drops: u64,
}

/// The txonly source. Interactive, it sends from `start` to `stop` and
/// then reports the exact count while the link stays up.
fn generator(sock: &PathBuf, limit: Duration, interactive: bool) -> TestPmd {
    let _ = std::fs::remove_file(sock);
    let b = TestPmdBuilder::new("0,1", 1);
    let b = if interactive { b.interactive() } else { b };
    let mut g = b
        .vdev(&format!("net_vhost0,iface={},queues=1", sock.display()))
        .args([
            "--forward-mode=txonly".to_string(),
            "--txpkts=64".into(),
            format!("--eth-peer=0,{SPATE_MAC}"),
            "--tx-ip=198.18.0.1,198.18.0.2".into(),
            "--tx-udp=9,9".into(),
            "--nb-cores=1".into(),
            "--burst=32".into(),
            "--rxd=1024".into(),
            "--txd=1024".into(),
            "--total-num-mbufs=16384".into(),
        ])
        .args(if interactive { vec![] } else { vec!["--stats-period=1".to_string()] })
        .limit(limit)
        .spawn("gen")
        .expect("start the generator");
    g.proc.remove_on_drop(sock);
    if interactive {
        g.wait_prompt(Duration::from_secs(30)).expect("generator prompt");
    } else {
        g.wait_started(Duration::from_secs(30)).expect("generator starts");
    }
    g
}

fn testpmd_rxonly(sock: &PathBuf, warmup: u64, seconds: u64) -> Sample {
    let mut source = generator(sock, Duration::from_secs(warmup + seconds + 60), false);
    let mut rx = TestPmdBuilder::new("0,1", 0)
        .vdev(&format!("net_virtio_user0,path={},queues=1,queue_size={RING}", sock.display()))
        .args(
            [
                "--forward-mode=rxonly",
                "--record-core-cycles",
                "--nb-cores=1",
                "--burst=32",
                "--rxd=1024",
                "--txd=1024",
                "--total-num-mbufs=16384",
                "--stats-period=1",
            ]
            .map(String::from),
        )
        .limit(Duration::from_secs(warmup + seconds + 60))
        .spawn("rxonly")
        .expect("start testpmd rxonly");
    rx.wait_started(Duration::from_secs(30)).expect("rxonly starts");
    std::thread::sleep(Duration::from_secs(warmup + seconds));
    let out = rx.finish();
    source.finish();
    let stats = FwdStats::parse(&out).unwrap_or_else(|| panic!("no rxonly stats:\n{out}"));
    let samples: Vec<u64> = pps_samples(&out, "Rx").into_iter().skip(warmup as usize).filter(|&v| v > 0).collect();
    Sample {
        pps: samples.iter().sum::<u64>() as f64 / samples.len().max(1) as f64,
        cycles: stats.cycles_per_packet.expect("--record-core-cycles"),
    }
}

fn spate_sink(sock: &PathBuf, warmup: u64, seconds: u64, checksum_offload: bool) -> (Sample, Reconciliation) {
    let mut source = generator(sock, Duration::from_secs(warmup + seconds + 60), true);
    let mut spec = PortSpec::new(&format!(
        "{},path={},queues=1,queue_size={RING},mac={SPATE_MAC}",
        unique("net_virtio_user"),
        sock.display()
    ))
    .addr("198.18.0.2/24")
    .unwrap();
    spec.rx_checksum_offload = checksum_offload;
    spec.tx_checksum_offload = checksum_offload;
    let cfg = StackConfig {
        lcores: "1".into(),
        ports: vec![spec],
        rx_desc: RING,
        tx_desc: RING,
        stop_on_signal: false,
        announce: false,
        ..StackConfig::default()
    };
    let stack = Stack::new(cfg).expect("stack");
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
            move |_: &mut LcoreCtx<'_>| {
                if s.recv_batch(&mut batch, 64).is_ok() {
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
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds));
    let (busy1, loops1) = stack.lcore_load(0);
    let n1 = consumed.load(Ordering::Relaxed);
    eprintln!("spate: {} loop iterations, {:.1} datagrams per iteration", loops1, n1 as f64 / loops1.max(1) as f64);
    let secs = t0.elapsed().as_secs_f64();
    let sample = Sample { pps: (n1 - n0) as f64 / secs, cycles: (busy1 - busy0) as f64 / (n1 - n0).max(1) as f64 };

    // Reconcile: stop the source (the link stays up), let spate drain,
    // compare totals.
    let out = source.command("stop", "Done.").expect("stop the source");
    let sent = FwdStats::parse(&out).map(|s| s.tx).unwrap_or(0);
    let mut last = u64::MAX;
    while stack.counters()[Counter::RxFrames] != last {
        last = stack.counters()[Counter::RxFrames];
        std::thread::sleep(Duration::from_millis(200));
    }
    running.stop();
    let _ = source.command("quit", "Bye");
    let c = stack.counters();
    let port_rx = stack.port_stats()[0].1.ipackets;
    let rec = Reconciliation {
        sent,
        port_rx,
        frames: c[Counter::RxFrames],
        delivered: c[Counter::RxDelivered],
        drops: c.rx_drops() + stack.port_stats()[0].1.imissed,
    };
    std::hint::black_box(bytes_sum.load(Ordering::Relaxed));
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

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let quick = args.iter().any(|a| a == "--quick");
    let rounds: usize = flag("--rounds").and_then(|v| v.parse().ok()).unwrap_or(if quick { 1 } else { 3 });
    let seconds: u64 = flag("--seconds").and_then(|v| v.parse().ok()).unwrap_or(if quick { 3 } else { 5 });
    let warmup = 2;
    let _ = env_logger::builder().filter_level(log::LevelFilter::Warn).try_init();
    if !spate_dpdk::eal::hugepages_available() {
        eprintln!("stack_rx needs hugepages: run `cargo xtask setup` as root");
        std::process::exit(2);
    }
    let sock = unique_socket_path("rxbench");
    let (mut t_pps, mut t_cyc, mut s_pps, mut s_cyc, mut o_pps, mut o_cyc) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut recs = Vec::new();
    for round in 0..rounds {
        let t = testpmd_rxonly(&sock, warmup, seconds);
        let (s, rec) = spate_sink(&sock, warmup, seconds, false);
        let (o, _) = spate_sink(&sock, warmup, seconds, true);
        eprintln!(
            "round {}: testpmd rxonly {:.2} Mpps {:.1} cyc | spate {:.2} Mpps {:.1} cyc | spate+csum offload {:.2} Mpps {:.1} cyc",
            round + 1,
            t.pps / 1e6,
            t.cycles,
            s.pps / 1e6,
            s.cycles,
            o.pps / 1e6,
            o.cycles
        );
        t_pps.push(t.pps);
        t_cyc.push(t.cycles);
        s_pps.push(s.pps);
        s_cyc.push(s.cycles);
        o_pps.push(o.pps);
        o_cyc.push(o.cycles);
        recs.push(rec);
    }
    let (tp, tc, sp, sc, op, oc) = (
        median(&mut t_pps),
        median(&mut t_cyc),
        median(&mut s_pps),
        median(&mut s_cyc),
        median(&mut o_pps),
        median(&mut o_cyc),
    );
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
        "| spate sink, virtio checksum offload asked | {:>14.2} | {:>20.1} | {:.3} / {:.3}                  |",
        op / 1e6,
        oc,
        op / tp,
        oc / tc
    );
    println!(
        "targets: rate >= 0.6 of rxonly ({}), cycles <= 2x rxonly ({})",
        if sp / tp >= 0.6 { "met" } else { "missed" },
        if sc / tc <= 2.0 { "met" } else { "missed" }
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
             \"spate\":{{\"pps\":{sp:.0},\"cycles\":{sc:.2}}},\"spate_csum_offload\":{{\"pps\":{op:.0},\"cycles\":{oc:.2}}}}}\n"
        );
        std::fs::write(&path, body).expect("write JSON");
    }
}

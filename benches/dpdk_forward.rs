//! Burst RX -> TX forwarding on the spate-dpdk API, side by side with
//! `dpdk-testpmd --forward-mode=io` on the same vhost-user pair, in one run.
//!
//! A testpmd `flowgen` generator (64-byte UDP frames; it also drains what
//! comes back) serves `net_vhost0` on CPU 0. The forwarder under test is the
//! `net_virtio_user` client on CPU 1: first testpmd io (with
//! `--record-core-cycles`), then spate's loop in this process, alternating
//! for the given number of rounds. Both count busy cycles the same way:
//! TSC from before rx_burst to after tx_burst, only in iterations that
//! received something, divided by the packets received.
//!
//! `cargo bench --bench dpdk_forward -- [--quick] [--rounds N] [--seconds S] [--json PATH]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use spate::dpdk::{Burst, EalBuilder, Memory, Mempool, MempoolConfig, Port, PortConfig, lcore};
use spate_testkit::testpmd::pps_samples;
use spate_testkit::{FwdStats, TestPmdBuilder, unique, unique_socket_path};

const RING: u16 = 1024;
const MBUFS: u32 = 16383;

#[derive(Debug, Clone, Copy)]
struct Sample {
    pps: f64,
    cycles_per_packet: f64,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let quick = args.iter().any(|a| a == "--quick");
    let rounds: usize = flag("--rounds").and_then(|v| v.parse().ok()).unwrap_or(if quick { 1 } else { 3 });
    let seconds: u64 = flag("--seconds").and_then(|v| v.parse().ok()).unwrap_or(if quick { 3 } else { 6 });
    let warmup = 2u64;
    let json = flag("--json");
    let _ = env_logger::builder().filter_level(log::LevelFilter::Warn).try_init();

    if !spate::dpdk::eal::hugepages_available() {
        eprintln!("dpdk_forward needs hugepages (vhost-user): run `cargo xtask setup` as root");
        std::process::exit(2);
    }
    let sock = unique_socket_path("fwdbench");
    let _ = std::fs::remove_file(&sock);
    let mut generator = TestPmdBuilder::new("0,1", 1)
        .vdev(&format!("net_vhost0,iface={},queues=1", sock.display()))
        .args(testpmd_common(&["--forward-mode=flowgen", "--txpkts=64"]))
        .limit(Duration::from_secs(60 + rounds as u64 * 2 * (seconds + warmup + 10)))
        .spawn("gen")
        .expect("start the testpmd generator");
    generator.proc.remove_on_drop(&sock);
    generator.wait_started(Duration::from_secs(30)).expect("generator starts");

    let _eal = EalBuilder::new()
        .program("spate-bench")
        .lcores("1")
        .memory(Memory::Hugepages)
        .memory_mb(512)
        .init()
        .expect("EAL");
    let pool = Arc::new(Mempool::new(&MempoolConfig::new("fwdbench", MBUFS)).expect("mempool"));
    let virtio = |name: &str| format!("{name},path={},queues=1,queue_size={RING}", sock.display());

    let (mut testpmd, mut spate) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // testpmd io forwarding on the client side.
        let mut fwd = TestPmdBuilder::new("0,1", 0)
            .vdev(&virtio("net_virtio_user0"))
            .args(testpmd_common(&["--forward-mode=io", "--record-core-cycles", "--port-topology=loop"]))
            .limit(Duration::from_secs(seconds + warmup + 60))
            .spawn("fwd")
            .expect("start testpmd io");
        fwd.wait_started(Duration::from_secs(30)).expect("testpmd io starts");
        std::thread::sleep(Duration::from_secs(warmup + seconds));
        let out = fwd.finish();
        let stats = FwdStats::parse(&out).unwrap_or_else(|| panic!("no testpmd stats in:\n{out}"));
        eprintln!("testpmd: {} received, {} dropped on transmit", stats.rx, stats.tx_dropped);
        let rx = pps_samples(&out, "Rx");
        let measured: Vec<u64> = rx.iter().copied().skip(warmup as usize).filter(|&v| v > 0).collect();
        let pps = measured.iter().sum::<u64>() as f64 / measured.len().max(1) as f64;
        let t = Sample { pps, cycles_per_packet: stats.cycles_per_packet.expect("--record-core-cycles output") };
        drop(fwd);

        let s = spate_forward(&virtio(&unique("net_virtio_user")), pool.clone(), warmup, seconds);
        eprintln!(
            "round {}: testpmd io {:.2} Mpps {:.1} cyc/pkt | spate {:.2} Mpps {:.1} cyc/pkt",
            round + 1,
            t.pps / 1e6,
            t.cycles_per_packet,
            s.pps / 1e6,
            s.cycles_per_packet
        );
        testpmd.push(t);
        spate.push(s);
    }
    drop(generator);
    assert_eq!(pool.in_use(), 0, "the forwarder leaked mbufs");

    let (t, s) = (median(&testpmd), median(&spate));
    let pps_ratio = s.pps / t.pps;
    let cyc_ratio = s.cycles_per_packet / t.cycles_per_packet;
    println!();
    println!(
        "burst RX->TX forwarding over a vhost-user pair, 64-byte frames, median of {rounds} round(s) of {seconds} s"
    );
    println!("| forwarder            |        Mpps | busy cycles/packet |");
    println!("|----------------------|-------------|--------------------|");
    println!("| dpdk-testpmd io      | {:>11.2} | {:>18.1} |", t.pps / 1e6, t.cycles_per_packet);
    println!("| spate-dpdk loop      | {:>11.2} | {:>18.1} |", s.pps / 1e6, s.cycles_per_packet);
    println!("| spate / testpmd      | {:>11.3} | {:>18.3} |", pps_ratio, cyc_ratio);
    println!("| target               |    >= 0.950 |           <= 1.050 |");
    println!(
        "pps ratio {} target; cycles ratio {} target",
        if pps_ratio >= 0.95 { "meets" } else { "misses" },
        if cyc_ratio <= 1.05 { "meets" } else { "misses" }
    );
    if let Some(path) = json {
        let body = format!(
            "{{\"bench\":\"dpdk_forward\",\"rounds\":{rounds},\"seconds\":{seconds},\
             \"testpmd\":{{\"pps\":{:.0},\"cycles_per_packet\":{:.2}}},\
             \"spate\":{{\"pps\":{:.0},\"cycles_per_packet\":{:.2}}},\
             \"pps_ratio\":{pps_ratio:.4},\"cycles_ratio\":{cyc_ratio:.4}}}\n",
            t.pps, t.cycles_per_packet, s.pps, s.cycles_per_packet
        );
        std::fs::write(&path, body).expect("write JSON");
        println!("wrote {path}");
    }
}

fn testpmd_common(mode: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = mode.iter().map(|s| s.to_string()).collect();
    v.extend(
        ["--nb-cores=1", "--burst=32", "--rxd=1024", "--txd=1024", "--total-num-mbufs=16384", "--stats-period=1"]
            .map(String::from),
    );
    v
}

/// spate's forwarder: the same loop shape as testpmd's io engine.
fn spate_forward(spec: &str, pool: Arc<Mempool>, warmup: u64, seconds: u64) -> Sample {
    let mut port = Port::create(spec).expect("virtio_user port");
    // Configured as testpmd configures its port: no checksum offloads.
    let cfg =
        PortConfig { rx_desc: RING, tx_desc: RING, rx_checksum: false, tx_checksum: false, ..PortConfig::default() };
    port.configure(&cfg, pool).expect("configure");
    port.start().expect("start");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !port.link().map(|l| l.up).unwrap_or(false) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut rx = port.rx_queue(0).expect("rxq");
    let mut tx = port.tx_queue(0).expect("txq");
    let hz = lcore::tsc_hz();
    let mut burst: Burst = Burst::new();

    let mut run = |secs: u64| -> (u64, u64, u64) {
        let end = lcore::tsc() + secs * hz;
        let (mut pkts, mut busy, mut dropped) = (0u64, 0u64, 0u64);
        let mut iter = 0u32;
        loop {
            let start = lcore::tsc();
            let n = rx.rx_burst(&mut burst);
            if n > 0 {
                tx.tx_burst(&mut burst);
                dropped += burst.len() as u64;
                burst.clear();
                pkts += n as u64;
                busy += lcore::tsc() - start;
            }
            iter = iter.wrapping_add(1);
            if iter.is_multiple_of(1024) && lcore::tsc() >= end {
                return (pkts, busy, dropped);
            }
        }
    };
    run(warmup);
    let (pkts, busy, dropped) = run(seconds);
    eprintln!("spate: {pkts} forwarded, {dropped} dropped on transmit (TX ring full)");
    drop((rx, tx));
    Sample { pps: pkts as f64 / seconds as f64, cycles_per_packet: busy as f64 / pkts.max(1) as f64 }
}

fn median(v: &[Sample]) -> Sample {
    let mut p: Vec<f64> = v.iter().map(|s| s.pps).collect();
    let mut c: Vec<f64> = v.iter().map(|s| s.cycles_per_packet).collect();
    p.sort_by(f64::total_cmp);
    c.sort_by(f64::total_cmp);
    Sample { pps: p[p.len() / 2], cycles_per_packet: c[c.len() / 2] }
}

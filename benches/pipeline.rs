//! The receive pipeline in one thread, counted in instructions.
//!
//! Everything runs on the calling thread: the stack polls one end of an
//! in-memory wire pair (net_ring) on the EAL main lcore, and its
//! run-to-completion callback plays both the traffic source (it writes
//! 64-byte UDP frames into the other end) and the sink (it takes the
//! datagrams from a socket and reads every payload byte). Run under
//! `valgrind --tool=callgrind` twice, with N and 2N datagrams, the
//! difference of the instruction totals divided by N is the cost of one
//! datagram, repeatable to the instruction on a shared machine.
//!
//! ```text
//! cargo bench --bench pipeline -- [--callgrind] [--datagrams N] [--flows F] [--sockets S] [--json PATH]
//! ```
//! `--inject-only` measures the source and a bare rx_burst + free loop
//! without the stack, the floor the stack's cost is read against.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use spate_dpdk::{Burst, EalBuilder, Memory, Mempool, MempoolConfig, Port, PortConfig, RxQueue, TxQueue};
use spate_stack::wire::MacAddr;
use spate_stack::{DatagramBatch, LcoreCtx, PortSpec, Stack, StackConfig, UdpSocket};
use spate_testkit::wire_peer::udp_frame;

const SPATE_MAC: MacAddr = MacAddr([0x02, 0x53, 0x50, 0x41, 0x54, 0x45]);

struct Source {
    tx: TxQueue,
    rx: RxQueue,
    pool: Arc<Mempool>,
    frames: Vec<Vec<u8>>,
    sent: u64,
    target: u64,
}

impl Source {
    /// Writes up to 32 frames into the wire.
    fn inject(&mut self) {
        let n = (self.target - self.sent).min(32) as usize;
        if n == 0 {
            return;
        }
        let mut b: Burst = Burst::new();
        if self.pool.alloc_bulk(&mut b, n).is_err() {
            return;
        }
        for (i, m) in b.as_mut_slice().iter_mut().enumerate() {
            let f = &self.frames[(self.sent as usize + i) % self.frames.len()];
            m.append(f.len()).expect("room").copy_from_slice(f);
        }
        self.sent += self.tx.tx_burst(&mut b) as u64;
    }

    /// Frees what the stack sent back (nothing, for a sink).
    fn drain(&mut self) {
        let mut b: Burst = Burst::new();
        while self.rx.rx_burst(&mut b) > 0 {
            b.clear();
        }
    }
}

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

struct Args {
    datagrams: u64,
    flows: usize,
    sockets: usize,
    inject_only: bool,
}

fn parse() -> (Args, bool, Option<String>) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let a = Args {
        datagrams: flag("--datagrams").and_then(|v| v.parse().ok()).unwrap_or(200_000),
        flows: flag("--flows").and_then(|v| v.parse().ok()).unwrap_or(16),
        sockets: flag("--sockets").and_then(|v| v.parse().ok()).unwrap_or(1),
        inject_only: args.iter().any(|a| a == "--inject-only"),
    };
    (a, args.iter().any(|a| a == "--callgrind"), flag("--json"))
}

/// One run in this process; prints `datagrams cycles`.
fn run_once(a: &Args) {
    let _ = env_logger::builder().filter_level(log::LevelFilter::Warn).try_init();
    let _eal = EalBuilder::new().program("spate-pipeline").lcores("0").memory(Memory::NoHuge).init().expect("EAL");
    let (a_port, mut b_port) = Port::wire_pair("pl").expect("wire pair");
    let peer_pool = Arc::new(Mempool::new(&MempoolConfig::new("plpeer", 8191)).expect("pool"));
    b_port.configure(&PortConfig::default(), peer_pool.clone()).expect("configure");
    b_port.start().expect("start");
    let frames: Vec<Vec<u8>> =
        (0..a.flows).map(|i| udp_frame(SPATE_MAC, false, 10_000 + i as u16, 9, &[i as u8; 22])).collect();
    let source = Source {
        tx: b_port.tx_queue(0).unwrap(),
        rx: b_port.rx_queue(0).unwrap(),
        pool: peer_pool,
        frames,
        sent: 0,
        target: a.datagrams,
    };
    let start = spate_dpdk::lcore::tsc();
    if a.inject_only {
        let mut a_port = a_port;
        let pool = Arc::new(Mempool::new(&MempoolConfig::new("plown", 4095)).expect("pool"));
        a_port.configure(&PortConfig::default(), pool).expect("configure");
        a_port.start().expect("start");
        let mut rx = a_port.rx_queue(0).unwrap();
        let mut src = source;
        let mut b: Burst = Burst::new();
        let mut got = 0u64;
        while got < a.datagrams {
            src.inject();
            let n = rx.rx_burst(&mut b);
            for m in b.as_slice() {
                std::hint::black_box(read_every_byte(m.data()));
            }
            b.clear();
            got += n as u64;
        }
        println!("{} {}", got, spate_dpdk::lcore::tsc() - start);
        return;
    }
    let mut spec = PortSpec::new(a_port.name()).addr("198.18.0.2/24").unwrap();
    spec.mac = Some(SPATE_MAC);
    let cfg = StackConfig {
        lcores: "0".into(),
        ports: vec![spec],
        stop_on_signal: false,
        announce: false,
        mempool_size: 4095,
        // The same flows on the same sockets in every run (N and 2N).
        hash_seed: Some(0x5ba7e),
        ..StackConfig::default()
    };
    let stack = Stack::new(cfg).expect("stack");
    let sockets: Vec<UdpSocket> = (0..a.sockets)
        .map(|_| {
            let s = UdpSocket::builder(&stack)
                .reuseport(a.sockets > 1)
                .recv_buffer_size(1 << 22)
                .bind("0.0.0.0:9")
                .unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect();
    let sockets = Arc::new(sockets);
    let source = Arc::new(Mutex::new(Some(source)));
    let consumed = Arc::new(AtomicU64::new(0));
    let (s, src, c, target) = (sockets.clone(), source.clone(), consumed.clone(), a.datagrams);
    stack
        .run(move |_| {
            let s = s.clone();
            let c = c.clone();
            let mut src = src.lock().unwrap().take().expect("one lcore");
            let mut batch = DatagramBatch::with_capacity(64);
            let mut n = 0u64;
            let first = s[0].id();
            move |ctx: &mut LcoreCtx<'_>| {
                src.inject();
                // The sockets this lcore fed (ids are consecutive from the first).
                for id in ctx.ready() {
                    let sock = &s[(id - first) as usize];
                    while sock.recv_batch(&mut batch, 64).is_ok() {
                        for d in batch.iter() {
                            std::hint::black_box(read_every_byte(d.data()));
                        }
                        n += batch.len() as u64;
                        batch.clear();
                    }
                }
                src.drain();
                if n >= target {
                    c.store(n, Ordering::Relaxed);
                    ctx.stack().stop();
                }
            }
        })
        .expect("run");
    println!("{} {}", consumed.load(Ordering::Relaxed), spate_dpdk::lcore::tsc() - start);
}

/// Total instructions of a run under callgrind.
fn callgrind(extra: &[String], datagrams: u64) -> u64 {
    let me = std::env::current_exe().expect("own path");
    let out = PathBuf::from(format!("/tmp/spate-callgrind-{}-{datagrams}.out", std::process::id()));
    let status = Command::new("valgrind")
        .args(["--tool=callgrind", "--quiet", &format!("--callgrind-out-file={}", out.display())])
        .arg(&me)
        .args(extra)
        .args(["--datagrams", &datagrams.to_string()])
        .status()
        .expect("valgrind (apt-get install valgrind)");
    assert!(status.success(), "callgrind run failed");
    let text = std::fs::read_to_string(&out).expect("callgrind output");
    let _ = std::fs::remove_file(&out);
    text.lines()
        .find_map(|l| l.strip_prefix("summary: ").or_else(|| l.strip_prefix("totals: ")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("callgrind summary line")
}

/// Instructions per datagram: (Ir(2N) - Ir(N)) / N.
pub fn instructions_per_datagram(extra: &[String], n: u64) -> f64 {
    let one = callgrind(extra, n);
    let two = callgrind(extra, 2 * n);
    (two - one) as f64 / n as f64
}

/// Cycles per datagram, natively, for each argument list: the runs take
/// turns, five rounds, and each keeps its median.
fn cycles_per_datagram(runs: &[Vec<String>], datagrams: u64) -> Vec<f64> {
    let me = std::env::current_exe().expect("own path");
    let mut rounds = vec![Vec::new(); runs.len()];
    for _ in 0..5 {
        for (r, extra) in runs.iter().enumerate() {
            let out = Command::new(&me)
                .args(extra)
                .args(["--datagrams", &datagrams.to_string()])
                .output()
                .expect("run the pipeline");
            assert!(out.status.success(), "pipeline run failed: {}", String::from_utf8_lossy(&out.stderr));
            let text = String::from_utf8_lossy(&out.stdout);
            let v: Vec<f64> = text.split_whitespace().filter_map(|w| w.parse().ok()).collect();
            assert_eq!(v.len(), 2, "expected `datagrams cycles`, got {text:?}");
            rounds[r].push(v[1] / v[0]);
        }
    }
    rounds
        .into_iter()
        .map(|mut r| {
            r.sort_by(f64::total_cmp);
            r[r.len() / 2]
        })
        .collect()
}

fn main() {
    let (a, under_callgrind, json) = parse();
    if !under_callgrind {
        run_once(&a);
        return;
    }
    let n = 20_000;
    let mut extra = vec!["--flows".to_string(), a.flows.to_string(), "--sockets".into(), a.sockets.to_string()];
    let stack = instructions_per_datagram(&extra, n);
    extra[3] = "64".into();
    let group = instructions_per_datagram(&extra, n);
    let group_args = extra.clone();
    extra.push("--inject-only".into());
    let floor = instructions_per_datagram(&extra, n);
    let mut single_args = group_args.clone();
    single_args[3] = a.sockets.to_string();
    let cycles = cycles_per_datagram(&[single_args, group_args, extra], 1_000_000);
    println!("instructions per datagram (callgrind, {} flows):", a.flows);
    println!("| path | instructions |");
    println!("|---|---|");
    println!("| source + rx_burst + read + free (no stack) | {floor:.1} |");
    println!("| source + spate: RX -> 1 socket -> recv -> read | {stack:.1} |");
    println!("| source + spate: RX -> 64-member reuseport group -> recv -> read | {group:.1} |");
    println!("| spate's own cost, 1 socket | {:.1} |", stack - floor);
    println!("| spate's own cost, 64-member group | {:.1} |", group - floor);
    println!("| 64-member group / 1 socket (whole path; target <= 1.05) | {:.3} |", group / stack);
    println!();
    println!("cycles per datagram (native, median of 5 alternating rounds of 1,000,000):");
    println!("| path | cycles |");
    println!("|---|---|");
    println!("| source + rx_burst + read + free (no stack) | {:.1} |", cycles[2]);
    println!("| source + spate, 1 socket | {:.1} |", cycles[0]);
    println!("| source + spate, 64-member group | {:.1} |", cycles[1]);
    println!("| 64-member group / 1 socket (whole path; target <= 1.05) | {:.3} |", cycles[1] / cycles[0]);
    println!("| spate's own cost, group / 1 socket | {:.3} |", (cycles[1] - cycles[2]) / (cycles[0] - cycles[2]));
    if let Some(path) = json {
        let body = format!(
            "{{\"bench\":\"pipeline\",\"flows\":{},\"floor_ir\":{floor:.1},\"stack_ir\":{stack:.1},\"group64_ir\":{group:.1},\"floor_cycles\":{:.1},\"stack_cycles\":{:.1},\"group64_cycles\":{:.1}}}\n",
            a.flows, cycles[2], cycles[0], cycles[1]
        );
        std::fs::write(path, body).expect("write JSON");
    }
}

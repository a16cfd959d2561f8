//! Socket lookup cost: time (criterion) and instructions (callgrind) per
//! lookup, for one socket, a 64-member reuseport group (the seeds ran 64
//! iperf3 streams), the same group with one connected member (the re-score
//! path), and 500 connected sockets on one port (Linux's hash4 case).
//!
//! `cargo bench --bench lookup` runs criterion; `-- --callgrind` prints the
//! instruction table with the ratios the design targets.

use std::hint::black_box;
use std::net::SocketAddr;

use criterion::Criterion;
use spate::internals::{Binding, Family, FlowKey, SocketTable};

const SECRET: [u64; 4] = [0x9e37_79b9_7f4a_7c15, 0xc2b2_ae3d_27d4_eb4f, 0x1656_67b1_9e37_79f9, 0x27d4_eb2f_1656_67c5];
const FLOWS: usize = 1024;

fn binding(id: u64, reuseport: bool, peer: Option<SocketAddr>) -> Binding<u64> {
    let local: SocketAddr = if peer.is_some() { "198.18.0.2:9" } else { "0.0.0.0:9" }.parse().unwrap();
    Binding {
        id,
        family: Family::V4,
        local,
        bound: "0.0.0.0".parse().unwrap(),
        peer,
        v6only: false,
        iface: None,
        reuseport,
        incoming_lcore: None,
        epoch: 0,
        sock: id,
    }
}

fn peer(i: usize) -> SocketAddr {
    format!("198.18.{}.{}:{}", 1 + i / 250, 1 + i % 250, 2000 + i).parse().unwrap()
}

/// The table of a scenario and the keys looked up in it.
fn scenario(name: &str) -> (SocketTable<u64>, Vec<FlowKey>) {
    let t = SocketTable::new(SECRET);
    let dst: SocketAddr = "198.18.0.2:9".parse().unwrap();
    let strangers: Vec<FlowKey> = (0..FLOWS)
        .map(|i| FlowKey::new(&format!("198.19.{}.{}:{}", i / 200, 1 + i % 200, 10_000 + i).parse().unwrap(), &dst, 0))
        .collect();
    match name {
        "single" => {
            t.bind(binding(1, false, None)).unwrap();
            (t, strangers)
        }
        "group64" | "group64+connected" => {
            for id in 0..64 {
                t.bind(binding(id, true, None)).unwrap();
            }
            if name == "group64+connected" {
                t.bind(binding(64, true, Some(peer(0)))).unwrap();
            }
            (t, strangers)
        }
        "connected500" => {
            for i in 0..500 {
                t.bind(binding(i as u64, true, Some(peer(i)))).unwrap();
            }
            let keys = (0..FLOWS).map(|i| FlowKey::new(&peer(i % 500), &dst, 0)).collect();
            (t, keys)
        }
        other => panic!("unknown scenario {other}"),
    }
}

const SCENARIOS: [&str; 4] = ["single", "group64", "group64+connected", "connected500"];

fn run_lookups(name: &str, n: usize) {
    let (t, keys) = scenario(name);
    let snap = t.snapshot();
    let mut found = 0u64;
    for i in 0..n {
        if let Some((_, b)) = snap.lookup(black_box(&keys[i % keys.len()])) {
            found += b.id + 1;
        }
    }
    assert!(found > 0, "{name}: lookups found nothing");
    black_box(found);
}

fn callgrind(name: &str, n: usize) -> u64 {
    let me = std::env::current_exe().expect("own path");
    spate_testkit::callgrind::total(&me, &["--scenario".into(), name.into(), "--lookups".into(), n.to_string()])
}

/// Nanoseconds per lookup, natively: the scenarios take turns, seven
/// rounds of two million lookups each, and each keeps its median round, so
/// drift on a shared machine hits them alike.
fn nanoseconds() -> Vec<f64> {
    let tables: Vec<_> = SCENARIOS.iter().map(|s| scenario(s)).collect();
    let snaps: Vec<_> = tables.iter().map(|(t, _)| t.snapshot()).collect();
    let n = 2_000_000;
    let mut rounds = vec![Vec::new(); SCENARIOS.len()];
    for _ in 0..7 {
        for (s, ((_, keys), snap)) in tables.iter().zip(&snaps).enumerate() {
            let start = std::time::Instant::now();
            let mut found = 0u64;
            for i in 0..n {
                if let Some((_, b)) = snap.lookup(black_box(&keys[i % keys.len()])) {
                    found += b.id + 1;
                }
            }
            black_box(found);
            rounds[s].push(start.elapsed().as_nanos() as f64 / n as f64);
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

fn instructions(name: &str) -> f64 {
    let n = 200_000;
    (callgrind(name, 2 * n) - callgrind(name, n)) as f64 / n as f64
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| args.iter().position(|a| a == f).and_then(|i| args.get(i + 1)).cloned();
    if let Some(name) = flag("--scenario") {
        run_lookups(&name, flag("--lookups").and_then(|v| v.parse().ok()).unwrap_or(100_000));
        return;
    }
    if args.iter().any(|a| a == "--callgrind") {
        let ir: Vec<f64> = SCENARIOS.iter().map(|s| instructions(s)).collect();
        let ns = nanoseconds();
        // (scenario, the row its ratio is against, target)
        let rows = [
            ("1 socket", 0, None),
            ("64-member reuseport group", 0, Some(1.20)),
            ("64-member group + 1 connected (re-score)", 1, Some(1.15)),
            ("500 connected sockets on one port", 0, Some(1.20)),
        ];
        println!("socket lookup, per lookup ({FLOWS} flows; instructions from callgrind, time native, median of 7)");
        println!("| scenario | instructions | ratio | target | ns | ratio |");
        println!("|---|---|---|---|---|---|");
        for (s, (label, base, target)) in rows.iter().enumerate() {
            let vs = match (s, base) {
                (0, _) => "",
                (_, 0) => "vs 1 socket",
                _ => "vs group",
            };
            let target = target.map(|t| format!("<= {t:.2}")).unwrap_or_default();
            println!(
                "| {label} | {:.1} | {:.3} {vs} | {target} | {:.2} | {:.3} |",
                ir[s],
                ir[s] / ir[*base],
                ns[s],
                ns[s] / ns[*base]
            );
        }
        if let Some(path) = flag("--json") {
            let body = format!(
                "{{\"bench\":\"lookup\",\"ir\":[{:.2},{:.2},{:.2},{:.2}],\"ns\":[{:.3},{:.3},{:.3},{:.3}]}}\n",
                ir[0], ir[1], ir[2], ir[3], ns[0], ns[1], ns[2], ns[3]
            );
            std::fs::write(path, body).expect("write JSON");
        }
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    for name in SCENARIOS {
        let (t, keys) = scenario(name);
        let snap = t.snapshot();
        let mut i = 0;
        c.bench_function(&format!("lookup/{name}"), |b| {
            b.iter(|| {
                i = (i + 1) % keys.len();
                black_box(snap.lookup(black_box(&keys[i])).map(|(x, _)| x))
            })
        });
    }
    c.final_summary();
}

//! IPv4 ID reservation, three designs side by side (seed 002):
//!
//! - spate: per-thread leases of a bucket's one counter (`IpIdGen`);
//! - Linux: one shared atomic per bucket, added to for every datagram
//!   (`ip_idents_reserve`: packed arrays of counters and timestamps, one
//!   atomic add per datagram, the idle step only when the timestamp moved;
//!   here the "jiffies" never move during a run, as at a high rate they
//!   move once per tick);
//! - per-core ranges: each thread counts through its own slice of the
//!   space, what seed 002 measured fastest and rejected.
//!
//! Each design reserves one ID per datagram with 1 and 2 threads, to one
//! destination (every thread on one bucket, the worst case for sharing)
//! and to 256 destinations in turn. All use the same bucket hash. Rounds
//! alternate between the designs; each keeps its median.
//!
//! ```text
//! cargo bench --bench ip_id -- [--quick] [--json PATH]
//! ```

use std::cell::Cell;
use std::hint::black_box;
use std::net::Ipv4Addr;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use spate::internals::{BUCKETS, IpIdGen};

#[derive(Clone, Copy, PartialEq)]
enum Design {
    Spate,
    Linux,
    PerCore,
}

impl Design {
    fn name(self) -> &'static str {
        match self {
            Design::Spate => "spate leases",
            Design::Linux => "shared atomic per bucket (Linux)",
            Design::PerCore => "per-core ranges (rejected)",
        }
    }
}

/// Linux's `ip_idents` and `ip_tstamps`: packed, as in the kernel.
struct LinuxIdents {
    idents: Box<[AtomicU32]>,
    tstamps: Box<[AtomicU32]>,
    jiffies: AtomicU32,
}

impl LinuxIdents {
    fn new() -> LinuxIdents {
        LinuxIdents {
            idents: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
            tstamps: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
            jiffies: AtomicU32::new(1),
        }
    }

    #[inline]
    fn reserve(&self, src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, count: u32) -> u16 {
        let b = bucket(src, dst, protocol);
        let now = self.jiffies.load(Ordering::Relaxed);
        let old = self.tstamps[b].load(Ordering::Relaxed);
        let mut delta = 0;
        if old != now && self.tstamps[b].compare_exchange(old, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            delta = now.wrapping_sub(old) % 64;
        }
        (self.idents[b].fetch_add(count + delta, Ordering::Relaxed).wrapping_add(delta)) as u16
    }
}

fn bucket(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8) -> usize {
    let x = ((u32::from(dst) as u64) << 32 | u32::from(src) as u64) ^ 0x5eed;
    let h = (x ^ (protocol as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_mul(0x1d5 | 1);
    (h >> 40) as usize & (BUCKETS - 1)
}

thread_local! {
    /// Per-core ranges: this thread's next position in its slice.
    static RANGE: Cell<u32> = const { Cell::new(0) };
}

/// Per-core ranges as the seed's experiment: each thread counts through
/// its own `slice` (65,536 / threads) IDs.
#[inline]
fn per_core(thread: usize, slice: u32) -> u16 {
    RANGE.with(|c| {
        let n = c.get();
        c.set(if n + 1 == slice { 0 } else { n + 1 });
        (thread as u32 * slice + n) as u16
    })
}

/// Million reservations per second, all threads together.
fn run(design: Design, threads: usize, destinations: u32, per_thread: u64) -> f64 {
    let spate = IpIdGen::new([0x5eed, 0x1d5]);
    let linux = LinuxIdents::new();
    let src = Ipv4Addr::new(198, 18, 0, 2);
    let barrier = Barrier::new(threads);
    let elapsed: Vec<f64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (spate, linux, barrier) = (&spate, &linux, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    let mut acc = 0u16;
                    let mut d = 0u32;
                    let slice = 65_536 / threads as u32;
                    for _ in 0..per_thread {
                        let dst = Ipv4Addr::from(0xc612_0100 + d);
                        d = if d + 1 == destinations { 0 } else { d + 1 };
                        // Each ID is used (black_box), so no design's loop
                        // is folded or vectorised away.
                        acc ^= black_box(match design {
                            Design::Spate => spate.reserve(src, black_box(dst), 17, 1),
                            Design::Linux => linux.reserve(src, black_box(dst), 17, 1),
                            Design::PerCore => per_core(t, slice),
                        });
                    }
                    black_box(acc);
                    start.elapsed().as_secs_f64()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("bench thread")).collect()
    });
    let slowest = elapsed.iter().cloned().fold(0.0, f64::max);
    (threads as u64 * per_thread) as f64 / slowest / 1e6
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let json = args.iter().position(|a| a == "--json").and_then(|i| args.get(i + 1)).cloned();
    let per_thread = if quick { 2_000_000 } else { 20_000_000 };
    let rounds = if quick { 3 } else { 7 };
    let designs = [Design::Spate, Design::Linux, Design::PerCore];
    let mut rows = Vec::new();
    println!("IPv4 ID reservation, million IDs per second, all threads (median of {rounds} alternating rounds):");
    println!(
        "| threads | destinations | spate leases | shared atomic (Linux) | per-core ranges | spate / per-core | spate / Linux |"
    );
    println!("|---|---|---|---|---|---|---|");
    for threads in [1, 2] {
        for destinations in [1, 256] {
            let mut samples = vec![Vec::new(); designs.len()];
            for _ in 0..rounds {
                for (i, &d) in designs.iter().enumerate() {
                    samples[i].push(run(d, threads, destinations, per_thread));
                }
            }
            let med: Vec<f64> = samples
                .into_iter()
                .map(|mut v| {
                    v.sort_by(f64::total_cmp);
                    v[v.len() / 2]
                })
                .collect();
            println!(
                "| {threads} | {destinations} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} |",
                med[0],
                med[1],
                med[2],
                med[0] / med[2],
                med[0] / med[1]
            );
            rows.push(serde_json::json!({
                "threads": threads, "destinations": destinations,
                designs[0].name(): med[0], designs[1].name(): med[1], designs[2].name(): med[2],
            }));
        }
    }
    if let Some(path) = json {
        std::fs::write(path, serde_json::json!({ "bench": "ip_id", "rows": rows }).to_string()).expect("write JSON");
    }
}

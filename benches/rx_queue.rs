//! The socket receive queue against the queues it could have been: a
//! single-lock queue (`Mutex<VecDeque>`, as Linux's `sk_receive_queue` was
//! before the reader queue) and crossbeam's `ArrayQueue` and `SegQueue`.
//! Items are 16 bytes charged 2,240 bytes each, the size of a datagram in
//! a 2 KiB mbuf; every queue holds at most 8,192 of them (spate's through
//! its receive-buffer limit), and a producer that finds its queue full
//! waits and retries, so every item is delivered.
//!
//! - cross-core: one producer thread on CPU 1, one reader on CPU 0;
//! - one core: one thread pushes a burst of 32 and reads it back (the
//!   run-to-completion case, where splicing must cost nothing: seed 003);
//! - two producers and one reader, three threads on two CPUs.
//!
//! Producers hand over bursts of 32 where the queue takes batches (spate,
//! the single lock) and items one by one where it does not (crossbeam);
//! readers take up to 32 at a time. Scenarios take turns, five rounds, and
//! each keeps its median, so drift hits them alike.
//!
//! `cargo bench --bench rx_queue -- [--quick] [--json PATH]`

use spate_testkit::stats::median;
use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crossbeam::queue::{ArrayQueue, SegQueue};
use spate::dpdk::lcore::set_affinity;
use spate::internals::{SocketQueue, Truesize, Wait};

const CAPACITY: usize = 8192;
const TRUESIZE: usize = 2240;
const BURST: usize = 32;

#[derive(Debug)]
struct Item {
    seq: u64,
    size: u32,
}

impl Truesize for Item {
    fn truesize(&self) -> usize {
        self.size as usize
    }
}

/// A queue as the benchmark drives it.
trait Queue: Sync {
    fn name(&self) -> &'static str;
    /// Queues from the front of `burst` what fits; what does not stays.
    fn push(&self, producer: usize, burst: &mut Vec<Item>);
    /// Takes up to `BURST` items into `out`.
    fn pop(&self, out: &mut Vec<Item>) -> usize;
}

impl Queue for SocketQueue<Item> {
    fn name(&self) -> &'static str {
        "spate SocketQueue"
    }
    fn push(&self, producer: usize, burst: &mut Vec<Item>) {
        let _ = self.push_batch(producer, burst);
    }
    fn pop(&self, out: &mut Vec<Item>) -> usize {
        self.pop_batch(out, BURST, Wait::No)
    }
}

/// One lock over the list and the bytes it holds, the receive-buffer limit
/// enforced under it (the cheapest way a single-lock queue can account).
struct SingleLock(Mutex<(VecDeque<Item>, usize)>);

impl Queue for SingleLock {
    fn name(&self) -> &'static str {
        "Mutex<VecDeque>"
    }
    fn push(&self, _: usize, burst: &mut Vec<Item>) {
        let mut g = self.0.lock().unwrap();
        let (list, rmem) = &mut *g;
        let mut n = 0;
        for item in burst.iter() {
            if *rmem + item.truesize() > CAPACITY * TRUESIZE {
                break;
            }
            *rmem += item.truesize();
            n += 1;
        }
        list.extend(burst.drain(..n));
    }
    fn pop(&self, out: &mut Vec<Item>) -> usize {
        let mut g = self.0.lock().unwrap();
        let (list, rmem) = &mut *g;
        let n = list.len().min(BURST);
        for item in list.drain(..n) {
            *rmem -= item.truesize();
            out.push(item);
        }
        n
    }
}

struct Array(ArrayQueue<Item>);

impl Queue for Array {
    fn name(&self) -> &'static str {
        "crossbeam ArrayQueue"
    }
    fn push(&self, _: usize, burst: &mut Vec<Item>) {
        for mut item in burst.drain(..) {
            // Full: wait for the reader (it reads until every item came).
            let mut idle = 0;
            while let Err(back) = self.0.push(item) {
                item = back;
                backoff(&mut idle);
            }
        }
    }
    fn pop(&self, out: &mut Vec<Item>) -> usize {
        let mut n = 0;
        while n < BURST {
            match self.0.pop() {
                Some(item) => out.push(item),
                None => break,
            }
            n += 1;
        }
        n
    }
}

struct Segments(SegQueue<Item>);

impl Queue for Segments {
    fn name(&self) -> &'static str {
        "crossbeam SegQueue"
    }
    fn push(&self, _: usize, burst: &mut Vec<Item>) {
        // Unbounded: hold back while the reader is CAPACITY behind.
        if self.0.len() >= CAPACITY {
            return;
        }
        for item in burst.drain(..) {
            self.0.push(item);
        }
    }
    fn pop(&self, out: &mut Vec<Item>) -> usize {
        let mut n = 0;
        while n < BURST {
            match self.0.pop() {
                Some(item) => out.push(item),
                None => break,
            }
            n += 1;
        }
        n
    }
}

fn queues(producers: usize) -> Vec<Box<dyn Queue>> {
    vec![
        Box::new(SocketQueue::<Item>::new(producers, CAPACITY * TRUESIZE)),
        Box::new(SingleLock(Mutex::new((VecDeque::with_capacity(CAPACITY), 0)))),
        Box::new(Array(ArrayQueue::new(CAPACITY))),
        Box::new(Segments(SegQueue::new())),
    ]
}

/// Pushes `n` items as producer `p`, in bursts, retrying what a full queue refused.
fn produce(q: &dyn Queue, p: usize, n: u64, stop: &AtomicBool) {
    let mut burst: Vec<Item> = Vec::with_capacity(BURST);
    let (mut seq, mut idle) = (0, 0);
    while seq < n || !burst.is_empty() {
        while burst.len() < BURST && seq < n {
            burst.push(Item { seq, size: TRUESIZE as u32 });
            seq += 1;
        }
        let before = burst.len();
        q.push(p, &mut burst);
        if burst.len() == before {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            backoff(&mut idle);
        } else {
            idle = 0;
        }
    }
}

/// Reads `n` items; returns the sum of their sequence numbers.
fn consume(q: &dyn Queue, n: u64) -> u64 {
    let mut out: Vec<Item> = Vec::with_capacity(BURST);
    let (mut got, mut sum) = (0, 0u64);
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    let mut idle = 0;
    while got < n {
        if q.pop(&mut out) == 0 {
            backoff(&mut idle);
            assert!(idle % 4096 != 0 || Instant::now() < deadline, "{}: the reader starved", q.name());
            continue;
        }
        idle = 0;
        got += out.len() as u64;
        sum += out.iter().map(|i| i.seq).sum::<u64>();
        out.clear();
    }
    sum
}

/// Items per second from `producers` threads (pinned to CPU 1 when one)
/// to a reader on CPU 0.
fn threaded(q: &dyn Queue, producers: usize, per_producer: u64) -> f64 {
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let sum = std::thread::scope(|s| {
        for p in 0..producers {
            let stop = &stop;
            s.spawn(move || {
                if producers == 1 {
                    let _ = set_affinity(&[1]);
                }
                produce(q, p, per_producer, stop);
            });
        }
        if producers == 1 {
            let _ = set_affinity(&[0]);
        }
        let sum = consume(q, per_producer * producers as u64);
        stop.store(true, Ordering::Relaxed);
        sum
    });
    let rate = (per_producer * producers as u64) as f64 / start.elapsed().as_secs_f64();
    let expect = producers as u64 * per_producer * (per_producer - 1) / 2;
    assert_eq!(sum, expect, "{}: lost or duplicated items", q.name());
    rate
}

/// Items per second through one thread: push a burst, read it back.
fn one_core(q: &dyn Queue, n: u64) -> f64 {
    let _ = set_affinity(&[0]);
    let mut burst: Vec<Item> = Vec::with_capacity(BURST);
    let mut out: Vec<Item> = Vec::with_capacity(BURST);
    let start = Instant::now();
    let mut sum = 0u64;
    let mut seq = 0;
    while seq < n {
        for _ in 0..BURST {
            burst.push(Item { seq, size: TRUESIZE as u32 });
            seq += 1;
        }
        q.push(0, &mut burst);
        assert!(burst.is_empty(), "{}: an empty queue refused a burst", q.name());
        while q.pop(&mut out) > 0 {
            sum += out.iter().map(|i| i.seq).sum::<u64>();
            out.clear();
        }
    }
    black_box(sum);
    seq as f64 / start.elapsed().as_secs_f64()
}

/// Spins a little, then gives the CPU away (three threads share two CPUs
/// in one scenario; a spinning waiter would starve the thread it waits for).
fn backoff(idle: &mut u32) {
    *idle += 1;
    if *idle < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let quick = args.iter().any(|a| a == "--quick");
    let (rounds, n) = if quick { (3, 1_000_000u64) } else { (5, 4_000_000u64) };
    if let Some(i) = flag("--one-core-only").and_then(|v| v.parse::<usize>().ok()) {
        // For a profiler: only queue `i` in the one-core scenario.
        println!("{:.2} Mitems/s", one_core(queues(1)[i].as_ref(), n) / 1e6);
        return;
    }
    let names: Vec<&str> = queues(1).iter().map(|q| q.name()).collect();
    // [scenario][queue] -> rounds
    let mut results = vec![vec![Vec::new(); names.len()]; 3];
    for _ in 0..rounds {
        for (i, q) in queues(1).iter().enumerate() {
            results[0][i].push(threaded(q.as_ref(), 1, n));
        }
        for (i, q) in queues(1).iter().enumerate() {
            results[1][i].push(one_core(q.as_ref(), n));
        }
        for (i, q) in queues(2).iter().enumerate() {
            results[2][i].push(threaded(q.as_ref(), 2, n / 2));
        }
    }
    let m: Vec<Vec<f64>> = results.into_iter().map(|s| s.iter().map(|v| median(v)).collect()).collect();
    println!("receive queue, Mitems/s (median of {rounds} rounds of {n} items; ratio: spate / that queue)");
    println!(
        "| queue | 1 producer -> 1 reader, 2 cores | ratio | one core | ratio | 2 producers -> 1 reader | ratio |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (i, name) in names.iter().enumerate() {
        println!(
            "| {name} | {:.2} | {:.3} | {:.2} | {:.3} | {:.2} | {:.3} |",
            m[0][i] / 1e6,
            m[0][0] / m[0][i],
            m[1][i] / 1e6,
            m[1][0] / m[1][i],
            m[2][i] / 1e6,
            m[2][0] / m[2][i]
        );
    }
    let cross = m[0][0] / m[0][1];
    let one = m[1][0] / m[1][1];
    let crossbeam = (m[0][0] / m[0][2]).min(m[0][0] / m[0][3]);
    println!(
        "targets: 2 cores >= 1.5x Mutex<VecDeque> ({cross:.3}: {}), on par with crossbeam ({crossbeam:.3}: {}), \
         one core within 5% of Mutex<VecDeque> ({one:.3}: {})",
        if cross >= 1.5 { "met" } else { "missed" },
        if crossbeam >= 1.0 { "met" } else { "missed" },
        if one >= 0.95 { "met" } else { "missed" }
    );
    if let Some(path) = flag("--json") {
        let row = |s: usize| m[s].iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>().join(",");
        let body = format!(
            "{{\"bench\":\"rx_queue\",\"queues\":{:?},\"cross_core\":[{}],\"one_core\":[{}],\"two_producers\":[{}]}}\n",
            names,
            row(0),
            row(1),
            row(2)
        );
        std::fs::write(path, body).expect("write JSON");
    }
}

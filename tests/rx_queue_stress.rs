//! The receive queue under load with real mbufs: two producer threads and
//! one reader move 10 million datagrams through one queue whose receive
//! buffer is small enough that producers are refused now and then. Every
//! datagram is received exactly once, in order per producer, or counted as
//! dropped by the producer that was refused; after close the mempool's
//! in-use count is back at its baseline. A slow reader: the drops are
//! counted exactly and what was queued still comes out in order.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use spate::dpdk::{Burst, Mbuf, Memory, Mempool, MempoolConfig};
use spate::internals::{Refusal, SocketQueue, Truesize, Wait};
use spate_testkit::{device_lock, shared_eal, unique};

const PER_PRODUCER: u64 = 5_000_000;
const BURST: usize = 32;

/// A datagram stand-in: an mbuf holding its producer and sequence number.
struct Item {
    m: Mbuf,
    truesize: usize,
}

impl Item {
    fn new(mut m: Mbuf, producer: u8, seq: u64) -> Item {
        m.append(9).expect("room for 9 bytes").copy_from_slice(&[&[producer][..], &seq.to_be_bytes()].concat());
        let truesize = m.buf_len() + 64;
        Item { m, truesize }
    }

    fn producer(&self) -> usize {
        self.m.data()[0] as usize
    }

    fn seq(&self) -> u64 {
        u64::from_be_bytes(self.m.data()[1..9].try_into().unwrap())
    }
}

impl Truesize for Item {
    fn truesize(&self) -> usize {
        self.truesize
    }
}

/// Queues `PER_PRODUCER` items as producer `p` in bursts; returns how many
/// the queue refused (freed here at once).
fn produce(q: &SocketQueue<Item>, pool: &Mempool, p: u8, deadline: Instant) -> u64 {
    let mut burst: Burst = Burst::new();
    let mut batch: Vec<Item> = Vec::with_capacity(BURST);
    let (mut seq, mut refused) = (0u64, 0u64);
    while seq < PER_PRODUCER {
        let n = (PER_PRODUCER - seq).min(BURST as u64) as usize;
        while pool.alloc_bulk(&mut burst, n).is_err() {
            assert!(Instant::now() < deadline, "producer {p}: the pool stayed empty");
            std::thread::yield_now();
        }
        for m in burst.drain() {
            batch.push(Item::new(m, p, seq));
            seq += 1;
        }
        match q.push_batch(p as usize, &mut batch) {
            Ok(()) => {}
            Err(Refusal::Full) => {
                refused += batch.len() as u64;
                batch.clear();
                std::thread::yield_now();
            }
            Err(Refusal::Closed) => panic!("closed under the producer"),
            Err(Refusal::Mem) => panic!("no stack-wide cap here"),
        }
    }
    refused
}

#[test]
fn two_producers_one_reader_ten_million() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let pool = Arc::new(Mempool::new(&MempoolConfig::new(&unique("rxq"), 16383)).unwrap());
    let baseline = pool.in_use();
    let truesize = pool.alloc().map(|m| Item::new(m, 0, 0).truesize()).unwrap();
    // Room for 256 datagrams: bursts of two producers overrun it at times.
    let q = Arc::new(SocketQueue::<Item>::new(2, 256 * truesize));
    let deadline = Instant::now() + Duration::from_secs(300);
    let done = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..2u8)
        .map(|p| {
            let (q, pool) = (q.clone(), pool.clone());
            std::thread::spawn(move || produce(&q, &pool, p, deadline))
        })
        .collect();
    let (q2, d2) = (q.clone(), done.clone());
    let reader = std::thread::spawn(move || {
        let mut next = [0u64; 2];
        let mut received = [0u64; 2];
        let mut out: Vec<Item> = Vec::with_capacity(64);
        let mut peak_rmem = 0;
        loop {
            let finished = d2.load(Ordering::Acquire);
            let n = q2.pop_batch(&mut out, 64, Wait::Until(Instant::now() + Duration::from_millis(50)));
            peak_rmem = peak_rmem.max(q2.rmem());
            for item in out.drain(..) {
                let (p, seq) = (item.producer(), item.seq());
                assert!(seq >= next[p], "producer {p}: {seq} after {} (duplicate or reordered)", next[p]);
                next[p] = seq + 1;
                received[p] += 1;
            }
            if n == 0 && finished {
                return (received, peak_rmem);
            }
            assert!(Instant::now() < deadline, "the stress run took over 300 s");
        }
    });
    let refused: Vec<u64> = producers.into_iter().map(|t| t.join().unwrap()).collect();
    done.store(true, Ordering::Release);
    let (received, peak_rmem) = reader.join().unwrap();
    for p in 0..2 {
        assert_eq!(q.drops(p), refused[p], "producer {p}: drops counted = datagrams refused");
        assert_eq!(received[p] + refused[p], PER_PRODUCER, "producer {p}: every datagram received once or dropped");
    }
    assert!(refused.iter().sum::<u64>() > 0, "the receive buffer never filled: the drop path went untested");
    assert!(received.iter().sum::<u64>() > PER_PRODUCER, "most datagrams got through");
    // The documented bound: rcvbuf plus one burst of the other producer.
    assert!(peak_rmem <= 256 * truesize + BURST * truesize, "rmem peaked at {peak_rmem}");
    assert_eq!(q.rmem(), 0, "every charge given back");
    q.close();
    drop(q);
    assert_eq!(pool.in_use(), baseline, "mbufs leaked");
}

#[test]
fn slow_reader_sees_exact_drops_and_order() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let pool = Mempool::new(&MempoolConfig::new(&unique("rxqo"), 4095)).unwrap();
    let baseline = pool.in_use();
    let truesize = pool.alloc().map(|m| Item::new(m, 0, 0).truesize()).unwrap();
    let q = SocketQueue::<Item>::new(2, 100 * truesize);
    // 300 offered in bursts of 10 from two producers while nobody reads:
    // exactly the first 100 fit.
    let mut refused = [0u64; 2];
    let mut burst: Burst = Burst::new();
    for b in 0..30u64 {
        let p = (b % 2) as u8;
        pool.alloc_bulk(&mut burst, 10).unwrap();
        let mut batch: Vec<Item> = burst.drain().enumerate().map(|(i, m)| Item::new(m, p, b * 10 + i as u64)).collect();
        if q.push_batch(p as usize, &mut batch).is_err() {
            refused[p as usize] += batch.len() as u64;
        }
    }
    assert_eq!(refused, [100, 100]);
    assert_eq!((q.drops(0), q.drops(1)), (100, 100), "each producer counts its own");
    assert_eq!(q.rmem(), 100 * truesize);
    // The queued ones: producer 0's bursts 0, 2, 4, ..., producer 1's 1, 3, ...
    let mut got: Vec<(usize, u64)> = Vec::new();
    while let Some(item) = q.pop(Wait::No) {
        got.push((item.producer(), item.seq()));
    }
    assert_eq!(got.len(), 100);
    for p in 0..2 {
        let seqs: Vec<u64> = got.iter().filter(|(x, _)| *x == p).map(|(_, s)| *s).collect();
        let expect: Vec<u64> = (0..10u64).filter(|b| b % 2 == p as u64).flat_map(|b| b * 10..b * 10 + 10).collect();
        assert_eq!(seqs, expect, "producer {p}: the first bursts, in order");
    }
    // Room again: the next burst is taken whole.
    pool.alloc_bulk(&mut burst, 10).unwrap();
    let mut batch: Vec<Item> = burst.drain().map(|m| Item::new(m, 0, 1000)).collect();
    q.push_batch(0, &mut batch).unwrap();
    q.close();
    assert_eq!(q.rmem(), 0);
    drop(q);
    assert_eq!(pool.in_use(), baseline, "mbufs leaked");
}

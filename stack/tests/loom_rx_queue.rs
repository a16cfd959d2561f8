//! Model checking of the receive queue with loom: the production code of
//! `stack/src/rx_queue.rs`, compiled with loom's atomics, locks and
//! condition variable (`--cfg loom`), every interleaving of two producers
//! and one reader explored up to loom's preemption bound.
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p spate-stack --test loom_rx_queue --features internals --release
//! ```
//! (`cargo xtask test` runs it so.)
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use spate_stack::internals::{Refusal, SocketQueue, Truesize, Wait};

#[derive(Debug, PartialEq, Eq)]
struct Item {
    producer: usize,
    seq: u32,
    size: usize,
}

impl Truesize for Item {
    fn truesize(&self) -> usize {
        self.size
    }
}

fn item(producer: usize, seq: u32) -> Item {
    Item { producer, seq, size: 100 }
}

/// What the reader saw: every item once, each producer's in order.
fn check(got: &[Item], per_producer: u32) {
    for p in 0..2 {
        let seqs: Vec<u32> = got.iter().filter(|i| i.producer == p).map(|i| i.seq).collect();
        assert_eq!(seqs, (0..per_producer).collect::<Vec<_>>(), "producer {p}: lost, duplicated or reordered");
    }
}

/// Two producers queue two items each (one alone, one as a batch of one)
/// while the reader polls; the reader then drains. Nothing is lost or
/// duplicated, each producer's items come in order, and the memory
/// accounting returns to zero.
#[test]
fn two_producers_one_reader_polling() {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        let q = Arc::new(SocketQueue::<Item>::new(2, 1 << 20));
        let producers: Vec<_> = (0..2)
            .map(|p| {
                let q = q.clone();
                thread::spawn(move || {
                    q.push(p, item(p, 0)).unwrap();
                    let mut batch = vec![item(p, 1)];
                    q.push_batch(p, &mut batch).unwrap();
                })
            })
            .collect();
        let mut got = Vec::new();
        let mut out = Vec::new();
        for _ in 0..2 {
            q.pop_batch(&mut out, 4, Wait::No);
            got.append(&mut out);
        }
        for t in producers {
            t.join().unwrap();
        }
        while q.pop_batch(&mut out, 4, Wait::No) > 0 {
            got.append(&mut out);
        }
        assert_eq!(got.len(), 4);
        check(&got, 2);
        assert_eq!(q.rmem(), 0, "everything consumed is given back");
    });
}

/// A reader blocked in `pop` is woken by a push from either producer: no
/// interleaving loses the wake-up (loom reports a deadlock if one does).
#[test]
fn blocked_reader_is_always_woken() {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        let q = Arc::new(SocketQueue::<Item>::new(2, 1 << 20));
        let producers: Vec<_> = (0..2)
            .map(|p| {
                let q = q.clone();
                thread::spawn(move || q.push(p, item(p, 0)).unwrap())
            })
            .collect();
        let mut got = Vec::new();
        while got.len() < 2 {
            got.push(q.pop(Wait::Forever).expect("woken with data"));
        }
        for t in producers {
            t.join().unwrap();
        }
        check(&got, 1);
        assert_eq!(q.rmem(), 0);
    });
}

/// The receive-buffer limit under two producers: room for three items.
/// What each producer was refused it counted as drops; what was accepted
/// arrives once and in order; the charges return to zero.
#[test]
fn limit_holds_and_drops_are_counted() {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        let q = Arc::new(SocketQueue::<Item>::new(2, 300));
        let producers: Vec<_> = (0..2)
            .map(|p| {
                let q = q.clone();
                thread::spawn(move || {
                    let mut batch = vec![item(p, 0), item(p, 1)];
                    match q.push_batch(p, &mut batch) {
                        Ok(()) => 0,
                        Err(Refusal::Full) => batch.len() as u64,
                        Err(Refusal::Closed) => unreachable!("nobody closes"),
                        Err(Refusal::Mem) => unreachable!("no stack-wide cap"),
                    }
                })
            })
            .collect();
        let refused: Vec<u64> = producers.into_iter().map(|t| t.join().unwrap()).collect();
        let mut got = Vec::new();
        let mut out = Vec::new();
        while q.pop_batch(&mut out, 4, Wait::No) > 0 {
            got.append(&mut out);
        }
        // The bound with two producers is rcvbuf + one burst of the other.
        assert!(got.len() * 100 <= 300 + 200, "{} items accepted", got.len());
        assert!(got.len() >= 3 - 1, "room was left unused: {} accepted", got.len());
        for p in 0..2 {
            assert_eq!(q.drops(p), refused[p], "producer {p}'s drops");
            let seqs: Vec<u32> = got.iter().filter(|i| i.producer == p).map(|i| i.seq).collect();
            assert_eq!(seqs, (0..seqs.len() as u32).collect::<Vec<_>>(), "a prefix, in order");
        }
        assert_eq!(got.len() as u64 + refused.iter().sum::<u64>(), 4);
        assert_eq!(q.rmem(), 0);
    });
}

/// Close while a producer pushes: whatever was accepted is dropped by
/// close (and given back), later pushes are refused, and a blocked reader
/// wakes.
#[test]
fn close_races_a_producer() {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(3);
    model.check(|| {
        let q = Arc::new(SocketQueue::<Item>::new(2, 1 << 20));
        let q2 = q.clone();
        let producer = thread::spawn(move || {
            let mut batch = vec![item(0, 0)];
            q2.push_batch(0, &mut batch).is_ok()
        });
        q.close();
        let accepted = producer.join().unwrap();
        assert!(q.pop(Wait::Forever).is_none(), "closed: nothing left, no wait");
        assert_eq!(q.rmem(), 0, "accepted {accepted}: closing gave it back");
        assert!(q.push(1, item(1, 0)).is_err());
    });
}

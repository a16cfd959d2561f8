//! Model checking of the sleep hand-off with loom: the production code of
//! `stack/src/shared/doorbell.rs` with loom's atomics (`--cfg loom`). An
//! lcore about to sleep and producers queueing work for it: in every
//! interleaving, either the lcore's last look finds the work or a
//! producer rings its bell, and the bell rings once per sleep.
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p spate-stack --test loom_doorbell --features internals --release
//! ```
#![cfg(loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use spate_stack::internals::Doorbell;

/// A queue as the weakest producer publishes into it (an `rte_ring`'s
/// release store of its tail), read with acquire.
fn push(queue: &AtomicUsize) {
    let n = queue.load(Ordering::Relaxed);
    queue.store(n + 1, Ordering::Release);
}

#[test]
fn a_producer_never_leaves_a_sleeping_lcore_unwoken() {
    loom::model(|| {
        let bell = Arc::new(Doorbell::new());
        let queue = Arc::new(AtomicUsize::new(0));
        let rings = Arc::new(AtomicUsize::new(0));
        let producer = {
            let (bell, queue, rings) = (bell.clone(), queue.clone(), rings.clone());
            thread::spawn(move || {
                push(&queue);
                if bell.should_ring() {
                    rings.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        // The lcore: going to sleep, then its last look.
        bell.going_to_sleep();
        let found = queue.load(Ordering::Acquire) > 0;
        producer.join().unwrap();
        if !found {
            assert_eq!(rings.load(Ordering::Relaxed), 1, "the lcore slept with work queued and no ring");
        }
        bell.awake();
    });
}

#[test]
fn two_producers_ring_once_per_sleep() {
    loom::model(|| {
        let bell = Arc::new(Doorbell::new());
        let queue = Arc::new(AtomicUsize::new(0));
        let rings = Arc::new(AtomicUsize::new(0));
        bell.going_to_sleep();
        let producers: Vec<_> = (0..2)
            .map(|_| {
                let (bell, queue, rings) = (bell.clone(), queue.clone(), rings.clone());
                thread::spawn(move || {
                    queue.fetch_add(1, Ordering::Release);
                    if bell.should_ring() {
                        rings.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for p in producers {
            p.join().unwrap();
        }
        assert_eq!(rings.load(Ordering::Relaxed), 1, "one ring for the sleep");
        bell.awake();
        // Awake: nobody rings.
        assert!(!bell.should_ring());
    });
}

#[test]
fn work_for_the_callback_never_leaves_a_sleeping_lcore_unwoken() {
    loom::model(|| {
        let bell = Arc::new(Doorbell::new());
        let rings = Arc::new(AtomicUsize::new(0));
        // `Stack::wake_lcore`: the flag, then the look at the lcore.
        let producer = {
            let (bell, rings) = (bell.clone(), rings.clone());
            thread::spawn(move || {
                bell.note_app_work();
                if bell.should_ring() {
                    rings.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        // The lcore: going to sleep, then its last look, the flag in it.
        bell.going_to_sleep();
        let found = bell.has_app_work();
        producer.join().unwrap();
        if !found {
            assert_eq!(rings.load(Ordering::Relaxed), 1, "the lcore slept with work for its callback and no ring");
        }
        bell.awake();
        // The next turn takes the flag: set by the producer either way.
        assert!(bell.take_app_work());
        assert!(!bell.has_app_work());
    });
}

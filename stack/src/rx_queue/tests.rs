//! The receive queue's unit tests (its loom models are in
//! `stack/tests/loom_rx_queue.rs`).

use super::*;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, PartialEq, Eq)]
struct D(u32, usize);
impl Truesize for D {
    fn truesize(&self) -> usize {
        self.1
    }
}

#[test]
fn fifo_per_producer_and_round_robin_splice() {
    let q = SocketQueue::new(2, 1 << 20);
    for i in 0..3 {
        q.push(0, D(i, 10)).unwrap();
        q.push(1, D(100 + i, 10)).unwrap();
    }
    let got: Vec<u32> = std::iter::from_fn(|| q.pop(Wait::No)).map(|d| d.0).collect();
    assert_eq!(got, vec![0, 1, 2, 100, 101, 102]);
    assert_eq!(q.rmem(), 0, "all given back once the lists ran dry");
}

#[test]
fn rcvbuf_limit_and_batched_release() {
    let q = SocketQueue::new(1, 1000);
    for i in 0..10 {
        q.push(0, D(i, 100)).unwrap();
    }
    assert!(matches!(q.push(0, D(99, 1)), Err(Refused::Full(D(99, 1)))));
    assert_eq!(q.drops(0), 1);
    assert_eq!(q.rmem(), 1000);
    q.pop(Wait::No).unwrap();
    assert_eq!(q.rmem(), 1000, "100 owed is under a quarter: not released yet");
    q.pop(Wait::No).unwrap();
    q.pop(Wait::No).unwrap();
    assert_eq!(q.rmem(), 700, "300 owed passes 250: released");
    let mut out = Vec::with_capacity(16);
    assert_eq!(q.pop_batch(&mut out, 16, Wait::No), 7);
    assert_eq!(q.rmem(), 0);
}

#[test]
fn batches_are_taken_whole_or_up_to_the_limit() {
    let q = SocketQueue::new(1, 1000);
    let mut b: Vec<D> = (0..5).map(|i| D(i, 100)).collect();
    q.push_batch(0, &mut b).unwrap();
    assert!(b.is_empty());
    let mut b: Vec<D> = (5..12).map(|i| D(i, 100)).collect();
    assert_eq!(q.push_batch(0, &mut b), Err(Refusal::Full));
    assert_eq!(b.iter().map(|d| d.0).collect::<Vec<_>>(), vec![10, 11], "the prefix that fits went in");
    assert_eq!((q.rmem(), q.drops(0)), (1000, 2));
    let got: Vec<u32> = std::iter::from_fn(|| q.pop(Wait::No)).map(|d| d.0).collect();
    assert_eq!(got, (0..10).collect::<Vec<_>>());
    q.close();
    let mut b = vec![D(1, 1)];
    assert_eq!(q.push_batch(0, &mut b), Err(Refusal::Closed));
    assert_eq!(b.len(), 1);
}

#[test]
fn queues_sharing_a_cap_hold_no_more_than_it_together() {
    let cap = std::sync::Arc::new(MemCap::new(300, 0));
    let a = SocketQueue::with_cap(1, 1000, Some(cap.clone()));
    let b = SocketQueue::with_cap(1, 1000, Some(cap.clone()));
    let mut batch: Vec<D> = (0..2).map(|i| D(i, 100)).collect();
    a.push_batch(0, &mut batch).unwrap();
    let mut batch: Vec<D> = (2..4).map(|i| D(i, 100)).collect();
    assert_eq!(b.push_batch(0, &mut batch), Err(Refusal::Mem), "each has room, the cap has not");
    assert_eq!(batch.len(), 1, "the prefix that fits went in");
    assert!(matches!(a.push(0, D(9, 100)), Err(Refused::Mem(_))));
    assert_eq!((cap.held(), a.drops(0), b.drops(0)), (300, 1, 1));
    let mut out = Vec::new();
    assert_eq!(a.pop_batch(&mut out, 8, Wait::No), 2);
    assert_eq!(cap.held(), 100, "the reader gave it back");
    b.close();
    assert_eq!(cap.held(), 0, "and closing did");
    // With a floor of 200 bytes per queue, a queue holding less than
    // that still takes what reaches the floor while the cap is full.
    let cap = std::sync::Arc::new(MemCap::new(300, 200));
    let (a, b) = (SocketQueue::with_cap(1, 1000, Some(cap.clone())), SocketQueue::with_cap(1, 1000, Some(cap.clone())));
    let mut batch: Vec<D> = (0..4).map(|i| D(i, 100)).collect();
    assert_eq!(a.push_batch(0, &mut batch), Err(Refusal::Mem));
    assert_eq!(cap.held(), 300);
    let mut batch: Vec<D> = (0..3).map(|i| D(i, 100)).collect();
    assert_eq!(b.push_batch(0, &mut batch), Err(Refusal::Mem));
    assert_eq!((batch.len(), cap.held()), (1, 500), "b reached its floor, no more");
}

#[test]
fn close_refuses_and_wakes() {
    let q = Arc::new(SocketQueue::new(1, 1000));
    q.push(0, D(1, 10)).unwrap();
    let q2 = q.clone();
    let waiter = std::thread::spawn(move || {
        let first = q2.pop(Wait::Forever);
        let second = q2.pop(Wait::Forever);
        (first, second)
    });
    std::thread::sleep(Duration::from_millis(50));
    q.close();
    let (first, second) = waiter.join().unwrap();
    assert_eq!(first, Some(D(1, 10)));
    assert_eq!(second, None);
    assert!(matches!(q.push(0, D(2, 10)), Err(Refused::Closed(_))));
}

#[test]
fn halt_wakes_every_waiter_and_keeps_readers_from_waiting() {
    let q = Arc::new(SocketQueue::<D>::new(1, 1000));
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let q = q.clone();
            std::thread::spawn(move || q.pop(Wait::Forever))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    q.halt();
    for w in waiters {
        assert_eq!(w.join().unwrap(), None);
    }
    // Later reads do not wait; after resume they do again.
    assert_eq!(q.pop(Wait::Forever), None);
    q.resume();
    let deadline = StdInstant::now() + Duration::from_millis(30);
    assert_eq!(q.pop(Wait::Until(deadline)), None);
    assert!(StdInstant::now() >= deadline);
}

#[test]
fn pop_each_hands_over_in_order_and_keeps_what_is_given_back() {
    let cap = Arc::new(MemCap::new(10_000, 0));
    let q = SocketQueue::with_cap(2, 1000, Some(cap.clone()));
    for i in 0..3 {
        q.push(0, D(i, 100)).unwrap();
        q.push(1, D(10 + i, 100)).unwrap();
    }
    // Across both producers' lists; the fifth is given back.
    let mut got = Vec::new();
    let n = q.try_pop_each(8, |d| {
        if got.len() == 4 {
            return Err(d);
        }
        got.push(d);
        Ok(())
    });
    assert_eq!(n, 4);
    assert_eq!(got.len(), 4);
    // What is still queued is charged, and read next, in order.
    assert_eq!((q.rmem(), cap.held()), (200, 200));
    let mut rest = Vec::new();
    let taken = q.try_pop_each(8, |d| {
        rest.push(d);
        Ok(())
    });
    assert_eq!(taken, 2);
    let mut all: Vec<D> = got.into_iter().chain(rest).collect();
    let (a, b): (Vec<D>, Vec<D>) = all.drain(..).partition(|d| d.0 < 10);
    assert_eq!(a, [D(0, 100), D(1, 100), D(2, 100)]);
    assert_eq!(b, [D(10, 100), D(11, 100), D(12, 100)]);
    assert_eq!((q.rmem(), cap.held()), (0, 0));
    // The first one given back: nothing taken, it stays and is seen.
    q.push(0, D(7, 10)).unwrap();
    assert_eq!(q.try_pop_each(8, Err), 0);
    assert!(!q.looks_empty());
    assert_eq!(q.try_pop_each(1, |_| Ok(())), 1);
    assert!(q.looks_empty());
    assert_eq!(q.try_pop_each(1, |_| Ok(())), 0);
}

#[test]
fn shut_reads_wakes_waiters_and_keeps_what_is_queued_and_comes() {
    let q = Arc::new(SocketQueue::<D>::new(1, 1000));
    let q2 = q.clone();
    let waiter = std::thread::spawn(move || q2.pop(Wait::Forever));
    std::thread::sleep(Duration::from_millis(50));
    q.shut_reads();
    assert_eq!(waiter.join().unwrap(), None);
    // Datagrams still arrive and are read; an empty queue never waits.
    q.push(0, D(7, 10)).unwrap();
    assert_eq!(q.pop(Wait::Forever), Some(D(7, 10)));
    assert_eq!(q.pop(Wait::Forever), None);
    assert!(q.is_shut() && !q.is_halted());
}

#[test]
fn an_awake_reader_costs_no_wakeups() {
    let q = Arc::new(SocketQueue::new(1, 1 << 20));
    for i in 0..1000 {
        q.push(0, D(i, 10)).unwrap();
    }
    let mut out = Vec::with_capacity(1000);
    assert_eq!(q.pop_batch(&mut out, 1000, Wait::Forever), 1000);
    assert_eq!(q.wakeups(), 0, "nobody slept, nobody was woken");
    let q2 = q.clone();
    let t = std::thread::spawn(move || q2.pop(Wait::Forever));
    // Bounded wait until the reader sleeps (it registers before it does).
    let deadline = StdInstant::now() + Duration::from_secs(10);
    while q.waiters.count.load(Ordering::SeqCst) == 0 {
        assert!(StdInstant::now() < deadline, "the reader never blocked");
        std::thread::sleep(Duration::from_millis(1));
    }
    q.push(0, D(7, 1)).unwrap();
    assert_eq!(t.join().unwrap(), Some(D(7, 1)));
    assert_eq!(q.wakeups(), 1, "one sleeping reader, one wake-up");
}

#[test]
fn blocked_reader_wakes_on_push_and_times_out_when_idle() {
    let q = Arc::new(SocketQueue::new(1, 1000));
    let start = StdInstant::now();
    assert!(q.pop(Wait::Until(start + Duration::from_millis(30))).is_none());
    assert!(start.elapsed() >= Duration::from_millis(30));
    let q2 = q.clone();
    let t = std::thread::spawn(move || q2.pop(Wait::Forever));
    std::thread::sleep(Duration::from_millis(30));
    q.push(0, D(7, 1)).unwrap();
    assert_eq!(t.join().unwrap(), Some(D(7, 1)));
}

//! A socket's receive queue, split as Linux splits `sk_receive_queue` and
//! `reader_queue`: one producer list per lcore (its own lock and cache
//! line, written by that lcore and emptied by the reader's splice) and one
//! reader list that only readers touch. A reader takes datagrams from its
//! list; when it is empty it splices a whole producer list across in O(1)
//! (a swap of two `VecDeque`s, the emptied one keeping its capacity), taking
//! producers in turn so none starves.
//!
//! Memory accounting follows `udp_rmem_release`: producers charge each
//! datagram's true size to `rmem` before queueing it and drop it when the
//! charge would pass `rcvbuf`; the reader gives back what it consumed in
//! batches, once a quarter of `rcvbuf` is owed or its list ran dry.
//!
//! Overshoot: a producer adds its charge and takes it back if the sum
//! passed `rcvbuf`, so accepted datagrams never hold more than `rcvbuf`; the
//! counter itself can read up to (producers x largest datagram) too high
//! for an instant, which makes concurrent producers drop a little early,
//! never late.

use std::collections::VecDeque;
use std::time::Instant as StdInstant;

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, Ordering, lock};

/// What a queued item costs against the receive buffer.
pub trait Truesize {
    /// Bytes charged for it.
    fn truesize(&self) -> usize;
}

/// Why a push was refused; the item comes back.
#[derive(Debug)]
pub enum Refused<T> {
    /// The receive buffer is full.
    Full(T),
    /// The socket is closed.
    Closed(T),
}

struct Producer<T> {
    list: Mutex<VecDeque<T>>,
    // Counters the producer writes sit in the producer's own line.
    drops: AtomicU64,
}

struct Reader<T> {
    list: VecDeque<T>,
    next: usize,
    owed: usize,
}

struct Memory {
    rmem: AtomicUsize,
    rcvbuf: AtomicUsize,
}

struct Waiters {
    count: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

/// Why `push_batch` left items behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The receive buffer is full.
    Full,
    /// The socket is closed.
    Closed,
}

/// How long `pop` may wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Not at all.
    No,
    /// Until something arrives or the queue closes.
    Forever,
    /// Until this moment.
    Until(StdInstant),
}

/// The receive queue.
pub struct RxQueue<T> {
    producers: Box<[CachePadded<Producer<T>>]>,
    reader: CachePadded<Mutex<Reader<T>>>,
    mem: CachePadded<Memory>,
    waiters: CachePadded<Waiters>,
    closed: AtomicBool,
    // Set by `interrupt`: the next wait returns at once (a socket error arrived).
    alert: AtomicBool,
}

impl<T> std::fmt::Debug for RxQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxQueue")
            .field("producers", &self.producers.len())
            .field("rmem", &self.mem.rmem.load(Ordering::Relaxed))
            .field("rcvbuf", &self.mem.rcvbuf.load(Ordering::Relaxed))
            .finish()
    }
}

impl<T: Truesize> RxQueue<T> {
    /// A queue with `producers` producer lists and a `rcvbuf`-byte limit.
    pub fn new(producers: usize, rcvbuf: usize) -> Self {
        RxQueue {
            producers: (0..producers.max(1))
                .map(|_| CachePadded::new(Producer { list: Mutex::new(VecDeque::new()), drops: AtomicU64::new(0) }))
                .collect(),
            reader: CachePadded::new(Mutex::new(Reader { list: VecDeque::new(), next: 0, owed: 0 })),
            mem: CachePadded::new(Memory { rmem: AtomicUsize::new(0), rcvbuf: AtomicUsize::new(rcvbuf) }),
            waiters: CachePadded::new(Waiters { count: AtomicUsize::new(0), lock: Mutex::new(()), cv: Condvar::new() }),
            closed: AtomicBool::new(false),
            alert: AtomicBool::new(false),
        }
    }

    /// Wakes waiting readers without data: their `pop` returns `None` so
    /// they can look at the socket's pending error.
    pub fn interrupt(&self) {
        self.alert.store(true, Ordering::SeqCst);
        let _g = lock(&self.waiters.lock);
        self.waiters.cv.notify_all();
    }

    /// Queues `item` from producer `p` (its lcore index).
    #[inline]
    pub fn push(&self, p: usize, item: T) -> Result<(), Refused<T>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Refused::Closed(item));
        }
        let producer = &self.producers[p];
        let size = item.truesize();
        let rcvbuf = self.mem.rcvbuf.load(Ordering::Relaxed);
        let before = self.mem.rmem.fetch_add(size, Ordering::Relaxed);
        if before + size > rcvbuf {
            self.mem.rmem.fetch_sub(size, Ordering::Relaxed);
            producer.drops.fetch_add(1, Ordering::Relaxed);
            return Err(Refused::Full(item));
        }
        lock(&producer.list).push_back(item);
        // SeqCst pairs with the reader's registration in `wait`: either the
        // reader sees the item, or we see the reader and wake it.
        if self.waiters.count.load(Ordering::SeqCst) > 0 {
            let _g = lock(&self.waiters.lock);
            self.waiters.cv.notify_all();
        }
        Ok(())
    }

    /// Queues every item of `batch` from producer `p` with one charge and
    /// one lock. What does not fit, or everything if the queue is closed,
    /// stays in `batch` and the error says why.
    #[inline]
    pub fn push_batch(&self, p: usize, batch: &mut Vec<T>) -> Result<(), Refusal> {
        if batch.is_empty() {
            return Ok(());
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(Refusal::Closed);
        }
        let producer = &self.producers[p];
        let rcvbuf = self.mem.rcvbuf.load(Ordering::Relaxed);
        let total: usize = batch.iter().map(Truesize::truesize).sum();
        let before = self.mem.rmem.fetch_add(total, Ordering::Relaxed);
        let mut taken = batch.len();
        if before + total > rcvbuf {
            // Take back the charge; keep the longest prefix that fits.
            self.mem.rmem.fetch_sub(total, Ordering::Relaxed);
            let mut room = rcvbuf.saturating_sub(self.mem.rmem.load(Ordering::Relaxed));
            let mut size = 0;
            taken = 0;
            for item in batch.iter() {
                let s = item.truesize();
                if s > room {
                    break;
                }
                room -= s;
                size += s;
                taken += 1;
            }
            let now = self.mem.rmem.fetch_add(size, Ordering::Relaxed);
            if now + size > rcvbuf {
                self.mem.rmem.fetch_sub(size, Ordering::Relaxed);
                taken = 0;
            }
            producer.drops.fetch_add((batch.len() - taken) as u64, Ordering::Relaxed);
        }
        if taken > 0 {
            lock(&producer.list).extend(batch.drain(..taken));
            if self.waiters.count.load(Ordering::SeqCst) > 0 {
                let _g = lock(&self.waiters.lock);
                self.waiters.cv.notify_all();
            }
        }
        if batch.is_empty() { Ok(()) } else { Err(Refusal::Full) }
    }

    /// Takes the oldest datagram of the reader list, splicing a producer
    /// list across when it is empty; waits as `wait` says.
    pub fn pop(&self, wait: Wait) -> Option<T> {
        loop {
            if let Some(item) = self.try_pop() {
                return Some(item);
            }
            if !self.wait(wait) {
                return None;
            }
        }
    }

    /// Takes up to `max` datagrams into `out` (no allocation while `out`
    /// has room); waits as `wait` says for the first one.
    pub fn pop_batch(&self, out: &mut Vec<T>, max: usize, wait: Wait) -> usize {
        loop {
            let n = self.try_pop_batch(out, max);
            if n > 0 || max == 0 {
                return n;
            }
            if !self.wait(wait) {
                return 0;
            }
        }
    }

    fn try_pop(&self) -> Option<T> {
        let mut r = lock(&self.reader);
        if r.list.is_empty() {
            self.splice(&mut r);
        }
        let item = r.list.pop_front()?;
        self.consumed(&mut r, item.truesize());
        Some(item)
    }

    fn try_pop_batch(&self, out: &mut Vec<T>, max: usize) -> usize {
        let mut r = lock(&self.reader);
        let mut n = 0;
        let mut size = 0;
        while n < max {
            if r.list.is_empty() && !self.splice(&mut r) {
                break;
            }
            match r.list.pop_front() {
                Some(item) => {
                    size += item.truesize();
                    out.push(item);
                    n += 1;
                }
                None => break,
            }
        }
        if n > 0 {
            self.consumed(&mut r, size);
        }
        n
    }

    /// Swaps the next non-empty producer list into the (empty) reader list.
    fn splice(&self, r: &mut Reader<T>) -> bool {
        let n = self.producers.len();
        for i in 0..n {
            let idx = (r.next + i) % n;
            let mut list = lock(&self.producers[idx].list);
            if !list.is_empty() {
                std::mem::swap(&mut r.list, &mut *list);
                r.next = (idx + 1) % n;
                return true;
            }
        }
        false
    }

    /// Gives back consumed memory in batches.
    fn consumed(&self, r: &mut Reader<T>, size: usize) {
        r.owed += size;
        let threshold = self.mem.rcvbuf.load(Ordering::Relaxed) / 4;
        if r.owed >= threshold || r.list.is_empty() {
            self.mem.rmem.fetch_sub(r.owed, Ordering::Relaxed);
            r.owed = 0;
        }
    }

    /// Blocks as `wait` allows; false when the caller should stop trying.
    fn wait(&self, wait: Wait) -> bool {
        if wait == Wait::No || self.closed.load(Ordering::Acquire) || self.alert.swap(false, Ordering::SeqCst) {
            return false;
        }
        let w = &self.waiters;
        let mut g = lock(&w.lock);
        // Registered before looking, so a push after the look sees us.
        w.count.fetch_add(1, Ordering::SeqCst);
        let timed_out = if self.has_data() || self.closed.load(Ordering::Acquire) || self.alert.load(Ordering::SeqCst) {
            false
        } else {
            match wait {
                Wait::No => true,
                Wait::Forever => {
                    g = w.cv.wait(g).unwrap_or_else(|p| p.into_inner());
                    false
                }
                Wait::Until(deadline) => {
                    let now = StdInstant::now();
                    if now >= deadline {
                        true
                    } else {
                        #[cfg(not(loom))]
                        {
                            g = w.cv.wait_timeout(g, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
                        }
                        #[cfg(loom)]
                        {
                            g = w.cv.wait(g).unwrap();
                        }
                        false
                    }
                }
            }
        };
        w.count.fetch_sub(1, Ordering::SeqCst);
        drop(g);
        !timed_out && !self.closed.load(Ordering::Acquire) && !self.alert.swap(false, Ordering::SeqCst)
    }

    /// Whether anything is queued (looks at producer lists: not for the fast path).
    pub fn has_data(&self) -> bool {
        !lock(&self.reader).list.is_empty() || self.producers.iter().any(|p| !lock(&p.list).is_empty())
    }

    /// Closes the queue: later pushes are refused, waiters wake, and what
    /// was queued is dropped (freeing its mbufs).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let mut dropped: VecDeque<T> = std::mem::take(&mut lock(&self.reader).list);
        for p in self.producers.iter() {
            dropped.extend(lock(&p.list).drain(..));
        }
        let size: usize = dropped.iter().map(Truesize::truesize).sum();
        self.mem.rmem.fetch_sub(size.min(self.rmem()), Ordering::Relaxed);
        drop(dropped);
        let _g = lock(&self.waiters.lock);
        self.waiters.cv.notify_all();
    }

    /// Whether it is closed.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Bytes charged now.
    pub fn rmem(&self) -> usize {
        self.mem.rmem.load(Ordering::Relaxed)
    }

    /// The limit.
    pub fn rcvbuf(&self) -> usize {
        self.mem.rcvbuf.load(Ordering::Relaxed)
    }

    /// Sets the limit.
    pub fn set_rcvbuf(&self, bytes: usize) {
        self.mem.rcvbuf.store(bytes, Ordering::Relaxed);
    }

    /// Drops counted by producer `p`.
    pub fn drops(&self, p: usize) -> u64 {
        self.producers[p].drops.load(Ordering::Relaxed)
    }

    /// All drops.
    pub fn total_drops(&self) -> u64 {
        self.producers.iter().map(|p| p.drops.load(Ordering::Relaxed)).sum()
    }

    /// Number of producer lists.
    pub fn producers(&self) -> usize {
        self.producers.len()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
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
        let q = RxQueue::new(2, 1 << 20);
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
        let q = RxQueue::new(1, 1000);
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
        let q = RxQueue::new(1, 1000);
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
    fn close_refuses_and_wakes() {
        let q = Arc::new(RxQueue::new(1, 1000));
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
    fn blocked_reader_wakes_on_push_and_times_out_when_idle() {
        let q = Arc::new(RxQueue::new(1, 1000));
        let start = StdInstant::now();
        assert!(q.pop(Wait::Until(start + Duration::from_millis(30))).is_none());
        assert!(start.elapsed() >= Duration::from_millis(30));
        let q2 = q.clone();
        let t = std::thread::spawn(move || q2.pop(Wait::Forever));
        std::thread::sleep(Duration::from_millis(30));
        q.push(0, D(7, 1)).unwrap();
        assert_eq!(t.join().unwrap(), Some(D(7, 1)));
    }
}

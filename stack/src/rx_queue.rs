//! A socket's receive queue, split as Linux splits `sk_receive_queue` and
//! `reader_queue`: one producer list per lcore (its own lock and cache
//! line, written by that lcore and emptied by the reader's splice) and one
//! reader list that only readers touch. A reader takes datagrams from its
//! list; when it is empty it splices a whole producer list across in O(1)
//! (the producer's `Vec` becomes the reader's `VecDeque` and the reader's
//! emptied buffer the producer's, both keeping their capacity), taking
//! producers in turn so none starves. Whole lists move with one copy at
//! most: a producer whose list is empty swaps the burst's buffer in (no
//! copy; the burst keeps the list's empty buffer) and otherwise appends
//! the burst with one `memcpy`, and a reader with
//! room for all of a producer's list takes it straight into its batch the
//! same way, the list keeping its buffer. Each side publishes how many items
//! its list holds, so a poll of an empty queue reads those words and takes
//! no lock at all, and a splice skips empty producers without touching
//! their locks.
//!
//! Memory accounting follows `udp_rmem_release`, without a shared
//! read-modify-write counter: each producer adds what it queues to its own
//! `charged` word (under its own lock, on its own line); the reader adds
//! what it consumed to one `released` word on its side, in batches, once a
//! quarter of `rcvbuf` is owed or its list ran dry. The bytes held are
//! the sum of the charges less the releases. A producer queues the longest
//! prefix of its burst that fits under `rcvbuf` and drops the rest,
//! counting the drops on its own line.
//!
//! A stack-wide cap (Linux's `udp_mem`) bounds what all queues that share
//! a [`MemCap`] hold together: a producer also charges the cap (one atomic
//! add per queued run) and queues only what fits under both limits; the
//! reader gives the cap back what it releases. Drops for want of the
//! cap's room are told apart from a full receive buffer
//! ([`Refusal::Mem`]). The cap can be overshot as the buffer can, by what
//! producers check and charge at the same moment. Each queue may hold
//! the cap's `min` bytes whatever the others hold (Linux's
//! `udp_rmem_min`), so the queues hold at most the cap plus `min` each.
//!
//! Overshoot: a producer sees every other producer's charges up to that
//! producer's last unlock, so what can be missing is at most one burst per
//! other producer still inside its critical section. The bytes held stay
//! under `rcvbuf + (producers - 1) x (largest burst a producer charges at
//! once)`; with spate's 32-frame bursts of 2 KiB mbufs that is about 72 KB
//! per extra lcore. A release seen late makes a producer drop early, never
//! late.

use std::collections::VecDeque;
use std::task::Waker;
use std::time::Instant as StdInstant;

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, Ordering, lock};

/// Naps in a row a reader takes on an empty queue before it asks to be
/// woken (see `RxQueue::set_nap`).
const EMPTY_NAPS: usize = 2;

/// A producer list's first buffer: room for a burst (spate's are 32), so
/// a burst queued on the empty list can be swapped in whole instead of
/// copied (see `push_batch`).
const PRODUCER_CAPACITY: usize = 32;

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
    /// The stack-wide cap on receive memory is reached.
    Mem(T),
    /// The socket is closed.
    Closed(T),
}

/// One lcore's side: everything here is written by that lcore, except
/// that the reader's splice empties `list` and zeroes `queued` under the
/// same lock.
struct Producer<T> {
    list: Mutex<Vec<T>>,
    /// `list.len()`, published for lock-free polls (written under `list`'s lock).
    queued: AtomicUsize,
    /// What `list`'s items are charged, so a splice that takes the list
    /// whole need not sum them (read and written under `list`'s lock).
    bytes: AtomicUsize,
    /// Bytes this producer ever queued (wrapping; written under `list`'s lock).
    charged: AtomicUsize,
    /// Datagrams this producer dropped for want of room.
    drops: AtomicU64,
}

struct Reader<T> {
    list: VecDeque<T>,
    next: usize,
    owed: usize,
}

/// The readers' side: written by whoever holds `reader`.
struct ReaderSide<T> {
    reader: Mutex<Reader<T>>,
    /// The reader list's length, published for lock-free polls.
    queued: AtomicUsize,
    /// Bytes ever given back (wrapping).
    released: AtomicUsize,
    /// Naps in a row that found nothing (see `set_nap`).
    empty_naps: AtomicUsize,
}

struct Waiters {
    /// Blocked readers, and 1 while a task's waker is registered.
    count: AtomicUsize,
    /// The registered task's waker (an async reader), under the lock
    /// blocked readers wait with.
    lock: Mutex<Option<Waker>>,
    cv: Condvar,
    /// Times a producer woke sleeping readers.
    wakes: AtomicU64,
}

/// Why `push_batch` left items behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The receive buffer is full.
    Full,
    /// The stack-wide cap on receive memory is reached.
    Mem,
    /// The socket is closed.
    Closed,
}

/// The stack-wide cap on what receive queues hold (Linux's `udp_mem`):
/// the bytes every queue sharing it holds, and the limit.
#[derive(Debug)]
pub struct MemCap {
    held: CachePadded<AtomicUsize>,
    limit: usize,
    /// What each queue may hold whatever the others hold (Linux's
    /// `udp_rmem_min`), so a socket whose reader keeps up still receives
    /// while stalled ones hold the cap.
    min: usize,
}

impl MemCap {
    /// A cap of `limit` bytes, each queue keeping `min` bytes of room
    /// whatever the others hold.
    pub fn new(limit: usize, min: usize) -> MemCap {
        MemCap { held: CachePadded::new(AtomicUsize::new(0)), limit, min }
    }

    /// Bytes held by the queues sharing it.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }
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
    readers: CachePadded<ReaderSide<T>>,
    waiters: CachePadded<Waiters>,
    /// Read by everyone, written when the socket changes: the limit, closed
    /// and the alert (set by `interrupt`: the next wait returns at once, a
    /// socket error arrived).
    rcvbuf: AtomicUsize,
    closed: AtomicBool,
    alert: AtomicBool,
    /// Readers do not wait while it is set (`halt`: the stack stopped).
    halted: AtomicBool,
    /// Readers wait no more, for good (`shut_reads`: the socket was shut
    /// down for reading); what is queued stays readable.
    shut: AtomicBool,
    /// A reader finding nothing naps this many ns before it asks to be
    /// woken (0: it asks at once).
    nap: AtomicU64,
    /// The stack-wide cap it shares, if any.
    cap: Option<std::sync::Arc<MemCap>>,
}

impl<T> std::fmt::Debug for RxQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxQueue")
            .field("producers", &self.producers.len())
            .field("rmem", &self.rmem())
            .field("rcvbuf", &self.rcvbuf.load(Ordering::Relaxed))
            .finish()
    }
}

impl<T> RxQueue<T> {
    /// Bytes charged now: every producer's charges less the releases. The
    /// releases are read first, so the difference never goes below zero.
    pub fn rmem(&self) -> usize {
        let released = self.readers.released.load(Ordering::Acquire);
        let charged = match &self.producers[..] {
            // One polling lcore: no loop.
            [one] => one.charged.load(Ordering::Acquire),
            all => all.iter().fold(0usize, |sum, p| sum.wrapping_add(p.charged.load(Ordering::Acquire))),
        };
        charged.wrapping_sub(released)
    }
}

impl<T: Truesize> RxQueue<T> {
    /// A queue with `producers` producer lists and a `rcvbuf`-byte limit.
    pub fn new(producers: usize, rcvbuf: usize) -> Self {
        Self::with_cap(producers, rcvbuf, None)
    }

    /// A queue as [`new`](Self::new) makes, also bounded by the stack-wide
    /// `cap` it shares with other queues.
    pub fn with_cap(producers: usize, rcvbuf: usize, cap: Option<std::sync::Arc<MemCap>>) -> Self {
        RxQueue {
            producers: (0..producers.max(1))
                .map(|_| {
                    CachePadded::new(Producer {
                        list: Mutex::new(Vec::with_capacity(PRODUCER_CAPACITY)),
                        queued: AtomicUsize::new(0),
                        bytes: AtomicUsize::new(0),
                        charged: AtomicUsize::new(0),
                        drops: AtomicU64::new(0),
                    })
                })
                .collect(),
            readers: CachePadded::new(ReaderSide {
                reader: Mutex::new(Reader { list: VecDeque::new(), next: 0, owed: 0 }),
                queued: AtomicUsize::new(0),
                released: AtomicUsize::new(0),
                empty_naps: AtomicUsize::new(0),
            }),
            waiters: CachePadded::new(Waiters {
                count: AtomicUsize::new(0),
                lock: Mutex::new(None),
                cv: Condvar::new(),
                wakes: AtomicU64::new(0),
            }),
            rcvbuf: AtomicUsize::new(rcvbuf),
            closed: AtomicBool::new(false),
            alert: AtomicBool::new(false),
            halted: AtomicBool::new(false),
            shut: AtomicBool::new(false),
            nap: AtomicU64::new(0),
            cap,
        }
    }

    /// Wakes waiting readers without data: their `pop` returns `None` so
    /// they can look at the socket's pending error.
    pub fn interrupt(&self) {
        self.alert.store(true, Ordering::SeqCst);
        self.wake_all();
    }

    /// Wakes every blocked reader and the registered task.
    fn wake_all(&self) {
        let mut g = lock(&self.waiters.lock);
        self.waiters.cv.notify_all();
        let task = self.unregister(&mut g);
        drop(g);
        wake_task(task);
    }

    /// Wakes every waiting reader and the registered task, and lets no
    /// reader wait until [`resume`](Self::resume): the stack stopped, and
    /// every read returns what is queued or nothing at once.
    pub fn halt(&self) {
        self.halted.store(true, Ordering::SeqCst);
        self.wake_all();
    }

    /// Readers wait again (the stack runs again).
    pub fn resume(&self) {
        self.halted.store(false, Ordering::SeqCst);
    }

    /// Whether readers may not wait ([`halt`](Self::halt)).
    pub fn is_halted(&self) -> bool {
        self.halted.load(Ordering::SeqCst)
    }

    /// Wakes every waiting reader and the registered task, and lets no
    /// reader wait again: the socket was shut down for reading. What is
    /// queued, and what still arrives, stays readable.
    pub fn shut_reads(&self) {
        self.shut.store(true, Ordering::SeqCst);
        self.wake_all();
    }

    /// Whether [`shut_reads`](Self::shut_reads) was called.
    pub fn is_shut(&self) -> bool {
        self.shut.load(Ordering::SeqCst)
    }

    /// Whether readers wait no more: the socket closed or was shut down
    /// for reading, or the stack stopped.
    fn ended(&self) -> bool {
        self.closed.load(Ordering::Acquire) || self.is_halted() || self.is_shut()
    }

    /// Asks that the task `waker` belongs to be woken when a datagram is
    /// queued, the queue closes or an error is reported (the last task
    /// to ask is the one woken, as with an async socket's `poll_recv`).
    /// Returns false when there is already something to take or report:
    /// the caller looks again instead of waiting.
    pub fn register_waker(&self, waker: &Waker) -> bool {
        let mut g = lock(&self.waiters.lock);
        match &mut *g {
            Some(w) if w.will_wake(waker) => {}
            Some(w) => w.clone_from(waker),
            None => {
                *g = Some(waker.clone());
                // Counted as a waiter: a producer that sees it wakes it.
                self.waiters.count.fetch_add(1, Ordering::SeqCst);
            }
        }
        drop(g);
        // Registered before looking (as `wait` does): a push after the
        // look sees the registration.
        !(self.has_data() || self.ended() || self.alert.load(Ordering::SeqCst))
    }

    /// Takes the registered waker out (the waiters' lock held).
    fn unregister(&self, slot: &mut Option<Waker>) -> Option<Waker> {
        let w = slot.take()?;
        self.waiters.count.fetch_sub(1, Ordering::SeqCst);
        Some(w)
    }

    /// Whether the queue is closed (its socket is).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Takes the alert an error left (`interrupt`), for a poll that reports
    /// the error.
    pub fn clear_alert(&self) {
        self.alert.store(false, Ordering::SeqCst);
    }

    /// Queues `item` from producer `p` (its lcore index).
    #[inline]
    pub fn push(&self, p: usize, item: T) -> Result<(), Refused<T>> {
        let producer = &self.producers[p];
        let size = item.truesize();
        let mut list = lock(&producer.list);
        // Under the lock: `close` drains this list after setting the flag,
        // so an item is either refused here or drained there.
        if self.closed.load(Ordering::Acquire) {
            return Err(Refused::Closed(item));
        }
        let short = if size > self.room() {
            Some(Refused::Full(item))
        } else if size > self.cap_room() {
            Some(Refused::Mem(item))
        } else {
            list.push(item);
            None
        };
        if let Some(refused) = short {
            drop(list);
            producer.drops.fetch_add(1, Ordering::Relaxed);
            return Err(refused);
        }
        self.publish(producer, &list, size);
        drop(list);
        self.wake();
        Ok(())
    }

    /// Queues the longest prefix of `batch` that fits from producer `p`,
    /// under one lock; the rest, or everything if the queue is closed, stays
    /// in `batch` and the error says why.
    #[inline]
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn push_batch(&self, p: usize, batch: &mut Vec<T>) -> Result<(), Refusal> {
        self.push_batch_gathering(p, batch, None)
    }

    /// [`push_batch`](Self::push_batch), leaving the registered task's
    /// waker, if there is one to wake, in `wakers` (when given) for the
    /// caller to wake once its burst is queued.
    #[inline]
    pub fn push_batch_gathering(
        &self,
        p: usize,
        batch: &mut Vec<T>,
        wakers: Option<&mut Vec<Waker>>,
    ) -> Result<(), Refusal> {
        if batch.is_empty() {
            return Ok(());
        }
        let producer = &self.producers[p];
        let mut list = lock(&producer.list);
        // Under the lock, as in `push`.
        if self.closed.load(Ordering::Acquire) {
            return Err(Refusal::Closed);
        }
        let (room, cap_room) = (self.room(), self.cap_room());
        let mut size: usize = match &batch[..] {
            // One, the common case in a group that spread a burst: no loop.
            [one] => one.truesize(),
            all => all.iter().map(Truesize::truesize).sum(),
        };
        let mut taken = batch.len();
        let mut short = Refusal::Full;
        if size > room.min(cap_room) {
            (size, taken) = (0, 0);
            for item in batch.iter() {
                let s = item.truesize();
                if size + s > room.min(cap_room) {
                    if size + s <= room {
                        short = Refusal::Mem;
                    }
                    break;
                }
                size += s;
                taken += 1;
            }
        }
        if let (1, [_]) = (taken, &batch[..]) {
            list.push(batch.pop().expect("one"));
        } else if taken == batch.len() {
            if list.is_empty() && list.capacity() >= batch.capacity() {
                // The batch's buffer becomes the list, without a copy; the
                // batch keeps the list's empty one, no smaller than its own.
                std::mem::swap(&mut *list, batch);
            } else {
                list.append(batch);
            }
        } else {
            list.extend(batch.drain(..taken));
        }
        if taken > 0 {
            self.publish(producer, &list, size);
        }
        drop(list);
        if taken > 0 {
            self.wake_gathering(wakers);
        }
        if batch.is_empty() {
            return Ok(());
        }
        producer.drops.fetch_add(batch.len() as u64, Ordering::Relaxed);
        Err(short)
    }

    /// Bytes the stack-wide cap still has room for.
    #[inline(always)]
    fn cap_room(&self) -> usize {
        match &self.cap {
            None => usize::MAX,
            Some(c) => c.limit.saturating_sub(c.held.load(Ordering::Relaxed)).max(c.min.saturating_sub(self.rmem())),
        }
    }

    /// Bytes a producer may still queue.
    #[inline]
    fn room(&self) -> usize {
        self.rcvbuf.load(Ordering::Relaxed).saturating_sub(self.rmem())
    }

    /// After queueing `size` bytes: the producer's charge and its length,
    /// stored by the lock holder (no read-modify-write), and the
    /// stack-wide cap's charge.
    #[inline]
    fn publish(&self, producer: &Producer<T>, list: &[T], size: usize) {
        producer.charged.store(producer.charged.load(Ordering::Relaxed).wrapping_add(size), Ordering::Release);
        producer.bytes.store(producer.bytes.load(Ordering::Relaxed) + size, Ordering::Relaxed);
        producer.queued.store(list.len(), Ordering::Release);
        if let Some(c) = &self.cap {
            c.held.fetch_add(size, Ordering::Relaxed);
        }
    }

    /// Wakes blocked readers and the registered task, if there are any.
    #[inline]
    fn wake(&self) {
        self.wake_gathering(None);
    }

    /// [`wake`](Self::wake), the task's waker left in `wakers` when given.
    #[inline]
    fn wake_gathering(&self, wakers: Option<&mut Vec<Waker>>) {
        // SeqCst pairs with the reader's registration in `wait` and
        // `register_waker`: either the reader sees the item, or we see the
        // reader and wake it.
        if self.waiters.count.load(Ordering::SeqCst) > 0 {
            self.wake_waiters(wakers);
        }
    }

    #[cold]
    fn wake_waiters(&self, wakers: Option<&mut Vec<Waker>>) {
        let mut g = lock(&self.waiters.lock);
        self.waiters.cv.notify_all();
        self.waiters.wakes.fetch_add(1, Ordering::Relaxed);
        let task = self.unregister(&mut g);
        drop(g);
        match (task, wakers) {
            (Some(w), Some(gathered)) => gathered.push(w),
            (task, _) => wake_task(task),
        }
    }

    /// Times a producer woke sleeping readers (each one system call): none
    /// while readers are awake, however much arrives.
    pub fn wakeups(&self) -> u64 {
        self.waiters.wakes.load(Ordering::Relaxed)
    }

    /// Lets a reader that finds the queue empty nap for `nap` before it
    /// looks again, up to `EMPTY_NAPS` times in a row, instead of asking to
    /// be woken; it registers for a wake-up only when the naps found
    /// nothing (`None`, the default: at once). While datagrams stream in,
    /// every nap finds some, and the polling lcores never make the system
    /// call that wakes a sleeping thread (in a VM that call interrupts the
    /// other vCPU and costs microseconds). The price is latency: a datagram
    /// that arrives during a nap waits for its end.
    pub fn set_nap(&self, nap: Option<std::time::Duration>) {
        self.nap.store(nap.map_or(0, |d| d.as_nanos().max(1) as u64), Ordering::Relaxed);
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

    /// Calls `f` with the oldest datagram of the reader list (a producer
    /// list spliced across when it is empty) and leaves it there; waits as
    /// `wait` says.
    pub fn peek<R>(&self, wait: Wait, f: impl FnOnce(&T) -> R) -> Option<R> {
        loop {
            if !self.looks_empty() {
                let mut r = lock(&self.readers.reader);
                if r.list.is_empty() && self.splice(&mut r, &mut Vec::new(), 0).is_some() {
                    // The spliced list is the reader's now: say so, or
                    // the queue would look empty.
                    self.readers.queued.store(r.list.len(), Ordering::Release);
                }
                if let Some(item) = r.list.front() {
                    return Some(f(item));
                }
            }
            if !self.wait(wait) {
                return None;
            }
        }
    }

    /// Takes up to `max` datagrams into `out` (no allocation while `out`
    /// has room); waits as `wait` says for the first one.
    #[inline]
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

    /// Hands up to `max` datagrams, oldest first, to `take` one at a time
    /// under the reader's lock, never waiting: for a reader that puts
    /// each straight where it goes (libspate's message and datagram
    /// arrays) instead of into a `Vec` first. A datagram `take` gives
    /// back (`Err`) stays at the head, charged as before, and ends the
    /// call. Returns how many `take` kept.
    #[inline]
    pub fn try_pop_each(&self, max: usize, mut take: impl FnMut(T) -> Result<(), T>) -> usize {
        if max == 0 || self.looks_empty() {
            return 0;
        }
        let mut r = lock(&self.readers.reader);
        let (mut n, mut size, mut spliced) = (0, 0, false);
        'lists: while n < max {
            if r.list.is_empty() {
                // Room for none: the producer's list becomes the reader's.
                match self.splice(&mut r, &mut Vec::new(), 0) {
                    None => break,
                    Some(_) => spliced = true,
                }
            }
            while n < max {
                let Some(item) = r.list.pop_front() else { continue 'lists };
                let charged = item.truesize();
                if let Err(item) = take(item) {
                    // Into the slot it left: no allocation.
                    r.list.push_front(item);
                    break 'lists;
                }
                (n, size) = (n + 1, size + charged);
            }
        }
        if n > 0 {
            self.consumed(&mut r, size);
        } else if spliced {
            // The spliced list is the reader's now: say so, or the queue
            // would look empty.
            self.readers.queued.store(r.list.len(), Ordering::Release);
        }
        n
    }

    /// Whether the published lengths say every list is empty: a poll of an
    /// empty queue reads them and takes no lock. A length that is a moment
    /// old only delays a non-blocking poll; `wait` looks under the locks.
    #[inline]
    pub fn looks_empty(&self) -> bool {
        self.readers.queued.load(Ordering::Acquire) == 0
            && match &self.producers[..] {
                [one] => one.queued.load(Ordering::Acquire) == 0,
                all => all.iter().all(|p| p.queued.load(Ordering::Acquire) == 0),
            }
    }

    fn try_pop(&self) -> Option<T> {
        if self.looks_empty() {
            return None;
        }
        let mut r = lock(&self.readers.reader);
        if r.list.is_empty() {
            // Room for none: the list comes across whole.
            self.splice(&mut r, &mut Vec::new(), 0);
        }
        let item = r.list.pop_front();
        if let Some(item) = &item {
            self.consumed(&mut r, item.truesize());
        }
        item
    }

    #[inline]
    fn try_pop_batch(&self, out: &mut Vec<T>, max: usize) -> usize {
        if max == 0 || self.looks_empty() {
            return 0;
        }
        let mut r = lock(&self.readers.reader);
        let mut n = 0;
        let mut size = 0;
        while n < max {
            if r.list.is_empty() {
                match self.splice(&mut r, out, max - n) {
                    None => break,
                    Some((0, _)) => {}
                    Some((k, s)) => {
                        (n, size) = (n + k, size + s);
                        // With one producer, that was all there is.
                        if self.producers.len() == 1 {
                            break;
                        }
                        continue;
                    }
                }
            }
            let k = (max - n).min(r.list.len());
            if k >= 8 {
                // A long run: charged in one pass and moved in one (two
                // copies at most: the deque's two slices).
                size += r.list.range(..k).map(|item| item.truesize()).sum::<usize>();
                out.extend(r.list.drain(..k));
            } else {
                // A few: one by one costs less than a drain.
                for _ in 0..k {
                    let item = r.list.pop_front().expect("k items");
                    size += item.truesize();
                    out.push(item);
                }
            }
            n += k;
        }
        if n > 0 {
            self.consumed(&mut r, size);
        }
        n
    }

    /// Moves the next non-empty producer list across (producers whose
    /// published length is zero are passed over unlocked): straight into
    /// `out` when all of it fits in `room` more items, with one copy
    /// (returns how many items and bytes), otherwise into the empty reader
    /// list, swapped in O(1) (returns no items). `None`: every producer
    /// list is empty.
    #[inline(always)]
    fn splice(&self, r: &mut Reader<T>, out: &mut Vec<T>, room: usize) -> Option<(usize, usize)> {
        let n = self.producers.len();
        for i in 0..n {
            let idx = match r.next + i {
                j if j >= n => j - n,
                j => j,
            };
            let p = &self.producers[idx];
            if p.queued.load(Ordering::Acquire) == 0 {
                continue;
            }
            let mut list = lock(&p.list);
            if list.is_empty() {
                continue;
            }
            let taken = if list.len() <= room {
                let items = (list.len(), p.bytes.load(Ordering::Relaxed));
                if let [_] = &list[..] {
                    out.push(list.pop().expect("one"));
                } else {
                    out.append(&mut list);
                }
                items
            } else {
                // Both conversions keep the buffer: the producer's becomes
                // the reader's, the reader's (empty) the producer's.
                let spare = Vec::from(std::mem::take(&mut r.list));
                r.list = VecDeque::from(std::mem::replace(&mut *list, spare));
                (0, 0)
            };
            p.bytes.store(0, Ordering::Relaxed);
            p.queued.store(0, Ordering::Release);
            r.next = if idx + 1 == n { 0 } else { idx + 1 };
            return Some(taken);
        }
        None
    }

    /// Publishes the reader list's length and gives back consumed memory in
    /// batches.
    fn consumed(&self, r: &mut Reader<T>, size: usize) {
        let side = &self.readers;
        side.queued.store(r.list.len(), Ordering::Release);
        if side.empty_naps.load(Ordering::Relaxed) != 0 {
            side.empty_naps.store(0, Ordering::Relaxed);
        }
        r.owed += size;
        let threshold = self.rcvbuf.load(Ordering::Relaxed) / 4;
        if r.owed >= threshold || r.list.is_empty() {
            self.release(r);
        }
    }

    /// Gives back everything the reader owes (the lock holder writes).
    fn release(&self, r: &mut Reader<T>) {
        let released = &self.readers.released;
        released.store(released.load(Ordering::Relaxed).wrapping_add(r.owed), Ordering::Release);
        if let Some(c) = &self.cap {
            c.held.fetch_sub(r.owed, Ordering::Relaxed);
        }
        r.owed = 0;
    }

    /// Blocks as `wait` allows; false when the caller should stop trying.
    fn wait(&self, wait: Wait) -> bool {
        if wait == Wait::No || self.ended() || self.alert.swap(false, Ordering::SeqCst) {
            return false;
        }
        let nap = self.nap.load(Ordering::Relaxed);
        let naps = &self.readers.empty_naps;
        if nap > 0 && naps.load(Ordering::Relaxed) < EMPTY_NAPS {
            let mut until = StdInstant::now() + std::time::Duration::from_nanos(nap);
            if let Wait::Until(deadline) = wait {
                if StdInstant::now() >= deadline {
                    return false;
                }
                until = until.min(deadline);
            }
            naps.store(naps.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            std::thread::sleep(until.saturating_duration_since(StdInstant::now()));
            return true;
        }
        let w = &self.waiters;
        let mut g = lock(&w.lock);
        // Registered before looking, so a push after the look sees us.
        w.count.fetch_add(1, Ordering::SeqCst);
        let timed_out = if self.has_data() || self.ended() || self.alert.load(Ordering::SeqCst) {
            false
        } else {
            match wait {
                Wait::No => true,
                Wait::Forever => {
                    g = crate::sync::wait(&w.cv, g, None);
                    false
                }
                Wait::Until(deadline) => {
                    let now = StdInstant::now();
                    if now >= deadline {
                        true
                    } else {
                        g = crate::sync::wait(&w.cv, g, Some(deadline - now));
                        false
                    }
                }
            }
        };
        w.count.fetch_sub(1, Ordering::SeqCst);
        drop(g);
        !timed_out && !self.ended() && !self.alert.swap(false, Ordering::SeqCst)
    }

    /// Whether anything is queued, looked at under the locks (the blocking
    /// path's check; polls use the published lengths).
    pub fn has_data(&self) -> bool {
        !lock(&self.readers.reader).list.is_empty() || self.producers.iter().any(|p| !lock(&p.list).is_empty())
    }

    /// Closes the queue: later pushes are refused, waiters wake, and what
    /// was queued is dropped (freeing its mbufs) and given back.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let mut r = lock(&self.readers.reader);
        let mut dropped: VecDeque<T> = std::mem::take(&mut r.list);
        for p in self.producers.iter() {
            let mut list = lock(&p.list);
            dropped.extend(list.drain(..));
            p.bytes.store(0, Ordering::Relaxed);
            p.queued.store(0, Ordering::Release);
        }
        r.owed += dropped.iter().map(Truesize::truesize).sum::<usize>();
        self.readers.queued.store(0, Ordering::Release);
        self.release(&mut r);
        drop(r);
        drop(dropped);
        self.wake_all();
    }

    /// The limit.
    pub fn rcvbuf(&self) -> usize {
        self.rcvbuf.load(Ordering::Relaxed)
    }

    /// Sets the limit.
    pub fn set_rcvbuf(&self, bytes: usize) {
        self.rcvbuf.store(bytes, Ordering::Relaxed);
    }

    /// Drops counted by producer `p`.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn drops(&self, p: usize) -> u64 {
        self.producers[p].drops.load(Ordering::Relaxed)
    }

    /// Items queued now, on the producers' lists and the reader's.
    pub fn queued(&self) -> usize {
        let producers: usize = self.producers.iter().map(|p| p.queued.load(Ordering::Relaxed)).sum();
        producers + self.readers.queued.load(Ordering::Relaxed)
    }

    /// All drops.
    pub fn total_drops(&self) -> u64 {
        self.producers.iter().map(|p| p.drops.load(Ordering::Relaxed)).sum()
    }
}

/// Wakes a task, if there is one; a waker that panics is the task's
/// problem, not the waking lcore's: the panic stops here.
pub fn wake_task(task: Option<Waker>) {
    if let Some(w) = task {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.wake()));
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
    fn queues_sharing_a_cap_hold_no_more_than_it_together() {
        let cap = std::sync::Arc::new(MemCap::new(300, 0));
        let a = RxQueue::with_cap(1, 1000, Some(cap.clone()));
        let b = RxQueue::with_cap(1, 1000, Some(cap.clone()));
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
        let (a, b) = (RxQueue::with_cap(1, 1000, Some(cap.clone())), RxQueue::with_cap(1, 1000, Some(cap.clone())));
        let mut batch: Vec<D> = (0..4).map(|i| D(i, 100)).collect();
        assert_eq!(a.push_batch(0, &mut batch), Err(Refusal::Mem));
        assert_eq!(cap.held(), 300);
        let mut batch: Vec<D> = (0..3).map(|i| D(i, 100)).collect();
        assert_eq!(b.push_batch(0, &mut batch), Err(Refusal::Mem));
        assert_eq!((batch.len(), cap.held()), (1, 500), "b reached its floor, no more");
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
    fn halt_wakes_every_waiter_and_keeps_readers_from_waiting() {
        let q = Arc::new(RxQueue::<D>::new(1, 1000));
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
        let q = RxQueue::with_cap(2, 1000, Some(cap.clone()));
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
        let q = Arc::new(RxQueue::<D>::new(1, 1000));
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
        let q = Arc::new(RxQueue::new(1, 1 << 20));
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

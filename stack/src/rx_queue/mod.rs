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
//!
//! The files: the queue's parts and its settings here; `produce` the
//! lcores' side (charging, queueing a burst); `consume` the reader's
//! (splicing, popping, releasing); `wait` sleeping, waking and closing.

use std::collections::VecDeque;
use std::task::Waker;
use std::time::Instant as StdInstant;

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, Ordering};

/// Naps in a row a reader takes on an empty queue before it asks to be
/// woken (see `SocketQueue::set_nap`).
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
pub struct SocketQueue<T> {
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

impl<T> std::fmt::Debug for SocketQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketQueue")
            .field("producers", &self.producers.len())
            .field("rmem", &self.rmem())
            .field("rcvbuf", &self.rcvbuf.load(Ordering::Relaxed))
            .finish()
    }
}

impl<T> SocketQueue<T> {
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

mod consume;
mod produce;
mod wait;

impl<T: Truesize> SocketQueue<T> {
    /// A queue with `producers` producer lists and a `rcvbuf`-byte limit.
    pub fn new(producers: usize, rcvbuf: usize) -> Self {
        Self::with_cap(producers, rcvbuf, None)
    }

    /// A queue as [`new`](Self::new) makes, also bounded by the stack-wide
    /// `cap` it shares with other queues.
    pub fn with_cap(producers: usize, rcvbuf: usize, cap: Option<std::sync::Arc<MemCap>>) -> Self {
        SocketQueue {
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
mod tests;

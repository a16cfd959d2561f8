//! An lcore's inbox: the bounded queue application threads hand their
//! packets to, and the wait of a sender that finds it full. A full inbox
//! is backpressure, not an error, for a blocking sender: it registers as
//! waiting and sleeps until the lcore has taken packets out (the lcore
//! wakes waiting senders once per drained batch, and only when there are
//! any: a load while nobody waits), its timeout passes, or the stack
//! stops. An async send's `Pending` will rest on the same two halves: a
//! registration before the last try, and the drain's wake-up.

use std::sync::atomic::{AtomicUsize, Ordering, fence};
use std::sync::{Condvar, Mutex};
use std::task::Waker;
use std::time::{Duration, Instant};

use crossbeam::queue::ArrayQueue;

/// The longest a waiting sender sleeps before it looks again on its own:
/// a bound on what a wake-up lost to a race could cost, and how soon a
/// stop is noticed.
const RECHECK: Duration = Duration::from_millis(20);

/// Why [`Inbox::push_wait`] gave the packet back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gave {
    /// The deadline passed with the inbox still full.
    Timeout,
    /// The stack stopped.
    Stopped,
}

/// A bounded multi-producer queue drained by one lcore.
#[derive(Debug)]
pub(crate) struct Inbox<T> {
    queue: ArrayQueue<T>,
    /// Senders waiting for room (blocked threads and registered tasks).
    waiting: AtomicUsize,
    /// The wakers of tasks waiting for room, under the lock blocked
    /// senders wait with.
    lock: Mutex<Vec<Waker>>,
    room: Condvar,
}

impl<T> Inbox<T> {
    /// An inbox of `capacity` packets.
    pub(crate) fn new(capacity: usize) -> Inbox<T> {
        Inbox {
            queue: ArrayQueue::new(capacity),
            waiting: AtomicUsize::new(0),
            lock: Mutex::new(Vec::new()),
            room: Condvar::new(),
        }
    }

    /// Queues `item`, or gives it back when the inbox is full.
    #[inline]
    pub(crate) fn push(&self, item: T) -> Result<(), T> {
        self.queue.push(item)
    }

    /// Takes the oldest packet (the owning lcore only).
    #[inline]
    pub(crate) fn pop(&self) -> Option<T> {
        self.queue.pop()
    }

    /// Whether it has no room.
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.queue.is_full()
    }

    /// Asks that the task `waker` belongs to be woken when the lcore next
    /// drains; false when there is room already (the caller tries again).
    pub(crate) fn register_waker(&self, waker: &Waker) -> bool {
        let mut wakers = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        if !wakers.iter().any(|w| w.will_wake(waker)) {
            wakers.push(waker.clone());
            self.waiting.fetch_add(1, Ordering::SeqCst);
        }
        drop(wakers);
        // Registered before the look, as `push_wait` does.
        fence(Ordering::SeqCst);
        self.queue.is_full()
    }

    /// Whether nothing is queued.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Queues `item`, sleeping while the inbox is full until the lcore
    /// drains it, `deadline` passes or `running` says the stack stopped;
    /// then the item comes back with the reason.
    pub(crate) fn push_wait(
        &self,
        mut item: T,
        deadline: Option<Instant>,
        running: impl Fn() -> bool,
    ) -> Result<(), (T, Gave)> {
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        // Registered before the last try: a drain after the try sees us
        // and wakes us; one before it left the room the try finds (the
        // fences order each side's write before its read).
        self.waiting.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let outcome = loop {
            item = match self.queue.push(item) {
                Ok(()) => break Ok(()),
                Err(item) => item,
            };
            if !running() {
                break Err((item, Gave::Stopped));
            }
            let nap = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left.min(RECHECK),
                    _ => break Err((item, Gave::Timeout)),
                },
                None => RECHECK,
            };
            guard = self.room.wait_timeout(guard, nap).unwrap_or_else(|p| p.into_inner()).0;
        };
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        drop(guard);
        outcome
    }

    /// After the lcore took packets out: wakes the senders waiting for
    /// room, if there are any.
    #[inline]
    pub(crate) fn drained(&self) {
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::Relaxed) > 0 {
            self.wake();
        }
    }

    /// Wakes every waiting sender (the lcore drained, or the stack stops).
    #[cold]
    pub(crate) fn wake(&self) {
        let mut wakers = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.room.notify_all();
        let tasks = std::mem::take(&mut *wakers);
        self.waiting.fetch_sub(tasks.len(), Ordering::SeqCst);
        drop(wakers);
        for w in tasks {
            crate::rx_queue::wake_task(Some(w));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn a_waiting_sender_gets_in_when_the_inbox_drains() {
        let inbox = Arc::new(Inbox::new(2));
        inbox.push(1).unwrap();
        inbox.push(2).unwrap();
        assert_eq!(
            inbox.push_wait(3, Some(Instant::now() + Duration::from_millis(30)), || true),
            Err((3, Gave::Timeout))
        );
        let (i, start) = (inbox.clone(), Instant::now());
        let sender =
            std::thread::spawn(move || i.push_wait(3, Some(Instant::now() + Duration::from_secs(10)), || true));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(inbox.pop(), Some(1));
        inbox.drained();
        assert_eq!(sender.join().unwrap(), Ok(()));
        assert!(start.elapsed() < Duration::from_secs(5), "woken by the drain, not the deadline");
        assert_eq!((inbox.pop(), inbox.pop(), inbox.pop()), (Some(2), Some(3), None));
    }

    #[test]
    fn a_waiting_sender_notices_the_stop() {
        let inbox = Arc::new(Inbox::new(1));
        inbox.push(1).unwrap();
        let running = Arc::new(AtomicBool::new(true));
        let (i, r) = (inbox.clone(), running.clone());
        let sender = std::thread::spawn(move || i.push_wait(2, None, || r.load(Ordering::SeqCst)));
        std::thread::sleep(Duration::from_millis(30));
        running.store(false, Ordering::SeqCst);
        inbox.wake();
        assert_eq!(sender.join().unwrap(), Err((2, Gave::Stopped)));
    }
}

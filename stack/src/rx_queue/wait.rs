//! Sleeping and waking: a reader waiting on an empty queue, the tasks and
//! epoll sets told of arrivals, halting, shutting down and closing.

use std::collections::VecDeque;
use std::task::Waker;
use std::time::Instant as StdInstant;

use super::*;
use crate::sync::{Ordering, lock};

impl<T: Truesize> SocketQueue<T> {
    /// Wakes waiting readers without data: their `pop` returns `None` so
    /// they can look at the socket's pending error.
    pub fn interrupt(&self) {
        self.alert.store(true, Ordering::SeqCst);
        self.wake_all();
    }

    /// Wakes every blocked reader and the registered task.
    pub(super) fn wake_all(&self) {
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
    pub(super) fn ended(&self) -> bool {
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
    pub(super) fn unregister(&self, slot: &mut Option<Waker>) -> Option<Waker> {
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

    /// Wakes blocked readers and the registered task, if there are any.
    #[inline]
    pub(super) fn wake(&self) {
        self.wake_gathering(None);
    }

    /// [`wake`](Self::wake), the task's waker left in `wakers` when given.
    #[inline]
    pub(super) fn wake_gathering(&self, wakers: Option<&mut Vec<Waker>>) {
        // SeqCst pairs with the reader's registration in `wait` and
        // `register_waker`: either the reader sees the item, or we see the
        // reader and wake it.
        if self.waiters.count.load(Ordering::SeqCst) > 0 {
            self.wake_waiters(wakers);
        }
    }

    #[cold]
    pub(super) fn wake_waiters(&self, wakers: Option<&mut Vec<Waker>>) {
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

    /// Blocks as `wait` allows; false when the caller should stop trying.
    pub(super) fn wait(&self, wait: Wait) -> bool {
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
}

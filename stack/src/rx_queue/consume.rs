//! The reader's side of a socket's receive queue: its own list, the
//! splice of a producer's list across, and the release of what it read.

use std::collections::VecDeque;

use super::*;
use crate::sync::{Ordering, lock};

impl<T: Truesize> SocketQueue<T> {
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

    pub(super) fn try_pop(&self) -> Option<T> {
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
    pub(super) fn try_pop_batch(&self, out: &mut Vec<T>, max: usize) -> usize {
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
    pub(super) fn splice(&self, r: &mut Reader<T>, out: &mut Vec<T>, room: usize) -> Option<(usize, usize)> {
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
    pub(super) fn consumed(&self, r: &mut Reader<T>, size: usize) {
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
    pub(super) fn release(&self, r: &mut Reader<T>) {
        let released = &self.readers.released;
        released.store(released.load(Ordering::Relaxed).wrapping_add(r.owed), Ordering::Release);
        if let Some(c) = &self.cap {
            c.held.fetch_sub(r.owed, Ordering::Relaxed);
        }
        r.owed = 0;
    }

    /// Whether anything is queued, looked at under the locks (the blocking
    /// path's check; polls use the published lengths).
    pub fn has_data(&self) -> bool {
        !lock(&self.readers.reader).list.is_empty() || self.producers.iter().any(|p| !lock(&p.list).is_empty())
    }
}

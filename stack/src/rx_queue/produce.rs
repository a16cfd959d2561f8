//! The lcores' side of a socket's receive queue: a burst charged against
//! the receive buffer and the stack's cap, and queued on the lcore's own
//! producer list.

use std::task::Waker;

use super::*;
use crate::sync::{Ordering, lock};

impl<T: Truesize> SocketQueue<T> {
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
            if list.is_empty() && list.capacity() == batch.capacity() {
                // The batch's buffer becomes the list, without a copy; the
                // batch keeps the list's empty one, of the same size. A
                // list that grew past a burst (a reader behind) keeps its
                // buffer: handing it to the lcore would leave the list a
                // burst's room to grow again, and every buffer the lcore
                // passes round would grow in turn.
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
    pub(super) fn cap_room(&self) -> usize {
        match &self.cap {
            None => usize::MAX,
            Some(c) => c.limit.saturating_sub(c.held.load(Ordering::Relaxed)).max(c.min.saturating_sub(self.rmem())),
        }
    }

    /// Bytes a producer may still queue.
    #[inline]
    pub(super) fn room(&self) -> usize {
        self.rcvbuf.load(Ordering::Relaxed).saturating_sub(self.rmem())
    }

    /// After queueing `size` bytes: the producer's charge and its length,
    /// stored by the lock holder (no read-modify-write), and the
    /// stack-wide cap's charge.
    #[inline]
    pub(super) fn publish(&self, producer: &Producer<T>, list: &[T], size: usize) {
        producer.charged.store(producer.charged.load(Ordering::Relaxed).wrapping_add(size), Ordering::Release);
        producer.bytes.store(producer.bytes.load(Ordering::Relaxed) + size, Ordering::Relaxed);
        producer.queued.store(list.len(), Ordering::Release);
        if let Some(c) = &self.cap {
            c.held.fetch_add(size, Ordering::Relaxed);
        }
    }
}

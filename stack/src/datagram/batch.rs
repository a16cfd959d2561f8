//! A reader's batch of datagrams, and the staged datagrams of a burst
//! lent to the lcore's callback.

use super::*;

/// Datagrams taken in one call, freed together: dropping or clearing a
/// batch gives every mbuf back to the pool in bulk calls.
#[derive(Debug, Default)]
pub struct DatagramBatch {
    items: Vec<Datagram>,
}

impl DatagramBatch {
    /// A batch with room for `n` datagrams without allocating.
    pub fn with_capacity(n: usize) -> DatagramBatch {
        DatagramBatch { items: Vec::with_capacity(n) }
    }

    /// Datagrams held.
    #[inline]
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether it holds none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The datagrams.
    #[inline]
    pub fn iter(&self) -> std::slice::Iter<'_, Datagram> {
        self.items.iter()
    }

    /// Takes every datagram out (to reply with, or keep).
    #[inline]
    pub fn drain(&mut self) -> std::vec::Drain<'_, Datagram> {
        self.items.drain(..)
    }

    /// Adds a datagram (taken out earlier), to be freed with the others.
    #[inline]
    pub fn push(&mut self, d: Datagram) {
        self.items.push(d);
    }

    /// Frees every datagram held, 64 mbufs per call.
    pub fn clear(&mut self) {
        Mbuf::free_all(&mut self.items, |d| d.mbuf);
    }

    pub(crate) fn vec(&mut self) -> &mut Vec<Datagram> {
        &mut self.items
    }

    /// Starts the cache misses of the datagrams from `from` on, all of
    /// them at once: their mbufs' headers, then (with the headers on
    /// their way) the first line of each payload. Datagrams another core
    /// queued are otherwise two misses each, one after the other, as the
    /// application reads them.
    #[inline]
    pub(crate) fn prefetch_from(&self, from: usize) {
        let new = &self.items[from.min(self.items.len())..];
        for d in new {
            d.mbuf.prefetch_header();
        }
        for d in new {
            d.mbuf.prefetch_data();
        }
    }
}

impl Drop for DatagramBatch {
    fn drop(&mut self) {
        self.clear();
    }
}

/// One socket's datagrams of a burst, where the polling lcore staged
/// them, lent to its run-to-completion callback by
/// [`LcoreCtx::recv_staged`](crate::LcoreCtx::recv_staged): take them
/// all ([`drain`](Self::drain), [`move_to`](Self::move_to)), or none,
/// and they are queued to the socket when the callback returns.
#[derive(Debug)]
pub struct Staged<'a> {
    items: &'a mut Vec<Datagram>,
}

impl<'a> Staged<'a> {
    pub(crate) fn new(items: &'a mut Vec<Datagram>) -> Staged<'a> {
        Staged { items }
    }

    /// Takes every datagram out, in arrival order (those the iterator is
    /// dropped with are freed).
    #[inline]
    pub fn drain(self) -> std::vec::Drain<'a, Datagram> {
        self.items.drain(..)
    }

    /// Moves every datagram into `batch`, after what it holds: an empty
    /// batch whose capacity is at least the lcore's buffer's takes that
    /// buffer whole, without a copy, and lends it its own.
    #[inline]
    pub fn move_to(self, batch: &mut DatagramBatch) {
        let out = &mut batch.items;
        if out.is_empty() && out.capacity() >= self.items.capacity() {
            std::mem::swap(out, self.items);
        } else {
            out.append(self.items);
        }
    }
}

/// The datagrams, in arrival order (`len`, `iter` and the rest of a
/// slice's reading).
impl std::ops::Deref for Staged<'_> {
    type Target = [Datagram];
    fn deref(&self) -> &[Datagram] {
        self.items
    }
}

impl<'a> IntoIterator for &'a DatagramBatch {
    type Item = &'a Datagram;
    type IntoIter = std::slice::Iter<'a, Datagram>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

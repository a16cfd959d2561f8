//! A fixed-capacity array of owned mbufs: what burst RX fills and burst TX
//! drains, with no heap allocation.

use std::mem::MaybeUninit;

use crate::mbuf::Mbuf;
use crate::sys;

/// The burst size spate uses by default (DPDK's customary 32).
pub const BURST_SIZE: usize = 32;

/// Up to `N` owned mbufs, kept at the front of an inline array.
pub struct Burst<const N: usize = BURST_SIZE> {
    slots: [MaybeUninit<Mbuf>; N],
    len: usize,
}

impl<const N: usize> Default for Burst<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> std::fmt::Debug for Burst<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Burst").field("len", &self.len).field("capacity", &N).finish()
    }
}

impl<const N: usize> Burst<N> {
    /// An empty burst.
    pub const fn new() -> Self {
        Burst { slots: [const { MaybeUninit::uninit() }; N], len: 0 }
    }

    /// Mbufs held.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether it is full.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.len == N
    }

    /// Capacity `N`.
    #[inline]
    pub const fn capacity(&self) -> usize {
        N
    }

    /// Adds an mbuf at the end; gives it back when full.
    #[inline]
    pub fn push(&mut self, m: Mbuf) -> Result<(), Mbuf> {
        // `>=`, not `==`: the index below is then known to be in bounds.
        if self.len >= N {
            return Err(m);
        }
        self.slots[self.len].write(m);
        self.len += 1;
        Ok(())
    }

    /// Removes the last mbuf.
    #[inline]
    pub fn pop(&mut self) -> Option<Mbuf> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        // SAFETY: slot `len` was initialised and is now outside the live prefix.
        Some(unsafe { self.slots[self.len].assume_init_read() })
    }

    /// The mbufs held.
    #[inline]
    pub fn as_slice(&self) -> &[Mbuf] {
        // SAFETY: the first `len` slots are initialised.
        unsafe { std::slice::from_raw_parts(self.slots.as_ptr() as *const Mbuf, self.len) }
    }

    /// The mbufs held, mutable.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [Mbuf] {
        // SAFETY: the first `len` slots are initialised.
        unsafe { std::slice::from_raw_parts_mut(self.slots.as_mut_ptr() as *mut Mbuf, self.len) }
    }

    /// Takes every mbuf out, in order; the burst is empty afterwards even if
    /// the iterator is dropped early (the rest are freed in bulk).
    #[inline]
    pub fn drain(&mut self) -> Drain<'_, N> {
        let len = self.len;
        self.len = 0;
        Drain { burst: self, next: 0, end: len }
    }

    /// Passes each mbuf to `f` in order and keeps those it gives back,
    /// moved forward over those it took, in place: what a burst loop that
    /// sends some frames elsewhere does without a second burst and a copy
    /// back. Should `f` panic, the mbufs not yet passed are leaked, never
    /// freed twice.
    #[inline]
    pub fn retain_with(&mut self, mut f: impl FnMut(Mbuf) -> Option<Mbuf>) {
        let len = self.len;
        self.len = 0;
        let mut kept = 0;
        for i in 0..len {
            // SAFETY: slots i..len are initialised and owned; slot i is
            // read once and is outside the live prefix from here on.
            let m = unsafe { self.slots[i].assume_init_read() };
            if let Some(m) = f(m) {
                // kept <= i: the slot written was read already.
                self.slots[kept].write(m);
                kept += 1;
                self.len = kept;
            }
        }
    }

    /// Frees every mbuf held, in one bulk call.
    #[inline]
    pub fn clear(&mut self) {
        if self.len > 0 {
            // SAFETY: the live prefix holds owned mbufs, freed once here.
            unsafe { sys::rte_pktmbuf_free_bulk(self.slots.as_mut_ptr() as *mut *mut sys::rte_mbuf, self.len as u32) };
            self.len = 0;
        }
    }

    /// Drops the first `n` slots, which the caller has handed to DPDK, and
    /// moves the rest to the front.
    ///
    /// # Safety
    /// The first `n` slots must no longer be owned by this burst.
    #[inline]
    pub(crate) unsafe fn consume_front(&mut self, n: usize) {
        debug_assert!(n <= self.len);
        let rest = self.len - n;
        if n > 0 && rest > 0 {
            // SAFETY: both ranges lie within the array; copy handles overlap.
            unsafe { std::ptr::copy(self.slots.as_ptr().add(n), self.slots.as_mut_ptr(), rest) };
        }
        self.len = rest;
    }

    /// Pointer to the array, for DPDK calls that read `len` mbufs.
    #[inline]
    pub(crate) fn as_raw_ptr(&mut self) -> *mut *mut sys::rte_mbuf {
        self.slots.as_mut_ptr() as *mut *mut sys::rte_mbuf
    }

    /// Pointer to the first free slot, for DPDK calls that fill the burst.
    #[inline]
    pub(crate) fn spare_ptr(&mut self) -> *mut *mut sys::rte_mbuf {
        // SAFETY: len <= N, so this is at most one past the end.
        unsafe { self.as_raw_ptr().add(self.len) }
    }

    /// Free slots.
    #[inline]
    pub fn spare(&self) -> usize {
        N - self.len
    }

    /// # Safety
    /// Slots up to `len` must hold owned mbufs.
    #[inline]
    pub(crate) unsafe fn set_len(&mut self, len: usize) {
        debug_assert!(len <= N);
        self.len = len;
    }
}

impl<const N: usize> Drop for Burst<N> {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Iterator returned by [`Burst::drain`].
pub struct Drain<'a, const N: usize> {
    burst: &'a mut Burst<N>,
    next: usize,
    end: usize,
}

impl<const N: usize> Iterator for Drain<'_, N> {
    type Item = Mbuf;

    #[inline]
    fn next(&mut self) -> Option<Mbuf> {
        if self.next == self.end {
            return None;
        }
        // SAFETY: slots next..end are initialised and owned by the drain.
        let m = unsafe { self.burst.slots[self.next].assume_init_read() };
        self.next += 1;
        Some(m)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.end - self.next, Some(self.end - self.next))
    }
}

impl<const N: usize> ExactSizeIterator for Drain<'_, N> {}

impl<const N: usize> Drop for Drain<'_, N> {
    fn drop(&mut self) {
        let rest = self.end - self.next;
        if rest > 0 {
            // SAFETY: the undrained slots are owned mbufs; free them once.
            unsafe { sys::rte_pktmbuf_free_bulk(self.burst.as_raw_ptr().add(self.next), rest as u32) };
        }
    }
}

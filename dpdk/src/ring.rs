//! Single-producer single-consumer rings of mbufs between two lcores
//! (`rte_ring` created with `RING_F_SP_ENQ | RING_F_SC_DEQ`): a burst
//! goes in or comes out with one pair of index updates, no lock and no
//! compare-and-swap. The two ends are separate values, each `Send` and
//! used through `&mut self`, so one thread produces and one consumes.

use std::ffi::CString;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::burst::Burst;
use crate::error::{Error, Result, rte_errno, strerror};
use crate::sys;

static NEXT_RING: AtomicU64 = AtomicU64::new(0);

struct Inner {
    ring: *mut sys::rte_ring,
    /// The EAL stays up while the ring lives.
    _eal: crate::eal::EalRef,
}

// SAFETY: the ring is DPDK shared memory, safe to use from any thread; the
// single-producer/single-consumer discipline is kept by the end types.
unsafe impl Send for Inner {}
// SAFETY: as above; `Inner` itself only frees the ring on drop.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // Both ends are gone: free what still waits, then the ring.
        let mut burst: Burst = Burst::new();
        loop {
            // SAFETY: nobody else holds the ring now.
            let n = unsafe {
                let n = sys::spate_ring_dequeue_burst(self.ring, burst.spare_ptr(), burst.spare() as u32);
                burst.set_len(n as usize);
                n
            };
            burst.clear();
            if n == 0 {
                break;
            }
        }
        // SAFETY: created by rte_ring_create, used by nothing any more.
        unsafe { sys::rte_ring_free(self.ring) };
    }
}

/// The producing end of an mbuf ring.
pub struct RingProducer {
    inner: Arc<Inner>,
}

/// The consuming end of an mbuf ring.
pub struct RingConsumer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RingProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RingProducer")
    }
}

impl std::fmt::Debug for RingConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RingConsumer")
    }
}

/// A ring holding up to `capacity` - 1 mbufs (`capacity` a power of two,
/// 2 to 2^28), as its two ends.
pub fn mbuf_ring(capacity: u32) -> Result<(RingProducer, RingConsumer)> {
    let eal = crate::eal::EalRef::get()?;
    if !capacity.is_power_of_two() || !(2..=1 << 28).contains(&capacity) {
        return Err(Error::Ring { capacity, what: "not a power of two from 2 to 2^28".into() });
    }
    let name = format!("spr{}_{}", std::process::id() % 100_000, NEXT_RING.fetch_add(1, Ordering::Relaxed));
    let c = CString::new(name).expect("no NUL");
    // SAFETY: a valid name (DPDK copies it), any socket.
    let ring = unsafe {
        sys::rte_ring_create(c.as_ptr(), capacity, sys::SOCKET_ID_ANY, sys::RING_F_SP_ENQ | sys::RING_F_SC_DEQ)
    };
    if ring.is_null() {
        let errno = rte_errno();
        return Err(Error::Ring { capacity, what: format!("rte_ring_create: rte_errno {errno}: {}", strerror(errno)) });
    }
    let inner = Arc::new(Inner { ring, _eal: eal });
    Ok((RingProducer { inner: inner.clone() }, RingConsumer { inner }))
}

impl RingProducer {
    /// Moves as many of `burst`'s mbufs as fit into the ring, from the
    /// front; those that did not fit stay in `burst`. Returns how many went.
    #[inline]
    pub fn enqueue<const N: usize>(&mut self, burst: &mut Burst<N>) -> usize {
        let len = burst.len();
        if len == 0 {
            return 0;
        }
        // SAFETY: the first `len` slots hold owned mbufs; the ring takes the
        // first `n`, which the burst then forgets. Only this end enqueues.
        unsafe {
            let n = sys::spate_ring_enqueue_burst(self.inner.ring, burst.as_raw_ptr(), len as u32) as usize;
            burst.consume_front(n);
            n
        }
    }
}

impl RingConsumer {
    /// Appends up to `burst`'s free room of mbufs from the ring; returns
    /// how many.
    #[inline]
    pub fn dequeue<const N: usize>(&mut self, burst: &mut Burst<N>) -> usize {
        let room = burst.spare();
        if room == 0 {
            return 0;
        }
        // SAFETY: DPDK writes up to `room` owned mbufs into the free slots.
        // Only this end dequeues.
        unsafe {
            let n = sys::spate_ring_dequeue_burst(self.inner.ring, burst.spare_ptr(), room as u32) as usize;
            burst.set_len(burst.len() + n);
            n
        }
    }

    /// Mbufs waiting.
    pub fn len(&self) -> usize {
        // SAFETY: a read of the ring's indexes.
        unsafe { sys::spate_ring_count(self.inner.ring) as usize }
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

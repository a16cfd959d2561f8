//! Packet mbuf pools.

use std::ffi::{CStr, CString};
use std::ptr::NonNull;

use crate::burst::Burst;
use crate::error::{Error, Result, rte_errno, strerror};
use crate::mbuf::Mbuf;
use crate::sys;

/// The longest mempool name every driver takes: the stack drivers name
/// their stack `MP_<name>`, and a stack's name holds 27 bytes.
pub const MAX_NAME_LEN: usize = 24;

/// How to size a pool.
#[derive(Debug, Clone)]
pub struct MempoolConfig {
    /// Unique pool name (at most [`MAX_NAME_LEN`] bytes).
    pub name: String,
    /// Number of mbufs; DPDK works best with 2^n - 1.
    pub size: u32,
    /// Per-lcore cache size (0 for none; at most 512).
    pub cache_size: u32,
    /// Bytes of data room per mbuf, headroom included.
    pub data_room: u16,
    /// NUMA socket, or `None` for any.
    pub socket: Option<u32>,
    /// In which order free mbufs beyond the per-lcore caches are reused.
    pub order: PoolOrder,
}

/// In which order a pool reuses the mbufs its per-lcore caches pass on:
/// mbufs one thread frees and another allocates (a reader thread's,
/// another lcore's) go through this store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolOrder {
    /// The last freed first (DPDK's lock-free stack mempool driver,
    /// `lf_stack`): reused while their lines may still be in a cache.
    /// Asked for, it is given where DPDK would give the default ring: not
    /// over a driver the platform or `--mbuf-pool-ops-name` chose, nor
    /// where the driver is not installed (librte_mempool_stack).
    Lifo,
    /// The first freed first (DPDK's default ring): with many free mbufs,
    /// each has gone cold by the time it comes back. Asked for, the pool
    /// takes the driver DPDK picks.
    Fifo,
    /// Whatever order the driver the platform or the EAL's
    /// `--mbuf-pool-ops-name` chose keeps (a hardware pool's).
    Driver,
}

/// DPDK's default packet pool driver, and the LIFO one spate prefers: its
/// lock-free stack (the `stack` driver takes a spinlock, and a thread
/// descheduled holding it would stall every other).
const RING_DRIVER: &CStr = c"ring_mp_mc";
const STACK_DRIVER: &CStr = c"lf_stack";

/// The driver a pool asked for `order` gets, and the order that gives.
fn driver_for(order: PoolOrder, pool: &str) -> (&'static CStr, PoolOrder) {
    // SAFETY: DPDK returns a static, NUL-terminated name.
    let best = unsafe { CStr::from_ptr(sys::spate_best_mempool_ops()) };
    if best != RING_DRIVER {
        return (best, PoolOrder::Driver);
    }
    // SAFETY: reads the table of registered drivers.
    if order == PoolOrder::Lifo && unsafe { sys::spate_mempool_ops_registered(STACK_DRIVER.as_ptr()) } == 0 {
        log::warn!(
            "mempool {pool}: no `lf_stack` mempool driver (librte_mempool_stack); free mbufs are reused first freed, \
             first reused"
        );
        return (RING_DRIVER, PoolOrder::Fifo);
    }
    match order {
        PoolOrder::Lifo => (STACK_DRIVER, PoolOrder::Lifo),
        _ => (RING_DRIVER, PoolOrder::Fifo),
    }
}

impl MempoolConfig {
    /// `size` mbufs with DPDK's default data room (2,048 bytes + headroom)
    /// and a 256-mbuf per-lcore cache.
    pub fn new(name: &str, size: u32) -> Self {
        MempoolConfig {
            name: name.into(),
            size,
            cache_size: 256.min(size / 2),
            data_room: sys::RTE_MBUF_DEFAULT_BUF_SIZE as u16,
            socket: None,
            order: PoolOrder::Lifo,
        }
    }
}

/// A pool of packet mbufs; `Send + Sync` (DPDK's pools are thread-safe).
///
/// Dropping a pool whose mbufs are still in use leaks it with a warning
/// instead of freeing memory that mbufs point into.
#[derive(Debug)]
pub struct Mempool {
    raw: NonNull<sys::rte_mempool>,
    name: String,
    size: u32,
    order: PoolOrder,
    /// The EAL stays up while the pool (and so its mbufs) can be used.
    eal: Option<crate::eal::EalRef>,
}

// SAFETY: rte_mempool operations are multi-producer/multi-consumer safe.
unsafe impl Send for Mempool {}
// SAFETY: as above; the struct itself is immutable after creation.
unsafe impl Sync for Mempool {}

impl Mempool {
    /// Creates a packet mbuf pool.
    pub fn new(cfg: &MempoolConfig) -> Result<Mempool> {
        let eal = crate::eal::EalRef::get()?;
        let fail = |errno: i32, why: Option<&str>| Error::MempoolCreate {
            name: cfg.name.clone(),
            size: cfg.size,
            errno,
            text: why.map(str::to_string).unwrap_or_else(|| strerror(errno)),
        };
        if cfg.name.is_empty() || cfg.name.len() > MAX_NAME_LEN {
            return Err(fail(libc::ENAMETOOLONG, Some("name must be 1 to 24 bytes")));
        }
        // DPDK refuses a cache whose flush threshold (1.5 times its size)
        // passes the pool's size.
        if cfg.size == 0 || cfg.cache_size > 512 || cfg.cache_size as u64 * 3 / 2 > cfg.size as u64 {
            return Err(fail(libc::EINVAL, Some("size must be > 0 and cache_size <= min(512, size / 1.5)")));
        }
        let cname = CString::new(cfg.name.as_str()).map_err(|_| fail(libc::EINVAL, Some("NUL in name")))?;
        let socket = cfg.socket.map(|s| s as i32).unwrap_or(sys::SOCKET_ID_ANY);
        let (driver, order) = driver_for(cfg.order, &cfg.name);
        // SAFETY: the EAL runs; the names are valid C strings DPDK copies.
        let raw = unsafe {
            sys::rte_pktmbuf_pool_create_by_ops(
                cname.as_ptr(),
                cfg.size,
                cfg.cache_size,
                0,
                cfg.data_room,
                socket,
                driver.as_ptr(),
            )
        };
        let raw = NonNull::new(raw).ok_or_else(|| fail(rte_errno(), None))?;
        Ok(Mempool { raw, name: cfg.name.clone(), size: cfg.size, order, eal: Some(eal) })
    }

    /// In which order free mbufs are reused: what the pool asked for, or
    /// what it was given instead (see [`PoolOrder`]).
    pub fn order(&self) -> PoolOrder {
        self.order
    }

    /// One mbuf, or `None` when the pool is exhausted.
    #[inline]
    pub fn alloc(&self) -> Option<Mbuf> {
        // SAFETY: the pool is valid; a non-null result is a fresh mbuf we own.
        unsafe { Mbuf::from_raw(sys::spate_pktmbuf_alloc(self.raw.as_ptr())) }
    }

    /// One mbuf, or [`Error::MempoolExhausted`].
    pub fn try_alloc(&self) -> Result<Mbuf> {
        self.alloc().ok_or_else(|| self.exhausted(1))
    }

    /// Fills `burst` up to `n` mbufs in one call, or allocates none.
    pub fn alloc_bulk<const N: usize>(&self, burst: &mut Burst<N>, n: usize) -> Result<()> {
        let start = burst.len();
        if start + n > N {
            return Err(Error::MbufRoom("burst too small for the bulk allocation"));
        }
        // SAFETY: the spare slots of the burst take n pointers; on success
        // all n are fresh mbufs owned by the burst.
        let ret = unsafe { sys::spate_pktmbuf_alloc_bulk(self.raw.as_ptr(), burst.spare_ptr(), n as u32) };
        if ret != 0 {
            return Err(self.exhausted(n as u32));
        }
        // SAFETY: n slots past len were just initialised.
        unsafe { burst.set_len(start + n) };
        Ok(())
    }

    fn exhausted(&self, wanted: u32) -> Error {
        Error::MempoolExhausted { name: self.name.clone(), in_use: self.in_use(), size: self.size, wanted }
    }

    /// Mbufs handed out and not yet returned (per-lcore caches count as free).
    pub fn in_use(&self) -> u32 {
        // SAFETY: the pool is valid.
        unsafe { sys::rte_mempool_in_use_count(self.raw.as_ptr()) }
    }

    /// Mbufs available.
    pub fn available(&self) -> u32 {
        // SAFETY: the pool is valid.
        unsafe { sys::rte_mempool_avail_count(self.raw.as_ptr()) }
    }

    /// Number of mbufs in the pool.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes of buffer per mbuf, headroom included (each mbuf's `buf_len`).
    pub fn buf_len(&self) -> u16 {
        // SAFETY: the pool is a packet pool, created by rte_pktmbuf_pool_create.
        unsafe { sys::spate_pktmbuf_data_room_size(self.raw.as_ptr()) }
    }

    /// Bytes of packet data an mbuf holds after its headroom.
    pub fn data_room(&self) -> u16 {
        self.buf_len() - sys::RTE_PKTMBUF_HEADROOM as u16
    }

    /// The raw pool pointer, for other `spate-dpdk` modules.
    pub(crate) fn as_ptr(&self) -> *mut sys::rte_mempool {
        self.raw.as_ptr()
    }

    /// A raw pool's name (for diagnostics).
    pub(crate) fn name_of(raw: *const sys::rte_mempool) -> String {
        if raw.is_null() {
            return String::new();
        }
        // SAFETY: a valid pool's name is a NUL-terminated array.
        unsafe { CStr::from_ptr((*raw).name.as_ptr()).to_string_lossy().into_owned() }
    }
}

impl Drop for Mempool {
    fn drop(&mut self) {
        let in_use = self.in_use();
        if in_use == 0 {
            // SAFETY: no mbuf of the pool is alive, so nothing points into it.
            unsafe { sys::rte_mempool_free(self.raw.as_ptr()) };
        } else {
            log::warn!("mempool {} dropped with {in_use} mbufs still in use: leaking it", self.name);
            // The mbufs still point into it, and into the EAL's memory: the
            // EAL's share is leaked with it, so the EAL is never cleaned up
            // under them.
            std::mem::forget(self.eal.take());
        }
    }
}

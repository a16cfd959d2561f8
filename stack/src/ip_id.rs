//! IPv4 identification for datagrams that may be fragmented.
//!
//! As Linux's `__ip_select_ident`: a keyed hash of (destination, source,
//! protocol) picks one of many counters, each on its own cache line, and a
//! bucket that sat idle advances by a random step first. Unlike Linux, a
//! thread does not add to the shared counter for every datagram: it
//! leases the next [`LEASE`] IDs of a bucket at once and hands them out
//! from a thread-local slot, so sends from many threads to many
//! destinations share no cache line on their common path.
//!
//! What the lease must not cost is what sank per-core ID ranges (seed
//! 002): two threads sending overlapping IDs to one destination. A lease
//! is a contiguous stretch of the bucket's one counter, so IDs to a
//! destination still come from one sequence that runs through all 65,536
//! values before it repeats. A thread uses its lease only while the shared
//! counter is less than [`FRESH`] past it (one plain load, a cache hit
//! unless another thread took a lease on this bucket since): an ID sent
//! late from an old lease would come back soon from the counter's next lap.
//!
//! The window (`L` of the ID-space property, in the order IDs are
//! reserved): an ID reserved from a lease can trail IDs other threads
//! reserved already by less than [`FRESH`]; when the counter comes round
//! to it again, each other thread holds at most [`LEASE`] - 1 reserved but
//! unsent positions before it; and positions never sent shorten the lap:
//! the random steps of idle buckets and the unsent ends of leases a thread
//! drops (as stale, or for a count larger than what is left), all counted in [`IpIdGen::skipped`]. So with T threads no ID
//! repeats within 65,536 - L consecutive sends to one destination,
//! L = FRESH + (T - 1) x (LEASE - 1) + the positions skipped in between;
//! for two threads L = 319 + skipped, and a thread that keeps sending
//! while the other does too skips nothing.
//!
//! Datagrams that cannot be fragmented (DF set, within the path MTU) are
//! atomic in RFC 6864's sense and need no unique ID: spate writes 0 there,
//! as Linux does for unconnected sockets, and a connected socket's own
//! counter (Linux's `inet_id`).

use std::cell::Cell;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

/// Counters in the table (a power of two).
pub const BUCKETS: usize = 2048;
/// IDs a thread takes from a bucket at once.
pub const LEASE: u64 = 64;
/// The most an idle bucket advances at once.
pub const IDLE_STEP_MAX: u64 = 64;
/// A lease is used while the bucket's counter is less than this far past
/// its next position (room for three other threads' leases).
pub const FRESH: u64 = 4 * LEASE;

static NEXT_GENERATOR: AtomicU32 = AtomicU32::new(1);

/// One bucket: the next ID position (never wraps; the ID is its low 16
/// bits) and when a lease was last taken, in ms.
#[derive(Debug, Default)]
struct Bucket {
    next: AtomicU64,
    last_ms: AtomicU32,
}

/// The ID generator.
#[derive(Debug)]
pub struct IpIdGen {
    id: u32,
    key: [u64; 2],
    buckets: Box<[CachePadded<Bucket>]>,
    born: std::time::Instant,
    /// Positions never sent, all buckets: idle steps and dropped leases'
    /// ends (written on the cold path only).
    skipped: CachePadded<AtomicU64>,
}

/// A thread's lease on one bucket: `left` IDs from position `next`.
#[derive(Debug, Clone, Copy, Default)]
struct Lease {
    generator: u32,
    left: u32,
    next: u64,
}

thread_local! {
    /// This thread's leases, one per bucket (16 bytes each, allocated at
    /// the thread's first reservation), so a thread sending to many
    /// destinations keeps a lease on each.
    static LEASES: Box<[Cell<Lease>]> = (0..BUCKETS).map(|_| Cell::new(Lease::default())).collect();
}

impl IpIdGen {
    /// A generator with a secret key.
    pub fn new(key: [u64; 2]) -> IpIdGen {
        IpIdGen {
            id: NEXT_GENERATOR.fetch_add(1, Ordering::Relaxed),
            key,
            buckets: (0..BUCKETS)
                .map(|i| {
                    let b = Bucket::default();
                    b.next.store((i as u64).wrapping_mul(key[0]) & 0xffff, Ordering::Relaxed);
                    CachePadded::new(b)
                })
                .collect(),
            born: std::time::Instant::now(),
            skipped: CachePadded::new(AtomicU64::new(0)),
        }
    }

    /// Positions skipped so far, all buckets: idle buckets' random steps
    /// and the unsent ends of dropped leases (they add to `L`).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// Reserves `count` consecutive IDs (1 to [`LEASE`]) for datagrams from
    /// `src` to `dst`; returns the first.
    #[inline]
    pub fn reserve(&self, src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, count: u16) -> u16 {
        let count = (count as u64).clamp(1, LEASE);
        let b = self.bucket(src, dst, protocol);
        let shared = &self.buckets[b];
        LEASES.with(|slots| {
            let slot = &slots[b];
            let lease = slot.get();
            if lease.generator == self.id
                && lease.left as u64 >= count
                && shared.next.load(Ordering::Relaxed).wrapping_sub(lease.next) < FRESH
            {
                slot.set(Lease { left: lease.left - count as u32, next: lease.next + count, ..lease });
                return lease.next as u16;
            }
            self.drop_lease(lease);
            let start = self.take_lease(shared);
            slot.set(Lease { generator: self.id, left: (LEASE - count) as u32, next: start + count });
            start as u16
        })
    }

    /// Counts the unsent end of a lease given up (a lease of another
    /// generator in the slot, from a second stack in the process, is not
    /// this generator's to count).
    #[cold]
    fn drop_lease(&self, lease: Lease) {
        if lease.generator == self.id && lease.left > 0 {
            self.skipped.fetch_add(lease.left as u64, Ordering::Relaxed);
        }
    }

    /// Takes the bucket's next [`LEASE`] IDs, stepping an idle bucket
    /// forward by a random amount first (as Linux does, so an observer
    /// cannot count a host's traffic to a destination across idle times).
    #[cold]
    fn take_lease(&self, shared: &Bucket) -> u64 {
        let now = self.born.elapsed().as_millis() as u32;
        let last = shared.last_ms.load(Ordering::Relaxed);
        let mut step = 0;
        if now != last && shared.last_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            let idle = now.wrapping_sub(last) as u64;
            // Below the idle time in ms, as Linux's prandom_u32_max(now - old):
            // a bucket in use every millisecond never steps.
            step = mix(self.key[1] ^ now as u64 ^ shared as *const Bucket as u64) % idle.min(IDLE_STEP_MAX);
            if step > 0 {
                self.skipped.fetch_add(step, Ordering::Relaxed);
            }
        }
        shared.next.fetch_add(LEASE + step, Ordering::Relaxed) + step
    }

    fn bucket(&self, src: Ipv4Addr, dst: Ipv4Addr, protocol: u8) -> usize {
        let x = ((u32::from(dst) as u64) << 32 | u32::from(src) as u64) ^ self.key[0];
        let h = (x ^ (protocol as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_mul(self.key[1] | 1);
        (h >> 40) as usize & (BUCKETS - 1)
    }
}

/// splitmix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The thread's random source for IPv6 fragment identifications and other
/// values that must not be guessable (xorshift64*, seeded from the OS and
/// the thread).
pub fn random_u32() -> u32 {
    thread_local! {
        static STATE: std::cell::Cell<u64> = std::cell::Cell::new({
            let mut seed = [0u8; 8];
            if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
                let _ = std::io::Read::read_exact(&mut f, &mut seed);
            }
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64);
            mix(u64::from_ne_bytes(seed) ^ t.unwrap_or(0) ^ &seed as *const _ as u64) | 1
        });
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
    const DST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);

    #[test]
    fn one_thread_counts_through_the_whole_space() {
        let g = IpIdGen::new([7, 9]);
        let mut expect = g.reserve(SRC, DST, 17, 1);
        let mut total = 0;
        for i in 1..70_000u32 {
            let id = g.reserve(SRC, DST, 17, 1);
            // One after the other, but for the random step a bucket takes
            // when this thread was descheduled for 2 ms or more.
            let skipped = id.wrapping_sub(expect.wrapping_add(1)) as u64;
            assert!(skipped < IDLE_STEP_MAX, "send {i}: {id} after {expect}");
            total += skipped;
            expect = id;
        }
        assert_eq!(total, g.skipped(), "every skip is a counted idle step");
    }

    #[test]
    fn counts_reserve_consecutive_ids() {
        let g = IpIdGen::new([7, 9]);
        let a = g.reserve(SRC, DST, 17, 3);
        let b = g.reserve(SRC, DST, 17, 1);
        assert_eq!(b, a.wrapping_add(3));
    }

    #[test]
    fn a_lapped_lease_is_dropped() {
        let g = IpIdGen::new([7, 9]);
        let id = g.reserve(SRC, DST, 17, 1);
        // Another thread runs the bucket a full lap on.
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..65_536 {
                    g.reserve(SRC, DST, 17, 1);
                }
            });
        });
        let next = g.reserve(SRC, DST, 17, 1);
        assert_ne!(next, id.wrapping_add(1), "the old lease would repeat IDs just sent");
    }
}

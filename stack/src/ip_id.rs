//! IPv4 identification: a keyed hash of (destination, source, protocol)
//! picks one of many counters, as Linux's `__ip_select_ident` does; a send
//! reserves as many consecutive IDs as it has fragments.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};

use crossbeam_utils::CachePadded;

/// Counters in the table (a power of two).
pub const BUCKETS: usize = 2048;

/// The ID generator.
#[derive(Debug)]
pub struct IpIdGen {
    key: [u64; 2],
    buckets: Box<[CachePadded<AtomicU32>]>,
}

impl IpIdGen {
    /// A generator with a secret key.
    pub fn new(key: [u64; 2]) -> IpIdGen {
        IpIdGen {
            key,
            buckets: (0..BUCKETS)
                .map(|i| CachePadded::new(AtomicU32::new((i as u32).wrapping_mul(key[0] as u32))))
                .collect(),
        }
    }

    /// Reserves `count` IDs for datagrams from `src` to `dst`; returns the first.
    #[inline]
    pub fn reserve(&self, src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, count: u16) -> u16 {
        let b = self.bucket(src, dst, protocol);
        self.buckets[b].fetch_add(count as u32, Ordering::Relaxed) as u16
    }

    fn bucket(&self, src: Ipv4Addr, dst: Ipv4Addr, protocol: u8) -> usize {
        let x = ((u32::from(dst) as u64) << 32 | u32::from(src) as u64) ^ self.key[0];
        let h = (x ^ (protocol as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_mul(self.key[1] | 1);
        (h >> 40) as usize & (BUCKETS - 1)
    }
}

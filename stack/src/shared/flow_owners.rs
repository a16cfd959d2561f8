//! Which lcore's queue a flow arrives on, under `rss = "device"`: the
//! device keeps each flow on one queue and spate records where, so that a
//! datagram reassembled where its fragments met (chosen by addresses and
//! ID) goes to the lcore its flow's whole datagrams reach, and a flow the
//! device moves is seen and counted.
//!
//! A slot per flow hash, written by the lcore that receives the flow: a
//! tag from the hash's upper bits and the lcore, in one atomic word. An
//! lcore only reads the slot for a datagram whose flow it already owns,
//! and writes it when the flow is new or moved, so the lines stay shared
//! while flows stay put. Two flows on one slot take it in turn (the tag
//! tells them apart: neither is counted as moved, the older is forgotten).

use std::sync::atomic::{AtomicU32, Ordering};

use crate::rss::{FlowHash, MAX_INPUT};

/// Slots (a power of two): a quarter of a MiB.
const SLOTS: usize = 1 << 16;

/// The flow table of a stack with device-steered ports.
#[derive(Debug)]
pub(crate) struct FlowOwners {
    slots: Box<[AtomicU32]>,
    hash: FlowHash,
}

/// What [`FlowOwners::record`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// The flow was last seen here.
    Here,
    /// It is new (or its slot held another flow).
    New,
    /// Its datagrams came to another lcore before.
    Moved,
}

impl FlowOwners {
    /// An empty table hashing with `hash`.
    pub fn new(hash: FlowHash) -> FlowOwners {
        FlowOwners { slots: (0..SLOTS).map(|_| AtomicU32::new(0)).collect(), hash }
    }

    fn slot(&self, key: &[u8; MAX_INPUT], n: usize) -> (&AtomicU32, u32) {
        let h = self.hash.hash(key, n);
        // The low 16 bits pick the slot, the top 24 the tag.
        (&self.slots[h as usize & (SLOTS - 1)], (h >> 40) as u32)
    }

    /// Records that the flow `key[..n]` (addresses and ports, as
    /// [`crate::rss::flow_input`] writes them) arrived on lcore `me`.
    #[inline]
    pub fn record(&self, key: &[u8; MAX_INPUT], n: usize, me: usize) -> Seen {
        let (slot, tag) = self.slot(key, n);
        let want = tag << 8 | (me as u32 + 1);
        let was = slot.load(Ordering::Relaxed);
        if was == want {
            return Seen::Here;
        }
        slot.store(want, Ordering::Relaxed);
        if was >> 8 == tag && was & 0xff != 0 { Seen::Moved } else { Seen::New }
    }

    /// The lcore the flow's datagrams last arrived on, if it is known.
    #[inline]
    pub fn owner(&self, key: &[u8; MAX_INPUT], n: usize) -> Option<usize> {
        let (slot, tag) = self.slot(key, n);
        let v = slot.load(Ordering::Relaxed);
        (v >> 8 == tag && v & 0xff != 0).then(|| (v & 0xff) as usize - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(port: u16) -> [u8; MAX_INPUT] {
        let mut k = [0u8; MAX_INPUT];
        k[..8].copy_from_slice(&[198, 18, 0, 1, 198, 18, 0, 2]);
        k[8..10].copy_from_slice(&port.to_be_bytes());
        k[10..12].copy_from_slice(&7u16.to_be_bytes());
        k
    }

    #[test]
    fn a_flow_is_owned_where_it_arrives_and_a_move_is_seen() {
        let t = FlowOwners::new(FlowHash::new([1, 2, 3, 4, 5]));
        assert_eq!(t.owner(&key(1000), 12), None);
        assert_eq!(t.record(&key(1000), 12, 1), Seen::New);
        assert_eq!(t.record(&key(1000), 12, 1), Seen::Here);
        assert_eq!(t.owner(&key(1000), 12), Some(1));
        assert_eq!(t.record(&key(1000), 12, 0), Seen::Moved);
        assert_eq!(t.owner(&key(1000), 12), Some(0));
    }

    #[test]
    fn a_thousand_flows_keep_their_owners() {
        let t = FlowOwners::new(FlowHash::new([9, 8, 7, 6, 5]));
        for p in 0..1000 {
            assert_eq!(t.record(&key(p), 12, p as usize % 3), Seen::New, "flow {p}");
        }
        // With 65,536 slots a few of 1,000 flows may share one; the rest
        // answer.
        let known = (0..1000).filter(|&p| t.owner(&key(p), 12) == Some(p as usize % 3)).count();
        assert!(known >= 990, "{known} of 1000");
        assert_eq!(t.owner(&key(5000), 12), None, "a flow never seen has no owner");
    }
}

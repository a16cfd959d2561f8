//! Broadcast and multicast delivery: a datagram sent to a group address
//! reaches every socket that matches it (Linux's
//! `__udp4_lib_mcast_deliver`), each in an mbuf of its own: the received
//! one for the last socket, copies for the others. Mbufs have one owner
//! and the receive path writes in place (the arrival in the headroom, a
//! reply in the request's mbuf), so sockets cannot share one. The copies
//! wait uncharged with the burst, so at most `GROUP_COPIES` wait at once:
//! a datagram whose copies would pass that first sends what the burst
//! staged so far to its queues (charged there), and only a group of more
//! members than that loses copies, each dropped and counted
//! (`RcvbufErrors`, `InErrors`).

use spate_dpdk::Mbuf;

use super::Worker;
use super::offsets::UdpInFrame;
use crate::datagram::{Datagram, header_span};
use crate::iface::Interface;
use crate::lookup::{Family, FlowKey};
use crate::shared::GROUP_COPIES;
use crate::stats::Counter;
use crate::wire::udp;

impl Worker<'_> {
    /// Stages `m`, a datagram to a group address, for every socket it
    /// reaches; returns `false` (and gives `m` back) when none matches.
    #[cold]
    #[inline(never)]
    pub(super) fn deliver_group(
        &mut self,
        ifc: &Interface,
        m: Mbuf,
        at: &UdpInFrame,
        key: &FlowKey,
        payload: usize,
    ) -> Result<(), Mbuf> {
        let mut matches = std::mem::take(&mut self.group_matches);
        self.snapshot.group_matches(key, &mut matches);
        // A tunnel's endpoint takes no group traffic; a socket takes a
        // group's only as its own membership's filter says (Linux's
        // `ip_mc_sf_allow`).
        let net = self.net.clone();
        let mcast = at.dst.is_multicast();
        matches.retain(|&i| {
            let b = self.snapshot.binding(i);
            let all = || b.sock.mcast_all.load(std::sync::atomic::Ordering::Relaxed);
            b.sock.tunnel.is_none() && (!mcast || net.mcast.socket_allows(b.id, ifc.index, &at.dst, &at.src, all()))
        });
        let Some((&last, rest)) = matches.split_last() else {
            self.group_matches = matches;
            return Err(m);
        };
        let v4 = at.src.is_ipv4();
        if self.group_copies > 0 && self.group_copies + rest.len() > GROUP_COPIES {
            // What the burst staged so far goes to its queues first (a
            // GRO train ended there: its place in the staging goes with it).
            self.gro_flush();
            self.stamp_staged();
            self.deliver_staged();
        }
        for &index in rest {
            let copy = match self.group_copies < GROUP_COPIES {
                true => copy_packet(&self.shared.pool, &m),
                false => None,
            };
            match copy {
                Some(c) => {
                    self.group_copies += 1;
                    self.stage_group(ifc, c, at, index, payload);
                }
                None => {
                    // Linux counts a failed clone as the socket's drop.
                    self.inc(if v4 { Counter::UdpRcvbufErrors } else { Counter::Udp6RcvbufErrors });
                    self.inc(if v4 { Counter::UdpInErrors } else { Counter::Udp6InErrors });
                }
            }
        }
        self.stage_group(ifc, m, at, last, payload);
        self.group_matches = matches;
        Ok(())
    }

    /// Stages one socket's copy: only the payload left in the mbuf, the
    /// headers in its headroom.
    fn stage_group(&mut self, ifc: &Interface, mut m: Mbuf, at: &UdpInFrame, index: u32, payload: usize) {
        let v4 = at.src.is_ipv4();
        let after = m.pkt_len() - (at.l4 + udp::HEADER_LEN + payload);
        if m.adj(at.l4 + udp::HEADER_LEN).is_err() || (after > 0 && m.trim(after).is_err()) {
            self.inc(if v4 { Counter::UdpInErrors } else { Counter::Udp6InErrors });
            return;
        }
        let mapped = self.snapshot.binding(index).family == Family::V6 && v4;
        let mut d = Datagram::new(m, header_span(at.l3, at.l4), mapped, ifc.index);
        d.set_group_copy();
        self.stage(index, v4, d);
    }
}

/// A copy of the packet in `m` (every segment, from the data's start), in
/// mbufs from `pool`: the same offsets, so the copy is cut as the
/// original is. `None` when the pool is out of mbufs.
pub(super) fn copy_packet(pool: &spate_dpdk::Mempool, m: &Mbuf) -> Option<Mbuf> {
    let mut head: Option<Mbuf> = None;
    for seg in m.segment_data() {
        let mut c = pool.alloc()?;
        c.append(seg.len()).ok()?.copy_from_slice(seg);
        match head.as_mut() {
            None => head = Some(c),
            Some(h) => h.chain(c).ok()?,
        }
    }
    head
}

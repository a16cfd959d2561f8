//! UDP GRO for sockets that ask for it (Linux's `UDP_GRO`): datagrams that
//! arrive back to back in one burst from one sender to one socket, all of
//! one size but the last (which may be shorter), become one datagram of up
//! to 64 segments, its mbufs chained, with that size as its `gso_size`.
//! Anything else in between (another flow, a bad checksum, ARP, a frame
//! for another socket) ends the train, as does a short segment; trains do
//! not span bursts.

use std::net::IpAddr;

use spate_dpdk::{Burst, Mbuf};

use super::offsets::UdpInFrame;
use crate::datagram::{Datagram, header_span};
use crate::wire::udp;

use super::Worker;
use crate::stats::Counter;

/// Segments in one coalesced datagram at most (Linux's `UDP_GRO` limit).
pub const MAX_SEGMENTS: u16 = 64;

/// A flow as GRO tells trains apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flow {
    pub src: IpAddr,
    pub src_port: u16,
    pub dst: IpAddr,
    pub dst_port: u16,
    /// What else the IP header says that a coalesced datagram must share,
    /// as Linux's `inet_gro_receive` and `ipv6_gro_receive` require: TOS
    /// and TTL, or the first word (traffic class, flow label) and the hop
    /// limit. A train ends where they change, so a reader's ECN and TTL
    /// are every segment's.
    pub ip: u64,
}

impl Flow {
    /// The `ip` word of the IP header `h`.
    #[inline]
    pub(crate) fn ip_word(h: &[u8], v4: bool) -> u64 {
        match (v4, h) {
            (true, [_, tos, _, _, _, _, _, _, ttl, ..]) => (*tos as u64) << 8 | *ttl as u64,
            (false, [a, b, c, d, _, _, _, hops, ..]) => {
                (u32::from_be_bytes([*a, *b, *c, *d]) as u64) << 8 | *hops as u64
            }
            _ => 0,
        }
    }
}

/// The datagram a burst may still grow, and the segments waiting to be
/// chained to it (in one pass, when the train ends). One per lcore, reused.
#[derive(Debug, Default)]
pub(crate) struct Train {
    /// Whether a train is open.
    open: bool,
    /// Its place among the burst's staged datagrams (run, position).
    pos: (usize, usize),
    /// The frame that last grew it.
    frame: u64,
    /// The socket's binding in the snapshot.
    index: u32,
    flow: Option<Flow>,
    /// Segment size: the first datagram's payload.
    seg: u16,
    /// A short segment came: nothing more may follow.
    closed: bool,
    /// The segments after the first.
    pending: Burst<{ MAX_SEGMENTS as usize }>,
}

impl Worker<'_> {
    /// A UDP datagram while the GRO stage runs, its socket found (`index`):
    /// to its tunnel's decapsulation, coalesced into the open train, or
    /// queued as usual (opening a train when its socket coalesces). Out of
    /// line, so the path without the stage stays as it was.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gro_stage_udp(
        &mut self,
        iface: u16,
        mut m: Mbuf,
        at: UdpInFrame,
        index: u32,
        mapped: bool,
        tunnel: Option<u16>,
        coalesce: bool,
        flow: Flow,
        payload: usize,
    ) -> Option<Counter> {
        self.inc(Counter::GroLookups);
        if let Some(port) = tunnel {
            return self.rx_vxlan(iface, port, m, at);
        }
        let after = m.pkt_len() - (at.l4 + udp::HEADER_LEN + payload);
        if m.adj(at.l4 + udp::HEADER_LEN).is_err() || (after > 0 && m.trim(after).is_err()) {
            self.inc(if at.src.is_ipv4() { Counter::UdpInErrors } else { Counter::Udp6InErrors });
            return Some(Counter::RxUdpErrors);
        }
        if coalesce {
            m = match self.gro_merge(index, &flow, m, payload) {
                Ok(()) => return Some(Counter::RxGroMerged),
                Err(m) => m,
            };
        }
        let d = Datagram::new(m, header_span(at.l3, at.l4), mapped, iface);
        let pos = self.stage(index, iface, at.src.is_ipv4(), d);
        self.gro_open(coalesce, index, flow, payload, pos);
        None
    }

    /// Adds the payload in `m` (`payload` bytes, headers already cut off)
    /// to the open train when it continues it; gives `m` back otherwise.
    #[inline]
    pub(super) fn gro_merge(&mut self, index: u32, flow: &Flow, m: Mbuf, payload: usize) -> Result<(), Mbuf> {
        let frame = self.frame_no;
        let t = &mut self.train;
        let continues = t.open
            && t.frame + 1 == frame
            && t.index == index
            && !t.closed
            && t.pending.len() + 1 < MAX_SEGMENTS as usize
            && payload > 0
            && payload <= t.seg as usize
            && t.flow.as_ref() == Some(flow);
        if !continues {
            return Err(m);
        }
        t.pending.push(m)?;
        t.frame = frame;
        t.closed = payload < t.seg as usize;
        if t.pending.len() == 1 {
            self.inc(Counter::GroCoalesced);
        }
        Ok(())
    }

    /// Opens a train at the datagram just staged at `pos` (ending the open
    /// one), or just ends the open one when this socket does not coalesce.
    #[inline]
    pub(super) fn gro_open(&mut self, coalesce: bool, index: u32, flow: Flow, payload: usize, pos: (usize, usize)) {
        self.gro_flush();
        if coalesce && payload > 0 && payload <= u16::MAX as usize {
            let t = &mut self.train;
            t.open = true;
            t.pos = pos;
            t.frame = self.frame_no;
            t.index = index;
            t.flow = Some(flow);
            t.seg = payload as u16;
            t.closed = false;
        }
    }

    /// Ends the open train: its segments join its first datagram.
    #[inline]
    pub(super) fn gro_flush(&mut self) {
        let t = &mut self.train;
        if !t.open {
            return;
        }
        t.open = false;
        if !t.pending.is_empty() {
            self.runs.get_mut(t.pos).append_segments(&mut t.pending, t.seg);
        }
    }
}

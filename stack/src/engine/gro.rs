//! UDP GRO for sockets that ask for it (Linux's `UDP_GRO`): datagrams that
//! arrive back to back in one burst from one sender to one socket, all of
//! one size but the last (which may be shorter), become one datagram of up
//! to 64 segments, its mbufs chained, with that size as its `gso_size`.
//! Anything else in between (another flow, a bad checksum, ARP, a frame
//! for another socket) ends the train, as does a short segment; trains do
//! not span bursts.

use std::net::IpAddr;

use spate_dpdk::Mbuf;

use super::offsets::UdpInFrame;
use crate::datagram::{Datagram, header_span};
use crate::wire::udp;

use super::{Step, Worker};
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

/// The datagram a burst may still grow: where it waits, what it is, and
/// the rules a datagram must meet to become its next segment. One per
/// lcore, reused; the segments themselves wait beside it (the lcore's
/// `train_segments`), to be chained to it in one pass when it ends.
#[derive(Debug, Default)]
pub(crate) struct Train {
    /// Whether a train is open.
    open: bool,
    /// Its place among the burst's staged datagrams (binding index,
    /// position in its share).
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
    /// Segments after the first.
    more: usize,
}

impl Train {
    /// Whether a datagram of `payload` bytes in frame number `frame`, for
    /// binding `index`, of `flow`, is the open train's next segment: the
    /// very next frame, the same socket and flow (IP word included), no
    /// short segment before it, no larger than the first, room left.
    #[inline]
    pub(super) fn continues(&self, frame: u64, index: u32, flow: &Flow, payload: usize) -> bool {
        self.open
            && self.frame + 1 == frame
            && self.index == index
            && !self.closed
            && self.more + 1 < MAX_SEGMENTS as usize
            && payload > 0
            && payload <= self.seg as usize
            && self.flow.as_ref() == Some(flow)
    }

    /// Takes that datagram as its next segment; returns whether it was the
    /// first one after the train's opening datagram.
    #[inline]
    pub(super) fn grow(&mut self, frame: u64, payload: usize) -> bool {
        self.frame = frame;
        self.closed = payload < self.seg as usize;
        self.more += 1;
        self.more == 1
    }

    /// Opens a train at the datagram staged at `pos` (frame number
    /// `frame`) when its socket coalesces and its payload can be a segment
    /// size; the open train must have ended. Returns whether it opened.
    #[inline]
    pub(super) fn start(
        &mut self,
        coalesce: bool,
        frame: u64,
        index: u32,
        flow: Flow,
        payload: usize,
        pos: (usize, usize),
    ) -> bool {
        debug_assert!(!self.open, "the open train ends first");
        if !coalesce || payload == 0 || payload > u16::MAX as usize {
            return false;
        }
        *self = Train { open: true, pos, frame, index, flow: Some(flow), seg: payload as u16, closed: false, more: 0 };
        true
    }

    /// Ends the open train: where its first datagram waits and the segment
    /// size, when segments were added to it.
    #[inline]
    pub(super) fn end(&mut self) -> Option<((usize, usize), u16)> {
        let grown = self.open && self.more > 0;
        (self.open, self.more) = (false, 0);
        grown.then_some((self.pos, self.seg))
    }
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
    ) -> Step {
        self.inc(Counter::GroLookups);
        if let Some(port) = tunnel {
            return self.rx_vxlan(iface, port, m, at);
        }
        let after = m.pkt_len() - (at.l4 + udp::HEADER_LEN + payload);
        if m.adj(at.l4 + udp::HEADER_LEN).is_err() || (after > 0 && m.trim(after).is_err()) {
            self.inc(if at.src.is_ipv4() { Counter::UdpInErrors } else { Counter::Udp6InErrors });
            return Step::Done(Some(Counter::RxUdpErrors));
        }
        if coalesce {
            m = match self.gro_merge(index, &flow, m, payload) {
                Ok(()) => return Step::Done(Some(Counter::RxGroMerged)),
                Err(m) => m,
            };
        }
        let d = Datagram::new(m, header_span(at.l3, at.l4), mapped, iface);
        let pos = self.stage(index, at.src.is_ipv4(), d);
        self.gro_open(coalesce, index, flow, payload, pos);
        Step::Done(None)
    }

    /// Adds the payload in `m` (`payload` bytes, headers already cut off)
    /// to the open train when it continues it; gives `m` back otherwise.
    #[inline]
    pub(super) fn gro_merge(&mut self, index: u32, flow: &Flow, m: Mbuf, payload: usize) -> Result<(), Mbuf> {
        let frame = self.frame_no;
        if !self.train.continues(frame, index, flow, payload) {
            return Err(m);
        }
        self.train_segments.push(m)?;
        if self.train.grow(frame, payload) {
            self.inc(Counter::GroCoalesced);
        }
        Ok(())
    }

    /// Opens a train at the datagram just staged at `pos` (ending the open
    /// one), or just ends the open one when this socket does not coalesce.
    #[inline]
    pub(super) fn gro_open(&mut self, coalesce: bool, index: u32, flow: Flow, payload: usize, pos: (usize, usize)) {
        self.gro_flush();
        self.train.start(coalesce, self.frame_no, index, flow, payload, pos);
    }

    /// Ends the open train: its segments join its first datagram.
    #[inline]
    pub(super) fn gro_flush(&mut self) {
        if let Some((pos, seg)) = self.train.end() {
            self.staging.get_mut(pos).append_segments(&mut self.train_segments, seg);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn flow(src_port: u16) -> Flow {
        let a = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2));
        let b = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
        Flow { src: a, src_port, dst: b, dst_port: 7, ip: 64 }
    }

    /// A train opened at frame 10 for binding 3, flow 5000, 1,200-byte
    /// segments.
    fn open() -> Train {
        let mut t = Train::default();
        assert!(t.start(true, 10, 3, flow(5000), 1200, (0, 0)));
        t
    }

    #[test]
    fn a_train_grows_only_from_one_frame_to_the_very_next() {
        let mut t = open();
        assert!(!t.continues(10, 3, &flow(5000), 1200), "the same frame");
        assert!(!t.continues(12, 3, &flow(5000), 1200), "a frame in between ended it");
        assert!(t.continues(11, 3, &flow(5000), 1200));
        assert!(t.grow(11, 1200), "the first segment after the opening one");
        assert!(t.continues(12, 3, &flow(5000), 1200));
        assert!(!t.grow(12, 1200));
        assert!(!t.continues(12, 3, &flow(5000), 1200), "frame 12 grew it already");
    }

    #[test]
    fn another_socket_flow_or_ip_header_ends_the_train() {
        let t = open();
        assert!(!t.continues(11, 4, &flow(5000), 1200), "another socket");
        assert!(!t.continues(11, 3, &flow(5001), 1200), "another sender port");
        let mut other_ttl = flow(5000);
        other_ttl.ip = 63;
        assert!(!t.continues(11, 3, &other_ttl, 1200), "another TTL or TOS");
        assert!(t.continues(11, 3, &flow(5000), 1200));
    }

    #[test]
    fn segments_are_the_first_ones_size_and_a_short_one_is_the_last() {
        let mut t = open();
        assert!(!t.continues(11, 3, &flow(5000), 1201), "larger than the first");
        assert!(!t.continues(11, 3, &flow(5000), 0), "empty");
        assert!(t.continues(11, 3, &flow(5000), 700));
        t.grow(11, 700);
        assert!(!t.continues(12, 3, &flow(5000), 700), "nothing follows a short segment");
        assert!(!t.continues(12, 3, &flow(5000), 1200));
    }

    #[test]
    fn a_train_holds_at_most_64_segments() {
        let mut t = open();
        let mut frame = 11;
        while t.continues(frame, 3, &flow(5000), 1200) {
            t.grow(frame, 1200);
            frame += 1;
        }
        // The opening datagram and those added.
        assert_eq!(1 + t.more, MAX_SEGMENTS as usize);
        assert_eq!(t.end(), Some(((0, 0), 1200)));
    }

    #[test]
    fn only_a_coalescing_socket_with_a_payload_opens_a_train_and_ending_reports_growth() {
        let mut t = Train::default();
        assert!(!t.start(false, 1, 3, flow(5000), 1200, (0, 0)), "the socket does not ask for GRO");
        assert!(!t.start(true, 1, 3, flow(5000), 0, (0, 0)), "no payload to be a segment size");
        assert!(!t.start(true, 1, 3, flow(5000), 65536, (0, 0)), "no segment size that large");
        assert!(!t.continues(2, 3, &flow(5000), 1200), "none opened");
        assert_eq!(t.end(), None);
        let mut t = open();
        assert_eq!(t.end(), None, "nothing to chain to a train that did not grow");
        assert!(!t.continues(11, 3, &flow(5000), 1200), "ended");
        let mut t = open();
        t.grow(11, 1200);
        assert_eq!(t.end(), Some(((0, 0), 1200)));
        assert_eq!(t.end(), None, "ended once");
    }

    #[test]
    fn the_ip_word_is_tos_and_ttl_or_the_first_word_and_hop_limit() {
        let mut v4 = [0u8; 20];
        (v4[1], v4[8]) = (0xb8, 61);
        assert_eq!(Flow::ip_word(&v4, true), 0xb8 << 8 | 61);
        v4[2] = 0xff; // the total length is no part of it
        assert_eq!(Flow::ip_word(&v4, true), 0xb8 << 8 | 61);
        let mut v6 = [0u8; 40];
        v6[..4].copy_from_slice(&[0x6b, 0x81, 0x23, 0x45]);
        v6[7] = 9;
        assert_eq!(Flow::ip_word(&v6, false), 0x6b81_2345 << 8 | 9);
        assert_eq!(Flow::ip_word(&v6[..5], false), 0, "too short to read");
    }
}

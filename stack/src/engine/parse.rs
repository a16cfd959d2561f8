//! The full path's reading of a frame, free of I/O: Ethernet, IPv4, IPv6
//! and UDP checked over any [`PacketBuf`], returning the frame's `Rx`
//! outcome or the step that acts on it ([`Frame`]); the MIB counters its
//! checks earn go to the caller's [`Tally`]. `rx.rs` acts on what comes
//! back (the lookup, reassembly, ICMP, IGMP, ARP); the unit tests below
//! drive it with buffers in memory and hold the fast path (`fast.rs`) to
//! it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use spate_dpdk::RxChecksum;

use super::offsets::UdpInFrame;
use crate::buf::PacketBuf;
use crate::frag::reassembly;
use crate::iface::Interface;
use crate::lookup::ip_key;
use crate::stats::Counter;
use crate::wire::{MacAddr, WireError, checksum, ethernet, ip_proto, ipv4, ipv6, udp};

/// Where the parse counts and asks: the lcore's counters, and the
/// interfaces' group memberships.
pub(crate) trait Tally {
    /// Counts one of `c`.
    fn inc(&mut self, c: Counter);
    /// Whether interface `iface` takes a packet to group `dst` from `src`
    /// (`query`: a membership query, which any joined group's interface
    /// takes), counting it as a group packet when it does.
    fn joined(&mut self, iface: u16, dst: IpAddr, src: IpAddr, query: bool) -> bool;
}

/// A [`Tally`] for unit tests that records: the counters counted, in
/// order, and the groups the interface is in.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct Record {
    pub counts: Vec<Counter>,
    pub groups: Vec<IpAddr>,
}

#[cfg(test)]
impl Tally for Record {
    fn inc(&mut self, c: Counter) {
        self.counts.push(c);
    }

    fn joined(&mut self, _iface: u16, dst: IpAddr, _src: IpAddr, _query: bool) -> bool {
        let ok = self.groups.contains(&dst);
        if ok {
            self.counts.push(if dst.is_ipv4() { Counter::IpExtInMcastPkts } else { Counter::Ip6InMcastPkts });
        }
        ok
    }
}

/// What a frame is, once its headers are checked: dropped with its `Rx`
/// outcome, or the step that acts on it, with the buffer.
#[derive(Debug)]
pub(crate) enum Frame<B> {
    /// Dropped (its MIB counters counted): the frame's `Rx` outcome.
    Done(Counter),
    /// ARP, its header at `l2`.
    Arp { m: B, l2: usize },
    /// UDP, its length and checksum not yet checked ([`udp()`]).
    Udp { m: B, at: UdpInFrame },
    /// An IPv4 or IPv6 fragment, for reassembly.
    Fragment { key: reassembly::Key, f: reassembly::Fragment<B>, src: IpAddr, dst: IpAddr, group: bool },
    /// ICMPv4, its header at `l4`.
    Icmpv4 { m: B, l4: usize, src: Ipv4Addr, dst: Ipv4Addr, broadcast: bool },
    /// IGMP, its message at `l4..end`.
    Igmp { m: B, l4: usize, end: usize },
    /// An IPv4 protocol spate does not speak: answered with protocol
    /// unreachable unless `broadcast`.
    UnknownV4 { m: B, l2: usize, src: Ipv4Addr, dst: Ipv4Addr, broadcast: bool },
    /// ICMPv6, its header at `l4`.
    Icmpv6 { m: B, l4: usize, src: Ipv6Addr, dst: Ipv6Addr, hop_limit: u8, eth_src: MacAddr },
    /// An IPv6 next header spate does not speak: answered with a
    /// parameter problem when `answer`.
    UnknownV6 { m: B, l2: usize, src: Ipv6Addr, dst: Ipv6Addr, answer: bool },
}

/// A UDP header's ports and the payload's length, once its length and
/// checksum are good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UdpHeader {
    pub src_port: u16,
    pub dst_port: u16,
    pub payload: usize,
    /// The checksum field holds only the pseudo-header's sum (accepted on
    /// a port whose frames the kernel hands over as sent): the receive
    /// path completes it, so that a reply built from the datagram's
    /// headers carries a good one.
    pub partial: bool,
}

/// Counters of one IP family's UDP.
pub(crate) struct UdpCounters {
    pub no_ports: Counter,
    pub in_errors: Counter,
    pub csum_errors: Counter,
    pub ignored_multi: Counter,
}

/// IPv4's.
pub(crate) const UDP4: UdpCounters = UdpCounters {
    no_ports: Counter::UdpNoPorts,
    in_errors: Counter::UdpInErrors,
    csum_errors: Counter::UdpInCsumErrors,
    ignored_multi: Counter::UdpIgnoredMulti,
};

/// IPv6's.
pub(crate) const UDP6: UdpCounters = UdpCounters {
    no_ports: Counter::Udp6NoPorts,
    in_errors: Counter::Udp6InErrors,
    csum_errors: Counter::Udp6InCsumErrors,
    ignored_multi: Counter::Udp6IgnoredMulti,
};

/// The UDP counters of a datagram from `src`.
#[inline(always)]
pub(crate) fn udp_counters(src: &IpAddr) -> &'static UdpCounters {
    if src.is_ipv4() { &UDP4 } else { &UDP6 }
}

/// A frame that came in on `ifc`: its Ethernet header checked, then its
/// IPv4 or IPv6 header.
#[inline]
pub(crate) fn frame<B: PacketBuf>(ifc: &Interface, m: B, t: &mut impl Tally) -> Frame<B> {
    let data = m.data();
    let frame = ethernet::Frame::new_unchecked(data);
    if frame.check_len().is_err() {
        return Frame::Done(Counter::RxEthTruncated);
    }
    if !ifc.accepts_mac(&frame.dst()) {
        return Frame::Done(Counter::RxNotForUs);
    }
    if frame.vlan_id() != ifc.vlan {
        return Frame::Done(Counter::RxVlanMismatch);
    }
    let l2 = frame.header_len();
    let eth_src = frame.src();
    match frame.ethertype() {
        ethernet::ethertype::IPV4 => ipv4(ifc, m, l2, t),
        ethernet::ethertype::IPV6 => ipv6(ifc, m, l2, eth_src, t),
        ethernet::ethertype::ARP => Frame::Arp { m, l2 },
        _ => Frame::Done(Counter::RxUnknownEtherType),
    }
}

/// An IPv4 packet at `l2`.
fn ipv4<B: PacketBuf>(ifc: &Interface, mut m: B, l2: usize, t: &mut impl Tally) -> Frame<B> {
    t.inc(Counter::IpInReceives);
    let data = &m.data()[l2..];
    let ip = ipv4::Packet::new_unchecked(data);
    match ip.check_len() {
        Ok(()) => {}
        Err(WireError::Truncated) => {
            t.inc(Counter::IpInTruncatedPkts);
            return Frame::Done(Counter::RxIpv4Truncated);
        }
        Err(_) => {
            t.inc(Counter::IpInHdrErrors);
            return Frame::Done(Counter::RxIpv4HdrErrors);
        }
    }
    let checksum_ok = match m.rx_ip_checksum() {
        RxChecksum::Good => true,
        RxChecksum::Bad => false,
        _ => ip.verify_checksum(),
    };
    if ip.version() != 4 || !checksum_ok {
        t.inc(Counter::IpInHdrErrors);
        return Frame::Done(Counter::RxIpv4HdrErrors);
    }
    let (src, dst, protocol) = (ip.src(), ip.dst(), ip.protocol());
    let (ihl, total, fragment) = (ip.header_len(), ip.total_len() as usize, ip.is_fragment());
    let (ident, frag_offset, more_frags) = (ip.ident(), ip.frag_offset(), ip.more_frags());
    let padding = data.len() - total;
    // A group the interface is in (the sockets' own filters apply at
    // delivery), or every host's.
    let query = protocol == ip_proto::IGMP;
    let group = dst.is_multicast() && t.joined(ifc.index, dst.into(), src.into(), query);
    let broadcast = group || (!ifc.has_ipv4(dst) && ifc.is_ipv4_broadcast(dst));
    if !broadcast && !ifc.has_ipv4(dst) {
        t.inc(Counter::IpInAddrErrors);
        return Frame::Done(Counter::RxIpv4NotForUs);
    }
    if src.is_broadcast() || src.is_multicast() || ifc.is_ipv4_broadcast(src) {
        t.inc(Counter::IpInHdrErrors);
        return Frame::Done(Counter::RxIpv4HdrErrors);
    }
    if padding > 0 && m.trim(padding).is_err() {
        t.inc(Counter::IpInHdrErrors);
        return Frame::Done(Counter::RxIpv4HdrErrors);
    }
    if fragment {
        t.inc(Counter::IpReasmReqds);
        let key = reassembly::Key {
            src: ip_key(&src.into()),
            dst: ip_key(&dst.into()),
            protocol,
            ident: ident as u32,
            v6: false,
        };
        let f = reassembly::Fragment {
            offset: frag_offset,
            more: more_frags,
            len: (total - ihl) as u32,
            data_at: l2 + ihl,
            l3: l2,
            mbuf: m,
        };
        return Frame::Fragment { key, f, src: src.into(), dst: dst.into(), group: broadcast };
    }
    let l4 = l2 + ihl;
    match protocol {
        ip_proto::UDP => {
            t.inc(Counter::IpInDelivers);
            let at = UdpInFrame { l3: l2, l4, end: l2 + total, src: src.into(), dst: dst.into(), group: broadcast };
            Frame::Udp { m, at }
        }
        ip_proto::ICMP => {
            t.inc(Counter::IpInDelivers);
            Frame::Icmpv4 { m, l4, src, dst, broadcast }
        }
        ip_proto::IGMP => {
            t.inc(Counter::IpInDelivers);
            Frame::Igmp { m, l4, end: l2 + total }
        }
        _ => {
            t.inc(Counter::IpInUnknownProtos);
            Frame::UnknownV4 { m, l2, src, dst, broadcast }
        }
    }
}

/// An IPv6 packet at `l2`, from the Ethernet source `eth_src`.
fn ipv6<B: PacketBuf>(ifc: &Interface, mut m: B, l2: usize, eth_src: MacAddr, t: &mut impl Tally) -> Frame<B> {
    t.inc(Counter::Ip6InReceives);
    let data = &m.data()[l2..];
    let ip = ipv6::Packet::new_unchecked(data);
    if ip.check_len().is_err() {
        t.inc(Counter::Ip6InTruncatedPkts);
        return Frame::Done(Counter::RxIpv6Truncated);
    }
    if ip.version() != 6 {
        t.inc(Counter::Ip6InHdrErrors);
        return Frame::Done(Counter::RxIpv6HdrErrors);
    }
    let (src, dst, hop_limit) = (ip.src(), ip.dst(), ip.hop_limit());
    let len = ipv6::HEADER_LEN + ip.payload_len() as usize;
    // MLD comes behind a hop-by-hop Router Alert; UDP to a group does not.
    let query = ip.next_header() == ip_proto::HOP_BY_HOP;
    let joined = dst.is_multicast() && t.joined(ifc.index, dst.into(), src.into(), query);
    if !joined && !ifc.accepts_ipv6(&dst) {
        t.inc(Counter::Ip6InAddrErrors);
        return Frame::Done(Counter::RxIpv6NotForUs);
    }
    if src.is_multicast() {
        t.inc(Counter::Ip6InHdrErrors);
        return Frame::Done(Counter::RxIpv6HdrErrors);
    }
    let ext = match ipv6::walk_extensions(ip.next_header(), ip.payload()) {
        Ok(e) => e,
        Err(_) => {
            t.inc(Counter::Ip6InHdrErrors);
            return Frame::Done(Counter::RxIpv6ExtErrors);
        }
    };
    let padding = data.len() - len;
    if padding > 0 && m.trim(padding).is_err() {
        t.inc(Counter::Ip6InHdrErrors);
        return Frame::Done(Counter::RxIpv6HdrErrors);
    }
    if let Some(frag) = ext.fragment {
        t.inc(Counter::Ip6ReasmReqds);
        let key = reassembly::Key {
            src: ip_key(&src.into()),
            dst: ip_key(&dst.into()),
            protocol: frag.next_header,
            ident: frag.ident,
            v6: true,
        };
        let f = reassembly::Fragment {
            offset: frag.offset,
            more: frag.more,
            len: (len - ipv6::HEADER_LEN - ext.fragment_offset) as u32,
            data_at: l2 + ipv6::HEADER_LEN + ext.fragment_offset,
            l3: l2,
            mbuf: m,
        };
        return Frame::Fragment { key, f, src: src.into(), dst: dst.into(), group: dst.is_multicast() };
    }
    let l4 = l2 + ipv6::HEADER_LEN + ext.offset;
    match ext.protocol {
        ip_proto::UDP => {
            t.inc(Counter::Ip6InDelivers);
            let at =
                UdpInFrame { l3: l2, l4, end: l2 + len, src: src.into(), dst: dst.into(), group: dst.is_multicast() };
            Frame::Udp { m, at }
        }
        ip_proto::ICMPV6 => {
            t.inc(Counter::Ip6InDelivers);
            Frame::Icmpv6 { m, l4, src, dst, hop_limit, eth_src }
        }
        proto => {
            t.inc(Counter::Ip6InUnknownProtos);
            let answer = proto != ip_proto::NO_NEXT && ext.count == 0 && !dst.is_multicast();
            Frame::UnknownV6 { m, l2, src, dst, answer }
        }
    }
}

/// A UDP datagram in one segment: its length and checksum (the port's
/// verdict, else computed; IPv6 has no datagram without one). On a port
/// whose frames the kernel hands over as sent, a field that holds only
/// the pseudo-header's sum is a checksum a sender on the same host left to
/// an offload: accepted, and counted, as the kernel accepts it, in an IP
/// packet of at most `partial_up_to` bytes (the interface's MTU; 0 on
/// other ports). A longer one is a UDP GSO batch handed over unsegmented:
/// no single datagram, an error.
#[inline]
pub(crate) fn udp<B: PacketBuf>(
    m: &B,
    at: &UdpInFrame,
    partial_up_to: usize,
    t: &mut impl Tally,
) -> Result<UdpHeader, Counter> {
    let c = udp_counters(&at.src);
    let p = udp::Packet::new_unchecked(&m.data()[at.l4..at.end]);
    if p.check_len().is_err() {
        t.inc(c.in_errors);
        return Err(Counter::RxUdpErrors);
    }
    let checksum_ok = match m.rx_l4_checksum() {
        RxChecksum::Good => p.checksum() != 0 || at.src.is_ipv4(),
        RxChecksum::Bad => false,
        _ => p.verify_checksum(&at.src, &at.dst),
    };
    let partial =
        !checksum_ok && at.end - at.l3 <= partial_up_to && p.checksum() != 0 && p.is_partial_checksum(&at.src, &at.dst);
    if partial {
        t.inc(Counter::CsumPartial);
    } else if !checksum_ok {
        t.inc(c.csum_errors);
        t.inc(c.in_errors);
        return Err(Counter::RxUdpCsumErrors);
    }
    let payload = p.len() as usize - udp::HEADER_LEN;
    Ok(UdpHeader { src_port: p.src_port(), dst_port: p.dst_port(), payload, partial })
}

/// A reassembled UDP datagram (a chain, the UDP header in the first
/// segment): its length and checksum checked over the segments.
pub(crate) fn reassembled_udp<B: PacketBuf>(m: &B, at: &UdpInFrame, t: &mut impl Tally) -> Result<UdpHeader, Counter> {
    let c = udp_counters(&at.src);
    let Some(hdr) = m.data().get(at.l4..at.l4 + udp::HEADER_LEN) else {
        t.inc(c.in_errors);
        return Err(Counter::RxUdpErrors);
    };
    // The header alone (the datagram runs on in the next segments).
    let hdr = udp::Packet::new_unchecked(hdr);
    let (udp_len, field) = (hdr.len() as usize, hdr.checksum());
    if udp_len != at.end - at.l4 || udp_len < udp::HEADER_LEN {
        t.inc(c.in_errors);
        return Err(Counter::RxUdpErrors);
    }
    let ok = if field == 0 {
        at.src.is_ipv4()
    } else {
        let pseudo = udp::pseudo_header(&at.src, &at.dst, udp_len as u16);
        let mut segments = m.segments();
        let first = segments.next().map(|s| &s[at.l4..]).unwrap_or(&[]);
        // Every fragment but the last carries a multiple of 8 bytes, so
        // each segment starts on an even offset of the datagram.
        let sum = segments.fold(checksum::sum(first), |acc, s| acc + checksum::sum(s));
        checksum::fold(pseudo + sum) == 0xffff
    };
    if !ok {
        t.inc(c.csum_errors);
        t.inc(c.in_errors);
        return Err(Counter::RxUdpCsumErrors);
    }
    Ok(UdpHeader {
        src_port: hdr.src_port(),
        dst_port: hdr.dst_port(),
        payload: udp_len - udp::HEADER_LEN,
        partial: false,
    })
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

    use spate_dpdk::RxChecksum;

    use super::*;
    use crate::buf::MemBuf;
    use crate::engine::testing::*;
    use crate::frag::reassembly::{Limits, Outcome, Reassembler};
    use crate::time::Instant;
    use crate::wire::ethernet::ethertype;

    const L3: usize = 14;
    const L4: usize = L3 + 20;
    const L4_V6: usize = L3 + 40;

    /// `m` through the parse: what it became and what it counted.
    fn parse(m: MemBuf) -> (Frame<MemBuf>, Vec<Counter>) {
        let mut t = Record::default();
        let f = frame(&interface(), m, &mut t);
        (f, t.counts)
    }

    fn done(m: MemBuf) -> (Counter, Vec<Counter>) {
        match parse(m) {
            (Frame::Done(c), counts) => (c, counts),
            (other, _) => panic!("not dropped: {other:?}"),
        }
    }

    fn udp_step(m: MemBuf) -> (MemBuf, UdpInFrame) {
        match parse(m) {
            (Frame::Udp { m, at }, _) => (m, at),
            (other, _) => panic!("not UDP: {other:?}"),
        }
    }

    #[test]
    fn a_datagram_to_us_reaches_the_udp_step_with_its_offsets_and_ports() {
        let (s, d) = to_us4();
        let (f, counts) = parse(udp_frame(s, d, b"hello"));
        let Frame::Udp { m, at } = f else { panic!("not UDP: {f:?}") };
        let want = UdpInFrame { l3: L3, l4: L4, end: L4 + 13, src: s.ip(), dst: d.ip(), group: false };
        assert_eq!(at, want);
        assert_eq!(counts, [Counter::IpInReceives, Counter::IpInDelivers]);
        let h = udp(&m, &at, 0, &mut Record::default()).expect("good datagram");
        assert_eq!(h, UdpHeader { src_port: 5000, dst_port: 7, payload: 5, partial: false });

        let (s, d) = to_us6();
        let (f, counts) = parse(udp_frame(s, d, b"hello"));
        let Frame::Udp { m, at } = f else { panic!("not UDP: {f:?}") };
        assert_eq!((at.l4, at.end, at.src, at.group), (L4_V6, L4_V6 + 13, s.ip(), false));
        assert_eq!(counts, [Counter::Ip6InReceives, Counter::Ip6InDelivers]);
        assert_eq!(udp(&m, &at, 0, &mut Record::default()).map(|h| h.payload), Ok(5));
    }

    #[test]
    fn ethernet_drops_name_their_cause_and_count_no_ip_counter() {
        let (s, d) = to_us4();
        let good = udp_frame(s, d, b"x");
        let short = MemBuf::new(&good.to_vec()[..13]);
        let elsewhere = edited(&good, |b| b[5] = 0x09);
        let tagged = edited(&good, |b| {
            b.splice(12..12, [0x81, 0x00, 0x00, 0x05]);
        });
        let unknown = edited(&good, |b| b[12..14].copy_from_slice(&0x88b5u16.to_be_bytes()));
        for (m, want) in [
            (short, Counter::RxEthTruncated),
            (elsewhere, Counter::RxNotForUs),
            (tagged, Counter::RxVlanMismatch),
            (unknown, Counter::RxUnknownEtherType),
        ] {
            assert_eq!(done(m), (want, vec![]));
        }
        let arp = edited(&good, |b| b[12..14].copy_from_slice(&ethertype::ARP.to_be_bytes()));
        assert!(matches!(parse(arp).0, Frame::Arp { l2: L3, .. }));
    }

    #[test]
    fn the_ports_checksum_verdict_comes_before_the_ipv4_sum() {
        let (s, d) = to_us4();
        let good = udp_frame(s, d, b"x");
        let mut bad = edited(&good, |b| b[L3 + 10] ^= 0xff);
        let hdr_error = (Counter::RxIpv4HdrErrors, vec![Counter::IpInReceives, Counter::IpInHdrErrors]);
        assert_eq!(done(bad.clone()), hdr_error);
        bad.rx_checksum.0 = RxChecksum::Good;
        udp_step(bad);
        let mut refused = good.clone();
        refused.rx_checksum.0 = RxChecksum::Bad;
        assert_eq!(done(refused), hdr_error);
        let v5 = edited(&good, |b| {
            b[L3] = 0x55;
            refill_ipv4_checksum(b, L3);
        });
        assert_eq!(done(v5), hdr_error);
        let truncated = MemBuf::new(&good.to_vec()[..L3 + 19]);
        assert_eq!(
            done(truncated),
            (Counter::RxIpv4Truncated, vec![Counter::IpInReceives, Counter::IpInTruncatedPkts])
        );
    }

    #[test]
    fn ipv4_addresses_decide_whose_the_packet_is() {
        let peer: SocketAddr = (PEER4, 5000).into();
        let to = |a: [u8; 4]| SocketAddr::from((Ipv4Addr::from(a), 7));
        assert_eq!(
            done(udp_frame(peer, to([198, 18, 0, 9]), b"x")),
            (Counter::RxIpv4NotForUs, vec![Counter::IpInReceives, Counter::IpInAddrErrors])
        );
        let (_, at) = udp_step(udp_frame(peer, to([198, 18, 0, 255]), b"x"));
        assert!(at.group, "the subnet's broadcast is a group datagram");
        let (_, at) = udp_step(udp_frame(peer, to([255, 255, 255, 255]), b"x"));
        assert!(at.group);
        let from_broadcast = udp_frame(SocketAddr::from(([198, 18, 0, 255], 5000)), to([198, 18, 0, 1]), b"x");
        assert_eq!(done(from_broadcast).0, Counter::RxIpv4HdrErrors);
        // A group: only once the interface is in it.
        let group = udp_frame(peer, to([239, 1, 2, 3]), b"x");
        assert_eq!(done(group.clone()).0, Counter::RxIpv4NotForUs);
        let mut t = Record { groups: vec![IpAddr::from([239, 1, 2, 3])], ..Record::default() };
        let Frame::Udp { at, .. } = frame(&interface(), group, &mut t) else { panic!("a joined group's datagram") };
        assert!(at.group);
        assert_eq!(t.counts, [Counter::IpInReceives, Counter::IpExtInMcastPkts, Counter::IpInDelivers]);
    }

    #[test]
    fn padding_after_the_ip_packet_is_cut_before_the_udp_step() {
        let (s, d) = to_us4();
        let good = udp_frame(s, d, b"hi");
        let padded = edited(&good, |b| b.resize(60, 0));
        let (m, at) = udp_step(padded);
        assert_eq!(m.to_vec(), good.to_vec());
        assert_eq!(at.end, good.pkt_len());
        let (s, d) = to_us6();
        let good = udp_frame(s, d, b"hi");
        let (m, _) = udp_step(edited(&good, |b| b.extend([0; 7])));
        assert_eq!(m.to_vec(), good.to_vec());
    }

    #[test]
    fn a_checksum_left_to_an_offload_passes_only_where_the_kernel_hands_frames_over() {
        for ((s, d), l4) in [(to_us4(), L4), (to_us6(), L4_V6)] {
            let good = udp_frame(s, d, b"left to the offload");
            let len = good.pkt_len() - l4;
            let pseudo = udp::pseudo_header(&s.ip(), &d.ip(), len as u16);
            let partial = edited(&good, |b| b[l4 + 6..l4 + 8].copy_from_slice(&checksum::fold(pseudo).to_be_bytes()));
            let check = |m: &MemBuf, up_to: usize| {
                let (m, at) = udp_step(m.clone());
                let mut t = Record::default();
                (udp(&m, &at, up_to, &mut t).map(|h| h.partial), t.counts)
            };
            assert_eq!(check(&partial, 1500), (Ok(true), vec![Counter::CsumPartial]));
            assert_eq!(check(&partial, 0).0, Err(Counter::RxUdpCsumErrors), "a port that checks them all");
            assert_eq!(check(&good, 1500), (Ok(false), vec![]), "a whole checksum is no partial one");
            // Past the MTU: a GSO batch handed over whole, no datagram.
            let ip_len = good.pkt_len() - L3;
            assert_eq!(check(&partial, ip_len - 1).0, Err(Counter::RxUdpCsumErrors));
            assert_eq!(check(&partial, ip_len).0, Ok(true));
            // Any other wrong field is wrong.
            let wrong = edited(&partial, |b| b[l4 + 7] ^= 1);
            assert_eq!(check(&wrong, 1500).0, Err(Counter::RxUdpCsumErrors));
        }
    }

    #[test]
    fn udp_length_and_checksum_are_checked_and_counted_by_family() {
        let check = |m: MemBuf| {
            let (m, at) = udp_step(m);
            let mut t = Record::default();
            (udp(&m, &at, 0, &mut t), t.counts)
        };
        let (s, d) = to_us4();
        let good = udp_frame(s, d, b"payload");
        let mut bad = edited(&good, |b| b[L4 + 8] ^= 1);
        let csum = Err(Counter::RxUdpCsumErrors);
        assert_eq!(check(bad.clone()), (csum, vec![Counter::UdpInCsumErrors, Counter::UdpInErrors]));
        bad.rx_checksum.1 = RxChecksum::Good;
        assert!(check(bad).0.is_ok(), "the port's verdict stands");
        // IPv4 may leave it out; IPv6 may not.
        assert!(check(edited(&good, |b| b[L4 + 6..L4 + 8].fill(0))).0.is_ok());
        let (s6, d6) = to_us6();
        let good6 = udp_frame(s6, d6, b"payload");
        let zero6 = edited(&good6, |b| b[L4_V6 + 6..L4_V6 + 8].fill(0));
        assert_eq!(check(zero6), (csum, vec![Counter::Udp6InCsumErrors, Counter::Udp6InErrors]));
        let mut zero6_good = edited(&good6, |b| b[L4_V6 + 6..L4_V6 + 8].fill(0));
        zero6_good.rx_checksum.1 = RxChecksum::Good;
        assert_eq!(check(zero6_good).0, csum, "a zero IPv6 checksum is wrong whatever the port says");
        // A UDP length past the IP packet's end.
        let long = edited(&good, |b| b[L4 + 4..L4 + 6].copy_from_slice(&100u16.to_be_bytes()));
        assert_eq!(check(long), (Err(Counter::RxUdpErrors), vec![Counter::UdpInErrors]));
    }

    #[test]
    fn ipv6_extension_headers_are_walked_and_unknown_next_headers_answered() {
        let (s, d) = to_us6();
        let good = udp_frame(s, d, b"data");
        // A hop-by-hop header (PadN) in front of UDP.
        let hop_by_hop = edited(&good, |b| {
            b.splice(L4_V6..L4_V6, [ip_proto::UDP, 0, 1, 4, 0, 0, 0, 0]);
            b[L3 + 6] = ip_proto::HOP_BY_HOP;
            let len = u16::from_be_bytes([b[L3 + 4], b[L3 + 5]]) + 8;
            b[L3 + 4..L3 + 6].copy_from_slice(&len.to_be_bytes());
        });
        let (m, at) = udp_step(hop_by_hop);
        assert_eq!(at.l4, L4_V6 + 8);
        assert_eq!(udp(&m, &at, 0, &mut Record::default()).map(|h| h.dst_port), Ok(7));
        let next = |n: u8| edited(&good, |b| b[L3 + 6] = n);
        let (f, counts) = parse(next(132));
        assert!(matches!(f, Frame::UnknownV6 { answer: true, l2: L3, .. }), "{f:?}");
        assert_eq!(counts, [Counter::Ip6InReceives, Counter::Ip6InUnknownProtos]);
        assert!(matches!(parse(next(ip_proto::NO_NEXT)).0, Frame::UnknownV6 { answer: false, .. }));
        let from_group = udp_frame((Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1), 9).into(), d, b"x");
        assert_eq!(done(from_group).0, Counter::RxIpv6HdrErrors);
        let elsewhere = udp_frame(s, (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 9), 7).into(), b"x");
        assert_eq!(done(elsewhere), (Counter::RxIpv6NotForUs, vec![Counter::Ip6InReceives, Counter::Ip6InAddrErrors]));
        let routing = edited(&good, |b| {
            b.splice(L4_V6..L4_V6, [ip_proto::UDP, 0, 0, 1, 0, 0, 0, 0]);
            b[L3 + 6] = ip_proto::ROUTING;
            let len = u16::from_be_bytes([b[L3 + 4], b[L3 + 5]]) + 8;
            b[L3 + 4..L3 + 6].copy_from_slice(&len.to_be_bytes());
        });
        assert_eq!(done(routing).0, Counter::RxIpv6ExtErrors, "segments left: spate is no router");
    }

    #[test]
    fn icmp_igmp_and_unknown_protocols_go_to_their_steps() {
        let (s, d) = to_us4();
        let good = udp_frame(s, d, b"12345678");
        let proto = |m: &MemBuf, p: u8| {
            edited(m, |b| {
                b[L3 + 9] = p;
                refill_ipv4_checksum(b, L3);
            })
        };
        assert!(matches!(parse(proto(&good, ip_proto::ICMP)).0, Frame::Icmpv4 { l4: L4, broadcast: false, .. }));
        let (f, counts) = parse(proto(&good, ip_proto::IGMP));
        assert!(matches!(f, Frame::Igmp { l4: L4, end: 50, .. }), "{f:?}");
        assert_eq!(counts, [Counter::IpInReceives, Counter::IpInDelivers]);
        let (f, counts) = parse(proto(&good, 99));
        assert!(matches!(f, Frame::UnknownV4 { broadcast: false, l2: L3, .. }), "{f:?}");
        assert_eq!(counts, [Counter::IpInReceives, Counter::IpInUnknownProtos]);
        // To the subnet's broadcast: not answered.
        let broadcast = udp_frame((PEER4, 5000).into(), (Ipv4Addr::new(198, 18, 0, 255), 7).into(), b"x");
        assert!(matches!(parse(proto(&broadcast, 99)).0, Frame::UnknownV4 { broadcast: true, .. }));
        let (s6, d6) = to_us6();
        let icmp6 = edited(&udp_frame(s6, d6, b"x"), |b| b[L3 + 6] = ip_proto::ICMPV6);
        let (f, counts) = parse(icmp6);
        assert!(matches!(f, Frame::Icmpv6 { l4: L4_V6, hop_limit: 64, .. }), "{f:?}");
        assert_eq!(counts, [Counter::Ip6InReceives, Counter::Ip6InDelivers]);
    }

    /// `whole`'s IP payload cut into fragments of `chunk` bytes (a
    /// multiple of 8), each a frame of its own.
    fn fragments(whole: &MemBuf, v6: bool, chunk: usize) -> Vec<MemBuf> {
        let b = whole.to_vec();
        let l4 = if v6 { L4_V6 } else { L4 };
        let payload = &b[l4..];
        let mut out = Vec::new();
        for (i, part) in payload.chunks(chunk).enumerate() {
            let (offset, more) = ((i * chunk) as u16, (i + 1) * chunk < payload.len());
            let mut f = b[..l4].to_vec();
            if v6 {
                f[L3 + 6] = ip_proto::FRAGMENT;
                f[L3 + 4..L3 + 6].copy_from_slice(&((8 + part.len()) as u16).to_be_bytes());
                f.extend([ip_proto::UDP, 0]);
                f.extend((offset | more as u16).to_be_bytes());
                f.extend(0xfeed_beefu32.to_be_bytes());
            } else {
                f[L3 + 2..L3 + 4].copy_from_slice(&((20 + part.len()) as u16).to_be_bytes());
                f[L3 + 6..L3 + 8].copy_from_slice(&((offset / 8) | ((more as u16) << 13)).to_be_bytes());
                refill_ipv4_checksum(&mut f, L3);
            }
            f.extend_from_slice(part);
            out.push(MemBuf::new(&f));
        }
        out
    }

    /// Fragments through the parse and a reassembly table: the UDP step's
    /// verdict on the datagram they make, and its payload.
    fn reassemble(frames: Vec<MemBuf>) -> Result<(UdpHeader, Vec<u8>), Counter> {
        let mut table: Reassembler<MemBuf> =
            Reassembler::new(Limits { high: 1 << 20, low: 1 << 19, timeout_ns: 1_000_000_000, max_datagrams: 4 });
        let n = frames.len();
        for (i, m) in frames.into_iter().enumerate() {
            let (f, _) = parse(m);
            let Frame::Fragment { key, f, src, dst, group } = f else { panic!("not a fragment: {f:?}") };
            match table.insert(key, f, Instant(0)) {
                Outcome::Held => assert!(i + 1 < n, "the last fragment completes it"),
                Outcome::Complete { mbuf, l3, data_at, len } => {
                    assert_eq!(i + 1, n, "complete before its last fragment");
                    let at = UdpInFrame { l3, l4: data_at, end: data_at + len as usize, src, dst, group };
                    let h = reassembled_udp(&mbuf, &at, &mut Record::default())?;
                    return Ok((h, bytes_from(&mbuf, data_at + udp::HEADER_LEN)));
                }
                other => panic!("fragment refused: {other:?}"),
            }
        }
        panic!("never complete")
    }

    #[test]
    fn fragments_of_both_families_reassemble_through_the_parse() {
        let payload: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
        for (v6, (s, d)) in [(false, to_us4()), (true, to_us6())] {
            let whole = udp_frame(s, d, &payload);
            let mut frames = fragments(&whole, v6, 1232);
            assert_eq!(frames.len(), 3);
            frames.rotate_left(1); // the first fragment comes last
            let (h, got) = reassemble(frames).expect("a good datagram");
            assert_eq!(h, UdpHeader { src_port: 5000, dst_port: 7, payload: 3000, partial: false });
            assert_eq!(got, payload, "v6: {v6}");
            // A byte changed in the middle fragment: the sum over the
            // chain finds it.
            let mut frames = fragments(&whole, v6, 1232);
            frames[1] = edited(&frames[1], |b| *b.last_mut().unwrap() ^= 0x10);
            assert_eq!(reassemble(frames).map(|_| ()), Err(Counter::RxUdpCsumErrors));
        }
    }
}

//! The fast path: the common case (IPv4 or IPv6 UDP to a bound socket,
//! nothing unusual) without the full path's branches, tried first for
//! every frame of a burst without the GRO stage; what it does not take
//! goes back, untouched, to the full path (`rx.rs`), which counts and
//! answers it.

use std::net::Ipv6Addr;

use spate_dpdk::{Mbuf, RxChecksum};

use super::Worker;
use crate::buf::PacketBuf;
use crate::datagram::{Datagram, header_span};
use crate::iface::Interface;
use crate::lookup::{Family, FlowKey, Shortcut, TableSnapshot, reciprocal_scale};
use crate::wire::{checksum, ethernet, ip_proto, ipv4, ipv6, udp};

/// Where the fast path finds an untagged IPv4 frame's headers.
const FAST_L3: usize = ethernet::HEADER_LEN;
const FAST_L4: usize = FAST_L3 + ipv4::HEADER_LEN;
/// And an IPv6 frame's UDP header, after a header without extensions.
const FAST6_L4: usize = FAST_L3 + ipv6::HEADER_LEN;

/// Whether a UDP checksum verifies, from the sum over the pseudo-header's
/// addresses (which lie just before the UDP header, in IPv4 and IPv6
/// alike) through the datagram's end, plus protocol and length; in the
/// machine's byte order (the fold is all ones either way).
#[inline(always)]
fn udp_sum_ok(addresses_to_end: &[u8], udp_len: usize) -> bool {
    let sum = checksum::sum_native(addresses_to_end);
    let rest = u16::from_be(ip_proto::UDP as u16) as u64 + u16::from_be(udp_len as u16) as u64;
    checksum::folds_to_ones(sum + rest)
}

/// The EtherType of a frame to the interface's own MAC, as it lies in the
/// frame (compare it with [`wire_type`]): the frames the fast path looks
/// into, on an interface without a VLAN (its caller tests that once per
/// burst).
#[inline(always)]
pub(super) fn to_us<B: PacketBuf>(ifc: &Interface, m: &B) -> Option<u16> {
    let h = m.data().get(..ethernet::HEADER_LEN)?;
    let mac = &ifc.mac.0;
    let to_us = u32::from_ne_bytes([h[0], h[1], h[2], h[3]]) == u32::from_ne_bytes([mac[0], mac[1], mac[2], mac[3]])
        && u16::from_ne_bytes([h[4], h[5]]) == u16::from_ne_bytes([mac[4], mac[5]]);
    to_us.then(|| u16::from_ne_bytes([h[12], h[13]]))
}

/// An EtherType as [`to_us`] reads it from a frame (no byte swap per frame).
pub(super) const fn wire_type(ethertype: u16) -> u16 {
    u16::from_ne_bytes(ethertype.to_be_bytes())
}

const WIRE_IPV4: u16 = wire_type(ethernet::ethertype::IPV4);
const WIRE_IPV6: u16 = wire_type(ethernet::ethertype::IPV6);

/// A datagram the fast path takes, before its look-up: its addresses as
/// the socket table keys them (IPv4 mapped into IPv6), its ports, and the
/// padding after the IP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Fast {
    pub src: u128,
    pub src_port: u16,
    pub dst: u128,
    pub dst_port: u16,
    pub padding: usize,
}

/// An untagged frame's IPv4 datagram as the fast path takes it (its
/// Ethernet header already checked): version 4 with a 20-byte header, not
/// a fragment (DF may be set), UDP to one of the interface's unicast
/// addresses from an address that is not a group or broadcast, its UDP
/// length the IP payload's, both checksums good. None for anything else.
#[inline(always)]
pub(super) fn parse_v4<B: PacketBuf>(ifc: &Interface, m: &B) -> Option<Fast> {
    let d = m.data();
    // The headers as one fixed-size array: no bounds checks below.
    let h: &[u8; FAST_L4 + udp::HEADER_LEN] =
        d.get(..FAST_L4 + udp::HEADER_LEN)?.try_into().expect("sliced to the size");
    let be16 = |i: usize| u16::from_be_bytes([h[i], h[i + 1]]);
    let total = be16(FAST_L3 + 2) as usize;
    let frag = be16(FAST_L3 + 6) & 0x3fff;
    if h[FAST_L3] != 0x45 || frag != 0 || h[FAST_L3 + 9] != ip_proto::UDP {
        return None;
    }
    if total < ipv4::HEADER_LEN + udp::HEADER_LEN || FAST_L3 + total > d.len() {
        return None;
    }
    // A port without receive offloads (the verdicts unknown): one test of
    // its flags for both checksums.
    let offloaded = !m.rx_checksums_unknown();
    let ip_verdict = if offloaded { m.rx_ip_checksum() } else { RxChecksum::Unknown };
    let ip_ok = match ip_verdict {
        RxChecksum::Good => true,
        RxChecksum::Bad => false,
        _ => {
            // In the machine's byte order: the folded sum is all ones
            // either way.
            let w = |i: usize| {
                u32::from_ne_bytes([h[FAST_L3 + i], h[FAST_L3 + i + 1], h[FAST_L3 + i + 2], h[FAST_L3 + i + 3]]) as u64
            };
            checksum::folds_to_ones(w(0) + w(4) + w(8) + w(12) + w(16))
        }
    };
    let ne32 = |i: usize| u32::from_ne_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    let (src, dst) = (ne32(FAST_L3 + 12), ne32(FAST_L3 + 16));
    if !ip_ok || !ifc.is_ipv4_unicast_to_us(src, dst) {
        return None;
    }
    let udp_len = be16(FAST_L4 + 4) as usize;
    if udp_len != total - ipv4::HEADER_LEN {
        return None;
    }
    let udp_verdict = if offloaded { m.rx_l4_checksum() } else { RxChecksum::Unknown };
    let udp_ok = match udp_verdict {
        RxChecksum::Good => true,
        RxChecksum::Bad => false,
        _ if be16(FAST_L4 + 6) == 0 => true,
        _ => udp_sum_ok(&d[FAST_L3 + 12..FAST_L4 + udp_len], udp_len),
    };
    if !udp_ok {
        return None;
    }
    Some(Fast {
        src: 0xffff_0000_0000 | u32::from_be(src) as u128,
        src_port: be16(FAST_L4),
        dst: 0xffff_0000_0000 | u32::from_be(dst) as u128,
        dst_port: be16(FAST_L4 + 2),
        padding: d.len() - FAST_L3 - total,
    })
}

/// An untagged frame's IPv6 datagram as the fast path takes it: no
/// extension header (the next header UDP), to one of the interface's
/// unicast addresses from one that is not a group, the UDP length the
/// payload's, the UDP checksum present and good (IPv6 has no datagram
/// without one). None for anything else.
#[inline(always)]
pub(super) fn parse_v6<B: PacketBuf>(ifc: &Interface, m: &B) -> Option<Fast> {
    let d = m.data();
    let h: &[u8; FAST6_L4 + udp::HEADER_LEN] =
        d.get(..FAST6_L4 + udp::HEADER_LEN)?.try_into().expect("sliced to the size");
    let be16 = |i: usize| u16::from_be_bytes([h[i], h[i + 1]]);
    let addr = |i: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&h[i..i + 16]).expect("16 bytes"));
    let payload_len = be16(FAST_L3 + 4) as usize;
    if h[FAST_L3] >> 4 != 6 || h[FAST_L3 + 6] != ip_proto::UDP || FAST6_L4 + payload_len > d.len() {
        return None;
    }
    let (src, dst) = (addr(FAST_L3 + 8), addr(FAST_L3 + 24));
    if dst.is_multicast() || src.is_multicast() || !ifc.has_ipv6(&dst) {
        return None;
    }
    let udp_len = be16(FAST6_L4 + 4) as usize;
    if udp_len != payload_len || udp_len < udp::HEADER_LEN {
        return None;
    }
    let udp_ok = match m.rx_l4_checksum() {
        RxChecksum::Good => be16(FAST6_L4 + 6) != 0,
        RxChecksum::Bad => false,
        _ if be16(FAST6_L4 + 6) == 0 => false,
        _ => udp_sum_ok(&d[FAST_L3 + 8..FAST6_L4 + udp_len], udp_len),
    };
    if !udp_ok {
        return None;
    }
    Some(Fast {
        src: u128::from(src),
        src_port: be16(FAST6_L4),
        dst: u128::from(dst),
        dst_port: be16(FAST6_L4 + 2),
        padding: d.len() - FAST6_L4 - udp_len,
    })
}

/// The last port a burst's fast path looked up, and what the socket
/// table's shortcut said of it: the datagrams of a burst mostly go to one
/// port, and the table does not change during a burst. Made anew for each
/// burst.
#[derive(Debug, Clone, Copy)]
pub(super) struct PortMemo {
    /// The port and family (`dst_port | v4 << 16`), or `u32::MAX`.
    key: u32,
    /// 1 + the index of the port's sole socket for the family, or 0: the
    /// common answer, tested first.
    socket: u32,
    /// Whether that socket (or the group's sockets) is IPv6.
    mapped: bool,
    /// A spread group's first member's index and how many it has (0: not
    /// one), apart from `route`, tested second.
    first: u32,
    members: u32,
    /// The answer otherwise.
    route: Route,
}

impl PortMemo {
    /// A memo that remembers nothing yet.
    pub(super) fn new() -> PortMemo {
        PortMemo { key: u32::MAX, socket: 0, mapped: false, first: 0, members: 0, route: Route::Walk }
    }

    /// What the table says of port and family `key`: out of line, as it
    /// runs once per burst and port.
    #[inline(never)]
    fn of<S>(key: u32, snapshot: &TableSnapshot<S>) -> PortMemo {
        let route = Route::of(snapshot.shortcut(key as u16, key >> 16 != 0));
        let memo = PortMemo { key, route, ..PortMemo::new() };
        match route {
            Route::Found(Some((index, mapped))) => PortMemo { socket: index + 1, mapped, ..memo },
            Route::Group(g) => match snapshot.spread(g) {
                Some((first, members, mapped)) => {
                    PortMemo { mapped, first, members, route: Route::Spread(first, members), ..memo }
                }
                None => memo,
            },
            _ => memo,
        }
    }
}

/// [`Shortcut`] without its borrow: a binding by index, with whether it
/// is an IPv6 socket's.
#[derive(Debug, Clone, Copy)]
enum Route {
    Found(Option<(u32, bool)>),
    /// A group no member of which names an incoming lcore: its first
    /// member's index and how many it has, so that a pick is the hash
    /// scaled onto them, the group not looked at again.
    Spread(u32, u32),
    Group(u32),
    LcoreGroup(u32),
    Walk,
}

impl Route {
    #[inline(always)]
    fn of<S>(shortcut: Shortcut<'_, S>) -> Route {
        match shortcut {
            Shortcut::Found(found) => Route::Found(found.map(|(index, b)| (index, b.family == Family::V6))),
            Shortcut::Group(g) => Route::Group(g),
            Shortcut::LcoreGroup(g) => Route::LcoreGroup(g),
            Shortcut::Walk => Route::Walk,
        }
    }
}

impl Worker<'_> {
    /// The common case without the branches of the others: an untagged
    /// Ethernet frame to the interface's own MAC carrying IPv4 without
    /// options or IPv6 without extension headers, not a fragment, UDP to
    /// one of the interface's unicast addresses with good checksums, its
    /// UDP length the IP payload's, to a bound socket. Such a datagram is
    /// staged for its socket, and counted with the burst (`IpInReceives`
    /// and `IpInDelivers`, or their IPv6 twins, by the caller;
    /// `RxDelivered` and `UdpInDatagrams` or `Udp6InDatagrams` with the
    /// burst's staged datagrams, less what a queue refuses), exactly as the
    /// full path would. Returns whether it was IPv4. Anything else comes
    /// back untouched, for the full path, which counts and answers it
    /// (ICMP port unreachable included): nothing here is counted or
    /// changed before the datagram is known to be the common case.
    #[inline(always)]
    pub(super) fn rx_fast(&mut self, ifc: &Interface, memo: &mut PortMemo, m: Mbuf) -> Result<bool, Mbuf> {
        match to_us(ifc, &m) {
            Some(WIRE_IPV4) => self.rx_fast_v4(ifc, memo, m).map(|()| true),
            Some(WIRE_IPV6) => self.rx_fast_v6(ifc, memo, m).map(|()| false),
            _ => Err(m),
        }
    }

    /// [`rx_fast`](Self::rx_fast) for IPv4, the frame's Ethernet header
    /// already checked.
    #[inline(always)]
    fn rx_fast_v4(&mut self, ifc: &Interface, memo: &mut PortMemo, m: Mbuf) -> Result<(), Mbuf> {
        let iface = ifc.index;
        let Some(f) = parse_v4(ifc, &m) else { return Err(m) };
        let Some((index, mapped)) = self.fast_lookup(memo, &m, iface, true, (f.src, f.src_port), (f.dst, f.dst_port))
        else {
            return Err(m);
        };
        self.stage_fast(iface, true, m, f.padding, FAST_L4, index, mapped)
    }

    /// [`rx_fast`](Self::rx_fast) for IPv6, the frame's Ethernet header
    /// already checked.
    #[inline(always)]
    fn rx_fast_v6(&mut self, ifc: &Interface, memo: &mut PortMemo, m: Mbuf) -> Result<(), Mbuf> {
        let iface = ifc.index;
        let Some(f) = parse_v6(ifc, &m) else { return Err(m) };
        // An IPv6 datagram is never mapped: its socket is IPv6.
        let Some((index, _)) = self.fast_lookup(memo, &m, iface, false, (f.src, f.src_port), (f.dst, f.dst_port))
        else {
            return Err(m);
        };
        self.stage_fast(iface, false, m, f.padding, FAST6_L4, index, false)
    }

    /// The fast paths' look-up: the port's shortcut decision (the burst's
    /// memo of it, for a datagram to the port and family the last one
    /// looked up went to), the group's hash from the port's RSS hash where
    /// there is one, the walk otherwise. Returns the binding's index and
    /// whether the datagram reaches an IPv6 socket (IPv4-mapped, for an
    /// IPv4 one).
    #[inline(always)]
    fn fast_lookup(
        &self,
        memo: &mut PortMemo,
        m: &Mbuf,
        iface: u16,
        v4: bool,
        (src, src_port): (u128, u16),
        (dst, dst_port): (u128, u16),
    ) -> Option<(u32, bool)> {
        let key = dst_port as u32 | (v4 as u32) << 16;
        if memo.key != key {
            *memo = PortMemo::of(key, &*self.snapshot);
        }
        if memo.socket != 0 {
            return Some((memo.socket - 1, memo.mapped));
        }
        // A group spread by the port's hash, right after the sole socket:
        // the addresses are not looked at.
        if memo.members != 0
            && let Some(hash) = m.rss_hash()
        {
            return Some((memo.first + reciprocal_scale(hash, memo.members), memo.mapped));
        }
        let found = match memo.route {
            Route::Spread(first, members) => {
                let hash = self.snapshot.flow_hash_of(src, src_port, dst, dst_port);
                return Some((first + reciprocal_scale(hash, members), memo.mapped));
            }
            Route::Found(found) => return found,
            Route::LcoreGroup(g) if let Some(found) = self.snapshot.sole_member(g, self.idx as u32) => Some(found),
            Route::Group(g) | Route::LcoreGroup(g) => {
                let hash = m.rss_hash().unwrap_or_else(|| self.snapshot.flow_hash_of(src, src_port, dst, dst_port));
                self.snapshot.pick(g, hash, self.idx as u32)
            }
            Route::Walk => {
                let key =
                    FlowKey { src, src_port, dst, dst_port, v4, iface, lcore: self.idx as u32, rss_hash: m.rss_hash() };
                self.snapshot.lookup(&key)
            }
        };
        found.map(|(index, b)| (index, b.family == Family::V6))
    }

    /// Stages a fast path's datagram: only the payload stays in the mbuf
    /// (the headers stay in its headroom, where the datagram reads its
    /// addresses from); padding after the IP packet goes.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn stage_fast(
        &mut self,
        iface: u16,
        v4: bool,
        mut m: Mbuf,
        padding: usize,
        l4: usize,
        index: u32,
        mapped: bool,
    ) -> Result<(), Mbuf> {
        if (padding > 0 && m.trim(padding).is_err()) || m.adj(l4 + udp::HEADER_LEN).is_err() {
            return Err(m);
        }
        let d = Datagram::new(m, header_span(FAST_L3, l4), mapped, iface);
        self.stage(index, v4, d);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use spate_dpdk::RxChecksum;

    use super::*;
    use crate::buf::MemBuf;
    use crate::engine::parse::{self, Frame, Record};
    use crate::engine::testing::*;
    use crate::lookup::ip_key;
    use crate::stats::Counter;

    /// What the fast path makes of `m`: whether IPv4, and the datagram.
    fn fast(ifc: &Interface, m: &MemBuf) -> Option<(bool, Fast)> {
        match to_us(ifc, m)? {
            WIRE_IPV4 => parse_v4(ifc, m).map(|f| (true, f)),
            WIRE_IPV6 => parse_v6(ifc, m).map(|f| (false, f)),
            _ => None,
        }
    }

    /// Holds the fast path to the full one on frame `m`: whatever the
    /// fast path takes, the full path delivers to the same addresses and
    /// ports, with the same padding cut off, the same counters counted
    /// (those the fast path's caller counts for it: received and
    /// delivered), the UDP header in the same place. Returns whether the
    /// fast path took it.
    fn agree(m: &MemBuf) -> bool {
        let ifc = interface();
        let Some((v4, f)) = fast(&ifc, m) else { return false };
        let mut t = Record::default();
        let full = parse::frame(&ifc, m.clone(), &mut t);
        let Frame::Udp { m: trimmed, at } = full else {
            panic!("the fast path took what the full path did not: {full:?}")
        };
        let h = parse::udp(&trimmed, &at, 0, &mut t).expect("the fast path took a datagram the UDP step refuses");
        assert!(!at.group);
        assert_eq!((ip_key(&at.src), h.src_port, ip_key(&at.dst), h.dst_port), (f.src, f.src_port, f.dst, f.dst_port));
        assert_eq!(at.l4, if v4 { FAST_L4 } else { FAST6_L4 });
        assert_eq!(m.pkt_len() - trimmed.pkt_len(), f.padding);
        let counted = if v4 {
            [Counter::IpInReceives, Counter::IpInDelivers]
        } else {
            [Counter::Ip6InReceives, Counter::Ip6InDelivers]
        };
        assert_eq!(t.counts, counted);
        true
    }

    #[test]
    fn the_fast_path_takes_the_common_case_as_the_full_path_would() {
        let (s4, d4) = to_us4();
        let (s6, d6) = to_us6();
        let good4 = udp_frame(s4, d4, b"payload");
        let good6 = udp_frame(s6, d6, b"payload");
        let mut df = headers(s4, d4);
        df.dont_frag = true;
        let mut verified = good4.clone();
        verified.rx_checksum = (RxChecksum::Good, RxChecksum::Good);
        let common = [
            good4.clone(),
            good6.clone(),
            edited(&good4, |b| b.resize(60, 0)),
            edited(&good6, |b| b.extend([0; 9])),
            edited(&good4, |b| b[FAST_L4 + 6..FAST_L4 + 8].fill(0)),
            frame_with(&df, b"payload"),
            udp_frame(s4, d4, &[]),
            verified,
        ];
        for (i, m) in common.iter().enumerate() {
            assert!(agree(m), "frame {i}: the fast path left the common case to the full path");
        }
    }

    #[test]
    fn the_fast_path_leaves_everything_else_to_the_full_path() {
        let (s4, d4) = to_us4();
        let (s6, d6) = to_us6();
        let good4 = udp_frame(s4, d4, b"payload");
        let good6 = udp_frame(s6, d6, b"payload");
        let mut port_refused = good4.clone();
        port_refused.rx_checksum.1 = RxChecksum::Bad;
        let peer = SocketAddr::from((PEER4, 5000));
        let uncommon = [
            ("another MAC", edited(&good4, |b| b[0] = 0xff)),
            ("IP options", {
                edited(&good4, |b| {
                    b.splice(FAST_L4..FAST_L4, [1, 1, 1, 1]);
                    b[FAST_L3] = 0x46;
                    let total = u16::from_be_bytes([b[FAST_L3 + 2], b[FAST_L3 + 3]]) + 4;
                    b[FAST_L3 + 2..FAST_L3 + 4].copy_from_slice(&total.to_be_bytes());
                    refill_ipv4_checksum(b, FAST_L3);
                })
            }),
            ("a fragment", {
                edited(&good4, |b| {
                    b[FAST_L3 + 6] |= 0x20;
                    refill_ipv4_checksum(b, FAST_L3);
                })
            }),
            ("a bad IPv4 sum", edited(&good4, |b| b[FAST_L3 + 8] ^= 1)),
            ("a bad UDP sum", edited(&good4, |b| b[FAST_L4 + 8] ^= 1)),
            ("the port's UDP verdict", port_refused),
            ("ICMP", {
                edited(&good4, |b| {
                    b[FAST_L3 + 9] = 1;
                    refill_ipv4_checksum(b, FAST_L3);
                })
            }),
            ("to the subnet's broadcast", udp_frame(peer, (std::net::Ipv4Addr::new(198, 18, 0, 255), 7).into(), b"x")),
            ("to a group", udp_frame(peer, (std::net::Ipv4Addr::new(239, 1, 2, 3), 7).into(), b"x")),
            ("from a broadcast address", udp_frame((std::net::Ipv4Addr::new(198, 18, 0, 255), 1).into(), d4, b"x")),
            ("UDP shorter than IP", edited(&good4, |b| b[FAST_L4 + 5] -= 1)),
            ("a zero IPv6 UDP sum", edited(&good6, |b| b[FAST6_L4 + 6..FAST6_L4 + 8].fill(0))),
            ("an IPv6 extension header", edited(&good6, |b| b[FAST_L3 + 6] = ip_proto::DEST_OPTS)),
            ("another IPv6 address", udp_frame(s6, (std::net::Ipv6Addr::LOCALHOST, 7).into(), b"x")),
        ];
        for (what, m) in uncommon {
            assert!(!agree(&m), "the fast path took {what}");
        }
    }

    #[test]
    fn any_one_byte_changed_in_the_headers_leaves_the_two_paths_agreeing() {
        let (s4, d4) = to_us4();
        let (s6, d6) = to_us6();
        let mut taken = 0;
        for good in [udp_frame(s4, d4, b"0123456789"), udp_frame(s6, d6, b"0123456789")] {
            let l4 = if to_us(&interface(), &good) == Some(WIRE_IPV4) { FAST_L4 } else { FAST6_L4 };
            for at in 0..l4 + udp::HEADER_LEN {
                for flip in [0x01u8, 0x10, 0x80, 0xff] {
                    let m = edited(&good, |b| b[at] ^= flip);
                    taken += agree(&m) as u32;
                    for verdicts in [(RxChecksum::Good, RxChecksum::Good), (RxChecksum::Bad, RxChecksum::Good)] {
                        let mut m = m.clone();
                        m.rx_checksum = verdicts;
                        taken += agree(&m) as u32;
                    }
                }
            }
        }
        // Changes the checksums do not see (a port, with the port's
        // verdict) or that keep the datagram the common case (the TTL,
        // with the sum checked by the port) are taken, and agree.
        assert!(taken > 50, "only {taken} changed frames taken: the test no longer reaches the fast path");
    }
}

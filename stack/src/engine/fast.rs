//! The fast path: the common case (IPv4 or IPv6 UDP to a bound socket,
//! nothing unusual) without the full path's branches, tried first for
//! every frame of a burst without the GRO stage; what it does not take
//! goes back, untouched, to the full path (`rx.rs`), which counts and
//! answers it.

use std::net::{Ipv4Addr, Ipv6Addr};

use spate_dpdk::{Mbuf, RxChecksum};

use super::Worker;
use crate::datagram::{Datagram, header_span};
use crate::iface::Interface;
use crate::lookup::{Family, FlowKey, Shortcut};
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
    checksum::fold(sum + rest) == 0xffff
}

impl Worker<'_> {
    /// The common case without the branches of the others: an untagged
    /// Ethernet frame to the interface's own MAC carrying IPv4 without
    /// options or IPv6 without extension headers, not a fragment, UDP to
    /// one of the interface's unicast addresses with good checksums, its
    /// UDP length the IP payload's, to a bound socket. Such a datagram is
    /// staged for its socket, and counted with the burst (`IpInReceives`
    /// and `IpInDelivers`, or their IPv6 twins, by the caller;
    /// `RxDelivered` and `UdpInDatagrams` when queued), exactly as the
    /// full path would. Returns whether it was IPv4. Anything else comes
    /// back untouched, for the full path, which counts and answers it
    /// (ICMP port unreachable included): nothing here is counted or
    /// changed before the datagram is known to be the common case.
    #[inline(always)]
    pub(super) fn rx_fast(&mut self, iface: &Interface, m: Mbuf) -> Result<bool, Mbuf> {
        let Some(h) = m.data().get(..ethernet::HEADER_LEN) else { return Err(m) };
        let mac = &iface.mac.0;
        let to_us = u32::from_ne_bytes([h[0], h[1], h[2], h[3]])
            == u32::from_ne_bytes([mac[0], mac[1], mac[2], mac[3]])
            && u16::from_ne_bytes([h[4], h[5]]) == u16::from_ne_bytes([mac[4], mac[5]]);
        if iface.vlan.is_some() || !to_us {
            return Err(m);
        }
        match u16::from_be_bytes([h[12], h[13]]) {
            ethernet::ethertype::IPV4 => self.rx_fast_v4(iface, m).map(|()| true),
            ethernet::ethertype::IPV6 => self.rx_fast_v6(iface, m).map(|()| false),
            _ => Err(m),
        }
    }

    /// [`rx_fast`](Self::rx_fast) for IPv4, the frame's Ethernet header
    /// already checked.
    #[inline(always)]
    fn rx_fast_v4(&mut self, iface: &Interface, m: Mbuf) -> Result<(), Mbuf> {
        let ifx = iface.index;
        let d = m.data();
        // The headers as one fixed-size array: no bounds checks below.
        let Some(h) = d.get(..FAST_L4 + udp::HEADER_LEN) else { return Err(m) };
        let h: &[u8; FAST_L4 + udp::HEADER_LEN] = h.try_into().expect("sliced to the size");
        let be16 = |i: usize| u16::from_be_bytes([h[i], h[i + 1]]);
        let be32 = |i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        // Version 4 with a 20-byte header; no fragment
        // (DF may be set); UDP.
        let total = be16(FAST_L3 + 2) as usize;
        let frag = be16(FAST_L3 + 6) & 0x3fff;
        if h[FAST_L3] != 0x45 || frag != 0 || h[FAST_L3 + 9] != ip_proto::UDP {
            return Err(m);
        }
        if total < ipv4::HEADER_LEN + udp::HEADER_LEN || FAST_L3 + total > d.len() {
            return Err(m);
        }
        let ip_ok = match m.rx_ip_checksum() {
            RxChecksum::Good => true,
            RxChecksum::Bad => false,
            _ => {
                // In the machine's byte order: the folded sum is all ones
                // either way.
                let w = |i: usize| {
                    u32::from_ne_bytes([h[FAST_L3 + i], h[FAST_L3 + i + 1], h[FAST_L3 + i + 2], h[FAST_L3 + i + 3]])
                        as u64
                };
                checksum::fold(w(0) + w(4) + w(8) + w(12) + w(16)) == 0xffff
            }
        };
        let (src, dst) = (Ipv4Addr::from(be32(FAST_L3 + 12)), Ipv4Addr::from(be32(FAST_L3 + 16)));
        if !ip_ok || !iface.has_ipv4(dst) || src.is_multicast() || iface.is_ipv4_broadcast(src) {
            return Err(m);
        }
        let udp_len = be16(FAST_L4 + 4) as usize;
        if udp_len != total - ipv4::HEADER_LEN {
            return Err(m);
        }
        let udp_ok = match m.rx_l4_checksum() {
            RxChecksum::Good => true,
            RxChecksum::Bad => false,
            _ if be16(FAST_L4 + 6) == 0 => true,
            _ => udp_sum_ok(&d[FAST_L3 + 12..FAST_L4 + udp_len], udp_len),
        };
        if !udp_ok {
            return Err(m);
        }
        let padding = d.len() - FAST_L3 - total;
        let dst_port = be16(FAST_L4 + 2);
        let (src, dst) = (0xffff_0000_0000 | u32::from(src) as u128, 0xffff_0000_0000 | u32::from(dst) as u128);
        let Some((index, mapped)) = self.fast_lookup(&m, ifx, true, (src, be16(FAST_L4)), (dst, dst_port)) else {
            return Err(m);
        };
        self.stage_fast(ifx, true, m, padding, FAST_L4, index, mapped)
    }

    /// [`rx_fast`](Self::rx_fast) for IPv6: no extension header (the next
    /// header UDP), to one of the interface's unicast addresses, the UDP
    /// checksum present and good (IPv6 has no datagram without one).
    #[inline(always)]
    fn rx_fast_v6(&mut self, iface: &Interface, m: Mbuf) -> Result<(), Mbuf> {
        let ifx = iface.index;
        let d = m.data();
        let Some(h) = d.get(..FAST6_L4 + udp::HEADER_LEN) else { return Err(m) };
        let h: &[u8; FAST6_L4 + udp::HEADER_LEN] = h.try_into().expect("sliced to the size");
        let be16 = |i: usize| u16::from_be_bytes([h[i], h[i + 1]]);
        let addr = |i: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&h[i..i + 16]).expect("16 bytes"));
        let payload_len = be16(FAST_L3 + 4) as usize;
        if h[FAST_L3] >> 4 != 6 || h[FAST_L3 + 6] != ip_proto::UDP || FAST6_L4 + payload_len > d.len() {
            return Err(m);
        }
        let (src, dst) = (addr(FAST_L3 + 8), addr(FAST_L3 + 24));
        if dst.is_multicast() || src.is_multicast() || !iface.has_ipv6(&dst) {
            return Err(m);
        }
        let udp_len = be16(FAST6_L4 + 4) as usize;
        if udp_len != payload_len || udp_len < udp::HEADER_LEN {
            return Err(m);
        }
        let udp_ok = match m.rx_l4_checksum() {
            RxChecksum::Good => be16(FAST6_L4 + 6) != 0,
            RxChecksum::Bad => false,
            _ if be16(FAST6_L4 + 6) == 0 => false,
            _ => udp_sum_ok(&d[FAST_L3 + 8..FAST6_L4 + udp_len], udp_len),
        };
        if !udp_ok {
            return Err(m);
        }
        let padding = d.len() - FAST6_L4 - udp_len;
        let dst_port = be16(FAST6_L4 + 2);
        let (src, dst) = (u128::from(src), u128::from(dst));
        // An IPv6 datagram is never mapped: its socket is IPv6.
        let Some((index, _)) = self.fast_lookup(&m, ifx, false, (src, be16(FAST6_L4)), (dst, dst_port)) else {
            return Err(m);
        };
        self.stage_fast(ifx, false, m, padding, FAST6_L4, index, false)
    }

    /// The fast paths' look-up: the port's shortcut decision, the group's
    /// hash from the port's RSS hash where there is one, the walk
    /// otherwise. Returns the binding's index and whether the datagram
    /// reaches an IPv6 socket (IPv4-mapped, for an IPv4 one).
    #[inline(always)]
    fn fast_lookup(
        &self,
        m: &Mbuf,
        ifx: u16,
        v4: bool,
        (src, src_port): (u128, u16),
        (dst, dst_port): (u128, u16),
    ) -> Option<(u32, bool)> {
        let found = match self.snapshot.shortcut(dst_port, v4) {
            Shortcut::Found(found) => found,
            Shortcut::LcoreGroup(g) if let Some(found) = self.snapshot.sole_member(g, self.idx as u32) => Some(found),
            Shortcut::Group(g) | Shortcut::LcoreGroup(g) => {
                let hash = m.rss_hash().unwrap_or_else(|| self.snapshot.flow_hash_of(src, src_port, dst, dst_port));
                self.snapshot.pick(g, hash, self.idx as u32)
            }
            Shortcut::Walk => {
                let key = FlowKey {
                    src,
                    src_port,
                    dst,
                    dst_port,
                    v4,
                    iface: ifx,
                    lcore: self.idx as u32,
                    rss_hash: m.rss_hash(),
                };
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
        ifx: u16,
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
        let d = Datagram::new(m, header_span(FAST_L3, l4), mapped, ifx);
        self.stage(index, ifx, v4, d);
        Ok(())
    }
}

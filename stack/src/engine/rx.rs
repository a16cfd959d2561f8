//! Receive: every frame ends in exactly one `Rx` counter.

use std::net::IpAddr;

use spate_dpdk::{Mbuf, RxChecksum};

use super::Worker;
use super::gro::Flow;
use super::offsets::{Handed, UdpInFrame};
use crate::datagram::{Datagram, header_span};
use crate::frag::reassembly;
use crate::iface::Interface;
use crate::lookup::{Family, FlowKey, ip_key};
use crate::neigh;
use crate::shared::Net;
use crate::stats::Counter;
use crate::wire::{WireError, arp, checksum, ethernet, ip_proto, ipv4, ipv6, udp};

/// Counters of one IP family's UDP.
struct UdpCounters {
    no_ports: Counter,
    in_errors: Counter,
    csum_errors: Counter,
    ignored_multi: Counter,
}

const UDP4: UdpCounters = UdpCounters {
    no_ports: Counter::UdpNoPorts,
    in_errors: Counter::UdpInErrors,
    csum_errors: Counter::UdpInCsumErrors,
    ignored_multi: Counter::UdpIgnoredMulti,
};

const UDP6: UdpCounters = UdpCounters {
    no_ports: Counter::Udp6NoPorts,
    in_errors: Counter::Udp6InErrors,
    csum_errors: Counter::Udp6InCsumErrors,
    ignored_multi: Counter::Udp6IgnoredMulti,
};

impl Worker<'_> {
    /// Classifies one frame and hands it on; returns its `Rx` outcome.
    /// `GRO` picks the build of the path with the GRO stage; the burst
    /// loop chooses it once per burst (Linux's static key, as two copies
    /// of the code), so the path without it is what it was before the
    /// stage existed.
    #[inline]
    pub(super) fn rx_frame<const GRO: bool>(&mut self, net: &Net, ifx: u16, m: Mbuf) -> Option<Counter> {
        let iface: &Interface = &net.ifaces[ifx as usize];
        let data = m.data();
        let frame = ethernet::Frame::new_unchecked(data);
        if frame.check_len().is_err() {
            return Some(Counter::RxEthTruncated);
        }
        let dst = frame.dst();
        if !iface.accepts_mac(&dst) {
            return Some(Counter::RxNotForUs);
        }
        if frame.vlan_id() != iface.vlan {
            return Some(Counter::RxVlanMismatch);
        }
        let l2 = frame.header_len();
        let eth_src = frame.src();
        match frame.ethertype() {
            ethernet::ethertype::IPV4 => self.rx_ipv4::<GRO>(iface, m, l2),
            ethernet::ethertype::IPV6 => self.rx_ipv6::<GRO>(iface, m, l2, eth_src),
            ethernet::ethertype::ARP => Some(self.rx_arp(iface, m, l2)),
            _ => Some(Counter::RxUnknownEtherType),
        }
    }

    fn rx_ipv4<const GRO: bool>(&mut self, iface: &Interface, mut m: Mbuf, l2: usize) -> Option<Counter> {
        self.inc(Counter::IpInReceives);
        let data = &m.data()[l2..];
        let ip = ipv4::Packet::new_unchecked(data);
        match ip.check_len() {
            Ok(()) => {}
            Err(WireError::Truncated) => {
                self.inc(Counter::IpInTruncatedPkts);
                return Some(Counter::RxIpv4Truncated);
            }
            Err(_) => {
                self.inc(Counter::IpInHdrErrors);
                return Some(Counter::RxIpv4HdrErrors);
            }
        }
        let checksum_ok = match m.rx_ip_checksum() {
            RxChecksum::Good => true,
            RxChecksum::Bad => false,
            _ => ip.verify_checksum(),
        };
        if ip.version() != 4 || !checksum_ok {
            self.inc(Counter::IpInHdrErrors);
            return Some(Counter::RxIpv4HdrErrors);
        }
        let (src, dst, protocol) = (ip.src(), ip.dst(), ip.protocol());
        let (ihl, total, fragment) = (ip.header_len(), ip.total_len() as usize, ip.is_fragment());
        let (ident, frag_offset, more_frags) = (ip.ident(), ip.frag_offset(), ip.more_frags());
        let padding = data.len() - total;
        // A group the interface is in (the sockets' own filters apply at
        // delivery), or every host's.
        let query = protocol == ip_proto::IGMP;
        let group = dst.is_multicast() && self.joined(iface.index, dst.into(), src.into(), query);
        let broadcast = group || (!iface.has_ipv4(dst) && iface.is_ipv4_broadcast(dst));
        if !broadcast && !iface.has_ipv4(dst) {
            self.inc(Counter::IpInAddrErrors);
            return Some(Counter::RxIpv4NotForUs);
        }
        if src.is_broadcast() || src.is_multicast() || iface.is_ipv4_broadcast(src) {
            self.inc(Counter::IpInHdrErrors);
            return Some(Counter::RxIpv4HdrErrors);
        }
        if padding > 0 && m.trim(padding).is_err() {
            self.inc(Counter::IpInHdrErrors);
            return Some(Counter::RxIpv4HdrErrors);
        }
        if fragment {
            self.inc(Counter::IpReasmReqds);
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
            return self.reassemble(iface, key, f, src.into(), dst.into(), broadcast);
        }
        let l4 = l2 + ihl;
        match protocol {
            ip_proto::UDP => {
                self.inc(Counter::IpInDelivers);
                let at = UdpInFrame { l3: l2, l4, end: l2 + total, src: src.into(), dst: dst.into(), group: broadcast };
                self.rx_udp::<GRO>(iface, m, at)
            }
            ip_proto::ICMP => {
                self.inc(Counter::IpInDelivers);
                Some(self.rx_icmpv4(iface, m, l4, src, dst, broadcast))
            }
            ip_proto::IGMP => {
                self.inc(Counter::IpInDelivers);
                self.rx_igmp(iface.index, &m.data()[l4..l2 + total]);
                Some(Counter::RxIgmp)
            }
            _ => {
                self.inc(Counter::IpInUnknownProtos);
                if !broadcast {
                    self.icmp_error_v4(m, l2, src, dst, crate::wire::icmpv4::unreachable::PROTOCOL, 0);
                }
                Some(Counter::RxIpv4UnknownProto)
            }
        }
    }

    fn rx_ipv6<const GRO: bool>(
        &mut self,
        iface: &Interface,
        mut m: Mbuf,
        l2: usize,
        eth_src: crate::wire::MacAddr,
    ) -> Option<Counter> {
        self.inc(Counter::Ip6InReceives);
        let data = &m.data()[l2..];
        let ip = ipv6::Packet::new_unchecked(data);
        if ip.check_len().is_err() {
            self.inc(Counter::Ip6InTruncatedPkts);
            return Some(Counter::RxIpv6Truncated);
        }
        if ip.version() != 6 {
            self.inc(Counter::Ip6InHdrErrors);
            return Some(Counter::RxIpv6HdrErrors);
        }
        let (src, dst, hop_limit) = (ip.src(), ip.dst(), ip.hop_limit());
        let len = ipv6::HEADER_LEN + ip.payload_len() as usize;
        // MLD comes behind a hop-by-hop Router Alert; UDP to a group does not.
        let query = ip.next_header() == ip_proto::HOP_BY_HOP;
        let joined = dst.is_multicast() && self.joined(iface.index, dst.into(), src.into(), query);
        if !joined && !iface.accepts_ipv6(&dst) {
            self.inc(Counter::Ip6InAddrErrors);
            return Some(Counter::RxIpv6NotForUs);
        }
        if src.is_multicast() {
            self.inc(Counter::Ip6InHdrErrors);
            return Some(Counter::RxIpv6HdrErrors);
        }
        let ext = match ipv6::walk_extensions(ip.next_header(), ip.payload()) {
            Ok(e) => e,
            Err(_) => {
                self.inc(Counter::Ip6InHdrErrors);
                return Some(Counter::RxIpv6ExtErrors);
            }
        };
        let padding = data.len() - len;
        if padding > 0 && m.trim(padding).is_err() {
            self.inc(Counter::Ip6InHdrErrors);
            return Some(Counter::RxIpv6HdrErrors);
        }
        if let Some(frag) = ext.fragment {
            self.inc(Counter::Ip6ReasmReqds);
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
            return self.reassemble(iface, key, f, src.into(), dst.into(), dst.is_multicast());
        }
        let l4 = l2 + ipv6::HEADER_LEN + ext.offset;
        match ext.protocol {
            ip_proto::UDP => {
                self.inc(Counter::Ip6InDelivers);
                let at = UdpInFrame {
                    l3: l2,
                    l4,
                    end: l2 + len,
                    src: src.into(),
                    dst: dst.into(),
                    group: dst.is_multicast(),
                };
                self.rx_udp::<GRO>(iface, m, at)
            }
            ip_proto::ICMPV6 => {
                self.inc(Counter::Ip6InDelivers);
                Some(self.rx_icmpv6(iface, m, l4, src, dst, hop_limit, eth_src))
            }
            proto => {
                self.inc(Counter::Ip6InUnknownProtos);
                if proto != ip_proto::NO_NEXT && ext.count == 0 && !dst.is_multicast() {
                    self.icmp_param_problem_v6(m, l2, src, dst, 6);
                }
                Some(Counter::RxIpv6UnknownProto)
            }
        }
    }

    /// UDP: validate, look the socket up, queue the datagram.
    #[inline]
    pub(super) fn rx_udp<const GRO: bool>(&mut self, iface: &Interface, m: Mbuf, at: UdpInFrame) -> Option<Counter> {
        let c = if at.src.is_ipv4() { &UDP4 } else { &UDP6 };
        let data = &m.data()[at.l4..at.end];
        let p = udp::Packet::new_unchecked(data);
        if p.check_len().is_err() {
            self.inc(c.in_errors);
            return Some(Counter::RxUdpErrors);
        }
        let checksum_ok = match m.rx_l4_checksum() {
            RxChecksum::Good => p.checksum() != 0 || at.src.is_ipv4(),
            RxChecksum::Bad => false,
            _ => p.verify_checksum(&at.src, &at.dst),
        };
        if !checksum_ok {
            self.inc(c.csum_errors);
            self.inc(c.in_errors);
            return Some(Counter::RxUdpCsumErrors);
        }
        let (src_port, dst_port, payload) = (p.src_port(), p.dst_port(), p.len() as usize - udp::HEADER_LEN);
        self.rx_udp_deliver::<GRO>(iface, m, at, src_port, dst_port, payload)
    }

    /// A UDP datagram whose length and checksum are good: looked up, then
    /// queued to its socket, or answered with port unreachable.
    #[inline(always)]
    fn rx_udp_deliver<const GRO: bool>(
        &mut self,
        iface: &Interface,
        mut m: Mbuf,
        at: UdpInFrame,
        src_port: u16,
        dst_port: u16,
        payload: usize,
    ) -> Option<Counter> {
        let c = if at.src.is_ipv4() { &UDP4 } else { &UDP6 };
        let key = FlowKey {
            src: ip_key(&at.src),
            src_port,
            dst: ip_key(&at.dst),
            dst_port,
            v4: at.src.is_ipv4(),
            iface: iface.index,
            lcore: self.idx as u32,
            rss_hash: m.rss_hash(),
        };
        if at.group {
            // Every socket that matches gets it.
            return match self.deliver_group(iface, m, &at, &key, payload) {
                Ok(()) => None,
                Err(_unwanted) => {
                    self.inc(c.ignored_multi);
                    Some(Counter::RxIgnoredMulti)
                }
            };
        }
        if let Some((index, b)) = self.snapshot.lookup(&key) {
            let mapped = b.family == Family::V6 && at.src.is_ipv4();
            if GRO {
                // The GRO stage, out of line: its lookup was this one.
                let (tunnel, coalesce) = (b.sock.tunnel, b.sock.gro.load(std::sync::atomic::Ordering::Relaxed));
                let ip = Flow::ip_word(m.data().get(at.l3..).unwrap_or(&[]), at.src.is_ipv4());
                let flow = Flow { src: at.src, src_port: key.src_port, dst: at.dst, dst_port: key.dst_port, ip };
                return self.gro_stage_udp(iface.index, m, at, index, mapped, tunnel, coalesce, flow, payload);
            }
            // Leave only the payload in the mbuf: the headers stay in the
            // headroom, where the datagram reads its addresses from.
            let after = m.pkt_len() - (at.l4 + udp::HEADER_LEN + payload);
            if m.adj(at.l4 + udp::HEADER_LEN).is_err() || (after > 0 && m.trim(after).is_err()) {
                self.inc(c.in_errors);
                return Some(Counter::RxUdpErrors);
            }
            let d = Datagram::new(m, header_span(at.l3, at.l4), mapped, iface.index);
            // Staged: for the callback, or queued with one charge and one
            // lock per socket.
            self.stage(index, iface.index, at.src.is_ipv4(), d);
            return None;
        }
        self.inc(c.no_ports);
        match (at.src, at.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                self.icmp_error_v4(m, at.l3, s, d, crate::wire::icmpv4::unreachable::PORT, 0)
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => self.icmp_error_v6(
                m,
                at.l3,
                s,
                d,
                crate::wire::icmpv6::msg_type::DST_UNREACHABLE,
                crate::wire::icmpv6::unreachable::PORT,
                0,
            ),
            _ => {}
        }
        Some(Counter::RxNoPort)
    }

    fn rx_arp(&mut self, iface: &Interface, mut m: Mbuf, l2: usize) -> Counter {
        let parsed = arp::Packet::new_checked(&m.data()[l2..]).and_then(|p| arp::Repr::parse(&p));
        let Ok(repr) = parsed else {
            return Counter::RxArpErrors;
        };
        let h = neigh::arp::handle(&self.shared.neigh, self.now, iface, &repr);
        if h.request_for_us {
            self.inc(Counter::ArpInRequests);
        } else if repr.operation == arp::Operation::Reply {
            self.inc(Counter::ArpInReplies);
        }
        if let Some((mac, pending)) = h.released {
            self.inc(Counter::NeighResolved);
            for pkt in pending {
                self.send_ip(pkt, mac);
            }
        }
        if let Some(reply) = h.reply {
            // The request's mbuf carries the reply.
            let excess = m.pkt_len() - l2 - arp::PACKET_LEN;
            if m.adj(l2).is_ok() && m.trim(excess).is_ok() {
                reply.emit(m.data_mut());
                self.inc(Counter::ArpOutReplies);
                self.send_frame(iface.index, m, reply.target_mac, ethernet::ethertype::ARP);
            }
        }
        Counter::RxArp
    }
}

impl Worker<'_> {
    /// A fragment: held, or the datagram it completes handed on as if it
    /// had arrived whole (only UDP is reassembled).
    fn reassemble(
        &mut self,
        iface: &Interface,
        key: reassembly::Key,
        f: reassembly::Fragment,
        src: IpAddr,
        dst: IpAddr,
        group: bool,
    ) -> Option<Counter> {
        let v6 = key.v6;
        let outcome = self.reasm.insert(key, f, self.now);
        self.count_reasm_drops();
        match outcome {
            reassembly::Outcome::Held => Some(Counter::RxReasmHeld),
            reassembly::Outcome::Duplicate => Some(Counter::RxReasmDuplicates),
            reassembly::Outcome::Failed => Some(Counter::RxReasmDropped),
            reassembly::Outcome::Complete { mbuf, l3, data_at, len } => {
                self.inc(if v6 { Counter::Ip6ReasmOKs } else { Counter::IpReasmOKs });
                if key.protocol != ip_proto::UDP {
                    self.inc(if v6 { Counter::Ip6InUnknownProtos } else { Counter::IpInUnknownProtos });
                    return Some(Counter::RxReasmDropped);
                }
                self.inc(if v6 { Counter::Ip6InDelivers } else { Counter::IpInDelivers });
                // Another lcore may own the datagram's flow (software RSS).
                let mbuf = self.hand_datagram(iface, mbuf, l3, data_at, len)?;
                let at = UdpInFrame { l3, l4: data_at, end: data_at + len as usize, src, dst, group };
                self.rx_udp_reassembled(iface, mbuf, at)
            }
        }
    }

    /// A reassembled datagram another lcore handed over (its offsets in
    /// the hash field, as [`Worker::hand_datagram`] packed them: [`Handed`]).
    pub(super) fn rx_handed_datagram(&mut self, net: &Net, mut m: Mbuf) -> Option<Counter> {
        // The offsets, not a flow hash: taken out, so that a reuseport
        // group does not pick a member by them (the length in them would
        // spread one flow over the members).
        let Handed { l3, l4, len } = Handed::decode(m.take_rss_hash().unwrap_or(0));
        let len = len as usize;
        let iface = &net.ifaces[self.shared.iface_of_port(m.port()) as usize];
        let ip = m.data().get(l3..l4).unwrap_or(&[]);
        let (src, dst): (IpAddr, IpAddr) = match ip.first().map(|v| v >> 4) {
            Some(4) if ip.len() >= ipv4::HEADER_LEN => {
                let p = ipv4::Packet::new_unchecked(ip);
                (p.src().into(), p.dst().into())
            }
            Some(6) if ip.len() >= ipv6::HEADER_LEN => {
                let p = ipv6::Packet::new_unchecked(ip);
                (p.src().into(), p.dst().into())
            }
            _ => return Some(Counter::RxUdpErrors),
        };
        let group = match dst {
            IpAddr::V4(d) => d.is_multicast() || (!iface.has_ipv4(d) && iface.is_ipv4_broadcast(d)),
            IpAddr::V6(d) => d.is_multicast(),
        };
        let at = UdpInFrame { l3, l4, end: l4 + len, src, dst, group };
        self.rx_udp_reassembled(iface, m, at)
    }

    /// A reassembled UDP datagram (an mbuf chain, the UDP header in the
    /// first segment): its length and checksum checked over the segments,
    /// then delivered as any other.
    fn rx_udp_reassembled(&mut self, iface: &Interface, m: Mbuf, at: UdpInFrame) -> Option<Counter> {
        let c = if at.src.is_ipv4() { &UDP4 } else { &UDP6 };
        let Some(hdr) = m.data().get(at.l4..at.l4 + udp::HEADER_LEN) else {
            self.inc(c.in_errors);
            return Some(Counter::RxUdpErrors);
        };
        // The header alone (the datagram runs on in the next segments).
        let hdr = udp::Packet::new_unchecked(hdr);
        let (src_port, dst_port) = (hdr.src_port(), hdr.dst_port());
        let (udp_len, field) = (hdr.len() as usize, hdr.checksum());
        if udp_len != at.end - at.l4 || udp_len < udp::HEADER_LEN {
            self.inc(c.in_errors);
            return Some(Counter::RxUdpErrors);
        }
        let ok = if field == 0 {
            at.src.is_ipv4()
        } else {
            let pseudo = udp::pseudo_header(&at.src, &at.dst, udp_len as u16);
            let mut segments = m.segment_data();
            let first = segments.next().map(|s| &s[at.l4..]).unwrap_or(&[]);
            // Every fragment but the last carries a multiple of 8 bytes, so
            // each segment starts on an even offset of the datagram.
            let sum = segments.fold(checksum::sum(first), |acc, s| acc + checksum::sum(s));
            checksum::fold(pseudo + sum) == 0xffff
        };
        if !ok {
            self.inc(c.csum_errors);
            self.inc(c.in_errors);
            return Some(Counter::RxUdpCsumErrors);
        }
        // Reassembled datagrams do not coalesce or enter tunnels: one to a
        // tunnel endpoint would wait in its queue, which nobody reads.
        let v4 = at.src.is_ipv4();
        if self
            .shared
            .links
            .iter()
            .any(|i| i.tunnel.is_some_and(|t| t.local_port == dst_port && t.remote.is_ipv4() == v4))
        {
            return Some(Counter::RxVxlanFragmented);
        }
        self.rx_udp_deliver::<false>(iface, m, at, src_port, dst_port, udp_len - udp::HEADER_LEN)
    }
}

//! ICMP and ICMPv6 on a polling lcore: echo answered in the request's own
//! mbuf, errors noted for connected sockets, neighbour discovery handed to
//! `neigh::nd`, and the errors spate sends (port and protocol unreachable,
//! parameter problem), rate-limited and never about errors, broadcasts,
//! multicasts or non-first fragments (RFC 1122 3.2.2, RFC 4443 2.4).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::Ordering;

use spate_dpdk::Mbuf;

use super::Worker;
use crate::iface::Interface;
use crate::lookup::FlowKey;
use crate::neigh::nd;
use crate::shared::TxPacket;
use crate::stats::Counter;
use crate::wire::{checksum, get_u16, icmpv4, icmpv6, ip_proto, ipv4, ipv6, set_u16};

/// Most bytes of an ICMPv4 error (RFC 1812: 576).
const ICMP4_ERROR_MAX: usize = 576;
/// Most bytes of an ICMPv6 error (the IPv6 minimum MTU).
const ICMP6_ERROR_MAX: usize = 1280;

enum Icmp6Action {
    Echo,
    Nd,
    Unreachable(Option<SocketAddr>, Option<SocketAddr>),
    None,
}

impl Worker<'_> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rx_icmpv4(
        &mut self,
        ifc: &Interface,
        m: Mbuf,
        l4: usize,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        group: bool,
    ) -> Counter {
        let data = &m.data()[l4..];
        let p = icmpv4::Packet::new_unchecked(data);
        if p.check_len().is_err() {
            self.inc(Counter::IcmpInErrors);
            return Counter::RxIcmpErrors;
        }
        if !p.verify_checksum() {
            self.inc(Counter::IcmpInCsumErrors);
            self.inc(Counter::IcmpInErrors);
            return Counter::RxIcmpErrors;
        }
        self.inc(Counter::IcmpInMsgs);
        match (p.msg_type(), p.code()) {
            (icmpv4::msg_type::ECHO_REQUEST, 0) => {
                self.inc(Counter::IcmpInEchos);
                // Like Linux's icmp_echo_ignore_broadcasts = 1.
                if !group {
                    self.echo_reply_v4(m, l4, src, dst);
                }
            }
            (icmpv4::msg_type::ECHO_REPLY, _) => self.inc(Counter::IcmpInEchoReps),
            (icmpv4::msg_type::DST_UNREACHABLE, code) => {
                self.inc(Counter::IcmpInDestUnreachs);
                if code == icmpv4::unreachable::PORT
                    && let Some((local, peer)) = quoted_udp_v4(p.data())
                {
                    self.socket_error(ifc, local, peer, libc::ECONNREFUSED);
                }
                if code == icmpv4::unreachable::FRAG_NEEDED {
                    // The next-hop MTU sits in the header's second word
                    // (RFC 1191); 0 from routers older than it.
                    let mtu = get_u16(data, 6);
                    match quoted_udp_v4(p.data()) {
                        Some((local, peer)) if self.could_have_sent(ifc, local, peer) => {
                            let mtu = if mtu == 0 { crate::frag::pmtu::MIN_V4 } else { mtu };
                            let now = self.shared.pmtu.learn(peer.ip(), mtu);
                            self.inc(Counter::PmtuLearnt);
                            log::debug!("path MTU to {} is {now}", peer.ip());
                        }
                        _ => self.inc(Counter::PmtuIgnored),
                    }
                }
            }
            (icmpv4::msg_type::TIME_EXCEEDED, _) => self.inc(Counter::IcmpInTimeExcds),
            _ => {}
        }
        Counter::RxIcmp
    }

    /// Turns an echo request into its reply in the same mbuf.
    fn echo_reply_v4(&mut self, mut m: Mbuf, l4: usize, req_src: Ipv4Addr, req_dst: Ipv4Addr) {
        if m.adj(l4).is_err() || !m.is_contiguous() {
            return;
        }
        let d = m.data_mut();
        let old = get_u16(d, 0);
        d[0] = icmpv4::msg_type::ECHO_REPLY;
        let new = get_u16(d, 0);
        let c = checksum::update_u16(get_u16(d, 2), old, new);
        set_u16(d, 2, c);
        let ident = self.shared.ip_id.reserve(req_dst, req_src, ip_proto::ICMP, 1);
        let ip = ipv4::Repr {
            src: req_dst,
            dst: req_src,
            protocol: ip_proto::ICMP,
            payload_len: m.pkt_len() as u16,
            ttl: 64,
            tos: 0,
            ident,
            dont_frag: false,
            more_frags: false,
            frag_offset: 0,
        };
        let Ok(h) = m.prepend(ipv4::HEADER_LEN) else {
            return;
        };
        ip.emit(h, false);
        self.inc(Counter::IcmpOutMsgs);
        self.inc(Counter::IcmpOutEchoReps);
        self.route_and_send(m, IpAddr::V4(req_src), IpAddr::V4(req_dst));
    }

    /// Sends an ICMPv4 destination-unreachable about the packet at `l3`.
    pub(super) fn icmp_error_v4(
        &mut self,
        mut m: Mbuf,
        l3: usize,
        orig_src: Ipv4Addr,
        orig_dst: Ipv4Addr,
        code: u8,
        mtu: u16,
    ) {
        if orig_src.is_unspecified() || orig_src.is_broadcast() || orig_src.is_multicast() {
            return;
        }
        if !self.icmp_limit.allow(self.now) {
            self.inc(Counter::IcmpOutRateLimited);
            return;
        }
        let keep = (m.pkt_len() - l3).min(ICMP4_ERROR_MAX - ipv4::HEADER_LEN - icmpv4::HEADER_LEN);
        let cut = m.pkt_len() - l3 - keep;
        if m.adj(l3).is_err() || m.trim(cut).is_err() || !m.is_contiguous() {
            return;
        }
        {
            let Ok(h) = m.prepend(icmpv4::HEADER_LEN) else {
                return;
            };
            h.fill(0);
            h[0] = icmpv4::msg_type::DST_UNREACHABLE;
            h[1] = code;
            set_u16(h, 6, mtu);
        }
        let c = checksum::checksum(m.data());
        set_u16(m.data_mut(), 2, c);
        let ident = self.shared.ip_id.reserve(orig_dst, orig_src, ip_proto::ICMP, 1);
        let ip = ipv4::Repr {
            src: orig_dst,
            dst: orig_src,
            protocol: ip_proto::ICMP,
            payload_len: m.pkt_len() as u16,
            ttl: 64,
            tos: 0xc0,
            ident,
            dont_frag: false,
            more_frags: false,
            frag_offset: 0,
        };
        let Ok(h) = m.prepend(ipv4::HEADER_LEN) else {
            return;
        };
        ip.emit(h, false);
        self.inc(Counter::IcmpOutMsgs);
        self.inc(Counter::IcmpOutDestUnreachs);
        self.route_and_send(m, IpAddr::V4(orig_src), IpAddr::V4(orig_dst));
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn rx_icmpv6(
        &mut self,
        ifc: &Interface,
        m: Mbuf,
        l4: usize,
        src: Ipv6Addr,
        dst: Ipv6Addr,
        hop_limit: u8,
        eth_src: crate::wire::MacAddr,
    ) -> Counter {
        let data = &m.data()[l4..];
        let p = icmpv6::Packet::new_unchecked(data);
        if p.check_len().is_err() {
            self.inc(Counter::Icmp6InErrors);
            return Counter::RxIcmpErrors;
        }
        if !p.verify_checksum(&src, &dst) {
            self.inc(Counter::Icmp6InCsumErrors);
            self.inc(Counter::Icmp6InErrors);
            return Counter::RxIcmpErrors;
        }
        self.inc(Counter::Icmp6InMsgs);
        if p.msg_type() == 130 {
            // RFC 3810 5.1.14: a query from a link-local source only.
            let query = crate::config::is_link_local(&src).then(|| crate::mcast::report::mld_query(data)).flatten();
            if let Some(q) = query {
                self.inc(Counter::Mld6InQueries);
                self.heard_query(ifc.index, true, q);
            }
            return Counter::RxIcmp;
        }
        let nd_type = matches!(
            p.msg_type(),
            icmpv6::msg_type::NEIGHBOR_SOLICIT
                | icmpv6::msg_type::NEIGHBOR_ADVERT
                | icmpv6::msg_type::ROUTER_ADVERT
                | icmpv6::msg_type::ROUTER_SOLICIT
        );
        let repr = match icmpv6::Repr::parse(&icmpv6::Packet::new_unchecked(data), &src, &dst, true) {
            Ok(r) => r,
            Err(_) => {
                self.inc(Counter::Icmp6InErrors);
                return if nd_type { Counter::RxNdErrors } else { Counter::RxIcmpErrors };
            }
        };
        let action = match repr {
            icmpv6::Repr::EchoRequest { .. } => {
                self.inc(Counter::Icmp6InEchos);
                if dst.is_multicast() { Icmp6Action::None } else { Icmp6Action::Echo }
            }
            icmpv6::Repr::EchoReply { .. } => {
                self.inc(Counter::Icmp6InEchoReplies);
                Icmp6Action::None
            }
            icmpv6::Repr::DstUnreachable { code, data } => {
                self.inc(Counter::Icmp6InDestUnreachs);
                match (code, quoted_udp_v6(data)) {
                    (icmpv6::unreachable::PORT, Some((l, r))) => Icmp6Action::Unreachable(Some(l), Some(r)),
                    _ => Icmp6Action::None,
                }
            }
            icmpv6::Repr::PacketTooBig { mtu, data } => {
                self.inc(Counter::Icmp6InPktTooBigs);
                match quoted_udp_v6(data) {
                    Some((local, peer)) if self.could_have_sent(ifc, local, peer) => {
                        let now = self.shared.pmtu.learn(peer.ip(), mtu.min(u16::MAX as u32) as u16);
                        self.inc(Counter::PmtuLearnt);
                        log::debug!("path MTU to {} is {now}", peer.ip());
                    }
                    _ => self.inc(Counter::PmtuIgnored),
                }
                Icmp6Action::None
            }
            icmpv6::Repr::NeighborSolicit { .. } => {
                self.inc(Counter::Icmp6InNeighborSolicits);
                Icmp6Action::Nd
            }
            icmpv6::Repr::NeighborAdvert { .. } => {
                self.inc(Counter::Icmp6InNeighborAdvertisements);
                Icmp6Action::Nd
            }
            icmpv6::Repr::RouterAdvert(_) => {
                self.inc(Counter::Icmp6InRouterAdvertisements);
                Icmp6Action::Nd
            }
            _ => Icmp6Action::None,
        };
        match action {
            Icmp6Action::Nd => {
                let rx = nd::Received { src, dst, hop_limit, eth_src, msg: &repr };
                match nd::handle(&self.shared.neigh, self.now, ifc, &rx) {
                    Err(_) => {
                        self.inc(Counter::Icmp6InErrors);
                        return Counter::RxNdErrors;
                    }
                    Ok(h) => {
                        if let Some((mac, pending)) = h.released {
                            self.inc(Counter::NeighResolved);
                            for pkt in pending {
                                self.send_ip(pkt, mac);
                            }
                        }
                        if let Some(out) = h.reply {
                            self.send_nd(ifc.index, out);
                        }
                    }
                }
                return Counter::RxNd;
            }
            Icmp6Action::Echo => self.echo_reply_v6(m, l4, src, dst),
            Icmp6Action::Unreachable(Some(local), Some(peer)) => {
                self.socket_error(ifc, local, peer, libc::ECONNREFUSED)
            }
            _ => {}
        }
        Counter::RxIcmp
    }

    fn echo_reply_v6(&mut self, mut m: Mbuf, l4: usize, req_src: Ipv6Addr, req_dst: Ipv6Addr) {
        if m.adj(l4).is_err() || !m.is_contiguous() {
            return;
        }
        let d = m.data_mut();
        let old = get_u16(d, 0);
        d[0] = icmpv6::msg_type::ECHO_REPLY;
        let new = get_u16(d, 0);
        // Swapping source and destination leaves the pseudo-header sum as it was.
        let c = checksum::update_u16(get_u16(d, 2), old, new);
        set_u16(d, 2, c);
        let ip = ipv6::Repr {
            src: req_dst,
            dst: req_src,
            next_header: ip_proto::ICMPV6,
            payload_len: m.pkt_len() as u16,
            hop_limit: 64,
        };
        let Ok(h) = m.prepend(ipv6::HEADER_LEN) else {
            return;
        };
        ip.emit(h);
        self.inc(Counter::Icmp6OutMsgs);
        self.inc(Counter::Icmp6OutEchoReplies);
        self.route_and_send(m, IpAddr::V6(req_src), IpAddr::V6(req_dst));
    }

    /// Sends an ICMPv6 error of `msg_type`/`code` about the packet at `l3`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn icmp_error_v6(
        &mut self,
        mut m: Mbuf,
        l3: usize,
        orig_src: Ipv6Addr,
        orig_dst: Ipv6Addr,
        msg_type: u8,
        code: u8,
        param: u32,
    ) {
        if orig_src.is_unspecified() || orig_src.is_multicast() || orig_dst.is_multicast() {
            return;
        }
        if !self.icmp_limit.allow(self.now) {
            self.inc(Counter::Icmp6OutRateLimited);
            return;
        }
        let keep = (m.pkt_len() - l3).min(ICMP6_ERROR_MAX - ipv6::HEADER_LEN - icmpv6::HEADER_LEN);
        let cut = m.pkt_len() - l3 - keep;
        if m.adj(l3).is_err() || m.trim(cut).is_err() || !m.is_contiguous() {
            return;
        }
        {
            let Ok(h) = m.prepend(icmpv6::HEADER_LEN) else {
                return;
            };
            h.fill(0);
            h[0] = msg_type;
            h[1] = code;
            h[4..8].copy_from_slice(&param.to_be_bytes());
        }
        icmpv6::Packet::new_unchecked(m.data_mut()).fill_checksum(&orig_dst, &orig_src);
        let ip = ipv6::Repr {
            src: orig_dst,
            dst: orig_src,
            next_header: ip_proto::ICMPV6,
            payload_len: m.pkt_len() as u16,
            hop_limit: 64,
        };
        let Ok(h) = m.prepend(ipv6::HEADER_LEN) else {
            return;
        };
        ip.emit(h);
        self.inc(Counter::Icmp6OutMsgs);
        if msg_type == icmpv6::msg_type::DST_UNREACHABLE {
            self.inc(Counter::Icmp6OutDestUnreachs);
        }
        self.route_and_send(m, IpAddr::V6(orig_src), IpAddr::V6(orig_dst));
    }

    /// Parameter problem, unrecognised next header, pointing at `pointer`.
    pub(super) fn icmp_param_problem_v6(&mut self, m: Mbuf, l3: usize, src: Ipv6Addr, dst: Ipv6Addr, pointer: u32) {
        self.icmp_error_v6(
            m,
            l3,
            src,
            dst,
            icmpv6::msg_type::PARAM_PROBLEM,
            icmpv6::PARAM_UNRECOGNIZED_NEXT_HEADER,
            pointer,
        );
    }

    /// Routes a packet spate made (the mbuf starts at its IP header).
    pub(super) fn route_and_send(&mut self, mut m: Mbuf, dst: IpAddr, src: IpAddr) {
        m.set_ol_flags(0);
        match self.shared.route_in(&self.net, &dst, Some(&src)) {
            Some(r) => self.transmit(TxPacket { mbuf: m, iface: r.iface, next_hop: r.next_hop, datagram: false }),
            None => self.inc(Counter::TxNoRoute),
        }
    }

    /// Whether the UDP datagram `local` -> `peer` an ICMP error quotes is
    /// one spate could have sent: from an address of `ifc`'s, from a
    /// port a socket holds that would take the answer (as Linux's UDP
    /// error handler looks the socket up before it believes a path MTU).
    /// A forged message quoting anything else changes nothing.
    fn could_have_sent(&self, ifc: &Interface, local: SocketAddr, peer: SocketAddr) -> bool {
        let ours = match local.ip() {
            IpAddr::V4(a) => ifc.has_ipv4(a),
            IpAddr::V6(a) => ifc.has_ipv6(&a),
        };
        ours && self.snapshot.lookup(&FlowKey::new(&peer, &local, ifc.index)).is_some()
    }

    /// Reports `errno` to the connected socket `local` <-> `peer` (the next
    /// receive or send returns it, as Linux reports ICMP errors to connected
    /// UDP sockets).
    fn socket_error(&self, ifc: &Interface, local: SocketAddr, peer: SocketAddr, errno: i32) {
        let key = FlowKey::new(&peer, &local, ifc.index);
        if let Some((_, b)) = self.snapshot.lookup(&key)
            && b.peer.is_some()
        {
            b.sock.error.store(errno, Ordering::Release);
            b.sock.queue.interrupt();
        }
    }
}

/// The (our address, their address) of the UDP datagram quoted in an
/// ICMPv4 error.
fn quoted_udp_v4(data: &[u8]) -> Option<(SocketAddr, SocketAddr)> {
    let ip = ipv4::Packet::new_unchecked(data);
    if data.len() < ipv4::HEADER_LEN || ip.protocol() != ip_proto::UDP {
        return None;
    }
    let l4 = data.get(ip.header_len()..ip.header_len() + 4)?;
    Some((SocketAddr::new(ip.src().into(), get_u16(l4, 0)), SocketAddr::new(ip.dst().into(), get_u16(l4, 2))))
}

/// The same for ICMPv6 (no extension headers in the quote).
fn quoted_udp_v6(data: &[u8]) -> Option<(SocketAddr, SocketAddr)> {
    if data.len() < ipv6::HEADER_LEN + 4 {
        return None;
    }
    let ip = ipv6::Packet::new_unchecked(data);
    if ip.next_header() != ip_proto::UDP {
        return None;
    }
    let l4 = &data[ipv6::HEADER_LEN..];
    Some((SocketAddr::new(ip.src().into(), get_u16(l4, 0)), SocketAddr::new(ip.dst().into(), get_u16(l4, 2))))
}

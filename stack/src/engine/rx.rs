//! Receive: every frame ends in exactly one `Rx` counter.

use std::net::IpAddr;

use spate_dpdk::Mbuf;

use super::gro::Flow;
use super::offsets::{Handed, UdpInFrame};
use super::parse::{self, Frame};
use super::{Step, Worker};
use crate::datagram::{Datagram, header_span};
use crate::frag::reassembly;
use crate::iface::Interface;
use crate::lookup::{Family, FlowKey, ip_key};
use crate::neigh;
use crate::shared::Net;
use crate::stats::Counter;
use crate::wire::{arp, ethernet, ip_proto, ipv4, ipv6, udp};

impl parse::Tally for &Worker<'_> {
    #[inline(always)]
    fn inc(&mut self, c: Counter) {
        Worker::inc(self, c)
    }

    #[inline(always)]
    fn joined(&mut self, iface: u16, dst: IpAddr, src: IpAddr, query: bool) -> bool {
        Worker::joined(self, iface, dst, src, query)
    }
}

impl Worker<'_> {
    /// Classifies one frame and hands it on; returns its `Rx` outcome.
    /// `GRO` picks the build of the path with the GRO stage; the burst
    /// loop chooses it once per burst (Linux's static key, as two copies
    /// of the code), so the path without it is what it was before the
    /// stage existed.
    #[inline]
    pub(super) fn rx_frame<const GRO: bool>(&mut self, net: &Net, iface: u16, m: Mbuf) -> Step {
        let ifc: &Interface = &net.ifaces[iface as usize];
        Step::Done(match parse::frame(ifc, m, &mut &*self) {
            Frame::Done(outcome) => Some(outcome),
            Frame::Udp { m, at } => return self.rx_udp::<GRO>(ifc, m, at),
            Frame::Fragment { key, f, src, dst, group } => self.reassemble(ifc, key, f, src, dst, group),
            Frame::Arp { m, l2 } => Some(self.rx_arp(ifc, m, l2)),
            Frame::Icmpv4 { m, l4, src, dst, broadcast } => Some(self.rx_icmpv4(ifc, m, l4, src, dst, broadcast)),
            Frame::Igmp { m, l4, end } => {
                self.rx_igmp(ifc.index, &m.data()[l4..end]);
                Some(Counter::RxIgmp)
            }
            Frame::UnknownV4 { m, l2, src, dst, broadcast } => {
                if !broadcast {
                    self.icmp_error_v4(m, l2, src, dst, crate::wire::icmpv4::unreachable::PROTOCOL, 0);
                }
                Some(Counter::RxIpv4UnknownProto)
            }
            Frame::Icmpv6 { m, l4, src, dst, hop_limit, eth_src } => {
                Some(self.rx_icmpv6(ifc, m, l4, src, dst, hop_limit, eth_src))
            }
            Frame::UnknownV6 { m, l2, src, dst, answer } => {
                if answer {
                    self.icmp_param_problem_v6(m, l2, src, dst, 6);
                }
                Some(Counter::RxIpv6UnknownProto)
            }
        })
    }

    /// UDP: validate, look the socket up, queue the datagram.
    #[inline]
    pub(super) fn rx_udp<const GRO: bool>(&mut self, ifc: &Interface, m: Mbuf, at: UdpInFrame) -> Step {
        let partial_up_to = if ifc.partial_checksums { ifc.mtu as usize } else { 0 };
        match parse::udp(&m, &at, partial_up_to, &mut &*self) {
            Ok(h) => {
                let mut m = m;
                if h.partial {
                    complete_udp_checksum(&mut m, &at, &h);
                }
                self.rx_udp_deliver::<GRO>(ifc, m, at, h.src_port, h.dst_port, h.payload)
            }
            Err(outcome) => Step::Done(Some(outcome)),
        }
    }

    /// A UDP datagram whose length and checksum are good: looked up, then
    /// queued to its socket, or answered with port unreachable.
    #[inline(always)]
    fn rx_udp_deliver<const GRO: bool>(
        &mut self,
        ifc: &Interface,
        mut m: Mbuf,
        at: UdpInFrame,
        src_port: u16,
        dst_port: u16,
        payload: usize,
    ) -> Step {
        let c = parse::udp_counters(&at.src);
        let key = FlowKey {
            src: ip_key(&at.src),
            src_port,
            dst: ip_key(&at.dst),
            dst_port,
            v4: at.src.is_ipv4(),
            iface: ifc.index,
            lcore: self.idx as u32,
            rss_hash: m.rss_hash(),
        };
        if at.group {
            // Every socket that matches gets it.
            return Step::Done(match self.deliver_group(ifc, m, &at, &key, payload) {
                Ok(()) => None,
                Err(_unwanted) => {
                    self.inc(c.ignored_multi);
                    Some(Counter::RxIgnoredMulti)
                }
            });
        }
        if let Some((index, b)) = self.snapshot.lookup(&key) {
            let mapped = b.family == Family::V6 && at.src.is_ipv4();
            if GRO {
                // The GRO stage, out of line: its lookup was this one.
                let (tunnel, coalesce) = (b.sock.tunnel, b.sock.gro.load(std::sync::atomic::Ordering::Relaxed));
                let ip = Flow::ip_word(m.data().get(at.l3..).unwrap_or(&[]), at.src.is_ipv4());
                let flow = Flow { src: at.src, src_port: key.src_port, dst: at.dst, dst_port: key.dst_port, ip };
                return self.gro_stage_udp(ifc.index, m, at, index, mapped, tunnel, coalesce, flow, payload);
            }
            // Leave only the payload in the mbuf: the headers stay in the
            // headroom, where the datagram reads its addresses from.
            let after = m.pkt_len() - (at.l4 + udp::HEADER_LEN + payload);
            if m.adj(at.l4 + udp::HEADER_LEN).is_err() || (after > 0 && m.trim(after).is_err()) {
                self.inc(c.in_errors);
                return Step::Done(Some(Counter::RxUdpErrors));
            }
            let d = Datagram::new(m, header_span(at.l3, at.l4), mapped, ifc.index);
            // Staged: for the callback, or queued with one charge and one
            // lock per socket.
            self.stage(index, at.src.is_ipv4(), d);
            return Step::Done(None);
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
        Step::Done(Some(Counter::RxNoPort))
    }

    fn rx_arp(&mut self, ifc: &Interface, mut m: Mbuf, l2: usize) -> Counter {
        let parsed = arp::Packet::new_checked(&m.data()[l2..]).and_then(|p| arp::Repr::parse(&p));
        let Ok(repr) = parsed else {
            return Counter::RxArpErrors;
        };
        let h = neigh::arp::handle(&self.shared.neigh, self.now, ifc, &repr);
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
                self.send_frame(ifc.index, m, reply.target_mac, ethernet::ethertype::ARP);
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
        ifc: &Interface,
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
                let mbuf = self.hand_datagram(ifc, mbuf, l3, data_at, len)?;
                let at = UdpInFrame { l3, l4: data_at, end: data_at + len as usize, src, dst, group };
                self.rx_udp_reassembled(ifc, mbuf, at)
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
        let ifc = &net.ifaces[self.shared.iface_of_port(m.port()) as usize];
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
            IpAddr::V4(d) => d.is_multicast() || (!ifc.has_ipv4(d) && ifc.is_ipv4_broadcast(d)),
            IpAddr::V6(d) => d.is_multicast(),
        };
        let at = UdpInFrame { l3, l4, end: l4 + len, src, dst, group };
        self.rx_udp_reassembled(ifc, m, at)
    }

    /// A reassembled UDP datagram (an mbuf chain, the UDP header in the
    /// first segment): its length and checksum checked over the segments,
    /// then delivered as any other.
    fn rx_udp_reassembled(&mut self, ifc: &Interface, m: Mbuf, at: UdpInFrame) -> Option<Counter> {
        let h = match parse::reassembled_udp(&m, &at, &mut &*self) {
            Ok(h) => h,
            Err(outcome) => return Some(outcome),
        };
        let (src_port, dst_port, udp_len) = (h.src_port, h.dst_port, h.payload + udp::HEADER_LEN);
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
        self.rx_udp_deliver::<false>(ifc, m, at, src_port, dst_port, udp_len - udp::HEADER_LEN).outcome()
    }
}

/// Writes the UDP checksum a sender on the same host left to an offload
/// (the field holds the pseudo-header's sum): the offload's work, done
/// here, so the datagram's headers are whole for a reply built from them.
#[cold]
fn complete_udp_checksum(m: &mut Mbuf, at: &UdpInFrame, h: &parse::UdpHeader) {
    let Some(d) = m.data_mut().get_mut(at.l4..at.end) else { return };
    // Over the UDP length, which may be shorter than the IP payload.
    let repr = udp::Repr { src_port: h.src_port, dst_port: h.dst_port, payload_len: h.payload as u16 };
    repr.emit_with_checksum(d, &at.src, &at.dst);
}

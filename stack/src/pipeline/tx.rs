//! The transmit side's header writing: UDP and IP headers go into the
//! mbuf's headroom in front of the payload, the Ethernet header last, once
//! the neighbour is known. Checksums are computed here unless the port
//! offloads them.

use std::net::{IpAddr, SocketAddr};

use spate_dpdk::Mbuf;
use spate_dpdk::mbuf::tx_flags;

use crate::iface::Interface;
use crate::wire::{MacAddr, checksum, ethernet, ip_proto, ipv4, ipv6, udp};

/// Headroom spate's own headers need at most: Ethernet with a VLAN tag,
/// IPv6 with a fragment header, UDP.
pub const MAX_HEADERS: usize =
    ethernet::VLAN_HEADER_LEN + ipv6::HEADER_LEN + ipv6::FRAGMENT_HEADER_LEN + udp::HEADER_LEN;

/// Largest UDP payload in one IPv4 datagram.
pub const MAX_UDP_PAYLOAD_V4: usize = 65535 - ipv4::HEADER_LEN - udp::HEADER_LEN;
/// Largest UDP payload in one IPv6 datagram (no jumbograms).
pub const MAX_UDP_PAYLOAD_V6: usize = 65535 - udp::HEADER_LEN;

/// An IP packet on its way out: the mbuf starts at the IP header.
#[derive(Debug)]
pub struct TxPacket {
    /// The packet.
    pub mbuf: Mbuf,
    /// Interface index.
    pub iface: u16,
    /// The neighbour to send it to.
    pub next_hop: IpAddr,
    /// Counts as a UDP datagram sent (false for the second and later
    /// fragments of one, and for packets spate makes itself).
    pub datagram: bool,
}

/// How to write a UDP datagram's headers.
#[derive(Debug, Clone, Copy)]
pub struct UdpHeaders {
    /// Source (a concrete address of ours).
    pub src: SocketAddr,
    /// Destination.
    pub dst: SocketAddr,
    /// IPv4 identification.
    pub ident: u16,
    /// IPv4 don't-fragment.
    pub dont_frag: bool,
    /// TTL or hop limit.
    pub ttl: u8,
    /// Leave the UDP checksum zero (IPv4 only: tunnels do, RFC 7348).
    pub zero_checksum: bool,
}

/// Writes UDP and IP headers in front of the payload in `m`.
pub fn push_udp_ip(m: &mut Mbuf, h: &UdpHeaders, iface: &Interface) -> Result<(), &'static str> {
    let payload_len = m.pkt_len();
    let udp_len = payload_len + udp::HEADER_LEN;
    let (src, dst) = (h.src.ip(), h.dst.ip());
    let v4 = src.is_ipv4();
    if v4 != dst.is_ipv4() {
        return Err("source and destination families differ");
    }
    let max = if v4 { MAX_UDP_PAYLOAD_V4 } else { MAX_UDP_PAYLOAD_V6 };
    if payload_len > max {
        return Err("datagram too long");
    }
    let pseudo = udp::pseudo_header(&src, &dst, udp_len as u16);
    let offload = iface.tx_checksum;
    let zero = h.zero_checksum && v4;
    let data_sum = if offload || zero { 0 } else { checksum::sum_segments(m.segment_data()) };
    let repr = udp::Repr { src_port: h.src.port(), dst_port: h.dst.port(), payload_len: payload_len as u16 };
    {
        let hdr = m.prepend(udp::HEADER_LEN).map_err(|_| "no headroom")?;
        repr.emit(hdr, 0);
        // The port wants the pseudo-header sum in the field; software puts
        // the final checksum there.
        let c = if zero {
            0
        } else if offload {
            checksum::fold(pseudo)
        } else {
            udp::finish_checksum(pseudo, data_sum + checksum::sum(hdr))
        };
        hdr[6..8].copy_from_slice(&c.to_be_bytes());
    }
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let ip = ipv4::Repr {
                src: s,
                dst: d,
                protocol: ip_proto::UDP,
                payload_len: udp_len as u16,
                ttl: h.ttl,
                tos: 0,
                ident: h.ident,
                dont_frag: h.dont_frag,
                more_frags: false,
                frag_offset: 0,
            };
            ip.emit(m.prepend(ipv4::HEADER_LEN).map_err(|_| "no headroom")?, offload);
            if offload {
                let udp_flag = if zero { 0 } else { tx_flags::UDP_CKSUM };
                m.set_ol_flags(m.ol_flags() | tx_flags::IPV4 | tx_flags::IP_CKSUM | udp_flag);
            }
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let ip = ipv6::Repr {
                src: s,
                dst: d,
                next_header: ip_proto::UDP,
                payload_len: udp_len as u16,
                hop_limit: h.ttl,
            };
            ip.emit(m.prepend(ipv6::HEADER_LEN).map_err(|_| "no headroom")?);
            if offload {
                m.set_ol_flags(m.ol_flags() | tx_flags::IPV6 | tx_flags::UDP_CKSUM);
            }
        }
        _ => unreachable!("families checked above"),
    }
    Ok(())
}

/// Writes the Ethernet header (tagged when the interface has a VLAN) and
/// completes the offload request with the header lengths.
#[inline]
pub fn push_ethernet(m: &mut Mbuf, iface: &Interface, dst: MacAddr, ethertype: u16) -> Result<(), &'static str> {
    let repr = ethernet::Repr { src: iface.mac, dst, ethertype, vlan: iface.vlan };
    let l2 = repr.buffer_len();
    repr.emit(m.prepend(l2).map_err(|_| "no headroom")?);
    let flags = m.ol_flags();
    if flags & tx_flags::ALL != 0 {
        let l3 = if flags & tx_flags::IPV4 != 0 { ipv4::HEADER_LEN } else { ipv6::HEADER_LEN };
        m.set_tx_offload(l2 as u8, l3 as u16, udp::HEADER_LEN as u8, 0);
    }
    Ok(())
}

/// The EtherType of an IP packet to `next_hop`.
#[inline]
pub fn ethertype_for(next_hop: &IpAddr) -> u16 {
    if next_hop.is_ipv4() { ethernet::ethertype::IPV4 } else { ethernet::ethertype::IPV6 }
}

use crate::neigh::{Resolve, Solicit, arp as neigh_arp, nd};
use crate::stats::Counter;
use crate::worker::Worker;

/// How often a full TX ring is retried before its frames are dropped.
const TX_RETRIES: usize = 16;

impl Worker<'_> {
    /// Sends an IP packet: Ethernet header from the neighbour cache, or a
    /// wait in the neighbour's queue while it is resolved.
    #[inline]
    pub(crate) fn transmit(&mut self, pkt: TxPacket) {
        if let Some(mac) = self.memo.get(pkt.iface, &pkt.next_hop, self.now) {
            self.send_ip(pkt, mac);
            return;
        }
        let key = (pkt.iface, pkt.next_hop);
        match self.shared.neigh.resolve(self.now, key, pkt) {
            Resolve::Ready { mac, pkt, until, probe } => {
                if until > self.now {
                    self.memo.put(key.0, key.1, mac, until);
                }
                self.send_ip(pkt, mac);
                if let Some(s) = probe {
                    self.solicit(s);
                }
            }
            Resolve::Queued { solicit, dropped } => {
                self.inc(Counter::NeighQueued);
                if dropped.is_some() {
                    self.inc(Counter::NeighQueueDrops);
                }
                if let Some(s) = solicit {
                    self.solicit(s);
                }
            }
        }
    }

    /// Sends an IP packet to a known MAC.
    #[inline]
    pub(crate) fn send_ip(&mut self, pkt: TxPacket, mac: MacAddr) {
        let ethertype = ethertype_for(&pkt.next_hop);
        self.inc(if pkt.next_hop.is_ipv4() { Counter::IpOutRequests } else { Counter::Ip6OutRequests });
        self.send_frame(pkt.iface, pkt.mbuf, mac, ethertype);
    }

    /// Adds the Ethernet header and queues the frame for its port.
    #[inline]
    pub(crate) fn send_frame(&mut self, iface: u16, mut m: Mbuf, dst: MacAddr, ethertype: u16) {
        let ifc = &self.shared.ifaces[iface as usize];
        if push_ethernet(&mut m, ifc, dst, ethertype).is_err() {
            return;
        }
        if let Some(t) = ifc.tunnel {
            self.vxlan_encap(t, m);
            return;
        }
        self.queue_tx(iface as usize, m);
    }

    /// Queues a finished frame for port `i`, flushing first when full.
    #[inline]
    pub(crate) fn queue_tx(&mut self, i: usize, m: Mbuf) {
        if let Err(m) = self.txbuf[i].push(m) {
            self.flush(i);
            let _ = self.txbuf[i].push(m);
        }
    }

    /// Sends what waits for port `i`, retrying a full ring a few times.
    pub(crate) fn flush(&mut self, i: usize) {
        if self.tx[i].is_none() {
            self.hand_tx(i);
            return;
        }
        let mut tries = 0;
        while !self.txbuf[i].is_empty() {
            let sent = self.tx[i].as_mut().map_or(0, |q| q.tx_burst(&mut self.txbuf[i]));
            self.add(Counter::TxFrames, sent as u64);
            if sent == 0 {
                tries += 1;
                if tries >= TX_RETRIES {
                    self.add(Counter::TxRingFull, self.txbuf[i].len() as u64);
                    self.txbuf[i].clear();
                    return;
                }
                std::hint::spin_loop();
            }
        }
    }

    /// Flushes every port.
    pub(crate) fn flush_all(&mut self) {
        for i in 0..self.txbuf.len() {
            if !self.txbuf[i].is_empty() {
                self.flush(i);
            }
        }
    }

    /// Sends an ARP request or neighbour solicitation.
    pub(crate) fn solicit(&mut self, s: Solicit) {
        let iface = &self.shared.ifaces[s.iface as usize];
        match s.target {
            IpAddr::V4(t) => {
                if let Some(req) = neigh_arp::request(iface, t, s.unicast) {
                    self.send_arp(s.iface, req, s.unicast.unwrap_or(MacAddr::BROADCAST));
                }
            }
            IpAddr::V6(t) => {
                if let Some(out) = nd::solicitation(iface, t, s.unicast) {
                    self.send_nd(s.iface, out);
                }
            }
        }
    }

    /// Gratuitous ARP and unsolicited neighbour advertisements for every
    /// address, so peers update their caches when spate (re)starts.
    pub(crate) fn announce(&mut self) {
        for iface in self.shared.ifaces.iter() {
            for c in &iface.ipv4 {
                if let IpAddr::V4(a) = c.addr {
                    self.send_arp(iface.index, neigh_arp::gratuitous(iface, a), MacAddr::BROADCAST);
                }
            }
            for c in &iface.ipv6 {
                if let IpAddr::V6(a) = c.addr {
                    self.send_nd(iface.index, nd::unsolicited_advert(iface, a));
                }
            }
        }
    }

    /// Sends an ARP packet in a fresh mbuf.
    pub(crate) fn send_arp(&mut self, iface: u16, repr: crate::wire::arp::Repr, dst: MacAddr) {
        let Some(mut m) = self.shared.pool.alloc() else {
            self.inc(Counter::TxNoMbuf);
            return;
        };
        let Ok(body) = m.append(crate::wire::arp::PACKET_LEN) else {
            return;
        };
        repr.emit(body);
        self.inc(if repr.operation == crate::wire::arp::Operation::Request {
            Counter::ArpOutRequests
        } else {
            Counter::ArpOutReplies
        });
        self.send_frame(iface, m, dst, ethernet::ethertype::ARP);
    }

    /// Sends a neighbour-discovery message in a fresh mbuf (hop limit 255).
    pub(crate) fn send_nd(&mut self, iface: u16, out: nd::Outgoing) {
        let Some(mut m) = self.shared.pool.alloc() else {
            self.inc(Counter::TxNoMbuf);
            return;
        };
        let len = out.msg.buffer_len();
        let Ok(body) = m.append(len) else { return };
        out.msg.emit(body, &out.src, &out.dst);
        let ip = ipv6::Repr {
            src: out.src,
            dst: out.dst,
            next_header: ip_proto::ICMPV6,
            payload_len: len as u16,
            hop_limit: 255,
        };
        let Ok(h) = m.prepend(ipv6::HEADER_LEN) else {
            return;
        };
        ip.emit(h);
        self.inc(Counter::Icmp6OutMsgs);
        self.inc(match out.msg {
            crate::wire::icmpv6::Repr::NeighborSolicit { .. } => Counter::Icmp6OutNeighborSolicits,
            _ => Counter::Icmp6OutNeighborAdvertisements,
        });
        self.send_frame(iface, m, out.dst_mac, ethernet::ethertype::IPV6);
    }
}

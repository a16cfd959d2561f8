//! Header writing for what spate sends: UDP and IP headers go into the
//! mbuf's headroom in front of the payload, the Ethernet header last, once
//! the neighbour is known. Checksums are computed here unless the port
//! offloads them. No I/O: the engine and the sockets both write with it.

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
    /// The UDP checksum, when known already (a reply keeping its
    /// request's, see `SendBuf::reply_checksum`): no payload is summed.
    pub known_checksum: Option<u16>,
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
    let known = h.known_checksum.filter(|_| !offload && !zero);
    let data_sum = if offload || zero || known.is_some() { 0 } else { checksum::sum_segments(m.segment_data()) };
    let repr = udp::Repr { src_port: h.src.port(), dst_port: h.dst.port(), payload_len: payload_len as u16 };
    {
        let hdr = m.prepend(udp::HEADER_LEN).map_err(|_| "no headroom")?;
        repr.emit(hdr, 0);
        // The port wants the pseudo-header sum in the field; software puts
        // the final checksum there.
        let c = if zero {
            0
        } else if let Some(c) = known {
            c
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

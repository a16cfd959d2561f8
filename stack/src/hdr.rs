//! Header writing for what spate sends: UDP and IP headers go into the
//! mbuf's headroom in front of the payload, the Ethernet header last, once
//! the neighbour is known. Checksums are computed here unless the port
//! offloads them. No I/O: the engine and the sockets both write with it.

use std::net::{IpAddr, SocketAddr, SocketAddrV4};

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
    /// IPv4 TOS or IPv6 traffic class (DSCP and ECN).
    pub tos: u8,
    /// Leave the UDP checksum zero (IPv4 only: tunnels do, RFC 7348).
    pub zero_checksum: bool,
    /// The UDP checksum, when known already (a reply keeping its
    /// request's, see `SendBuf::reply_checksum`): no payload is summed.
    pub known_checksum: Option<u16>,
}

/// Writes UDP and IP headers in front of the payload in `m`.
#[inline]
pub fn push_udp_ip(m: &mut Mbuf, h: &UdpHeaders, offload: bool) -> Result<(), &'static str> {
    if let (SocketAddr::V4(s), SocketAddr::V4(d)) = (h.src, h.dst) {
        let v4 =
            Udp4 { ident: h.ident, dont_frag: h.dont_frag, ttl: h.ttl, tos: h.tos, zero_checksum: h.zero_checksum };
        return push_udp_ipv4(m, s, d, v4, h.known_checksum, offload);
    }
    push_udp_ip_any(m, h, offload)
}

/// What an IPv4 datagram's headers carry besides its addresses (see
/// [`UdpHeaders`]).
#[derive(Debug, Clone, Copy)]
pub struct Udp4 {
    /// IPv4 identification.
    pub ident: u16,
    /// IPv4 don't-fragment.
    pub dont_frag: bool,
    /// TTL.
    pub ttl: u8,
    /// TOS (DSCP and ECN).
    pub tos: u8,
    /// Leave the UDP checksum zero.
    pub zero_checksum: bool,
}

impl Udp4 {
    /// A socket's datagram: DF set (the path MTU is discovered), the
    /// socket's TTL and TOS, a UDP checksum.
    #[inline(always)]
    pub const fn datagram(ident: u16, ttl: u8, tos: u8) -> Udp4 {
        Udp4 { ident, dont_frag: true, ttl, tos, zero_checksum: false }
    }
}

/// IPv4 headers, the common case: both headers composed as words and
/// written with one prepend, the IPv4 checksum summed from those words.
/// The addresses come by value, in registers, not in a `SocketAddr`.
#[inline(always)]
pub fn push_udp_ipv4(
    m: &mut Mbuf,
    s: SocketAddrV4,
    d: SocketAddrV4,
    h: Udp4,
    known_checksum: Option<u16>,
    offload: bool,
) -> Result<(), &'static str> {
    let payload_len = m.pkt_len();
    if payload_len > MAX_UDP_PAYLOAD_V4 {
        return Err("datagram too long");
    }
    let udp_len = (payload_len + udp::HEADER_LEN) as u16;
    let total = udp_len + ipv4::HEADER_LEN as u16;
    let (sa, da) = (u32::from(*s.ip()), u32::from(*d.ip()));
    let (sp, dp) = (s.port(), d.port());
    let addrs = (sa >> 16) as u64 + (sa & 0xffff) as u64 + (da >> 16) as u64 + (da & 0xffff) as u64;
    let udp_check = if h.zero_checksum {
        0
    } else if offload {
        // The port wants the pseudo-header sum in the field.
        checksum::fold(addrs + ip_proto::UDP as u64 + udp_len as u64)
    } else if let Some(c) = known_checksum {
        c
    } else {
        let data = checksum::sum_segments(m.segment_data());
        let header = sp as u64 + dp as u64 + udp_len as u64;
        udp::finish_checksum(addrs + ip_proto::UDP as u64 + udp_len as u64, data + header)
    };
    let frag = if h.dont_frag { ipv4::DF } else { 0 };
    let ttl_proto = (h.ttl as u16) << 8 | ip_proto::UDP as u16;
    let ip_check = if offload {
        0
    } else {
        let ver_tos = 0x4500 | h.tos as u64;
        !checksum::fold(ver_tos + total as u64 + h.ident as u64 + frag as u64 + ttl_proto as u64 + addrs)
    };
    let mut hdr = [0u8; ipv4::HEADER_LEN + udp::HEADER_LEN];
    hdr[0] = 0x45;
    hdr[1] = h.tos;
    hdr[2..4].copy_from_slice(&total.to_be_bytes());
    hdr[4..6].copy_from_slice(&h.ident.to_be_bytes());
    hdr[6..8].copy_from_slice(&frag.to_be_bytes());
    hdr[8..10].copy_from_slice(&ttl_proto.to_be_bytes());
    hdr[10..12].copy_from_slice(&ip_check.to_be_bytes());
    hdr[12..16].copy_from_slice(&sa.to_be_bytes());
    hdr[16..20].copy_from_slice(&da.to_be_bytes());
    hdr[20..22].copy_from_slice(&sp.to_be_bytes());
    hdr[22..24].copy_from_slice(&dp.to_be_bytes());
    hdr[24..26].copy_from_slice(&udp_len.to_be_bytes());
    hdr[26..28].copy_from_slice(&udp_check.to_be_bytes());
    m.prepend(hdr.len()).map_err(|_| "no headroom")?.copy_from_slice(&hdr);
    if offload {
        let udp_flag = if h.zero_checksum { 0 } else { tx_flags::UDP_CKSUM };
        m.set_ol_flags(m.ol_flags() | tx_flags::IPV4 | tx_flags::IP_CKSUM | udp_flag);
    }
    Ok(())
}

/// UDP and IP headers for any family pair (IPv6, and the IPv4 case's
/// reference in the tests).
fn push_udp_ip_any(m: &mut Mbuf, h: &UdpHeaders, offload: bool) -> Result<(), &'static str> {
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
                tos: h.tos,
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
            let hdr = m.prepend(ipv6::HEADER_LEN).map_err(|_| "no headroom")?;
            ip.emit(hdr);
            ipv6::set_traffic_class(hdr, h.tos);
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
    if iface.vlan.is_none() {
        // Untagged, the common case: one 14-byte write.
        return push_untagged(m, &untagged_header(dst, iface.mac, ethertype));
    }
    let repr = ethernet::Repr { src: iface.mac, dst, ethertype, vlan: iface.vlan };
    let l2 = repr.buffer_len();
    repr.emit(m.prepend(l2).map_err(|_| "no headroom")?);
    set_offload_lengths(m, l2);
    Ok(())
}

/// An untagged Ethernet header, as bytes.
#[inline(always)]
pub fn untagged_header(dst: MacAddr, src: MacAddr, ethertype: u16) -> [u8; ethernet::HEADER_LEN] {
    let mut h = [0u8; ethernet::HEADER_LEN];
    h[..6].copy_from_slice(&dst.0);
    h[6..12].copy_from_slice(&src.0);
    h[12..].copy_from_slice(&ethertype.to_be_bytes());
    h
}

/// Writes an untagged Ethernet header made beforehand and completes the
/// offload request.
#[inline(always)]
pub fn push_untagged(m: &mut Mbuf, header: &[u8; ethernet::HEADER_LEN]) -> Result<(), &'static str> {
    m.prepend(header.len()).map_err(|_| "no headroom")?.copy_from_slice(header);
    set_offload_lengths(m, header.len());
    Ok(())
}

/// The header lengths an offload request needs, when there is one.
#[inline(always)]
fn set_offload_lengths(m: &mut Mbuf, l2: usize) {
    let flags = m.ol_flags();
    if flags & tx_flags::ALL != 0 {
        let l3 = if flags & tx_flags::IPV4 != 0 { ipv4::HEADER_LEN } else { ipv6::HEADER_LEN };
        m.set_tx_offload(l2 as u8, l3 as u16, udp::HEADER_LEN as u8, 0);
    }
}

/// The EtherType of an IP packet to `next_hop`.
#[inline]
pub fn ethertype_for(next_hop: &IpAddr) -> u16 {
    if next_hop.is_ipv4() { ethernet::ethertype::IPV4 } else { ethernet::ethertype::IPV6 }
}

//! Header writing for what spate sends: UDP and IP headers go into the
//! mbuf's headroom in front of the payload, the Ethernet header last, once
//! the neighbour is known. Checksums are computed here unless the port
//! offloads them. No I/O: the engine and the sockets both write with it,
//! over any [`PacketBuf`] (an `Mbuf`, or a `MemBuf` in the tests).

use std::net::{IpAddr, SocketAddr, SocketAddrV4};

use spate_dpdk::mbuf::tx_flags;

use crate::buf::PacketBuf;
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
pub fn push_udp_ip(m: &mut impl PacketBuf, h: &UdpHeaders, offload: bool) -> Result<(), &'static str> {
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
    m: &mut impl PacketBuf,
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
        let data = checksum::sum_segments(m.segments());
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
fn push_udp_ip_any(m: &mut impl PacketBuf, h: &UdpHeaders, offload: bool) -> Result<(), &'static str> {
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
    let data_sum = if offload || zero || known.is_some() { 0 } else { checksum::sum_segments(m.segments()) };
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
pub fn push_ethernet(
    m: &mut impl PacketBuf,
    ifc: &Interface,
    dst: MacAddr,
    ethertype: u16,
) -> Result<(), &'static str> {
    if ifc.vlan.is_none() {
        // Untagged, the common case: one 14-byte write.
        return push_untagged(m, &untagged_header(dst, ifc.mac, ethertype));
    }
    let repr = ethernet::Repr { src: ifc.mac, dst, ethertype, vlan: ifc.vlan };
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
pub fn push_untagged(m: &mut impl PacketBuf, header: &[u8; ethernet::HEADER_LEN]) -> Result<(), &'static str> {
    m.prepend(header.len()).map_err(|_| "no headroom")?.copy_from_slice(header);
    set_offload_lengths(m, header.len());
    Ok(())
}

/// The header lengths an offload request needs, when there is one.
#[inline(always)]
fn set_offload_lengths(m: &mut impl PacketBuf, l2: usize) {
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

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddrV6};

    use super::*;
    use crate::buf::MemBuf;

    const SRC: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 7);
    const DST: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 40000);

    fn payload(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + 3) as u8).collect()
    }

    fn headers(v4: Udp4, known_checksum: Option<u16>) -> UdpHeaders {
        UdpHeaders {
            src: SRC.into(),
            dst: DST.into(),
            ident: v4.ident,
            dont_frag: v4.dont_frag,
            ttl: v4.ttl,
            tos: v4.tos,
            zero_checksum: v4.zero_checksum,
            known_checksum,
        }
    }

    /// The payload split into segments at `cuts` (odd lengths included).
    fn segmented(p: &[u8], cuts: &[usize]) -> MemBuf {
        let first = cuts.first().copied().unwrap_or(p.len()).min(p.len());
        let mut m = MemBuf::new(&p[..first]);
        let mut at = first;
        for &c in cuts.iter().skip(1).chain(std::iter::once(&p.len())) {
            let c = c.min(p.len());
            if c > at {
                m.chained.push(p[at..c].to_vec());
                at = c;
            }
        }
        m
    }

    #[test]
    fn the_ipv4_writer_matches_the_repr_path() {
        // Every mode of the word-composed IPv4 writer against the generic
        // one, which writes through ipv4::Repr and udp::Repr: the same
        // bytes, the same offload flags.
        let modes = [
            Udp4::datagram(0x1234, 64, 0),
            Udp4 { ident: 0xffff, dont_frag: false, ttl: 1, tos: 0xb8, zero_checksum: false },
            Udp4 { ident: 7, dont_frag: true, ttl: 255, tos: 0x03, zero_checksum: true },
        ];
        for len in [0, 1, 7, 64, 1472, 9000] {
            for cuts in [&[][..], &[1, 4][..], &[33][..]] {
                for v4 in modes {
                    for offload in [false, true] {
                        let p = payload(len);
                        let (mut a, mut b) = (segmented(&p, cuts), segmented(&p, cuts));
                        push_udp_ipv4(&mut a, SRC, DST, v4, None, offload).unwrap();
                        push_udp_ip_any(&mut b, &headers(v4, None), offload).unwrap();
                        assert_eq!(a.to_vec(), b.to_vec(), "len {len} cuts {cuts:?} {v4:?} offload {offload}");
                        assert_eq!(a.ol_flags, b.ol_flags);
                    }
                }
            }
        }
    }

    #[test]
    fn written_checksums_verify() {
        for len in [0, 1, 7, 64, 1473] {
            let p = payload(len);
            let mut m = segmented(&p, &[3, 10]);
            push_udp_ipv4(&mut m, SRC, DST, Udp4::datagram(9, 64, 0), None, false).unwrap();
            let bytes = m.to_vec();
            let ip = ipv4::Packet::new_checked(&bytes[..]).unwrap();
            assert!(ip.verify_checksum(), "len {len}");
            assert_eq!((ip.total_len() as usize, ip.dont_frag(), ip.ttl()), (28 + len, true, 64));
            let u = udp::Packet::new_checked(ip.payload()).unwrap();
            assert!(u.verify_checksum(&(*SRC.ip()).into(), &(*DST.ip()).into()), "len {len}");
            assert_eq!((u.src_port(), u.dst_port(), u.len() as usize), (7, 40000, 8 + len));
            assert_eq!(&ip.payload()[8..], &p[..]);
        }
    }

    #[test]
    fn a_known_checksum_is_written_as_given() {
        // A reply keeps its request's checksum: nothing is summed, the
        // field is what the caller says, in both writers.
        let p = payload(20);
        let (mut a, mut b) = (MemBuf::new(&p), MemBuf::new(&p));
        push_udp_ipv4(&mut a, SRC, DST, Udp4::datagram(1, 64, 0), Some(0xbeef), false).unwrap();
        push_udp_ip_any(&mut b, &headers(Udp4::datagram(1, 64, 0), Some(0xbeef)), false).unwrap();
        assert_eq!(a.to_vec(), b.to_vec());
        assert_eq!(a.to_vec()[26..28], [0xbe, 0xef]);
    }

    #[test]
    fn ipv6_headers_carry_the_class_and_a_checksum() {
        let (s, d) = ("fd00::2".parse().unwrap(), "fd00::1".parse().unwrap());
        let h = UdpHeaders {
            src: SocketAddrV6::new(s, 7, 0, 0).into(),
            dst: SocketAddrV6::new(d, 40000, 0, 0).into(),
            ident: 0,
            dont_frag: true,
            ttl: 9,
            tos: 0xb9,
            // Asked for, but IPv6 has no datagram without a checksum.
            zero_checksum: true,
            known_checksum: None,
        };
        let p = payload(33);
        let mut m = segmented(&p, &[5]);
        push_udp_ip(&mut m, &h, false).unwrap();
        let bytes = m.to_vec();
        let ip = ipv6::Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!((ip.traffic_class(), ip.hop_limit(), ip.next_header()), (0xb9, 9, ip_proto::UDP));
        let u = udp::Packet::new_checked(ip.payload()).unwrap();
        assert_ne!(u.checksum(), 0);
        assert!(u.verify_checksum(&IpAddr::V6(s), &IpAddr::V6(d)));
    }

    #[test]
    fn what_cannot_be_written_is_refused() {
        let v4 = Udp4::datagram(1, 64, 0);
        let mut long = MemBuf::new(&payload(MAX_UDP_PAYLOAD_V4 + 1));
        assert_eq!(push_udp_ipv4(&mut long, SRC, DST, v4, None, false), Err("datagram too long"));
        let mut tight = MemBuf::with_headroom(&payload(8), ipv4::HEADER_LEN + udp::HEADER_LEN - 1);
        assert_eq!(push_udp_ipv4(&mut tight, SRC, DST, v4, None, false), Err("no headroom"));
        let mixed = UdpHeaders { dst: "[fd00::1]:9".parse().unwrap(), ..headers(v4, None) };
        assert_eq!(push_udp_ip(&mut MemBuf::new(b"x"), &mixed, false), Err("source and destination families differ"));
    }

    #[test]
    fn ethernet_headers_tagged_and_not() {
        let mac = MacAddr([2, 0x53, 0x50, 0x41, 0x54, 0x45]);
        let peer = MacAddr([6, 5, 4, 3, 2, 1]);
        let cidr = [crate::config::Cidr { addr: IpAddr::V4(*SRC.ip()), prefix_len: 24 }];
        let mut ifc = Interface::new(0, 0, "t".into(), mac, 1500, None, &cidr, &[]);
        let mut m = MemBuf::new(&payload(28));
        m.set_ol_flags(tx_flags::IPV4 | tx_flags::IP_CKSUM);
        push_ethernet(&mut m, &ifc, peer, ethernet::ethertype::IPV4).unwrap();
        assert_eq!(m.to_vec()[..14], untagged_header(peer, mac, ethernet::ethertype::IPV4));
        // An offload request learns the header lengths.
        assert_eq!(m.tx_offload, (14, 20, 8));
        ifc.vlan = Some(100);
        let mut m = MemBuf::new(&payload(28));
        push_ethernet(&mut m, &ifc, peer, ethernet::ethertype::IPV4).unwrap();
        let bytes = m.to_vec();
        let f = ethernet::Frame::new_checked(&bytes[..]).unwrap();
        assert_eq!((f.vlan_id(), f.ethertype(), f.header_len(), f.dst(), f.src()), (Some(100), 0x0800, 18, peer, mac));
        assert_eq!(m.tx_offload, (0, 0, 0), "no offload asked, none described");
    }
}

//! parse(emit(x)) == x for every wire format, and no panic on any input.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::*;

fn mac() -> impl Strategy<Value = MacAddr> {
    any::<[u8; 6]>().prop_map(MacAddr)
}

fn v4() -> impl Strategy<Value = Ipv4Addr> {
    any::<u32>().prop_map(Ipv4Addr::from)
}

fn v6() -> impl Strategy<Value = Ipv6Addr> {
    any::<u128>().prop_map(Ipv6Addr::from)
}

proptest! {
    #[test]
    fn ethernet_round_trip(src in mac(), dst in mac(), ethertype in any::<u16>(), vlan in proptest::option::of(0u16..4096)) {
        prop_assume!(ethertype != ethernet::ethertype::VLAN);
        let r = ethernet::Repr { src, dst, ethertype, vlan };
        let mut buf = vec![0u8; r.buffer_len()];
        r.emit(&mut buf);
        prop_assert_eq!(ethernet::Repr::parse(&ethernet::Frame::new_checked(&buf[..]).unwrap()).unwrap(), r);
    }

    #[test]
    fn arp_round_trip(req in any::<bool>(), sender_mac in mac(), sender_ip in v4(), target_mac in mac(), target_ip in v4()) {
        let operation = if req { arp::Operation::Request } else { arp::Operation::Reply };
        let r = arp::Repr { operation, sender_mac, sender_ip, target_mac, target_ip };
        let mut buf = [0u8; arp::PACKET_LEN];
        r.emit(&mut buf);
        prop_assert_eq!(arp::Repr::parse(&arp::Packet::new_checked(&buf[..]).unwrap()).unwrap(), r);
    }

    #[test]
    fn ipv4_round_trip(src in v4(), dst in v4(), protocol in any::<u8>(), payload_len in 0u16..1480, ttl in any::<u8>(),
                       tos in any::<u8>(), ident in any::<u16>(), dont_frag in any::<bool>(), more_frags in any::<bool>(),
                       off8 in 0u32..8192) {
        let r = ipv4::Repr { src, dst, protocol, payload_len, ttl, tos, ident, dont_frag, more_frags, frag_offset: off8 * 8 };
        let mut buf = vec![0u8; ipv4::HEADER_LEN + payload_len as usize];
        r.emit(&mut buf, false);
        prop_assert!(ipv4::Packet::new_checked(&buf[..]).unwrap().verify_checksum());
        prop_assert_eq!(checksum::checksum(&buf[..ipv4::HEADER_LEN]), 0);
        prop_assert_eq!(ipv4::Repr::parse(&ipv4::Packet::new_checked(&buf[..]).unwrap(), false).unwrap(), r);
    }

    #[test]
    fn ipv6_round_trip(src in v6(), dst in v6(), next_header in any::<u8>(), payload_len in 0u16..1460, hop_limit in any::<u8>()) {
        let r = ipv6::Repr { src, dst, next_header, payload_len, hop_limit };
        let mut buf = vec![0u8; ipv6::HEADER_LEN + payload_len as usize];
        r.emit(&mut buf);
        prop_assert_eq!(ipv6::Repr::parse(&ipv6::Packet::new_checked(&buf[..]).unwrap()).unwrap(), r);
    }

    #[test]
    fn udp_round_trip(src_port in any::<u16>(), dst_port in any::<u16>(), payload in proptest::collection::vec(any::<u8>(), 0..600),
                      v6addrs in any::<bool>(), a4 in v4(), b4 in v4(), a6 in v6(), b6 in v6()) {
        let (s, d) = if v6addrs { (IpAddr::V6(a6), IpAddr::V6(b6)) } else { (IpAddr::V4(a4), IpAddr::V4(b4)) };
        let r = udp::Repr { src_port, dst_port, payload_len: payload.len() as u16 };
        let mut buf = vec![0u8; udp::HEADER_LEN];
        buf.extend_from_slice(&payload);
        r.emit_with_checksum(&mut buf, &s, &d);
        let p = udp::Packet::new_checked(&buf[..]).unwrap();
        prop_assert_eq!(udp::Repr::parse(&p, &s, &d, false).unwrap(), r);
        prop_assert_eq!(p.payload(), &payload[..]);
    }

    #[test]
    fn icmpv4_round_trip(kind in 0u8..4, ident in any::<u16>(), seq_no in any::<u16>(), code in any::<u8>(), mtu in any::<u16>(),
                         data in proptest::collection::vec(any::<u8>(), 0..200)) {
        let r = match kind {
            0 => icmpv4::Repr::EchoRequest { ident, seq_no, data: &data },
            1 => icmpv4::Repr::EchoReply { ident, seq_no, data: &data },
            2 => icmpv4::Repr::DstUnreachable { code, mtu, data: &data },
            _ => icmpv4::Repr::TimeExceeded { code, data: &data },
        };
        let mut buf = vec![0u8; r.buffer_len()];
        r.emit(&mut buf);
        let p = icmpv4::Packet::new_checked(&buf[..]).unwrap();
        prop_assert_eq!(icmpv4::Repr::parse(&p, false).unwrap(), r);
    }

    #[test]
    fn icmpv6_round_trip(kind in 0u8..6, ident in any::<u16>(), seq_no in any::<u16>(), mtu in any::<u32>(), target in v6(),
                         ll in proptest::option::of(mac()), flags in any::<[bool; 3]>(), src in v6(), dst in v6(),
                         data in proptest::collection::vec(any::<u8>(), 0..200)) {
        let r = match kind {
            0 => icmpv6::Repr::EchoRequest { ident, seq_no, data: &data },
            1 => icmpv6::Repr::EchoReply { ident, seq_no, data: &data },
            2 => icmpv6::Repr::PacketTooBig { mtu, data: &data },
            3 => icmpv6::Repr::NeighborSolicit { target, source_ll: ll },
            4 => icmpv6::Repr::NeighborAdvert {
                flags: icmpv6::NaFlags { router: flags[0], solicited: flags[1], override_: flags[2] }, target, target_ll: ll },
            _ => icmpv6::Repr::RouterSolicit { source_ll: ll },
        };
        let mut buf = vec![0u8; r.buffer_len()];
        r.emit(&mut buf, &src, &dst);
        let p = icmpv6::Packet::new_checked(&buf[..]).unwrap();
        prop_assert_eq!(icmpv6::Repr::parse(&p, &src, &dst, false).unwrap(), r);
    }

    #[test]
    fn no_parser_panics_on_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..200), a in v6(), b in v6()) {
        let _ = ethernet::Frame::new_checked(&bytes[..]).and_then(|f| ethernet::Repr::parse(&f));
        let _ = arp::Packet::new_checked(&bytes[..]).and_then(|p| arp::Repr::parse(&p));
        if let Ok(p) = ipv4::Packet::new_checked(&bytes[..]) {
            let _ = ipv4::Repr::parse(&p, false);
            let _ = p.payload();
        }
        if let Ok(p) = ipv6::Packet::new_checked(&bytes[..]) {
            let _ = ipv6::walk_extensions(p.next_header(), p.payload());
        }
        let _ = ipv6::walk_extensions(bytes.first().copied().unwrap_or(0), &bytes);
        if let Ok(p) = udp::Packet::new_checked(&bytes[..]) {
            let _ = udp::Repr::parse(&p, &IpAddr::V6(a), &IpAddr::V6(b), false);
            let _ = p.payload();
        }
        if let Ok(p) = icmpv4::Packet::new_checked(&bytes[..]) {
            let _ = icmpv4::Repr::parse(&p, true);
        }
        if let Ok(p) = icmpv6::Packet::new_checked(&bytes[..]) {
            let _ = icmpv6::Repr::parse(&p, &a, &b, true);
        }
    }
}

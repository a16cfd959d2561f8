//! VXLAN (RFC 7348): an inner interface whose Ethernet frames travel in
//! UDP between spate and a remote tunnel endpoint.
//!
//! Receive: the endpoint is a socket-table entry on the tunnel's UDP port
//! (4789 by default) that the GRO stage recognises; it checks the 8-byte
//! VXLAN header (the I flag, a VNI spate has) and that the packet came
//! from that tunnel's remote to its local address over its outer
//! interface, cuts the outer headers off
//! and hands the inner frame to the inner interface's receive path as if
//! a port had received it, so its ARP, ICMP, UDP sockets and GRO work as on
//! any interface. Transmit: a frame leaving the inner interface gets the
//! VXLAN header, UDP (source port from a hash of the inner headers, so
//! flows spread; checksum zero over IPv4, computed over IPv6) and the outer
//! IP header, and goes out of the outer interface like any packet of
//! spate's, its next hop resolved there.
//!
//! The tunnels' inner interfaces and endpoints are set up by
//! `setup::tunnels`; this is the datapath.

use std::net::{IpAddr, SocketAddr};

use spate_dpdk::Mbuf;

use super::offsets::UdpInFrame;
use super::{Step, Worker};
use crate::buf::PacketBuf;
use crate::hdr::{UdpHeaders, push_udp_ip};
use crate::iface::{Interface, Tunnel};
use crate::shared::TxPacket;
use crate::stats::Counter;
use crate::wire::{ethernet, udp, vxlan};

impl Worker<'_> {
    /// A datagram that came in on interface `iface` for a tunnel endpoint
    /// on UDP port `port`, decapsulated ([`decapsulate`]).
    /// The inner frame goes back to the receive loop, which takes it next
    /// as a frame of the inner interface (no recursion: the loop's one
    /// call of `rx_frame` stays inlined).
    pub(super) fn rx_vxlan(&mut self, iface: u16, port: u16, mut m: Mbuf, at: UdpInFrame) -> Step {
        match decapsulate(&self.shared.links, iface, port, &mut m, &at) {
            Ok(inner) => {
                self.inc(Counter::VxlanInPackets);
                Step::Inner(inner, m)
            }
            Err(outcome) => Step::Done(Some(outcome)),
        }
    }

    /// Sends frame `m`, leaving the inner interface of tunnel `t`, to the
    /// tunnel's remote.
    pub(super) fn vxlan_encap(&mut self, t: Tunnel, mut m: Mbuf) {
        let sport = source_port(m.data());
        let header = vxlan::Repr { vni: t.vni };
        let Ok(h) = m.prepend(header.buffer_len()) else {
            self.inc(Counter::TxNoMbuf);
            return;
        };
        header.emit(h);
        let v4 = t.local.is_ipv4();
        let ident = match (t.local, t.remote.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => self.shared.ip_id.reserve(s, d, crate::wire::ip_proto::UDP, 1),
            _ => 0,
        };
        let headers = UdpHeaders {
            src: SocketAddr::new(t.local, sport),
            dst: t.remote,
            ident,
            dont_frag: false,
            ttl: 64,
            tos: 0,
            zero_checksum: v4,
            known_checksum: None,
        };
        let outer = &self.shared.links[t.outer as usize];
        m.set_ol_flags(0);
        if push_udp_ip(&mut m, &headers, outer.tx_checksum).is_err() {
            self.inc(Counter::TxNoMbuf);
            return;
        }
        let Some(route) = self.shared.route_in(&self.net, &t.remote.ip(), Some(&t.local)) else {
            self.inc(Counter::TxNoRoute);
            return;
        };
        self.inc(Counter::VxlanOutPackets);
        self.transmit(TxPacket { mbuf: m, iface: route.iface, next_hop: route.next_hop, datagram: false });
    }
}

/// A datagram that came in on interface `iface` for a tunnel endpoint on
/// UDP port `port` (`m` the frame, `at` where the datagram lies): its
/// 8-byte VXLAN header checked (the I flag, a VNI one of `links` has on
/// that port), and that it came from that tunnel's remote, to its local
/// address, over its outer interface (anyone else who reaches the port
/// would otherwise put frames on the inner interface). Then the outer
/// headers are cut off and the port's verdicts forgotten (they were
/// about the outer packet): `m` is the inner frame, and the inner
/// interface is returned.
pub(super) fn decapsulate<B: PacketBuf>(
    links: &[Interface],
    iface: u16,
    port: u16,
    m: &mut B,
    at: &UdpInFrame,
) -> Result<u16, Counter> {
    let start = at.l4 + udp::HEADER_LEN;
    let header = m.data().get(start..at.end).map(vxlan::Packet::new_checked);
    let Some(Ok(header)) = header else { return Err(Counter::RxVxlanErrors) };
    let Ok(vxlan::Repr { vni }) = vxlan::Repr::parse(&header) else { return Err(Counter::RxVxlanErrors) };
    if header.payload().len() < ethernet::HEADER_LEN {
        return Err(Counter::RxVxlanErrors);
    }
    let Some((inner, t)) =
        links.iter().find_map(|i| i.tunnel.filter(|t| t.vni == vni && t.local_port == port).map(|t| (i.index, t)))
    else {
        return Err(Counter::RxVxlanErrors);
    };
    if at.src != t.remote.ip() || at.dst != t.local || iface != t.outer {
        return Err(Counter::RxVxlanWrongSource);
    }
    if m.adj(start + vxlan::HEADER_LEN).is_err() {
        return Err(Counter::RxVxlanErrors);
    }
    m.clear_offload();
    Ok(inner)
}

/// The outer UDP source port of an inner frame: a hash of what names its
/// flow (MACs, EtherType, IP addresses and protocol, the first four bytes
/// after an IPv4 header without options or after the IPv6 header: the
/// ports of UDP and TCP) mapped onto 32768..=60999, Linux's ephemeral
/// range. An inner flow keeps its port; flows spread over paths.
fn source_port(frame: &[u8]) -> u16 {
    let field = |from: usize, to: usize| frame.get(from..to.min(frame.len())).unwrap_or(&[]);
    let ethertype = field(12, 14);
    let parts: [&[u8]; 4] = match ethertype {
        [0x08, 0x00] => [field(0, 14), field(23, 24), field(26, 34), field(34, 38)],
        [0x86, 0xdd] => [field(0, 14), field(20, 21), field(22, 54), field(54, 58)],
        _ => [field(0, 14), &[], &[], &[]],
    };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.iter().flat_map(|p| p.iter()) {
        h = (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    32768 + (h % (60999 - 32768 + 1)) as u16
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use spate_dpdk::RxChecksum;

    use super::*;
    use crate::buf::MemBuf;
    use crate::engine::parse::{self, Frame, Record};
    use crate::engine::testing::*;

    const VNI: u32 = 42;
    const PORT: u16 = 4789;

    /// Interface 0, and interface 1 the inner side of a tunnel to the
    /// peer's port 4789 over it.
    fn links() -> Vec<Interface> {
        let mut inner = Interface::new(1, u16::MAX, "vxlan42".into(), PEER_MAC, 1450, None, &[], &[]);
        let remote = SocketAddr::from((PEER4, PORT));
        inner.tunnel = Some(Tunnel { vni: VNI, remote, local_port: PORT, outer: 0, local: ADDR4.into() });
        vec![interface(), inner]
    }

    /// The frame `inner` in a VXLAN packet of `vni` from `src`, with the
    /// port's verdicts, where the datagram lies, and what remains once
    /// decapsulated.
    fn outer(src: SocketAddr, vni: u32, inner: &[u8]) -> (MemBuf, UdpInFrame) {
        let mut payload = vec![0; vxlan::HEADER_LEN];
        vxlan::Repr { vni }.emit(&mut payload);
        payload.extend_from_slice(inner);
        let mut m = udp_frame(src, (ADDR4, PORT).into(), &payload);
        m.rx_checksum = (RxChecksum::Good, RxChecksum::Good);
        m.rss = Some(0x1234);
        match parse::frame(&links()[0], m, &mut Record::default()) {
            Frame::Udp { m, at } => (m, at),
            other => panic!("not UDP: {other:?}"),
        }
    }

    fn inner_frame() -> Vec<u8> {
        udp_frame((Ipv4Addr::new(10, 0, 0, 2), 9).into(), (Ipv4Addr::new(10, 0, 0, 1), 9).into(), b"inner").to_vec()
    }

    #[test]
    fn a_tunnels_packet_leaves_its_inner_frame_for_the_inner_interface() {
        let (mut m, at) = outer((PEER4, 50000).into(), VNI, &inner_frame());
        assert_eq!(decapsulate(&links(), 0, PORT, &mut m, &at), Ok(1));
        assert_eq!(m.to_vec(), inner_frame());
        assert_eq!(m.rx_checksum, (RxChecksum::Unknown, RxChecksum::Unknown), "the verdicts were the outer packet's");
        assert_eq!(m.rss, None);
    }

    #[test]
    fn only_the_tunnels_remote_to_its_local_address_over_its_outer_interface() {
        let (mut m, at) = outer((Ipv4Addr::new(198, 18, 0, 3), 50000).into(), VNI, &inner_frame());
        assert_eq!(decapsulate(&links(), 0, PORT, &mut m, &at), Err(Counter::RxVxlanWrongSource));
        let (mut m, at) = outer((PEER4, 50000).into(), VNI, &inner_frame());
        assert_eq!(decapsulate(&links(), 2, PORT, &mut m, &at), Err(Counter::RxVxlanWrongSource), "another outer port");
        let other_dst = UdpInFrame { dst: Ipv4Addr::new(198, 18, 0, 7).into(), ..at };
        assert_eq!(decapsulate(&links(), 0, PORT, &mut m, &other_dst), Err(Counter::RxVxlanWrongSource));
        assert_eq!(m.pkt_len(), at.end, "a refused packet keeps its headers");
    }

    #[test]
    fn a_bad_vxlan_header_an_unknown_vni_or_a_short_inner_frame_is_an_error() {
        let from = SocketAddr::from((PEER4, 50000));
        let (mut m, at) = outer(from, VNI + 1, &inner_frame());
        assert_eq!(decapsulate(&links(), 0, PORT, &mut m, &at), Err(Counter::RxVxlanErrors), "unknown VNI");
        let (mut m, at) = outer(from, VNI, &inner_frame());
        assert_eq!(decapsulate(&links(), 0, PORT + 1, &mut m, &at), Err(Counter::RxVxlanErrors), "another port");
        let (m, at) = outer(from, VNI, &inner_frame());
        let mut no_i_flag = edited(&m, |b| b[at.l4 + udp::HEADER_LEN] = 0);
        assert_eq!(decapsulate(&links(), 0, PORT, &mut no_i_flag, &at), Err(Counter::RxVxlanErrors), "no I flag");
        let (mut m, at) = outer(from, VNI, &inner_frame()[..ethernet::HEADER_LEN - 1]);
        assert_eq!(
            decapsulate(&links(), 0, PORT, &mut m, &at),
            Err(Counter::RxVxlanErrors),
            "no inner Ethernet header"
        );
    }

    #[test]
    fn a_flow_keeps_its_source_port() {
        let mut a = vec![0u8; 64];
        a[12..14].copy_from_slice(&[0x08, 0x00]);
        a[23] = 17;
        a[26..34].copy_from_slice(&[198, 19, 0, 1, 198, 19, 0, 2]);
        a[34..38].copy_from_slice(&[0x9c, 0x40, 0, 7]);
        let mut b = a.clone();
        b[18..20].copy_from_slice(&[0x12, 0x34]); // another IP ID
        b[24..26].copy_from_slice(&[0xab, 0xcd]); // another header checksum
        b[50] = 99; // other payload
        assert_eq!(source_port(&a), source_port(&b));
        let mut c = a.clone();
        c[35] = 0x41; // another source port
        assert_ne!(source_port(&a), source_port(&c));
        assert!((32768..=60999).contains(&source_port(&a)));
        assert!((32768..=60999).contains(&source_port(&[1, 2, 3])));
    }
}

//! What the engine's unit tests share: an interface, and frames built in
//! memory with the header writers the transmit path uses ([`crate::hdr`]).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::buf::{MemBuf, PacketBuf};
use crate::config::Cidr;
use crate::hdr::{UdpHeaders, ethertype_for, push_udp_ip, push_untagged, untagged_header};
use crate::iface::Interface;
use crate::wire::{MacAddr, ipv4};

/// The interface's MAC, and the peer's.
pub const MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x01]);
pub const PEER_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x02]);
/// The interface's addresses (a /24 and a /64), and the peer's.
pub const ADDR4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const PEER4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
pub const ADDR6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
pub const PEER6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);

/// Interface 0: untagged, [`ADDR4`]/24 and [`ADDR6`]/64.
pub fn interface() -> Interface {
    let v4 = [Cidr { addr: ADDR4.into(), prefix_len: 24 }];
    let v6 = [Cidr { addr: ADDR6.into(), prefix_len: 64 }];
    Interface::new(0, 0, "test0".into(), MAC, 1500, None, &v4, &v6)
}

/// From the peer's port 5000 to the interface's port 7 (IPv4).
pub fn to_us4() -> (SocketAddr, SocketAddr) {
    ((PEER4, 5000).into(), (ADDR4, 7).into())
}

/// And over IPv6.
pub fn to_us6() -> (SocketAddr, SocketAddr) {
    ((PEER6, 5000).into(), (ADDR6, 7).into())
}

/// The headers a peer's datagram from `src` to `dst` gets.
pub fn headers(src: SocketAddr, dst: SocketAddr) -> UdpHeaders {
    UdpHeaders {
        src,
        dst,
        ident: 0x1234,
        dont_frag: false,
        ttl: 64,
        tos: 0,
        zero_checksum: false,
        known_checksum: None,
    }
}

/// An untagged frame from the peer to the interface's MAC carrying a UDP
/// datagram with `h`'s headers and `payload`, checksums computed.
pub fn frame_with(h: &UdpHeaders, payload: &[u8]) -> MemBuf {
    let mut m = MemBuf::new(payload);
    push_udp_ip(&mut m, h, false).expect("headroom");
    push_untagged(&mut m, &untagged_header(MAC, PEER_MAC, ethertype_for(&h.dst.ip()))).expect("headroom");
    m
}

/// [`frame_with`] with a peer's usual headers.
pub fn udp_frame(src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> MemBuf {
    frame_with(&headers(src, dst), payload)
}

/// The frame's bytes, changed by `f`, as a new buffer with the same
/// verdicts.
pub fn edited(m: &MemBuf, f: impl FnOnce(&mut Vec<u8>)) -> MemBuf {
    let mut bytes = m.to_vec();
    f(&mut bytes);
    let mut out = MemBuf::new(&bytes);
    out.rx_checksum = m.rx_checksum;
    out
}

/// Writes the IPv4 header checksum at `l3` again.
pub fn refill_ipv4_checksum(frame: &mut [u8], l3: usize) {
    ipv4::Packet::new_unchecked(&mut frame[l3..]).fill_checksum();
}

/// The bytes a buffer holds, after `from`.
pub fn bytes_from(m: &impl PacketBuf, from: usize) -> Vec<u8> {
    let all: Vec<u8> = m.segments().flatten().copied().collect();
    all[from..].to_vec()
}

//! What comes with a received datagram and goes with a send: addresses,
//! the interface, ECN, timestamps, GRO's and GSO's segment size.

use std::net::{IpAddr, SocketAddr};

/// What Linux's control messages tell of a received datagram, in one
/// value: [`Datagram::meta`](super::Datagram::meta), [`UdpSocket::recv_msg`](crate::UdpSocket::recv_msg).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvMeta {
    /// The sender (IPv4-mapped on an IPv6 socket).
    pub src: SocketAddr,
    /// The address and port it was sent to (`IP_PKTINFO`'s `ipi_addr`,
    /// `IPV6_PKTINFO`'s `ipi6_addr`): one of the stack's addresses, or a
    /// broadcast one.
    pub dst: SocketAddr,
    /// The interface it arrived on (an index of
    /// [`Stack::interfaces`](crate::Stack::interfaces)).
    pub iface: u16,
    /// TOS or traffic class: DSCP and ECN.
    pub tos: u8,
    /// TTL or hop limit.
    pub ttl: u8,
    /// The receive timestamp (`SO_TIMESTAMPNS`), when asked for.
    pub timestamp: Option<std::time::SystemTime>,
    /// The segment size of a coalesced datagram (UDP GRO's `UDP_GRO`
    /// control message).
    pub gso_size: Option<usize>,
}

impl RecvMeta {
    /// The ECN codepoint of [`tos`](Self::tos).
    pub fn ecn(&self) -> Ecn {
        Ecn::from_bits(self.tos)
    }
}

/// An ECN codepoint: the low two bits of the TOS byte or traffic class
/// (RFC 3168).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Ecn {
    /// Not ECN-capable transport.
    #[default]
    NotEct = 0,
    /// ECN-capable transport, ECT(1).
    Ect1 = 1,
    /// ECN-capable transport, ECT(0).
    Ect0 = 2,
    /// Congestion experienced.
    Ce = 3,
}

impl Ecn {
    /// The codepoint in the low two bits of `tos`.
    pub const fn from_bits(tos: u8) -> Ecn {
        match tos & 3 {
            0 => Ecn::NotEct,
            1 => Ecn::Ect1,
            2 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }
}

/// What one send says besides its payload and destination (the control
/// messages of Linux's `sendmsg`): [`UdpSocket::send_msg_to`](crate::UdpSocket::send_msg_to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendMeta {
    /// The source address (`IP_PKTINFO`'s `ipi_spec_dst`, `IPV6_PKTINFO`):
    /// one of the stack's addresses, of the destination's family (an
    /// IPv4-mapped one for an IPv4 destination of an IPv6 socket). `None`
    /// or the unspecified address: the socket's bound address, or the
    /// route's.
    pub src_ip: Option<IpAddr>,
    /// The ECN codepoint, in place of the low two bits of the socket's
    /// TOS or traffic class (`IP_TOS`/`IPV6_TCLASS` as a control message,
    /// how QUIC marks its packets).
    pub ecn: Option<Ecn>,
    /// The payload as datagrams of this many bytes each, the last one
    /// possibly shorter (`UDP_SEGMENT` as a control message, UDP GSO), in
    /// place of the socket's segment size.
    pub segment_size: Option<usize>,
    /// The TTL (IPv4: 1 to 255, 0 is `EINVAL`) or hop limit (IPv6: 0 to
    /// 255), in place of the socket's, multicast included (`IP_TTL`,
    /// `IPV6_HOPLIMIT` as control messages).
    pub ttl: Option<u8>,
}

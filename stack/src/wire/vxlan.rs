//! VXLAN (RFC 7348): the 8-byte header in front of a tunnelled Ethernet
//! frame, and what the tunnel adds in all.

use super::{ethernet, ipv4, udp};

/// Bytes of the VXLAN header.
pub const HEADER_LEN: usize = 8;
/// The I flag: the VNI is valid.
pub const FLAG_VNI: u8 = 0x08;

/// What VXLAN adds in front of an inner frame over IPv4 (over IPv6: 70).
pub const OVERHEAD_V4: u16 = (ethernet::HEADER_LEN + ipv4::HEADER_LEN + udp::HEADER_LEN + HEADER_LEN) as u16;

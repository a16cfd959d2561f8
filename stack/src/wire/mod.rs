//! Wire formats: zero-copy views over byte slices and typed representations.
//!
//! Each protocol has a `Packet<T: AsRef<[u8]>>` view (`new_unchecked`,
//! `new_checked`, `check_len`; after `check_len` succeeds no accessor
//! panics), field offsets in a private `field` module, and a `Repr` with
//! `parse`, `emit` and `buffer_len`. Parsing never allocates and never trusts
//! a length field it has not checked.

pub mod arp;
pub mod checksum;
pub mod ethernet;
pub mod icmpv4;
pub mod icmpv6;
pub mod igmp;
pub mod ipv4;
pub mod ipv6;
pub mod udp;
pub mod vxlan;

#[cfg(any(test, feature = "internals"))]
pub(crate) mod fixtures;
#[cfg(test)]
mod proptests;

pub use ethernet::MacAddr;

/// Why a buffer does not hold a valid packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than the header, or than a length field says.
    #[error("truncated")]
    Truncated,
    /// A field holds a value the format does not allow.
    #[error("malformed")]
    Malformed,
    /// The checksum does not match.
    #[error("bad checksum")]
    Checksum,
    /// Valid, but of a kind spate does not handle.
    #[error("unsupported")]
    Unsupported,
}

/// Result of parsing.
pub type Result<T> = core::result::Result<T, WireError>;

/// IP protocol numbers (and IPv6 next-header values) spate knows.
pub mod ip_proto {
    /// IPv6 hop-by-hop options.
    pub const HOP_BY_HOP: u8 = 0;
    /// ICMP.
    pub const ICMP: u8 = 1;
    /// IGMP.
    pub const IGMP: u8 = 2;
    /// UDP.
    pub const UDP: u8 = 17;
    /// IPv6 routing header.
    pub const ROUTING: u8 = 43;
    /// IPv6 fragment header.
    pub const FRAGMENT: u8 = 44;
    /// Encapsulating security payload.
    pub const ESP: u8 = 50;
    /// Authentication header.
    pub const AH: u8 = 51;
    /// ICMPv6.
    pub const ICMPV6: u8 = 58;
    /// No next header.
    pub const NO_NEXT: u8 = 59;
    /// IPv6 destination options.
    pub const DEST_OPTS: u8 = 60;
}

#[inline]
pub(crate) fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[inline]
pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
pub(crate) fn set_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn set_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

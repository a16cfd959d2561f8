//! IGMP (RFC 1112, RFC 2236, RFC 3376): a message's fixed part, the
//! message types, and an IGMPv3 query's length. Building the reports and
//! reading a query's meaning is `mcast::report`'s.

use std::net::Ipv4Addr;

use super::checksum::checksum;
use super::{Result, WireError, get_u16};

mod field {
    pub const TYPE: usize = 0;
    pub const MAX_RESP: usize = 1;
    pub const CHECKSUM: usize = 2;
    pub const GROUP: usize = 4;
}

/// IGMP's message types.
pub mod msg_type {
    /// A membership query (every version).
    pub const QUERY: u8 = 0x11;
    /// An IGMPv1 membership report.
    pub const V1_REPORT: u8 = 0x12;
    /// An IGMPv2 membership report.
    pub const V2_REPORT: u8 = 0x16;
    /// An IGMPv2 leave group.
    pub const V2_LEAVE: u8 = 0x17;
    /// An IGMPv3 membership report.
    pub const V3_REPORT: u8 = 0x22;
}

/// Bytes of an IGMPv1 or IGMPv2 message (and of every message's fixed
/// part).
pub const HEADER_LEN: usize = 8;
/// Bytes of an IGMPv3 query at least (RFC 3376 section 7.1: a query of 9
/// to 11 bytes is ignored).
pub const V3_QUERY_LEN: usize = 12;

/// A view of an IGMP message (the IPv4 payload).
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps without checking.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps and checks the length.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks that the fixed part fits.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    /// The message's length.
    pub fn len(&self) -> usize {
        self.buffer.as_ref().len()
    }

    /// Whether the message is empty (never, once checked).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The message type ([`msg_type`]).
    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }

    /// The Max Resp Code (IGMPv2: tenths of a second; IGMPv3: coded;
    /// IGMPv1: zero).
    pub fn max_resp_code(&self) -> u8 {
        self.buffer.as_ref()[field::MAX_RESP]
    }

    /// The checksum field.
    pub fn checksum(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// The group address (unspecified in a general query).
    pub fn group(&self) -> Ipv4Addr {
        let b = self.buffer.as_ref();
        Ipv4Addr::new(b[field::GROUP], b[field::GROUP + 1], b[field::GROUP + 2], b[field::GROUP + 3])
    }

    /// Whether the checksum over the whole message verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum(self.buffer.as_ref()) == 0
    }
}

/// Writes an IGMPv1 or IGMPv2 message (`msg_type`, Max Resp Code zero, the
/// group) with its checksum into the first [`HEADER_LEN`] bytes of `buf`.
pub fn emit_v2(buf: &mut [u8], msg_type: u8, group: Ipv4Addr) {
    let g = group.octets();
    buf[..HEADER_LEN].copy_from_slice(&[msg_type, 0, 0, 0, g[0], g[1], g[2], g[3]]);
    fill_checksum(&mut buf[..HEADER_LEN]);
}

/// Writes the checksum of the whole message `msg` (any version) into its
/// checksum field.
pub fn fill_checksum(msg: &mut [u8]) {
    msg[field::CHECKSUM..field::CHECKSUM + 2].fill(0);
    let c = checksum(msg);
    msg[field::CHECKSUM..field::CHECKSUM + 2].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_v2_report_reads_back() {
        let mut b = [0u8; HEADER_LEN];
        emit_v2(&mut b, msg_type::V2_REPORT, Ipv4Addr::new(239, 1, 2, 3));
        // RFC 2236's layout: type, max resp, checksum, group.
        assert_eq!(b[0], 0x16);
        assert_eq!(b[4..], [239, 1, 2, 3]);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum());
        assert_eq!((p.msg_type(), p.max_resp_code(), p.group()), (0x16, 0, Ipv4Addr::new(239, 1, 2, 3)));
        b[7] ^= 1;
        assert!(!Packet::new_unchecked(&b[..]).verify_checksum());
    }

    #[test]
    fn short_messages_are_refused() {
        assert_eq!(Packet::new_checked(&[0x11u8, 0, 0, 0, 0, 0, 0][..]).unwrap_err(), WireError::Truncated);
    }
}

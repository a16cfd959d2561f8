//! ARP for IPv4 over Ethernet (RFC 826).

use std::net::Ipv4Addr;

use super::{MacAddr, Result, WireError, get_u16, set_u16};

mod field {
    use std::ops::Range;
    pub const HTYPE: usize = 0;
    pub const PTYPE: usize = 2;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: usize = 6;
    pub const SHA: Range<usize> = 8..14;
    pub const SPA: Range<usize> = 14..18;
    pub const THA: Range<usize> = 18..24;
    pub const TPA: Range<usize> = 24..28;
}

/// Length of an Ethernet/IPv4 ARP packet.
pub const PACKET_LEN: usize = 28;

/// ARP operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Who has the target address?
    Request,
    /// The target is at this address.
    Reply,
}

/// A view of an ARP packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps without checks.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps a buffer long enough for an Ethernet/IPv4 ARP packet.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the length.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < PACKET_LEN { Err(WireError::Truncated) } else { Ok(()) }
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Hardware type (1 = Ethernet).
    pub fn htype(&self) -> u16 {
        get_u16(self.b(), field::HTYPE)
    }

    /// Protocol type (0x0800 = IPv4).
    pub fn ptype(&self) -> u16 {
        get_u16(self.b(), field::PTYPE)
    }

    /// Operation code.
    pub fn oper(&self) -> u16 {
        get_u16(self.b(), field::OPER)
    }

    /// Sender hardware address.
    pub fn sha(&self) -> MacAddr {
        MacAddr(self.b()[field::SHA].try_into().expect("6 bytes"))
    }

    /// Sender protocol address.
    pub fn spa(&self) -> Ipv4Addr {
        Ipv4Addr::from(<[u8; 4]>::try_from(&self.b()[field::SPA]).expect("4 bytes"))
    }

    /// Target hardware address.
    pub fn tha(&self) -> MacAddr {
        MacAddr(self.b()[field::THA].try_into().expect("6 bytes"))
    }

    /// Target protocol address.
    pub fn tpa(&self) -> Ipv4Addr {
        Ipv4Addr::from(<[u8; 4]>::try_from(&self.b()[field::TPA]).expect("4 bytes"))
    }
}

/// A parsed Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Request or reply.
    pub operation: Operation,
    /// Sender MAC.
    pub sender_mac: MacAddr,
    /// Sender IPv4 address.
    pub sender_ip: Ipv4Addr,
    /// Target MAC (zero in requests).
    pub target_mac: MacAddr,
    /// Target IPv4 address.
    pub target_ip: Ipv4Addr,
}

impl Repr {
    /// Parses; other hardware or protocol types are `Unsupported`.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        let b = p.b();
        if p.htype() != 1 || p.ptype() != 0x0800 || b[field::HLEN] != 6 || b[field::PLEN] != 4 {
            return Err(WireError::Unsupported);
        }
        let operation = match p.oper() {
            1 => Operation::Request,
            2 => Operation::Reply,
            _ => return Err(WireError::Unsupported),
        };
        Ok(Repr { operation, sender_mac: p.sha(), sender_ip: p.spa(), target_mac: p.tha(), target_ip: p.tpa() })
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        PACKET_LEN
    }

    /// Writes the packet into the start of `buf`.
    pub fn emit(&self, buf: &mut [u8]) {
        set_u16(buf, field::HTYPE, 1);
        set_u16(buf, field::PTYPE, 0x0800);
        buf[field::HLEN] = 6;
        buf[field::PLEN] = 4;
        set_u16(buf, field::OPER, if self.operation == Operation::Request { 1 } else { 2 });
        buf[field::SHA].copy_from_slice(&self.sender_mac.0);
        buf[field::SPA].copy_from_slice(&self.sender_ip.octets());
        buf[field::THA].copy_from_slice(&self.target_mac.0);
        buf[field::TPA].copy_from_slice(&self.target_ip.octets());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::wire::fixtures::{ARP_REPLY, ARP_REQUEST, hex};

    #[test]
    fn parses_captured_request_and_reply() {
        let req = hex(ARP_REQUEST);
        let r = Repr::parse(&Packet::new_checked(&req[14..]).unwrap()).unwrap();
        assert_eq!(r.operation, Operation::Request);
        assert_eq!(r.sender_ip, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(r.target_ip, Ipv4Addr::new(198, 18, 0, 2));
        let rep = hex(ARP_REPLY);
        let r = Repr::parse(&Packet::new_checked(&rep[14..]).unwrap()).unwrap();
        assert_eq!(r.operation, Operation::Reply);
        assert_eq!(r.sender_ip, Ipv4Addr::new(198, 18, 0, 2));
        assert_eq!(r.sender_mac, MacAddr([0x02, 0x53, 0x50, 0x41, 0x54, 0x45]));
        let mut out = [0u8; 28];
        r.emit(&mut out);
        assert_eq!(out[..], rep[14..]);
    }

    #[test]
    fn rejects_short_and_foreign() {
        let rep = hex(ARP_REPLY);
        let reply: [u8; 28] = rep[14..].try_into().unwrap();
        assert_eq!(Packet::new_checked(&reply[..27]).unwrap_err(), WireError::Truncated);
        let mut other = reply;
        other[1] = 6; // IEEE 802 hardware
        assert_eq!(Repr::parse(&Packet::new_unchecked(&other[..])).unwrap_err(), WireError::Unsupported);
        let mut bad_op = reply;
        bad_op[7] = 9;
        assert_eq!(Repr::parse(&Packet::new_unchecked(&bad_op[..])).unwrap_err(), WireError::Unsupported);
    }
}

//! IPv4 headers (RFC 791). Options are skipped, not interpreted.

use std::net::Ipv4Addr;

use super::checksum;
use super::{Result, WireError, get_u16, set_u16};

mod field {
    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const LENGTH: usize = 2;
    pub const IDENT: usize = 4;
    pub const FLG_OFF: usize = 6;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: usize = 10;
    pub const SRC: usize = 12;
    pub const DST: usize = 16;
}

/// Length of a header without options.
pub const HEADER_LEN: usize = 20;
/// Largest total length.
pub const MAX_PACKET_LEN: usize = 65535;

pub(crate) const DF: u16 = 0x4000;
const MF: u16 = 0x2000;
const OFFSET_MASK: u16 = 0x1fff;

/// A view of an IPv4 packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps without checks.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps a buffer after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks that the buffer holds a 20-byte header, that the header
    /// length is at least 20 and fits, and that the total length covers the
    /// header and fits in the buffer (padding after it is allowed).
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let ihl = self.header_len();
        if ihl < HEADER_LEN {
            return Err(WireError::Malformed);
        }
        let total = self.total_len() as usize;
        if total < ihl {
            return Err(WireError::Malformed);
        }
        if b.len() < ihl || b.len() < total {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Version field (4 for IPv4).
    pub fn version(&self) -> u8 {
        self.b()[field::VER_IHL] >> 4
    }

    /// Header length in bytes.
    pub fn header_len(&self) -> usize {
        ((self.b()[field::VER_IHL] & 0x0f) as usize) * 4
    }

    /// DSCP and ECN.
    pub fn tos(&self) -> u8 {
        self.b()[field::TOS]
    }

    /// Total length.
    pub fn total_len(&self) -> u16 {
        get_u16(self.b(), field::LENGTH)
    }

    /// Identification.
    pub fn ident(&self) -> u16 {
        get_u16(self.b(), field::IDENT)
    }

    /// Don't-fragment flag.
    pub fn dont_frag(&self) -> bool {
        get_u16(self.b(), field::FLG_OFF) & DF != 0
    }

    /// More-fragments flag.
    pub fn more_frags(&self) -> bool {
        get_u16(self.b(), field::FLG_OFF) & MF != 0
    }

    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> u32 {
        ((get_u16(self.b(), field::FLG_OFF) & OFFSET_MASK) as u32) * 8
    }

    /// Whether this is a fragment (MF set or a non-zero offset).
    pub fn is_fragment(&self) -> bool {
        get_u16(self.b(), field::FLG_OFF) & (MF | OFFSET_MASK) != 0
    }

    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.b()[field::TTL]
    }

    /// Protocol of the payload.
    pub fn protocol(&self) -> u8 {
        self.b()[field::PROTOCOL]
    }

    /// Header checksum field.
    pub fn checksum(&self) -> u16 {
        get_u16(self.b(), field::CHECKSUM)
    }

    /// Source address.
    pub fn src(&self) -> Ipv4Addr {
        Ipv4Addr::from(<[u8; 4]>::try_from(&self.b()[field::SRC..field::SRC + 4]).expect("4 bytes"))
    }

    /// Destination address.
    pub fn dst(&self) -> Ipv4Addr {
        Ipv4Addr::from(<[u8; 4]>::try_from(&self.b()[field::DST..field::DST + 4]).expect("4 bytes"))
    }

    /// Whether the header checksum is right (always inlined, as UDP's).
    #[inline(always)]
    pub fn verify_checksum(&self) -> bool {
        let b = self.b();
        if self.header_len() == HEADER_LEN {
            // The usual 20 bytes as five 32-bit words.
            let w = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]) as u64;
            return checksum::fold(w(0) + w(4) + w(8) + w(12) + w(16)) == 0xffff;
        }
        checksum::fold(checksum::sum(&b[..self.header_len()])) == 0xffff
    }

    /// The payload (after the header, up to the total length).
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..self.total_len() as usize]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets the TTL.
    pub fn set_ttl(&mut self, ttl: u8) {
        self.bm()[field::TTL] = ttl;
    }

    /// Sets the source address.
    pub fn set_src(&mut self, a: Ipv4Addr) {
        self.bm()[field::SRC..field::SRC + 4].copy_from_slice(&a.octets());
    }

    /// Sets the destination address.
    pub fn set_dst(&mut self, a: Ipv4Addr) {
        self.bm()[field::DST..field::DST + 4].copy_from_slice(&a.octets());
    }

    /// Sets the identification.
    pub fn set_ident(&mut self, id: u16) {
        set_u16(self.bm(), field::IDENT, id);
    }

    /// Sets the total length.
    pub fn set_total_len(&mut self, len: u16) {
        set_u16(self.bm(), field::LENGTH, len);
    }

    /// Sets flags and offset: `offset` in bytes (a multiple of 8).
    pub fn set_frag(&mut self, dont_frag: bool, more_frags: bool, offset: u32) {
        let v =
            (if dont_frag { DF } else { 0 }) | (if more_frags { MF } else { 0 }) | ((offset / 8) as u16 & OFFSET_MASK);
        set_u16(self.bm(), field::FLG_OFF, v);
    }

    /// Sets the checksum field.
    pub fn set_checksum(&mut self, c: u16) {
        set_u16(self.bm(), field::CHECKSUM, c);
    }

    /// Computes and writes the header checksum.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let len = self.header_len();
        let c = checksum::checksum(&self.buffer.as_ref()[..len]);
        self.set_checksum(c);
    }
}

/// A parsed IPv4 header (without options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Source.
    pub src: Ipv4Addr,
    /// Destination.
    pub dst: Ipv4Addr,
    /// Payload protocol.
    pub protocol: u8,
    /// Payload length.
    pub payload_len: u16,
    /// Time to live.
    pub ttl: u8,
    /// DSCP and ECN.
    pub tos: u8,
    /// Identification.
    pub ident: u16,
    /// Don't fragment.
    pub dont_frag: bool,
    /// More fragments.
    pub more_frags: bool,
    /// Fragment offset in bytes.
    pub frag_offset: u32,
}

impl Repr {
    /// Parses a packet, checking version and header checksum unless
    /// `checksum_verified` (the port checked it).
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>, checksum_verified: bool) -> Result<Repr> {
        p.check_len()?;
        if p.version() != 4 {
            return Err(WireError::Malformed);
        }
        if !checksum_verified && !p.verify_checksum() {
            return Err(WireError::Checksum);
        }
        Ok(Repr {
            src: p.src(),
            dst: p.dst(),
            protocol: p.protocol(),
            payload_len: p.total_len() - p.header_len() as u16,
            ttl: p.ttl(),
            tos: p.tos(),
            ident: p.ident(),
            dont_frag: p.dont_frag(),
            more_frags: p.more_frags(),
            frag_offset: p.frag_offset(),
        })
    }

    /// Header length `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes a 20-byte header into the start of `buf`; the checksum is
    /// computed unless `offload` (the port fills it; the field stays 0).
    /// The checksum is summed from the fields, not read back from `buf`:
    /// an 8-byte load over the bytes just stored one or two at a time
    /// cannot be forwarded from the store buffer and stalls.
    #[inline]
    pub fn emit(&self, buf: &mut [u8], offload: bool) {
        let length = self.payload_len + HEADER_LEN as u16;
        let frag = (if self.dont_frag { DF } else { 0 })
            | (if self.more_frags { MF } else { 0 })
            | ((self.frag_offset / 8) as u16 & OFFSET_MASK);
        let (src, dst) = (u32::from(self.src), u32::from(self.dst));
        buf[field::VER_IHL] = 0x45;
        buf[field::TOS] = self.tos;
        set_u16(buf, field::LENGTH, length);
        set_u16(buf, field::IDENT, self.ident);
        set_u16(buf, field::FLG_OFF, frag);
        buf[field::TTL] = self.ttl;
        buf[field::PROTOCOL] = self.protocol;
        buf[field::SRC..field::SRC + 4].copy_from_slice(&src.to_be_bytes());
        buf[field::DST..field::DST + 4].copy_from_slice(&dst.to_be_bytes());
        let c = if offload {
            0
        } else {
            let words = (0x4500 | self.tos as u64)
                + length as u64
                + self.ident as u64
                + frag as u64
                + ((self.ttl as u64) << 8 | self.protocol as u64)
                + (src >> 16) as u64
                + (src & 0xffff) as u64
                + (dst >> 16) as u64
                + (dst & 0xffff) as u64;
            !checksum::fold(words)
        };
        set_u16(buf, field::CHECKSUM, c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::wire::fixtures::{UDP4, hex};

    fn udp_packet() -> Vec<u8> {
        hex(UDP4)[14..].to_vec()
    }

    #[test]
    fn parses_a_captured_packet() {
        let pkt = udp_packet();
        let p = Packet::new_checked(&pkt[..]).unwrap();
        let r = Repr::parse(&p, false).unwrap();
        assert_eq!(r.src, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(r.dst, Ipv4Addr::new(198, 18, 0, 2));
        assert_eq!(r.protocol, 17);
        assert_eq!(r.payload_len, 12);
        assert!(r.dont_frag && !r.more_frags && r.frag_offset == 0);
        assert!(!p.is_fragment());
        let mut out = [0u8; 20];
        r.emit(&mut out, false);
        assert_eq!(out[..], pkt[..20]);
    }

    #[test]
    fn length_and_checksum_errors() {
        let pkt = udp_packet();
        let packet: [u8; 32] = pkt[..].try_into().unwrap();
        assert_eq!(Packet::new_checked(&packet[..19]).unwrap_err(), WireError::Truncated);
        let mut ihl4 = packet;
        ihl4[0] = 0x44;
        assert_eq!(Packet::new_checked(&ihl4[..]).unwrap_err(), WireError::Malformed);
        let mut long = packet;
        long[3] = 0x40; // total length 64 > 32 bytes present
        assert_eq!(Packet::new_checked(&long[..]).unwrap_err(), WireError::Truncated);
        let mut short = packet;
        short[3] = 0x10; // total length 16 < header
        assert_eq!(Packet::new_checked(&short[..]).unwrap_err(), WireError::Malformed);
        let mut bad = packet;
        bad[11] ^= 1;
        assert_eq!(Repr::parse(&Packet::new_checked(&bad[..]).unwrap(), false).unwrap_err(), WireError::Checksum);
        assert!(Repr::parse(&Packet::new_checked(&bad[..]).unwrap(), true).is_ok(), "offload said good");
        let mut v6 = packet;
        v6[0] = 0x65;
        assert_eq!(Repr::parse(&Packet::new_checked(&v6[..]).unwrap(), true).unwrap_err(), WireError::Malformed);
    }

    #[test]
    fn options_are_skipped() {
        let packet = udp_packet();
        let mut with_opts = vec![0x46u8];
        with_opts.extend_from_slice(&packet[1..20]);
        with_opts.extend_from_slice(&[1, 1, 1, 0]); // NOP NOP NOP EOL
        with_opts.extend_from_slice(&packet[20..]);
        with_opts[3] = 36;
        let mut p = Packet::new_checked(&mut with_opts[..]).unwrap();
        p.fill_checksum();
        let r = Repr::parse(&p, false).unwrap();
        assert_eq!(p.header_len(), 24);
        assert_eq!(r.payload_len, 12);
        assert_eq!(&p.payload()[8..], b"ping");
    }
}

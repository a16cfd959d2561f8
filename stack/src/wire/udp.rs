//! UDP (RFC 768; over IPv6, RFC 8200 section 8.1: a zero checksum is invalid).

use std::net::IpAddr;

use super::checksum;
use super::{Result, WireError, get_u16, ip_proto, set_u16};

mod field {
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    pub const LENGTH: usize = 4;
    pub const CHECKSUM: usize = 6;
}

/// Header length.
pub const HEADER_LEN: usize = 8;

/// A view of a UDP datagram.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps without checks.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks that the header fits and that the length field is at least 8
    /// and no more than the buffer.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let l = self.len() as usize;
        if l < HEADER_LEN {
            return Err(WireError::Malformed);
        }
        if l > len {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        get_u16(self.b(), field::SRC_PORT)
    }

    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        get_u16(self.b(), field::DST_PORT)
    }

    /// Length field (header included).
    pub fn len(&self) -> u16 {
        get_u16(self.b(), field::LENGTH)
    }

    /// Whether the length field says there is no payload.
    pub fn is_empty(&self) -> bool {
        self.len() as usize == HEADER_LEN
    }

    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        get_u16(self.b(), field::CHECKSUM)
    }

    /// The payload, as long as the length field says.
    pub fn payload(&self) -> &[u8] {
        &self.b()[HEADER_LEN..self.len() as usize]
    }

    /// Verifies the checksum over the pseudo-header and the datagram as the
    /// length field delimits it. A zero checksum passes over IPv4 (none
    /// sent) and fails over IPv6. Always inlined: the receive path has a
    /// copy with the GRO stage and one without, and each keeps it inline.
    #[inline(always)]
    pub fn verify_checksum(&self, src: &IpAddr, dst: &IpAddr) -> bool {
        if self.checksum() == 0 {
            return src.is_ipv4();
        }
        let len = self.len();
        let acc = pseudo_header(src, dst, len) + checksum::sum(&self.b()[..len as usize]);
        checksum::fold(acc) == 0xffff
    }

    /// Whether the checksum field holds only the pseudo-header's sum: what
    /// a Linux sender writes when it leaves the rest to an offload
    /// (`CHECKSUM_PARTIAL`), and what a frame handed over before that
    /// offload ran (a veth's peer, read by a packet or XDP socket) carries.
    pub fn is_partial_checksum(&self, src: &IpAddr, dst: &IpAddr) -> bool {
        self.checksum() == checksum::fold(pseudo_header(src, dst, self.len()))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the source port.
    pub fn set_src_port(&mut self, p: u16) {
        set_u16(self.buffer.as_mut(), field::SRC_PORT, p);
    }

    /// Sets the destination port.
    pub fn set_dst_port(&mut self, p: u16) {
        set_u16(self.buffer.as_mut(), field::DST_PORT, p);
    }

    /// Sets the checksum field.
    pub fn set_checksum(&mut self, c: u16) {
        set_u16(self.buffer.as_mut(), field::CHECKSUM, c);
    }
}

/// The pseudo-header sum for a UDP datagram of `udp_len` bytes.
#[inline]
pub fn pseudo_header(src: &IpAddr, dst: &IpAddr, udp_len: u16) -> u64 {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => checksum::pseudo_header_v4(*s, *d, ip_proto::UDP, udp_len as u32),
        (IpAddr::V6(s), IpAddr::V6(d)) => checksum::pseudo_header_v6(s, d, ip_proto::UDP, udp_len as u32),
        _ => 0,
    }
}

/// The checksum field value for a datagram whose header (checksum field
/// zero) and payload sum to `data_sum`: never 0, which means "none".
#[inline]
pub fn finish_checksum(pseudo: u64, data_sum: u64) -> u16 {
    match !checksum::fold(pseudo + data_sum) {
        0 => 0xffff,
        c => c,
    }
}

/// A parsed UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Payload length.
    pub payload_len: u16,
}

impl Repr {
    /// Parses a datagram, verifying its checksum unless `checksum_verified`.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>, src: &IpAddr, dst: &IpAddr, checksum_verified: bool) -> Result<Repr> {
        p.check_len()?;
        if !checksum_verified && !p.verify_checksum(src, dst) {
            return Err(WireError::Checksum);
        }
        Ok(Repr { src_port: p.src_port(), dst_port: p.dst_port(), payload_len: p.len() - HEADER_LEN as u16 })
    }

    /// Header length.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header into `header` (8 bytes); the checksum field gets
    /// `checksum` (computed by the caller over the payload, or the
    /// pseudo-header sum alone when the port offloads it).
    pub fn emit(&self, header: &mut [u8], checksum: u16) {
        set_u16(header, field::SRC_PORT, self.src_port);
        set_u16(header, field::DST_PORT, self.dst_port);
        set_u16(header, field::LENGTH, self.payload_len + HEADER_LEN as u16);
        set_u16(header, field::CHECKSUM, checksum);
    }

    /// Writes header and checksum over a contiguous `datagram` whose
    /// payload is already in place after the first 8 bytes.
    pub fn emit_with_checksum(&self, datagram: &mut [u8], src: &IpAddr, dst: &IpAddr) {
        self.emit(datagram, 0);
        let len = self.payload_len + HEADER_LEN as u16;
        let c = finish_checksum(pseudo_header(src, dst, len), checksum::sum(&datagram[..len as usize]));
        set_u16(datagram, field::CHECKSUM, c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixtures::{UDP4, UDP6, hex};

    fn addrs(a: &str, b: &str) -> (IpAddr, IpAddr) {
        (a.parse().unwrap(), b.parse().unwrap())
    }

    #[test]
    fn parses_captured_v4_and_v6() {
        for (fx, src, dst, ip_len) in [(UDP4, "198.18.0.1", "198.18.0.2", 20), (UDP6, "fd00::1", "fd00::2", 40)] {
            let f = hex(fx);
            let (s, d) = addrs(src, dst);
            let dg = &f[14 + ip_len..];
            let p = Packet::new_checked(dg).unwrap();
            let r = Repr::parse(&p, &s, &d, false).unwrap();
            assert_eq!(r, Repr { src_port: 40000, dst_port: 7, payload_len: 4 });
            assert_eq!(p.payload(), b"ping");
            let mut out = dg.to_vec();
            out[6] = 0;
            out[7] = 0;
            r.emit_with_checksum(&mut out, &s, &d);
            assert_eq!(out, dg, "checksum recomputed as Linux did");
        }
    }

    #[test]
    fn zero_checksum_rules() {
        let f = hex(UDP4);
        let mut dg = f[34..].to_vec();
        dg[6] = 0;
        dg[7] = 0;
        let (s, d) = addrs("198.18.0.1", "198.18.0.2");
        assert!(Repr::parse(&Packet::new_checked(&dg[..]).unwrap(), &s, &d, false).is_ok(), "IPv4 allows none");
        let (s6, d6) = addrs("fd00::1", "fd00::2");
        assert_eq!(
            Repr::parse(&Packet::new_checked(&dg[..]).unwrap(), &s6, &d6, false).unwrap_err(),
            WireError::Checksum
        );
    }

    #[test]
    fn length_errors() {
        let f = hex(UDP4);
        let dg = &f[34..];
        assert_eq!(Packet::new_checked(&dg[..7]).unwrap_err(), WireError::Truncated);
        assert_eq!(Packet::new_checked(&dg[..11]).unwrap_err(), WireError::Truncated, "length field 12 > 11 bytes");
        let mut small = dg.to_vec();
        small[5] = 7;
        assert_eq!(Packet::new_checked(&small[..]).unwrap_err(), WireError::Malformed);
        let mut bad = dg.to_vec();
        bad[9] ^= 0x20;
        let (s, d) = addrs("198.18.0.1", "198.18.0.2");
        assert_eq!(
            Repr::parse(&Packet::new_checked(&bad[..]).unwrap(), &s, &d, false).unwrap_err(),
            WireError::Checksum
        );
    }
}

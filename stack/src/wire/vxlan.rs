//! VXLAN (RFC 7348): the 8-byte header in front of a tunnelled Ethernet
//! frame, and what the tunnel adds in all.

use super::{Result, WireError, ethernet, ipv4, udp};

mod field {
    pub const FLAGS: usize = 0;
    pub const VNI: usize = 4;
}

/// Bytes of the VXLAN header.
pub const HEADER_LEN: usize = 8;
/// The I flag: the VNI is valid.
pub const FLAG_VNI: u8 = 0x08;

/// What VXLAN adds in front of an inner frame over IPv4 (over IPv6: 70).
pub const OVERHEAD_V4: u16 = (ethernet::HEADER_LEN + ipv4::HEADER_LEN + udp::HEADER_LEN + HEADER_LEN) as u16;

/// A view of a VXLAN header and the inner frame behind it (the UDP
/// payload).
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

    /// Checks that the header fits.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    /// The flags byte.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }

    /// The 24-bit VXLAN network identifier.
    pub fn vni(&self) -> u32 {
        let b = self.buffer.as_ref();
        u32::from_be_bytes([0, b[field::VNI], b[field::VNI + 1], b[field::VNI + 2]])
    }

    /// The inner Ethernet frame.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

/// A VXLAN header: its network identifier (the I flag always set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// The VNI (24 bits).
    pub vni: u32,
}

impl Repr {
    /// Parses a header whose length was checked: one without the I flag
    /// carries no VNI, and is malformed.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        if p.flags() & FLAG_VNI == 0 {
            return Err(WireError::Malformed);
        }
        Ok(Repr { vni: p.vni() })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `buf`:
    /// the I flag, the VNI, the reserved fields zero.
    pub fn emit(&self, buf: &mut [u8]) {
        let v = self.vni.to_be_bytes();
        buf[..HEADER_LEN].copy_from_slice(&[FLAG_VNI, 0, 0, 0, v[1], v[2], v[3], 0]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        // RFC 7348's layout: flags 0x08, 24 reserved bits, VNI 0x123456,
        // 8 reserved bits; then the inner frame.
        let mut b = [0u8; HEADER_LEN + ethernet::HEADER_LEN];
        Repr { vni: 0x12_3456 }.emit(&mut b);
        assert_eq!(b[..HEADER_LEN], [0x08, 0, 0, 0, 0x12, 0x34, 0x56, 0]);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Repr::parse(&p), Ok(Repr { vni: 0x12_3456 }));
        assert_eq!(p.payload().len(), ethernet::HEADER_LEN);
    }

    #[test]
    fn short_or_flagless_headers_are_refused() {
        assert_eq!(Packet::new_checked(&[0x08u8, 0, 0, 0, 0, 0, 1][..]).unwrap_err(), WireError::Truncated);
        let p = Packet::new_checked(&[0u8, 0, 0, 0, 0, 0, 1, 0][..]).unwrap();
        assert_eq!(Repr::parse(&p), Err(WireError::Malformed));
    }
}

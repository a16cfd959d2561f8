//! Ethernet II frames, with an optional 802.1Q tag.

use super::{Result, WireError, get_u16, set_u16};

/// A MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    /// 00:00:00:00:00:00.
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    /// Whether it is the broadcast address.
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// Whether the group bit is set (multicast or broadcast).
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }

    /// Whether it is a unicast address.
    pub fn is_unicast(&self) -> bool {
        !self.is_multicast()
    }

    /// The IPv6 multicast MAC address for a group (33:33 + its last 32 bits).
    pub fn ipv6_multicast(group: &std::net::Ipv6Addr) -> MacAddr {
        let o = group.octets();
        MacAddr([0x33, 0x33, o[12], o[13], o[14], o[15]])
    }
}

impl std::fmt::Display for MacAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3], b[4], b[5])
    }
}

impl std::fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl<'de> serde::Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(|_| serde::de::Error::custom(format!("{s:?} is not a MAC address")))
    }
}

impl std::str::FromStr for MacAddr {
    type Err = WireError;

    fn from_str(s: &str) -> Result<MacAddr> {
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for b in &mut out {
            let p = parts.next().ok_or(WireError::Malformed)?;
            *b = u8::from_str_radix(p, 16).map_err(|_| WireError::Malformed)?;
        }
        if parts.next().is_some() {
            return Err(WireError::Malformed);
        }
        Ok(MacAddr(out))
    }
}

/// EtherType values spate handles.
pub mod ethertype {
    /// IPv4.
    pub const IPV4: u16 = 0x0800;
    /// ARP.
    pub const ARP: u16 = 0x0806;
    /// 802.1Q VLAN tag.
    pub const VLAN: u16 = 0x8100;
    /// IPv6.
    pub const IPV6: u16 = 0x86dd;
}

mod field {
    use std::ops::Range;
    pub const DST: Range<usize> = 0..6;
    pub const SRC: Range<usize> = 6..12;
    pub const ETHERTYPE: usize = 12;
    pub const VLAN_TCI: usize = 14;
    pub const VLAN_ETHERTYPE: usize = 16;
}

/// Length of an untagged header.
pub const HEADER_LEN: usize = 14;
/// Length of a header with one 802.1Q tag.
pub const VLAN_HEADER_LEN: usize = 18;

/// A view of an Ethernet frame.
#[derive(Debug, Clone)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps a buffer without checks.
    pub const fn new_unchecked(buffer: T) -> Frame<T> {
        Frame { buffer }
    }

    /// Wraps a buffer that holds the whole header (tag included).
    pub fn new_checked(buffer: T) -> Result<Frame<T>> {
        let f = Self::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
    }

    /// Checks that the header, and a VLAN tag if announced, fit.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if get_u16(self.buffer.as_ref(), field::ETHERTYPE) == ethertype::VLAN && len < VLAN_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    /// The buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Destination address.
    pub fn dst(&self) -> MacAddr {
        MacAddr(self.buffer.as_ref()[field::DST].try_into().expect("6 bytes"))
    }

    /// Source address.
    pub fn src(&self) -> MacAddr {
        MacAddr(self.buffer.as_ref()[field::SRC].try_into().expect("6 bytes"))
    }

    /// The outer EtherType (0x8100 for a tagged frame).
    pub fn outer_ethertype(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::ETHERTYPE)
    }

    /// The VLAN id of a tagged frame.
    pub fn vlan_id(&self) -> Option<u16> {
        (self.outer_ethertype() == ethertype::VLAN).then(|| get_u16(self.buffer.as_ref(), field::VLAN_TCI) & 0x0fff)
    }

    /// The EtherType of the payload (behind the tag, if any).
    pub fn ethertype(&self) -> u16 {
        match self.outer_ethertype() {
            ethertype::VLAN => get_u16(self.buffer.as_ref(), field::VLAN_ETHERTYPE),
            t => t,
        }
    }

    /// Header length: 14, or 18 with a tag.
    pub fn header_len(&self) -> usize {
        if self.outer_ethertype() == ethertype::VLAN { VLAN_HEADER_LEN } else { HEADER_LEN }
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Sets the destination.
    pub fn set_dst(&mut self, a: MacAddr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&a.0);
    }

    /// Sets the source.
    pub fn set_src(&mut self, a: MacAddr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&a.0);
    }

    /// Sets the outer EtherType.
    pub fn set_ethertype(&mut self, t: u16) {
        set_u16(self.buffer.as_mut(), field::ETHERTYPE, t);
    }
}

/// A parsed Ethernet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Source.
    pub src: MacAddr,
    /// Destination.
    pub dst: MacAddr,
    /// Payload EtherType.
    pub ethertype: u16,
    /// 802.1Q VLAN id (the priority bits are not kept).
    pub vlan: Option<u16>,
}

impl Repr {
    /// Parses a checked frame.
    pub fn parse<T: AsRef<[u8]>>(f: &Frame<T>) -> Result<Repr> {
        f.check_len()?;
        Ok(Repr { src: f.src(), dst: f.dst(), ethertype: f.ethertype(), vlan: f.vlan_id() })
    }

    /// Header length.
    pub const fn buffer_len(&self) -> usize {
        if self.vlan.is_some() { VLAN_HEADER_LEN } else { HEADER_LEN }
    }

    /// Writes the header into the start of `buf` (at least `buffer_len` bytes).
    pub fn emit(&self, buf: &mut [u8]) {
        buf[field::DST].copy_from_slice(&self.dst.0);
        buf[field::SRC].copy_from_slice(&self.src.0);
        match self.vlan {
            Some(id) => {
                set_u16(buf, field::ETHERTYPE, ethertype::VLAN);
                set_u16(buf, field::VLAN_TCI, id & 0x0fff);
                set_u16(buf, field::VLAN_ETHERTYPE, self.ethertype);
            }
            None => set_u16(buf, field::ETHERTYPE, self.ethertype),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_captured_frame() {
        let frame = crate::wire::fixtures::hex(crate::wire::fixtures::ARP_REQUEST);
        let f = Frame::new_checked(&frame[..]).unwrap();
        let r = Repr::parse(&f).unwrap();
        assert_eq!(r.dst, MacAddr::BROADCAST);
        assert_eq!(r.src, "6a:1f:3c:55:10:9e".parse().unwrap());
        assert_eq!(r.ethertype, ethertype::ARP);
        assert_eq!(r.vlan, None);
        assert_eq!(f.payload().len(), 28);
    }

    #[test]
    fn vlan_tag_round_trip() {
        let r = Repr {
            src: MacAddr([2, 0, 0, 0, 0, 1]),
            dst: MacAddr::BROADCAST,
            ethertype: ethertype::IPV4,
            vlan: Some(42),
        };
        let mut buf = [0u8; 18];
        r.emit(&mut buf);
        let f = Frame::new_checked(&buf[..]).unwrap();
        assert_eq!(Repr::parse(&f).unwrap(), r);
        assert_eq!(f.header_len(), 18);
        assert_eq!(Frame::new_checked(&buf[..16]).unwrap_err(), WireError::Truncated);
        assert_eq!(Frame::new_checked(&buf[..13]).unwrap_err(), WireError::Truncated);
    }

    #[test]
    fn mac_addresses() {
        assert!(MacAddr::BROADCAST.is_broadcast() && MacAddr::BROADCAST.is_multicast());
        let g: std::net::Ipv6Addr = "ff02::1:ff00:2".parse().unwrap();
        assert_eq!(MacAddr::ipv6_multicast(&g), MacAddr([0x33, 0x33, 0xff, 0, 0, 2]));
        assert!("02:00:00:00:00".parse::<MacAddr>().is_err());
        assert_eq!(MacAddr([2, 0x53, 0x50, 0x41, 0x54, 0x45]).to_string(), "02:53:50:41:54:45");
    }
}

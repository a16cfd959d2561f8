//! Where a UDP datagram sits in its frame: what the classification stage
//! hands the later stages ([`UdpInFrame`]), and how a reassembled
//! datagram's offsets travel to the lcore owning its flow ([`Handed`]).

use std::net::IpAddr;

/// Where a UDP datagram sits in its frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UdpInFrame {
    /// Offset of the IP header.
    pub l3: usize,
    /// Offset of the UDP header.
    pub l4: usize,
    /// End of the IP packet.
    pub end: usize,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Sent to a broadcast or multicast address.
    pub group: bool,
}

/// A reassembled datagram's offsets as they ride in the mbuf's 32-bit
/// hash field to the lcore owning its flow (software RSS): the IP header's
/// offset in 5 bits, the UDP header's in 11, the UDP datagram's length in
/// 16. A datagram whose headers lie further in is not handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handed {
    /// Offset of the IP header.
    pub l3: usize,
    /// Offset of the UDP header.
    pub l4: usize,
    /// Length of the UDP datagram, header included.
    pub len: u32,
}

impl Handed {
    /// The packed form, or none when an offset does not fit.
    #[inline]
    pub fn encode(self) -> Option<u32> {
        if self.l3 >= 1 << 5 || self.l4 >= 1 << 11 || self.len > 0xffff {
            return None;
        }
        Some((self.l3 as u32) << 27 | (self.l4 as u32) << 16 | self.len)
    }

    /// The offsets [`encode`](Self::encode) packed.
    #[inline]
    pub fn decode(packed: u32) -> Handed {
        Handed { l3: (packed >> 27) as usize, l4: (packed >> 16 & 0x7ff) as usize, len: packed & 0xffff }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_round_trip_up_to_their_widths() {
        for h in [
            Handed { l3: 14, l4: 34, len: 8 },
            Handed { l3: 18, l4: 58, len: 65_515 },
            Handed { l3: 31, l4: 2047, len: 0xffff },
            Handed { l3: 0, l4: 0, len: 0 },
        ] {
            let packed = h.encode().expect("fits");
            assert_eq!(Handed::decode(packed), h, "{packed:#x}");
        }
        // Each field in its own bits: one changed changes only itself.
        let a = Handed { l3: 14, l4: 34, len: 100 }.encode().unwrap();
        let b = Handed { l3: 14, l4: 35, len: 100 }.encode().unwrap();
        assert_eq!(a ^ b, (34 ^ 35) << 16);
    }

    #[test]
    fn offsets_too_wide_are_not_packed() {
        assert_eq!(Handed { l3: 32, l4: 52, len: 8 }.encode(), None);
        assert_eq!(Handed { l3: 14, l4: 2048, len: 8 }.encode(), None);
        assert_eq!(Handed { l3: 14, l4: 34, len: 0x1_0000 }.encode(), None);
    }
}

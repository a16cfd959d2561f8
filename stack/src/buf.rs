//! The buffer the datapath's stages work on: [`PacketBuf`], which DPDK's
//! [`Mbuf`] implements (generic code over it is monomorphized: over `Mbuf`
//! it compiles to what it was written against `Mbuf`), and [`MemBuf`], a
//! buffer in memory with an mbuf's rules for room, so a stage can be
//! unit-tested without an EAL.

use spate_dpdk::{Mbuf, RxChecksum};

/// A buffer had no room (headroom, or bytes) for what was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoRoom;

/// What the datapath's stages ask of a packet buffer: its segments' bytes,
/// room in front, cutting bytes off either end, the port's verdicts and
/// the offload flags. The header writing of [`crate::hdr`], the receive
/// path's parsing (`engine/parse.rs`, the fast path's) and decapsulation
/// work over it.
pub trait PacketBuf {
    /// Bytes in all segments.
    fn pkt_len(&self) -> usize;
    /// The first segment's bytes.
    fn data(&self) -> &[u8];
    /// Each segment's bytes, in order.
    fn segments(&self) -> impl Iterator<Item = &[u8]>;
    /// Cuts `len` bytes off the front of the first segment.
    fn adj(&mut self, len: usize) -> Result<(), NoRoom>;
    /// Cuts `len` bytes off the end.
    fn trim(&mut self, len: usize) -> Result<(), NoRoom>;
    /// The port's verdict on the IPv4 header checksum.
    fn rx_ip_checksum(&self) -> RxChecksum;
    /// The port's verdict on the UDP checksum.
    fn rx_l4_checksum(&self) -> RxChecksum;
    /// Whether both verdicts are [`RxChecksum::Unknown`] (a port without
    /// receive offloads), in one test where the buffer can.
    #[inline(always)]
    fn rx_checksums_unknown(&self) -> bool {
        self.rx_ip_checksum() == RxChecksum::Unknown && self.rx_l4_checksum() == RxChecksum::Unknown
    }
    /// Forgets what the port said about the packet (checksum verdicts,
    /// hash) and every offload flag: a tunnel's inner frame was not what
    /// the port looked at.
    fn clear_offload(&mut self);
    /// Grows the packet by `len` bytes in front (from the headroom) and
    /// returns them; fails when the headroom is short.
    fn prepend(&mut self, len: usize) -> Result<&mut [u8], NoRoom>;
    /// The offload flags (`spate_dpdk::mbuf::tx_flags` and the receive
    /// flags).
    fn ol_flags(&self) -> u64;
    /// Sets the offload flags.
    fn set_ol_flags(&mut self, flags: u64);
    /// The header lengths a transmit offload needs.
    fn set_tx_offload(&mut self, l2_len: u8, l3_len: u16, l4_len: u8, flags: u64);
}

impl PacketBuf for Mbuf {
    #[inline(always)]
    fn pkt_len(&self) -> usize {
        Mbuf::pkt_len(self)
    }

    #[inline(always)]
    fn data(&self) -> &[u8] {
        Mbuf::data(self)
    }

    #[inline(always)]
    fn segments(&self) -> impl Iterator<Item = &[u8]> {
        self.segment_data()
    }

    #[inline(always)]
    fn adj(&mut self, len: usize) -> Result<(), NoRoom> {
        Mbuf::adj(self, len).map_err(|_| NoRoom)
    }

    #[inline(always)]
    fn trim(&mut self, len: usize) -> Result<(), NoRoom> {
        Mbuf::trim(self, len).map_err(|_| NoRoom)
    }

    #[inline(always)]
    fn rx_ip_checksum(&self) -> RxChecksum {
        Mbuf::rx_ip_checksum(self)
    }

    #[inline(always)]
    fn rx_l4_checksum(&self) -> RxChecksum {
        Mbuf::rx_l4_checksum(self)
    }

    #[inline(always)]
    fn rx_checksums_unknown(&self) -> bool {
        Mbuf::rx_checksums_unknown(self)
    }

    #[inline(always)]
    fn clear_offload(&mut self) {
        Mbuf::set_ol_flags(self, 0)
    }

    #[inline(always)]
    fn prepend(&mut self, len: usize) -> Result<&mut [u8], NoRoom> {
        Mbuf::prepend(self, len).map_err(|_| NoRoom)
    }

    #[inline(always)]
    fn ol_flags(&self) -> u64 {
        Mbuf::ol_flags(self)
    }

    #[inline(always)]
    fn set_ol_flags(&mut self, flags: u64) {
        Mbuf::set_ol_flags(self, flags)
    }

    #[inline(always)]
    fn set_tx_offload(&mut self, l2_len: u8, l3_len: u16, l4_len: u8, flags: u64) {
        Mbuf::set_tx_offload(self, l2_len, l3_len, l4_len, flags)
    }
}

/// A packet buffer in memory: one segment with headroom in front (as an
/// mbuf's, 128 bytes unless told), more segments chained behind it, the
/// verdicts and hash a port would have written and the offload fields it
/// would read.
#[cfg(any(test, feature = "internals"))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemBuf {
    room: Vec<u8>,
    start: usize,
    /// Segments after the first.
    pub chained: Vec<Vec<u8>>,
    /// Offload flags.
    pub ol_flags: u64,
    /// The header lengths of a transmit offload request.
    pub tx_offload: (u8, u16, u8),
    /// The port's verdicts on the IPv4 and the UDP checksum.
    pub rx_checksum: (RxChecksum, RxChecksum),
    /// The port's flow hash.
    pub rss: Option<u32>,
}

#[cfg(any(test, feature = "internals"))]
impl MemBuf {
    /// DPDK's default headroom (`RTE_PKTMBUF_HEADROOM`).
    pub const HEADROOM: usize = 128;

    /// A buffer holding `bytes` behind the default headroom.
    pub fn new(bytes: &[u8]) -> MemBuf {
        MemBuf::with_headroom(bytes, Self::HEADROOM)
    }

    /// A buffer holding `bytes` behind `headroom` bytes of room. The room
    /// holds a pattern, not zeros, as a reused mbuf holds stale bytes: a
    /// writer that skips a field leaves the pattern there.
    pub fn with_headroom(bytes: &[u8], headroom: usize) -> MemBuf {
        let mut room = vec![0xa5; headroom];
        room.extend_from_slice(bytes);
        MemBuf {
            room,
            start: headroom,
            chained: Vec::new(),
            ol_flags: 0,
            tx_offload: (0, 0, 0),
            rx_checksum: (RxChecksum::Unknown, RxChecksum::Unknown),
            rss: None,
        }
    }

    /// Every segment's bytes, joined.
    pub fn to_vec(&self) -> Vec<u8> {
        self.segments().flatten().copied().collect()
    }
}

#[cfg(any(test, feature = "internals"))]
impl PacketBuf for MemBuf {
    fn pkt_len(&self) -> usize {
        self.data().len() + self.chained.iter().map(Vec::len).sum::<usize>()
    }

    fn data(&self) -> &[u8] {
        &self.room[self.start..]
    }

    fn segments(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(self.data()).chain(self.chained.iter().map(Vec::as_slice))
    }

    fn adj(&mut self, len: usize) -> Result<(), NoRoom> {
        if len > self.data().len() {
            return Err(NoRoom);
        }
        self.start += len;
        Ok(())
    }

    /// As `rte_pktmbuf_trim`: only the last segment is cut, and more than
    /// it holds is refused.
    fn trim(&mut self, len: usize) -> Result<(), NoRoom> {
        if let Some(last) = self.chained.last_mut() {
            let keep = last.len().checked_sub(len).ok_or(NoRoom)?;
            last.truncate(keep);
            return Ok(());
        }
        let keep = self.data().len().checked_sub(len).ok_or(NoRoom)?;
        self.room.truncate(self.start + keep);
        Ok(())
    }

    fn rx_ip_checksum(&self) -> RxChecksum {
        self.rx_checksum.0
    }

    fn rx_l4_checksum(&self) -> RxChecksum {
        self.rx_checksum.1
    }

    fn clear_offload(&mut self) {
        self.ol_flags = 0;
        self.rx_checksum = (RxChecksum::Unknown, RxChecksum::Unknown);
        self.rss = None;
    }

    fn prepend(&mut self, len: usize) -> Result<&mut [u8], NoRoom> {
        self.start = self.start.checked_sub(len).ok_or(NoRoom)?;
        Ok(&mut self.room[self.start..self.start + len])
    }

    fn ol_flags(&self) -> u64 {
        self.ol_flags
    }

    fn set_ol_flags(&mut self, flags: u64) {
        self.ol_flags = flags;
    }

    fn set_tx_offload(&mut self, l2_len: u8, l3_len: u16, l4_len: u8, flags: u64) {
        self.tx_offload = (l2_len, l3_len, l4_len);
        self.ol_flags |= flags;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_buf_keeps_the_headroom_rules() {
        let mut b = MemBuf::with_headroom(b"payload", 4);
        assert_eq!(b.prepend(4).unwrap(), &mut [0xa5u8; 4][..]);
        assert!(b.prepend(1).is_err(), "the headroom is used up");
        b.adj(4).unwrap();
        b.chained.push(b"-more".to_vec());
        assert_eq!(b.pkt_len(), 12);
        // Only the last segment is trimmed, as an mbuf's.
        assert!(b.trim(6).is_err());
        b.trim(3).unwrap();
        assert_eq!(b.to_vec(), b"payload-m");
        b.chained.clear();
        b.trim(4).unwrap();
        assert_eq!(b.to_vec(), b"pay");
        assert!(b.trim(4).is_err());
        assert!(b.adj(4).is_err());
    }
}

//! A send buffer: an mbuf the application fills in place, or a received
//! datagram turned into its reply.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};

use spate_dpdk::Mbuf;

use crate::wire::{get_u16, udp};

/// A payload being prepared for sending, in an mbuf with room in front
/// for the headers. Get one from `UdpSocket::alloc_send_buf` (or a
/// received `Datagram`), fill it in place, and hand it to
/// `UdpSocket::send_buf_to`.
#[derive(Debug)]
pub struct SendBuf {
    pub(crate) mbuf: Mbuf,
    /// For a received datagram turned around and not changed since: the
    /// span of its request's IP and UDP headers, in the headroom before
    /// the payload. 0 otherwise (any change of the payload clears it).
    pub(super) request: u16,
    /// For a received datagram turned around: the same span, whatever
    /// became of the payload (where a reply goes). 0 otherwise.
    pub(super) reply: u16,
}

impl SendBuf {
    pub(crate) fn new(mbuf: Mbuf) -> SendBuf {
        SendBuf { mbuf, request: 0, reply: 0 }
    }

    /// Where a reply goes, for a buffer made from a received datagram: its
    /// sender, read from its headers in the headroom (IPv4 as such, also
    /// when an IPv6 socket received it; IPv6 otherwise). Read before any
    /// header is written.
    #[inline(always)]
    pub(crate) fn reply_to(&self) -> Option<Result<SocketAddrV4, SocketAddr>> {
        if self.reply == 0 {
            return None;
        }
        let room = self.mbuf.headroom_bytes();
        let ip = room.get(room.len().checked_sub(self.reply as usize)?..)?;
        let port = get_u16(room.get(room.len().checked_sub(udp::HEADER_LEN)?..)?, 0);
        if ip.first()? >> 4 == 4 {
            let a: [u8; 4] = ip.get(12..16)?.try_into().ok()?;
            return Some(Ok(SocketAddrV4::new(Ipv4Addr::from(a), port)));
        }
        let a: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
        Some(Err(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(a)), port)))
    }

    /// The UDP checksum a reply from `src` to `dst` can keep: its
    /// request's, when this is the request's payload unchanged and the
    /// request went from `dst` to `src`. Read before any header is written.
    #[inline]
    pub(crate) fn reply_checksum(&self, src: &SocketAddr, dst: &SocketAddr) -> Option<u16> {
        if self.request == 0 {
            return None;
        }
        let room = self.mbuf.headroom_bytes();
        let ip = room.get(room.len().checked_sub(self.request as usize)?..)?;
        let udp_hdr = &room[room.len() - udp::HEADER_LEN..];
        let (from, to) = match (ip[0] >> 4, src.ip(), dst.ip()) {
            (4, IpAddr::V4(s), IpAddr::V4(d)) => (ip[12..16] == d.octets(), ip[16..20] == s.octets()),
            (6, IpAddr::V6(s), IpAddr::V6(d)) if ip.len() >= 40 => (ip[8..24] == d.octets(), ip[24..40] == s.octets()),
            _ => return None,
        };
        let ports = get_u16(udp_hdr, 0) == dst.port() && get_u16(udp_hdr, 2) == src.port();
        let same_len = get_u16(udp_hdr, 4) as usize == self.mbuf.pkt_len() + udp::HEADER_LEN;
        (from && to && ports && same_len).then(|| get_u16(udp_hdr, 6))
    }

    /// [`reply_checksum`](Self::reply_checksum) for IPv4, the addresses
    /// by value.
    #[inline]
    pub(crate) fn reply_checksum_v4(&self, src: SocketAddrV4, dst: SocketAddrV4) -> Option<u16> {
        if self.request == 0 {
            return None;
        }
        let room = self.mbuf.headroom_bytes();
        let ip = room.get(room.len().checked_sub(self.request as usize)?..)?;
        let (ip, udp_hdr) = (ip.get(..20)?, &room[room.len() - udp::HEADER_LEN..]);
        let word = |b: &[u8], at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let same = ip[0] >> 4 == 4
            && word(ip, 12) == u32::from(*dst.ip())
            && word(ip, 16) == u32::from(*src.ip())
            && get_u16(udp_hdr, 0) == dst.port()
            && get_u16(udp_hdr, 2) == src.port()
            && get_u16(udp_hdr, 4) as usize == self.mbuf.pkt_len() + udp::HEADER_LEN;
        same.then(|| get_u16(udp_hdr, 6))
    }

    /// Payload length.
    #[inline]
    pub fn len(&self) -> usize {
        self.mbuf.pkt_len()
    }

    /// Whether the payload is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Shortens the payload to `len` bytes (no effect if it is shorter),
    /// across segments for a buffer made from a reassembled datagram.
    pub fn truncate(&mut self, len: usize) {
        self.request = 0;
        self.mbuf.truncate(len);
    }

    /// Appends bytes; fails when the mbuf has no room.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.request = 0;
        self.mbuf
            .append(bytes.len())
            .map(|dst| dst.copy_from_slice(bytes))
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EMSGSIZE))
    }
}

impl std::ops::Deref for SendBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.mbuf.data()
    }
}

impl std::ops::DerefMut for SendBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.request = 0;
        self.mbuf.data_mut()
    }
}

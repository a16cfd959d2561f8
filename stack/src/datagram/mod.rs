//! Received datagrams and send buffers: both own an mbuf, so a datagram
//! moves from the port to the application, and back out as a reply,
//! without a copy.
//!
//! The files: [`Datagram`] here; `meta` what comes with a datagram and
//! goes with a send ([`RecvMeta`], [`SendMeta`], [`Ecn`]); `batch` a
//! reader's batch and the staged datagrams lent to a callback
//! ([`DatagramBatch`], [`Staged`]); `send_buf` a buffer filled in place
//! for sending ([`SendBuf`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use spate_dpdk::{Burst, Mbuf};

use crate::rx_queue::Truesize;
use crate::wire::{get_u16, udp};

mod batch;
mod meta;
mod send_buf;

pub use batch::{DatagramBatch, Staged};
pub use meta::{Ecn, RecvMeta, SendMeta};
pub use send_buf::SendBuf;

/// A received UDP datagram: its payload, in the mbuf that carried it.
///
/// Its addresses are read on demand from the IP and UDP headers, which
/// stay in the mbuf's headroom in front of the payload; a datagram is
/// therefore two words, cheap to queue and move.
///
/// Datagrams that fit one mbuf (up to 2,048 bytes with the default pool)
/// are one segment, so [`data`](Self::data) is the whole payload. Larger
/// ones, reassembled from fragments, are chains: use
/// [`segments`](Self::segments) or [`copy_to`](Self::copy_to).
///
/// A socket with UDP GRO on may receive one datagram made of several that
/// arrived back to back from one sender: each a segment of
/// [`gso_size`](Self::gso_size) bytes, the last one possibly shorter, as
/// Linux's `UDP_GRO` delivers them.
#[derive(Debug)]
pub struct Datagram {
    mbuf: Mbuf,
    /// What it costs against the receive buffer (kept, so queueing does not
    /// read the mbuf again).
    truesize: u32,
    /// Bytes from the start of the IP header to the payload (`SPAN`);
    /// `MAPPED` when addresses are shown as IPv6 (an IPv6 socket receiving
    /// IPv4), `STAMPED` when a receive timestamp is in the headroom,
    /// `GROUP` for one socket's copy of a broadcast or multicast datagram.
    headers: u16,
    /// Segment size of a coalesced datagram (UDP GRO); 0 for a plain one.
    gso: u16,
}

/// The bit of `Datagram::headers` that says "mapped".
const MAPPED: u16 = 1 << 15;
/// The bit of `Datagram::headers` that says a receive timestamp is in the
/// headroom (see `Datagram::stamp`).
const STAMPED: u16 = 1 << 14;
/// The bit of `Datagram::headers` that says it was sent to a broadcast or
/// multicast address and is one socket's copy (see `engine::group`).
const GROUP: u16 = 1 << 13;
/// The bits of `Datagram::headers` that hold the header span (the span
/// lies in a 2 KiB mbuf's headroom: 11 bits).
const SPAN: u16 = GROUP - 1;
/// Bytes of the receive timestamp, just before the IP header.
const STAMP_LEN: usize = 8;

impl Datagram {
    /// Wraps an mbuf whose data is exactly the UDP payload, with the IP
    /// header `headers` bytes before it, received on interface `iface`
    /// (kept in the mbuf's port field, which nothing reads again).
    #[inline]
    pub(crate) fn new(mut mbuf: Mbuf, headers: u16, mapped: bool, iface: u16) -> Datagram {
        debug_assert!(headers <= SPAN, "headers lie in a 2 KiB mbuf's headroom");
        mbuf.set_port(iface);
        let truesize = truesize_of(mbuf.buf_len()) as u32;
        Datagram { mbuf, truesize, headers: headers | if mapped { MAPPED } else { 0 }, gso: 0 }
    }

    /// Appends the next segments of a coalesced datagram (UDP GRO): each
    /// packet of `segs` holds one segment's payload, `gso_size` is the
    /// train's segment size.
    #[inline]
    pub(crate) fn append_segments<const N: usize>(&mut self, segs: &mut Burst<N>, gso_size: u16) {
        let bufs: usize = segs.as_slice().iter().map(Mbuf::buf_len).sum();
        if self.mbuf.chain_all(segs).is_ok() {
            self.truesize += bufs as u32;
            self.gso = gso_size;
        }
    }

    /// The segment size when this datagram coalesces several (UDP GRO):
    /// every segment is this long but the last, which may be shorter.
    /// `None` for a datagram as it arrived.
    #[inline]
    pub fn gso_size(&self) -> Option<usize> {
        (self.gso != 0).then_some(self.gso as usize)
    }

    /// The payload of the first segment (all of it for a contiguous datagram).
    #[inline]
    pub fn data(&self) -> &[u8] {
        self.mbuf.data()
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

    /// Whether the payload is in one segment.
    #[inline]
    pub fn is_contiguous(&self) -> bool {
        self.mbuf.is_contiguous()
    }

    /// Each segment of the payload, in order.
    #[inline]
    pub fn segments(&self) -> impl Iterator<Item = &[u8]> {
        self.mbuf.segment_data()
    }

    /// Copies as much of the payload as fits into `buf`; returns the bytes
    /// copied (the rest is cut off, as `recv_from` does).
    #[inline(always)]
    pub fn copy_to(&self, buf: &mut [u8]) -> usize {
        if self.is_contiguous() {
            // One segment (every datagram but a coalesced or reassembled
            // one): one copy, inlined into the caller's loop.
            let data = self.data();
            let n = data.len().min(buf.len());
            copy_bytes(&data[..n], buf);
            return n;
        }
        self.copy_segments_to(buf)
    }

    #[inline(never)]
    fn copy_segments_to(&self, buf: &mut [u8]) -> usize {
        let mut done = 0;
        for seg in self.segments() {
            let n = seg.len().min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&seg[..n]);
            done += n;
            if done == buf.len() {
                break;
            }
        }
        done
    }

    /// The payload as a new vector (allocates).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len()];
        self.copy_to(&mut v);
        v
    }

    /// (IP header, UDP header) from the headroom.
    #[inline]
    fn headers(&self) -> (&[u8], &[u8]) {
        let room = self.mbuf.headroom_bytes();
        let ip = &room[room.len() - (self.headers & SPAN) as usize..];
        (ip, &room[room.len() - udp::HEADER_LEN..])
    }

    // Always: a reply's address is read in the application's loop, and
    // the compiler would otherwise call it there once per datagram.
    #[inline(always)]
    fn addr(&self, source: bool) -> SocketAddr {
        let (ip, udp_hdr) = self.headers();
        let port = get_u16(udp_hdr, if source { 0 } else { 2 });
        let addr = if ip[0] >> 4 == 4 {
            let at = if source { 12 } else { 16 };
            let a = Ipv4Addr::new(ip[at], ip[at + 1], ip[at + 2], ip[at + 3]);
            if self.is_mapped() { IpAddr::V6(a.to_ipv6_mapped()) } else { IpAddr::V4(a) }
        } else {
            let at = if source { 8 } else { 24 };
            IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&ip[at..at + 16]).expect("16 bytes")))
        };
        SocketAddr::new(addr, port)
    }

    /// The sender.
    #[inline]
    pub fn src(&self) -> SocketAddr {
        self.addr(true)
    }

    /// Marks it as one socket's copy of a group datagram.
    #[inline]
    pub(crate) fn set_group_copy(&mut self) {
        self.headers |= GROUP;
    }

    /// Whether it is one socket's copy of a group datagram.
    #[inline]
    pub(crate) fn is_group_copy(&self) -> bool {
        self.headers & GROUP != 0
    }

    /// Whether addresses are shown IPv4-mapped.
    pub(crate) fn is_mapped(&self) -> bool {
        self.headers & MAPPED != 0
    }

    /// The same datagram shown to a socket of another family.
    pub(crate) fn remap(mut self, v6_socket: bool) -> Datagram {
        let (ip, _) = self.headers();
        let mapped = v6_socket && ip[0] >> 4 == 4;
        self.headers = (self.headers & !MAPPED) | if mapped { MAPPED } else { 0 };
        self
    }

    /// The sender as on the wire (IPv4 not mapped).
    pub(crate) fn wire_src(&self) -> SocketAddr {
        crate::addr::normalize(self.src())
    }

    /// Whether it arrived over IPv4 (its IP header's version): the family
    /// its counters are, whatever its addresses look like (an IPv6 source
    /// of the form `::ffff:a.b.c.d` stays IPv6's).
    #[inline]
    pub(crate) fn arrived_v4(&self) -> bool {
        self.headers().0[0] >> 4 == 4
    }

    /// The destination as on the wire (IPv4 not mapped).
    pub(crate) fn wire_dst(&self) -> SocketAddr {
        crate::addr::normalize(self.dst())
    }

    /// The address it was sent to (one of ours).
    #[inline]
    pub fn dst(&self) -> SocketAddr {
        self.addr(false)
    }

    /// Notes the receive time, `CLOCK_REALTIME` nanoseconds, in the 8
    /// bytes before the IP header (the Ethernet header's, which nothing
    /// reads again, in a cache line the receive path has just read).
    #[inline]
    pub(crate) fn stamp(&mut self, ns: u64) {
        let span = (self.headers & SPAN) as usize;
        let room = self.mbuf.headroom_bytes_mut();
        let Some(at) = room.len().checked_sub(span + STAMP_LEN) else { return };
        room[at..at + STAMP_LEN].copy_from_slice(&ns.to_ne_bytes());
        self.headers |= STAMPED;
    }

    /// The index of the interface it arrived on (see
    /// [`Stack::interfaces`](crate::Stack::interfaces)): `IP_PKTINFO`'s
    /// `ipi_ifindex` and `IPV6_PKTINFO`'s, in spate's numbering.
    #[inline]
    pub fn iface(&self) -> u16 {
        self.mbuf.port()
    }

    /// When the polling lcore received it: the TSC read at the start of
    /// the loop iteration whose burst held it, as `CLOCK_REALTIME`
    /// (`SO_TIMESTAMPNS`). `None` unless some socket of the stack asked for
    /// timestamps ([`UdpSocket::set_recv_timestamps`](crate::UdpSocket::set_recv_timestamps))
    /// when it arrived.
    #[inline]
    pub fn timestamp(&self) -> Option<std::time::SystemTime> {
        if self.headers & STAMPED == 0 {
            return None;
        }
        let room = self.mbuf.headroom_bytes();
        let at = room.len() - (self.headers & SPAN) as usize - STAMP_LEN;
        let ns = u64::from_ne_bytes(room[at..at + STAMP_LEN].try_into().expect("8 bytes"));
        Some(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns))
    }

    /// The receive time as `CLOCK_REALTIME` nanoseconds, when stamped.
    #[inline]
    pub(crate) fn stamp_ns(&self) -> Option<u64> {
        if self.headers & STAMPED == 0 {
            return None;
        }
        let room = self.mbuf.headroom_bytes();
        let at = room.len().checked_sub((self.headers & SPAN) as usize + STAMP_LEN)?;
        Some(u64::from_ne_bytes(room[at..at + STAMP_LEN].try_into().ok()?))
    }

    /// The IPv4 TOS byte or the IPv6 traffic class, as received: DSCP in
    /// the top six bits, ECN in the low two (`IP_RECVTOS`,
    /// `IPV6_RECVTCLASS`).
    #[inline]
    pub fn tos(&self) -> u8 {
        let (ip, _) = self.headers();
        if ip[0] >> 4 == 4 { ip[1] } else { crate::wire::ipv6::traffic_class(ip) }
    }

    /// The ECN codepoint it arrived with.
    #[inline]
    pub fn ecn(&self) -> Ecn {
        Ecn::from_bits(self.tos())
    }

    /// The TTL or hop limit, as received (`IP_RECVTTL`,
    /// `IPV6_RECVHOPLIMIT`).
    #[inline]
    pub fn ttl(&self) -> u8 {
        let (ip, _) = self.headers();
        if ip[0] >> 4 == 4 { ip[8] } else { ip[7] }
    }

    /// Everything the datagram says of itself besides its payload.
    pub fn meta(&self) -> RecvMeta {
        RecvMeta {
            src: self.src(),
            dst: self.dst(),
            iface: self.iface(),
            tos: self.tos(),
            ttl: self.ttl(),
            timestamp: self.timestamp(),
            gso_size: self.gso_size(),
        }
    }

    /// Turns the datagram into a send buffer holding the same payload, for
    /// answering without a copy.
    ///
    /// Its request's headers stay in the headroom: sent back unchanged to
    /// the address it came from, from the address it went to, the reply
    /// keeps the request's UDP checksum (the pseudo-header sums the same
    /// four values, swapped) and spate sums no payload.
    #[inline]
    pub fn into_send_buf(self) -> SendBuf {
        // A coalesced datagram's checksum was its first segment's; an IPv4
        // one without a checksum has none to keep.
        let keeps = self.gso == 0 && self.mbuf.is_contiguous() && get_u16(self.headers().1, 6) != 0;
        let request = if keeps { self.headers & SPAN } else { 0 };
        SendBuf { mbuf: self.mbuf, request, reply: self.headers & SPAN }
    }

    /// The mbuf, for code that works with DPDK directly.
    #[inline]
    pub fn into_mbuf(self) -> Mbuf {
        self.mbuf
    }
}

impl Truesize for Datagram {
    #[inline]
    fn truesize(&self) -> usize {
        self.truesize as usize
    }
}

/// The charge of a datagram whose mbufs' buffers add up to `buf_len` bytes.
#[inline]
pub(crate) fn truesize_of(buf_len: usize) -> usize {
    buf_len + std::mem::size_of::<Datagram>()
}

/// Where the payload starts, seen from the IP header, for
/// [`Datagram::new`]: the IP header (with IPv6 extension headers) and UDP.
#[inline]
pub(crate) fn header_span(l3: usize, l4: usize) -> u16 {
    (l4 - l3 + udp::HEADER_LEN) as u16
}

/// Copies `src` into the start of `dst`, which must be as long at least.
/// A payload of 8 to 32 bytes (a small datagram's: a 64-byte frame
/// carries 22) is two overlapping loads and stores of 8 or 16 bytes,
/// inline: a call to the C library's `memcpy`, which first dispatches on
/// the length, costs half as much again.
#[inline(always)]
fn copy_bytes(src: &[u8], dst: &mut [u8]) {
    let n = src.len();
    let dst = &mut dst[..n];
    if (16..=32).contains(&n) {
        let head: [u8; 16] = src[..16].try_into().unwrap_or_default();
        let tail: [u8; 16] = src[n - 16..].try_into().unwrap_or_default();
        dst[..16].copy_from_slice(&head);
        dst[n - 16..].copy_from_slice(&tail);
    } else if (8..16).contains(&n) {
        let head: [u8; 8] = src[..8].try_into().unwrap_or_default();
        let tail: [u8; 8] = src[n - 8..].try_into().unwrap_or_default();
        dst[..8].copy_from_slice(&head);
        dst[n - 8..].copy_from_slice(&tail);
    } else {
        dst.copy_from_slice(src);
    }
}

#[cfg(test)]
mod tests {
    use super::copy_bytes;

    #[test]
    fn copy_bytes_copies_every_length_exactly() {
        let src: Vec<u8> = (1..=80).collect();
        for n in 0..=80 {
            let mut dst = [0u8; 96];
            copy_bytes(&src[..n], &mut dst);
            assert_eq!(&dst[..n], &src[..n], "length {n}");
            assert!(dst[n..].iter().all(|&b| b == 0), "length {n}: nothing past the end");
        }
    }
}

//! Received datagrams and send buffers: both own an mbuf, so a datagram
//! moves from the port to the application, and back out as a reply,
//! without a copy.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};

use spate_dpdk::{Burst, Mbuf};

use crate::rx_queue::Truesize;
use crate::wire::{get_u16, udp};

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

/// What Linux's control messages tell of a received datagram, in one
/// value: [`Datagram::meta`], [`UdpSocket::recv_msg`](crate::UdpSocket::recv_msg).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvMeta {
    /// The sender (IPv4-mapped on an IPv6 socket).
    pub src: SocketAddr,
    /// The address and port it was sent to (`IP_PKTINFO`'s `ipi_addr`,
    /// `IPV6_PKTINFO`'s `ipi6_addr`): one of the stack's addresses, or a
    /// broadcast one.
    pub dst: SocketAddr,
    /// The interface it arrived on (an index of
    /// [`Stack::interfaces`](crate::Stack::interfaces)).
    pub iface: u16,
    /// TOS or traffic class: DSCP and ECN.
    pub tos: u8,
    /// TTL or hop limit.
    pub ttl: u8,
    /// The receive timestamp (`SO_TIMESTAMPNS`), when asked for.
    pub timestamp: Option<std::time::SystemTime>,
    /// The segment size of a coalesced datagram (UDP GRO's `UDP_GRO`
    /// control message).
    pub gso_size: Option<usize>,
}

impl RecvMeta {
    /// The ECN codepoint of [`tos`](Self::tos).
    pub fn ecn(&self) -> Ecn {
        Ecn::from_bits(self.tos)
    }
}

/// An ECN codepoint: the low two bits of the TOS byte or traffic class
/// (RFC 3168).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Ecn {
    /// Not ECN-capable transport.
    #[default]
    NotEct = 0,
    /// ECN-capable transport, ECT(1).
    Ect1 = 1,
    /// ECN-capable transport, ECT(0).
    Ect0 = 2,
    /// Congestion experienced.
    Ce = 3,
}

impl Ecn {
    /// The codepoint in the low two bits of `tos`.
    pub const fn from_bits(tos: u8) -> Ecn {
        match tos & 3 {
            0 => Ecn::NotEct,
            1 => Ecn::Ect1,
            2 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }
}

/// What one send says besides its payload and destination (the control
/// messages of Linux's `sendmsg`): [`UdpSocket::send_msg_to`](crate::UdpSocket::send_msg_to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendMeta {
    /// The source address (`IP_PKTINFO`'s `ipi_spec_dst`, `IPV6_PKTINFO`):
    /// one of the stack's addresses, of the destination's family (an
    /// IPv4-mapped one for an IPv4 destination of an IPv6 socket). `None`
    /// or the unspecified address: the socket's bound address, or the
    /// route's.
    pub src_ip: Option<IpAddr>,
    /// The ECN codepoint, in place of the low two bits of the socket's
    /// TOS or traffic class (`IP_TOS`/`IPV6_TCLASS` as a control message,
    /// how QUIC marks its packets).
    pub ecn: Option<Ecn>,
    /// The payload as datagrams of this many bytes each, the last one
    /// possibly shorter (`UDP_SEGMENT` as a control message, UDP GSO), in
    /// place of the socket's segment size.
    pub segment_size: Option<usize>,
    /// The TTL (IPv4: 1 to 255, 0 is `EINVAL`) or hop limit (IPv6: 0 to
    /// 255), in place of the socket's, multicast included (`IP_TTL`,
    /// `IPV6_HOPLIMIT` as control messages).
    pub ttl: Option<u8>,
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

/// Datagrams taken in one call, freed together: dropping or clearing a
/// batch gives every mbuf back to the pool in bulk calls.
#[derive(Debug, Default)]
pub struct DatagramBatch {
    items: Vec<Datagram>,
}

impl DatagramBatch {
    /// A batch with room for `n` datagrams without allocating.
    pub fn with_capacity(n: usize) -> DatagramBatch {
        DatagramBatch { items: Vec::with_capacity(n) }
    }

    /// Datagrams held.
    #[inline]
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether it holds none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The datagrams.
    #[inline]
    pub fn iter(&self) -> std::slice::Iter<'_, Datagram> {
        self.items.iter()
    }

    /// Takes every datagram out (to reply with, or keep).
    #[inline]
    pub fn drain(&mut self) -> std::vec::Drain<'_, Datagram> {
        self.items.drain(..)
    }

    /// Adds a datagram (taken out earlier), to be freed with the others.
    #[inline]
    pub fn push(&mut self, d: Datagram) {
        self.items.push(d);
    }

    /// Frees every datagram held, 32 mbufs per call.
    pub fn clear(&mut self) {
        let mut burst: Burst = Burst::new();
        for d in self.items.drain(..) {
            if let Err(m) = burst.push(d.mbuf) {
                burst.clear();
                let _ = burst.push(m);
            }
        }
    }

    pub(crate) fn vec(&mut self) -> &mut Vec<Datagram> {
        &mut self.items
    }

    /// Starts the cache misses of the datagrams from `from` on, all of
    /// them at once: their mbufs' headers, then (with the headers on
    /// their way) the first line of each payload. Datagrams another core
    /// queued are otherwise two misses each, one after the other, as the
    /// application reads them.
    #[inline]
    pub(crate) fn prefetch_from(&self, from: usize) {
        let new = &self.items[from.min(self.items.len())..];
        for d in new {
            d.mbuf.prefetch_header();
        }
        for d in new {
            d.mbuf.prefetch_data();
        }
    }
}

impl Drop for DatagramBatch {
    fn drop(&mut self) {
        self.clear();
    }
}

/// One socket's datagrams of a burst, where the polling lcore staged
/// them, lent to its run-to-completion callback by
/// [`LcoreCtx::recv_staged`](crate::LcoreCtx::recv_staged): take them
/// all ([`drain`](Self::drain), [`move_to`](Self::move_to)), or none,
/// and they are queued to the socket when the callback returns.
#[derive(Debug)]
pub struct Staged<'a> {
    items: &'a mut Vec<Datagram>,
}

impl<'a> Staged<'a> {
    pub(crate) fn new(items: &'a mut Vec<Datagram>) -> Staged<'a> {
        Staged { items }
    }

    /// Takes every datagram out, in arrival order (those the iterator is
    /// dropped with are freed).
    #[inline]
    pub fn drain(self) -> std::vec::Drain<'a, Datagram> {
        self.items.drain(..)
    }

    /// Moves every datagram into `batch`, after what it holds: an empty
    /// batch whose capacity is at least the lcore's buffer's takes that
    /// buffer whole, without a copy, and lends it its own.
    #[inline]
    pub fn move_to(self, batch: &mut DatagramBatch) {
        let out = &mut batch.items;
        if out.is_empty() && out.capacity() >= self.items.capacity() {
            std::mem::swap(out, self.items);
        } else {
            out.append(self.items);
        }
    }
}

/// The datagrams, in arrival order (`len`, `iter` and the rest of a
/// slice's reading).
impl std::ops::Deref for Staged<'_> {
    type Target = [Datagram];
    fn deref(&self) -> &[Datagram] {
        self.items
    }
}

impl<'a> IntoIterator for &'a DatagramBatch {
    type Item = &'a Datagram;
    type IntoIter = std::slice::Iter<'a, Datagram>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

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
    request: u16,
    /// For a received datagram turned around: the same span, whatever
    /// became of the payload (where a reply goes). 0 otherwise.
    reply: u16,
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

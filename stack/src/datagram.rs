//! Received datagrams and send buffers: both own an mbuf, so a datagram
//! moves from the port to the application, and back out as a reply,
//! without a copy.

use std::net::SocketAddr;

use spate_dpdk::Mbuf;

use crate::rx_queue::Truesize;

/// A received UDP datagram: its payload (in the mbuf that carried it) and
/// its addresses.
///
/// Datagrams that fit one mbuf (up to 2,048 bytes with the default pool)
/// are one segment, so [`data`](Self::data) is the whole payload. Larger
/// ones, reassembled from fragments, are chains: use
/// [`segments`](Self::segments) or [`copy_to`](Self::copy_to).
#[derive(Debug)]
pub struct Datagram {
    mbuf: Mbuf,
    src: SocketAddr,
    dst: SocketAddr,
}

impl Datagram {
    /// Wraps an mbuf whose data is exactly the UDP payload.
    pub(crate) fn new(mbuf: Mbuf, src: SocketAddr, dst: SocketAddr) -> Datagram {
        Datagram { mbuf, src, dst }
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
    pub fn segments(&self) -> impl Iterator<Item = &[u8]> {
        self.mbuf.segment_data()
    }

    /// Copies as much of the payload as fits into `buf`; returns the bytes
    /// copied (the rest is cut off, as `recv_from` does).
    pub fn copy_to(&self, buf: &mut [u8]) -> usize {
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

    /// The sender.
    #[inline]
    pub fn src(&self) -> SocketAddr {
        self.src
    }

    /// The address it was sent to (one of ours).
    #[inline]
    pub fn dst(&self) -> SocketAddr {
        self.dst
    }

    /// Turns the datagram into a send buffer holding the same payload, for
    /// answering without a copy.
    pub fn into_send_buf(self) -> SendBuf {
        SendBuf { mbuf: self.mbuf }
    }

    /// The mbuf, for code that works with DPDK directly.
    pub fn into_mbuf(self) -> Mbuf {
        self.mbuf
    }
}

impl Truesize for Datagram {
    #[inline]
    fn truesize(&self) -> usize {
        self.mbuf.buf_len() + std::mem::size_of::<Datagram>()
    }
}

/// A payload being prepared for sending, in an mbuf with room in front
/// for the headers. Get one from `UdpSocket::alloc_send_buf` (or a
/// received `Datagram`), fill it in place, and hand it to
/// `UdpSocket::send_buf_to`.
#[derive(Debug)]
pub struct SendBuf {
    pub(crate) mbuf: Mbuf,
}

impl SendBuf {
    pub(crate) fn new(mbuf: Mbuf) -> SendBuf {
        SendBuf { mbuf }
    }

    /// Payload length.
    pub fn len(&self) -> usize {
        self.mbuf.pkt_len()
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Shortens the payload to `len` bytes (no effect if it is shorter).
    pub fn truncate(&mut self, len: usize) {
        let cut = self.len().saturating_sub(len);
        if cut > 0 {
            // Within one segment here: SendBufs from alloc_send_buf are contiguous.
            let _ = self.mbuf.trim(cut);
        }
    }

    /// Appends bytes; fails when the mbuf has no room.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.mbuf
            .append(bytes.len())
            .map(|dst| dst.copy_from_slice(bytes))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::OutOfMemory, "send buffer full"))
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
        self.mbuf.data_mut()
    }
}

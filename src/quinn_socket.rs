//! QUIC over spate: a [`quinn`] 0.11 socket over a spate [`UdpSocket`],
//! for `quinn::Endpoint::new_with_abstract_socket` with quinn's tokio
//! runtime for timers and tasks (behind the `quinn` feature).
//!
//! What quinn asks of a socket, from spate's datapath: `try_send` sends a
//! [`Transmit`]'s segments with spate's UDP GSO, from its source address,
//! with its ECN codepoint, DF set (`may_fragment` is false, so quinn's
//! path-MTU discovery runs); an error other than `WouldBlock` is dropped
//! and counted, not returned, as quinn-udp does (quinn stops driving a
//! connection whose send fails): a probe larger than the path MTU
//! (`EMSGSIZE`), a pool out of mbufs, an ICMP error. `poll_recv` fills each [`RecvMeta`] from a
//! datagram's headers: the sender, the destination address, ECN, and the
//! segment size of a datagram spate's UDP GRO coalesced (`stride`). One
//! copy each way between quinn's buffers and mbufs.
//!
//! Give the socket a receive buffer for quinn's windows before wrapping
//! it (`SocketBuilder::recv_buffer_size`; `spate-quic` uses 8 MiB): the
//! default 212,992 bytes drops their bursts, which quinn then recovers as
//! loss.
//!
//! [`Transmit`]: quinn::udp::Transmit
//! [`RecvMeta`]: quinn::udp::RecvMeta

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use quinn::udp::{EcnCodepoint, RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use spate_stack::{Ecn, SendMeta, UdpSocket};

/// Segments spate coalesces into one received datagram at most (its UDP
/// GRO's limit).
const GRO_SEGMENTS: usize = 64;

/// A spate socket as quinn's `AsyncUdpSocket`.
pub struct QuinnSocket {
    sock: UdpSocket,
    /// Datagrams received per ECN codepoint (Not-ECT, ECT(1), ECT(0), CE):
    /// quinn's own path statistics count none.
    ecn: [AtomicU64; 4],
    /// Sends that failed with an error quinn is not told of.
    send_errors: AtomicU64,
}

impl fmt::Debug for QuinnSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuinnSocket").field("local", &self.sock.local_addr().ok()).finish()
    }
}

impl QuinnSocket {
    /// Wraps `sock` for quinn: don't-fragment on (quinn discovers the path
    /// MTU) and UDP GRO on (quinn takes coalesced datagrams).
    pub fn new(sock: UdpSocket) -> io::Result<Arc<QuinnSocket>> {
        sock.set_dont_fragment(true)?;
        sock.set_gro(true)?;
        Ok(Arc::new(QuinnSocket { sock, ecn: Default::default(), send_errors: AtomicU64::new(0) }))
    }

    /// Sends that failed with an error other than `WouldBlock` (quinn
    /// treats them as lost datagrams).
    pub fn send_errors(&self) -> u64 {
        self.send_errors.load(Ordering::Relaxed)
    }

    /// Datagrams received with each ECN codepoint, indexed by its bits:
    /// Not-ECT, ECT(1), ECT(0), CE.
    pub fn ecn_received(&self) -> [u64; 4] {
        std::array::from_fn(|i| self.ecn[i].load(Ordering::Relaxed))
    }

    /// The spate socket.
    pub fn socket(&self) -> &UdpSocket {
        &self.sock
    }
}

impl AsyncUdpSocket for QuinnSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(Writable { sock: self })
    }

    fn try_send(&self, t: &Transmit) -> io::Result<()> {
        let ecn = t.ecn.map(|e| match e {
            EcnCodepoint::Ect0 => Ecn::Ect0,
            EcnCodepoint::Ect1 => Ecn::Ect1,
            EcnCodepoint::Ce => Ecn::Ce,
        });
        let meta = SendMeta { src_ip: t.src_ip, ecn, segment_size: t.segment_size, ttl: None };
        match self.sock.try_send_msg_to(t.contents, t.destination, &meta) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(e),
            // Lost, as on the wire: a path-MTU probe too large for the
            // path, no mbuf, an error the network reported.
            Err(_) => {
                self.send_errors.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        }
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let mut n = 0;
        while n < bufs.len().min(meta.len()) {
            let d = match self.sock.poll_recv_datagram(cx) {
                Poll::Ready(Ok(d)) => d,
                Poll::Ready(Err(e)) if n == 0 => return Poll::Ready(Err(e)),
                Poll::Pending if n == 0 => return Poll::Pending,
                _ => break,
            };
            let len = d.copy_to(&mut bufs[n]);
            let m = d.meta();
            self.ecn[(m.tos & 3) as usize].fetch_add(1, Ordering::Relaxed);
            meta[n] = RecvMeta {
                // IPv4-mapped already on an IPv6 socket, as quinn expects.
                addr: m.src,
                len,
                stride: m.gso_size.unwrap_or(len),
                ecn: EcnCodepoint::from_bits(m.tos),
                dst_ip: Some(m.dst.ip()),
            };
            n += 1;
        }
        Poll::Ready(Ok(n))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        spate_stack::GSO_MAX_SEGMENTS
    }

    fn max_receive_segments(&self) -> usize {
        GRO_SEGMENTS
    }

    fn may_fragment(&self) -> bool {
        false
    }
}

/// Write readiness for one task (quinn makes one per waiting task).
#[derive(Debug)]
struct Writable {
    sock: Arc<QuinnSocket>,
}

impl UdpPoller for Writable {
    fn poll_writable(self: Pin<&mut Self>, cx: &mut Context) -> Poll<io::Result<()>> {
        self.sock.sock.poll_writable(cx)
    }
}

//! The send path of a socket: the route and source address, UDP and IP
//! headers written in place, datagrams larger than the path MTU as IP
//! fragments, UDP GSO segments, and the hand-off to the transmit path (the
//! lcore's own queue inside its callback, else the socket's lcore's inbox).
//!
//! The files: the calls here; `path` the route, source and what a send to
//! one address shares; `batch` batched sends and replies, their headers
//! written; `segments` UDP GSO and IP fragments; `submit` the hand-off and
//! its back-pressure.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::task::{Context, Poll};

use super::{UdpSocket, errno};
use crate::datagram::{SendBuf, SendMeta};
use crate::hdr::MAX_HEADERS;
use crate::lookup::Family;
use crate::stats::Counter;

mod batch;
mod path;
mod segments;
mod submit;

use batch::Prepared;
use path::Path;

thread_local! {
    /// Set while a poll sends: a full inbox is `WouldBlock` whatever the
    /// socket's mode (read only once the inbox refused a packet).
    static NO_WAIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with [`NO_WAIT`] set, restoring what it was after, also when
/// `f` panics.
fn without_waiting<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            NO_WAIT.set(self.0);
        }
    }
    let _restore = Restore(NO_WAIT.replace(true));
    f()
}

/// Segments one UDP GSO send may make at most (Linux raised
/// `UDP_MAX_SEGMENTS` from 64 to 128 in 6.9).
pub const GSO_MAX_SEGMENTS: usize = 128;

impl UdpSocket {
    /// A send buffer of `len` bytes (contents unspecified) to fill in place.
    pub fn alloc_send_buf(&self, len: usize) -> io::Result<SendBuf> {
        crate::app_thread::enter();
        let shared = self.shared();
        let room = shared.pool.data_room() as usize - MAX_HEADERS;
        if len > room {
            return Err(errno(libc::EMSGSIZE, "longer than one mbuf"));
        }
        let mut m = shared.pool.alloc().ok_or_else(|| self.mem_error())?;
        m.append(len).map_err(|_| errno(libc::EMSGSIZE, "longer than one mbuf"))?;
        Ok(SendBuf::new(m))
    }

    fn mem_error(&self) -> io::Error {
        // Linux counts a send's ENOBUFS in SndbufErrors (MemErrors is the
        // receive side's udp_mem).
        let c = if self.family == Family::V4 { Counter::UdpSndbufErrors } else { Counter::Udp6SndbufErrors };
        self.shared().stats.shared().add_shared(c, 1);
        errno(libc::ENOBUFS, "no mbuf free")
    }

    /// Sends `buf` to `addr`; returns `buf.len()`.
    pub fn send_to(&self, buf: &[u8], addr: impl ToSocketAddrs) -> io::Result<usize> {
        let addr = addr.to_socket_addrs()?.next().ok_or_else(|| errno(libc::EINVAL, "no address"))?;
        let dst = self.destination(addr)?;
        self.send_with(buf, dst, None)
    }

    /// Sends `buf` to `addr` with what `meta` asks of this datagram: its
    /// source address, its ECN codepoint (Linux's `sendmsg` with
    /// `IP_PKTINFO`/`IPV6_PKTINFO` and `IP_TOS`/`IPV6_TCLASS` control
    /// messages). A source the stack does not own is `EADDRNOTAVAIL`, as a
    /// bind there says (Linux 6.18's `sendmsg` says `ENETUNREACH` for
    /// IPv4 and `EINVAL` for IPv6, measured); one of the other family than
    /// the destination, `EINVAL`; the unspecified address asks for none,
    /// as in Linux's control message. Segments as `send_to` does when the
    /// socket has a segment size. Returns `buf.len()`.
    pub fn send_msg_to(&self, buf: &[u8], addr: impl ToSocketAddrs, meta: &SendMeta) -> io::Result<usize> {
        let addr = addr.to_socket_addrs()?.next().ok_or_else(|| errno(libc::EINVAL, "no address"))?;
        let dst = self.destination(addr)?;
        self.send_with(buf, dst, Some(meta))
    }

    /// Sends `buf` to `addr` as [`send_to`](Self::send_to) does, without
    /// waiting: when the lcore's queue has no room the task in `cx` is
    /// woken once the lcore drains it, and the send is `Pending` (as
    /// tokio's `UdpSocket::poll_send_to`; the last task to poll is the one
    /// woken).
    pub fn poll_send_to(&self, cx: &mut Context<'_>, buf: &[u8], addr: SocketAddr) -> Poll<io::Result<usize>> {
        let dst = match self.destination(addr) {
            Ok(d) => d,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let shared = self.shared();
        let inbox = &shared.inbox[self.tx_worker];
        if crate::shared::in_callback(shared) {
            // The lcore's own queue: no drain will wake a task for it.
            return Poll::Ready(without_waiting(|| self.send_with(buf, dst, None)));
        }
        for _ in 0..2 {
            if shared.should_stop() && inbox.is_full() {
                // Stopped: no lcore will drain it.
                return Poll::Ready(Err(io::Error::from_raw_os_error(libc::EAGAIN)));
            }
            if !inbox.is_full() {
                match without_waiting(|| self.send_with(buf, dst, None)) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    done => return Poll::Ready(done),
                }
            }
            if inbox.register_waker(cx.waker()) {
                return Poll::Pending;
            }
        }
        // Room came while registering: the task is woken at the next drain
        // anyway; ask to be polled again now.
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// [`send_msg_to`](Self::send_msg_to) that never waits: a full queue
    /// to the lcore is `WouldBlock` whatever the socket's mode (what an
    /// async runtime's `try_send` wants; [`poll_writable`](Self::poll_writable)
    /// says when to try again).
    pub fn try_send_msg_to(&self, buf: &[u8], addr: SocketAddr, meta: &SendMeta) -> io::Result<usize> {
        let dst = self.destination(addr)?;
        without_waiting(|| self.send_with(buf, dst, Some(meta)))
    }

    /// Whether a send would find room in the lcore's queue; when not, the
    /// task in `cx` is woken once the lcore drains it. Inside an lcore's
    /// callback (a task an `LcoreRuntime` runs there), the queue is the
    /// lcore's own, drained when the callback returns: with no room for a
    /// GSO send's segments, the task is woken at once and runs again at
    /// the next turn, after the drain.
    pub fn poll_writable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let inbox = &self.shared().inbox[self.tx_worker];
        let shared = self.shared();
        match crate::shared::callback_room(shared, GSO_MAX_SEGMENTS) {
            Some(true) => return Poll::Ready(Ok(())),
            Some(false) => {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            None => {}
        }
        // A stack stopping after the registration wakes it; one that
        // stopped before it, or is stopping, never drains: try again now.
        if !inbox.is_full() || !inbox.register_waker(cx.waker()) || !shared.is_running() || shared.should_stop() {
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    }

    /// `send_to` and `send_msg_to` once the destination is checked.
    fn send_with(&self, buf: &[u8], dst: SocketAddr, meta: Option<&SendMeta>) -> io::Result<usize> {
        // A send's own segment size replaces the socket's (as Linux's
        // `UDP_SEGMENT` control message does the option).
        let seg = match meta.and_then(|m| m.segment_size) {
            Some(s) => Some(s),
            None => self.segment_size()?.map(usize::from),
        };
        if let Some(seg) = seg.filter(|s| buf.len() > *s) {
            return self.send_segments(buf, seg, dst, meta);
        }
        self.send_slice(buf, dst, meta)
    }

    /// Sends `buf` as one datagram: copied into one mbuf, or, when it is
    /// longer than one holds, straight into IP fragments.
    fn send_slice(&self, buf: &[u8], dst: SocketAddr, meta: Option<&SendMeta>) -> io::Result<usize> {
        if buf.len() > self.shared().pool.data_room() as usize - MAX_HEADERS {
            crate::app_thread::enter();
            self.pending_error()?;
            let path = self.path_for(dst, meta)?;
            self.send_fragments(std::iter::once(buf), buf.len(), dst, &path)?;
            return Ok(buf.len());
        }
        let sb = self.copy_in(buf)?;
        match meta {
            None => self.send_prepared(sb, dst)?,
            Some(_) => {
                self.pending_error()?;
                let path = self.path_for(dst, meta)?;
                self.send_on(sb, dst, path)?;
            }
        }
        Ok(buf.len())
    }

    /// Sends `buf` to the connected peer.
    pub fn send(&self, buf: &[u8]) -> io::Result<usize> {
        let peer = self.state().peer.ok_or_else(|| errno(libc::EDESTADDRREQ, "not connected"))?;
        self.send_with(buf, peer, None)
    }

    fn copy_in(&self, buf: &[u8]) -> io::Result<SendBuf> {
        let mut sb = self.alloc_send_buf(buf.len())?;
        sb.copy_from_slice(buf);
        Ok(sb)
    }

    /// Sends a filled buffer (or a received datagram turned around) to
    /// `addr` without copying its payload.
    pub fn send_buf_to(&self, buf: SendBuf, addr: SocketAddr) -> io::Result<()> {
        let dst = self.destination(addr)?;
        self.send_prepared(buf, dst)
    }

    /// Sends a filled buffer to the connected peer.
    pub fn send_buf(&self, buf: SendBuf) -> io::Result<()> {
        let peer = self.state().peer.ok_or_else(|| errno(libc::EDESTADDRREQ, "not connected"))?;
        self.send_prepared(buf, peer)
    }

    fn send_prepared(&self, buf: SendBuf, dst: SocketAddr) -> io::Result<()> {
        self.pending_error()?;
        let path = self.path_to(dst)?;
        self.send_on(buf, dst, path)
    }

    /// Sends a filled buffer to `dst` by `path`.
    #[inline(always)]
    fn send_on(&self, buf: SendBuf, dst: SocketAddr, path: Path) -> io::Result<()> {
        match self.prepare(buf, dst, path)? {
            Prepared::Packet(pkt) => self.submit(pkt, dst.is_ipv4()),
            Prepared::TooLong(buf, path) => self.send_long(buf, dst, &path),
        }
    }
}

//! A C socket: a spate socket that exists before `bind` (its options
//! kept until then), its descriptor, and the calls on it with Linux's
//! semantics, in safe Rust over slices and addresses (`ffi` turns the
//! C arguments into them). Errors are Linux's errno values.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use spate::{Datagram, DatagramBatch, SendMeta, UdpSocket};

use crate::global;
use crate::readiness::Readiness;

/// A result with Linux's errno as the error.
pub type CResult<T> = Result<T, i32>;

/// The errno of a spate error.
pub fn os(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// Which control messages a receive delivers (bits of `CSocket::cmsgs`).
pub mod want {
    /// `IP_PKTINFO`.
    pub(crate) const PKTINFO: u32 = 1;
    /// `IP_RECVTOS`.
    pub(crate) const TOS: u32 = 2;
    /// `IP_RECVTTL`.
    pub(crate) const TTL: u32 = 4;
    /// `IPV6_RECVPKTINFO`.
    pub(crate) const PKTINFO6: u32 = 8;
    /// `IPV6_RECVTCLASS`.
    pub(crate) const TCLASS: u32 = 16;
    /// `IPV6_RECVHOPLIMIT`.
    pub(crate) const HOPLIMIT: u32 = 32;
    /// `SO_TIMESTAMPNS`.
    pub(crate) const TIMESTAMPNS: u32 = 64;
    /// `UDP_GRO`.
    pub(crate) const GRO: u32 = 128;
}

/// What is set before `bind` and used by it.
#[derive(Debug, Default)]
pub struct BindOptions {
    pub reuseaddr: bool,
    pub reuseport: bool,
    pub v6only: bool,
    /// `SO_RCVBUF` as Linux reports it (twice what was asked).
    pub rcvbuf: Option<usize>,
    /// `SO_BINDTODEVICE`: spate's interface index.
    pub device: Option<u16>,
    /// Options of the bound socket set before `bind`: (level, name,
    /// value), applied in order when it binds.
    pub deferred: Vec<(i32, i32, Vec<u8>)>,
}

/// A C socket.
#[derive(Debug)]
pub struct CSocket {
    /// The descriptor and its readiness.
    pub ready: Arc<Readiness>,
    /// `AF_INET6` (else `AF_INET`).
    pub v6: bool,
    /// The spate socket, once bound (by `bind`, or by `connect` or a
    /// send on an unbound socket, as Linux's autobind).
    bound: OnceLock<UdpSocket>,
    /// Options before `bind`; its lock also orders binding.
    pub setup: Mutex<BindOptions>,
    /// `O_NONBLOCK`.
    pub nonblocking: AtomicBool,
    /// `SO_RCVTIMEO`, `SO_SNDTIMEO` in ns (0: none).
    pub rcvtimeo: AtomicU64,
    pub sndtimeo: AtomicU64,
    /// `SO_SNDBUF` as Linux reports it.
    pub sndbuf: AtomicU32,
    /// Control messages asked for (`want`).
    pub cmsgs: AtomicU32,
    /// `shutdown`: reads end (`SHUT_RD`), writes fail (`SHUT_WR`).
    pub shut_rd: AtomicBool,
    pub shut_wr: AtomicBool,
}

/// What a receive needs of each datagram besides its bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Want {
    /// Its sender (an address to write).
    pub src: bool,
    /// Its metadata (control messages to write).
    pub meta: bool,
}

/// What one received datagram was, besides its bytes.
#[derive(Debug)]
pub struct Received {
    /// Bytes copied into the caller's buffers.
    pub copied: usize,
    /// The datagram's length.
    pub len: usize,
    /// The sender, as the socket's family shows it (when asked for).
    pub src: SocketAddr,
    /// The datagram, for its control messages (`None` for a peek, or not
    /// asked for).
    pub meta: Option<spate::RecvMeta>,
}

impl CSocket {
    /// A new unbound socket of the family.
    pub fn new(v6: bool) -> CResult<Arc<CSocket>> {
        Ok(Self::with(Readiness::new().map_err(os)?, v6))
    }

    /// A new unbound socket of the family under descriptor number `fd`
    /// (see [`Readiness::at`]).
    pub fn at(fd: i32, v6: bool, cloexec: bool) -> CResult<Arc<CSocket>> {
        Ok(Self::with(Readiness::at(fd, cloexec).map_err(os)?, v6))
    }

    fn with(ready: Arc<Readiness>, v6: bool) -> Arc<CSocket> {
        Arc::new(CSocket {
            ready,
            v6,
            bound: OnceLock::new(),
            setup: Mutex::new(BindOptions::default()),
            nonblocking: AtomicBool::new(false),
            rcvtimeo: AtomicU64::new(0),
            sndtimeo: AtomicU64::new(0),
            sndbuf: AtomicU32::new(212_992),
            cmsgs: AtomicU32::new(0),
            shut_rd: AtomicBool::new(false),
            shut_wr: AtomicBool::new(false),
        })
    }

    /// The spate socket, if bound.
    #[inline]
    pub fn bound(&self) -> Option<&UdpSocket> {
        self.bound.get()
    }

    /// `bind`: `EINVAL` when bound already.
    pub fn bind(&self, addr: SocketAddr) -> CResult<()> {
        let mut setup = self.setup.lock().unwrap_or_else(|p| p.into_inner());
        if self.bound.get().is_some() {
            return Err(libc::EINVAL);
        }
        self.bind_locked(&mut setup, addr)
    }

    fn bind_locked(&self, setup: &mut BindOptions, addr: SocketAddr) -> CResult<()> {
        let stack = global::stack()?;
        let mut b =
            UdpSocket::builder(stack).reuseport(setup.reuseport).reuse_address(setup.reuseaddr).only_v6(setup.v6only);
        if let Some(r) = setup.rcvbuf {
            b = b.recv_buffer_size(r);
        }
        if let Some(d) = setup.device {
            b = b.bind_device(d);
        }
        let sock = b.bind(addr).map_err(os)?;
        // The C layer waits itself (signals interrupt it); the spate
        // socket's own mode governs sends only.
        sock.set_nonblocking(self.nonblocking.load(Ordering::Relaxed)).map_err(os)?;
        if let t @ 1.. = self.sndtimeo.load(Ordering::Relaxed) {
            sock.set_write_timeout(Some(Duration::from_nanos(t))).map_err(os)?;
        }
        for (level, name, value) in std::mem::take(&mut setup.deferred) {
            crate::options::set_bound(self, &sock, level, name, &value)?;
        }
        self.shut_spate_socket(&sock);
        let _ = self.bound.set(sock);
        if let Some(sock) = self.bound.get() {
            self.ready.rearm(sock);
        }
        Ok(())
    }

    /// Shuts the spate socket down as this socket was (its readers and
    /// sends see it too); `ENOTCONN` is the caller's to report.
    fn shut_spate_socket(&self, sock: &UdpSocket) {
        let how = match (self.shut_rd.load(Ordering::SeqCst), self.shut_wr.load(Ordering::SeqCst)) {
            (true, true) => std::net::Shutdown::Both,
            (true, false) => std::net::Shutdown::Read,
            (false, true) => std::net::Shutdown::Write,
            (false, false) => return,
        };
        let _ = sock.shutdown(how);
    }

    /// The bound socket, binding to the wildcard address and an
    /// ephemeral port first if it is not (Linux's autobind).
    pub fn autobind(&self) -> CResult<&UdpSocket> {
        if let Some(s) = self.bound.get() {
            return Ok(s);
        }
        let mut setup = self.setup.lock().unwrap_or_else(|p| p.into_inner());
        if self.bound.get().is_none() {
            self.bind_locked(&mut setup, self.any())?;
        }
        drop(setup);
        self.bound.get().ok_or(libc::EINVAL)
    }

    /// `connect`; `None` (`AF_UNSPEC`) disconnects.
    pub fn connect(&self, to: Option<SocketAddr>) -> CResult<()> {
        match to {
            None => match self.bound.get() {
                Some(s) => s.disconnect().map_err(os),
                None => Ok(()),
            },
            Some(a) => self.autobind()?.connect(a).map_err(os),
        }
    }

    /// The local address (the wildcard and port 0 before `bind`).
    pub fn local(&self) -> CResult<SocketAddr> {
        match self.bound.get() {
            Some(s) => s.local_addr().map_err(os),
            None => Ok(self.any()),
        }
    }

    /// The family's wildcard address, port 0.
    fn any(&self) -> SocketAddr {
        match self.v6 {
            true => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
            false => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        }
    }

    /// The connected peer, or `ENOTCONN`.
    pub fn peer(&self) -> CResult<SocketAddr> {
        self.bound.get().ok_or(libc::ENOTCONN)?.peer_addr().map_err(os)
    }

    /// Whether a call may wait: not `O_NONBLOCK`, not `MSG_DONTWAIT`, not
    /// on a polling lcore.
    fn may_wait(&self, flags: i32) -> bool {
        flags & libc::MSG_DONTWAIT == 0 && !self.nonblocking.load(Ordering::Relaxed) && !global::on_lcore()
    }

    /// The receive timeout's deadline, if there is one.
    fn deadline(&self) -> Option<Instant> {
        deadline_after(self.rcvtimeo.load(Ordering::Relaxed))
    }

    /// Sleeps once as a blocking receive does between attempts, also
    /// ending (at once, or when its readiness is notified) once `also`
    /// says so: libspate-preload's receive on a socket with a kernel
    /// socket beside it, whose arrivals set `also` and notify.
    pub fn wait_also(&self, timeout: Option<Duration>, also: impl Fn() -> bool) -> CResult<()> {
        self.ready.sleep(
            || self.bound.get(),
            || also() || self.shut_rd.load(Ordering::SeqCst) || global::is_down(),
            timeout,
        )
    }

    /// Resets the descriptor when the socket has nothing to report (as a
    /// receive does after it takes the last datagram).
    pub fn settle(&self) {
        // Shut down for reading or stopped, the descriptor stays readable.
        if self.shut_rd.load(Ordering::SeqCst) || global::is_down() {
            return;
        }
        if let Some(sock) = self.bound.get() {
            self.ready.settle(sock);
        }
    }

    /// Waits until a receive may find something; `EAGAIN` past
    /// `deadline`, `EINTR` when a signal interrupts.
    fn wait(&self, deadline: Option<Instant>) -> CResult<()> {
        let timeout = time_left(deadline)?;
        self.ready.sleep(|| self.bound.get(), || self.shut_rd.load(Ordering::SeqCst) || global::is_down(), timeout)
    }

    /// Takes up to `max` datagrams into `out`, waiting (as the socket's
    /// mode, `flags` and its timeout allow) for the first only.
    pub fn recv_batch(&self, out: &mut DatagramBatch, max: usize, flags: i32) -> CResult<usize> {
        self.recv_with(flags, |sock| sock.try_recv_batch(out, max))
    }

    /// Hands up to `max` datagrams to `take` one at a time, as
    /// [`UdpSocket::try_recv_each`] does, waiting (as the socket's mode,
    /// `flags` and its timeout allow) for the first only: `Ok(0)` only
    /// when `take` gave the first back (or shut down for reading).
    #[inline]
    pub fn recv_each(
        &self,
        max: usize,
        flags: i32,
        mut take: impl FnMut(Datagram) -> Result<(), Datagram>,
    ) -> CResult<usize> {
        self.recv_with(flags, |sock| sock.try_recv_each(max, &mut take))
    }

    /// A receive: `attempt`, which never waits, on the spate socket until
    /// it finds something, waiting in between as the socket's mode,
    /// `flags` and its timeout allow.
    #[inline]
    fn recv_with(&self, flags: i32, mut attempt: impl FnMut(&UdpSocket) -> io::Result<usize>) -> CResult<usize> {
        let wait = self.may_wait(flags);
        let deadline = if wait { self.deadline() } else { None };
        loop {
            let Some(sock) = self.bound.get() else {
                if global::is_down() {
                    return Err(libc::ENETDOWN);
                }
                if self.shut_rd.load(Ordering::Relaxed) && wait {
                    return Ok(0);
                }
                match wait {
                    true => {
                        self.wait(deadline)?;
                        continue;
                    }
                    false => return Err(libc::EAGAIN),
                }
            };
            let r = attempt(sock);
            let shut = self.shut_rd.load(Ordering::Relaxed);
            // Shut down for reading, the descriptor stays readable.
            if !shut {
                self.ready.settle(sock);
            }
            match r {
                Ok(n) => return Ok(n),
                // Shut down for reading: what was queued, then nothing
                // for a call that would wait (one that would not:
                // EAGAIN, as Linux's).
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && shut && wait => return Ok(0),
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && wait => self.wait(deadline)?,
                Err(e) => return Err(os(e)),
            }
        }
    }

    /// Receives one datagram into `bufs` (scattered in order; bytes past
    /// them are cut off), or with `MSG_PEEK` copies it and leaves it; the
    /// sender and the metadata when `want` asks for them.
    pub fn recv_one(
        &self,
        bufs: &mut [&mut [u8]],
        flags: i32,
        batch: &mut DatagramBatch,
        want: Want,
    ) -> CResult<Received> {
        if flags & libc::MSG_PEEK != 0 {
            return self.peek(bufs, flags);
        }
        batch.clear();
        if self.recv_batch(batch, 1, flags)? == 0 {
            // Shut down for reading: an empty read, as Linux's.
            return Ok(Received { copied: 0, len: 0, src: self.local()?, meta: None });
        }
        let d = batch.drain().next().ok_or(libc::EAGAIN)?;
        Ok(self.deliver(&d, bufs, want))
    }

    /// The datagram `d` copied into `bufs`, and what `want` asks of it
    /// (reading its headers costs as much as the copy of a small one).
    #[inline]
    pub fn deliver(&self, d: &Datagram, bufs: &mut [&mut [u8]], want: Want) -> Received {
        let copied = scatter(d, bufs);
        let (src, meta) = match want {
            Want { meta: true, .. } => {
                let mut meta = d.meta();
                meta.src = self.present(meta.src);
                meta.dst = self.present(meta.dst);
                (meta.src, Some(meta))
            }
            Want { src: true, .. } => (self.present(d.src()), None),
            _ => (self.any(), None),
        };
        Received { copied, len: d.len(), src, meta }
    }

    fn peek(&self, bufs: &mut [&mut [u8]], flags: i32) -> CResult<Received> {
        let wait = self.may_wait(flags);
        let deadline = if wait { self.deadline() } else { None };
        loop {
            let sock = match self.bound.get() {
                Some(s) => s,
                None if global::is_down() => return Err(libc::ENETDOWN),
                None if wait && self.shut_rd.load(Ordering::SeqCst) => {
                    return Ok(Received { copied: 0, len: 0, src: self.local()?, meta: None });
                }
                None if wait => {
                    self.wait(deadline)?;
                    continue;
                }
                None => return Err(libc::EAGAIN),
            };
            let len = sock.next_len();
            let r = match (len, &mut *bufs) {
                (Some(len), [one]) => sock.try_peek_from(one).map(|(n, src)| (n, len, src)),
                (Some(len), bufs) => {
                    let mut tmp = vec![0u8; len];
                    sock.try_peek_from(&mut tmp)
                        .map(|(n, src)| (scatter_segments(std::iter::once(&tmp[..n]), bufs), len, src))
                }
                (None, _) => Err(std::io::Error::from_raw_os_error(libc::EAGAIN)),
            };
            match r {
                Ok((copied, len, src)) => return Ok(Received { copied, len, src, meta: None }),
                // Shut down for reading, nothing queued: an empty read.
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && wait && self.shut_rd.load(Ordering::SeqCst) => {
                    return Ok(Received { copied: 0, len: 0, src: self.local()?, meta: None });
                }
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && wait => self.wait(deadline)?,
                Err(e) => return Err(os(e)),
            }
        }
    }

    /// An address as this socket's family shows it (IPv4 as mapped on an
    /// IPv6 socket).
    pub fn present(&self, a: SocketAddr) -> SocketAddr {
        match (self.v6, a) {
            (true, SocketAddr::V4(v4)) => SocketAddr::V6(SocketAddrV6::new(v4.ip().to_ipv6_mapped(), v4.port(), 0, 0)),
            _ => a,
        }
    }

    /// Sends the bytes of `bufs` (gathered) as one datagram to `to`, or
    /// to the connected peer.
    pub fn send(&self, bufs: &[&[u8]], to: Option<SocketAddr>, meta: &SendMeta, flags: i32) -> CResult<usize> {
        if flags & (libc::MSG_OOB | libc::MSG_MORE) != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        if self.shut_wr.load(Ordering::Relaxed) {
            return Err(libc::EPIPE);
        }
        let sock = match to {
            Some(_) => self.autobind()?,
            None => self.bound.get().ok_or(libc::EDESTADDRREQ)?,
        };
        let to = match to {
            Some(a) => a,
            None => sock.peer_addr().map_err(|_| libc::EDESTADDRREQ)?,
        };
        let dontwait = flags & libc::MSG_DONTWAIT != 0 || global::on_lcore();
        // A datagram sent whole or not at all waits here, where a signal
        // interrupts the wait; segments, which may go in part, in spate.
        // So do IP fragments (a datagram past one mbuf's room, 1,400
        // bytes being well within it).
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let segmented = total > ONE_MBUF || meta.segment_size.is_some() || sock.segment_size().map_err(os)?.is_some();
        let plain = *meta == SendMeta::default();
        let send = |buf: &[u8]| match (dontwait, segmented, plain) {
            (false, false, _) => self.send_waiting(sock, buf, to, meta),
            (false, true, true) => sock.send_to(buf, to),
            (false, true, false) => sock.send_msg_to(buf, to, meta),
            (true, ..) => sock.try_send_msg_to(buf, to, meta),
        };
        let r = match bufs {
            [one] => send(one),
            // Gathered into the thread's buffer (no allocation once warm).
            many => GATHER.with(|g| {
                let mut g = g.borrow_mut();
                g.clear();
                for b in many {
                    g.extend_from_slice(b);
                }
                send(&g)
            }),
        };
        r.map_err(os)
    }

    /// One datagram to `to`, waiting while the lcore's queue is full (as
    /// the socket's mode and `SO_SNDTIMEO` allow) on the thread's own
    /// descriptor: `EINTR` when a signal handler runs (a wait without a
    /// timeout restarts after one installed with `SA_RESTART`), `EAGAIN`
    /// past the timeout.
    fn send_waiting(&self, sock: &UdpSocket, buf: &[u8], to: SocketAddr, meta: &SendMeta) -> std::io::Result<usize> {
        let deadline = deadline_after(self.sndtimeo.load(Ordering::Relaxed));
        loop {
            match sock.try_send_msg_to(buf, to, meta) {
                // A stack that does not run drains nothing: EAGAIN.
                Err(e)
                    if e.raw_os_error() == Some(libc::EAGAIN)
                        && !self.nonblocking.load(Ordering::Relaxed)
                        && sock.stack().is_running() =>
                {
                    let Ok(timeout) = time_left(deadline) else { return Err(e) };
                    crate::readiness::sleep_until_writable(sock, timeout).map_err(std::io::Error::from_raw_os_error)?;
                }
                r => return r,
            }
        }
    }

    /// `FIONREAD`: the next datagram's length, 0 when none.
    pub fn next_len(&self) -> usize {
        self.bound.get().and_then(|s| s.next_len()).unwrap_or(0)
    }

    /// `O_NONBLOCK` on or off.
    pub fn set_nonblocking(&self, on: bool) -> CResult<()> {
        self.nonblocking.store(on, Ordering::Relaxed);
        if let Some(s) = self.bound.get() {
            s.set_nonblocking(on).map_err(os)?;
        }
        Ok(())
    }

    /// `shutdown(how)`.
    pub fn shutdown(&self, how: i32) -> CResult<()> {
        let (rd, wr) = match how {
            libc::SHUT_RD => (true, false),
            libc::SHUT_WR => (false, true),
            libc::SHUT_RDWR => (true, true),
            _ => return Err(libc::EINVAL),
        };
        // Linux: an unconnected UDP socket is not connected (ENOTCONN),
        // yet the shutdown takes effect.
        let connected = self.bound.get().is_some_and(|s| s.peer_addr().is_ok());
        if rd {
            self.shut_rd.store(true, Ordering::SeqCst);
        }
        if wr {
            self.shut_wr.store(true, Ordering::SeqCst);
        }
        if let Some(sock) = self.bound.get() {
            self.shut_spate_socket(sock);
        }
        self.ready.notify();
        if connected { Ok(()) } else { Err(libc::ENOTCONN) }
    }
}

/// The deadline of a timeout of `ns` nanoseconds (0: none), from now.
fn deadline_after(ns: u64) -> Option<Instant> {
    (ns != 0).then(|| Instant::now() + Duration::from_nanos(ns))
}

/// What is left until `deadline` (`None`: no deadline), or `EAGAIN` once
/// it passed.
fn time_left(deadline: Option<Instant>) -> CResult<Option<Duration>> {
    match deadline.map(|d| d.checked_duration_since(Instant::now())) {
        None => Ok(None),
        Some(Some(t)) if !t.is_zero() => Ok(Some(t)),
        Some(_) => Err(libc::EAGAIN),
    }
}

/// Bytes a datagram surely sends in one mbuf, headers added.
const ONE_MBUF: usize = 1400;

thread_local! {
    /// A send's iovecs gathered.
    static GATHER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Copies datagram `d` into `bufs` in order; returns the bytes copied.
#[inline]
pub fn scatter(d: &Datagram, bufs: &mut [&mut [u8]]) -> usize {
    if let [one] = bufs {
        return d.copy_to(one);
    }
    scatter_segments(d.segments(), bufs)
}

/// Copies `segments` into `bufs` in order; returns the bytes copied.
fn scatter_segments<'a>(segments: impl Iterator<Item = &'a [u8]>, bufs: &mut [&mut [u8]]) -> usize {
    let (mut b, mut at, mut copied) = (0, 0, 0);
    for mut seg in segments {
        while !seg.is_empty() {
            let Some(buf) = bufs.get_mut(b) else { return copied };
            let k = (buf.len() - at).min(seg.len());
            buf[at..at + k].copy_from_slice(&seg[..k]);
            (at, copied, seg) = (at + k, copied + k, &seg[k..]);
            if at == buf.len() {
                (b, at) = (b + 1, 0);
            }
        }
    }
    copied
}

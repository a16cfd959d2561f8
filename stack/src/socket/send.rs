//! The send path of a socket: the route and source address, UDP and IP
//! headers written in place, datagrams larger than the path MTU as IP
//! fragments, UDP GSO segments, and the hand-off to the transmit path (the
//! lcore's own queue inside its callback, else the socket's lcore's inbox).

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Instant as StdInstant;

use arrayvec::ArrayVec;

use super::{DEFAULT_TTL, UdpSocket, errno};
use crate::datagram::{SendBuf, SendMeta};
use crate::hdr::{MAX_HEADERS, MAX_UDP_PAYLOAD_V4, MAX_UDP_PAYLOAD_V6, Udp4, UdpHeaders, push_udp_ip, push_udp_ipv4};
use crate::lookup::Family;
use crate::shared::{LOCAL_TX, TxPacket, mark_mcast_loop};
use crate::stats::Counter;
use crate::wire::{ipv4, ipv6, udp};

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
    /// task in `cx` is woken once the lcore drains it.
    pub fn poll_writable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let inbox = &self.shared().inbox[self.tx_worker];
        let shared = self.shared();
        // A stack stopping after the registration wakes it; one that
        // stopped before it, or is stopping, never drains: try again now.
        if !inbox.is_full()
            || crate::shared::in_callback(shared)
            || !inbox.register_waker(cx.waker())
            || !shared.is_running()
            || shared.should_stop()
        {
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

    /// The path of one send: the socket's, or what `meta` makes of it.
    fn path_for(&self, dst: SocketAddr, meta: Option<&SendMeta>) -> io::Result<Path> {
        let Some(meta) = meta else { return self.path_to(dst) };
        let src = match meta.src_ip {
            None => None,
            Some(ip) if ip.is_unspecified() => None,
            Some(ip) => {
                let ip = crate::addr::normalize(SocketAddr::new(ip, 0)).ip();
                if ip.is_ipv4() != dst.is_ipv4() {
                    return Err(errno(libc::EINVAL, "source and destination of different families"));
                }
                if !self.shared().is_local(&ip) {
                    return Err(errno(libc::EADDRNOTAVAIL, "the source is not an address of this stack"));
                }
                Some(ip)
            }
        };
        let mut path = self.path_from(dst, src)?;
        if let Some(ecn) = meta.ecn {
            path.tos = (path.tos & !3) | ecn as u8;
        }
        match meta.ttl {
            Some(0) if dst.is_ipv4() => return Err(errno(libc::EINVAL, "a TTL of 0")),
            Some(ttl) => path.ttl = ttl,
            None => {}
        }
        Ok(path)
    }

    /// Sends `buf` to the connected peer.
    pub fn send(&self, buf: &[u8]) -> io::Result<usize> {
        let peer = self.state().peer.ok_or_else(|| errno(libc::EDESTADDRREQ, "not connected"))?;
        self.send_with(buf, peer, None)
    }

    /// Sends `buf` to `addr` as datagrams of `segment` bytes each (the last
    /// one possibly shorter), in one call: Linux's UDP GSO (`UDP_SEGMENT`),
    /// segmented in software. Errors as Linux gives them: a segment that
    /// does not fit the path MTU with its headers is `EMSGSIZE`, as is a
    /// payload longer than one IP datagram could carry; a segment size of
    /// 0, or more than [`GSO_MAX_SEGMENTS`] segments, is `EINVAL`. Returns
    /// `buf.len()`.
    pub fn send_to_segmented(&self, buf: &[u8], segment: usize, addr: impl ToSocketAddrs) -> io::Result<usize> {
        let addr = addr.to_socket_addrs()?.next().ok_or_else(|| errno(libc::EINVAL, "no address"))?;
        let dst = self.destination(addr)?;
        self.send_segments(buf, segment, dst, None)
    }

    /// Sets a segment size for every later `send` and `send_to` longer than
    /// it (Linux's `UDP_SEGMENT` socket option); `None` turns it off.
    pub fn set_segment_size(&self, segment: Option<u16>) -> io::Result<()> {
        if segment == Some(0) {
            return Err(errno(libc::EINVAL, "segment size 0"));
        }
        self.inner.gso_size.store(segment.unwrap_or(0) as u32, Ordering::Relaxed);
        Ok(())
    }

    /// The segment size set with [`set_segment_size`](Self::set_segment_size).
    pub fn segment_size(&self) -> io::Result<Option<u16>> {
        Ok(match self.inner.gso_size.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n as u16),
        })
    }

    fn send_segments(&self, buf: &[u8], segment: usize, dst: SocketAddr, meta: Option<&SendMeta>) -> io::Result<usize> {
        crate::app_thread::enter();
        self.pending_error()?;
        if segment == 0 {
            return Err(errno(libc::EINVAL, "segment size 0"));
        }
        let shared = self.shared();
        let v4 = dst.is_ipv4();
        let path = self.path_for(dst, meta)?;
        let (port, connected, route) = (path.port, path.peer == Some(dst), path.route);
        let ip_hdr = if v4 { ipv4::HEADER_LEN } else { ipv6::HEADER_LEN };
        let max_payload = if v4 { MAX_UDP_PAYLOAD_V4 } else { MAX_UDP_PAYLOAD_V6 };
        if segment + udp::HEADER_LEN + ip_hdr > route.mtu as usize {
            return Err(errno(libc::EMSGSIZE, "segment larger than the path MTU allows"));
        }
        if buf.len() > max_payload {
            return Err(errno(libc::EMSGSIZE, "longer than one IP datagram"));
        }
        let count = buf.len().div_ceil(segment).max(1);
        if count > GSO_MAX_SEGMENTS {
            return Err(errno(libc::EINVAL, "more segments than UDP GSO allows"));
        }
        // Every mbuf first: all the segments go, or none.
        let mut mbufs: spate_dpdk::Burst<GSO_MAX_SEGMENTS> = spate_dpdk::Burst::new();
        shared.pool.alloc_bulk(&mut mbufs, count).map_err(|_| self.mem_error())?;
        let src = SocketAddr::new(route.src, port);
        let first_ident = match src.ip() {
            IpAddr::V4(_) if connected => self.core.ident.fetch_add(count as u32, Ordering::Relaxed) as u16,
            _ => 0,
        };
        for (i, mut m) in mbufs.drain().enumerate() {
            let chunk = &buf[(i * segment).min(buf.len())..((i + 1) * segment).min(buf.len())];
            let room = m.append(chunk.len()).map_err(|_| errno(libc::EMSGSIZE, "segment longer than one mbuf"))?;
            room.copy_from_slice(chunk);
            let ident = if connected { first_ident.wrapping_add(i as u16) } else { 0 };
            let (ttl, tos) = (path.ttl, path.tos);
            let headers =
                UdpHeaders { src, dst, ident, dont_frag: true, ttl, tos, zero_checksum: false, known_checksum: None };
            push_udp_ip(&mut m, &headers, route.offload).map_err(|e| errno(libc::EMSGSIZE, e))?;
            mark_mcast_loop(&mut m, path.mcast_loop);
            let pkt = TxPacket { mbuf: m, iface: route.iface, next_hop: route.next_hop, datagram: true };
            if let Err(e) = self.submit(pkt, v4) {
                if i == 0 {
                    return Err(e);
                }
                // Some segments went: the rest are lost (counted in
                // SndbufErrors by the refusal), as on a lossy path; a
                // retry would send the first ones twice.
                return Ok(buf.len());
            }
        }
        // Once per call, from the sending thread (an atomic add each on
        // the shared block, amortised over up to 128 segments).
        let stats = shared.stats.shared();
        stats.add_shared(Counter::GsoSends, 1);
        stats.add_shared(Counter::GsoSegments, count as u64);
        Ok(buf.len())
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

    /// The socket's local port and connected peer, and the route to
    /// `dst`'s address from its bound address (the last send's when it went
    /// to the same address from the same one), under one lock; the path MTU
    /// applied; the socket's TTL and TOS for the family. All of it depends
    /// on `dst`'s address alone, not its port. Inlined: out of line, its
    /// result goes through memory on every send.
    #[inline(always)]
    fn path_to(&self, dst: SocketAddr) -> io::Result<Path> {
        self.path_from(dst, None)
    }

    /// [`path_to`](Self::path_to) from source address `src` (one of the
    /// stack's, of `dst`'s family) instead of the bound one.
    #[inline(always)]
    fn path_from(&self, dst: SocketAddr, src: Option<IpAddr>) -> io::Result<Path> {
        let shared = self.shared();
        let mut st = self.lock_state();
        if st.shut_write {
            return Err(errno(libc::EPIPE, "shut down for writing"));
        }
        let local = src.unwrap_or(st.local.ip());
        let net_gen = shared.net_generation();
        let mut route = match st.last_route {
            Some((d, l, r)) if d == dst.ip() && l == local && st.route_gen == net_gen => r,
            _ => {
                let net = shared.net();
                let bound_ip = super::bound_source(local).filter(|ip| ip.is_ipv4() == dst.is_ipv4());
                super::check_source(&net, bound_ip)?;
                let found = net.routes.socket_route(&net.ifaces, &dst.ip(), bound_ip.as_ref(), st.ip.mcast_if);
                let Some(r) = found else {
                    let c = if dst.is_ipv4() { Counter::IpOutNoRoutes } else { Counter::Ip6OutNoRoutes };
                    shared.stats.shared().add_shared(c, 1);
                    return Err(errno(libc::ENETUNREACH, "no route"));
                };
                super::check_broadcast(&net, &dst.ip(), &r, st.ip.broadcast)?;
                st.last_route = Some((dst.ip(), local, r));
                st.route_gen = net_gen;
                r
            }
        };
        if let Some(mtu) = shared.pmtu.get(&dst.ip()) {
            route.mtu = route.mtu.min(mtu);
        }
        let (mut ttl, tos) = st.ip.for_family(dst.is_ipv4());
        let mut mcast_loop = false;
        if dst.ip().is_multicast() {
            (ttl, mcast_loop) = match dst.is_ipv4() {
                true => (st.ip.mcast_ttl, st.ip.mcast_loop_v4),
                false => (st.ip.mcast_hops, st.ip.mcast_loop_v6),
            };
        }
        Ok(Path { port: st.local.port(), peer: st.peer, route, ttl, tos, mcast_loop })
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

    /// Sends each buffer to its address, as `sendmmsg` does: one call for
    /// a batch, its datagrams handed to the transmit path together, the
    /// route looked up once for consecutive datagrams to one place. Each
    /// datagram stands alone: one that cannot be sent (a bad address, a
    /// full queue) is dropped and counted as its own send would count it,
    /// and the rest still go. Returns how many were sent, or, when none
    /// could be, the first error.
    pub fn send_batch_to<I>(&self, msgs: I) -> io::Result<usize>
    where
        I: IntoIterator<Item = (SendBuf, SocketAddr)>,
    {
        self.pending_error()?;
        let mut batch = Batch::new();
        for (buf, addr) in msgs {
            // IPv4, the common case (IPv4-mapped on an IPv6 socket too),
            // with its addresses by value.
            let to = match addr {
                SocketAddr::V4(d) => Ok(d),
                SocketAddr::V6(a) if self.family == Family::V6 => {
                    let (o, port) = (a.ip().octets(), a.port());
                    match o[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
                        true => Ok(SocketAddrV4::new(Ipv4Addr::new(o[12], o[13], o[14], o[15]), port)),
                        false => Err(addr),
                    }
                }
                SocketAddr::V6(_) => Err(addr),
            };
            self.batch_one(&mut batch, buf, to);
        }
        self.batch_end(&mut batch)
    }

    /// Sends each buffer back to the sender of the datagram it was made
    /// from ([`Datagram::into_send_buf`](crate::Datagram::into_send_buf)),
    /// from this socket, as [`send_batch_to`](Self::send_batch_to) sends
    /// each to its address: a service's replies, the destination read
    /// from the request's headers in the buffer's headroom instead of
    /// passed as a `SocketAddr`. A buffer not made from a received
    /// datagram fails on its own with `EDESTADDRREQ`; one made from a
    /// coalesced datagram (UDP GRO) goes back as one datagram, as
    /// `send_batch_to` would send it. Returns how many were sent, or, when
    /// none could be, the first error.
    #[inline(always)]
    pub fn send_replies<I>(&self, bufs: I) -> io::Result<usize>
    where
        I: IntoIterator<Item = SendBuf>,
    {
        self.pending_error()?;
        let mut batch = Batch::new();
        for buf in bufs {
            match buf.reply_to() {
                Some(to) => self.batch_one(&mut batch, buf, to),
                None => {
                    batch.first_error.get_or_insert(errno(libc::EDESTADDRREQ, "not made from a received datagram"));
                }
            }
        }
        self.batch_end(&mut batch)
    }

    /// One datagram of a batch send to `to` (an IPv4 destination by
    /// value, or any): staged, or sent as fragments after what was staged
    /// before it; a failure kept as the batch's first error.
    #[inline(always)]
    fn batch_one(&self, b: &mut Batch, buf: SendBuf, to: Result<SocketAddrV4, SocketAddr>) {
        let (buf, addr) = match to {
            Ok(d) => match self.prepare_v4(buf, d, &mut b.last4) {
                Ok(Ok(pkt)) => {
                    b.staged.push(pkt);
                    if b.staged.is_full() {
                        b.sent += self.submit_staged(&mut b.staged, &mut b.first_error);
                    }
                    return;
                }
                Ok(Err(buf)) => (buf, SocketAddr::V4(d)),
                Err(e) => {
                    b.first_error.get_or_insert(e);
                    return;
                }
            },
            Err(addr) => (buf, addr),
        };
        let step = self.destination(addr).and_then(|dst| {
            let path = match b.last {
                Some((ip, p)) if ip == dst.ip() => p,
                _ => {
                    let p = self.path_to(dst)?;
                    b.last = Some((dst.ip(), p));
                    p
                }
            };
            match self.prepare(buf, dst, path)? {
                Prepared::Packet(pkt) => b.staged.push(pkt),
                Prepared::TooLong(buf, path) => {
                    // After what was staged before it, in order.
                    b.sent += self.submit_staged(&mut b.staged, &mut b.first_error);
                    self.send_long(buf, dst, &path)?;
                    b.sent += 1;
                }
            }
            Ok(())
        });
        if let Err(e) = step {
            b.first_error.get_or_insert(e);
        }
        if b.staged.is_full() {
            b.sent += self.submit_staged(&mut b.staged, &mut b.first_error);
        }
    }

    /// Hands over what is left of a batch send; how many went, or the
    /// first error when none did.
    #[inline(always)]
    fn batch_end(&self, b: &mut Batch) -> io::Result<usize> {
        b.sent += self.submit_staged(&mut b.staged, &mut b.first_error);
        match b.first_error.take() {
            Some(e) if b.sent == 0 => Err(e),
            _ => Ok(b.sent),
        }
    }

    /// [`prepare`](Self::prepare) for an IPv4 destination, the addresses
    /// kept by value; `last` keeps the path of the batch's last IPv4
    /// destination. A buffer comes back (`Ok(Err)`) for the general path:
    /// longer than the path MTU, or a socket whose source is not IPv4.
    #[inline(always)]
    fn prepare_v4(
        &self,
        mut buf: SendBuf,
        d: SocketAddrV4,
        last: &mut Option<Path4>,
    ) -> io::Result<Result<TxPacket, SendBuf>> {
        self.v4_destination(d)?;
        let path = match *last {
            Some(p) if p.dst == *d.ip() => p,
            _ => {
                let p = self.path_to(SocketAddr::V4(d))?;
                let (IpAddr::V4(src), IpAddr::V4(next_hop)) = (p.route.src, p.route.next_hop) else {
                    return Ok(Err(buf));
                };
                let peer = match p.peer {
                    Some(SocketAddr::V4(a)) => Some(a),
                    _ => None,
                };
                let (iface, mtu, ttl, tos) = (p.route.iface, p.route.mtu, p.ttl, p.tos);
                let offload = p.route.offload;
                let plain = ttl == DEFAULT_TTL && tos == 0;
                *last = Some(Path4 {
                    dst: *d.ip(),
                    src,
                    port: p.port,
                    peer,
                    iface,
                    mtu,
                    next_hop,
                    ttl,
                    tos,
                    offload,
                    plain,
                    mcast_loop: p.mcast_loop,
                });
                last.expect("just set")
            }
        };
        if buf.len() + udp::HEADER_LEN + ipv4::HEADER_LEN > path.mtu as usize {
            return Ok(Err(buf));
        }
        let src = SocketAddrV4::new(path.src, path.port);
        // As `prepare`: connected sockets count IDs, others send 0.
        let ident = if path.peer == Some(d) { self.core.ident.fetch_add(1, Ordering::Relaxed) as u16 } else { 0 };
        buf.mbuf.set_ol_flags(0);
        let known = buf.reply_checksum_v4(src, d);
        let offload = path.offload;
        // Two copies of the header writer: with Linux's defaults, the TTL
        // and TOS are constants folded into the header and its checksum
        // (the common case, 20 instructions less per datagram).
        let pushed = if path.plain {
            push_udp_ipv4(&mut buf.mbuf, src, d, Udp4::datagram(ident, DEFAULT_TTL, 0), known, offload)
        } else {
            push_udp_ipv4(&mut buf.mbuf, src, d, Udp4::datagram(ident, path.ttl, path.tos), known, offload)
        };
        pushed.map_err(|e| errno(libc::EMSGSIZE, e))?;
        mark_mcast_loop(&mut buf.mbuf, path.mcast_loop);
        Ok(Ok(TxPacket { mbuf: buf.mbuf, iface: path.iface, next_hop: IpAddr::V4(path.next_hop), datagram: true }))
    }

    /// The packet for one send to `dst` by `route`: headers written in
    /// front of the payload. A datagram longer than the path comes back,
    /// to go as fragments.
    #[inline(always)]
    fn prepare(&self, mut buf: SendBuf, dst: SocketAddr, path: Path) -> io::Result<Prepared> {
        let v4 = dst.is_ipv4();
        let ip_hdr = if v4 { ipv4::HEADER_LEN } else { ipv6::HEADER_LEN };
        let (route, connected) = (path.route, path.peer == Some(dst));
        if buf.len() + udp::HEADER_LEN + ip_hdr > route.mtu as usize {
            return Ok(Prepared::TooLong(buf, path));
        }
        let src = SocketAddr::new(route.src, path.port);
        // Linux: connected sockets count on their own; unconnected
        // datagrams that may not be fragmented carry 0 (RFC 6864).
        let ident = if v4 && connected { self.core.ident.fetch_add(1, Ordering::Relaxed) as u16 } else { 0 };
        buf.mbuf.set_ol_flags(0);
        let known_checksum = buf.reply_checksum(&src, &dst);
        let (ttl, tos) = (path.ttl, path.tos);
        let headers = UdpHeaders { src, dst, ident, dont_frag: true, ttl, tos, zero_checksum: false, known_checksum };
        push_udp_ip(&mut buf.mbuf, &headers, route.offload).map_err(|e| errno(libc::EMSGSIZE, e))?;
        mark_mcast_loop(&mut buf.mbuf, path.mcast_loop);
        Ok(Prepared::Packet(TxPacket { mbuf: buf.mbuf, iface: route.iface, next_hop: route.next_hop, datagram: true }))
    }

    /// Sends a datagram longer than the path as fragments, copied out of
    /// its buffer.
    #[cold]
    fn send_long(&self, buf: SendBuf, dst: SocketAddr, path: &Path) -> io::Result<()> {
        let len = buf.len();
        self.send_fragments(buf.mbuf.segment_data(), len, dst, path)
    }

    /// Sends a datagram larger than the path MTU as IP fragments (unless
    /// the socket asked for don't-fragment: then `EMSGSIZE`, as Linux's
    /// `IP_PMTUDISC_DO`). IPv4 fragments carry an ID from the generator
    /// (they are not atomic); IPv6 ones a random 32-bit identification.
    fn send_fragments<'a>(
        &self,
        parts: impl Iterator<Item = &'a [u8]> + Clone,
        len: usize,
        dst: SocketAddr,
        path: &Path,
    ) -> io::Result<()> {
        let (route, local_port) = (path.route, path.port);
        let shared = self.shared();
        let v4 = dst.is_ipv4();
        let (fails, oks, creates) = if v4 {
            (Counter::IpFragFails, Counter::IpFragOKs, Counter::IpFragCreates)
        } else {
            (Counter::Ip6FragFails, Counter::Ip6FragOKs, Counter::Ip6FragCreates)
        };
        let max = if v4 { MAX_UDP_PAYLOAD_V4 } else { MAX_UDP_PAYLOAD_V6 };
        if len > max {
            return Err(errno(libc::EMSGSIZE, "longer than one IP datagram"));
        }
        if self.inner.dont_fragment.load(Ordering::Relaxed) {
            shared.stats.shared().add_shared(fails, 1);
            return Err(errno(libc::EMSGSIZE, "larger than the path MTU and don't-fragment is set"));
        }
        let src = SocketAddr::new(route.src, local_port);
        let ident = match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => shared.ip_id.reserve(s, d, crate::wire::ip_proto::UDP, 1) as u32,
            _ => crate::ip_id::random_u32(),
        };
        let plan = crate::frag::fragment::Plan {
            src,
            dst,
            mtu: route.mtu as usize,
            ident,
            ttl: path.ttl,
            tos: path.tos,
            offload_ip_checksum: route.offload,
        };
        let mut out: spate_dpdk::Burst<{ crate::frag::fragment::MAX_FRAGMENTS }> = spate_dpdk::Burst::new();
        let n = crate::frag::fragment::fragment_udp(&shared.pool, &plan, parts, len, &mut out).map_err(|e| {
            shared.stats.shared().add_shared(fails, 1);
            match e {
                crate::frag::fragment::FragError::NoMbufs => self.mem_error(),
                crate::frag::fragment::FragError::TooLong => {
                    errno(libc::EMSGSIZE, "cannot be fragmented to the path MTU")
                }
            }
        })?;
        for (i, mut m) in out.drain().enumerate() {
            mark_mcast_loop(&mut m, path.mcast_loop);
            let pkt = TxPacket { mbuf: m, iface: route.iface, next_hop: route.next_hop, datagram: i == 0 };
            if let Err(e) = self.submit(pkt, v4) {
                if i == 0 {
                    return Err(e);
                }
                // A fragment went: the datagram is lost at the receiver
                // (the refusal counted), not sent again with a new ID.
                break;
            }
        }
        let stats = shared.stats.shared();
        stats.add_shared(oks, 1);
        stats.add_shared(creates, n as u64);
        Ok(())
    }

    /// Asks that datagrams never be fragmented (Linux's `IP_MTU_DISCOVER`
    /// with `IP_PMTUDISC_DO`, `IPV6_DONTFRAG`): a send larger than the
    /// path MTU fails with `EMSGSIZE`. Off by default: larger datagrams are
    /// fragmented, smaller ones go with DF set so routers report the path
    /// MTU (`IP_PMTUDISC_WANT`).
    pub fn set_dont_fragment(&self, on: bool) -> io::Result<()> {
        self.inner.dont_fragment.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Whether don't-fragment is asked for.
    pub fn dont_fragment(&self) -> io::Result<bool> {
        Ok(self.inner.dont_fragment.load(Ordering::Relaxed))
    }

    /// Hands a packet to the transmit path: the lcore's own queue when
    /// called from its callback (finished there when it goes to the
    /// lcore's direct neighbour), else the inbox of this socket's lcore.
    fn submit(&self, pkt: TxPacket, v4: bool) -> io::Result<()> {
        self.submit_waking(pkt, v4, true)
    }

    /// `submit`, ringing the lcore for a packet queued in its inbox only
    /// if `wake` (a batch rings it once, after its last packet); a sender
    /// about to wait for room always rings it first.
    fn submit_waking(&self, pkt: TxPacket, v4: bool, wake: bool) -> io::Result<()> {
        let shared = self.shared();
        let pkt = match LOCAL_TX.with(|l| match &mut *l.borrow_mut() {
            Some(local) if local.stack_id == shared.id => local.take(pkt).map_err(Err),
            _ => Err(Ok(pkt)),
        }) {
            Ok(()) => return Ok(()),
            Err(Err(_full)) => return Err(self.sndbuf_error(v4)),
            Err(Ok(pkt)) => pkt,
        };
        let inbox = &shared.inbox[self.tx_worker];
        let pkt = match inbox.push(pkt) {
            Ok(()) => {
                if wake {
                    shared.wake(self.tx_worker);
                }
                return Ok(());
            }
            Err(p) => p,
        };
        if self.inner.nonblocking.load(Ordering::Relaxed) || NO_WAIT.get() || !shared.is_running() {
            return Err(self.sndbuf_error(v4));
        }
        // What this batch queued so far must be taken for room to come.
        shared.wake(self.tx_worker);
        // Backpressure: sleep until the lcore drains the inbox (it wakes
        // waiting senders), the timeout passes or the stack stops.
        let timeout = *self.inner.write_timeout.lock().unwrap_or_else(|p| p.into_inner());
        let deadline = timeout.map(|t| StdInstant::now() + t);
        match inbox.push_wait(pkt, deadline, || shared.is_running() && !shared.should_stop()) {
            Ok(()) => {
                shared.wake(self.tx_worker);
                Ok(())
            }
            Err(_) => Err(self.sndbuf_error(v4)),
        }
    }

    /// Hands the staged packets to the transmit path in one go (the
    /// lcore's own queue inside its callback, frames finished there for
    /// its direct neighbour; else one by one into the lcore's inbox, which
    /// is rung once at the end); returns how many went, keeping the first
    /// error of those that did not.
    fn submit_staged(&self, staged: &mut Staged, first_error: &mut Option<io::Error>) -> usize {
        let shared = self.shared();
        let n = staged.len();
        if n == 0 {
            return 0;
        }
        let local = LOCAL_TX.with(|l| match &mut *l.borrow_mut() {
            Some(local) if local.stack_id == shared.id && local.has_room(n) => {
                for pkt in staged.drain() {
                    // Room checked above: never refused.
                    let _ = local.take(pkt);
                }
                true
            }
            _ => false,
        });
        if local {
            return n;
        }
        let mut sent = 0;
        for pkt in staged.drain() {
            let v4 = pkt.next_hop.is_ipv4();
            match self.submit_waking(pkt, v4, false) {
                Ok(()) => sent += 1,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if sent > 0 {
            shared.wake(self.tx_worker);
        }
        sent
    }

    fn sndbuf_error(&self, v4: bool) -> io::Error {
        let c = if v4 { Counter::UdpSndbufErrors } else { Counter::Udp6SndbufErrors };
        self.shared().stats.shared().add_shared(c, 1);
        io::Error::from_raw_os_error(libc::EAGAIN)
    }
}

/// Where a socket's sends to one address go (see [`UdpSocket::path_to`]).
#[derive(Clone, Copy)]
struct Path {
    port: u16,
    peer: Option<SocketAddr>,
    route: crate::route::Route,
    /// TTL or hop limit.
    ttl: u8,
    /// TOS or traffic class.
    tos: u8,
    /// To a group, looped back to local members too.
    mcast_loop: bool,
}

/// What a batch's datagrams to one IPv4 destination share, compact (a
/// [`Path`] is four times its size, and was copied for every batch).
#[derive(Clone, Copy)]
struct Path4 {
    dst: Ipv4Addr,
    src: Ipv4Addr,
    port: u16,
    /// The connected peer, when it is an IPv4 one.
    peer: Option<SocketAddrV4>,
    iface: u16,
    mtu: u16,
    next_hop: Ipv4Addr,
    ttl: u8,
    tos: u8,
    /// The interface computes the checksums.
    offload: bool,
    /// TTL and TOS are Linux's defaults.
    plain: bool,
    /// To a group, looped back to local members too.
    mcast_loop: bool,
}

/// What [`UdpSocket::prepare`] made of a send.
enum Prepared {
    /// Headers written: ready for the transmit path.
    Packet(TxPacket),
    /// Longer than the path MTU: to be fragmented.
    TooLong(SendBuf, Path),
}

/// A batch send under way: what is staged, what went, the first error,
/// and the paths of its last destinations.
struct Batch {
    staged: Staged,
    sent: usize,
    first_error: Option<io::Error>,
    last: Option<(IpAddr, Path)>,
    last4: Option<Path4>,
}

impl Batch {
    fn new() -> Batch {
        Batch { staged: Staged::new(), sent: 0, first_error: None, last: None, last4: None }
    }
}

/// Packets of a batch send on their way to the transmit path.
struct Staged {
    slots: ArrayVec<TxPacket, STAGED>,
}

/// Packets a batch send stages before it hands them over.
const STAGED: usize = 8;

impl Staged {
    fn new() -> Staged {
        Staged { slots: ArrayVec::new() }
    }

    #[inline]
    fn push(&mut self, pkt: TxPacket) {
        // Never full here: a full stage is handed over first.
        debug_assert!(!self.slots.is_full(), "a full stage is handed over first");
        let _ = self.slots.try_push(pkt);
    }

    fn len(&self) -> usize {
        self.slots.len()
    }

    fn is_full(&self) -> bool {
        self.slots.is_full()
    }

    /// Takes the staged packets out, oldest first.
    fn drain(&mut self) -> arrayvec::Drain<'_, TxPacket, STAGED> {
        self.slots.drain(..)
    }
}

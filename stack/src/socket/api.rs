//! The socket API: binding (with its options), connecting, the socket's
//! options, receiving, and closing.

use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV4, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant as StdInstant};

use super::{Inner, IpOptions, State, UdpSocket, errno};
use crate::addr::{mapped, normalize};
use crate::control_plane::Stack;
use crate::datagram::{Datagram, DatagramBatch};
use crate::lookup::{BindError, Binding, Family};
use crate::rx_queue::{SocketQueue, Wait};
use crate::shared::SocketCore;

/// Options set before `bind`.
#[derive(Debug, Clone)]
pub struct SocketBuilder {
    stack: Stack,
    reuseport: bool,
    reuseaddr: bool,
    v6only: bool,
    rcvbuf: Option<usize>,
    iface: Option<u16>,
    incoming_lcore: Option<u32>,
}

impl SocketBuilder {
    /// Shares the address and port with other sockets that set it too
    /// (`SO_REUSEPORT`): datagrams are spread over the group by flow.
    pub fn reuseport(mut self, on: bool) -> Self {
        self.reuseport = on;
        self
    }

    /// Binds beside other sockets of the address and port that set this
    /// or [`reuseport`](Self::reuseport) (`SO_REUSEADDR`). spate makes them
    /// one group as `reuseport` does: a broadcast or multicast datagram
    /// reaches every member, as on Linux; unicast ones are spread by flow,
    /// where Linux gives them all to one member.
    pub fn reuse_address(mut self, on: bool) -> Self {
        self.reuseaddr = on;
        self
    }

    /// An IPv6 socket that does not receive IPv4 (`IPV6_V6ONLY`).
    pub fn only_v6(mut self, on: bool) -> Self {
        self.v6only = on;
        self
    }

    /// The receive buffer in bytes (`SO_RCVBUF`, not doubled as Linux does).
    pub fn recv_buffer_size(mut self, bytes: usize) -> Self {
        self.rcvbuf = Some(bytes);
        self
    }

    /// Prefers datagrams polled by the stack's lcore `index`
    /// (`SO_INCOMING_CPU`): its score gains one point there, and a
    /// reuseport group gives such a member every flow that lcore receives.
    pub fn incoming_lcore(mut self, index: u32) -> Self {
        self.incoming_lcore = Some(index);
        self
    }

    /// Receives only from interface `index` (`SO_BINDTODEVICE`).
    pub fn bind_device(mut self, index: u16) -> Self {
        self.iface = Some(index);
        self
    }

    /// Creates the socket bound to `addr` (port 0 picks an ephemeral port).
    pub fn bind(self, addr: impl ToSocketAddrs) -> io::Result<UdpSocket> {
        let mut last = errno(libc::EINVAL, "no address to bind");
        for a in addr.to_socket_addrs()? {
            match self.bind_one(a) {
                Ok(s) => return Ok(s),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn bind_one(&self, addr: SocketAddr) -> io::Result<UdpSocket> {
        let shared = &self.stack.shared;
        let family = if addr.is_ipv4() { Family::V4 } else { Family::V6 };
        let local = normalize(addr);
        if family == Family::V6 && self.v6only && local.is_ipv4() {
            return Err(errno(libc::EINVAL, "an IPv6-only socket cannot bind an IPv4-mapped address"));
        }
        let ip = local.ip();
        // A group is bound as Linux binds it: to receive the group's
        // datagrams only; sends go from the route's source.
        if !ip.is_unspecified() && !ip.is_multicast() && !shared.is_local(&ip) {
            return Err(errno(libc::EADDRNOTAVAIL, "not an address of this stack"));
        }
        if let Some(i) = self.iface
            && i as usize >= shared.links.len()
        {
            return Err(errno(libc::ENODEV, "no such interface"));
        }
        if let Some(l) = self.incoming_lcore
            && l as usize >= shared.workers
        {
            return Err(errno(libc::EINVAL, "no such polling lcore"));
        }
        let rcvbuf = self.rcvbuf.unwrap_or(shared.cfg.rcvbuf);
        let id = shared.next_socket_id.fetch_add(1, Ordering::Relaxed);
        let queue = SocketQueue::with_cap(shared.workers, rcvbuf, Some(shared.rcv_mem.clone()));
        queue.set_nap((shared.cfg.reader_nap_us > 0).then(|| Duration::from_micros(shared.cfg.reader_nap_us as u64)));
        let core = Arc::new(SocketCore {
            id,
            queue,
            error: AtomicI32::new(0),
            ident: AtomicU32::new(shared.random_u32()),
            epoch: AtomicU64::new(0),
            gro: AtomicBool::new(false),
            tunnel: None,
            read_delay: Default::default(),
            mcast_all: AtomicBool::new(true),
        });
        let binding = Binding {
            id,
            family,
            local,
            bound: local.ip(),
            peer: None,
            v6only: self.v6only,
            iface: self.iface,
            reuseport: self.reuseport || self.reuseaddr,
            incoming_lcore: self.incoming_lcore,
            epoch: 0,
            sock: core.clone(),
        };
        let local = shared.sockets.bind(binding).map_err(|e| match e {
            BindError::InUse => errno(libc::EADDRINUSE, "address in use"),
            BindError::NoPorts => errno(libc::EAGAIN, "no ephemeral port free"),
        })?;
        shared.note_down(&core);
        let tx_worker = shared.next_tx_worker.fetch_add(1, Ordering::Relaxed) % shared.workers;
        let state = State {
            local,
            peer: None,
            explicit_ip: !local.ip().is_unspecified(),
            last_route: None,
            route_gen: 0,
            ip: IpOptions::DEFAULT,
            shut_write: false,
        };
        let sock = UdpSocket {
            stack: self.stack.clone(),
            core: core.clone(),
            family,
            v6only: self.v6only,
            tx_worker,
            inner: Arc::new(Inner {
                stack: self.stack.clone(),
                core,
                state: Mutex::new(state),
                nonblocking: AtomicBool::new(false),
                read_timeout: AtomicU64::new(0),
                write_timeout: Mutex::new(None),
                gso_size: AtomicU32::new(0),
                dont_fragment: AtomicBool::new(false),
                timestamps: AtomicBool::new(false),
            }),
        };
        if shared.cfg.read_delay_histograms {
            sock.set_read_delay_histogram(true)?;
        }
        Ok(sock)
    }
}

impl UdpSocket {
    /// A socket bound to `addr` with default options.
    pub fn bind(stack: &Stack, addr: impl ToSocketAddrs) -> io::Result<UdpSocket> {
        Self::builder(stack).bind(addr)
    }

    /// Options for a socket before it is bound.
    pub fn builder(stack: &Stack) -> SocketBuilder {
        SocketBuilder {
            stack: stack.clone(),
            reuseport: false,
            reuseaddr: false,
            v6only: false,
            rcvbuf: None,
            iface: None,
            incoming_lcore: None,
        }
    }

    /// The local address (IPv4 addresses of an IPv6 socket shown mapped).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.present(self.state().local))
    }

    /// The connected peer.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.state().peer.map(|p| self.present(p)).ok_or_else(|| errno(libc::ENOTCONN, "not connected"))
    }

    pub(super) fn present(&self, a: SocketAddr) -> SocketAddr {
        if self.family == Family::V6 { mapped(a) } else { a }
    }

    /// The destination as the wire sees it, checked against the family.
    pub(super) fn destination(&self, addr: SocketAddr) -> io::Result<SocketAddr> {
        if let SocketAddr::V4(a) = addr {
            // The common case, without the normalising below.
            return self.v4_destination(a).map(|()| addr);
        }
        let dst = normalize(addr);
        match (self.family, addr, dst) {
            (Family::V4, SocketAddr::V6(_), _) => Err(errno(libc::EAFNOSUPPORT, "IPv6 address on an IPv4 socket")),
            (Family::V6, _, SocketAddr::V4(_)) if self.v6only => {
                Err(errno(libc::ENETUNREACH, "IPv4-mapped address on an IPv6-only socket"))
            }
            _ if dst.port() == 0 || dst.ip().is_unspecified() => {
                Err(errno(libc::EINVAL, "no destination port or address"))
            }
            _ => Ok(dst),
        }
    }

    /// Whether this socket may send to IPv4 destination `a`.
    #[inline]
    pub(super) fn v4_destination(&self, a: SocketAddrV4) -> io::Result<()> {
        if self.family == Family::V6 && self.v6only {
            return Err(errno(libc::ENETUNREACH, "IPv4-mapped address on an IPv6-only socket"));
        }
        if a.port() == 0 || a.ip().is_unspecified() {
            return Err(errno(libc::EINVAL, "no destination port or address"));
        }
        Ok(())
    }

    /// Connects to `addr`: `send` goes there and only its datagrams are
    /// received. The local address is fixed to the route's source if the
    /// socket was bound to the unspecified address, as Linux does.
    pub fn connect(&self, addr: impl ToSocketAddrs) -> io::Result<()> {
        let addr = addr.to_socket_addrs()?.next().ok_or_else(|| errno(libc::EINVAL, "no address"))?;
        let dst = self.destination(addr)?;
        let shared = self.shared();
        let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        let bound_ip = super::bound_source(st.local.ip()).filter(|ip| ip.is_ipv4() == dst.is_ipv4());
        let net = shared.net();
        super::check_source(&net, bound_ip)?;
        // Its source and interface matter here, not its MTU.
        let route = net
            .routes
            .socket_route(&net.ifaces, &dst.ip(), bound_ip.as_ref(), st.ip.mcast_if)
            .ok_or_else(|| errno(libc::ENETUNREACH, "no route"))?;
        super::check_broadcast(&net, &dst.ip(), &route, st.ip.broadcast)?;
        let mut local = st.local;
        // A group-bound socket keeps receiving its group (Linux's
        // `inet_rcv_saddr`).
        if local.ip().is_unspecified() || local.is_ipv4() != dst.is_ipv4() {
            local.set_ip(route.src);
        }
        self.rebind(local, Some(dst));
        st.local = local;
        st.peer = Some(dst);
        Ok(())
    }

    /// Publishes a new local address and peer, then tells the lcores the
    /// old binding is stale.
    fn rebind(&self, local: SocketAddr, peer: Option<SocketAddr>) {
        let epoch = self.core.epoch.load(Ordering::Relaxed) + 1;
        self.shared().sockets.update(self.core.id, local, peer, epoch);
        self.core.epoch.store(epoch, Ordering::Release);
    }

    /// This socket's id (what [`LcoreCtx::ready`](crate::LcoreCtx::ready) lists).
    pub fn id(&self) -> u64 {
        self.core.id
    }

    /// Undoes `connect` (Linux's connect to `AF_UNSPEC`).
    pub fn disconnect(&self) -> io::Result<()> {
        let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        if !st.explicit_ip {
            let any =
                if self.family == Family::V4 { IpAddr::from([0u8; 4]) } else { IpAddr::V6(Ipv6Addr::UNSPECIFIED) };
            st.local.set_ip(any);
        }
        st.peer = None;
        self.rebind(st.local, None);
        Ok(())
    }

    /// Moves the blocking mode.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.inner.nonblocking.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Sets how long a receive waits; `None` waits forever. A zero duration
    /// is an error, as for `std::net::UdpSocket`.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t == Some(Duration::ZERO) {
            return Err(errno(libc::EINVAL, "cannot set a 0 duration timeout"));
        }
        let nanos = t.map(|d| d.as_nanos().min(u64::MAX as u128) as u64).unwrap_or(0);
        self.inner.read_timeout.store(nanos, Ordering::Relaxed);
        Ok(())
    }

    /// The receive timeout.
    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(match self.inner.read_timeout.load(Ordering::Relaxed) {
            0 => None,
            n => Some(Duration::from_nanos(n)),
        })
    }

    /// Sets how long a blocking send waits, asleep, for room in the
    /// lcore's queue (the lcore wakes it when it drains the queue); past
    /// it the send fails with `WouldBlock` (`EAGAIN`), as Linux's does past
    /// `SO_SNDTIMEO`. `None`: until there is room or the stack stops.
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t == Some(Duration::ZERO) {
            return Err(errno(libc::EINVAL, "cannot set a 0 duration timeout"));
        }
        *self.inner.write_timeout.lock().unwrap_or_else(|p| p.into_inner()) = t;
        Ok(())
    }

    /// The send timeout.
    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(*self.inner.write_timeout.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Sets the receive buffer in bytes.
    pub fn set_recv_buffer_size(&self, bytes: usize) -> io::Result<()> {
        if bytes < 2048 {
            return Err(errno(libc::EINVAL, "receive buffer below 2048 bytes"));
        }
        self.core.queue.set_rcvbuf(bytes);
        Ok(())
    }

    /// The receive buffer in bytes.
    pub fn recv_buffer_size(&self) -> io::Result<usize> {
        Ok(self.core.queue.rcvbuf())
    }

    /// Turns UDP GRO on or off (Linux's `UDP_GRO`): with it on, datagrams
    /// that arrive back to back in one burst from one sender, all of one
    /// size but the last, come as one [`Datagram`] of up to 64 segments
    /// with [`gso_size`](Datagram::gso_size) set; `recv_from` copies them
    /// out as one payload. While any socket has it on (or a tunnel is
    /// registered) the lcores run the GRO stage for every UDP datagram.
    pub fn set_gro(&self, on: bool) -> io::Result<()> {
        let shared = self.shared();
        if on && !self.core.gro.swap(true, Ordering::AcqRel) {
            shared.gro_user(true);
        } else if !on && self.core.gro.swap(false, Ordering::AcqRel) {
            shared.gro_user(false);
        }
        Ok(())
    }

    /// Whether UDP GRO is on.
    pub fn gro(&self) -> io::Result<bool> {
        Ok(self.core.gro.load(Ordering::Acquire))
    }

    /// Times the polling lcores woke a reader sleeping in `recv` on this
    /// socket (each a system call; none while readers keep up awake).
    pub fn reader_wakeups(&self) -> u64 {
        self.core.queue.wakeups()
    }

    /// Datagrams this socket's queue refused for lack of room.
    pub fn rcvbuf_drops(&self) -> u64 {
        self.core.queue.total_drops()
    }

    /// Shuts the socket down for reading, writing or both, as Linux's
    /// `shutdown` does for UDP. Reading: blocked receives return at once
    /// and, from then on, a receive that would wait for an empty queue
    /// returns nothing (`recv_batch` 0, `recv_from` 0 bytes from the
    /// unspecified address, `recv_datagram` `ESHUTDOWN`); what is queued,
    /// and what still arrives, stays readable, and a non-blocking receive
    /// of an empty queue is `WouldBlock` as before. Writing: every send
    /// fails with `EPIPE` (`BrokenPipe`; no signal). A socket that is not
    /// connected is `NotConnected` (`ENOTCONN`), the shutdown taking
    /// effect all the same, as on Linux.
    pub fn shutdown(&self, how: std::net::Shutdown) -> io::Result<()> {
        use std::net::Shutdown;
        let mut st = self.lock_state();
        if matches!(how, Shutdown::Write | Shutdown::Both) {
            st.shut_write = true;
        }
        let connected = st.peer.is_some();
        drop(st);
        if matches!(how, Shutdown::Read | Shutdown::Both) {
            self.core.queue.shut_reads();
        }
        match connected {
            true => Ok(()),
            false => Err(errno(libc::ENOTCONN, "not connected (the shutdown took effect)")),
        }
    }

    /// How a receive that found nothing, waiting as `wait` said, ends: the
    /// pending error; else `shut` when the socket was shut down for
    /// reading (a receive that would wait returns nothing); else
    /// `WouldBlock` or `NetworkDown` ([`no_data`](Self::no_data)).
    #[cold]
    pub(super) fn found_nothing<T>(&self, wait: Wait, shut: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        self.pending_error()?;
        match wait != Wait::No && self.core.queue.is_shut() {
            true => shut(),
            false => Err(self.no_data()),
        }
    }

    /// What `recv_datagram` gives when shut down for reading with
    /// nothing queued.
    pub(super) fn shut_error() -> io::Error {
        errno(libc::ESHUTDOWN, "shut down for reading, nothing queued")
    }

    /// The address a receive that returns nothing reports: the socket
    /// family's unspecified one.
    pub(super) fn nobody(&self) -> SocketAddr {
        match self.family {
            Family::V4 => SocketAddr::from(([0, 0, 0, 0], 0)),
            Family::V6 => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
        }
    }

    /// Takes the pending error, if any (`SO_ERROR`).
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        Ok(match self.take_errno() {
            0 => None,
            e => Some(io::Error::from_raw_os_error(e)),
        })
    }

    #[inline]
    pub(super) fn pending_error(&self) -> io::Result<()> {
        // A plain load first: the common case writes nothing.
        if self.core.error.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        match self.take_errno() {
            0 => Ok(()),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }

    /// Takes the pending errno (0 for none), leaving `ENETDOWN` in place
    /// while the stack is down: every call fails until it runs again.
    #[cold]
    fn take_errno(&self) -> i32 {
        let e = self.core.error.load(Ordering::Acquire);
        if e == libc::ENETDOWN && self.shared().is_down() {
            return e;
        }
        self.core.error.swap(0, Ordering::AcqRel)
    }

    #[inline]
    pub(super) fn wait_mode(&self) -> Wait {
        if self.inner.nonblocking.load(Ordering::Relaxed) {
            return Wait::No;
        }
        match self.inner.read_timeout.load(Ordering::Relaxed) {
            0 => Wait::Forever,
            n => Wait::Until(StdInstant::now() + Duration::from_nanos(n)),
        }
    }

    pub(super) fn no_data(&self) -> io::Error {
        // A timeout reports WouldBlock, as std does on Unix; a stack that
        // stopped, NetworkDown.
        match self.shared().is_down() {
            true => io::Error::from_raw_os_error(libc::ENETDOWN),
            false => io::Error::from_raw_os_error(libc::EAGAIN),
        }
    }

    /// Receives one datagram; bytes beyond `buf` are cut off.
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        crate::app_thread::enter();
        self.pending_error()?;
        let wait = self.wait_mode();
        let Some(d) = self.core.queue.pop(wait) else {
            return self.found_nothing(wait, || Ok((0, self.nobody())));
        };
        self.note_delay(std::slice::from_ref(&d));
        let n = d.copy_to(buf);
        Ok((n, self.present(d.src())))
    }

    /// Receives one datagram from the connected peer.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_from(buf).map(|(n, _)| n)
    }

    /// Receives one datagram without copying it.
    pub fn recv_datagram(&self) -> io::Result<Datagram> {
        crate::app_thread::enter();
        self.pending_error()?;
        let wait = self.wait_mode();
        let Some(d) = self.inner.core.queue.pop(wait) else {
            return self.found_nothing(wait, || Err(Self::shut_error()));
        };
        self.note_delay(std::slice::from_ref(&d));
        Ok(d)
    }

    /// Adds the datagrams' waits since their RX burst to the socket's
    /// histogram, when it keeps one: one relaxed load otherwise.
    #[inline]
    pub(super) fn note_delay(&self, read: &[Datagram]) {
        let Some((h, now)) = self.read_delays() else { return };
        for d in read {
            if let Some(t) = d.stamp_ns() {
                h.record(now.saturating_sub(t));
            }
        }
    }

    /// The read-delay histogram and the time now on the stamps' clock
    /// (`CLOCK_REALTIME`), when the socket keeps one.
    #[inline]
    pub(super) fn read_delays(&self) -> Option<(&crate::stats::DelayHistogram, u64)> {
        let h = &self.core.read_delay;
        if !h.is_on() {
            return None;
        }
        Some((h, crate::time::realtime_ns()))
    }

    /// Moves up to `max` datagrams into `out` without copying them; waits
    /// (as the socket's mode says) only for the first. Allocates nothing
    /// while `out` has capacity; clearing `out` frees the mbufs in bulk.
    pub fn recv_batch(&self, out: &mut DatagramBatch, max: usize) -> io::Result<usize> {
        self.recv_batch_waiting(out, max, self.wait_mode())
    }

    #[inline]
    pub(super) fn recv_batch_waiting(&self, out: &mut DatagramBatch, max: usize, wait: Wait) -> io::Result<usize> {
        crate::app_thread::enter();
        self.pending_error()?;
        let held = out.len();
        match self.core.queue.pop_batch(out.vec(), max, wait) {
            0 if max > 0 => self.found_nothing(wait, || Ok(0)),
            n => {
                // A thread reading what a polling lcore queued finds every
                // line in that lcore's cache: all misses at once.
                out.prefetch_from(held);
                self.note_delay(&out.vec()[held..]);
                Ok(n)
            }
        }
    }

    /// The stack this socket lives on.
    pub fn stack(&self) -> &Stack {
        &self.stack
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let shared = &self.stack.shared;
        let port = self.state.lock().unwrap_or_else(|p| p.into_inner()).local.port();
        shared.sockets.unbind(self.core.id, port);
        self.core.epoch.store(u64::MAX, Ordering::Release);
        self.core.queue.close();
        // After the unbind: no snapshot that still holds this socket is
        // read with the GRO stage or the timestamps off because of it.
        if self.core.gro.swap(false, Ordering::AcqRel) {
            shared.gro_user(false);
        }
        if self.timestamps.swap(false, Ordering::AcqRel) {
            shared.stamp_user(false);
        }
        // The counts stay readable in the core; the stamps stop.
        if self.core.read_delay.set_on(false) {
            shared.stamp_user(false);
        }
        // Its groups are left (reported if the interface leaves them).
        self.stack.leave_all_groups(self.core.id);
    }
}

//! UDP sockets, in the style of `std::net::UdpSocket`.

use std::cell::RefCell;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant as StdInstant};

use crate::datagram::{Datagram, DatagramBatch, SendBuf};
use crate::lookup::{BindError, Binding, Family};
use crate::pipeline::tx::{MAX_HEADERS, MAX_UDP_PAYLOAD_V4, MAX_UDP_PAYLOAD_V6, TxPacket, UdpHeaders, push_udp_ip};
use crate::rx_queue::{RxQueue, Wait};
use crate::stack::{Shared, Stack};
use crate::stats::Counter;
use crate::wire::{ipv4, ipv6, udp};

/// The part of a socket the receive path reaches through the socket table.
#[derive(Debug)]
pub(crate) struct SocketCore {
    pub id: u64,
    pub queue: RxQueue<Datagram>,
    /// A pending error (errno) for the next call, as `SO_ERROR` keeps it.
    pub error: AtomicI32,
    /// The IPv4 ID counter of a connected socket (Linux's `inet_id`).
    pub ident: AtomicU32,
    /// Bumped after every change of the socket's binding (u64::MAX once
    /// closed): an lcore holding an older snapshot sees its pick is stale.
    pub epoch: AtomicU64,
    /// UDP GRO: the socket takes coalesced datagrams (read by the lcores
    /// only while the GRO stage runs, beside `epoch` on one line).
    pub gro: AtomicBool,
    /// The tunnel interface this socket terminates (a VXLAN endpoint the
    /// stack made); `None` for an application's socket.
    pub tunnel: Option<u16>,
}

/// Options set before `bind`.
#[derive(Debug, Clone)]
pub struct SocketBuilder {
    stack: Stack,
    reuseport: bool,
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
        let mut last = io::Error::new(io::ErrorKind::InvalidInput, "no address to bind");
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
        if !ip.is_unspecified() && !shared.is_local(&ip) {
            return Err(errno(libc::EADDRNOTAVAIL, "not an address of this stack"));
        }
        if let Some(i) = self.iface {
            if i as usize >= shared.ifaces.len() {
                return Err(errno(libc::ENODEV, "no such interface"));
            }
        }
        if let Some(l) = self.incoming_lcore {
            if l as usize >= shared.workers {
                return Err(errno(libc::EINVAL, "no such polling lcore"));
            }
        }
        let rcvbuf = self.rcvbuf.unwrap_or(shared.cfg.rcvbuf);
        let id = shared.next_socket_id.fetch_add(1, Ordering::Relaxed);
        let queue = RxQueue::new(shared.workers, rcvbuf);
        queue.set_nap((shared.cfg.reader_nap_us > 0).then(|| Duration::from_micros(shared.cfg.reader_nap_us as u64)));
        let core = Arc::new(SocketCore {
            id,
            queue,
            error: AtomicI32::new(0),
            ident: AtomicU32::new(shared.random_u32()),
            epoch: AtomicU64::new(0),
            gro: AtomicBool::new(false),
            tunnel: None,
        });
        let binding = Binding {
            id,
            family,
            local,
            bound: local.ip(),
            peer: None,
            v6only: self.v6only,
            iface: self.iface,
            reuseport: self.reuseport,
            incoming_lcore: self.incoming_lcore,
            epoch: 0,
            sock: core.clone(),
        };
        let local = shared.sockets.bind(binding).map_err(|e| match e {
            BindError::InUse => errno(libc::EADDRINUSE, "address in use"),
            BindError::NoPorts => errno(libc::EAGAIN, "no ephemeral port free"),
        })?;
        let tx_worker = shared.next_tx_worker.fetch_add(1, Ordering::Relaxed) % shared.workers;
        Ok(UdpSocket {
            stack: self.stack.clone(),
            core,
            family,
            v6only: self.v6only,
            state: Mutex::new(State { local, peer: None, explicit_ip: !local.ip().is_unspecified() }),
            nonblocking: AtomicBool::new(false),
            read_timeout: AtomicU64::new(0),
            write_timeout: Mutex::new(None),
            tx_worker,
            gso_size: AtomicU32::new(0),
            dont_fragment: AtomicBool::new(false),
        })
    }
}

#[derive(Debug, Clone, Copy)]
struct State {
    local: SocketAddr,
    peer: Option<SocketAddr>,
    // Bound to a specific address by the user, not by connect.
    explicit_ip: bool,
}

/// A UDP socket on a spate [`Stack`].
///
/// It behaves like `std::net::UdpSocket`: blocking by default, with
/// `set_nonblocking` and timeouts; errors carry the errno Linux would give
/// (`AddrInUse`, `ConnectionRefused`, `WouldBlock`...). Received datagrams
/// can also be taken in batches as [`Datagram`]s that own their mbufs, and
/// payloads can be sent from a [`SendBuf`] filled in place, without copies.
#[derive(Debug)]
pub struct UdpSocket {
    stack: Stack,
    core: Arc<SocketCore>,
    family: Family,
    v6only: bool,
    state: Mutex<State>,
    nonblocking: AtomicBool,
    /// Nanoseconds; 0 for none.
    read_timeout: AtomicU64,
    write_timeout: Mutex<Option<Duration>>,
    tx_worker: usize,
    /// `UDP_SEGMENT`: 0 for none.
    gso_size: AtomicU32,
    /// Fail sends larger than the path MTU instead of fragmenting them.
    dont_fragment: AtomicBool,
}

/// Segments one UDP GSO send may make at most (Linux raised
/// `UDP_MAX_SEGMENTS` from 64 to 128 in 6.9).
pub const GSO_MAX_SEGMENTS: usize = 128;

pub(crate) fn errno(code: i32, what: &'static str) -> io::Error {
    let kind = io::Error::from_raw_os_error(code).kind();
    io::Error::new(kind, format!("{what} ({})", io::Error::from_raw_os_error(code)))
}

/// IPv4-mapped IPv6 addresses become IPv4: the table and the wire speak IPv4.
pub(crate) fn normalize(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => a,
        },
        v4 => v4,
    }
}

fn mapped(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V4(v4) => SocketAddr::new(IpAddr::V6(v4.ip().to_ipv6_mapped()), v4.port()),
        v6 => v6,
    }
}

thread_local! {
    /// Set on a polling lcore while it runs the application's callback:
    /// sends made there go straight to the lcore's transmit path.
    pub(crate) static LOCAL_TX: RefCell<Option<LocalTx>> = const { RefCell::new(None) };
}

/// The lcore-local send queue of one stack.
#[derive(Debug)]
pub(crate) struct LocalTx {
    pub stack_id: u64,
    pub queue: Vec<TxPacket>,
}

/// Room in the lcore-local send queue per loop iteration.
pub(crate) const LOCAL_TX_CAPACITY: usize = 4096;

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
            v6only: false,
            rcvbuf: None,
            iface: None,
            incoming_lcore: None,
        }
    }

    fn shared(&self) -> &Shared {
        &self.stack.shared
    }

    fn state(&self) -> State {
        *self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The local address (IPv4 addresses of an IPv6 socket shown mapped).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.present(self.state().local))
    }

    /// The connected peer.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.state().peer.map(|p| self.present(p)).ok_or_else(|| errno(libc::ENOTCONN, "not connected"))
    }

    fn present(&self, a: SocketAddr) -> SocketAddr {
        if self.family == Family::V6 { mapped(a) } else { a }
    }

    /// The destination as the wire sees it, checked against the family.
    fn destination(&self, addr: SocketAddr) -> io::Result<SocketAddr> {
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

    /// Connects to `addr`: `send` goes there and only its datagrams are
    /// received. The local address is fixed to the route's source if the
    /// socket was bound to the unspecified address, as Linux does.
    pub fn connect(&self, addr: impl ToSocketAddrs) -> io::Result<()> {
        let addr = addr.to_socket_addrs()?.next().ok_or_else(|| errno(libc::EINVAL, "no address"))?;
        let dst = self.destination(addr)?;
        let shared = self.shared();
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let bound_ip = Some(st.local.ip()).filter(|ip| !ip.is_unspecified() && ip.is_ipv4() == dst.is_ipv4());
        let route = shared.route(&dst.ip(), bound_ip.as_ref()).ok_or_else(|| errno(libc::ENETUNREACH, "no route"))?;
        let mut local = st.local;
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
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
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
        self.nonblocking.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Sets how long a receive waits; `None` waits forever. A zero duration
    /// is an error, as for `std::net::UdpSocket`.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t == Some(Duration::ZERO) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "cannot set a 0 duration timeout"));
        }
        let nanos = t.map(|d| d.as_nanos().min(u64::MAX as u128) as u64).unwrap_or(0);
        self.read_timeout.store(nanos, Ordering::Relaxed);
        Ok(())
    }

    /// The receive timeout.
    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(match self.read_timeout.load(Ordering::Relaxed) {
            0 => None,
            n => Some(Duration::from_nanos(n)),
        })
    }

    /// Sets how long a send waits for room in the lcore's queue.
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t == Some(Duration::ZERO) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "cannot set a 0 duration timeout"));
        }
        *self.write_timeout.lock().unwrap_or_else(|p| p.into_inner()) = t;
        Ok(())
    }

    /// The send timeout.
    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(*self.write_timeout.lock().unwrap_or_else(|p| p.into_inner()))
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
            shared.gro_users.fetch_add(1, Ordering::AcqRel);
        } else if !on && self.core.gro.swap(false, Ordering::AcqRel) {
            shared.gro_users.fetch_sub(1, Ordering::AcqRel);
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

    /// Takes the pending error, if any (`SO_ERROR`).
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        Ok(match self.core.error.swap(0, Ordering::AcqRel) {
            0 => None,
            e => Some(io::Error::from_raw_os_error(e)),
        })
    }

    #[inline]
    fn pending_error(&self) -> io::Result<()> {
        // A plain load first: the common case writes nothing.
        if self.core.error.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        match self.core.error.swap(0, Ordering::AcqRel) {
            0 => Ok(()),
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }

    #[inline]
    fn wait_mode(&self) -> Wait {
        if self.nonblocking.load(Ordering::Relaxed) {
            return Wait::No;
        }
        match self.read_timeout.load(Ordering::Relaxed) {
            0 => Wait::Forever,
            n => Wait::Until(StdInstant::now() + Duration::from_nanos(n)),
        }
    }

    fn no_data(&self) -> io::Error {
        // A timeout reports WouldBlock, as std does on Unix.
        io::Error::from_raw_os_error(libc::EAGAIN)
    }

    /// Receives one datagram; bytes beyond `buf` are cut off.
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        crate::app_thread::enter();
        self.pending_error()?;
        let d = self
            .core
            .queue
            .pop(self.wait_mode())
            .ok_or_else(|| self.pending_error().err().unwrap_or_else(|| self.no_data()))?;
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
        self.core
            .queue
            .pop(self.wait_mode())
            .ok_or_else(|| self.pending_error().err().unwrap_or_else(|| self.no_data()))
    }

    /// Moves up to `max` datagrams into `out` without copying them; waits
    /// (as the socket's mode says) only for the first. Allocates nothing
    /// while `out` has capacity; clearing `out` frees the mbufs in bulk.
    pub fn recv_batch(&self, out: &mut DatagramBatch, max: usize) -> io::Result<usize> {
        crate::app_thread::enter();
        self.pending_error()?;
        match self.core.queue.pop_batch(out.vec(), max, self.wait_mode()) {
            0 if max > 0 => Err(self.pending_error().err().unwrap_or_else(|| self.no_data())),
            n => Ok(n),
        }
    }

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
        let c = if self.family == Family::V4 { Counter::UdpMemErrors } else { Counter::Udp6MemErrors };
        self.shared().stats.shared().add_shared(c, 1);
        errno(libc::ENOBUFS, "no mbuf free")
    }

    /// Sends `buf` to `addr`; returns `buf.len()`.
    pub fn send_to(&self, buf: &[u8], addr: impl ToSocketAddrs) -> io::Result<usize> {
        let addr = addr.to_socket_addrs()?.next().ok_or_else(|| errno(libc::EINVAL, "no address"))?;
        let dst = self.destination(addr)?;
        if let Some(seg) = self.segment_size()?.filter(|s| buf.len() > *s as usize) {
            return self.send_segments(buf, seg as usize, dst);
        }
        self.send_slice(buf, dst)
    }

    /// Sends `buf` as one datagram: copied into one mbuf, or, when it is
    /// longer than one holds, straight into IP fragments.
    fn send_slice(&self, buf: &[u8], dst: SocketAddr) -> io::Result<usize> {
        if buf.len() > self.shared().pool.data_room() as usize - MAX_HEADERS {
            crate::app_thread::enter();
            self.pending_error()?;
            let st = self.state();
            let route = self.route_to(dst, &st)?;
            self.send_fragments(std::iter::once(buf), buf.len(), dst, route, st.local.port())?;
            return Ok(buf.len());
        }
        let sb = self.copy_in(buf)?;
        self.send_prepared(sb, dst)?;
        Ok(buf.len())
    }

    /// The route to `dst` for this socket (its bound address as source).
    fn route_to(&self, dst: SocketAddr, st: &State) -> io::Result<crate::route::Route> {
        let shared = self.shared();
        let bound_ip = Some(st.local.ip()).filter(|ip| !ip.is_unspecified() && ip.is_ipv4() == dst.is_ipv4());
        shared.route(&dst.ip(), bound_ip.as_ref()).ok_or_else(|| {
            let c = if dst.is_ipv4() { Counter::IpOutNoRoutes } else { Counter::Ip6OutNoRoutes };
            shared.stats.shared().add_shared(c, 1);
            errno(libc::ENETUNREACH, "no route")
        })
    }

    /// Sends `buf` to the connected peer.
    pub fn send(&self, buf: &[u8]) -> io::Result<usize> {
        let peer = self.state().peer.ok_or_else(|| errno(libc::EDESTADDRREQ, "not connected"))?;
        if let Some(seg) = self.segment_size()?.filter(|s| buf.len() > *s as usize) {
            return self.send_segments(buf, seg as usize, peer);
        }
        self.send_slice(buf, peer)
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
        self.send_segments(buf, segment, dst)
    }

    /// Sets a segment size for every later `send` and `send_to` longer than
    /// it (Linux's `UDP_SEGMENT` socket option); `None` turns it off.
    pub fn set_segment_size(&self, segment: Option<u16>) -> io::Result<()> {
        if segment == Some(0) {
            return Err(errno(libc::EINVAL, "segment size 0"));
        }
        self.gso_size.store(segment.unwrap_or(0) as u32, Ordering::Relaxed);
        Ok(())
    }

    /// The segment size set with [`set_segment_size`](Self::set_segment_size).
    pub fn segment_size(&self) -> io::Result<Option<u16>> {
        Ok(match self.gso_size.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n as u16),
        })
    }

    fn send_segments(&self, buf: &[u8], segment: usize, dst: SocketAddr) -> io::Result<usize> {
        crate::app_thread::enter();
        self.pending_error()?;
        if segment == 0 {
            return Err(errno(libc::EINVAL, "segment size 0"));
        }
        let shared = self.shared();
        let v4 = dst.is_ipv4();
        let st = self.state();
        let bound_ip = Some(st.local.ip()).filter(|ip| !ip.is_unspecified() && ip.is_ipv4() == v4);
        let Some(route) = shared.route(&dst.ip(), bound_ip.as_ref()) else {
            let c = if v4 { Counter::IpOutNoRoutes } else { Counter::Ip6OutNoRoutes };
            shared.stats.shared().add_shared(c, 1);
            return Err(errno(libc::ENETUNREACH, "no route"));
        };
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
        let src = SocketAddr::new(route.src, st.local.port());
        let connected = st.peer == Some(dst);
        let first_ident = match src.ip() {
            IpAddr::V4(_) if connected => self.core.ident.fetch_add(count as u32, Ordering::Relaxed) as u16,
            _ => 0,
        };
        let iface = &shared.ifaces[route.iface as usize];
        for (i, mut m) in mbufs.drain().enumerate() {
            let chunk = &buf[(i * segment).min(buf.len())..((i + 1) * segment).min(buf.len())];
            let room = m.append(chunk.len()).map_err(|_| errno(libc::EMSGSIZE, "segment longer than one mbuf"))?;
            room.copy_from_slice(chunk);
            let ident = if connected { first_ident.wrapping_add(i as u16) } else { 0 };
            let headers = UdpHeaders { src, dst, ident, dont_frag: true, ttl: 64, zero_checksum: false };
            push_udp_ip(&mut m, &headers, iface).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            self.submit(TxPacket { mbuf: m, iface: route.iface, next_hop: route.next_hop, datagram: true }, v4)?;
        }
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

    fn send_prepared(&self, mut buf: SendBuf, dst: SocketAddr) -> io::Result<()> {
        self.pending_error()?;
        let shared = self.shared();
        let st = self.state();
        let route = self.route_to(dst, &st)?;
        let v4 = dst.is_ipv4();
        let ip_hdr = if v4 { ipv4::HEADER_LEN } else { ipv6::HEADER_LEN };
        if buf.len() + udp::HEADER_LEN + ip_hdr > route.mtu as usize {
            // Larger than the path: fragments, copied out of the buffer.
            let len = buf.len();
            return self.send_fragments(buf.mbuf.segment_data(), len, dst, route, st.local.port());
        }
        let src = SocketAddr::new(route.src, st.local.port());
        let connected = st.peer == Some(dst);
        let ident = match (src.ip(), dst.ip()) {
            // Linux: connected sockets count on their own; unconnected
            // datagrams that may not be fragmented carry 0 (RFC 6864).
            (IpAddr::V4(_), _) if connected => self.core.ident.fetch_add(1, Ordering::Relaxed) as u16,
            (IpAddr::V4(_), _) => 0,
            _ => 0,
        };
        buf.mbuf.set_ol_flags(0);
        let headers = UdpHeaders { src, dst, ident, dont_frag: true, ttl: 64, zero_checksum: false };
        let iface = &shared.ifaces[route.iface as usize];
        push_udp_ip(&mut buf.mbuf, &headers, iface).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        self.submit(TxPacket { mbuf: buf.mbuf, iface: route.iface, next_hop: route.next_hop, datagram: true }, v4)
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
        route: crate::route::Route,
        local_port: u16,
    ) -> io::Result<()> {
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
        if self.dont_fragment.load(Ordering::Relaxed) {
            shared.stats.shared().add_shared(fails, 1);
            return Err(errno(libc::EMSGSIZE, "larger than the path MTU and don't-fragment is set"));
        }
        let src = SocketAddr::new(route.src, local_port);
        let ident = match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => shared.ip_id.reserve(s, d, crate::wire::ip_proto::UDP, 1) as u32,
            _ => crate::ip_id::random_u32(),
        };
        let iface = &shared.ifaces[route.iface as usize];
        let plan = crate::frag::fragment::Plan {
            src,
            dst,
            mtu: route.mtu as usize,
            ident,
            ttl: 64,
            offload_ip_checksum: iface.tx_checksum,
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
        for (i, m) in out.drain().enumerate() {
            self.submit(TxPacket { mbuf: m, iface: route.iface, next_hop: route.next_hop, datagram: i == 0 }, v4)?;
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
        self.dont_fragment.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Whether don't-fragment is asked for.
    pub fn dont_fragment(&self) -> io::Result<bool> {
        Ok(self.dont_fragment.load(Ordering::Relaxed))
    }

    /// Hands a packet to the transmit path: the lcore's own queue when
    /// called from its callback, else the inbox of this socket's lcore.
    fn submit(&self, pkt: TxPacket, v4: bool) -> io::Result<()> {
        let shared = self.shared();
        let pkt = match LOCAL_TX.with(|l| match &mut *l.borrow_mut() {
            Some(local) if local.stack_id == shared.id => {
                if local.queue.len() < LOCAL_TX_CAPACITY {
                    local.queue.push(pkt);
                    Ok(())
                } else {
                    Err(Err(pkt))
                }
            }
            _ => Err(Ok(pkt)),
        }) {
            Ok(()) => return Ok(()),
            Err(Err(_full)) => return Err(self.sndbuf_error(v4)),
            Err(Ok(pkt)) => pkt,
        };
        let inbox = &shared.inbox[self.tx_worker];
        let mut pkt = match inbox.push(pkt) {
            Ok(()) => return Ok(()),
            Err(p) => p,
        };
        if self.nonblocking.load(Ordering::Relaxed) || !shared.is_running() {
            return Err(self.sndbuf_error(v4));
        }
        let timeout = *self.write_timeout.lock().unwrap_or_else(|p| p.into_inner());
        let deadline = timeout.map(|t| StdInstant::now() + t);
        loop {
            std::thread::yield_now();
            pkt = match inbox.push(pkt) {
                Ok(()) => return Ok(()),
                Err(p) => p,
            };
            if deadline.is_some_and(|d| StdInstant::now() >= d) || !shared.is_running() {
                return Err(self.sndbuf_error(v4));
            }
        }
    }

    fn sndbuf_error(&self, v4: bool) -> io::Error {
        let c = if v4 { Counter::UdpSndbufErrors } else { Counter::Udp6SndbufErrors };
        self.shared().stats.shared().add_shared(c, 1);
        io::Error::from_raw_os_error(libc::EAGAIN)
    }

    /// The stack this socket lives on.
    pub fn stack(&self) -> &Stack {
        &self.stack
    }
}

impl Drop for UdpSocket {
    fn drop(&mut self) {
        let port = self.state().local.port();
        self.shared().sockets.unbind(self.core.id, port);
        self.core.epoch.store(u64::MAX, Ordering::Release);
        self.core.queue.close();
        // After the unbind: no snapshot that still holds this socket is
        // read with the GRO stage off because of it.
        if self.core.gro.swap(false, Ordering::AcqRel) {
            self.shared().gro_users.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

//! UDP sockets, in the style of `std::net::UdpSocket`: the API in [`api`]
//! (binding, options, receiving), the send path in [`send`] (routes,
//! headers, fragments and segments, the hand-off to an lcore). Sockets
//! reach the lcores only through the shared state: the socket table, the
//! inboxes and the lcore-local send queue.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::control_plane::Stack;
use crate::lookup::Family;
use crate::shared::{Net, Shared, SocketCore};

mod api;
mod mcast;
mod options;
mod poll;
mod poller;
mod send;

pub use api::SocketBuilder;
pub use poller::{Event, Interest, Poller};
pub use send::GSO_MAX_SEGMENTS;

#[derive(Debug, Clone, Copy)]
struct State {
    local: SocketAddr,
    peer: Option<SocketAddr>,
    // Bound to a specific address by the user, not by connect.
    explicit_ip: bool,
    /// The route of the last send: (destination, local address it was
    /// looked up for, route before the path MTU): while the stack's
    /// addresses and routes stay as they were (`route_gen`), the pair
    /// decides the route; a reply stream looks it up once. A route to a
    /// broadcast address is kept only while the socket may send there.
    last_route: Option<(IpAddr, IpAddr, crate::route::Route)>,
    /// The stack's network generation `last_route` was looked up in:
    /// a route is looked up again after addresses or routes change.
    route_gen: u64,
    /// What the IP header of a send carries besides addresses.
    ip: IpOptions,
    /// Shut down for writing: every send fails with `EPIPE`.
    shut_write: bool,
}

/// A socket's IP-level send options, per family (an IPv6 socket sends
/// IPv4-mapped destinations with the IPv4 ones, as Linux does).
#[derive(Debug, Clone, Copy)]
struct IpOptions {
    /// `IP_TTL`.
    ttl: u8,
    /// `IPV6_UNICAST_HOPS`.
    hops: u8,
    /// `IP_TOS` (DSCP and ECN).
    tos: u8,
    /// `IPV6_TCLASS`.
    tclass: u8,
    /// `SO_BROADCAST`.
    broadcast: bool,
    /// `IP_MULTICAST_TTL`.
    mcast_ttl: u8,
    /// `IPV6_MULTICAST_HOPS`.
    mcast_hops: u8,
    /// `IP_MULTICAST_IF` / `IPV6_MULTICAST_IF`: the interface a datagram
    /// to a group leaves by.
    mcast_if: Option<u16>,
    /// `IP_MULTICAST_LOOP`: its IPv4 datagrams to a group reach this
    /// host's members too.
    mcast_loop_v4: bool,
    /// `IPV6_MULTICAST_LOOP`.
    mcast_loop_v6: bool,
}

/// Linux's default TTL and hop limit (`net.ipv4.ip_default_ttl`,
/// `net.ipv6.conf.*.hop_limit`).
pub(crate) const DEFAULT_TTL: u8 = 64;

impl IpOptions {
    const DEFAULT: IpOptions = IpOptions {
        ttl: DEFAULT_TTL,
        hops: DEFAULT_TTL,
        tos: 0,
        tclass: 0,
        broadcast: false,
        // Linux's: a group's datagrams stay on the link unless asked.
        mcast_ttl: 1,
        mcast_hops: 1,
        mcast_if: None,
        // Linux's: local members hear the host's own group datagrams.
        mcast_loop_v4: true,
        mcast_loop_v6: true,
    };

    /// (TTL or hop limit, TOS or traffic class) for a datagram of the family.
    #[inline(always)]
    fn for_family(&self, v4: bool) -> (u8, u8) {
        if v4 { (self.ttl, self.tos) } else { (self.hops, self.tclass) }
    }
}

/// A UDP socket on a spate [`Stack`].
///
/// It behaves like `std::net::UdpSocket`: blocking by default, with
/// `set_nonblocking` and timeouts; errors carry the errno Linux would give
/// (`AddrInUse`, `ConnectionRefused`, `WouldBlock`...). Received datagrams
/// can also be taken in batches as [`Datagram`](crate::Datagram)s that own their mbufs, and
/// payloads can be sent from a [`SendBuf`](crate::SendBuf) filled in place, without copies.
///
/// [`try_clone`](Self::try_clone) gives a second handle to the same
/// socket (as `dup` does): options, binding and queue are shared, and the
/// socket closes when the last handle is dropped.
#[derive(Debug)]
pub struct UdpSocket {
    inner: Arc<Inner>,
    // What never changes, copied into each handle: the send path reads
    // it without going through `inner`.
    stack: Stack,
    core: Arc<SocketCore>,
    family: Family,
    v6only: bool,
    tx_worker: usize,
}

/// The socket the handles share: what changes, and what closes it when
/// the last handle goes.
#[derive(Debug)]
struct Inner {
    stack: Stack,
    core: Arc<SocketCore>,
    state: Mutex<State>,
    nonblocking: AtomicBool,
    /// Nanoseconds; 0 for none.
    read_timeout: AtomicU64,
    write_timeout: Mutex<Option<Duration>>,
    /// `UDP_SEGMENT`: 0 for none.
    gso_size: AtomicU32,
    /// Fail sends larger than the path MTU instead of fragmenting them.
    dont_fragment: AtomicBool,
    /// `SO_TIMESTAMPNS`: receive timestamps asked for.
    timestamps: AtomicBool,
}

/// The source address a socket bound to `bound` sends from, if it fixes
/// one: not the unspecified address, nor a group (a group-bound socket
/// sends from its route's source, as Linux's `inet_saddr` of 0).
fn bound_source(bound: IpAddr) -> Option<IpAddr> {
    Some(bound).filter(|ip| !ip.is_unspecified() && !ip.is_multicast())
}

/// Refuses a send or connect from `bound`, an address the stack no longer
/// has: for IPv4 `ENETUNREACH`, what Linux's route lookup says (measured
/// on 6.18: a socket bound to an address `ip addr del` removed); for IPv6
/// `EADDRNOTAVAIL`, as a bind there would say, where Linux sends from the
/// removed address anyway.
fn check_source(net: &Net, bound: Option<IpAddr>) -> io::Result<()> {
    match bound.filter(|ip| !net.is_local(ip)) {
        None => Ok(()),
        Some(IpAddr::V4(_)) => Err(errno(libc::ENETUNREACH, "the socket's address was removed from the stack")),
        Some(IpAddr::V6(_)) => Err(errno(libc::EADDRNOTAVAIL, "the socket's address was removed from the stack")),
    }
}

/// Refuses `route` to `dst` when `dst` is the limited or the route's
/// interface's subnet broadcast address and the socket may not send there
/// (`SO_BROADCAST` off): `EACCES`, as Linux.
fn check_broadcast(net: &Net, dst: &IpAddr, route: &crate::route::Route, allowed: bool) -> io::Result<()> {
    match dst {
        IpAddr::V4(d) if !allowed && net.ifaces[route.iface as usize].is_ipv4_broadcast(*d) => {
            Err(errno(libc::EACCES, "a broadcast address, and SO_BROADCAST is off"))
        }
        _ => Ok(()),
    }
}

/// Linux's errno `code` as the error, as `std::net::UdpSocket` gives it
/// (`raw_os_error()` is the code, so a C caller gets it back and Rust's
/// `ErrorKind` matches); `what` says why, logged at debug level.
pub(crate) fn errno(code: i32, what: &'static str) -> io::Error {
    log::debug!("socket call: {what} (errno {code})");
    io::Error::from_raw_os_error(code)
}

impl UdpSocket {
    fn shared(&self) -> &Shared {
        &self.stack.shared
    }

    fn state(&self) -> State {
        *self.lock_state()
    }

    fn lock_state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

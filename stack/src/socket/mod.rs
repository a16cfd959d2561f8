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

use crate::lookup::Family;
use crate::shared::{Shared, SocketCore, Stack};

mod api;
mod send;

pub use api::SocketBuilder;
pub use send::GSO_MAX_SEGMENTS;

#[derive(Debug, Clone, Copy)]
struct State {
    local: SocketAddr,
    peer: Option<SocketAddr>,
    // Bound to a specific address by the user, not by connect.
    explicit_ip: bool,
    /// The route of the last send: (destination, local address it was
    /// looked up for, route before the path MTU). The routing table and
    /// the interfaces do not change while the stack lives, so the pair
    /// decides the route; a reply stream looks it up once.
    last_route: Option<(IpAddr, IpAddr, crate::route::Route)>,
}

/// A UDP socket on a spate [`Stack`].
///
/// It behaves like `std::net::UdpSocket`: blocking by default, with
/// `set_nonblocking` and timeouts; errors carry the errno Linux would give
/// (`AddrInUse`, `ConnectionRefused`, `WouldBlock`...). Received datagrams
/// can also be taken in batches as [`Datagram`](crate::Datagram)s that own their mbufs, and
/// payloads can be sent from a [`SendBuf`](crate::SendBuf) filled in place, without copies.
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

pub(crate) fn errno(code: i32, what: &'static str) -> io::Error {
    let kind = io::Error::from_raw_os_error(code).kind();
    io::Error::new(kind, format!("{what} ({})", io::Error::from_raw_os_error(code)))
}

impl UdpSocket {
    fn shared(&self) -> &Shared {
        &self.stack.shared
    }

    fn state(&self) -> State {
        *self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

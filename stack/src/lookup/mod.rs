//! The socket table: who receives a datagram.
//!
//! Writers (bind, connect, disconnect, close) change a master copy under a
//! mutex and publish a new immutable [`TableSnapshot`]; each lcore keeps the
//! snapshot it took last and compares one generation counter per burst.
//! This is RCU by reference counting: a lookup takes no lock, does no
//! atomic read-modify-write and never waits for a writer, and a writer
//! never waits for readers (the old snapshot goes when the last lcore lets
//! go of it). The price is on the writer's side: a change rebuilds the
//! snapshot, O(sockets) work that binds and connects pay, not packets.
//! Seqlocks would make readers retry under writes and per-entry epochs
//! would put reclamation on the datapath; neither buys anything here.
//!
//! A lookup sees one consistent state, perhaps a moment old. Each binding
//! carries the socket's epoch at publication; the socket bumps its own
//! epoch after every change, so the lcore notices a stale pick when it
//! queues the datagram and looks again in a fresh snapshot
//! (`Rx.SocketClosed` counts what then has no socket).
//!
//! The lookup itself follows Linux: the 4-tuple table for connected
//! sockets, then the sockets bound to the destination address, then those
//! bound to the wildcard, each scored by [`compute_score`], reuseport
//! groups resolved by flow hash.

mod reuseport;
pub use reuseport::reciprocal_scale;
mod score;
mod table;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[cfg(test)]
use score::compute_score;
pub use score::{FlowKey, ip_key};
pub use table::{Shortcut, TableSnapshot};

/// Address family of a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    /// AF_INET.
    V4,
    /// AF_INET6 (dual-stack unless `v6only`).
    V6,
}

/// What the table knows of a socket, copied into every snapshot.
#[derive(Debug, Clone)]
pub struct Binding<S> {
    /// Socket id.
    pub id: u64,
    /// Family.
    pub family: Family,
    /// Local address; an IPv4-mapped IPv6 address is stored as IPv4.
    /// Connecting a wildcard-bound socket fixes it to the route's source.
    pub local: SocketAddr,
    /// The address given to bind (groups and the table layout follow it,
    /// as Linux keeps a connected socket in its reuseport group).
    pub bound: std::net::IpAddr,
    /// Connected peer (IPv4-mapped stored as IPv4).
    pub peer: Option<SocketAddr>,
    /// IPv6 socket that refuses IPv4.
    pub v6only: bool,
    /// Bound to one interface.
    pub iface: Option<u16>,
    /// Member of a reuseport group.
    pub reuseport: bool,
    /// The lcore (index) this socket prefers to be fed on
    /// (`SO_INCOMING_CPU`).
    pub incoming_lcore: Option<u32>,
    /// The socket's epoch when this binding was published.
    pub epoch: u64,
    /// The socket's receiver.
    pub sock: S,
}

/// Why a bind failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindError {
    /// Another socket holds the address and port.
    InUse,
    /// No ephemeral port is free.
    NoPorts,
}

/// Ephemeral ports, as Linux's default `ip_local_port_range`.
pub const EPHEMERAL: std::ops::RangeInclusive<u16> = 32768..=60999;

/// The table.
#[derive(Debug)]
pub struct SocketTable<S> {
    master: Mutex<Master<S>>,
    published: Mutex<Arc<TableSnapshot<S>>>,
    generation: AtomicU64,
    secret: [u64; 4],
}

#[derive(Debug)]
struct Master<S> {
    by_port: HashMap<u16, Vec<Binding<S>>>,
    next_ephemeral: u16,
}

fn overlaps<S>(a: &Binding<S>, b: &Binding<S>) -> bool {
    let (la, lb) = (a.local.ip(), b.local.ip());
    // Families meet when they are equal or one side is a dual-stack wildcard.
    let covers = |x: &Binding<S>, y: &Binding<S>| {
        x.family == Family::V6 && !x.v6only && x.local.ip().is_unspecified() && y.local.ip().is_ipv4()
    };
    let same_family = la.is_ipv4() == lb.is_ipv4();
    if !same_family && !covers(a, b) && !covers(b, a) {
        return false;
    }
    la.is_unspecified() || lb.is_unspecified() || la == lb
}

impl<S: Clone> SocketTable<S> {
    /// Every binding, in no order (for the control endpoint's listing).
    pub fn bindings(&self) -> Vec<Binding<S>> {
        let m = self.master.lock().unwrap_or_else(|p| p.into_inner());
        m.by_port.values().flatten().cloned().collect()
    }

    /// An empty table keyed with `secret` (random per stack).
    pub fn new(secret: [u64; 4]) -> Self {
        let span = (*EPHEMERAL.end() - *EPHEMERAL.start()) as u64 + 1;
        SocketTable {
            master: Mutex::new(Master {
                by_port: HashMap::new(),
                next_ephemeral: EPHEMERAL.start() + (secret[0] % span) as u16,
            }),
            published: Mutex::new(Arc::new(TableSnapshot::empty(secret))),
            generation: AtomicU64::new(0),
            secret,
        }
    }

    /// The current generation (lcores compare it at the top of each loop
    /// iteration and after each burst that brought frames).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<TableSnapshot<S>> {
        self.published.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Master<S>> {
        self.master.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, m: &Master<S>) {
        let all: Vec<&Binding<S>> = m.by_port.values().flatten().collect();
        let snap = TableSnapshot::build(&all, self.secret);
        *self.published.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(snap);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Adds `b`; port 0 picks a free ephemeral port. Returns the local address.
    pub fn bind(&self, mut b: Binding<S>) -> Result<SocketAddr, BindError> {
        let mut m = self.lock();
        if b.local.port() == 0 {
            let span = (*EPHEMERAL.end() - *EPHEMERAL.start()) as u32 + 1;
            let mut found = None;
            for _ in 0..span {
                let port = m.next_ephemeral;
                m.next_ephemeral = if port == *EPHEMERAL.end() { *EPHEMERAL.start() } else { port + 1 };
                b.local.set_port(port);
                if Self::conflict(&m, &b).is_none() {
                    found = Some(port);
                    break;
                }
            }
            if found.is_none() {
                return Err(BindError::NoPorts);
            }
        } else if Self::conflict(&m, &b).is_some() {
            return Err(BindError::InUse);
        }
        let local = b.local;
        m.by_port.entry(local.port()).or_default().push(b);
        self.publish(&m);
        Ok(local)
    }

    fn conflict<'a>(m: &'a Master<S>, b: &Binding<S>) -> Option<&'a Binding<S>> {
        m.by_port.get(&b.local.port())?.iter().find(|o| overlaps(o, b) && !(o.reuseport && b.reuseport))
    }

    /// Changes socket `id`'s peer (and local address, when connecting fixes
    /// the source address of a wildcard-bound socket), at epoch `epoch`.
    pub fn update(&self, id: u64, local: SocketAddr, peer: Option<SocketAddr>, epoch: u64) -> bool {
        let mut m = self.lock();
        let Some(b) = m.by_port.get_mut(&local.port()).and_then(|v| v.iter_mut().find(|b| b.id == id)) else {
            return false;
        };
        b.local = local;
        b.peer = peer;
        b.epoch = epoch;
        self.publish(&m);
        true
    }

    /// Removes socket `id` bound on `port`.
    pub fn unbind(&self, id: u64, port: u16) -> Option<Binding<S>> {
        let mut m = self.lock();
        let v = m.by_port.get_mut(&port)?;
        let at = v.iter().position(|b| b.id == id)?;
        let b = v.remove(at);
        if v.is_empty() {
            m.by_port.remove(&port);
        }
        self.publish(&m);
        Some(b)
    }
}

#[cfg(test)]
mod tests;

//! The socket table: who receives a datagram.
//!
//! Writers (bind, connect, close) change a master copy under a mutex and
//! publish an immutable snapshot; lcores keep the snapshot they last took
//! and check one generation counter per burst, so a lookup takes no lock and
//! never waits for a writer. A datagram looked up in an older snapshot can
//! still reach a socket that closed meanwhile: its queue refuses it and the
//! drop is counted (`Rx.SocketClosed`).
//!
//! Lookup follows Linux's `__udp4_lib_lookup`: sockets bound to the
//! packet's destination address are scored first (connected ones among
//! them), wildcard-bound sockets only when none of those matches.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Address family of a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    pub local: SocketAddr,
    /// Connected peer (IPv4-mapped stored as IPv4).
    pub peer: Option<SocketAddr>,
    /// IPv6 socket that refuses IPv4.
    pub v6only: bool,
    /// Bound to one interface.
    pub iface: Option<u16>,
    /// Member of a reuseport group.
    pub reuseport: bool,
    /// The socket's receiver.
    pub sock: S,
}

/// A received datagram's addressing, as the lookup needs it.
#[derive(Debug, Clone, Copy)]
pub struct FlowKey {
    /// Source address.
    pub src: IpAddr,
    /// Source port.
    pub src_port: u16,
    /// Destination address.
    pub dst: IpAddr,
    /// Destination port.
    pub dst_port: u16,
    /// Arriving interface.
    pub iface: u16,
}

/// Linux's `compute_score`: -1 when `b` cannot take the datagram, else
/// higher for a closer match. `wildcard_pass` looks for sockets bound to
/// the unspecified address.
#[inline(always)]
pub fn compute_score<S>(b: &Binding<S>, k: &FlowKey, wildcard_pass: bool) -> i32 {
    if b.local.port() != k.dst_port {
        return -1;
    }
    let mut score = match (b.family, k.dst) {
        (Family::V4, IpAddr::V4(_)) => 2,
        (Family::V6, IpAddr::V4(_)) if !b.v6only => 1,
        (Family::V6, IpAddr::V6(_)) => 2,
        _ => return -1,
    };
    let local = b.local.ip();
    if wildcard_pass {
        if !local.is_unspecified() {
            return -1;
        }
        // 0.0.0.0 (also an IPv6 socket's ::ffff:0.0.0.0) covers IPv4 only;
        // the family match above already kept IPv4 from v6only sockets.
        if local.is_ipv4() && !k.dst.is_ipv4() {
            return -1;
        }
    } else if local != k.dst {
        return -1;
    }
    if let Some(peer) = b.peer {
        if peer.ip() != k.src {
            return -1;
        }
        score += 4;
        if peer.port() != k.src_port {
            return -1;
        }
        score += 4;
    }
    match b.iface {
        Some(i) if i != k.iface => return -1,
        Some(_) => score += 4,
        None => {}
    }
    score
}

/// An immutable view of the table.
#[derive(Debug)]
pub struct Snapshot<S> {
    by_port: HashMap<u16, Box<[Binding<S>]>>,
}

impl<S> Default for Snapshot<S> {
    fn default() -> Self {
        Snapshot {
            by_port: HashMap::new(),
        }
    }
}

impl<S> Snapshot<S> {
    /// The socket that receives a datagram with key `k`.
    #[inline]
    pub fn lookup(&self, k: &FlowKey) -> Option<&Binding<S>> {
        let slot = self.by_port.get(&k.dst_port)?;
        // Two passes with one call site of compute_score: specific bindings
        // first, wildcard ones only when none matched.
        for wildcard_pass in [false, true] {
            let mut best: Option<&Binding<S>> = None;
            let mut best_score = -1;
            for b in slot.iter() {
                let s = compute_score(b, k, wildcard_pass);
                if s > best_score {
                    best_score = s;
                    best = Some(b);
                }
            }
            if best.is_some() {
                return best;
            }
        }
        None
    }

    /// Bindings on `port`.
    pub fn on_port(&self, port: u16) -> &[Binding<S>] {
        self.by_port.get(&port).map(|b| &**b).unwrap_or(&[])
    }
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
    published: Mutex<Arc<Snapshot<S>>>,
    generation: AtomicU64,
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
        x.family == Family::V6
            && !x.v6only
            && x.local.ip().is_unspecified()
            && y.local.ip().is_ipv4()
    };
    let same_family = la.is_ipv4() == lb.is_ipv4();
    if !same_family && !covers(a, b) && !covers(b, a) {
        return false;
    }
    la.is_unspecified() || lb.is_unspecified() || la == lb
}

impl<S: Clone> SocketTable<S> {
    /// An empty table; `seed` spreads the first ephemeral port.
    pub fn new(seed: u64) -> Self {
        let span = (*EPHEMERAL.end() - *EPHEMERAL.start()) as u64 + 1;
        SocketTable {
            master: Mutex::new(Master {
                by_port: HashMap::new(),
                next_ephemeral: EPHEMERAL.start() + (seed % span) as u16,
            }),
            published: Mutex::new(Arc::new(Snapshot::default())),
            generation: AtomicU64::new(0),
        }
    }

    /// The current generation (lcores compare it once per burst).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot<S>> {
        self.published
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Master<S>> {
        self.master.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, m: &Master<S>) {
        let snap = Snapshot {
            by_port: m
                .by_port
                .iter()
                .map(|(p, v)| (*p, v.clone().into_boxed_slice()))
                .collect(),
        };
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
                m.next_ephemeral = if port == *EPHEMERAL.end() {
                    *EPHEMERAL.start()
                } else {
                    port + 1
                };
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
        m.by_port
            .get(&b.local.port())?
            .iter()
            .find(|o| overlaps(o, b) && !(o.reuseport && b.reuseport))
    }

    /// Changes socket `id`'s peer (and local address, when connecting fixes
    /// the source address of a wildcard-bound socket).
    pub fn update(&self, id: u64, local: SocketAddr, peer: Option<SocketAddr>) -> bool {
        let mut m = self.lock();
        let Some(b) = m
            .by_port
            .get_mut(&local.port())
            .and_then(|v| v.iter_mut().find(|b| b.id == id))
        else {
            return false;
        };
        b.local = local;
        b.peer = peer;
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
mod tests {
    use super::*;

    fn b(id: u64, family: Family, local: &str, peer: Option<&str>) -> Binding<u64> {
        Binding {
            id,
            family,
            local: local.parse().unwrap(),
            peer: peer.map(|p| p.parse().unwrap()),
            v6only: false,
            iface: None,
            reuseport: false,
            sock: id,
        }
    }

    fn key(src: &str, dst: &str) -> FlowKey {
        let (s, d): (SocketAddr, SocketAddr) = (src.parse().unwrap(), dst.parse().unwrap());
        FlowKey {
            src: s.ip(),
            src_port: s.port(),
            dst: d.ip(),
            dst_port: d.port(),
            iface: 0,
        }
    }

    #[test]
    fn specific_beats_wildcard_and_connected_beats_unconnected() {
        let t = SocketTable::new(0);
        t.bind(b(1, Family::V4, "0.0.0.0:7", None)).unwrap();
        t.bind(b(2, Family::V4, "198.18.0.2:8", None)).unwrap();
        let s = t.snapshot();
        assert_eq!(
            s.lookup(&key("198.18.0.1:1000", "198.18.0.2:7"))
                .unwrap()
                .id,
            1
        );
        assert_eq!(
            s.lookup(&key("198.18.0.1:1000", "198.18.0.2:8"))
                .unwrap()
                .id,
            2
        );
        assert!(s.lookup(&key("198.18.0.1:1000", "198.18.0.3:8")).is_none());
        assert!(
            s.lookup(&key("[fd00::1]:1000", "[fd00::2]:7")).is_none(),
            "v4 socket, v6 packet"
        );
    }

    #[test]
    fn bind_conflicts_and_ephemeral_ports() {
        let t = SocketTable::new(5);
        t.bind(b(1, Family::V4, "0.0.0.0:7", None)).unwrap();
        assert_eq!(
            t.bind(b(2, Family::V4, "198.18.0.2:7", None)),
            Err(BindError::InUse)
        );
        assert_eq!(
            t.bind(b(3, Family::V6, "[::]:7", None)),
            Err(BindError::InUse),
            "dual-stack :: covers 0.0.0.0"
        );
        let mut v6only = b(4, Family::V6, "[::]:7", None);
        v6only.v6only = true;
        t.bind(v6only).unwrap();
        let a = t.bind(b(5, Family::V4, "0.0.0.0:0", None)).unwrap();
        assert!(EPHEMERAL.contains(&a.port()));
        let c = t.bind(b(6, Family::V4, "0.0.0.0:0", None)).unwrap();
        assert_ne!(a.port(), c.port());
        assert!(t.unbind(1, 7).is_some());
        t.bind(b(7, Family::V4, "198.18.0.2:7", None)).unwrap();
    }

    #[test]
    fn generation_moves_with_every_change() {
        let t = SocketTable::new(0);
        let g0 = t.generation();
        t.bind(b(1, Family::V4, "0.0.0.0:7", None)).unwrap();
        let g1 = t.generation();
        assert!(g1 > g0);
        assert!(t.update(
            1,
            "198.18.0.2:7".parse().unwrap(),
            Some("198.18.0.1:9".parse().unwrap())
        ));
        assert!(t.generation() > g1);
        let s = t.snapshot();
        assert!(
            s.lookup(&key("198.18.0.1:10", "198.18.0.2:7")).is_none(),
            "connected: other peers refused"
        );
        assert_eq!(
            s.lookup(&key("198.18.0.1:9", "198.18.0.2:7")).unwrap().id,
            1
        );
    }
}

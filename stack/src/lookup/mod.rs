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

/// An address as the lookup compares it: IPv6, with IPv4 in its mapped form.
#[inline]
pub fn ip_key(ip: &IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => 0xffff_0000_0000 | u32::from(*a) as u128,
        IpAddr::V6(a) => u128::from(*a),
    }
}

/// A received datagram's addressing, as the lookup needs it.
#[derive(Debug, Clone, Copy)]
pub struct FlowKey {
    /// Source address ([`ip_key`] form).
    pub src: u128,
    /// Source port.
    pub src_port: u16,
    /// Destination address ([`ip_key`] form).
    pub dst: u128,
    /// Destination port.
    pub dst_port: u16,
    /// An IPv4 datagram.
    pub v4: bool,
    /// Arriving interface.
    pub iface: u16,
}

impl FlowKey {
    /// The key of a datagram from `src` to `dst` on interface `iface`.
    #[inline]
    pub fn new(src: &SocketAddr, dst: &SocketAddr, iface: u16) -> FlowKey {
        FlowKey {
            src: ip_key(&src.ip()),
            src_port: src.port(),
            dst: ip_key(&dst.ip()),
            dst_port: dst.port(),
            v4: dst.is_ipv4(),
            iface,
        }
    }
}

/// A binding in the form `compute_score` reads: integers only, one dense
/// array per snapshot.
#[derive(Debug, Clone, Copy)]
pub struct Matcher {
    port: u16,
    local: u128,
    local_any: bool,
    local_v4: bool,
    family_v4: bool,
    v6only: bool,
    peer: Option<(u128, u16)>,
    iface: Option<u16>,
}

impl Matcher {
    fn of<S>(b: &Binding<S>) -> Matcher {
        let ip = b.local.ip();
        Matcher {
            port: b.local.port(),
            local: ip_key(&ip),
            local_any: ip.is_unspecified(),
            local_v4: ip.is_ipv4(),
            family_v4: b.family == Family::V4,
            v6only: b.v6only,
            peer: b.peer.map(|p| (ip_key(&p.ip()), p.port())),
            iface: b.iface,
        }
    }
}

/// Linux's `compute_score`: -1 when a socket cannot take the datagram,
/// else higher for a closer match: 2 for a socket of the datagram's family
/// (1 for a dual-stack IPv6 socket taking IPv4), +4 for a matching
/// connected peer address, +4 for its port, +4 for a socket bound to the
/// arriving interface. `wildcard_pass` looks at sockets bound to the
/// unspecified address.
#[inline(always)]
pub fn compute_score(m: &Matcher, k: &FlowKey, wildcard_pass: bool) -> i32 {
    if m.port != k.dst_port {
        return -1;
    }
    let mut score = match (m.family_v4, k.v4) {
        (true, true) => 2,
        (false, true) if !m.v6only => 1,
        (false, false) => 2,
        _ => return -1,
    };
    if wildcard_pass {
        // 0.0.0.0 (also an IPv6 socket's ::ffff:0.0.0.0) covers IPv4 only;
        // the family match above already kept IPv4 from v6only sockets.
        if !m.local_any || (m.local_v4 && !k.v4) {
            return -1;
        }
    } else if m.local != k.dst || m.local_any {
        return -1;
    }
    if let Some((ip, port)) = m.peer {
        if ip != k.src {
            return -1;
        }
        score += 4;
        if port != k.src_port {
            return -1;
        }
        score += 4;
    }
    match m.iface {
        Some(i) if i != k.iface => return -1,
        Some(_) => score += 4,
        None => {}
    }
    score
}

/// An immutable view of the table: every binding in one array, and a
/// port table indexed by the port itself (so no port can be aimed at a
/// hash bucket) that leads to the range of the array holding that port's
/// bindings.
#[derive(Debug)]
pub struct Snapshot<S> {
    bindings: Vec<Binding<S>>,
    matchers: Vec<Matcher>,
    /// Per port: 0, or 1 + the index of its range in `ranges`: (start,
    /// end of the specifically bound ones, end of all); specific bindings
    /// come first in the array, wildcard ones after them.
    ports: Box<[u32]>,
    ranges: Vec<(u32, u32, u32)>,
}

impl<S> Snapshot<S> {
    fn empty() -> Self {
        Snapshot {
            bindings: Vec::new(),
            matchers: Vec::new(),
            ports: vec![0; 65536].into_boxed_slice(),
            ranges: Vec::new(),
        }
    }

    #[inline]
    fn range(&self, port: u16) -> Option<(u32, u32, u32)> {
        match self.ports[port as usize] {
            0 => None,
            r => Some(self.ranges[r as usize - 1]),
        }
    }

    /// The socket that receives a datagram with key `k`: its index in
    /// this snapshot, and its binding.
    #[inline]
    pub fn lookup(&self, k: &FlowKey) -> Option<(u32, &Binding<S>)> {
        let (start, specific_end, end) = self.range(k.dst_port)?;
        // Specific bindings first, wildcard ones only when none matched;
        // one call site of compute_score serves both.
        let (mut lo, mut hi, mut wildcard) = (start, specific_end, false);
        loop {
            let mut best = None;
            let mut best_score = -1;
            for i in lo..hi {
                let s = compute_score(&self.matchers[i as usize], k, wildcard);
                if s > best_score {
                    best_score = s;
                    best = Some(i);
                }
            }
            if let Some(i) = best {
                return Some((i, &self.bindings[i as usize]));
            }
            if wildcard || specific_end == end {
                return None;
            }
            (lo, hi, wildcard) = (specific_end, end, true);
        }
    }

    /// The binding at `index` (from `lookup`).
    #[inline]
    pub fn get(&self, index: u32) -> &Binding<S> {
        &self.bindings[index as usize]
    }

    /// Bindings on `port`.
    pub fn on_port(&self, port: u16) -> &[Binding<S>] {
        match self.range(port) {
            Some((s, _, e)) => &self.bindings[s as usize..e as usize],
            None => &[],
        }
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
        x.family == Family::V6 && !x.v6only && x.local.ip().is_unspecified() && y.local.ip().is_ipv4()
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
            published: Mutex::new(Arc::new(Snapshot::empty())),
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
        self.published.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Master<S>> {
        self.master.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, m: &Master<S>) {
        let mut snap = Snapshot::empty();
        for (port, v) in &m.by_port {
            let start = snap.bindings.len() as u32;
            let (wild, specific): (Vec<&Binding<S>>, Vec<&Binding<S>>) =
                v.iter().partition(|b| b.local.ip().is_unspecified());
            let specific_end = start + specific.len() as u32;
            for b in specific.into_iter().chain(wild) {
                snap.bindings.push(b.clone());
                snap.matchers.push(Matcher::of(b));
            }
            snap.ranges.push((start, specific_end, snap.bindings.len() as u32));
            snap.ports[*port as usize] = snap.ranges.len() as u32;
        }
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
    /// the source address of a wildcard-bound socket).
    pub fn update(&self, id: u64, local: SocketAddr, peer: Option<SocketAddr>) -> bool {
        let mut m = self.lock();
        let Some(b) = m.by_port.get_mut(&local.port()).and_then(|v| v.iter_mut().find(|b| b.id == id)) else {
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
        FlowKey::new(&src.parse().unwrap(), &dst.parse().unwrap(), 0)
    }

    #[test]
    fn specific_beats_wildcard_and_connected_beats_unconnected() {
        let t = SocketTable::new(0);
        t.bind(b(1, Family::V4, "0.0.0.0:7", None)).unwrap();
        t.bind(b(2, Family::V4, "198.18.0.2:8", None)).unwrap();
        let s = t.snapshot();
        assert_eq!(s.lookup(&key("198.18.0.1:1000", "198.18.0.2:7")).unwrap().1.id, 1);
        assert_eq!(s.lookup(&key("198.18.0.1:1000", "198.18.0.2:8")).unwrap().1.id, 2);
        assert!(s.lookup(&key("198.18.0.1:1000", "198.18.0.3:8")).is_none());
        assert!(s.lookup(&key("[fd00::1]:1000", "[fd00::2]:7")).is_none(), "v4 socket, v6 packet");
    }

    #[test]
    fn bind_conflicts_and_ephemeral_ports() {
        let t = SocketTable::new(5);
        t.bind(b(1, Family::V4, "0.0.0.0:7", None)).unwrap();
        assert_eq!(t.bind(b(2, Family::V4, "198.18.0.2:7", None)), Err(BindError::InUse));
        assert_eq!(t.bind(b(3, Family::V6, "[::]:7", None)), Err(BindError::InUse), "dual-stack :: covers 0.0.0.0");
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
        assert!(t.update(1, "198.18.0.2:7".parse().unwrap(), Some("198.18.0.1:9".parse().unwrap())));
        assert!(t.generation() > g1);
        let s = t.snapshot();
        assert!(s.lookup(&key("198.18.0.1:10", "198.18.0.2:7")).is_none(), "connected: other peers refused");
        assert_eq!(s.lookup(&key("198.18.0.1:9", "198.18.0.2:7")).unwrap().1.id, 1);
    }
}

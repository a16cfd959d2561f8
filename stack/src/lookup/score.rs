//! How well a socket matches a datagram: Linux's `compute_score`, over a
//! compact integer form of each binding.

use std::net::{IpAddr, SocketAddr};

use super::{Binding, Family};

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
    /// The polling lcore doing the lookup (its index in the stack).
    pub lcore: u32,
    /// The flow's hash when the port computed one (RSS); otherwise spate
    /// hashes the 4-tuple with its secret when a reuseport group needs it.
    pub rss_hash: Option<u32>,
}

impl FlowKey {
    /// The key of a datagram from `src` to `dst` on interface `iface`,
    /// looked up by lcore index 0.
    #[inline]
    pub fn new(src: &SocketAddr, dst: &SocketAddr, iface: u16) -> FlowKey {
        FlowKey {
            src: ip_key(&src.ip()),
            src_port: src.port(),
            dst: ip_key(&dst.ip()),
            dst_port: dst.port(),
            v4: dst.is_ipv4(),
            iface,
            lcore: 0,
            rss_hash: None,
        }
    }

    /// The same key seen by polling lcore `lcore`.
    #[inline]
    pub fn on_lcore(mut self, lcore: u32) -> FlowKey {
        self.lcore = lcore;
        self
    }
}

/// Interface or lcore field of a [`Matcher`] that names none.
pub(super) const ANY: u32 = u32::MAX;

/// A binding in the form `compute_score` reads: integers only, the family
/// rules folded into one base score per datagram family, in one dense
/// array per snapshot.
#[derive(Debug, Clone, Copy)]
pub struct Matcher {
    /// The bound address ([`ip_key`] form), 0 when bound to the wildcard
    /// (no datagram is addressed to `::`).
    pub(super) local: u128,
    pub(super) peer: u128,
    pub(super) port: u16,
    pub(super) peer_port: u16,
    /// The score for an IPv4 datagram (index 0) and an IPv6 one (1) when
    /// everything else matches, lcore bonus aside: 2 for the socket's own
    /// family, 1 for IPv4 into a dual-stack IPv6 socket, +8 when connected
    /// (peer address and port), +4 when bound to a device; -1 where the
    /// socket cannot take the family.
    pub(super) score: [i8; 2],
    pub(super) connected: bool,
    pub(super) iface: u32,
    pub(super) incoming_lcore: u32,
    /// 0, or 1 + the index of the reuseport group of this binding when the
    /// binding selects within it (an unconnected member).
    pub(super) group: u32,
    /// For a group member: one past the group's last binding index, where
    /// the walk resumes after re-scoring the group's pick.
    pub(super) group_end: u32,
}

impl Matcher {
    pub(super) fn of<S>(b: &Binding<S>) -> Matcher {
        let ip = b.local.ip();
        let v4_local = ip.is_ipv4();
        let base_v4 = match b.family {
            Family::V4 => 2,
            Family::V6 if !b.v6only => 1,
            Family::V6 => -1,
        };
        // An IPv4 address (0.0.0.0 included, also an IPv6 socket's
        // ::ffff:0.0.0.0) takes no IPv6.
        let base_v6 = if b.family == Family::V6 && !v4_local { 2 } else { -1 };
        let (peer, peer_port) = b.peer.map(|p| (ip_key(&p.ip()), p.port())).unwrap_or((0, 0));
        let bonus = 8 * b.peer.is_some() as i8 + 4 * b.iface.is_some() as i8;
        let score = |base: i8| if base < 0 { -1 } else { base + bonus };
        Matcher {
            local: if ip.is_unspecified() { 0 } else { ip_key(&ip) },
            peer,
            port: b.local.port(),
            peer_port,
            score: [score(base_v4), score(base_v6)],
            connected: b.peer.is_some(),
            iface: b.iface.map(u32::from).unwrap_or(ANY),
            incoming_lcore: b.incoming_lcore.unwrap_or(ANY),
            group: 0,
            group_end: 0,
        }
    }

    /// Whether a connected binding's 4-tuple is exactly the datagram's
    /// (Linux's `inet_match`), and the device fits.
    #[inline]
    pub fn exact(&self, k: &FlowKey) -> bool {
        self.connected
            && self.peer == k.src
            && self.peer_port == k.src_port
            && self.local == k.dst
            && (self.iface == ANY || self.iface == k.iface as u32)
    }
}

/// Linux's `compute_score`: -1 when a socket cannot take the datagram,
/// else higher for a closer match: 2 for a socket of the datagram's family
/// (1 for a dual-stack IPv6 socket taking IPv4), +4 for a matching
/// connected peer address, +4 for its port, +4 for a socket bound to the
/// arriving interface, +1 when the socket's incoming lcore is the lcore
/// doing the lookup. `wildcard` looks at sockets bound to the unspecified
/// address, otherwise at sockets bound to the destination address.
///
/// Always inlined, and called from one place in the lookup: a second call
/// site is what made the compiler stop inlining Linux's (seed 000).
#[cfg_attr(not(feature = "no-inline-score"), inline(always))]
#[cfg_attr(feature = "no-inline-score", inline(never))]
pub fn compute_score(m: &Matcher, k: &FlowKey, wildcard: bool) -> i32 {
    // The bonuses for a connected peer and a device are in `m.score`
    // already; what is left is to refuse a mismatch.
    let score = m.score[!k.v4 as usize] as i32;
    let local = if wildcard { 0 } else { k.dst };
    if score < 0 || m.port != k.dst_port || m.local != local {
        return -1;
    }
    if m.connected && (m.peer != k.src || m.peer_port != k.src_port) {
        return -1;
    }
    if m.iface != ANY && m.iface != k.iface as u32 {
        return -1;
    }
    score + (m.incoming_lcore == k.lcore) as i32
}

/// A keyed hash: each step multiplies 64-bit words into 128 bits and folds
/// the halves, with secret words mixed in, so a remote sender cannot
/// predict which bucket a flow lands in.
#[inline]
pub fn fold_mul(a: u64, b: u64) -> u64 {
    let r = (a as u128).wrapping_mul(b as u128);
    (r as u64) ^ ((r >> 64) as u64)
}

/// The secret-keyed hash of a 4-tuple: two independent multiplications
/// (they run in parallel) over the four 64-bit halves of the addresses,
/// the ports folded into one of them.
#[inline]
pub fn hash_tuple(secret: &[u64; 4], local: u128, local_port: u16, remote: u128, remote_port: u16) -> u64 {
    let ports = ((local_port as u64) << 16) | remote_port as u64;
    let a = fold_mul(local as u64 ^ secret[0], remote as u64 ^ secret[1]);
    let b = fold_mul((local >> 64) as u64 ^ ports ^ secret[2], (remote >> 64) as u64 ^ secret[3]);
    a ^ b.rotate_left(29)
}

/// The flow hash a reuseport group spreads flows by, when the port gave
/// none: one keyed multiplication over the 4-tuple (selection needs an even
/// spread, the tables need the stronger [`hash_tuple`]).
#[inline]
pub fn hash_flow(secret: &[u64; 4], k: &FlowKey) -> u32 {
    hash_flow_parts(secret, k.src, k.src_port, k.dst, k.dst_port)
}

/// [`hash_flow`] of a flow given by its parts.
#[inline(always)]
pub fn hash_flow_parts(secret: &[u64; 4], src: u128, src_port: u16, dst: u128, dst_port: u16) -> u32 {
    let ports = ((src_port as u64) << 16) | dst_port as u64;
    let a = src as u64 ^ (dst >> 64) as u64 ^ ports ^ secret[0];
    let b = dst as u64 ^ (src >> 64) as u64 ^ secret[1];
    let h = fold_mul(a, b);
    (h ^ (h >> 32)) as u32
}

/// The secret-keyed hash of an (address, port).
#[inline]
pub fn hash_addr_port(secret: &[u64; 4], addr: u128, port: u16) -> u64 {
    let h = fold_mul(addr as u64 ^ secret[1], (addr >> 64) as u64 ^ port as u64 ^ secret[2]);
    fold_mul(h, secret[3] | 1)
}

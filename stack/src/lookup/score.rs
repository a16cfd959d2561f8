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

/// A binding in the form `compute_score` reads: integers only, in one
/// dense array per snapshot.
#[derive(Debug, Clone, Copy)]
pub struct Matcher {
    pub(super) port: u16,
    pub(super) local: u128,
    pub(super) local_any: bool,
    pub(super) local_v4: bool,
    pub(super) family_v4: bool,
    pub(super) v6only: bool,
    pub(super) peer: Option<(u128, u16)>,
    pub(super) iface: Option<u16>,
    pub(super) incoming_lcore: Option<u32>,
    /// 0, or 1 + the index of the reuseport group this binding leads.
    pub(super) group: u32,
}

impl Matcher {
    pub(super) fn of<S>(b: &Binding<S>) -> Matcher {
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
            incoming_lcore: b.incoming_lcore,
            group: 0,
        }
    }

    /// Whether the binding is connected.
    #[inline]
    pub fn connected(&self) -> bool {
        self.peer.is_some()
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
    if m.port != k.dst_port {
        return -1;
    }
    let mut score = match (m.family_v4, k.v4) {
        (true, true) => 2,
        (false, true) if !m.v6only => 1,
        (false, false) => 2,
        _ => return -1,
    };
    if wildcard {
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
    if m.incoming_lcore == Some(k.lcore) {
        score += 1;
    }
    score
}

/// A keyed hash: each step multiplies 64-bit words into 128 bits and folds
/// the halves, with secret words mixed in, so a remote sender cannot
/// predict which bucket a flow lands in.
#[inline]
pub fn fold_mul(a: u64, b: u64) -> u64 {
    let r = (a as u128).wrapping_mul(b as u128);
    (r as u64) ^ ((r >> 64) as u64)
}

/// The secret-keyed hash of a 4-tuple.
#[inline]
pub fn hash_tuple(secret: &[u64; 4], local: u128, local_port: u16, remote: u128, remote_port: u16) -> u64 {
    let ports = ((local_port as u64) << 16) | remote_port as u64;
    let h = fold_mul(local as u64 ^ secret[0], (local >> 64) as u64 ^ secret[1]);
    let h = fold_mul(h ^ remote as u64 ^ secret[2], (remote >> 64) as u64 ^ ports ^ secret[3]);
    fold_mul(h, secret[0] | 1)
}

/// The secret-keyed hash of an (address, port).
#[inline]
pub fn hash_addr_port(secret: &[u64; 4], addr: u128, port: u16) -> u64 {
    let h = fold_mul(addr as u64 ^ secret[1], (addr >> 64) as u64 ^ port as u64 ^ secret[2]);
    fold_mul(h, secret[3] | 1)
}

//! A snapshot of the socket table, the form lcores read: three tables
//! over one array of bindings, built whole by the writer and never
//! changed afterwards.
//!
//! - the port table, indexed by the port itself: whether anyone listens,
//!   where the wildcard-bound sockets are, and how many connected sockets
//!   the port has (when none, the 4-tuple table is not touched);
//! - the (address, port) table: the sockets bound to a specific address;
//! - the 4-tuple table (Linux 6.13's hash4): connected sockets.
//!
//! The two hashed tables use a secret key chosen when the stack starts.

use super::reuseport::Group;
use super::score::{ANY, FlowKey, Matcher, compute_score, hash_addr_port, hash_tuple};
use super::{Binding, Family};

/// An open-addressing table, built once.
#[derive(Debug)]
pub(super) struct KeyedTable<K, V> {
    slots: Box<[Option<(K, V)>]>,
    mask: usize,
}

impl<K: Copy + Eq, V: Copy> KeyedTable<K, V> {
    pub(super) fn build(entries: &[(u64, K, V)]) -> Self {
        let cap = (entries.len() * 2).max(8).next_power_of_two();
        let mut slots: Vec<Option<(K, V)>> = vec![None; cap];
        for &(h, k, v) in entries {
            let mut i = h as usize & (cap - 1);
            while slots[i].is_some() {
                i = (i + 1) & (cap - 1);
            }
            slots[i] = Some((k, v));
        }
        KeyedTable { slots: slots.into_boxed_slice(), mask: cap - 1 }
    }

    #[inline]
    pub(super) fn get(&self, h: u64, key: &K) -> Option<V> {
        let mut i = h as usize & self.mask;
        loop {
            match &self.slots[i] {
                Some((k, v)) if k == key => return Some(*v),
                Some(_) => i = (i + 1) & self.mask,
                None => return None,
            }
        }
    }
}

/// What the port table knows of one port.
#[derive(Debug, Clone, Copy, Default)]
struct PortEntry {
    wild_lo: u32,
    wild_hi: u32,
    /// Connected sockets on the port (the per-slot counter: 0 keeps the
    /// lookup away from the 4-tuple table).
    connected: u32,
    /// Where this port's connected sockets are listed in `conn_list`.
    conn_lo: u32,
    /// Whether any socket is bound to a specific address on this port.
    specific: bool,
    /// One bit per connected peer (address and port, hashed): most
    /// datagrams from strangers skip the connected sockets on one test.
    peers: u64,
    /// 1 + the index of the port's only binding when that is all the
    /// lookup can find (bound to the wildcard, unconnected, to no device,
    /// in no group): the datagram's family alone decides, as the full
    /// walk would. 0 otherwise.
    sole: u32,
    /// 1 + the index of the port's only reuseport group when that is all
    /// the lookup can find (its members bound to the wildcard, none
    /// connected, to no device): the family decides whether it takes the
    /// datagram, the flow hash which member does. 0 otherwise.
    group: u32,
    /// For `group`: whether some lcore has exactly one member.
    group_by_lcore: bool,
    /// For `sole` or `group`: whether it takes IPv4 (`[0]`) and IPv6
    /// (`[1]`) datagrams, so the shortcut reads no binding to say.
    takes: [bool; 2],
}

/// Up to this many connected sockets on a port are compared one by one;
/// beyond it the 4-tuple table answers.
const FEW_CONNECTED: u32 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tuple {
    local: u128,
    remote: u128,
    local_port: u16,
    remote_port: u16,
}

/// What [`TableSnapshot::shortcut`] found.
#[derive(Debug)]
pub enum Shortcut<'a, S> {
    /// The lookup's answer.
    Found(Option<(u32, &'a Binding<S>)>),
    /// The port's only reuseport group, which takes the family: its index.
    Group(u32),
    /// As `Group`, for a group whose members name their incoming lcores:
    /// an lcore with one member takes it without a hash
    /// ([`TableSnapshot::sole_member`]).
    LcoreGroup(u32),
    /// The port needs [`TableSnapshot::lookup`].
    Walk,
}

/// An immutable view of the socket table.
#[derive(Debug)]
pub struct TableSnapshot<S> {
    bindings: Vec<Binding<S>>,
    matchers: Vec<Matcher>,
    /// Per port: 0, or 1 + its index in `port_info`.
    ports: Box<[u32; 65536]>,
    port_info: Vec<PortEntry>,
    addr_port: KeyedTable<(u128, u16), (u32, u32)>,
    tuples: KeyedTable<Tuple, u32>,
    /// Binding indices of connected sockets, port by port.
    conn_list: Vec<u32>,
    groups: Vec<Group>,
    secret: [u64; 4],
}

/// Group key: family, v6only, address, port, device.
type GroupKey = (bool, bool, u128, u16, Option<u16>);

impl<S: Clone> TableSnapshot<S> {
    /// An empty table.
    pub(super) fn empty(secret: [u64; 4]) -> Self {
        Self::build(&[], secret)
    }

    /// Lays `all` out: per port, the specifically bound sockets address by
    /// address, then the wildcard ones; within each, reuseport groups as
    /// contiguous blocks, unconnected members first.
    pub(super) fn build(all: &[&Binding<S>], secret: [u64; 4]) -> Self {
        let mut sorted: Vec<&Binding<S>> = all.to_vec();
        // A reuseport group returns its pick at once, so the first group
        // that matches wins: sockets bound to a device come first, then
        // IPv4 before IPv6 of the same address (the wildcard range counts
        // as one address), as Linux adds IPv6 reuseport sockets at the tail
        // of a chain.
        let key = |b: &Binding<S>| {
            let unspecified = b.bound.is_unspecified();
            let addr = if unspecified { 0 } else { super::score::ip_key(&b.bound) };
            (
                b.local.port(),
                unspecified,
                addr,
                b.iface.is_none(),
                b.family,
                group_key(b),
                b.reuseport,
                b.peer.is_some(),
                b.id,
            )
        };
        sorted.sort_by_key(|b| key(b));
        let mut snap = TableSnapshot {
            bindings: Vec::with_capacity(sorted.len()),
            matchers: Vec::with_capacity(sorted.len()),
            ports: vec![0; 65536].into_boxed_slice().try_into().expect("65536 ports"),
            port_info: Vec::new(),
            addr_port: KeyedTable::build(&[]),
            tuples: KeyedTable::build(&[]),
            conn_list: Vec::new(),
            groups: Vec::new(),
            secret,
        };
        let mut addr_entries = Vec::new();
        let mut tuple_entries = Vec::new();
        let mut i = 0;
        while i < sorted.len() {
            let port = sorted[i].local.port();
            let mut info = PortEntry { conn_lo: snap.conn_list.len() as u32, ..PortEntry::default() };
            // Specific addresses, one range each.
            while i < sorted.len() && sorted[i].local.port() == port && !sorted[i].bound.is_unspecified() {
                let addr = super::score::ip_key(&sorted[i].bound);
                let lo = snap.bindings.len() as u32;
                while i < sorted.len()
                    && sorted[i].local.port() == port
                    && super::score::ip_key(&sorted[i].bound) == addr
                    && !sorted[i].bound.is_unspecified()
                {
                    i = snap.push_run(&sorted, i, &mut info, &mut tuple_entries);
                }
                let hi = snap.bindings.len() as u32;
                addr_entries.push((hash_addr_port(&secret, addr, port), (addr, port), (lo, hi)));
                info.specific = true;
            }
            info.wild_lo = snap.bindings.len() as u32;
            while i < sorted.len() && sorted[i].local.port() == port {
                i = snap.push_run(&sorted, i, &mut info, &mut tuple_entries);
            }
            info.wild_hi = snap.bindings.len() as u32;
            if !info.specific && info.connected == 0 && info.wild_hi == info.wild_lo + 1 {
                let m = &snap.matchers[info.wild_lo as usize];
                if m.local == 0 && !m.connected && m.iface == ANY && m.group == 0 {
                    info.sole = info.wild_lo + 1;
                    info.takes = m.score.map(|s| s >= 0);
                }
            }
            if !info.specific && info.connected == 0 && info.wild_hi > info.wild_lo {
                let m = &snap.matchers[info.wild_lo as usize];
                let members = &snap.matchers[info.wild_lo as usize..info.wild_hi as usize];
                if m.group != 0 && m.group_end == info.wild_hi && members.iter().all(|x| x.local == 0 && x.iface == ANY)
                {
                    info.group = m.group;
                    info.group_by_lcore = snap.groups[m.group as usize - 1].has_sole();
                    // Every member has the group's family: the first says.
                    info.takes = m.score.map(|s| s >= 0);
                }
            }
            snap.port_info.push(info);
            snap.ports[port as usize] = snap.port_info.len() as u32;
        }
        snap.addr_port = KeyedTable::build(&addr_entries);
        snap.tuples = KeyedTable::build(&tuple_entries);
        snap
    }

    /// Pushes the binding at `sorted[i]`, or the whole reuseport group it
    /// starts; returns the next index.
    fn push_run(
        &mut self,
        sorted: &[&Binding<S>],
        i: usize,
        info: &mut PortEntry,
        tuples: &mut Vec<(u64, Tuple, u32)>,
    ) -> usize {
        let first = sorted[i];
        let mut j = i + 1;
        if first.reuseport {
            while j < sorted.len() && sorted[j].reuseport && group_key(sorted[j]) == group_key(first) {
                j += 1;
            }
        }
        let group_id = if first.reuseport { self.groups.len() as u32 + 1 } else { 0 };
        let mut group = Group { first: self.bindings.len() as u32, ..Group::default() };
        for b in &sorted[i..j] {
            let index = self.bindings.len() as u32;
            let mut m = Matcher::of(b);
            if let Some(peer) = b.peer {
                info.connected += 1;
                info.peers |= peer_bit(super::score::ip_key(&peer.ip()), peer.port());
                self.conn_list.push(index);
                group.has_conns = true;
                let t = Tuple {
                    local: m.local,
                    remote: super::score::ip_key(&peer.ip()),
                    local_port: b.local.port(),
                    remote_port: peer.port(),
                };
                tuples.push((hash_tuple(&self.secret, t.local, t.local_port, t.remote, t.remote_port), t, index));
            } else if first.reuseport {
                m.group = group_id;
                group.unconnected += 1;
                if let Some(l) = b.incoming_lcore {
                    match group.by_lcore.iter_mut().find(|(x, _)| *x == l) {
                        Some((_, v)) => v.push(index),
                        None => group.by_lcore.push((l, vec![index])),
                    }
                }
            }
            self.bindings.push((*b).clone());
            self.matchers.push(m);
        }
        if first.reuseport {
            let end = self.bindings.len() as u32;
            for m in &mut self.matchers[group.first as usize..] {
                m.group_end = end;
            }
            group.index_lcores();
            self.groups.push(group);
        }
        j
    }
}

/// The bit of a peer in [`PortEntry::peers`].
#[inline]
fn peer_bit(addr: u128, port: u16) -> u64 {
    let x = (addr as u64 ^ (addr >> 64) as u64 ^ port as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    1 << (x >> 58)
}

fn group_key<S>(b: &Binding<S>) -> GroupKey {
    (b.family == Family::V4, b.v6only, super::score::ip_key(&b.bound), b.local.port(), b.iface)
}

impl<S> TableSnapshot<S> {
    /// What the lookup's shortcuts say of a datagram of family `v4` to
    /// port `port`, before any key is built: the answer (no socket, or the
    /// port's sole socket, or none when it does not take the family), the
    /// port's only reuseport group (the flow's hash picks the member, see
    /// [`pick`](Self::pick)), or that it needs the whole lookup.
    #[inline(always)]
    pub fn shortcut(&self, port: u16, v4: bool) -> Shortcut<'_, S> {
        match self.ports[port as usize] {
            0 => Shortcut::Found(None),
            p => self.shortcut_in(&self.port_info[p as usize - 1], v4),
        }
    }

    /// [`shortcut`](Self::shortcut) for a port's info: its sole socket,
    /// or its only group (every member has the group's family, so the
    /// first one's score decides for all).
    #[inline(always)]
    fn shortcut_in(&self, info: &PortEntry, v4: bool) -> Shortcut<'_, S> {
        let takes = info.takes[!v4 as usize];
        if let Some(i) = info.sole.checked_sub(1) {
            // One socket on the port, taking any address: what the walk
            // would find (its score is the family's, or none).
            return Shortcut::Found(takes.then(|| (i, &self.bindings[i as usize])));
        }
        match info.group.checked_sub(1) {
            Some(_) if !takes => Shortcut::Found(None),
            Some(g) if info.group_by_lcore => Shortcut::LcoreGroup(g),
            Some(g) => Shortcut::Group(g),
            None => Shortcut::Walk,
        }
    }

    /// The member of group `g` (from [`Shortcut::Group`]) for a flow with
    /// `hash` (the port's RSS hash, or [`TableSnapshot::flow_hash_of`]) on lcore
    /// `lcore`.
    #[inline(always)]
    pub fn pick(&self, g: u32, hash: u32, lcore: u32) -> Option<(u32, &Binding<S>)> {
        let pick = self.groups[g as usize].select(hash, lcore)?;
        Some((pick, &self.bindings[pick as usize]))
    }

    /// Group `g`'s members as a block a hash spreads over, when no member
    /// names an incoming lcore: the first's index, how many, and whether
    /// they are IPv6 sockets (a group has one family). What
    /// [`pick`](Self::pick) answers is then `first + reciprocal_scale(hash,
    /// n)`, which a caller that picks for many datagrams of a burst can
    /// compute without looking at the group again.
    #[inline]
    pub fn spread(&self, g: u32) -> Option<(u32, u32, bool)> {
        let group = &self.groups[g as usize];
        if !group.by_lcore.is_empty() || group.unconnected == 0 {
            return None;
        }
        let v6 = self.bindings[group.first as usize].family == Family::V6;
        Some((group.first, group.unconnected, v6))
    }

    /// Group `g`'s member for any datagram looked up on `lcore`, when the
    /// lcore has exactly one: [`pick`](Self::pick) without a hash.
    #[inline(always)]
    pub fn sole_member(&self, g: u32, lcore: u32) -> Option<(u32, &Binding<S>)> {
        let m = self.groups[g as usize].sole(lcore)?;
        Some((m, &self.bindings[m as usize]))
    }

    /// The secret-keyed flow hash a group spreads by when the port gave
    /// none, of the flow `src`:`src_port` -> `dst`:`dst_port` (addresses
    /// as [`ip_key`](super::ip_key) gives them).
    #[inline(always)]
    pub fn flow_hash_of(&self, src: u128, src_port: u16, dst: u128, dst_port: u16) -> u32 {
        super::score::hash_flow_parts(&self.secret, src, src_port, dst, dst_port)
    }

    /// The socket that receives a datagram with key `k`: its index in this
    /// snapshot, and its binding.
    #[inline]
    pub fn lookup(&self, k: &FlowKey) -> Option<(u32, &Binding<S>)> {
        let info = match self.ports[k.dst_port as usize] {
            0 => return None,
            p => &self.port_info[p as usize - 1],
        };
        match self.shortcut_in(info, k.v4) {
            Shortcut::Found(found) => found,
            // The group holds no connected member, so it always picks one.
            Shortcut::Group(g) | Shortcut::LcoreGroup(g) => self.pick(g, self.flow_hash(k), k.lcore),
            Shortcut::Walk => self.walk(info, k),
        }
    }

    /// Every socket a broadcast or multicast datagram reaches, as Linux's
    /// `__udp4_lib_mcast_deliver` finds them: each bound to the port and
    /// to the destination address or the wildcard (a socket that connect
    /// gave a local address has one), connected to the sender or to
    /// nobody, on the arriving interface or any, of a family
    /// that takes the datagram; every member of a reuseport group. Their
    /// binding indices go into `out` (cleared first), in table order.
    pub fn group_matches(&self, k: &FlowKey, out: &mut Vec<u32>) {
        out.clear();
        let info = match self.ports[k.dst_port as usize] {
            0 => return,
            p => &self.port_info[p as usize - 1],
        };
        let specific = match info.specific {
            true => self.addr_port.get(hash_addr_port(&self.secret, k.dst, k.dst_port), &(k.dst, k.dst_port)),
            false => None,
        };
        for ((lo, hi), wildcard) in
            specific.map(|r| (r, false)).into_iter().chain([((info.wild_lo, info.wild_hi), true)])
        {
            for i in lo..hi {
                if compute_score(&self.matchers[i as usize], k, wildcard) >= 0 {
                    out.push(i);
                }
            }
        }
    }

    /// The binding at `index` (from [`group_matches`](Self::group_matches)).
    pub fn binding(&self, index: u32) -> &Binding<S> {
        &self.bindings[index as usize]
    }

    /// The lookup without its shortcuts: connected sockets, then those
    /// bound to the destination address, then the wildcard-bound ones.
    #[inline]
    fn walk(&self, info: &PortEntry, k: &FlowKey) -> Option<(u32, &Binding<S>)> {
        if info.peers & peer_bit(k.src, k.src_port) != 0
            && let Some(i) = self.connected(info, k)
        {
            return Some((i, &self.bindings[i as usize]));
        }
        let specific = match info.specific {
            true => self.addr_port.get(hash_addr_port(&self.secret, k.dst, k.dst_port), &(k.dst, k.dst_port)),
            false => None,
        };
        let found = specific
            .and_then(|range| self.lookup2(range, false, k))
            .or_else(|| self.lookup2((info.wild_lo, info.wild_hi), true, k))?;
        Some((found, &self.bindings[found as usize]))
    }

    /// The connected socket whose 4-tuple is the datagram's, as Linux's
    /// `udp4_lib_lookup4` finds it: an exact match (and the device), no
    /// scoring. A few are compared in turn, more through the 4-tuple table.
    /// Out of line: only datagrams that pass the peer filter come here, and
    /// inlined it would cost the common path registers.
    #[inline(never)]
    fn connected(&self, info: &PortEntry, k: &FlowKey) -> Option<u32> {
        let fits = |i: u32| self.matchers[i as usize].exact(k);
        if info.connected <= FEW_CONNECTED {
            let lo = info.conn_lo as usize;
            return self.conn_list[lo..lo + info.connected as usize].iter().copied().find(|&i| fits(i));
        }
        let t = Tuple { local: k.dst, remote: k.src, local_port: k.dst_port, remote_port: k.src_port };
        self.tuples
            .get(hash_tuple(&self.secret, t.local, t.local_port, t.remote, t.remote_port), &t)
            .filter(|&i| fits(i))
    }

    /// Linux's `udp4_lib_lookup2` over one range of sockets: those bound
    /// to the destination address, or (`wildcard`) those bound to the
    /// unspecified address. The best score wins; a reuseport group hands
    /// the datagram to the member its flow hash picks, and when the group
    /// holds connected members that pick is scored again, through the same
    /// call of `compute_score` (seed 000: one call site, so it stays
    /// inlined). Out of line, as in Linux: `lookup` calls it once per range.
    #[inline(never)]
    fn lookup2(&self, (mut i, hi): (u32, u32), wildcard: bool, k: &FlowKey) -> Option<u32> {
        let mut badness = -1;
        let mut result = None;
        let mut rescore: Option<u32> = None;
        while i < hi {
            let scored = rescore.unwrap_or(i);
            let m = &self.matchers[scored as usize];
            let score = compute_score(m, k, wildcard);
            if let Some(pick) = rescore.take() {
                // The group's pick stands (as in Linux); its score only
                // raises the bar for what follows the group.
                if m.group_end >= hi {
                    return Some(pick);
                }
                badness = badness.max(score);
                result = Some(pick);
                i = m.group_end;
                continue;
            }
            if score <= badness {
                i += 1;
                continue;
            }
            badness = score;
            if m.group == 0 {
                result = Some(i);
                i += 1;
                continue;
            }
            let g = &self.groups[m.group as usize - 1];
            match g.select(self.flow_hash(k), k.lcore) {
                None => {
                    result = Some(i);
                    i += 1;
                }
                Some(pick) if !g.has_conns => return Some(pick),
                Some(pick) => rescore = Some(pick),
            }
        }
        result
    }

    /// The flow's hash for a reuseport group: the port's RSS hash, or the
    /// secret-keyed 4-tuple hash. Out of line on purpose, so the compiler
    /// does not hoist it into every lookup, groups or not.
    #[inline(never)]
    fn flow_hash(&self, k: &FlowKey) -> u32 {
        k.rss_hash.unwrap_or_else(|| super::score::hash_flow(&self.secret, k))
    }

    /// [`lookup`](Self::lookup) the long way, for tests that hold the
    /// shortcuts to the walk's answers.
    #[cfg(test)]
    pub(super) fn lookup_walked(&self, k: &FlowKey) -> Option<(u32, &Binding<S>)> {
        match self.ports[k.dst_port as usize] {
            0 => None,
            p => self.walk(&self.port_info[p as usize - 1], k),
        }
    }

    /// The binding at `index` (from `lookup`).
    #[inline]
    pub fn get(&self, index: u32) -> &Binding<S> {
        &self.bindings[index as usize]
    }
}

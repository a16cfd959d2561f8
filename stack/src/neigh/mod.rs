//! The neighbour cache shared by ARP (IPv4) and neighbour discovery (IPv6).
//!
//! States follow Linux in a reduced form: INCOMPLETE (soliciting, packets
//! wait in a bounded queue), REACHABLE (confirmed by a reply), STALE (heard
//! of, or confirmed too long ago: still used, and the next use starts a
//! probe), PROBE (unicast solicitations to confirm). An entry that does not
//! answer its solicitations is removed and its queued packets dropped.
//!
//! The table is shared by the lcores behind a mutex: lcores keep a small
//! memo of reachable entries and come here only on a miss, when an entry
//! expires, or after the table's generation changed (a MAC changed or an
//! entry went away). The pending type `P` is generic so the state machine
//! is tested without mbufs.

pub mod arp;
pub mod nd;

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::config::NeighborConfig;
use crate::time::Instant;
use crate::wire::MacAddr;

/// A neighbour's key: interface index and address.
pub type Key = (u16, IpAddr);

/// A solicitation to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Solicit {
    /// Interface.
    pub iface: u16,
    /// Address to resolve.
    pub target: IpAddr,
    /// Unicast to this MAC (a probe), or broadcast/multicast when `None`.
    pub unicast: Option<MacAddr>,
}

/// How an address was learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Learn {
    /// An answer to our solicitation (ARP reply, solicited NA): reachable.
    Confirmed,
    /// Heard from the neighbour itself (its ARP request or NS for one of our
    /// addresses): creates a stale entry or refreshes one.
    Heard,
    /// An unsolicited announcement (gratuitous ARP, NA with override):
    /// updates an existing entry only.
    Announced,
}

/// The outcome of [`NeighTable::resolve`].
#[derive(Debug)]
pub enum Resolve<P> {
    /// Send to this MAC; the memo may keep it until `until`.
    Ready {
        /// The neighbour's MAC.
        mac: MacAddr,
        /// The packet back.
        pkt: P,
        /// How long a memo may reuse the answer without asking again.
        until: Instant,
        /// A unicast probe to send now (the entry was stale).
        probe: Option<Solicit>,
    },
    /// The packet waits for resolution.
    Queued {
        /// A solicitation to send now, if one is due.
        solicit: Option<Solicit>,
        /// An older packet pushed out of the full queue.
        dropped: Option<P>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Incomplete {
        probes: u32,
        next: Instant,
    },
    Reachable {
        until: Instant,
    },
    Stale,
    Probe {
        probes: u32,
        next: Instant,
    },
    /// Configured: used as it is, never solicited, expired or replaced.
    Permanent,
}

#[derive(Debug)]
struct Entry<P> {
    mac: MacAddr,
    state: State,
    pending: VecDeque<P>,
    last_used: Instant,
}

/// The neighbour table.
#[derive(Debug)]
pub struct NeighTable<P> {
    inner: Mutex<HashMap<Key, Entry<P>>>,
    generation: AtomicU64,
    cfg: NeighborConfig,
}

/// What a timer pass produced.
#[derive(Debug)]
pub struct Expired<P> {
    /// Solicitations to send.
    pub solicits: Vec<Solicit>,
    /// Packets of neighbours that did not answer.
    pub dropped: Vec<P>,
    /// Neighbours given up on.
    pub failed: u64,
}

impl<P> Default for Expired<P> {
    fn default() -> Self {
        Expired { solicits: Vec::new(), dropped: Vec::new(), failed: 0 }
    }
}

impl<P> NeighTable<P> {
    /// An empty table.
    pub fn new(cfg: NeighborConfig) -> Self {
        NeighTable { inner: Mutex::new(HashMap::new()), generation: AtomicU64::new(0), cfg }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Entry<P>>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Changes whenever a MAC changes or an entry goes: memos compare it.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn retrans(&self) -> Duration {
        Duration::from_millis(self.cfg.retrans_ms)
    }

    fn reachable(&self) -> Duration {
        Duration::from_millis(self.cfg.reachable_ms)
    }

    /// Finds the MAC for `key`, or queues `pkt` and says whether to solicit.
    pub fn resolve(&self, now: Instant, key: Key, pkt: P) -> Resolve<P> {
        let mut t = self.lock();
        if !t.contains_key(&key) && t.len() >= self.cfg.max_entries {
            Self::evict_one(&mut t);
            self.bump();
        }
        let retrans = self.retrans();
        let e = t.entry(key).or_insert_with(|| Entry {
            mac: MacAddr::ZERO,
            state: State::Incomplete { probes: 0, next: now },
            pending: VecDeque::new(),
            last_used: now,
        });
        e.last_used = now;
        match e.state {
            State::Permanent => Resolve::Ready { mac: e.mac, pkt, until: Instant(u64::MAX), probe: None },
            State::Reachable { until } if now < until => Resolve::Ready { mac: e.mac, pkt, until, probe: None },
            State::Reachable { .. } | State::Stale => {
                // Still usable while we check that it is still there.
                e.state = State::Probe { probes: 1, next: now + retrans };
                let probe = Some(Solicit { iface: key.0, target: key.1, unicast: Some(e.mac) });
                Resolve::Ready { mac: e.mac, pkt, until: now, probe }
            }
            State::Probe { .. } => Resolve::Ready { mac: e.mac, pkt, until: now, probe: None },
            State::Incomplete { probes, next } => {
                let dropped = if e.pending.len() >= self.cfg.pending_max { e.pending.pop_front() } else { None };
                e.pending.push_back(pkt);
                let solicit = (probes == 0 && now >= next).then(|| {
                    e.state = State::Incomplete { probes: 1, next: now + retrans };
                    Solicit { iface: key.0, target: key.1, unicast: None }
                });
                Resolve::Queued { solicit, dropped }
            }
        }
    }

    /// A configured entry: `key` is at `mac`, for good (the table's entry
    /// limit does not count it out, and nothing the wire says changes it).
    pub fn add_permanent(&self, key: Key, mac: MacAddr) {
        let mut t = self.lock();
        let pending = VecDeque::new();
        t.insert(key, Entry { mac, state: State::Permanent, pending, last_used: Instant(0) });
        drop(t);
        self.bump();
    }

    /// Records that `key` is at `mac`; returns the packets that waited for it.
    pub fn learn(&self, now: Instant, key: Key, mac: MacAddr, how: Learn) -> Option<(MacAddr, VecDeque<P>)> {
        let mut t = self.lock();
        let reachable = self.reachable();
        let exists = t.contains_key(&key);
        if !exists {
            if how != Learn::Heard {
                return None;
            }
            if t.len() >= self.cfg.max_entries {
                Self::evict_one(&mut t);
                self.bump();
            }
            t.insert(key, Entry { mac, state: State::Stale, pending: VecDeque::new(), last_used: now });
            return None;
        }
        let e = t.get_mut(&key).expect("checked");
        if e.state == State::Permanent {
            // The configuration says where it is; the wire does not.
            return None;
        }
        let was_incomplete = matches!(e.state, State::Incomplete { .. });
        let changed = !was_incomplete && e.mac != mac;
        e.mac = mac;
        e.state = match (how, e.state) {
            (Learn::Confirmed, _) => State::Reachable { until: now + reachable },
            // A new address announced: believe it, but check before long.
            (_, _) if changed || was_incomplete => State::Stale,
            (_, s) => s,
        };
        let released = std::mem::take(&mut e.pending);
        if changed {
            self.bump();
        }
        drop(t);
        (was_incomplete || !released.is_empty()).then_some((mac, released))
    }

    /// Runs the timers: retransmits solicitations, gives up on silent
    /// neighbours, forgets unused stale entries.
    pub fn poll(&self, now: Instant) -> Expired<P> {
        let mut out = Expired::default();
        let mut t = self.lock();
        let retrans = self.retrans();
        let gc = Duration::from_millis(self.cfg.gc_stale_ms);
        let probes_max = self.cfg.probes;
        let mut removed = false;
        t.retain(|key, e| match e.state {
            State::Incomplete { probes, next } if now >= next => {
                if probes >= probes_max {
                    out.failed += 1;
                    out.dropped.extend(e.pending.drain(..));
                    removed = true;
                    false
                } else {
                    e.state = State::Incomplete { probes: probes + 1, next: now + retrans };
                    out.solicits.push(Solicit { iface: key.0, target: key.1, unicast: None });
                    true
                }
            }
            State::Probe { probes, next } if now >= next => {
                if probes >= probes_max {
                    out.failed += 1;
                    removed = true;
                    false
                } else {
                    e.state = State::Probe { probes: probes + 1, next: now + retrans };
                    out.solicits.push(Solicit { iface: key.0, target: key.1, unicast: Some(e.mac) });
                    true
                }
            }
            State::Reachable { until } if now >= until => {
                e.state = State::Stale;
                true
            }
            State::Stale if now.since(e.last_used) > gc => {
                removed = true;
                false
            }
            _ => true,
        });
        if removed {
            self.bump();
        }
        out
    }

    /// Entries in the table.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the table is empty.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The MAC recorded for `key`, in any state but INCOMPLETE.
    #[cfg(test)]
    pub fn peek(&self, key: Key) -> Option<MacAddr> {
        self.lock().get(&key).filter(|e| !matches!(e.state, State::Incomplete { .. })).map(|e| e.mac)
    }

    fn evict_one(t: &mut HashMap<Key, Entry<P>>) {
        // The least recently used entry without waiting packets.
        if let Some(k) = t
            .iter()
            .filter(|(_, e)| e.pending.is_empty() && e.state != State::Permanent)
            .min_by_key(|(_, e)| e.last_used)
            .map(|(k, _)| *k)
        {
            t.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const MAC2: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);

    fn cfg() -> NeighborConfig {
        NeighborConfig {
            reachable_ms: 1000,
            retrans_ms: 100,
            probes: 3,
            pending_max: 2,
            max_entries: 4,
            gc_stale_ms: 5000,
        }
    }

    fn key(n: u8) -> Key {
        (0, IpAddr::from([198, 18, 0, n]))
    }

    fn ms(n: u64) -> Instant {
        Instant(n * 1_000_000)
    }

    #[test]
    fn a_permanent_entry_is_used_as_configured_and_kept() {
        let t = NeighTable::<u32>::new(cfg());
        t.add_permanent(key(9), MAC);
        for now in [0, 5_000, 1_000_000] {
            match t.resolve(ms(now), key(9), 1) {
                Resolve::Ready { mac, until, probe: None, .. } => assert_eq!((mac, until), (MAC, Instant(u64::MAX))),
                other => panic!("{other:?}"),
            }
            let e = t.poll(ms(now));
            assert!(e.solicits.is_empty() && e.failed == 0, "never solicited or given up: {e:?}");
        }
        for how in [Learn::Confirmed, Learn::Heard, Learn::Announced] {
            assert!(t.learn(ms(10), key(9), MAC2, how).is_none());
            assert_eq!(t.peek(key(9)), Some(MAC), "{how:?} does not replace a configured MAC");
        }
        // A full table evicts the others, never the configured entry.
        for n in 1..=8 {
            t.learn(ms(20 + n as u64), key(n), MAC2, Learn::Heard);
        }
        assert_eq!(t.peek(key(9)), Some(MAC));
    }

    #[test]
    fn resolution_queues_then_releases_in_order() {
        let t = NeighTable::<u32>::new(cfg());
        match t.resolve(ms(0), key(1), 1) {
            Resolve::Queued { solicit: Some(s), dropped: None } => assert_eq!(s.unicast, None),
            other => panic!("{other:?}"),
        }
        assert!(matches!(t.resolve(ms(1), key(1), 2), Resolve::Queued { solicit: None, dropped: None }));
        // The queue holds two: the oldest goes.
        assert!(matches!(t.resolve(ms(2), key(1), 3), Resolve::Queued { dropped: Some(1), .. }));
        let (mac, released) = t.learn(ms(3), key(1), MAC, Learn::Confirmed).unwrap();
        assert_eq!(mac, MAC);
        assert_eq!(released.into_iter().collect::<Vec<_>>(), vec![2, 3]);
        match t.resolve(ms(4), key(1), 4) {
            Resolve::Ready { mac, pkt, until, probe } => {
                assert_eq!((mac, pkt, probe), (MAC, 4, None));
                assert_eq!(until, ms(1003));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn silent_neighbours_fail_after_the_probes() {
        let t = NeighTable::<u32>::new(cfg());
        let _ = t.resolve(ms(0), key(2), 7);
        let mut solicits = 1;
        let mut now = 0;
        let mut failed = 0;
        let mut dropped = vec![];
        while now < 1000 {
            now += 10;
            let e = t.poll(ms(now));
            solicits += e.solicits.len();
            failed += e.failed;
            dropped.extend(e.dropped);
        }
        assert_eq!(solicits, 3, "one at first use, then retransmissions up to `probes`");
        assert_eq!((failed, dropped), (1, vec![7]));
        assert!(t.is_empty());
    }

    #[test]
    fn stale_entries_are_probed_and_removed_if_silent() {
        let t = NeighTable::<u32>::new(cfg());
        let _ = t.resolve(ms(0), key(3), 1);
        t.learn(ms(1), key(3), MAC, Learn::Confirmed);
        let g = t.generation();
        t.poll(ms(2000)); // reachable -> stale
        match t.resolve(ms(2001), key(3), 2) {
            Resolve::Ready { mac, probe: Some(p), until, .. } => {
                assert_eq!((mac, p.unicast), (MAC, Some(MAC)));
                assert_eq!(until, ms(2001), "not memoised while probing");
            }
            other => panic!("{other:?}"),
        }
        let mut probes = 1;
        for step in 1..100 {
            probes += t.poll(ms(2001 + step * 10)).solicits.len();
        }
        assert_eq!(probes, 3);
        assert!(t.peek(key(3)).is_none(), "silent neighbour removed");
        assert_ne!(t.generation(), g, "memos are told");
    }

    #[test]
    fn learning_rules() {
        let t = NeighTable::<u32>::new(cfg());
        assert!(t.learn(ms(0), key(4), MAC, Learn::Announced).is_none());
        assert!(t.peek(key(4)).is_none(), "announcements do not create entries");
        t.learn(ms(0), key(4), MAC, Learn::Heard);
        assert_eq!(t.peek(key(4)), Some(MAC), "requests for us do");
        let g = t.generation();
        t.learn(ms(1), key(4), MAC2, Learn::Announced);
        assert_eq!(t.peek(key(4)), Some(MAC2));
        assert_ne!(t.generation(), g);
        // The table stays bounded.
        for n in 10..20 {
            t.learn(ms(n as u64), key(n), MAC, Learn::Heard);
        }
        assert!(t.len() <= 4);
    }
}

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
//! expires, or after the table's generation changed (a MAC changed or a
//! reachable entry went away). The pending type `P` is generic so the
//! state machine is tested without mbufs.
//!
//! Bounds, against sources that flood spate with addresses that never
//! answer (each reply to one waits for its resolution): at most
//! `max_entries` entries, a full table evicting one in O(1) (a clock over
//! the entries in the order they came, passing over those used since the
//! hand last passed them, so a busy neighbour such as the gateway stays);
//! an evicted entry's waiting packets dropped with it; and at most
//! `pending_total` packets waiting in the whole table besides
//! `pending_max` per neighbour, so unresolved neighbours never hold more
//! of the mempool than that.

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
    /// Used since the eviction clock's hand last passed it.
    used: bool,
}

/// Entries the clock's hand passes over (used recently) before it takes
/// the one it is at anyway: the bound on an eviction's work.
const SECOND_CHANCES: usize = 16;

/// What the table's lock guards.
#[derive(Debug)]
struct Table<P> {
    map: HashMap<Key, Entry<P>>,
    /// The eviction clock: every entry that is not permanent, in the order
    /// it came (a key whose entry went, or came again, may be here twice;
    /// the clock skips it, and the list is rebuilt when such keys pile up).
    order: VecDeque<Key>,
    /// Packets waiting in all entries.
    waiting: usize,
    /// Packets of evicted entries, dropped at the next timer pass.
    evicted: Vec<P>,
}

/// The neighbour table.
#[derive(Debug)]
pub struct NeighTable<P> {
    inner: Mutex<Table<P>>,
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
        let t = Table { map: HashMap::new(), order: VecDeque::new(), waiting: 0, evicted: Vec::new() };
        NeighTable { inner: Mutex::new(t), generation: AtomicU64::new(0), cfg }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table<P>> {
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
        let mut guard = self.lock();
        let t = &mut *guard;
        if !t.map.contains_key(&key) {
            self.make_room(t);
            t.map.insert(
                key,
                Entry {
                    mac: MacAddr::ZERO,
                    state: State::Incomplete { probes: 0, next: now },
                    pending: VecDeque::new(),
                    last_used: now,
                    used: false,
                },
            );
            t.order.push_back(key);
        }
        let retrans = self.retrans();
        let e = t.map.get_mut(&key).expect("there");
        e.last_used = now;
        e.used = true;
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
                let dropped = if e.pending.len() >= self.cfg.pending_max {
                    // This neighbour's queue is full: its oldest goes.
                    e.pending.push_back(pkt);
                    e.pending.pop_front()
                } else if t.waiting + t.evicted.len() >= self.cfg.pending_total.unwrap_or(usize::MAX) {
                    // (Evicted entries' packets count until the timer frees them.)
                    // The table's is: the newcomer goes.
                    Some(pkt)
                } else {
                    e.pending.push_back(pkt);
                    t.waiting += 1;
                    None
                };
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
        let entry =
            Entry { mac, state: State::Permanent, pending: VecDeque::new(), last_used: Instant(0), used: false };
        if let Some(old) = t.map.insert(key, entry) {
            t.waiting -= old.pending.len();
            t.evicted.extend(old.pending);
        }
        drop(t);
        self.bump();
    }

    /// Forgets `key`'s entry, configured or learnt (what waited for it is
    /// freed with the next poll); false when there was none.
    pub fn remove(&self, key: Key) -> bool {
        let mut guard = self.lock();
        let t = &mut *guard;
        let Some(old) = t.map.remove(&key) else { return false };
        t.order.retain(|k| *k != key);
        t.waiting -= old.pending.len();
        t.evicted.extend(old.pending);
        drop(guard);
        self.bump();
        true
    }

    /// Records that `key` is at `mac`; returns the packets that waited for it.
    pub fn learn(&self, now: Instant, key: Key, mac: MacAddr, how: Learn) -> Option<(MacAddr, VecDeque<P>)> {
        let mut guard = self.lock();
        let t = &mut *guard;
        let reachable = self.reachable();
        if !t.map.contains_key(&key) {
            if how != Learn::Heard {
                return None;
            }
            self.make_room(t);
            t.map
                .insert(key, Entry { mac, state: State::Stale, pending: VecDeque::new(), last_used: now, used: false });
            t.order.push_back(key);
            return None;
        }
        let e = t.map.get_mut(&key).expect("checked");
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
        t.waiting -= released.len();
        if changed {
            self.bump();
        }
        drop(guard);
        (was_incomplete || !released.is_empty()).then_some((mac, released))
    }

    /// Makes room for one more entry in a full table: the clock's hand
    /// takes the first entry it reaches that was not used since it last
    /// came by (giving each used one a second chance, up to a bound), and
    /// drops its waiting packets with it. Memos are told only when the
    /// entry was one they may hold (reachable).
    fn make_room(&self, t: &mut Table<P>) {
        // Keys of entries that went another way pile up: rebuild the clock.
        if t.order.len() > 2 * self.cfg.max_entries + SECOND_CHANCES {
            let Table { map, order, .. } = t;
            order.clear();
            order.extend(map.iter().filter(|(_, e)| e.state != State::Permanent).map(|(k, _)| *k));
        }
        if t.map.len() < self.cfg.max_entries {
            return;
        }
        let mut chances = SECOND_CHANCES;
        while let Some(key) = t.order.pop_front() {
            let Some(e) = t.map.get_mut(&key) else { continue };
            if e.state == State::Permanent {
                continue;
            }
            // A reachable entry is in use even when no packet asked the
            // table for it: the lcores' memos answer for it until it goes
            // stale.
            if (e.used || matches!(e.state, State::Reachable { .. })) && chances > 0 {
                e.used = false;
                chances -= 1;
                t.order.push_back(key);
                continue;
            }
            let e = t.map.remove(&key).expect("there");
            t.waiting -= e.pending.len();
            t.evicted.extend(e.pending);
            if matches!(e.state, State::Reachable { .. }) {
                self.bump();
            }
            break;
        }
    }

    /// Runs the timers: retransmits solicitations, gives up on silent
    /// neighbours, forgets unused stale entries.
    pub fn poll(&self, now: Instant) -> Expired<P> {
        let mut out = Expired::default();
        let mut guard = self.lock();
        let t = &mut *guard;
        out.dropped.append(&mut t.evicted);
        let retrans = self.retrans();
        let gc = Duration::from_millis(self.cfg.gc_stale_ms);
        let probes_max = self.cfg.probes;
        let mut removed = false;
        let waiting = &mut t.waiting;
        t.map.retain(|key, e| match e.state {
            State::Incomplete { probes, next } if now >= next => {
                if probes >= probes_max {
                    out.failed += 1;
                    *waiting -= e.pending.len();
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
        self.lock().map.len()
    }

    /// Packets waiting for their neighbours' addresses.
    pub fn waiting(&self) -> usize {
        self.lock().waiting
    }

    /// Every entry as `ip neigh` lists it: key, MAC (none while
    /// incomplete), state at `now`, packets waiting.
    pub fn entries(&self, now: Instant) -> Vec<(Key, Option<MacAddr>, &'static str, usize)> {
        let t = self.lock();
        t.map
            .iter()
            .map(|(k, e)| {
                let state = match e.state {
                    State::Incomplete { .. } => "INCOMPLETE",
                    State::Reachable { until } if now < until => "REACHABLE",
                    State::Reachable { .. } | State::Stale => "STALE",
                    State::Probe { .. } => "PROBE",
                    State::Permanent => "PERMANENT",
                };
                let mac = (!matches!(e.state, State::Incomplete { .. })).then_some(e.mac);
                (*k, mac, state, e.pending.len())
            })
            .collect()
    }

    /// Whether the table is empty.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The MAC recorded for `key`, in any state but INCOMPLETE.
    #[cfg(test)]
    pub fn peek(&self, key: Key) -> Option<MacAddr> {
        self.lock().map.get(&key).filter(|e| !matches!(e.state, State::Incomplete { .. })).map(|e| e.mac)
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
            pending_total: Some(5),
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

    /// Sources that never answer cannot hold more than the table's bounds:
    /// entries stay within `max_entries` even when every one has packets
    /// waiting (eviction used to pass those over, and the table grew past
    /// its limit), the evicted entries' packets come back as dropped, and
    /// no more than `pending_total` packets wait in all.
    #[test]
    fn unresolved_neighbours_stay_within_the_bounds() {
        let t = NeighTable::<u32>::new(cfg());
        let mut dropped = 0;
        for n in 1..=40u8 {
            for p in 0..3 {
                if let Resolve::Queued { dropped: Some(_), .. } = t.resolve(ms(n as u64), key(n), n as u32 * 10 + p) {
                    dropped += 1;
                }
            }
            assert!(t.len() <= 4, "{} entries", t.len());
            assert!(t.waiting() <= 5, "{} packets waiting", t.waiting());
        }
        let e = t.poll(ms(41));
        // 40 neighbours x 3 packets: what is still waiting, what was
        // refused or pushed out, and what went with the evicted entries.
        assert_eq!(t.waiting() + dropped + e.dropped.len(), 120);
        assert!(!e.dropped.is_empty(), "evicted entries' packets are dropped");
    }

    /// A neighbour in use survives a flood of new ones (the clock passes
    /// over entries used since it last came by), and evicting entries no
    /// memo can hold leaves the generation alone (it used to change on
    /// every eviction, emptying every lcore's memo).
    #[test]
    fn a_busy_neighbour_survives_a_flood_of_new_ones() {
        let t = NeighTable::<u32>::new(cfg());
        let _ = t.resolve(ms(0), key(1), 1);
        t.learn(ms(0), key(1), MAC, Learn::Confirmed);
        let g = t.generation();
        for n in 10..200u8 {
            t.learn(ms(n as u64), key(n), MAC2, Learn::Heard);
            // The gateway is used between the flood's packets.
            assert!(matches!(t.resolve(ms(n as u64), key(1), 2), Resolve::Ready { .. }), "evicted at {n}");
            assert!(t.len() <= 4);
        }
        assert_eq!(t.generation(), g, "only stale entries went");
        assert_eq!(t.peek(key(1)), Some(MAC));
    }

    /// A reachable neighbour the lcores' memos answer for (no packet asks
    /// the table) survives a flood too, and keys of entries that went stay
    /// bounded while the table is not full.
    #[test]
    fn a_memoised_neighbour_survives_and_the_clock_stays_bounded() {
        let t = NeighTable::<u32>::new(NeighborConfig { reachable_ms: 1_000_000, ..cfg() });
        let _ = t.resolve(ms(0), key(1), 1);
        t.learn(ms(0), key(1), MAC, Learn::Confirmed);
        for n in 10..200u8 {
            t.learn(ms(n as u64), key(n), MAC2, Learn::Heard);
        }
        assert_eq!(t.peek(key(1)), Some(MAC), "the memoised neighbour was evicted");
        let t = NeighTable::<u32>::new(cfg());
        for round in 0..1000u64 {
            for n in 1..=3u8 {
                let _ = t.resolve(ms(round * 10_000), key(n), 0);
            }
            for step in 1..=5 {
                t.poll(ms(round * 10_000 + step * 200));
            }
            assert!(t.is_empty(), "the silent neighbours went");
        }
        assert!(t.lock().order.len() <= 2 * 4 + SECOND_CHANCES + 3, "{} keys in the clock", t.lock().order.len());
    }
}

//! Path MTU per destination, learnt from ICMP "fragmentation needed" and
//! ICMPv6 "packet too big", honoured by every send and forgotten after an
//! expiry (Linux: 10 minutes). While nothing is learnt a send pays one load
//! for it.
//!
//! Bounded, since the messages come from the network: at most
//! `max_entries` destinations (a full table forgets the entry that would
//! expire first), and nothing is scanned: entries wait in the order they
//! expire, so the timer forgets the expired ones from the front and a
//! full table evicts there too, each in O(1) per entry. (The receive path
//! learns only what a socket of spate's could have sent: see
//! `engine::icmp`.)

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::RwLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The smallest path MTU believed for IPv4 (Linux's `min_pmtu`): a smaller
/// one in an ICMP message is taken as this.
pub const MIN_V4: u16 = 552;
/// IPv6's minimum link MTU (RFC 8200).
pub const MIN_V6: u16 = 1280;

#[derive(Debug, Default)]
struct Table {
    map: HashMap<IpAddr, (u16, Instant)>,
    /// (destination, the expiry it was given), in expiry order (every entry
    /// lasts the same): an entry renewed later is here again further back,
    /// and the older mention, whose expiry no longer matches, is passed over.
    order: VecDeque<(IpAddr, Instant)>,
}

impl Table {
    /// Forgets the front entry (when its mention is current); false when
    /// the order is empty.
    fn pop_front(&mut self) -> bool {
        let Some((dst, until)) = self.order.pop_front() else { return false };
        if self.map.get(&dst).is_some_and(|(_, u)| *u == until) {
            self.map.remove(&dst);
        }
        true
    }
}

/// The table.
#[derive(Debug)]
pub struct PathMtu {
    entries: AtomicUsize,
    table: RwLock<Table>,
    expiry: Duration,
    max_entries: usize,
}

impl PathMtu {
    /// An empty table of at most `max_entries` whose entries last `expiry`.
    pub fn new(expiry: Duration, max_entries: usize) -> PathMtu {
        PathMtu { entries: AtomicUsize::new(0), table: RwLock::new(Table::default()), expiry, max_entries }
    }

    /// The path MTU learnt for `dst`, if one is current.
    #[inline(always)]
    pub fn get(&self, dst: &IpAddr) -> Option<u16> {
        if self.entries.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.look_up(dst)
    }

    /// `get` with entries to look through.
    #[inline(never)]
    fn look_up(&self, dst: &IpAddr) -> Option<u16> {
        let t = self.table.read().unwrap_or_else(|p| p.into_inner());
        t.map.get(dst).filter(|(_, until)| *until > Instant::now()).map(|(mtu, _)| *mtu)
    }

    /// Records that packets to `dst` larger than `mtu` do not pass (a
    /// larger value than the one known is ignored until it expires, as
    /// Linux does); returns the MTU now in force.
    pub fn learn(&self, dst: IpAddr, mtu: u16) -> u16 {
        let floor = if dst.is_ipv4() { MIN_V4 } else { MIN_V6 };
        let mtu = mtu.max(floor);
        let mut guard = self.table.write().unwrap_or_else(|p| p.into_inner());
        // Read under the lock, so entries join the order in expiry order.
        let now = Instant::now();
        let t = &mut *guard;
        let mtu = match t.map.get(&dst) {
            Some(&(known, until)) if until > now && mtu > known => known,
            _ => {
                if !t.map.contains_key(&dst) {
                    while t.map.len() >= self.max_entries && t.pop_front() {}
                }
                let until = now + self.expiry;
                t.map.insert(dst, (mtu, until));
                t.order.push_back((dst, until));
                if t.order.len() > 2 * self.max_entries.max(1) {
                    // Renewals piled up stale mentions: keep the current.
                    let Table { map, order } = t;
                    order.retain(|(d, u)| map.get(d).is_some_and(|(_, v)| v == u));
                }
                mtu
            }
        };
        self.entries.store(t.map.len(), Ordering::Release);
        mtu
    }

    /// Forgets expired entries (from the front of the order).
    pub fn prune(&self) {
        if self.entries.load(Ordering::Acquire) == 0 {
            return;
        }
        let now = Instant::now();
        let mut t = self.table.write().unwrap_or_else(|p| p.into_inner());
        while t.order.front().is_some_and(|(_, until)| *until <= now) {
            t.pop_front();
        }
        self.entries.store(t.map.len(), Ordering::Release);
    }

    /// The current entries: destination, MTU, time left.
    pub fn entries(&self) -> Vec<(IpAddr, u16, Duration)> {
        let now = Instant::now();
        let t = self.table.read().unwrap_or_else(|p| p.into_inner());
        t.map.iter().filter(|(_, (_, until))| *until > now).map(|(d, (mtu, until))| (*d, *mtu, *until - now)).collect()
    }

    /// Destinations known (expired ones included until the timer forgets
    /// them).
    pub fn len(&self) -> usize {
        self.entries.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_lowers_floors_and_expires() {
        let t = PathMtu::new(Duration::from_millis(50), 16);
        let d: IpAddr = "198.18.0.1".parse().unwrap();
        assert_eq!(t.get(&d), None);
        assert_eq!(t.learn(d, 1280), 1280);
        assert_eq!(t.get(&d), Some(1280));
        assert_eq!(t.learn(d, 1400), 1280, "a larger value does not raise it");
        assert_eq!(t.learn(d, 1000), 1000);
        assert_eq!(t.learn(d, 68), MIN_V4, "floored");
        let d6: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(t.learn(d6, 1000), MIN_V6);
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(t.get(&d), None, "expired");
        t.prune();
        assert_eq!(t.entries.load(Ordering::Relaxed), 0);
    }

    /// Forged messages for many destinations fill the table to its bound
    /// and no further (it used to grow with every one), and the newest
    /// are kept.
    #[test]
    fn the_table_stays_within_its_bound() {
        let t = PathMtu::new(Duration::from_secs(600), 100);
        for i in 0..10_000u32 {
            t.learn(IpAddr::from(i.to_be_bytes()), 1200);
            assert!(t.len() <= 100);
        }
        assert_eq!(t.get(&IpAddr::from(9_999u32.to_be_bytes())), Some(1200));
        assert_eq!(t.get(&IpAddr::from(0u32.to_be_bytes())), None, "the oldest went");
        // The same destination told again and again.
        let d = IpAddr::from([198, 18, 0, 1]);
        for _ in 0..10_000 {
            t.learn(d, 1000);
        }
        assert_eq!(t.get(&d), Some(1000));
        let table = t.table.read().unwrap();
        assert!(table.order.len() <= 200, "the order list stays bounded too: {}", table.order.len());
    }
}

//! Path MTU per destination, learnt from ICMP "fragmentation needed" and
//! ICMPv6 "packet too big", honoured by every send and forgotten after an
//! expiry (Linux: 10 minutes). While nothing is learnt a send pays one load
//! for it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::RwLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The smallest path MTU believed for IPv4 (Linux's `min_pmtu`): a smaller
/// one in an ICMP message is taken as this.
pub const MIN_V4: u16 = 552;
/// IPv6's minimum link MTU (RFC 8200).
pub const MIN_V6: u16 = 1280;

/// The table.
#[derive(Debug)]
pub struct PathMtu {
    entries: AtomicUsize,
    map: RwLock<HashMap<IpAddr, (u16, Instant)>>,
    expiry: Duration,
}

impl PathMtu {
    /// An empty table whose entries last `expiry`.
    pub fn new(expiry: Duration) -> PathMtu {
        PathMtu { entries: AtomicUsize::new(0), map: RwLock::new(HashMap::new()), expiry }
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
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        map.get(dst).filter(|(_, until)| *until > Instant::now()).map(|(mtu, _)| *mtu)
    }

    /// Records that packets to `dst` larger than `mtu` do not pass (a
    /// larger value than the one known is ignored until it expires, as
    /// Linux does); returns the MTU now in force.
    pub fn learn(&self, dst: IpAddr, mtu: u16) -> u16 {
        let floor = if dst.is_ipv4() { MIN_V4 } else { MIN_V6 };
        let mtu = mtu.max(floor);
        let now = Instant::now();
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, (_, until)| *until > now);
        let e = map.entry(dst).or_insert((mtu, now + self.expiry));
        if mtu <= e.0 || e.1 <= now {
            *e = (mtu, now + self.expiry);
        }
        let mtu = e.0;
        self.entries.store(map.len(), Ordering::Release);
        mtu
    }

    /// Forgets expired entries.
    pub fn prune(&self) {
        if self.entries.load(Ordering::Acquire) == 0 {
            return;
        }
        let now = Instant::now();
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, (_, until)| *until > now);
        self.entries.store(map.len(), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_lowers_floors_and_expires() {
        let t = PathMtu::new(Duration::from_millis(50));
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
}

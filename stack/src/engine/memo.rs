//! What a polling lcore keeps to itself on the transmit side: a memo of
//! the neighbours it resolved recently (no shared table read per packet)
//! and the ICMP error rate limit.

use std::net::IpAddr;

use crate::time::Instant;
use crate::wire::MacAddr;

#[derive(Debug, Clone, Copy)]
struct MemoSlot {
    iface: u16,
    ip: IpAddr,
    mac: MacAddr,
    until: Instant,
}

/// Reachable neighbours this lcore resolved recently.
#[derive(Debug, Default)]
pub(crate) struct NeighMemo {
    slots: [Option<MemoSlot>; 16],
    generation: u64,
}

impl NeighMemo {
    fn slot(ip: &IpAddr) -> usize {
        let b = match ip {
            IpAddr::V4(a) => a.octets()[3] ^ a.octets()[2],
            IpAddr::V6(a) => a.octets()[15] ^ a.octets()[14],
        };
        (b & 15) as usize
    }

    #[inline]
    pub fn get(&self, iface: u16, ip: &IpAddr, now: Instant) -> Option<MacAddr> {
        self.get_until(iface, ip, now).map(|(mac, _)| mac)
    }

    /// The MAC and until when it may be used without asking the table.
    #[inline]
    pub fn get_until(&self, iface: u16, ip: &IpAddr, now: Instant) -> Option<(MacAddr, Instant)> {
        match self.slots[Self::slot(ip)] {
            Some(s) if s.iface == iface && s.ip == *ip && now < s.until => Some((s.mac, s.until)),
            _ => None,
        }
    }

    pub fn put(&mut self, iface: u16, ip: IpAddr, mac: MacAddr, until: Instant) {
        self.slots[Self::slot(&ip)] = Some(MemoSlot { iface, ip, mac, until });
    }

    /// Forgets everything when the table's generation moved; says whether
    /// it did.
    #[inline]
    pub fn sync(&mut self, generation: u64) -> bool {
        if generation != self.generation {
            self.slots = [None; 16];
            self.generation = generation;
            return true;
        }
        false
    }
}

/// ICMP error rate limit: a token bucket.
#[derive(Debug)]
pub(crate) struct RateLimit {
    tokens: u64,
    burst: u64,
    per_sec: u64,
    last: Instant,
}

impl RateLimit {
    pub fn new(per_sec: u64, burst: u64) -> RateLimit {
        RateLimit { tokens: burst, burst, per_sec, last: Instant(0) }
    }

    /// Takes a token if there is one.
    pub fn allow(&mut self, now: Instant) -> bool {
        if self.per_sec > 0 {
            let elapsed = now.0.saturating_sub(self.last.0);
            let new = elapsed as u128 * self.per_sec as u128 / 1_000_000_000;
            if new > 0 {
                self.tokens = (self.tokens + new as u64).min(self.burst);
                self.last = now;
            }
        }
        if self.tokens > 0 {
            self.tokens -= 1;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ICMP error limit: a burst at once, then the rate, never more
    /// than the burst saved up however long it was quiet.
    #[test]
    fn icmp_errors_keep_to_the_rate_and_the_burst() {
        let mut r = RateLimit::new(1000, 50);
        let at = |ms: u64| Instant(1_000_000_000 + ms * 1_000_000);
        assert_eq!((0..200).filter(|_| r.allow(at(0))).count(), 50, "the burst");
        assert_eq!((0..200).filter(|_| r.allow(at(10))).count(), 10, "10 ms at 1,000/s");
        assert_eq!((0..200).filter(|_| r.allow(at(60_000))).count(), 50, "a minute's quiet saves one burst");
        // A flood at one per microsecond for a second gets the rate.
        let sent = (0..1_000_000u64).filter(|us| r.allow(Instant(at(60_001).0 + us * 1000))).count();
        assert!((1000..=1000 + 50).contains(&sent), "{sent} in a second");
    }
}

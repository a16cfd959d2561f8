//! What a host keeps about the queriers it hears: the oldest version heard
//! lately on each interface and family, which sets the version of its
//! reports (the compatibility modes of RFC 3376 section 7.2.1 and RFC 3810
//! section 8.2.1), and a rate limit on its answers to queries, so a flood
//! of queries costs a bounded number of reports. Times are nanoseconds on
//! the stack's clock.

use std::net::IpAddr;

/// How long an older querier is remembered after its last query, less
/// the query's maximum response time: the Older Version Querier Present
/// Timeout of RFC 3376 section 8.12 (robustness 2 times a query interval
/// of 125 s, plus the response time).
pub const OLDER_QUERIER_NS: u64 = 2 * 125 * 1_000_000_000;
/// Answers to queries about one group (or general ones) an interface may
/// send at once, per family.
pub const ANSWER_BURST: u64 = 3;
/// Answers about one group it may send a second after that: a querier's
/// group queries after a leave (two, a second apart, Linux's default) and
/// its general queries (every 125 s, or a few seconds on a test bridge)
/// are all answered.
pub const ANSWERS_PER_SECOND: u64 = 2;

/// The version a host speaks when no older querier is heard: IGMPv3 for
/// IPv4, MLDv2 for IPv6.
pub fn latest(v6: bool) -> u8 {
    if v6 { 2 } else { 3 }
}

/// The older queriers heard, per interface and family.
#[derive(Debug, Clone, Default)]
pub struct Queriers {
    /// (interface, IPv6, version, heard until).
    older: Vec<(u16, bool, u8, u64)>,
}

impl Queriers {
    /// A query of `version` heard at `now` on `iface`, answers due within
    /// `max_delay_ns`.
    pub fn heard(&mut self, iface: u16, v6: bool, version: u8, max_delay_ns: u64, now: u64) {
        if version >= latest(v6) {
            return;
        }
        let until = now.saturating_add(OLDER_QUERIER_NS).saturating_add(max_delay_ns);
        match self.older.iter_mut().find(|o| (o.0, o.1, o.2) == (iface, v6, version)) {
            Some(o) => o.3 = until,
            None => self.older.push((iface, v6, version, until)),
        }
    }

    /// The version `iface` speaks for the family at `now`: the oldest
    /// querier's heard lately, else the latest.
    pub fn version(&self, iface: u16, v6: bool, now: u64) -> u8 {
        let heard = self.older.iter().filter(|o| o.0 == iface && o.1 == v6 && o.3 > now);
        heard.map(|o| o.2).min().unwrap_or(latest(v6))
    }
}

/// The answers each interface may still send, per family and group (or
/// general): a token bucket of [`ANSWER_BURST`] refilled at
/// [`ANSWERS_PER_SECOND`], kept as the time its next answer would be on
/// schedule (GCRA). Per group, so a flood of queries about one group
/// never silences the answers about another (a router prunes a group
/// nobody answers for); a flood costs at most the bucket's rate per group
/// the interface is in, on top of the coalescing of pending answers.
#[derive(Debug, Clone, Default)]
pub struct AnswerLimit {
    /// (interface, IPv6, group or none, theoretical arrival time): only
    /// buckets not yet full again (a full one is the same as none).
    due: Vec<(u16, bool, Option<IpAddr>, u64)>,
}

impl AnswerLimit {
    /// Whether `iface` may send an answer about `group` (`None`: a
    /// general one) at `now`, taking it if so.
    pub fn take(&mut self, iface: u16, v6: bool, group: Option<IpAddr>, now: u64) -> bool {
        let interval = 1_000_000_000 / ANSWERS_PER_SECOND;
        let slack = (ANSWER_BURST - 1) * interval;
        self.due.retain(|d| d.3 > now);
        let tat = self.due.iter().find(|d| (d.0, d.1, d.2) == (iface, v6, group)).map_or(now, |d| d.3);
        if tat - now > slack {
            return false;
        }
        match self.due.iter_mut().find(|d| (d.0, d.1, d.2) == (iface, v6, group)) {
            Some(d) => d.3 = tat + interval,
            None => self.due.push((iface, v6, group, tat + interval)),
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn an_older_querier_sets_the_version_until_it_is_quiet() {
        let mut q = Queriers::default();
        assert_eq!((q.version(0, false, 0), q.version(0, true, 0)), (3, 2));
        q.heard(0, false, 2, 10 * S, 5 * S);
        q.heard(0, false, 3, 10 * S, 6 * S);
        assert_eq!(q.version(0, false, 6 * S), 2, "IGMPv2 heard");
        assert_eq!(q.version(1, false, 6 * S), 3, "on interface 0 only");
        assert_eq!(q.version(0, true, 6 * S), 2, "IPv4's querier says nothing of MLD");
        q.heard(0, false, 1, 0, 7 * S);
        assert_eq!(q.version(0, false, 8 * S), 1, "the oldest wins");
        assert_eq!(q.version(0, false, 7 * S + OLDER_QUERIER_NS + 1), 2, "v1 gone, v2 heard later still");
        assert_eq!(q.version(0, false, 15 * S + OLDER_QUERIER_NS + 1), 3);
        q.heard(0, true, 1, S, 0);
        assert_eq!(q.version(0, true, S), 1);
    }

    #[test]
    fn answers_are_limited_to_a_burst_then_a_rate_per_group() {
        let mut l = AnswerLimit::default();
        let t0 = 100 * S;
        let burst = (0..100).filter(|_| l.take(0, false, None, t0)).count() as u64;
        assert_eq!(burst, ANSWER_BURST);
        assert!(l.take(0, true, None, t0), "IPv6 has its own bucket");
        assert!(l.take(1, false, None, t0), "so has each interface");
        let g: IpAddr = "239.1.2.3".parse().unwrap();
        assert!(l.take(0, false, Some(g), t0), "and each group");
        // A second later, two more.
        let later = (0..100).filter(|_| l.take(0, false, None, t0 + S)).count() as u64;
        assert_eq!(later, ANSWERS_PER_SECOND);
        // Quiet for long: the whole burst again, not more; nothing kept.
        let rested = (0..100).filter(|_| l.take(0, false, None, t0 + 100 * S)).count() as u64;
        assert_eq!(rested, ANSWER_BURST);
        assert_eq!(l.due.len(), 1, "buckets full again are forgotten");
        // A querier's group queries after a leave, a second apart, and a
        // general query between them: all answered.
        let mut l = AnswerLimit::default();
        for t in [0, S / 2, S, 2 * S] {
            assert!(l.take(0, false, Some(g), t0 + t) && l.take(0, false, None, t0 + t));
        }
    }
}

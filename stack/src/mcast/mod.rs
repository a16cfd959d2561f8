//! Multicast memberships: which sockets joined which groups on which
//! interfaces, with which source filters (RFC 3376's and RFC 3810's
//! socket state), and what that makes each interface's state (their
//! merge, RFC 3376 section 3.2), which the receive path filters on and
//! IGMPv3 and MLDv2 report. No I/O: the setup layer publishes what changes
//! and the lcores send the reports.

use std::net::IpAddr;

pub mod compat;
pub mod report;

/// Groups a socket may join at most (Linux's `igmp_max_memberships`).
pub const MAX_MEMBERSHIPS: usize = 20;
/// Sources one IPv4 membership may list (Linux's `igmp_max_msf`).
pub const MAX_SOURCES_V4: usize = 10;
/// Sources one IPv6 membership may list (Linux's `mld_max_msf`).
pub const MAX_SOURCES_V6: usize = 64;

/// How a filter reads its sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Only these sources.
    Include,
    /// Every source but these.
    Exclude,
}

/// A source filter: a mode and its sources (kept sorted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFilter {
    /// The mode.
    pub mode: Mode,
    /// The sources, sorted.
    pub sources: Vec<IpAddr>,
}

impl SourceFilter {
    /// Any source (an any-source join: EXCLUDE with none).
    pub fn any() -> SourceFilter {
        SourceFilter { mode: Mode::Exclude, sources: Vec::new() }
    }

    /// Whether a datagram from `src` passes.
    #[inline]
    pub fn allows(&self, src: &IpAddr) -> bool {
        self.sources.binary_search(src).is_ok() == (self.mode == Mode::Include)
    }

    /// Whether nothing passes (INCLUDE with no source): no membership.
    pub fn is_empty(&self) -> bool {
        self.mode == Mode::Include && self.sources.is_empty()
    }

    /// The interface's filter from its sockets' (RFC 3376 section 3.2):
    /// EXCLUDE if any socket excludes, with the sources every excluding
    /// socket excludes and no including socket includes; else INCLUDE
    /// with every socket's sources.
    pub fn merge<'a>(filters: impl Iterator<Item = &'a SourceFilter> + Clone) -> SourceFilter {
        let mut excluding = filters.clone().filter(|f| f.mode == Mode::Exclude);
        match excluding.next() {
            Some(first) => {
                let mut sources: Vec<IpAddr> = first
                    .sources
                    .iter()
                    .filter(|s| excluding.clone().all(|f| f.sources.binary_search(s).is_ok()))
                    .filter(|s| !filters.clone().any(|f| f.mode == Mode::Include && f.sources.binary_search(s).is_ok()))
                    .copied()
                    .collect();
                sources.sort();
                SourceFilter { mode: Mode::Exclude, sources }
            }
            None => {
                let mut sources: Vec<IpAddr> = filters.flat_map(|f| f.sources.iter().copied()).collect();
                sources.sort();
                sources.dedup();
                SourceFilter { mode: Mode::Include, sources }
            }
        }
    }
}

/// One socket's membership of a group on an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// The socket's id.
    pub socket: u64,
    /// The interface.
    pub iface: u16,
    /// The group.
    pub group: IpAddr,
    /// Its source filter.
    pub filter: SourceFilter,
    /// Whether a source was ever set (Linux's `sflist`): then its mode
    /// holds.
    pub sources_set: bool,
}

/// What a change asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Any-source join (`IP_ADD_MEMBERSHIP`).
    Join,
    /// Leave (`IP_DROP_MEMBERSHIP`).
    Leave,
    /// Add a source to an INCLUDE membership, joining if need be
    /// (`IP_ADD_SOURCE_MEMBERSHIP`).
    JoinSource(IpAddr),
    /// Drop a source from an INCLUDE membership, leaving with the last
    /// (`IP_DROP_SOURCE_MEMBERSHIP`).
    LeaveSource(IpAddr),
    /// Exclude a source from an any-source membership (`IP_BLOCK_SOURCE`).
    Block(IpAddr),
    /// Take a source back (`IP_UNBLOCK_SOURCE`).
    Unblock(IpAddr),
}

/// Why a change was refused, as Linux's errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Past a limit (`ENOBUFS`).
    NoBuffers,
    /// Already joined, or a source already there (`EADDRINUSE`).
    InUse,
    /// Not a member, or the source is not there (`EADDRNOTAVAIL`).
    NotThere,
    /// The change does not fit the membership's mode (`EINVAL`).
    WrongMode,
}

impl Refused {
    /// Linux's errno for it.
    pub fn errno(self) -> i32 {
        match self {
            Refused::NoBuffers => libc::ENOBUFS,
            Refused::InUse => libc::EADDRINUSE,
            Refused::NotThere => libc::EADDRNOTAVAIL,
            Refused::WrongMode => libc::EINVAL,
        }
    }
}

/// Every socket's memberships.
#[derive(Debug, Clone, Default)]
pub struct Memberships {
    all: Vec<Membership>,
}

impl Memberships {
    /// Applies `change` of socket `socket` to `group` on `iface`, as
    /// Linux's `ip_mc_source` and `ip_mc_join_group` would: a source
    /// change needs a prior membership (`EINVAL`) except a source-specific
    /// join, which makes one; a membership whose source list is still
    /// unset takes either mode, a set one keeps its mode (`EINVAL`); a
    /// source twice or one not there is `EADDRNOTAVAIL`, past the limits
    /// `ENOBUFS` (checked first).
    pub fn change(&mut self, socket: u64, iface: u16, group: IpAddr, change: Change) -> Result<(), Refused> {
        let max_sources = if group.is_ipv4() { MAX_SOURCES_V4 } else { MAX_SOURCES_V6 };
        let at = self.all.iter().position(|m| m.socket == socket && m.iface == iface && m.group == group);
        // Linux's limit is IPv4's (`igmp_max_memberships`).
        let full = group.is_ipv4()
            && self.all.iter().filter(|m| m.socket == socket && m.group.is_ipv4()).count() >= MAX_MEMBERSHIPS;
        match (change, at) {
            (Change::Join, Some(_)) => Err(Refused::InUse),
            (Change::Join | Change::JoinSource(_), None) if full => Err(Refused::NoBuffers),
            (Change::Join, None) => {
                let filter = SourceFilter::any();
                self.all.push(Membership { socket, iface, group, filter, sources_set: false });
                Ok(())
            }
            (Change::Leave, Some(i)) => {
                self.all.swap_remove(i);
                Ok(())
            }
            (Change::JoinSource(s), None) => {
                let filter = SourceFilter { mode: Mode::Include, sources: vec![s] };
                self.all.push(Membership { socket, iface, group, filter, sources_set: true });
                Ok(())
            }
            (Change::JoinSource(s) | Change::Block(s), Some(i)) => {
                let m = &mut self.all[i];
                let want = if matches!(change, Change::JoinSource(_)) { Mode::Include } else { Mode::Exclude };
                if m.filter.mode != want {
                    if m.sources_set {
                        return Err(Refused::WrongMode);
                    }
                    // An empty list takes the other mode.
                    m.filter.mode = want;
                }
                if m.filter.sources.len() >= max_sources {
                    return Err(Refused::NoBuffers);
                }
                match m.filter.sources.binary_search(&s) {
                    Ok(_) => Err(Refused::NotThere),
                    Err(p) => {
                        m.filter.sources.insert(p, s);
                        m.sources_set = true;
                        Ok(())
                    }
                }
            }
            (Change::LeaveSource(s) | Change::Unblock(s), Some(i)) => {
                let m = &mut self.all[i];
                let want = if matches!(change, Change::LeaveSource(_)) { Mode::Include } else { Mode::Exclude };
                if m.filter.mode != want {
                    return Err(if m.sources_set { Refused::WrongMode } else { Refused::NotThere });
                }
                let p = m.filter.sources.binary_search(&s).map_err(|_| Refused::NotThere)?;
                m.filter.sources.remove(p);
                if m.filter.is_empty() {
                    self.all.swap_remove(i);
                }
                Ok(())
            }
            (Change::Leave, None) => Err(Refused::NotThere),
            // Source changes need a prior join.
            (_, None) => Err(Refused::WrongMode),
        }
    }

    /// Drops every membership of `socket` (it closed); returns the
    /// interfaces and groups it was in.
    pub fn leave_all(&mut self, socket: u64) -> Vec<(u16, IpAddr)> {
        let gone = self.all.iter().filter(|m| m.socket == socket).map(|m| (m.iface, m.group)).collect();
        self.all.retain(|m| m.socket != socket);
        gone
    }

    /// Interface `iface`'s state: each group some socket joined there,
    /// with the merge of their filters, sorted by group.
    pub fn iface_state(&self, iface: u16) -> Vec<(IpAddr, SourceFilter)> {
        let mut groups: Vec<IpAddr> = self.all.iter().filter(|m| m.iface == iface).map(|m| m.group).collect();
        groups.sort();
        groups.dedup();
        groups
            .into_iter()
            .map(|g| {
                let of = self.all.iter().filter(|m| m.iface == iface && m.group == g).map(|m| &m.filter);
                (g, SourceFilter::merge(of))
            })
            .filter(|(_, f)| !f.is_empty())
            .collect()
    }

    /// Every membership.
    pub fn all(&self) -> &[Membership] {
        &self.all
    }
}

/// The receive side's view: the groups each interface is in, and each
/// socket's own filters (Linux's `ip_mc_sf_allow`).
#[derive(Debug, Clone, Default)]
pub struct McastView {
    /// Per interface: its groups and merged filters, sorted by group.
    pub ifaces: Vec<Vec<(IpAddr, SourceFilter)>>,
    /// Every socket's memberships.
    pub sockets: Vec<Membership>,
}

impl McastView {
    /// The view of `m` for `n` interfaces.
    pub fn of(m: &Memberships, n: usize) -> McastView {
        McastView { ifaces: (0..n as u16).map(|i| m.iface_state(i)).collect(), sockets: m.all().to_vec() }
    }

    /// Whether interface `iface` takes a datagram from `src` to `group`.
    #[inline]
    pub fn iface_allows(&self, iface: u16, group: &IpAddr, src: &IpAddr) -> bool {
        let Some(groups) = self.ifaces.get(iface as usize) else { return false };
        match groups.binary_search_by(|(g, _)| g.cmp(group)) {
            Ok(i) => groups[i].1.allows(src),
            Err(_) => false,
        }
    }

    /// Whether interface `iface` is in `group`, whatever its filter (a
    /// query comes from the querier, not from a source the filter lists).
    pub fn iface_in(&self, iface: u16, group: &IpAddr) -> bool {
        self.ifaces.get(iface as usize).is_some_and(|g| g.binary_search_by(|(a, _)| a.cmp(group)).is_ok())
    }

    /// Whether socket `socket` takes it: by its own filter where it joined
    /// the group on the interface, else as its `IP_MULTICAST_ALL` says
    /// (`all`; on by default in Linux: a wildcard-bound socket hears every
    /// group the interface is in).
    pub fn socket_allows(&self, socket: u64, iface: u16, group: &IpAddr, src: &IpAddr, all: bool) -> bool {
        match self.sockets.iter().find(|m| m.socket == socket && m.iface == iface && m.group == *group) {
            Some(m) => m.filter.allows(src),
            None => all,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn interface_state_merges_the_sockets_filters() {
        let g = ip("239.1.2.3");
        let (a, b, c) = (ip("198.18.0.1"), ip("198.18.0.5"), ip("198.18.0.9"));
        let mut m = Memberships::default();
        m.change(1, 0, g, Change::JoinSource(a)).unwrap();
        m.change(2, 0, g, Change::JoinSource(b)).unwrap();
        let st = m.iface_state(0);
        assert_eq!(st, vec![(g, SourceFilter { mode: Mode::Include, sources: vec![a, b] })]);
        // An any-source member with a block makes the interface EXCLUDE,
        // less what the includers take.
        m.change(3, 0, g, Change::Join).unwrap();
        m.change(3, 0, g, Change::Block(a)).unwrap();
        m.change(3, 0, g, Change::Block(c)).unwrap();
        assert_eq!(m.iface_state(0), vec![(g, SourceFilter { mode: Mode::Exclude, sources: vec![c] })]);
        let v = McastView::of(&m, 1);
        assert!(v.iface_allows(0, &g, &a) && !v.iface_allows(0, &g, &c) && v.iface_allows(0, &g, &ip("10.0.0.1")));
        assert!(!v.iface_allows(0, &ip("239.9.9.9"), &a));
        assert!(v.socket_allows(1, 0, &g, &a, true) && !v.socket_allows(1, 0, &g, &b, true));
        assert!(!v.socket_allows(3, 0, &g, &a, true) && v.socket_allows(3, 0, &g, &b, true));
        // A socket that did not join the group hears it if IP_MULTICAST_ALL.
        assert!(v.socket_allows(9, 0, &g, &c, true) && !v.socket_allows(9, 0, &g, &c, false));
        // Leaving: the last source of an INCLUDE membership ends it.
        m.change(1, 0, g, Change::LeaveSource(a)).unwrap();
        assert_eq!(m.all().iter().filter(|x| x.socket == 1).count(), 0);
        assert_eq!(m.leave_all(3), vec![(0, g)]);
        assert_eq!(m.iface_state(0), vec![(g, SourceFilter { mode: Mode::Include, sources: vec![b] })]);
        m.change(2, 0, g, Change::Leave).unwrap();
        assert!(m.iface_state(0).is_empty());
    }

    #[test]
    fn refusals_carry_linux_errnos() {
        let g = ip("239.1.2.3");
        let mut m = Memberships::default();
        m.change(1, 0, g, Change::Join).unwrap();
        assert_eq!(m.change(1, 0, g, Change::Join), Err(Refused::InUse));
        assert_eq!(m.change(1, 0, ip("239.0.0.9"), Change::Leave), Err(Refused::NotThere));
        assert_eq!(m.change(1, 0, ip("239.0.0.9"), Change::Block(ip("1.2.3.4"))), Err(Refused::WrongMode));
        assert_eq!(m.change(1, 0, g, Change::Unblock(ip("1.2.3.4"))), Err(Refused::NotThere));
        // An any-source membership whose list was never set takes a source
        // (Linux switches it to INCLUDE); once set, the mode holds.
        m.change(1, 0, g, Change::JoinSource(ip("1.2.3.4"))).unwrap();
        assert_eq!(m.all()[0].filter, SourceFilter { mode: Mode::Include, sources: vec![ip("1.2.3.4")] });
        assert_eq!(m.change(1, 0, g, Change::JoinSource(ip("1.2.3.4"))), Err(Refused::NotThere), "twice");
        assert_eq!(m.change(1, 0, g, Change::Block(ip("1.2.3.5"))), Err(Refused::WrongMode));
        m.change(1, 0, g, Change::Leave).unwrap();
        m.change(1, 0, g, Change::Join).unwrap();
        for i in 0..MAX_SOURCES_V4 {
            m.change(1, 0, g, Change::Block(IpAddr::from([10, 0, 0, i as u8]))).unwrap();
        }
        assert_eq!(m.change(1, 0, g, Change::Block(ip("10.1.1.1"))), Err(Refused::NoBuffers));
        // The limit before the duplicate, as Linux checks them.
        assert_eq!(m.change(1, 0, g, Change::Block(ip("10.0.0.0"))), Err(Refused::NoBuffers));
        for i in 1..MAX_MEMBERSHIPS {
            m.change(1, 0, IpAddr::from([239, 0, 1, i as u8]), Change::Join).unwrap();
        }
        assert_eq!(m.change(1, 0, ip("239.0.2.1"), Change::Join), Err(Refused::NoBuffers));
        // IPv6 groups have no such limit.
        m.change(1, 0, ip("ff0e::1"), Change::Join).unwrap();
        assert_eq!(Refused::NoBuffers.errno(), libc::ENOBUFS);
    }
}

//! IGMP and MLD on the lcores: a query heard on any lcore schedules the
//! answer (after a random delay up to the query's maximum, RFC 3376
//! section 5.2), and lcore 0's timer sends the reports that are due: the
//! state changes the sockets' joins and leaves queued, and those answers.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::Ordering;

use super::Worker;
use crate::iface::Interface;
use crate::mcast::report::{self, Query};
use crate::mcast::{Mode, SourceFilter, compat};
use crate::shared::PendingReport;
use crate::stats::Counter;
use crate::time::Instant;
use crate::wire::ethernet;

impl Worker<'_> {
    /// Whether interface `iface` takes a packet from `src` to group `dst`
    /// (it is in the group and its filter takes the source; every host's
    /// group always; a `query`, IGMP or MLD, whatever its source, as
    /// Linux's `ip_check_mc_rcu`), counted. Out of line: the unicast path
    /// pays only its caller's test of the address.
    #[cold]
    #[inline(never)]
    pub(super) fn joined(&self, iface: u16, dst: IpAddr, src: IpAddr, query: bool) -> bool {
        let all_hosts = dst == IpAddr::V4(report::ALL_HOSTS) || dst == IpAddr::V6(crate::wire::ipv6::ALL_NODES);
        let view = &self.net.mcast;
        let ok = all_hosts || if query { view.iface_in(iface, &dst) } else { view.iface_allows(iface, &dst, &src) };
        if ok {
            self.inc(if dst.is_ipv4() { Counter::IpExtInMcastPkts } else { Counter::Ip6InMcastPkts });
        }
        ok
    }

    /// An IGMP message (the IPv4 payload): a query is answered.
    #[cold]
    #[inline(never)]
    pub(super) fn rx_igmp(&mut self, iface: u16, msg: &[u8]) {
        if let Some(q) = report::igmp_query(msg) {
            self.inc(Counter::IgmpInQueries);
            self.heard_query(iface, false, q);
        }
    }

    /// Notes the querier's version of `q`, heard on interface `iface`, and
    /// schedules the answer if the interface is in a group it asks about.
    #[cold]
    pub(super) fn heard_query(&mut self, iface: u16, v6: bool, q: Query) {
        let max_ns = q.max_delay_ms.max(1) as u64 * 1_000_000;
        let mut timers = self.shared.mcast_reports.lock().unwrap_or_else(|p| p.into_inner());
        timers.queriers.heard(iface, v6, q.version, max_ns, self.now.0);
        let in_any = self.net.mcast.ifaces.get(iface as usize).is_some_and(|groups| {
            groups.iter().any(|(g, _)| g.is_ipv6() == v6 && q.group.is_none_or(|want| want == *g))
        });
        if !in_any {
            return;
        }
        let random = (self.shared.random_u32() as u64) << 32 | self.shared.random_u32() as u64;
        let due = Instant(self.now.0 + random % max_ns);
        let reports = &mut timers.reports;
        // RFC 3376 section 5.2: a general answer due sooner covers it; an
        // answer for the same group pending later is brought forward.
        let same = |p: &PendingReport| p.current && p.iface == iface && p.v6 == v6;
        if reports.iter().any(|p| same(p) && p.group.is_none() && p.due <= due) {
            return;
        }
        match reports.iter_mut().find(|p| same(p) && p.group == q.group) {
            Some(p) => p.due = p.due.min(due),
            None => reports.push(PendingReport {
                due,
                iface,
                v6,
                group: q.group,
                current: true,
                repeat: false,
                unasked: false,
            }),
        }
        self.shared.mcast_pending.store(true, Ordering::Release);
    }

    /// Lcore 0's timer: sends the reports that are due, each in the
    /// version its interface speaks now; answers to queries past their
    /// rate limit are dropped and counted.
    pub(super) fn send_due_reports(&mut self) {
        self.refresh_reports();
        if !self.shared.mcast_pending.load(Ordering::Acquire) {
            return;
        }
        // The reports say the memberships as they are now: a join's first
        // report, built from a copy taken before the join, would say
        // TO_IN{} (a leave).
        self.sync_net();
        let (due, limited) = {
            let mut timers = self.shared.mcast_reports.lock().unwrap_or_else(|p| p.into_inner());
            let now = self.now;
            let mut due: Vec<(PendingReport, u8)> = Vec::new();
            let mut limited = (0, 0);
            for r in timers.reports.iter().filter(|r| r.due <= now).copied().collect::<Vec<_>>() {
                if r.current && !r.unasked && !timers.answers.take(r.iface, r.v6, r.group, now.0) {
                    if r.v6 {
                        limited.1 += 1
                    } else {
                        limited.0 += 1
                    }
                    continue;
                }
                due.push((r, timers.queriers.version(r.iface, r.v6, now.0)));
            }
            timers.reports.retain(|r| r.due > now);
            if timers.reports.is_empty() {
                self.shared.mcast_pending.store(false, Ordering::Release);
            }
            (due, limited)
        };
        self.add(Counter::IgmpAnswersLimited, limited.0);
        self.add(Counter::Mld6AnswersLimited, limited.1);
        for (r, version) in due {
            self.send_report(r, version);
        }
    }

    /// On interfaces whose queries reach only the kernel (`net_af_xdp`
    /// beside it): every `report_refresh_ns`, the state of each family's
    /// groups, unasked, as the answer to a general query would give it.
    fn refresh_reports(&mut self) {
        let net = self.net.clone();
        let now = self.now;
        let mut due = Vec::new();
        for ifc in net.ifaces.iter().filter(|i| i.report_refresh_ns > 0) {
            let i = ifc.index as usize;
            if self.reports_refreshed.len() <= i {
                self.reports_refreshed.resize(i + 1, None);
            }
            // The first period starts now: joins report themselves.
            let last = *self.reports_refreshed[i].get_or_insert(now);
            if now.0.saturating_sub(last.0) < ifc.report_refresh_ns {
                continue;
            }
            self.reports_refreshed[i] = Some(now);
            let groups = net.mcast.ifaces.get(i).map(|g| g.as_slice()).unwrap_or_default();
            for v6 in [false, true] {
                if groups.iter().any(|(g, _)| g.is_ipv6() == v6 && report::reported(g)) {
                    let (iface, group, current, repeat, unasked) = (ifc.index, None, true, false, true);
                    due.push(PendingReport { due: now, iface, v6, group, current, repeat, unasked });
                }
            }
        }
        if due.is_empty() {
            return;
        }
        let mut timers = self.shared.mcast_reports.lock().unwrap_or_else(|p| p.into_inner());
        // A general state already on its way covers it.
        let pending = |r: &PendingReport, t: &[PendingReport]| {
            t.iter().any(|p| p.current && p.group.is_none() && (p.iface, p.v6) == (r.iface, r.v6))
        };
        for r in due {
            if !pending(&r, &timers.reports) {
                timers.reports.push(r);
            }
        }
        drop(timers);
        self.shared.mcast_pending.store(true, Ordering::Release);
    }

    /// Sends one report: the interface's state of the group (or of every
    /// group of the family), as a change or as the current state, in
    /// IGMPv3 or MLDv2, or in the older `version` a querier speaks.
    fn send_report(&mut self, r: PendingReport, version: u8) {
        let states = self.net.mcast.ifaces.get(r.iface as usize).cloned().unwrap_or_default();
        let ifc = self.net.ifaces.get(r.iface as usize).cloned();
        let Some(ifc) = ifc else { return };
        let of_family =
            |g: &IpAddr| g.is_ipv6() == r.v6 && r.group.is_none_or(|want| want == *g) && report::reported(g);
        let mut records: Vec<(IpAddr, SourceFilter)> = states.into_iter().filter(|(g, _)| of_family(g)).collect();
        if version < compat::latest(r.v6) {
            self.send_older(&ifc, r, version, &records);
            return;
        }
        if let (Some(g), false) = (r.group, r.current) {
            // A change to no membership: TO_IN with no source, a leave.
            if records.is_empty() && report::reported(&g) {
                records.push((g, SourceFilter { mode: Mode::Include, sources: Vec::new() }));
            }
        }
        // As many records a packet as the interface's MTU takes.
        let per_source = if r.v6 { 16 } else { 4 };
        let mut packet: Vec<(IpAddr, SourceFilter)> = Vec::new();
        let mut size = 0;
        let room = (ifc.mtu as usize).saturating_sub(if r.v6 { 40 + 8 + 8 } else { 24 + 8 });
        for rec in records {
            let len = (if r.v6 { 20 } else { 8 }) + per_source * rec.1.sources.len();
            if !packet.is_empty() && size + len > room {
                self.send_records(&ifc, r, std::mem::take(&mut packet));
                size = 0;
            }
            size += len;
            packet.push(rec);
        }
        if !packet.is_empty() {
            self.send_records(&ifc, r, packet);
        }
    }

    /// A report in an older querier's version (IGMPv1 or v2, MLDv1): a
    /// report of each group in `records` (source lists are not spoken:
    /// any membership is one), or, for a change that left the group, an
    /// IGMPv2 leave or MLDv1 done, once (IGMPv1 has none).
    fn send_older(&mut self, ifc: &Interface, r: PendingReport, version: u8, records: &[(IpAddr, SourceFilter)]) {
        let (src4, src6) = sources(ifc);
        let left = match (r.group, r.current) {
            (Some(g), false) if records.is_empty() && report::reported(&g) => Some(g),
            _ => None,
        };
        if left.is_some() && r.repeat {
            return;
        }
        let messages: Vec<(Vec<u8>, Counter)> = match left {
            Some(IpAddr::V4(g)) if version == 2 => vec![(report::igmp_older(src4, 2, g, true), Counter::IgmpOutLeaves)],
            Some(IpAddr::V6(g)) => vec![(report::mldv1(src6, g, true), Counter::Mld6OutDones)],
            Some(_) => Vec::new(),
            None => records
                .iter()
                .map(|(g, _)| match g {
                    IpAddr::V4(g) => (report::igmp_older(src4, version, *g, false), Counter::IgmpOutReports),
                    IpAddr::V6(g) => (report::mldv1(src6, *g, false), Counter::Mld6OutReports),
                })
                .collect(),
        };
        for (packet, counter) in messages {
            self.send_control(r.iface, &packet, counter);
        }
    }

    /// One report packet of `records` (groups of the report's family).
    fn send_records(&mut self, ifc: &Interface, r: PendingReport, records: Vec<(IpAddr, SourceFilter)>) {
        let (src4, src6) = sources(ifc);
        match r.v6 {
            true => {
                self.send_control(r.iface, &report::mldv2_report(src6, &records, r.current), Counter::Mld6OutReports)
            }
            false => {
                self.send_control(r.iface, &report::igmpv3_report(src4, &records, r.current), Counter::IgmpOutReports)
            }
        }
    }

    /// Sends `packet`, an IGMP or MLD packet spate made, to its
    /// destination group's MAC on interface `iface`, counted in `counter`.
    fn send_control(&mut self, iface: u16, packet: &[u8], counter: Counter) {
        let (dst, ethertype) = match packet[0] >> 4 {
            6 => {
                let o: [u8; 16] = packet[24..40].try_into().expect("an IPv6 header");
                (IpAddr::V6(Ipv6Addr::from(o)), ethernet::ethertype::IPV6)
            }
            _ => (IpAddr::V4(Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19])), ethernet::ethertype::IPV4),
        };
        let Some(mut m) = self.shared.pool.alloc() else {
            self.inc(Counter::TxNoMbuf);
            return;
        };
        let Ok(body) = m.append(packet.len()) else {
            self.inc(Counter::TxNoMbuf);
            return;
        };
        body.copy_from_slice(packet);
        self.inc(counter);
        self.send_frame(iface, m, report::group_mac(&dst), ethertype);
    }
}

/// The sources of an interface's reports: its first IPv4 address (or
/// 0.0.0.0) and its link-local IPv6 address (or ::, before it has one).
fn sources(ifc: &Interface) -> (Ipv4Addr, Ipv6Addr) {
    let v4 = ifc.ipv4_addrs.first().copied().unwrap_or(Ipv4Addr::UNSPECIFIED);
    let v6 = ifc
        .ipv6
        .iter()
        .find_map(|c| match c.addr {
            IpAddr::V6(a) if crate::config::is_link_local(&a) => Some(a),
            _ => None,
        })
        .unwrap_or(Ipv6Addr::UNSPECIFIED);
    (v4, v6)
}

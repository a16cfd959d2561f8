//! IGMP and MLD on the lcores: a query heard on any lcore schedules the
//! answer (after a random delay up to the query's maximum, RFC 3376
//! section 5.2), and lcore 0's timer sends the reports that are due: the
//! state changes the sockets' joins and leaves queued, and those answers.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::Ordering;

use super::Worker;
use crate::mcast::report::{self, Query};
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
    pub(super) fn joined(&mut self, iface: u16, dst: IpAddr, src: IpAddr, query: bool) -> bool {
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
            self.heard_query(iface, false, q);
        }
    }

    /// Schedules the answer to `q`, heard on interface `iface`, if the
    /// interface is in a group it asks about.
    #[cold]
    pub(super) fn heard_query(&mut self, iface: u16, v6: bool, q: Query) {
        let in_any = self.net.mcast.ifaces.get(iface as usize).is_some_and(|groups| {
            groups.iter().any(|(g, _)| g.is_ipv6() == v6 && q.group.is_none_or(|want| want == *g))
        });
        if !in_any {
            return;
        }
        let random = (self.shared.random_u32() as u64) << 32 | self.shared.random_u32() as u64;
        let due = Instant(self.now.0 + random % (q.max_delay_ms.max(1) as u64 * 1_000_000));
        let mut reports = self.shared.mcast_reports.lock().unwrap_or_else(|p| p.into_inner());
        // RFC 3376 section 5.2: a general answer due sooner covers it; an
        // answer for the same group pending later is brought forward.
        let same = |p: &PendingReport| p.current && p.iface == iface && p.v6 == v6;
        if reports.iter().any(|p| same(p) && p.group.is_none() && p.due <= due) {
            return;
        }
        match reports.iter_mut().find(|p| same(p) && p.group == q.group) {
            Some(p) => p.due = p.due.min(due),
            None => reports.push(PendingReport { due, iface, v6, group: q.group, current: true }),
        }
        self.shared.mcast_pending.store(true, Ordering::Release);
    }

    /// Lcore 0's timer: sends the reports that are due.
    pub(super) fn send_due_reports(&mut self) {
        if !self.shared.mcast_pending.load(Ordering::Acquire) {
            return;
        }
        let due: Vec<PendingReport> = {
            let mut reports = self.shared.mcast_reports.lock().unwrap_or_else(|p| p.into_inner());
            let now = self.now;
            let due = reports.iter().filter(|r| r.due <= now).copied().collect();
            reports.retain(|r| r.due > now);
            if reports.is_empty() {
                self.shared.mcast_pending.store(false, Ordering::Release);
            }
            due
        };
        for r in due {
            self.send_report(r);
        }
    }

    /// Sends one report: the interface's state of the group (or of every
    /// group of the family), as a change or as the current state.
    fn send_report(&mut self, r: PendingReport) {
        let states = self.net.mcast.ifaces.get(r.iface as usize).cloned().unwrap_or_default();
        let ifc = self.net.ifaces.get(r.iface as usize).cloned();
        let Some(ifc) = ifc else { return };
        let of_family =
            |g: &IpAddr| g.is_ipv6() == r.v6 && r.group.is_none_or(|want| want == *g) && report::reported(g);
        let mut records: Vec<(IpAddr, crate::mcast::SourceFilter)> =
            states.into_iter().filter(|(g, _)| of_family(g)).collect();
        if let (Some(g), false) = (r.group, r.current) {
            // A change to no membership: TO_IN with no source, a leave.
            if records.is_empty() && report::reported(&g) {
                records
                    .push((g, crate::mcast::SourceFilter { mode: crate::mcast::Mode::Include, sources: Vec::new() }));
            }
        }
        // As many records a packet as the interface's MTU takes.
        let per_source = if r.v6 { 16 } else { 4 };
        let mut packet: Vec<(IpAddr, crate::mcast::SourceFilter)> = Vec::new();
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

    /// One report packet of `records` (groups of the report's family).
    fn send_records(
        &mut self,
        ifc: &crate::iface::Interface,
        r: PendingReport,
        records: Vec<(IpAddr, crate::mcast::SourceFilter)>,
    ) {
        let (packet, dst, ethertype) = if r.v6 {
            let src = ifc
                .ipv6
                .iter()
                .find_map(|c| match c.addr {
                    IpAddr::V6(a) if crate::config::is_link_local(&a) => Some(a),
                    _ => None,
                })
                .unwrap_or(Ipv6Addr::UNSPECIFIED);
            (
                report::mldv2_report(src, &records, r.current),
                IpAddr::V6(report::MLDV2_ROUTERS),
                ethernet::ethertype::IPV6,
            )
        } else {
            let src = ifc.ipv4_addrs.first().copied().unwrap_or(Ipv4Addr::UNSPECIFIED);
            (
                report::igmpv3_report(src, &records, r.current),
                IpAddr::V4(report::IGMPV3_ROUTERS),
                ethernet::ethertype::IPV4,
            )
        };
        let Some(mut m) = self.shared.pool.alloc() else {
            self.inc(Counter::TxNoMbuf);
            return;
        };
        let Ok(body) = m.append(packet.len()) else {
            self.inc(Counter::TxNoMbuf);
            return;
        };
        body.copy_from_slice(&packet);
        self.inc(if r.v6 { Counter::Mld6OutReports } else { Counter::IgmpOutReports });
        self.send_frame(r.iface, m, report::group_mac(&dst), ethertype);
    }
}

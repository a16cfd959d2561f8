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
    /// group always), counted. Out of line: the unicast path pays only
    /// its caller's test of the address.
    #[cold]
    #[inline(never)]
    pub(super) fn joined(&mut self, iface: u16, dst: IpAddr, src: IpAddr) -> bool {
        let all_hosts = dst == IpAddr::V4(report::ALL_HOSTS) || dst == IpAddr::V6(crate::wire::ipv6::ALL_NODES);
        let ok = all_hosts || self.net.mcast.iface_allows(iface, &dst, &src);
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
        let wait = self.shared.random_u32() as u64 % (q.max_delay_ms.max(1) as u64 * 1_000_000);
        let r = PendingReport { due: Instant(self.now.0 + wait), iface, v6, group: q.group, current: true };
        let mut reports = self.shared.mcast_reports.lock().unwrap_or_else(|p| p.into_inner());
        // One answer pending per group is enough (a general one covers all).
        let covered = reports
            .iter()
            .any(|p| p.current && p.iface == iface && p.v6 == v6 && (p.group.is_none() || p.group == q.group));
        if !covered {
            reports.push(r);
            self.shared.mcast_pending.store(true, Ordering::Release);
        }
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
        let states = self.shared.mcast.lock().unwrap_or_else(|p| p.into_inner()).iface_state(r.iface);
        let ifc = self.net.ifaces.get(r.iface as usize).cloned();
        let Some(ifc) = ifc else { return };
        let of_family = |g: &IpAddr| g.is_ipv6() == r.v6 && r.group.is_none_or(|want| want == *g);
        let mut records: Vec<(IpAddr, crate::mcast::SourceFilter)> =
            states.into_iter().filter(|(g, _)| of_family(g)).collect();
        if let (Some(g), false) = (r.group, r.current) {
            // A change to no membership: TO_IN with no source, a leave.
            if records.is_empty() {
                records
                    .push((g, crate::mcast::SourceFilter { mode: crate::mcast::Mode::Include, sources: Vec::new() }));
            }
        }
        if records.is_empty() {
            return;
        }
        let (packet, dst, ethertype) = if r.v6 {
            let src = ifc
                .ipv6
                .iter()
                .find_map(|c| match c.addr {
                    IpAddr::V6(a) if crate::config::is_link_local(&a) => Some(a),
                    _ => None,
                })
                .unwrap_or(Ipv6Addr::UNSPECIFIED);
            let recs: Vec<(Ipv6Addr, _)> = records
                .into_iter()
                .filter_map(|(g, f)| match g {
                    IpAddr::V6(g) => Some((g, f)),
                    _ => None,
                })
                .collect();
            (report::mldv2_report(src, &recs, r.current), IpAddr::V6(report::MLDV2_ROUTERS), ethernet::ethertype::IPV6)
        } else {
            let src = ifc.ipv4_addrs.first().copied().unwrap_or(Ipv4Addr::UNSPECIFIED);
            let recs: Vec<(Ipv4Addr, _)> = records
                .into_iter()
                .filter_map(|(g, f)| match g {
                    IpAddr::V4(g) => Some((g, f)),
                    _ => None,
                })
                .collect();
            (
                report::igmpv3_report(src, &recs, r.current),
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

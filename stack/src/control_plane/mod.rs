//! The control plane: what manages the datapath's shared state from above
//! it. The [`Stack`] handle holds both halves: [`Shared`], the state the
//! lcores and sockets read on the datapath (tables, pool, queues, the
//! published view of interfaces, routes and groups), and [`ControlPlane`],
//! what only changes them: the sockets' multicast memberships (each change
//! published to the datapath as a new view, reported by IGMP and MLD),
//! the ports' device filters ([`filters`]), and the service threads'
//! handles ([`service`]). The engine reads none of it; the threads
//! themselves are started by `setup`, the layer above.

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::mcast::{Change, McastView, Memberships, SourceFilter};
use crate::shared::{PendingReport, Shared};
use crate::time::Instant;

pub(crate) mod filters;
pub(crate) mod service;
pub(crate) mod xdp;

use filters::DeviceFilter;
use service::ServiceThread;

/// A UDP/IP stack on DPDK ports. Cheap to clone (a handle).
#[derive(Debug, Clone)]
pub struct Stack {
    // The control plane first: its service threads stop before the
    // datapath's state (and its pool) can go (it holds the state too).
    pub(crate) control: Arc<ControlPlane>,
    pub(crate) shared: Arc<Shared>,
}

/// A [`Stack`] held without keeping it alive (the service threads hold
/// one between requests): the control plane, which keeps the datapath's
/// state alive as long as it lives.
#[derive(Debug, Clone)]
pub(crate) struct WeakStack {
    control: Weak<ControlPlane>,
}

impl Stack {
    /// A handle over the datapath's state `shared` and a control plane for
    /// it, the ports' device filters as set up.
    pub(crate) fn from_parts(shared: Shared, filters: Vec<DeviceFilter>) -> Stack {
        let shared = Arc::new(shared);
        Stack { control: Arc::new(ControlPlane::new(shared.clone(), filters)), shared }
    }

    /// A handle that does not keep the stack alive.
    pub(crate) fn downgrade(&self) -> WeakStack {
        WeakStack { control: Arc::downgrade(&self.control) }
    }
}

impl WeakStack {
    /// The stack, while a handle to it lives.
    pub(crate) fn upgrade(&self) -> Option<Stack> {
        let control = self.control.upgrade()?;
        Some(Stack { shared: control.shared.clone(), control })
    }

    /// Whether every handle to the stack is gone.
    pub(crate) fn is_gone(&self) -> bool {
        self.control.strong_count() == 0
    }

    /// The datapath's state alone, while the stack lives.
    pub(crate) fn shared(&self) -> Option<Arc<Shared>> {
        self.control.upgrade().map(|c| c.shared.clone())
    }
}

/// What the control plane keeps.
#[derive(Debug)]
pub(crate) struct ControlPlane {
    /// The datapath's state it manages, kept alive while the control
    /// plane lives: its service threads stop before the pool can go,
    /// whichever thread drops the last handle.
    shared: Arc<Shared>,
    /// The sockets' multicast memberships (the lcores read their view,
    /// published in `Net`).
    pub memberships: Mutex<Memberships>,
    /// How each non-promiscuous port hears its groups (see [`filters`]).
    pub filters: Mutex<Vec<DeviceFilter>>,
    /// The control endpoint, once `setup` opened it: dropped with the
    /// stack, which stops its thread and removes its socket.
    pub endpoint: OnceLock<ServiceThread>,
    /// The metrics endpoint (`metrics`), likewise.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub metrics: OnceLock<ServiceThread>,
    /// By interface: spate's XDP program on a `net_af_xdp` port, whose
    /// address maps follow the interface's addresses and groups.
    pub xdp: Mutex<Vec<Option<xdp::XdpPort>>>,
}

impl ControlPlane {
    /// No memberships or endpoints yet; the ports' filters as set up.
    fn new(shared: Arc<Shared>, filters: Vec<DeviceFilter>) -> ControlPlane {
        ControlPlane {
            shared,
            memberships: Mutex::default(),
            filters: Mutex::new(filters),
            endpoint: OnceLock::new(),
            metrics: OnceLock::new(),
            xdp: Mutex::default(),
        }
    }
}

/// Interface `iface`'s filter for `group`, if it is in it.
fn state_of(m: &Memberships, iface: u16, group: &IpAddr) -> Option<SourceFilter> {
    m.iface_state(iface).into_iter().find(|(g, _)| g == group).map(|(_, f)| f)
}

impl Stack {
    /// Applies a membership change of socket `socket` and publishes the
    /// interfaces' new state; a change of an interface's state is reported
    /// (IGMPv3 or MLDv2) at once and again within a second, as RFC 3376's
    /// robustness variable of 2 asks.
    pub(crate) fn change_membership(
        &self,
        socket: u64,
        iface: u16,
        group: IpAddr,
        change: Change,
    ) -> std::io::Result<()> {
        let mut m = self.control.memberships.lock().unwrap_or_else(|p| p.into_inner());
        let before = state_of(&m, iface, &group);
        m.change(socket, iface, group, change).map_err(|r| std::io::Error::from_raw_os_error(r.errno()))?;
        let changed = if state_of(&m, iface, &group) != before { vec![(iface, group)] } else { Vec::new() };
        self.publish_mcast(&m, &changed);
        drop(m);
        self.sync_filters(&changed);
        Ok(())
    }

    /// Programs the device filters of the interfaces whose groups
    /// `changed`, after the memberships' lock is let go: a device's
    /// control call may take a while, and each reads the newest state.
    fn sync_filters(&self, changed: &[(u16, IpAddr)]) {
        let mut ifaces: Vec<u16> = changed.iter().map(|(i, _)| *i).collect();
        ifaces.sort();
        ifaces.dedup();
        for i in ifaces {
            self.sync_multicast_filter(i);
            let _ = self.sync_xdp(i); // logged
        }
    }

    /// Drops every membership of a socket that closed.
    pub(crate) fn leave_all_groups(&self, socket: u64) {
        let mut m = self.control.memberships.lock().unwrap_or_else(|p| p.into_inner());
        let groups: Vec<(u16, IpAddr)> =
            m.all().iter().filter(|x| x.socket == socket).map(|x| (x.iface, x.group)).collect();
        if groups.is_empty() {
            return;
        }
        let before: Vec<_> = groups.iter().map(|(i, g)| state_of(&m, *i, g)).collect();
        m.leave_all(socket);
        let changed: Vec<(u16, IpAddr)> =
            groups.into_iter().zip(before).filter(|((i, g), b)| state_of(&m, *i, g) != *b).map(|(x, _)| x).collect();
        self.publish_mcast(&m, &changed);
        drop(m);
        self.sync_filters(&changed);
    }

    /// Publishes the memberships' view and queues the reports of the
    /// interface states that `changed`.
    fn publish_mcast(&self, m: &Memberships, changed: &[(u16, IpAddr)]) {
        let _ = self.shared.change_net(|net| {
            net.mcast = Arc::new(McastView::of(m, net.ifaces.len()));
            Ok(())
        });
        if changed.is_empty() {
            return;
        }
        let now = self.shared.clock.now();
        let mut reports = self.shared.mcast_reports.lock().unwrap_or_else(|p| p.into_inner());
        for &(iface, group) in changed.iter().filter(|(_, g)| crate::mcast::report::reported(g)) {
            let repeat = Instant(now.0 + 1 + (self.shared.random_u32() as u64 % 1_000_000_000));
            for (due, repeat) in [(now, false), (repeat, true)] {
                let report = PendingReport {
                    due,
                    iface,
                    v6: group.is_ipv6(),
                    group: Some(group),
                    current: false,
                    repeat,
                    unasked: false,
                };
                reports.reports.push(report);
            }
        }
        self.shared.mcast_pending.store(true, Ordering::Release);
        drop(reports);
        // Lcore 0 sends reports: at once, also when it sleeps.
        self.shared.wake(0);
    }
}

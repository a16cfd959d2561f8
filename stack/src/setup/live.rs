//! Changing a running stack: addresses, routes and static neighbour
//! entries, as `ip addr`, `ip route` and `ip neigh` change Linux's. Each
//! change publishes a new copy of the interfaces and routes
//! (`shared::Net`): the lcores take it before they receive a frame that
//! arrives after the change returned (they look at the top of each loop
//! iteration and after each burst) and before they send a group packet,
//! sockets look their cached routes up again at their next send. Errors
//! carry the errno `ip` would show.

use std::io;
use std::net::IpAddr;
use std::sync::atomic::Ordering;

use crate::config::Cidr;
use crate::control_plane::Stack;
use crate::route::{RouteError, StaticRoute};
use crate::stats::Counter;
use crate::wire::MacAddr;

fn errno(code: i32, what: &str) -> io::Error {
    let kind = io::Error::from_raw_os_error(code).kind();
    io::Error::new(kind, Errno { code, text: format!("{what} ({})", io::Error::from_raw_os_error(code)) })
}

/// A refusal's errno, kept in the error (its kind alone loses ESRCH and
/// others) for the control endpoint to pass on.
#[derive(Debug)]
pub struct Errno {
    /// Linux's errno.
    pub code: i32,
    text: String,
}

impl Errno {
    /// An errno with its message.
    pub(super) fn new(code: i32, text: String) -> Errno {
        Errno { code, text }
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for Errno {}

/// A prefix no longer than its family's addresses (`Cidr`'s fields are
/// public, so one may arrive unparsed).
fn check_prefix(c: &Cidr) -> io::Result<()> {
    let max = if c.addr.is_ipv4() { 32 } else { 128 };
    if c.prefix_len > max {
        return Err(errno(libc::EINVAL, "a prefix longer than its address"));
    }
    Ok(())
}

impl Stack {
    /// Adds `addr` to interface `iface` (`ip addr add`): it answers ARP or
    /// neighbour solicitations and pings, and sockets may bind it, for
    /// every frame that arrives after this returns; lcore 0 announces it
    /// (gratuitous ARP, unsolicited neighbour advertisement) at its next
    /// timer, within 10 ms. `ENODEV` for no such interface, `EEXIST` for an address the
    /// stack has already, `EINVAL` for one no interface can own
    /// (unspecified, multicast, limited broadcast).
    pub fn add_address(&self, iface: u16, addr: Cidr) -> io::Result<()> {
        let shared = &self.shared;
        check_prefix(&addr)?;
        let ip = addr.addr;
        let bad = match ip {
            IpAddr::V4(a) => a.is_unspecified() || a.is_multicast() || a.is_broadcast(),
            IpAddr::V6(a) => a.is_unspecified() || a.is_multicast(),
        };
        if bad {
            return Err(errno(libc::EINVAL, "not an address an interface can own"));
        }
        shared.change_net(|net| {
            if net.is_local(&ip) {
                return Err(errno(libc::EEXIST, "the stack has that address"));
            }
            let i = net.ifaces.get_mut(iface as usize).ok_or_else(|| errno(libc::ENODEV, "no such interface"))?;
            i.add_address(addr);
            Ok(())
        })?;
        if ip.is_ipv4() {
            // The broadcast addresses, as at the start.
            shared.add_broadcast_neighbors(iface, addr.broadcast().as_slice());
        }
        shared.announce.lock().unwrap_or_else(|p| p.into_inner()).push((iface, ip));
        shared.announce_pending.store(true, Ordering::Release);
        // Lcore 0 announces it: at once, also when it sleeps.
        shared.wake(0);
        if ip.is_ipv6() {
            // Its solicited-node group, for a port that filters groups.
            self.sync_multicast_filter(iface);
        }
        let _ = self.sync_xdp(iface); // logged
        shared.stats.shared().add_shared(Counter::ConfAddrAdds, 1);
        Ok(())
    }

    /// Removes `ip` from interface `iface` (`ip addr del`): for every
    /// frame that arrives after this returns it answers nothing, datagrams
    /// to it are not delivered (sockets bound to it stop receiving), and
    /// sends from it fail: `ENETUNREACH` for IPv4, as Linux's;
    /// `EADDRNOTAVAIL` for IPv6, where Linux sends from the removed address
    /// anyway (6.18). `ENODEV` for no such interface, `EADDRNOTAVAIL` for
    /// an address the interface does not have.
    pub fn remove_address(&self, iface: u16, ip: IpAddr) -> io::Result<()> {
        let orphaned = self.shared.change_net(|net| {
            let i = net.ifaces.get_mut(iface as usize).ok_or_else(|| errno(libc::ENODEV, "no such interface"))?;
            let broadcast = i.ipv4.iter().find(|c| c.addr == ip).and_then(Cidr::broadcast);
            if !i.remove_address(&ip) {
                return Err(errno(libc::EADDRNOTAVAIL, "the interface has no such address"));
            }
            // Its subnet's broadcast address, unless another address has it.
            Ok(broadcast.filter(|b| !i.ipv4_broadcast.contains(b)))
        })?;
        if let Some(b) = orphaned {
            self.shared.neigh.remove((iface, IpAddr::V4(b)));
        }
        if ip.is_ipv6() {
            self.sync_multicast_filter(iface);
        }
        let _ = self.sync_xdp(iface); // logged
        self.shared.stats.shared().add_shared(Counter::ConfAddrRemoves, 1);
        Ok(())
    }

    /// Adds a route to `dst` (`ip route add`): through gateway `via`,
    /// which must be on an interface's link (and on `iface`'s, when
    /// given), or straight out of interface `iface`. A prefix of length 0
    /// sets the family's default gateway. The longest prefix wins, an
    /// interface's own prefix a tie. `EEXIST` for a prefix routed already,
    /// `ENETUNREACH` for a gateway on no link, `ENODEV` for no such
    /// interface, `EINVAL` for a route with no way out or a gateway of the
    /// other family.
    pub fn add_route(&self, dst: Cidr, via: Option<IpAddr>, iface: Option<u16>) -> io::Result<()> {
        check_prefix(&dst)?;
        self.shared.change_net(|net| {
            net.routes.add(&net.ifaces, dst, via, iface).map_err(|e| match e {
                RouteError::GatewayNotOnLink => errno(libc::ENETUNREACH, "the gateway is on no interface's link"),
                RouteError::NoSuchInterface => errno(libc::ENODEV, "no such interface"),
                RouteError::NoWayOut => errno(libc::EINVAL, "a route needs a gateway or an interface"),
                RouteError::Family => errno(libc::EINVAL, "the gateway's family is not the destination's"),
                RouteError::Exists => errno(libc::EEXIST, "a route to that prefix exists"),
            })
        })?;
        self.shared.stats.shared().add_shared(Counter::ConfRouteAdds, 1);
        Ok(())
    }

    /// Removes the route to `dst` (`ip route del`; a prefix of length 0
    /// removes the default gateway). `ESRCH` when there is none.
    pub fn remove_route(&self, dst: Cidr) -> io::Result<()> {
        check_prefix(&dst)?;
        self.shared.change_net(|net| match net.routes.remove(dst) {
            true => Ok(()),
            false => Err(errno(libc::ESRCH, "no route to that prefix")),
        })?;
        self.shared.stats.shared().add_shared(Counter::ConfRouteRemoves, 1);
        Ok(())
    }

    /// The static routes and default gateways (the interfaces' own prefixes
    /// are routes too, not listed).
    pub fn routes(&self) -> Vec<StaticRoute> {
        self.shared.net().routes.list()
    }

    /// Sets `ip`'s MAC on interface `iface` for good (`ip neigh replace
    /// ... nud permanent`): nothing asks for it or changes it from the
    /// wire. `ENODEV` for no such interface, `EINVAL` for a multicast or
    /// zero MAC.
    pub fn add_neighbor(&self, iface: u16, ip: IpAddr, mac: MacAddr) -> io::Result<()> {
        if iface as usize >= self.shared.links.len() {
            return Err(errno(libc::ENODEV, "no such interface"));
        }
        if mac == MacAddr::ZERO || mac.0[0] & 1 == 1 {
            return Err(errno(libc::EINVAL, "a neighbour's MAC is a unicast one"));
        }
        self.shared.neigh.add_permanent((iface, ip), mac);
        self.shared.stats.shared().add_shared(Counter::ConfNeighAdds, 1);
        Ok(())
    }

    /// Forgets `ip`'s entry on interface `iface`, configured or learnt
    /// (`ip neigh del`): the next packet there asks for it again.
    /// `ENOENT` when there is none.
    pub fn remove_neighbor(&self, iface: u16, ip: IpAddr) -> io::Result<()> {
        if !self.shared.neigh.remove((iface, ip)) {
            return Err(errno(libc::ENOENT, "no such neighbour entry"));
        }
        self.shared.stats.shared().add_shared(Counter::ConfNeighRemoves, 1);
        Ok(())
    }
}

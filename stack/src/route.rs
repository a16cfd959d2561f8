//! Routes: the on-link prefixes of each interface, static routes and one
//! default gateway per family. Looked up without a lock: the table is part
//! of the stack's published network state (`shared::Net`), replaced whole
//! when it changes.

use std::net::IpAddr;

use crate::config::{Cidr, is_link_local};
use crate::iface::Interface;

/// Where a packet to some destination goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// Interface index.
    pub iface: u16,
    /// The neighbour to hand it to: the destination itself or the gateway.
    pub next_hop: IpAddr,
    /// Source address to use.
    pub src: IpAddr,
    /// MTU of the interface.
    pub mtu: u16,
    /// The interface computes IPv4/UDP checksums on transmit.
    pub offload: bool,
}

/// A static route: destinations in `dst` go through gateway `via` (on
/// the link of an interface), or straight out of interface `iface`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaticRoute {
    /// The destinations.
    pub dst: Cidr,
    /// The gateway, when not on-link.
    pub via: Option<IpAddr>,
    /// The interface it leaves by.
    pub iface: u16,
}

/// The routing table.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    gateway_v4: Option<(IpAddr, u16)>,
    gateway_v6: Option<(IpAddr, u16)>,
    /// Static routes, longest prefix first.
    statics: Vec<StaticRoute>,
}

impl Routes {
    /// Routes for `ifaces` with `gateways` (validated to be on-link).
    pub fn new(ifaces: &[Interface], gateways: &[IpAddr]) -> Routes {
        let mut r = Routes::default();
        for g in gateways {
            // (An IPv6 gateway off every link goes by the first interface
            // with IPv6: configuration checked the rest.)
            let iface = gateway_iface(ifaces, g)
                .or_else(|| ifaces.iter().find(|i| g.is_ipv6() && !i.ipv6.is_empty()).map(|i| i.index))
                .unwrap_or(0);
            r.set_gateway(*g, iface);
        }
        r
    }

    fn set_gateway(&mut self, g: IpAddr, iface: u16) {
        if g.is_ipv4() { self.gateway_v4 = Some((g, iface)) } else { self.gateway_v6 = Some((g, iface)) }
    }

    /// The static routes and default gateways, as `StaticRoute`s (a
    /// default gateway is the route to `0.0.0.0/0` or `::/0`).
    pub fn list(&self) -> Vec<StaticRoute> {
        let default = |g: Option<(IpAddr, u16)>, any: IpAddr| {
            g.map(|(via, iface)| StaticRoute { dst: Cidr { addr: any, prefix_len: 0 }, via: Some(via), iface })
        };
        self.statics
            .iter()
            .copied()
            .chain(default(self.gateway_v4, IpAddr::from([0u8; 4])))
            .chain(default(self.gateway_v6, IpAddr::from([0u16; 8])))
            .collect()
    }

    /// Adds a route to `dst` through `via` (which must be on the link of
    /// an interface) or out of interface `iface`; a prefix of length 0 is
    /// the family's default gateway. Err: the route exists, or names no
    /// way out.
    pub fn add(
        &mut self,
        ifaces: &[Interface],
        dst: Cidr,
        via: Option<IpAddr>,
        iface: Option<u16>,
    ) -> Result<(), RouteError> {
        if via.is_some_and(|v| v.is_ipv4() != dst.addr.is_ipv4()) {
            return Err(RouteError::Family);
        }
        let iface = match (via, iface) {
            (Some(v), i) => {
                let found = gateway_iface(ifaces, &v).ok_or(RouteError::GatewayNotOnLink)?;
                if i.is_some_and(|i| i != found) {
                    return Err(RouteError::GatewayNotOnLink);
                }
                found
            }
            (None, Some(i)) if (i as usize) < ifaces.len() => i,
            (None, Some(_)) => return Err(RouteError::NoSuchInterface),
            (None, None) => return Err(RouteError::NoWayOut),
        };
        let dst = dst.network();
        if dst.prefix_len == 0 {
            let Some(v) = via else { return Err(RouteError::NoWayOut) };
            let current = if v.is_ipv4() { self.gateway_v4 } else { self.gateway_v6 };
            if current.is_some() {
                return Err(RouteError::Exists);
            }
            self.set_gateway(v, iface);
            return Ok(());
        }
        if self.statics.iter().any(|r| r.dst == dst) {
            return Err(RouteError::Exists);
        }
        self.statics.push(StaticRoute { dst, via, iface });
        self.statics.sort_by_key(|r| std::cmp::Reverse(r.dst.prefix_len));
        Ok(())
    }

    /// Removes the route to `dst` (the default gateway for a prefix of
    /// length 0); false when there is none.
    pub fn remove(&mut self, dst: Cidr) -> bool {
        let dst = dst.network();
        if dst.prefix_len == 0 {
            let g = if dst.addr.is_ipv4() { &mut self.gateway_v4 } else { &mut self.gateway_v6 };
            return g.take().is_some();
        }
        let before = self.statics.len();
        self.statics.retain(|r| r.dst != dst);
        self.statics.len() != before
    }

    /// The route to `dst`, using `src` as the source when given (a socket
    /// bound to a specific address). The longest prefix wins; an
    /// interface's own prefix wins a tie.
    pub fn lookup(&self, ifaces: &[Interface], dst: &IpAddr, src: Option<&IpAddr>) -> Option<Route> {
        if dst.is_unspecified() {
            return None;
        }
        if let IpAddr::V4(d) = dst {
            // The common case in one pass: an on-link IPv4 destination, the
            // longest prefix that holds it giving the source, unless a
            // static route is longer still.
            let d = u32::from(*d);
            let mut best: Option<(&Interface, &Cidr)> = None;
            for iface in ifaces {
                for c in iface.ipv4.iter().filter(|c| c.contains_v4(d)) {
                    if best.is_none_or(|(_, b)| c.prefix_len > b.prefix_len) {
                        best = Some((iface, c));
                    }
                }
            }
            if let Some((iface, c)) = best
                && !self.statics.iter().any(|r| r.dst.prefix_len > c.prefix_len && r.dst.contains(dst))
            {
                let src = match src {
                    Some(s) if !s.is_unspecified() => *s,
                    _ => c.addr,
                };
                return Some(route(iface, *dst, src));
            }
        }
        // The interface prefix that holds `dst`, the longest (the first
        // interface's of equal ones).
        let direct = ifaces
            .iter()
            .flat_map(|i| i.ipv4.iter().chain(&i.ipv6).filter(|c| c.contains(dst)).map(move |c| (i, c.prefix_len)))
            .min_by_key(|(_, len)| std::cmp::Reverse(*len));
        let statik = self.statics.iter().find(|r| r.dst.contains(dst));
        let via_static = match (direct, statik) {
            (Some((_, on_link)), Some(r)) => r.dst.prefix_len > on_link,
            (None, Some(_)) => true,
            _ => false,
        };
        let direct = direct.map(|(i, _)| i).or_else(|| match dst {
            // Link-local destinations are on the first interface with IPv6
            // (spate has no scope ids yet).
            IpAddr::V6(a) if is_link_local(a) || a.is_multicast() => ifaces.iter().find(|i| !i.ipv6.is_empty()),
            // The limited broadcast leaves by the interface of the
            // source, when there is one (Linux: the device of `saddr`).
            IpAddr::V4(a) if a.is_broadcast() => src
                .and_then(|s| ifaces.iter().find(|i| matches!(s, IpAddr::V4(v) if i.has_ipv4(*v))))
                .or_else(|| ifaces.iter().find(|i| !i.ipv4.is_empty())),
            _ => None,
        });
        let (iface, next_hop) = match (via_static, statik, direct) {
            (true, Some(r), _) => (ifaces.get(r.iface as usize)?, r.via.unwrap_or(*dst)),
            (_, _, Some(i)) => (i, *dst),
            _ => {
                let (gw, idx) = if dst.is_ipv4() { self.gateway_v4? } else { self.gateway_v6? };
                (ifaces.get(idx as usize)?, gw)
            }
        };
        let src = match src {
            Some(s) if !s.is_unspecified() => *s,
            _ => iface.source_for(dst)?,
        };
        Some(route(iface, next_hop, src))
    }
}

impl Routes {
    /// The route of a socket's datagram to `dst`: [`lookup`](Self::lookup)'s
    /// for a unicast destination, [`multicast_route`]'s (leaving by
    /// `mcast_if`, the socket's `IP_MULTICAST_IF`) for a group.
    pub fn socket_route(
        &self,
        ifaces: &[Interface],
        dst: &IpAddr,
        src: Option<&IpAddr>,
        mcast_if: Option<u16>,
    ) -> Option<Route> {
        match dst.is_multicast() {
            false => self.lookup(ifaces, dst, src),
            true => multicast_route(self, ifaces, dst, mcast_if, src),
        }
    }
}

/// The route of a datagram to group `group`: out of interface `out` if
/// given, else the route's interface for the group, else the first with
/// an address of its family; handed to the group itself (its MAC is the
/// group's), from `src` or the interface's address.
pub fn multicast_route(
    routes: &Routes,
    ifaces: &[Interface],
    group: &IpAddr,
    out: Option<u16>,
    src: Option<&IpAddr>,
) -> Option<Route> {
    let v4 = group.is_ipv4();
    let has_family = |i: &&Interface| if v4 { !i.ipv4.is_empty() } else { !i.ipv6.is_empty() };
    let ifc = match out {
        Some(o) => ifaces.get(o as usize),
        None => routes
            .lookup(ifaces, group, src)
            .and_then(|r| ifaces.get(r.iface as usize))
            .or_else(|| ifaces.iter().find(has_family)),
    }?;
    let src = match src {
        Some(s) if !s.is_unspecified() => *s,
        _ => ifc.source_for(group)?,
    };
    Some(route(ifc, *group, src))
}

fn route(ifc: &Interface, next_hop: IpAddr, src: IpAddr) -> Route {
    Route { iface: ifc.index, next_hop, src, mtu: ifc.mtu, offload: ifc.tx_checksum }
}

/// The interface whose link gateway `g` is on (an IPv6 gateway may be
/// link-local: the first interface with IPv6).
fn gateway_iface(ifaces: &[Interface], g: &IpAddr) -> Option<u16> {
    ifaces
        .iter()
        .find(|i| i.on_link(g))
        .or_else(|| ifaces.iter().find(|i| g.is_ipv6() && !i.ipv6.is_empty() && is_link_local_ip(g)))
        .map(|i| i.index)
}

fn is_link_local_ip(ip: &IpAddr) -> bool {
    matches!(ip, IpAddr::V6(a) if is_link_local(a))
}

/// Why a route was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteError {
    /// The gateway is on no interface's link (or not on the one named).
    GatewayNotOnLink,
    /// No interface has that index.
    NoSuchInterface,
    /// Neither a gateway nor an interface (a default route needs a gateway).
    NoWayOut,
    /// The gateway's family is not the destination's.
    Family,
    /// A route to that prefix exists.
    Exists,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::MacAddr;

    fn iface() -> Interface {
        let mac = MacAddr([2, 0x53, 0x50, 0x41, 0x54, 0x45]);
        let ifc = Interface::new(
            0,
            0,
            "p".into(),
            mac,
            1500,
            None,
            &["198.18.0.2/24".parse().unwrap()],
            &["fd00::2/64".parse().unwrap()],
        );
        assert_eq!(ifc.ipv6[0].addr, IpAddr::V6(crate::wire::ipv6::link_local_from_mac(&mac)), "link-local first");
        ifc
    }

    #[test]
    fn on_link_gateway_and_sources() {
        let ifs = [iface()];
        let r = Routes::new(&ifs, &["198.18.0.1".parse().unwrap()]);
        let on = r.lookup(&ifs, &"198.18.0.9".parse().unwrap(), None).unwrap();
        assert_eq!((on.next_hop, on.src), ("198.18.0.9".parse().unwrap(), "198.18.0.2".parse().unwrap()));
        let off = r.lookup(&ifs, &"203.0.113.5".parse().unwrap(), None).unwrap();
        assert_eq!(off.next_hop, "198.18.0.1".parse::<IpAddr>().unwrap());
        assert!(r.lookup(&ifs, &"2001:db8::1".parse().unwrap(), None).is_none(), "no IPv6 gateway");
        let v6 = r.lookup(&ifs, &"fd00::1".parse().unwrap(), None).unwrap();
        assert_eq!(v6.src, "fd00::2".parse::<IpAddr>().unwrap());
        let ll = r.lookup(&ifs, &"fe80::1".parse().unwrap(), None).unwrap();
        assert_eq!(ll.src, IpAddr::V6(ifs[0].link_local()));
        assert!(r.lookup(&ifs, &"0.0.0.0".parse().unwrap(), None).is_none());
    }

    #[test]
    fn interface_acceptance() {
        let i = iface();
        assert!(i.has_ipv4("198.18.0.2".parse().unwrap()));
        assert!(i.is_ipv4_broadcast("198.18.0.255".parse().unwrap()));
        assert!(i.accepts_ipv6(&"ff02::1:ff00:2".parse().unwrap()));
        assert!(i.accepts_ipv6(&crate::wire::ipv6::ALL_NODES));
        assert!(!i.accepts_ipv6(&"ff02::1:ff00:3".parse().unwrap()));
        assert!(i.accepts_mac(&MacAddr::BROADCAST));
        assert!(!i.accepts_mac(&MacAddr([2, 0, 0, 0, 0, 9])));
    }
}

#[cfg(test)]
mod static_tests {
    use super::*;
    use crate::wire::MacAddr;

    fn ifaces() -> Vec<Interface> {
        let mac = MacAddr([2, 0x53, 0x50, 0x41, 0x54, 0x45]);
        vec![Interface::new(0, 0, "p".into(), mac, 1500, None, &["198.18.0.2/24".parse().unwrap()], &[])]
    }

    #[test]
    fn the_longest_prefix_wins_and_routes_come_and_go() {
        let ifs = ifaces();
        let mut r = Routes::new(&ifs, &[]);
        let far: IpAddr = "203.0.113.5".parse().unwrap();
        assert!(r.lookup(&ifs, &far, None).is_none(), "no gateway yet");
        let via: IpAddr = "198.18.0.1".parse().unwrap();
        r.add(&ifs, "203.0.113.0/24".parse().unwrap(), Some(via), None).unwrap();
        let got = r.lookup(&ifs, &far, None).unwrap();
        assert_eq!((got.next_hop, got.src), (via, "198.18.0.2".parse().unwrap()));
        assert_eq!(r.add(&ifs, "203.0.113.9/24".parse().unwrap(), Some(via), None), Err(RouteError::Exists));
        assert_eq!(
            r.add(&ifs, "192.0.2.0/24".parse().unwrap(), Some("192.0.2.1".parse().unwrap()), None),
            Err(RouteError::GatewayNotOnLink)
        );
        // More specific than the interface's own /24: it wins.
        r.add(&ifs, "198.18.0.128/25".parse().unwrap(), Some(via), None).unwrap();
        assert_eq!(r.lookup(&ifs, &"198.18.0.200".parse().unwrap(), None).unwrap().next_hop, via);
        assert_eq!(
            r.lookup(&ifs, &"198.18.0.20".parse().unwrap(), None).unwrap().next_hop,
            "198.18.0.20".parse::<IpAddr>().unwrap(),
            "on-link below it"
        );
        // A default gateway, listed, and removed.
        let default = Cidr { addr: IpAddr::from([0u8; 4]), prefix_len: 0 };
        r.add(&ifs, default, Some(via), None).unwrap();
        assert_eq!(r.lookup(&ifs, &"8.8.8.8".parse().unwrap(), None).unwrap().next_hop, via);
        assert_eq!(r.list().len(), 3);
        assert!(r.remove("203.0.113.0/24".parse().unwrap()));
        assert!(!r.remove("203.0.113.0/24".parse().unwrap()));
        assert_eq!(r.lookup(&ifs, &far, None).unwrap().next_hop, via, "the default gateway now");
        assert!(r.remove(default));
        assert!(r.lookup(&ifs, &far, None).is_none());
    }
}

//! Routes: the on-link prefixes of each interface and one default gateway
//! per family. Fixed when the stack is built, so lookups take no lock.

use std::net::IpAddr;

use crate::config::is_link_local;
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
}

/// The routing table.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    gateway_v4: Option<(IpAddr, u16)>,
    gateway_v6: Option<(IpAddr, u16)>,
}

impl Routes {
    /// Routes for `ifaces` with `gateways` (validated to be on-link).
    pub fn new(ifaces: &[Interface], gateways: &[IpAddr]) -> Routes {
        let mut r = Routes::default();
        for g in gateways {
            let iface = ifaces
                .iter()
                .find(|i| i.on_link(g))
                .or_else(|| ifaces.iter().find(|i| g.is_ipv6() && !i.ipv6.is_empty()))
                .map(|i| i.index)
                .unwrap_or(0);
            if g.is_ipv4() { r.gateway_v4 = Some((*g, iface)) } else { r.gateway_v6 = Some((*g, iface)) }
        }
        r
    }

    /// The route to `dst`, using `src` as the source when given (a socket
    /// bound to a specific address).
    pub fn lookup(&self, ifaces: &[Interface], dst: &IpAddr, src: Option<&IpAddr>) -> Option<Route> {
        if dst.is_unspecified() {
            return None;
        }
        if let IpAddr::V4(d) = dst {
            // The common case in one pass: an on-link IPv4 destination, the
            // prefix that holds it giving the source.
            let d = u32::from(*d);
            for iface in ifaces {
                if let Some(c) = iface.ipv4.iter().find(|c| c.contains_v4(d)) {
                    let src = match src {
                        Some(s) if !s.is_unspecified() => *s,
                        _ => c.addr,
                    };
                    return Some(Route { iface: iface.index, next_hop: *dst, src, mtu: iface.mtu });
                }
            }
        }
        let direct = ifaces.iter().find(|i| i.on_link(dst)).or_else(|| match dst {
            // Link-local destinations are on the first interface with IPv6
            // (spate has no scope ids yet).
            IpAddr::V6(a) if is_link_local(a) || a.is_multicast() => ifaces.iter().find(|i| !i.ipv6.is_empty()),
            IpAddr::V4(a) if a.is_broadcast() => ifaces.iter().find(|i| !i.ipv4.is_empty()),
            _ => None,
        });
        let (iface, next_hop) = match direct {
            Some(i) => (i, *dst),
            None => {
                let (gw, idx) = if dst.is_ipv4() { self.gateway_v4? } else { self.gateway_v6? };
                (ifaces.get(idx as usize)?, gw)
            }
        };
        let src = match src {
            Some(s) if !s.is_unspecified() => *s,
            _ => iface.source_for(dst)?,
        };
        Some(Route { iface: iface.index, next_hop, src, mtu: iface.mtu })
    }
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

//! Which UDP sockets spate carries, from `SPATE_ROUTES` (spate_apps::run's
//! `routes_text`: spate-run writes it, libspate makes it from
//! `SPATE_ARGS` otherwise): a socket bound to one of spate's addresses or
//! to a wildcard, or sending to a destination spate's routes reach; not
//! loopback, not an address only the kernel has.

use std::net::{IpAddr, SocketAddr};

/// What spate carries.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    /// spate's addresses with their prefix lengths.
    nets: Vec<(IpAddr, u8)>,
    /// spate has a default route for IPv4 and for IPv6.
    gateway4: bool,
    gateway6: bool,
    /// Names the lock that keeps one stack per device.
    pub lock: String,
}

impl Routes {
    /// Reads a `SPATE_ROUTES` line.
    pub fn from_text(text: &str) -> Result<Routes, String> {
        let mut r = Routes::default();
        for word in text.split_whitespace() {
            match word.split_once('=') {
                Some(("net", net)) => {
                    let (addr, len) = net.split_once('/').ok_or_else(|| format!("{word}: no prefix length"))?;
                    let addr: IpAddr = addr.parse().map_err(|e| format!("{word}: {e}"))?;
                    let len: u8 = len.parse().map_err(|e| format!("{word}: {e}"))?;
                    if len > if addr.is_ipv4() { 32 } else { 128 } {
                        return Err(format!("{word}: the prefix is too long"));
                    }
                    r.nets.push((addr, len));
                }
                Some(("lock", name)) => r.lock = name.to_string(),
                None if word == "gateway4" => r.gateway4 = true,
                None if word == "gateway6" => r.gateway6 = true,
                _ => return Err(format!("{word}: not a route")),
            }
        }
        if r.lock.is_empty() {
            return Err("no lock= word".into());
        }
        Ok(r)
    }

    /// Whether a socket bound to `a` is spate's: a wildcard or one of
    /// spate's addresses (an IPv4-mapped one as its IPv4 address).
    pub fn binds(&self, a: &SocketAddr) -> bool {
        let ip = canonical(a.ip());
        ip.is_unspecified() || self.nets.iter().any(|(n, _)| *n == ip)
    }

    /// Whether spate carries datagrams to `a`: not loopback, and on one of
    /// spate's networks or behind its default route.
    pub fn reaches(&self, a: &SocketAddr) -> bool {
        let ip = canonical(a.ip());
        if ip.is_loopback() || ip.is_unspecified() {
            return false;
        }
        let gateway = if ip.is_ipv4() { self.gateway4 } else { self.gateway6 };
        gateway || self.nets.iter().any(|&(n, len)| on_net(n, len, ip))
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it maps.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether `ip` lies in `net`/`len`.
fn on_net(net: IpAddr, len: u8, ip: IpAddr) -> bool {
    let bits = |a: IpAddr| -> (u128, u32) {
        match a {
            IpAddr::V4(a) => (u32::from(a) as u128, 32),
            IpAddr::V6(a) => (u128::from(a), 128),
        }
    };
    let ((n, width), (x, w2)) = (bits(net), bits(ip));
    if width != w2 {
        return false;
    }
    let keep = u32::from(len).min(width);
    let shift = width - keep;
    keep == 0 || (n >> shift) == (x >> shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spate_carries_its_own_addresses_and_what_its_routes_reach() {
        let r = Routes::from_text("net=198.18.0.2/24 net=fd00::2/64 lock=net_null0").unwrap();
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(r.binds(&a("0.0.0.0:53")) && r.binds(&a("[::]:53")));
        assert!(r.binds(&a("198.18.0.2:9")) && r.binds(&a("[::ffff:198.18.0.2]:9")) && r.binds(&a("[fd00::2]:9")));
        assert!(!r.binds(&a("127.0.0.1:9")) && !r.binds(&a("10.1.1.1:9")) && !r.binds(&a("[::1]:9")));
        assert!(
            r.reaches(&a("198.18.0.1:9")) && r.reaches(&a("[fd00::1]:9")) && r.reaches(&a("[::ffff:198.18.0.7]:9"))
        );
        assert!(!r.reaches(&a("127.0.0.1:9")) && !r.reaches(&a("8.8.8.8:53")) && !r.reaches(&a("[2001:db8::1]:53")));
        // The line spate_apps::run's own test has routes_text write.
        let g = Routes::from_text("net=198.18.0.2/24 gateway4 lock=net_pcap0.vA").unwrap();
        assert_eq!(g.lock, "net_pcap0.vA");
        assert!(g.reaches(&a("8.8.8.8:53")) && !g.reaches(&a("127.0.0.1:53")) && !g.reaches(&a("[2001:db8::1]:53")));
        for bad in ["net=nonsense/24 lock=x", "net=10.0.0.1/33 lock=x", "net=10.0.0.1 lock=x", "gateway9 lock=x", ""] {
            assert!(Routes::from_text(bad).is_err(), "{bad}");
        }
    }
}

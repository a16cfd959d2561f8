//! Which UDP sockets spate carries, from the stack flags in `SPATE_ARGS`
//! alone (no stack is built to decide): a socket bound to one of spate's
//! addresses or to a wildcard, or sending to a destination spate's routes
//! reach; not loopback, not an address only the kernel has.

use std::net::{IpAddr, SocketAddr};

use clap::Parser;
use spate::config::{Cidr, StackConfig};
use spate_apps::cli::StackArgs;
use spate_apps::run::split_words;

/// The stack flags, as `SPATE_ARGS` gives them.
#[derive(Debug, Parser)]
#[command(name = "SPATE_ARGS", about = "spate's stack flags")]
struct Flags {
    #[command(flatten)]
    stack: StackArgs,
}

/// What spate carries, and the flags its stack is built from.
#[derive(Debug, Clone)]
pub struct Routes {
    /// The flags, `argv[0]` first, for `spate_init`.
    pub args: Vec<String>,
    /// spate's addresses with their prefixes.
    nets: Vec<Cidr>,
    /// spate has a default route for IPv4 and for IPv6.
    gateway4: bool,
    gateway6: bool,
    /// The devices, to name the lock that keeps one stack per device.
    pub devices: Vec<String>,
}

impl Routes {
    /// Reads the flags (`SPATE_ARGS`, split as a shell splits words).
    pub fn from_args(text: &str) -> Result<Routes, String> {
        let mut args = vec!["spate-run".to_string()];
        args.extend(split_words(text)?);
        let flags = Flags::try_parse_from(&args).map_err(|e| e.to_string())?;
        let cfg: StackConfig = flags.stack.to_config().map_err(|e| e.to_string())?;
        let nets: Vec<Cidr> = cfg.ports.iter().flat_map(|p| p.ipv4.iter().chain(&p.ipv6)).copied().collect();
        Ok(Routes {
            args,
            nets,
            gateway4: cfg.gateways.iter().any(IpAddr::is_ipv4),
            gateway6: cfg.gateways.iter().any(IpAddr::is_ipv6),
            devices: cfg.ports.iter().map(|p| p.device.clone()).collect(),
        })
    }

    /// Whether a socket bound to `a` is spate's: a wildcard or one of
    /// spate's addresses (an IPv4-mapped one as its IPv4 address).
    pub fn binds(&self, a: &SocketAddr) -> bool {
        let ip = canonical(a.ip());
        ip.is_unspecified() || self.nets.iter().any(|c| c.addr == ip)
    }

    /// Whether spate carries datagrams to `a`: not loopback, and on one of
    /// spate's networks or behind its default route.
    pub fn reaches(&self, a: &SocketAddr) -> bool {
        let ip = canonical(a.ip());
        if ip.is_loopback() || ip.is_unspecified() {
            return false;
        }
        let gateway = if ip.is_ipv4() { self.gateway4 } else { self.gateway6 };
        gateway || self.nets.iter().any(|c| on_net(c, ip))
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it maps.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether `ip` lies in `net`'s prefix.
fn on_net(net: &Cidr, ip: IpAddr) -> bool {
    let bits = |a: IpAddr| -> (u128, u32) {
        match a {
            IpAddr::V4(a) => (u32::from(a) as u128, 32),
            IpAddr::V6(a) => (u128::from(a), 128),
        }
    };
    let ((n, width), (x, w2)) = (bits(net.addr), bits(ip));
    if width != w2 {
        return false;
    }
    let keep = u32::from(net.prefix_len).min(width);
    let shift = width - keep;
    keep == 0 || (n >> shift) == (x >> shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spate_carries_its_own_addresses_and_what_its_routes_reach() {
        let r = Routes::from_args("--vdev net_null0 --ip 198.18.0.2/24 --ip6 fd00::2/64").unwrap();
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(r.binds(&a("0.0.0.0:53")) && r.binds(&a("[::]:53")));
        assert!(r.binds(&a("198.18.0.2:9")) && r.binds(&a("[::ffff:198.18.0.2]:9")) && r.binds(&a("[fd00::2]:9")));
        assert!(!r.binds(&a("127.0.0.1:9")) && !r.binds(&a("10.1.1.1:9")) && !r.binds(&a("[::1]:9")));
        assert!(
            r.reaches(&a("198.18.0.1:9")) && r.reaches(&a("[fd00::1]:9")) && r.reaches(&a("[::ffff:198.18.0.7]:9"))
        );
        assert!(!r.reaches(&a("127.0.0.1:9")) && !r.reaches(&a("8.8.8.8:53")) && !r.reaches(&a("[2001:db8::1]:53")));
        let g = Routes::from_args("--vdev net_null0 --ip 198.18.0.2/24 --gateway 198.18.0.1").unwrap();
        assert!(g.reaches(&a("8.8.8.8:53")) && !g.reaches(&a("127.0.0.1:53")) && !g.reaches(&a("[2001:db8::1]:53")));
        assert!(Routes::from_args("--ip nonsense").is_err());
    }
}

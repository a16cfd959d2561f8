//! The address maps of spate's XDP program on `net_af_xdp` ports that
//! share their interface with the kernel: kept equal to what the
//! interface's frames must reach spate for (its addresses and the groups
//! its sockets joined), at start and after each change. An address the
//! kernel has on the interface too stays the kernel's: spate's IPv6
//! link-local address, made from the MAC both share, is the kernel's
//! unless the kernel's IPv6 is off there.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv6Addr};

use spate_dpdk::xdp::AddressMaps;

use super::Stack;

/// A port's program: its interface's kernel index, its maps and what they
/// hold.
#[derive(Debug)]
pub(crate) struct XdpPort {
    pub if_index: u32,
    pub maps: AddressMaps,
    pub installed: BTreeSet<IpAddr>,
}

/// The IPv6 addresses the kernel has on interface `if_index`
/// (`/proc/net/if_inet6`: address, index, ... per line).
fn kernel_ipv6(if_index: u32) -> Vec<Ipv6Addr> {
    let text = std::fs::read_to_string("/proc/net/if_inet6").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (hex, index) = (f.next()?, u32::from_str_radix(f.next()?, 16).ok()?);
            (index == if_index && hex.len() == 32).then(|| u128::from_str_radix(hex, 16).ok().map(Ipv6Addr::from))?
        })
        .collect()
}

impl Stack {
    /// Makes interface `iface`'s XDP maps (if its port has spate's
    /// program) hold its addresses and groups now; each change logged.
    pub(crate) fn sync_xdp(&self, iface: u16) {
        let mut ports = self.control.xdp.lock().unwrap_or_else(|p| p.into_inner());
        let Some(Some(port)) = ports.get_mut(iface as usize) else { return };
        let net = self.shared.net();
        let Some(ifc) = net.ifaces.get(iface as usize) else { return };
        let kernel = kernel_ipv6(port.if_index);
        let mut want: BTreeSet<IpAddr> = ifc.ipv4_addrs.iter().map(|&a| IpAddr::V4(a)).collect();
        want.extend(ifc.ipv6_addrs.iter().filter(|a| !kernel.contains(a)).map(|&a| IpAddr::V6(a)));
        if let Some(groups) = net.mcast.ifaces.get(iface as usize) {
            want.extend(groups.iter().map(|(g, _)| *g));
        }
        for ip in port.installed.difference(&want).copied().collect::<Vec<_>>() {
            match port.maps.remove(ip) {
                Ok(()) => {
                    port.installed.remove(&ip);
                    log::info!("spate: interface {iface}'s XDP program gives {ip}'s frames back to the kernel");
                }
                Err(e) => log::warn!("spate: interface {iface}'s XDP program: removing {ip}: {e}"),
            }
        }
        for ip in want.difference(&port.installed).copied().collect::<Vec<_>>() {
            match port.maps.insert(ip) {
                Ok(()) => {
                    port.installed.insert(ip);
                    log::info!("spate: interface {iface}'s XDP program gives spate {ip}'s frames");
                }
                Err(e) => log::warn!("spate: interface {iface}'s XDP program: adding {ip}: {e}"),
            }
        }
        for a in ifc.ipv6_addrs.iter().filter(|a| kernel.contains(a)) {
            log::debug!("spate: interface {iface}: {a} is the kernel's too: its frames stay the kernel's");
        }
    }
}

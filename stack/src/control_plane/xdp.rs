//! The address maps of spate's XDP program on `net_af_xdp` ports that
//! share their interface with the kernel: kept equal to what the
//! interface's frames must reach spate for (its addresses and the groups
//! its sockets joined), at start and after each change. An address the
//! kernel had on the interface at start stays the kernel's (warned about
//! but for spate's IPv6 link-local address, which both make from the MAC
//! they share: the kernel's unless its IPv6 is off there).

use std::collections::BTreeSet;
use std::net::IpAddr;

use spate_dpdk::xdp::AddressMaps;

use super::Stack;
use crate::config::is_link_local;

/// A port's program: its maps, what they hold, and the kernel's own
/// addresses on the interface at start.
#[derive(Debug)]
pub(crate) struct XdpPort {
    pub maps: AddressMaps,
    pub installed: BTreeSet<IpAddr>,
    pub kernel: Vec<IpAddr>,
    /// The addresses both have, warned about once.
    pub warned: BTreeSet<IpAddr>,
}

impl Stack {
    /// Makes interface `iface`'s XDP maps (if its port has spate's
    /// program) hold its addresses and groups now; each change logged, and
    /// the first failure returned (the others are tried all the same).
    pub(crate) fn sync_xdp(&self, iface: u16) -> std::io::Result<()> {
        let mut ports = self.control.xdp.lock().unwrap_or_else(|p| p.into_inner());
        let Some(Some(port)) = ports.get_mut(iface as usize) else { return Ok(()) };
        let net = self.shared.net();
        let Some(ifc) = net.ifaces.get(iface as usize) else { return Ok(()) };
        let mut first = Ok(());
        let mine = ifc.ipv4_addrs.iter().map(|&a| IpAddr::V4(a)).chain(ifc.ipv6_addrs.iter().map(|&a| IpAddr::V6(a)));
        let mut want = BTreeSet::new();
        for ip in mine {
            if !port.kernel.contains(&ip) {
                want.insert(ip);
            } else if port.warned.insert(ip) {
                if matches!(ip, IpAddr::V6(a) if is_link_local(&a)) {
                    log::info!(
                        "spate: interface {iface}: its link-local address {ip} is the kernel's too (made from the MAC \
                         both use): its frames stay the kernel's, so spate reaches no neighbour or gateway by a \
                         link-local address there; give spate a MAC of its own, or turn the kernel's IPv6 off on it"
                    );
                } else {
                    log::warn!("spate: interface {iface}: the kernel has {ip} too: its frames stay the kernel's");
                }
            }
        }
        if let Some(groups) = net.mcast.ifaces.get(iface as usize) {
            want.extend(groups.iter().map(|(g, _)| *g));
        }
        for ip in port.installed.difference(&want).copied().collect::<Vec<_>>() {
            match port.maps.remove(ip) {
                Ok(()) => {
                    port.installed.remove(&ip);
                    log::info!("spate: interface {iface}'s XDP program gives {ip}'s frames back to the kernel");
                }
                Err(e) => {
                    log::warn!("spate: interface {iface}'s XDP program: removing {ip}: {e}");
                    first = first.and(Err(e));
                }
            }
        }
        for ip in want.difference(&port.installed).copied().collect::<Vec<_>>() {
            match port.maps.insert(ip) {
                Ok(()) => {
                    port.installed.insert(ip);
                    log::info!("spate: interface {iface}'s XDP program gives spate {ip}'s frames");
                }
                Err(e) => {
                    log::warn!("spate: interface {iface}'s XDP program: adding {ip}: {e}");
                    first = first.and(Err(e));
                }
            }
        }
        first
    }
}

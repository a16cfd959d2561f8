//! The multicast filters of ports that do not run promiscuous: the group
//! MACs an interface must hear programmed into its device, so its
//! memberships, its IPv6 solicited-node groups and every host's and
//! node's group reach spate. A device without a list falls back to
//! all-multicast, one without that to promiscuous mode, and one without
//! even that (virtio without a control queue) filters nothing (each said
//! in the log, once); a promiscuous port needs none of it. Spate's own
//! filter in software runs whatever the device does.

use std::net::IpAddr;

use super::Stack;
use crate::iface::Interface;
use crate::mcast::report::{ALL_HOSTS, group_mac};
use crate::wire::ipv6;

/// How a non-promiscuous port hears its groups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeviceFilter {
    /// The port's multicast address list.
    #[default]
    List,
    /// All-multicast mode (the device keeps no list).
    AllMulticast,
    /// Promiscuous mode (the device has neither).
    Promiscuous,
    /// None: the device has no receive filter to set, not even
    /// promiscuous mode, and hands over every frame (`net_virtio_user`
    /// without a control queue, as OVS-DPDK's vhost-user ports offer it).
    Unfiltered,
}

impl Stack {
    /// Programs interface `iface`'s port with the group MACs it must hear
    /// now, when the port is configured not promiscuous. Each fallback is
    /// logged: the port then hears more than it needs, never less.
    pub(crate) fn sync_multicast_filter(&self, iface: u16) {
        let Some(spec) = self.shared.cfg.ports.get(iface as usize) else { return };
        let Some(port) = self.shared.ports.get(iface as usize) else { return };
        if spec.promiscuous {
            return;
        }
        let mut modes = self.control.filters.lock().unwrap_or_else(|p| p.into_inner());
        if modes.len() <= iface as usize {
            modes.resize(iface as usize + 1, DeviceFilter::List);
        }
        let macs = self.multicast_macs(iface);
        if modes[iface as usize] == DeviceFilter::List {
            match port.set_mc_addr_list(&macs) {
                Ok(()) => return,
                Err(e) => {
                    log::info!("{e}: all-multicast mode for its groups instead");
                    modes[iface as usize] = DeviceFilter::AllMulticast;
                }
            }
        }
        if modes[iface as usize] == DeviceFilter::AllMulticast {
            match port.set_allmulticast(true) {
                Ok(()) => return,
                Err(e) => {
                    log::info!("{e}: promiscuous mode for its groups instead");
                    modes[iface as usize] = DeviceFilter::Promiscuous;
                }
            }
        }
        if modes[iface as usize] == DeviceFilter::Promiscuous
            && let Err(e) = port.set_promiscuous(true)
        {
            log::info!("{e}: the device filters nothing, spate's filter does the work");
            modes[iface as usize] = DeviceFilter::Unfiltered;
        }
    }

    /// How interface `iface`'s port hears its groups (`None` when it runs
    /// promiscuous by configuration).
    pub(crate) fn device_filter(&self, iface: u16) -> Option<DeviceFilter> {
        let spec = self.shared.cfg.ports.get(iface as usize)?;
        if spec.promiscuous {
            return None;
        }
        let modes = self.control.filters.lock().unwrap_or_else(|p| p.into_inner());
        Some(modes.get(iface as usize).copied().unwrap_or_default())
    }

    /// The group MACs interface `iface` must hear now.
    fn multicast_macs(&self, iface: u16) -> Vec<[u8; 6]> {
        let net = self.shared.net();
        let joined: Vec<IpAddr> =
            net.mcast.ifaces.get(iface as usize).map(|g| g.iter().map(|(g, _)| *g).collect()).unwrap_or_default();
        net.ifaces.get(iface as usize).map_or_else(Vec::new, |ifc| group_macs(ifc, &joined))
    }
}

/// The group MACs interface `ifc` must hear with the groups `joined`:
/// theirs, every host's (224.0.0.1), every node's (ff02::1) when it has
/// IPv6, and the solicited-node group of each of its IPv6 addresses
/// (neighbour discovery asks there); sorted, each once.
fn group_macs(ifc: &Interface, joined: &[IpAddr]) -> Vec<[u8; 6]> {
    let mut groups: Vec<IpAddr> = vec![IpAddr::V4(ALL_HOSTS)];
    if !ifc.ipv6.is_empty() {
        groups.push(IpAddr::V6(ipv6::ALL_NODES));
    }
    for c in &ifc.ipv6 {
        if let IpAddr::V6(a) = c.addr {
            groups.push(IpAddr::V6(ipv6::solicited_node(&a)));
        }
    }
    groups.extend_from_slice(joined);
    let mut macs: Vec<[u8; 6]> = groups.iter().map(|g| group_mac(g).0).collect();
    macs.sort();
    macs.dedup();
    macs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interface_hears_its_groups_and_neighbour_discoverys() {
        let v4_only = Interface::new(
            0,
            0,
            "p0".into(),
            crate::wire::MacAddr::ZERO,
            1500,
            None,
            &["198.18.0.2/24".parse().unwrap()],
            &[],
        );
        let g: IpAddr = "239.1.2.3".parse().unwrap();
        assert_eq!(group_macs(&v4_only, &[g]), vec![[1, 0, 0x5e, 0, 0, 1], [1, 0, 0x5e, 1, 2, 3]]);
        let dual = Interface::new(
            0,
            0,
            "p0".into(),
            crate::wire::MacAddr::ZERO,
            1500,
            None,
            &["198.18.0.2/24".parse().unwrap()],
            &["fd00::2:abcd/64".parse().unwrap()],
        );
        let macs = group_macs(&dual, &[g, "ff0e::7".parse().unwrap(), g]);
        // fd00::2:abcd's solicited-node group ff02::1:ff02:abcd; the
        // link-local address the interface made has its own.
        for want in [
            [0x33, 0x33, 0, 0, 0, 1],
            [0x33, 0x33, 0xff, 0x02, 0xab, 0xcd],
            [0x33, 0x33, 0, 0, 0, 7],
            [1, 0, 0x5e, 1, 2, 3],
        ] {
            assert!(macs.contains(&want), "{want:02x?} in {macs:02x?}");
        }
        assert_eq!(macs.len(), 2 + dual.ipv6.len() + 2, "{macs:02x?}");
    }
}

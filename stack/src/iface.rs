//! Interfaces: a port with its MAC, MTU, VLAN, addresses and offloads.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::config::{Cidr, is_link_local};
use crate::wire::{MacAddr, ipv6};

/// One interface as the stack sees it: a port, or the inner side of a
/// tunnel. Its addresses may change while the stack runs (each change
/// publishes a new copy, see `Stack::add_address`); the rest is fixed
/// when the stack is built.
#[derive(Debug, Clone)]
pub struct Interface {
    /// Index among the stack's interfaces (ports first, then tunnels).
    pub index: u16,
    /// DPDK port id (`u16::MAX` for a tunnel).
    pub port_id: u16,
    /// DPDK port name.
    pub name: String,
    /// MAC address.
    pub mac: MacAddr,
    /// MTU (IP packet size).
    pub mtu: u16,
    /// VLAN tag to send and expect.
    pub vlan: Option<u16>,
    /// IPv4 addresses.
    pub ipv4: Vec<Cidr>,
    /// The addresses of `ipv4` alone, and their subnet broadcast addresses
    /// (kept to spare the datapath the conversions and arithmetic).
    pub ipv4_addrs: Vec<Ipv4Addr>,
    /// See `ipv4_addrs`.
    pub ipv4_broadcast: Vec<Ipv4Addr>,
    /// With one IPv4 address (the common case), it and its subnet's
    /// broadcast address (the limited one for a /31 or /32), each as the
    /// wire's four bytes read in the machine's order: the fast path's
    /// test, with no byte swap and no slice. 0 with none or several.
    sole_ipv4: [u32; 2],
    /// IPv6 addresses, the link-local one first.
    pub ipv6: Vec<Cidr>,
    /// The addresses of `ipv6` alone, as the receive path compares them.
    pub ipv6_addrs: Vec<Ipv6Addr>,
    /// The port checks IPv4/UDP checksums on receive.
    pub rx_checksum: bool,
    /// The port computes IPv4/UDP checksums on transmit.
    pub tx_checksum: bool,
    /// The kernel hands the port its frames as they were sent
    /// (`net_af_packet`, `net_af_xdp`): a sender on the same host (a veth
    /// peer with TX checksum offload on) may leave a UDP checksum to an
    /// offload that never runs, the field holding the pseudo-header's sum.
    pub partial_checksums: bool,
    /// Every how many ns lcore 0 reports the interface's groups unasked
    /// (a `net_af_xdp` port beside the kernel, whose queries the kernel
    /// gets); 0: only when asked and when they change.
    pub report_refresh_ns: u64,
    /// For a tunnel's inner interface: where its frames go.
    pub tunnel: Option<Tunnel>,
}

/// The outer side of a VXLAN inner interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tunnel {
    /// VXLAN network identifier.
    pub vni: u32,
    /// The remote endpoint.
    pub remote: SocketAddr,
    /// The UDP port spate receives on.
    pub local_port: u16,
    /// The interface the outer packets leave by.
    pub outer: u16,
    /// The outer source address.
    pub local: IpAddr,
}

impl Interface {
    /// An interface with `ipv4` and `ipv6` (a link-local address from the
    /// MAC is put first when there is IPv6).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        index: u16,
        port_id: u16,
        name: String,
        mac: MacAddr,
        mtu: u16,
        vlan: Option<u16>,
        ipv4: &[Cidr],
        ipv6: &[Cidr],
    ) -> Interface {
        let mut v6 = Vec::new();
        if !ipv6.is_empty() {
            v6.push(Cidr { addr: IpAddr::V6(ipv6::link_local_from_mac(&mac)), prefix_len: 64 });
        }
        v6.extend(ipv6.iter().copied());
        let mut iface = Interface {
            index,
            port_id,
            name,
            mac,
            mtu,
            vlan,
            ipv4: ipv4.to_vec(),
            ipv4_addrs: Vec::new(),
            ipv4_broadcast: Vec::new(),
            sole_ipv4: [0; 2],
            ipv6_addrs: Vec::new(),
            ipv6: v6,
            rx_checksum: false,
            tx_checksum: false,
            partial_checksums: false,
            report_refresh_ns: 0,
            tunnel: None,
        };
        iface.derive();
        iface
    }
}

impl Interface {
    /// Whether `a` is one of our IPv4 addresses.
    #[inline]
    pub fn has_ipv4(&self, a: Ipv4Addr) -> bool {
        match &self.ipv4_addrs[..] {
            // One address, the common case: no loop.
            [one] => *one == a,
            all => all.contains(&a),
        }
    }

    /// Whether `a` is the limited broadcast or one of our subnets'
    /// broadcast addresses.
    #[inline]
    pub fn is_ipv4_broadcast(&self, a: Ipv4Addr) -> bool {
        a.is_broadcast()
            || match &self.ipv4_broadcast[..] {
                [one] => *one == a,
                all => all.contains(&a),
            }
    }

    /// Whether an IPv4 datagram from `src` to `dst` (each the wire's four
    /// bytes read in the machine's order) is unicast to one of our
    /// addresses from one that is not a group or broadcast address: what
    /// [`has_ipv4`](Self::has_ipv4), [`Ipv4Addr::is_multicast`] and
    /// [`is_ipv4_broadcast`](Self::is_ipv4_broadcast) answer together.
    #[inline(always)]
    pub fn is_ipv4_unicast_to_us(&self, src: u32, dst: u32) -> bool {
        if src.to_ne_bytes()[0] & 0xf0 == 0xe0 || src == u32::MAX {
            return false;
        }
        match self.sole_ipv4 {
            [0, _] => {
                let (src, dst) = (Ipv4Addr::from(src.to_ne_bytes()), Ipv4Addr::from(dst.to_ne_bytes()));
                self.has_ipv4(dst) && !self.is_ipv4_broadcast(src)
            }
            [me, bcast] => dst == me && src != bcast,
        }
    }

    /// Whether `a` is one of our IPv6 addresses.
    #[inline]
    pub fn has_ipv6(&self, a: &Ipv6Addr) -> bool {
        self.ipv6_addrs.contains(a)
    }

    /// Whether an IPv6 packet to `a` is ours: our addresses, their
    /// solicited-node groups, and all-nodes.
    #[inline]
    pub fn accepts_ipv6(&self, a: &Ipv6Addr) -> bool {
        if a.is_multicast() {
            return *a == ipv6::ALL_NODES
                || self.ipv6.iter().any(|c| matches!(c.addr, IpAddr::V6(me) if ipv6::is_solicited_node_of(a, &me)));
        }
        self.has_ipv6(a)
    }

    /// Whether a frame to `dst` is for this interface.
    #[inline]
    pub fn accepts_mac(&self, dst: &MacAddr) -> bool {
        // Groups' frames: the IP layer keeps those of groups joined.
        *dst == self.mac
            || dst.is_broadcast()
            || (dst.0[0] == 0x33 && dst.0[1] == 0x33)
            || (dst.0[0] == 0x01 && dst.0[1] == 0x00 && dst.0[2] == 0x5e)
    }

    /// The source address for a packet to `dst`: one on the same prefix
    /// if there is one, else the first of the family (for IPv6, the
    /// link-local address only toward link-local destinations).
    pub fn source_for(&self, dst: &IpAddr) -> Option<IpAddr> {
        match dst {
            IpAddr::V4(_) => self.ipv4.iter().find(|c| c.contains(dst)).or(self.ipv4.first()).map(|c| c.addr),
            IpAddr::V6(d) => {
                let ll = is_link_local(d);
                let pick = |c: &&Cidr| matches!(c.addr, IpAddr::V6(a) if is_link_local(&a) == ll);
                self.ipv6.iter().filter(pick).find(|c| c.contains(dst)).or(self.ipv6.iter().find(pick)).map(|c| c.addr)
            }
        }
    }

    /// Whether `dst` is on one of this interface's prefixes.
    pub fn on_link(&self, dst: &IpAddr) -> bool {
        self.ipv4.iter().chain(&self.ipv6).any(|c| c.contains(dst))
    }

    /// The link-local IPv6 address.
    pub fn link_local(&self) -> Ipv6Addr {
        ipv6::link_local_from_mac(&self.mac)
    }

    /// Adds an address (the link-local one first, with the interface's
    /// first IPv6 address); false when it has it already.
    pub fn add_address(&mut self, c: Cidr) -> bool {
        match c.addr {
            IpAddr::V4(a) => {
                if self.ipv4_addrs.contains(&a) {
                    return false;
                }
                self.ipv4.push(c);
            }
            IpAddr::V6(a) => {
                if self.ipv6_addrs.contains(&a) {
                    return false;
                }
                if self.ipv6.is_empty() && !is_link_local(&a) {
                    self.ipv6.push(Cidr { addr: IpAddr::V6(self.link_local()), prefix_len: 64 });
                }
                self.ipv6.push(c);
            }
        }
        self.derive();
        true
    }

    /// Removes an address; false when it has no such address.
    pub fn remove_address(&mut self, ip: &IpAddr) -> bool {
        let list = if ip.is_ipv4() { &mut self.ipv4 } else { &mut self.ipv6 };
        let before = list.len();
        list.retain(|c| c.addr != *ip);
        if list.len() == before {
            return false;
        }
        self.derive();
        true
    }

    /// The address lists the receive path compares, from the prefixes.
    fn derive(&mut self) {
        self.ipv4_addrs = self
            .ipv4
            .iter()
            .filter_map(|c| match c.addr {
                IpAddr::V4(a) => Some(a),
                _ => None,
            })
            .collect();
        self.ipv4_broadcast = self.ipv4.iter().filter_map(|c| c.broadcast()).collect();
        let ne = |a: Ipv4Addr| u32::from_ne_bytes(a.octets());
        self.sole_ipv4 = match (&self.ipv4_addrs[..], &self.ipv4_broadcast[..]) {
            ([one], [bcast]) => [ne(*one), ne(*bcast)],
            ([one], []) => [ne(*one), u32::MAX],
            _ => [0; 2],
        };
        self.ipv6_addrs = self
            .ipv6
            .iter()
            .filter_map(|c| match c.addr {
                IpAddr::V6(a) => Some(a),
                _ => None,
            })
            .collect();
    }
}

//! One port's settings: the device, addresses, routes' neighbours,
//! VXLAN tunnels over it, and the neighbour table's timers.

use std::net::IpAddr;

use serde::Deserialize;

use super::*;
use crate::error::Result;
use crate::wire::MacAddr;

/// One port and what spate is on it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortSpec {
    /// A DPDK virtual device (`net_tap0,iface=spate0,mac=02:53:50:41:54:45`,
    /// `net_pcap0,iface=veth0,phy_mac=1`, `net_virtio_user0,path=...`), a
    /// PCI address (`0000:00:04.0`), or the name of a port that already
    /// exists (for example one end of `Port::wire_pair`).
    pub device: String,
    /// IPv4 addresses with prefix lengths.
    #[serde(default)]
    pub ipv4: Vec<Cidr>,
    /// IPv6 addresses with prefix lengths (a link-local address derived from
    /// the MAC is added).
    #[serde(default)]
    pub ipv6: Vec<Cidr>,
    /// MAC address to set on the port (default: the device's own, or the
    /// `mac=` argument of the device string).
    #[serde(default)]
    pub mac: Option<MacAddr>,
    /// MTU (default: the device's, normally 1500).
    #[serde(default)]
    pub mtu: Option<u16>,
    /// 802.1Q VLAN id: frames are sent tagged and only frames with this tag
    /// are received.
    #[serde(default)]
    pub vlan: Option<u16>,
    /// Use RX checksum offload where the device checks both IPv4 and UDP
    /// checksums (default true; a device with one of them is asked for
    /// neither).
    #[serde(default = "yes")]
    pub rx_checksum_offload: bool,
    /// Use TX checksum offload where the device computes both IPv4 and
    /// UDP checksums (default true; likewise).
    #[serde(default = "yes")]
    pub tx_checksum_offload: bool,
    /// Run the port promiscuous (default true): spate filters frames in
    /// software. Off, the device filters them: spate programs its
    /// multicast list with the groups the interface is in (falling back
    /// to all-multicast, then promiscuous mode, where the device has no
    /// list), and a MAC the device refuses to take still turns
    /// promiscuous mode on.
    #[serde(default = "yes")]
    pub promiscuous: bool,
    /// How the lcores poll this port's queues, where it differs from the
    /// stack's `poll`: an lcore sleeps only when every port it polls is
    /// adaptive (one busy port keeps it polling; an lcore without RX
    /// queues when every port is), and only adaptive ports are configured
    /// with RX interrupts.
    #[serde(default)]
    pub poll: Option<PollMode>,
    /// Neighbours whose MAC is configured (Linux's `ip neigh add ...
    /// permanent`): never solicited, probed, expired or replaced by what
    /// the wire says, so spate can answer a peer that never answers ARP or
    /// neighbour solicitations (`testpmd txonly`, a traffic generator).
    #[serde(default)]
    pub neighbors: Vec<StaticNeighbor>,
}

/// A neighbour entry from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticNeighbor {
    /// The neighbour's address, on one of the port's prefixes (or IPv6
    /// link-local).
    pub ip: IpAddr,
    /// Its MAC (unicast).
    pub mac: MacAddr,
}

fn yes() -> bool {
    true
}

/// The IANA port of VXLAN (RFC 7348).
pub const VXLAN_PORT: u16 = 4789;

fn vxlan_port() -> u16 {
    VXLAN_PORT
}

/// A VXLAN tunnel endpoint (RFC 7348): an inner interface whose Ethernet
/// frames travel in UDP to and from `remote`, with addresses of its own.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VxlanSpec {
    /// The VXLAN network identifier (24 bits).
    pub vni: u32,
    /// The remote tunnel endpoint (reached through the ports' routes).
    pub remote: IpAddr,
    /// The remote's UDP port.
    #[serde(default = "vxlan_port")]
    pub remote_port: u16,
    /// The UDP port spate receives VXLAN on.
    #[serde(default = "vxlan_port")]
    pub local_port: u16,
    /// IPv4 addresses on the inner interface.
    #[serde(default)]
    pub ipv4: Vec<Cidr>,
    /// IPv6 addresses on the inner interface (a link-local one is added).
    #[serde(default)]
    pub ipv6: Vec<Cidr>,
    /// The inner interface's MAC (default: a local one made from the VNI).
    #[serde(default)]
    pub mac: Option<MacAddr>,
    /// The inner MTU (default: the outer one less VXLAN's 50 bytes over
    /// IPv4, 70 over IPv6).
    #[serde(default)]
    pub mtu: Option<u16>,
}

impl VxlanSpec {
    /// A tunnel `vni` to `remote` on the standard port, no addresses yet.
    pub fn new(vni: u32, remote: IpAddr) -> VxlanSpec {
        VxlanSpec {
            vni,
            remote,
            remote_port: VXLAN_PORT,
            local_port: VXLAN_PORT,
            ipv4: Vec::new(),
            ipv6: Vec::new(),
            mac: None,
            mtu: None,
        }
    }

    /// The inner MAC: the configured one, or 02:56:58:xx:xx:xx (`V`, `X`,
    /// then the VNI).
    pub fn inner_mac(&self) -> MacAddr {
        self.mac.unwrap_or(MacAddr([0x02, 0x56, 0x58, (self.vni >> 16) as u8, (self.vni >> 8) as u8, self.vni as u8]))
    }
}

impl PortSpec {
    /// A port on `device`, with no addresses yet.
    pub fn new(device: &str) -> PortSpec {
        PortSpec {
            device: device.into(),
            ipv4: Vec::new(),
            ipv6: Vec::new(),
            mac: None,
            mtu: None,
            vlan: None,
            rx_checksum_offload: true,
            tx_checksum_offload: true,
            promiscuous: true,
            poll: None,
            neighbors: Vec::new(),
        }
    }

    /// Adds a static neighbour: `ip` is at `mac` on this port.
    pub fn neighbor(mut self, ip: IpAddr, mac: MacAddr) -> PortSpec {
        self.neighbors.push(StaticNeighbor { ip, mac });
        self
    }

    /// Adds an address (`198.18.0.2/24` or `fd00::2/64`).
    pub fn addr(mut self, cidr: &str) -> Result<PortSpec> {
        let c: Cidr = cidr.parse()?;
        if c.addr.is_ipv4() {
            self.ipv4.push(c)
        } else {
            self.ipv6.push(c)
        }
        Ok(self)
    }

    /// Whether `device` names a PCI device.
    pub fn is_pci(&self) -> bool {
        let d = self.device.split(',').next().unwrap_or("");
        let parts: Vec<&str> = d.split([':', '.']).collect();
        parts.len() >= 3 && parts.iter().all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_hexdigit()))
    }
}

/// Neighbour-discovery timers and limits (ARP and IPv6 ND alike).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NeighborConfig {
    /// How long a confirmed entry stays reachable, in ms (Linux: 30 s).
    pub reachable_ms: u64,
    /// Interval between solicitations, in ms (Linux: 1 s).
    pub retrans_ms: u64,
    /// Solicitations before giving up (Linux: 3).
    pub probes: u32,
    /// Packets kept per unresolved neighbour (Linux keeps about 100).
    pub pending_max: usize,
    /// Packets kept waiting for resolution in the whole table, so that
    /// sources that never answer cannot take the mempool; `None` (the
    /// default): an eighth of `mempool_size`, or of what the rings leave of
    /// it when that is less. At most half of it.
    pub pending_total: Option<usize>,
    /// Entries kept at most.
    pub max_entries: usize,
    /// An unused stale entry is forgotten after this long, in ms (Linux: 60 s).
    pub gc_stale_ms: u64,
}

impl Default for NeighborConfig {
    fn default() -> Self {
        NeighborConfig {
            reachable_ms: 30_000,
            retrans_ms: 1_000,
            probes: 3,
            pending_max: 64,
            pending_total: None,
            max_entries: 4096,
            gc_stale_ms: 60_000,
        }
    }
}

/// Parses a MAC given in a device string's `mac=` argument, if any.
pub fn mac_from_device(device: &str) -> Option<MacAddr> {
    devarg(device, "mac").and_then(|m| m.parse().ok())
}

/// The value of argument `key` in a device string (`net_af_xdp0,iface=eth0`:
/// `iface` is `eth0`), if it has one.
pub(crate) fn devarg<'a>(device: &'a str, key: &str) -> Option<&'a str> {
    device.split(',').skip(1).find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

//! How a [`Stack`](crate::Stack) is set up: ports and their addresses,
//! routes, lcores, pools and timers; from code or from a TOML file.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::str::FromStr;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::wire::MacAddr;

/// An address with its prefix length, such as `198.18.0.2/24`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    /// The address.
    pub addr: IpAddr,
    /// The prefix length.
    pub prefix_len: u8,
}

impl Cidr {
    /// Whether the IPv4 address `other` (as a number) lies in this prefix.
    #[inline]
    pub fn contains_v4(&self, other: u32) -> bool {
        match self.addr {
            IpAddr::V4(a) => {
                let mask = if self.prefix_len == 0 { 0 } else { u32::MAX << (32 - self.prefix_len as u32) };
                u32::from(a) & mask == other & mask
            }
            IpAddr::V6(_) => false,
        }
    }

    /// Whether `other` lies in this prefix.
    pub fn contains(&self, other: &IpAddr) -> bool {
        match (self.addr, other) {
            (IpAddr::V4(_), IpAddr::V4(b)) => self.contains_v4(u32::from(*b)),
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                let mask = if self.prefix_len == 0 { 0 } else { u128::MAX << (128 - self.prefix_len as u32) };
                u128::from(a) & mask == u128::from(*b) & mask
            }
            _ => false,
        }
    }

    /// The prefix itself: the address with its host bits cleared.
    pub fn network(&self) -> Cidr {
        let addr = match self.addr {
            IpAddr::V4(a) => {
                let mask = if self.prefix_len == 0 { 0 } else { u32::MAX << (32 - self.prefix_len.min(32) as u32) };
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let mask = if self.prefix_len == 0 { 0 } else { u128::MAX << (128 - self.prefix_len.min(128) as u32) };
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        };
        Cidr { addr, prefix_len: self.prefix_len }
    }

    /// The subnet-directed broadcast address (IPv4 prefixes up to /30).
    pub fn broadcast(&self) -> Option<Ipv4Addr> {
        match self.addr {
            IpAddr::V4(a) if self.prefix_len <= 30 => {
                let host = u32::MAX >> self.prefix_len as u32;
                Some(Ipv4Addr::from(u32::from(a) | host))
            }
            _ => None,
        }
    }
}

impl FromStr for Cidr {
    type Err = Error;

    fn from_str(s: &str) -> Result<Cidr> {
        let bad = || Error::Config(format!("{s:?} is not ADDRESS/PREFIX (like 198.18.0.2/24 or fd00::2/64)"));
        let (a, p) = s.split_once('/').ok_or_else(bad)?;
        let addr: IpAddr = a.parse().map_err(|_| bad())?;
        let prefix_len: u8 = p.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix_len > max {
            return Err(bad());
        }
        if addr.is_unspecified() || addr.is_multicast() {
            return Err(Error::Config(format!("{s}: an interface address must be a unicast address")));
        }
        Ok(Cidr { addr, prefix_len })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

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

/// Hugepage use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Hugepages {
    /// Hugepages when the machine offers them.
    #[default]
    Auto,
    /// Hugepages or an error.
    On,
    /// No hugepages.
    Off,
}

/// How the lcores share a port's traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RssMode {
    /// One lcore: nothing to share. Several: `hw` where the port hashes
    /// flows over as many RX queues as lcores, else `sw`.
    #[default]
    Auto,
    /// The port spreads flows over one RX queue per lcore (its RSS hash,
    /// or a device that keeps flows on one queue itself, as
    /// `net_af_packet`'s fanout); an error where it cannot.
    Hw,
    /// One RX queue; the lcore polling it hashes each frame's flow
    /// (spate's keyed flow hash) and hands it to the flow's lcore over a ring.
    Sw,
    /// Each lcore polls a queue of its own and keeps what arrives there
    /// (no flow affinity unless the device provides it).
    Off,
    /// Each lcore polls a queue of its own, trusting the device to keep
    /// each flow on one queue (OVS-DPDK's `tx-steering=hash` in front of a
    /// multi-queue virtio NIC): nothing is hashed or handed over but IP
    /// fragments, which meet on one lcore by addresses and ID, their
    /// datagram then delivered on the lcore its flow arrives on. A flow
    /// seen on two queues is counted (`Steer.FlowMoved`). `auto` never
    /// picks it: a guest cannot see the host's steering.
    Device,
}

impl std::str::FromStr for RssMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<RssMode, String> {
        match s {
            "auto" => Ok(RssMode::Auto),
            "hw" => Ok(RssMode::Hw),
            "sw" => Ok(RssMode::Sw),
            "off" => Ok(RssMode::Off),
            "device" => Ok(RssMode::Device),
            _ => Err(format!("{s:?}: expected auto, hw, sw, off or device")),
        }
    }
}

/// In which order the packet pool reuses the free mbufs that pass its
/// per-lcore caches: those a reader thread frees for the lcore to
/// allocate, or one lcore for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MempoolOrder {
    /// The last freed first (DPDK's lock-free stack mempool driver,
    /// `lf_stack`), while their lines may still be in a cache; where DPDK
    /// would give its default ring (not over a driver the platform or
    /// `--mbuf-pool-ops-name` chose) and the driver is installed.
    #[default]
    Lifo,
    /// The driver DPDK picks (its ring by default: first freed, first
    /// reused).
    Fifo,
}

/// How an lcore polls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PollMode {
    /// Poll without pause: the lowest latency, a whole CPU whatever comes.
    #[default]
    Busy,
    /// Poll while there is work; after 50 us of none, sleep until a frame
    /// (the RX queues' interrupts), a hand-off from another thread or
    /// lcore, or 100 ms pass (the idle lcore's timer tick), and poll
    /// again. Ports without RX interrupts get naps on the hand-off bell
    /// instead, from 1 us doubling to 10 ms. The lcore's callback
    /// (`Stack::run`) is not called while it sleeps.
    Adaptive,
}

impl std::str::FromStr for PollMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<PollMode, String> {
        match s {
            "busy" => Ok(PollMode::Busy),
            "adaptive" => Ok(PollMode::Adaptive),
            other => Err(format!("poll mode {other:?}: busy or adaptive")),
        }
    }
}

/// Everything a stack needs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StackConfig {
    /// The lcores spate polls on, in EAL `-l` syntax (`1`, `0-1`), or in
    /// EAL `--lcores` syntax to let an lcore's thread run on a set of
    /// CPUs (`1@(0-1)`: lcore 1 on CPU 0 or 1, wherever the kernel finds
    /// room; for adaptive polling beside other work).
    pub lcores: String,
    /// How the lcores share the ports' traffic.
    pub rss: RssMode,
    /// Ports.
    pub ports: Vec<PortSpec>,
    /// Default gateways (at most one per family).
    pub gateways: Vec<IpAddr>,
    /// Mbufs in the packet pool.
    pub mempool_size: u32,
    /// Per-lcore mempool cache.
    pub mempool_cache: u32,
    /// In which order the packet pool reuses the free mbufs its per-lcore
    /// caches pass on.
    pub mempool_order: MempoolOrder,
    /// RX descriptors per queue.
    pub rx_desc: u16,
    /// TX descriptors per queue.
    pub tx_desc: u16,
    /// Default socket receive buffer in bytes (Linux: 212,992).
    pub rcvbuf: usize,
    /// What the receive queues of all sockets may hold together, in bytes
    /// (Linux's `udp_mem`), so readers that stall cannot take the mempool;
    /// `None` (the default): what the mbuf budget leaves them, half the
    /// pool's mbufs at most (see [`MbufBudget`]).
    pub udp_mem_bytes: Option<usize>,
    /// What each socket may queue whatever the others hold (Linux's
    /// `udp_rmem_min`, 4 KB there; a datagram here is charged a whole mbuf,
    /// about 2 KB), so a socket whose reader keeps up goes on receiving
    /// while stalled ones hold `udp_mem_bytes`. The queues together hold at
    /// most `udp_mem_bytes` plus this much per socket.
    pub udp_rmem_min: usize,
    /// Neighbour discovery.
    pub neighbor: NeighborConfig,
    /// ICMP errors sent per second, at most (Linux: 1,000).
    pub icmp_rate: u32,
    /// ICMP error burst (Linux: 50).
    pub icmp_burst: u32,
    /// When an lcore found nothing to do for a while, sleep this long (µs)
    /// between polls; 0 polls without pause (lowest latency, one busy core).
    pub idle_sleep_us: u32,
    /// How the lcores poll: `busy` (the default) or `adaptive` (which
    /// makes `idle_sleep_us` moot: it is not used then).
    pub poll: PollMode,
    /// Hugepages.
    pub hugepages: Hugepages,
    /// EAL memory in MiB.
    pub memory_mb: u32,
    /// Extra EAL arguments, passed through.
    pub eal_args: Vec<String>,
    /// Stop when SIGINT or SIGTERM arrives.
    pub stop_on_signal: bool,
    /// Ignore SIGPIPE process-wide (a vhost-user peer that goes away makes
    /// the next write to its socket raise it). spate's and DPDK's threads
    /// block every signal either way; the C API turns this off, leaving
    /// the program's disposition as it was.
    pub ignore_sigpipe: bool,
    /// Send gratuitous ARP / unsolicited NA when the stack starts.
    pub announce: bool,
    /// VXLAN tunnel endpoints, each an inner interface.
    pub vxlan: Vec<VxlanSpec>,
    /// How long a datagram's fragments may take to arrive, in ms (Linux:
    /// 30 s).
    pub reassembly_timeout_ms: u64,
    /// Bytes of fragments (mbuf buffers, both IP families together) an
    /// lcore holds before it drops the oldest datagrams (Linux's
    /// `ipfrag_high_thresh`: 4 MiB); `None` (the default): 4 MiB, or a
    /// quarter of what the rings leave of the pool shared among the lcores
    /// when that is less...
    pub reassembly_high_bytes: Option<usize>,
    /// ...until it holds no more than this (Linux's `ipfrag_low_thresh`;
    /// `None`: three quarters of the high mark).
    pub reassembly_low_bytes: Option<usize>,
    /// Datagrams an lcore reassembles at once at most.
    pub reassembly_datagrams: usize,
    /// How long a learnt path MTU lasts, in seconds (Linux: 600).
    pub pmtu_expiry_secs: u64,
    /// Destinations whose path MTU is kept at most (the table forgets the
    /// oldest when full).
    pub pmtu_max_entries: usize,
    /// A reader blocked in `recv` on an empty queue naps this many µs
    /// (twice at most) before it asks a polling lcore to wake it; 0, the
    /// default, asks at once, as Linux does. While datagrams stream in, the
    /// naps find them and no lcore makes the wake-up system call, which in
    /// a VM interrupts the reader's vCPU and costs the lcore microseconds;
    /// a datagram that arrives during a nap waits for its end (the timer
    /// slack included, about 50 µs more).
    pub reader_nap_us: u32,
    /// Derive the secrets of the stack's keyed hashes (socket tables,
    /// reuseport selection, IPv4 IDs) from this seed instead of the OS's
    /// randomness, so that which flow lands on which socket repeats from run
    /// to run. For benchmarks and tests: a secret others can guess lets a
    /// remote sender aim every flow at one bucket.
    pub hash_seed: Option<u64>,
    /// The stack's name, for operators: its control endpoint is
    /// `NAME.sock` instead of `PID-ID.sock` (letters, digits, `-`, `_`,
    /// `.`; at most 64 bytes).
    pub name: Option<String>,
    /// The control endpoint `spate-stat` reads ([`ControlConfig`]).
    pub control: ControlConfig,
    /// Every socket keeps a histogram of its datagrams' waits from RX
    /// burst to read (`UdpSocket::set_read_delay_histogram`), for
    /// `spate-stat` and the metrics; the lcores then stamp every burst.
    pub read_delay_histograms: bool,
    /// Serve Prometheus metrics at `http://ADDR:PORT/metrics` (a kernel
    /// TCP socket in the process's network namespace, on a thread of the
    /// stack's own); needs the `metrics` feature.
    pub metrics: Option<std::net::SocketAddr>,
}

/// The control endpoint: a unix socket a running stack serves off the
/// datapath, for `spate-stat` and run-time changes of addresses, routes
/// and neighbours. It gives access to everything the stack carries, so it
/// is mode 0600: its owner and root only.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControlConfig {
    /// Whether the stack opens it (default true). Where the folder cannot
    /// be made (not root), the stack runs without it and says so.
    pub enabled: bool,
    /// The folder its socket goes in.
    pub dir: std::path::PathBuf,
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig { enabled: true, dir: "/run/spate".into() }
    }
}

impl Default for StackConfig {
    fn default() -> Self {
        StackConfig {
            lcores: "0".into(),
            rss: RssMode::Auto,
            ports: Vec::new(),
            gateways: Vec::new(),
            mempool_size: 16383,
            mempool_cache: 256,
            mempool_order: MempoolOrder::Lifo,
            rx_desc: 1024,
            tx_desc: 1024,
            rcvbuf: 212_992,
            udp_mem_bytes: None,
            udp_rmem_min: 65_536,
            neighbor: NeighborConfig::default(),
            icmp_rate: 1000,
            icmp_burst: 50,
            idle_sleep_us: 0,
            poll: PollMode::Busy,
            hugepages: Hugepages::Auto,
            memory_mb: 512,
            eal_args: Vec::new(),
            stop_on_signal: true,
            ignore_sigpipe: true,
            announce: true,
            vxlan: Vec::new(),
            reassembly_timeout_ms: 30_000,
            reassembly_high_bytes: None,
            reassembly_low_bytes: None,
            reassembly_datagrams: 1024,
            pmtu_expiry_secs: 600,
            pmtu_max_entries: 1024,
            reader_nap_us: 0,
            hash_seed: None,
            name: None,
            control: ControlConfig::default(),
            metrics: None,
            read_delay_histograms: false,
        }
    }
}

/// Where the pool's mbufs go when every bound is full: the RX rings, the TX
/// rings, the lcores' caches and bursts, then the bounds, and what is left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MbufBudget {
    /// Mbufs in the pool.
    pub pool: usize,
    /// What the RX rings hold (measured once the ports started).
    pub rx_rings: usize,
    /// What the TX rings may keep: the descriptors of ports whose driver
    /// frees a sent mbuf only when it reuses the descriptor (PCI devices,
    /// virtio); drivers that copy the frame or pass it on keep none.
    pub tx_rings: usize,
    /// What the lcores' mempool caches and bursts in hand may hold.
    pub in_flight: usize,
    /// The cap on all receive queues together, in bytes (`udp_mem_bytes`).
    pub udp_mem_bytes: usize,
    /// Packets waiting for address resolution (`neighbor.pending_total`).
    pub pending_total: usize,
    /// Fragments an lcore holds before it evicts
    /// (`reassembly_high_bytes`)...
    pub reassembly_high_bytes: usize,
    /// ...and down to what (`reassembly_low_bytes`).
    pub reassembly_low_bytes: usize,
    /// Mbufs the receive queues hold at the cap.
    pub receive_queues: usize,
    /// Mbufs every lcore's reassembly holds at its high mark.
    pub reassembly: usize,
    /// Mbufs no bound reaches: room for the per-socket floors
    /// (`udp_rmem_min`, the application's to keep within this) and for
    /// packets on their way through the hand-off rings.
    pub spare: usize,
}

impl std::fmt::Display for MbufBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pool {} mbufs: RX rings {}, TX rings {}, caches and bursts {}, receive queues {} ({} bytes), \
             unresolved neighbours {}, reassembly {} ({} bytes per lcore), spare {}",
            self.pool,
            self.rx_rings,
            self.tx_rings,
            self.in_flight,
            self.receive_queues,
            self.udp_mem_bytes,
            self.pending_total,
            self.reassembly,
            self.reassembly_high_bytes,
            self.spare
        )
    }
}

impl StackConfig {
    /// Reads a TOML file.
    pub fn from_file(path: &Path) -> Result<StackConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        Self::from_toml(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
    }

    /// Parses TOML text.
    pub fn from_toml(text: &str) -> Result<StackConfig> {
        toml::from_str(text).map_err(|e| Error::Config(e.to_string()))
    }

    /// Checks what can be checked before any device is touched.
    pub fn validate(&self) -> Result<()> {
        if self.ports.is_empty() {
            return Err(Error::Config("no port configured".into()));
        }
        lcore_ids(&self.lcores)?;
        if let Some(n) = &self.name {
            let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
            // `PID-ID` is what unnamed stacks' endpoints are called.
            let unnamed =
                n.split_once('-').is_some_and(|(pid, _)| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
            if n.is_empty() || n.len() > 64 || !n.chars().all(ok) || n.starts_with('.') || unnamed {
                return Err(Error::Config(format!(
                    "name {n:?}: 1 to 64 letters, digits, '-', '_' or '.', not starting with '.' nor with digits and '-' (unnamed stacks' PID-ID)"
                )));
            }
        }
        for (i, p) in self.ports.iter().enumerate() {
            if p.ipv4.is_empty() && p.ipv6.is_empty() {
                return Err(Error::Config(format!("port {i} ({}) has no address", p.device)));
            }
            if let Some(v) = p.vlan
                && (v == 0 || v >= 4095)
            {
                return Err(Error::Config(format!("VLAN id {v} is outside 1..=4094")));
            }
            if let Some(m) = p.mtu
                && (m < 576 || (m < 1280 && !p.ipv6.is_empty()))
            {
                return Err(Error::Config(format!("MTU {m} is below 576 (1280 with IPv6)")));
            }
            for (k, n) in p.neighbors.iter().enumerate() {
                if n.mac == MacAddr::ZERO || n.mac.0[0] & 1 != 0 {
                    return Err(Error::Config(format!(
                        "port {i}: static neighbour {}: {} is not a unicast MAC",
                        n.ip, n.mac
                    )));
                }
                let on_link = p.ipv4.iter().chain(&p.ipv6).any(|c| c.contains(&n.ip) && c.addr != n.ip)
                    || matches!(n.ip, IpAddr::V6(a) if is_link_local(&a));
                if !on_link {
                    return Err(Error::Config(format!(
                        "port {i}: static neighbour {} is not on any of the port's prefixes (or one of its own addresses)",
                        n.ip
                    )));
                }
                if p.neighbors[..k].iter().any(|m| m.ip == n.ip) {
                    return Err(Error::Config(format!("port {i}: static neighbour {} given twice", n.ip)));
                }
            }
        }
        let (mut v4, mut v6) = (0, 0);
        for g in &self.gateways {
            if g.is_ipv4() {
                v4 += 1
            } else {
                v6 += 1
            }
            let on_link = self.ports.iter().any(|p| p.ipv4.iter().chain(&p.ipv6).any(|c| c.contains(g)))
                || matches!(g, IpAddr::V6(a) if is_link_local(a));
            if !on_link {
                return Err(Error::Config(format!("gateway {g} is not on any configured prefix")));
            }
        }
        if v4 > 1 || v6 > 1 {
            return Err(Error::Config("at most one default gateway per address family".into()));
        }
        if self.mempool_size < 1023 {
            return Err(Error::Config(format!("mempool_size {} is too small (at least 1023)", self.mempool_size)));
        }
        if self.rcvbuf < 4096 {
            return Err(Error::Config("rcvbuf below 4096 bytes".into()));
        }
        if self.udp_mem_bytes.is_some_and(|b| b < 4096) {
            return Err(Error::Config("udp_mem_bytes below 4096 bytes".into()));
        }
        if let Some(n) = self.neighbor.pending_total.filter(|&n| n > self.mempool_size as usize / 2) {
            return Err(Error::Config(format!(
                "neighbor.pending_total {n} is more than half of mempool_size {}: unresolved neighbours could \
                 starve the receive rings",
                self.mempool_size
            )));
        }
        if self.neighbor.max_entries == 0 {
            return Err(Error::Config("neighbor.max_entries must be positive".into()));
        }
        if self.reassembly_low_bytes.zip(self.reassembly_high_bytes).is_some_and(|(l, h)| l > h)
            || self.reassembly_datagrams == 0
        {
            return Err(Error::Config(
                "reassembly_low_bytes must not exceed reassembly_high_bytes, and reassembly_datagrams must be positive"
                    .into(),
            ));
        }
        for (i, t) in self.vxlan.iter().enumerate() {
            if t.vni >= 1 << 24 {
                return Err(Error::Config(format!("VXLAN {i}: VNI {} does not fit 24 bits", t.vni)));
            }
            if t.ipv4.is_empty() && t.ipv6.is_empty() {
                return Err(Error::Config(format!("VXLAN {i} (VNI {}) has no inner address", t.vni)));
            }
            if t.remote.is_unspecified() || t.remote.is_multicast() {
                return Err(Error::Config(format!("VXLAN {i}: remote {} must be a unicast address", t.remote)));
            }
            if self.vxlan[..i].iter().any(|o| o.vni == t.vni && o.local_port == t.local_port) {
                return Err(Error::Config(format!("VXLAN VNI {} on port {} twice", t.vni, t.local_port)));
            }
            if t.mtu.is_some_and(|m| m < 576) {
                return Err(Error::Config(format!("VXLAN {i}: inner MTU below 576")));
            }
        }
        Ok(())
    }
}

/// Whether an IPv6 address is link-local (fe80::/10).
pub fn is_link_local(a: &Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

/// Parses EAL `-l` syntax (`0`, `0-2`, `0,2,4-5`) into sorted lcore ids.
pub fn parse_lcores(list: &str) -> Result<Vec<u32>> {
    parse_list(list, 128)
}

/// Parses `0`, `0-2`, `0,2,4-5` into sorted ids below `max`.
fn parse_list(list: &str, max: u32) -> Result<Vec<u32>> {
    let bad = || Error::Config(format!("lcore list {list:?} is not like 0, 0-1 or 0,2-3"));
    let mut out = Vec::new();
    for part in list.split(',') {
        let part = part.trim();
        if let Some((a, b)) = part.split_once('-') {
            let (a, b): (u32, u32) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
            if a > b || b >= max {
                return Err(bad());
            }
            out.extend(a..=b);
        } else {
            let v: u32 = part.parse().map_err(|_| bad())?;
            if v >= max {
                return Err(bad());
            }
            out.push(v);
        }
    }
    out.sort_unstable();
    out.dedup();
    if out.is_empty() {
        return Err(bad());
    }
    Ok(out)
}

/// The lcore ids of a stack's `lcores`: EAL `-l` syntax, or EAL
/// `--lcores` syntax where lcores take CPU sets (`1@(0-1)`, `1@0`,
/// `(1-2)@(0-3)`; a group of lcores shares the set). Each lcore once.
pub fn lcore_ids(spec: &str) -> Result<Vec<u32>> {
    if !spec.contains(['@', '(']) {
        return parse_lcores(spec);
    }
    let bad = |why: &str| Error::Config(format!("lcores {spec:?}: {why} (like 1, 0-1, 1@(0-1) or (1-2)@(0-3))"));
    // Elements split at the commas outside parentheses.
    let mut elements = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in spec.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                elements.push(&spec[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(bad("unbalanced or nested parentheses"));
        }
    }
    if depth != 0 {
        return Err(bad("unbalanced parentheses"));
    }
    elements.push(&spec[start..]);
    // Lcore ids below 128 (RTE_MAX_LCORE), CPUs below 1024 (CPU_SETSIZE).
    let group = |g: &str, max: u32| -> Result<Vec<u32>> {
        let g = g.trim();
        match g.strip_prefix('(').and_then(|g| g.strip_suffix(')')) {
            Some(inner) => parse_list(inner, max),
            None if g.contains(',') => Err(bad("a list needs parentheses")),
            None => parse_list(g, max),
        }
    };
    let mut out = Vec::new();
    for e in elements {
        let (ids, cpus) = match e.split_once('@') {
            Some((ids, cpus)) => (ids, Some(cpus)),
            None => (e, None),
        };
        let ids = group(ids, 128).map_err(|_| bad(&format!("{ids:?} is not an lcore or a group of them")))?;
        if let Some(cpus) = cpus {
            group(cpus, 1024).map_err(|_| bad(&format!("{cpus:?} is not a CPU or a set of them")))?;
        }
        for id in ids {
            if out.contains(&id) {
                return Err(bad(&format!("lcore {id} is given twice")));
            }
            out.push(id);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Parses a MAC given in a device string's `mac=` argument, if any.
pub fn mac_from_device(device: &str) -> Option<MacAddr> {
    device.split(',').find_map(|kv| kv.strip_prefix("mac=")).and_then(|m| m.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs() {
        let c: Cidr = "198.18.0.2/24".parse().unwrap();
        assert!(c.contains(&"198.18.0.200".parse().unwrap()));
        assert!(!c.contains(&"198.18.1.1".parse().unwrap()));
        assert_eq!(c.broadcast(), Some(Ipv4Addr::new(198, 18, 0, 255)));
        let c6: Cidr = "fd00::2/64".parse().unwrap();
        assert!(c6.contains(&"fd00::99".parse().unwrap()));
        assert!(!c6.contains(&"fd01::1".parse().unwrap()));
        for bad in ["198.18.0.2", "198.18.0.2/33", "fd00::1/129", "0.0.0.0/0", "x/1", "224.0.0.1/4"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn names_that_look_like_an_unnamed_stacks_are_refused() {
        let named = |n: &str| {
            let mut c = StackConfig { name: Some(n.into()), ..StackConfig::default() };
            c.ports.push(PortSpec::new("net_null0").addr("198.18.0.2/24").unwrap());
            c.validate()
        };
        assert!(named("echo-1").is_ok());
        assert!(named("1echo").is_ok());
        assert!(named("123-4").is_err());
        assert!(named("123-x").is_err());
        assert!(named(".hidden").is_err());
    }

    #[test]
    fn lcores() {
        assert_eq!(parse_lcores("1").unwrap(), vec![1]);
        assert_eq!(parse_lcores("0-2,5").unwrap(), vec![0, 1, 2, 5]);
        for bad in ["", "a", "3-1", "0-200", "1,,2"] {
            assert!(parse_lcores(bad).is_err(), "{bad}");
        }
        assert_eq!(lcore_ids("0-1").unwrap(), vec![0, 1]);
        assert_eq!(lcore_ids("1@(0-1)").unwrap(), vec![1]);
        assert_eq!(lcore_ids("2@0,1@(0,1)").unwrap(), vec![1, 2]);
        assert_eq!(lcore_ids("(1-2)@(0-3),4").unwrap(), vec![1, 2, 4]);
        assert_eq!(lcore_ids("1@(200-201)").unwrap(), vec![1], "CPUs past 127");
        assert!(lcore_ids("200@1").is_err(), "lcore ids stay below 128");
        for bad in ["1@", "@1", "1@(0", "1@0,1)", "1@((0))", "1@0,1@1", "1@0,1", "x@1", "1@(a)"] {
            assert!(lcore_ids(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn toml_config() {
        let c = StackConfig::from_toml(
            r#"
            lcores = "1"
            gateways = ["198.18.0.1"]
            [[ports]]
            device = "net_tap0,iface=spate0"
            ipv4 = ["198.18.0.2/24"]
            ipv6 = ["fd00::2/64"]
            poll = "adaptive"
            "#,
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.ports[0].ipv4[0].to_string(), "198.18.0.2/24");
        assert_eq!((c.poll, c.ports[0].poll), (PollMode::Busy, Some(PollMode::Adaptive)));
        assert!(StackConfig::from_toml("bogus = 1").is_err(), "unknown keys are errors");
        assert_eq!(c.mempool_order, MempoolOrder::Lifo, "the default");
        assert_eq!(StackConfig::from_toml("mempool_order = \"fifo\"").unwrap().mempool_order, MempoolOrder::Fifo);
        assert!(StackConfig::from_toml("mempool_order = \"random\"").is_err());
        let off_link = StackConfig { gateways: vec!["10.0.0.1".parse().unwrap()], ..c.clone() };
        assert!(off_link.validate().unwrap_err().to_string().contains("not on any configured prefix"));
        let no_ports = StackConfig { ports: vec![], ..c };
        assert!(no_ports.validate().is_err());
    }

    #[test]
    fn static_neighbors() {
        let c = StackConfig::from_toml(
            r#"
            [[ports]]
            device = "net_tap0,iface=spate0"
            ipv4 = ["198.18.0.2/24"]
            ipv6 = ["fd00::2/64"]
            neighbors = [{ ip = "198.18.0.1", mac = "02:00:00:00:00:01" }, { ip = "fe80::1", mac = "02:00:00:00:00:01" }]
            "#,
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.ports[0].neighbors[0].mac, MacAddr([2, 0, 0, 0, 0, 1]));
        let with = |ip: &str, mac: [u8; 6]| {
            let mut p = c.ports[0].clone();
            p.neighbors = vec![StaticNeighbor { ip: ip.parse().unwrap(), mac: MacAddr(mac) }];
            StackConfig { ports: vec![p], ..c.clone() }.validate().map_err(|e| e.to_string())
        };
        assert!(with("10.0.0.1", [2, 0, 0, 0, 0, 1]).unwrap_err().contains("not on any of the port's prefixes"));
        assert!(with("198.18.0.2", [2, 0, 0, 0, 0, 1]).unwrap_err().contains("not on any"), "our own address");
        assert!(with("198.18.0.1", [1, 0, 0, 0, 0, 1]).unwrap_err().contains("not a unicast MAC"));
        assert!(with("198.18.0.1", [0; 6]).unwrap_err().contains("not a unicast MAC"));
        let mut twice = c.ports[0].clone();
        twice.neighbors.push(twice.neighbors[0]);
        let e = StackConfig { ports: vec![twice], ..c.clone() }.validate().unwrap_err().to_string();
        assert!(e.contains("given twice"), "{e}");
        assert!(StackConfig::from_toml("[[ports]]\ndevice = \"x\"\nneighbors = [{ ip = \"1.2.3.4\" }]").is_err());
    }

    #[test]
    fn device_kinds() {
        assert!(PortSpec::new("0000:00:04.0").is_pci());
        assert!(!PortSpec::new("net_tap0,iface=x").is_pci());
        assert_eq!(
            mac_from_device("net_tap0,iface=x,mac=02:53:50:41:54:45"),
            Some(MacAddr([2, 0x53, 0x50, 0x41, 0x54, 0x45]))
        );
    }
}

//! How a [`Stack`](crate::Stack) is set up: ports and their addresses,
//! routes, lcores, pools and timers; from code or from a TOML file.
//!
//! The files: the stack's settings here ([`StackConfig`], reading and
//! checking them); `port` a port's ([`PortSpec`], VXLAN, neighbours);
//! `cidr` addresses with prefixes; `lcores` lcore lists.

use std::net::IpAddr;
use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::wire::MacAddr;

mod cidr;
mod lcores;
mod port;

pub use cidr::{Cidr, is_link_local};
pub use lcores::{lcore_ids, parse_lcores};
pub(crate) use port::devarg;
pub use port::{NeighborConfig, PortSpec, StaticNeighbor, VXLAN_PORT, VxlanSpec, mac_from_device};

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

/// The longest `poll_idle_us` (10 ms: past that, a busy lcore).
pub const POLL_IDLE_US_MAX: u32 = 10_000;

/// How an lcore polls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PollMode {
    /// Poll without pause: the lowest latency, a whole CPU whatever comes.
    #[default]
    Busy,
    /// Poll while there is work; after `poll_idle_us` (50 us) of none,
    /// or less while the lcore's idle times run longer than that (its
    /// window, tuned as KVM tunes halt polling), sleep until a frame (the
    /// RX queues' interrupts), a hand-off from another thread or lcore
    /// (`Stack::wake_lcore` included), the callback's next turn
    /// (`LcoreCtx::wake_at`) or 100 ms pass (the idle lcore's timer tick),
    /// and poll again. Ports without RX
    /// interrupts get naps on the hand-off bell instead, from 1 us
    /// doubling to 10 ms. The lcore's callback (`Stack::run`) is not
    /// called while it sleeps.
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
    /// With `poll = "adaptive"`: the longest time (µs) an lcore polls
    /// without work before it sleeps, at most [`POLL_IDLE_US_MAX`]. 50
    /// (Linux's `busy_poll` figure) catches a reply or the next request of
    /// an exchange without a wake-up. The lcore's window follows how its
    /// idle times end: one that outlasted a window of the whole
    /// `poll_idle_us`, or one later than `poll_idle_us` and as much again
    /// (that room at least 50 us), closes it (the lcore sleeps at once
    /// after work from then on, but on `net_tap`, which keeps 20 us), and
    /// a second wake-up for work sooner opens it again: a peer that
    /// computes between its datagrams (a QUIC handshake's flights) costs
    /// no polling. 0 sleeps as soon as the lcore is idle, at the cost of a
    /// wake-up per frame.
    pub poll_idle_us: u32,
    /// On a `net_af_xdp` port sharing its interface with the kernel, where
    /// IGMP and MLD queries reach only the kernel: every how many seconds
    /// spate reports its groups unasked, so that a snooping switch or a
    /// router keeps them (their default timeout: 260 s). 0: never.
    pub mcast_refresh_secs: u32,
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
            poll_idle_us: 50,
            mcast_refresh_secs: 60,
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
        if self.poll_idle_us > POLL_IDLE_US_MAX {
            return Err(Error::Config(format!(
                "poll_idle_us = {}: at most {POLL_IDLE_US_MAX} (an idle lcore's poll before it sleeps)",
                self.poll_idle_us
            )));
        }
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

#[cfg(test)]
mod tests;

//! The control endpoint: a unix socket every stack opens by default
//! (`/run/spate/PID-ID.sock`, or `NAME.sock` for a named stack), served by
//! a thread of its own off the datapath, for `spate-stat` and for changes
//! of addresses, routes and neighbours while the stack runs.
//!
//! The protocol is one JSON object a line each way: a [`Request`], then
//! `{"ok": ...}` or `{"error": {"message": ..., "errno": ...}}`. The lcores
//! do nothing for it: a [`Snapshot`] reads the counters, loads and tables
//! they keep anyway.
//!
//! The socket is mode 0600 (its owner and root: the kernel refuses anyone
//! else's connect): it is bound in a private folder and moved into place,
//! so it is never reachable with wider permissions. A socket left by a
//! killed process is found by connecting to it (refused: nobody listens)
//! and replaced; the sockets of processes that no longer exist are swept
//! when a stack starts.
//!
//! The files: the protocol's types here, the capture's stream
//! ([`stream`]: [`CaptureRequest`], [`Message`]), the serving thread and
//! its requests (`server`), what a snapshot reads (`report`), and the
//! client side `spate-stat` and `spate-dump` use ([`Client`], [`find`]).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::unix::net::UnixStream;

use serde::{Deserialize, Serialize};

pub use super::live::Errno;
pub use crate::capture::bpf::Insn;
use crate::stats::{Counter, DelayHistogram};

mod client;
mod report;
mod server;
pub mod stream;

pub use client::{Capture, CaptureStopper, Client, endpoints, find};
pub(crate) use report::{info, snapshot};
#[cfg(feature = "metrics")]
pub(crate) use server::ACCEPT_TICK;
pub(super) use server::open;
pub use stream::{CaptureRequest, CaptureStart, Message};

/// What a client asks (`{"op": "snapshot"}`, `{"op": "add_address",
/// "iface": 0, "addr": "198.18.0.5/24"}`, ...).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Who the stack is ([`Info`]).
    Info,
    /// Everything `spate-stat` shows ([`Snapshot`]).
    Snapshot,
    /// [`Stack::add_address`](crate::Stack::add_address).
    AddAddress {
        /// Interface index.
        iface: u16,
        /// `ADDR/PREFIX`.
        addr: String,
    },
    /// [`Stack::remove_address`](crate::Stack::remove_address).
    RemoveAddress {
        /// Interface index.
        iface: u16,
        /// The address.
        ip: IpAddr,
    },
    /// [`Stack::add_route`](crate::Stack::add_route).
    AddRoute {
        /// `ADDR/PREFIX` (a /0 is the default route).
        dst: String,
        /// The gateway, if any.
        via: Option<IpAddr>,
        /// The interface, if not the gateway's.
        iface: Option<u16>,
    },
    /// [`Stack::remove_route`](crate::Stack::remove_route).
    RemoveRoute {
        /// `ADDR/PREFIX`.
        dst: String,
    },
    /// [`Stack::add_neighbor`](crate::Stack::add_neighbor).
    AddNeighbor {
        /// Interface index.
        iface: u16,
        /// The neighbour's address.
        ip: IpAddr,
        /// Its MAC.
        mac: String,
    },
    /// [`Stack::remove_neighbor`](crate::Stack::remove_neighbor).
    RemoveNeighbor {
        /// Interface index.
        iface: u16,
        /// The neighbour's address.
        ip: IpAddr,
    },
    /// A capture: the answer is a [`CaptureStart`], then the connection
    /// carries the capture's [`Message`]s until the client sends anything
    /// or closes.
    Capture(CaptureRequest),
}

/// The answer to a request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    /// Done, with what was asked for (`null` for a change).
    Ok(serde_json::Value),
    /// Refused.
    Error {
        /// Why.
        message: String,
        /// Linux's errno for it, where there is one.
        errno: Option<i32>,
    },
}

/// Who a stack is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Info {
    /// Its process.
    pub pid: u32,
    /// Its name, if it has one.
    pub name: Option<String>,
    /// Its number in the process (1 for the first).
    pub id: u64,
    /// spate's version.
    pub version: String,
    /// Whether its lcores poll.
    pub running: bool,
    /// TSC cycles per second.
    pub tsc_hz: u64,
    /// The TSC when the snapshot was taken (busy shares are cycle deltas).
    pub tsc: u64,
    /// Its interfaces.
    pub interfaces: Vec<InterfaceInfo>,
}

/// An interface and its addresses now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InterfaceInfo {
    /// Index (ports first, then tunnels).
    pub index: u16,
    /// The DPDK port's name (or the tunnel's).
    pub name: String,
    /// MAC address.
    pub mac: String,
    /// MTU.
    pub mtu: u16,
    /// `ADDR/PREFIX`, IPv4 then IPv6.
    pub addrs: Vec<String>,
}

/// One polling lcore.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LcoreInfo {
    /// Its index among the stack's lcores.
    pub index: usize,
    /// Its EAL lcore id.
    pub lcore: u32,
    /// TSC cycles of loop iterations that did work.
    pub busy_cycles: u64,
    /// Loop iterations.
    pub loops: u64,
    /// Frames it received.
    pub rx_frames: u64,
    /// UDP datagrams it delivered to sockets (IPv4 and IPv6).
    pub datagrams: u64,
}

/// One port: DPDK's statistics.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PortInfo {
    /// Interface index.
    pub index: u16,
    /// DPDK port name.
    pub name: String,
    /// Link up.
    pub link_up: bool,
    /// Link speed in Mbit/s (0: unknown).
    pub speed_mbps: u32,
    /// `rte_eth_stats`: ipackets, opackets, ibytes, obytes, imissed,
    /// ierrors, oerrors, rx_nombuf.
    pub stats: BTreeMap<String, u64>,
    /// The driver's extended statistics.
    pub xstats: BTreeMap<String, u64>,
}

/// One socket, as `ss -u` lists it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SocketInfo {
    /// The socket's id.
    pub id: u64,
    /// `ipv4` or `ipv6` (dual-stack unless `v6only`).
    pub family: String,
    /// Only IPv6.
    pub v6only: bool,
    /// Local address.
    pub local: String,
    /// Connected peer.
    pub peer: Option<String>,
    /// Bound to this interface.
    pub iface: Option<u16>,
    /// The reuseport group it is in (numbered in this snapshot).
    pub reuseport_group: Option<usize>,
    /// Datagrams queued to be read.
    pub queued: usize,
    /// Bytes they are charged (rmem).
    pub queued_bytes: usize,
    /// The receive buffer.
    pub rcvbuf: usize,
    /// Datagrams dropped on a full buffer.
    pub drops: u64,
    /// Times a blocked reader was woken.
    pub reader_wakeups: u64,
    /// UDP GRO on.
    pub gro: bool,
    /// A tunnel endpoint the stack made itself.
    pub tunnel: bool,
    /// Its datagrams' waits from RX burst to read, when it keeps them
    /// (`set_read_delay_histogram`).
    #[serde(default)]
    pub read_delay: Option<DelayInfo>,
}

/// A socket's read-delay histogram.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DelayInfo {
    /// Reads counted.
    pub count: u64,
    /// Their delays' sum, in nanoseconds.
    pub sum_ns: u64,
    /// Per bucket: its upper bound in nanoseconds (exclusive; none for the
    /// last) and how many delays fell in it.
    pub buckets: Vec<(Option<u64>, u64)>,
}

impl DelayInfo {
    /// The bound under which at least `q` (0 to 1) of the delays fell
    /// (`None`: the last, open bucket; or no delays at all).
    pub fn quantile_bound_ns(&self, q: f64) -> Option<u64> {
        let want = (q * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (bound, n) in &self.buckets {
            seen += n;
            if seen >= want {
                return *bound;
            }
        }
        None
    }
}

/// A neighbour entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NeighborInfo {
    /// Interface index.
    pub iface: u16,
    /// Address.
    pub ip: IpAddr,
    /// MAC (none while incomplete).
    pub mac: Option<String>,
    /// INCOMPLETE, REACHABLE, STALE, PROBE or PERMANENT.
    pub state: String,
    /// Packets waiting for it.
    pub waiting: usize,
}

/// A learnt path MTU.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PathMtuInfo {
    /// Destination.
    pub dst: IpAddr,
    /// MTU.
    pub mtu: u16,
    /// Seconds until it expires.
    pub expires_secs: f64,
}

/// Memory: the packet pool, receive queues, reassembly.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemoryInfo {
    /// Mbufs out of the pool.
    pub mbufs_in_use: u32,
    /// The pool's size.
    pub mbufs: u32,
    /// Bytes the receive queues hold, and their limit.
    pub receive_bytes: usize,
    /// See `receive_bytes`.
    pub receive_limit: usize,
    /// Bytes held for reassembly.
    pub reassembly_bytes: u64,
}

/// Everything `spate-stat` shows of a stack.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    /// Who it is.
    pub info: Info,
    /// Every counter, by Linux's name (`UdpInDatagrams`: group and name).
    pub counters: BTreeMap<String, u64>,
    /// The polling lcores.
    pub lcores: Vec<LcoreInfo>,
    /// The ports.
    pub ports: Vec<PortInfo>,
    /// The sockets.
    pub sockets: Vec<SocketInfo>,
    /// The neighbour table.
    pub neighbors: Vec<NeighborInfo>,
    /// Learnt path MTUs.
    pub path_mtus: Vec<PathMtuInfo>,
    /// Memory.
    pub memory: MemoryInfo,
    /// The attached capture, if any.
    #[serde(default)]
    pub capture: Option<CaptureInfo>,
}

/// An attached capture (`spate-dump`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaptureInfo {
    /// Its snap length.
    pub snaplen: u32,
    /// Frames copied so far.
    pub captured: u64,
    /// Frames dropped for want of a free record.
    pub dropped: u64,
}

/// A counter's name as `nstat` prints it: group then name.
pub fn nstat_name(c: Counter) -> String {
    format!("{}{}", c.group(), c.name())
}

/// Writes one reply line.
pub(in crate::setup) fn reply(out: &mut UnixStream, r: &Reply) -> io::Result<()> {
    let mut text = serde_json::to_vec(r).map_err(io::Error::other)?;
    text.push(b'\n');
    out.write_all(&text)
}

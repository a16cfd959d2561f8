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

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Write};
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use super::capture::{CaptureRequest, CaptureStart, Message};
pub use super::live::Errno;
pub use crate::capture::bpf::Insn;
use crate::config::Cidr;
use crate::error::{Error, Result};
use crate::shared::{Listener, ServiceThread, Shared, Stack};
use crate::stats::{Counter, DelayHistogram};
use crate::wire::MacAddr;

/// What a client asks (`{"op": "snapshot"}`, `{"op": "add_address",
/// "iface": 0, "addr": "198.18.0.5/24"}`, ...).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Who the stack is ([`Info`]).
    Info,
    /// Everything `spate-stat` shows ([`Snapshot`]).
    Snapshot,
    /// [`Stack::add_address`].
    AddAddress {
        /// Interface index.
        iface: u16,
        /// `ADDR/PREFIX`.
        addr: String,
    },
    /// [`Stack::remove_address`].
    RemoveAddress {
        /// Interface index.
        iface: u16,
        /// The address.
        ip: IpAddr,
    },
    /// [`Stack::add_route`].
    AddRoute {
        /// `ADDR/PREFIX` (a /0 is the default route).
        dst: String,
        /// The gateway, if any.
        via: Option<IpAddr>,
        /// The interface, if not the gateway's.
        iface: Option<u16>,
    },
    /// [`Stack::remove_route`].
    RemoveRoute {
        /// `ADDR/PREFIX`.
        dst: String,
    },
    /// [`Stack::add_neighbor`].
    AddNeighbor {
        /// Interface index.
        iface: u16,
        /// The neighbour's address.
        ip: IpAddr,
        /// Its MAC.
        mac: String,
    },
    /// [`Stack::remove_neighbor`].
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

/// Connections served at once at most (more are refused).
const MAX_CLIENTS: usize = 16;
/// A request line's length at most.
const MAX_LINE: usize = 64 << 10;
/// How often a waiting connection looks whether the stack is gone.
const READ_TICK: Duration = Duration::from_secs(1);
/// How long `accept` waits before the serving thread looks at its stop
/// flag again (a wake-up connection normally ends the wait at once).
pub(crate) const ACCEPT_TICK: Duration = Duration::from_secs(1);

/// Opens `stack`'s endpoint, unless configured off; where its folder
/// cannot be made (not root), the stack goes on without it, said in the
/// log. A named stack whose socket a running stack serves is an error.
pub(super) fn open(stack: &Stack) -> Result<()> {
    let shared = &stack.shared;
    let cfg = &shared.cfg.control;
    if !cfg.enabled {
        return Ok(());
    }
    if let Err(e) = std::fs::create_dir_all(&cfg.dir) {
        log::warn!("spate: no control endpoint: cannot make {}: {e}", cfg.dir.display());
        return Ok(());
    }
    if let Err(why) = trusted_dir(&cfg.dir) {
        log::warn!("spate: no control endpoint: {}: {why}", cfg.dir.display());
        return Ok(());
    }
    sweep(&cfg.dir);
    let pid = std::process::id();
    let file = match &shared.cfg.name {
        Some(n) => format!("{n}.sock"),
        None => format!("{pid}-{}.sock", shared.id),
    };
    let path = cfg.dir.join(file);
    let (listener, ino) = match bind_private(&path) {
        Ok(l) => l,
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            return Err(Error::Config(format!("control endpoint {}: a running stack serves it", path.display())));
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            log::warn!("spate: no control endpoint: {}: {e}", path.display());
            return Ok(());
        }
        Err(e) => return Err(Error::Config(format!("control endpoint {}: {e}", path.display()))),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (weak, flag) = (Arc::downgrade(shared), stop.clone());
    let thread = super::service_thread("spate-control", move || serve(listener, weak, flag))
        .map_err(|e| Error::Config(format!("control endpoint: no thread: {e}")))?;
    let endpoint =
        ServiceThread { listener: Listener::Unix(path.clone(), ino), stop, thread: Mutex::new(Some(thread)) };
    if shared.endpoint.set(endpoint).is_err() {
        return Err(Error::State("the control endpoint was opened twice".into()));
    }
    log::info!("spate: control endpoint {}", path.display());
    Ok(())
}

/// Binds `path` with mode 0600: in a folder of mode 0700, then linked
/// into place (a link fails where a name exists: of two stacks starting
/// with one name, the second is `AddrInUse`, never silently replacing the
/// first). A stale socket there (nobody listening) is replaced; a live one
/// is `AddrInUse`; anything else there is left alone. Returns the
/// listener and the socket's inode.
fn bind_private(path: &Path) -> io::Result<(UnixListener, u64)> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, "not a socket: left alone"));
        }
        match UnixStream::connect(path) {
            Ok(_) => return Err(io::Error::from(io::ErrorKind::AddrInUse)),
            // Nobody listens: a killed process's.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => std::fs::remove_file(path)?,
            Err(e) => return Err(e),
        }
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let private = dir.join(format!(".bind-{}-{}", std::process::id(), NEXT_BIND.fetch_add(1, Ordering::Relaxed)));
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let result = (|| {
        let inside = private.join("s");
        let listener = UnixListener::bind(&inside)?;
        std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o600))?;
        let ino = std::fs::metadata(&inside)?.ino();
        std::fs::hard_link(&inside, path).map_err(|e| match e.kind() {
            io::ErrorKind::AlreadyExists => io::Error::from(io::ErrorKind::AddrInUse),
            _ => e,
        })?;
        Ok((listener, ino))
    })();
    let _ = std::fs::remove_dir_all(&private);
    result
}

static NEXT_BIND: AtomicUsize = AtomicUsize::new(0);

/// The control folder is this user's or root's, and nobody else may
/// write in it (else another user could put a socket of theirs where
/// clients look, or remove ours).
fn trusted_dir(dir: &Path) -> std::result::Result<(), String> {
    let meta = std::fs::metadata(dir).map_err(|e| e.to_string())?;
    let me = spate_dpdk::process::effective_uid();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(format!("owned by user {}, neither this user ({me}) nor root", meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!("mode {:o}: others may write in it", meta.mode() & 0o7777));
    }
    Ok(())
}

/// Removes the sockets (`PID-ID.sock`) of processes that are gone: only
/// those nobody listens on (a connect refused), whatever their name says.
fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_suffix(".sock")?.split_once('-')?.0.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if UnixStream::connect(e.path()).is_err_and(|err| err.kind() == io::ErrorKind::ConnectionRefused) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Accepts until the stack goes: a thread per connection, at most
/// [`MAX_CLIENTS`] at once. The stack's drop wakes `accept` with a
/// connection; should that miss (the socket's path is gone or another's),
/// the accept timeout ends the wait within [`ACCEPT_TICK`].
fn serve(listener: UnixListener, shared: Weak<Shared>, stop: Arc<AtomicBool>) {
    // Threads started by the EAL's main thread inherit its pinning.
    let _ = spate_dpdk::lcore::unpin_current_thread();
    if socket2::SockRef::from(&listener).set_read_timeout(Some(ACCEPT_TICK)).is_err() {
        return;
    }
    let clients = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Acquire) {
        let mut conn = match listener.accept() {
            Ok((c, _)) if !stop.load(Ordering::Acquire) => c,
            Ok(_) => break,
            // The timeout (EAGAIN), or a connection gone before accept.
            Err(_) => continue,
        };
        if clients.load(Ordering::Relaxed) >= MAX_CLIENTS {
            let _ = reply(&mut conn, &Reply::Error { message: "too many clients".into(), errno: Some(libc::EBUSY) });
            continue;
        }
        clients.fetch_add(1, Ordering::Relaxed);
        let (shared, stop, clients, mine) = (shared.clone(), stop.clone(), clients.clone(), clients.clone());
        let spawned = std::thread::Builder::new().name("spate-control-client".into()).spawn(move || {
            client(conn, &shared, &stop);
            clients.fetch_sub(1, Ordering::Relaxed);
        });
        if spawned.is_err() {
            // The connection went with the closure: its place is free.
            mine.fetch_sub(1, Ordering::Relaxed);
            log::warn!("spate: control endpoint: no thread for a client");
        }
    }
}

/// One connection's requests, until it closes, the stack goes, or a line
/// is not a request.
fn client(conn: UnixStream, shared: &Weak<Shared>, stop: &AtomicBool) {
    if conn.set_read_timeout(Some(READ_TICK)).is_err() {
        return;
    }
    let Ok(mut out) = conn.try_clone() else { return };
    let mut input = BufReader::new(conn);
    let mut line = Vec::new();
    loop {
        match read_line(&mut input, &mut line) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                if stop.load(Ordering::Acquire) || shared.strong_count() == 0 {
                    return;
                }
                continue;
            }
            Err(_) => return,
        }
        let answer = match serde_json::from_slice::<Request>(&line) {
            Ok(Request::Capture(req)) => {
                drop(out);
                return super::capture::session(input.into_inner(), shared, stop, req);
            }
            Ok(req) => match shared.upgrade() {
                Some(s) => handle(&Stack { shared: s }, req),
                None => return,
            },
            Err(e) => Reply::Error { message: format!("not a request: {e}"), errno: Some(libc::EINVAL) },
        };
        line.clear();
        if reply(&mut out, &answer).is_err() {
            return;
        }
    }
}

/// Reads up to a newline into `line` (kept across timeouts); false at
/// the end of the stream.
fn read_line(input: &mut BufReader<UnixStream>, line: &mut Vec<u8>) -> io::Result<bool> {
    loop {
        let buf = input.fill_buf()?;
        if buf.is_empty() {
            return Ok(false);
        }
        let (take, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        line.extend_from_slice(&buf[..take]);
        input.consume(take);
        if line.len() > MAX_LINE {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "request line too long"));
        }
        if done {
            return Ok(true);
        }
    }
}

pub(super) fn reply(out: &mut UnixStream, r: &Reply) -> io::Result<()> {
    let mut text = serde_json::to_vec(r).map_err(io::Error::other)?;
    text.push(b'\n');
    out.write_all(&text)
}

fn handle(stack: &Stack, req: Request) -> Reply {
    let done = |r: io::Result<()>| match r {
        Ok(()) => Reply::Ok(serde_json::Value::Null),
        Err(e) => {
            let code = e.get_ref().and_then(|x| x.downcast_ref::<super::live::Errno>()).map(|x| x.code);
            Reply::Error { message: e.to_string(), errno: e.raw_os_error().or(code) }
        }
    };
    let bad = |what: &str, e: String| Reply::Error { message: format!("{what}: {e}"), errno: Some(libc::EINVAL) };
    let value = |v: serde_json::Result<serde_json::Value>| match v {
        Ok(v) => Reply::Ok(v),
        Err(e) => Reply::Error { message: e.to_string(), errno: None },
    };
    match req {
        Request::Info => value(serde_json::to_value(info(stack))),
        Request::Snapshot => value(serde_json::to_value(snapshot(stack))),
        Request::AddAddress { iface, addr } => match addr.parse::<Cidr>() {
            Ok(c) => done(stack.add_address(iface, c)),
            Err(e) => bad(&addr, e.to_string()),
        },
        Request::RemoveAddress { iface, ip } => done(stack.remove_address(iface, ip)),
        Request::AddRoute { dst, via, iface } => match dst.parse::<Cidr>() {
            Ok(c) => done(stack.add_route(c, via, iface)),
            Err(e) => bad(&dst, e.to_string()),
        },
        Request::RemoveRoute { dst } => match dst.parse::<Cidr>() {
            Ok(c) => done(stack.remove_route(c)),
            Err(e) => bad(&dst, e.to_string()),
        },
        Request::AddNeighbor { iface, ip, mac } => match mac.parse::<MacAddr>() {
            Ok(m) => done(stack.add_neighbor(iface, ip, m)),
            Err(e) => bad(&mac, e.to_string()),
        },
        Request::RemoveNeighbor { iface, ip } => done(stack.remove_neighbor(iface, ip)),
        // Served by the connection's loop.
        Request::Capture(_) => Reply::Error { message: "not here".into(), errno: Some(libc::EINVAL) },
    }
}

pub(super) fn info(stack: &Stack) -> Info {
    let s = &stack.shared;
    Info {
        pid: std::process::id(),
        name: s.cfg.name.clone(),
        id: s.id,
        version: env!("CARGO_PKG_VERSION").into(),
        running: stack.is_running(),
        tsc_hz: stack.tsc_hz(),
        tsc: spate_dpdk::lcore::tsc(),
        interfaces: stack
            .interfaces()
            .iter()
            .map(|i| InterfaceInfo {
                index: i.index,
                name: i.name.clone(),
                mac: i.mac.to_string(),
                mtu: i.mtu,
                addrs: i.ipv4.iter().chain(&i.ipv6).map(|c| c.to_string()).collect(),
            })
            .collect(),
    }
}

/// Everything at once, off the datapath: locks the tables the lcores take
/// only on their slow paths (the socket table's master copy, the
/// neighbour table, the path-MTU table), none they take per packet.
pub(crate) fn snapshot(stack: &Stack) -> Snapshot {
    let s = &stack.shared;
    let counters = stack.counters();
    let lcores = (0..s.lcores.len())
        .map(|i| {
            let (busy_cycles, loops) = stack.lcore_load(i);
            let c = stack.lcore_counters(i);
            LcoreInfo {
                index: i,
                lcore: s.lcores[i],
                busy_cycles,
                loops,
                rx_frames: c[Counter::RxFrames],
                datagrams: c[Counter::UdpInDatagrams] + c[Counter::Udp6InDatagrams],
            }
        })
        .collect();
    // Not every driver's statistics calls may run on two threads at once
    // (the control endpoint's clients and the metrics endpoint).
    static PORT_STATS: Mutex<()> = Mutex::new(());
    let _one_at_a_time = PORT_STATS.lock().unwrap_or_else(|p| p.into_inner());
    let ports = s
        .ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let st = p.stats().unwrap_or_default();
            let stats = [
                ("ipackets", st.ipackets),
                ("opackets", st.opackets),
                ("ibytes", st.ibytes),
                ("obytes", st.obytes),
                ("imissed", st.imissed),
                ("ierrors", st.ierrors),
                ("oerrors", st.oerrors),
                ("rx_nombuf", st.rx_nombuf),
            ];
            let link = p.link().ok();
            PortInfo {
                index: i as u16,
                name: p.name().to_string(),
                link_up: link.is_some_and(|l| l.up),
                speed_mbps: link.map_or(0, |l| l.speed_mbps),
                stats: stats.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
                xstats: p.xstats().unwrap_or_default().into_iter().collect(),
            }
        })
        .collect();
    let mut bindings = s.sockets.bindings();
    bindings.sort_by_key(|b| (b.local.port(), b.id));
    let mut groups: Vec<(bool, bool, IpAddr, u16, Option<u16>)> = Vec::new();
    let sockets = bindings
        .iter()
        .map(|b| {
            let key = (b.family == crate::lookup::Family::V4, b.v6only, b.bound, b.local.port(), b.iface);
            let reuseport_group = b.reuseport.then(|| match groups.iter().position(|g| *g == key) {
                Some(i) => i,
                None => {
                    groups.push(key);
                    groups.len() - 1
                }
            });
            let q = &b.sock.queue;
            SocketInfo {
                id: b.id,
                family: if b.family == crate::lookup::Family::V4 { "ipv4" } else { "ipv6" }.into(),
                v6only: b.v6only,
                local: b.local.to_string(),
                peer: b.peer.map(|p| p.to_string()),
                iface: b.iface,
                reuseport_group,
                queued: q.queued(),
                queued_bytes: q.rmem(),
                rcvbuf: q.rcvbuf(),
                drops: q.total_drops(),
                reader_wakeups: q.wakeups(),
                gro: b.sock.gro.load(Ordering::Relaxed),
                tunnel: b.sock.tunnel.is_some(),
                read_delay: {
                    let h = &b.sock.read_delay;
                    let counts = h.counts();
                    let count = counts.iter().sum::<u64>();
                    (h.is_on() || count > 0).then(|| DelayInfo {
                        count,
                        sum_ns: h.sum_ns(),
                        buckets: counts.iter().enumerate().map(|(i, n)| (DelayHistogram::bound_ns(i), *n)).collect(),
                    })
                },
            }
        })
        .collect();
    let neighbors = s
        .neigh
        .entries(s.clock.now())
        .into_iter()
        .map(|((iface, ip), mac, state, waiting)| NeighborInfo {
            iface,
            ip,
            mac: mac.map(|m| m.to_string()),
            state: state.into(),
            waiting,
        })
        .collect();
    let path_mtus = s
        .pmtu
        .entries()
        .into_iter()
        .map(|(dst, mtu, left)| PathMtuInfo { dst, mtu, expires_secs: left.as_secs_f64() })
        .collect();
    let (receive_bytes, receive_limit) = stack.receive_memory();
    Snapshot {
        info: info(stack),
        counters: counters.iter().map(|(c, v)| (nstat_name(c), v)).collect(),
        lcores,
        ports,
        sockets,
        neighbors,
        path_mtus,
        memory: MemoryInfo {
            mbufs_in_use: s.pool.in_use(),
            mbufs: s.pool.size(),
            receive_bytes,
            receive_limit,
            reassembly_bytes: stack.reassembly_bytes(),
        },
        capture: s.capture.current().map(|t| {
            let (captured, dropped) = t.totals();
            CaptureInfo { snaplen: t.snaplen(), captured, dropped }
        }),
    }
}

/// A connection to a stack's control endpoint.
#[derive(Debug)]
pub struct Client {
    input: BufReader<UnixStream>,
    output: UnixStream,
}

impl Client {
    /// Connects to the endpoint at `path` (`PermissionDenied` for a user
    /// other than its owner and root).
    pub fn connect(path: &Path) -> io::Result<Client> {
        let s = UnixStream::connect(path)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Client { output: s.try_clone()?, input: BufReader::new(s) })
    }

    /// Sends `req` and reads its answer; a refusal is an error with its
    /// errno.
    pub fn request(&mut self, req: &Request) -> io::Result<serde_json::Value> {
        let mut text = serde_json::to_vec(req).map_err(io::Error::other)?;
        text.push(b'\n');
        self.output.write_all(&text)?;
        let mut line = String::new();
        if self.input.read_line(&mut line)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the stack closed the connection"));
        }
        match serde_json::from_str::<Reply>(&line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))? {
            Reply::Ok(v) => Ok(v),
            Reply::Error { message, errno: Some(n) } => Err(io::Error::new(
                io::Error::from_raw_os_error(n).kind(),
                Errno::new(n, format!("{message} (errno {n})")),
            )),
            Reply::Error { message, errno: None } => Err(io::Error::other(message)),
        }
    }

    /// [`Request::Info`].
    pub fn info(&mut self) -> io::Result<Info> {
        serde_json::from_value(self.request(&Request::Info)?).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// [`Request::Snapshot`].
    pub fn snapshot(&mut self) -> io::Result<Snapshot> {
        serde_json::from_value(self.request(&Request::Snapshot)?)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Attaches a capture ([`Request::Capture`]): the connection carries
    /// its messages from now on.
    pub fn capture(mut self, req: CaptureRequest) -> io::Result<(CaptureStart, Capture)> {
        let start = serde_json::from_value(self.request(&Request::Capture(req))?)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        // Frames may be seconds apart.
        self.output.set_read_timeout(None)?;
        Ok((start, Capture { input: self.input, output: self.output }))
    }
}

/// An attached capture's stream.
#[derive(Debug)]
pub struct Capture {
    input: BufReader<UnixStream>,
    output: UnixStream,
}

impl Capture {
    /// The next message; `None` once the stack closed the stream (after
    /// the last counts, or when it went away).
    pub fn next_message(&mut self) -> io::Result<Option<Message>> {
        Message::read(&mut self.input)
    }

    /// A handle that ends the capture from another thread: the stack
    /// writes what its lcores copied so far, the last counts, and closes.
    pub fn stopper(&self) -> io::Result<CaptureStopper> {
        Ok(CaptureStopper(self.output.try_clone()?))
    }
}

/// Ends a [`Capture`] ([`Capture::stopper`]).
#[derive(Debug)]
pub struct CaptureStopper(UnixStream);

impl CaptureStopper {
    /// Asks the stack to end the capture.
    pub fn stop(&self) -> io::Result<()> {
        (&self.0).write_all(b"\n")
    }
}

/// The endpoints in `dir` that answer, with who they are; stale sockets
/// (nobody listening) are left out, and so are those this user may not
/// open.
pub fn endpoints(dir: &Path) -> Vec<(PathBuf, Info)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<(PathBuf, Info)> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sock"))
        .filter_map(|p| Client::connect(&p).and_then(|mut c| c.info()).ok().map(|i| (p, i)))
        .collect();
    out.sort_by_key(|(_, i)| (i.pid, i.id));
    out
}

/// The endpoint of the stack of process `pid`, or named `name`, or the
/// only one in `dir`.
pub fn find(dir: &Path, pid: Option<u32>, name: Option<&str>) -> io::Result<PathBuf> {
    if let Some(n) = name {
        let p = dir.join(format!("{n}.sock"));
        return if p.exists() {
            Ok(p)
        } else {
            Err(io::Error::new(io::ErrorKind::NotFound, format!("no stack named {n} ({} is not there)", p.display())))
        };
    }
    let all = endpoints(dir);
    let chosen: Vec<&(PathBuf, Info)> = all.iter().filter(|(_, i)| pid.is_none_or(|p| i.pid == p)).collect();
    match (chosen.as_slice(), pid) {
        ([one], _) => Ok(one.0.clone()),
        ([], Some(p)) => {
            Err(io::Error::new(io::ErrorKind::NotFound, format!("no stack of process {p} in {}", dir.display())))
        }
        ([], None) => {
            // Say why when it is the permissions.
            let denied =
                std::fs::read_dir(dir).ok().into_iter().flatten().flatten().any(|e| {
                    UnixStream::connect(e.path()).is_err_and(|err| err.kind() == io::ErrorKind::PermissionDenied)
                });
            let why = if denied { " this user may open (their owner and root only)" } else { "" };
            Err(io::Error::new(io::ErrorKind::NotFound, format!("no running stack{why} in {}", dir.display())))
        }
        (many, _) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} stacks run: choose with --pid or --name ({})",
                many.len(),
                many.iter().map(|(p, i)| format!("pid {} {}", i.pid, p.display())).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::{bind_private, trusted_dir};

    #[test]
    fn a_folder_others_may_write_in_is_not_trusted() {
        let dir = std::env::temp_dir().join(format!("spate-control-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(trusted_dir(&dir), Ok(()));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(trusted_dir(&dir).unwrap_err().contains("others may write"), "{:?}", trusted_dir(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_name_in_use_is_never_taken_over() {
        let dir = std::env::temp_dir().join(format!("spate-control-bind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.sock");
        let (_first, ino) = bind_private(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        let second = bind_private(&path).unwrap_err();
        assert_eq!(second.kind(), std::io::ErrorKind::AddrInUse);
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), ino, "the first stack's socket is still there");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

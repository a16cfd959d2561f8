//! The datapath's shared state: what the lcores and the sockets read and
//! write while packets move: the tables, the pool, the ports, the
//! published view of interfaces, routes and groups ([`Net`]), the
//! per-lcore load figures and inboxes ([`Shared`]), the part of a socket
//! the receive path reaches ([`SocketCore`]), and the hand-off types
//! ([`handoff`]). Built by the setup layer; read by the engine and the
//! sockets, which never reach each other; changed from above by the
//! control plane (`control_plane`: memberships, device filters, the
//! service threads), which the [`Stack`](crate::Stack) handle holds beside it.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_utils::CachePadded;
use spate_dpdk::{Mempool, Port};

use crate::config::StackConfig;
use crate::datagram::Datagram;
use crate::error::{Error, Result};
use crate::iface::Interface;
use crate::ip_id::IpIdGen;
use crate::lookup::SocketTable;
use crate::mcast::McastView;
use crate::neigh::NeighTable;
use crate::route::{Route, Routes};
use crate::rx_queue::SocketQueue;
use crate::stats::StatsRegistry;
use crate::time::{Clock, Instant};

pub(crate) mod doorbell;
pub(crate) mod flow_owners;
pub(crate) mod handoff;
pub(crate) mod inbox;

pub(crate) use handoff::{
    BURST, Direct, GROUP_COPIES, LOCAL_TX, LOCAL_TX_CAPACITY, LOOPED_MAX, Lanes, LocalTx, MCAST_LOOP_MARK,
    PortSteering, Steering, TxPacket, WorkerQueues, mark_mcast_loop,
};

/// The part of a socket the receive path reaches through the socket table.
#[derive(Debug)]
pub(crate) struct SocketCore {
    pub id: u64,
    pub queue: SocketQueue<Datagram>,
    /// A pending error (errno) for the next call, as `SO_ERROR` keeps it.
    pub error: AtomicI32,
    /// The IPv4 ID counter of a connected socket (Linux's `inet_id`).
    pub ident: AtomicU32,
    /// Bumped after every change of the socket's binding (u64::MAX once
    /// closed): an lcore holding an older snapshot sees its pick is stale.
    pub epoch: AtomicU64,
    /// UDP GRO: the socket takes coalesced datagrams (read by the lcores
    /// only while the GRO stage runs, beside `epoch` on one line).
    pub gro: AtomicBool,
    /// The tunnel interface this socket terminates (a VXLAN endpoint the
    /// stack made); `None` for an application's socket.
    pub tunnel: Option<u16>,
    /// The delays from RX burst to read, while the socket keeps them.
    pub read_delay: crate::stats::DelayHistogram,
    /// `IP_MULTICAST_ALL` (and IPv6's): a group this socket did not join
    /// reaches it when the interface is in it (Linux's default, true).
    pub mcast_all: AtomicBool,
}

impl SocketCore {
    /// The stack stopped: its calls fail with `ENETDOWN`, its readers
    /// wait no more.
    fn go_down(&self) {
        self.error.store(libc::ENETDOWN, Ordering::SeqCst);
        self.queue.halt();
    }
}

/// An IGMP or MLD report lcore 0 sends when it is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingReport {
    /// When, on the stack's clock.
    pub due: Instant,
    /// The interface.
    pub iface: u16,
    /// IPv6 (MLD) or IPv4 (IGMP).
    pub v6: bool,
    /// The group; `None`: every group of the family (a general query's
    /// answer).
    pub group: Option<IpAddr>,
    /// A state (answering a query) rather than a change.
    pub current: bool,
    /// A change's repetition (robustness): an IGMPv2 leave or MLDv1 done
    /// goes once, as Linux sends it.
    pub repeat: bool,
    /// A state sent unasked (`mcast_refresh_secs`): no query's answer,
    /// so not held to the answers' rate.
    pub unasked: bool,
}

/// What the lcores keep of IGMP and MLD between queries and reports.
#[derive(Debug, Default)]
pub struct McastTimers {
    /// The reports to send.
    pub reports: Vec<PendingReport>,
    /// The older queriers heard (the version to report in).
    pub queriers: crate::mcast::compat::Queriers,
    /// The answers to queries each interface may still send.
    pub answers: crate::mcast::compat::AnswerLimit,
}

/// Load figures of one lcore, written by it alone.
#[derive(Debug, Default)]
pub struct LcoreLoad {
    /// TSC cycles spent in loop iterations that did some work.
    pub busy_cycles: AtomicU64,
    /// Loop iterations.
    pub loops: AtomicU64,
    /// TSC cycles spent steering received bursts (what an lcore polling a
    /// steered port does for every frame before it processes its own).
    pub steer_cycles: AtomicU64,
    /// Bytes of fragments waiting for reassembly.
    pub reasm_bytes: AtomicU64,
    /// The most `reasm_bytes` has been.
    pub reasm_peak: AtomicU64,
}

/// The interfaces (with their addresses) and the routes, as one value:
/// readers hold a copy while they use it, a change publishes a new one
/// (see [`Shared::net`]).
#[derive(Debug, Clone)]
pub struct Net {
    /// The interfaces, by index.
    pub ifaces: Vec<Interface>,
    /// The routing table.
    pub routes: Routes,
    /// The multicast groups the interfaces and sockets are in.
    pub mcast: Arc<McastView>,
}

impl Net {
    /// Whether `ip` is one of our addresses.
    pub fn is_local(&self, ip: &IpAddr) -> bool {
        self.ifaces.iter().any(|i| match ip {
            IpAddr::V4(a) => i.has_ipv4(*a),
            IpAddr::V6(a) => i.has_ipv6(a),
        })
    }
}

/// State shared by the lcores and the sockets.
#[derive(Debug)]
pub(crate) struct Shared {
    pub id: u64,
    pub cfg: StackConfig,
    /// The bounds on held mbufs, resolved against the pool.
    pub budget: crate::config::MbufBudget,
    /// The interfaces and routes now; replaced whole on a change.
    pub(crate) net: Mutex<Arc<Net>>,
    /// Moves when `net` is replaced: the lcores take the new copy at their
    /// next look at what is published (before any frame that arrives
    /// after the change), sockets look their cached routes up again.
    pub net_gen: CachePadded<AtomicU64>,
    /// Moves after every change the lcores take besides the socket table
    /// (which has its own generation): `net`, the GRO and timestamp
    /// users, the capture tap. An lcore looks at both at the top of a loop
    /// iteration and again after each burst that brought frames, so a
    /// frame that arrives after a change returned is received with it.
    /// Changed through [`published`](Self::published) and the methods
    /// that call it.
    pub(crate) changes: CachePadded<AtomicU64>,
    /// What interfaces never change once built (their MAC, MTU, VLAN,
    /// offloads, tunnel), for code that reads nothing else.
    pub links: Vec<Interface>,
    /// Addresses added while the stack runs, for lcore 0 to announce
    /// (gratuitous ARP, unsolicited neighbour advertisement) at its next
    /// timer; `announce_pending` says there are some.
    pub announce: Mutex<Vec<(u16, IpAddr)>>,
    pub announce_pending: AtomicBool,
    pub neigh: NeighTable<TxPacket>,
    pub sockets: SocketTable<Arc<SocketCore>>,
    pub ip_id: IpIdGen,
    pub stats: StatsRegistry,
    pub load: Box<[CachePadded<LcoreLoad>]>,
    pub inbox: Box<[CachePadded<inbox::Inbox<TxPacket>>]>,
    /// `poll = "adaptive"` for the stack or a port: idle lcores may
    /// sleep, and who gives them work wakes them.
    pub adaptive: bool,
    /// Per lcore: whether it sleeps when idle (every port it polls is
    /// adaptive; with none, the stack is).
    pub sleeps: Vec<bool>,
    /// Per lcore: its side of the sleep hand-off, and the bell that wakes
    /// it (adaptive polling; none otherwise).
    pub doorbells: Box<[CachePadded<doorbell::Doorbell>]>,
    pub bells: Vec<Arc<spate_dpdk::Bell>>,
    pub workers: usize,
    pub lcores: Vec<u32>,
    pub clock: Clock,
    pub next_socket_id: AtomicU64,
    pub next_tx_worker: AtomicUsize,
    /// Sockets with UDP GRO on and registered tunnels: while zero, the
    /// lcores skip the GRO stage. Changed through [`gro_user`](Self::gro_user).
    pub gro_users: CachePadded<AtomicUsize>,
    /// Sockets that asked for receive timestamps: while zero, the lcores
    /// stamp no datagram. Changed through [`stamp_user`](Self::stamp_user).
    pub stamp_users: CachePadded<AtomicUsize>,
    /// Path MTUs learnt from ICMP.
    pub pmtu: crate::frag::pmtu::PathMtu,
    /// The cap on what all sockets' receive queues hold (`udp_mem_bytes`).
    pub rcv_mem: Arc<crate::rx_queue::MemCap>,
    /// Per port id: its interface (ports are few; DPDK numbers them from 0).
    pub(crate) port_iface: Vec<u16>,
    /// Per interface: how its frames are steered in software.
    pub(crate) steered: Vec<PortSteering>,
    /// Where flows arrive, when a port is device-steered.
    pub(crate) flow_owners: Option<flow_owners::FlowOwners>,
    /// Per interface: its TX queues (lcore `i` uses queue `i % n`; only the
    /// first `n` lcores own one).
    pub(crate) tx_queues: Vec<usize>,
    /// Starting and stopping the lcores.
    pub(crate) lifecycle: Lifecycle,
    pub(crate) rng: Mutex<u64>,
    pub(crate) ports: Vec<Port>,
    /// The attached capture (`spate-dump`), if any.
    pub capture: crate::capture::TapSlot,
    /// IGMP and MLD reports to send, for lcore 0's timer
    /// (`mcast_pending` says there are some), the queriers heard and the
    /// answers' rate limit.
    pub mcast_reports: Mutex<McastTimers>,
    pub mcast_pending: AtomicBool,
    // Last: queued packets above must go back to the pool first.
    pub pool: Arc<Mempool>,
}

/// Whether this thread is an lcore of `shared`'s stack inside its
/// run-to-completion callback (its sends go to the lcore's own queue).
pub fn in_callback(shared: &Shared) -> bool {
    LOCAL_TX.with(|l| l.borrow().as_ref().is_some_and(|l| l.stack_id == shared.id))
}

/// Inside a callback of `shared`'s lcores: whether its own queue has room
/// for `n` more packets (none outside one).
pub fn callback_room(shared: &Shared, n: usize) -> Option<bool> {
    LOCAL_TX.with(|l| l.borrow().as_ref().filter(|l| l.stack_id == shared.id).map(|l| l.has_room(n)))
}

impl Shared {
    /// Logs ports whose link went down or came up since the last call
    /// (`seen`: the link-change counts last looked at).
    pub fn log_link_changes(&self, seen: &mut Vec<u64>) {
        seen.resize(self.ports.len(), 0);
        for (i, port) in self.ports.iter().enumerate() {
            let n = port.link_changes();
            if n != seen[i] {
                seen[i] = n;
                let up = port.link_up_by_interrupt();
                log::warn!("spate: port {} link {}", port.name(), if up { "up" } else { "down" });
            }
        }
    }

    /// The interface of a port id.
    #[inline]
    pub fn iface_of_port(&self, port: u16) -> u16 {
        self.port_iface.get(port as usize).copied().unwrap_or(0)
    }

    /// How the interface's frames are steered in software.
    #[inline]
    pub fn iface_steered(&self, iface: u16) -> PortSteering {
        self.steered.get(iface as usize).copied().unwrap_or(PortSteering::None)
    }

    /// How the port's frames are steered in software.
    #[inline]
    pub fn port_steered(&self, port: u16) -> PortSteering {
        self.iface_steered(self.iface_of_port(port))
    }

    /// The lcore that transmits for lcore `idx` on interface `iface`.
    #[inline]
    pub fn tx_owner(&self, iface: usize, idx: usize) -> usize {
        idx % self.tx_queues.get(iface).copied().unwrap_or(1).max(1)
    }

    /// The interfaces and routes now.
    pub fn net(&self) -> Arc<Net> {
        self.net.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The generation of [`net`](Self::net).
    #[inline]
    pub fn net_generation(&self) -> u64 {
        self.net_gen.load(Ordering::Acquire)
    }

    /// Changes the interfaces or routes: `f` edits a copy, which is
    /// published when it returns `Ok`.
    pub fn change_net<T>(&self, f: impl FnOnce(&mut Net) -> std::io::Result<T>) -> std::io::Result<T> {
        let mut cur = self.net.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = Net::clone(&cur);
        let out = f(&mut next)?;
        *cur = Arc::new(next);
        self.net_gen.fetch_add(1, Ordering::AcqRel);
        self.published();
        Ok(out)
    }

    /// Tells the lcores something they take changed (after it changed).
    #[inline]
    pub fn published(&self) {
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// The count of changes [`published`](Self::published).
    #[inline]
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// One socket or tunnel more (`on`) or less that needs the GRO stage.
    pub fn gro_user(&self, on: bool) {
        match on {
            true => self.gro_users.fetch_add(1, Ordering::AcqRel),
            false => self.gro_users.fetch_sub(1, Ordering::AcqRel),
        };
        self.published();
    }

    /// One socket more (`on`) or less that asks for receive timestamps.
    pub fn stamp_user(&self, on: bool) {
        match on {
            true => self.stamp_users.fetch_add(1, Ordering::AcqRel),
            false => self.stamp_users.fetch_sub(1, Ordering::AcqRel),
        };
        self.published();
    }

    /// Attaches a capture's tap; false when one is attached already.
    pub fn attach_capture(&self, tap: Arc<crate::capture::Tap>) -> bool {
        let attached = self.capture.attach(tap);
        self.published();
        attached
    }

    /// Detaches `tap`, if it is the one attached.
    pub fn detach_capture(&self, tap: &Arc<crate::capture::Tap>) {
        self.capture.detach(tap);
        self.published();
    }

    /// Whether `ip` is one of our addresses.
    pub fn is_local(&self, ip: &IpAddr) -> bool {
        self.net().is_local(ip)
    }

    /// Makes the limited broadcast address and `subnets` (broadcast
    /// addresses of interface `iface`'s prefixes) neighbours at the
    /// broadcast MAC for good, as Linux's `NUD_NOARP` entries: a send there
    /// asks nobody.
    pub fn add_broadcast_neighbors(&self, iface: u16, subnets: &[std::net::Ipv4Addr]) {
        for b in subnets.iter().chain([&std::net::Ipv4Addr::BROADCAST]) {
            self.neigh.add_permanent((iface, IpAddr::V4(*b)), crate::wire::MacAddr::BROADCAST);
        }
    }

    /// The route to `dst` in network state `net`, the path MTU applied.
    #[inline]
    pub fn route_in(&self, net: &Net, dst: &IpAddr, src: Option<&IpAddr>) -> Option<Route> {
        let mut r = net.routes.lookup(&net.ifaces, dst, src)?;
        if let Some(mtu) = self.pmtu.get(dst) {
            r.mtu = r.mtu.min(mtu);
        }
        Some(r)
    }

    /// Tells lcore `worker` it has work (queued before this call), should
    /// it be going to sleep or asleep: one fence and a load while polling
    /// is adaptive, nothing otherwise.
    #[inline]
    pub fn wake(&self, worker: usize) {
        if self.adaptive && self.sleeps[worker] && self.doorbells[worker].should_ring() {
            self.bells[worker].ring();
        }
    }

    /// Asks the lcores to stop, waking those asleep.
    pub fn request_stop(&self) {
        self.lifecycle.request_stop();
        for w in 0..self.workers {
            self.wake(w);
        }
    }

    /// Whether the lcores should stop.
    #[inline]
    pub fn should_stop(&self) -> bool {
        self.lifecycle.stop.load(Ordering::Relaxed) || (self.cfg.stop_on_signal && spate_dpdk::signal::stop_requested())
    }

    /// Whether lcores are polling.
    pub fn is_running(&self) -> bool {
        self.lifecycle.running.load(Ordering::Acquire)
    }

    /// Marks the stack stopped (its lcores joined) and wakes the senders
    /// waiting on a full inbox, which give up.
    pub fn stopped(&self) {
        self.lifecycle.stopped();
        self.went_down();
    }

    /// An lcore left its loop (a signal, `stop`): the stack is down until
    /// it runs again. Every socket's calls fail with `ENETDOWN` (its
    /// pending error, kept while the stack is down), readers waiting in
    /// any thread wake and wait no more, and senders waiting for room in
    /// an inbox give up.
    pub fn went_down(&self) {
        let _turn = self.lifecycle.turn();
        self.went_down_turned();
    }

    /// A stop asked of a stack whose lcores do not run: down at once. The
    /// question and the change are one step, so a start running at the
    /// same time either sees it or comes after it.
    pub fn down_if_idle(&self) {
        let _turn = self.lifecycle.turn();
        if !self.is_running() {
            self.went_down_turned();
        }
    }

    fn went_down_turned(&self) {
        if self.lifecycle.down.swap(true, Ordering::SeqCst) {
            return;
        }
        for b in self.sockets.bindings() {
            b.sock.go_down();
        }
        for inbox in self.inbox.iter() {
            inbox.wake();
        }
    }

    /// The lcores start polling again: the sockets' `ENETDOWN` goes.
    pub fn came_up(&self) {
        let _turn = self.lifecycle.turn();
        self.lifecycle.down.store(false, Ordering::SeqCst);
        for b in self.sockets.bindings() {
            let _ = b.sock.error.compare_exchange(libc::ENETDOWN, 0, Ordering::SeqCst, Ordering::SeqCst);
            b.sock.queue.resume();
        }
    }

    /// Whether the stack is down: its lcores stopped, and it has not run
    /// since ([`went_down`](Self::went_down)). A stack not yet run is not.
    pub fn is_down(&self) -> bool {
        self.lifecycle.down.load(Ordering::SeqCst)
    }

    /// Marks `core`, a socket just bound, down with the stack if it is
    /// (after the socket is in the table: a stop running now either sees
    /// it there or is seen here).
    pub fn note_down(&self, core: &SocketCore) {
        let _turn = self.lifecycle.turn();
        if self.is_down() {
            core.go_down();
        }
    }

    /// A random number (xorshift over a seed from the OS, or from
    /// `StackConfig::hash_seed`).
    pub fn random_u32(&self) -> u32 {
        let mut s = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        (*s >> 16) as u32
    }
}

/// Starting and stopping the polling lcores: the setup layer changes it,
/// the lcores and the sockets only read it (through [`Shared`]).
#[derive(Debug)]
pub(crate) struct Lifecycle {
    stop: AtomicBool,
    running: AtomicBool,
    /// The lcores stopped since they last started (`Shared::went_down`).
    down: AtomicBool,
    /// Held while the stack goes down or comes up, or a socket bound
    /// meanwhile takes the state: one at a time.
    down_turn: Mutex<()>,
    /// Each lcore's queue handles while it does not poll.
    queues: Mutex<Vec<Option<WorkerQueues>>>,
}

impl Lifecycle {
    /// Stopped, with the lcores' queue handles.
    pub fn new(queues: Vec<WorkerQueues>) -> Lifecycle {
        Lifecycle {
            stop: AtomicBool::new(false),
            running: AtomicBool::new(false),
            down: AtomicBool::new(false),
            down_turn: Mutex::new(()),
            queues: Mutex::new(queues.into_iter().map(Some).collect()),
        }
    }

    /// Asks the lcores to stop.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// The turn to change whether the stack is down.
    fn turn(&self) -> std::sync::MutexGuard<'_, ()> {
        self.down_turn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lcores have stopped.
    pub fn stopped(&self) {
        self.running.store(false, Ordering::Release);
    }

    /// Marks the stack running and takes every lcore's queue handles (an
    /// error when it runs already).
    pub fn start(&self) -> Result<Vec<WorkerQueues>> {
        let mut q = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        if q.iter().any(Option::is_none) || self.running.swap(true, Ordering::AcqRel) {
            return Err(Error::State("the stack is already running".into()));
        }
        self.stop.store(false, Ordering::SeqCst);
        Ok(q.iter_mut().map(|x| x.take().expect("checked")).collect())
    }

    /// Lcore `idx` stopped polling: its queue handles come back.
    pub fn give_back(&self, idx: usize, q: WorkerQueues) {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())[idx] = Some(q);
    }
}

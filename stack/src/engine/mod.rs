//! The engine: what a polling lcore runs. [`Worker`] is one lcore's
//! state; the receive stages run over each burst in the order the code
//! runs them:
//!
//! 1. burst RX ([`poll`]): a burst from each RX queue, prefetched, steered
//!    to its flow's lcore in software where the port cannot ([`steer`]);
//! 2. classification and validation: the fast path first ([`fast`]: IPv4
//!    or IPv6 UDP to a bound socket, nothing else), then the full path
//!    ([`rx`], which acts on what [`parse`] reads of the frame):
//!    Ethernet, ARP, IPv4, IPv6, fragments (reassembled here, before the
//!    lookup), ICMP ([`icmp`]), IGMP and MLD ([`mcast`]), UDP; every frame
//!    ends in exactly one `Rx` counter; where the UDP datagram lies is an
//!    [`offsets::UdpInFrame`];
//! 3. the socket lookup (in [`rx`]: the lcore's snapshot of the socket
//!    table, the reuseport group's member picked by the flow's hash; a
//!    group address's sockets in [`group`]);
//! 4. the GRO stage ([`gro`]), only while a tunnel or a GRO socket exists
//!    (a flag taken with what is published decides, and the receive path
//!    is built twice, so without them it is the code it was before the
//!    stage existed); it takes the lookup's answer, hands a tunnel's
//!    datagrams to decapsulation ([`vxlan`], the inner frame returned to
//!    the loop as its next frame), coalesces trains for GRO sockets and
//!    passes the rest on. Linux looks the socket up inside its GRO stage;
//!    spate's stage takes the answer of the one lookup each datagram gets;
//! 5. staging and queueing ([`deliver`]): each socket's share of the
//!    burst under one lock, the sockets named for the application's
//!    `ready` list; the iteration's last burst after the callback, which
//!    may take its sockets' datagrams first, without the queue.
//!
//! The stages' rules are written over any [`PacketBuf`](crate::buf::PacketBuf)
//! and return their results: [`parse`] (the full path's reading of a
//! frame), the fast path's `parse_v4`/`parse_v6`, [`gro::Train`]'s rules,
//! [`deliver::Staging`] and [`vxlan::decapsulate`]; their unit tests drive
//! them with frames in memory, no EAL. The `Worker` keeps the device side:
//! queues, the sleeper, rings, the steering hand-off, the pool.
//!
//! Names: `iface` is an interface's index (a `u16`, as the tables key
//! it), `ifc` the [`Interface`](crate::iface::Interface) itself.
//!
//! Transmit ([`tx`]) resolves neighbours through the lcore's [`memo`] and
//! the shared table and sends bursts. The engine reaches the sockets only
//! through the shared state ([`crate::shared`]), never their API.

use std::sync::Arc;

use spate_dpdk::{Burst, Mbuf, RxQueue, TxQueue};

use crate::capture::Tap;
use crate::control_plane::Stack;
use crate::datagram::Datagram;
use crate::frag::reassembly::{Limits, Reassembler};
use crate::lookup::TableSnapshot;
use crate::shared::{BURST, Direct, Net, Shared, SocketCore, Steering, WorkerQueues};
use crate::stats::{Counter, CounterBlock};
use crate::time::Instant;

mod deliver;
mod fast;
mod gro;
mod group;
mod icmp;
mod mcast;
mod memo;
mod offsets;
mod parse;
mod poll;
mod rx;
mod sleep;
mod steer;
#[cfg(test)]
mod testing;
mod tx;
mod vxlan;
mod window;

use memo::{NeighMemo, RateLimit};

/// What the application's per-lcore callback sees.
#[derive(Debug)]
pub struct LcoreCtx<'a> {
    index: usize,
    lcore: u32,
    now: Instant,
    stack: &'a Stack,
    ready: &'a [u64],
    /// The last burst's datagrams, by socket, not yet queued: the
    /// callback may take them ([`recv_staged`](Self::recv_staged)).
    staged: std::cell::RefCell<&'a mut deliver::Staging>,
    snapshot: &'a TableSnapshot<Arc<SocketCore>>,
    /// When the callback wants to run again at the latest.
    wake_at: Option<std::time::Instant>,
}

impl LcoreCtx<'_> {
    /// This lcore's index among the stack's polling lcores (0-based).
    pub fn index(&self) -> usize {
        self.index
    }

    /// The EAL lcore id.
    pub fn lcore_id(&self) -> u32 {
        self.lcore
    }

    /// The stack's clock at the start of this loop iteration.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The stack.
    pub fn stack(&self) -> &Stack {
        self.stack
    }

    /// An lcore on adaptive polling that goes to sleep after this
    /// iteration wakes by `at` at the latest, so that the callback runs
    /// then (its next timer, to the microsecond); one with less than 20
    /// us to go polls on instead. The earliest of this iteration's calls counts;
    /// each iteration starts with none. Busy lcores poll anyway.
    pub fn wake_at(&mut self, at: std::time::Instant) {
        self.wake_at = Some(self.wake_at.map_or(at, |t| t.min(at)));
    }

    /// Ids ([`UdpSocket::id`](crate::UdpSocket::id)) of the sockets this
    /// lcore queued datagrams to since the callback last ran: an
    /// application with many sockets reads only these. The iteration's
    /// last burst is not queued yet: [`recv_staged`](Self::recv_staged)
    /// hands it over.
    pub fn ready(&self) -> &[u64] {
        self.ready
    }
}

/// What the receive path made of a frame.
#[derive(Debug)]
pub(super) enum Step {
    /// Its `Rx` outcome (`RxGroMerged` when a GRO train grew by it);
    /// none when a socket took it (counted as delivered when queued).
    Done(Option<Counter>),
    /// A tunnel's datagram, decapsulated: the inner frame and its
    /// interface, the receive loop's next frame (the outer frame's own
    /// outcome is none). Only the path with the GRO stage gives it.
    Inner(u16, Mbuf),
}

impl Step {
    /// The outcome, on a path without the GRO stage (which never
    /// decapsulates).
    #[inline(always)]
    pub(super) fn outcome(self) -> Option<Counter> {
        match self {
            Step::Done(outcome) => outcome,
            Step::Inner(..) => unreachable!("only the GRO stage decapsulates"),
        }
    }
}

/// One polling lcore's state, private to the engine, by stage.
pub(crate) struct Worker<'s> {
    // Who it is.
    idx: usize,
    lcore: u32,
    shared: &'s Shared,
    stack: &'s Stack,
    counters: &'s CounterBlock,

    // The loop.
    /// The stack's clock at the start of this loop iteration.
    now: Instant,
    next_timer: Instant,
    idle_polls: u32,
    /// Link-change counts of the ports last looked at (lcore 0 logs them).
    link_seen: Vec<u64>,

    // Receive: queues, the socket table's snapshot, the burst's staging.
    rx: Vec<(u16, RxQueue)>,
    snapshot: Arc<TableSnapshot<Arc<SocketCore>>>,
    snap_gen: u64,
    /// [`Shared::changes`] when this lcore last took them (`u64::MAX`
    /// before its first look).
    changes_seen: u64,
    /// The interfaces' addresses and the routes, and their generation:
    /// taken again when it moves.
    net: Arc<Net>,
    net_gen: u64,
    /// Datagrams that found a socket during this burst, by socket: lent to
    /// the callback, and what it leaves queued after it (or before the
    /// next burst is staged).
    staging: deliver::Staging,
    /// Sockets this lcore queued datagrams to since the application's
    /// callback last ran, and a bit per id modulo 64 of those in it.
    ready: Vec<u64>,
    ready_bits: u64,
    /// IPv4 and IPv6 fragments waiting for the rest of their datagram.
    reasm: Reassembler,
    /// Whether some socket asks for receive timestamps (taken with the
    /// rest of what is published).
    stamp: bool,
    /// The sockets a group datagram reaches (kept for its capacity).
    group_matches: Vec<u32>,
    /// Copies of group datagrams made for the burst staged now.
    group_copies: usize,
    /// The wakers of tasks waiting on sockets this burst reached, woken
    /// once it is queued.
    wakers: Vec<std::task::Waker>,

    // The GRO stage and tunnels.
    /// Whether this burst runs the GRO stage (a tunnel or a GRO socket
    /// exists): taken with the rest of what is published.
    gro_active: bool,
    /// Frames taken from the ports so far (a GRO train grows only from one
    /// frame to the very next).
    frame_no: u64,
    /// The coalesced datagram this burst may still grow (UDP GRO), and
    /// the segments waiting to be chained to it.
    train: gro::Train,
    train_segments: Burst<{ gro::MAX_SEGMENTS as usize }>,
    /// Copies of this lcore's own packets to groups for its receive path
    /// (`IP_MULTICAST_LOOP`), with their interface: taken in the next
    /// poll.
    looped: Vec<(u16, Mbuf)>,
    /// Lcore 0: by interface, when it reported its groups unasked last
    /// (interfaces with a `report_refresh_ns`).
    reports_refreshed: Vec<Option<Instant>>,

    // Adaptive polling.
    /// The lcore's sleeps (its bell in its thread's epoll set), when
    /// polling is adaptive.
    sleeper: Option<spate_dpdk::Sleeper>,
    /// Its RX queues all have interrupts or watched descriptors (else it
    /// naps).
    rx_intr: bool,
    /// Per RX queue: its interrupt is registered in the thread's epoll set.
    intr_registered: Vec<bool>,
    /// When the current idle time began.
    idle_since: Option<u64>,
    /// The last idle time has not gone into a sleep (yet): one that ends
    /// so, in work, was caught by the poll (told to the window when the
    /// next begins).
    idle_unslept: bool,
    /// When the callback asked to run again ([`LcoreCtx::wake_at`]).
    app_deadline: Option<std::time::Instant>,
    /// How long it polls idle before it sleeps: up to `poll_idle_us`,
    /// tuned by how its idle times end.
    window: window::PollWindow,
    /// The next nap (no RX interrupts).
    nap_ns: u64,
    /// Descriptors readable while frames wait on a queue whose receive
    /// function may not see them yet (`net_tap`), each with the signal it
    /// sends when it turns readable.
    pending_fds: Vec<(std::os::fd::RawFd, Option<spate_dpdk::sched::IoSignal>)>,
    /// One of them was readable at the last look of this idle time (or
    /// woke the lcore).
    pending_seen: bool,
    /// The last sleep ended for a frame.
    woke_rx: bool,
    /// Nanoseconds asleep in the current idle time.
    asleep_ns: u64,
    /// What the lcore polled of the current idle time before its first
    /// sleep, and whether that was its whole window (not a sleep begun
    /// early for threads waiting for a CPU).
    polled: Option<(u64, bool)>,
    /// The system's run queues, looked at while idle, where the lcore may
    /// run on every CPU.
    run_queue: Option<spate_dpdk::sched::RunQueue>,
    /// When the idle lcore next looks at its pending descriptors and the
    /// run queues.
    next_idle_check: u64,

    // Transmit.
    /// Per port: this lcore's TX queue, or none (it hands its frames to
    /// the lcore owning one).
    tx: Vec<Option<TxQueue>>,
    txbuf: Vec<Burst<BURST>>,
    /// The neighbour the callback's sends finish frames for themselves
    /// (see [`LocalTx`](crate::shared::LocalTx)): the last one the
    /// callback's queued packets found in the memo, until the memo's
    /// entry expires or the neighbour table changes.
    direct: Option<Direct>,
    direct_until: Instant,
    memo: NeighMemo,
    icmp_limit: RateLimit,

    // Several lcores.
    /// Software RSS and the rings to the other lcores (several lcores).
    steer: Option<Steering>,

    // Capture.
    /// The attached capture, taken when the slot's generation moves
    /// (looked at with the rest of what is published).
    tap: Option<Arc<Tap>>,
    tap_gen: u64,
}

impl<'s> Worker<'s> {
    pub fn new(idx: usize, lcore: u32, stack: &'s Stack, queues: WorkerQueues) -> Worker<'s> {
        let shared: &'s Shared = &stack.shared;
        let n_ifaces = queues.tx.len();
        let per_lcore = (shared.cfg.icmp_rate as u64 / shared.workers as u64).max(1);
        Worker {
            idx,
            lcore,
            shared,
            stack,
            rx: queues.rx,
            tx: queues.tx,
            steer: queues.steer,
            link_seen: Vec::new(),
            txbuf: (0..n_ifaces).map(|_| Burst::new()).collect(),
            snapshot: shared.sockets.snapshot(),
            // The first look takes everything again (the snapshot above
            // may be older than the generation read after it).
            snap_gen: u64::MAX,
            changes_seen: u64::MAX,
            net_gen: shared.net_generation(),
            net: Arc::new(Net::clone(&shared.net())),
            memo: NeighMemo::default(),
            icmp_limit: RateLimit::new(per_lcore, shared.cfg.icmp_burst as u64),
            now: shared.clock.now(),
            next_timer: Instant(0),
            direct: None,
            direct_until: Instant(0),
            idle_polls: 0,
            counters: shared.stats.lcore(idx),
            staging: deliver::Staging::new(),
            ready: Vec::with_capacity(64),
            ready_bits: 0,
            gro_active: false,
            stamp: false,
            group_matches: Vec::with_capacity(64),
            group_copies: 0,
            wakers: Vec::with_capacity(64),
            frame_no: 0,
            train: Default::default(),
            train_segments: Burst::new(),
            looped: Vec::new(),
            reports_refreshed: Vec::new(),
            sleeper: None,
            rx_intr: false,
            intr_registered: Vec::new(),
            idle_since: None,
            idle_unslept: false,
            nap_ns: 0,
            app_deadline: None,
            window: window::PollWindow::new(0, 0),
            pending_fds: Vec::new(),
            pending_seen: false,
            woke_rx: false,
            asleep_ns: 0,
            polled: None,
            run_queue: None,
            next_idle_check: 0,
            tap: None,
            tap_gen: 0,
            reasm: Reassembler::new(Limits {
                high: shared.budget.reassembly_high_bytes,
                low: shared.budget.reassembly_low_bytes,
                timeout_ns: shared.cfg.reassembly_timeout_ms * 1_000_000,
                max_datagrams: shared.cfg.reassembly_datagrams,
            }),
        }
    }

    /// Gives the queue handles back (when the loop ends).
    pub fn into_queues(self) -> WorkerQueues {
        WorkerQueues { rx: self.rx, tx: self.tx, steer: self.steer }
    }

    #[inline]
    fn counters(&self) -> &'s CounterBlock {
        self.counters
    }

    #[inline]
    fn inc(&self, c: Counter) {
        self.counters().inc_local(c);
    }

    #[inline]
    fn add(&self, c: Counter, n: u64) {
        self.counters().add_local(c, n);
    }

    /// Whether this burst runs the GRO stage; always false in the
    /// no-gro-stage build, so the compiler drops the stage there.
    #[inline(always)]
    fn gro_stage(&self) -> bool {
        !cfg!(feature = "no-gro-stage") && self.gro_active
    }

    /// Copies `frames` of interface `iface` to the attached capture, if
    /// any.
    #[inline(always)]
    fn tap(&self, iface: u16, outbound: bool, frames: &[Mbuf]) {
        if let Some(t) = &self.tap {
            t.offer(self.idx, self.now.0, iface, outbound, frames);
        }
    }

    /// Stages a datagram for binding `index`, for the callback or the
    /// socket's queue (see [`deliver`]); `v4`: it arrived over IPv4 (its
    /// IP header's family, which its counters follow and which a refusal
    /// or a re-lookup reads back with `Datagram::arrived_v4`). Returns
    /// where it waits (for a GRO train to grow it).
    #[inline(always)]
    fn stage(&mut self, index: u32, v4: bool, d: Datagram) -> (usize, usize) {
        debug_assert_eq!(v4, d.arrived_v4(), "staged as the header's family");
        self.staging.push(index, v4, d)
    }

    /// Stamps the datagrams staged so far with `CLOCK_REALTIME` read now,
    /// after their burst came from the device, while some socket asks for
    /// timestamps: one test per burst otherwise.
    #[inline(always)]
    fn stamp_staged(&mut self) {
        if self.stamp {
            self.staging.stamp(crate::time::realtime_ns());
        }
    }
}

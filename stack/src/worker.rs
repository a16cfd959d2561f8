//! A polling lcore: its queues, its view of the socket table, its
//! neighbour memo, and the loop that runs the pipeline.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use spate_dpdk::{Burst, RxQueue, TxQueue};

use crate::datagram::Datagram;
use crate::lookup::Snapshot;
use crate::rx_queue::Refusal;
use crate::socket::{LOCAL_TX, LOCAL_TX_CAPACITY, LocalTx, SocketCore};
use crate::stack::{Shared, Stack};
use crate::stats::{Counter, CounterBlock};
use crate::time::Instant;
use crate::wire::MacAddr;

/// Burst size of receive and transmit.
pub const BURST: usize = 32;
/// Packets taken from the inbox per loop iteration.
const INBOX_BATCH: usize = 256;
/// Timer period.
const TIMER_NS: u64 = 10_000_000;
/// Empty polls before an idle lcore starts sleeping (when configured to).
const IDLE_POLLS: u32 = 256;

/// Load figures of one lcore, written by it alone.
#[derive(Debug, Default)]
pub struct LcoreLoad {
    /// TSC cycles spent in loop iterations that did some work.
    pub busy_cycles: AtomicU64,
    /// Loop iterations.
    pub loops: AtomicU64,
    /// Bytes of fragments waiting for reassembly.
    pub reasm_bytes: AtomicU64,
    /// The most `reasm_bytes` has been.
    pub reasm_peak: AtomicU64,
}

/// What the application's per-lcore callback sees.
#[derive(Debug)]
pub struct LcoreCtx<'a> {
    index: usize,
    lcore: u32,
    now: Instant,
    stack: &'a Stack,
    ready: &'a [u64],
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

    /// Ids ([`UdpSocket::id`](crate::UdpSocket::id)) of the sockets this
    /// lcore queued datagrams to since the callback last ran: an
    /// application with many sockets reads only these.
    pub fn ready(&self) -> &[u64] {
        self.ready
    }
}

#[derive(Debug, Clone, Copy)]
struct MemoSlot {
    iface: u16,
    ip: IpAddr,
    mac: MacAddr,
    until: Instant,
}

/// Reachable neighbours this lcore resolved recently.
#[derive(Debug, Default)]
pub(crate) struct NeighMemo {
    slots: [Option<MemoSlot>; 16],
    generation: u64,
}

impl NeighMemo {
    fn slot(ip: &IpAddr) -> usize {
        let b = match ip {
            IpAddr::V4(a) => a.octets()[3] ^ a.octets()[2],
            IpAddr::V6(a) => a.octets()[15] ^ a.octets()[14],
        };
        (b & 15) as usize
    }

    #[inline]
    pub fn get(&self, iface: u16, ip: &IpAddr, now: Instant) -> Option<MacAddr> {
        match self.slots[Self::slot(ip)] {
            Some(s) if s.iface == iface && s.ip == *ip && now < s.until => Some(s.mac),
            _ => None,
        }
    }

    pub fn put(&mut self, iface: u16, ip: IpAddr, mac: MacAddr, until: Instant) {
        self.slots[Self::slot(&ip)] = Some(MemoSlot { iface, ip, mac, until });
    }

    /// Forgets everything when the table's generation moved.
    #[inline]
    pub fn sync(&mut self, generation: u64) {
        if generation != self.generation {
            self.slots = [None; 16];
            self.generation = generation;
        }
    }
}

/// ICMP error rate limit: a token bucket.
#[derive(Debug)]
pub(crate) struct RateLimit {
    tokens: u64,
    burst: u64,
    per_sec: u64,
    last: Instant,
}

impl RateLimit {
    pub fn new(per_sec: u64, burst: u64) -> RateLimit {
        RateLimit { tokens: burst, burst, per_sec, last: Instant(0) }
    }

    /// Takes a token if there is one.
    pub fn allow(&mut self, now: Instant) -> bool {
        if self.per_sec > 0 {
            let elapsed = now.0.saturating_sub(self.last.0);
            let new = elapsed as u128 * self.per_sec as u128 / 1_000_000_000;
            if new > 0 {
                self.tokens = (self.tokens + new as u64).min(self.burst);
                self.last = now;
            }
        }
        if self.tokens > 0 {
            self.tokens -= 1;
            true
        } else {
            false
        }
    }
}

/// One polling lcore's state.
pub(crate) struct Worker<'s> {
    pub idx: usize,
    pub lcore: u32,
    pub shared: &'s Shared,
    pub stack: &'s Stack,
    pub rx: Vec<(u16, RxQueue)>,
    /// Per port: this lcore's TX queue, or none (it hands its frames to
    /// the lcore owning one).
    pub tx: Vec<Option<TxQueue>>,
    pub txbuf: Vec<Burst<BURST>>,
    pub snapshot: Arc<Snapshot<Arc<SocketCore>>>,
    pub snap_gen: u64,
    pub memo: NeighMemo,
    pub icmp_limit: RateLimit,
    pub now: Instant,
    next_timer: Instant,
    local: Vec<crate::pipeline::tx::TxPacket>,
    idle_polls: u32,
    counters: &'s CounterBlock,
    /// Datagrams found a socket during this burst: (binding index in the
    /// snapshot, interface, IPv4?, datagram), queued together after it.
    pub staged: Vec<(u32, u16, bool, Datagram)>,
    scratch: Vec<Datagram>,
    /// Sockets this lcore queued datagrams to since the application's
    /// callback last ran.
    ready: Vec<u64>,
    /// Whether this burst runs the GRO stage (a tunnel or a GRO socket
    /// exists): read once per burst.
    pub gro_active: bool,
    /// Frames taken from the ports so far (a GRO train grows only from one
    /// frame to the very next).
    pub frame_no: u64,
    /// The coalesced datagram this burst may still grow (UDP GRO).
    pub train: crate::pipeline::gro::Train,
    /// An inner frame a tunnel just decapsulated, for the receive loop.
    pub decapsulated: Option<(u16, spate_dpdk::Mbuf)>,
    /// IPv4 and IPv6 fragments waiting for the rest of their datagram.
    pub reasm: crate::frag::reassembly::Reassembler,
    /// Software RSS and the rings to the other lcores (several lcores).
    pub steer: Option<crate::pipeline::steer::Steering>,
    /// Link-change counts of the ports last looked at (lcore 0 logs them).
    link_seen: Vec<u64>,
}

/// The queue handles a worker polls, per interface.
#[derive(Debug)]
pub(crate) struct WorkerQueues {
    pub rx: Vec<(u16, RxQueue)>,
    pub tx: Vec<Option<TxQueue>>,
    pub steer: Option<crate::pipeline::steer::Steering>,
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
            snap_gen: shared.sockets.generation(),
            memo: NeighMemo::default(),
            icmp_limit: RateLimit::new(per_lcore, shared.cfg.icmp_burst as u64),
            now: shared.clock.now(),
            next_timer: Instant(0),
            local: Vec::with_capacity(LOCAL_TX_CAPACITY),
            idle_polls: 0,
            counters: shared.stats.lcore(idx),
            staged: Vec::with_capacity(BURST),
            scratch: Vec::with_capacity(BURST),
            ready: Vec::with_capacity(64),
            gro_active: false,
            frame_no: 0,
            train: Default::default(),
            decapsulated: None,
            reasm: crate::frag::reassembly::Reassembler::new(crate::frag::reassembly::Limits {
                high: shared.cfg.reassembly_high_bytes,
                low: shared.cfg.reassembly_low_bytes,
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
    pub fn counters(&self) -> &'s CounterBlock {
        self.counters
    }

    #[inline]
    pub fn inc(&self, c: Counter) {
        self.counters().inc_local(c);
    }

    #[inline]
    pub fn add(&self, c: Counter, n: u64) {
        self.counters().add_local(c, n);
    }

    /// Whether this burst runs the GRO stage; always false in the
    /// no-gro-stage build, so the compiler drops the stage there.
    #[inline(always)]
    pub fn gro_stage(&self) -> bool {
        !cfg!(feature = "no-gro-stage") && self.gro_active
    }

    /// Runs until the stack stops, calling `app` once per iteration.
    pub fn run(&mut self, app: &mut dyn FnMut(&mut LcoreCtx<'_>)) {
        let load = &self.shared.load[self.idx];
        if self.idx == 0 && self.shared.cfg.announce {
            self.now = self.shared.clock.now();
            self.announce();
            self.flush_all();
        }
        loop {
            let start = spate_dpdk::lcore::tsc();
            self.now = self.shared.clock.at(start);
            let mut work = self.poll_rx();
            work += self.run_app(app);
            work += self.drain_inbox();
            self.flush_all();
            if self.now.0 >= self.next_timer.0 {
                self.timers();
                self.next_timer = Instant(self.now.0 + TIMER_NS);
            }
            load.loops.store(load.loops.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            if work > 0 {
                let spent = spate_dpdk::lcore::tsc().wrapping_sub(start);
                load.busy_cycles.store(load.busy_cycles.load(Ordering::Relaxed) + spent, Ordering::Relaxed);
                self.idle_polls = 0;
            } else {
                self.idle_polls = self.idle_polls.saturating_add(1);
                let sleep = self.shared.cfg.idle_sleep_us;
                if sleep > 0 && self.idle_polls > IDLE_POLLS {
                    std::thread::sleep(std::time::Duration::from_micros(sleep as u64));
                }
            }
            if self.shared.should_stop() {
                break;
            }
        }
        self.flush_all();
    }

    /// One burst from every RX queue through the receive pipeline.
    #[inline]
    pub fn poll_rx(&mut self) -> usize {
        let g = self.shared.sockets.generation();
        if g != self.snap_gen {
            self.snapshot = self.shared.sockets.snapshot();
            self.snap_gen = g;
        }
        // After the snapshot: a tunnel or GRO socket in it was counted
        // before it was published. The no-gro-stage build (the benchmark's
        // baseline) has no stage at all.
        self.gro_active = !cfg!(feature = "no-gro-stage") && self.shared.gro_users.load(Ordering::Acquire) != 0;
        self.memo.sync(self.shared.neigh.generation());
        let mut total = 0;
        let mut burst: Burst<BURST> = Burst::new();
        for q in 0..self.rx.len() {
            let iface = self.rx[q].0;
            let n = self.rx[q].1.rx_burst(&mut burst);
            if n == 0 {
                continue;
            }
            total += n;
            self.add(Counter::RxFrames, n as u64);
            // The device wrote these frames from another core: start all
            // the cache misses now, so they overlap.
            for m in burst.as_slice() {
                m.prefetch_data();
            }
            if self.steer.is_some() && self.shared.iface_steered(iface) {
                self.steer_burst(&mut burst);
            }
            self.rx_run(iface, &mut burst);
        }
        if self.steer.is_some() {
            total += self.poll_steered();
        }
        total
    }

    /// A burst of one interface's frames through the receive pipeline.
    #[inline]
    pub(crate) fn rx_run(&mut self, iface: u16, burst: &mut Burst<BURST>) {
        if self.gro_stage() {
            self.rx_frames_gro(iface, burst);
        } else {
            for m in burst.drain() {
                if let Some(outcome) = self.rx_frame::<false>(iface, m) {
                    self.inc(outcome);
                }
            }
        }
        self.deliver_staged();
    }

    /// The burst's frames with the GRO stage: a tunnel's inner frame is its
    /// outer frame's next step, and trains end with the burst.
    #[inline(never)]
    fn rx_frames_gro(&mut self, iface: u16, burst: &mut Burst<BURST>) {
        for m in burst.drain() {
            self.frame_no += 1;
            let (mut ifc, mut m) = (iface, m);
            loop {
                if let Some(outcome) = self.rx_frame::<true>(ifc, m) {
                    self.inc(outcome);
                }
                match self.decapsulated.take() {
                    Some(inner) => (ifc, m) = inner,
                    None => break,
                }
            }
        }
        self.gro_flush();
    }

    /// Queues the burst's datagrams to their sockets: all of one socket's
    /// with one lock, in the order they arrived. Flows of a reuseport group
    /// interleave in a burst, so the burst is first sorted by socket; the
    /// sort is stable (each socket's datagrams keep their order), takes one
    /// pass when the burst is one run already, and uses no heap at this size.
    #[inline]
    pub(crate) fn deliver_staged(&mut self) {
        if self.staged.is_empty() {
            return;
        }
        self.staged.sort_by_key(|s| s.0);
        let mut staged = std::mem::take(&mut self.staged);
        let mut batch = std::mem::take(&mut self.scratch);
        let mut v4 = [false; BURST];
        let mut it = staged.drain(..).peekable();
        while let Some((index, iface, is_v4, d)) = it.next() {
            v4[0] = is_v4;
            batch.push(d);
            while let Some((_, _, is_v4, d)) = it.next_if(|(i, _, _, _)| *i == index) {
                v4[batch.len()] = is_v4;
                batch.push(d);
            }
            let b = self.snapshot.get(index);
            if b.sock.epoch.load(Ordering::Acquire) != b.epoch {
                // The socket changed (connected, left its group, closed)
                // after this snapshot: look again in the current one.
                self.redeliver(iface, &mut batch);
                continue;
            }
            let offered = batch.len();
            let refusal = b.sock.queue.push_batch(self.idx, &mut batch);
            let id = b.id;
            // What was refused is the tail of the run.
            let accepted = offered - batch.len();
            if accepted > 0 && self.ready.last() != Some(&id) && !self.ready.contains(&id) {
                self.ready.push(id);
            }
            let accepted_v4 = v4[..accepted].iter().filter(|&&f| f).count() as u64;
            self.add(Counter::RxDelivered, accepted as u64);
            self.add(Counter::UdpInDatagrams, accepted_v4);
            self.add(Counter::Udp6InDatagrams, accepted as u64 - accepted_v4);
            match refusal {
                Ok(()) => {}
                Err(Refusal::Full) => {
                    self.add(Counter::RxRcvbufFull, batch.len() as u64);
                    for &f in &v4[accepted..offered] {
                        self.inc(if f { Counter::UdpRcvbufErrors } else { Counter::Udp6RcvbufErrors });
                        self.inc(if f { Counter::UdpInErrors } else { Counter::Udp6InErrors });
                    }
                }
                Err(Refusal::Closed) => self.add(Counter::RxSocketClosed, batch.len() as u64),
            }
            batch.clear();
        }
        drop(it);
        self.staged = staged;
        self.scratch = batch;
    }

    /// Delivers datagrams whose socket changed since the lookup, one by one,
    /// after a fresh lookup in the current snapshot.
    #[cold]
    fn redeliver(&mut self, iface: u16, batch: &mut Vec<Datagram>) {
        self.snapshot = self.shared.sockets.snapshot();
        self.snap_gen = self.shared.sockets.generation();
        for d in batch.drain(..) {
            let v4 = d.src().is_ipv4() || d.is_mapped();
            let key = crate::lookup::FlowKey::new(&d.wire_src(), &d.wire_dst(), iface).on_lcore(self.idx as u32);
            let Some((_, b)) = self.snapshot.lookup(&key) else {
                self.inc(Counter::RxSocketClosed);
                continue;
            };
            let d = d.remap(b.family == crate::lookup::Family::V6);
            let id = b.id;
            match b.sock.queue.push(self.idx, d) {
                Ok(()) => {
                    if !self.ready.contains(&id) {
                        self.ready.push(id);
                    }
                    self.inc(Counter::RxDelivered);
                    self.inc(if v4 { Counter::UdpInDatagrams } else { Counter::Udp6InDatagrams });
                }
                Err(crate::rx_queue::Refused::Full(_)) => {
                    self.inc(Counter::RxRcvbufFull);
                    self.inc(if v4 { Counter::UdpRcvbufErrors } else { Counter::Udp6RcvbufErrors });
                    self.inc(if v4 { Counter::UdpInErrors } else { Counter::Udp6InErrors });
                }
                Err(crate::rx_queue::Refused::Closed(_)) => self.inc(Counter::RxSocketClosed),
            }
        }
    }

    /// Calls the application and sends what it sent.
    fn run_app(&mut self, app: &mut dyn FnMut(&mut LcoreCtx<'_>)) -> usize {
        let queue = std::mem::take(&mut self.local);
        LOCAL_TX.with(|l| *l.borrow_mut() = Some(LocalTx { stack_id: self.shared.id, queue }));
        let mut ctx =
            LcoreCtx { index: self.idx, lcore: self.lcore, now: self.now, stack: self.stack, ready: &self.ready };
        app(&mut ctx);
        self.ready.clear();
        let mut queue = LOCAL_TX.with(|l| l.borrow_mut().take()).map(|l| l.queue).unwrap_or_default();
        let n = queue.len();
        for pkt in queue.drain(..) {
            self.count_out(&pkt);
            self.transmit(pkt);
        }
        self.local = queue;
        n
    }

    /// Sends what application threads queued for this lcore.
    fn drain_inbox(&mut self) -> usize {
        let inbox = &self.shared.inbox[self.idx];
        let mut n = 0;
        while n < INBOX_BATCH {
            let Some(pkt) = inbox.pop() else { break };
            self.count_out(&pkt);
            self.transmit(pkt);
            n += 1;
        }
        n
    }

    #[inline]
    fn count_out(&self, pkt: &crate::pipeline::tx::TxPacket) {
        if !pkt.datagram {
            return;
        }
        self.inc(if pkt.next_hop.is_ipv4() { Counter::UdpOutDatagrams } else { Counter::Udp6OutDatagrams });
    }

    fn timers(&mut self) {
        if self.reasm.pending() > 0 {
            self.reasm.expire(self.now);
            self.count_reasm_drops();
        }
        if self.idx != 0 {
            return;
        }
        self.shared.pmtu.prune();
        self.shared.log_link_changes(&mut self.link_seen);
        let expired = self.shared.neigh.poll(self.now);
        self.add(Counter::NeighFailed, expired.failed);
        self.add(Counter::NeighQueueDrops, expired.dropped.len() as u64);
        drop(expired.dropped);
        for s in expired.solicits {
            self.solicit(s);
        }
    }
}

impl Worker<'_> {
    /// Counts what reassembly dropped, and publishes what it holds.
    pub(crate) fn count_reasm_drops(&mut self) {
        let [v4, v6] = self.reasm.take_drops();
        self.add(Counter::IpReasmFails, v4.failed + v4.evicted + v4.timed_out);
        self.add(Counter::IpReasmTimeout, v4.timed_out);
        self.add(Counter::Ip6ReasmFails, v6.failed + v6.evicted + v6.timed_out);
        self.add(Counter::Ip6ReasmTimeout, v6.timed_out);
        let held = self.reasm.bytes() as u64;
        let load = &self.shared.load[self.idx];
        load.reasm_bytes.store(held, Ordering::Relaxed);
        if held > load.reasm_peak.load(Ordering::Relaxed) {
            load.reasm_peak.store(held, Ordering::Relaxed);
        }
    }
}

//! The polling loop: one burst from every RX queue through the receive
//! stages, the application's callback, what application threads queued,
//! the transmit flush and the timers, until the stack stops.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use spate_dpdk::{Burst, Mbuf};

use super::fast::PortMemo;
use super::{LcoreCtx, Step, Worker};
use crate::shared::{BURST, Direct, LOCAL_TX, LOCAL_TX_CAPACITY, LocalTx, Net, PortSteering, TxPacket};
use crate::stats::{Counter, add_single_writer};
use crate::time::Instant;

/// Clears `LOCAL_TX` when dropped, on the way out of the loop however it
/// ends.
struct LocalTxGuard;

impl Drop for LocalTxGuard {
    fn drop(&mut self) {
        LOCAL_TX.with(|l| l.borrow_mut().take());
    }
}

/// Packets taken from the inbox per loop iteration.
const INBOX_BATCH: usize = 256;
/// Timer period.
const TIMER_NS: u64 = 10_000_000;
/// Empty polls before an idle lcore starts sleeping (when configured to).
const IDLE_POLLS: u32 = 256;

impl Worker<'_> {
    /// Runs until the stack stops, calling `app` once per iteration.
    pub fn run(&mut self, app: &mut dyn FnMut(&mut LcoreCtx<'_>)) {
        // The first contended lock (a socket's queue) must not allocate.
        crate::sync::prepare_thread();
        let load = &self.shared.load[self.idx];
        if self.idx == 0 && self.shared.cfg.announce {
            self.now = self.shared.clock.now();
            self.announce();
            self.flush_all();
        }
        self.install_local_tx();
        self.setup_sleep();
        // net_tap's signals reach this lcore, not the application's threads.
        if self.rx.iter().any(|(iface, _)| self.is_tap(*iface)) {
            let n = spate_dpdk::sched::direct_tap_signals_here();
            log::debug!("spate: lcore {}: {n} TAP descriptors signal this lcore", self.lcore);
        }
        // Should the loop unwind, the queue goes with it (its mbufs
        // freed): a thread that carries on must not send into it.
        let _installed = LocalTxGuard;
        loop {
            let start = spate_dpdk::lcore::tsc();
            self.now = self.shared.clock.at(start);
            let mut work = self.poll_rx();
            work += self.call_app(app);
            work += self.drain_inbox();

            // Timers before the flush: what they send (ARP and ND retries,
            // reports, announcements) goes with this iteration's frames,
            // not after a sleep.
            if self.now.0 >= self.next_timer.0 {
                self.timers();
                self.next_timer = Instant(self.now.0 + TIMER_NS);
            }
            self.flush_all();
            add_single_writer(&load.loops, 1);
            // Work for the callback ([`Stack::wake_lcore`]), also from
            // what its turn queued: it runs again before any sleep. A busy
            // iteration leaves the flag to the next idle one.
            if work == 0 && self.shared.doorbells[self.idx].take_app_work() {
                work = 1;
            }
            if work > 0 {
                let spent = spate_dpdk::lcore::tsc().wrapping_sub(start);
                add_single_writer(&load.busy_cycles, spent);
                self.idle_polls = 0;
                self.busy();
            } else {
                self.idle_polls = self.idle_polls.saturating_add(1);
                let sleep = self.shared.cfg.idle_sleep_us;
                if sleep > 0 && self.idle_polls > IDLE_POLLS && !self.shared.sleeps[self.idx] {
                    std::thread::sleep(std::time::Duration::from_micros(sleep as u64));
                }
                self.idle();
            }
            if self.shared.should_stop() {
                break;
            }
        }
        // What a last look before a sleep staged, should the stop have
        // come then.
        self.deliver_staged();
        self.teardown_sleep();
        self.remove_local_tx();
        self.flush_all();
    }

    /// One burst from every RX queue through the receive pipeline.
    #[inline]
    pub fn poll_rx(&mut self) -> usize {
        self.look_at_published();
        if self.memo.sync(self.shared.neigh.generation()) {
            // The table changed: the callback's frames wait for a new
            // look-up too.
            self.direct_until = Instant(0);
        }
        let mut total = 0;
        if !self.looped.is_empty() {
            // First, as the receive burst they stand in for.
            total += self.rx_looped();
        }
        let mut burst: Burst<BURST> = Burst::new();
        for q in 0..self.rx.len() {
            let iface = self.rx[q].0;
            let n = self.rx[q].1.rx_burst(&mut burst);
            if n == 0 {
                continue;
            }
            // A change that returned before these frames came holds for
            // them, also when it came after this iteration's first look
            // (an lcore taken off its CPU in between).
            self.look_at_published();
            total += n;
            self.add(Counter::RxFrames, n as u64);
            // The device wrote these frames from another core: start all
            // the cache misses now, so they overlap.
            for m in burst.as_slice() {
                m.prefetch_data();
            }
            self.tap(iface, false, burst.as_slice());
            if self.steer.is_some() {
                let how = self.shared.iface_steered(iface);
                if how != PortSteering::None {
                    let t = spate_dpdk::lcore::tsc();
                    self.steer_burst(&mut burst, how);
                    let spent = spate_dpdk::lcore::tsc().wrapping_sub(t);
                    add_single_writer(&self.shared.load[self.idx].steer_cycles, spent);
                }
            }
            self.receive_burst(iface, &mut burst);
        }
        if self.steer.is_some() {
            total += self.poll_steered();
        }
        total
    }

    /// The copies of this lcore's own group packets (`IP_MULTICAST_LOOP`)
    /// through the receive pipeline, as frames of the interface they left
    /// by. Out of line: the poll pays one test of an empty vector.
    #[cold]
    #[inline(never)]
    fn rx_looped(&mut self) -> usize {
        let mut looped = std::mem::take(&mut self.looped);
        let n = looped.len();
        let mut burst: Burst<BURST> = Burst::new();
        let mut frames = looped.drain(..).peekable();
        while let Some((iface, m)) = frames.next() {
            let _ = burst.push(m);
            let next_elsewhere = frames.peek().is_none_or(|(i, _)| *i != iface);
            if burst.is_full() || next_elsewhere {
                self.receive_burst(iface, &mut burst);
            }
        }
        drop(frames);
        // Nothing the receive path does loops a packet back (what it sends
        // is no socket's datagram); were it to, those wait their turn.
        if self.looped.is_empty() {
            self.looped = looped;
        }
        n
    }

    /// A burst of one interface's frames through the receive pipeline,
    /// its datagrams staged for the callback (an earlier burst's queued
    /// first). Not inlined: one call per burst, and the benchmark reads its
    /// cost.
    #[inline(never)]
    pub(super) fn receive_burst(&mut self, iface: u16, burst: &mut Burst<BURST>) {
        self.deliver_staged();
        // The burst's view of the interfaces' addresses (the receive path
        // holds it while it calls methods of the worker).
        let net = self.net.clone();
        let ifc = &net.ifaces[iface as usize];
        if self.gro_stage() {
            self.rx_frames_gro(&net, iface, burst);
        } else if ifc.vlan.is_some() {
            // The fast path takes untagged frames only.
            for m in burst.drain() {
                self.rx_full(&net, iface, m);
            }
        } else {
            // The common case first (IPv4 UDP to a socket, not a
            // fragment); what it does not take goes the whole way.
            let (mut fast4, mut fast6) = (0, 0);
            let mut memo = PortMemo::new();
            for m in burst.drain() {
                match self.rx_fast(ifc, &mut memo, m) {
                    Ok(true) => fast4 += 1,
                    Ok(false) => fast6 += 1,
                    Err(m) => self.rx_full(&net, iface, m),
                }
            }
            if fast4 > 0 {
                self.add(Counter::IpInReceives, fast4);
                self.add(Counter::IpInDelivers, fast4);
            }
            if fast6 > 0 {
                self.add(Counter::Ip6InReceives, fast6);
                self.add(Counter::Ip6InDelivers, fast6);
            }
        }
        self.stamp_staged();
    }

    /// A frame the whole way through the receive path, without the GRO
    /// stage, its outcome counted.
    #[inline(always)]
    fn rx_full(&mut self, net: &Net, iface: u16, m: Mbuf) {
        if let Some(outcome) = self.rx_frame::<false>(net, iface, m).outcome() {
            self.inc(outcome);
        }
    }

    /// The burst's frames with the GRO stage: a tunnel's inner frame is its
    /// outer frame's next step, and trains end with the burst.
    #[inline(never)]
    fn rx_frames_gro(&mut self, net: &Net, iface: u16, burst: &mut Burst<BURST>) {
        for m in burst.drain() {
            self.frame_no += 1;
            let (mut on, mut m) = (iface, m);
            loop {
                match self.rx_frame::<true>(net, on, m) {
                    Step::Done(outcome) => {
                        if let Some(outcome) = outcome {
                            self.inc(outcome);
                        }
                        break;
                    }
                    Step::Inner(inner, frame) => {
                        self.tap(inner, false, std::slice::from_ref(&frame));
                        (on, m) = (inner, frame)
                    }
                }
            }
        }
        self.gro_flush();
    }

    /// Calls the application, queues the staged datagrams it did not take,
    /// and sends what it sent.
    fn call_app(&mut self, app: &mut dyn FnMut(&mut LcoreCtx<'_>)) -> usize {
        if self.direct.is_some() && self.now >= self.direct_until {
            // The memo's time for it is up: looked up again.
            self.set_direct(None);
        }
        let mut ctx = LcoreCtx {
            index: self.idx,
            lcore: self.lcore,
            now: self.now,
            stack: self.stack,
            ready: &self.ready,
            staged: std::cell::RefCell::new(&mut self.staging),
            snapshot: &self.snapshot,
            wake_at: None,
        };
        app(&mut ctx);
        self.app_deadline = ctx.wake_at;
        self.ready.clear();
        self.ready_bits = 0;
        // Named in the next callback's `ready` list.
        self.deliver_staged();
        // What the callback sent, sent from where it lies: one
        // thread-local access.
        LOCAL_TX.with(|l| match &mut *l.borrow_mut() {
            Some(local) => self.transmit_local(local),
            None => 0,
        })
    }

    /// Sends what the callback sent: the frames it finished, then the
    /// packets it queued; the neighbour those found in the memo becomes
    /// the next callback's direct one. Returns how many went.
    fn transmit_local(&mut self, local: &mut LocalTx) -> usize {
        let n = local.frames.len() + local.queue.len();
        // The frames were finished for the neighbour the thread-local
        // names (the worker's copy only decides when it changes).
        if let Some(d) = &local.direct {
            let (iface, v4) = (d.iface, d.next_hop.is_ipv4());
            self.transmit_frames(iface, v4, &mut local.frames, std::mem::take(&mut local.datagrams));
        }
        if !local.queue.is_empty()
            && let Some((d, until)) = self.transmit_all(&mut local.queue)
        {
            self.direct_until = until;
            if self.direct != Some(d) {
                self.direct = Some(d);
                local.direct = Some(d);
            }
        }
        n
    }

    /// Sets the neighbour the callback's sends finish frames for.
    fn set_direct(&mut self, direct: Option<Direct>) {
        self.direct = direct;
        LOCAL_TX.with(|l| {
            if let Some(local) = &mut *l.borrow_mut() {
                local.direct = direct;
            }
        });
    }

    /// Installs this lcore's queue for sends from its callback (the
    /// thread-local `LOCAL_TX`) for the time the loop runs.
    fn install_local_tx(&mut self) {
        self.direct = None;
        let local = LocalTx {
            stack_id: self.shared.id,
            queue: Vec::with_capacity(LOCAL_TX_CAPACITY),
            direct: None,
            frames: Vec::with_capacity(LOCAL_TX_CAPACITY),
            datagrams: 0,
        };
        LOCAL_TX.with(|l| *l.borrow_mut() = Some(local));
    }

    /// Takes the queue out again and sends what is in it: after the loop,
    /// sends go to the inbox.
    fn remove_local_tx(&mut self) {
        if let Some(mut local) = LOCAL_TX.with(|l| l.borrow_mut().take()) {
            self.transmit_local(&mut local);
        }
    }

    /// Sends what application threads queued for this lcore.
    fn drain_inbox(&mut self) -> usize {
        let inbox = &self.shared.inbox[self.idx];
        // Two loads say whether there is anything, cheaper than a failed pop.
        if inbox.is_empty() {
            return 0;
        }
        // A neighbour removed or changed before these packets were queued
        // holds for them, also when it happened after this iteration's
        // first look at the table.
        if self.memo.sync(self.shared.neigh.generation()) {
            self.direct_until = Instant(0);
        }
        let mut n = 0;
        while n < INBOX_BATCH {
            let Some(pkt) = inbox.pop() else { break };
            self.count_out(&pkt);
            self.transmit(pkt);
            n += 1;
        }
        // Room made: a sender blocked on the full inbox goes on.
        inbox.drained();
        n
    }

    /// Takes what changed since the last look: the socket table, and what
    /// [`Shared::published`](crate::shared::Shared::published) counts
    /// (two loads when nothing did).
    #[inline(always)]
    pub(super) fn look_at_published(&mut self) {
        let g = self.shared.sockets.generation();
        let c = self.shared.changes();
        if g != self.snap_gen || c != self.changes_seen {
            self.take_published(g, c);
        }
    }

    #[cold]
    #[inline(never)]
    fn take_published(&mut self, g: u64, c: u64) {
        // What is staged names bindings of the snapshot it was staged
        // with, and went through the GRO stage as it was: it goes first
        // (a train, none open between bursts, ended with it).
        self.gro_flush();
        self.deliver_staged();
        if g != self.snap_gen {
            self.snapshot = self.shared.sockets.snapshot();
            self.snap_gen = g;
        }
        // After the snapshot: a tunnel or GRO socket in it was counted
        // before it was published. The no-gro-stage build (the benchmark's
        // baseline) has no stage at all.
        self.gro_active = !cfg!(feature = "no-gro-stage") && self.shared.gro_users.load(Ordering::Acquire) != 0;
        self.stamp = self.shared.stamp_users.load(Ordering::Acquire) != 0;
        self.sync_net();
        let tap_gen = self.shared.capture.generation();
        if tap_gen != self.tap_gen {
            self.tap = self.shared.capture.current();
            self.tap_gen = tap_gen;
        }
        self.changes_seen = c;
    }

    /// Takes the interfaces, routes and memberships published since the
    /// last look.
    #[inline]
    pub(super) fn sync_net(&mut self) {
        let net_gen = self.shared.net_generation();
        if net_gen != self.net_gen {
            // A copy of its own: the burst's reference count stays on
            // this lcore's cache lines, not one all lcores bounce.
            self.net = Arc::new(Net::clone(&self.shared.net()));
            self.net_gen = net_gen;
        }
    }

    #[inline]
    fn count_out(&self, pkt: &TxPacket) {
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
        self.send_due_reports();
        self.shared.pmtu.prune();
        self.shared.log_link_changes(&mut self.link_seen);
        if self.shared.announce_pending.swap(false, Ordering::AcqRel) {
            let added = std::mem::take(&mut *self.shared.announce.lock().unwrap_or_else(|p| p.into_inner()));
            self.announce_added(&added);
        }
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
    pub(super) fn count_reasm_drops(&mut self) {
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

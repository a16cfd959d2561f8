//! Adaptive polling (`poll = "adaptive"`): an lcore that found no work
//! for its window (at most `poll_idle_us`, 50 us; less while its idle
//! times run longer: `window.rs`) says it is going to sleep (its
//! doorbell), arms its RX queues' interrupts, looks once more at its queues, inbox and lanes
//! (what came before the arming: NAPI's re-check), and sleeps until a
//! frame, a ring of its bell (work handed over, the stack stopping) or its
//! timer tick, [`IDLE_TICK_NS`] away while it sleeps (its timers run ten
//! times less often than the 10 ms of a polling lcore: reassembly and
//! neighbour timeouts end up to that much late; what the application
//! asks of lcore 0, a join's report, an address's announcement, rings its
//! bell); then polls again. `net_af_packet` has no RX interrupts, but
//! each queue's packet socket is readable while frames wait in its ring:
//! the lcore waits on it instead. Ports with neither get naps on the
//! bell, from [`NAP_MIN_NS`] doubling to [`NAP_MAX_NS`]: the first frame
//! after a long quiet waits that long at most. Woken with nothing to do,
//! it sleeps again at once; work starts the idle time over. An lcore
//! that polls a port with `poll = "busy"` does not sleep.
//!
//! An lcore that may run on every CPU (its `lcores` entry a CPU set of
//! them all, `1@(0-1)` on two) shares them: idle, it looks every
//! [`IDLE_CHECK_NS`] whether threads wait for a CPU (more runnable than
//! online CPUs) and if so sleeps at once, as a blocking thread would,
//! instead of polling out its idle time while a peer or the application
//! waits for the CPU it holds. The count is the system's: it says
//! nothing of a smaller set's CPUs, so an lcore on one keeps polling, as
//! a pinned lcore does. A pinned lcore keeps its CPU: whoever shares it
//! gets it in the scheduler's slices either way, and a sleep would cost
//! each frame a wake-up.
//!
//! `net_tap` reads a queue only once the signal its descriptor sent for
//! the frames was handled, by whichever thread of the process the kernel
//! picked (on a busy CPU, up to milliseconds later). An idle lcore whose
//! `net_tap` descriptor woke it, or stayed readable from one look to the
//! next, raises the signal on itself.

use super::Worker;
use super::window::{PollWindow, Tuned};
use crate::stats::Counter;

/// How an idle time that went into a sleep ended.
#[derive(Clone, Copy)]
enum IdleEnd {
    /// Work found at the last look: the sleep was given up.
    LastLook,
    /// A frame or a hand-off woke the lcore.
    Work,
    /// The sleep ran to its timer.
    Timer,
}

/// The first nap where the ports have no RX interrupts.
const NAP_MIN_NS: u64 = 1_000;
/// The longest nap.
const NAP_MAX_NS: u64 = 10_000_000;
/// How often an idle lcore looks at its `net_tap` descriptors and, on a
/// CPU set, at the run queues (the first look when it turns idle).
const IDLE_CHECK_NS: u64 = 10_000;
/// The shortest idle poll of an lcore with `net_tap` queues: two looks
/// at their descriptors.
const TAP_IDLE_MIN_NS: u64 = 2 * IDLE_CHECK_NS;
/// The shortest sleep until the callback's next turn (`wake_at`): closer
/// than this, the lcore polls on (a sleep and its wake-up cost about as
/// much).
const APP_WAIT_MIN_NS: u64 = 20_000;
/// How long an lcore with RX interrupts sleeps at most: its timers' tick
/// while idle.
pub(super) const IDLE_TICK_NS: u64 = 100_000_000;

impl Worker<'_> {
    /// At the loop's start, on the lcore's thread: its bell in the
    /// thread's epoll set, and its RX queues' interrupts where the devices
    /// have them (`net_af_packet`: its queues' packet sockets; else naps,
    /// said in the log).
    /// Whether interface `iface` is a `net_tap` port (its queues signal).
    pub(super) fn is_tap(&self, iface: u16) -> bool {
        self.shared.ports.get(iface as usize).is_some_and(|p| p.info().driver == "net_tap")
    }

    pub(super) fn setup_sleep(&mut self) {
        if !self.shared.sleeps[self.idx] {
            if self.shared.adaptive && !self.rx.is_empty() {
                log::info!("spate: lcore {} polls a port with poll = \"busy\": it does not sleep", self.lcore);
            }
            return;
        }
        let bell = self.shared.bells[self.idx].clone();
        let mut sleeper = match spate_dpdk::Sleeper::new(bell) {
            Ok(s) => s,
            Err(e) => {
                log::warn!("spate: lcore {}: {e}: it polls without sleeping", self.lcore);
                return;
            }
        };
        // Naps as short as asked (the default slack is 50 us).
        spate_dpdk::sleep::set_timer_slack(1_000);
        // An lcore without RX queues (steered ports) waits on its bell.
        let mut all = true;
        self.intr_registered = vec![false; self.rx.len()];
        for (i, (iface, q)) in self.rx.iter().enumerate() {
            let Err(e) = q.intr_register() else {
                self.intr_registered[i] = true;
                continue;
            };
            let port = self.shared.ports.get(*iface as usize).map(|p| p.info());
            // net_af_packet and net_af_xdp have no RX interrupts, but each
            // queue's packet or XDP socket is readable while frames wait in
            // its ring. net_af_packet opens one per queue pair, in order:
            // any other packet socket on the interface (another port on
            // it) and they are not told apart; an XDP socket says its
            // queue (sock_diag).
            let sockets = match port {
                Some(i) if i.driver == "net_af_packet" && i.if_index != 0 => {
                    Some((spate_dpdk::sleep::packet_sockets(i.if_index), i, "packet"))
                }
                Some(i) if i.driver == "net_af_xdp" && i.if_index != 0 => {
                    Some((spate_dpdk::xdp::own_sockets(i.if_index), i, "XDP"))
                }
                _ => None,
            };
            if let Some((sockets, info, kind)) = sockets {
                let ours = sockets.len() == info.max_rx_queues as usize;
                if let Some(&fd) = sockets.get(q.index() as usize).filter(|_| ours) {
                    match sleeper.watch(fd) {
                        Ok(()) => {
                            log::info!(
                                "spate: lcore {}: interface {iface} ({}) has no RX interrupts: idle, the lcore waits on its {kind} socket",
                                self.lcore,
                                info.driver
                            );
                            continue;
                        }
                        Err(e) => log::info!("spate: lcore {}: interface {iface}'s {kind} socket: {e}", self.lcore),
                    }
                }
            }
            log::info!(
                "spate: lcore {}: interface {iface} has no RX interrupts ({e}): idle, the lcore naps {} us doubling to {} ms",
                self.lcore,
                NAP_MIN_NS / 1_000,
                NAP_MAX_NS / 1_000_000
            );
            all = false;
        }
        self.sleeper = Some(sleeper);
        self.rx_intr = all;
        self.nap_ns = NAP_MIN_NS;
        // net_tap's receive function answers nothing until the signal
        // that follows a frame was handled (its `trigger_seen`), which may
        // come after the frame woke the lcore, or after the last look: its
        // descriptor, readable while frames wait, is looked at too.
        self.pending_fds = self
            .rx
            .iter()
            .filter(|(iface, _)| self.is_tap(*iface))
            .filter_map(|(_, q)| q.intr_fd())
            .map(|fd| (fd, spate_dpdk::sched::IoSignal::of(fd)))
            .collect();
        // How long it polls idle at most; net_tap's frames need two looks
        // at their descriptors (the second raises the signal) before a
        // sleep: its window never shrinks under them.
        let mut max_ns = self.shared.cfg.poll_idle_us as u64 * 1_000;
        let mut min_ns = 0;
        if !self.pending_fds.is_empty() {
            min_ns = TAP_IDLE_MIN_NS;
            if max_ns < TAP_IDLE_MIN_NS {
                log::info!(
                    "spate: lcore {} polls net_tap: it polls {} us idle before it sleeps (poll_idle_us = {})",
                    self.lcore,
                    TAP_IDLE_MIN_NS / 1_000,
                    self.shared.cfg.poll_idle_us
                );
                max_ns = TAP_IDLE_MIN_NS;
            }
        }
        self.window = PollWindow::new(max_ns, min_ns);
        // On a CPU set of every CPU, the lcore yields when threads wait for
        // one.
        let allowed = spate_dpdk::lcore::cpus_allowed();
        if allowed > 1 {
            match spate_dpdk::sched::RunQueue::open() {
                Some(q) if allowed as u32 >= q.cpus() => {
                    log::info!(
                        "spate: lcore {} may run on every CPU: idle, it sleeps at once while threads wait for a CPU",
                        self.lcore
                    );
                    self.run_queue = Some(q);
                }
                Some(q) => log::info!(
                    "spate: lcore {} may run on {allowed} of {} CPUs: it polls out its idle time (the system's run queue count says nothing of its CPUs)",
                    self.lcore,
                    q.cpus()
                ),
                None => {
                    log::info!("spate: lcore {}: /proc/loadavg cannot be read: it polls out its idle time", self.lcore)
                }
            }
        }
    }

    /// At the loop's end, on the lcore's thread: its RX queues' interrupts
    /// out of its epoll set (a stack run again registers them anew; the
    /// set outlives the stack on EAL's threads) and its bell with them.
    pub(super) fn teardown_sleep(&mut self) {
        if self.sleeper.take().is_none() {
            return;
        }
        for ((_, q), registered) in self.rx.iter().zip(std::mem::take(&mut self.intr_registered)) {
            if registered {
                let _ = q.intr_unregister();
            }
        }
        self.pending_fds.clear();
        self.run_queue = None;
    }

    /// An iteration that did work: the idle time starts over.
    #[inline]
    pub(super) fn busy(&mut self) {
        self.idle_since = None;
    }

    /// An iteration that found no work: sleeps once idle long enough.
    #[inline]
    pub(super) fn idle(&mut self) {
        if self.sleeper.is_some() {
            self.idle_adaptive();
        }
    }

    /// The idle iteration of an lcore that may sleep (out of the polling
    /// loop's code: a busy lcore never comes here).
    #[inline(never)]
    fn idle_adaptive(&mut self) {
        let since = match self.idle_since {
            Some(t) => t,
            None => {
                // The last idle time ended in work without a sleep: the
                // poll caught it.
                if std::mem::replace(&mut self.idle_unslept, true) {
                    self.window.caught();
                }
                // A new idle time: naps start short again.
                self.idle_since = Some(self.now.0);
                self.asleep_ns = 0;
                self.polled = None;
                self.nap_ns = NAP_MIN_NS;
                self.next_idle_check = self.now.0;
                self.pending_seen = std::mem::take(&mut self.woke_rx);
                self.now.0
            }
        };
        if self.now.0.saturating_sub(since) >= self.window.ns() {
            // Past the window: work that ends this idle time now (the
            // callback's next turn too close for a sleep) is no catch.
            self.idle_unslept = false;
            self.sleep();
        } else if self.now.0 >= self.next_idle_check && (self.run_queue.is_some() || !self.pending_fds.is_empty()) {
            self.idle_check();
        }
    }

    /// The looks of an idle lcore before its idle time is up: `net_tap`
    /// frames still waiting for their signal get it here; threads waiting
    /// for a CPU send a CPU-set lcore to sleep at once.
    #[cold]
    #[inline(never)]
    fn idle_check(&mut self) {
        self.next_idle_check = self.now.0 + IDLE_CHECK_NS;
        let waiting = self.pending_fds.iter().find(|&&(fd, _)| spate_dpdk::sleep::readable(fd)).map(|&(_, sig)| sig);
        if let Some(sig) = waiting {
            // Frames wait: no sleep (its last look would find them). One
            // handler run serves every queue (the driver's trigger is one
            // for all).
            match sig {
                Some(sig) if self.pending_seen => {
                    sig.raise();
                    self.inc(Counter::PollSignalsRaised);
                    self.pending_seen = false;
                }
                _ => self.pending_seen = true,
            }
            return;
        }
        self.pending_seen = false;
        if self.run_queue.as_ref().is_some_and(|q| q.contended()) && self.sleep_budget().is_some() {
            self.inc(Counter::PollSleepsContended);
            self.sleep();
        }
    }

    #[cold]
    #[inline(never)]
    fn sleep(&mut self) {
        let Some(wait_ns) = self.sleep_budget() else { return };
        self.idle_unslept = false;
        if self.polled.is_none() {
            let polled = self.idle_since.map_or(0, |since| self.now.0.saturating_sub(since));
            self.polled = Some((polled.min(self.window.ns()), polled >= self.window.ns()));
        }
        let bell = &self.shared.doorbells[self.idx];
        bell.going_to_sleep();
        self.arm(true);
        // The last look: what came before the flag and the arming.
        let found = self.poll_rx() > 0
            || !self.shared.inbox[self.idx].is_empty()
            || !self.looped.is_empty()
            || self.shared.doorbells[self.idx].has_app_work()
            || self.pending_fds.iter().any(|&(fd, _)| spate_dpdk::sleep::readable(fd));
        if found || self.shared.should_stop() {
            self.arm(false);
            self.shared.doorbells[self.idx].awake();
            self.inc(Counter::PollSleepsAborted);
            self.tune_window(IdleEnd::LastLook);
            self.idle_since = None;
            return;
        }
        let start = std::time::Instant::now();
        let sleeper = self.sleeper.as_mut().expect("adaptive");
        let woke = match self.rx_intr {
            true => sleeper.wait_ns(wait_ns),
            false => {
                let ns = self.nap_ns.min(wait_ns);
                self.nap_ns = (self.nap_ns * 2).min(NAP_MAX_NS);
                sleeper.nap(ns)
            }
        };
        self.arm(false);
        self.shared.doorbells[self.idx].awake();
        self.inc(Counter::PollSleeps);
        let asleep = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.asleep_ns = self.asleep_ns.saturating_add(asleep);
        self.add(Counter::PollAsleepMicros, asleep / 1_000);
        self.inc(match (woke.rx, woke.bell) {
            (true, _) => Counter::PollWakesRx,
            (false, true) => Counter::PollWakesHandoff,
            (false, false) => Counter::PollWakesTimer,
        });
        if woke.bell && self.idx == 0 {
            // Lcore 0 is rung for its timers' work too (a join's report,
            // an added address's announcement): due now.
            self.next_timer = crate::time::Instant(0);
        }
        self.woke_rx = woke.rx;
        self.tune_window(if woke.timed_out() { IdleEnd::Timer } else { IdleEnd::Work });
        if !woke.timed_out() {
            // Woken for work: it polls its window before sleeping again
            // (none, maybe; on net_tap at least its 20 us). A device may
            // signal before its frame can be taken: net_tap's interrupt is
            // its descriptor turning readable, while its receive function
            // returns nothing until the signal that follows has been
            // handled (`trigger_seen`); a later look finds the frame, or
            // raises the signal (`idle_check`).
            self.idle_since = None;
        }
    }

    /// The idle time that went into a sleep ended now, as `end` says: the
    /// idle poll grows or shrinks (`window`). Naps end by their timer
    /// whether frames came or not: an lcore that naps keeps its window. The
    /// stack stopping says nothing of its traffic.
    ///
    /// The idle time is taken as what the lcore polled of it before its
    /// first sleep (at most its window) and the time asleep: not the time
    /// since it began, which on a CPU the lcore shares also holds the
    /// slices another thread ran in. An lcore preempted while it polled
    /// keeps its window, as it kept polling. A last look after a sleep in
    /// the same idle time (one that ran to its timer) ends it as a wake-up
    /// would.
    fn tune_window(&mut self, end: IdleEnd) {
        if !self.rx_intr || self.shared.should_stop() {
            return;
        }
        let (Some(since), Some((polled, full))) = (self.idle_since, self.polled) else { return };
        let idle_ns = polled.saturating_add(self.asleep_ns);
        let tuned = match end {
            IdleEnd::LastLook if self.asleep_ns == 0 => {
                self.window.aborted(self.shared.clock.now().0.saturating_sub(since))
            }
            IdleEnd::LastLook | IdleEnd::Work => self.window.woke(idle_ns, full),
            IdleEnd::Timer => self.window.timed_out(idle_ns),
        };
        match tuned {
            Tuned::Kept => {}
            Tuned::Grown => self.inc(Counter::PollWindowGrown),
            Tuned::Shrunk => self.inc(Counter::PollWindowShrunk),
        }
    }

    /// How long a sleep may last: the idle tick, or less to the callback's
    /// next turn (`LcoreCtx::wake_at`); none when that is too close for a
    /// sleep (the lcore polls on).
    fn sleep_budget(&self) -> Option<u64> {
        let Some(at) = self.app_deadline else { return Some(IDLE_TICK_NS) };
        let left = at.saturating_duration_since(std::time::Instant::now());
        let left = u64::try_from(left.as_nanos()).unwrap_or(u64::MAX);
        (left >= APP_WAIT_MIN_NS).then(|| left.min(IDLE_TICK_NS))
    }

    /// Arms (or disarms) the RX queues' interrupts, where they have them
    /// (`net_tap`'s are always armed: its calls say `ENOTSUP`).
    fn arm(&mut self, on: bool) {
        if !self.rx_intr {
            return;
        }
        for ((_, q), _) in self.rx.iter().zip(&self.intr_registered).filter(|(_, r)| **r) {
            let _ = if on { q.intr_enable() } else { q.intr_disable() };
        }
    }
}

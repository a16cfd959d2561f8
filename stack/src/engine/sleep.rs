//! Adaptive polling (`poll = "adaptive"`): an lcore that found no work
//! for [`IDLE_NS`] says it is going to sleep (its doorbell), arms its RX
//! queues' interrupts, looks once more at its queues, inbox and lanes
//! (what came before the arming: NAPI's re-check), and sleeps until a
//! frame, a ring of its bell (work handed over, the stack stopping) or its
//! next timer; then polls again. Ports without RX interrupts get naps on
//! the bell instead, from [`NAP_MIN_NS`] doubling to [`NAP_MAX_NS`].
//! Woken with nothing to do (its timer), it sleeps again at once; work
//! starts the idle time over.

use super::Worker;
use crate::stats::Counter;

/// Idle time before an lcore sleeps (Linux's `busy_poll` default, 50 us).
pub(super) const IDLE_NS: u64 = 50_000;
/// The first nap where the ports have no RX interrupts.
const NAP_MIN_NS: u64 = 1_000;
/// The longest nap.
const NAP_MAX_NS: u64 = 1_000_000;

impl Worker<'_> {
    /// At the loop's start, on the lcore's thread: its bell in the
    /// thread's epoll set, and its RX queues' interrupts where the devices
    /// have them (else naps, said in the log).
    pub(super) fn setup_sleep(&mut self) {
        if !self.shared.adaptive {
            return;
        }
        let bell = self.shared.bells[self.idx].clone();
        match spate_dpdk::Sleeper::new(bell) {
            Ok(s) => self.sleeper = Some(s),
            Err(e) => {
                log::warn!("spate: lcore {}: {e}: it polls without sleeping", self.lcore);
                return;
            }
        }
        // Naps as short as asked (the default slack is 50 us).
        spate_dpdk::sleep::set_timer_slack(1_000);
        let mut all = !self.rx.is_empty();
        for (iface, q) in &self.rx {
            if let Err(e) = q.intr_register() {
                log::info!(
                    "spate: lcore {}: interface {iface} has no RX interrupts ({e}): idle, the lcore naps {} us to {} ms",
                    self.lcore,
                    NAP_MIN_NS / 1_000,
                    NAP_MAX_NS / 1_000_000
                );
                all = false;
            }
        }
        self.rx_intr = all;
        self.nap_ns = NAP_MIN_NS;
    }

    /// An iteration that did work: the idle time starts over.
    #[inline]
    pub(super) fn busy(&mut self) {
        self.idle_since = None;
    }

    /// An iteration that found no work: sleeps once idle long enough.
    #[inline]
    pub(super) fn idle(&mut self) {
        if self.sleeper.is_none() {
            return;
        }
        let since = match self.idle_since {
            Some(t) => t,
            None => {
                // A new idle time: naps start short again.
                self.idle_since = Some(self.now.0);
                self.nap_ns = NAP_MIN_NS;
                self.now.0
            }
        };
        if self.now.0.saturating_sub(since) >= IDLE_NS {
            self.sleep();
        }
    }

    #[cold]
    #[inline(never)]
    fn sleep(&mut self) {
        let until_timer = self.next_timer.0.saturating_sub(self.now.0);
        if until_timer < NAP_MIN_NS {
            return;
        }
        let bell = &self.shared.doorbells[self.idx];
        bell.going_to_sleep();
        self.arm(true);
        // The last look: what came before the flag and the arming.
        let found = self.poll_rx() > 0 || !self.shared.inbox[self.idx].is_empty() || !self.looped.is_empty();
        if found || self.shared.should_stop() {
            self.arm(false);
            self.shared.doorbells[self.idx].awake();
            self.inc(Counter::PollSleepsAborted);
            self.idle_since = None;
            return;
        }
        let start = std::time::Instant::now();
        let sleeper = self.sleeper.as_mut().expect("adaptive");
        let woke = match self.rx_intr {
            true => sleeper.wait(until_timer.div_ceil(1_000_000) as i32),
            false => {
                let ns = self.nap_ns.min(until_timer);
                self.nap_ns = (self.nap_ns * 2).min(NAP_MAX_NS);
                sleeper.nap(ns)
            }
        };
        self.arm(false);
        self.shared.doorbells[self.idx].awake();
        self.inc(Counter::PollSleeps);
        self.add(Counter::PollAsleepUs, start.elapsed().as_micros() as u64);
        self.inc(match (woke.rx, woke.bell) {
            (true, _) => Counter::PollWakesRx,
            (false, true) => Counter::PollWakesHandoff,
            (false, false) => Counter::PollWakesTimer,
        });
    }

    /// Arms (or disarms) the RX queues' interrupts, where they have them
    /// (`net_tap`'s are always armed: its calls say `ENOTSUP`).
    fn arm(&mut self, on: bool) {
        if !self.rx_intr {
            return;
        }
        for (_, q) in &self.rx {
            let _ = if on { q.intr_enable() } else { q.intr_disable() };
        }
    }
}

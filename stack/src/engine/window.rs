//! How long an idle lcore polls before it sleeps (adaptive polling), tuned
//! by how its idle times end, as KVM tunes a vCPU's halt polling
//! (`halt_poll_ns`). A poll pays when work comes back before a sleep and
//! its wake-up would have ended; when work comes back later, the poll was
//! CPU spent for nothing and the sleep's wake-up is paid on top.
//!
//! An idle time that went into a sleep is taken as the window's poll and
//! the time asleep (`Worker::tune_window`: not the time since it began,
//! which on a shared CPU also holds other threads' slices). The wake-up
//! comes some time after the work that ended it (an interrupt, the
//! scheduler: tens of microseconds on a virtual machine), so work that
//! came back within `poll_idle_us` can measure up to about twice that:
//! only more than [`LATE`] times `poll_idle_us` counts as late.
//! - An idle time that work ended while the lcore polled: the window stays.
//! - One that outlasted a window of the whole `poll_idle_us`, or lasted
//!   longer than [`LATE`] times `poll_idle_us`: its poll was lost, and no
//!   longer one is allowed: the window falls to its floor (none, or
//!   `net_tap`'s two looks), as KVM's does with `halt_poll_ns_shrink = 0`
//!   (its default for years; it halves now).
//! - One that outlasted a shorter window and ended sooner in a wake-up for
//!   work: a longer poll might have caught it: the window grows to
//!   [`GROW_START_NS`] (doubles, if longer already). When the idle time
//!   before it ended so too (work comes back steadily, later than the
//!   window), it grows at once to twice this idle time. Never past
//!   `poll_idle_us`.
//! - A sleep given up at its last look (work came as the window ended)
//!   grows the window as such a wake-up does, and never shrinks it.
//! - A sleep that ran to its timer sooner (the callback's next turn) says
//!   nothing of when work comes: the window stays.
//!
//! Where long and short idle times alternate (a QUIC handshake's client:
//! a long wait for the peer's crypto, a short one for the answer to its
//! last flight) the window stays short: each long one ends it, and a
//! single short one grows it to [`GROW_START_NS`] only. Growing at once
//! to what a short idle time needed, or halving at a long one, would have
//! it poll most of `poll_idle_us` in vain at each long one.
//!
//! An lcore whose work comes back within `poll_idle_us` (a busy flow, an
//! echo's peer answering at once) keeps a window that catches it, two
//! sleeps after a pause; one whose work comes back later (a peer that
//! computes for a millisecond between its packets, a quiet link) sleeps
//! at once, as a blocking thread would. Work that comes back just later
//! than `poll_idle_us` takes the window through none, 10 us and the whole
//! again: a third of a fixed window's loss.

/// The window a wake-up for work within `poll_idle_us` grows to from none.
pub(super) const GROW_START_NS: u64 = 10_000;
/// An idle time longer than this many times `poll_idle_us` ended too late
/// for any poll: room for the wake-up's own latency.
pub(super) const LATE: u64 = 2;

/// The idle poll's length: between a floor and `poll_idle_us`, starting
/// at `poll_idle_us`.
#[derive(Debug, Clone, Copy)]
pub(super) struct PollWindow {
    ns: u64,
    min_ns: u64,
    max_ns: u64,
    /// The last idle time that went into a sleep ended in a wake-up for
    /// work within `max_ns`.
    short_before: bool,
}

/// What an idle time's end did to the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tuned {
    Kept,
    Grown,
    Shrunk,
}

impl PollWindow {
    /// A window of `max_ns` (`poll_idle_us`) that shrinks no lower than
    /// `min_ns` (at most `max_ns`).
    pub(super) fn new(max_ns: u64, min_ns: u64) -> PollWindow {
        let min_ns = min_ns.min(max_ns);
        PollWindow { ns: max_ns, min_ns, max_ns, short_before: false }
    }

    /// How long the lcore polls idle before it sleeps.
    #[inline]
    pub(super) fn ns(&self) -> u64 {
        self.ns
    }

    /// A sleep woken for work (a frame, a hand-off) ended an idle time of
    /// `idle_ns`; `full`: the lcore polled its whole window before it
    /// slept (not a sleep begun early for threads waiting for a CPU).
    pub(super) fn woke(&mut self, idle_ns: u64, full: bool) -> Tuned {
        let late = idle_ns > self.max_ns.saturating_mul(LATE);
        // The whole of poll_idle_us polled, and work came later still.
        let lost = full && self.ns >= self.max_ns;
        if late || lost { self.close() } else { self.grow(idle_ns) }
    }

    /// A sleep that ran to its timer ended an idle time of `idle_ns`.
    pub(super) fn timed_out(&mut self, idle_ns: u64) -> Tuned {
        if idle_ns > self.max_ns.saturating_mul(LATE) { self.close() } else { Tuned::Kept }
    }

    /// A sleep given up at its last look, `idle_ns` after its idle time
    /// began: work came as the window ended (or the lcore was held up
    /// since): the window grows or stays.
    pub(super) fn aborted(&mut self, idle_ns: u64) -> Tuned {
        self.grow(idle_ns.min(self.max_ns))
    }

    /// The poll was spent for nothing: none (or the floor) from now on.
    fn close(&mut self) -> Tuned {
        self.short_before = false;
        self.set(0)
    }

    /// Work came `idle_ns` into the idle time, after the window: to the
    /// grow start (doubled, if longer already), or twice the idle time
    /// when the idle time before ended so too.
    fn grow(&mut self, idle_ns: u64) -> Tuned {
        if idle_ns <= self.ns {
            return Tuned::Kept;
        }
        let steady = if self.short_before { idle_ns.saturating_mul(2) } else { 0 };
        self.short_before = true;
        self.set(self.ns.saturating_mul(2).max(GROW_START_NS).max(steady))
    }

    fn set(&mut self, ns: u64) -> Tuned {
        let before = self.ns;
        self.ns = ns.clamp(self.min_ns, self.max_ns);
        match self.ns.cmp(&before) {
            std::cmp::Ordering::Equal => Tuned::Kept,
            std::cmp::Ordering::Greater => Tuned::Grown,
            std::cmp::Ordering::Less => Tuned::Shrunk,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    #[test]
    fn starts_at_the_configured_poll_and_keeps_it_while_work_comes_back_within_it() {
        let mut w = PollWindow::new(50 * US, 0);
        assert_eq!(w.ns(), 50 * US);
        // Caught by the poll: nothing reported, nothing tuned.
        assert_eq!(idle(&mut w, 45 * US), 45 * US);
        assert_eq!(w.ns(), 50 * US);
    }

    /// One idle time of `len_ns` under the window: the lcore polls up to
    /// the window, then sleeps until work comes. What it polled.
    fn idle(w: &mut PollWindow, len_ns: u64) -> u64 {
        let polled = len_ns.min(w.ns());
        if len_ns > w.ns() {
            w.woke(len_ns, true);
        }
        polled
    }

    #[test]
    fn work_that_comes_back_later_than_the_whole_configured_poll_ends_it() {
        let mut w = PollWindow::new(50 * US, 0);
        assert_eq!(w.woke(400 * US, true), Tuned::Shrunk);
        assert_eq!(w.ns(), 0);
        assert_eq!(w.woke(400 * US, true), Tuned::Kept, "none stays none");
        // Just after the whole configured poll: lost as well.
        let mut w = PollWindow::new(50 * US, 0);
        assert_eq!(w.woke(60 * US, true), Tuned::Shrunk);
        // A sleep that ran to the stack's idle tick is as long.
        let mut w = PollWindow::new(50 * US, 0);
        assert_eq!(w.timed_out(100_000 * US), Tuned::Shrunk);
        assert_eq!(w.ns(), 0);
    }

    #[test]
    fn a_wake_up_late_by_its_own_latency_or_a_last_look_grows_a_short_poll() {
        // A 10 us window; work 45 us into the idle time, the wake-up 30 us
        // later: a longer window would have caught it.
        let mut w = PollWindow::new(50 * US, 0);
        w.woke(1_000 * US, true);
        w.woke(15 * US, true);
        assert_eq!(w.ns(), 10 * US);
        assert_eq!(w.woke(75 * US, true), Tuned::Grown);
        assert_eq!(w.ns(), 50 * US);
        let mut w = PollWindow::new(50 * US, 0);
        w.woke(1_000 * US, true);
        assert_eq!(w.woke(101 * US, true), Tuned::Kept, "past twice the configured poll: late, none stays none");
        // A sleep begun early (threads waited for a CPU) and woken within
        // twice the configured poll: its poll was not lost.
        let mut w = PollWindow::new(50 * US, 0);
        assert_eq!(w.woke(70 * US, false), Tuned::Kept);
        assert_eq!(w.ns(), 50 * US);
        // Found at the last look after the whole window, or after the
        // lcore was held up for a millisecond: never a shrink.
        let mut w = PollWindow::new(50 * US, 0);
        assert_eq!(w.aborted(50 * US + 1), Tuned::Kept);
        assert_eq!(w.aborted(1_000 * US), Tuned::Kept);
        assert_eq!(w.ns(), 50 * US);
        w.woke(1_000 * US, true);
        assert_eq!(w.aborted(3 * US), Tuned::Grown);
        assert_eq!(w.ns(), 10 * US);
    }

    #[test]
    fn a_wake_up_for_work_within_the_configured_poll_grows_it_back() {
        let mut w = PollWindow::new(50 * US, 0);
        w.woke(1_000 * US, true);
        let mut seen = Vec::new();
        for _ in 0..3 {
            idle(&mut w, 15 * US);
            seen.push(w.ns() / US);
        }
        assert_eq!(seen, [10, 30, 30], "the grow start, then twice the idle time, which it catches");
        // Twice a longer idle time is more than the configured poll.
        w.woke(1_000 * US, true);
        assert_eq!([idle(&mut w, 45 * US), idle(&mut w, 45 * US), idle(&mut w, 45 * US)], [0, 10 * US, 45 * US]);
        assert_eq!(w.ns(), 50 * US);
        // A single short idle time between long ones: the grow start only.
        w.woke(1_000 * US, true);
        idle(&mut w, 45 * US);
        w.woke(1_000 * US, true);
        idle(&mut w, 45 * US);
        assert_eq!(w.ns(), 10 * US);
    }

    #[test]
    fn a_long_configured_poll_catches_a_steady_flow_after_two_sleeps() {
        // poll_idle_us = 10000 and datagrams 2 ms apart after a quiet
        // (kernel_poll.rs's test): 10 us, then 4 ms.
        let mut w = PollWindow::new(10_000 * US, 0);
        w.timed_out(100_000 * US);
        let sleeps = (0..30).filter(|_| idle(&mut w, 2_000 * US) < 2_000 * US).count();
        assert_eq!(sleeps, 2);
        assert_eq!(w.ns(), 4_000 * US);
    }

    #[test]
    fn a_timer_within_the_configured_poll_says_nothing() {
        let mut w = PollWindow::new(50 * US, 0);
        w.woke(1_000 * US, true);
        w.woke(15 * US, true);
        assert_eq!(w.ns(), 10 * US);
        assert_eq!(w.timed_out(40 * US), Tuned::Kept);
        assert_eq!(w.ns(), 10 * US);
    }

    #[test]
    fn a_steady_flow_keeps_the_whole_poll_and_regrows_it_after_a_pause() {
        let mut w = PollWindow::new(50 * US, 0);
        let polled: u64 = (0..100).map(|_| idle(&mut w, 20 * US)).sum();
        assert_eq!(polled, 100 * 20 * US, "every idle time caught");
        assert_eq!(w.ns(), 50 * US);
        idle(&mut w, 5_000 * US);
        let sleeps = (0..10).filter(|_| idle(&mut w, 20 * US) < 20 * US).count();
        assert_eq!(sleeps, 2, "none and 10 us slept; 40 us caught the rest");
    }

    #[test]
    fn idle_times_just_longer_than_the_configured_poll_lose_less_than_it() {
        // A fixed window loses all of its 50 us to each 60 us idle time;
        // this one cycles through none, 10 us and 50 us.
        let mut w = PollWindow::new(50 * US, 0);
        let polled: u64 = (0..99).map(|_| idle(&mut w, 60 * US)).sum();
        assert_eq!(polled, 33 * 60 * US);
    }

    #[test]
    fn alternating_long_and_short_idle_times_settle_on_a_short_window() {
        // A QUIC client's handshake: a long wait for the peer's crypto, a
        // short one for its answer to the client's last flight. A fixed
        // window polls 80 us a pair.
        let mut w = PollWindow::new(50 * US, 0);
        let polled: u64 = (0..100).map(|_| idle(&mut w, 400 * US) + idle(&mut w, 30 * US)).sum();
        assert!(polled <= 50 * US + 100 * 10 * US, "polled {} us over 100 pairs", polled / US);
    }

    #[test]
    fn keeps_its_floor_and_its_ceiling() {
        // net_tap's lcores keep two looks at their descriptors.
        let mut w = PollWindow::new(50 * US, 20 * US);
        for _ in 0..8 {
            w.woke(1_000 * US, true);
        }
        assert_eq!(w.ns(), 20 * US);
        // A floor above the configured poll is the configured poll.
        let mut w = PollWindow::new(5 * US, 20 * US);
        assert_eq!(w.woke(1_000 * US, true), Tuned::Kept);
        assert_eq!(w.ns(), 5 * US);
        // poll_idle_us = 0: nothing to tune.
        let mut w = PollWindow::new(0, 0);
        assert_eq!(w.woke(3 * US, true), Tuned::Kept);
        assert_eq!(w.ns(), 0);
    }
}

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
//! - One longer than [`LATE`] times `poll_idle_us`: its poll was lost: the
//!   window falls to its floor (none, or `net_tap`'s two looks), as KVM's
//!   does with `halt_poll_ns_shrink = 0` (its default for years; it halves
//!   now).
//! - One that outlasted the window and ended sooner in a wake-up for work:
//!   a longer poll might have caught it: the window grows to
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
//! at once, as a blocking thread would.

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

    /// A sleep given up at its last look, `idle_ns` after its idle time
    /// began: work came as the window ended (or the lcore was held up
    /// since): the window grows or stays.
    pub(super) fn aborted(&mut self, idle_ns: u64) -> Tuned {
        self.ended(idle_ns.min(self.max_ns), true)
    }

    /// How long the lcore polls idle before it sleeps.
    #[inline]
    pub(super) fn ns(&self) -> u64 {
        self.ns
    }

    /// An idle time that went past the window into a sleep (or a sleep
    /// given up at its last look) ended `idle_ns` after it began: woken for
    /// work (a frame, a hand-off, work found at the last look), or by its
    /// timer.
    pub(super) fn ended(&mut self, idle_ns: u64, for_work: bool) -> Tuned {
        let before = self.ns;
        if idle_ns > self.max_ns.saturating_mul(LATE) {
            self.ns = 0;
            self.short_before = false;
        } else if for_work && idle_ns > self.ns {
            let steady = if self.short_before { idle_ns.saturating_mul(2) } else { 0 };
            self.ns = (self.ns * 2).max(GROW_START_NS).max(steady);
            self.short_before = true;
        }
        self.ns = self.ns.clamp(self.min_ns, self.max_ns);
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
        // A sleep woken for work 50 us in at most: nothing to grow into.
        assert_eq!(w.ended(50 * US, true), Tuned::Kept);
        assert_eq!(w.ns(), 50 * US);
    }

    /// One idle time of `len_ns` under the window: the lcore polls up to
    /// the window, then sleeps until work comes. What it polled.
    fn idle(w: &mut PollWindow, len_ns: u64) -> u64 {
        let polled = len_ns.min(w.ns());
        if len_ns > w.ns() {
            w.ended(len_ns, true);
        }
        polled
    }

    #[test]
    fn work_that_comes_back_later_than_the_configured_poll_ends_the_poll() {
        let mut w = PollWindow::new(50 * US, 0);
        assert_eq!(w.ended(400 * US, true), Tuned::Shrunk);
        assert_eq!(w.ns(), 0);
        assert_eq!(w.ended(400 * US, true), Tuned::Kept, "none stays none");
        // A sleep that ran to the stack's idle tick is as long.
        let mut w = PollWindow::new(50 * US, 0);
        assert_eq!(w.ended(100_000 * US, false), Tuned::Shrunk);
        assert_eq!(w.ns(), 0);
    }

    #[test]
    fn a_wake_up_late_by_its_own_latency_or_a_last_look_keeps_the_poll() {
        // Work 45 us into the idle time, the wake-up 30 us later.
        let mut w = PollWindow::new(50 * US, 0);
        assert_eq!(w.ended(75 * US, true), Tuned::Kept);
        assert_eq!(w.ended(100 * US, true), Tuned::Kept);
        assert_eq!(w.ns(), 50 * US);
        assert_eq!(w.ended(101 * US, true), Tuned::Shrunk, "past twice the configured poll: late");
        // Found at the last look after the whole window, or after the
        // lcore was held up for a millisecond: never a shrink.
        let mut w = PollWindow::new(50 * US, 0);
        assert_eq!(w.aborted(50 * US + 1), Tuned::Kept);
        assert_eq!(w.aborted(1_000 * US), Tuned::Kept);
        assert_eq!(w.ns(), 50 * US);
        w.ended(1_000 * US, true);
        assert_eq!(w.aborted(3 * US), Tuned::Grown);
        assert_eq!(w.ns(), 10 * US);
    }

    #[test]
    fn a_wake_up_for_work_within_the_configured_poll_grows_it_back() {
        let mut w = PollWindow::new(50 * US, 0);
        w.ended(1_000 * US, true);
        let mut seen = Vec::new();
        for _ in 0..3 {
            idle(&mut w, 15 * US);
            seen.push(w.ns() / US);
        }
        assert_eq!(seen, [10, 30, 30], "the grow start, then twice the idle time, which it catches");
        // Twice a longer idle time is more than the configured poll.
        w.ended(1_000 * US, true);
        assert_eq!([idle(&mut w, 45 * US), idle(&mut w, 45 * US), idle(&mut w, 45 * US)], [0, 10 * US, 45 * US]);
        assert_eq!(w.ns(), 50 * US);
        // A single short idle time between long ones: the grow start only.
        w.ended(1_000 * US, true);
        idle(&mut w, 45 * US);
        w.ended(1_000 * US, true);
        idle(&mut w, 45 * US);
        assert_eq!(w.ns(), 10 * US);
        // Work the window catches: nothing to tune.
        let mut w = PollWindow::new(50 * US, 0);
        assert_eq!(idle(&mut w, 5 * US), 5 * US);
        assert_eq!(w.ns(), 50 * US);
    }

    #[test]
    fn a_long_configured_poll_catches_a_steady_flow_after_two_sleeps() {
        // poll_idle_us = 10000 and datagrams 2 ms apart after a quiet
        // (kernel_poll.rs's test): 10 us, then 4 ms.
        let mut w = PollWindow::new(10_000 * US, 0);
        w.ended(100_000 * US, false);
        let sleeps = (0..30).filter(|_| idle(&mut w, 2_000 * US) < 2_000 * US).count();
        assert_eq!(sleeps, 2);
        assert_eq!(w.ns(), 4_000 * US);
    }

    #[test]
    fn a_timer_within_the_configured_poll_says_nothing() {
        let mut w = PollWindow::new(50 * US, 0);
        w.ended(1_000 * US, true);
        w.ended(15 * US, true);
        assert_eq!(w.ns(), 10 * US);
        assert_eq!(w.ended(40 * US, false), Tuned::Kept);
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
            w.ended(1_000 * US, true);
        }
        assert_eq!(w.ns(), 20 * US);
        // A floor above the configured poll is the configured poll.
        let mut w = PollWindow::new(5 * US, 20 * US);
        assert_eq!(w.ended(1_000 * US, true), Tuned::Kept);
        assert_eq!(w.ns(), 5 * US);
        // poll_idle_us = 0: nothing to tune.
        let mut w = PollWindow::new(0, 0);
        assert_eq!(w.ended(3 * US, true), Tuned::Kept);
        assert_eq!(w.ns(), 0);
    }
}

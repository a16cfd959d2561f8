//! How long an idle lcore polls before it sleeps (adaptive polling), tuned
//! by how its idle times end, as KVM tunes a vCPU's halt polling
//! (`halt_poll_ns`). A poll pays when work comes back before a sleep and
//! its wake-up would have ended; when work comes back later, the poll was
//! CPU spent for nothing and the sleep's wake-up is paid on top.
//!
//! An idle time that went into a sleep is taken as what the lcore polled
//! of it and the time asleep (`Worker::tune_window`: not the time since
//! it began, which on a shared CPU also holds other threads' slices). The
//! wake-up comes some time after the work that ended it (an interrupt,
//! the scheduler: tens of microseconds on a virtual machine, more under
//! load), so an idle time counts as late only past `poll_idle_us` and as
//! much again, at least [`WAKE_ROOM_NS`].
//! - An idle time that work ended while the lcore polled: the window stays.
//! - One that outlasted a window of the whole `poll_idle_us` polled to its
//!   end (not a sleep begun early for threads waiting for a CPU), or a
//!   late one: its poll was lost, and no longer one is allowed: the window
//!   falls to its floor (none, or `net_tap`'s two looks), as KVM's does
//!   with `halt_poll_ns_shrink = 0` (its default for years; it halves
//!   now).
//! - One that outlasted a shorter window and ended in a wake-up for work
//!   before it was late (a short idle time), when one before it since the
//!   window last closed ended so too (work comes back steadily, later than
//!   the window): a longer poll would have caught it: the window grows to
//!   twice this idle time (or twice itself, if more), never past
//!   `poll_idle_us`. At first ([`GROW_AFTER`]) the first short idle time
//!   after the window closed only counts.
//! - A window so opened that closes before it caught [`REPAID`] idle times
//!   (ones that work ended while the lcore polled past its floor) did not
//!   pay for its loss: from then on one short idle time more opens it, up
//!   to [`GROW_AFTER_MAX`]; once a window catches [`REPAID`], two open it
//!   again.
//! - A sleep given up at its last look before any sleep of the idle time
//!   (work came as the window ended) counts as a short idle time, and
//!   never shrinks the window.
//! - A sleep that ran to its timer before it was late (the callback's
//!   next turn) says nothing of when work comes: the window stays.
//! - After [`PROBE_AFTER`] idle times in a row with the window closed, the
//!   next polls the whole `poll_idle_us` once: wake-ups slow enough to
//!   make a steady flow's idle times count as late would otherwise keep
//!   it closed for good. A lost probe closes it again, at a cost of at
//!   most `poll_idle_us` / [`PROBE_AFTER`] an idle time.
//!
//! Where long and short idle times alternate (a QUIC handshake: a long
//! wait for the peer's crypto, a short one for its acknowledgement or its
//! answer to the last flight) the window stays closed: each long one
//! ends it, and a short one between two long ones does not open it.
//! Growing at a single short one, or halving at a long one, would have it
//! poll in vain at each long one. A QUIC server's handshake has two short
//! ones between its long ones (the client's last flight, then its close
//! and next connection): the second opened the window just before the
//! long one, which took its whole poll (0.7 times a handshake, measured);
//! after one such loss the window asks a third, and stays closed.
//!
//! An lcore whose work comes back within `poll_idle_us` (a busy flow, an
//! echo's peer answering at once) keeps a window that catches it, two
//! sleeps after a pause; one whose work comes back later (a peer that
//! computes for a millisecond between its packets, a quiet link) sleeps
//! at once, as a blocking thread would. Work that comes back just later
//! than `poll_idle_us` takes the window through none, none and the whole
//! again, then through one none more each time, up to eight: it loses a
//! ninth of what a fixed window would.

/// The room left past `poll_idle_us` for a wake-up's own latency before an
/// idle time counts as late: `poll_idle_us` again, at least this (the
/// latency is a time of its own, not a share of the poll).
pub(super) const WAKE_ROOM_NS: u64 = 50_000;
/// Idle times in a row with the window closed before one polls the whole
/// `poll_idle_us` again (`PollWindow::probe`).
pub(super) const PROBE_AFTER: u32 = 64;

/// Short idle times since the window last closed that open it, at first.
pub(super) const GROW_AFTER: u32 = 2;
/// The most short idle times a window that keeps losing its poll asks
/// before it opens.
pub(super) const GROW_AFTER_MAX: u32 = 8;
/// Idle times an opened window must catch before it closes to have paid
/// for its loss: its poll (up to `poll_idle_us`) against the sleeps it
/// spared, tens of microseconds of CPU each on a virtual machine.
pub(super) const REPAID: u32 = 2;

/// The idle poll's length: between a floor and `poll_idle_us`, starting
/// at `poll_idle_us`.
#[derive(Debug, Clone, Copy)]
pub(super) struct PollWindow {
    ns: u64,
    min_ns: u64,
    max_ns: u64,
    /// Idle times since the window last closed that ended in a wake-up for
    /// work (or at the last look) after the window and before they were
    /// late.
    shorts: u32,
    /// How many such idle times open the window: [`GROW_AFTER`], one more
    /// each time an opened window closed without having paid for itself.
    grow_after: u32,
    /// The window was opened by short idle times (not a probe, not the
    /// start) and has not closed since.
    opened: bool,
    /// Idle times the window caught since it opened (none while it is
    /// closed: [`caught`](Self::caught) counts only past the floor, and
    /// closing starts it over).
    catches: u32,
    /// Idle times in a row that left the window closed.
    closed_run: u32,
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
        PollWindow {
            ns: max_ns,
            min_ns,
            max_ns,
            shorts: 0,
            grow_after: GROW_AFTER,
            opened: false,
            catches: 0,
            closed_run: 0,
        }
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
        // The whole of poll_idle_us polled, and work came later still.
        let lost = full && self.ns >= self.max_ns;
        let tuned = if self.late(idle_ns) || lost { self.close() } else { self.grow(idle_ns) };
        self.probe(tuned)
    }

    /// An idle time ended in work while the lcore polled its window (no
    /// sleep): the window stays; once it caught [`REPAID`] of them, short
    /// idle times open it as readily as at first again. One caught by the
    /// floor alone (`net_tap`'s looks, a closed window) says nothing.
    pub(super) fn caught(&mut self) {
        if self.ns <= self.min_ns {
            return;
        }
        self.catches = self.catches.saturating_add(1);
        if self.catches >= REPAID {
            self.grow_after = GROW_AFTER;
        }
    }

    /// A sleep that ran to its timer ended an idle time of `idle_ns`.
    pub(super) fn timed_out(&mut self, idle_ns: u64) -> Tuned {
        let tuned = if self.late(idle_ns) { self.close() } else { Tuned::Kept };
        self.probe(tuned)
    }

    /// After [`PROBE_AFTER`] idle times in a row that left the window
    /// closed, the next polls the whole `poll_idle_us` once: a steady flow
    /// whose wake-ups are slow enough to make its idle times count as late
    /// is caught again (and keeps the window); else that poll is lost and
    /// closes it, at most `poll_idle_us` / [`PROBE_AFTER`] an idle time.
    fn probe(&mut self, tuned: Tuned) -> Tuned {
        if self.ns > self.min_ns || self.min_ns == self.max_ns {
            self.closed_run = 0;
            return tuned;
        }
        self.closed_run += 1;
        if self.closed_run < PROBE_AFTER {
            return tuned;
        }
        self.closed_run = 0;
        self.set(self.max_ns)
    }

    /// Work came too late for any poll, with room for the wake-up.
    fn late(&self, idle_ns: u64) -> bool {
        idle_ns > self.max_ns.saturating_add(self.max_ns.max(WAKE_ROOM_NS))
    }

    /// A sleep given up at its last look, `idle_ns` after its idle time
    /// began: work came as the window ended (or the lcore was held up
    /// since): the window grows or stays.
    pub(super) fn aborted(&mut self, idle_ns: u64) -> Tuned {
        self.grow(idle_ns.min(self.max_ns))
    }

    /// The poll was spent for nothing: none (or the floor) from now on. A
    /// window that short idle times opened and that caught fewer than
    /// [`REPAID`] before this loss asks one short idle time more before it
    /// opens again (at most [`GROW_AFTER_MAX`]).
    fn close(&mut self) -> Tuned {
        if std::mem::take(&mut self.opened) && self.catches < REPAID {
            self.grow_after = (self.grow_after + 1).min(GROW_AFTER_MAX);
        }
        self.catches = 0;
        self.shorts = 0;
        self.set(0)
    }

    /// Work came `idle_ns` into the idle time, after the window and before
    /// it was late: once `grow_after` have since the window last closed
    /// (this one included), the window grows to twice this one (or twice
    /// itself); before, this one is counted.
    fn grow(&mut self, idle_ns: u64) -> Tuned {
        if idle_ns <= self.ns {
            return Tuned::Kept;
        }
        self.shorts = self.shorts.saturating_add(1);
        if self.shorts < self.grow_after {
            return Tuned::Kept;
        }
        let closed = self.ns <= self.min_ns;
        let tuned = self.set(self.ns.max(idle_ns).saturating_mul(2));
        if closed && tuned == Tuned::Grown {
            self.opened = true;
        }
        tuned
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
        } else {
            w.caught();
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
    fn a_wake_up_late_by_its_own_latency_or_a_last_look_still_counts_as_short() {
        // Work 45 us into the idle time, the wake-up 30 us later, twice: a
        // window would have caught it.
        let mut w = PollWindow::new(50 * US, 0);
        w.woke(1_000 * US, true);
        assert_eq!(w.woke(75 * US, true), Tuned::Kept, "one counts");
        assert_eq!(w.woke(75 * US, true), Tuned::Grown, "two open");
        assert_eq!(w.ns(), 50 * US);
        let mut w = PollWindow::new(50 * US, 0);
        w.woke(1_000 * US, true);
        w.woke(100 * US, true);
        assert_eq!(w.woke(100 * US, true), Tuned::Grown, "the configured poll and as much room");
        let mut w = PollWindow::new(50 * US, 0);
        w.woke(1_000 * US, true);
        w.woke(100 * US, true);
        assert_eq!(w.woke(101 * US, true), Tuned::Kept, "late: none stays none");
        assert_eq!(w.woke(100 * US, true), Tuned::Kept, "and the mark went with it");
        // A short configured poll still leaves 50 us of room.
        let mut w = PollWindow::new(10 * US, 0);
        w.woke(1_000 * US, true);
        w.woke(60 * US, true);
        assert_eq!(w.woke(60 * US, true), Tuned::Grown);
        let mut w = PollWindow::new(10 * US, 0);
        w.woke(1_000 * US, true);
        w.woke(60 * US, true);
        assert_eq!(w.woke(61 * US, true), Tuned::Kept);
        // The room is the configured poll again past 50 us.
        let mut w = PollWindow::new(1_000 * US, 0);
        w.woke(10_000 * US, true);
        w.woke(2_000 * US, true);
        assert_eq!(w.woke(2_000 * US, true), Tuned::Grown);
        // A sleep begun early (threads waited for a CPU) and woken before
        // it was late: its poll was not lost.
        let mut w = PollWindow::new(50 * US, 0);
        assert_eq!(w.woke(70 * US, false), Tuned::Kept);
        assert_eq!(w.ns(), 50 * US);
        // Found at the last look after the whole window, or after the
        // lcore was held up for a millisecond: never a shrink.
        let mut w = PollWindow::new(50 * US, 0);
        assert_eq!(w.aborted(50 * US + 1), Tuned::Kept);
        assert_eq!(w.aborted(1_000 * US), Tuned::Kept);
        assert_eq!(w.ns(), 50 * US);
        // With the window closed, two found at the last look open it.
        w.woke(1_000 * US, true);
        assert_eq!(w.aborted(3 * US), Tuned::Kept);
        assert_eq!(w.aborted(3 * US), Tuned::Grown);
        assert_eq!(w.ns(), 6 * US);
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
        assert_eq!(seen, [0, 30, 30], "counted, then twice the idle time, which it catches");
        // Twice a longer idle time is more than the configured poll.
        let mut w = PollWindow::new(50 * US, 0);
        w.woke(1_000 * US, true);
        assert_eq!([idle(&mut w, 45 * US), idle(&mut w, 45 * US), idle(&mut w, 45 * US)], [0, 0, 45 * US]);
        assert_eq!(w.ns(), 50 * US);
        // Short idle times each between long ones: never opened.
        let polled: u64 = (0..10).map(|_| idle(&mut w, 1_000 * US) + idle(&mut w, 45 * US)).sum();
        assert_eq!(polled, 50 * US, "the first long one only");
        assert_eq!(w.ns(), 0);
    }

    #[test]
    fn a_long_configured_poll_catches_a_steady_flow_after_two_sleeps() {
        // poll_idle_us = 10000 and datagrams 2 ms apart after a quiet
        // (kernel_poll.rs's test): counted, then 4 ms.
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
        w.woke(15 * US, true);
        assert_eq!(w.ns(), 30 * US);
        assert_eq!(w.timed_out(40 * US), Tuned::Kept);
        assert_eq!(w.ns(), 30 * US);
    }

    #[test]
    fn a_steady_flow_keeps_the_whole_poll_and_regrows_it_after_a_pause() {
        let mut w = PollWindow::new(50 * US, 0);
        let polled: u64 = (0..100).map(|_| idle(&mut w, 20 * US)).sum();
        assert_eq!(polled, 100 * 20 * US, "every idle time caught");
        assert_eq!(w.ns(), 50 * US);
        idle(&mut w, 5_000 * US);
        let sleeps = (0..10).filter(|_| idle(&mut w, 20 * US) < 20 * US).count();
        assert_eq!(sleeps, 2, "two slept at none; 40 us caught the rest");
    }

    #[test]
    fn idle_times_just_longer_than_the_configured_poll_lose_less_than_it() {
        // A fixed window loses all of its 50 us to each 60 us idle time.
        // This one loses its first, then opens after two, three... eight
        // of them, each opening lost: 14 of 99.
        let mut w = PollWindow::new(50 * US, 0);
        let polled: u64 = (0..99).map(|_| idle(&mut w, 60 * US)).sum();
        assert_eq!(polled, 14 * 50 * US);
        // From then on, a ninth.
        let polled: u64 = (0..900).map(|_| idle(&mut w, 60 * US)).sum();
        assert_eq!(polled, 100 * 50 * US);
    }

    #[test]
    fn a_quic_server_s_two_short_idle_times_between_long_ones_keep_the_window_closed() {
        // Its handshake: the client's crypto (200 us), then the client's
        // last flight (70 us through a sleep) and its close and next
        // connection (60 us). The second short one opened the window
        // just before the long one, every handshake: 50 us lost each.
        let mut w = PollWindow::new(50 * US, 0);
        let polled: u64 =
            (0..100).map(|_| idle(&mut w, 200 * US) + idle(&mut w, 70 * US) + idle(&mut w, 60 * US)).sum();
        // The first long one, the one opening, then a probe every 64 idle
        // times, each lost (the short ones outlast 50 us too): 300 us.
        assert_eq!(polled, 2 * 50 * US + 4 * 50 * US, "polled {} us over 100 handshakes", polled / US);
        assert_eq!(w.ns(), 0);
    }

    #[test]
    fn a_window_that_catches_enough_keeps_opening_and_a_flow_turned_steady_reopens_it() {
        // Four short idle times between long ones: the window opens at the
        // second and catches the next two, which pays for its loss.
        let mut w = PollWindow::new(50 * US, 0);
        let mut caught = 0;
        for _ in 0..20 {
            idle(&mut w, 1_000 * US);
            for _ in 0..4 {
                caught += usize::from(idle(&mut w, 40 * US) > 0);
            }
        }
        assert_eq!(caught, 20 * 2, "two caught each time");
        // After the handshake's pattern made it ask for more, a steady
        // flow opens it after three sleeps, then after two again.
        let mut w = PollWindow::new(50 * US, 0);
        for _ in 0..10 {
            idle(&mut w, 200 * US);
            idle(&mut w, 70 * US);
            idle(&mut w, 60 * US);
        }
        idle(&mut w, 200 * US);
        let sleeps = (0..10).filter(|_| idle(&mut w, 20 * US) < 20 * US).count();
        assert_eq!(sleeps, 3);
        idle(&mut w, 5_000 * US);
        let sleeps = (0..10).filter(|_| idle(&mut w, 20 * US) < 20 * US).count();
        assert_eq!(sleeps, 2);
    }

    #[test]
    fn a_steady_flow_regrows_the_poll_through_a_slow_wake_up() {
        // 20 us gaps, each sleep's wake-up 60 us late (a loaded host): the
        // measured idle times stay under the room, and the window grows
        // back to catch the flow.
        let mut w = PollWindow::new(50 * US, 0);
        w.timed_out(100_000 * US);
        assert_eq!(slow_sleeps(&mut w, 10, 20 * US, 60 * US), 2);
        assert_eq!(w.ns(), 50 * US);
    }

    /// `n` idle times of `gap_ns`, each sleep's wake-up `late_ns` after its
    /// work: how many slept.
    fn slow_sleeps(w: &mut PollWindow, n: usize, gap_ns: u64, late_ns: u64) -> usize {
        let mut sleeps = 0;
        for _ in 0..n {
            if w.ns() < gap_ns {
                sleeps += 1;
                w.woke(gap_ns + late_ns, true);
            } else {
                w.caught();
            }
        }
        sleeps
    }

    #[test]
    fn alternating_long_and_short_idle_times_keep_the_window_closed_but_for_probes() {
        // A QUIC client's handshake: a long wait for the peer's crypto, a
        // short one for its answer to the client's last flight. A fixed
        // window polls 80 us a pair, 8,000 over 100.
        let mut w = PollWindow::new(50 * US, 0);
        let polled: u64 = (0..100).map(|_| idle(&mut w, 400 * US) + idle(&mut w, 30 * US)).sum();
        // The first long one, then a probe every 64 idle times (at most
        // 50 us each, and one that meets a short idle time catches it).
        assert!(polled <= 50 * US + 4 * 50 * US, "polled {} us over 100 pairs", polled / US);
        assert!(polled >= 50 * US + 2 * 30 * US, "the probes ran: {} us", polled / US);
    }

    #[test]
    fn a_probe_finds_a_steady_flow_that_slow_wake_ups_made_late() {
        // 20 us gaps, each wake-up 90 us late: 110 us, late for a 50 us
        // poll; closed, the window would stay closed for good.
        let mut w = PollWindow::new(50 * US, 0);
        w.timed_out(100_000 * US);
        let sleeps = slow_sleeps(&mut w, 200, 20 * US, 90 * US);
        assert_eq!(sleeps, PROBE_AFTER as usize - 1, "until the probe, which catches the flow and keeps the window");
        assert_eq!(w.ns(), 50 * US);
        // A quiet link probes once every 64 of its timer's ticks.
        let mut w = PollWindow::new(50 * US, 0);
        let grown = (0..128).filter(|_| w.timed_out(100_000 * US) == Tuned::Grown).count();
        assert_eq!(grown, 2);
        // A floor that is the whole poll has nothing to probe.
        let mut w = PollWindow::new(20 * US, 20 * US);
        assert!((0..128).all(|_| w.timed_out(100_000 * US) == Tuned::Kept));
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

//! The queueing stage: the burst's datagrams that found a socket go to
//! its receive queue, a share of them per socket under one lock; datagrams
//! whose socket changed since the lookup are looked up again.
//!
//! The loop iteration's last burst waits for the application's callback:
//! a run-to-completion reader takes each socket's share where it lies
//! ([`LcoreCtx::recv_staged`]), without the queue's locks, copies and
//! charges on either side, and what it does not take is queued after the
//! callback returns. An earlier burst of the same iteration (a second RX
//! queue, frames another lcore handed over) is queued before the next one
//! is staged, so at most one burst's mbufs (and its `GROUP_COPIES` copies
//! of group datagrams) wait uncharged.
//!
//! Staging sorts nothing: each binding (socket) of the lcore's snapshot
//! has a share of its own, found by the binding's index, and the burst
//! notes the order in which shares got their first datagram. A burst that
//! reuseport spread over many sockets costs one push per datagram and one
//! queue append per socket, and every socket's datagrams keep the order
//! they arrived in.

use std::sync::atomic::Ordering;

use arrayvec::ArrayVec;

use super::{LcoreCtx, Worker};
use crate::datagram::{Datagram, Staged};
use crate::rx_queue::Refusal;
use crate::shared::{BURST, GROUP_COPIES};
use crate::stats::Counter;

/// Shares whose order the staging keeps inline: what a burst of
/// datagrams to as many sockets and its group copies stage. More (which
/// no burst reaches today) go on in a vector of their own.
const ORDER: usize = BURST + GROUP_COPIES;

/// The burst's staged datagrams, grouped by socket as they arrive
/// (generic, so the unit tests below stage plain values; the lcores stage
/// [`Datagram`]s).
#[derive(Debug)]
pub(super) struct Staging<D = Datagram> {
    /// Each binding index's share, in arrival order: made with a burst's
    /// room (512 bytes of [`Datagram`]s, as a socket's queue holds for
    /// each lcore) for every index up to the largest staged, the first
    /// time one is, and kept with its buffer, so nothing is allocated per
    /// datagram. A buffer changes hands without a copy where it can: with
    /// a socket's empty queue (the same room) and with the callback's
    /// empty batch ([`Staged::move_to`]: a batch with more room leaves its
    /// buffer here), so a share holds a burst's room or, at most, that of
    /// the largest batch the callback moved datagrams into.
    shares: Vec<Vec<D>>,
    /// The binding indices whose share is not empty, in the order their
    /// first datagram arrived: the first [`ORDER`] here (no capacity
    /// test of a vector's), the rest in `spill`.
    order: ArrayVec<u32, ORDER>,
    spill: Vec<u32>,
    /// Datagrams staged: counted delivered with the burst, less those a
    /// queue refuses or a re-lookup counts itself.
    staged: u64,
    /// Datagrams the callback took.
    taken: u64,
    /// How many of the staged datagrams arrived over IPv4 (declared apart
    /// from `staged`: side by side, as rustc lays out these fields in
    /// practice, the compiler made the two increments one vector add of
    /// four instructions).
    staged_v4: u64,
}

impl<D> Staging<D> {
    pub(super) fn new() -> Staging<D> {
        Staging { shares: Vec::new(), order: ArrayVec::new(), spill: Vec::new(), staged: 0, staged_v4: 0, taken: 0 }
    }

    /// Adds `d` to binding `index`'s share; returns where it went (binding
    /// index, position), for a GRO train to grow it.
    #[inline(always)]
    pub(super) fn push(&mut self, index: u32, v4: bool, d: D) -> (usize, usize) {
        let r = index as usize;
        self.staged += 1;
        self.staged_v4 += v4 as u64;
        let share = match self.shares.get_mut(r) {
            Some(share) => share,
            None => grow_shares(&mut self.shares, r),
        };
        if share.is_empty()
            && let Err(full) = self.order.try_push(index)
        {
            spill(&mut self.spill, full.element());
        }
        share.push(d);
        (r, share.len() - 1)
    }

    /// The staged datagram at `at` (from [`push`](Self::push)).
    pub(super) fn get_mut(&mut self, (r, i): (usize, usize)) -> &mut D {
        &mut self.shares[r][i]
    }

    /// The binding indices whose share is not empty, in the order their
    /// first datagram arrived.
    fn ordered(&self) -> impl Iterator<Item = u32> + '_ {
        self.order.iter().chain(&self.spill).copied()
    }

    /// Forgets the burst's shares (each already emptied by its delivery).
    #[inline]
    fn reset(&mut self) {
        debug_assert!(self.ordered().all(|i| self.shares[i as usize].is_empty()), "a share left full");
        self.order.clear();
        self.spill.clear();
        (self.staged, self.staged_v4, self.taken) = (0, 0, 0);
    }
}

/// Notes a share past the first [`ORDER`] of a burst.
#[cold]
fn spill(spill: &mut Vec<u32>, index: u32) {
    spill.push(index);
}

/// Shares up to binding index `r`, each with a burst's room (the room a
/// socket's empty queue swaps for its own); returns `r`'s.
#[cold]
fn grow_shares<D>(shares: &mut Vec<Vec<D>>, r: usize) -> &mut Vec<D> {
    shares.resize_with(r + 1, || Vec::with_capacity(BURST));
    &mut shares[r]
}

impl Staging<Datagram> {
    /// Notes `ns` as the receive time of every staged datagram.
    #[cold]
    pub(super) fn stamp(&mut self, ns: u64) {
        for index in self.order.iter().chain(&self.spill) {
            // (Not `ordered()`: its borrow of the whole staging would
            // keep the shares from being written.)
            for d in &mut self.shares[*index as usize] {
                d.stamp(ns);
            }
        }
    }
}

impl LcoreCtx<'_> {
    /// Lends `f` the datagrams this lcore received in the loop iteration's
    /// last burst, socket by socket, where they lie: `f(id, staged)` for
    /// each socket ([`UdpSocket::id`](crate::UdpSocket::id)), in the order
    /// its first datagram arrived, each socket's in arrival order. No lock,
    /// copy or memory charge on the lcore's side or the reader's: the
    /// run-to-completion read. The datagrams `f` takes are the callback's,
    /// as [`recv_batch`](crate::UdpSocket::recv_batch) would make them,
    /// and are counted delivered; those it leaves are queued when the
    /// callback returns.
    ///
    /// A socket whose receive queue holds datagrams already (what an
    /// earlier callback left, an earlier burst of this iteration: a
    /// second RX queue, frames another lcore handed over, another lcore's
    /// flows) is passed over, so that each flow keeps its order: its
    /// datagrams of this burst are queued behind the others when the
    /// callback returns, and the socket is named in [`ready`](Self::ready)
    /// then. So is a socket that changed (connected, left its group,
    /// closed) since the lookup: its datagrams are looked up again. A
    /// socket's pending error (ICMP) is not reported here: `recv_batch`
    /// reports it. A callback that reads only with `recv_batch` gets the
    /// same datagrams one iteration later, through the queues; a thread
    /// reading the socket, as soon as the callback returns.
    pub fn recv_staged(&self, mut f: impl FnMut(u64, Staged<'_>)) {
        // A callback that calls this from `f` finds nothing more.
        let Ok(mut staged) = self.staged.try_borrow_mut() else { return };
        let Staging { shares, order, spill, taken, .. } = &mut **staged;
        self.lend(shares, order, taken, &mut f);
        if !spill.is_empty() {
            self.lend(shares, spill, taken, &mut f);
        }
    }

    /// [`recv_staged`](Self::recv_staged) for the shares of `order`.
    #[inline(always)]
    fn lend(&self, shares: &mut [Vec<Datagram>], order: &[u32], taken: &mut u64, f: &mut impl FnMut(u64, Staged<'_>)) {
        for &index in order {
            let share = &mut shares[index as usize];
            if share.is_empty() {
                // Taken by an earlier call in this iteration.
                continue;
            }
            let b = self.snapshot.get(index);
            // A socket that changed after the lookup: looked up again when
            // the shares are queued.
            if b.sock.epoch.load(Ordering::Acquire) != b.epoch || !b.sock.queue.looks_empty() {
                continue;
            }
            let n = share.len() as u64;
            f(b.id, Staged::new(share));
            // All or none: none, and they are queued after the callback.
            // (What is counted delivered comes from the count of what was
            // staged, less what a queue refuses; this one only says
            // whether anything is left to queue, so a callback that
            // panics after taking them leaves an empty share to the
            // queueing, which skips it.)
            if share.is_empty() {
                *taken += n;
            }
        }
    }
}

impl Worker<'_> {
    /// Queues the burst's datagrams to their sockets: each socket's share
    /// with one lock, the shares in the order their sockets first appeared.
    /// The burst's delivered datagrams are counted once, after them all
    /// (those a re-lookup takes, by it).
    /// Called before a burst is staged too (nothing staged: one load), so
    /// that at most one burst waits for the callback.
    #[inline]
    pub(super) fn deliver_staged(&mut self) {
        self.group_copies = 0;
        if self.staging.order.is_empty() {
            return;
        }
        let staging = &mut self.staging;
        if staging.taken == staging.staged {
            // The callback took them all: only the counting is left.
            let (delivered, v4) = (staging.staged, staging.staged_v4);
            staging.reset();
            self.count_delivered(delivered, v4);
            return;
        }
        self.queue_staged();
    }

    /// Counts `delivered` datagrams, `v4` of them IPv4, delivered.
    #[inline(always)]
    fn count_delivered(&mut self, delivered: u64, v4: u64) {
        self.add(Counter::RxDelivered, delivered);
        self.add(Counter::UdpInDatagrams, v4);
        self.add(Counter::Udp6InDatagrams, delivered - v4);
    }

    /// [`deliver_staged`](Self::deliver_staged) when some are left to queue.
    #[inline(never)]
    fn queue_staged(&mut self) {
        // Every datagram staged, less those refused and those a re-lookup
        // counts itself.
        let (mut delivered, mut v4) = (self.staging.staged, self.staging.staged_v4);
        for k in 0..self.staging.order.len() {
            let (n, n4) = self.queue_share(self.staging.order[k]);
            (delivered, v4) = (delivered - n, v4 - n4);
        }
        for k in 0..self.staging.spill.len() {
            let (n, n4) = self.queue_share(self.staging.spill[k]);
            (delivered, v4) = (delivered - n, v4 - n4);
        }
        self.staging.reset();
        self.count_delivered(delivered, v4);
        if !self.wakers.is_empty() {
            self.wake_tasks();
        }
    }

    /// Queues binding `index`'s share; returns how many of its datagrams
    /// (and how many IPv4) are not counted with the burst: those its queue
    /// refused, and those a re-lookup counted itself.
    #[inline(always)]
    fn queue_share(&mut self, index: u32) -> (u64, u64) {
        // The fields apart, so the share's datagrams go to the queue where
        // they lie (no move of the `Vec` in and out).
        let share = &mut self.staging.shares[index as usize];
        if share.is_empty() {
            // The callback took them all.
            return (0, 0);
        }
        let b = self.snapshot.get(index);
        if b.sock.epoch.load(Ordering::Acquire) != b.epoch {
            // The socket changed (connected, left its group, closed)
            // after this snapshot: look again in the current one.
            let mut datagrams = std::mem::take(share);
            let counted = self.redeliver(&mut datagrams);
            self.staging.shares[index as usize] = datagrams;
            return counted;
        }
        let offered = share.len();
        let refusal = b.sock.queue.push_batch_gathering(self.idx, share, Some(&mut self.wakers));
        let accepted = offered - share.len();
        if accepted > 0 {
            mark_ready(&mut self.ready, &mut self.ready_bits, b.id);
        }
        let Err(refusal) = refusal else { return (0, 0) };
        let mut datagrams = std::mem::take(share);
        let counted = self.refused(&mut datagrams, refusal);
        self.staging.shares[index as usize] = datagrams;
        counted
    }

    /// Wakes the tasks waiting on the sockets the burst reached, once the
    /// whole burst is queued: at most one wake per socket per burst.
    #[cold]
    fn wake_tasks(&mut self) {
        for w in self.wakers.drain(..) {
            crate::rx_queue::wake_task(Some(w));
        }
    }

    /// Counts and frees the tail of a share its queue refused; returns how
    /// many, and how many of them IPv4.
    #[cold]
    fn refused(&mut self, datagrams: &mut Vec<Datagram>, refusal: Refusal) -> (u64, u64) {
        let (n, n4) = (datagrams.len() as u64, datagrams.iter().filter(|d| d.arrived_v4()).count() as u64);
        self.count_refusal(refusal, n, n4);
        datagrams.clear();
        (n, n4)
    }

    /// Counts `total` datagrams (`v4` of them IPv4) a queue refused, as
    /// Linux counts them: a full buffer in RcvbufErrors and InErrors, the
    /// stack-wide cap in MemErrors and InErrors.
    #[cold]
    fn count_refusal(&mut self, why: Refusal, total: u64, v4: u64) {
        match why {
            Refusal::Full => {
                self.add(Counter::RxRcvbufFull, total);
                self.add(Counter::UdpRcvbufErrors, v4);
                self.add(Counter::Udp6RcvbufErrors, total - v4);
            }
            Refusal::Mem => {
                self.add(Counter::RxMemFull, total);
                self.add(Counter::UdpMemErrors, v4);
                self.add(Counter::Udp6MemErrors, total - v4);
            }
            Refusal::Closed => {
                self.add(Counter::RxSocketClosed, total);
                return;
            }
        }
        self.add(Counter::UdpInErrors, v4);
        self.add(Counter::Udp6InErrors, total - v4);
    }

    /// Names socket `id` in the application's `ready` list (see
    /// [`mark_ready`]).
    #[inline]
    fn mark_ready(&mut self, id: u64) {
        mark_ready(&mut self.ready, &mut self.ready_bits, id);
    }

    /// Delivers datagrams whose socket changed since the lookup, one by one,
    /// after a fresh lookup in the current snapshot, each counted here;
    /// returns how many, and how many of them IPv4.
    #[cold]
    fn redeliver(&mut self, batch: &mut Vec<Datagram>) -> (u64, u64) {
        let counted = (batch.len() as u64, batch.iter().filter(|d| d.arrived_v4()).count() as u64);
        // The current snapshot, kept apart: the burst's other shares hold
        // binding indices into the one they were staged against, which
        // stays the lcore's until its next poll takes the new one.
        let fresh = self.shared.sockets.snapshot();
        for d in batch.drain(..) {
            if d.is_group_copy() {
                // Every socket the group datagram reached has its copy:
                // the one whose socket changed goes, as Linux's would
                // with its socket.
                self.inc(Counter::RxSocketClosed);
                continue;
            }
            let v4 = d.arrived_v4();
            let key = crate::lookup::FlowKey::new(&d.wire_src(), &d.wire_dst(), d.iface()).on_lcore(self.idx as u32);
            let Some((_, b)) = fresh.lookup(&key) else {
                self.inc(Counter::RxSocketClosed);
                continue;
            };
            let d = d.remap(b.family == crate::lookup::Family::V6);
            let id = b.id;
            match b.sock.queue.push(self.idx, d) {
                Ok(()) => {
                    self.mark_ready(id);
                    self.inc(Counter::RxDelivered);
                    self.inc(if v4 { Counter::UdpInDatagrams } else { Counter::Udp6InDatagrams });
                }
                Err(crate::rx_queue::Refused::Full(_)) => self.count_refusal(Refusal::Full, 1, v4 as u64),
                Err(crate::rx_queue::Refused::Mem(_)) => self.count_refusal(Refusal::Mem, 1, v4 as u64),
                Err(crate::rx_queue::Refused::Closed(_)) => self.count_refusal(Refusal::Closed, 1, v4 as u64),
            }
        }
        counted
    }
}

/// Names socket `id` in the application's `ready` list, once: a bit per id
/// modulo 64 says when the list need not be searched.
#[inline(always)]
fn mark_ready(ready: &mut Vec<u64>, bits: &mut u64, id: u64) {
    let bit = 1u64 << (id % 64);
    if *bits & bit == 0 || !ready.contains(&id) {
        *bits |= bit;
        ready.push(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shares staged so far, in the order their first datagram
    /// arrived: (binding index, datagrams).
    fn shares(r: &Staging<u32>) -> Vec<(u32, Vec<u32>)> {
        r.ordered().map(|index| (index, r.shares[index as usize].clone())).collect()
    }

    #[test]
    fn each_socket_keeps_its_datagrams_in_order_and_shares_follow_first_arrival() {
        let mut r: Staging<u32> = Staging::new();
        let at: Vec<_> = [(7, 0), (2, 1), (7, 2), (9, 3), (2, 4), (7, 5)]
            .into_iter()
            .map(|(index, d)| r.push(index, d % 2 == 0, d))
            .collect();
        assert_eq!(shares(&r), [(7, vec![0, 2, 5]), (2, vec![1, 4]), (9, vec![3])]);
        assert_eq!(at, [(7, 0), (2, 0), (7, 1), (9, 0), (2, 1), (7, 2)]);
        *r.get_mut((2, 1)) = 40;
        assert_eq!(shares(&r)[1].1, [1, 40]);
        assert_eq!((r.staged, r.staged_v4), (6, 3));
    }

    #[test]
    fn shares_have_a_bursts_room_up_to_the_index_and_keep_it() {
        let mut r: Staging<u32> = Staging::new();
        r.push(300, true, 0);
        assert_eq!(r.shares.len(), 301);
        assert!(
            r.shares.iter().all(|s| s.capacity() == BURST),
            "the room a socket's empty queue swaps for its own, for every index up to the one staged"
        );
        let before = r.shares[300].as_ptr();
        for d in 1..BURST as u32 {
            r.push(300, true, d);
        }
        r.shares[300].clear();
        r.reset();
        r.push(300, true, 0);
        r.push(7, true, 0);
        assert_eq!(r.shares[300].as_ptr(), before, "a burst and the next to the same socket in one buffer");
        assert_eq!(r.shares.len(), 301, "a smaller index made nothing new");
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "a share left full")]
    fn a_reset_with_a_share_left_full_is_caught_in_debug_builds() {
        let mut r: Staging<u32> = Staging::new();
        r.push(3, true, 0);
        r.reset();
    }

    #[test]
    fn more_sockets_than_a_burst_each_get_a_share() {
        let mut r: Staging<u32> = Staging::new();
        // Past the inline order: the rest in the spill, in order too.
        let n = ORDER as u32 + 300;
        for index in 0..n {
            r.push(index * 3, false, index);
        }
        r.push(0, false, n);
        r.push((n - 1) * 3, false, n + 1);
        let got = shares(&r);
        assert_eq!(got.len(), n as usize);
        assert_eq!(got[0].1, [0, n], "the first socket's second datagram found its share");
        assert_eq!(got[n as usize - 1].1, [n - 1, n + 1], "so did the last one's, in the spill");
        assert!(got.iter().enumerate().all(|(i, share)| share.0 == i as u32 * 3));
        assert_eq!(r.spill.len(), n as usize - ORDER);
        for index in r.ordered().collect::<Vec<_>>() {
            r.shares[index as usize].clear();
        }
        r.reset();
        r.push(9, true, 1);
        assert_eq!((r.order.len(), r.spill.len()), (1, 0), "the spill forgotten with the burst");
    }

    #[test]
    fn a_reset_forgets_the_order_and_the_counts() {
        let mut r: Staging<u32> = Staging::new();
        r.push(7, true, 1);
        r.push(8, true, 2);
        for index in r.ordered().collect::<Vec<_>>() {
            r.shares[index as usize].clear();
        }
        r.reset();
        assert_eq!(shares(&r), []);
        // 8 first this time: the order is this burst's.
        r.push(8, false, 3);
        r.push(7, true, 4);
        assert_eq!(shares(&r), [(8, vec![3]), (7, vec![4])]);
        assert_eq!((r.staged, r.staged_v4), (2, 1));
    }
}

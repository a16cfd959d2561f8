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
//! Staging sorts nothing: each datagram joins its socket's share as it is
//! staged (a 64-entry table from binding index to share answers which), so
//! a burst that reuseport spread over many sockets costs one push per
//! datagram and one queue append per socket, and every socket's datagrams
//! keep the order they arrived in.

use std::sync::atomic::Ordering;

use super::{LcoreCtx, Worker};
use crate::datagram::{Datagram, Staged};
use crate::rx_queue::Refusal;
use crate::shared::BURST;
use crate::stats::Counter;

/// Entries in the table from binding index to share (a power of two).
const SLOTS: usize = 64;

/// One socket's datagrams of the burst, in arrival order (generic, so the
/// unit tests below stage plain values; the lcores stage [`Datagram`]s).
#[derive(Debug)]
struct Share<D = Datagram> {
    /// The binding's index in the lcore's snapshot.
    index: u32,
    datagrams: Vec<D>,
}

impl<D> Default for Share<D> {
    fn default() -> Self {
        Share { index: 0, datagrams: Vec::new() }
    }
}

/// The burst's staged datagrams, grouped by socket as they arrive: each
/// socket's share. Shares past `used` are kept, with their capacity, for
/// the next burst.
#[derive(Debug)]
pub(super) struct Staging<D = Datagram> {
    shares: Vec<Share<D>>,
    used: usize,
    /// 1 + the share of a binding index, at `index % SLOTS`; 0: none. An index
    /// whose entry another holds, or whose share is past the 255th, is found
    /// by a scan of the used shares.
    slot: [u8; SLOTS],
    /// The binding index whose share opened last, and that share
    /// (`u32::MAX`: none): a burst to one socket finds it here, without the
    /// table.
    last: (u32, usize),
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
        Staging {
            shares: (0..BURST).map(|_| Share { datagrams: Vec::with_capacity(BURST), ..Share::default() }).collect(),
            used: 0,
            slot: [0; SLOTS],
            last: (u32::MAX, 0),
            staged: 0,
            staged_v4: 0,
            taken: 0,
        }
    }

    /// Adds `d` to binding `index`'s share; returns where it went (share,
    /// position), for a GRO train to grow it.
    #[inline(always)]
    pub(super) fn push(&mut self, index: u32, v4: bool, d: D) -> (usize, usize) {
        let r = match self.last {
            (last, r) if last == index => r,
            _ => self.find(index),
        };
        self.staged += 1;
        self.staged_v4 += v4 as u64;
        let share = &mut self.shares[r];
        share.datagrams.push(d);
        (r, share.datagrams.len() - 1)
    }

    /// The share of binding `index`, from the table (or a new one, noted
    /// as the last: a burst to one socket finds it there).
    #[inline(always)]
    fn find(&mut self, index: u32) -> usize {
        let h = index as usize % SLOTS;
        match self.slot[h] as usize {
            s if s > 0 && self.shares[s - 1].index == index => s - 1,
            s => self.open(index, h, s == 0),
        }
    }

    /// The share of an index the table does not answer for: found among the
    /// used shares (its entry taken by another, or past the 255th share), or
    /// a new one.
    #[inline(always)]
    fn open(&mut self, index: u32, h: usize, free: bool) -> usize {
        let noted = free && self.used < u8::MAX as usize;
        if !noted && let Some(r) = self.shares[..self.used].iter().position(|r| r.index == index) {
            return r;
        }
        if self.used == self.shares.len() {
            self.shares.push(Share::default());
        }
        let r = self.used;
        self.used += 1;
        let share = &mut self.shares[r];
        share.index = index;
        if noted {
            self.slot[h] = r as u8 + 1;
        }
        self.last = (index, r);
        r
    }

    /// The staged datagram at `at` (from [`push`](Self::push)).
    pub(super) fn get_mut(&mut self, (r, i): (usize, usize)) -> &mut D {
        &mut self.shares[r].datagrams[i]
    }

    /// Forgets the burst's shares (each already emptied by its delivery).
    #[inline]
    fn reset(&mut self) {
        // The whole table: 64 bytes, a few stores, no loop.
        self.slot = [0; SLOTS];
        self.last = (u32::MAX, 0);
        self.used = 0;
        (self.staged, self.staged_v4, self.taken) = (0, 0, 0);
    }
}

impl Staging<Datagram> {
    /// Notes `ns` as the receive time of every staged datagram.
    #[cold]
    pub(super) fn stamp(&mut self, ns: u64) {
        for share in &mut self.shares[..self.used] {
            for d in &mut share.datagrams {
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
        let Staging { shares, used, taken, .. } = &mut **staged;
        for share in &mut shares[..*used] {
            if share.datagrams.is_empty() {
                continue;
            }
            let b = self.snapshot.get(share.index);
            // A socket that changed after the lookup: looked up again when
            // the shares are queued.
            if b.sock.epoch.load(Ordering::Acquire) != b.epoch || !b.sock.queue.looks_empty() {
                continue;
            }
            let n = share.datagrams.len() as u64;
            f(b.id, Staged::new(&mut share.datagrams));
            // All or none: none, and they are queued after the callback.
            // (What is counted delivered comes from the count of what was
            // staged, less what a queue refuses; this one only says
            // whether anything is left to queue, so a callback that
            // panics after taking them leaves an empty share to the
            // queueing, which skips it.)
            if share.datagrams.is_empty() {
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
        if self.staging.used == 0 {
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
        for r in 0..self.staging.used {
            // The fields apart, so the share's datagrams go to the queue where
            // they lie (no move of the `Vec` in and out).
            let share = &mut self.staging.shares[r];
            if share.datagrams.is_empty() {
                // The callback took them all.
                continue;
            }
            let b = self.snapshot.get(share.index);
            if b.sock.epoch.load(Ordering::Acquire) != b.epoch {
                // The socket changed (connected, left its group, closed)
                // after this snapshot: look again in the current one.
                let mut datagrams = std::mem::take(&mut share.datagrams);
                let (n, n4) = self.redeliver(&mut datagrams);
                self.staging.shares[r].datagrams = datagrams;
                (delivered, v4) = (delivered - n, v4 - n4);
                continue;
            }
            let offered = share.datagrams.len();
            let refusal = b.sock.queue.push_batch_gathering(self.idx, &mut share.datagrams, Some(&mut self.wakers));
            let accepted = offered - share.datagrams.len();
            if accepted > 0 {
                mark_ready(&mut self.ready, &mut self.ready_bits, b.id);
            }
            if let Err(refusal) = refusal {
                let mut datagrams = std::mem::take(&mut share.datagrams);
                let (n, n4) = self.refused(&mut datagrams, refusal);
                self.staging.shares[r].datagrams = datagrams;
                (delivered, v4) = (delivered - n, v4 - n4);
            }
        }
        self.staging.reset();
        self.count_delivered(delivered, v4);
        if !self.wakers.is_empty() {
            self.wake_tasks();
        }
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

    /// The shares staged so far: (binding index, datagrams).
    fn shares(r: &Staging<u32>) -> Vec<(u32, Vec<u32>)> {
        r.shares[..r.used].iter().map(|share| (share.index, share.datagrams.clone())).collect()
    }

    #[test]
    fn each_socket_keeps_its_datagrams_in_order_and_shares_follow_first_arrival() {
        let mut r: Staging<u32> = Staging::new();
        let at: Vec<_> = [(7, 0), (2, 1), (7, 2), (9, 3), (2, 4), (7, 5)]
            .into_iter()
            .map(|(index, d)| r.push(index, d % 2 == 0, d))
            .collect();
        assert_eq!(shares(&r), [(7, vec![0, 2, 5]), (2, vec![1, 4]), (9, vec![3])]);
        assert_eq!(at, [(0, 0), (1, 0), (0, 1), (2, 0), (1, 1), (0, 2)]);
        *r.get_mut((1, 1)) = 40;
        assert_eq!(shares(&r)[1].1, [1, 40]);
        assert_eq!((r.staged, r.staged_v4), (6, 3));
    }

    #[test]
    fn indexes_that_share_a_slot_keep_shares_of_their_own() {
        let mut r: Staging<u32> = Staging::new();
        for (i, index) in [1, 65, 1, 129, 65, 129, 1].into_iter().enumerate() {
            r.push(index, true, i as u32);
        }
        assert_eq!(shares(&r), [(1, vec![0, 2, 6]), (65, vec![1, 4]), (129, vec![3, 5])]);
    }

    #[test]
    fn shares_past_the_255th_are_found_by_a_scan() {
        let mut r: Staging<u32> = Staging::new();
        // 255 shares, none in entry 63; then index 319 (entry 63, free),
        // whose share, the 256th, an entry cannot name.
        let first: Vec<u32> = (0..).filter(|i| i % SLOTS as u32 != 63).take(255).collect();
        for &index in first.iter().chain(&[319]) {
            r.push(index, false, index);
        }
        // 400's entry is 10's: a share of its own, the last opened, so
        // 319's is found by neither the table nor the last.
        for index in [319, 10, 400, 319] {
            r.push(index, false, 1000 + index);
        }
        let got = shares(&r);
        assert_eq!(got.len(), 257, "no second share for 319");
        assert_eq!(got[255], (319, vec![319, 1319, 1319]));
        assert_eq!(got[256], (400, vec![1400]));
        assert_eq!(got[10], (10, vec![10, 1010]));
    }

    #[test]
    fn more_sockets_than_shares_made_ahead_still_each_get_one() {
        let mut r: Staging<u32> = Staging::new();
        let n = BURST as u32 + 300;
        for index in 0..n {
            r.push(index * 3, false, index);
        }
        r.push(0, false, n);
        let got = shares(&r);
        assert_eq!(got.len(), n as usize);
        assert_eq!(got[0].1, [0, n], "the first socket's second datagram found its share");
        assert!(got.iter().enumerate().all(|(i, share)| share.0 == i as u32 * 3));
    }

    #[test]
    fn a_reset_forgets_the_shares_and_the_table() {
        let mut r: Staging<u32> = Staging::new();
        r.push(7, true, 1);
        for share in &mut r.shares[..r.used] {
            share.datagrams.clear();
        }
        r.reset();
        assert_eq!(shares(&r), []);
        // 7 again first: a table left as it was would send it to the old
        // share without opening one.
        r.push(7, true, 3);
        r.push(8, false, 2);
        assert_eq!(shares(&r), [(7, vec![3]), (8, vec![2])]);
        assert_eq!((r.staged, r.staged_v4), (2, 1));
    }
}

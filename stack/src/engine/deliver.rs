//! The queueing stage: the burst's datagrams that found a socket go to
//! its receive queue, a run of them per socket under one lock; datagrams
//! whose socket changed since the lookup are looked up again.

use std::sync::atomic::Ordering;

use super::{Staged, Worker};
use crate::datagram::Datagram;
use crate::rx_queue::Refusal;
use crate::stats::Counter;

/// Marks a key whose datagram is in place (positions fit the low 32 bits,
/// socket indices the next 31).
const PLACED: u64 = 1 << 63;

impl Worker<'_> {
    /// Queues the burst's datagrams to their sockets: all of one socket's
    /// with one lock, in the order they arrived. A burst for one socket
    /// (the common case) goes as it is; flows of a reuseport group
    /// interleave in a burst, so such a burst is first put in socket order,
    /// stably (each socket's datagrams keep their order), without heap
    /// allocation: (socket, position) keys are sorted, the datagrams moved
    /// into that order by swaps, and each socket's run moved out once.
    #[inline]
    pub(super) fn deliver_staged(&mut self) {
        let Some(&first) = self.staged_at.first() else { return };
        let mut batch = std::mem::take(&mut self.staged);
        let mut at = std::mem::take(&mut self.staged_at);
        if at.iter().all(|s| s.index == first.index) {
            self.deliver_run(first, &mut batch, &at);
        } else {
            let mut keys = std::mem::take(&mut self.keys);
            keys.extend(at.iter().enumerate().map(|(i, s)| (s.index as u64) << 32 | i as u64));
            keys.sort_unstable();
            let mut sorted = std::mem::take(&mut self.sorted_at);
            sorted.extend(keys.iter().map(|&k| at[k as u32 as usize]));
            // keys[i] names the datagram that belongs at i: follow each
            // cycle of that permutation once, marking the places filled.
            for start in 0..keys.len() {
                let mut i = start;
                while keys[i] & PLACED == 0 {
                    let from = keys[i] as u32 as usize;
                    keys[i] |= PLACED;
                    if from == start {
                        break;
                    }
                    batch.swap(i, from);
                    i = from;
                }
            }
            let mut run = std::mem::take(&mut self.scratch);
            let mut end = sorted.len();
            while end > 0 {
                let index = sorted[end - 1].index;
                let start = sorted[..end].iter().rposition(|s| s.index != index).map_or(0, |p| p + 1);
                run.extend(batch.drain(start..end));
                self.deliver_run(sorted[start], &mut run, &sorted[start..end]);
                run.clear();
                end = start;
            }
            keys.clear();
            sorted.clear();
            (self.keys, self.sorted_at, self.scratch) = (keys, sorted, run);
        }
        batch.clear();
        at.clear();
        self.staged = batch;
        self.staged_at = at;
    }

    /// Queues one socket's run of the burst (`batch`, described by `at`),
    /// counting what was queued and what was refused; what was refused is
    /// left at the end of `batch`, for the caller to free.
    #[inline]
    fn deliver_run(&mut self, run: Staged, batch: &mut Vec<Datagram>, at: &[Staged]) {
        let b = self.snapshot.get(run.index);
        if b.sock.epoch.load(Ordering::Acquire) != b.epoch {
            // The socket changed (connected, left its group, closed)
            // after this snapshot: look again in the current one.
            self.redeliver(run.iface, batch);
            return;
        }
        let offered = batch.len();
        let refusal = b.sock.queue.push_batch(self.idx, batch);
        let id = b.id;
        // What was refused is the tail of the run.
        let accepted = offered - batch.len();
        if accepted > 0 && self.ready.last() != Some(&id) && !self.ready.contains(&id) {
            self.ready.push(id);
        }
        let accepted_v4 = at[..accepted].iter().filter(|s| s.v4).count() as u64;
        self.add(Counter::RxDelivered, accepted as u64);
        self.add(Counter::UdpInDatagrams, accepted_v4);
        self.add(Counter::Udp6InDatagrams, accepted as u64 - accepted_v4);
        match refusal {
            Ok(()) => {}
            Err(Refusal::Full) => {
                self.add(Counter::RxRcvbufFull, batch.len() as u64);
                for s in &at[accepted..offered] {
                    self.inc(if s.v4 { Counter::UdpRcvbufErrors } else { Counter::Udp6RcvbufErrors });
                    self.inc(if s.v4 { Counter::UdpInErrors } else { Counter::Udp6InErrors });
                }
            }
            Err(Refusal::Closed) => self.add(Counter::RxSocketClosed, batch.len() as u64),
        }
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
}

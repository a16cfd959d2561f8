//! The queueing stage: the burst's datagrams that found a socket go to
//! its receive queue, a run of them per socket under one lock; datagrams
//! whose socket changed since the lookup are looked up again.

use std::sync::atomic::Ordering;

use super::{Staged, Worker};
use crate::datagram::Datagram;
use crate::rx_queue::Refusal;
use crate::stats::Counter;

impl Worker<'_> {
    /// Queues the burst's datagrams to their sockets: all of one socket's
    /// with one lock, in the order they arrived. A burst for one socket
    /// (the common case) goes as it is; flows of a reuseport group
    /// interleave in a burst, so such a burst is first sorted by socket;
    /// the sort is stable (each socket's datagrams keep their order) and
    /// uses no heap at this size.
    #[inline]
    pub(super) fn deliver_staged(&mut self) {
        let Some(&first) = self.staged_at.first() else { return };
        let mut batch = std::mem::take(&mut self.staged);
        let mut at = std::mem::take(&mut self.staged_at);
        if at.iter().all(|s| s.index == first.index) {
            self.deliver_run(first, &mut batch, &at);
        } else if at.len() <= 64 {
            // By socket, stably: sort (index, position) keys, put the
            // datagrams in that order by swaps, and queue the runs from the
            // last (each moved out once).
            let n = at.len();
            let mut keys = [0u64; 64];
            for (k, s) in keys.iter_mut().zip(at.iter()) {
                *k = (s.index as u64) << 8;
            }
            for (i, k) in keys[..n].iter_mut().enumerate() {
                *k |= i as u64;
            }
            keys[..n].sort_unstable();
            let mut sorted = std::mem::take(&mut self.sorted_at);
            sorted.extend(keys[..n].iter().map(|k| at[(k & 0xff) as usize]));
            // keys[i] names the datagram that belongs at i: follow each
            // cycle of that permutation once.
            let mut done = 0u64;
            for start in 0..n {
                if done & 1 << start != 0 {
                    continue;
                }
                let mut i = start;
                loop {
                    done |= 1 << i;
                    let from = (keys[i] & 0xff) as usize;
                    if from == start {
                        break;
                    }
                    batch.swap(i, from);
                    i = from;
                }
            }
            let mut end = n;
            let mut run = std::mem::take(&mut self.scratch);
            while end > 0 {
                let index = sorted[end - 1].index;
                let mut start = end - 1;
                while start > 0 && sorted[start - 1].index == index {
                    start -= 1;
                }
                if end - start >= 8 {
                    run.extend(batch.drain(start..end));
                } else {
                    // A short run: popped off the end (cheaper than a
                    // drain), then put back in order.
                    for _ in start..end {
                        run.push(batch.pop().expect("the run is the tail"));
                    }
                    run.reverse();
                }
                self.deliver_run(sorted[start], &mut run, &sorted[start..end]);
                run.clear();
                end = start;
            }
            self.scratch = run;
            sorted.clear();
            self.sorted_at = sorted;
        } else {
            let mut sorting = std::mem::take(&mut self.sorting);
            sorting.extend(at.drain(..).zip(batch.drain(..)));
            sorting.sort_by_key(|(s, _)| s.index);
            let mut it = sorting.drain(..).peekable();
            while let Some((s, d)) = it.next() {
                at.push(s);
                batch.push(d);
                while let Some((s, d)) = it.next_if(|(n, _)| n.index == s.index) {
                    at.push(s);
                    batch.push(d);
                }
                self.deliver_run(s, &mut batch, &at);
                batch.clear();
                at.clear();
            }
            drop(it);
            self.sorting = sorting;
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

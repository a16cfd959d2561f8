//! The queueing stage: the burst's datagrams that found a socket go to
//! its receive queue, a run of them per socket under one lock; datagrams
//! whose socket changed since the lookup are looked up again.

use std::sync::atomic::Ordering;

use super::Worker;
use crate::datagram::Datagram;
use crate::rx_queue::Refusal;
use crate::shared::BURST;
use crate::stats::Counter;

impl Worker<'_> {
    /// Queues the burst's datagrams to their sockets: all of one socket's
    /// with one lock, in the order they arrived. Flows of a reuseport group
    /// interleave in a burst, so the burst is first sorted by socket; the
    /// sort is stable (each socket's datagrams keep their order), takes one
    /// pass when the burst is one run already, and uses no heap at this size.
    #[inline]
    pub(super) fn deliver_staged(&mut self) {
        if self.staged.is_empty() {
            return;
        }
        self.staged.sort_by_key(|s| s.0);
        let mut staged = std::mem::take(&mut self.staged);
        let mut batch = std::mem::take(&mut self.scratch);
        let mut v4 = [false; BURST];
        let mut it = staged.drain(..).peekable();
        while let Some((index, iface, is_v4, d)) = it.next() {
            v4[0] = is_v4;
            batch.push(d);
            while let Some((_, _, is_v4, d)) = it.next_if(|(i, _, _, _)| *i == index) {
                v4[batch.len()] = is_v4;
                batch.push(d);
            }
            let b = self.snapshot.get(index);
            if b.sock.epoch.load(Ordering::Acquire) != b.epoch {
                // The socket changed (connected, left its group, closed)
                // after this snapshot: look again in the current one.
                self.redeliver(iface, &mut batch);
                continue;
            }
            let offered = batch.len();
            let refusal = b.sock.queue.push_batch(self.idx, &mut batch);
            let id = b.id;
            // What was refused is the tail of the run.
            let accepted = offered - batch.len();
            if accepted > 0 && self.ready.last() != Some(&id) && !self.ready.contains(&id) {
                self.ready.push(id);
            }
            let accepted_v4 = v4[..accepted].iter().filter(|&&f| f).count() as u64;
            self.add(Counter::RxDelivered, accepted as u64);
            self.add(Counter::UdpInDatagrams, accepted_v4);
            self.add(Counter::Udp6InDatagrams, accepted as u64 - accepted_v4);
            match refusal {
                Ok(()) => {}
                Err(Refusal::Full) => {
                    self.add(Counter::RxRcvbufFull, batch.len() as u64);
                    for &f in &v4[accepted..offered] {
                        self.inc(if f { Counter::UdpRcvbufErrors } else { Counter::Udp6RcvbufErrors });
                        self.inc(if f { Counter::UdpInErrors } else { Counter::Udp6InErrors });
                    }
                }
                Err(Refusal::Closed) => self.add(Counter::RxSocketClosed, batch.len() as u64),
            }
            batch.clear();
        }
        drop(it);
        self.staged = staged;
        self.scratch = batch;
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

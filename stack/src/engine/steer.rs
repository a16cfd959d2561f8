//! Software RSS and the hand-offs between lcores.
//!
//! On a port in `sw` mode the lcores that poll the port's RX queues (one,
//! on a port without RSS) hash each frame's flow (spate's keyed flow hash
//! over the addresses and UDP ports, [`crate::rss`]): frames of its own flows it
//! processes, the rest go to their owners over single-producer
//! single-consumer rings, a burst per ring per poll. IP fragments carry no
//! ports: they are steered by (source, destination, protocol, ID), so all
//! fragments of a datagram meet on one lcore, which reassembles it and
//! hands the whole datagram to the lcore owning its flow. Frames that are
//! neither UDP nor fragments (ARP, ICMP) are processed where they arrive.
//!
//! On a port in `device` mode each lcore polls a queue of its own and the
//! device keeps a flow on one queue: only fragments move (the device may
//! hash a first fragment with its ports and the others without), to meet
//! as under `sw`, and the reassembled datagram goes to the lcore its flow's
//! whole datagrams arrive on, which each lcore records as they come
//! ([`crate::shared::flow_owners`]).
//!
//! Where a port has fewer TX queues than lcores, an lcore without a queue
//! hands its frames to the lcore owning one, over the same kind of ring.

use spate_dpdk::{Burst, Mbuf};

use super::Worker;
use super::offsets::Handed;
use crate::iface::Interface;
use crate::rss::{datagram_input, flow_input};
use crate::shared::flow_owners::Seen;
use crate::shared::{BURST, Lanes, PortSteering, Steering};
use crate::stats::Counter;

impl Worker<'_> {
    /// Moves the frames `how` says go elsewhere out of `burst` (keeping
    /// the order of the rest) and sends them on: under `sw` every frame of
    /// another lcore's flow; under device steering only fragments, to the
    /// lcore where their datagram's fragments meet (by addresses and ID, as
    /// under `sw`), while the lcore records which UDP flows arrive on its
    /// queue and counts the datagrams of a flow the device moved. Not
    /// inlined: one call per burst, and the benchmark reads its cost.
    #[inline(never)]
    pub(super) fn steer_burst(&mut self, burst: &mut Burst<BURST>, how: PortSteering) {
        let Some(s) = self.steer.as_mut() else { return };
        let owners = self.shared.flow_owners.as_ref();
        let me = self.idx;
        let mut moved = 0;
        burst.retain_with(|m| {
            // The common frame hashed straight from its headers.
            let to = if how == PortSteering::Flows
                && let Some(h) = s.hash.ipv4_udp(m.data())
            {
                Some(s.reta.lcore(h as u32))
            } else {
                let mut key = [0u8; 36];
                match flow_input(m.data(), &mut key) {
                    Some((n, fragment)) if fragment || how == PortSteering::Flows => Some(s.owner_of(&key, n)),
                    Some((n, _)) => {
                        moved += owners.is_some_and(|o| o.record(&key, n, me) == Seen::Moved) as u64;
                        None
                    }
                    None => None,
                }
            };
            match to {
                // Never full: it holds at most this burst's frames.
                Some(o) if o != me => s.frames.out[o].push(m).err(),
                _ => Some(m),
            }
        });
        let shared = self.shared;
        let (sent, dropped) = s.frames.flush(|d| shared.wake(d));
        let handed = if how == PortSteering::Flows { Counter::SteerFrames } else { Counter::SteerFragments };
        self.add(handed, sent);
        self.add(Counter::RxSteerDropped, dropped);
        self.add(Counter::SteerFlowMoved, moved);
    }

    /// What waits on ring `r` of one kind of hand-off, into `burst`.
    fn handed(&mut self, kind: fn(&mut Steering) -> &mut Lanes, r: usize, burst: &mut Burst<BURST>) -> usize {
        self.steer.as_mut().map_or(0, |s| kind(s).from[r].dequeue(burst))
    }

    /// Frames other lcores handed over, through the receive pipeline.
    pub(super) fn poll_steered(&mut self) -> usize {
        // One ring from each other lcore, for each kind.
        let Some(rings) = self.steer.as_ref().map(|s| s.frames.from.len()) else { return 0 };
        let mut total = 0;
        for r in 0..rings {
            let mut burst: Burst<BURST> = Burst::new();
            let n = self.handed(|s| &mut s.frames, r, &mut burst);
            if n == 0 {
                continue;
            }
            // Taken from the device after what the lcore that did saw.
            self.look_at_published();
            total += n;
            self.rx_handed_frames(&mut burst);
        }
        for r in 0..rings {
            let mut burst: Burst<BURST> = Burst::new();
            let n = self.handed(|s| &mut s.datagrams, r, &mut burst);
            if n == 0 {
                continue;
            }
            self.look_at_published();
            total += n;
            // At most a burst staged at a time.
            self.deliver_staged();
            let net = self.net.clone();
            for m in burst.drain() {
                if let Some(c) = self.rx_handed_datagram(&net, m) {
                    self.inc(c);
                }
            }
            self.stamp_staged();
        }
        for r in 0..rings {
            let mut burst: Burst<BURST> = Burst::new();
            total += self.handed(|s| &mut s.tx, r, &mut burst);
            for m in burst.drain() {
                let i = self.shared.iface_of_port(m.port()) as usize;
                self.queue_tx(i, m);
            }
        }
        total
    }

    /// Frames another lcore handed over, through the receive pipeline in
    /// bursts of one port (their interface is the port's). Not inlined: the
    /// benchmark reads the owner's cost of a handed frame from it.
    #[inline(never)]
    fn rx_handed_frames(&mut self, burst: &mut Burst<BURST>) {
        // The RX lcore read only the headers' first line: start the rest
        // of the misses together, as after rx_burst.
        for m in burst.as_slice() {
            m.prefetch_data();
        }
        let mut run: Burst<BURST> = Burst::new();
        let mut iface = None;
        for m in burst.drain() {
            let i = self.shared.iface_of_port(m.port());
            if let Some(prev) = iface.filter(|&p| p != i) {
                self.receive_burst(prev, &mut run);
            }
            iface = Some(i);
            let _ = run.push(m);
        }
        if let Some(i) = iface {
            self.receive_burst(i, &mut run);
        }
    }

    /// Hands a reassembled datagram of interface `ifc` to the lcore
    /// owning its flow, when that is another; gives it back otherwise. Its
    /// offsets travel in the mbuf's hash field ([`Handed`]); one whose
    /// headers lie further in stays here. So does a tunnel's inner datagram: the
    /// receiving lcore knows its interface only from the mbuf's port, the
    /// outer one, and inner flows are not steered (their outer packets
    /// are).
    pub(super) fn hand_datagram(
        &mut self,
        ifc: &Interface,
        mut m: Mbuf,
        l3: usize,
        l4: usize,
        len: u32,
    ) -> Option<Mbuf> {
        let me = self.idx;
        let Some(s) = self.steer.as_mut() else { return Some(m) };
        let how = self.shared.port_steered(m.port());
        let packed = Handed { l3, l4, len }.encode();
        let Some(packed) = packed.filter(|_| ifc.tunnel.is_none() && how != PortSteering::None) else {
            return Some(m);
        };
        let mut key = [0u8; 36];
        let data = m.data();
        let n = datagram_input(data.get(l3..l4).unwrap_or(&[]), data.get(l4..).unwrap_or(&[]), &mut key);
        let Some(n) = n else { return Some(m) };
        let owner = match how {
            // The lcore the flow's whole datagrams arrive on, if any did.
            // The lcore the flow's whole datagrams arrive on; for a flow
            // never seen whole, one fixed by its hash, so that its
            // datagrams keep their order whatever lcore their fragments
            // met on.
            PortSteering::Fragments => match self.shared.flow_owners.as_ref().and_then(|o| o.owner(&key, n)) {
                Some(o) if o < s.datagrams.out.len() => o,
                _ => s.owner_of(&key, n),
            },
            _ => s.owner_of(&key, n),
        };
        if owner == me {
            return Some(m);
        }
        m.set_rss_hash(packed);
        let _ = s.datagrams.out[owner].push(m);
        let shared = self.shared;
        let (sent, dropped) = s.datagrams.flush(|d| shared.wake(d));
        self.add(Counter::SteerDatagrams, sent);
        self.add(Counter::RxSteerDropped, dropped);
        None
    }

    /// Hands what waits for port `i` to the lcore owning its TX queue.
    pub(super) fn hand_tx(&mut self, i: usize) {
        let port = self.shared.links[i].port_id;
        let owner = self.shared.tx_owner(i, self.idx);
        let Some(s) = self.steer.as_mut() else {
            let n = self.txbuf[i].len() as u64;
            self.txbuf[i].clear();
            self.add(Counter::TxHandoffDropped, n);
            return;
        };
        let mut lost = 0;
        for mut m in self.txbuf[i].drain() {
            m.set_port(port);
            if s.tx.out[owner].push(m).is_err() {
                lost += 1;
            }
        }
        let shared = self.shared;
        let (sent, dropped) = s.tx.flush(|d| shared.wake(d));
        let dropped = dropped + lost;
        self.add(Counter::SteerTx, sent);
        self.add(Counter::TxHandoffDropped, dropped);
    }
}

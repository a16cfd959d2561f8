//! What moves between the parts of the stack: packets on their way out
//! ([`TxPacket`]), the lcore-local send queue of the application's
//! callback, the rings between lcores ([`Lanes`], [`Steering`]) and the
//! queue handles the setup gives each polling lcore ([`WorkerQueues`]).

use std::cell::RefCell;
use std::net::IpAddr;

use spate_dpdk::{Burst, Mbuf, RingConsumer, RingProducer, RxQueue, TxQueue};

use crate::hdr::{ethertype_for, push_untagged, untagged_header};
use crate::rss::{FlowHash, Reta};
use crate::wire::{MacAddr, ethernet};

/// Burst size of receive and transmit.
pub const BURST: usize = 32;
/// Copies of group (broadcast, multicast) datagrams an lcore makes per
/// burst at most: they wait uncharged with the burst, so they count in
/// what an lcore has in hand (`MbufBudget`); past it a copy is dropped
/// and counted as a receive-buffer error, as Linux counts a failed clone.
pub const GROUP_COPIES: usize = BURST;

/// Copies of its own group packets (`IP_MULTICAST_LOOP`) an lcore keeps
/// for its receive path at once, at most: past that a copy is not made,
/// counted in `OutDiscards`, as Linux's loopback drops past its backlog.
/// One burst: they are made while the lcore's receive burst is empty (its
/// frames staged or queued) and its next poll takes them first, as that
/// burst, so the mbuf budget's receive burst covers them.
pub(crate) const LOOPED_MAX: usize = BURST;

/// What a packet to a group carries in its mbuf's port field (unused on
/// the way out until the transmit stage) when its socket loops its group
/// datagrams back to this host's members (`IP_MULTICAST_LOOP`): no port
/// has this id (a received mbuf turned into a reply keeps its port's, a
/// new one `RTE_MBUF_PORT_INVALID`). A mark in the mbuf costs the unicast
/// path nothing; a flag in [`TxPacket`] cost an echoed datagram 13
/// instructions (callgrind, measured).
pub const MCAST_LOOP_MARK: u16 = u16::MAX - 1;

/// Marks `m`, a packet to a group, for the loop back when `on`.
#[inline(always)]
pub fn mark_mcast_loop(m: &mut Mbuf, on: bool) {
    if on {
        m.set_port(MCAST_LOOP_MARK);
    }
}

/// An IP packet on its way out: the mbuf starts at the IP header.
#[derive(Debug)]
pub struct TxPacket {
    /// The packet.
    pub mbuf: Mbuf,
    /// Interface index.
    pub iface: u16,
    /// The neighbour to send it to.
    pub next_hop: IpAddr,
    /// Counts as a UDP datagram sent (false for the second and later
    /// fragments of one, and for packets spate makes itself).
    pub datagram: bool,
}

thread_local! {
    /// Set on a polling lcore while its loop runs (only the application's
    /// callback sends from that thread meanwhile): sends made there go
    /// straight to the lcore's transmit path.
    pub(crate) static LOCAL_TX: RefCell<Option<LocalTx>> = const { RefCell::new(None) };
}

/// The lcore-local send path of one stack: what the callback sent, for
/// the transmit stage after it returns.
#[derive(Debug)]
pub(crate) struct LocalTx {
    pub stack_id: u64,
    /// Packets the transmit stage finishes (their neighbour looked up).
    pub queue: Vec<TxPacket>,
    /// A neighbour the lcore found reachable when the callback began:
    /// a send to it writes the Ethernet header itself, and the frame
    /// waits in `frames`, ready for the port's burst.
    pub direct: Option<Direct>,
    /// Frames to `direct`, finished, in the order they were sent.
    pub frames: Vec<Mbuf>,
    /// How many of `frames` are UDP datagrams (the rest: fragments after
    /// a datagram's first).
    pub datagrams: u64,
}

/// A reachable neighbour on an interface with neither a VLAN tag nor a
/// tunnel, and the Ethernet header of the frames to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Direct {
    pub iface: u16,
    pub next_hop: IpAddr,
    pub mac: MacAddr,
    pub header: [u8; ethernet::HEADER_LEN],
}

impl Direct {
    /// The neighbour `mac` at `next_hop` on interface `iface` (of MAC
    /// `own`), frames of `next_hop`'s family.
    pub fn new(iface: u16, own: MacAddr, next_hop: IpAddr, mac: MacAddr) -> Direct {
        Direct { iface, next_hop, mac, header: untagged_header(mac, own, ethertype_for(&next_hop)) }
    }

    /// The frame of `pkt`, its Ethernet header written, and whether it
    /// is a datagram, when it goes to this neighbour; else `pkt` back.
    #[inline(always)]
    pub fn finish(&self, mut pkt: TxPacket) -> Result<(Mbuf, bool), TxPacket> {
        if pkt.iface == self.iface
            && pkt.next_hop == self.next_hop
            && push_untagged(&mut pkt.mbuf, &self.header).is_ok()
        {
            return Ok((pkt.mbuf, pkt.datagram));
        }
        Err(pkt)
    }
}

impl LocalTx {
    /// Whether `n` more packets fit, however they are taken.
    #[inline]
    pub fn has_room(&self, n: usize) -> bool {
        self.queue.len() + self.frames.len() + n <= LOCAL_TX_CAPACITY
    }

    /// Takes a packet the callback sent: its frame finished when it goes
    /// to the direct neighbour, else queued for the transmit stage; gives
    /// it back when there is no room.
    #[inline(always)]
    pub fn take(&mut self, pkt: TxPacket) -> Result<(), TxPacket> {
        if !self.has_room(1) {
            return Err(pkt);
        }
        let pkt = match &self.direct {
            Some(d) => match d.finish(pkt) {
                Ok((frame, datagram)) => {
                    self.frames.push(frame);
                    self.datagrams += datagram as u64;
                    return Ok(());
                }
                Err(pkt) => pkt,
            },
            _ => pkt,
        };
        self.queue.push(pkt);
        Ok(())
    }
}

/// Packets and frames a callback may send per loop iteration, together.
pub(crate) const LOCAL_TX_CAPACITY: usize = 4096;

/// Frames a ring between two lcores holds.
pub const RING_CAPACITY: u32 = 4096;

/// One kind of hand-off as seen by one lcore: a ring to and from every
/// other lcore, and what waits to go.
#[derive(Debug, Default)]
pub(crate) struct Lanes {
    pub to: Vec<Option<RingProducer>>,
    pub from: Vec<RingConsumer>,
    pub out: Vec<Burst<BURST>>,
}

impl Lanes {
    /// A full mesh between `n` lcores: the lanes of each.
    pub fn mesh(n: usize) -> spate_dpdk::Result<Vec<Lanes>> {
        let mut lanes: Vec<Lanes> = (0..n)
            .map(|_| Lanes {
                to: (0..n).map(|_| None).collect(),
                from: Vec::new(),
                out: (0..n).map(|_| Burst::new()).collect(),
            })
            .collect();
        for a in 0..n {
            for b in 0..n {
                if a != b {
                    let (p, c) = spate_dpdk::mbuf_ring(RING_CAPACITY)?;
                    lanes[a].to[b] = Some(p);
                    lanes[b].from.push(c);
                }
            }
        }
        Ok(lanes)
    }

    /// Sends what waits; returns how many frames did not fit (freed).
    pub(crate) fn flush(&mut self, mut wake: impl FnMut(usize)) -> (u64, u64) {
        let (mut sent, mut dropped) = (0, 0);
        for (dest, out) in self.out.iter_mut().enumerate() {
            if out.is_empty() {
                continue;
            }
            if let Some(p) = self.to[dest].as_mut() {
                let n = p.enqueue(out) as u64;
                if n > 0 {
                    wake(dest);
                }
                sent += n;
            }
            dropped += out.len() as u64;
            out.clear();
        }
        (sent, dropped)
    }
}

/// What the lcores receiving a port's frames do with them in software.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PortSteering {
    /// Nothing: each keeps what arrives (`hw`, `off`, one lcore).
    None,
    /// Each frame of a flow goes to the flow's lcore (`sw`).
    Flows,
    /// The device keeps flows on one queue (`device`): only fragments move,
    /// to meet by addresses and ID, and the flows' queues are recorded.
    Fragments,
}

/// One lcore's hand-off state.
#[derive(Debug)]
pub(crate) struct Steering {
    /// The flow hash, the same on every lcore.
    pub hash: FlowHash,
    pub reta: Reta,
    /// Received frames, to the lcore owning their flow.
    pub frames: Lanes,
    /// Reassembled datagrams, to the lcore owning their flow.
    pub datagrams: Lanes,
    /// Frames to send, to the lcore owning the port's TX queue.
    pub tx: Lanes,
}

/// The queue handles a worker polls, per interface.
#[derive(Debug)]
pub(crate) struct WorkerQueues {
    pub rx: Vec<(u16, RxQueue)>,
    pub tx: Vec<Option<TxQueue>>,
    pub steer: Option<Steering>,
}

impl Steering {
    /// The lcore owning the flow of input `key[..n]`.
    #[inline]
    pub fn owner_of(&self, key: &[u8; 36], n: usize) -> usize {
        self.reta.lcore(self.hash.hash(key, n) as u32)
    }
}

//! What moves between the parts of the stack: packets on their way out
//! ([`TxPacket`]), the lcore-local send queue of the application's
//! callback, the rings between lcores ([`Lanes`], [`Steering`]) and the
//! queue handles the setup gives each polling lcore ([`WorkerQueues`]).

use std::cell::RefCell;
use std::net::IpAddr;

use spate_dpdk::{Burst, Mbuf, RingConsumer, RingProducer, RxQueue, TxQueue};

use crate::rss::{FlowHash, Reta};

/// Burst size of receive and transmit.
pub const BURST: usize = 32;

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

/// The lcore-local send queue of one stack.
#[derive(Debug)]
pub(crate) struct LocalTx {
    pub stack_id: u64,
    pub queue: Vec<TxPacket>,
}

/// Room in the lcore-local send queue per loop iteration.
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
    pub(crate) fn flush(&mut self) -> (u64, u64) {
        let (mut sent, mut dropped) = (0, 0);
        for (dest, out) in self.out.iter_mut().enumerate() {
            if out.is_empty() {
                continue;
            }
            if let Some(p) = self.to[dest].as_mut() {
                sent += p.enqueue(out) as u64;
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

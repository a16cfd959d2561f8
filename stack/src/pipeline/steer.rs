//! Software RSS and the hand-offs between lcores.
//!
//! On a port in `sw` mode the lcores that poll the port's RX queues (one,
//! on a port without RSS) hash each frame's flow as a NIC would (Toeplitz over the
//! addresses and UDP ports, [`crate::rss`]): frames of its own flows it
//! processes, the rest go to their owners over single-producer
//! single-consumer rings, a burst per ring per poll. IP fragments carry no
//! ports: they are steered by (source, destination, protocol, ID), so all
//! fragments of a datagram meet on one lcore, which reassembles it and
//! hands the whole datagram to the lcore owning its flow. Frames that are
//! neither UDP nor fragments (ARP, ICMP) are processed where they arrive.
//!
//! Where a port has fewer TX queues than lcores, an lcore without a queue
//! hands its frames to the lcore owning one, over the same kind of ring.

use std::sync::Arc;

use spate_dpdk::{Burst, Mbuf, RingConsumer, RingProducer};

use crate::config::RssMode;
use crate::rss::{Reta, Toeplitz};
use crate::stats::Counter;
use crate::worker::{BURST, Worker};

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
    fn flush(&mut self) -> (u64, u64) {
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

/// One lcore's hand-off state.
#[derive(Debug)]
pub(crate) struct Steering {
    pub toeplitz: Arc<Toeplitz>,
    pub reta: Reta,
    /// Received frames, to the lcore owning their flow.
    pub frames: Lanes,
    /// Reassembled datagrams, to the lcore owning their flow.
    pub datagrams: Lanes,
    /// Frames to send, to the lcore owning the port's TX queue.
    pub tx: Lanes,
}

/// Writes the bytes that decide a frame's lcore into `key` and returns
/// how many: a UDP datagram's addresses and ports (the input of a NIC's
/// 4-tuple hash), a fragment's addresses and ID (IPv4 also the protocol).
/// `None` for frames that are no flow's (ARP, ICMP, other protocols, IPv6
/// with extension headers before UDP): they stay where they arrive.
pub(crate) fn flow_input(frame: &[u8], key: &mut [u8; 36]) -> Option<usize> {
    let ethertype = u16::from_be_bytes(frame.get(12..14)?.try_into().ok()?);
    let (ethertype, l3) = if ethertype == 0x8100 {
        (u16::from_be_bytes(frame.get(16..18)?.try_into().ok()?), 18)
    } else {
        (ethertype, 14)
    };
    let ip = frame.get(l3..)?;
    match ethertype {
        0x0800 if ip.len() >= 20 => {
            let ihl = (ip[0] & 0x0f) as usize * 4;
            key[..8].copy_from_slice(&ip[12..20]);
            if u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0 {
                key[8..10].copy_from_slice(&ip[4..6]);
                key[10] = ip[9];
                return Some(11);
            }
            if ip[9] != 17 || ihl < 20 {
                return None;
            }
            key[8..12].copy_from_slice(ip.get(ihl..ihl + 4)?);
            Some(12)
        }
        0x86dd if ip.len() >= 48 => {
            key[..32].copy_from_slice(&ip[8..40]);
            match ip[6] {
                17 => key[32..36].copy_from_slice(&ip[40..44]),
                44 => key[32..36].copy_from_slice(&ip[44..48]),
                _ => return None,
            }
            Some(36)
        }
        _ => None,
    }
}

impl Steering {
    /// The lcore owning a frame's flow (`None`: not a flow's).
    #[inline]
    pub fn owner(&self, frame: &[u8]) -> Option<usize> {
        let mut key = [0u8; 36];
        let n = flow_input(frame, &mut key)?;
        Some(self.reta.lcore(self.toeplitz.hash(&key[..n])))
    }
}

impl Worker<'_> {
    /// Moves the frames of other lcores' flows out of `burst` (keeping the
    /// order of the rest) and sends them on.
    pub(crate) fn steer_burst(&mut self, burst: &mut Burst<BURST>) {
        let Some(s) = self.steer.as_mut() else { return };
        let me = self.idx;
        let mut keep: Burst<BURST> = Burst::new();
        for m in burst.drain() {
            match s.owner(m.data()) {
                Some(o) if o != me => {
                    let _ = s.frames.out[o].push(m);
                }
                _ => {
                    let _ = keep.push(m);
                }
            }
        }
        *burst = keep;
        let (sent, dropped) = s.frames.flush();
        self.add(Counter::SteerFrames, sent);
        self.add(Counter::RxSteerDropped, dropped);
    }

    /// What waits on ring `r` of one kind of hand-off, into `burst`.
    fn handed(&mut self, kind: fn(&mut Steering) -> &mut Lanes, r: usize, burst: &mut Burst<BURST>) -> usize {
        self.steer.as_mut().map_or(0, |s| kind(s).from[r].dequeue(burst))
    }

    /// Frames other lcores handed over, through the receive pipeline.
    pub(crate) fn poll_steered(&mut self) -> usize {
        // One ring from each other lcore, for each kind.
        let Some(rings) = self.steer.as_ref().map(|s| s.frames.from.len()) else { return 0 };
        let mut total = 0;
        for r in 0..rings {
            let mut burst: Burst<BURST> = Burst::new();
            let n = self.handed(|s| &mut s.frames, r, &mut burst);
            if n == 0 {
                continue;
            }
            total += n;
            // Runs of one port through the pipeline (their interface is
            // the port's).
            let mut run: Burst<BURST> = Burst::new();
            let mut iface = None;
            for m in burst.drain() {
                let i = self.shared.iface_of_port(m.port());
                if let Some(prev) = iface.filter(|&p| p != i) {
                    self.rx_run(prev, &mut run);
                }
                iface = Some(i);
                let _ = run.push(m);
            }
            if let Some(i) = iface {
                self.rx_run(i, &mut run);
            }
        }
        for r in 0..rings {
            let mut burst: Burst<BURST> = Burst::new();
            total += self.handed(|s| &mut s.datagrams, r, &mut burst);
            for m in burst.drain() {
                if let Some(c) = self.rx_handed_datagram(m) {
                    self.inc(c);
                }
            }
            // At most a burst staged at a time.
            self.deliver_staged();
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

    /// Hands a reassembled datagram to the lcore owning its flow, when that
    /// is another; gives it back otherwise. Its offsets travel in the
    /// mbuf's hash field: IP header (5 bits) | UDP header (11) | length of
    /// the UDP datagram (16); one whose headers lie further in stays here.
    pub(crate) fn hand_datagram(&mut self, mut m: Mbuf, l3: usize, l4: usize, len: u32) -> Option<Mbuf> {
        let me = self.idx;
        let Some(s) = self.steer.as_mut() else { return Some(m) };
        if !self.shared.port_steered(m.port()) || l3 >= 32 || l4 >= 2048 || len > 0xffff {
            return Some(m);
        }
        let mut key = [0u8; 36];
        let n = {
            let data = m.data();
            let mut put = |at: usize, from: Option<&[u8]>| from.map(|b| key[at..at + b.len()].copy_from_slice(b));
            match data.get(l3).map(|v| v >> 4) {
                Some(4) => put(0, data.get(l3 + 12..l3 + 20)).and(put(8, data.get(l4..l4 + 4))).map(|()| 12),
                Some(6) => put(0, data.get(l3 + 8..l3 + 40)).and(put(32, data.get(l4..l4 + 4))).map(|()| 36),
                _ => None,
            }
        };
        let Some(n) = n else { return Some(m) };
        let owner = s.reta.lcore(s.toeplitz.hash(&key[..n]));
        if owner == me {
            return Some(m);
        }
        m.set_rss_hash((l3 as u32) << 27 | (l4 as u32) << 16 | len);
        let _ = s.datagrams.out[owner].push(m);
        let (sent, dropped) = s.datagrams.flush();
        self.add(Counter::SteerDatagrams, sent);
        self.add(Counter::RxSteerDropped, dropped);
        None
    }

    /// Hands what waits for port `i` to the lcore owning its TX queue.
    pub(crate) fn hand_tx(&mut self, i: usize) {
        let port = self.shared.ifaces[i].port_id;
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
        let (sent, dropped) = s.tx.flush();
        let dropped = dropped + lost;
        self.add(Counter::SteerTx, sent);
        self.add(Counter::TxHandoffDropped, dropped);
    }
}

/// How a port is set up for the stack's lcores.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PortPlan {
    pub mode: RssMode,
    pub rx_queues: u16,
    pub tx_queues: u16,
    pub rss: spate_dpdk::Rss,
    pub steered: bool,
}

impl PortPlan {
    /// One line for the log.
    pub fn describe(&self, workers: usize) -> String {
        match self.mode {
            RssMode::Sw => format!(
                "software RSS: {} RX queue(s), their lcores hand flows to {workers} lcores; {} TX queue(s)",
                self.rx_queues, self.tx_queues
            ),
            RssMode::Hw => format!("RSS by the port over {} RX queues; {} TX queues", self.rx_queues, self.tx_queues),
            _ => format!("{} RX / {} TX queue(s), no RSS", self.rx_queues, self.tx_queues),
        }
    }
}

/// Drivers that keep each flow on one of their RX queues without an RSS
/// hash (`net_af_packet`: the kernel's fanout hashes flows over its
/// sockets).
const SPREADS_FLOWS: &[&str] = &["net_af_packet"];

/// Decides `mode` (auto: hw where the port spreads flows over enough RX
/// queues, sw otherwise) for a port and `workers` lcores.
pub(crate) fn plan_port(
    mode: RssMode,
    workers: usize,
    info: &spate_dpdk::DeviceInfo,
    device: &str,
) -> crate::error::Result<PortPlan> {
    use crate::error::Error;
    let n = workers as u16;
    let tx_queues = n.min(info.max_tx_queues).max(1);
    let spreads = info.supports_rss() || SPREADS_FLOWS.contains(&info.driver.as_str());
    let enough = info.max_rx_queues >= n;
    let mode = match mode {
        _ if workers == 1 => RssMode::Off,
        RssMode::Auto if spreads && enough => RssMode::Hw,
        RssMode::Auto => RssMode::Sw,
        m => m,
    };
    let rss_of = |on: bool| if on { spate_dpdk::Rss::Required } else { spate_dpdk::Rss::Off };
    match mode {
        // Every RX queue the device has (up to one per lcore) is polled:
        // a device that spreads frames over its queues itself would lose
        // those of a queue nobody polls.
        RssMode::Sw => Ok(PortPlan {
            mode,
            rx_queues: info.max_rx_queues.min(n).max(1),
            tx_queues,
            rss: spate_dpdk::Rss::Off,
            steered: true,
        }),
        RssMode::Hw if !spreads => Err(Error::Config(format!(
            "port {device} ({}) hashes no flows (no RSS) and does not spread them itself: use rss = \"sw\"",
            info.driver
        ))),
        RssMode::Hw | RssMode::Off if !enough => Err(Error::Config(format!(
            "port {device} ({}) has {} RX queues, fewer than the {workers} lcores: use rss = \"sw\"",
            info.driver, info.max_rx_queues
        ))),
        RssMode::Hw => Ok(PortPlan { mode, rx_queues: n, tx_queues, rss: rss_of(info.supports_rss()), steered: false }),
        _ => Ok(PortPlan {
            mode: RssMode::Off,
            rx_queues: n,
            tx_queues,
            rss: if workers == 1 { spate_dpdk::Rss::Auto } else { spate_dpdk::Rss::Off },
            steered: false,
        }),
    }
}

//! The traffic source and sink the run-to-completion callback plays:
//! 64-byte UDP frames written into the wire's far end, every payload byte
//! read.

use std::sync::Arc;

use spate::DatagramBatch;
use spate::dpdk::{Burst, Mempool, RxQueue, TxQueue};
use spate::wire::MacAddr;

/// Frames the source keeps in flight at most when several lcores read:
/// a quarter of a hand-off ring, many bursts.
pub(crate) const IN_FLIGHT: u64 = 1024;

pub(crate) const SPATE_MAC: MacAddr = MacAddr([0x02, 0x53, 0x50, 0x41, 0x54, 0x45]);

pub(crate) struct Source {
    /// Frames written per call (at most 32).
    pub(crate) burst: u64,
    pub(crate) tx: TxQueue,
    pub(crate) rx: RxQueue,
    pub(crate) pool: Arc<Mempool>,
    pub(crate) frames: Vec<Vec<u8>>,
    /// Per frame: the RSS hash its mbuf carries, as a NIC's RSS would set
    /// it (`--rss-hash`); none without.
    pub(crate) hashes: Option<Vec<u32>>,
    pub(crate) sent: u64,
    pub(crate) target: u64,
    /// Frames spate sent, ARP requests aside.
    pub(crate) wire: u64,
    /// The answer to spate's ARP request for the peer.
    pub(crate) arp_reply: Vec<u8>,
    /// TSC cycles spent in `inject` and `drain` in the lcore's busy loop
    /// iterations: the benchmark's own work on the lcore it shares, taken
    /// out of that lcore's busy cycles.
    pub(crate) cycles: u64,
    /// Those of the current iteration, counted once the stack has said
    /// whether it was busy (an idle iteration's are not in its busy
    /// cycles).
    pub(crate) pending: u64,
}

impl Source {
    /// Writes up to `burst` frames into the wire.
    pub(crate) fn inject(&mut self) {
        let t = spate::dpdk::lcore::tsc();
        self.inject_frames();
        self.pending += spate::dpdk::lcore::tsc().wrapping_sub(t);
    }

    /// Counts the last iteration's cycles if it was `busy`.
    pub(crate) fn settle(&mut self, busy: bool) {
        if busy {
            self.cycles += self.pending;
        }
        self.pending = 0;
    }

    pub(crate) fn inject_frames(&mut self) {
        let n = (self.target - self.sent).min(self.burst) as usize;
        if n == 0 {
            return;
        }
        let mut b: Burst = Burst::new();
        if self.pool.alloc_bulk(&mut b, n).is_err() {
            return;
        }
        for (i, m) in b.as_mut_slice().iter_mut().enumerate() {
            let at = (self.sent as usize + i) % self.frames.len();
            let f = &self.frames[at];
            m.append(f.len()).expect("room").copy_from_slice(f);
            if let Some(hashes) = &self.hashes {
                m.set_rss_hash(hashes[at]);
            }
        }
        self.sent += self.tx.tx_burst(&mut b) as u64;
    }

    /// Frees what the stack sent, answering its ARP request for the peer.
    pub(crate) fn drain(&mut self) {
        let t = spate::dpdk::lcore::tsc();
        self.drain_frames();
        self.pending += spate::dpdk::lcore::tsc().wrapping_sub(t);
    }

    pub(crate) fn drain_frames(&mut self) {
        let mut b: Burst = Burst::new();
        while self.rx.rx_burst(&mut b) > 0 {
            for m in b.drain() {
                if u16::from_be_bytes([m.data()[12], m.data()[13]]) != 0x0806 {
                    self.wire += 1;
                    continue;
                }
                let mut r: Burst = Burst::new();
                if self.pool.alloc_bulk(&mut r, 1).is_ok() {
                    let mut reply = r.drain().next().expect("one");
                    reply.append(self.arp_reply.len()).expect("room").copy_from_slice(&self.arp_reply);
                    let mut out: Burst = Burst::new();
                    let _ = out.push(reply);
                    self.tx.tx_burst(&mut out);
                }
            }
        }
    }
}

/// Reads every payload byte of the batch and frees it; returns the
/// datagrams it held (a coalesced one counting its segments). A
/// contiguous datagram is read as an application reads one, through
/// `data`; a chain segment by segment.
pub(crate) fn consume(batch: &mut DatagramBatch) -> u64 {
    let mut n = 0;
    for d in batch.iter() {
        if d.is_contiguous() {
            std::hint::black_box(read_every_byte(d.data()));
        } else {
            for seg in d.segments() {
                std::hint::black_box(read_every_byte(seg));
            }
        }
        n += d.gso_size().map_or(1, |g| d.len().div_ceil(g) as u64);
    }
    batch.clear();
    n
}

/// Reads `data` 8 bytes at a time, as an application that sums or copies
/// a payload does; a tail shorter than 8 bytes is read with the last 8
/// bytes' load, the bytes read already shifted out (a byte loop would
/// charge the reader's tail to the stack: the floor's 64-byte frames have
/// none, the datagrams' 22-byte payloads 6 bytes).
pub(crate) fn read_every_byte(data: &[u8]) -> u64 {
    let mut chunks = data.chunks_exact(8);
    let mut acc = 0u64;
    for c in &mut chunks {
        acc = acc.wrapping_add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
    }
    let rest = chunks.remainder();
    let tail = match data.len() {
        _ if rest.is_empty() => 0,
        n if n >= 8 => u64::from_le_bytes(data[n - 8..].try_into().expect("8 bytes")) >> (8 * (8 - rest.len())),
        _ => rest.iter().fold(0u64, |a, &b| a << 8 | b as u64),
    };
    acc.wrapping_add(tail)
}

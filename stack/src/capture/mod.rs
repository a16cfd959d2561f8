//! Packet capture from a running stack (`spate-dump`): while a [`Tap`] is
//! attached, each polling lcore copies the frames it receives and sends,
//! those the tap's filter keeps, into records of the tap's own and hands
//! them to the writer through a bounded lane of its own; with none
//! attached, the lcores pay nothing past the look they take at what is
//! published (the changes counter, at the top of each loop iteration and
//! after each burst).
//!
//! Records are made when the tap is attached and recycled between the
//! lcore and the writer (two bounded queues per lcore: free and full), so
//! the datapath allocates nothing and never takes from the packet pool; a
//! frame that finds no free record is counted as dropped, and the count
//! goes into the capture file's statistics.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam::queue::ArrayQueue;
use crossbeam_utils::CachePadded;
use spate_dpdk::Mbuf;

pub mod bpf;

/// Frames a record keeps at most (a jumbo frame whole).
pub const MAX_SNAPLEN: u32 = 65_535;
/// Records an lcore's lane holds by default.
pub const DEFAULT_RECORDS: usize = 4096;

/// One captured frame.
#[derive(Debug)]
pub struct Record {
    /// The stack's clock when the lcore took the frame (its loop
    /// iteration's start), in nanoseconds.
    pub time: u64,
    /// The interface (ports first, then tunnels' inner interfaces).
    pub iface: u16,
    /// Sent (true) or received.
    pub outbound: bool,
    /// The frame's length on the wire.
    pub wire_len: u32,
    /// Its first bytes, up to the snap length.
    pub data: Vec<u8>,
}

/// What an attached capture asks for.
#[derive(Debug, Clone)]
pub struct TapConfig {
    /// Bytes of each frame kept at most (1 to [`MAX_SNAPLEN`]).
    pub snaplen: u32,
    /// The filter; none keeps every frame.
    pub filter: Option<bpf::Program>,
    /// Records per lcore.
    pub records: usize,
    /// Only this interface's frames, if given.
    pub iface: Option<u16>,
}

/// One lcore's lane: records it may fill, records the writer may take,
/// and what it captured and dropped (written by the lcore only).
#[derive(Debug)]
struct Lane {
    free: ArrayQueue<Box<Record>>,
    full: ArrayQueue<Box<Record>>,
    captured: AtomicU64,
    dropped: AtomicU64,
}

/// An attached capture.
#[derive(Debug)]
pub struct Tap {
    snaplen: u32,
    filter: Option<bpf::Program>,
    iface: Option<u16>,
    lanes: Box<[CachePadded<Lane>]>,
    /// The lane the writer's next drain starts at: each in turn, so one
    /// busy lcore cannot keep the others' records waiting.
    next_lane: AtomicUsize,
}

impl Tap {
    /// A tap for `lcores` lcores whose records hold `frame_max` bytes at
    /// most (the largest frame the interfaces carry).
    pub fn new(cfg: TapConfig, lcores: usize, frame_max: usize) -> Tap {
        let cap = (cfg.snaplen as usize).min(frame_max).max(1);
        let records = cfg.records.max(1);
        let lanes = (0..lcores)
            .map(|_| {
                let free = ArrayQueue::new(records);
                for _ in 0..records {
                    let r = Record { time: 0, iface: 0, outbound: false, wire_len: 0, data: Vec::with_capacity(cap) };
                    let _ = free.push(Box::new(r));
                }
                CachePadded::new(Lane {
                    free,
                    full: ArrayQueue::new(records),
                    captured: AtomicU64::new(0),
                    dropped: AtomicU64::new(0),
                })
            })
            .collect();
        Tap {
            snaplen: cfg.snaplen.clamp(1, MAX_SNAPLEN),
            filter: cfg.filter,
            iface: cfg.iface,
            lanes,
            next_lane: AtomicUsize::new(0),
        }
    }

    /// Lcore `lane` took `frames` on interface `iface` at `time`: copies
    /// those the filter keeps.
    #[inline(never)]
    pub fn offer(&self, lane: usize, time: u64, iface: u16, outbound: bool, frames: &[Mbuf]) {
        if self.iface.is_some_and(|i| i != iface) {
            return;
        }
        let Some(l) = self.lanes.get(lane) else { return };
        let (mut captured, mut dropped) = (0, 0);
        for m in frames {
            let wire_len = m.pkt_len() as u32;
            let keep = match &self.filter {
                // Headers are in the first segment: the filter reads it.
                Some(f) => f.run(m.data(), wire_len).min(self.snaplen),
                None => self.snaplen,
            };
            if keep == 0 {
                continue;
            }
            let Some(mut r) = l.free.pop() else {
                dropped += 1;
                continue;
            };
            let want = (keep as usize).min(wire_len as usize).min(r.data.capacity());
            r.data.clear();
            for seg in m.segment_data() {
                let n = seg.len().min(want - r.data.len());
                r.data.extend_from_slice(&seg[..n]);
                if r.data.len() == want {
                    break;
                }
            }
            (r.time, r.iface, r.outbound, r.wire_len) = (time, iface, outbound, wire_len);
            // The free queue and the full one are the same size.
            let _ = l.full.push(r);
            captured += 1;
        }
        // One writer per lane: plain stores.
        if captured > 0 {
            l.captured.store(l.captured.load(Ordering::Relaxed) + captured, Ordering::Relaxed);
        }
        if dropped > 0 {
            l.dropped.store(l.dropped.load(Ordering::Relaxed) + dropped, Ordering::Relaxed);
        }
    }

    /// The writer's side: takes up to `max` records across the lanes,
    /// hands each to `f`, and recycles it. Returns how many.
    pub fn drain(&self, max: usize, mut f: impl FnMut(&Record)) -> usize {
        let mut n = 0;
        let first = self.next_lane.fetch_add(1, Ordering::Relaxed);
        let lanes = self.lanes.len();
        for k in 0..lanes {
            let l = &self.lanes[(first + k) % lanes];
            while n < max {
                let Some(r) = l.full.pop() else { break };
                f(&r);
                let _ = l.free.push(r);
                n += 1;
            }
        }
        n
    }

    /// Frames copied and frames dropped for want of a free record, over
    /// all lanes.
    pub fn totals(&self) -> (u64, u64) {
        self.lanes
            .iter()
            .fold((0, 0), |(c, d), l| (c + l.captured.load(Ordering::Relaxed), d + l.dropped.load(Ordering::Relaxed)))
    }

    /// The snap length.
    pub fn snaplen(&self) -> u32 {
        self.snaplen
    }
}

/// Where the lcores find the attached tap: a generation they compare when
/// `Shared::changes` moved (attaching and detaching move both), and the
/// tap itself, taken under the lock only when the generation moved.
#[derive(Debug, Default)]
pub struct TapSlot {
    generation: CachePadded<AtomicU64>,
    tap: Mutex<Option<Arc<Tap>>>,
}

impl TapSlot {
    /// The generation now.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The attached tap, if any.
    pub fn current(&self) -> Option<Arc<Tap>> {
        self.tap.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Attaches `tap`; false when one is attached already.
    pub fn attach(&self, tap: Arc<Tap>) -> bool {
        let mut slot = self.tap.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return false;
        }
        *slot = Some(tap);
        self.generation.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Detaches `tap` (if it is the one attached): the lcores let go of it
    /// at their next loop iteration.
    pub fn detach(&self, tap: &Arc<Tap>) {
        let mut slot = self.tap.lock().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_some_and(|t| Arc::ptr_eq(t, tap)) {
            *slot = None;
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }
}

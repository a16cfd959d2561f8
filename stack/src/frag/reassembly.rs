//! Bounded reassembly of IPv4 and IPv6 fragments, one table per lcore
//! (both families share it, and its memory budget).
//!
//! A datagram's fragments are kept by (source, destination, protocol,
//! identification) until they cover it, then linked into one mbuf chain in
//! offset order and handed on as if the datagram had arrived whole. What
//! an attacker can make it hold is bounded three ways: at most
//! [`MAX_FRAGMENTS`] fragments per datagram, a memory budget (above the
//! high watermark the oldest datagrams go until the low one is reached),
//! and a timeout (30 s by default).
//!
//! Overlaps: a fragment identical in offset and length to one held is a
//! duplicate and dropped alone; any other overlap drops the whole datagram,
//! as RFC 5722 requires for IPv6 and Linux does for IPv4 since 2018. A first
//! fragment shorter than a UDP header, a fragment reaching past 64 KiB, a
//! non-last fragment whose length is not a multiple of 8, and lengths that
//! contradict the last fragment's are refused the same way.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher};

use spate_dpdk::{Burst, Mbuf};

use crate::time::Instant;

/// Fragments one datagram may have at most.
pub const MAX_FRAGMENTS: usize = 64;
/// The largest IP payload a datagram can reassemble to.
pub const MAX_PAYLOAD: u32 = 65535;

/// A datagram's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    /// Source address (IPv4 mapped into IPv6).
    pub src: u128,
    /// Destination address.
    pub dst: u128,
    /// Upper-layer protocol.
    pub protocol: u8,
    /// Identification (16 bits for IPv4, 32 for IPv6).
    pub ident: u32,
    /// IPv6.
    pub v6: bool,
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.src as u64);
        h.write_u64((self.src >> 64) as u64);
        h.write_u64(self.dst as u64);
        h.write_u64((self.dst >> 64) as u64);
        h.write_u64(self.ident as u64 | (self.protocol as u64) << 32 | (self.v6 as u64) << 40);
    }
}

/// The table's hash: a folded 64 x 64 -> 128-bit multiply per word with a
/// random key per table, so a sender who picks addresses and IDs cannot
/// aim at one bucket (a quarter of SipHash's cost here).
#[derive(Debug, Clone, Copy)]
struct Keyed(u64, u64);

impl BuildHasher for Keyed {
    type Hasher = KeyedHasher;
    fn build_hasher(&self) -> KeyedHasher {
        KeyedHasher { state: self.0, key: self.1 | 1 }
    }
}

struct KeyedHasher {
    state: u64,
    key: u64,
}

impl Hasher for KeyedHasher {
    fn write_u64(&mut self, x: u64) {
        let p = (self.state ^ x) as u128 * self.key as u128;
        self.state = (p >> 64) as u64 ^ p as u64;
    }
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    fn finish(&self) -> u64 {
        self.state
    }
}

/// One fragment as the table takes it.
#[derive(Debug)]
pub struct Fragment {
    /// The frame, its data starting at the Ethernet header.
    pub mbuf: Mbuf,
    /// Where the IP header starts in the frame.
    pub l3: usize,
    /// Where the fragmentable part starts in the frame (after the IP
    /// header, and for IPv6 after the fragment header).
    pub data_at: usize,
    /// Offset of this fragment in the datagram's fragmentable part.
    pub offset: u32,
    /// Bytes of the fragmentable part this fragment carries.
    pub len: u32,
    /// More fragments follow.
    pub more: bool,
}

/// What became of a fragment.
#[derive(Debug)]
pub enum Outcome {
    /// Kept until the datagram is complete.
    Held,
    /// The same fragment was held already; this one was dropped.
    Duplicate,
    /// Refused: the datagram it belongs to (if any) was dropped with it.
    Failed,
    /// The datagram is complete: the first fragment's frame with the rest
    /// of the payload chained after it; where its IP header and its
    /// fragmentable part start in the first segment; the fragmentable
    /// part's length.
    Complete {
        /// The chain.
        mbuf: Mbuf,
        /// Where the IP header starts.
        l3: usize,
        /// Where the fragmentable part starts.
        data_at: usize,
        /// The fragmentable part's length.
        len: u32,
    },
}

/// A datagram being reassembled: a slot of the table's slab, reused in
/// place (at about 1.3 KB it is not moved in and out of the hash map).
#[derive(Debug)]
struct Entry {
    key: Key,
    created: Instant,
    /// Order of arrival among the table's datagrams (ties in `created`
    /// are common: one burst shares a timestamp); [`FREE`] when the slot
    /// is unused.
    seq: u64,
    /// (offset, len, data_at, l3) per held fragment, parallel to `mbufs`.
    spans: [(u32, u32, u16, u16); MAX_FRAGMENTS],
    mbufs: Burst<MAX_FRAGMENTS>,
    /// The datagram's length, once the last fragment came.
    total: Option<u32>,
    received: u32,
    bytes: usize,
}

/// Limits of one table.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes held (mbuf buffers) above which the oldest datagrams go.
    pub high: usize,
    /// ...until this many are left.
    pub low: usize,
    /// How long a datagram may wait for its fragments.
    pub timeout_ns: u64,
    /// Datagrams held at most (the table never grows past it).
    pub max_datagrams: usize,
}

/// Counts of what happened, for the caller's counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Drops {
    /// Datagrams dropped for a bad or overlapping fragment or too many.
    pub failed: u64,
    /// Datagrams dropped because they waited too long.
    pub timed_out: u64,
    /// Datagrams dropped to stay in the memory budget.
    pub evicted: u64,
}

/// `Entry::seq` of an unused slot.
const FREE: u64 = u64::MAX;

/// The reassembly table of one lcore.
#[derive(Debug)]
pub struct Reassembler {
    /// Datagram -> its slot in `entries`.
    table: HashMap<Key, u32, Keyed>,
    entries: Vec<Entry>,
    /// Unused slots.
    free: Vec<u32>,
    /// Datagrams oldest first, by (seq, slot); records of datagrams gone
    /// since are skipped, and swept out when it is full.
    order: VecDeque<(u64, u32)>,
    next_seq: u64,
    limits: Limits,
    bytes: usize,
    /// Per family: IPv4, IPv6.
    drops: [Drops; 2],
}

impl Reassembler {
    /// An empty table with room for `limits.max_datagrams` datagrams
    /// (allocated now: taking fragments allocates nothing).
    pub fn new(limits: Limits) -> Reassembler {
        let max = limits.max_datagrams;
        let key = [crate::ip_id::random_u32(), crate::ip_id::random_u32(), crate::ip_id::random_u32()];
        Reassembler {
            // Twice the most it holds: hashbrown then always rehashes in place
            // (never reallocates) when deleted slots run out.
            table: HashMap::with_capacity_and_hasher(
                2 * max,
                Keyed((key[0] as u64) << 32 | key[1] as u64, (key[2] as u64) << 32 | 0x9e37_79b9),
            ),
            entries: (0..max)
                .map(|_| Entry {
                    key: Key { src: 0, dst: 0, protocol: 0, ident: 0, v6: false },
                    created: Instant(0),
                    seq: FREE,
                    spans: [(0, 0, 0, 0); MAX_FRAGMENTS],
                    mbufs: Burst::new(),
                    total: None,
                    received: 0,
                    bytes: 0,
                })
                .collect(),
            free: (0..max as u32).rev().collect(),
            order: VecDeque::with_capacity(2 * max),
            next_seq: 0,
            limits,
            bytes: 0,
            drops: Default::default(),
        }
    }

    /// Bytes of mbuf buffers held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Datagrams waiting for fragments.
    pub fn pending(&self) -> usize {
        self.table.len()
    }

    /// What was dropped since the last call (and reset): IPv4's, IPv6's.
    pub fn take_drops(&mut self) -> [Drops; 2] {
        std::mem::take(&mut self.drops)
    }

    /// Takes fragment `f` of datagram `key`.
    pub fn insert(&mut self, key: Key, f: Fragment, now: Instant) -> Outcome {
        let end = f.offset + f.len;
        let tiny_first = f.offset == 0 && f.len < 8;
        let bad = (f.len == 0 && f.more) || end > MAX_PAYLOAD || (f.more && f.len % 8 != 0) || tiny_first;
        if bad {
            self.fail(&key);
            return Outcome::Failed;
        }
        let slot = match self.table.get(&key) {
            Some(&slot) => slot,
            None => {
                self.make_room();
                let slot = self.free.pop().expect("make_room leaves a free slot");
                let seq = self.next_seq;
                self.next_seq += 1;
                self.order.push_back((seq, slot));
                self.table.insert(key, slot);
                let e = &mut self.entries[slot as usize];
                (e.key, e.created, e.seq, e.total, e.received, e.bytes) = (key, now, seq, None, 0, 0);
                slot
            }
        };
        let e = &mut self.entries[slot as usize];
        let n = e.mbufs.len();
        for &(s, l, _, _) in &e.spans[..n] {
            if s == f.offset && l == f.len {
                return Outcome::Duplicate;
            }
            if f.offset < s + l && s < end {
                self.fail(&key);
                return Outcome::Failed;
            }
        }
        let contradicts = match (f.more, e.total) {
            (false, Some(t)) => t != end,
            (false, None) => e.spans[..n].iter().any(|&(s, l, _, _)| s + l > end),
            (true, Some(t)) => end > t,
            (true, None) => false,
        };
        if contradicts || n == MAX_FRAGMENTS {
            self.fail(&key);
            return Outcome::Failed;
        }
        let e = &mut self.entries[slot as usize];
        if !f.more {
            e.total = Some(end);
        }
        let size = f.mbuf.buf_len();
        e.spans[n] = (f.offset, f.len, f.data_at as u16, f.l3 as u16);
        let _ = e.mbufs.push(f.mbuf);
        e.received += f.len;
        e.bytes += size;
        let complete = e.total == Some(e.received);
        self.bytes += size;
        if !complete {
            if self.bytes > self.limits.high {
                self.evict_to_low();
                if !self.table.contains_key(&key) {
                    return Outcome::Failed;
                }
            }
            return Outcome::Held;
        }
        self.table.remove(&key);
        let e = &mut self.entries[slot as usize];
        self.bytes -= e.bytes;
        let done = Outcome::complete(e);
        self.release(slot);
        if matches!(done, Outcome::Failed) {
            self.drops[key.v6 as usize].failed += 1;
        }
        done
    }

    /// Frees a slot and whatever mbufs it still holds.
    fn release(&mut self, slot: u32) {
        let e = &mut self.entries[slot as usize];
        e.mbufs.clear();
        e.seq = FREE;
        self.free.push(slot);
    }

    /// Drops datagrams that waited longer than the timeout.
    pub fn expire(&mut self, now: Instant) {
        let timeout = self.limits.timeout_ns;
        let mut freed = 0;
        let (drops, entries, free) = (&mut self.drops, &mut self.entries, &mut self.free);
        self.table.retain(|k, slot| {
            let e = &mut entries[*slot as usize];
            let keep = now.0.saturating_sub(e.created.0) < timeout;
            if !keep {
                freed += e.bytes;
                drops[k.v6 as usize].timed_out += 1;
                e.mbufs.clear();
                e.seq = FREE;
                free.push(*slot);
            }
            keep
        });
        self.bytes -= freed;
    }

    fn fail(&mut self, key: &Key) {
        if let Some(slot) = self.table.remove(key) {
            self.bytes -= self.entries[slot as usize].bytes;
            self.release(slot);
        }
        self.drops[key.v6 as usize].failed += 1;
    }

    /// Keeps room for a new datagram in the table (the oldest goes when
    /// it is full) and in the order records (swept when they are full: at
    /// least half of them are stale then, so sweeps cost O(1) per
    /// datagram, and the deque never grows past its first allocation).
    fn make_room(&mut self) {
        if self.table.len() >= self.limits.max_datagrams {
            self.evict_oldest();
        }
        if self.order.len() >= 2 * self.limits.max_datagrams {
            let entries = &self.entries;
            self.order.retain(|&(seq, slot)| entries[slot as usize].seq == seq);
        }
    }

    /// Above the high watermark: the oldest datagrams go until the bytes
    /// held are at the low one.
    fn evict_to_low(&mut self) {
        while self.bytes > self.limits.low && !self.table.is_empty() {
            self.evict_oldest();
        }
    }

    fn evict_oldest(&mut self) {
        while let Some((seq, slot)) = self.order.pop_front() {
            if self.entries[slot as usize].seq == seq {
                let e = &self.entries[slot as usize];
                let (key, v6) = (e.key, e.key.v6);
                self.bytes -= e.bytes;
                self.table.remove(&key);
                self.release(slot);
                self.drops[v6 as usize].evicted += 1;
                return;
            }
        }
    }
}

impl Outcome {
    /// Links a complete datagram's fragments in offset order (taking them
    /// out of the entry).
    fn complete(e: &mut Entry) -> Outcome {
        let n = e.mbufs.len();
        let mut order: [u8; MAX_FRAGMENTS] = [0; MAX_FRAGMENTS];
        for (i, o) in order.iter_mut().enumerate().take(n) {
            *o = i as u8;
        }
        order[..n].sort_unstable_by_key(|&i| e.spans[i as usize].0);
        // Take the mbufs out in arrival order, then place them by offset.
        let mut slots: [Option<Mbuf>; MAX_FRAGMENTS] = [const { None }; MAX_FRAGMENTS];
        for (i, m) in e.mbufs.drain().enumerate() {
            slots[i] = Some(m);
        }
        let first = order[0] as usize;
        let mut head = slots[first].take().expect("first fragment");
        let (data_at, l3) = (e.spans[first].2 as usize, e.spans[first].3 as usize);
        let mut rest: Burst<MAX_FRAGMENTS> = Burst::new();
        for &i in &order[1..n] {
            let i = i as usize;
            let mut m = slots[i].take().expect("held");
            // Only the fragment's share of the payload stays.
            if m.adj(e.spans[i].2 as usize).is_err() {
                return Outcome::Failed;
            }
            let _ = rest.push(m);
        }
        let len = e.total.expect("complete");
        if head.chain_all(&mut rest).is_err() {
            return Outcome::Failed;
        }
        Outcome::Complete { mbuf: head, l3, data_at, len }
    }
}

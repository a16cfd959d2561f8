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
//!
//! The table is generic over what holds a fragment ([`FragBuf`]): an
//! [`Mbuf`] on the lcores, a plain byte buffer in the unit tests below,
//! which run the state machine without an EAL.

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

/// What the table keeps a fragment in.
// An mbuf's trim or chain that fails has nothing to say but that it did.
#[allow(clippy::result_unit_err)]
pub trait FragBuf: Sized {
    /// Where one datagram's fragments wait: room for [`MAX_FRAGMENTS`],
    /// allocated with the table.
    type Held: Default + std::fmt::Debug;

    /// Fragments held.
    fn held_len(held: &Self::Held) -> usize;
    /// Holds one more (there is room: the table counts them).
    fn hold(held: &mut Self::Held, buf: Self);
    /// Frees every fragment held.
    fn release(held: &mut Self::Held);
    /// Takes the fragments out, in the order they came.
    fn take(held: &mut Self::Held) -> impl Iterator<Item = Self>;
    /// Bytes charged against the memory budget (the whole buffer).
    fn charge(&self) -> usize;
    /// Cuts `n` bytes off the front.
    fn trim_front(&mut self, n: usize) -> Result<(), ()>;
    /// Chains `rest` after this buffer, in order.
    fn chain(&mut self, rest: impl Iterator<Item = Self>) -> Result<(), ()>;
}

impl FragBuf for Mbuf {
    type Held = Burst<MAX_FRAGMENTS>;

    #[inline]
    fn held_len(held: &Self::Held) -> usize {
        held.len()
    }

    #[inline]
    fn hold(held: &mut Self::Held, buf: Mbuf) {
        let _ = held.push(buf);
    }

    #[inline]
    fn release(held: &mut Self::Held) {
        held.clear();
    }

    #[inline]
    fn take(held: &mut Self::Held) -> impl Iterator<Item = Mbuf> {
        held.drain()
    }

    #[inline]
    fn charge(&self) -> usize {
        self.buf_len()
    }

    #[inline]
    fn trim_front(&mut self, n: usize) -> Result<(), ()> {
        self.adj(n).map_err(|_| ())
    }

    #[inline]
    fn chain(&mut self, rest: impl Iterator<Item = Mbuf>) -> Result<(), ()> {
        let mut tails: Burst<MAX_FRAGMENTS> = Burst::new();
        for m in rest {
            let _ = tails.push(m);
        }
        self.chain_all(&mut tails).map_err(|_| ())
    }
}

/// A buffer in memory holds a fragment as an mbuf does: the engine's unit
/// tests run fragments through the receive path's parse and this table.
#[cfg(any(test, feature = "internals"))]
impl FragBuf for crate::buf::MemBuf {
    type Held = Vec<crate::buf::MemBuf>;

    fn held_len(held: &Self::Held) -> usize {
        held.len()
    }

    fn hold(held: &mut Self::Held, buf: Self) {
        held.push(buf);
    }

    fn release(held: &mut Self::Held) {
        held.clear();
    }

    fn take(held: &mut Self::Held) -> impl Iterator<Item = Self> {
        std::mem::take(held).into_iter()
    }

    fn charge(&self) -> usize {
        use crate::buf::PacketBuf;
        Self::HEADROOM + self.pkt_len()
    }

    fn trim_front(&mut self, n: usize) -> Result<(), ()> {
        use crate::buf::PacketBuf;
        self.adj(n).map_err(|_| ())
    }

    fn chain(&mut self, rest: impl Iterator<Item = Self>) -> Result<(), ()> {
        use crate::buf::PacketBuf;
        for r in rest {
            let segments: Vec<Vec<u8>> = r.segments().map(<[u8]>::to_vec).collect();
            self.chained.extend(segments);
        }
        Ok(())
    }
}

/// One fragment as the table takes it.
#[derive(Debug)]
pub struct Fragment<B = Mbuf> {
    /// The frame, its data starting at the Ethernet header.
    pub mbuf: B,
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
pub enum Outcome<B = Mbuf> {
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
        mbuf: B,
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
struct Entry<B: FragBuf> {
    key: Key,
    created: Instant,
    /// Order of arrival among the table's datagrams (ties in `created`
    /// are common: one burst shares a timestamp); [`FREE`] when the slot
    /// is unused.
    seq: u64,
    /// (offset, len, data_at, l3) per held fragment, parallel to `mbufs`.
    spans: [(u32, u32, u16, u16); MAX_FRAGMENTS],
    mbufs: B::Held,
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
pub struct Reassembler<B: FragBuf = Mbuf> {
    /// Datagram -> its slot in `entries`.
    table: HashMap<Key, u32, Keyed>,
    entries: Vec<Entry<B>>,
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

impl<B: FragBuf> Reassembler<B> {
    /// An empty table with room for `limits.max_datagrams` datagrams
    /// (allocated now: taking fragments allocates nothing).
    pub fn new(limits: Limits) -> Reassembler<B> {
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
                    mbufs: B::Held::default(),
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
    pub fn insert(&mut self, key: Key, f: Fragment<B>, now: Instant) -> Outcome<B> {
        let end = f.offset + f.len;
        let tiny_first = f.offset == 0 && f.len < 8;
        let bad = (f.len == 0 && f.more) || end > MAX_PAYLOAD || (f.more && !f.len.is_multiple_of(8)) || tiny_first;
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
        let n = B::held_len(&e.mbufs);
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
        let size = f.mbuf.charge();
        e.spans[n] = (f.offset, f.len, f.data_at as u16, f.l3 as u16);
        B::hold(&mut e.mbufs, f.mbuf);
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
        B::release(&mut e.mbufs);
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
                B::release(&mut e.mbufs);
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

impl<B: FragBuf> Outcome<B> {
    /// Links a complete datagram's fragments in offset order (taking them
    /// out of the entry).
    fn complete(e: &mut Entry<B>) -> Outcome<B> {
        let n = B::held_len(&e.mbufs);
        let mut order: [u8; MAX_FRAGMENTS] = [0; MAX_FRAGMENTS];
        for (i, o) in order.iter_mut().enumerate().take(n) {
            *o = i as u8;
        }
        order[..n].sort_unstable_by_key(|&i| e.spans[i as usize].0);
        // Take the mbufs out in arrival order, then place them by offset.
        let mut slots: [Option<B>; MAX_FRAGMENTS] = [const { None }; MAX_FRAGMENTS];
        for (i, m) in B::take(&mut e.mbufs).enumerate() {
            slots[i] = Some(m);
        }
        let first = order[0] as usize;
        let mut head = slots[first].take().expect("first fragment");
        let (data_at, l3) = (e.spans[first].2 as usize, e.spans[first].3 as usize);
        for &i in &order[1..n] {
            let i = i as usize;
            // Only the fragment's share of the payload stays.
            if slots[i].as_mut().expect("held").trim_front(e.spans[i].2 as usize).is_err() {
                return Outcome::Failed;
            }
        }
        let len = e.total.expect("complete");
        let rest = order[1..n].iter().map(|&i| slots[i as usize].take().expect("held"));
        if head.chain(rest).is_err() {
            return Outcome::Failed;
        }
        Outcome::Complete { mbuf: head, l3, data_at, len }
    }
}

/// The state machine on byte buffers: no EAL, no mbufs.
/// Fragments as plain bytes, for running the table without an EAL (the
/// unit tests and the fuzz target).
#[cfg(any(test, feature = "internals"))]
pub mod bytes {
    use super::FragBuf;

    /// A fragment's frame as bytes; once chained, the segments after it.
    #[derive(Debug)]
    pub struct Bytes {
        /// The segments.
        pub segs: Vec<Vec<u8>>,
    }

    /// What each buffer is charged, as a 2,048-byte mbuf with headroom.
    pub const CHARGE: usize = 2176;

    impl FragBuf for Bytes {
        type Held = Vec<Bytes>;
        fn held_len(held: &Vec<Bytes>) -> usize {
            held.len()
        }
        fn hold(held: &mut Vec<Bytes>, buf: Bytes) {
            held.push(buf);
        }
        fn release(held: &mut Vec<Bytes>) {
            held.clear();
        }
        fn take(held: &mut Vec<Bytes>) -> impl Iterator<Item = Bytes> {
            std::mem::take(held).into_iter()
        }
        fn charge(&self) -> usize {
            CHARGE
        }
        fn trim_front(&mut self, n: usize) -> Result<(), ()> {
            if n > self.segs[0].len() {
                return Err(());
            }
            self.segs[0].drain(..n);
            Ok(())
        }
        fn chain(&mut self, rest: impl Iterator<Item = Bytes>) -> Result<(), ()> {
            for r in rest {
                self.segs.extend(r.segs);
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::bytes::{Bytes, CHARGE};

    /// Ethernet + IPv4 header in front of the fragmentable part.
    const L3: usize = 14;
    const DATA_AT: usize = 34;

    fn limits() -> Limits {
        Limits { high: 64 * CHARGE, low: 48 * CHARGE, timeout_ns: 1_000_000, max_datagrams: 16 }
    }

    fn key(ident: u32, v6: bool) -> Key {
        Key { src: 0xc612_0001, dst: 0xc612_0002, protocol: 17, ident, v6 }
    }

    /// Fragment [offset, offset + len) of `datagram`.
    fn frag(datagram: &[u8], offset: usize, len: usize, more: bool) -> Fragment<Bytes> {
        let mut frame = vec![0xee; DATA_AT];
        frame.extend_from_slice(&datagram[offset..offset + len]);
        Fragment {
            mbuf: Bytes { segs: vec![frame] },
            l3: L3,
            data_at: DATA_AT,
            offset: offset as u32,
            len: len as u32,
            more,
        }
    }

    fn datagram(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// The fragmentable part a complete datagram carries.
    fn payload(done: Outcome<Bytes>) -> Vec<u8> {
        let Outcome::Complete { mbuf, l3, data_at, len } = done else { panic!("not complete: {done:?}") };
        assert_eq!((l3, data_at), (L3, DATA_AT));
        let mut out = mbuf.segs[0][data_at..].to_vec();
        for s in &mbuf.segs[1..] {
            out.extend_from_slice(s);
        }
        assert_eq!(out.len(), len as usize);
        out
    }

    #[test]
    fn every_order_reassembles_byte_exact() {
        let d = datagram(3000);
        let parts = [(0, 1480, true), (1480, 1480, true), (2960, 40, false)];
        let orders = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]];
        let mut r: Reassembler<Bytes> = Reassembler::new(limits());
        for (n, order) in orders.iter().enumerate() {
            for (i, &p) in order.iter().enumerate() {
                let (off, len, more) = parts[p];
                let out = r.insert(key(n as u32, false), frag(&d, off, len, more), Instant(0));
                if i < 2 {
                    assert!(matches!(out, Outcome::Held), "order {order:?} step {i}: {out:?}");
                    assert_eq!(r.bytes(), (i + 1) * CHARGE);
                } else {
                    assert_eq!(payload(out), d, "order {order:?}");
                }
            }
            assert_eq!((r.pending(), r.bytes()), (0, 0));
        }
        assert_eq!(r.take_drops(), [Drops::default(); 2]);
    }

    #[test]
    fn a_duplicate_is_dropped_alone() {
        let d = datagram(2000);
        let mut r: Reassembler<Bytes> = Reassembler::new(limits());
        assert!(matches!(r.insert(key(1, false), frag(&d, 0, 1480, true), Instant(0)), Outcome::Held));
        assert!(matches!(r.insert(key(1, false), frag(&d, 0, 1480, true), Instant(0)), Outcome::Duplicate));
        assert_eq!(r.bytes(), CHARGE, "the duplicate is not held");
        assert_eq!(payload(r.insert(key(1, false), frag(&d, 1480, 520, false), Instant(0))), d);
    }

    #[test]
    fn an_overlap_drops_the_datagram() {
        let d = datagram(3000);
        let mut r: Reassembler<Bytes> = Reassembler::new(limits());
        assert!(matches!(r.insert(key(1, true), frag(&d, 0, 1480, true), Instant(0)), Outcome::Held));
        // Overlaps the first by 8 bytes (RFC 5722: the whole datagram goes).
        assert!(matches!(r.insert(key(1, true), frag(&d, 1472, 1480, true), Instant(0)), Outcome::Failed));
        assert_eq!((r.pending(), r.bytes()), (0, 0));
        assert_eq!(r.take_drops(), [Drops::default(), Drops { failed: 1, ..Drops::default() }]);
        // What comes later for the same key starts afresh.
        assert!(matches!(r.insert(key(1, true), frag(&d, 2960, 40, false), Instant(0)), Outcome::Held));
    }

    #[test]
    fn malformed_fragments_are_refused() {
        let d = datagram(70_000);
        let mut r: Reassembler<Bytes> = Reassembler::new(limits());
        let refused = |r: &mut Reassembler<Bytes>, f: Fragment<Bytes>| {
            matches!(r.insert(key(9, false), f, Instant(0)), Outcome::Failed)
        };
        assert!(refused(&mut r, frag(&d, 0, 4, true)), "a first fragment shorter than a UDP header");
        assert!(refused(&mut r, frag(&d, 8, 12, true)), "a non-last fragment not a multiple of 8");
        assert!(refused(&mut r, frag(&d, 65528, 16, false)), "past 64 KiB");
        assert!(refused(&mut r, frag(&d, 8, 0, true)), "empty, more to come");
        assert!(matches!(r.insert(key(9, false), frag(&d, 0, 1480, true), Instant(0)), Outcome::Held));
        assert!(refused(&mut r, frag(&d, 800, 200, false)), "a last fragment ending inside one held");
        assert!(matches!(r.insert(key(9, false), frag(&d, 1480, 100, false), Instant(0)), Outcome::Held));
        assert!(matches!(r.insert(key(9, false), frag(&d, 0, 1480, true), Instant(0)), Outcome::Complete { .. }));
        assert!(matches!(r.insert(key(9, false), frag(&d, 1480, 100, false), Instant(0)), Outcome::Held));
        assert!(refused(&mut r, frag(&d, 1600, 8, true)), "a fragment past the known end");
        assert_eq!(r.take_drops()[0].failed, 6);
        assert_eq!((r.pending(), r.bytes()), (0, 0));
    }

    #[test]
    fn a_datagram_holds_at_most_max_fragments() {
        let d = datagram(8 * (MAX_FRAGMENTS + 1));
        let mut r: Reassembler<Bytes> = Reassembler::new(limits());
        for i in 0..MAX_FRAGMENTS {
            let out = r.insert(key(3, false), frag(&d, 8 * i, 8, true), Instant(0));
            assert!(matches!(out, Outcome::Held), "fragment {i}: {out:?}");
        }
        let out = r.insert(key(3, false), frag(&d, 8 * MAX_FRAGMENTS, 8, false), Instant(0));
        assert!(matches!(out, Outcome::Failed), "{out:?}");
        assert_eq!((r.pending(), r.bytes(), r.take_drops()[0].failed), (0, 0, 1));
    }

    #[test]
    fn datagrams_time_out() {
        let d = datagram(2000);
        let mut r: Reassembler<Bytes> = Reassembler::new(limits());
        let _ = r.insert(key(1, false), frag(&d, 0, 1480, true), Instant(0));
        let _ = r.insert(key(2, true), frag(&d, 0, 1480, true), Instant(500_000));
        r.expire(Instant(999_999));
        assert_eq!(r.pending(), 2);
        r.expire(Instant(1_000_000));
        assert_eq!((r.pending(), r.bytes()), (1, CHARGE));
        r.expire(Instant(1_500_000));
        assert_eq!((r.pending(), r.bytes()), (0, 0));
        let [v4, v6] = r.take_drops();
        assert_eq!((v4.timed_out, v6.timed_out), (1, 1));
    }

    #[test]
    fn over_the_budget_the_oldest_go_down_to_the_low_mark() {
        let d = datagram(2000);
        let small = Limits { high: 5 * CHARGE, low: 3 * CHARGE, ..limits() };
        let mut r: Reassembler<Bytes> = Reassembler::new(small);
        for ident in 1..=5 {
            assert!(matches!(r.insert(key(ident, false), frag(&d, 0, 1480, true), Instant(0)), Outcome::Held));
        }
        // The sixth takes it over the high mark: 1, 2 and 3 go.
        assert!(matches!(r.insert(key(6, false), frag(&d, 0, 1480, true), Instant(0)), Outcome::Held));
        assert_eq!((r.pending(), r.bytes()), (3, 3 * CHARGE));
        assert_eq!(r.take_drops()[0].evicted, 3);
        assert!(matches!(r.insert(key(1, false), frag(&d, 1480, 520, false), Instant(0)), Outcome::Held), "1 is gone");
        assert_eq!(payload(r.insert(key(4, false), frag(&d, 1480, 520, false), Instant(0))), d, "4 stayed");
    }

    #[test]
    fn the_table_holds_at_most_max_datagrams() {
        let d = datagram(2000);
        let mut r: Reassembler<Bytes> = Reassembler::new(Limits { max_datagrams: 4, ..limits() });
        for ident in 0..5 {
            let _ = r.insert(key(ident, false), frag(&d, 0, 1480, true), Instant(0));
        }
        assert_eq!((r.pending(), r.take_drops()[0].evicted), (4, 1));
        assert!(
            matches!(r.insert(key(0, false), frag(&d, 1480, 520, false), Instant(0)), Outcome::Held),
            "the oldest went"
        );
    }

    #[test]
    fn bookkeeping_stays_bounded_over_many_datagrams() {
        let d = datagram(2000);
        let lim = Limits { max_datagrams: 8, ..limits() };
        let mut r: Reassembler<Bytes> = Reassembler::new(lim);
        for ident in 0..10_000u32 {
            let _ = r.insert(key(ident, false), frag(&d, 0, 1480, true), Instant(ident as u64));
            if ident % 3 == 0 {
                let out = r.insert(key(ident, false), frag(&d, 1480, 520, false), Instant(ident as u64));
                assert!(matches!(out, Outcome::Complete { .. }));
            }
            assert!(r.pending() <= 8 && r.order.len() <= 16 && r.free.len() + r.pending() == 8);
        }
    }
}

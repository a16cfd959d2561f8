//! Owned packet buffers.

use std::ptr::NonNull;

use crate::error::{Error, Result};
use crate::sys;

/// An owned DPDK packet buffer (a chain of one or more segments).
///
/// It is freed to its pool on drop, exactly once; `into_raw` hands it to
/// DPDK instead. `repr(transparent)` lets an array of `Mbuf` be passed as the
/// `struct rte_mbuf **` that the burst functions take.
#[repr(transparent)]
#[derive(Debug)]
pub struct Mbuf(NonNull<sys::rte_mbuf>);

// SAFETY: an Mbuf is the only handle to its buffer; DPDK mbufs may be freed
// on any thread.
unsafe impl Send for Mbuf {}

/// A read-only share of a packet: an indirect mbuf attached to another
/// mbuf's data (`rte_pktmbuf_clone`), or that mbuf itself once shared. The
/// data lives until the last share is dropped; no share can write it, so
/// shares may be read on any thread. What [`Mbuf::share`] makes.
#[derive(Debug)]
pub struct SharedMbuf(NonNull<sys::rte_mbuf>);

// SAFETY: every handle to the data is read-only; the reference count that
// frees it is atomic.
unsafe impl Send for SharedMbuf {}

impl SharedMbuf {
    /// The first segment's data.
    #[inline]
    pub fn data(&self) -> &[u8] {
        // SAFETY: a valid mbuf; its data is never written while shared.
        let m = unsafe { self.0.as_ref() };
        // SAFETY: buf_addr + data_off .. + data_len lies inside the buffer.
        unsafe { std::slice::from_raw_parts((m.buf_addr as *const u8).add(m.data_off as usize), m.data_len as usize) }
    }
}

impl Drop for SharedMbuf {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: this handle's own mbuf (direct or indirect), freed once;
        // DPDK frees the shared data with its last reference.
        unsafe { sys::spate_pktmbuf_free(self.0.as_ptr()) }
    }
}

/// `RTE_MBUF_F_TX_*` flags for checksum offload.
pub mod tx_flags {
    use crate::sys;
    /// The packet is IPv4.
    pub const IPV4: u64 = sys::RTE_MBUF_F_TX_IPV4;
    /// The packet is IPv6.
    pub const IPV6: u64 = sys::RTE_MBUF_F_TX_IPV6;
    /// Compute the IPv4 header checksum.
    pub const IP_CKSUM: u64 = sys::RTE_MBUF_F_TX_IP_CKSUM;
    /// Compute the UDP checksum (the field holds the pseudo-header sum).
    pub const UDP_CKSUM: u64 = sys::RTE_MBUF_F_TX_UDP_CKSUM;
    /// Every checksum-offload flag.
    pub const ALL: u64 = IPV4 | IPV6 | IP_CKSUM | UDP_CKSUM;
}

/// Checksum status a port reported for a received packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxChecksum {
    /// The port did not check it.
    Unknown,
    /// The port verified it.
    Good,
    /// The port found it wrong.
    Bad,
    /// The packet has no such checksum (or the check does not apply).
    None,
}

impl Mbuf {
    /// Takes ownership of a raw mbuf; `None` for a null pointer.
    ///
    /// # Safety
    /// `raw` must be null or a valid mbuf that nothing else owns.
    #[inline]
    pub unsafe fn from_raw(raw: *mut sys::rte_mbuf) -> Option<Mbuf> {
        NonNull::new(raw).map(Mbuf)
    }

    /// Shares the packet `extra + 1` ways without copying its data: `extra`
    /// indirect mbufs from `pool` attached to it (`rte_pktmbuf_clone`),
    /// then the packet itself, pushed to `out`, all read-only. Returns how
    /// many indirect ones the pool gave (fewer than `extra` when it ran
    /// out).
    pub fn share(self, pool: &crate::Mempool, extra: usize, out: &mut Vec<SharedMbuf>) -> usize {
        let mut made = 0;
        for _ in 0..extra {
            // SAFETY: a valid mbuf and pool; a non-null result is a new
            // indirect mbuf this call owns.
            let Some(c) = NonNull::new(unsafe { sys::rte_pktmbuf_clone(self.0.as_ptr(), pool.as_ptr()) }) else {
                break;
            };
            out.push(SharedMbuf(c));
            made += 1;
        }
        out.push(SharedMbuf(NonNull::new(self.into_raw()).expect("a valid mbuf")));
        made
    }

    /// Frees the mbuf of every item of `items` and empties it, up to 64
    /// in one bulk call: each item is moved out and handed to `mbuf`,
    /// which gives back the mbuf it owns (dropping whatever else it
    /// holds), and the pointers are gathered with a load and a store
    /// each, without [`Burst::push`]'s count and bound per mbuf.
    ///
    /// [`Burst::push`]: crate::Burst::push
    pub fn free_all<T>(items: &mut Vec<T>, mbuf: impl Fn(T) -> Mbuf) {
        const CHUNK: usize = 64;
        let len = items.len();
        // SAFETY: the vector forgets its items before they are moved out
        // below, each once; a panic in `mbuf` leaks what is left (and
        // the mbufs gathered so far) instead of dropping anything twice.
        unsafe { items.set_len(0) };
        let base = items.as_ptr();
        let mut start = 0;
        while start < len {
            let n = CHUNK.min(len - start);
            // Not zeroed first: only the `n` written are passed on.
            let mut raw = [const { std::mem::MaybeUninit::<*mut sys::rte_mbuf>::uninit() }; CHUNK];
            for (k, r) in raw[..n].iter_mut().enumerate() {
                // SAFETY: item `start + k` is initialised (it was within
                // the vector's length) and is moved out only here.
                r.write(mbuf(unsafe { base.add(start + k).read() }).into_raw());
            }
            // SAFETY: the first `n` pointers were written above, each an
            // mbuf this call owns (`into_raw` gave up its `Mbuf`), freed
            // exactly once, here.
            unsafe { sys::rte_pktmbuf_free_bulk(raw.as_mut_ptr() as *mut *mut sys::rte_mbuf, n as u32) };
            start += n;
        }
    }

    /// Gives up ownership without freeing.
    #[inline]
    pub fn into_raw(self) -> *mut sys::rte_mbuf {
        let raw = self.0.as_ptr();
        std::mem::forget(self);
        raw
    }

    /// The raw pointer (still owned by `self`).
    #[inline]
    pub fn as_ptr(&self) -> *mut sys::rte_mbuf {
        self.0.as_ptr()
    }

    #[inline]
    fn raw(&self) -> &sys::rte_mbuf {
        // SAFETY: we own a valid mbuf.
        unsafe { self.0.as_ref() }
    }

    #[inline]
    fn raw_mut(&mut self) -> &mut sys::rte_mbuf {
        // SAFETY: we own a valid mbuf exclusively.
        unsafe { self.0.as_mut() }
    }

    /// The first segment's data.
    #[inline]
    pub fn data(&self) -> &[u8] {
        let m = self.raw();
        // SAFETY: buf_addr + data_off .. + data_len lies inside the buffer.
        unsafe { std::slice::from_raw_parts((m.buf_addr as *const u8).add(m.data_off as usize), m.data_len as usize) }
    }

    /// Asks the CPU to bring the mbuf's first cache line (addresses and
    /// lengths) closer: an mbuf another core last wrote is otherwise a
    /// cache miss before its data can even be found.
    #[inline]
    pub fn prefetch_header(&self) {
        // SAFETY: a prefetch never faults and changes no memory.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(self.0.as_ptr() as *const i8);
        }
    }

    /// Asks the CPU to bring the first cache line of the data closer: frames
    /// a device wrote from another core are otherwise a cache miss each.
    #[inline]
    pub fn prefetch_data(&self) {
        let m = self.raw();
        // SAFETY: the address lies inside the mbuf's buffer; a prefetch
        // never faults and changes no memory.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            let p = (m.buf_addr as *const u8).add(m.data_off as usize);
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const i8);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = m;
    }

    /// The first segment's data, writable.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        let m = self.raw_mut();
        // SAFETY: as in `data`; the mbuf is ours alone (spate never clones
        // mbufs into shared ones), so writing cannot be observed elsewhere.
        unsafe { std::slice::from_raw_parts_mut((m.buf_addr as *mut u8).add(m.data_off as usize), m.data_len as usize) }
    }

    /// Bytes in the first segment.
    #[inline]
    pub fn data_len(&self) -> usize {
        self.raw().data_len as usize
    }

    /// Bytes in the whole packet (all segments).
    #[inline]
    pub fn pkt_len(&self) -> usize {
        self.raw().pkt_len as usize
    }

    /// Number of segments.
    #[inline]
    pub fn segments(&self) -> u16 {
        self.raw().nb_segs
    }

    /// Whether the packet is in one segment.
    #[inline]
    pub fn is_contiguous(&self) -> bool {
        self.raw().nb_segs == 1
    }

    /// Every segment's data, in order.
    pub fn segment_data(&self) -> SegmentIter<'_> {
        SegmentIter { next: self.0.as_ptr(), left: self.raw().nb_segs, _owner: std::marker::PhantomData }
    }

    /// Copies `out.len()` bytes starting at `offset` across segments; false
    /// when the packet is shorter.
    pub fn read_at(&self, mut offset: usize, out: &mut [u8]) -> bool {
        if offset + out.len() > self.pkt_len() {
            return false;
        }
        let mut done = 0;
        for seg in self.segment_data() {
            if offset >= seg.len() {
                offset -= seg.len();
                continue;
            }
            let n = (seg.len() - offset).min(out.len() - done);
            out[done..done + n].copy_from_slice(&seg[offset..offset + n]);
            done += n;
            offset = 0;
            if done == out.len() {
                break;
            }
        }
        done == out.len()
    }

    /// Free bytes before the data.
    #[inline]
    pub fn headroom(&self) -> usize {
        self.raw().data_off as usize
    }

    /// The bytes before the data in the first segment: after `adj`, the
    /// headers that were stripped are still there, until a `prepend`
    /// overwrites them.
    #[inline]
    pub fn headroom_bytes(&self) -> &[u8] {
        let m = self.raw();
        // SAFETY: buf_addr .. buf_addr + data_off lies inside the buffer.
        unsafe { std::slice::from_raw_parts(m.buf_addr as *const u8, m.data_off as usize) }
    }

    /// The bytes before the data in the first segment, to write: spate
    /// keeps a received datagram's arrival there, over its Ethernet header.
    #[inline]
    pub fn headroom_bytes_mut(&mut self) -> &mut [u8] {
        let m = self.raw();
        // SAFETY: buf_addr .. buf_addr + data_off lies inside the buffer,
        // which this mbuf owns alone (`&mut self`).
        unsafe { std::slice::from_raw_parts_mut(m.buf_addr as *mut u8, m.data_off as usize) }
    }

    /// Free bytes after the data of the last segment.
    pub fn tailroom(&self) -> usize {
        // SAFETY: last_segment returns a valid segment of our chain.
        unsafe { sys::spate_pktmbuf_tailroom(self.last_segment()) as usize }
    }

    fn last_segment(&self) -> *mut sys::rte_mbuf {
        let mut seg = self.0.as_ptr();
        // SAFETY: the chain of a valid mbuf ends in a null `next`.
        unsafe {
            while !(*seg).next.is_null() {
                seg = (*seg).next;
            }
        }
        seg
    }

    /// Grows the packet at the front by `len` bytes and returns them.
    #[inline]
    pub fn prepend(&mut self, len: usize) -> Result<&mut [u8]> {
        let m = self.raw_mut();
        if len > m.data_off as usize {
            return Err(Error::MbufRoom("prepend beyond the headroom"));
        }
        // What rte_pktmbuf_prepend does, inline.
        m.data_off -= len as u16;
        m.data_len += len as u16;
        m.pkt_len += len as u32;
        // SAFETY: the new front lies inside the buffer (checked above).
        Ok(unsafe { std::slice::from_raw_parts_mut((m.buf_addr as *mut u8).add(m.data_off as usize), len) })
    }

    /// Grows the packet at the end (of the last segment) by `len` bytes.
    #[inline]
    pub fn append(&mut self, len: usize) -> Result<&mut [u8]> {
        if len > u16::MAX as usize {
            return Err(Error::MbufRoom("append of more than 65,535 bytes"));
        }
        if self.is_contiguous() {
            let m = self.raw_mut();
            let end = m.data_off as usize + m.data_len as usize;
            if end + len > m.buf_len as usize {
                return Err(Error::MbufRoom("append beyond the tailroom"));
            }
            m.data_len += len as u16;
            m.pkt_len += len as u32;
            // SAFETY: end..end+len lies inside the buffer (checked above).
            return Ok(unsafe { std::slice::from_raw_parts_mut((m.buf_addr as *mut u8).add(end), len) });
        }
        // SAFETY: DPDK checks the tailroom and returns null when it is short.
        let p = unsafe { sys::spate_pktmbuf_append(self.0.as_ptr(), len as u16) };
        if p.is_null() {
            return Err(Error::MbufRoom("append beyond the tailroom"));
        }
        // SAFETY: DPDK reserved len bytes at p.
        Ok(unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) })
    }

    /// Removes `len` bytes from the front (of the first segment).
    #[inline]
    pub fn adj(&mut self, len: usize) -> Result<()> {
        let m = self.raw_mut();
        if len > m.data_len as usize {
            return Err(Error::MbufRoom("adj beyond the first segment"));
        }
        m.data_off += len as u16;
        m.data_len -= len as u16;
        m.pkt_len -= len as u32;
        Ok(())
    }

    /// Removes `len` bytes from the end (of the last segment).
    #[inline]
    pub fn trim(&mut self, len: usize) -> Result<()> {
        if self.is_contiguous() {
            let m = self.raw_mut();
            if len > m.data_len as usize {
                return Err(Error::MbufRoom("trim beyond the last segment"));
            }
            m.data_len -= len as u16;
            m.pkt_len -= len as u32;
            return Ok(());
        }
        if len > u16::MAX as usize {
            return Err(Error::MbufRoom("trim beyond the last segment"));
        }
        // SAFETY: DPDK checks the last segment's length.
        let ret = unsafe { sys::spate_pktmbuf_trim(self.0.as_ptr(), len as u16) };
        if ret != 0 {
            return Err(Error::MbufRoom("trim beyond the last segment"));
        }
        Ok(())
    }

    /// Keeps the first `len` bytes of the packet, whatever segments they
    /// lie in: the segment the cut falls in becomes the last, and the
    /// segments after it are freed. No effect when the packet is not
    /// longer.
    pub fn truncate(&mut self, len: usize) {
        let total = self.pkt_len();
        if len >= total {
            return;
        }
        if self.is_contiguous() {
            let m = self.raw_mut();
            m.data_len = len as u16;
            m.pkt_len = len as u32;
            return;
        }
        // SAFETY: the segments are our chain's; the walk stops at the
        // segment holding byte `len` (or the first one for `len == 0`),
        // which exists because `len < pkt_len`. The cut-off tail becomes
        // an Mbuf of its own with consistent header fields, freed on drop.
        unsafe {
            let head = self.0.as_ptr();
            let (mut seg, mut before, mut segs) = (head, 0usize, 1u16);
            while before + ((*seg).data_len as usize) < len && !(*seg).next.is_null() {
                before += (*seg).data_len as usize;
                seg = (*seg).next;
                segs += 1;
            }
            let had = (*seg).data_len as usize;
            let keep = (len - before).min(had);
            (*seg).data_len = keep as u16;
            let rest = (*seg).next;
            (*seg).next = std::ptr::null_mut();
            let rest_segs = (*head).nb_segs.saturating_sub(segs);
            (*head).nb_segs = segs;
            (*head).pkt_len = (before + keep) as u32;
            if !rest.is_null() {
                (*rest).nb_segs = rest_segs.max(1);
                (*rest).pkt_len = total.saturating_sub(before + had) as u32;
                drop(Mbuf::from_raw(rest));
            }
        }
    }

    /// Bytes of buffer behind the packet (every segment's buffer length):
    /// what it costs in memory.
    #[inline]
    pub fn buf_len(&self) -> usize {
        let m = self.raw();
        // nb_segs sits in the first cache line, next in the second.
        if m.nb_segs == 1 {
            return m.buf_len as usize;
        }
        self.segment_bufs().sum()
    }

    fn segment_bufs(&self) -> impl Iterator<Item = usize> + '_ {
        let mut seg = self.0.as_ptr() as *const sys::rte_mbuf;
        std::iter::from_fn(move || {
            if seg.is_null() {
                return None;
            }
            // SAFETY: segments of a chain we borrow are valid.
            unsafe {
                let len = (*seg).buf_len as usize;
                seg = (*seg).next;
                Some(len)
            }
        })
    }

    /// Appends `tail`'s segments to this packet.
    pub fn chain(&mut self, tail: Mbuf) -> Result<()> {
        let raw_tail = tail.into_raw();
        // SAFETY: both are valid; on success the chain owns tail.
        let ret = unsafe { sys::spate_pktmbuf_chain(self.0.as_ptr(), raw_tail) };
        if ret != 0 {
            // SAFETY: on failure DPDK left tail untouched and ours again.
            drop(unsafe { Mbuf::from_raw(raw_tail) });
            return Err(Error::MbufRoom("chain of more than the segment limit"));
        }
        Ok(())
    }

    /// Appends every packet of `tails`, in order, to this one: one walk to
    /// the last segment, then each link in O(1) (where [`chain`](Self::chain)
    /// walks the whole chain every time). `tails` is left empty. Fails, and
    /// frees `tails`, past 65,535 segments.
    pub fn chain_all<const N: usize>(&mut self, tails: &mut crate::Burst<N>) -> Result<()> {
        let segs: u32 =
            self.raw().nb_segs as u32 + tails.as_slice().iter().map(|t| t.raw().nb_segs as u32).sum::<u32>();
        let len: u32 = self.raw().pkt_len + tails.as_slice().iter().map(|t| t.raw().pkt_len).sum::<u32>();
        if segs > u16::MAX as u32 {
            tails.clear();
            return Err(Error::MbufRoom("chain of more than the segment limit"));
        }
        let mut last = self.last_segment();
        for t in tails.drain() {
            let tail = t.into_raw();
            // SAFETY: `tail` is a valid packet we own; linked after our last
            // segment it belongs to this chain, whose head is fixed below.
            unsafe {
                (*last).next = tail;
                last = tail;
                while !(*last).next.is_null() {
                    last = (*last).next;
                }
            }
        }
        let head = self.raw_mut();
        head.nb_segs = segs as u16;
        head.pkt_len = len;
        Ok(())
    }

    /// Splits off the segments after the first; the rest becomes its own packet.
    pub fn split_first_segment(&mut self) -> Option<Mbuf> {
        let m = self.raw_mut();
        if m.next.is_null() {
            return None;
        }
        let rest = m.next;
        m.next = std::ptr::null_mut();
        let first_len = m.data_len as u32;
        let rest_len = m.pkt_len - first_len;
        let rest_segs = m.nb_segs - 1;
        m.pkt_len = first_len;
        m.nb_segs = 1;
        // SAFETY: `rest` was the owned tail of our chain; fix its header fields.
        unsafe {
            (*rest).pkt_len = rest_len;
            (*rest).nb_segs = rest_segs;
            Mbuf::from_raw(rest)
        }
    }

    /// The port the packet arrived on.
    #[inline]
    pub fn port(&self) -> u16 {
        self.raw().port
    }

    /// Sets the port field (spate marks a frame handed to another lcore
    /// for transmission with the port it goes out of).
    #[inline]
    pub fn set_port(&mut self, port: u16) {
        self.raw_mut().port = port;
    }

    /// DPDK's packet type (`RTE_PTYPE_*` bits), as the PMD parsed it.
    #[inline]
    pub fn packet_type(&self) -> u32 {
        // SAFETY: packet_type is the plain view of the union.
        unsafe { self.raw().__bindgen_anon_1.packet_type }
    }

    /// Sets the packet type.
    #[inline]
    pub fn set_packet_type(&mut self, ptype: u32) {
        self.raw_mut().__bindgen_anon_1.packet_type = ptype;
    }

    /// Offload flags (`RTE_MBUF_F_*`).
    #[inline]
    pub fn ol_flags(&self) -> u64 {
        self.raw().ol_flags
    }

    /// Sets offload flags.
    #[inline]
    pub fn set_ol_flags(&mut self, flags: u64) {
        self.raw_mut().ol_flags = flags;
    }

    /// The hardware RSS hash, when the port computed one.
    #[inline]
    pub fn rss_hash(&self) -> Option<u32> {
        let m = self.raw();
        if m.ol_flags & sys::RTE_MBUF_F_RX_RSS_HASH as u64 != 0 {
            // SAFETY: with the flag set, `rss` is the valid union member.
            Some(unsafe { m.__bindgen_anon_2.hash.rss })
        } else {
            None
        }
    }

    /// Stores an RSS hash and sets its flag.
    #[inline]
    pub fn set_rss_hash(&mut self, hash: u32) {
        let m = self.raw_mut();
        m.__bindgen_anon_2.hash.rss = hash;
        m.ol_flags |= sys::RTE_MBUF_F_RX_RSS_HASH as u64;
    }

    /// Takes the RSS hash out (its flag cleared): what [`Mbuf::set_rss_hash`]
    /// stored, once, so later stages do not take it for the port's.
    #[inline]
    pub fn take_rss_hash(&mut self) -> Option<u32> {
        let hash = self.rss_hash();
        self.raw_mut().ol_flags &= !(sys::RTE_MBUF_F_RX_RSS_HASH as u64);
        hash
    }

    /// Marks the IP and L4 checksums good, as a port that checked them
    /// would: for a packet the host looped back to itself, whose checksums
    /// a transmit offload may have left unfinished (Linux's
    /// `CHECKSUM_UNNECESSARY` on loopback).
    #[inline]
    pub fn set_rx_checksums_good(&mut self) {
        let good = sys::RTE_MBUF_F_RX_IP_CKSUM_GOOD | sys::RTE_MBUF_F_RX_L4_CKSUM_GOOD;
        let m = self.raw_mut();
        m.ol_flags = (m.ol_flags & !((sys::RTE_MBUF_F_RX_IP_CKSUM_MASK | sys::RTE_MBUF_F_RX_L4_CKSUM_MASK) as u64))
            | good as u64;
    }

    /// Whether the port said nothing of either checksum (both verdicts
    /// unknown: a port without receive offloads): one test of the flags
    /// for what [`rx_ip_checksum`](Self::rx_ip_checksum) and
    /// [`rx_l4_checksum`](Self::rx_l4_checksum) would both answer
    /// [`RxChecksum::Unknown`].
    #[inline]
    pub fn rx_checksums_unknown(&self) -> bool {
        // UNKNOWN is the mask's zero in both fields.
        self.raw().ol_flags & (sys::RTE_MBUF_F_RX_IP_CKSUM_MASK | sys::RTE_MBUF_F_RX_L4_CKSUM_MASK) as u64 == 0
    }

    /// The IPv4 header checksum status the port reported.
    #[inline]
    pub fn rx_ip_checksum(&self) -> RxChecksum {
        let f = self.raw().ol_flags & sys::RTE_MBUF_F_RX_IP_CKSUM_MASK as u64;
        match f as u32 {
            sys::RTE_MBUF_F_RX_IP_CKSUM_GOOD => RxChecksum::Good,
            sys::RTE_MBUF_F_RX_IP_CKSUM_BAD => RxChecksum::Bad,
            sys::RTE_MBUF_F_RX_IP_CKSUM_NONE => RxChecksum::None,
            _ => RxChecksum::Unknown,
        }
    }

    /// The L4 (UDP) checksum status the port reported.
    #[inline]
    pub fn rx_l4_checksum(&self) -> RxChecksum {
        let f = self.raw().ol_flags & sys::RTE_MBUF_F_RX_L4_CKSUM_MASK as u64;
        match f as u32 {
            sys::RTE_MBUF_F_RX_L4_CKSUM_GOOD => RxChecksum::Good,
            sys::RTE_MBUF_F_RX_L4_CKSUM_BAD => RxChecksum::Bad,
            sys::RTE_MBUF_F_RX_L4_CKSUM_NONE => RxChecksum::None,
            _ => RxChecksum::Unknown,
        }
    }

    /// Asks the port to fill checksums on transmit: header lengths plus
    /// `RTE_MBUF_F_TX_*` flags (IPv4/IPv6, IP_CKSUM, UDP_CKSUM).
    #[inline]
    pub fn set_tx_offload(&mut self, l2_len: u8, l3_len: u16, l4_len: u8, flags: u64) {
        let m = self.raw_mut();
        // tx_offload packs l2_len:7, l3_len:9, l4_len:8 from bit 0 up.
        m.__bindgen_anon_3.tx_offload =
            (l2_len as u64 & 0x7f) | ((l3_len as u64 & 0x1ff) << 7) | ((l4_len as u64 & 0xff) << 16);
        m.ol_flags |= flags;
    }

    /// The pool this mbuf comes from.
    pub fn pool_name(&self) -> String {
        crate::mempool::Mempool::name_of(self.raw().pool)
    }
}

impl Drop for Mbuf {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: we own the mbuf (and its chain); freed exactly once here.
        unsafe { sys::spate_pktmbuf_free(self.0.as_ptr()) }
    }
}

/// The data of each segment of a packet.
#[derive(Clone)]
pub struct SegmentIter<'a> {
    next: *mut sys::rte_mbuf,
    /// Segments not yet given, from the head's `nb_segs`.
    left: u16,
    _owner: std::marker::PhantomData<&'a Mbuf>,
}

impl<'a> Iterator for SegmentIter<'a> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // SAFETY: `next` is not null while segments are left (the head is
        // a valid mbuf; a chain shorter than its `nb_segs` ends the walk),
        // and the segments of a chain we borrow stay valid for 'a.
        unsafe {
            let m = &*self.next;
            // The last segment's `next` is not read: it lies in the mbuf's
            // second cache line, which receiving a one-segment datagram
            // and answering it never touch otherwise.
            if self.left > 0 {
                self.next = m.next;
                if self.next.is_null() {
                    self.left = 0;
                }
            }
            Some(std::slice::from_raw_parts((m.buf_addr as *const u8).add(m.data_off as usize), m.data_len as usize))
        }
    }
}

//! UDP GRO for sockets that ask for it (Linux's `UDP_GRO`): datagrams that
//! arrive back to back in one burst from one sender to one socket, all of
//! one size but the last (which may be shorter), become one datagram of up
//! to 64 segments, its mbufs chained, with that size as its `gso_size`.
//! Anything else in between (another flow, a bad checksum, ARP, a frame
//! for another socket) ends the train, as does a short segment; trains do
//! not span bursts.

use std::net::IpAddr;

use spate_dpdk::Mbuf;

use crate::stats::Counter;
use crate::worker::Worker;

/// Segments in one coalesced datagram at most (Linux's `UDP_GRO` limit).
pub const MAX_SEGMENTS: u16 = 64;

/// A flow as GRO tells trains apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flow {
    pub src: IpAddr,
    pub src_port: u16,
    pub dst: IpAddr,
    pub dst_port: u16,
}

/// The datagram a burst may still grow.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Train {
    /// Its place among the burst's staged datagrams.
    pos: usize,
    /// The frame that last grew it.
    frame: u64,
    /// The socket's binding in the snapshot.
    index: u32,
    flow: Flow,
    /// Segment size: the first datagram's payload.
    seg: u16,
    segs: u16,
    /// A short segment came: nothing more may follow.
    closed: bool,
}

impl Worker<'_> {
    /// Adds the payload in `m` (`payload` bytes, headers already cut off)
    /// to the open train when it continues it; gives `m` back otherwise.
    #[inline]
    pub(crate) fn gro_merge(&mut self, index: u32, flow: &Flow, m: Mbuf, payload: usize) -> Result<(), Mbuf> {
        let Some(t) = self.train.as_mut() else { return Err(m) };
        let continues = t.frame + 1 == self.frame_no
            && t.index == index
            && !t.closed
            && t.segs < MAX_SEGMENTS
            && payload > 0
            && payload <= t.seg as usize
            && t.flow == *flow;
        if !continues {
            return Err(m);
        }
        let (pos, seg) = (t.pos, t.seg);
        if !self.staged[pos].3.append_segment(m, seg) {
            self.train = None;
            return Ok(()); // the chain refused it and freed it: not possible below 65,535 segments
        }
        let t = self.train.as_mut().expect("checked above");
        t.segs += 1;
        t.frame = self.frame_no;
        t.closed = payload < seg as usize;
        if t.segs == 2 {
            self.inc(Counter::GroCoalesced);
        }
        Ok(())
    }

    /// Opens a train at the datagram about to be staged, or closes the
    /// open one when this socket does not coalesce.
    #[inline]
    pub(crate) fn gro_open(&mut self, coalesce: bool, index: u32, flow: Flow, payload: usize) {
        self.train = (coalesce && payload > 0 && payload <= u16::MAX as usize).then_some(Train {
            pos: self.staged.len(),
            frame: self.frame_no,
            index,
            flow,
            seg: payload as u16,
            segs: 1,
            closed: false,
        });
    }
}

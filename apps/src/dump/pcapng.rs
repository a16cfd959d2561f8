//! A pcapng writer (the IETF draft `draft-ietf-opsawg-pcapng`), the
//! blocks spate-dump needs: a section header, an interface description
//! per interface (Ethernet, nanosecond timestamps, its name), an enhanced
//! packet block per frame with its direction, and interface statistics at
//! the end (what the capture dropped). DPDK 22.11's `rte_pcapng` knows
//! only ethdev ports; a tunnel's inner interface is an interface here too.

use std::io::{self, Write};

const SHB: u32 = 0x0A0D_0D0A;
const IDB: u32 = 0x0000_0001;
const ISB: u32 = 0x0000_0005;
const EPB: u32 = 0x0000_0006;
const BYTE_ORDER_MAGIC: u32 = 0x1A2B_3C4D;
/// `LINKTYPE_ETHERNET`.
const LINKTYPE_ETHERNET: u16 = 1;

const OPT_END: u16 = 0;
const OPT_COMMENT: u16 = 1;
const SHB_USERAPPL: u16 = 4;
const IF_NAME: u16 = 2;
const IF_DESCRIPTION: u16 = 3;
const IF_TSRESOL: u16 = 9;
const EPB_FLAGS: u16 = 2;
const ISB_STARTTIME: u16 = 2;
const ISB_ENDTIME: u16 = 3;
const ISB_USRDELIV: u16 = 8;
const ISB_OSDROP: u16 = 7;

/// A block's body, built before its length is known.
#[derive(Default)]
struct Block(Vec<u8>);

impl Block {
    fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Bytes padded to 32 bits.
    fn padded(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self.0.resize(self.0.len().next_multiple_of(4), 0);
        self
    }
    fn opt(&mut self, code: u16, value: &[u8]) -> &mut Self {
        self.u16(code).u16(value.len() as u16).padded(value)
    }
    /// A timestamp in nanoseconds as two 32-bit halves.
    fn time(&mut self, ns: u64) -> &mut Self {
        self.u32((ns >> 32) as u32).u32(ns as u32)
    }
    fn write(&mut self, out: &mut impl Write, kind: u32) -> io::Result<()> {
        let len = (self.0.len() + 12) as u32;
        out.write_all(&kind.to_le_bytes())?;
        out.write_all(&len.to_le_bytes())?;
        out.write_all(&self.0)?;
        out.write_all(&len.to_le_bytes())?;
        self.0.clear();
        Ok(())
    }
}

/// An interface of the file.
#[derive(Debug, Clone)]
pub struct Iface {
    /// Its name (`if_name`).
    pub name: String,
    /// What it is (`if_description`).
    pub description: String,
}

/// Writes a pcapng file to `out`.
pub struct Writer<W: Write> {
    out: W,
    block: Block,
}

impl<W: Write> Writer<W> {
    /// Writes the section header and one interface description per
    /// interface (numbered in order from 0), each with nanosecond
    /// timestamps.
    pub fn new(mut out: W, app: &str, ifaces: &[Iface], snaplen: u32) -> io::Result<Writer<W>> {
        let mut b = Block::default();
        b.u32(BYTE_ORDER_MAGIC).u16(1).u16(0).u64(u64::MAX);
        b.opt(SHB_USERAPPL, app.as_bytes()).opt(OPT_END, &[]);
        b.write(&mut out, SHB)?;
        for i in ifaces {
            b.u16(LINKTYPE_ETHERNET).u16(0).u32(snaplen);
            b.opt(IF_NAME, i.name.as_bytes()).opt(IF_DESCRIPTION, i.description.as_bytes());
            // 10^-9 s.
            b.opt(IF_TSRESOL, &[9]).opt(OPT_END, &[]);
            b.write(&mut out, IDB)?;
        }
        Ok(Writer { out, block: b })
    }

    /// One frame of interface `iface`, received or sent (`outbound`).
    pub fn frame(&mut self, iface: u32, time_ns: u64, wire_len: u32, data: &[u8], outbound: bool) -> io::Result<()> {
        let b = &mut self.block;
        b.u32(iface).time(time_ns).u32(data.len() as u32).u32(wire_len).padded(data);
        // Bits 0-1: 01 inbound, 10 outbound.
        let flags: u32 = if outbound { 2 } else { 1 };
        b.opt(EPB_FLAGS, &flags.to_le_bytes()).opt(OPT_END, &[]);
        b.write(&mut self.out, EPB)
    }

    /// Statistics of interface `iface` over the capture: frames written
    /// (`isb_usrdeliv`) and, where given, dropped by the capture
    /// (`isb_osdrop`).
    pub fn stats(
        &mut self,
        iface: u32,
        start_ns: u64,
        end_ns: u64,
        delivered: u64,
        dropped: Option<u64>,
        comment: &str,
    ) -> io::Result<()> {
        let b = &mut self.block;
        b.u32(iface).time(end_ns);
        let mut t = Vec::with_capacity(8);
        t.extend_from_slice(&((start_ns >> 32) as u32).to_le_bytes());
        t.extend_from_slice(&(start_ns as u32).to_le_bytes());
        b.opt(ISB_STARTTIME, &t);
        t.clear();
        t.extend_from_slice(&((end_ns >> 32) as u32).to_le_bytes());
        t.extend_from_slice(&(end_ns as u32).to_le_bytes());
        b.opt(ISB_ENDTIME, &t).opt(ISB_USRDELIV, &delivered.to_le_bytes());
        if let Some(d) = dropped {
            b.opt(ISB_OSDROP, &d.to_le_bytes());
        }
        if !comment.is_empty() {
            b.opt(OPT_COMMENT, comment.as_bytes());
        }
        b.opt(OPT_END, &[]);
        b.write(&mut self.out, ISB)
    }

    /// Flushes and returns the output.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }

    /// Flushes what was written so far.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn blocks_are_framed_and_padded() {
        let ifaces = [Iface { name: "net_tap0".into(), description: "port".into() }];
        let mut w = Writer::new(Vec::new(), "spate-dump", &ifaces, 65535).unwrap();
        w.frame(0, 1_000_000_000_123, 60, &[0xaa; 5], true).unwrap();
        let out = w.finish().unwrap();
        // Walk the blocks: each length repeated at its end, a multiple of 4.
        let mut at = 0;
        let mut kinds = Vec::new();
        while at < out.len() {
            let (kind, len) = (u32_at(&out, at), u32_at(&out, at + 4) as usize);
            assert_eq!(len % 4, 0);
            assert_eq!(u32_at(&out, at + len - 4) as usize, len);
            kinds.push(kind);
            if kind == EPB {
                assert_eq!(u32_at(&out, at + 8), 0);
                assert_eq!((u32_at(&out, at + 12) as u64) << 32 | u32_at(&out, at + 16) as u64, 1_000_000_000_123);
                assert_eq!(u32_at(&out, at + 20), 5);
                assert_eq!(u32_at(&out, at + 24), 60);
                assert_eq!(&out[at + 28..at + 33], &[0xaa; 5]);
                // Padding, then the flags option: outbound.
                assert_eq!(&out[at + 36..at + 40], &[2, 0, 4, 0]);
                assert_eq!(u32_at(&out, at + 40), 2);
            }
            at += len;
        }
        assert_eq!(kinds, [SHB, IDB, EPB]);
    }
}

//! IPv6 headers (RFC 8200) and the walk over extension headers.

use std::net::Ipv6Addr;

use super::{Result, WireError, get_u16, get_u32, ip_proto, set_u16};

mod field {
    pub const VER_TC_FLOW: usize = 0;
    pub const PAYLOAD_LEN: usize = 4;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: usize = 8;
    pub const DST: usize = 24;
}

/// Length of the fixed header.
pub const HEADER_LEN: usize = 40;
/// Length of a fragment extension header.
pub const FRAGMENT_HEADER_LEN: usize = 8;
/// Most extension headers spate walks before giving up on a packet: a
/// bound on the work an attacker can ask for (RFC 8200 expects a handful).
pub const MAX_EXTENSION_HEADERS: usize = 8;

/// A view of an IPv6 packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps without checks.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks that the fixed header and the payload length fit.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN || len < HEADER_LEN + self.payload_len() as usize {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Version (6).
    pub fn version(&self) -> u8 {
        self.b()[field::VER_TC_FLOW] >> 4
    }

    /// Traffic class.
    pub fn traffic_class(&self) -> u8 {
        ((get_u16(self.b(), field::VER_TC_FLOW) >> 4) & 0xff) as u8
    }

    /// Flow label.
    pub fn flow_label(&self) -> u32 {
        get_u32(self.b(), field::VER_TC_FLOW) & 0x000f_ffff
    }

    /// Payload length (extension headers included).
    pub fn payload_len(&self) -> u16 {
        get_u16(self.b(), field::PAYLOAD_LEN)
    }

    /// The first next-header value.
    pub fn next_header(&self) -> u8 {
        self.b()[field::NEXT_HEADER]
    }

    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.b()[field::HOP_LIMIT]
    }

    /// Source.
    pub fn src(&self) -> Ipv6Addr {
        Ipv6Addr::from(<[u8; 16]>::try_from(&self.b()[field::SRC..field::SRC + 16]).expect("16 bytes"))
    }

    /// Destination.
    pub fn dst(&self) -> Ipv6Addr {
        Ipv6Addr::from(<[u8; 16]>::try_from(&self.b()[field::DST..field::DST + 16]).expect("16 bytes"))
    }

    /// The payload (extension headers and upper layer), up to the payload length.
    pub fn payload(&self) -> &[u8] {
        &self.b()[HEADER_LEN..HEADER_LEN + self.payload_len() as usize]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the source.
    pub fn set_src(&mut self, a: &Ipv6Addr) {
        self.buffer.as_mut()[field::SRC..field::SRC + 16].copy_from_slice(&a.octets());
    }

    /// Sets the destination.
    pub fn set_dst(&mut self, a: &Ipv6Addr) {
        self.buffer.as_mut()[field::DST..field::DST + 16].copy_from_slice(&a.octets());
    }

    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, h: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = h;
    }

    /// Sets the payload length.
    pub fn set_payload_len(&mut self, len: u16) {
        set_u16(self.buffer.as_mut(), field::PAYLOAD_LEN, len);
    }
}

/// A parsed fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Source.
    pub src: Ipv6Addr,
    /// Destination.
    pub dst: Ipv6Addr,
    /// First next-header value.
    pub next_header: u8,
    /// Payload length.
    pub payload_len: u16,
    /// Hop limit.
    pub hop_limit: u8,
}

impl Repr {
    /// Parses the fixed header.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr> {
        p.check_len()?;
        if p.version() != 6 {
            return Err(WireError::Malformed);
        }
        Ok(Repr {
            src: p.src(),
            dst: p.dst(),
            next_header: p.next_header(),
            payload_len: p.payload_len(),
            hop_limit: p.hop_limit(),
        })
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the fixed header (traffic class and flow label 0).
    pub fn emit(&self, buf: &mut [u8]) {
        buf[..4].copy_from_slice(&[0x60, 0, 0, 0]);
        set_u16(buf, field::PAYLOAD_LEN, self.payload_len);
        buf[field::NEXT_HEADER] = self.next_header;
        buf[field::HOP_LIMIT] = self.hop_limit;
        buf[field::SRC..field::SRC + 16].copy_from_slice(&self.src.octets());
        buf[field::DST..field::DST + 16].copy_from_slice(&self.dst.octets());
    }
}

/// Writes the traffic class (DSCP and ECN) into a fixed header, beside
/// the version and the flow label's first bits.
#[inline]
pub fn set_traffic_class(buf: &mut [u8], tclass: u8) {
    buf[0] = 0x60 | tclass >> 4;
    buf[1] = (buf[1] & 0x0f) | tclass << 4;
}

/// The traffic class of a fixed header.
#[inline]
pub fn traffic_class(buf: &[u8]) -> u8 {
    buf[0] << 4 | buf[1] >> 4
}

/// A fragment header's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragmentHeader {
    /// Next header of the fragmentable part.
    pub next_header: u8,
    /// Offset in bytes.
    pub offset: u32,
    /// More fragments follow.
    pub more: bool,
    /// Identification.
    pub ident: u32,
}

impl FragmentHeader {
    /// Parses the 8 bytes of a fragment header.
    pub fn parse(b: &[u8]) -> Result<FragmentHeader> {
        if b.len() < FRAGMENT_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let off = get_u16(b, 2);
        Ok(FragmentHeader {
            next_header: b[0],
            offset: (off & 0xfff8) as u32,
            more: off & 1 == 1,
            ident: get_u32(b, 4),
        })
    }

    /// Writes the 8 bytes.
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.next_header;
        b[1] = 0;
        set_u16(b, 2, (self.offset as u16 & 0xfff8) | self.more as u16);
        b[4..8].copy_from_slice(&self.ident.to_be_bytes());
    }
}

/// Where the upper-layer header starts, found by walking the extension
/// headers of a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extensions {
    /// The upper-layer protocol (or the header the walk stopped at).
    pub protocol: u8,
    /// Offset of the upper-layer header within the IPv6 payload.
    pub offset: usize,
    /// The fragment header, when there was one.
    pub fragment: Option<FragmentHeader>,
    /// Offset of the fragment header's successor (the fragmentable part).
    pub fragment_offset: usize,
    /// Extension headers walked.
    pub count: usize,
}

/// Walks hop-by-hop, routing, destination-options and fragment headers,
/// at most [`MAX_EXTENSION_HEADERS`] of them. A routing header with
/// segments left is `Unsupported` (spate is a host, not a router); a
/// hop-by-hop header anywhere but first is `Malformed` (RFC 8200 4.3); a
/// chain longer than the payload is `Truncated`.
pub fn walk_extensions(first: u8, payload: &[u8]) -> Result<Extensions> {
    let mut next = first;
    let mut at = 0usize;
    let mut out = Extensions { protocol: first, offset: 0, fragment: None, fragment_offset: 0, count: 0 };
    loop {
        match next {
            ip_proto::HOP_BY_HOP | ip_proto::ROUTING | ip_proto::DEST_OPTS => {
                if next == ip_proto::HOP_BY_HOP && out.count > 0 {
                    return Err(WireError::Malformed);
                }
                let h = payload.get(at..at + 8).ok_or(WireError::Truncated)?;
                if next == ip_proto::ROUTING && h[3] != 0 {
                    return Err(WireError::Unsupported);
                }
                let len = (h[1] as usize + 1) * 8;
                if payload.len() < at + len {
                    return Err(WireError::Truncated);
                }
                next = h[0];
                at += len;
            }
            ip_proto::FRAGMENT => {
                if out.fragment.is_some() {
                    return Err(WireError::Malformed);
                }
                let f = FragmentHeader::parse(payload.get(at..).ok_or(WireError::Truncated)?)?;
                next = f.next_header;
                at += FRAGMENT_HEADER_LEN;
                out.fragment = Some(f);
                out.fragment_offset = at;
                // Only the first fragment carries the rest of the chain.
                if f.offset != 0 {
                    out.count += 1;
                    out.protocol = next;
                    out.offset = at;
                    return Ok(out);
                }
            }
            _ => {
                out.protocol = next;
                out.offset = at;
                return Ok(out);
            }
        }
        out.count += 1;
        if out.count > MAX_EXTENSION_HEADERS {
            return Err(WireError::Unsupported);
        }
    }
}

/// Whether an address is the solicited-node multicast group of `addr`.
pub fn is_solicited_node_of(group: &Ipv6Addr, addr: &Ipv6Addr) -> bool {
    let g = group.octets();
    let a = addr.octets();
    g[..13] == [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff] && g[13..] == a[13..]
}

/// The solicited-node multicast group of `addr` (ff02::1:ffXX:XXXX).
pub fn solicited_node(addr: &Ipv6Addr) -> Ipv6Addr {
    let a = addr.octets();
    let mut g = [0u8; 16];
    g[..13].copy_from_slice(&[0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff]);
    g[13..].copy_from_slice(&a[13..]);
    Ipv6Addr::from(g)
}

/// The all-nodes group ff02::1.
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// The modified EUI-64 link-local address for a MAC (RFC 4291 appendix A).
pub fn link_local_from_mac(mac: &super::MacAddr) -> Ipv6Addr {
    let m = mac.0;
    Ipv6Addr::from([0xfe, 0x80, 0, 0, 0, 0, 0, 0, m[0] ^ 0x02, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fixtures::{NS, UDP6, hex};

    #[test]
    fn parses_a_captured_packet() {
        let f = hex(UDP6);
        let p = Packet::new_checked(&f[14..]).unwrap();
        let r = Repr::parse(&p).unwrap();
        assert_eq!(r.src, "fd00::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(r.next_header, ip_proto::UDP);
        assert_eq!(r.payload_len, 12);
        assert_eq!(r.hop_limit, 64);
        let e = walk_extensions(r.next_header, p.payload()).unwrap();
        assert_eq!((e.protocol, e.offset, e.fragment), (ip_proto::UDP, 0, None));
        let mut out = [0u8; 40];
        r.emit(&mut out);
        assert_eq!(out[4..], f[14 + 4..14 + 40], "all but the flow label round-trip");
    }

    #[test]
    fn solicited_node_and_link_local() {
        let f = hex(NS);
        let p = Packet::new_checked(&f[14..]).unwrap();
        let me: Ipv6Addr = "fd00::2".parse().unwrap();
        assert!(is_solicited_node_of(&p.dst(), &me));
        assert_eq!(solicited_node(&me), p.dst());
        let mac = crate::wire::MacAddr([0x6a, 0x1f, 0x3c, 0x55, 0x10, 0x9e]);
        assert_eq!(link_local_from_mac(&mac), "fe80::681f:3cff:fe55:109e".parse::<Ipv6Addr>().unwrap());
    }

    fn ext(next: u8, len8: u8) -> Vec<u8> {
        let mut h = vec![next, len8];
        h.resize((len8 as usize + 1) * 8, 0);
        h
    }

    #[test]
    fn walks_extension_chains() {
        let mut p = ext(ip_proto::DEST_OPTS, 0);
        p.extend(ext(ip_proto::FRAGMENT, 1));
        let frag = FragmentHeader { next_header: ip_proto::UDP, offset: 0, more: true, ident: 0xdeadbeef };
        let mut fb = [0u8; 8];
        frag.emit(&mut fb);
        p.extend_from_slice(&fb);
        p.extend_from_slice(&[0u8; 8]);
        let e = walk_extensions(ip_proto::HOP_BY_HOP, &p).unwrap();
        assert_eq!(e.protocol, ip_proto::UDP);
        assert_eq!(e.offset, 8 + 16 + 8);
        assert_eq!(e.fragment, Some(frag));
        assert_eq!(e.count, 3);
    }

    #[test]
    fn bad_chains_are_refused() {
        // Longer than the payload.
        let short = ext(ip_proto::UDP, 3);
        assert_eq!(walk_extensions(ip_proto::DEST_OPTS, &short[..20]).unwrap_err(), WireError::Truncated);
        // Hop-by-hop not first.
        let mut p = ext(ip_proto::HOP_BY_HOP, 0);
        p.extend(ext(ip_proto::UDP, 0));
        assert_eq!(walk_extensions(ip_proto::DEST_OPTS, &p).unwrap_err(), WireError::Malformed);
        // An endless chain of destination options.
        let mut long = Vec::new();
        for _ in 0..20 {
            long.extend(ext(ip_proto::DEST_OPTS, 0));
        }
        assert_eq!(walk_extensions(ip_proto::DEST_OPTS, &long).unwrap_err(), WireError::Unsupported);
        // A routing header that wants us to forward.
        let mut rh = ext(ip_proto::UDP, 0);
        rh[3] = 1;
        assert_eq!(walk_extensions(ip_proto::ROUTING, &rh).unwrap_err(), WireError::Unsupported);
        assert_eq!(walk_extensions(ip_proto::FRAGMENT, &[0u8; 4]).unwrap_err(), WireError::Truncated);
    }
}

//! Sending a UDP datagram larger than the path MTU as IP fragments: IPv4
//! fragments (DF clear, one identification from the ID generator) or IPv6
//! fragment headers (a random 32-bit identification). The UDP checksum is
//! computed over the whole datagram first; every fragment is copied into
//! an mbuf of its own, all taken before any is written, so a datagram goes
//! out whole or not at all.

use std::net::{IpAddr, SocketAddr};

use spate_dpdk::mbuf::tx_flags;
use spate_dpdk::{Burst, Mempool};

use crate::wire::{checksum, ip_proto, ipv4, ipv6, udp};

/// Fragments one datagram may be cut into at most (a 65,507-byte datagram
/// over a 576-byte MTU needs 119).
pub const MAX_FRAGMENTS: usize = 128;

/// Why a datagram could not be fragmented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FragError {
    /// The MTU leaves no room for data, or too many fragments would be needed.
    TooLong,
    /// The pool had too few mbufs.
    NoMbufs,
}

/// How to fragment.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Source and destination.
    pub src: SocketAddr,
    /// Destination.
    pub dst: SocketAddr,
    /// The path MTU.
    pub mtu: usize,
    /// Identification (16 bits used over IPv4).
    pub ident: u32,
    /// TTL or hop limit.
    pub ttl: u8,
    /// TOS or traffic class.
    pub tos: u8,
    /// The port computes IPv4 header checksums.
    pub offload_ip_checksum: bool,
}

/// Bytes of fragmentable data per fragment: what the MTU leaves after the
/// headers, a multiple of 8, and no more than an mbuf holds.
fn chunk(plan: &Plan, data_room: usize) -> usize {
    let headers = if plan.dst.is_ipv4() { ipv4::HEADER_LEN } else { ipv6::HEADER_LEN + ipv6::FRAGMENT_HEADER_LEN };
    let room = data_room.saturating_sub(crate::hdr::MAX_HEADERS);
    (plan.mtu.saturating_sub(headers).min(room)) & !7
}

/// Cuts the UDP datagram carrying `parts` (concatenated, `len` bytes in
/// all) into IP fragments, each an mbuf of `out` starting at its IP header.
/// Returns how many.
pub fn fragment_udp<'a, I>(
    pool: &Mempool,
    plan: &Plan,
    parts: I,
    len: usize,
    out: &mut Burst<MAX_FRAGMENTS>,
) -> Result<usize, FragError>
where
    I: Iterator<Item = &'a [u8]> + Clone,
{
    let (src, dst) = (plan.src.ip(), plan.dst.ip());
    let udp_len = len + udp::HEADER_LEN;
    let step = chunk(plan, pool.data_room() as usize);
    if step == 0 {
        return Err(FragError::TooLong);
    }
    let count = udp_len.div_ceil(step);
    if count > MAX_FRAGMENTS {
        return Err(FragError::TooLong);
    }
    // The UDP header, its checksum over the whole datagram.
    let mut header = [0u8; udp::HEADER_LEN];
    let repr = udp::Repr { src_port: plan.src.port(), dst_port: plan.dst.port(), payload_len: len as u16 };
    repr.emit(&mut header, 0);
    let pseudo = udp::pseudo_header(&src, &dst, udp_len as u16);
    let c = udp::finish_checksum(pseudo, stream_sum(&header, parts.clone()));
    header[6..8].copy_from_slice(&c.to_be_bytes());

    pool.alloc_bulk(out, count).map_err(|_| FragError::NoMbufs)?;
    let mut stream = Stream { header: &header, at_header: 0, parts, current: &[] };
    let mut offset = 0usize;
    for (i, m) in out.as_mut_slice().iter_mut().enumerate() {
        let take = step.min(udp_len - offset);
        let room = m.append(take).map_err(|_| FragError::TooLong)?;
        stream.fill(room);
        let more = i + 1 < count;
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let ip = ipv4::Repr {
                    src: s,
                    dst: d,
                    protocol: ip_proto::UDP,
                    payload_len: take as u16,
                    ttl: plan.ttl,
                    tos: plan.tos,
                    ident: plan.ident as u16,
                    dont_frag: false,
                    more_frags: more,
                    frag_offset: offset as u32,
                };
                ip.emit(m.prepend(ipv4::HEADER_LEN).map_err(|_| FragError::TooLong)?, plan.offload_ip_checksum);
                m.set_ol_flags(if plan.offload_ip_checksum { tx_flags::IPV4 | tx_flags::IP_CKSUM } else { 0 });
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let f =
                    ipv6::FragmentHeader { next_header: ip_proto::UDP, offset: offset as u32, more, ident: plan.ident };
                f.emit(m.prepend(ipv6::FRAGMENT_HEADER_LEN).map_err(|_| FragError::TooLong)?);
                let ip = ipv6::Repr {
                    src: s,
                    dst: d,
                    next_header: ip_proto::FRAGMENT,
                    payload_len: (take + ipv6::FRAGMENT_HEADER_LEN) as u16,
                    hop_limit: plan.ttl,
                };
                let hdr = m.prepend(ipv6::HEADER_LEN).map_err(|_| FragError::TooLong)?;
                ip.emit(hdr);
                ipv6::set_traffic_class(hdr, plan.tos);
                m.set_ol_flags(0);
            }
            _ => return Err(FragError::TooLong),
        }
        offset += take;
    }
    Ok(count)
}

/// The one's-complement sum of `header` followed by `parts`, as one byte
/// stream: a part that starts at an odd position has its sum's bytes
/// swapped (one's-complement sums commute with byte swapping).
fn stream_sum<'a>(header: &[u8], parts: impl Iterator<Item = &'a [u8]>) -> u64 {
    let mut acc = checksum::sum(header);
    let mut odd = header.len() % 2 == 1;
    for b in parts {
        let s = checksum::sum(b);
        acc += if odd { checksum::fold(s).swap_bytes() as u64 } else { s };
        odd ^= b.len() % 2 == 1;
    }
    acc
}

/// The UDP header followed by the payload parts, read in order.
struct Stream<'h, 'a, I> {
    header: &'h [u8],
    at_header: usize,
    parts: I,
    current: &'a [u8],
}

impl<'a, I: Iterator<Item = &'a [u8]>> Stream<'_, 'a, I> {
    fn fill(&mut self, mut out: &mut [u8]) {
        while !out.is_empty() {
            if self.at_header < self.header.len() {
                let n = (self.header.len() - self.at_header).min(out.len());
                out[..n].copy_from_slice(&self.header[self.at_header..self.at_header + n]);
                self.at_header += n;
                out = &mut out[n..];
                continue;
            }
            if self.current.is_empty() {
                match self.parts.next() {
                    Some(p) => self.current = p,
                    None => return,
                }
                continue;
            }
            let n = self.current.len().min(out.len());
            out[..n].copy_from_slice(&self.current[..n]);
            self.current = &self.current[n..];
            out = &mut out[n..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_sum_matches_a_contiguous_sum() {
        let header = [1u8, 2, 3, 4, 5, 6, 0, 0];
        let a = [7u8, 8, 9];
        let b = [10u8, 11, 12, 13];
        let c = [14u8];
        let whole: Vec<u8> = header.iter().chain(&a).chain(&b).chain(&c).copied().collect();
        assert_eq!(
            checksum::fold(stream_sum(&header, [&a[..], &b[..], &c[..]].into_iter())),
            checksum::fold(checksum::sum(&whole))
        );
    }

    #[test]
    fn streams_the_header_then_the_parts() {
        let header = [0xaau8; 8];
        let parts = [&[1u8, 2, 3][..], &[4u8, 5][..]];
        let mut s = Stream { header: &header, at_header: 0, parts: parts.into_iter(), current: &[] };
        let mut a = [0u8; 6];
        s.fill(&mut a);
        assert_eq!(a, [0xaa; 6]);
        let mut b = [0u8; 7];
        s.fill(&mut b);
        assert_eq!(b, [0xaa, 0xaa, 1, 2, 3, 4, 5]);
    }
}

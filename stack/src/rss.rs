//! Receive-side scaling in software: the hash that keeps a flow on one
//! lcore, and the redirection table that maps a hash to a polling lcore.
//!
//! Software RSS needs a flow to stay on one lcore, not to agree with any
//! device, so spate hashes with its own keyed hash ([`FlowHash`]: a
//! multiply per eight bytes of input). The Toeplitz hash a NIC computes
//! (Microsoft's RSS specification; DPDK's `rte_softrss`: a table load per
//! input byte, 12 for an IPv4 4-tuple and 36 for IPv6) is kept with its
//! verification vectors, in the tests only, for the case where spate must
//! agree with a port's own queue choice (handing a datagram reassembled
//! under hardware RSS to its flow's queue, which needs the port's key:
//! many NICs keep a private one).

#[cfg(test)]
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::wire::ethernet::{self, ethertype};
use crate::wire::{ip_proto, ipv4, ipv6};

#[cfg(test)]
/// The key of Microsoft's RSS verification suite, which many NICs and
/// DPDK drivers use as their default.
pub const DEFAULT_KEY: [u8; 40] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0, 0xd0, 0xca, 0x2b,
    0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac,
    0x01, 0xfa,
];

/// The longest input: an IPv6 4-tuple.
pub const MAX_INPUT: usize = 36;

/// Entries of the redirection table (as most NICs: 128).
pub const RETA_SIZE: usize = 128;

/// A Toeplitz hasher for one key.
#[cfg(test)]
#[derive(Clone)]
pub struct Toeplitz {
    table: Box<[[u32; 256]; MAX_INPUT]>,
}

#[cfg(test)]
impl std::fmt::Debug for Toeplitz {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Toeplitz")
    }
}

#[cfg(test)]
impl Toeplitz {
    /// The tables for `key` (40 bytes: enough for 36 input bytes).
    pub fn new(key: &[u8; 40]) -> Toeplitz {
        // The 32 key bits starting at bit `k` (bit 0 is the key's first
        // byte's most significant bit).
        let window = |k: usize| -> u32 {
            let bytes = [key[k / 8], key[k / 8 + 1], key[k / 8 + 2], key[k / 8 + 3], key[k / 8 + 4]];
            let wide = u64::from_be_bytes([0, 0, 0, bytes[0], bytes[1], bytes[2], bytes[3], bytes[4]]);
            (wide >> (8 - k % 8)) as u32
        };
        let mut table = Box::new([[0u32; 256]; MAX_INPUT]);
        for (i, row) in table.iter_mut().enumerate() {
            for (v, slot) in row.iter_mut().enumerate() {
                *slot = (0..8).filter(|b| v & (0x80 >> b) != 0).fold(0, |acc, b| acc ^ window(i * 8 + b));
            }
        }
        Toeplitz { table }
    }

    /// The hash of `input` (at most [`MAX_INPUT`] bytes).
    #[inline]
    pub fn hash(&self, input: &[u8]) -> u32 {
        input.iter().zip(self.table.iter()).fold(0, |acc, (&b, row)| acc ^ row[b as usize])
    }

    /// The hash of an IPv4 flow: source, destination, and with `ports`
    /// the source and destination ports (RSS's "IPv4 with TCP/UDP").
    #[inline]
    #[cfg(test)]
    pub fn v4(&self, src: Ipv4Addr, dst: Ipv4Addr, ports: Option<(u16, u16)>) -> u32 {
        let mut input = [0u8; 12];
        input[..4].copy_from_slice(&src.octets());
        input[4..8].copy_from_slice(&dst.octets());
        match ports {
            Some((s, d)) => {
                input[8..10].copy_from_slice(&s.to_be_bytes());
                input[10..12].copy_from_slice(&d.to_be_bytes());
                self.hash(&input)
            }
            None => self.hash(&input[..8]),
        }
    }

    /// The hash of an IPv6 flow, as [`Toeplitz::v4`].
    #[inline]
    #[cfg(test)]
    pub fn v6(&self, src: &Ipv6Addr, dst: &Ipv6Addr, ports: Option<(u16, u16)>) -> u32 {
        let mut input = [0u8; MAX_INPUT];
        input[..16].copy_from_slice(&src.octets());
        input[16..32].copy_from_slice(&dst.octets());
        match ports {
            Some((s, d)) => {
                input[32..34].copy_from_slice(&s.to_be_bytes());
                input[34..36].copy_from_slice(&d.to_be_bytes());
                self.hash(&input)
            }
            None => self.hash(&input[..32]),
        }
    }
}

/// The redirection table: hash -> lcore index, filled round-robin as
/// DPDK fills a NIC's by default.
#[derive(Debug, Clone)]
pub struct Reta {
    entries: [u8; RETA_SIZE],
}

impl Reta {
    /// `lcores` (1 to 128) lcores in turn.
    pub fn round_robin(lcores: usize) -> Reta {
        assert!((1..=RETA_SIZE).contains(&lcores), "1 to {RETA_SIZE} lcores");
        let mut entries = [0u8; RETA_SIZE];
        for (i, e) in entries.iter_mut().enumerate() {
            *e = (i % lcores) as u8;
        }
        Reta { entries }
    }

    /// The lcore index for `hash` (its low 7 bits, as a NIC's table).
    #[inline]
    pub fn lcore(&self, hash: u32) -> usize {
        self.entries[hash as usize % RETA_SIZE] as usize
    }
}

/// A keyed hash of a flow's addresses and ports for spate's own tables
/// (not a NIC's: nothing outside has to agree with it), a multiply per
/// eight bytes of input rather than Toeplitz's load per byte.
#[derive(Debug, Clone)]
pub struct FlowHash {
    keys: [u64; 5],
}

/// Pairs multiplied as in NH (UMAC): each product mixes 128 bits.
#[inline]
fn nh(a: u64, b: u64) -> u64 {
    let p = (a as u128) * (b as u128);
    (p >> 64) as u64 ^ p as u64
}

/// Where the common frame's fields lie: an untagged Ethernet header, then
/// IPv4 without options, then UDP.
mod common {
    use crate::wire::{ethernet, ipv4};
    const L3: usize = ethernet::HEADER_LEN;
    pub const ETHERTYPE: usize = L3 - 2;
    pub const VERSION_IHL: usize = L3;
    pub const FLAGS_OFFSET: usize = L3 + 6;
    pub const PROTOCOL: usize = L3 + 9;
    /// Source and destination address.
    pub const ADDRS: usize = L3 + 12;
    /// Source and destination port.
    pub const PORTS: usize = L3 + ipv4::HEADER_LEN;
    pub const LEN: usize = PORTS + 4;
}

impl FlowHash {
    /// A hash under secret `keys`.
    pub fn new(keys: [u64; 5]) -> FlowHash {
        FlowHash { keys }
    }

    /// The hash of the first `n` bytes of `input` (the rest zero, as
    /// [`flow_input`] leaves it).
    #[inline]
    pub fn hash(&self, input: &[u8; MAX_INPUT], n: usize) -> u64 {
        let w = |i: usize| u64::from_le_bytes(input[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let tail = |at: usize| u32::from_le_bytes(input[at..at + 4].try_into().expect("4 bytes")) as u64;
        let k = &self.keys;
        if n <= 12 {
            nh(w(0) ^ k[0], tail(8) ^ k[1])
        } else {
            nh(w(0) ^ k[0], w(1) ^ k[1]) ^ nh(w(2) ^ k[2], w(3) ^ k[3]) ^ nh(tail(32) ^ k[4], k[0] | 1)
        }
    }

    /// The hash of the common frame without building its input: an
    /// untagged IPv4 UDP datagram, no options, not a fragment. The same
    /// value as [`FlowHash::hash`] over what [`flow_input`] writes for it
    /// (its addresses and ports, 12 bytes); `None` for any other frame.
    #[inline]
    pub fn ipv4_udp(&self, frame: &[u8]) -> Option<u64> {
        use crate::wire::{ethernet::ethertype, ip_proto};
        use common::*;
        let h: &[u8; LEN] = frame.get(..LEN)?.try_into().ok()?;
        // Not a fragment: MF and the offset (the mask 0x3fff) clear.
        let fragment = h[FLAGS_OFFSET] & 0x3f != 0 || h[FLAGS_OFFSET + 1] != 0;
        let ethertype = u16::from_be_bytes([h[ETHERTYPE], h[ETHERTYPE + 1]]);
        if ethertype != ethertype::IPV4 || h[VERSION_IHL] != 0x45 || h[PROTOCOL] != ip_proto::UDP || fragment {
            return None;
        }
        let addrs = u64::from_le_bytes(h[ADDRS..ADDRS + 8].try_into().expect("8 bytes"));
        let ports = u32::from_le_bytes(h[PORTS..PORTS + 4].try_into().expect("4 bytes")) as u64;
        Some(nh(addrs ^ self.keys[0], ports ^ self.keys[1]))
    }
}

/// Writes the bytes that decide a frame's lcore into `key` and returns
/// how many, and whether the frame is a fragment: a UDP datagram's
/// addresses and ports (the input of a NIC's 4-tuple hash), a fragment's
/// addresses and ID (IPv4 also the protocol). `None` for frames that are
/// no flow's (ARP, ICMP, other protocols, IPv6 with extension headers
/// before UDP): they stay where they arrive.
pub fn flow_input(frame: &[u8], key: &mut [u8; 36]) -> Option<(usize, bool)> {
    let frame = ethernet::Frame::new_checked(frame).ok()?;
    let ip = frame.payload();
    match frame.ethertype() {
        ethertype::IPV4 if ip.len() >= ipv4::HEADER_LEN => {
            let p = ipv4::Packet::new_unchecked(ip);
            if p.is_fragment() {
                put_addresses_v4(&p, key);
                key[8..10].copy_from_slice(&p.ident().to_be_bytes());
                key[10] = p.protocol();
                return Some((11, true));
            }
            let ihl = p.header_len();
            if p.protocol() != ip_proto::UDP || ihl < ipv4::HEADER_LEN {
                return None;
            }
            datagram_input_v4(ip, ip.get(ihl..)?, key).map(|n| (n, false))
        }
        ethertype::IPV6 if ip.len() >= ipv6::HEADER_LEN + 8 => {
            let p = ipv6::Packet::new_unchecked(ip);
            match p.next_header() {
                ip_proto::UDP => datagram_input_v6(ip, &ip[ipv6::HEADER_LEN..], key).map(|n| (n, false)),
                ip_proto::FRAGMENT => {
                    put_addresses_v6(&p, key);
                    // The fragment header's identification, after its
                    // next header, reserved byte and offset.
                    key[32..36].copy_from_slice(&ip[ipv6::HEADER_LEN + 4..ipv6::HEADER_LEN + 8]);
                    Some((36, true))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// Writes a whole UDP datagram's flow input into `key`: the addresses of
/// its IP header `ip` (the family from its version field: the hand-off of
/// reassembled datagrams, whose headers were checked) and the ports that
/// start its UDP header `udp`. Returns how many bytes (12 for IPv4, 36 for
/// IPv6); `None` when a header is short or `ip` is neither version.
#[inline]
pub fn datagram_input(ip: &[u8], udp: &[u8], key: &mut [u8; 36]) -> Option<usize> {
    match ip.first()? >> 4 {
        4 => datagram_input_v4(ip, udp, key),
        6 => datagram_input_v6(ip, udp, key),
        _ => None,
    }
}

/// [`datagram_input`] for an IPv4 header (the family known already: a
/// frame's EtherType said it).
#[inline]
fn datagram_input_v4(ip: &[u8], udp: &[u8], key: &mut [u8; 36]) -> Option<usize> {
    // The source and destination ports, the UDP header's first four bytes.
    let ports = udp.get(..4)?;
    put_addresses_v4(&ipv4::Packet::new_unchecked(ip.get(..ipv4::HEADER_LEN)?), key);
    key[8..12].copy_from_slice(ports);
    Some(12)
}

/// [`datagram_input`] for an IPv6 header.
#[inline]
fn datagram_input_v6(ip: &[u8], udp: &[u8], key: &mut [u8; 36]) -> Option<usize> {
    let ports = udp.get(..4)?;
    put_addresses_v6(&ipv6::Packet::new_unchecked(ip.get(..ipv6::HEADER_LEN)?), key);
    key[32..36].copy_from_slice(ports);
    Some(36)
}

/// An IPv4 header's source and destination: a key's first 8 bytes.
#[inline]
fn put_addresses_v4(p: &ipv4::Packet<&[u8]>, key: &mut [u8; 36]) {
    key[..4].copy_from_slice(&p.src().octets());
    key[4..8].copy_from_slice(&p.dst().octets());
}

/// An IPv6 header's source and destination: a key's first 32 bytes.
#[inline]
fn put_addresses_v6(p: &ipv6::Packet<&[u8]>, key: &mut [u8; 36]) {
    key[..16].copy_from_slice(&p.src().octets());
    key[16..32].copy_from_slice(&p.dst().octets());
}

#[cfg(test)]
mod tests {
    use super::*;

    // Microsoft's "Verifying the RSS Hash Calculation": (source, source
    // port, destination, destination port, addresses only, with ports).
    const V4: [(&str, u16, &str, u16, u32, u32); 5] = [
        ("66.9.149.187", 2794, "161.142.100.80", 1766, 0x323e8fc2, 0x51ccc178),
        ("199.92.111.2", 14230, "65.69.140.83", 4739, 0xd718262a, 0xc626b0ea),
        ("24.19.198.95", 12898, "12.22.207.184", 38024, 0xd2d0a5de, 0x5c2b394a),
        ("38.27.205.30", 48228, "209.142.163.6", 2217, 0x82989176, 0xafc7327f),
        ("153.39.163.191", 44251, "202.188.127.2", 1303, 0x5d1809c5, 0x10e828a2),
    ];
    const V6: [(&str, u16, &str, u16, u32, u32); 3] = [
        ("3ffe:2501:200:1fff::7", 2794, "3ffe:2501:200:3::1", 1766, 0x2cc18cd5, 0x40207d3d),
        ("3ffe:501:8::260:97ff:fe40:efab", 14230, "ff02::1", 4739, 0x0f0c461c, 0xdde51bbf),
        ("3ffe:1900:4545:3:200:f8ff:fe21:67cf", 44251, "fe80::200:f8ff:fe21:67cf", 38024, 0x4b61e985, 0x02d1feef),
    ];

    #[test]
    fn matches_the_rss_verification_suite() {
        let t = Toeplitz::new(&DEFAULT_KEY);
        for (s, sp, d, dp, addrs, full) in V4 {
            let (s, d) = (s.parse().unwrap(), d.parse().unwrap());
            assert_eq!(t.v4(s, d, None), addrs, "{s} -> {d}");
            assert_eq!(t.v4(s, d, Some((sp, dp))), full, "{s}:{sp} -> {d}:{dp}");
        }
        for (s, sp, d, dp, addrs, full) in V6 {
            let (s, d) = (s.parse().unwrap(), d.parse().unwrap());
            assert_eq!(t.v6(&s, &d, None), addrs, "{s} -> {d}");
            assert_eq!(t.v6(&s, &d, Some((sp, dp))), full, "[{s}]:{sp} -> [{d}]:{dp}");
        }
    }

    #[test]
    fn tables_match_the_bitwise_definition() {
        // The definition, one bit at a time, against the tables.
        let key: [u8; 40] = std::array::from_fn(|i| (i as u8).wrapping_mul(73).wrapping_add(11));
        let t = Toeplitz::new(&key);
        let input: [u8; MAX_INPUT] = std::array::from_fn(|i| (i as u8).wrapping_mul(151) ^ 0x5c);
        let mut k = u32::from_be_bytes([key[0], key[1], key[2], key[3]]);
        let mut want = 0u32;
        for (i, &b) in input.iter().enumerate() {
            for bit in 0..8 {
                if b & (0x80 >> bit) != 0 {
                    want ^= k;
                }
                k = (k << 1) | ((key[4 + i] >> (7 - bit)) & 1) as u32;
            }
        }
        assert_eq!(t.hash(&input), want);
    }

    #[test]
    fn a_datagrams_input_is_its_frames() {
        use crate::wire::fixtures::{UDP4, UDP6, hex};
        // The kernel's frames: what flow_input reads from a whole frame,
        // datagram_input reads from its IP and UDP headers (the hand-off of
        // reassembled datagrams), byte for byte.
        for (frame, l4, n) in [(hex(UDP4), 34, 12), (hex(UDP6), 54, 36)] {
            let (mut a, mut b) = ([0u8; MAX_INPUT], [0u8; MAX_INPUT]);
            assert_eq!(flow_input(&frame, &mut a), Some((n, false)));
            assert_eq!(datagram_input(&frame[14..l4], &frame[l4..], &mut b), Some(n));
            assert_eq!(a, b);
            // The ports 40000 and 7 end it.
            assert_eq!(a[n - 4..n], [0x9c, 0x40, 0x00, 0x07]);
        }
        assert_eq!(datagram_input(&[0x45; 20], &[0; 3], &mut [0u8; MAX_INPUT]), None, "short UDP header");
        assert_eq!(datagram_input(&[0x55; 20], &[0; 8], &mut [0u8; MAX_INPUT]), None, "no IP version");
    }

    #[test]
    fn flow_input_tells_fragments_from_datagrams() {
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[14 + 9] = 17;
        f[14 + 20..14 + 24].copy_from_slice(&[0x13, 0x88, 0x00, 0x07]);
        let mut key = [0u8; MAX_INPUT];
        assert_eq!(flow_input(&f, &mut key), Some((12, false)));
        assert_eq!(key[8..12], [0x13, 0x88, 0x00, 0x07]);
        f[14 + 6] = 0x20; // more fragments
        assert_eq!(flow_input(&f, &mut [0u8; MAX_INPUT]), Some((11, true)));
    }

    #[test]
    fn flow_hash_spreads_flows_and_depends_on_every_input_byte() {
        let h = FlowHash::new([0x243f6a88_85a308d3, 0x13198a2e_03707344, 0xa4093822_299f31d0, 0x082efa98_ec4e6c89, 7]);
        for n in [11, 12, 36] {
            let base = [0u8; MAX_INPUT];
            for i in 0..n {
                let mut k = base;
                k[i] = 1;
                assert_ne!(h.hash(&k, n), h.hash(&base, n), "byte {i} of {n}");
            }
        }
        // 10,000 flows (one source, consecutive ports), IPv4 and IPv6, and
        // 10,000 consecutive fragment IDs over 2 and 16 lcores: each lcore
        // within 10% of its share of the redirection table's pick.
        type Fill = fn(&mut [u8; MAX_INPUT], u16) -> usize;
        // fd00::1 to fd00::2.
        fn v6_pair(k: &mut [u8; MAX_INPUT]) {
            (k[0], k[15], k[16], k[31]) = (0xfd, 1, 0xfd, 2);
        }
        let cases: [(&str, Fill); 3] = [
            ("IPv4 ports", |k, i| {
                k[..8].copy_from_slice(&[198, 18, 0, 1, 198, 18, 0, 2]);
                k[8..10].copy_from_slice(&(20_000 + i).to_be_bytes());
                k[10..12].copy_from_slice(&7u16.to_be_bytes());
                12
            }),
            ("IPv6 ports", |k, i| {
                v6_pair(k);
                k[32..34].copy_from_slice(&(20_000 + i).to_be_bytes());
                k[34..36].copy_from_slice(&7u16.to_be_bytes());
                36
            }),
            ("IPv6 fragment IDs", |k, i| {
                v6_pair(k);
                k[32..36].copy_from_slice(&(i as u32).to_be_bytes());
                36
            }),
        ];
        for (what, fill) in cases {
            for lcores in [2usize, 16] {
                let r = Reta::round_robin(lcores);
                let mut count = vec![0usize; lcores];
                for i in 0..10_000u16 {
                    let mut k = [0u8; MAX_INPUT];
                    let n = fill(&mut k, i);
                    count[r.lcore(h.hash(&k, n) as u32)] += 1;
                }
                let share = 10_000 / lcores;
                assert!(count.iter().all(|&c| c.abs_diff(share) * 10 <= share), "{what}, {lcores} lcores: {count:?}");
            }
        }
    }

    #[test]
    fn the_common_frames_hash_is_the_general_one() {
        let h = FlowHash::new([0x243f6a88_85a308d3, 0x13198a2e_03707344, 0xa4093822_299f31d0, 0x082efa98_ec4e6c89, 7]);
        let mut f = vec![0u8; 14 + 20 + 8 + 4];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[14 + 9] = 17;
        f[14 + 12..14 + 20].copy_from_slice(&[198, 18, 0, 1, 198, 18, 0, 2]);
        for port in [1u16, 7, 4789, 20_000, 65_535] {
            f[14 + 20..14 + 22].copy_from_slice(&port.to_be_bytes());
            f[14 + 22..14 + 24].copy_from_slice(&(port ^ 0x5a5a).to_be_bytes());
            let mut key = [0u8; MAX_INPUT];
            let (n, _) = flow_input(&f, &mut key).unwrap();
            assert_eq!(h.ipv4_udp(&f), Some(h.hash(&key, n)), "port {port}");
        }
        // Whatever is not the common case takes the general path.
        let not = |i: usize, v: u8| {
            let mut g = f.clone();
            g[i] = v;
            h.ipv4_udp(&g)
        };
        assert_eq!(not(14, 0x46), None, "options");
        assert_eq!(not(14 + 6, 0x20), None, "more fragments");
        assert_eq!(not(14 + 7, 1), None, "fragment offset");
        assert_eq!(not(14 + 9, 6), None, "TCP");
        assert_eq!(not(12, 0x81), None, "VLAN tag");
        assert_eq!(h.ipv4_udp(&f[..37]), None, "short");
        // Don't-fragment set is still the common case.
        assert!(not(14 + 6, 0x40).is_some());
        // Random frames, biased towards the common case: whenever the fast
        // path takes one, the general path sees the same UDP flow.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut taken = 0;
        for _ in 0..100_000 {
            let mut g = f.clone();
            g.truncate(30 + (next() % 20) as usize);
            for b in g.iter_mut().skip(26) {
                *b = next() as u8;
            }
            for (i, v) in [(12, 0x08), (13, 0x00), (14, 0x45), (20, 0x00), (21, 0x00), (23, 17)] {
                if i < g.len() && next() % 8 != 0 {
                    g[i] = v;
                } else if i < g.len() {
                    g[i] = next() as u8;
                }
            }
            if let Some(fast) = h.ipv4_udp(&g) {
                taken += 1;
                let mut key = [0u8; MAX_INPUT];
                assert_eq!(flow_input(&g, &mut key), Some((12, false)), "{g:02x?}");
                assert_eq!(fast, h.hash(&key, 12), "{g:02x?}");
            }
        }
        assert!(taken > 10_000, "the common case was drawn {taken} times");
    }

    #[test]
    fn the_table_spreads_evenly() {
        let r = Reta::round_robin(3);
        let mut n = [0usize; 3];
        (0..RETA_SIZE as u32).for_each(|h| n[r.lcore(h)] += 1);
        assert_eq!(n, [43, 43, 42]);
    }
}

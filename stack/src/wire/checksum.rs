//! The Internet checksum (RFC 1071), pseudo-headers, and incremental
//! updates (RFC 1624).

use std::net::{Ipv4Addr, Ipv6Addr};

/// The one's-complement sum of `data` as 16-bit big-endian words (folded
/// or not: callers fold); an odd last byte is padded with zero.
///
/// The words are summed in the machine's byte order and the folded sum
/// swapped once at the end (RFC 1071, 2(B): the sum is independent of
/// byte order up to that swap), so the loop needs no byte swaps.
#[inline(always)]
pub fn sum(data: &[u8]) -> u64 {
    u16::from_be(fold(sum_native(data))) as u64
}

/// The one's-complement sum of `data` in the machine's byte order, not
/// folded: the words as the machine reads them. Its fold equals the
/// folded big-endian sum with its bytes swapped (on a little-endian
/// machine), so a sum that must come out all ones can be checked without
/// the swap.
#[inline(always)]
pub fn sum_native(data: &[u8]) -> u64 {
    let (acc, carries) = sum_words(data);
    // Folded below 2^35, so callers may add more before their fold.
    (acc >> 32) + (acc & 0xffff_ffff) + carries
}

/// The 64-bit words of `data` (the last one zero-padded) summed with
/// end-around carries (RFC 1071, 2(C)): the sum and the carries not yet
/// added back. On x86-64 one add-with-carry chain, four words per turn of
/// the loop: one instruction per 8 bytes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn sum_words(data: &[u8]) -> (u64, u64) {
    use std::arch::x86_64::_addcarry_u64;
    let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().expect("8 bytes"));
    let (mut acc, mut c) = (0u64, 0u8);
    let mut blocks = data.chunks_exact(32);
    for b in &mut blocks {
        c = _addcarry_u64(c, acc, word(&b[0..8]), &mut acc);
        c = _addcarry_u64(c, acc, word(&b[8..16]), &mut acc);
        c = _addcarry_u64(c, acc, word(&b[16..24]), &mut acc);
        c = _addcarry_u64(c, acc, word(&b[24..32]), &mut acc);
    }
    let mut words = blocks.remainder().chunks_exact(8);
    for w in &mut words {
        c = _addcarry_u64(c, acc, word(w), &mut acc);
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        c = _addcarry_u64(c, acc, tail(data, rest), &mut acc);
    }
    (acc, c as u64)
}

/// [`sum_words`] elsewhere: an add and a count of its carry per word.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn sum_words(data: &[u8]) -> (u64, u64) {
    let (mut acc, mut carries) = (0u64, 0u64);
    let mut add = |w: u64| {
        let (s, c) = acc.overflowing_add(w);
        acc = s;
        carries += c as u64;
    };
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        add(u64::from_ne_bytes(w.try_into().expect("8 bytes")));
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        add(tail(data, rest));
    }
    (acc, carries)
}

/// `rest`, the last 1 to 7 bytes of `data`, as a word zero-padded to 8
/// bytes (they start on an even offset, so an odd last byte is the high
/// half of its 16-bit word, as it must be). With 8 bytes or more in
/// `data`, one load of its last 8 bytes, shifted: no copy, no branch per
/// piece.
#[inline(always)]
fn tail(data: &[u8], rest: &[u8]) -> u64 {
    let r = rest.len();
    if cfg!(target_endian = "little") && data.len() >= 8 {
        let last = u64::from_le_bytes(data[data.len() - 8..].try_into().expect("8 bytes"));
        return last >> (8 * (8 - r));
    }
    let mut padded = [0u8; 8];
    padded[..r].copy_from_slice(rest);
    u64::from_ne_bytes(padded)
}

/// Folds a sum to 16 bits (not complemented), in two steps: each adds the
/// halves and the carry out of that add (an end-around carry never carries
/// again: a sum that carried is at most 2^n - 2).
#[inline]
pub fn fold(acc: u64) -> u16 {
    let (x, c) = (acc as u32).overflowing_add((acc >> 32) as u32);
    let x = x + c as u32;
    let (y, c) = (x as u16).overflowing_add((x >> 16) as u16);
    y + c as u16
}

/// Whether `acc` folds to all ones, as the sum over a header or datagram
/// that holds a good checksum does: `acc` is then a nonzero multiple of
/// 0xffff (2^16 is 1 modulo 0xffff, so every fold step keeps the residue,
/// and a nonzero sum never folds to 0). A multiply and a compare, where
/// [`fold`] and its compare take nine instructions.
#[inline(always)]
pub fn folds_to_ones(acc: u64) -> bool {
    acc != 0 && acc.is_multiple_of(0xffff)
}

/// The checksum field value for `data`: the complement of its folded sum.
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum(data))
}

/// The sum over data split in segments, as if it were one buffer (a
/// segment of odd length shifts the bytes after it).
pub fn sum_segments<'a>(segments: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let mut acc: u64 = 0;
    let mut odd = false;
    for seg in segments {
        if seg.is_empty() {
            continue;
        }
        let s = fold(sum(seg)) as u64;
        // After an odd number of bytes the next segment's words are
        // byte-swapped relative to the whole buffer.
        acc += if odd { (s >> 8) | ((s & 0xff) << 8) } else { s };
        odd ^= seg.len() % 2 == 1;
    }
    acc
}

/// The sum of an IPv4 pseudo-header.
#[inline]
pub fn pseudo_header_v4(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, length: u32) -> u64 {
    let s = u32::from(src) as u64;
    let d = u32::from(dst) as u64;
    (s >> 16) + (s & 0xffff) + (d >> 16) + (d & 0xffff) + protocol as u64 + length as u64
}

/// The sum of an IPv6 pseudo-header.
#[inline]
pub fn pseudo_header_v6(src: &Ipv6Addr, dst: &Ipv6Addr, next_header: u8, length: u32) -> u64 {
    sum(&src.octets()) + sum(&dst.octets()) + (length >> 16) as u64 + (length & 0xffff) as u64 + next_header as u64
}

/// Updates checksum field `check` after a 16-bit word changed from `old`
/// to `new` (RFC 1624, eqn. 3: HC' = ~(~HC + ~m + m')).
#[inline]
pub fn update_u16(check: u16, old: u16, new: u16) -> u16 {
    let acc = (!check as u64) + (!old as u64 & 0xffff) + new as u64;
    !fold(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A straightforward RFC 1071 reference.
    fn reference(data: &[u8]) -> u16 {
        let mut acc: u32 = 0;
        for pair in data.chunks(2) {
            let w = if pair.len() == 2 { u16::from_be_bytes([pair[0], pair[1]]) } else { (pair[0] as u16) << 8 };
            acc += w as u32;
            acc = (acc & 0xffff) + (acc >> 16);
        }
        !(acc as u16)
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(&data)), 0xddf2);
        assert_eq!(checksum(&data), !0xddf2);
    }

    #[test]
    fn matches_reference_for_all_lengths() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 37 + 11) as u8).collect();
        for len in 0..data.len() {
            assert_eq!(checksum(&data[..len]), reference(&data[..len]), "len {len}");
        }
    }

    #[test]
    fn a_buffer_holding_its_checksum_sums_to_all_ones_natively() {
        for len in 2..300usize {
            let mut data: Vec<u8> = (0..len as u32).map(|i| (i * 53 + 7) as u8).collect();
            data[0..2].copy_from_slice(&[0, 0]);
            let c = checksum(&data);
            data[0..2].copy_from_slice(&c.to_be_bytes());
            assert_eq!(fold(sum_native(&data)), 0xffff, "len {len}");
            assert_eq!(fold(sum(&data)), 0xffff, "len {len}");
        }
    }

    #[test]
    fn folds_to_ones_answers_as_the_fold() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut edges =
            vec![0, 1, 0xfffe, 0xffff, 0x1_0000, 0x1_fffe, 0xffff_ffff, 0x1_ffff_fffe, u64::MAX, u64::MAX - 1];
        edges.extend((1..2000u64).map(|k| k * 0xffff));
        edges.extend((1..2000u64).map(|k| k * 0xffff + 1));
        edges.extend((0..100_000).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x >> (x % 40)
        }));
        let mut ones = 0;
        for &v in &edges {
            assert_eq!(folds_to_ones(v), fold(v) == 0xffff, "{v:#x}");
            ones += folds_to_ones(v) as u32;
        }
        assert!(ones >= 2000, "the multiples were seen: {ones}");
    }

    #[test]
    fn fold_matches_folding_until_it_fits() {
        let slow = |mut x: u64| {
            while x > 0xffff {
                x = (x & 0xffff) + (x >> 16);
            }
            x as u16
        };
        let edges = [0, 1, 0xffff, 0x1_0000, 0xffff_ffff, 0x1_0000_0000, 0x1_fffe_0001, u64::MAX, u64::MAX - 1];
        let spread = (0..10_000u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        for x in edges.into_iter().chain(spread) {
            assert_eq!(fold(x), slow(x), "{x:#x}");
        }
    }

    #[test]
    fn segments_equal_whole() {
        let data: Vec<u8> = (0..100u32).map(|i| (i * 91 + 3) as u8).collect();
        for cut1 in 0..data.len() {
            let cut2 = (cut1 + 7).min(data.len());
            let parts = [&data[..cut1], &data[cut1..cut2], &data[cut2..]];
            assert_eq!(fold(sum_segments(parts)), fold(sum(&data)), "cuts {cut1} {cut2}");
        }
    }

    #[test]
    fn incremental_update_matches_recompute() {
        let mut data = [0x45u8, 0, 0, 0x54, 0x12, 0x34, 0x40, 0, 0x40, 1, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
        let c = checksum(&data);
        let old = u16::from_be_bytes([data[8], data[9]]);
        data[8] = 0x3f; // TTL 64 -> 63
        let new = u16::from_be_bytes([data[8], data[9]]);
        assert_eq!(update_u16(c, old, new), checksum(&data));
    }
}

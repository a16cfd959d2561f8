//! A self-checking payload, for tests that must tell a corrupted datagram
//! from a lost one: bytes 0..8 the sequence number, 8..16 the FNV-1a 64
//! hash of the rest, the rest a pattern of the sequence number.

/// Smallest payload that carries the check.
pub const MIN_LEN: usize = 16;

/// FNV-1a, 64 bits.
pub fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// Writes datagram `seq`'s payload into `buf` (at least [`MIN_LEN`] bytes).
pub fn fill(buf: &mut [u8], seq: u64) {
    for (i, b) in buf[MIN_LEN..].iter_mut().enumerate() {
        *b = (seq as usize).wrapping_mul(31).wrapping_add(i * 7) as u8;
    }
    buf[..8].copy_from_slice(&seq.to_be_bytes());
    let h = fnv(&buf[MIN_LEN..]);
    buf[8..16].copy_from_slice(&h.to_be_bytes());
}

/// The sequence number of an intact payload; `None` if it was corrupted.
pub fn verify(buf: &[u8]) -> Option<u64> {
    if buf.len() < MIN_LEN {
        return None;
    }
    let h = u64::from_be_bytes(buf[8..16].try_into().ok()?);
    (fnv(&buf[MIN_LEN..]) == h).then(|| u64::from_be_bytes(buf[..8].try_into().expect("8 bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_any_changed_byte() {
        let mut b = vec![0u8; 2000];
        fill(&mut b, 42);
        assert_eq!(verify(&b), Some(42));
        for at in [16, 100, 1999] {
            let mut c = b.clone();
            c[at] ^= 1;
            assert_eq!(verify(&c), None, "byte {at}");
        }
        assert_eq!(verify(&b[..10]), None);
    }
}

#![no_main]
//! Fragments in any order, of any offset and length, overlapping or not,
//! for a few datagrams of both families, with time passing: the table
//! never panics, never holds more than its limits, and every datagram it
//! completes is exactly the bytes its fragments carried (each datagram's
//! bytes are a pattern of its identity and offset, so any mix-up shows).
use libfuzzer_sys::fuzz_target;
use spate_stack::internals::reassembly::bytes::{Bytes, CHARGE};
use spate_stack::internals::reassembly::{Fragment, Instant, Key, Limits, Outcome, Reassembler};

const L3: usize = 14;
const DATA_AT: usize = 34;

fn byte(ident: u32, at: usize) -> u8 {
    (at as u32).wrapping_mul(7).wrapping_add(ident.wrapping_mul(131)) as u8
}

fuzz_target!(|data: &[u8]| {
    let limits = Limits { high: 48 * CHARGE, low: 32 * CHARGE, timeout_ns: 50_000_000, max_datagrams: 8 };
    let mut table = Reassembler::<Bytes>::new(limits);
    let mut now = 0u64;
    for rec in data.chunks_exact(6) {
        let ident = (rec[0] & 7) as u32;
        let v6 = rec[0] & 8 != 0;
        let more = rec[0] & 16 != 0;
        let offset = (u16::from_le_bytes([rec[1], rec[2]]) as usize % 8200) * 8;
        let len = u16::from_le_bytes([rec[3], rec[4]]) as usize % 1600;
        now += rec[5] as u64 * 1_000_000;
        let mut frame = vec![0xee; DATA_AT];
        frame.extend((offset..offset + len).map(|at| byte(ident, at)));
        let f = Fragment {
            mbuf: Bytes { segs: vec![frame] },
            l3: L3,
            data_at: DATA_AT,
            offset: offset as u32,
            len: len as u32,
            more,
        };
        let key = Key { src: 0xc612_0001, dst: 0xc612_0002, protocol: 17, ident, v6 };
        if let Outcome::Complete { mbuf, l3, data_at, len } = table.insert(key, f, Instant(now)) {
            assert_eq!((l3, data_at), (L3, DATA_AT));
            let mut got = mbuf.segs[0][data_at..].to_vec();
            for s in &mbuf.segs[1..] {
                got.extend_from_slice(s);
            }
            assert_eq!(got.len(), len as usize, "the length it says");
            assert!(got.iter().enumerate().all(|(at, b)| *b == byte(ident, at)), "datagram {ident}: wrong bytes");
        }
        if rec[5] & 0x80 != 0 {
            table.expire(Instant(now));
        }
    }
});

#![no_main]
use std::net::Ipv6Addr;

use libfuzzer_sys::fuzz_target;
use spate_stack::wire::icmpv6::{Packet, Repr};

fuzz_target!(|data: &[u8]| {
    let (src, dst) = (Ipv6Addr::LOCALHOST, Ipv6Addr::UNSPECIFIED);
    if let Ok(p) = Packet::new_checked(data) {
        if let Ok(r) = Repr::parse(&p, &src, &dst, true) {
            let mut out = vec![0u8; r.buffer_len()];
            r.emit(&mut out, &src, &dst);
        }
    }
});

#![no_main]
use libfuzzer_sys::fuzz_target;
use spate_stack::wire::icmpv4::{Packet, Repr};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Packet::new_checked(data) {
        if let Ok(r) = Repr::parse(&p, true) {
            let mut out = vec![0u8; r.buffer_len()];
            r.emit(&mut out);
        }
    }
});

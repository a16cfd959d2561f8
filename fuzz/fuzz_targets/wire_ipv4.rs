#![no_main]
use libfuzzer_sys::fuzz_target;
use spate_stack::wire::ipv4::{Packet, Repr};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Packet::new_checked(data) {
        let _ = (p.payload().len(), p.is_fragment(), p.frag_offset(), p.verify_checksum());
        let _ = Repr::parse(&p, false);
        let _ = Repr::parse(&p, true);
    }
});

#![no_main]
use libfuzzer_sys::fuzz_target;
use spate_stack::wire::ipv6::{Packet, Repr, walk_extensions};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Packet::new_checked(data) {
        let _ = Repr::parse(&p);
        if let Ok(e) = walk_extensions(p.next_header(), p.payload()) {
            assert!(e.offset <= p.payload().len());
        }
    }
    let _ = walk_extensions(data.first().copied().unwrap_or(0), data);
});

#![no_main]
use libfuzzer_sys::fuzz_target;
use spate_stack::wire::arp::{Packet, Repr};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = Packet::new_checked(data).and_then(|p| Repr::parse(&p)) {
        let mut out = [0u8; 28];
        r.emit(&mut out);
        assert_eq!(Repr::parse(&Packet::new_checked(&out[..]).unwrap()).unwrap(), r);
    }
});

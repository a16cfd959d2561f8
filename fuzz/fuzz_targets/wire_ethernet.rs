#![no_main]
use libfuzzer_sys::fuzz_target;
use spate_stack::wire::ethernet::{Frame, Repr};

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = Frame::new_checked(data) {
        let _ = (f.dst(), f.src(), f.ethertype(), f.vlan_id(), f.payload().len());
        if let Ok(r) = Repr::parse(&f) {
            let mut out = vec![0u8; r.buffer_len()];
            r.emit(&mut out);
            assert_eq!(Repr::parse(&Frame::new_checked(&out[..]).unwrap()).unwrap(), r);
        }
    }
});

#![no_main]
use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use spate_stack::wire::udp::{Packet, Repr};

fuzz_target!(|data: &[u8]| {
    let (a, b): (IpAddr, IpAddr) = ("198.18.0.1".parse().unwrap(), "fd00::2".parse().unwrap());
    if let Ok(p) = Packet::new_checked(data) {
        let _ = p.payload().len();
        let _ = Repr::parse(&p, &a, &a, false);
        let _ = Repr::parse(&p, &b, &b, false);
    }
});

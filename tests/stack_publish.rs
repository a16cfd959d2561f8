//! What a call changes holds for every frame that arrives after it
//! returned, as on Linux: a datagram sent to a port once `bind` returned
//! reaches the socket. (`stack_control` proves it for a capture,
//! `kernel_mcast` for a send right after a join, `stack_gro` for GRO
//! turned on and off.)
//!
//! The lcore looks at what the control plane published at the top of a
//! loop iteration and again after each burst that brought frames. With
//! only the first look, an lcore taken off its CPU between it and its
//! burst carried an iteration begun before the change past it: 1 to 4 of
//! 300 datagrams got a port unreachable. Here the test thread runs on the
//! lcore's CPU, so each bind is made while the lcore is off it, at
//! whatever point of its iteration it was stopped.

use std::time::Duration;

use spate::dpdk::Memory;
use spate::{Counter, PortSpec, Stack, StackConfig, UdpSocket};
use spate_testkit::wire_peer::udp_frame;
use spate_testkit::{WirePeer, device_lock, pin_to_cpu, shared_eal};

const ROUNDS: u16 = 300;

/// A stack on `port` polling lcore 1 without a pause.
fn busy_stack(port: &str) -> Stack {
    Stack::new(StackConfig {
        lcores: "1".into(),
        ports: vec![PortSpec::new(port).addr("198.18.0.2/24").unwrap()],
        mempool_size: 2047,
        stop_on_signal: false,
        ..StackConfig::default()
    })
    .unwrap()
}

/// The counters that are not zero, for a failure's message.
fn named(stack: &Stack) -> Vec<String> {
    stack.counters().iter().filter(|(_, v)| *v > 0).map(|(k, v)| format!("{k:?}={v}")).collect()
}

#[test]
fn a_datagram_sent_once_bind_returned_reaches_the_socket() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (mut peer, port, _p) = WirePeer::new(1023);
    let stack = busy_stack(&port);
    let mac = stack.interfaces()[0].mac;
    let running = stack.spawn_polling().unwrap();
    pin_to_cpu(1).unwrap();
    let mut missed = Vec::new();
    // Ten misses say enough.
    for i in 0..ROUNDS {
        if missed.len() == 10 {
            break;
        }
        let s = UdpSocket::bind(&stack, ("0.0.0.0", 20000 + i)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        peer.send(&udp_frame(mac, false, 4000, 20000 + i, b"sent once bound"));
        if s.recv(&mut [0u8; 64]).is_err() {
            missed.push(i);
        }
    }
    assert!(missed.is_empty(), "rounds missed: {missed:?}; {:?}", named(&stack));
    assert_eq!(stack.counters()[Counter::UdpNoPorts], 0, "no port unreachable sent");
    running.stop();
}

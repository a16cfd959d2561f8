//! The rig the wire tests share: a wire pair, a stack on spate's end of it
//! polling lcore 1, and the loop that takes a socket's datagrams. Each
//! test sets what it needs on top of [`stack_config`].

use std::time::{Duration, Instant};

use spate_dpdk::{Memory, Port};
use spate_stack::wire::MacAddr;
use spate_stack::{Datagram, DatagramBatch, PortSpec, Stack, StackConfig, UdpSocket};

use crate::eal::shared_eal;
use crate::wire_peer::{SPATE_IP, SPATE_IP6, WirePeer};

/// What every wire test's stack has: lcore 1 polling `port`, stopped by
/// the test (not by a signal). The rest is `StackConfig`'s default.
pub fn stack_config(port: PortSpec) -> StackConfig {
    StackConfig { lcores: "1".into(), ports: vec![port], stop_on_signal: false, ..StackConfig::default() }
}

/// spate's end of a wire pair, `name`, with [`SPATE_IP`]/24.
pub fn spate_port(name: &str) -> PortSpec {
    PortSpec::new(name).addr(&format!("{SPATE_IP}/24")).expect("an address")
}

/// [`spate_port`] with [`SPATE_IP6`]/64 too.
pub fn spate_port_dual(name: &str) -> PortSpec {
    spate_port(name).addr(&format!("{SPATE_IP6}/64")).expect("an address")
}

/// A wire pair with a stack on spate's end: the stack goes first when the
/// rig is dropped, then the peer, then spate's end of the pair.
#[derive(Debug)]
pub struct WireRig {
    /// The stack, on spate's end.
    pub stack: Stack,
    /// The test's end.
    pub peer: WirePeer,
    /// The stack's interface MAC (where the peer's frames go).
    pub mac: MacAddr,
    /// spate's end of the pair, kept while the stack uses it.
    pub spate_side: Port,
}

impl WireRig {
    /// A wire pair (the peer's pool `peer_mbufs` large) and a stack built
    /// from `config(name of spate's end)`, in the process's EAL.
    pub fn new(peer_mbufs: u32, config: impl FnOnce(&str) -> StackConfig) -> WireRig {
        shared_eal(Memory::Auto);
        let (peer, name, spate_side) = WirePeer::new(peer_mbufs);
        let stack = Stack::new(config(&name)).expect("the stack");
        let mac = stack.interfaces()[0].mac;
        WireRig { stack, peer, mac, spate_side }
    }
}

/// Takes `want` datagrams from the non-blocking socket `sock`, failing
/// the test after 10 s without them.
pub fn recv_datagrams(sock: &UdpSocket, want: usize) -> Vec<Datagram> {
    let mut out = Vec::new();
    let mut batch = DatagramBatch::with_capacity(64);
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < want {
        assert!(Instant::now() < deadline, "got {} of {want} datagrams", out.len());
        if sock.recv_batch(&mut batch, 64).is_ok() {
            out.extend(batch.drain());
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    out
}

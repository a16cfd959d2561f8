//! Several lcores on a port without RSS (net_ring: one queue pair, no
//! hash): software RSS keeps every flow on one lcore, in order, and the
//! fragments of a datagram meet on one lcore and reach the lcore owning
//! the datagram's flow; lcores without a TX queue send through the one
//! that has it. More lcores than this machine's 2 cores: the EAL maps
//! lcores 0-4 onto CPUs 0-1 and the source is paced: it keeps at most
//! 1,024 datagrams on their way, so no ring can overflow and every
//! datagram must arrive.
//!
//! Which lcore processed a datagram is seen through a reuseport group with
//! one socket per lcore, each preferring its lcore (`incoming_lcore`):
//! an lcore delivers to its own member.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use spate_dpdk::{Burst, Eal, EalBuilder, Memory};
use spate_stack::config::RssMode;
use spate_stack::stats::Counter;
use spate_stack::{DatagramBatch, PortSpec, Stack, StackConfig, UdpSocket};
use spate_testkit::device_lock;
use spate_testkit::wire_peer::{PEER_IP, WirePeer, ip_fragments, udp_datagram, udp_frame};

static EAL: OnceLock<Eal> = OnceLock::new();

fn eal() {
    EAL.get_or_init(|| {
        let _ = env_logger::builder().is_test(true).try_init();
        let eal = EalBuilder::new()
            .program("spate-rss")
            .args(["--lcores", "(0-4)@(0-1)"])
            .memory(Memory::Auto)
            .memory_mb(512)
            .init()
            .expect("EAL with lcores 0-4 on CPUs 0-1");
        spate_dpdk::lcore::unpin_current_thread().expect("unpin");
        eal
    });
}

const FLOWS: u32 = 10_000;
const ROUNDS: u32 = 3;
const PORT: u16 = 9;
const WINDOW: u64 = 1024;

/// Flow `f`'s datagram `seq`: (flow, seq) and padding; every tenth flow's
/// second datagram is 2,000 bytes, sent as two IPv4 fragments.
fn frames(mac: spate_stack::wire::MacAddr, f: u32, seq: u32) -> Vec<Vec<u8>> {
    let src_port = 20_000 + (f % 40_000) as u16;
    let mut payload = [f.to_be_bytes(), seq.to_be_bytes()].concat();
    if f % 10 == 0 && seq == 1 {
        payload.resize(2000, 0x5a);
        let dg = udp_datagram(false, src_port, PORT, &payload);
        return ip_fragments(mac, false, f * 8 + seq, &dg, 1480);
    }
    payload.resize(18, 0);
    vec![udp_frame(mac, false, src_port, PORT, &payload)]
}

fn run(lcores: usize) {
    let _serial = device_lock();
    eal();
    let (mut peer, port, _spate_side) = WirePeer::new(16383);
    let cfg = StackConfig {
        lcores: format!("1-{lcores}"),
        rss: RssMode::Auto,
        ports: vec![PortSpec::new(&port).addr("198.18.0.2/24").unwrap()],
        stop_on_signal: false,
        announce: false,
        mempool_size: 16383,
        idle_sleep_us: 20,
        ..StackConfig::default()
    };
    let stack = Stack::new(cfg).unwrap();
    let mac = stack.interfaces()[0].mac;
    let sockets: Vec<UdpSocket> = (0..lcores)
        .map(|i| {
            let s = UdpSocket::builder(&stack)
                .reuseport(true)
                .incoming_lcore(i as u32)
                .recv_buffer_size(64 << 20)
                .bind(("0.0.0.0", PORT))
                .unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect();
    let running = stack.spawn_polling().unwrap();

    // Received: flow -> (socket, last seq), checked as they come.
    let mut seen: HashMap<u32, (usize, u32)> = HashMap::new();
    let mut per_socket = vec![0u64; lcores];
    let mut received = 0u64;
    let mut batch = DatagramBatch::with_capacity(64);
    let mut drain = |seen: &mut HashMap<u32, (usize, u32)>, per_socket: &mut Vec<u64>, received: &mut u64| {
        for (i, s) in sockets.iter().enumerate() {
            while s.recv_batch(&mut batch, 64).is_ok() {
                for d in batch.drain() {
                    let b = d.to_vec();
                    let (f, seq) = (
                        u32::from_be_bytes(b[..4].try_into().unwrap()),
                        u32::from_be_bytes(b[4..8].try_into().unwrap()),
                    );
                    if f % 10 == 0 && seq == 1 {
                        assert_eq!(b.len(), 2000, "flow {f}: the reassembled datagram whole");
                    }
                    match seen.insert(f, (i, seq)) {
                        Some((j, last)) => {
                            assert_eq!(j, i, "flow {f} on lcores {j} and {i}");
                            assert!(seq > last, "flow {f}: {seq} after {last}");
                        }
                        None => assert_eq!(seq, 0, "flow {f} starts at 0"),
                    }
                    per_socket[i] += 1;
                    *received += 1;
                }
            }
        }
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut sent = 0u64;
    for seq in 0..ROUNDS {
        for chunk in (0..FLOWS).collect::<Vec<_>>().chunks(16) {
            // At most WINDOW datagrams on their way: less than a ring
            // between two lcores holds, so none can overflow.
            while sent - received > WINDOW {
                assert!(Instant::now() < deadline, "received {received} of {sent}");
                drain(&mut seen, &mut per_socket, &mut received);
                std::thread::sleep(Duration::from_micros(100));
            }
            let mut b: Burst = Burst::new();
            for &f in chunk {
                for fr in frames(mac, f, seq) {
                    b.push(peer.mbuf(&fr)).unwrap();
                }
            }
            sent += chunk.len() as u64;
            // Paced: the lcores share two CPUs with this thread.
            while !b.is_empty() {
                assert!(Instant::now() < deadline, "the wire stayed full");
                peer.send_keep(&mut b);
                if !b.is_empty() {
                    drain(&mut seen, &mut per_socket, &mut received);
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            drain(&mut seen, &mut per_socket, &mut received);
        }
    }
    let c = || stack.counters();
    let dropped = |c: &spate_stack::stats::Counters| c[Counter::RxSteerDropped] + c[Counter::UdpRcvbufErrors];
    while received + dropped(&c()) < sent {
        assert!(
            Instant::now() < deadline,
            "received {received} + dropped {} of {sent}\n{}",
            dropped(&c()),
            c().render_nonzero()
        );
        drain(&mut seen, &mut per_socket, &mut received);
        std::thread::sleep(Duration::from_millis(1));
    }
    let counters = c();
    println!(
        "{lcores} lcores: {sent} datagrams sent, {received} received, per lcore {per_socket:?}; steered {} frames and \
         {} datagrams, dropped {}",
        counters[Counter::SteerFrames],
        counters[Counter::SteerDatagrams],
        dropped(&counters)
    );
    assert_eq!(received, sent, "nothing lost\n{}", counters.render_nonzero());
    assert_eq!(counters.unaccounted_frames(), 0, "each frame in one Rx outcome\n{}", counters.render_nonzero());
    assert_eq!(seen.len() as u32, FLOWS);
    for (i, &n) in per_socket.iter().enumerate() {
        assert!(n as f64 > sent as f64 / lcores as f64 * 0.8, "lcore {i} processed {n} of {sent}: flows spread");
    }
    assert!(counters[Counter::SteerFrames] > 0 && counters[Counter::SteerDatagrams] > 0);
    assert_eq!(counters[Counter::IpReasmOKs], (FLOWS / 10) as u64, "every fragmented datagram reassembled");

    // Resolve the peer first (what waits for ARP is a bounded queue).
    sockets[0].send_to(b"hello", SocketAddr::from((PEER_IP, 7))).unwrap();
    let first = peer.recv_matching(|f| f.len() >= 42 && f[23] == 17 || f.len() >= 42 && f[12..14] == [0x08, 0x06]);
    if first[12..14] == [0x08, 0x06] {
        assert!(peer.answer_arp(&first), "spate asked for the peer's MAC");
        peer.recv_matching(|f| f.len() >= 42 && f[23] == 17);
    }
    // Every lcore sends (only the first owns the TX queue): 100 each.
    for s in &sockets {
        for k in 0..100u32 {
            s.send_to(&k.to_be_bytes(), SocketAddr::from((PEER_IP, 7))).unwrap();
        }
    }
    let mut got = 0;
    let mut b: Burst = Burst::new();
    while got < 100 * lcores {
        assert!(Instant::now() < deadline, "peer got {got} of {} datagrams", 100 * lcores);
        if peer.recv_burst(&mut b) == 0 {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        for m in b.drain() {
            if !peer.answer_arp(m.data()) && m.data().len() >= 42 && m.data()[23] == 17 {
                got += 1;
            }
        }
    }
    assert!(stack.counters()[Counter::SteerTx] > 0, "lcores without a TX queue handed frames over");
    running.stop();
}

#[test]
fn software_rss_keeps_flows_on_one_lcore_with_2_and_4_lcores() {
    run(2);
    run(4);
}

#[test]
fn rss_modes_a_port_cannot_honour_are_clear_errors() {
    let _serial = device_lock();
    eal();
    let (_peer, port, _spate_side) = WirePeer::new(4095);
    for mode in [RssMode::Hw, RssMode::Off] {
        let cfg = StackConfig {
            lcores: "1-2".into(),
            rss: mode,
            ports: vec![PortSpec::new(&port).addr("198.18.0.2/24").unwrap()],
            stop_on_signal: false,
            ..StackConfig::default()
        };
        let e = Stack::new(cfg).unwrap_err().to_string();
        assert!(e.contains("rss = \"sw\""), "{mode:?}: {e}");
    }
}

/// Hardware RSS: a frame whose mbuf carries the port's hash is placed in a
/// reuseport group by that hash, not by one spate computes (net_ring
/// passes mbufs through, so the peer sets the hash a NIC would have set).
#[test]
fn the_ports_hash_picks_the_group_member() {
    let _serial = device_lock();
    eal();
    let (mut peer, port, _spate_side) = WirePeer::new(4095);
    let cfg = StackConfig {
        lcores: "1".into(),
        ports: vec![PortSpec::new(&port).addr("198.18.0.2/24").unwrap()],
        stop_on_signal: false,
        announce: false,
        idle_sleep_us: 20,
        ..StackConfig::default()
    };
    let stack = Stack::new(cfg).unwrap();
    let mac = stack.interfaces()[0].mac;
    let group: Vec<UdpSocket> = (0..4)
        .map(|_| {
            let s = UdpSocket::builder(&stack).reuseport(true).bind(("0.0.0.0", PORT)).unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect();
    let running = stack.spawn_polling().unwrap();
    // Case 1: one flow, 64 different hashes: spread over the members.
    // Case 2: 64 flows, one hash: all on one member.
    let mut member_of = |frames: Vec<(Vec<u8>, u32)>| -> Vec<usize> {
        for chunk in frames.chunks(32) {
            let mut b: Burst = Burst::new();
            for (f, h) in chunk {
                let mut m = peer.mbuf(f);
                m.set_rss_hash(*h);
                b.push(m).unwrap();
            }
            assert_eq!(peer.send_keep(&mut b), chunk.len());
        }
        let mut members = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut batch = DatagramBatch::with_capacity(64);
        while members.len() < frames.len() {
            assert!(Instant::now() < deadline, "got {} of {}", members.len(), frames.len());
            for (i, s) in group.iter().enumerate() {
                while s.recv_batch(&mut batch, 64).is_ok() {
                    members.extend(batch.drain().map(|_| i));
                }
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        members
    };
    let one_flow = member_of(
        (0..64).map(|h| (udp_frame(mac, false, 40_000, PORT, &[1; 8]), (h as u32).wrapping_mul(0x9e37_79b9))).collect(),
    );
    let used: std::collections::HashSet<usize> = one_flow.iter().copied().collect();
    assert!(used.len() > 1, "one flow with many hashes reached several members: {one_flow:?}");
    let one_hash =
        member_of((0..64).map(|i| (udp_frame(mac, false, 40_000 + i as u16, PORT, &[1; 8]), 0xdead_beef)).collect());
    assert!(one_hash.iter().all(|&m| m == one_hash[0]), "many flows with one hash reached one member: {one_hash:?}");
    running.stop();
}

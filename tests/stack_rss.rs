//! Several lcores on a port without RSS (net_ring: one queue pair, no
//! hash): software RSS keeps every flow on one lcore, in order, and the
//! fragments of a datagram meet on one lcore and reach the lcore owning
//! the datagram's flow; lcores without a TX queue send through the one
//! that has it. More lcores than this machine's 2 cores: the EAL maps
//! lcores 0-4 onto CPUs 0-1 and the source is paced: it keeps at most
//! 384 datagrams on their way (fewer than a virtio ring of 1,024
//! holds, fragments counted twice), so no ring can overflow and every
//! datagram must arrive.
//!
//! Which lcore processed a datagram is seen through a reuseport group with
//! one socket per lcore, each preferring its lcore (`incoming_lcore`):
//! an lcore delivers to its own member.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use spate::Counter;
use spate::config::RssMode;
use spate::dpdk::{Burst, Eal, EalBuilder, Memory};
use spate::{DatagramBatch, PortSpec, Stack, StackConfig, UdpSocket};
use spate_testkit::wire_peer::{PEER_IP, WirePeer, ip_fragments, udp_datagram, udp_frame};
use spate_testkit::{Netns, TestPmdBuilder, device_lock, kernel_peer, unique, unique_socket_path, veth};

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
        spate::dpdk::lcore::unpin_current_thread().expect("unpin");
        eal
    });
}

const FLOWS: u32 = 10_000;
const ROUNDS: u32 = 3;
const PORT: u16 = 9;
const WINDOW: u64 = 384;

/// Flow `f`'s datagram `seq`: (flow, seq) and padding; every tenth flow's
/// second datagram is 2,000 bytes, sent as two IPv4 fragments.
fn frames(mac: spate::wire::MacAddr, f: u32, seq: u32) -> Vec<Vec<u8>> {
    let src_port = 20_000 + (f % 40_000) as u16;
    let mut payload = [f.to_be_bytes(), seq.to_be_bytes()].concat();
    if f.is_multiple_of(10) && seq == 1 {
        payload.resize(2000, 0x5a);
        let dg = udp_datagram(false, src_port, PORT, &payload);
        return ip_fragments(mac, false, f * 8 + seq, &dg, 1480);
    }
    payload.resize(18, 0);
    vec![udp_frame(mac, false, src_port, PORT, &payload)]
}

/// What the sockets of a group with one member per lcore received: flow
/// -> (socket, last seq), checked as datagrams come.
struct Tracker {
    seen: HashMap<u32, (usize, u32)>,
    per_socket: Vec<u64>,
    received: u64,
    batch: DatagramBatch,
    /// Every tenth flow's second datagram is the 2,000-byte one.
    fragmented: bool,
}

impl Tracker {
    fn new(lcores: usize, fragmented: bool) -> Tracker {
        Tracker {
            seen: HashMap::new(),
            per_socket: vec![0; lcores],
            received: 0,
            batch: DatagramBatch::with_capacity(64),
            fragmented,
        }
    }

    /// Reads every socket: each flow on one lcore, in order.
    fn drain(&mut self, sockets: &[UdpSocket]) {
        for (i, s) in sockets.iter().enumerate() {
            while s.recv_batch(&mut self.batch, 64).is_ok() {
                for d in self.batch.drain() {
                    let b = d.to_vec();
                    let (f, seq) = (
                        u32::from_be_bytes(b[..4].try_into().unwrap()),
                        u32::from_be_bytes(b[4..8].try_into().unwrap()),
                    );
                    if self.fragmented && f % 10 == 0 && seq == 1 {
                        assert_eq!(b.len(), 2000, "flow {f}: the reassembled datagram whole");
                    }
                    match self.seen.insert(f, (i, seq)) {
                        Some((j, last)) => {
                            assert_eq!(j, i, "flow {f} on lcores {j} and {i}");
                            assert!(seq > last, "flow {f}: {seq} after {last}");
                        }
                        None => assert_eq!(seq, 0, "flow {f} starts at 0"),
                    }
                    self.per_socket[i] += 1;
                    self.received += 1;
                }
            }
        }
    }

    /// Every flow seen, and every lcore had a fair share.
    fn spread(&self, flows: u32, sent: u64) {
        assert_eq!(self.seen.len() as u32, flows);
        let n = self.per_socket.len() as f64;
        for (i, &got) in self.per_socket.iter().enumerate() {
            assert!(got as f64 > sent as f64 / n * 0.8, "lcore {i} processed {got} of {sent}: flows spread");
        }
    }
}

/// A reuseport group with one member per lcore, each preferring its lcore.
fn group(stack: &Stack, lcores: usize) -> Vec<UdpSocket> {
    (0..lcores)
        .map(|i| {
            let s = UdpSocket::builder(stack)
                .reuseport(true)
                .incoming_lcore(i as u32)
                .recv_buffer_size(64 << 20)
                .bind(("0.0.0.0", PORT))
                .unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect()
}

/// The wire spate's port is on.
enum Wire {
    /// A net_ring pair in this process.
    Ring,
    /// A net_virtio_user port whose vhost-user peer is dpdk-testpmd,
    /// forwarding (io mode) between it and the peer's own virtio port.
    Virtio,
}

fn run(lcores: usize, wire: Wire) {
    let _serial = device_lock();
    eal();
    let mut _keep = None;
    let mut _testpmd = None;
    let (mut peer, port) = match wire {
        Wire::Ring => {
            let (peer, port, spate_side) = WirePeer::new(16383);
            _keep = Some(spate_side);
            (peer, port)
        }
        Wire::Virtio => {
            let socks = [unique_socket_path("rssa"), unique_socket_path("rssb")];
            let mut pmd = TestPmdBuilder::new("0,1", 0)
                .vdev(&format!("net_vhost0,iface={},queues=1", socks[0].display()))
                .vdev(&format!("net_vhost1,iface={},queues=1", socks[1].display()))
                .args(["--forward-mode=io", "--nb-cores=1", "--total-num-mbufs=16384", "--stats-period=1"])
                .limit(Duration::from_secs(300))
                .spawn("rss")
                .unwrap();
            for s in &socks {
                pmd.proc.remove_on_drop(s);
            }
            pmd.wait_started(Duration::from_secs(30)).unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while !socks.iter().all(|s| s.exists()) {
                assert!(Instant::now() < deadline, "testpmd made no vhost-user sockets\n{}", pmd.proc.output());
                std::thread::sleep(Duration::from_millis(20));
            }
            let vu = |s: &std::path::Path| {
                format!("{},path={},queues=1,queue_size=1024", unique("net_virtio_user"), s.display())
            };
            let port = spate::dpdk::Port::create(&vu(&socks[0]))
                .unwrap_or_else(|e| panic!("{e}\ntestpmd:\n{}", pmd.proc.output()));
            let peer = WirePeer::on_port(port, 16383);
            _testpmd = Some(pmd);
            (peer, vu(&socks[1]))
        }
    };
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
    let sockets = group(&stack, lcores);
    let running = stack.spawn_polling().unwrap();

    let mut t = Tracker::new(lcores, true);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut sent = 0u64;
    for seq in 0..ROUNDS {
        for chunk in (0..FLOWS).collect::<Vec<_>>().chunks(16) {
            // At most WINDOW datagrams on their way: less than a ring
            // between two lcores holds, so none can overflow.
            while sent - t.received > WINDOW {
                assert!(Instant::now() < deadline, "received {} of {sent}", t.received);
                t.drain(&sockets);
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
                    t.drain(&sockets);
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            t.drain(&sockets);
        }
    }
    let c = || stack.counters();
    let dropped = |c: &spate::Counters| c[Counter::RxSteerDropped] + c[Counter::UdpRcvbufErrors];
    while t.received + dropped(&c()) < sent {
        assert!(
            Instant::now() < deadline,
            "received {} + dropped {} of {sent}\n{}",
            t.received,
            dropped(&c()),
            c().render_nonzero()
        );
        t.drain(&sockets);
        std::thread::sleep(Duration::from_millis(1));
    }
    let counters = c();
    println!(
        "{lcores} lcores: {sent} datagrams sent, {} received, per lcore {:?}; steered {} frames and {} datagrams, \
         dropped {}",
        t.received,
        t.per_socket,
        counters[Counter::SteerFrames],
        counters[Counter::SteerDatagrams],
        dropped(&counters)
    );
    assert_eq!(t.received, sent, "nothing lost\n{}", counters.render_nonzero());
    assert_eq!(counters.unaccounted_frames(), 0, "each frame in one Rx outcome\n{}", counters.render_nonzero());
    t.spread(FLOWS, sent);
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
    run(2, Wire::Ring);
    run(4, Wire::Ring);
}

#[test]
fn software_rss_on_virtio_user_with_2_and_4_lcores() {
    run(2, Wire::Virtio);
    run(4, Wire::Virtio);
}

#[test]
fn rss_modes_a_port_cannot_honour_are_clear_errors() {
    let _serial = device_lock();
    eal();
    let (_peer, port, _spate_side) = WirePeer::new(4095);
    for mode in [RssMode::Hw, RssMode::Off, RssMode::Device] {
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

const PY_FLOWS: &str = r#"
import socket, struct, sys, time
flows, rounds = int(sys.argv[1]), int(sys.argv[2])
n = 0
for seq in range(rounds):
    for f in range(flows):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(('198.18.0.1', 20000 + f))
        s.sendto(struct.pack('>II', f, seq) + bytes(10), ('198.18.0.2', 9))
        s.close()
        n += 1
        if n % 256 == 0:
            time.sleep(0.002)
print('sent', n, flush=True)
"#;

/// A device that spreads flows over its queues itself: net_af_packet with
/// two queue pairs (the kernel's fanout hashes flows over its sockets). With
/// 2 lcores each polls a queue (rss hw: no hand-off); with 4, the two
/// polling lcores hash and hand flows to all four (rss sw over both
/// queues). The kernel in a peer namespace sends 10,000 flows.
#[test]
fn af_packet_queues_keep_flows_on_one_lcore_with_2_and_4_lcores() {
    let _serial = device_lock();
    eal();
    let spate_ns = Netns::new("rss");
    let kernel_ns = Netns::new("rsspeer");
    veth(&spate_ns, "vA", &kernel_ns, "vB");
    spate_ns.must(&["ip", "link", "set", "vA", "address", "02:53:50:41:54:45"]);
    spate_ns.disable_ipv6("vA");
    kernel_peer(&kernel_ns, "vB");
    for lcores in [2usize, 4] {
        let cfg = StackConfig {
            lcores: format!("1-{lcores}"),
            // Rings large enough that the fanout never rolls a flow over.
            ports: vec![
                PortSpec::new("net_af_packet0,iface=vA,qpairs=2,framecnt=16384").addr("198.18.0.2/24").unwrap(),
            ],
            stop_on_signal: false,
            mempool_size: 16383,
            idle_sleep_us: 20,
            ..StackConfig::default()
        };
        // The device's sockets open in the namespace of the creating thread.
        let stack = spate_ns.run(move || Stack::new(cfg).unwrap());
        let sockets = group(&stack, lcores);
        let running = stack.spawn_polling().unwrap();
        let mut sender = kernel_ns
            .spawn(
                "flows",
                "/usr/bin/python3",
                &["-c".into(), PY_FLOWS.into(), FLOWS.to_string(), ROUNDS.to_string()],
                Duration::from_secs(300),
            )
            .unwrap();
        // No fragments here: net_af_packet's fanout has the kernel
        // reassemble them first.
        let mut t = Tracker::new(lcores, false);
        let deadline = Instant::now() + Duration::from_secs(240);
        let sent = (FLOWS * ROUNDS) as u64;
        while t.received < sent {
            assert!(
                Instant::now() < deadline,
                "received {} of {sent}\n{}\n{}",
                t.received,
                sender.output(),
                stack.counters().render_nonzero()
            );
            t.drain(&sockets);
            std::thread::sleep(Duration::from_micros(500));
        }
        assert!(sender.wait_for_output(&format!("sent {sent}"), Duration::from_secs(30)), "{}", sender.output());
        let c = stack.counters();
        println!(
            "net_af_packet, 2 queues, {lcores} lcores: {} received, per lcore {:?}, steered {}",
            t.received,
            t.per_socket,
            c[Counter::SteerFrames]
        );
        t.spread(FLOWS, sent);
        assert_eq!(c[Counter::SteerFrames] > 0, lcores > 2, "hand-offs only where queues are fewer than lcores");
        running.stop();
        drop(sockets);
        drop(stack);
    }
}

/// A tunnel's inner datagram that came in fragments is delivered on the
/// inner interface whichever lcore owns its inner flow: with two lcores
/// and software RSS, the outer packets of all 16 inner flows land on one
/// lcore (one outer flow), which reassembles them. Before, those whose
/// inner flow the other lcore owns were handed over and delivered there as
/// the outer interface's datagrams, where no socket matched.
#[test]
fn reassembled_inner_datagrams_stay_on_the_inner_interface() {
    use spate::wire::{ethernet, ip_proto};
    use spate_testkit::wire_peer::eth;
    let _serial = device_lock();
    eal();
    let (mut peer, port, _keep) = WirePeer::new(4095);
    let mut cfg = StackConfig {
        lcores: "1-2".into(),
        rss: RssMode::Auto,
        ports: vec![PortSpec::new(&port).addr("198.18.0.2/24").unwrap()],
        stop_on_signal: false,
        announce: false,
        mempool_size: 16383,
        idle_sleep_us: 20,
        ..StackConfig::default()
    };
    let mut tunnel = spate::config::VxlanSpec::new(42, PEER_IP.into());
    tunnel.ipv4.push("198.19.0.2/24".parse().unwrap());
    cfg.vxlan.push(tunnel);
    let stack = Stack::new(cfg).unwrap();
    let (outer, inner) = (stack.interfaces()[0].mac, &stack.interfaces()[1]);
    let sock = UdpSocket::builder(&stack).bind_device(inner.index).bind("0.0.0.0:11").unwrap();
    sock.set_nonblocking(true).unwrap();
    let running = stack.spawn_polling().unwrap();

    let (src, dst) = (std::net::Ipv4Addr::new(198, 19, 0, 1), std::net::Ipv4Addr::new(198, 19, 0, 2));
    let mut frames = Vec::new();
    for f in 0..16u16 {
        let dg =
            spate_testkit::wire_peer::udp_datagram_between(src.into(), dst.into(), 30_000 + f, 11, &[f as u8; 2000]);
        for (offset, more) in [(0usize, true), (1480, false)] {
            let part = &dg[offset..if more { 1480 } else { dg.len() }];
            let pkt =
                spate_testkit::wire_peer::ipv4_packet(src, dst, ip_proto::UDP, 100 + f, offset as u32, more, part);
            let mut vx = vec![0x08, 0, 0, 0, 0, 0, 42, 0];
            vx.extend_from_slice(&eth(inner.mac, ethernet::ethertype::IPV4, &pkt));
            frames.push(udp_frame(outer, false, 41_000, 4789, &vx));
        }
    }
    for chunk in frames.chunks(8) {
        let mut b: Burst = Burst::new();
        for f in chunk {
            b.push(peer.mbuf(f)).unwrap();
        }
        assert_eq!(peer.send_burst(&mut b), chunk.len());
    }
    let mut seen = vec![false; 16];
    let mut batch = DatagramBatch::with_capacity(64);
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.iter().any(|s| !s) {
        assert!(Instant::now() < deadline, "flows {seen:?}\n{}", stack.counters().render_nonzero());
        if sock.recv_batch(&mut batch, 64).is_ok() {
            for d in batch.drain() {
                assert_eq!(d.len(), 2000);
                seen[d.data()[0] as usize] = true;
            }
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    running.stop();
    let c = stack.counters();
    assert_eq!((c[Counter::VxlanInPackets], c[Counter::RxNoPort]), (32, 0), "{}", c.render_nonzero());
}

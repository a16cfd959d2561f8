//! The stack on one end of an in-memory wire pair; the test plays the peer
//! on the other end with frames it builds itself.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use spate::dpdk::Memory;
use spate::wire::{MacAddr, arp, ethernet, ip_proto, ipv4, udp};
use spate::{Counter, LcoreCtx, PortSpec, Stack, StackConfig, UdpSocket};
use spate_testkit::wire_peer::{
    PEER_IP, PEER_MAC, SPATE_IP, SPATE_IP6, eth, frag_needed_icmp, ipv6_packet, udp_datagram_between, udp_frame,
};
use spate_testkit::{WirePeer, device_lock, rig, shared_eal, stack_config};

fn is_announcement(f: &[u8]) -> bool {
    let e = ethernet::Frame::new_unchecked(f);
    e.ethertype() == ethernet::ethertype::IPV6
        || (e.ethertype() == ethernet::ethertype::ARP && {
            let a = arp::Repr::parse(&arp::Packet::new_unchecked(&f[14..])).unwrap();
            a.sender_ip == a.target_ip
        })
}

/// A UDP datagram spate sent the peer over IPv4, both checksums verified:
/// (source port, destination port, UDP checksum, payload).
fn udp_to_peer(frame: &[u8], what: &str) -> (u16, u16, u16, Vec<u8>) {
    let e = ethernet::Frame::new_checked(frame).unwrap();
    let ip = ipv4::Packet::new_checked(e.payload()).unwrap();
    assert!(ip.verify_checksum(), "{what}: IPv4 header checksum");
    assert_eq!((ip.src(), ip.dst()), (SPATE_IP, PEER_IP), "{what}: addresses");
    let u = udp::Packet::new_checked(ip.payload()).unwrap();
    assert!(u.verify_checksum(&IpAddr::V4(SPATE_IP), &IpAddr::V4(PEER_IP)), "{what}: UDP checksum");
    (u.src_port(), u.dst_port(), u.checksum(), u.payload().to_vec())
}

/// A stack polling lcore 1 on `port` (announcing itself or not), with a
/// small pool whose in-use count each test brings back to zero.
fn wire_stack(port: PortSpec, announce: bool) -> Stack {
    Stack::new(StackConfig { mempool_size: 2047, idle_sleep_us: 50, announce, ..stack_config(port) }).unwrap()
}

#[test]
fn arp_udp_and_port_unreachable_over_a_wire_pair() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (mut peer, spate_port, _a) = WirePeer::new(1023);
    let stack = wire_stack(rig::spate_port(&spate_port), true);
    let spate_mac = stack.interfaces()[0].mac;
    let sock = UdpSocket::bind(&stack, "0.0.0.0:7").unwrap();
    let running = stack.spawn_polling().unwrap();

    // The gratuitous ARP comes first.
    let g = peer.recv_matching(|_| true);
    let ga = arp::Repr::parse(&arp::Packet::new_checked(&g[14..]).unwrap()).unwrap();
    assert_eq!((ga.sender_ip, ga.target_ip, ga.sender_mac), (SPATE_IP, SPATE_IP, spate_mac));

    let req = arp::Repr {
        operation: arp::Operation::Request,
        sender_mac: PEER_MAC,
        sender_ip: PEER_IP,
        target_mac: MacAddr::ZERO,
        target_ip: SPATE_IP,
    };
    let mut body = [0u8; 28];
    req.emit(&mut body);
    peer.send(&eth(MacAddr::BROADCAST, ethernet::ethertype::ARP, &body));
    let reply = peer.recv_matching(|f| !is_announcement(f));
    let r = arp::Repr::parse(&arp::Packet::new_checked(&reply[14..]).unwrap()).unwrap();
    assert_eq!(
        (r.operation, r.sender_mac, r.sender_ip, r.target_mac),
        (arp::Operation::Reply, spate_mac, SPATE_IP, PEER_MAC)
    );

    // UDP to port 7 reaches the socket; a thread echoes it back.
    peer.send(&udp_frame(spate_mac, false, 40000, 7, b"hello spate"));
    let mut buf = [0u8; 64];
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (n, from) = sock.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"hello spate");
    assert_eq!(from, SocketAddr::new(PEER_IP.into(), 40000));
    sock.send_to(&buf[..n], from).unwrap();
    let out = peer.recv_matching(|f| !is_announcement(f));
    let e = ethernet::Frame::new_checked(&out[..]).unwrap();
    assert_eq!((e.dst(), e.src()), (PEER_MAC, spate_mac));
    let ip = ipv4::Packet::new_checked(e.payload()).unwrap();
    assert_eq!((ip.src(), ip.dst()), (SPATE_IP, PEER_IP));
    let u = udp::Packet::new_checked(ip.payload()).unwrap();
    assert!(u.verify_checksum(&IpAddr::V4(SPATE_IP), &IpAddr::V4(PEER_IP)));
    assert_eq!((u.src_port(), u.dst_port(), u.payload()), (7, 40000, &b"hello spate"[..]));

    // A closed port: ICMP port unreachable.
    peer.send(&udp_frame(spate_mac, false, 40001, 9999, b"anyone?"));
    let icmp = peer.recv_matching(|f| f.len() > 23 && f[12..14] == [8, 0] && f[23] == ip_proto::ICMP);
    let ip = ipv4::Packet::new_checked(&icmp[14..]).unwrap();
    assert_eq!(ip.protocol(), ip_proto::ICMP);
    assert_eq!(&ip.payload()[..2], &[3, 3], "destination unreachable, port");

    running.stop();
    let c = stack.counters();
    assert_eq!(c[Counter::UdpInDatagrams], 1);
    assert_eq!(c[Counter::UdpNoPorts], 1);
    assert_eq!(c[Counter::UdpOutDatagrams], 1);
    assert_eq!(c[Counter::ArpInRequests], 1);
    assert_eq!(c.unaccounted_frames(), 0, "{}", c.render_nonzero());
    drop(sock);
    drop(peer);
    assert_eq!(stack.mempool().in_use(), 0);
}

/// A reader that does not keep up: the socket's receive buffer holds ten
/// datagrams, fifty arrive, and the forty refused are counted exactly (per
/// socket, in Udp and in Rx); the ten queued come out in order, and once
/// read there is room again.
#[test]
fn slow_reader_overflow_counts_drops_and_keeps_order() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (mut peer, spate_port, _a) = WirePeer::new(1023);
    let stack = wire_stack(rig::spate_port(&spate_port), false);
    let spate_mac = stack.interfaces()[0].mac;
    let truesize = stack.datagram_truesize();
    let sock = UdpSocket::builder(&stack).recv_buffer_size(10 * truesize).bind("0.0.0.0:9").unwrap();
    sock.set_nonblocking(true).unwrap();
    let running = stack.spawn_polling().unwrap();

    for seq in 0..50u32 {
        peer.send(&udp_frame(spate_mac, false, 40000, 9, &seq.to_be_bytes()));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let settled = || {
        let c = stack.counters();
        c[Counter::UdpInDatagrams] + c[Counter::UdpRcvbufErrors] == 50
    };
    while !settled() {
        assert!(std::time::Instant::now() < deadline, "{}", stack.counters().render_nonzero());
        std::thread::sleep(Duration::from_millis(5));
    }
    let c = stack.counters();
    assert_eq!(c[Counter::UdpInDatagrams], 10);
    assert_eq!(c[Counter::UdpRcvbufErrors], 40);
    assert_eq!(c[Counter::UdpInErrors], 40, "Linux counts a full buffer in InErrors too");
    assert_eq!(c[Counter::RxRcvbufFull], 40);
    assert_eq!(sock.rcvbuf_drops(), 40);

    let mut buf = [0u8; 16];
    let got: Vec<u32> = std::iter::from_fn(|| {
        let n = sock.recv(&mut buf).ok()?;
        Some(u32::from_be_bytes(buf[..n].try_into().unwrap()))
    })
    .collect();
    assert_eq!(got, (0..10).collect::<Vec<_>>(), "the first ten, in order");
    assert_eq!(sock.recv(&mut buf).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);

    // Read, so there is room: the next one is taken.
    sock.set_nonblocking(false).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    peer.send(&udp_frame(spate_mac, false, 40000, 9, &50u32.to_be_bytes()));
    let n = sock.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], &50u32.to_be_bytes());

    running.stop();
    assert_eq!(stack.counters().unaccounted_frames(), 0);
    drop(sock);
    drop(peer);
    assert_eq!(stack.mempool().in_use(), 0, "mbufs leaked");
}

/// An IPv6 datagram whose source is written as an IPv4-mapped address
/// (`::ffff:a.b.c.d`) is IPv6's, as Linux takes it (this guest's kernel
/// delivers one to an IPv6 socket and counts it in `Udp6InDatagrams`): its
/// delivery and its refusals are counted in the IPv6 counters, none in
/// IPv4's, and the reader sees the source as sent.
#[test]
fn an_ipv6_datagram_from_a_mapped_source_is_counted_as_ipv6() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (mut peer, spate_port, _a) = WirePeer::new(1023);
    let stack = wire_stack(rig::spate_port_dual(&spate_port), false);
    let spate_mac = stack.interfaces()[0].mac;
    let truesize = stack.datagram_truesize();
    let sock = UdpSocket::builder(&stack).recv_buffer_size(2 * truesize).bind("[::]:9").unwrap();
    sock.set_nonblocking(true).unwrap();
    let running = stack.spawn_polling().unwrap();

    let mapped: std::net::Ipv6Addr = "::ffff:198.18.0.9".parse().unwrap();
    for seq in 0..5u32 {
        let dg = udp_datagram_between(mapped.into(), SPATE_IP6.into(), 40000, 9, &seq.to_be_bytes());
        peer.send(&eth(spate_mac, ethernet::ethertype::IPV6, &ipv6_packet(mapped, SPATE_IP6, ip_proto::UDP, 64, &dg)));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let settled = || {
        let c = stack.counters();
        c[Counter::Udp6InDatagrams] + c[Counter::Udp6RcvbufErrors] == 5
    };
    while !settled() {
        assert!(Instant::now() < deadline, "{}", stack.counters().render_nonzero());
        std::thread::sleep(Duration::from_millis(5));
    }
    let c = stack.counters();
    assert_eq!(
        (c[Counter::Udp6InDatagrams], c[Counter::Udp6RcvbufErrors], c[Counter::Udp6InErrors]),
        (2, 3, 3),
        "{}",
        c.render_nonzero()
    );
    assert_eq!(
        (c[Counter::UdpInDatagrams], c[Counter::UdpRcvbufErrors], c[Counter::UdpInErrors], c[Counter::UdpMemErrors]),
        (0, 0, 0, 0),
        "nothing IPv4's: {}",
        c.render_nonzero()
    );
    assert_eq!(c[Counter::RxDelivered], 2);

    let mut buf = [0u8; 16];
    let (n, from) = sock.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from), (&0u32.to_be_bytes()[..], SocketAddr::from((mapped, 40000))));

    running.stop();
    assert_eq!(stack.counters().unaccounted_frames(), 0);
    drop(sock);
    drop(peer);
    assert_eq!(stack.mempool().in_use(), 0, "mbufs leaked");
}

/// A blocking send that finds its lcore's inbox full waits for room
/// asleep: until its timeout it costs next to no CPU (it used to spin on
/// `yield_now`, a whole CPU), and once the lcore drains the inbox it goes
/// on at once.
#[test]
fn a_blocking_send_on_a_full_inbox_sleeps_until_the_lcore_drains_it() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (peer, spate_port, _a) = WirePeer::new(1023);
    let stack = sending_stack(&spate_port, 50);
    let sock = UdpSocket::bind(&stack, "0.0.0.0:0").unwrap();
    // The lcore's callback holds it (so nothing drains the inbox) until
    // `hold` clears.
    let (hold, held) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicBool::new(false)));
    let (h, hd) = (hold.clone(), held.clone());
    let running = stack
        .spawn(move |_| {
            let (h, hd) = (h.clone(), hd.clone());
            move |_: &mut LcoreCtx<'_>| {
                hd.store(true, Ordering::SeqCst);
                let deadline = Instant::now() + Duration::from_secs(30);
                while h.load(Ordering::SeqCst) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        })
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !held.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the callback never ran");
        std::thread::sleep(Duration::from_millis(1));
    }
    let dst = SocketAddr::new(PEER_IP.into(), 9);
    sock.set_nonblocking(true).unwrap();
    let mut queued = 0;
    while sock.send_to(b"x", dst).is_ok() {
        queued += 1;
        assert!(queued <= 100_000, "the inbox never filled");
    }
    assert!(queued > 0);

    sock.set_nonblocking(false).unwrap();
    sock.set_write_timeout(Some(Duration::from_millis(300))).unwrap();
    let (cpu0, t0) = (spate::dpdk::lcore::thread_cpu_ns(), Instant::now());
    let err = sock.send_to(b"x", dst).unwrap_err();
    let cpu = spate::dpdk::lcore::thread_cpu_ns() - cpu0;
    assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
    assert!(t0.elapsed() >= Duration::from_millis(300), "gave up early: {:?}", t0.elapsed());
    assert!(cpu < 60_000_000, "{} ms of CPU to wait 300 ms", cpu / 1_000_000);

    sock.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    let h = hold.clone();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        h.store(false, Ordering::SeqCst);
    });
    let t1 = Instant::now();
    sock.send_to(b"x", dst).unwrap();
    assert!(t1.elapsed() < Duration::from_secs(10), "not woken by the drain: {:?}", t1.elapsed());
    releaser.join().unwrap();
    // Everything queued goes out (or is counted on a full wire ring).
    let deadline = Instant::now() + Duration::from_secs(20);
    while stack.counters()[Counter::UdpOutDatagrams] < queued + 1 {
        assert!(Instant::now() < deadline, "{}", stack.counters().render_nonzero());
        std::thread::sleep(Duration::from_millis(5));
    }
    running.stop();
    drop(sock);
    drop(peer);
    assert_eq!(stack.mempool().in_use(), 0, "mbufs leaked");
}

/// An IPv4 packet from the peer to spate.
/// A stack on lcore 1 on `spate_port` with the peer as a static
/// neighbour and room for a full inbox of sends (16,383 mbufs),
/// announcing nothing, sleeping `idle_sleep_us` between empty polls.
fn sending_stack(spate_port: &str, idle_sleep_us: u32) -> Stack {
    let port = PortSpec::new(spate_port).addr("198.18.0.2/24").unwrap().neighbor(PEER_IP.into(), PEER_MAC);
    let cfg = StackConfig {
        lcores: "1".into(),
        ports: vec![port],
        mempool_size: 16383,
        idle_sleep_us,
        stop_on_signal: false,
        announce: false,
        ..StackConfig::default()
    };
    Stack::new(cfg).unwrap()
}

/// Inside the lcore's callback a send goes to the lcore's own queue,
/// drained when the callback returns: once it is full, `poll_writable`
/// says Pending and wakes the task at once (so a task an `LcoreRuntime`
/// runs there tries again at the next turn, instead of looping on
/// `WouldBlock` in one turn forever), and at the next turn it is Ready.
#[test]
fn in_the_callback_a_full_queue_is_writable_again_at_the_next_turn() {
    use std::task::{Context, Poll, Wake, Waker};
    struct Count(std::sync::atomic::AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (peer, spate_port, _a) = WirePeer::new(1023);
    let stack = sending_stack(&spate_port, 0);
    let sock = Arc::new(UdpSocket::bind(&stack, "0.0.0.0:0").unwrap());
    sock.set_nonblocking(true).unwrap();
    // (sent before the queue refused, Pending then, woken, Ready at the next turn)
    let result = Arc::new(std::sync::Mutex::new(None));
    let (s, r) = (sock.clone(), result.clone());
    let running = stack
        .spawn(move |_| {
            let (s, r) = (s.clone(), r.clone());
            let (mut turn, mut first) = (0u32, None);
            let count = Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
            move |_: &mut LcoreCtx<'_>| {
                turn += 1;
                if turn > 2 || r.lock().unwrap().is_some() {
                    return;
                }
                let waker = Waker::from(count.clone());
                let mut cx = Context::from_waker(&waker);
                let dst = SocketAddr::new(PEER_IP.into(), 9);
                if turn == 1 {
                    let mut sent = 0;
                    while s.send_to(b"x", dst).is_ok() && sent < 100_000 {
                        sent += 1;
                    }
                    let pending = s.poll_writable(&mut cx).is_pending();
                    first = Some((sent, pending, count.0.load(Ordering::SeqCst)));
                } else {
                    let ready = matches!(s.poll_writable(&mut cx), Poll::Ready(Ok(())));
                    let (sent, pending, woken) = first.take().unwrap();
                    *r.lock().unwrap() = Some((sent, pending, woken, ready));
                }
            }
        })
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let got = loop {
        if let Some(got) = *result.lock().unwrap() {
            break got;
        }
        assert!(Instant::now() < deadline, "the callback never ran twice");
        std::thread::sleep(Duration::from_millis(1));
    };
    let (sent, pending, woken, ready) = got;
    assert!((1..100_000).contains(&sent), "the lcore's own queue took {sent} sends");
    assert!(pending && woken == 1, "a full queue: Pending ({pending}), the task woken at once ({woken})");
    assert!(ready, "writable at the next turn, after the drain");
    running.stop();
    drop(sock);
    drop(peer);
    assert_eq!(stack.mempool().in_use(), 0, "mbufs leaked");
}

fn ipv4_from_peer(dst_mac: MacAddr, protocol: u8, payload: &[u8]) -> Vec<u8> {
    eth(
        dst_mac,
        ethernet::ethertype::IPV4,
        &spate_testkit::wire_peer::ipv4_packet(PEER_IP, SPATE_IP, protocol, 9, 0, false, payload),
    )
}

/// A router's "fragmentation needed" (next-hop MTU 1200) quoting a UDP
/// datagram from spate's `src_port` to `dst`:9.
fn frag_needed(spate_mac: MacAddr, src_port: u16, dst: std::net::Ipv4Addr) -> Vec<u8> {
    ipv4_from_peer(spate_mac, ip_proto::ICMP, &frag_needed_icmp(src_port, dst, 1200))
}

/// A path MTU is believed only for a datagram a socket of spate's could
/// have sent: a "fragmentation needed" quoting a port no socket holds
/// changes nothing (it used to set the path MTU of any destination it
/// named, and fill the table), one quoting a bound socket's port does.
#[test]
fn path_mtu_is_learnt_only_for_what_a_socket_could_have_sent() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (mut peer, spate_port, _a) = WirePeer::new(1023);
    let stack = wire_stack(rig::spate_port(&spate_port), false);
    let spate_mac = stack.interfaces()[0].mac;
    let _sock = UdpSocket::bind(&stack, "0.0.0.0:5353").unwrap();
    let running = stack.spawn_polling().unwrap();
    let (forged, real) = ("203.0.113.9".parse().unwrap(), "203.0.113.10".parse().unwrap());
    peer.send(&frag_needed(spate_mac, 40000, forged));
    peer.send(&frag_needed(spate_mac, 5353, real));
    let deadline = Instant::now() + Duration::from_secs(10);
    while stack.counters()[Counter::PmtuLearnt] + stack.counters()[Counter::PmtuIgnored] < 2 {
        assert!(Instant::now() < deadline, "{}", stack.counters().render_nonzero());
        std::thread::sleep(Duration::from_millis(5));
    }
    running.stop();
    assert_eq!(stack.path_mtu(&IpAddr::V4(forged)), None, "a forged message changed the path MTU");
    assert_eq!(stack.path_mtu(&IpAddr::V4(real)), Some(1200));
    assert_eq!(stack.path_mtu_entries(), 1);
    let c = stack.counters();
    assert_eq!((c[Counter::PmtuLearnt], c[Counter::PmtuIgnored]), (1, 1));
}

/// Sockets whose readers stall cannot take the pool: what all receive
/// queues hold together stays under `udp_mem_bytes` (20 datagrams here,
/// against 8 sockets of 10 each), the rest is counted as Linux counts a
/// datagram past `udp_mem` (MemErrors and InErrors), and reading gives
/// the memory back. Before the cap, the sockets held 80 mbufs.
#[test]
fn stalled_readers_share_a_stack_wide_cap() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    // What a datagram is charged, from a stack of the same pool.
    let truesize = {
        let (_peer, port, _a) = WirePeer::new(1023);
        wire_stack(rig::spate_port(&port), false).datagram_truesize()
    };
    let (mut peer, spate_port, _a) = WirePeer::new(1023);
    let cfg = StackConfig {
        lcores: "1".into(),
        ports: vec![PortSpec::new(&spate_port).addr("198.18.0.2/24").unwrap()],
        mempool_size: 2047,
        idle_sleep_us: 50,
        stop_on_signal: false,
        announce: false,
        udp_mem_bytes: Some(20 * truesize),
        udp_rmem_min: 0,
        ..StackConfig::default()
    };
    let stack = Stack::new(cfg).unwrap();
    let spate_mac = stack.interfaces()[0].mac;
    let sockets: Vec<UdpSocket> = (0..8u16)
        .map(|i| UdpSocket::builder(&stack).recv_buffer_size(10 * truesize).bind(("0.0.0.0", 6000 + i)).unwrap())
        .collect();
    let running = stack.spawn_polling().unwrap();
    for i in 0..8u16 {
        for seq in 0..10u8 {
            peer.send(&udp_frame(spate_mac, false, 40000, 6000 + i, &[seq; 8]));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let settled = || {
        let c = stack.counters();
        c[Counter::UdpInDatagrams] + c[Counter::UdpMemErrors] + c[Counter::UdpRcvbufErrors] == 80
    };
    while !settled() {
        assert!(Instant::now() < deadline, "{}", stack.counters().render_nonzero());
        std::thread::sleep(Duration::from_millis(5));
    }
    let c = stack.counters();
    let (held, cap) = stack.receive_memory();
    assert_eq!(cap, 20 * truesize);
    assert!(held <= cap, "{held} bytes held, cap {cap}");
    assert_eq!(c[Counter::UdpInDatagrams], 20, "{}", c.render_nonzero());
    assert_eq!((c[Counter::UdpMemErrors], c[Counter::RxMemFull], c[Counter::UdpInErrors]), (60, 60, 60));
    assert_eq!(c[Counter::UdpRcvbufErrors], 0, "no socket's own buffer was full");
    assert!(stack.mempool().in_use() <= 20 + 32, "{} mbufs in use", stack.mempool().in_use());
    sockets.iter().for_each(|s| s.set_nonblocking(true).unwrap());
    let mut buf = [0u8; 16];
    let read: usize = sockets.iter().map(|s| std::iter::from_fn(|| s.recv(&mut buf).ok()).count()).sum();
    assert_eq!(read, 20);
    assert_eq!(stack.receive_memory().0, 0, "reading gave it all back");
    running.stop();
    drop(sockets);
    drop(peer);
    assert_eq!(stack.mempool().in_use(), 0, "mbufs leaked");
}

/// Received datagrams sent back as send buffers: unchanged to their
/// sender, the reply keeps the request's UDP checksum (nothing summed);
/// changed, shortened or sent elsewhere, its checksum is computed anew.
/// Every reply's checksum must verify.
#[test]
fn replies_in_the_requests_mbuf_carry_correct_checksums() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (mut peer, spate_port, _a) = WirePeer::new(1023);
    let port = PortSpec::new(&spate_port).addr("198.18.0.2/24").unwrap().neighbor(PEER_IP.into(), PEER_MAC);
    let stack = wire_stack(port, true);
    let spate_mac = stack.interfaces()[0].mac;
    let sock = UdpSocket::bind(&stack, "0.0.0.0:7").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let running = stack.spawn_polling().unwrap();
    let mut batch = spate::DatagramBatch::with_capacity(4);
    // (what the application does to the payload, where it sends the reply,
    // the payload and destination port expected on the wire)
    type Change = fn(&mut spate::SendBuf);
    let cases: [(&str, Change, u16, &[u8], u16); 4] = [
        ("unchanged", |_| {}, 40000, b"hello spate", 40000),
        ("changed", |b| b[0] = b'j', 40000, b"jello spate", 40000),
        ("shortened", |b| b.truncate(5), 40000, b"hello", 40000),
        ("elsewhere", |_| {}, 40009, b"hello spate", 40009),
    ];
    for (what, change, to_port, want, want_port) in cases {
        let request = udp_frame(spate_mac, false, 40000, 7, b"hello spate");
        let request_sum = u16::from_be_bytes([request[14 + 20 + 6], request[14 + 20 + 7]]);
        peer.send(&request);
        assert_eq!(sock.recv_batch(&mut batch, 1).unwrap(), 1, "{what}");
        let d = batch.drain().next().unwrap();
        let mut buf = d.into_send_buf();
        change(&mut buf);
        sock.send_buf_to(buf, SocketAddr::new(PEER_IP.into(), to_port)).unwrap();
        let (src_port, dst_port, sum, payload) = udp_to_peer(&peer.recv_matching(|f| !is_announcement(f)), what);
        assert_eq!((src_port, dst_port, &payload[..]), (7, want_port, want), "{what}");
        if what == "unchanged" {
            assert_eq!(sum, request_sum, "the request's checksum, kept");
        }
    }
    // The same four as one batch send: all of them go, in order, each
    // with its own checksum.
    let mut replies = Vec::new();
    for (what, change, to_port, _, _) in cases {
        peer.send(&udp_frame(spate_mac, false, 40000, 7, b"hello spate"));
        assert_eq!(sock.recv_batch(&mut batch, 1).unwrap(), 1, "{what}");
        let mut buf = batch.drain().next().unwrap().into_send_buf();
        change(&mut buf);
        replies.push((buf, SocketAddr::new(PEER_IP.into(), to_port)));
    }
    assert_eq!(sock.send_batch_to(replies).unwrap(), 4);
    for (what, _, _, want, want_port) in cases {
        let what = format!("batch {what}");
        let (src_port, dst_port, _, payload) = udp_to_peer(&peer.recv_matching(|f| !is_announcement(f)), &what);
        assert_eq!((src_port, dst_port, &payload[..]), (7, want_port, want), "{what}");
    }
    // A bad destination is refused on its own; the datagrams around it go.
    let bufs = (0..3).map(|i| {
        let mut b = sock.alloc_send_buf(2).unwrap();
        b.copy_from_slice(b"ok");
        (b, SocketAddr::new(PEER_IP.into(), if i == 1 { 0 } else { 40000 }))
    });
    assert_eq!(sock.send_batch_to(bufs).unwrap(), 2);
    for _ in 0..2 {
        let (_, _, _, payload) = udp_to_peer(&peer.recv_matching(|f| !is_announcement(f)), "around the bad one");
        assert_eq!(payload, b"ok");
    }
    let none = [(sock.alloc_send_buf(2).unwrap(), SocketAddr::new(PEER_IP.into(), 0))];
    assert_eq!(sock.send_batch_to(none).unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
    running.stop();
    let c = stack.counters();
    assert_eq!(c[Counter::UdpOutDatagrams], 10);
    assert_eq!(c.unaccounted_frames(), 0, "{}", c.render_nonzero());
    drop(batch);
    drop(sock);
    drop(peer);
    assert_eq!(stack.mempool().in_use(), 0);
}

/// The receive fast path (IPv4 and IPv6 UDP to a bound socket) against the
/// full one: the same frames, good and bad, sent once with the GRO stage
/// off (the fast path takes what it can) and once with it on (every frame
/// goes the whole way), must deliver the same datagrams and move every
/// counter outside the GRO stage's own by the same amounts.
#[test]
fn the_fast_path_delivers_and_counts_as_the_full_path() {
    use spate_testkit::wire_peer::PEER_IP6;
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (mut peer, spate_port, _a) = WirePeer::new(1023);
    let port = PortSpec::new(&spate_port)
        .addr("198.18.0.2/24")
        .unwrap()
        .addr("fd00::2/64")
        .unwrap()
        .neighbor(PEER_IP.into(), PEER_MAC)
        .neighbor(PEER_IP6.into(), PEER_MAC);
    let stack = wire_stack(port, false);
    let mac = stack.interfaces()[0].mac;
    let sock = UdpSocket::bind(&stack, "[::]:7").unwrap();
    sock.set_nonblocking(true).unwrap();
    let running = stack.spawn_polling().unwrap();

    let udp_sum_at = |f: &[u8]| if f[12..14] == [0x08, 0x00] { 14 + 20 + 6 } else { 14 + 40 + 6 };
    let mut frames: Vec<(String, Vec<u8>)> = Vec::new();
    for v6 in [false, true] {
        let fam = if v6 { "v6" } else { "v4" };
        let good = udp_frame(mac, v6, 40000, 7, format!("good {fam}").as_bytes());
        frames.push((format!("{fam} good"), good.clone()));
        let mut padded = good.clone();
        padded.extend_from_slice(&[0xee; 10]);
        frames.push((format!("{fam} padded"), padded));
        let mut bad = good.clone();
        *bad.last_mut().unwrap() ^= 0x55;
        frames.push((format!("{fam} bad checksum"), bad));
        let mut zero = good.clone();
        let at = udp_sum_at(&zero);
        zero[at..at + 2].copy_from_slice(&[0, 0]);
        frames.push((format!("{fam} zero checksum"), zero));
        frames.push((format!("{fam} closed port"), udp_frame(mac, v6, 40000, 9, b"nobody")));
        let mut short_ip = good.clone();
        short_ip.pop();
        frames.push((format!("{fam} cut short"), short_ip));
    }
    // IPv4 with an options word (IHL 6), checksums redone.
    let mut opts = udp_frame(mac, false, 40001, 7, b"options");
    opts.splice(34..34, [1u8, 1, 1, 0]);
    opts[14] = 0x46;
    let total = u16::from_be_bytes([opts[16], opts[17]]) + 4;
    opts[16..18].copy_from_slice(&total.to_be_bytes());
    opts[24..26].copy_from_slice(&[0, 0]);
    let c = !fold(&opts[14..38]);
    opts[24..26].copy_from_slice(&c.to_be_bytes());
    frames.push(("v4 options".into(), opts));
    // IPv6 with a hop-by-hop header (PadN): the UDP checksum is unchanged.
    let mut hbh = udp_frame(mac, true, 40001, 7, b"hop by hop");
    hbh.splice(54..54, [ip_proto::UDP, 0, 1, 4, 0, 0, 0, 0]);
    hbh[20] = 0;
    let plen = u16::from_be_bytes([hbh[18], hbh[19]]) + 8;
    hbh[18..20].copy_from_slice(&plen.to_be_bytes());
    frames.push(("v6 hop-by-hop".into(), hbh));
    // IPv6 to all-nodes, and from a multicast source.
    let mut all_nodes = udp_frame(mac, true, 40002, 7, b"all nodes");
    all_nodes[38..54].copy_from_slice(&"ff02::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
    frames.push(("v6 to all-nodes".into(), all_nodes));
    let mut from_group = udp_frame(mac, true, 40003, 7, b"from a group");
    from_group[22..38].copy_from_slice(&"ff02::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
    frames.push(("v6 from a group".into(), from_group));

    let settle = |stack: &Stack| {
        let loops = stack.lcore_load(0).1;
        let t = std::time::Instant::now();
        while stack.lcore_load(0).1 < loops + 2 && t.elapsed() < Duration::from_secs(2) {
            std::thread::yield_now();
        }
    };
    let round = |peer: &mut WirePeer| {
        let before = stack.counters();
        for (_, f) in &frames {
            peer.send(f);
        }
        let t = std::time::Instant::now();
        while stack.counters().delta(&before)[Counter::RxFrames] < frames.len() as u64
            && t.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        settle(&stack);
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = sock.recv_from(&mut buf) {
            got.push((from, buf[..n].to_vec()));
        }
        (stack.counters().delta(&before), got)
    };
    let (fast, fast_got) = round(&mut peer);
    let gro = UdpSocket::bind(&stack, "0.0.0.0:4789").unwrap();
    gro.set_gro(true).unwrap();
    let (full, full_got) = round(&mut peer);
    // The IPv6 socket's batch send to an IPv4-mapped peer and to an IPv6
    // one: IPv4 and IPv6 frames, checksums good.
    let to = |ip: IpAddr| {
        let mut b = sock.alloc_send_buf(5).unwrap();
        b.copy_from_slice(b"reply");
        (b, SocketAddr::new(ip, 40000))
    };
    let mapped = IpAddr::V6(PEER_IP.to_ipv6_mapped());
    assert_eq!(sock.send_batch_to([to(mapped), to(PEER_IP6.into())]).unwrap(), 2);
    let v4 = peer.recv_matching(|f| f[12..14] == [8, 0] && f[23] == ip_proto::UDP);
    let (src_port, dst_port, _, payload) = udp_to_peer(&v4, "to the IPv4-mapped peer");
    assert_eq!((src_port, dst_port, &payload[..]), (7, 40000, &b"reply"[..]));
    let v6 = peer.recv_matching(|f| f[12..14] == [0x86, 0xdd] && f[20] == ip_proto::UDP);
    let u = udp::Packet::new_checked(&v6[54..]).unwrap();
    assert!(u.verify_checksum(&spate_testkit::wire_peer::SPATE_IP6.into(), &PEER_IP6.into()));
    assert_eq!(u.payload(), b"reply");
    running.stop();

    let names: Vec<&str> = frames.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(fast_got, full_got, "the datagrams delivered, for {names:?}");
    assert!(fast_got.len() >= 4, "the good ones came through: {fast_got:?}");
    for want in [&b"good v4"[..], b"good v6"] {
        assert!(fast_got.iter().any(|(_, p)| p == want), "{want:?} came through: {fast_got:?}");
    }
    for (c, v) in full.iter() {
        if c.group() == "Gro" {
            continue;
        }
        assert_eq!(fast[c], v, "{}.{}: fast path {} vs full path {v}", c.group(), c.name(), fast[c]);
    }
    assert!(full[Counter::GroLookups] > 0, "the second round went through the GRO stage");
    assert_eq!(full.unaccounted_frames(), 0, "{}", full.render_nonzero());
    drop(gro);
    drop(sock);
    drop(peer);
    assert_eq!(stack.mempool().in_use(), 0);
}

/// The folded one's-complement sum of `b` (even length).
fn fold(b: &[u8]) -> u16 {
    let mut s: u32 = b.chunks(2).map(|w| u16::from_be_bytes([w[0], w[1]]) as u32).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// The run-to-completion read (`LcoreCtx::recv_staged`) takes the burst's
/// datagrams where the lcore staged them: twenty that arrive in one burst
/// at a socket whose receive buffer holds one are all read, none refused
/// (through the queue nineteen would be). A socket whose queue holds
/// datagrams is passed over until they are read, so the order holds when
/// a callback reads both ways; every datagram is counted once; what a
/// callback does not read reaches a thread that reads the socket; no mbuf
/// is left.
#[test]
fn the_callback_takes_staged_datagrams_in_order_and_leaves_the_rest_queued() {
    use spate::DatagramBatch;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicU8;

    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (mut peer, spate_port, _a) = WirePeer::new(1023);
    let stack = wire_stack(rig::spate_port(&spate_port), false);
    let spate_mac = stack.interfaces()[0].mac;
    let truesize = stack.datagram_truesize();
    let sock = Arc::new(UdpSocket::builder(&stack).recv_buffer_size(truesize).bind("0.0.0.0:9").unwrap());
    sock.set_nonblocking(true).unwrap();
    let send = |peer: &mut WirePeer, seqs: std::ops::Range<u32>| {
        for seq in seqs {
            peer.send(&udp_frame(spate_mac, false, 40000, 9, &seq.to_be_bytes()));
        }
    };
    // In the ring before the lcore first polls: one burst.
    send(&mut peer, 0..20);

    // 0: the callback reads nothing; 1: only what is staged; 2: what is
    // staged, then the queue.
    let mode = Arc::new(AtomicU8::new(1));
    let got: Arc<Mutex<Vec<u32>>> = Arc::default();
    let (s, m, g) = (sock.clone(), mode.clone(), got.clone());
    // Set when a second `recv_staged` in one iteration lent a share (its
    // length + 1).
    let lent_twice = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let t = lent_twice.clone();
    let seq = |d: &spate::Datagram| u32::from_be_bytes(d.data()[..4].try_into().unwrap());
    let running = stack
        .spawn(move |_| {
            let (s, m, g, twice) = (s.clone(), m.clone(), g.clone(), t.clone());
            let mut batch = DatagramBatch::with_capacity(64);
            move |ctx: &mut LcoreCtx<'_>| {
                let mode = m.load(Ordering::Relaxed);
                if mode == 0 {
                    return;
                }
                let mut g = g.lock().unwrap();
                // Mode 1 moves them into a batch, mode 2 drains them.
                ctx.recv_staged(|id, staged| {
                    assert_eq!(id, s.id());
                    match mode {
                        1 => staged.move_to(&mut batch),
                        _ => g.extend(staged.drain().map(|d| seq(&d))),
                    }
                });
                // Taken whole: a second call lends nothing more.
                ctx.recv_staged(|_, staged| twice.store(staged.len() as u32 + 1, Ordering::Relaxed));
                g.extend(batch.drain().map(|d| seq(&d)));
                if mode == 2 {
                    while s.recv_batch(&mut batch, 64).is_ok() {
                        g.extend(batch.drain().map(|d| seq(&d)));
                    }
                }
            }
        })
        .unwrap();
    let wait_for = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.lock().unwrap().len() < n {
            assert!(Instant::now() < deadline, "{:?}\n{}", got.lock().unwrap(), stack.counters().render_nonzero());
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    wait_for(20);
    assert_eq!(*got.lock().unwrap(), (0..20).collect::<Vec<_>>());
    assert_eq!(lent_twice.load(Ordering::Relaxed), 0, "a share taken whole was lent again (its length + 1)");
    assert_eq!(stack.counters()[Counter::UdpRcvbufErrors], 0, "{}", stack.counters().render_nonzero());

    // Queued while the callback reads nothing; then, while they wait, a
    // callback reading only what is staged is handed none of the newer
    // ones; read both ways while more arrive, the queued ones come first.
    sock.set_recv_buffer_size(64 * truesize).unwrap();
    mode.store(0, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(20));
    let counted = |n: u64| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while stack.counters()[Counter::UdpInDatagrams] < n {
            assert!(Instant::now() < deadline, "{}", stack.counters().render_nonzero());
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    send(&mut peer, 20..40);
    counted(40);
    mode.store(1, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(20));
    send(&mut peer, 40..44);
    counted(44);
    assert_eq!(*got.lock().unwrap(), (0..20).collect::<Vec<_>>(), "nothing staged taken past the queued");
    mode.store(2, Ordering::Relaxed);
    for chunk in 1..10 {
        send(&mut peer, 40 + 4 * chunk..44 + 4 * chunk);
    }
    wait_for(80);
    assert_eq!(*got.lock().unwrap(), (0..80).collect::<Vec<_>>());

    // A callback that does not read: a thread finds them queued.
    mode.store(0, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(20));
    send(&mut peer, 80..90);
    sock.set_nonblocking(false).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 16];
    let thread: Vec<u32> = (80..90)
        .map(|_| {
            let n = sock.recv(&mut buf).unwrap();
            u32::from_be_bytes(buf[..n].try_into().unwrap())
        })
        .collect();
    assert_eq!(thread, (80..90).collect::<Vec<_>>());

    running.stop();
    let c = stack.counters();
    assert_eq!((c[Counter::UdpInDatagrams], c[Counter::RxDelivered]), (90, 90), "{}", c.render_nonzero());
    assert_eq!(c[Counter::UdpRcvbufErrors], 0);
    assert_eq!(c.unaccounted_frames(), 0, "{}", c.render_nonzero());
    drop(sock);
    drop(peer);
    assert_eq!(stack.mempool().in_use(), 0, "mbufs leaked");
}

/// An ARP packet from the peer's side, in a frame to `dst`.
fn arp_from_peer(dst: MacAddr, operation: arp::Operation, sender_mac: MacAddr, target: (MacAddr, Ipv4Addr)) -> Vec<u8> {
    let repr = arp::Repr { operation, sender_mac, sender_ip: PEER_IP, target_mac: target.0, target_ip: target.1 };
    let mut body = [0u8; arp::PACKET_LEN];
    repr.emit(&mut body);
    eth(dst, ethernet::ethertype::ARP, &body)
}

/// A run-to-completion echo's replies go to the neighbour's MAC as the
/// neighbour table has it at the time: the lcore lets its callback's
/// sends finish the frames to a neighbour it found in its memo (the
/// Ethernet header written in the send call), and a MAC the neighbour
/// announces anew reaches the very next reply, before and after the
/// lcore has looked it up again; every datagram counted once, no mbuf
/// left.
#[test]
fn the_callbacks_replies_follow_the_neighbours_mac() {
    const NEW_MAC: MacAddr = MacAddr([0x02, 0x00, 0x00, 0x00, 0x00, 0x99]);
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (mut peer, spate_port, _a) = WirePeer::new(1023);
    let stack = wire_stack(rig::spate_port(&spate_port), false);
    let spate_mac = stack.interfaces()[0].mac;
    let sock = Arc::new(UdpSocket::bind(&stack, "0.0.0.0:7").unwrap());
    let s = sock.clone();
    let running = stack
        .spawn(move |_| {
            let s = s.clone();
            move |ctx: &mut LcoreCtx<'_>| {
                ctx.recv_staged(|_, staged| {
                    let replies = staged.drain().map(|d| {
                        let to = d.src();
                        (d.into_send_buf(), to)
                    });
                    assert!(s.send_batch_to(replies).is_ok());
                });
            }
        })
        .unwrap();
    // One request at a time, so the lcore runs many loop iterations; the
    // reply's destination MAC. ARP requests from spate are answered with
    // `answer` when given, else left unanswered.
    let echo = |peer: &mut WirePeer, seq: u32, answer: Option<MacAddr>| -> MacAddr {
        peer.send(&udp_frame(spate_mac, false, 40000, 7, &seq.to_be_bytes()));
        loop {
            let f = peer.recv_matching(|_| true);
            let e = ethernet::Frame::new_checked(&f[..]).unwrap();
            if e.ethertype() == ethernet::ethertype::ARP {
                let req = arp::Repr::parse(&arp::Packet::new_checked(e.payload()).unwrap()).unwrap();
                assert_eq!((req.operation, req.target_ip), (arp::Operation::Request, PEER_IP));
                if let Some(mac) = answer {
                    let to = (spate_mac, SPATE_IP);
                    peer.send(&arp_from_peer(spate_mac, arp::Operation::Reply, mac, to));
                }
                continue;
            }
            let (src_port, dst_port, _, payload) = udp_to_peer(&f, &format!("reply {seq}"));
            assert_eq!((src_port, dst_port, &payload[..]), (7, 40000, &seq.to_be_bytes()[..]));
            assert_eq!(e.src(), spate_mac);
            return e.dst();
        }
    };
    for seq in 0..40 {
        assert_eq!(echo(&mut peer, seq, Some(PEER_MAC)), PEER_MAC, "reply {seq}");
    }
    // The peer announces a new MAC; once spate has heard it, no reply
    // goes to the old one, while the entry waits for confirmation (the
    // probes unanswered) and after the peer confirms it.
    let arp_in = stack.counters()[Counter::RxArp];
    let announce = (MacAddr::ZERO, PEER_IP);
    peer.send(&arp_from_peer(MacAddr::BROADCAST, arp::Operation::Request, NEW_MAC, announce));
    let deadline = Instant::now() + Duration::from_secs(5);
    while stack.counters()[Counter::RxArp] == arp_in {
        assert!(Instant::now() < deadline, "{}", stack.counters().render_nonzero());
        std::thread::sleep(Duration::from_millis(1));
    }
    for seq in 40..60 {
        assert_eq!(echo(&mut peer, seq, None), NEW_MAC, "reply {seq}, the entry stale");
    }
    for seq in 60..100 {
        assert_eq!(echo(&mut peer, seq, Some(NEW_MAC)), NEW_MAC, "reply {seq}, the entry confirmed");
    }
    running.stop();
    let c = stack.counters();
    assert_eq!((c[Counter::UdpInDatagrams], c[Counter::UdpOutDatagrams]), (100, 100), "{}", c.render_nonzero());
    assert_eq!(c[Counter::IpOutRequests], 100);
    assert_eq!(c.unaccounted_frames(), 0, "{}", c.render_nonzero());
    drop(sock);
    drop(peer);
    assert_eq!(stack.mempool().in_use(), 0, "mbufs leaked");
}

/// `send_replies` answers each received datagram's sender, from the
/// request's headers alone: an IPv4 sender (its request with a UDP
/// checksum, or without one) and an IPv6 sender of a dual-stack socket,
/// the payload kept or changed, each reply's checksum right; a buffer not
/// made from a received datagram fails on its own (EDESTADDRREQ) and the
/// others go; a batch of only such buffers is refused with that error.
#[test]
fn send_replies_answers_each_sender() {
    use spate_testkit::wire_peer::{PEER_IP6, SPATE_IP6};
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (mut peer, spate_port, _a) = WirePeer::new(1023);
    let port = PortSpec::new(&spate_port)
        .addr("198.18.0.2/24")
        .unwrap()
        .addr("fd00::2/64")
        .unwrap()
        .neighbor(PEER_IP.into(), PEER_MAC)
        .neighbor(PEER_IP6.into(), PEER_MAC);
    let stack = wire_stack(port, false);
    let spate_mac = stack.interfaces()[0].mac;
    let sock = UdpSocket::bind(&stack, "[::]:7").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let running = stack.spawn_polling().unwrap();
    let mut no_checksum = udp_frame(spate_mac, false, 40001, 7, b"no checksum");
    no_checksum[14 + 20 + 6..14 + 20 + 8].copy_from_slice(&[0, 0]);
    let requests = [
        udp_frame(spate_mac, false, 40000, 7, b"hello v4"),
        no_checksum,
        udp_frame(spate_mac, true, 40002, 7, b"hello v6"),
        udp_frame(spate_mac, false, 40003, 7, b"hello spate"),
    ];
    for r in &requests {
        peer.send(r);
    }
    let mut batch = spate::DatagramBatch::with_capacity(4);
    let mut got = 0;
    while got < requests.len() {
        got += sock.recv_batch(&mut batch, 4 - got).unwrap();
    }
    let mut bufs: Vec<_> = batch.drain().map(|d| d.into_send_buf()).collect();
    bufs[3][0] = b'j';
    let mut fresh = sock.alloc_send_buf(2).unwrap();
    fresh.copy_from_slice(b"no");
    bufs.insert(2, fresh);
    assert_eq!(sock.send_replies(bufs).unwrap(), 4, "all but the fresh buffer");
    // In the order sent, the fresh buffer left out.
    let udp = |f: &[u8]| f.len() > 23 && (f[12..14] == [8, 0] && f[23] == ip_proto::UDP || f[20] == ip_proto::UDP);
    for (port, want) in [(40000u16, &b"hello v4"[..]), (40001, b"no checksum")] {
        let (src_port, dst_port, sum, payload) = udp_to_peer(&peer.recv_matching(udp), &format!("reply to {port}"));
        assert_eq!((src_port, dst_port, &payload[..]), (7, port, want));
        assert_ne!(sum, 0, "a checksum, also for a request without one");
    }
    let v6 = peer.recv_matching(udp);
    assert_eq!(v6[12..14], [0x86, 0xdd], "the reply to the IPv6 sender");
    let u = udp::Packet::new_checked(&v6[54..]).unwrap();
    assert!(u.verify_checksum(&SPATE_IP6.into(), &PEER_IP6.into()));
    assert_eq!((u.src_port(), u.dst_port(), u.payload()), (7, 40002, &b"hello v6"[..]));
    let (src_port, dst_port, _, payload) = udp_to_peer(&peer.recv_matching(udp), "the changed reply");
    assert_eq!((src_port, dst_port, &payload[..]), (7, 40003, &b"jello spate"[..]));
    let only_fresh = [sock.alloc_send_buf(1).unwrap()];
    let err = sock.send_replies(only_fresh).unwrap_err();
    let want = std::io::Error::from_raw_os_error(libc::EDESTADDRREQ);
    assert!(err.kind() == want.kind() && err.to_string().contains(&want.to_string()), "{err}");
    running.stop();
    let c = stack.counters();
    assert_eq!((c[Counter::UdpOutDatagrams], c[Counter::Udp6OutDatagrams]), (3, 1), "{}", c.render_nonzero());
    assert_eq!(c.unaccounted_frames(), 0, "{}", c.render_nonzero());
    drop(batch);
    drop(sock);
    drop(peer);
    assert_eq!(stack.mempool().in_use(), 0, "mbufs leaked");
}

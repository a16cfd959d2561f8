//! The stack on one end of an in-memory wire pair; the test plays the peer
//! on the other end with frames it builds itself.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spate_dpdk::{Burst, Memory, Mempool, MempoolConfig, Port, PortConfig, RxQueue, TxQueue};
use spate_stack::wire::{MacAddr, arp, ethernet, ip_proto, ipv4, udp};
use spate_stack::{Counter, PortSpec, Stack, StackConfig, UdpSocket};
use spate_testkit::{device_lock, shared_eal, unique};

const PEER_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x01]);
const PEER_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const SPATE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

struct Peer {
    rx: RxQueue,
    tx: TxQueue,
    pool: Arc<Mempool>,
    _port: Port,
}

impl Peer {
    fn send(&mut self, frame: &[u8]) {
        let mut m = self.pool.try_alloc().unwrap();
        m.append(frame.len()).unwrap().copy_from_slice(frame);
        let mut b: Burst = Burst::new();
        b.push(m).unwrap();
        assert_eq!(self.tx.tx_burst(&mut b), 1);
    }

    /// The next frame spate sends, skipping ones `skip` rejects.
    fn recv(&mut self, skip: impl Fn(&[u8]) -> bool) -> Vec<u8> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut b: Burst = Burst::new();
        loop {
            assert!(Instant::now() < deadline, "spate sent nothing");
            if self.rx.rx_burst(&mut b) > 0 {
                for m in b.drain() {
                    if !skip(m.data()) {
                        return m.data().to_vec();
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn eth(dst: MacAddr, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let r = ethernet::Repr {
        src: PEER_MAC,
        dst,
        ethertype,
        vlan: None,
    };
    let mut f = vec![0u8; 14];
    r.emit(&mut f);
    f.extend_from_slice(payload);
    f
}

fn udp4(dst_mac: MacAddr, src_port: u16, dst_port: u16, payload: &[u8]) -> Vec<u8> {
    let mut dg = vec![0u8; 8];
    dg.extend_from_slice(payload);
    let u = udp::Repr {
        src_port,
        dst_port,
        payload_len: payload.len() as u16,
    };
    u.emit_with_checksum(&mut dg, &IpAddr::V4(PEER_IP), &IpAddr::V4(SPATE_IP));
    let ip = ipv4::Repr {
        src: PEER_IP,
        dst: SPATE_IP,
        protocol: ip_proto::UDP,
        payload_len: dg.len() as u16,
        ttl: 64,
        tos: 0,
        ident: 1,
        dont_frag: true,
        more_frags: false,
        frag_offset: 0,
    };
    let mut pkt = vec![0u8; 20];
    ip.emit(&mut pkt, false);
    pkt.extend_from_slice(&dg);
    eth(dst_mac, ethernet::ethertype::IPV4, &pkt)
}

fn is_gratuitous_or_nd(f: &[u8]) -> bool {
    let e = ethernet::Frame::new_unchecked(f);
    e.ethertype() == ethernet::ethertype::IPV6
        || (e.ethertype() == ethernet::ethertype::ARP && {
            let a = arp::Repr::parse(&arp::Packet::new_unchecked(&f[14..])).unwrap();
            a.sender_ip == a.target_ip
        })
}

#[test]
fn arp_and_udp_echo_over_a_wire_pair() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (a, mut b) = Port::wire_pair(&unique("s")).unwrap();
    let peer_pool = Arc::new(Mempool::new(&MempoolConfig::new(&unique("peer"), 1023)).unwrap());
    b.configure(&PortConfig::default(), peer_pool.clone())
        .unwrap();
    b.start().unwrap();
    let mut peer = Peer {
        rx: b.rx_queue(0).unwrap(),
        tx: b.tx_queue(0).unwrap(),
        pool: peer_pool,
        _port: b,
    };

    let cfg = StackConfig {
        lcores: "1".into(),
        ports: vec![PortSpec::new(a.name()).addr("198.18.0.2/24").unwrap()],
        mempool_size: 2047,
        idle_sleep_us: 50,
        stop_on_signal: false,
        ..StackConfig::default()
    };
    let stack = Stack::new(cfg).unwrap();
    let spate_mac = stack.interfaces()[0].mac;
    let sock = UdpSocket::bind(&stack, "0.0.0.0:7").unwrap();
    let running = stack.spawn_polling().unwrap();

    // The gratuitous ARP comes first.
    let g = peer.recv(|_| false);
    let ga = arp::Repr::parse(&arp::Packet::new_checked(&g[14..]).unwrap()).unwrap();
    assert_eq!(
        (ga.sender_ip, ga.target_ip, ga.sender_mac),
        (SPATE_IP, SPATE_IP, spate_mac)
    );

    // ARP: who has 198.18.0.2?
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
    let reply = peer.recv(is_gratuitous_or_nd);
    let r = arp::Repr::parse(&arp::Packet::new_checked(&reply[14..]).unwrap()).unwrap();
    assert_eq!(
        (r.operation, r.sender_mac, r.sender_ip, r.target_mac),
        (arp::Operation::Reply, spate_mac, SPATE_IP, PEER_MAC)
    );

    // UDP to port 7 reaches the socket; a thread echoes it back.
    peer.send(&udp4(spate_mac, 40000, 7, b"hello spate"));
    let mut buf = [0u8; 64];
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (n, from) = sock.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"hello spate");
    assert_eq!(from, SocketAddr::new(PEER_IP.into(), 40000));
    sock.send_to(&buf[..n], from).unwrap();
    let out = peer.recv(is_gratuitous_or_nd);
    let e = ethernet::Frame::new_checked(&out[..]).unwrap();
    assert_eq!((e.dst(), e.src()), (PEER_MAC, spate_mac));
    let ip = ipv4::Packet::new_checked(e.payload()).unwrap();
    assert_eq!((ip.src(), ip.dst()), (SPATE_IP, PEER_IP));
    let u = udp::Packet::new_checked(ip.payload()).unwrap();
    assert!(u.verify_checksum(&IpAddr::V4(SPATE_IP), &IpAddr::V4(PEER_IP)));
    assert_eq!(
        (u.src_port(), u.dst_port(), u.payload()),
        (7, 40000, &b"hello spate"[..])
    );

    // A closed port: ICMP port unreachable.
    peer.send(&udp4(spate_mac, 40001, 9999, b"anyone?"));
    let icmp = peer.recv(is_gratuitous_or_nd);
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

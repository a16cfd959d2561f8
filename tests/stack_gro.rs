//! UDP GRO and the GRO stage's registry, over an in-memory wire pair.
//!
//! Every generated burst (up to 32 frames: three flows, payloads of 0 to
//! 300 bytes, bad checksums, ARP and unknown EtherTypes in between) goes to
//! spate twice in one `tx_burst` each: to a socket with UDP GRO on, then to
//! a plain one. The GRO socket's datagrams, cut at their `gso_size`, are
//! exactly what the plain socket received, in order; and each coalesced
//! datagram is what the rules make of the burst (consecutive frames of one
//! flow, one size but a shorter last, at most 64, nothing in between).

use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use spate::dpdk::{Burst, Memory};
use spate::wire::{MacAddr, ethernet, ip_proto};
use spate::{Counter, Datagram, DatagramBatch, Stack, StackConfig, UdpSocket};
use spate_testkit::wire_peer::{PEER_IP, eth, ipv4_packet, udp_datagram_between, udp_frame};
use spate_testkit::{WirePeer, WireRig, device_lock, recv_datagrams, shared_eal, spate_port, stack_config};

const GRO_PORT: u16 = 9;
const PLAIN_PORT: u16 = 10;

/// One frame of a generated burst.
#[derive(Debug, Clone)]
enum Item {
    Udp { flow: u16, len: usize, bad_checksum: bool },
    Arp,
    Junk,
}

fn item() -> impl Strategy<Value = Item> {
    prop_oneof![
        8 => (0u16..3, prop_oneof![3 => Just(100usize), 1 => 0usize..300], prop::bool::weighted(0.1))
            .prop_map(|(flow, len, bad_checksum)| Item::Udp { flow, len, bad_checksum }),
        1 => Just(Item::Arp),
        1 => Just(Item::Junk),
    ]
}

/// A payload that says which frame of the burst it was.
fn payload(pos: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| if i == 0 { pos as u8 } else { (pos * 31 + i * 7) as u8 }).collect()
}

fn frames(mac: MacAddr, items: &[Item], dst_port: u16) -> Vec<Vec<u8>> {
    items
        .iter()
        .enumerate()
        .map(|(pos, it)| match it {
            Item::Udp { flow, len, bad_checksum } => {
                let mut f = udp_frame(mac, false, 40000 + flow, dst_port, &payload(pos, *len));
                if *bad_checksum {
                    let at = 14 + 20 + 6;
                    f[at] ^= 0x5a;
                    if f[at] == 0 && f[at + 1] == 0 {
                        f[at + 1] = 1; // zero means "no checksum" over IPv4
                    }
                }
                f
            }
            // An ARP reply nobody asked for: handled, changes nothing.
            Item::Arp => {
                let mut body = vec![0u8; 28];
                body[..8].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 2]);
                body[14..18].copy_from_slice(&PEER_IP.octets());
                eth(mac, ethernet::ethertype::ARP, &body)
            }
            Item::Junk => eth(mac, 0x88b5, &[0u8; 46]),
        })
        .collect()
}

/// What GRO makes of a burst: per coalesced datagram, its flow and the
/// burst positions of its segments.
fn expected(items: &[Item]) -> Vec<(u16, Vec<usize>)> {
    let mut out: Vec<(u16, Vec<usize>)> = Vec::new();
    // (index in out, segment size, closed, last position)
    let mut open: Option<(usize, usize, bool, usize)> = None;
    for (pos, it) in items.iter().enumerate() {
        match it {
            Item::Udp { flow, len, bad_checksum: false } => {
                if let Some((at, seg, closed, last)) = open {
                    let (f, segs) = &out[at];
                    if *f == *flow && last + 1 == pos && !closed && segs.len() < 64 && *len > 0 && *len <= seg {
                        out[at].1.push(pos);
                        open = Some((at, seg, *len < seg, pos));
                        continue;
                    }
                }
                out.push((*flow, vec![pos]));
                open = (*len > 0).then_some((out.len() - 1, *len, false, pos));
            }
            _ => open = None,
        }
    }
    out
}

struct Rig {
    peer: WirePeer,
    _port: spate::dpdk::Port,
    mac: MacAddr,
    stack: Stack,
    gro: UdpSocket,
    plain: UdpSocket,
}

fn rig() -> &'static Mutex<Rig> {
    static RIG: OnceLock<Mutex<Rig>> = OnceLock::new();
    RIG.get_or_init(|| {
        let WireRig { stack, peer, mac, spate_side } =
            WireRig::new(8191, |port| StackConfig { announce: false, ..stack_config(spate_port(port)) });
        let gro = UdpSocket::builder(&stack).recv_buffer_size(8 << 20).bind(("0.0.0.0", GRO_PORT)).unwrap();
        gro.set_gro(true).unwrap();
        let plain = UdpSocket::builder(&stack).recv_buffer_size(8 << 20).bind(("0.0.0.0", PLAIN_PORT)).unwrap();
        for s in [&gro, &plain] {
            s.set_nonblocking(true).unwrap();
        }
        // Each test polls the rig's stack while it uses it: an lcore kept
        // busy for the whole process would be taken when another test
        // starts a stack of its own.
        Mutex::new(Rig { peer, _port: spate_side, mac, stack, gro, plain })
    })
}

/// Sends `frames` in one burst.
fn send_burst(peer: &mut WirePeer, frames: &[Vec<u8>]) {
    let mut b: Burst = Burst::new();
    for f in frames {
        b.push(peer.mbuf(f)).unwrap();
    }
    let n = b.len();
    assert_eq!(peer.send_burst(&mut b), n, "the ring took the whole burst");
}

/// Takes `want` datagrams from `s`.
fn take(s: &UdpSocket, want: usize) -> Vec<Datagram> {
    let out = recv_datagrams(s, want);
    let mut batch = DatagramBatch::with_capacity(64);
    assert!(s.recv_batch(&mut batch, 64).is_err(), "no more than expected");
    out
}

/// A property test run under the device lock as a whole: another test
/// must not use the rig or lcore 1 between its cases.
#[test]
fn gro_delivers_what_a_plain_socket_gets() {
    let _serial = device_lock();
    let config = ProptestConfig {
        cases: 96,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let result = runner.run(&prop::collection::vec(item(), 1..=32), |items| {
        let mut rig = rig().lock().unwrap_or_else(|p| p.into_inner());
        let Rig { peer, mac, stack, gro, plain, .. } = &mut *rig;
        let _running = stack.spawn_polling().unwrap();
        let want = expected(&items);
        let plain_count = items.iter().filter(|i| matches!(i, Item::Udp { bad_checksum: false, .. })).count();
        send_burst(peer, &frames(*mac, &items, GRO_PORT));
        let coalesced = take(gro, want.len());
        send_burst(peer, &frames(*mac, &items, PLAIN_PORT));
        let singles = take(plain, plain_count);

        // The bytes: segments of the GRO socket's datagrams, in order, are
        // the plain socket's datagrams.
        let mut cut: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
        for d in &coalesced {
            let bytes = d.to_vec();
            match d.gso_size() {
                None => cut.push((d.src(), bytes)),
                Some(seg) => {
                    prop_assert!(seg > 0);
                    for c in bytes.chunks(seg) {
                        cut.push((d.src(), c.to_vec()));
                    }
                }
            }
        }
        let plain_seen: Vec<(SocketAddr, Vec<u8>)> = singles.iter().map(|d| (d.src(), d.to_vec())).collect();
        prop_assert_eq!(&cut, &plain_seen);

        // The shape: the datagrams the rules make.
        prop_assert_eq!(coalesced.len(), want.len());
        for (d, (flow, positions)) in coalesced.iter().zip(&want) {
            prop_assert_eq!(d.src().port(), 40000 + flow);
            let lens: Vec<usize> = positions
                .iter()
                .map(|&p| match &items[p] {
                    Item::Udp { len, .. } => *len,
                    _ => 0,
                })
                .collect();
            prop_assert_eq!(d.len(), lens.iter().sum::<usize>());
            if positions.len() == 1 {
                prop_assert_eq!(d.gso_size(), None);
            } else {
                prop_assert_eq!(d.gso_size(), Some(lens[0]));
                prop_assert!(lens[..lens.len() - 1].iter().all(|&l| l == lens[0]));
                prop_assert!(positions.len() <= 64);
            }
            for (seg, &p) in d.to_vec().chunks(lens[0].max(1)).zip(positions) {
                if !seg.is_empty() {
                    prop_assert_eq!(seg[0], p as u8, "segment from burst position {}", p);
                }
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The registry: no GRO-stage lookups while nothing asks for the stage,
/// one per UDP datagram while a GRO socket exists, none again after.
#[test]
fn gro_stage_runs_only_while_someone_needs_it() {
    let _serial = device_lock();
    let mut rig = rig().lock().unwrap_or_else(|p| p.into_inner());
    let Rig { peer, mac, stack, gro, plain, .. } = &mut *rig;
    let _running = stack.spawn_polling().unwrap();
    let burst: Vec<Vec<u8>> = (0..20).map(|i| udp_frame(*mac, false, 41000, PLAIN_PORT, &[i as u8; 50])).collect();
    let lookups = |stack: &Stack| stack.counters()[Counter::GroLookups];
    // Each change holds for the next burst: the lcore looks at the
    // registry again after every burst that brought frames. The rig's GRO
    // socket starts with GRO on.
    gro.set_gro(false).unwrap();
    let before = lookups(stack);
    send_burst(peer, &burst);
    take(plain, 20);
    assert_eq!(lookups(stack), before, "no GRO socket, no tunnel: the stage is skipped");

    gro.set_gro(true).unwrap();
    send_burst(peer, &burst);
    take(plain, 20);
    assert_eq!(lookups(stack), before + 20, "one lookup per UDP datagram while a GRO socket exists");

    gro.set_gro(false).unwrap();
    send_burst(peer, &burst);
    take(plain, 20);
    assert_eq!(lookups(stack), before + 20, "skipped again once the last one went");

    // A socket that closes with GRO on gives its registration back.
    let other = UdpSocket::bind(stack, ("0.0.0.0", 11)).unwrap();
    other.set_gro(true).unwrap();
    send_burst(peer, &burst);
    take(plain, 20);
    assert_eq!(lookups(stack), before + 40);
    drop(other);
    send_burst(peer, &burst);
    take(plain, 20);
    assert_eq!(lookups(stack), before + 40, "closing the last GRO socket ends the stage");
    gro.set_gro(true).unwrap();
}

/// A stack polling lcore 1 on `port` (198.18.0.2/24), with a VXLAN
/// tunnel for each (VNI, remote, inner address).
fn tunnel_stack(port: &str, tunnels: &[(u32, std::net::Ipv4Addr, &str)]) -> Stack {
    let mut cfg = StackConfig { announce: false, ..stack_config(spate_port(port)) };
    for &(vni, remote, inner) in tunnels {
        let mut t = spate::config::VxlanSpec::new(vni, remote.into());
        t.ipv4.push(inner.parse().unwrap());
        cfg.vxlan.push(t);
    }
    Stack::new(cfg).unwrap()
}

/// A registered tunnel keeps the stage on for every UDP datagram, from
/// the start.
#[test]
fn a_tunnel_keeps_the_stage_on() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (mut peer, port, _spate_side) = WirePeer::new(4095);
    let stack = tunnel_stack(&port, &[(42, PEER_IP, "198.19.0.2/24")]);
    assert_eq!(stack.interfaces().len(), 2, "the port and the tunnel's inner interface");
    let mac = stack.interfaces()[0].mac;
    let plain = UdpSocket::bind(&stack, ("0.0.0.0", PLAIN_PORT)).unwrap();
    plain.set_nonblocking(true).unwrap();
    let running = stack.spawn_polling().unwrap();
    let burst: Vec<Vec<u8>> = (0..20).map(|i| udp_frame(mac, false, 41000, PLAIN_PORT, &[i as u8; 50])).collect();
    send_burst(&mut peer, &burst);
    take(&plain, 20);
    assert_eq!(stack.counters()[Counter::GroLookups], 20, "one lookup per UDP datagram");
    // A datagram to the tunnel port that is not VXLAN is counted, not delivered.
    send_burst(&mut peer, &[udp_frame(mac, false, 41000, 4789, &[0u8; 30])]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while stack.counters()[Counter::RxVxlanErrors] == 0 {
        assert!(Instant::now() < deadline, "{}", stack.counters().render_nonzero());
        std::thread::sleep(Duration::from_millis(5));
    }
    running.stop();
    assert_eq!(stack.counters().unaccounted_frames(), 0);
}

/// A VXLAN packet (VNI `vni`) from the peer carrying one UDP datagram
/// from 198.19.0.1 to `inner_dst`:`INNER_PORT`, in a frame to `inner_mac`.
fn vxlan_frame(outer_mac: MacAddr, vni: u32, inner_mac: MacAddr, inner_dst: std::net::Ipv4Addr) -> Vec<u8> {
    let src = std::net::Ipv4Addr::new(198, 19, 0, 1);
    let dg = udp_datagram_between(src.into(), inner_dst.into(), 5000, INNER_PORT, b"inside");
    let inner = ipv4_packet(src, inner_dst, ip_proto::UDP, 7, 0, false, &dg);
    let mut vx = vec![0x08, 0, 0, 0, (vni >> 16) as u8, (vni >> 8) as u8, vni as u8, 0];
    vx.extend_from_slice(&eth(inner_mac, ethernet::ethertype::IPV4, &inner));
    udp_frame(outer_mac, false, 41000, 4789, &vx)
}

const INNER_PORT: u16 = 11;

/// A tunnel takes VXLAN only from its remote: the peer is tunnel 42's
/// remote and not tunnel 43's, so its packet for 42 reaches the inner
/// socket and its packet for 43 is counted and dropped (before, anyone who
/// reached port 4789 could put frames on any inner interface).
#[test]
fn vxlan_is_taken_only_from_the_tunnels_remote() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (mut peer, port, _spate_side) = WirePeer::new(4095);
    let other = std::net::Ipv4Addr::new(198, 18, 0, 3);
    let stack = tunnel_stack(&port, &[(42, PEER_IP, "198.19.0.2/24"), (43, other, "198.20.0.2/24")]);
    let ifs = stack.interfaces();
    let (outer, in42, in43) = (ifs[0].mac, ifs[1].mac, ifs[2].mac);
    let sock = UdpSocket::bind(&stack, ("0.0.0.0", INNER_PORT)).unwrap();
    sock.set_nonblocking(true).unwrap();
    let running = stack.spawn_polling().unwrap();
    send_burst(&mut peer, &[vxlan_frame(outer, 43, in43, "198.20.0.2".parse().unwrap())]);
    send_burst(&mut peer, &[vxlan_frame(outer, 42, in42, "198.19.0.2".parse().unwrap())]);
    let got = take(&sock, 1);
    assert_eq!(got[0].data(), b"inside");
    let deadline = Instant::now() + Duration::from_secs(5);
    while stack.counters()[Counter::RxVxlanWrongSource] == 0 {
        assert!(Instant::now() < deadline, "{}", stack.counters().render_nonzero());
        std::thread::sleep(Duration::from_millis(5));
    }
    running.stop();
    let c = stack.counters();
    assert_eq!((c[Counter::VxlanInPackets], c[Counter::RxVxlanWrongSource]), (1, 1), "{}", c.render_nonzero());
    assert_eq!(c.unaccounted_frames(), 0);
}

/// A VXLAN packet from the tunnel's remote that arrives in two IPv4
/// fragments is reassembled, counted and dropped (RFC 7348 lets an endpoint
/// discard it), not decapsulated (spate decapsulates whole frames) nor left
/// in the endpoint's queue, which nobody reads: before, it was counted as
/// delivered there and its mbufs stayed.
#[test]
fn fragmented_vxlan_is_counted_and_dropped() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (mut peer, port, _spate_side) = WirePeer::new(4095);
    let stack = tunnel_stack(&port, &[(42, PEER_IP, "198.19.0.2/24")]);
    let (outer, inner) = (stack.interfaces()[0].mac, stack.interfaces()[1].mac);
    let sock = UdpSocket::bind(&stack, ("0.0.0.0", INNER_PORT)).unwrap();
    sock.set_nonblocking(true).unwrap();
    let baseline = stack.mempool().in_use();
    let running = stack.spawn_polling().unwrap();
    // The same VXLAN datagram vxlan_frame builds, as two fragments.
    let whole = vxlan_frame(outer, 42, inner, "198.19.0.2".parse().unwrap());
    let udp = &whole[ethernet::HEADER_LEN + 20..];
    let (dst, src) = (std::net::Ipv4Addr::new(198, 18, 0, 2), PEER_IP);
    let first = ipv4_packet(src, dst, ip_proto::UDP, 99, 0, true, &udp[..32]);
    let last = ipv4_packet(src, dst, ip_proto::UDP, 99, 32, false, &udp[32..]);
    send_burst(
        &mut peer,
        &[eth(outer, ethernet::ethertype::IPV4, &first), eth(outer, ethernet::ethertype::IPV4, &last)],
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while stack.counters()[Counter::RxVxlanFragmented] == 0 {
        assert!(Instant::now() < deadline, "{}", stack.counters().render_nonzero());
        std::thread::sleep(Duration::from_millis(5));
    }
    running.stop();
    let c = stack.counters();
    assert_eq!((c[Counter::UdpInDatagrams], c[Counter::VxlanInPackets]), (0, 0), "{}", c.render_nonzero());
    assert!(sock.recv(&mut [0u8; 16]).is_err(), "nothing reached the inner socket");
    assert_eq!(c.unaccounted_frames(), 0);
    assert_eq!(stack.mempool().in_use(), baseline, "the fragments' mbufs came back");
}

/// A train ends where the IP header's TOS or TTL changes, as Linux's
/// `inet_gro_receive` ends it: a reader's ECN and TTL are every segment's
/// (before, a CE mark on a later segment was lost in the first one's).
#[test]
fn a_train_ends_where_ecn_or_ttl_changes() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (mut peer, port, _spate_side) = WirePeer::new(4095);
    let stack = tunnel_stack(&port, &[]);
    let mac = stack.interfaces()[0].mac;
    let gro = UdpSocket::bind(&stack, ("0.0.0.0", GRO_PORT)).unwrap();
    gro.set_nonblocking(true).unwrap();
    gro.set_gro(true).unwrap();
    let running = stack.spawn_polling().unwrap();
    // Six segments of one flow: TOS 0, 0, CE, CE, CE with TTL 9, CE.
    let marks = [(0u8, 64u8), (0, 64), (3, 64), (3, 64), (3, 9), (3, 64)];
    let frames: Vec<Vec<u8>> = marks
        .iter()
        .enumerate()
        .map(|(i, &(tos, ttl))| {
            let mut f = udp_frame(mac, false, 41000, GRO_PORT, &[i as u8; 100]);
            let ip = ethernet::HEADER_LEN;
            f[ip + 1] = tos;
            f[ip + 8] = ttl;
            f[ip + 10..ip + 12].copy_from_slice(&[0, 0]);
            let sum = spate::wire::checksum::sum(&f[ip..ip + 20]);
            f[ip + 10..ip + 12].copy_from_slice(&(!spate::wire::checksum::fold(sum)).to_be_bytes());
            f
        })
        .collect();
    send_burst(&mut peer, &frames);
    let got = take(&gro, 4);
    running.stop();
    let seen: Vec<(usize, u8, u8)> = got.iter().map(|d| (d.len() / 100, d.tos(), d.ttl())).collect();
    assert_eq!(seen, [(2, 0, 64), (2, 3, 64), (1, 3, 9), (1, 3, 64)]);
    assert_eq!(got[1].ecn(), spate::Ecn::Ce);
}

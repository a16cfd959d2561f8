//! The test's end of an in-memory wire pair: it sends frames it builds and
//! reads what spate sends back.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spate_dpdk::{Burst, Mbuf, Mempool, MempoolConfig, Port, PortConfig, RxQueue, TxQueue};
use spate_stack::wire::{MacAddr, arp, ethernet, icmpv4, ip_proto, ipv4, ipv6, udp};

use crate::names::unique;

/// The peer's MAC.
pub const PEER_MAC: MacAddr = MacAddr([0x6a, 0x1f, 0x3c, 0x55, 0x10, 0x9e]);
/// The peer's IPv4 address.
pub const PEER_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// The peer's IPv6 address.
pub const PEER_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1);
/// spate's IPv4 address in wire tests.
pub const SPATE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// spate's IPv6 address in wire tests.
pub const SPATE_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2);

/// One end of a wire pair, driven by the test.
#[derive(Debug)]
pub struct WirePeer {
    rx: RxQueue,
    tx: TxQueue,
    /// The peer's packet pool.
    pub pool: Arc<Mempool>,
    _port: Port,
    arp_reply: Vec<u8>,
    /// Frames received in a burst after the one `recv_matching` returned.
    later: std::collections::VecDeque<Vec<u8>>,
}

impl WirePeer {
    /// Creates a wire pair; returns the peer and the name of spate's end.
    pub fn new(mbufs: u32) -> (WirePeer, String, Port) {
        let (a, b) = Port::wire_pair(&unique("w")).expect("wire pair");
        let name = a.name().to_string();
        (WirePeer::on_port(b, mbufs), name, a)
    }

    /// The peer on a port of its own (a `net_virtio_user` client, say),
    /// configured and started here with a pool of `mbufs`.
    pub fn on_port(mut port: Port, mbufs: u32) -> WirePeer {
        let pool = Arc::new(Mempool::new(&MempoolConfig::new(&unique("peer"), mbufs)).expect("peer pool"));
        port.configure(&PortConfig::default(), pool.clone()).expect("configure peer port");
        port.start().expect("start peer port");
        WirePeer {
            rx: port.rx_queue(0).unwrap(),
            tx: port.tx_queue(0).unwrap(),
            pool,
            _port: port,
            arp_reply: Vec::new(),
            later: Default::default(),
        }
    }

    /// Answers `frame` if it is an ARP request for the peer's address
    /// (from a reply built once, so answering allocates nothing).
    pub fn answer_arp(&mut self, frame: &[u8]) -> bool {
        let e = ethernet::Frame::new_unchecked(frame);
        if e.check_len().is_err() || e.ethertype() != ethernet::ethertype::ARP {
            return false;
        }
        let Ok(req) = arp::Packet::new_checked(&frame[14..]).and_then(|p| arp::Repr::parse(&p)) else {
            return false;
        };
        if req.operation != arp::Operation::Request || req.target_ip != PEER_IP {
            return false;
        }
        if self.arp_reply.is_empty() {
            let reply = arp::Repr {
                operation: arp::Operation::Reply,
                sender_mac: PEER_MAC,
                sender_ip: PEER_IP,
                target_mac: req.sender_mac,
                target_ip: req.sender_ip,
            };
            let mut body = [0u8; arp::PACKET_LEN];
            reply.emit(&mut body);
            self.arp_reply = eth(req.sender_mac, ethernet::ethertype::ARP, &body);
        }
        let mut b: Burst = Burst::new();
        let m = self.mbuf(&self.arp_reply);
        let _ = b.push(m);
        self.tx.tx_burst(&mut b);
        true
    }

    /// An mbuf holding `frame`.
    pub fn mbuf(&self, frame: &[u8]) -> Mbuf {
        let mut m = self.pool.try_alloc().expect("peer pool has room");
        m.append(frame.len()).expect("frame fits an mbuf").copy_from_slice(frame);
        m
    }

    /// Sends a burst; returns how many the ring took (the rest are freed).
    pub fn send_burst(&mut self, b: &mut Burst) -> usize {
        let n = self.tx.tx_burst(b);
        b.clear();
        n
    }

    /// Sends what the ring takes of a burst; the rest stays in `b`.
    pub fn send_keep(&mut self, b: &mut Burst) -> usize {
        self.tx.tx_burst(b)
    }

    /// Sends one frame, waiting for room.
    pub fn send(&mut self, frame: &[u8]) {
        let mut b: Burst = Burst::new();
        b.push(self.mbuf(frame)).expect("empty burst");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !b.is_empty() {
            assert!(Instant::now() < deadline, "the wire stayed full");
            self.tx.tx_burst(&mut b);
        }
    }

    /// Receives what is there into `b` (not the frames a `recv_matching`
    /// call kept for the next one).
    pub fn recv_burst(&mut self, b: &mut Burst) -> usize {
        self.rx.rx_burst(b)
    }

    /// The next frame `keep` accepts, within 5 s (frames that came in
    /// the same burst after it wait for the next call).
    pub fn recv_matching(&mut self, keep: impl Fn(&[u8]) -> bool) -> Vec<u8> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut b: Burst = Burst::new();
        loop {
            while let Some(f) = self.later.pop_front() {
                if keep(&f) {
                    return f;
                }
            }
            assert!(Instant::now() < deadline, "spate sent nothing matching");
            if self.rx.rx_burst(&mut b) > 0 {
                self.later.extend(b.drain().map(|m| m.data().to_vec()));
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
}

/// An Ethernet frame from the peer.
pub fn eth(dst: MacAddr, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let r = ethernet::Repr { src: PEER_MAC, dst, ethertype, vlan: None };
    let mut f = vec![0u8; r.buffer_len()];
    r.emit(&mut f);
    f.extend_from_slice(payload);
    f
}

/// A UDP datagram from the peer to spate (`v6` picks the family).
pub fn udp_frame(dst_mac: MacAddr, v6: bool, src_port: u16, dst_port: u16, payload: &[u8]) -> Vec<u8> {
    let dg = udp_datagram(v6, src_port, dst_port, payload);
    if v6 {
        eth(dst_mac, ethernet::ethertype::IPV6, &ipv6_packet(PEER_IP6, SPATE_IP6, ip_proto::UDP, 64, &dg))
    } else {
        eth(dst_mac, ethernet::ethertype::IPV4, &ipv4_packet(PEER_IP, SPATE_IP, ip_proto::UDP, 1, 0, false, &dg))
    }
}

/// A UDP datagram (header and payload) from the peer to spate, as the IP
/// payload that [`ip_fragment`] cuts.
pub fn udp_datagram(v6: bool, src_port: u16, dst_port: u16, payload: &[u8]) -> Vec<u8> {
    let (src, dst): (IpAddr, IpAddr) =
        if v6 { (PEER_IP6.into(), SPATE_IP6.into()) } else { (PEER_IP.into(), SPATE_IP.into()) };
    udp_datagram_between(src, dst, src_port, dst_port, payload)
}

/// A UDP datagram (header and payload) from `src`:`src_port` to
/// `dst`:`dst_port`, its checksum over those addresses.
pub fn udp_datagram_between(src: IpAddr, dst: IpAddr, src_port: u16, dst_port: u16, payload: &[u8]) -> Vec<u8> {
    let mut dg = vec![0u8; udp::HEADER_LEN + payload.len()];
    dg[udp::HEADER_LEN..].copy_from_slice(payload);
    udp::Repr { src_port, dst_port, payload_len: payload.len() as u16 }.emit_with_checksum(&mut dg, &src, &dst);
    dg
}

/// An IPv4 packet (TTL 64) from `src` to `dst` carrying `payload` at
/// byte `offset` of its datagram: a fragment when `more` or `offset` say
/// so, otherwise whole with DF set.
pub fn ipv4_packet(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    protocol: u8,
    ident: u16,
    offset: u32,
    more: bool,
    payload: &[u8],
) -> Vec<u8> {
    let ip = ipv4::Repr {
        src,
        dst,
        protocol,
        payload_len: payload.len() as u16,
        ttl: 64,
        tos: 0,
        ident,
        dont_frag: !more && offset == 0,
        more_frags: more,
        frag_offset: offset,
    };
    let mut p = vec![0u8; ipv4::HEADER_LEN];
    ip.emit(&mut p, false);
    p.extend_from_slice(payload);
    p
}

/// An ICMP "fragmentation needed" message (next-hop MTU `mtu`) quoting
/// the start of a 1,400-byte UDP datagram spate sent from `src_port` to
/// `dst`:9: the ICMP part, for an IPv4 packet from a router.
pub fn frag_needed_icmp(src_port: u16, dst: Ipv4Addr, mtu: u16) -> Vec<u8> {
    let quoted_ip = ipv4::Repr {
        src: SPATE_IP,
        dst,
        protocol: ip_proto::UDP,
        payload_len: 1400,
        ttl: 64,
        tos: 0,
        ident: 1,
        dont_frag: true,
        more_frags: false,
        frag_offset: 0,
    };
    let mut quoted = vec![0u8; ipv4::HEADER_LEN];
    quoted_ip.emit(&mut quoted, false);
    quoted.extend_from_slice(&[(src_port >> 8) as u8, src_port as u8, 0, 9, 0x05, 0x78, 0, 0]);
    let msg = icmpv4::Repr::DstUnreachable { code: icmpv4::unreachable::FRAG_NEEDED, mtu, data: &quoted };
    let mut icmp = vec![0u8; msg.buffer_len()];
    msg.emit(&mut icmp);
    icmp
}

/// An IPv6 packet from `src` to `dst` carrying `payload` as `next_header`.
pub fn ipv6_packet(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, hop_limit: u8, payload: &[u8]) -> Vec<u8> {
    let ip = ipv6::Repr { src, dst, next_header, payload_len: payload.len() as u16, hop_limit };
    let mut p = vec![0u8; ipv6::HEADER_LEN];
    ip.emit(&mut p);
    p.extend_from_slice(payload);
    p
}

/// One IP fragment of a UDP datagram from the peer: `data` at byte
/// `offset` of the datagram (IPv6: behind a fragment header).
pub fn ip_fragment(mac: MacAddr, v6: bool, ident: u32, offset: usize, more: bool, data: &[u8]) -> Vec<u8> {
    if v6 {
        let ip = ipv6::Repr {
            src: PEER_IP6,
            dst: SPATE_IP6,
            next_header: ip_proto::FRAGMENT,
            payload_len: (ipv6::FRAGMENT_HEADER_LEN + data.len()) as u16,
            hop_limit: 64,
        };
        let mut p = vec![0u8; ipv6::HEADER_LEN + ipv6::FRAGMENT_HEADER_LEN];
        ip.emit(&mut p);
        ipv6::FragmentHeader { next_header: ip_proto::UDP, offset: offset as u32, more, ident }
            .emit(&mut p[ipv6::HEADER_LEN..]);
        p.extend_from_slice(data);
        eth(mac, ethernet::ethertype::IPV6, &p)
    } else {
        let ip = ipv4::Repr {
            src: PEER_IP,
            dst: SPATE_IP,
            protocol: ip_proto::UDP,
            payload_len: data.len() as u16,
            ttl: 64,
            tos: 0,
            ident: ident as u16,
            dont_frag: false,
            more_frags: more,
            frag_offset: offset as u32,
        };
        let mut p = vec![0u8; ipv4::HEADER_LEN];
        ip.emit(&mut p, false);
        p.extend_from_slice(data);
        eth(mac, ethernet::ethertype::IPV4, &p)
    }
}

/// `datagram` (from [`udp_datagram`]) cut into fragments of `size` bytes
/// (a multiple of 8), in order.
pub fn ip_fragments(mac: MacAddr, v6: bool, ident: u32, datagram: &[u8], size: usize) -> Vec<Vec<u8>> {
    let n = datagram.len().div_ceil(size);
    (0..n)
        .map(|i| {
            let end = ((i + 1) * size).min(datagram.len());
            ip_fragment(mac, v6, ident, i * size, i + 1 < n, &datagram[i * size..end])
        })
        .collect()
}

/// A small deterministic PRNG (xorshift64*), so failures reproduce.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

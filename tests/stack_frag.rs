//! Reassembly over an in-memory wire pair (net_ring), fragments built here.
//!
//! - Any datagram, IPv4 or IPv6, cut into fragments of any size the rules
//!   allow, arriving in any order with duplicates in between, is delivered
//!   byte-exact, once, and every mbuf goes back to the pool.
//! - Overlaps, more than 64 fragments, contradicting lengths and a
//!   corrupted payload byte drop the datagram, each counted where a user
//!   looks for it.
//! - Above the memory budget the oldest datagrams go first, and what the
//!   table holds never passes the high watermark; after the timeout it
//!   holds nothing.

use std::net::IpAddr;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use spate::dpdk::Burst;
use spate::wire::MacAddr;
use spate::{Counter, Counters, DatagramBatch, Stack, StackConfig, UdpSocket};
use spate_testkit::wire_peer::{PEER_IP, PEER_IP6, ip_fragment as fragment, ip_fragments as cut, udp_datagram};
use spate_testkit::{WirePeer, WireRig, device_lock, recv_datagrams, spate_port_dual, stack_config};

const PORT: u16 = 9;
/// The rig's reassembly budget.
const HIGH: usize = 256 << 10;
const LOW: usize = 192 << 10;
const TIMEOUT_MS: u64 = 700;

struct Rig {
    peer: WirePeer,
    _port: spate::dpdk::Port,
    mac: MacAddr,
    stack: Stack,
    sock: UdpSocket,
    _running: spate::Running,
}

fn rig() -> &'static Mutex<Rig> {
    static RIG: OnceLock<Mutex<Rig>> = OnceLock::new();
    RIG.get_or_init(|| {
        let WireRig { stack, peer, mac, spate_side } = WireRig::new(8191, |port| StackConfig {
            announce: false,
            reassembly_high_bytes: Some(HIGH),
            reassembly_low_bytes: Some(LOW),
            reassembly_timeout_ms: TIMEOUT_MS,
            ..stack_config(spate_port_dual(port))
        });
        let sock = UdpSocket::builder(&stack).recv_buffer_size(8 << 20).bind(("::", PORT)).unwrap();
        sock.set_nonblocking(true).unwrap();
        let running = stack.spawn_polling().unwrap();
        Mutex::new(Rig { peer, _port: spate_side, mac, stack, sock, _running: running })
    })
}

fn datagram(v6: bool, payload: &[u8]) -> Vec<u8> {
    udp_datagram(v6, 40000, PORT, payload)
}

fn send(peer: &mut WirePeer, frames: &[Vec<u8>]) {
    for chunk in frames.chunks(32) {
        let mut b: Burst = Burst::new();
        for f in chunk {
            b.push(peer.mbuf(f)).unwrap();
        }
        let n = b.len();
        assert_eq!(peer.send_burst(&mut b), n, "the ring took the whole burst");
    }
}

/// Waits until `done` holds of the counters (bounded).
fn until(stack: &Stack, what: &str, done: impl Fn(&Counters) -> bool) -> Counters {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = stack.counters();
        if done(&c) {
            return c;
        }
        assert!(Instant::now() < deadline, "{what}:\n{}", c.render_nonzero());
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The datagrams the socket holds now (waiting for `want` of them).
fn take(sock: &UdpSocket, want: usize) -> Vec<(IpAddr, Vec<u8>)> {
    recv_datagrams(sock, want).into_iter().map(|d| (d.src().ip(), d.to_vec())).collect()
}

fn nothing_more(sock: &UdpSocket) {
    let mut batch = DatagramBatch::with_capacity(64);
    assert!(sock.recv_batch(&mut batch, 64).is_err(), "no more datagrams than expected");
}

fn counters(v6: bool) -> (Counter, Counter, Counter) {
    if v6 {
        (Counter::Ip6ReasmOKs, Counter::Ip6ReasmFails, Counter::Ip6ReasmTimeout)
    } else {
        (Counter::IpReasmOKs, Counter::IpReasmFails, Counter::IpReasmTimeout)
    }
}

/// Nothing held, every mbuf back (bounded wait: the lcore frees them).
fn settled(rig: &Rig) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.stack.mempool().in_use() != 0 || rig.stack.reassembly_bytes() != 0 {
        assert!(
            Instant::now() < deadline,
            "in use {}, reassembly holds {}",
            rig.stack.mempool().in_use(),
            rig.stack.reassembly_bytes()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn fragments_in_any_order_reassemble_byte_exact(
        v6 in any::<bool>(),
        len in prop_oneof![0usize..3000, 3000usize..=65_507],
        size_hint in 1usize..=185,
        order in any::<u64>(),
        dups in 0usize..4,
    ) {
        let _serial = device_lock();
        let mut guard = rig().lock().unwrap_or_else(|p| p.into_inner());
        let rig = &mut *guard;
        let len = if v6 { len.min(65_527 - 8) } else { len };
        let payload: Vec<u8> = (0..len).map(|i| (i * 13 + len) as u8).collect();
        let dg = datagram(v6, &payload);
        // Fragments of 8 to 1,480 bytes, at most 64 of them.
        let size = (size_hint * 8).max(dg.len().div_ceil(64).next_multiple_of(8));
        let mut frames = cut(rig.mac, v6, 0x1000 + order as u32 % 50_000, &dg, size);
        let n = frames.len();
        let mut rng = spate_testkit::wire_peer::Rng::new(order);
        for i in (1..n).rev() {
            frames.swap(i, rng.below(i + 1));
        }
        // Duplicates arrive before the fragment that completes the datagram.
        let dups = if n > 1 { dups } else { 0 };
        for _ in 0..dups {
            let f = frames[rng.below(n - 1)].clone();
            let at = rng.below(frames.len() - 1) + 1;
            let at = at.min(frames.len() - 1);
            frames.insert(at, f);
        }
        let (oks, fails, _) = counters(v6);
        let before = rig.stack.counters();
        send(&mut rig.peer, &frames);
        let got = take(&rig.sock, 1);
        let after = until(&rig.stack, "counted", |c| {
            c[Counter::RxFrames] - before[Counter::RxFrames] == frames.len() as u64 && c.unaccounted_frames() == 0
        });
        nothing_more(&rig.sock);
        let src: IpAddr = if v6 { PEER_IP6.into() } else { PEER_IP.into() };
        prop_assert_eq!(got[0].0.to_canonical(), src);
        prop_assert!(got[0].1 == payload, "{} bytes in {} fragments of {}: different bytes", len, n, size);
        if n > 1 {
            prop_assert_eq!(after[oks] - before[oks], 1);
            prop_assert_eq!(after[Counter::RxReasmDuplicates] - before[Counter::RxReasmDuplicates], dups as u64);
            prop_assert_eq!(after[Counter::RxReasmHeld] - before[Counter::RxReasmHeld], n as u64 - 1);
        }
        prop_assert_eq!(after[fails], before[fails]);
        drop(got);
        settled(rig);
    }
}

#[test]
fn bad_fragment_sets_drop_the_datagram_and_are_counted() {
    let _serial = device_lock();
    let mut guard = rig().lock().unwrap_or_else(|p| p.into_inner());
    let rig = &mut *guard;
    let mac = rig.mac;
    for v6 in [false, true] {
        let (oks, fails, _) = counters(v6);
        let dg = datagram(v6, &[0x5a; 600]);
        let good = cut(mac, v6, 7, &dg, 200);
        let cases: Vec<(&str, Vec<Vec<u8>>)> = vec![
            ("overlap", vec![good[0].clone(), fragment(mac, v6, 7, 192, true, &dg[192..400]), good[2].clone()]),
            ("last shorter than held", vec![good[2].clone(), fragment(mac, v6, 7, 200, false, &dg[200..400])]),
            ("two different ends", vec![good[3].clone(), fragment(mac, v6, 7, 400, false, &dg[400..600])]),
            ("more than 64 fragments", cut(mac, v6, 7, &datagram(v6, &[1; 8 * 65]), 8)),
            ("tiny first fragment", vec![fragment(mac, v6, 7, 0, true, &dg[..0])]),
            ("past 64 KiB", vec![fragment(mac, v6, 7, 65_528, false, &[0; 16])]),
            ("non-last not a multiple of 8", vec![fragment(mac, v6, 7, 0, true, &dg[..100])]),
        ];
        for (what, frames) in cases {
            let before = rig.stack.counters();
            send(&mut rig.peer, &frames);
            let after = until(&rig.stack, what, |c| {
                c[Counter::RxFrames] - before[Counter::RxFrames] == frames.len() as u64 && c.unaccounted_frames() == 0
            });
            assert_eq!(after[fails] - before[fails], 1, "{what} (v6 {v6}): one datagram failed");
            assert_eq!(after[oks], before[oks], "{what}");
            assert_eq!(after[Counter::RxReasmDropped] - before[Counter::RxReasmDropped], 1, "{what}");
            nothing_more(&rig.sock);
            // Whatever the failure left behind (fragments past the failing
            // one start a new datagram) times out.
            let deadline = Instant::now() + Duration::from_secs(5);
            while rig.stack.reassembly_bytes() != 0 {
                assert!(Instant::now() < deadline, "{what}: held past the timeout");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        // A corrupted byte in a later fragment: reassembled, then refused
        // by the UDP checksum over the whole chain.
        let csum = if v6 { Counter::Udp6InCsumErrors } else { Counter::UdpInCsumErrors };
        let before = rig.stack.counters();
        let mut frames = cut(mac, v6, 8, &dg, 200);
        let last = frames[2].len() - 1;
        frames[2][last] ^= 0x40;
        send(&mut rig.peer, &frames);
        let after = until(&rig.stack, "checksum", |c| c[csum] > before[csum]);
        assert_eq!(after[oks] - before[oks], 1);
        nothing_more(&rig.sock);
    }
    settled(rig);
    assert_eq!(rig.stack.counters().unaccounted_frames(), 0);
}

#[test]
fn budget_evicts_the_oldest_and_the_timeout_empties_the_table() {
    let _serial = device_lock();
    let mut guard = rig().lock().unwrap_or_else(|p| p.into_inner());
    let rig = &mut *guard;
    let mac = rig.mac;
    settled(rig);
    let dg = datagram(false, &[3; 1400]);
    let first = |id: u32| fragment(mac, false, id, 0, true, &dg[..1000]);
    let last = |id: u32| fragment(mac, false, id, 1000, false, &dg[1000..]);
    let before = rig.stack.counters();
    // 400 first fragments (one mbuf each, far over 256 KiB).
    let firsts: Vec<Vec<u8>> = (0..400).map(|i| first(20_000 + i)).collect();
    send(&mut rig.peer, &firsts);
    until(&rig.stack, "held", |c| {
        c[Counter::RxFrames] - before[Counter::RxFrames] == 400 && c.unaccounted_frames() == 0
    });
    let held = rig.stack.reassembly_bytes() as usize;
    assert!(held <= HIGH && held > 0, "holds {held}");
    assert!(rig.stack.reassembly_peak_bytes() as usize <= HIGH);
    // The newest ten complete; the oldest ten were evicted.
    let lasts: Vec<Vec<u8>> = (390..400).map(|i| last(20_000 + i)).chain((0..10).map(|i| last(20_000 + i))).collect();
    send(&mut rig.peer, &lasts);
    let got = take(&rig.sock, 10);
    assert!(got.iter().all(|(_, p)| p[..] == [3u8; 1400][..]));
    let c = until(&rig.stack, "the rest held", |c| {
        c[Counter::RxFrames] - before[Counter::RxFrames] == 420 && c.unaccounted_frames() == 0
    });
    nothing_more(&rig.sock);
    assert_eq!(c[Counter::IpReasmOKs] - before[Counter::IpReasmOKs], 10);
    // The timeout empties the table and gives every mbuf back: 390 first
    // fragments and 10 last ones never completed, each counted once.
    let c = until(&rig.stack, "timed out", |c| c[Counter::IpReasmFails] - before[Counter::IpReasmFails] == 400);
    let timed_out = c[Counter::IpReasmTimeout] - before[Counter::IpReasmTimeout];
    // Mbuf buffers are at least 2 KiB: the table held at most HIGH / 2048
    // datagrams, and every other one was evicted.
    assert!(400 - timed_out >= 400 - HIGH as u64 / 2048 - 10, "evicted {}, timed out {timed_out}", 400 - timed_out);
    drop(got);
    settled(rig);
    assert_eq!(rig.stack.counters().unaccounted_frames(), 0);
}

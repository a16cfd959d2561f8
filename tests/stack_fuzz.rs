//! A bounded fuzz run on stable Rust: 100,000 random and mutated frames
//! through the whole receive path of a running stack (with an echo
//! socket, so deliveries and replies happen too). Nothing panics, every
//! frame lands in exactly one `Rx` counter, and no mbuf is leaked.

use std::sync::Arc;
use std::time::{Duration, Instant};

use spate::dpdk::Burst;
use spate::internals::fixtures;
use spate::{Counter, DatagramBatch, LcoreCtx, StackConfig, UdpSocket};
use spate_testkit::{Rng, WireRig, device_lock, spate_port_dual, stack_config};

const FRAMES: u64 = 100_000;

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    match rng.below(10) {
        // Random bytes.
        0 => (0..rng.below(120)).map(|_| rng.next_u64() as u8).collect(),
        // A valid frame as captured.
        1 => seeds[rng.below(seeds.len())].clone(),
        // A captured frame with bytes flipped, cut or extended.
        _ => {
            let mut f = seeds[rng.below(seeds.len())].clone();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(f.len());
                match rng.below(4) {
                    0 => f[at] ^= 1 << rng.below(8),
                    1 => f[at] = rng.next_u64() as u8,
                    2 => f.truncate(at),
                    _ => f.extend((0..rng.below(64)).map(|_| rng.next_u64() as u8)),
                }
                if f.is_empty() {
                    break;
                }
            }
            f
        }
    }
}

#[test]
fn hundred_thousand_hostile_frames() {
    let _serial = device_lock();
    // The captured frames are addressed to 02:53:50:41:54:45, 198.18.0.2 and fd00::2.
    let WireRig { spate_side: _a, mut peer, mac: _, stack } = WireRig::new(8191, |name| {
        let mut port = spate_port_dual(name);
        port.mac = Some("02:53:50:41:54:45".parse().unwrap());
        StackConfig { mempool_size: 4095, ..stack_config(port) }
    });
    let sock = Arc::new(UdpSocket::bind(&stack, "[::]:7").unwrap());
    sock.set_nonblocking(true).unwrap();
    let s = sock.clone();
    let running = stack
        .spawn(move |_| {
            let s = s.clone();
            let mut batch = DatagramBatch::with_capacity(32);
            move |_: &mut LcoreCtx<'_>| {
                if s.recv_batch(&mut batch, 32).is_ok() {
                    for d in batch.drain() {
                        let to = d.src();
                        let _ = s.send_buf_to(d.into_send_buf(), to);
                    }
                }
            }
        })
        .unwrap();

    let seeds: Vec<Vec<u8>> = [
        fixtures::UDP4,
        fixtures::UDP6,
        fixtures::ICMP4_ECHO_REQUEST,
        fixtures::ICMP6_ECHO_REQUEST,
        fixtures::ARP_REQUEST,
        fixtures::ARP_REPLY,
        fixtures::NS,
        fixtures::NA,
        fixtures::RA,
        fixtures::ICMP4_PORT_UNREACHABLE,
        fixtures::ICMP6_PORT_UNREACHABLE,
    ]
    .iter()
    .map(|h| {
        // Frames the capture saw going to the kernel are turned toward spate.
        let mut f = fixtures::hex(h);
        if f[0] & 1 == 0 {
            f[..6].copy_from_slice(&[0x02, 0x53, 0x50, 0x41, 0x54, 0x45]);
        }
        f
    })
    .collect();
    let mut rng = Rng::new(0x5eed_5a7e);
    let mut sent = 0u64;
    let mut out: Burst = Burst::new();
    let mut back: Burst = Burst::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while sent < FRAMES {
        assert!(Instant::now() < deadline, "fuzz run stalled at {sent} frames");
        while !out.is_full() && sent + (out.len() as u64) < FRAMES {
            let f = mutate(&mut rng, &seeds);
            out.push(peer.mbuf(&f)).unwrap();
        }
        let want = out.len();
        let n = peer.send_burst(&mut out);
        sent += n as u64;
        if n < want {
            std::thread::sleep(Duration::from_micros(200));
        }
        while peer.recv_burst(&mut back) > 0 {
            back.clear();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while stack.counters()[Counter::RxFrames] < FRAMES && Instant::now() < deadline {
        while peer.recv_burst(&mut back) > 0 {
            back.clear();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    running.stop();
    let c = stack.counters();
    assert_eq!(c[Counter::RxFrames], FRAMES, "{}", c.render_nonzero());
    assert_eq!(c.unaccounted_frames(), 0, "{}", c.render_nonzero());
    assert!(c[Counter::RxDelivered] > 100, "valid frames got through: {}", c.render_nonzero());
    drop(sock);
    // Replies waiting for neighbours that will never answer go with the stack.
    let pool = stack.mempool().clone();
    drop(stack);
    while peer.recv_burst(&mut back) > 0 {
        back.clear();
    }
    assert_eq!(pool.in_use(), 0, "stack mbufs leaked");
    assert_eq!(peer.pool.in_use(), 0, "peer mbufs leaked");
    println!("{}", c.render_nonzero());
}

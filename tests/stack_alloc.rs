//! Zero heap allocations per datagram: a counting global allocator watches
//! the whole path PMD RX -> socket -> recv -> send -> TX for 100,000
//! datagrams after a warm-up, run-to-completion on the lcore and from an
//! application thread, and for 2,000-byte datagrams that arrive as IP
//! fragments, are reassembled, and leave fragmented again.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spate::dpdk::Burst;
use spate::wire::{ethernet, ip_proto, ipv4};
use spate::{DatagramBatch, LcoreCtx, UdpSocket};
use spate_testkit::wire_peer::{ip_fragments, udp_datagram, udp_frame};
use spate_testkit::{WirePeer, WireRig, device_lock, spate_port, stack_config};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged, counting calls.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const WARMUP: u64 = 20_000;
const MEASURED: u64 = 100_000;
const IN_FLIGHT: u64 = 64;

fn is_udp_reply(f: &[u8]) -> bool {
    let e = ethernet::Frame::new_unchecked(f);
    e.check_len().is_ok()
        && e.ethertype() == ethernet::ethertype::IPV4
        && ipv4::Packet::new_checked(e.payload()).is_ok_and(|p| p.protocol() == ip_proto::UDP)
}

/// Sends `n` echo requests, at most IN_FLIGHT outstanding, and counts the
/// replies; answers the stack's ARP requests on the way.
fn pump(peer: &mut WirePeer, frames: &[Vec<u8>], n: u64) {
    let mut out: Burst = Burst::new();
    let mut back: Burst = Burst::new();
    let (mut sent, mut replies) = (0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(120);
    while replies < n {
        assert!(Instant::now() < deadline, "stalled: {sent} sent, {replies} echoed");
        while sent < n && sent - replies < IN_FLIGHT && !out.is_full() {
            out.push(peer.mbuf(&frames[sent as usize % frames.len()])).unwrap();
            sent += 1;
        }
        let queued = out.len();
        let taken = peer.send_burst(&mut out);
        sent -= (queued - taken) as u64;
        if peer.recv_burst(&mut back) > 0 {
            for m in back.drain() {
                if is_udp_reply(m.data()) {
                    replies += 1;
                } else {
                    peer.answer_arp(m.data());
                }
            }
        }
    }
}

fn measure(peer: &mut WirePeer, frames: &[Vec<u8>]) -> u64 {
    pump(peer, frames, WARMUP);
    let before = ALLOCS.load(Ordering::SeqCst);
    pump(peer, frames, MEASURED);
    ALLOCS.load(Ordering::SeqCst) - before
}

#[test]
fn no_heap_allocation_per_datagram() {
    let _serial = device_lock();
    // The counter sees allocations (so a zero below means something).
    let before = ALLOCS.load(Ordering::SeqCst);
    let probe = std::hint::black_box(Box::new([0u8; 64]));
    assert!(ALLOCS.load(Ordering::SeqCst) > before);
    drop(probe);
    let WireRig { spate_side: _a, mut peer, mac, stack } = WireRig::new(4095, |name| {
        let mut spec = spate_port(name);
        spec.mac = Some("02:53:50:41:54:45".parse().unwrap());
        stack_config(spec)
    });
    let frames: Vec<Vec<u8>> =
        (0..16).map(|i| udp_frame(mac, false, 40000 + i, 7, &vec![i as u8; 64 + 50 * i as usize])).collect();
    let sock = Arc::new(UdpSocket::bind(&stack, "0.0.0.0:7").unwrap());

    // Run-to-completion: the lcore echoes in its own callback.
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
    let rtc = measure(&mut peer, &frames);
    running.stop();

    // A reuseport group of four: the 16 flows interleave in every burst,
    // so the lcore stages bursts by socket and feeds several queues.
    let group: Arc<Vec<UdpSocket>> = Arc::new(
        (0..4)
            .map(|_| {
                let s = UdpSocket::builder(&stack).reuseport(true).bind("0.0.0.0:9").unwrap();
                s.set_nonblocking(true).unwrap();
                s
            })
            .collect(),
    );
    let to_group: Vec<Vec<u8>> =
        (0..16).map(|i| udp_frame(mac, false, 41000 + i, 9, &vec![i as u8; 64 + 50 * i as usize])).collect();
    let per_socket: Arc<Vec<AtomicU64>> = Arc::new((0..4).map(|_| AtomicU64::new(0)).collect());
    let (g, counts) = (group.clone(), per_socket.clone());
    let running = stack
        .spawn(move |_| {
            let (g, counts) = (g.clone(), counts.clone());
            let mut batch = DatagramBatch::with_capacity(32);
            move |ctx: &mut LcoreCtx<'_>| {
                ctx.recv_staged(|id, staged| {
                    let at = g.iter().position(|s| s.id() == id).expect("a member");
                    counts[at].fetch_add(staged.len() as u64, Ordering::Relaxed);
                    let _ = g[at].send_batch_to(staged.drain().map(|d| {
                        let to = d.src();
                        (d.into_send_buf(), to)
                    }));
                });
                for id in ctx.ready() {
                    let Some(at) = g.iter().position(|s| s.id() == *id) else { continue };
                    let s = &g[at];
                    while let Ok(n) = s.recv_batch(&mut batch, 32) {
                        counts[at].fetch_add(n as u64, Ordering::Relaxed);
                        // The batch send, as spate-echo replies.
                        let _ = s.send_batch_to(batch.drain().map(|d| {
                            let to = d.src();
                            (d.into_send_buf(), to)
                        }));
                    }
                }
            }
        })
        .unwrap();
    let grouped = measure(&mut peer, &to_group);
    running.stop();
    let served = per_socket.iter().filter(|n| n.load(Ordering::Relaxed) > 0).count();

    // Thread mode: an application thread copies each datagram out and back.
    sock.set_nonblocking(false).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let running = stack.spawn_polling().unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let (s, d) = (sock.clone(), done.clone());
    let app = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while !d.load(Ordering::Relaxed) {
            if let Ok((n, from)) = s.recv_from(&mut buf) {
                let _ = s.send_to(&buf[..n], from);
            }
        }
    });
    let threaded = measure(&mut peer, &frames);

    // Fragments both ways (the thread echoes through a 2 KiB buffer, the
    // datagrams are 2,000 bytes: two fragments each way).
    let fragmented: Vec<Vec<u8>> = (0..16u16)
        .flat_map(|i| {
            let payload: Vec<u8> = (0..2000).map(|b| (b as u16 * 7 + i) as u8).collect();
            ip_fragments(mac, false, 100 + i as u32, &udp_datagram(false, 42000 + i, 7, &payload), 1480)
        })
        .collect();
    let before = stack.counters();
    let reassembling = measure(&mut peer, &fragmented);
    let after = stack.counters();
    let reassembled = after[spate::Counter::IpReasmOKs] - before[spate::Counter::IpReasmOKs];
    let fragmented_out = after[spate::Counter::IpFragOKs] - before[spate::Counter::IpFragOKs];
    done.store(true, Ordering::Relaxed);
    app.join().unwrap();
    running.stop();

    assert_eq!(rtc, 0, "heap allocations over {MEASURED} datagrams, run-to-completion");
    assert!(served >= 2, "the group's flows spread over {served} socket(s)");
    assert_eq!(grouped, 0, "heap allocations over {MEASURED} datagrams, reuseport group of 4");
    assert_eq!(threaded, 0, "heap allocations over {MEASURED} datagrams, application thread");
    assert!(reassembled >= (WARMUP + MEASURED) / 2 && fragmented_out >= (WARMUP + MEASURED) / 2);
    assert_eq!(reassembling, 0, "heap allocations over {MEASURED} fragments, reassembled and fragmented");
}

//! One run in this process: the stack on the wire pair and its callback
//! (receive, transmit with or without GSO, echo), a capture attached on
//! request.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use spate::config::VxlanSpec;
use spate::dpdk::{Burst, EalBuilder, Memory, Mempool, MempoolConfig, Port, PortConfig};
use spate::{DatagramBatch, LcoreCtx, PortSpec, Stack, StackConfig, UdpSocket};
use spate_testkit::wire_peer::{PEER_IP, PEER_MAC, eth, ip_fragments, udp_datagram, udp_frame};

use crate::args::Args;
use crate::source::{IN_FLIGHT, SPATE_MAC, Source, consume, read_every_byte};

/// One run in this process; prints `datagrams cycles`.
pub(crate) fn run_once(a: &Args) {
    let _ = env_logger::builder().filter_level(log::LevelFilter::Warn).try_init();
    let eal_lcores = if a.lcores > 1 { format!("0-{}", a.lcores - 1) } else { "0".into() };
    let _eal =
        EalBuilder::new().program("spate-pipeline").lcores(&eal_lcores).memory(Memory::NoHuge).init().expect("EAL");
    let (a_port, mut b_port) = Port::wire_pair("pl").expect("wire pair");
    let peer_pool = Arc::new(Mempool::new(&MempoolConfig::new("plpeer", 8191)).expect("pool"));
    b_port.configure(&PortConfig::default(), peer_pool.clone()).expect("configure");
    b_port.start().expect("start");
    let frames: Vec<Vec<u8>> = match a.echo {
        None => (0..a.flows).map(|i| udp_frame(SPATE_MAC, false, 10_000 + i as u16, 9, &[i as u8; 22])).collect(),
        Some(len) if len <= 1472 => {
            (0..a.flows).map(|i| udp_frame(SPATE_MAC, false, 10_000 + i as u16, 7, &vec![i as u8; len])).collect()
        }
        // Each datagram's fragments in turn (1,480 bytes fit a 1,500 MTU).
        Some(len) => (0..a.flows)
            .flat_map(|i| {
                let dg = udp_datagram(false, 10_000 + i as u16, 7, &vec![i as u8; len]);
                ip_fragments(SPATE_MAC, false, i as u32 + 1, &dg, 1480)
            })
            .collect(),
    };
    let frames_per_datagram = frames.len() as u64 / a.flows as u64;
    let arp_reply = {
        use spate::wire::arp;
        let reply = arp::Repr {
            operation: arp::Operation::Reply,
            sender_mac: PEER_MAC,
            sender_ip: PEER_IP,
            target_mac: SPATE_MAC,
            target_ip: "198.18.0.2".parse().unwrap(),
        };
        let mut body = [0u8; arp::PACKET_LEN];
        reply.emit(&mut body);
        eth(SPATE_MAC, spate::wire::ethernet::ethertype::ARP, &body)
    };
    let source = Source {
        burst: a.burst,
        tx: b_port.tx_queue(0).unwrap(),
        rx: b_port.rx_queue(0).unwrap(),
        pool: peer_pool,
        // A fixed per-flow value spread over the 32 bits, as a NIC's
        // Toeplitz hash is (a datagram's fragments share their flow's).
        hashes: a.rss_hash.then(|| {
            (0..frames.len()).map(|i| ((i as u64 / frames_per_datagram) as u32 + 1).wrapping_mul(0x9e37_79b9)).collect()
        }),
        frames,
        sent: 0,
        target: a.datagrams * frames_per_datagram,
        wire: 0,
        arp_reply,
        cycles: 0,
        pending: 0,
    };
    let start = spate::dpdk::lcore::tsc();
    if a.inject_only {
        let mut a_port = a_port;
        let pool = Arc::new(Mempool::new(&MempoolConfig::new("plown", 4095)).expect("pool"));
        a_port.configure(&PortConfig::default(), pool).expect("configure");
        a_port.start().expect("start");
        let mut rx = a_port.rx_queue(0).unwrap();
        let mut tx = a_port.tx_queue(0).unwrap();
        let mut src = source;
        let mut b: Burst = Burst::new();
        let mut got = 0u64;
        while got < a.datagrams {
            src.inject();
            let n = rx.rx_burst(&mut b);
            if a.echo.is_some() {
                // The echo's floor: every frame straight back, unread.
                tx.tx_burst(&mut b);
                src.drain();
            } else {
                for m in b.as_slice() {
                    std::hint::black_box(read_every_byte(m.data()));
                }
            }
            b.clear();
            got += n as u64;
            src.settle(true);
        }
        println!("{} {} {} {} {}", got, spate::dpdk::lcore::tsc() - start, 0, spate::dpdk::lcore::tsc_hz(), src.cycles);
        return;
    }
    let mut spec = PortSpec::new(a_port.name()).addr("198.18.0.2/24").unwrap();
    spec.mac = Some(SPATE_MAC);
    let mut cfg = StackConfig {
        lcores: eal_lcores.clone(),
        ports: vec![spec],
        stop_on_signal: false,
        announce: false,
        mempool_size: 4095,
        // The same flows on the same sockets in every run (N and 2N).
        hash_seed: Some(0x5ba7e),
        poll: if a.adaptive { spate::config::PollMode::Adaptive } else { spate::config::PollMode::Busy },
        ..StackConfig::default()
    };
    if a.tunnel {
        let mut t = VxlanSpec::new(42, PEER_IP.into());
        t.ipv4.push("198.19.0.2/24".parse().unwrap());
        cfg.vxlan.push(t);
    }
    let name = format!("pipeline-{}", std::process::id());
    if a.capture {
        cfg.name = Some(name.clone());
    }
    let stack = Stack::new(cfg).expect("stack");
    // The process may end while the capture's thread still holds the
    // stack: its endpoint's socket goes with this guard.
    let _endpoint = a.capture.then(|| {
        attach_capture(&name);
        RemoveOnDrop(Path::new("/run/spate").join(format!("{name}.sock")))
    });
    if let Some(seg) = a.send {
        transmit(&stack, source, seg, a.gso, a.datagrams, start);
        return;
    }
    if a.echo.is_some() {
        echo(&stack, source, a.datagrams, start, !a.queued);
        return;
    }
    // With several lcores, one socket per lcore, each fed by its lcore.
    let members = if a.lcores > 1 { a.lcores } else { a.sockets };
    let sockets: Vec<UdpSocket> = (0..members)
        .map(|i| {
            let mut b = UdpSocket::builder(&stack).reuseport(members > 1).recv_buffer_size(1 << 22);
            if a.lcores > 1 {
                b = b.incoming_lcore(i as u32);
            }
            let s = b.bind("0.0.0.0:9").unwrap();
            s.set_nonblocking(true).unwrap();
            s.set_gro(a.gro).unwrap();
            s
        })
        .collect();
    let sockets = Arc::new(sockets);
    let source = Arc::new(Mutex::new(Some(source)));
    let source_cycles = Arc::new(AtomicU64::new(0));
    let consumed = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let (s, src, c, k, target) = (sockets.clone(), source.clone(), consumed.clone(), calls.clone(), a.datagrams);
    let sc = source_cycles.clone();
    let per_call = if a.one_by_one { 1 } else { 64 };
    let (lcores, yield_idle, staged) = (a.lcores, a.yield_idle, !a.queued && !a.one_by_one);
    stack
        .run(move |idx| {
            let (s, c, k, sc) = (s.clone(), c.clone(), k.clone(), sc.clone());
            // The source runs on the lcore that polls the port (the first).
            let mut src = if idx == 0 { src.lock().unwrap().take() } else { None };
            let mut batch = DatagramBatch::with_capacity(128);
            let first = s[0].id();
            let mut last_busy = 0;
            move |ctx: &mut LcoreCtx<'_>| {
                if let Some(src) = src.as_mut() {
                    // The previous iteration's source cycles count if the
                    // stack counted that iteration busy.
                    let busy = ctx.stack().lcore_load(idx).0;
                    src.settle(busy != last_busy);
                    last_busy = busy;
                    // With several lcores, at most IN_FLIGHT frames between
                    // the source and the readers, so that the other
                    // lcores' rings never overflow: the costs are those of
                    // lcores that keep up (a full ring of 4,096 mbufs
                    // cycling is a working set past the caches), and under
                    // valgrind, which runs one thread at a time, the
                    // readers get their turn. Those dropped on the way
                    // count as arrived, read only when the window is full.
                    let arrived = || c.load(Ordering::Relaxed) + ctx.stack().counters().rx_drops();
                    if lcores == 1
                        || src.sent < c.load(Ordering::Relaxed) + IN_FLIGHT
                        || src.sent < arrived() + IN_FLIGHT
                    {
                        src.inject();
                    } else if yield_idle {
                        std::thread::yield_now();
                    }
                }
                // This burst's datagrams where the lcore staged them (not
                // with `--queued` or `--one-by-one`: those read through the
                // receive queues, as a thread reads), then the sockets this
                // lcore queued to (ids are consecutive from the first), all
                // into one batch (`recv_batch` appends), which is read and
                // freed once, in bulk, when full or at the end.
                let mut n = 0;
                if staged {
                    ctx.recv_staged(|_, staged| {
                        k.fetch_add(1, Ordering::Relaxed);
                        staged.move_to(&mut batch);
                        if batch.len() >= 64 {
                            n += consume(&mut batch);
                        }
                    });
                }
                for id in ctx.ready() {
                    let sock = &s[(id - first) as usize];
                    // A short batch means the queue is empty (as a short
                    // `recvmmsg` does): no call just to hear `WouldBlock`.
                    while let Ok(got) = sock.recv_batch(&mut batch, per_call) {
                        k.fetch_add(1, Ordering::Relaxed);
                        if batch.len() >= 64 {
                            n += consume(&mut batch);
                        }
                        if got < per_call {
                            break;
                        }
                    }
                }
                n += consume(&mut batch);
                if yield_idle && n == 0 && src.is_none() {
                    std::thread::yield_now();
                }
                if let Some(src) = src.as_mut() {
                    src.drain();
                    sc.store(src.cycles, Ordering::Relaxed);
                }
                if n > 0 && c.fetch_add(n, Ordering::Relaxed) + n >= target {
                    ctx.stack().stop();
                }
                // Once the source is done, datagrams dropped on the way
                // (a full ring to a busy lcore) count as arrived.
                if src.as_ref().is_some_and(|s| s.sent >= s.target) {
                    let counters = ctx.stack().counters();
                    if c.load(Ordering::Relaxed) + counters.rx_drops() >= target {
                        ctx.stack().stop();
                    }
                }
            }
        })
        .expect("run");
    let busy: Vec<String> = (0..a.lcores).map(|i| stack.lcore_load(i).0.to_string()).collect();
    println!(
        "{} {} {} {} {} {} {} {} {}",
        consumed.load(Ordering::Relaxed),
        spate::dpdk::lcore::tsc() - start,
        calls.load(Ordering::Relaxed),
        spate::dpdk::lcore::tsc_hz(),
        source_cycles.load(Ordering::Relaxed),
        stack.lcore_steer_cycles(0),
        stack.counters()[spate::Counter::SteerFrames],
        stack.counters().rx_drops(),
        busy.join(" ")
    );
}

/// Transmit: the callback sends `seg`-byte datagrams to the peer, 64 per
/// iteration, in one GSO call or in 64 calls, until `target` reached the
/// wire; prints `datagrams cycles calls`.
pub(crate) fn transmit(stack: &Stack, source: Source, seg: usize, gso: bool, target: u64, start: u64) {
    let sock = Arc::new(UdpSocket::bind(stack, "0.0.0.0:0").expect("bind"));
    sock.set_nonblocking(true).unwrap();
    let done = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let (s, d) = (sock.clone(), done.clone());
    let source = Mutex::new(Some(source));
    let src_cell = Arc::new(source);
    stack
        .run(move |_| {
            let (s, d) = (s.clone(), d.clone());
            let mut src = src_cell.lock().unwrap().take().expect("one lcore");
            let buf = vec![0x5au8; 64 * seg];
            let to: std::net::SocketAddr = (PEER_IP, 9).into();
            let mut calls = 0u64;
            move |ctx: &mut LcoreCtx<'_>| {
                src.drain();
                if gso {
                    if s.send_to_segmented(&buf, seg, to).is_ok() {
                        calls += 1;
                    }
                } else {
                    for _ in 0..64 {
                        if s.send_to(&buf[..seg], to).is_ok() {
                            calls += 1;
                        }
                    }
                }
                if src.wire >= target {
                    d.0.store(src.wire, Ordering::Relaxed);
                    d.1.store(calls, Ordering::Relaxed);
                    ctx.stack().stop();
                }
            }
        })
        .expect("run");
    println!(
        "{} {} {} {}",
        done.0.load(Ordering::Relaxed),
        spate::dpdk::lcore::tsc() - start,
        done.1.load(Ordering::Relaxed),
        spate::dpdk::lcore::tsc_hz()
    );
}

/// Echo: the callback answers every datagram on port 7 as spate-echo does
/// (the received buffer goes back out), until `target` datagrams were
/// echoed; prints `datagrams cycles payload-bytes hz`.
pub(crate) fn echo(stack: &Stack, source: Source, target: u64, start: u64, staged: bool) {
    let sock = Arc::new(UdpSocket::builder(stack).recv_buffer_size(1 << 22).bind("0.0.0.0:7").expect("bind"));
    sock.set_nonblocking(true).unwrap();
    let done = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let (s, d) = (sock.clone(), done.clone());
    let src_cell = Arc::new(Mutex::new(Some(source)));
    stack
        .run(move |_| {
            let (s, d) = (s.clone(), d.clone());
            let mut src = src_cell.lock().unwrap().take().expect("one lcore");
            let mut batch = DatagramBatch::with_capacity(64);
            let (mut n, mut bytes) = (0u64, 0u64);
            move |ctx: &mut LcoreCtx<'_>| {
                src.inject();
                // This burst's datagrams where the lcore staged them, then
                // what the queue holds, if the lcore queued any.
                if staged {
                    ctx.recv_staged(|_, staged| {
                        let replies = staged.drain().map(|dg| {
                            bytes += dg.len() as u64;
                            dg.into_send_buf()
                        });
                        n += s.send_replies(replies).unwrap_or(0) as u64;
                    });
                }
                // A short batch means the queue is empty (as a short
                // `recvmmsg` does): no call just to hear `WouldBlock`.
                let queued = !ctx.ready().is_empty();
                while let Some(Ok(got)) = queued.then(|| s.recv_batch(&mut batch, 64)) {
                    let replies = batch.drain().map(|dg| {
                        bytes += dg.len() as u64;
                        dg.into_send_buf()
                    });
                    n += s.send_replies(replies).unwrap_or(0) as u64;
                    if got < 64 {
                        break;
                    }
                }
                src.drain();
                if n >= target {
                    d.0.store(n, Ordering::Relaxed);
                    d.1.store(bytes, Ordering::Relaxed);
                    ctx.stack().stop();
                }
            }
        })
        .expect("run");
    let (n, bytes) = (done.0.load(Ordering::Relaxed), done.1.load(Ordering::Relaxed));
    assert!(n >= target, "echoed {n} of {target}");
    println!("{n} {} {bytes} {}", spate::dpdk::lcore::tsc() - start, spate::dpdk::lcore::tsc_hz());
}

/// Removes a file when dropped.
pub(crate) struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Attaches a capture to the stack named `name`, as spate-dump does, and
/// reads it on a thread of its own until the stack goes.
pub(crate) fn attach_capture(name: &str) {
    use spate::control::{CaptureRequest, Client};
    let path = Path::new("/run/spate").join(format!("{name}.sock"));
    let client = Client::connect(&path).expect("the stack's control endpoint");
    // Room for every frame of the runs: the lcore never finds its lane
    // full, whatever the reader's pace (valgrind runs one thread at a time).
    let req = CaptureRequest { snaplen: Some(128), records: Some(1 << 17), ..Default::default() };
    let (_, mut capture) = client.capture(req).expect("attach a capture");
    std::thread::spawn(move || while let Ok(Some(_)) = capture.next_message() {});
}

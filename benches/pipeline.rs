//! The receive pipeline in one thread, counted in instructions.
//!
//! Everything runs on the calling thread: the stack polls one end of an
//! in-memory wire pair (net_ring) on the EAL main lcore, and its
//! run-to-completion callback plays both the traffic source (it writes
//! 64-byte UDP frames into the other end) and the sink (it takes the
//! datagrams from a socket and reads every payload byte). Run under
//! `valgrind --tool=callgrind` twice, with N and 2N datagrams, the
//! difference of the instruction totals divided by N is the cost of one
//! datagram, repeatable to the instruction on a shared machine.
//!
//! ```text
//! cargo bench --bench pipeline -- [--callgrind] [--datagrams N] [--flows F] [--sockets S] [--burst B] [--lcores L] [--yield-idle] [--queued] [--json PATH]
//! cargo bench --bench pipeline -- --gro-table | --frag-table | --scale-table | --capture-table | --guard
//! ```
//! `--capture` attaches a capture (as `spate-dump` does) before the run;
//! `--capture-table` prints the echo's cost with none and with one.
//! `--guard` prints spate's own instructions per datagram on the paths
//! `cargo xtask perf-guard` holds to their budgets (receive with one
//! socket and with a 64-member group, the group read through its receive
//! queues, echo, and echo with one datagram per loop iteration, `--burst
//! 1`), each less its floor; with
//! `--echo`, `--inject-only` sends every frame straight back unread.
//! `--inject-only` measures the source and a bare rx_burst + free loop
//! without the stack, the floor the stack's cost is read against.
//! `--echo LEN` makes the callback an echo service for LEN-byte datagrams
//! (over 1,472 bytes the source sends each as IPv4 fragments, and spate
//! reassembles them and fragments the reply); `--frag-table` prints
//! 2,000-byte echo against 1,400-byte echo.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use spate::config::VxlanSpec;
use spate::dpdk::{Burst, EalBuilder, Memory, Mempool, MempoolConfig, Port, PortConfig, RxQueue, TxQueue};
use spate::wire::MacAddr;
use spate::{DatagramBatch, LcoreCtx, PortSpec, Stack, StackConfig, UdpSocket};
use spate_testkit::wire_peer::{PEER_IP, PEER_MAC, eth, ip_fragments, udp_datagram, udp_frame};

/// Frames the source keeps in flight at most when several lcores read:
/// a quarter of a hand-off ring, many bursts.
const IN_FLIGHT: u64 = 1024;

const SPATE_MAC: MacAddr = MacAddr([0x02, 0x53, 0x50, 0x41, 0x54, 0x45]);

struct Source {
    /// Frames written per call (at most 32).
    burst: u64,
    tx: TxQueue,
    rx: RxQueue,
    pool: Arc<Mempool>,
    frames: Vec<Vec<u8>>,
    sent: u64,
    target: u64,
    /// Frames spate sent, ARP requests aside.
    wire: u64,
    /// The answer to spate's ARP request for the peer.
    arp_reply: Vec<u8>,
    /// TSC cycles spent in `inject` and `drain` in the lcore's busy loop
    /// iterations: the benchmark's own work on the lcore it shares, taken
    /// out of that lcore's busy cycles.
    cycles: u64,
    /// Those of the current iteration, counted once the stack has said
    /// whether it was busy (an idle iteration's are not in its busy
    /// cycles).
    pending: u64,
}

impl Source {
    /// Writes up to `burst` frames into the wire.
    fn inject(&mut self) {
        let t = spate::dpdk::lcore::tsc();
        self.inject_frames();
        self.pending += spate::dpdk::lcore::tsc().wrapping_sub(t);
    }

    /// Counts the last iteration's cycles if it was `busy`.
    fn settle(&mut self, busy: bool) {
        if busy {
            self.cycles += self.pending;
        }
        self.pending = 0;
    }

    fn inject_frames(&mut self) {
        let n = (self.target - self.sent).min(self.burst) as usize;
        if n == 0 {
            return;
        }
        let mut b: Burst = Burst::new();
        if self.pool.alloc_bulk(&mut b, n).is_err() {
            return;
        }
        for (i, m) in b.as_mut_slice().iter_mut().enumerate() {
            let f = &self.frames[(self.sent as usize + i) % self.frames.len()];
            m.append(f.len()).expect("room").copy_from_slice(f);
        }
        self.sent += self.tx.tx_burst(&mut b) as u64;
    }

    /// Frees what the stack sent, answering its ARP request for the peer.
    fn drain(&mut self) {
        let t = spate::dpdk::lcore::tsc();
        self.drain_frames();
        self.pending += spate::dpdk::lcore::tsc().wrapping_sub(t);
    }

    fn drain_frames(&mut self) {
        let mut b: Burst = Burst::new();
        while self.rx.rx_burst(&mut b) > 0 {
            for m in b.drain() {
                if u16::from_be_bytes([m.data()[12], m.data()[13]]) != 0x0806 {
                    self.wire += 1;
                    continue;
                }
                let mut r: Burst = Burst::new();
                if self.pool.alloc_bulk(&mut r, 1).is_ok() {
                    let mut reply = r.drain().next().expect("one");
                    reply.append(self.arp_reply.len()).expect("room").copy_from_slice(&self.arp_reply);
                    let mut out: Burst = Burst::new();
                    let _ = out.push(reply);
                    self.tx.tx_burst(&mut out);
                }
            }
        }
    }
}

/// Reads every payload byte of the batch and frees it; returns the
/// datagrams it held (a coalesced one counting its segments). A
/// contiguous datagram is read as an application reads one, through
/// `data`; a chain segment by segment.
fn consume(batch: &mut DatagramBatch) -> u64 {
    let mut n = 0;
    for d in batch.iter() {
        if d.is_contiguous() {
            std::hint::black_box(read_every_byte(d.data()));
        } else {
            for seg in d.segments() {
                std::hint::black_box(read_every_byte(seg));
            }
        }
        n += d.gso_size().map_or(1, |g| d.len().div_ceil(g) as u64);
    }
    batch.clear();
    n
}

fn read_every_byte(data: &[u8]) -> u64 {
    let mut chunks = data.chunks_exact(8);
    let mut acc = 0u64;
    for c in &mut chunks {
        acc = acc.wrapping_add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
    }
    for &b in chunks.remainder() {
        acc = acc.wrapping_add(b as u64);
    }
    acc
}

struct Args {
    datagrams: u64,
    flows: usize,
    sockets: usize,
    inject_only: bool,
    /// A VXLAN tunnel registered on the stack (traffic does not use it).
    tunnel: bool,
    /// The sockets take coalesced datagrams (UDP GRO).
    gro: bool,
    /// Transmit instead: datagrams of this payload, sent by the callback.
    send: Option<usize>,
    /// With `send`: 64 at a time with UDP GSO, one call per 64.
    gso: bool,
    /// Receive one datagram per call (as `recvmsg` does) instead of batches.
    one_by_one: bool,
    /// Echo datagrams of this payload (fragmented above 1,472 bytes).
    echo: Option<usize>,
    /// Polling lcores (receive mode): with 2, software RSS hands half the
    /// flows to the second lcore.
    lcores: usize,
    /// Frames the source writes per loop iteration (1 to 32): 1 is a
    /// stream so thin that every datagram is a burst of its own.
    burst: u64,
    /// Lcores that found nothing to do yield the CPU: under valgrind,
    /// which runs one thread at a time, the other lcore then runs at once
    /// instead of after a spinning time slice.
    yield_idle: bool,
    /// The reader takes its datagrams through the receive queue
    /// (`UdpSocket::recv_batch`, as a thread reads) instead of where the
    /// lcore staged them (`LcoreCtx::recv_staged`).
    queued: bool,
    /// A capture is attached through the control endpoint (as
    /// `spate-dump` attaches one, snap length 128, room for every frame),
    /// read by a thread that discards it.
    capture: bool,
    /// `--poll adaptive`: the stack polls adaptively (the load keeps it
    /// awake: what that costs a busy lcore).
    adaptive: bool,
}

fn parse() -> (Args, bool, Option<String>) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let a = Args {
        datagrams: flag("--datagrams").and_then(|v| v.parse().ok()).unwrap_or(200_000),
        flows: flag("--flows").and_then(|v| v.parse().ok()).unwrap_or(16),
        sockets: flag("--sockets").and_then(|v| v.parse().ok()).unwrap_or(1),
        inject_only: args.iter().any(|a| a == "--inject-only"),
        tunnel: args.iter().any(|a| a == "--tunnel"),
        gro: args.iter().any(|a| a == "--gro"),
        send: flag("--send").and_then(|v| v.parse().ok()),
        gso: args.iter().any(|a| a == "--gso"),
        one_by_one: args.iter().any(|a| a == "--one-by-one"),
        echo: flag("--echo").and_then(|v| v.parse().ok()),
        lcores: flag("--lcores").and_then(|v| v.parse().ok()).unwrap_or(1),
        burst: flag("--burst").and_then(|v| v.parse().ok()).unwrap_or(32u64).clamp(1, 32),
        yield_idle: args.iter().any(|a| a == "--yield-idle"),
        queued: args.iter().any(|a| a == "--queued"),
        capture: args.iter().any(|a| a == "--capture"),
        adaptive: flag("--poll").as_deref() == Some("adaptive"),
    };
    (a, args.iter().any(|a| a == "--callgrind"), flag("--json"))
}

/// One run in this process; prints `datagrams cycles`.
fn run_once(a: &Args) {
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
fn transmit(stack: &Stack, source: Source, seg: usize, gso: bool, target: u64, start: u64) {
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
fn echo(stack: &Stack, source: Source, target: u64, start: u64, staged: bool) {
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
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Attaches a capture to the stack named `name`, as spate-dump does, and
/// reads it on a thread of its own until the stack goes.
fn attach_capture(name: &str) {
    use spate::control::{CaptureRequest, Client};
    let path = Path::new("/run/spate").join(format!("{name}.sock"));
    let client = Client::connect(&path).expect("the stack's control endpoint");
    // Room for every frame of the runs: the lcore never finds its lane
    // full, whatever the reader's pace (valgrind runs one thread at a time).
    let req = CaptureRequest { snaplen: Some(128), records: Some(1 << 17), ..Default::default() };
    let (_, mut capture) = client.capture(req).expect("attach a capture");
    std::thread::spawn(move || while let Ok(Some(_)) = capture.next_message() {});
}

/// Echo of 64-byte datagrams with no capture and with one attached:
/// the lcore's instructions per datagram (callgrind, its thread alone,
/// less the echo's floor) and cycles per datagram natively, the two
/// taking turns.
fn capture_table(json: Option<String>) {
    let n = 10_000;
    let base: Vec<String> = ["--echo", "64", "--flows", "16"].map(String::from).to_vec();
    let with = |extra: &str| -> Vec<String> {
        let mut v = base.clone();
        v.push(extra.into());
        v
    };
    // The lcore's thread alone: the capture's writer is another.
    let floor = lcore_instructions_per_datagram(&with("--inject-only"), n);
    let none = lcore_instructions_per_datagram(&base, n) - floor;
    let attached = lcore_instructions_per_datagram(&with("--capture"), n) - floor;
    let cycles = cycles_per_datagram(&[base.clone(), with("--capture")], 300_000);
    println!("CPU: {}", spate_testkit::cpu_model());
    println!("Echo of 64-byte datagrams (16 flows): a request and its reply captured per datagram, snap length 128");
    println!("| capture | the lcore's own instructions per datagram | cycles per datagram |");
    println!("|---|---|---|");
    println!("| none | {none:.1} | {:.1} |", cycles[0]);
    println!("| attached | {attached:.1} | {:.1} |", cycles[1]);
    println!("| attached less none | {:.1} | {:.1} |", attached - none, cycles[1] - cycles[0]);
    if let Some(path) = json {
        let body = serde_json::json!({
            "bench": "pipeline-capture", "cpu": spate_testkit::cpu_model(), "floor": floor,
            "none": none, "attached": attached, "cycles_none": cycles[0], "cycles_attached": cycles[1],
        });
        std::fs::write(path, body.to_string()).expect("write JSON");
    }
}

/// What `cargo xtask perf-guard` holds to its budget: spate's own
/// instructions per datagram (the path minus its floor), 16 flows of
/// 64-byte datagrams, on small runs. Prints one `perf-guard` line.
fn guard(json: Option<String>) {
    let n = 10_000;
    let args = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["--flows", "16"].map(String::from).to_vec();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let floor = instructions_per_datagram(&args(&["--inject-only"]), n);
    let one = instructions_per_datagram(&args(&["--sockets", "1"]), n) - floor;
    let group = instructions_per_datagram(&args(&["--sockets", "64"]), n) - floor;
    // The same group read through its receive queues, as threads read.
    let queued = instructions_per_datagram(&args(&["--sockets", "64", "--queued"]), n) - floor;
    let echo_floor = instructions_per_datagram(&args(&["--echo", "64", "--inject-only"]), n);
    let echo = instructions_per_datagram(&args(&["--echo", "64"]), n) - echo_floor;
    // One datagram per loop iteration: what every iteration costs besides
    // its datagrams, paid by each one when the stream is thin.
    let thin_floor = instructions_per_datagram(&args(&["--echo", "64", "--inject-only", "--burst", "1"]), n);
    let thin = instructions_per_datagram(&args(&["--echo", "64", "--burst", "1"]), n) - thin_floor;
    println!("spate's own instructions per datagram (callgrind, 16 flows, 64 bytes, {n} and {} datagrams):", 2 * n);
    println!("| path | floor | spate's own |");
    println!("|---|---|---|");
    println!("| receive, 1 socket | {floor:.1} | {one:.1} |");
    println!("| receive, 64-member group | {floor:.1} | {group:.1} |");
    println!("| receive, 64-member group, read through the queues | {floor:.1} | {queued:.1} |");
    println!("| echo (reply in the request's mbuf) | {echo_floor:.1} | {echo:.1} |");
    println!("| echo, one datagram per loop iteration | {thin_floor:.1} | {thin:.1} |");
    println!(
        "perf-guard receive_1_socket={one:.1} receive_64_group={group:.1} receive_64_group_queued={queued:.1} \
         echo={echo:.1} echo_burst_1={thin:.1}"
    );
    if let Some(path) = json {
        let body = serde_json::json!({
            "bench": "pipeline-guard", "floor": floor, "receive_1_socket": one,
            "receive_64_group": group, "receive_64_group_queued": queued, "echo_floor": echo_floor, "echo": echo,
            "echo_burst_1_floor": thin_floor, "echo_burst_1": thin,
        });
        std::fs::write(path, body.to_string()).expect("write JSON");
    }
}

/// 2,000-byte datagrams (two fragments each way) against 1,400-byte ones
/// through the echo service, natively.
fn frag_table(json: Option<String>) {
    let runs = native(
        &[
            ["--echo", "1400", "--flows", "16"].map(String::from).to_vec(),
            ["--echo", "2000", "--flows", "16"].map(String::from).to_vec(),
        ],
        300_000,
    );
    let (small, large) = (runs[0], runs[1]);
    let rate = |r: &Run| r.per_second(r.datagrams);
    // `calls` carries the payload bytes echoed in this mode.
    let gbit = |r: &Run| r.per_second(r.calls) * 8.0 / 1e9;
    println!("Echo through spate, one lcore, net_ring wire (native, median of 5 alternating rounds of 300,000):");
    println!("| datagrams | echoed/s | payload Gbit/s each way | frames per datagram each way |");
    println!("|---|---|---|---|");
    println!("| 1,400 bytes | {:.3} M | {:.2} | 1 |", rate(&small) / 1e6, gbit(&small));
    println!("| 2,000 bytes (reassembled, reply fragmented) | {:.3} M | {:.2} | 2 |", rate(&large) / 1e6, gbit(&large));
    println!("| 2,000 / 1,400 | {:.3} | {:.3} | 2 |", rate(&large) / rate(&small), gbit(&large) / gbit(&small));
    if let Some(path) = json {
        let body = serde_json::json!({
            "bench": "pipeline-frag",
            "echo1400_per_s": rate(&small), "echo2000_per_s": rate(&large),
            "echo1400_gbit": gbit(&small), "echo2000_gbit": gbit(&large),
        });
        std::fs::write(path, body.to_string()).expect("write JSON");
    }
}

/// One lcore against two with software RSS, and the model of how it
/// scales. Natively, busy cycles per datagram with the benchmark's own
/// source timed and taken out (a real RX lcore has none), the steering
/// timed around it on the RX lcore; under callgrind, the same parts in
/// instructions, function by function (the threads' totals would count
/// their idle polls, which depend on how valgrind interleaves them). The
/// prediction for 1 to 16 lcores is printed beside the measurements.
fn scale_table(json: Option<String>) {
    let n = 1_000_000;
    let runs = native(
        &[
            ["--flows", "16"].map(String::from).to_vec(),
            ["--flows", "16", "--lcores", "2"].map(String::from).to_vec(),
            ["--flows", "16", "--inject-only"].map(String::from).to_vec(),
        ],
        n,
    );
    let (one, two, floor) = (runs[0], runs[1], runs[2]);
    let hz = one.hz;
    let per = |r: &Run, x: f64| x / r.datagrams;
    let source = per(&one, one.source);
    let c1 = per(&one, one.busy[0] - one.source); // one lcore: rx_burst, the stack, read, free
    let f = per(&floor, floor.cycles - floor.source); // rx_burst + read + free, no stack
    let p = c1 - f; // the stack's own work
    let b0 = per(&two, two.busy[0] - two.source); // the RX lcore at 2
    let s = per(&two, two.steer); // every frame of the stream passes the steering
    let local = 1.0 - two.handed / two.datagrams; // the RX lcore's own share of the stream
    let r = b0 - c1 * local; // what the RX lcore does beyond its own datagrams
    let q = two.busy[1] / two.handed.max(1.0); // a handed datagram on its owner
    println!(
        "Scaling: one lcore against two with software RSS (net_ring wire, 16 flows, 64-byte frames; busy cycles, the benchmark's source timed and taken out; median of 5 alternating rounds of 1,000,000):"
    );
    println!("| measured | cycles |");
    println!("|---|---|");
    println!("| the benchmark's source, per datagram (taken out of every lcore figure) | {source:.1} |");
    println!("| 1 lcore, per datagram (C1) | {c1:.1} |");
    println!("| rx_burst + read + free, no stack (F) | {f:.1} |");
    println!("| the stack's own work, C1 - F (p) | {p:.1} |");
    println!("| 2 lcores: the RX lcore, per datagram of the stream (B0) | {b0:.1} |");
    println!("| the RX lcore's steering per frame, timed around it (s) | {s:.1} |");
    println!(
        "| the RX lcore's part beyond its own {:.0}% of the datagrams, B0 - C1 x {local:.2} (r) | {r:.1} |",
        local * 100.0
    );
    println!("| a handed-over datagram on its owner, its busy cycles / datagrams handed (q) | {q:.1} |");
    println!("| the owner's extra for a handed-over datagram, q - C1 | {:.1} |", q - c1);
    let moved = line_move_cycles(0, 1);
    if let Some(m) = moved {
        println!(
            "| a cache line written on CPU 0 and read on CPU 1 (the lcores' CPUs; ping-pong, a round trip halved, median of 7); q - C1 in such moves | {m:.1}; {:.1} |",
            (q - c1) / m
        );
    }
    println!();
    // An application that spends W cycles on each datagram (on the lcore
    // owning its flow) adds W to every term that processes datagrams.
    const W: f64 = 1000.0;
    println!(
        "Model (busiest lcore: software RSS max(r + (C1 + W)/N, (q + W)/N); hardware RSS (C1 + W)/N, no hand-off; W = 0 \
         as measured, and W = {W} cycles of application work per datagram):"
    );
    println!(
        "| lcores | software RSS Mpps | busiest lcore | hardware RSS Mpps | one lcore = 1.00: sw / hw | W = {W}: sw / hw |"
    );
    println!("|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    let busiest = |nf: f64, w: f64| {
        if nf == 1.0 {
            return (c1 + w, "the one");
        }
        let (rx, other) = (r + (c1 + w) / nf, (q + w) / nf);
        if rx >= other { (rx, "RX lcore") } else { (other, "owners") }
    };
    for lcores in [1usize, 2, 4, 8, 16] {
        let nf = lcores as f64;
        let (sw, who) = busiest(nf, 0.0);
        let (sw_w, _) = busiest(nf, W);
        let hw = c1 / nf;
        println!(
            "| {lcores} | {:.2} | {who} | {:.2} | {:.2} / {:.2} | {:.2} / {:.2} |",
            hz / sw / 1e6,
            hz / hw / 1e6,
            c1 / sw,
            c1 / hw,
            (c1 + W) / sw_w,
            nf
        );
        rows.push(serde_json::json!({
            "lcores": lcores, "sw_mpps": hz / sw / 1e6, "hw_mpps": hz / hw / 1e6, "sw_w1000_speedup": (c1 + W) / sw_w,
        }));
    }
    println!(
        "measured at 2 lcores (wall, the source on the RX lcore): {:.2} Mpps against {:.2} with one",
        two.per_second(two.datagrams) / 1e6,
        one.per_second(one.datagrams) / 1e6
    );
    println!();
    let counted = scale_instructions();
    if let Some(path) = json {
        let mut body = serde_json::json!({
            "bench": "pipeline-scale", "source": source, "c1": c1, "floor": f, "p": p, "b0": b0, "s": s, "r": r,
            "q": q, "line_move": moved, "rows": rows,
        });
        if let Some((steer, handed, local)) = counted {
            body["instructions"] = serde_json::json!({"steer": steer, "handed": handed, "local": local});
        }
        std::fs::write(path, body.to_string()).expect("write JSON");
    }
}

/// TSC cycles for a cache line written on CPU `a` to be read on CPU `b`:
/// the median of seven exchanges (a vCPU descheduled mid-exchange makes
/// one read several times the rest). See [`line_move_once`].
fn line_move_cycles(a: usize, b: usize) -> Option<f64> {
    let moves = (0..7).map(|_| line_move_once(a, b)).collect::<Option<Vec<f64>>>()?;
    Some(spate_testkit::stats::median(&moves))
}

/// One exchange for [`line_move_cycles`]: two threads pinned to `a` and
/// `b` pass a counter back and forth through one line, and a round trip
/// is two moves. The price every line a hand-off touches pays (the
/// frame's mbuf header and data, the ring's slots); None when a thread
/// cannot be pinned or the other stalls.
fn line_move_once(a: usize, b: usize) -> Option<f64> {
    #[repr(align(128))]
    struct Line(AtomicU64);
    const ROUNDS: u64 = 50_000;
    let line = Line(AtomicU64::new(0));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // Waits for the counter to reach `want`; false past the deadline.
    let wait = |want: u64| {
        let mut spins = 0u64;
        while line.0.load(Ordering::Acquire) != want {
            spins += 1;
            if spins.is_multiple_of(1 << 20) && std::time::Instant::now() > deadline {
                return false;
            }
            std::hint::spin_loop();
        }
        true
    };
    // Each side waits for its turn's value and writes the next; the first
    // side times the whole exchange.
    let side = |cpu: usize, odd: u64| {
        spate_testkit::pin_to_cpu(cpu).ok()?;
        let start = spate::dpdk::lcore::tsc();
        for i in 0..ROUNDS {
            if !wait(2 * i + odd) {
                return None;
            }
            line.0.store(2 * i + odd + 1, Ordering::Release);
        }
        Some(spate::dpdk::lcore::tsc() - start)
    };
    // Both sides on threads of their own: pinning the caller would pin
    // everything the benchmark starts after it.
    let (first, _) = std::thread::scope(|s| {
        let other = s.spawn(|| side(b, 1));
        let first = s.spawn(|| side(a, 0)).join().ok().flatten();
        (first, other.join().ok().flatten())
    });
    Some(first? as f64 / ROUNDS as f64 / 2.0)
}

/// The scale table's parts in instructions: the RX lcore's steering per
/// frame, a handed frame through the owner's pipeline, and a local frame
/// through the same pipeline on the RX lcore. Each is one function's
/// inclusive count under callgrind (`--toggle-collect`), from runs of N
/// and 2N datagrams, idle lcores yielding (`--yield-idle`): valgrind runs
/// one thread at a time, and the source's window keeps the ring to the
/// other lcore from overflowing (without it the frees of the dropped
/// frames counted as steering). A run that dropped anything fails.
fn scale_instructions() -> Option<(f64, f64, f64)> {
    if Command::new("valgrind").arg("--version").output().is_err() {
        println!("(valgrind missing: the instruction counts are left out; apt-get install valgrind)");
        return None;
    }
    let n = 20_000u64;
    let me = std::env::current_exe().expect("own path");
    // (instructions inside `function`, frames handed) of a
    // run; with `from`, only its calls from that function.
    let extra = ["--flows", "16", "--lcores", "2", "--yield-idle"].map(String::from);
    let toggled = |function: &str, from: Option<&str>, datagrams: u64| -> (f64, f64) {
        let out = PathBuf::from(format!("/tmp/spate-callgrind-scale-{}-{datagrams}.out", std::process::id()));
        let toggle = [format!("--toggle-collect=*{function}*")];
        let run = callgrind(&out, &toggle, &me, &extra, datagrams).output().expect("valgrind");
        assert!(run.status.success(), "callgrind run failed: {}", String::from_utf8_lossy(&run.stderr));
        let v: Vec<f64> =
            String::from_utf8_lossy(&run.stdout).split_whitespace().filter_map(|w| w.parse().ok()).collect();
        // With `from`, the callers above each function (`< caller (Nx)`).
        let mut annotate = Command::new("callgrind_annotate");
        annotate.args(["--inclusive=yes", "--threshold=100"]).args(from.map(|_| "--tree=caller")).arg(&out);
        let text = String::from_utf8_lossy(&annotate.output().expect("callgrind_annotate").stdout).into_owned();
        let _ = std::fs::remove_file(&out);
        let count = |line: &str| -> f64 {
            line.split_whitespace().next().map_or(0.0, |c| c.replace(',', "").parse().unwrap_or(0.0))
        };
        let total = match from {
            Some(caller) => {
                let line = text.lines().find(|l| l.contains("  < ") && l.contains(&format!("::{caller} (")));
                count(line.unwrap_or_else(|| panic!("no call of {function} from {caller} in:\n{text}")))
            }
            None => text.lines().find(|l| l.contains("PROGRAM TOTALS")).map_or(0.0, count),
        };
        assert_eq!(v.get(7).copied(), Some(0.0), "frames dropped on the way: {v:?}");
        (total, v.get(6).copied().unwrap_or(0.0))
    };
    let diff = |function: &str, from: Option<&str>| {
        let (a, ha) = toggled(function, from, n);
        let (b, hb) = toggled(function, from, 2 * n);
        (b - a, hb - ha)
    };
    let (steer, _) = diff("steer_burst", None);
    let (handed, frames) = diff("rx_handed_frames", None);
    // The RX lcore's own frames: receive_burst called from its loop (poll_rx is
    // inlined there), in the same run, on the same reuseport group.
    let (local, _) = diff("receive_burst", Some("run"));
    let (steer, handed, local) = (steer / n as f64, handed / frames.max(1.0), local / (n as f64 - frames).max(1.0));
    println!(
        "The same parts in instructions (callgrind, one function's inclusive count, {n} and {} datagrams):",
        2 * n
    );
    println!("| counted | instructions |");
    println!("|---|---|");
    println!("| the RX lcore's steering per frame (steer_burst) | {steer:.1} |");
    println!("| a handed-over frame through its owner's pipeline (rx_handed_frames) | {handed:.1} |");
    println!("| a local frame through the same pipeline, on the RX lcore (receive_burst) | {local:.1} |");
    println!("| the owner's extra instructions for a handed-over frame | {:.1} |", handed - local);
    Some((steer, handed, local))
}

/// Total instructions of a run of `exe` (this benchmark, or another build
/// of it) under callgrind.
fn callgrind_of(me: &Path, extra: &[String], datagrams: u64) -> u64 {
    let out = PathBuf::from(format!("/tmp/spate-callgrind-{}-{datagrams}.out", std::process::id()));
    let status = callgrind(&out, &[], me, extra, datagrams).status().expect("valgrind (apt-get install valgrind)");
    assert!(status.success(), "callgrind run failed");
    let text = std::fs::read_to_string(&out).expect("callgrind output");
    let _ = std::fs::remove_file(&out);
    text.lines()
        .find_map(|l| l.strip_prefix("summary: ").or_else(|| l.strip_prefix("totals: ")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("callgrind summary line")
}

/// Like [`instructions_per_datagram`], counting the main thread alone
/// (the polling lcore in these runs): a capture's writer thread does work
/// whose amount depends on how valgrind schedules it.
fn lcore_instructions_per_datagram(extra: &[String], n: u64) -> f64 {
    let me = std::env::current_exe().expect("own path");
    let main_thread = |datagrams: u64| -> u64 {
        let out = PathBuf::from(format!("/tmp/spate-callgrind-t-{}-{datagrams}.out", std::process::id()));
        let tool = ["--separate-threads=yes".to_string()];
        let status = callgrind(&out, &tool, &me, extra, datagrams).status().expect("valgrind");
        assert!(status.success(), "callgrind run failed");
        // One file per thread, `-01` the main one.
        let first = PathBuf::from(format!("{}-01", out.display()));
        let text = std::fs::read_to_string(&first).expect("callgrind output of the main thread");
        for t in 1..=64 {
            let _ = std::fs::remove_file(format!("{}-{t:02}", out.display()));
        }
        text.lines()
            .find_map(|l| l.strip_prefix("summary: ").or_else(|| l.strip_prefix("totals: ")))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("callgrind summary line")
    };
    let (one, two) = (main_thread(n), main_thread(2 * n));
    (two as f64 - one as f64) / n as f64
}

/// `exe extra --datagrams N` under callgrind (with `tool` options too),
/// writing its counts to `out`.
fn callgrind(out: &Path, tool: &[String], exe: &Path, extra: &[String], datagrams: u64) -> Command {
    let mut cmd = Command::new("valgrind");
    cmd.args(["--tool=callgrind", "--quiet", &format!("--callgrind-out-file={}", out.display())])
        .args(tool)
        .arg(exe)
        .args(extra)
        .args(["--datagrams", &datagrams.to_string()]);
    cmd
}

/// Instructions per datagram: (Ir(2N) - Ir(N)) / N.
pub fn instructions_per_datagram(extra: &[String], n: u64) -> f64 {
    let me = std::env::current_exe().expect("own path");
    instructions_of(&me, extra, n)
}

fn instructions_of(exe: &Path, extra: &[String], n: u64) -> f64 {
    let one = callgrind_of(exe, extra, n);
    let two = callgrind_of(exe, extra, 2 * n);
    (two - one) as f64 / n as f64
}

/// Cycles per datagram, natively, for each argument list: the runs take
/// turns, five rounds, and each keeps its median.
fn cycles_per_datagram(runs: &[Vec<String>], datagrams: u64) -> Vec<f64> {
    native(runs, datagrams).into_iter().map(|r| r.cycles / r.datagrams).collect()
}

/// What one native run printed: `datagrams cycles calls hz`.
#[derive(Debug, Clone, Copy)]
struct Run {
    datagrams: f64,
    cycles: f64,
    calls: f64,
    hz: f64,
    /// Cycles of the benchmark's source (receive and inject-only modes).
    source: f64,
    /// Cycles the first lcore spent steering (receive mode).
    steer: f64,
    /// Frames handed to another lcore (receive mode).
    handed: f64,
    /// Busy cycles of the first two lcores (receive mode).
    busy: [f64; 2],
}

impl Run {
    fn per_second(&self, n: f64) -> f64 {
        n * self.hz / self.cycles
    }
}

/// Native runs for each argument list, taking turns, five rounds; each
/// keeps the round with its median cycles per datagram.
fn native(runs: &[Vec<String>], datagrams: u64) -> Vec<Run> {
    let me = std::env::current_exe().expect("own path");
    let mut rounds: Vec<Vec<Run>> = vec![Vec::new(); runs.len()];
    for _ in 0..5 {
        for (r, extra) in runs.iter().enumerate() {
            let out = Command::new(&me)
                .args(extra)
                .args(["--datagrams", &datagrams.to_string()])
                .output()
                .expect("run the pipeline");
            assert!(out.status.success(), "pipeline run failed: {}", String::from_utf8_lossy(&out.stderr));
            let text = String::from_utf8_lossy(&out.stdout);
            let v: Vec<f64> = text.split_whitespace().filter_map(|w| w.parse().ok()).collect();
            assert!(v.len() >= 4, "expected `datagrams cycles calls hz`, got {text:?}");
            let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
            rounds[r].push(Run {
                datagrams: v[0],
                cycles: v[1],
                calls: v[2],
                hz: v[3],
                source: at(4),
                steer: at(5),
                handed: at(6),
                busy: [at(8), at(9)],
            });
        }
    }
    rounds
        .into_iter()
        .map(|mut r| {
            r.sort_by(|a, b| (a.cycles / a.datagrams).total_cmp(&(b.cycles / b.datagrams)));
            r[r.len() / 2]
        })
        .collect()
}

/// The same benchmark built without the GRO stage (`--features
/// no-gro-stage`, in a target directory of its own).
fn no_gro_stage_build() -> PathBuf {
    // The benchmarks are spate-apps' targets: the workspace is one up.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("apps/ sits in the workspace");
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .env("CARGO_TARGET_DIR", root.join("target/no-gro-stage"))
        .args(["build", "--release", "-p", "spate-apps", "--bench", "pipeline", "--features", "no-gro-stage"])
        .arg("--message-format=json")
        .output()
        .expect("cargo build");
    assert!(out.status.success(), "building without the GRO stage: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"]["name"] == "pipeline")
        .find_map(|v| v["executable"].as_str().map(PathBuf::from))
        .expect("the no-gro-stage benchmark's path")
}

/// The GRO stage's table: its idle cost, a registered tunnel's cost, GRO
/// against plain delivery, GSO against one send per datagram.
fn gro_table(json: Option<String>) {
    let n = 20_000;
    let base: Vec<String> = ["--flows", "16"].map(String::from).to_vec();
    let stage_idle = instructions_per_datagram(&base, n);
    let no_stage = instructions_of(&no_gro_stage_build(), &base, n);
    let mut tunnel_args = base.clone();
    tunnel_args.push("--tunnel".into());
    let tunnel = instructions_per_datagram(&tunnel_args, n);
    // One flow of equal datagrams (trains as long as a burst), taken one
    // datagram per call as Linux's recvmsg gives them.
    let train: Vec<String> = ["--flows", "1", "--one-by-one"].map(String::from).to_vec();
    let mut gro_args = train.clone();
    gro_args.push("--gro".into());
    let send: Vec<String> = ["--send", "1000"].map(String::from).to_vec();
    let mut gso_args = send.clone();
    gso_args.push("--gso".into());
    let runs = native(&[train, gro_args, send, gso_args], 1_000_000);
    let (plain, gro, one, gso) = (runs[0], runs[1], runs[2], runs[3]);
    println!("GRO stage and UDP GRO/GSO (instructions: callgrind, 16 flows; rates: native, median of 5 rounds)");
    println!("| comparison | measured | ratio | target |");
    println!("|---|---|---|---|");
    println!(
        "| no tunnel registered vs built without the stage | {stage_idle:.1} vs {no_stage:.1} instructions/datagram | {:.4} | <= 1.01 |",
        stage_idle / no_stage
    );
    println!(
        "| a tunnel registered (traffic not for it) vs none | {tunnel:.1} vs {stage_idle:.1} instructions/datagram | {:.4} | report (Linux: about 1.11) |",
        tunnel / stage_idle
    );
    println!(
        "| GRO socket vs plain socket, trains of one flow: datagrams/s to the app | {:.2} vs {:.2} M | {:.3} | report |",
        gro.per_second(gro.datagrams) / 1e6,
        plain.per_second(plain.datagrams) / 1e6,
        gro.per_second(gro.datagrams) / plain.per_second(plain.datagrams)
    );
    println!(
        "| GRO socket vs plain socket: receive calls/s | {:.0} vs {:.0} | {:.3} | report (Linux: 769,065 -> 24,877) |",
        gro.per_second(gro.calls),
        plain.per_second(plain.calls),
        gro.per_second(gro.calls) / plain.per_second(plain.calls)
    );
    println!(
        "| GSO send (64 x 1000 B per call) vs one datagram per call: datagrams/s on the wire | {:.2} vs {:.2} M | {:.3} | report |",
        gso.per_second(gso.datagrams) / 1e6,
        one.per_second(one.datagrams) / 1e6,
        gso.per_second(gso.datagrams) / one.per_second(one.datagrams)
    );
    println!(
        "| GSO vs one per call: send calls/s | {:.0} vs {:.0} | {:.4} | report |",
        gso.per_second(gso.calls),
        one.per_second(one.calls),
        gso.per_second(gso.calls) / one.per_second(one.calls)
    );
    if let Some(path) = json {
        let body = serde_json::json!({
            "bench": "pipeline-gro",
            "stage_idle_ir": stage_idle, "no_stage_ir": no_stage, "tunnel_ir": tunnel,
            "plain_dgrams_per_s": plain.per_second(plain.datagrams), "gro_dgrams_per_s": gro.per_second(gro.datagrams),
            "plain_calls_per_s": plain.per_second(plain.calls), "gro_calls_per_s": gro.per_second(gro.calls),
            "one_dgrams_per_s": one.per_second(one.datagrams), "gso_dgrams_per_s": gso.per_second(gso.datagrams),
        });
        std::fs::write(path, body.to_string()).expect("write JSON");
    }
}

fn main() {
    let (a, under_callgrind, json) = parse();
    if std::env::args().any(|a| a == "--gro-table") {
        gro_table(json);
        return;
    }
    if std::env::args().any(|a| a == "--frag-table") {
        frag_table(json);
        return;
    }
    if std::env::args().any(|a| a == "--scale-table") {
        scale_table(json);
        return;
    }
    if std::env::args().any(|a| a == "--capture-table") {
        capture_table(json);
        return;
    }
    if std::env::args().any(|a| a == "--guard") {
        guard(json);
        return;
    }
    if !under_callgrind {
        run_once(&a);
        return;
    }
    let n = 20_000;
    let mut extra = vec!["--flows".to_string(), a.flows.to_string(), "--sockets".into(), a.sockets.to_string()];
    let stack = instructions_per_datagram(&extra, n);
    extra[3] = "64".into();
    let group = instructions_per_datagram(&extra, n);
    let group_args = extra.clone();
    extra.push("--inject-only".into());
    let floor = instructions_per_datagram(&extra, n);
    let mut single_args = group_args.clone();
    single_args[3] = a.sockets.to_string();
    let cycles = cycles_per_datagram(&[single_args, group_args, extra], 1_000_000);
    println!("instructions per datagram (callgrind, {} flows):", a.flows);
    println!("| path | instructions |");
    println!("|---|---|");
    println!("| source + rx_burst + read + free (no stack) | {floor:.1} |");
    println!("| source + spate: RX -> 1 socket -> recv -> read | {stack:.1} |");
    println!("| source + spate: RX -> 64-member reuseport group -> recv -> read | {group:.1} |");
    println!("| spate's own cost, 1 socket | {:.1} |", stack - floor);
    println!("| spate's own cost, 64-member group | {:.1} |", group - floor);
    println!("| 64-member group / 1 socket (whole path; target <= 1.05) | {:.3} |", group / stack);
    println!();
    println!("cycles per datagram (native, median of 5 alternating rounds of 1,000,000):");
    println!("| path | cycles |");
    println!("|---|---|");
    println!("| source + rx_burst + read + free (no stack) | {:.1} |", cycles[2]);
    println!("| source + spate, 1 socket | {:.1} |", cycles[0]);
    println!("| source + spate, 64-member group | {:.1} |", cycles[1]);
    println!("| 64-member group / 1 socket (whole path; target <= 1.05) | {:.3} |", cycles[1] / cycles[0]);
    println!("| spate's own cost, group / 1 socket | {:.3} |", (cycles[1] - cycles[2]) / (cycles[0] - cycles[2]));
    if let Some(path) = json {
        let body = format!(
            "{{\"bench\":\"pipeline\",\"flows\":{},\"floor_ir\":{floor:.1},\"stack_ir\":{stack:.1},\"group64_ir\":{group:.1},\"floor_cycles\":{:.1},\"stack_cycles\":{:.1},\"group64_cycles\":{:.1}}}\n",
            a.flows, cycles[2], cycles[0], cycles[1]
        );
        std::fs::write(path, body).expect("write JSON");
    }
}

//! What an async receive or send costs a datagram against the blocking
//! call, and what a `Poller` wait costs with 1,000 sockets registered
//! against one: side by side in one run, over an in-memory wire pair.
//!
//! Receive: the peer puts N 64-byte datagrams on the wire, the polling
//! lcore queues them all, then the reader takes them, timed: with
//! `recv_from` (blocking mode), `recv_from_async` under tokio's
//! current-thread runtime (no reactor), and `Poller::wait` then
//! `recv_from` with one socket registered and with 1,000 (the other 999
//! idle). The datagrams are queued before the clock starts, so this is
//! the reading thread's cost per datagram, not a wake-up's. Send:
//! `send_to` against `send_to_async`, N datagrams each. Modes take turns,
//! five rounds; each keeps its median.
//!
//! `cargo bench --bench async_sockets -- [--datagrams N]`

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use spate::dpdk::{Burst, Memory};
use spate::{Counter, Event, Interest, Poller, PortSpec, Stack, StackConfig, UdpSocket};
use spate_testkit::stats::median;
use spate_testkit::wire_peer::udp_frame;
use spate_testkit::{WirePeer, cpu_model, shared_eal};

const PORT: u16 = 9000;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize =
        args.iter().position(|a| a == "--datagrams").and_then(|i| args.get(i + 1)?.parse().ok()).unwrap_or(20_000);
    shared_eal(Memory::Auto);
    let (mut peer, port, _keep) = WirePeer::new(32767);
    let cfg = StackConfig {
        lcores: "1".into(),
        ports: vec![PortSpec::new(&port).addr("198.18.0.2/24").unwrap()],
        stop_on_signal: false,
        announce: false,
        mempool_size: 65535,
        udp_mem_bytes: Some(60 << 20),
        ..StackConfig::default()
    };
    let stack = Stack::new(cfg).unwrap();
    let mac = stack.interfaces()[0].mac;
    let sock = UdpSocket::builder(&stack).recv_buffer_size(60 << 20).bind(("0.0.0.0", PORT)).unwrap();
    let idle: Vec<UdpSocket> = (1..1000u16).map(|i| UdpSocket::bind(&stack, ("0.0.0.0", PORT + i)).unwrap()).collect();
    let running = stack.spawn_polling().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let frame = udp_frame(mac, false, 41000, PORT, &[7u8; 64]);

    let fill = |peer: &mut WirePeer| {
        let before = stack.counters()[Counter::UdpInDatagrams];
        let mut sent = 0;
        while sent < n {
            let mut b: Burst = Burst::new();
            for _ in 0..32.min(n - sent) {
                b.push(peer.mbuf(&frame)).unwrap();
            }
            let k = b.len();
            sent += peer.send_burst(&mut b);
            if sent < n && k > 0 {
                std::thread::yield_now();
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while stack.counters()[Counter::UdpInDatagrams] < before + n as u64 {
            assert!(Instant::now() < deadline, "the lcore queued {} of {n}", stack.counters().render_nonzero());
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let mut buf = [0u8; 128];
    let modes = ["recv_from", "recv_from_async", "poller, 1 socket", "poller, 1,000 sockets"];
    let mut rx: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    let one = Poller::new();
    one.register(&sock, 0, Interest::READABLE).unwrap();
    let many = Poller::new();
    for (i, s) in idle.iter().enumerate() {
        many.register(s, i as u64 + 1, Interest::READABLE).unwrap();
    }
    for _round in 0..5 {
        for (m, samples) in rx.iter_mut().enumerate() {
            if m == 2 {
                many.deregister(0).ok();
                one.register(&sock, 0, Interest::READABLE).ok();
            }
            if m == 3 {
                one.deregister(0).ok();
                many.register(&sock, 0, Interest::READABLE).unwrap();
            }
            fill(&mut peer);
            let mut events: Vec<Event> = Vec::with_capacity(64);
            let t = Instant::now();
            match m {
                0 => {
                    for _ in 0..n {
                        sock.recv_from(&mut buf).unwrap();
                    }
                }
                1 => rt.block_on(async {
                    for _ in 0..n {
                        sock.recv_from_async(&mut buf).await.unwrap();
                    }
                }),
                _ => {
                    let poller = if m == 2 { &one } else { &many };
                    let mut got = 0;
                    while got < n {
                        poller.wait(&mut events, Some(Duration::from_secs(5))).unwrap();
                        assert!(events.iter().all(|e| e.token == 0), "only the socket with datagrams");
                        sock.recv_from(&mut buf).unwrap();
                        got += 1;
                    }
                }
            }
            samples.push(t.elapsed().as_nanos() as f64 / n as f64);
        }
    }
    let to: SocketAddr = "198.18.0.1:9".parse().unwrap();
    let mut tx: Vec<Vec<f64>> = vec![Vec::new(); 2];
    for _round in 0..5 {
        for (m, samples) in tx.iter_mut().enumerate() {
            let t = Instant::now();
            let payload = [1u8; 64];
            if m == 0 {
                for _ in 0..n {
                    sock.send_to(&payload, to).unwrap();
                }
            } else {
                rt.block_on(async {
                    for _ in 0..n {
                        sock.send_to_async(&payload, to).await.unwrap();
                    }
                });
            }
            samples.push(t.elapsed().as_nanos() as f64 / n as f64);
            // The peer drains what spate sent (ARP for 198.18.0.1 answered).
            let mut b: Burst = Burst::new();
            let deadline = Instant::now() + Duration::from_millis(300);
            while Instant::now() < deadline {
                if peer.recv_burst(&mut b) == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                for m in b.drain() {
                    let f = m.data().to_vec();
                    drop(m);
                    peer.answer_arp(&f);
                }
            }
        }
    }
    running.stop();
    println!("async sockets and the poller, {n} datagrams of 64 bytes, 5 rounds, medians ({})", cpu_model());
    println!("| receive | ns per datagram | ratio |");
    println!("|---|---|---|");
    let base = median(&rx[0]);
    for (m, name) in modes.iter().enumerate() {
        let v = median(&rx[m]);
        println!("| {name} | {v:.1} | {:.2}x |", v / base);
    }
    println!("| send | ns per datagram | ratio |");
    println!("|---|---|---|");
    let base = median(&tx[0]);
    for (m, name) in ["send_to", "send_to_async"].iter().enumerate() {
        let v = median(&tx[m]);
        println!("| {name} | {v:.1} | {:.2}x |", v / base);
    }
}

//! QUIC over spate against quinn on the Linux kernel's sockets in a peer
//! namespace (a stack in the test process on `net_af_packet`; quinn 0.11
//! on tokio both sides, `spate::QuinnSocket` on spate's):
//!
//! - spate's quinn as client: 200 bidirectional streams of 16 KiB each
//!   echoed byte-exact by the kernel-side server, and one 4 MiB stream;
//! - spate's quinn as server: the kernel-side client's 200 streams echoed
//!   byte-exact;
//! - spate's GSO and GRO counters move, and its datagrams carry ECT(0)
//!   (quinn marks them; the kernel-side quinn-udp reads them);
//! - quinn's path-MTU discovery on spate, searching to the byte, reaches
//!   1,472 bytes over the 1,500-byte link, and behind a router with a
//!   1,280-byte far link reaches and holds 1,252 bytes (IPv4) and 1,232
//!   (IPv6): the probes past them are refused (`EMSGSIZE`, swallowed)
//!   once the router's ICMP has taught spate the path MTU, or lost.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use quinn::{ClientConfig, Endpoint, EndpointConfig, ServerConfig, TokioRuntime};
use spate::dpdk::Memory;
use spate::{Counter, QuinnSocket, UdpSocket};
use spate_testkit::{af_packet_stack, device_lock, shared_eal, spate_and_kernel};

const STREAMS: usize = 200;
const STREAM_BYTES: usize = 16 << 10;
const LARGE: usize = 4 << 20;

/// A self-signed certificate for "localhost" and its key.
fn cert() -> (CertificateDer<'static>, PrivatePkcs8KeyDer<'static>) {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    (c.cert.der().clone(), PrivatePkcs8KeyDer::from(c.key_pair.serialize_der()))
}

fn server_config(cert: &CertificateDer<'static>, key: &PrivatePkcs8KeyDer<'static>) -> ServerConfig {
    ServerConfig::with_single_cert(vec![cert.clone()], PrivateKeyDer::Pkcs8(key.clone_key())).unwrap()
}

/// What a 1,500-byte link carries over IPv4 in a UDP payload.
const LINK_PAYLOAD: u16 = 1472;

/// A client trusting `cert`, whose path-MTU discovery may go up to what
/// a 1,500-byte link carries over IPv4, searching to the byte (quinn's
/// default stops within 20 bytes).
fn client_config(cert: &CertificateDer<'static>) -> ClientConfig {
    let mut roots = quinn::rustls::RootCertStore::empty();
    roots.add(cert.clone()).unwrap();
    let mut c = ClientConfig::with_root_certificates(Arc::new(roots)).unwrap();
    let mut mtud = quinn::MtuDiscoveryConfig::default();
    mtud.upper_bound(LINK_PAYLOAD).minimum_change(1);
    let mut t = quinn::TransportConfig::default();
    t.mtu_discovery_config(Some(mtud));
    c.transport_config(Arc::new(t));
    c
}

/// Echoes every bidirectional stream of every connection `ep` accepts,
/// until it is closed.
async fn echo_server(ep: Endpoint) {
    while let Some(incoming) = ep.accept().await {
        tokio::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                tokio::spawn(async move {
                    if let Ok(data) = recv.read_to_end(64 << 20).await {
                        let _ = send.write_all(&data).await;
                        let _ = send.finish();
                        let _ = send.stopped().await;
                    }
                });
            }
        });
    }
}

/// The payload of stream `i`, `len` bytes.
fn pattern(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j * 7 + j / 251) as u8).collect()
}

/// Opens `streams` streams on a connection from `ep` to `server` (and one
/// of `large` bytes when not 0), each echoed byte-exact; returns the UDP
/// payload size quinn's path-MTU discovery reached. With a `target`, the
/// search is given up to 20 s more to reach it (small streams keep
/// acknowledgements coming, which is how quinn learns a probe was lost),
/// then the same transfer runs again at that size.
async fn echo_client(ep: &Endpoint, server: SocketAddr, streams: usize, large: usize, target: Option<u16>) -> u16 {
    let conn = tokio::time::timeout(Duration::from_secs(10), ep.connect(server, "localhost").unwrap())
        .await
        .expect("handshake within 10 s")
        .expect("handshake");
    echo_streams(&conn, streams, large).await;
    let mtu = match target {
        Some(target) => {
            let until = tokio::time::Instant::now() + Duration::from_secs(20);
            while conn.stats().path.current_mtu != target && tokio::time::Instant::now() < until {
                echo_streams(&conn, 1, 0).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let reached = conn.stats().path.current_mtu;
            // Held: a second transfer at that size loses nothing to it.
            echo_streams(&conn, streams, large).await;
            reached
        }
        None => conn.stats().path.current_mtu,
    };
    conn.close(0u32.into(), b"done");
    mtu
}

/// `streams` streams of [`STREAM_BYTES`] (and one of `large` bytes when
/// not 0), each echoed byte-exact.
async fn echo_streams(conn: &quinn::Connection, streams: usize, large: usize) {
    let mut tasks = Vec::new();
    let sizes = (0..streams).map(|_| STREAM_BYTES).chain((large > 0).then_some(large));
    for (i, len) in sizes.enumerate() {
        let conn = conn.clone();
        tasks.push(tokio::spawn(async move {
            let (mut send, mut recv) = conn.open_bi().await.unwrap();
            let data = pattern(i, len);
            send.write_all(&data).await.unwrap();
            send.finish().unwrap();
            let back = recv.read_to_end(len + 1).await.unwrap();
            assert!(back == data, "stream {i}: {} bytes came back different", len);
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t).await.expect("echoed within 60 s").unwrap();
    }
}

/// A kernel socket for the peer's quinn, its receive buffer as large as
/// `net.core.rmem_max` lets it be (the default drops spate's GSO bursts,
/// and a lost path-MTU probe lowers what the search finds).
fn kernel_socket(addr: &str) -> std::net::UdpSocket {
    let sock = std::net::UdpSocket::bind(addr).unwrap();
    spate_testkit::set_recv_buffer(&sock, 8 << 20).unwrap();
    sock
}

/// quinn on a kernel socket bound to `bind`, echoing every stream of
/// every connection (inside a tokio runtime).
fn kernel_echo_server(bind: &str, cert: &CertificateDer<'static>, key: &PrivatePkcs8KeyDer<'static>) -> Endpoint {
    let cfg = Some(server_config(cert, key));
    let ep = Endpoint::new(EndpointConfig::default(), cfg, kernel_socket(bind), Arc::new(TokioRuntime)).unwrap();
    tokio::spawn(echo_server(ep.clone()));
    ep
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
}

#[test]
fn quinn_on_spate_and_quinn_on_the_kernel_echo_each_other() {
    let _serial = device_lock();
    shared_eal(Memory::Hugepages);
    let (spate_ns, kernel) = spate_and_kernel("quic");
    let stack = af_packet_stack(&spate_ns, &["198.18.0.2/24"], 32767);
    let running = stack.spawn_polling().unwrap();
    let (cert, key) = cert();

    // The kernel's side: an echo server on 198.18.0.1:4433, and a client
    // of spate's server, in its namespace (the sockets open there).
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let kernel_side = {
        let (cert, key) = (cert.clone(), key.clone_key());
        kernel.thread(move || {
            runtime().block_on(async move {
                let ep = kernel_echo_server("198.18.0.1:4433", &cert, &key);
                let mut client = Endpoint::client("198.18.0.1:0".parse().unwrap()).unwrap();
                client.set_default_client_config(client_config(&cert));
                ready_tx.send(()).unwrap();
                // Spate's server, once it says it listens.
                let _ = stop_rx.await;
                echo_client(&client, "198.18.0.2:4433".parse().unwrap(), STREAMS, 0, None).await;
                client.wait_idle().await;
                ep.close(0u32.into(), b"done");
            })
        })
    };
    ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    // The wire on the kernel's side: the TOS byte of spate's datagrams.
    let mut sniff = kernel
        .spawn(
            "quic-sniff",
            "/usr/bin/python3",
            &["-c".into(), include_str!("peers/meta.py").into(), "sniff".into(), "vB".into(), "5".into()],
            Duration::from_secs(30),
        )
        .unwrap();
    assert!(sniff.wait_for_output("\"ready\"", Duration::from_secs(10)), "{}", sniff.output());

    let big = |addr: &str| UdpSocket::builder(&stack).recv_buffer_size(8 << 20).bind(addr).unwrap();
    let client_sock = QuinnSocket::new(big("0.0.0.0:0")).unwrap();
    let server_sock = QuinnSocket::new(big("0.0.0.0:4433")).unwrap();
    runtime().block_on(async {
        // spate's client.
        let sock = client_sock.clone();
        let mut client =
            Endpoint::new_with_abstract_socket(EndpointConfig::default(), None, sock, Arc::new(TokioRuntime)).unwrap();
        client.set_default_client_config(client_config(&cert));
        let server = "198.18.0.1:4433".parse().unwrap();
        let mtu = echo_client(&client, server, STREAMS, LARGE, Some(LINK_PAYLOAD)).await;
        assert_eq!(mtu, LINK_PAYLOAD, "path-MTU discovery over a 1,500-byte link");
        println!("quinn on spate, 1,500-byte link: path MTU {mtu}");
        // spate's server, for the kernel's client.
        let sock = server_sock.clone();
        let server = Endpoint::new_with_abstract_socket(
            EndpointConfig::default(),
            Some(server_config(&cert, &key)),
            sock,
            Arc::new(TokioRuntime),
        )
        .unwrap();
        let serving = tokio::spawn(echo_server(server.clone()));
        stop_tx.send(()).unwrap();
        let joined = tokio::task::spawn_blocking(move || kernel_side.join()).await.unwrap();
        joined.expect("the kernel's side");
        server.close(0u32.into(), b"done");
        serving.abort();
        client.wait_idle().await;
    });
    running.stop();
    let c = stack.counters();
    println!("{}", c.render_nonzero());
    assert!(c[Counter::UdpInDatagrams] > 1000 && c[Counter::UdpOutDatagrams] > 1000, "{}", c.render_nonzero());
    assert!(c[Counter::GsoSends] > 0 && c[Counter::GsoSegments] > c[Counter::GsoSends], "GSO: {}", c.render_nonzero());
    assert!(c[Counter::GroCoalesced] > 0, "GRO: {}", c.render_nonzero());
    assert_eq!(c.unaccounted_frames(), 0);
    // ECN: quinn marks ECT(0) both ways; spate reads it on receive and
    // writes it on send.
    let (client_ecn, server_ecn) = (client_sock.ecn_received(), server_sock.ecn_received());
    println!("ECN received (Not-ECT, ECT(1), ECT(0), CE): client {client_ecn:?}, server {server_ecn:?}");
    assert!(client_ecn[2] > 100 && server_ecn[2] > 100, "ECT(0) received");
    assert!(sniff.wait_for_output("\"done\"", Duration::from_secs(10)), "{}", sniff.output());
    let marked = sniff.output().lines().filter(|l| l.contains("\"tos\": 2")).count();
    assert!(marked > 100, "ECT(0) on spate's frames on the wire: {marked}");
}

/// Behind a router whose far link carries 1,280-byte packets, quinn on
/// spate (DF set, `EMSGSIZE` for a probe past the path MTU spate learnt
/// from the router's ICMP swallowed) finds and holds the UDP payload that
/// fits: 1,252 bytes over IPv4, 1,232 over IPv6.
#[test]
fn quinn_on_spate_holds_to_a_smaller_path_mtu() {
    use spate::Cidr;
    let _serial = device_lock();
    shared_eal(Memory::Hugepages);
    // spate (vA) -- (rA) router (rB, 1280) -- (vB, 1280) kernel
    let (spate_ns, _router, kernel) = spate_testkit::behind_a_small_link("quicpmtu");
    let stack = af_packet_stack(&spate_ns, &["198.18.0.2/24", "fd00::2/64"], 32767);
    // The gateways, set on the running stack.
    let any4 = Cidr { addr: "0.0.0.0".parse().unwrap(), prefix_len: 0 };
    let any6 = Cidr { addr: "::".parse().unwrap(), prefix_len: 0 };
    stack.add_route(any4, Some("198.18.0.1".parse().unwrap()), None).unwrap();
    stack.add_route(any6, Some("fd00::1".parse().unwrap()), None).unwrap();
    let running = stack.spawn_polling().unwrap();
    let (cert, key) = cert();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let servers = {
        let (cert, key) = (cert.clone(), key.clone_key());
        kernel.thread(move || {
            runtime().block_on(async move {
                let mut eps = Vec::new();
                for bind in ["198.20.0.2:4433", "[fd01::2]:4433"] {
                    eps.push(kernel_echo_server(bind, &cert, &key));
                }
                ready_tx.send(()).unwrap();
                tokio::task::spawn_blocking(move || stop_rx.recv()).await.unwrap().ok();
            })
        })
    };
    ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let (v4, v6) = runtime().block_on(async {
        let mut mtus = Vec::new();
        for (bind, server) in [("0.0.0.0:0", "198.20.0.2:4433"), ("[::]:0", "[fd01::2]:4433")] {
            let sock = UdpSocket::builder(&stack).recv_buffer_size(8 << 20).bind(bind).unwrap();
            let sock = QuinnSocket::new(sock).unwrap();
            let mut client =
                Endpoint::new_with_abstract_socket(EndpointConfig::default(), None, sock, Arc::new(TokioRuntime))
                    .unwrap();
            client.set_default_client_config(client_config(&cert));
            let target = if server.starts_with('[') { 1232 } else { 1252 };
            mtus.push(echo_client(&client, server.parse().unwrap(), 20, 2 << 20, Some(target)).await);
            client.wait_idle().await;
        }
        (mtus[0], mtus[1])
    });
    stop_tx.send(()).unwrap();
    servers.join().unwrap();
    running.stop();
    println!("quinn on spate behind a 1,280-byte link: path MTU {v4} (IPv4), {v6} (IPv6)");
    assert_eq!((v4, v6), (1252, 1232), "the UDP payload a 1,280-byte link carries");
}

/// quinn's drivers on the lcore ([`spate::LcoreRuntime`]) of a stack on
/// adaptive polling, against quinn on the kernel's sockets: 50 streams of
/// 16 KiB and one of 4 MiB echoed byte-exact with the application's tasks
/// on a tokio thread, while the lcore sleeps between them; an
/// application task on the lcore itself makes a connection that the
/// kernel's side leaves idle, and quinn's idle timer, on the lcore's
/// timers, closes it on time (the lcore, asleep, woken by it rather than
/// by its 100 ms tick); a task that panics on the lcore is dropped and the
/// lcore goes on; five 50 ms timers of the runtime's, each due while the
/// lcore sleeps, fire within 30 ms of their time.
#[test]
fn quinn_driven_on_the_lcore_echoes_the_kernel_and_keeps_its_timers() {
    use spate::LcoreRuntime;
    let _serial = device_lock();
    shared_eal(Memory::Hugepages);
    let (spate_ns, kernel) = spate_and_kernel("quicl");
    let port = spate::PortSpec::new("net_af_packet0,iface=vA").addr("198.18.0.2/24").unwrap();
    let cfg = spate::StackConfig {
        lcores: "1".into(),
        ports: vec![port],
        stop_on_signal: false,
        mempool_size: 32767,
        poll: spate::config::PollMode::Adaptive,
        ..spate::StackConfig::default()
    };
    let stack = spate_ns.run(move || spate::Stack::new(cfg).expect("the stack"));
    let rt = LcoreRuntime::new(&stack, 0);
    let running = {
        let rt = rt.clone();
        stack.spawn(move |_| {
            let rt = rt.clone();
            move |ctx: &mut spate::LcoreCtx<'_>| rt.poll(ctx)
        })
    }
    .unwrap();
    let (cert, key) = cert();

    // The kernel's echo server on 198.18.0.1:4433.
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let kernel_side = {
        let (cert, key) = (cert.clone(), key.clone_key());
        kernel.thread(move || {
            runtime().block_on(async move {
                let ep = kernel_echo_server("198.18.0.1:4433", &cert, &key);
                ready_tx.send(()).unwrap();
                let _ = stop_rx.await;
                ep.close(0u32.into(), b"done");
                ep.wait_idle().await;
            })
        })
    };
    ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let server: SocketAddr = "198.18.0.1:4433".parse().unwrap();
    let sock =
        QuinnSocket::new(UdpSocket::builder(&stack).recv_buffer_size(8 << 20).bind("0.0.0.0:0").unwrap()).unwrap();
    let mut client = Endpoint::new_with_abstract_socket(EndpointConfig::default(), None, sock, rt.clone()).unwrap();
    client.set_default_client_config(client_config(&cert));
    let sleeps_before = stack.counters()[Counter::PollSleeps];
    runtime().block_on(async {
        let conn = tokio::time::timeout(Duration::from_secs(10), client.connect(server, "localhost").unwrap())
            .await
            .expect("handshake within 10 s")
            .expect("handshake");
        echo_streams(&conn, 50, LARGE).await;
        conn.close(0u32.into(), b"done");
    });
    assert!(rt.tasks() >= 1, "the endpoint's driver runs on the lcore: {rt:?}");

    // A task that panics on the lcore: dropped, logged, the lcore goes on.
    rt.spawn(async { panic!("a task's panic on the lcore") });
    // An application task on the lcore: a connection with a 300 ms idle
    // timeout that nobody uses, closed by quinn's idle timer.
    const IDLE: Duration = Duration::from_millis(300);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let ep = client.clone();
    let idle_cfg = {
        let mut c = client_config(&cert);
        let mut t = quinn::TransportConfig::default();
        t.max_idle_timeout(Some(IDLE.try_into().unwrap())).mtu_discovery_config(None);
        c.transport_config(Arc::new(t));
        c
    };
    rt.spawn(async move {
        let conn = ep.connect_with(idle_cfg, server, "localhost").unwrap().await.expect("handshake");
        let quiet = std::time::Instant::now();
        let why = conn.closed().await;
        let _ = done_tx.send((quiet.elapsed(), why));
    });
    let (idle_for, why) = done_rx.recv_timeout(Duration::from_secs(10)).expect("the idle connection closed");
    // The runtime's timers themselves, on a quiet lcore: five of 50 ms in
    // turn, each due while the lcore sleeps, each on time (its 100 ms tick
    // alone would make them up to that late).
    let (late_tx, late_rx) = std::sync::mpsc::channel();
    let timers = rt.clone();
    rt.spawn(async move {
        for _ in 0..5 {
            let due = std::time::Instant::now() + Duration::from_millis(50);
            let mut timer = quinn::Runtime::new_timer(&*timers, due);
            std::future::poll_fn(|cx| timer.as_mut().poll(cx)).await;
            let _ = late_tx.send(due.elapsed());
        }
    });
    let late: Vec<Duration> =
        (0..5).map(|_| late_rx.recv_timeout(Duration::from_secs(5)).expect("a timer fired")).collect();
    println!("five 50 ms timers on the lcore, late by {late:?}");
    assert!(late.iter().all(|l| *l < Duration::from_millis(30)), "timers late: {late:?}");
    println!("the idle connection closed after {idle_for:?}: {why}");
    assert!(matches!(why, quinn::ConnectionError::TimedOut), "closed by the idle timer: {why}");
    // Due after the idle timeout (quinn counts from the last packet, a
    // little before `quiet`); a sleeping lcore woken only by its 100 ms
    // tick would be up to that late.
    assert!(
        idle_for >= IDLE - Duration::from_millis(50) && idle_for < IDLE + Duration::from_millis(80),
        "{idle_for:?}"
    );

    stop_tx.send(()).unwrap();
    kernel_side.join().expect("the kernel's side");
    runtime().block_on(async { tokio::time::timeout(Duration::from_secs(5), client.wait_idle()).await.ok() });
    running.stop();
    drop(client);
    rt.shutdown();
    let c = stack.counters();
    println!("{}", c.render_nonzero());
    assert!(c[Counter::PollSleeps] > sleeps_before, "the lcore slept between the exchanges: {}", c.render_nonzero());
    // Received datagrams coalesced by GRO count once.
    assert!(c[Counter::RxFrames] > 1000 && c[Counter::UdpOutDatagrams] > 1000, "{}", c.render_nonzero());
    assert_eq!(c.unaccounted_frames(), 0);
}

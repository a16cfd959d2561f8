//! spate behind real OVS-DPDK, as users run it in VMs: `spate-echo` on a
//! `net_virtio_user` port in server mode, OVS connected to it through a
//! `dpdkvhostuserclient` port, and the Linux kernel in a peer namespace
//! reaching OVS through a `net_af_packet` port on a veth. The kernel's
//! datagrams echo byte-exact; then `ovs-vswitchd` is restarted with SIGTERM
//! and with SIGKILL while the kernel keeps sending: spate-echo keeps
//! running, logs the link going down and up, echo resumes within seconds,
//! and its counters show the gap (datagrams the kernel sent during the
//! outage never reached it).

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use spate_testkit::ovs::{Ovs, OvsPort, echo_behind_ovs};
use spate_testkit::{Netns, counter, device_lock, port_counter, unique_socket_path};

const ECHO: &str = env!("CARGO_BIN_EXE_spate-echo");

/// Echoes `n` datagrams of growing size byte-exact, each retried up to 3
/// times; returns how many were sent.
fn echo(n: usize) -> u64 {
    let s = UdpSocket::bind("198.18.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let target: SocketAddr = "198.18.0.2:7".parse().unwrap();
    let mut buf = vec![0u8; 2048];
    let mut sent = 0;
    for i in 0..n {
        // Each datagram starts with its number: a late answer to an
        // earlier one (retried) is skipped.
        let mut payload = (i as u32).to_be_bytes().to_vec();
        payload.extend((0..i * 1400 / n).map(|j| (i + j * 3) as u8));
        let mut attempt = 0;
        loop {
            s.send_to(&payload, target).unwrap();
            sent += 1;
            match s.recv_from(&mut buf) {
                Ok((len, _)) if len >= 4 && u32::from_be_bytes(buf[..4].try_into().unwrap()) < i as u32 => {}
                Ok((len, _)) => {
                    assert_eq!(&buf[..len], &payload[..], "datagram {i} came back different");
                    break;
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) && attempt < 3 => {
                    attempt += 1
                }
                Err(e) => panic!("datagram {i}: {e}"),
            }
        }
    }
    sent
}

/// What a steady stream saw: datagrams sent and answered, the longest
/// time without an answer, and whether answers came again at the end.
struct Stream {
    sent: u64,
    answered: u64,
    outage: Duration,
    resumed: bool,
}

/// Sends a datagram every 2 ms for `length`, taking answers as they come.
fn stream(length: Duration) -> Stream {
    let s = UdpSocket::bind("198.18.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(2))).unwrap();
    let start = Instant::now();
    let (mut sent, mut answered) = (0u64, 0u64);
    let (mut last, mut outage) = (Instant::now(), Duration::ZERO);
    let mut buf = [0u8; 64];
    while start.elapsed() < length {
        s.send_to(&sent.to_be_bytes(), "198.18.0.2:7").unwrap();
        sent += 1;
        while let Ok((n, _)) = s.recv_from(&mut buf) {
            assert_eq!(n, 8, "an answer of another size");
            answered += 1;
            outage = outage.max(last.elapsed());
            last = Instant::now();
        }
    }
    Stream { sent, answered, outage, resumed: last.elapsed() < Duration::from_millis(500) }
}

#[test]
fn kernel_through_ovs_dpdk_to_spate_survives_ovs_restarts() {
    let _serial = device_lock();
    let (_ovs_ns, kernel_ns, mut app, ovs) =
        echo_behind_ovs(ECHO, "ovs", 1, &["--lcores", "0"], OvsPort::AfPacket("vO".into()), OvsPort::VhostClient);

    let mut sent = kernel_ns.run(|| echo(200));
    let mut lost = 0;
    for (signal, name) in [(15, "SIGTERM"), (9, "SIGKILL")] {
        // A stream of datagrams across the restart.
        let flow = kernel_ns.thread(|| stream(Duration::from_secs(8)));
        std::thread::sleep(Duration::from_secs(1));
        let t = Instant::now();
        ovs.restart(signal);
        let back = t.elapsed();
        let s = flow.join().unwrap();
        println!(
            "{name}: ovs-vswitchd back in {back:?}; of {} datagrams {} answered, the longest silence {:?}",
            s.sent, s.answered, s.outage
        );
        assert!(s.resumed, "echo resumed after the {name} restart");
        assert!(s.answered < s.sent, "the outage shows");
        assert!(s.outage < Duration::from_secs(5), "back within seconds: {:?}", s.outage);
        sent += s.sent;
        lost += s.sent - s.answered;
        sent += kernel_ns.run(|| echo(50));
    }
    let out = app.output();
    // spate's own lines (the port layer logs the events too).
    assert!(out.matches("spate: port net_virtio_user0 link down").count() >= 2, "{out}");
    assert!(out.matches("spate: port net_virtio_user0 link up").count() >= 2, "{out}");
    drop(ovs);
    app.stop_with(libc::SIGINT, Duration::from_secs(10));
    let out = app.output();
    let c = spate_testkit::parse_counters(&out);
    // What the kernel sent while OVS was down never reached spate: the
    // counters show the gap, and every datagram that arrived was answered.
    let got = counter(&c, "Udp.InDatagrams");
    assert!(got < sent && got + lost >= sent, "spate got {got} of {sent} sent, {lost} unanswered\n{out}");
    assert_eq!(counter(&c, "Udp.OutDatagrams"), got, "{out}");
    assert!(out.contains("Mempool: InUse="), "{out}");
}

/// A generator through OVS-DPDK into spate: `spate-flood --check` and
/// `spate-sink --check`, each on a server-mode `net_virtio_user` port that
/// OVS connects to: every datagram the sink takes is intact, and the sink
/// takes what the flood put on the wire but for what its counters explain.
#[test]
fn generator_through_ovs_dpdk_to_spate() {
    let _serial = device_lock();
    let ns = Netns::new("ovsgen");
    let (a, b) = (unique_socket_path("ovsa"), unique_socket_path("ovsb"));
    let vdev = |sock: &std::path::Path, mac: &str| {
        format!("net_virtio_user0,path={},server=1,queues=1,queue_size=1024,mac={mac}", sock.display())
    };
    let sink_args: Vec<String> = [
        "--vdev",
        &vdev(&b, "02:53:50:41:54:45"),
        "--ip",
        "198.18.0.2/24",
        "--lcores",
        "0",
        "--idle-sleep",
        "20",
        "--interval",
        "0",
        "--check",
    ]
    .map(String::from)
    .to_vec();
    let flood_args: Vec<String> = [
        "--vdev",
        &vdev(&a, "02:53:50:41:54:46"),
        "--ip",
        "198.18.0.1/24",
        // Beside the sink on CPU 0: a busy lcore on CPU 1 would take half
        // of it from OVS's PMD, which then forwarded nothing for the
        // flood's whole run now and then.
        "--lcores",
        "0",
        "--dst",
        "198.18.0.2:9",
        "--len",
        "512",
        "--rate",
        "20000",
        "--time",
        "3",
        "--interval",
        "0",
        "--check",
    ]
    .map(String::from)
    .to_vec();
    let mut sink = ns.spawn("sink", env!("CARGO_BIN_EXE_spate-sink"), &sink_args, Duration::from_secs(300)).unwrap();
    sink.remove_on_drop(&b);
    let mut flood =
        ns.spawn("flood", env!("CARGO_BIN_EXE_spate-flood"), &flood_args, Duration::from_secs(300)).unwrap();
    flood.remove_on_drop(&a);
    for p in [&mut sink, &mut flood] {
        assert!(p.wait_for_output("waiting for client connection", Duration::from_secs(60)), "{}", p.output());
    }
    let ovs = Ovs::start(
        &ns,
        &[OvsPort::VhostClient(a.clone()), OvsPort::VhostClient(b.clone())],
        &["in_port=1,actions=output:2", "in_port=2,actions=output:1"],
    );
    assert!(flood.wait_exit(Duration::from_secs(120)), "{}\n{}", flood.output(), ovs.log());
    std::thread::sleep(Duration::from_millis(500));
    let p2 = ovs.port_stats(2);
    sink.stop_with(libc::SIGINT, Duration::from_secs(10));
    drop(ovs);
    let (fo, so) = (flood.output(), sink.output());
    let (fc, sc) = (spate_testkit::parse_counters(&fo), spate_testkit::parse_counters(&so));
    let sent = counter(&fc, "Udp.OutDatagrams");
    let (intact, corrupted) = (counter(&sc, "Checked.intact"), counter(&sc, "Checked.corrupted"));
    println!(
        "flood -> OVS-DPDK -> sink: {sent} datagrams sent, {intact} intact, {corrupted} corrupted; OVS port 2 tx {} \
         (dropped {})",
        p2.2, p2.3
    );
    assert!(sent > 10_000, "{fo}");
    assert_eq!(corrupted, 0, "{so}");
    // The flood accounts for every datagram: on the wire, dropped while
    // the sink's address was unresolved (OVS comes up, then its flows), or
    // still waiting for it when the flood stopped.
    let on_wire = counter(&fc, "Ip.OutRequests");
    assert_eq!(sent, on_wire + counter(&fc, "Neigh.QueueDrops") + counter(&fc, "Neighbours.Waiting"), "{fo}");
    // What OVS sent to the sink's port arrived there, and every datagram
    // that arrived is intact (or counted at a full socket).
    assert_eq!(port_counter(&so, "ipackets"), p2.2, "OVS port 2 vs the sink's port\n{so}");
    assert!(intact <= on_wire && intact > on_wire / 2, "{intact} of {on_wire} on the wire\n{so}");
    assert_eq!(intact + counter(&sc, "Rx.RcvbufFull"), counter(&sc, "Udp.InDatagrams"), "{so}");
    assert!(intact > 0, "{so}");
}

/// Adaptive polling over `net_virtio_user` behind OVS-DPDK: spate-echo
/// with `--poll adaptive` sleeps when idle, and a frame OVS writes into
/// its vhost-user queue wakes it through the queue's interrupt (the
/// callfd OVS signals once the queue asks for it): datagrams after idle
/// gaps are answered, each counted as an RX wake-up.
#[test]
fn adaptive_polling_over_virtio_user_wakes_on_ovs_frames() {
    let _serial = device_lock();
    let (_ovs_ns, kernel_ns, mut app, ovs) = echo_behind_ovs(
        ECHO,
        "ovsad",
        1,
        &["--lcores", "0", "--poll", "adaptive"],
        OvsPort::AfPacket("vO".into()),
        OvsPort::VhostClient,
    );
    kernel_ns.run(|| spate_testkit::echo_after_gaps(6, 24, Duration::from_millis(150)));
    drop(ovs);
    app.stop_with(libc::SIGINT, Duration::from_secs(10));
    let out = app.output();
    let c = spate_testkit::parse_counters(&out);
    assert!(!out.contains("has no RX interrupts"), "virtio_user has RX interrupts here:\n{out}");
    assert!(counter(&c, "Poll.WakesRx") >= 5, "frames woke the lcore:\n{out}");
    assert!(counter(&c, "Poll.Sleeps") >= 6, "{out}");
}

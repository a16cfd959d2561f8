//! spate's tools against real peers: `spate-iperf` against the Debian
//! `iperf` 2 (both directions, directly and through `spate-relay` dropping
//! a share of the frames), `spate-flood` into a Linux socket, `spate-sink`
//! against what dpdk-testpmd says it sent.

use std::net::UdpSocket;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use spate_testkit::process::Proc;
use spate_testkit::{
    FwdStats, Netns, RelayLeg, SpateApp, TestPmdBuilder, device_lock, kernel_peer, stop_relay, unique_socket_path, veth,
};

const IPERF: &str = env!("CARGO_BIN_EXE_spate-iperf");
const FLOOD: &str = env!("CARGO_BIN_EXE_spate-flood");
const SINK: &str = env!("CARGO_BIN_EXE_spate-sink");
const RELAY: &str = env!("CARGO_BIN_EXE_spate-relay");

/// spate's stack flags on the veth `vA` of its namespace.
fn stack_args(extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> =
        ["--vdev", "net_af_packet0,iface=vA", "--ip", "198.18.0.2/24", "--lcores", "0", "--mbufs", "4095"]
            .map(String::from)
            .to_vec();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// spate's namespace, the kernel's, and the relay between them when asked.
struct Net {
    spate: Netns,
    kernel: Netns,
    relay: Option<(Netns, Proc)>,
}

impl Net {
    /// `vA` (spate) - `vB` (kernel), or `vA` - `rA` [relay] `rB` - `vB`.
    fn new(relay_loss: Option<(f64, f64)>) -> Net {
        let spate = Netns::new("app");
        let kernel = Netns::new("peer");
        let relay = relay_loss.map(|(a_b, b_a)| {
            let r = Netns::new("relay");
            veth(&spate, "vA", &r, "rA");
            veth(&r, "rB", &kernel, "vB");
            r.disable_ipv6("rA");
            r.disable_ipv6("rB");
            let args: Vec<String> = [
                "--a",
                "rA",
                "--b",
                "rB",
                "--loss-a-b",
                &a_b.to_string(),
                "--loss-b-a",
                &b_a.to_string(),
                "--seed",
                "7",
            ]
            .map(String::from)
            .to_vec();
            let mut p = r.spawn("relay", RELAY, &args, Duration::from_secs(300)).expect("start spate-relay");
            assert!(p.wait_for_output("<->", Duration::from_secs(30)), "relay did not start: {}", p.output());
            (r, p)
        });
        if relay.is_none() {
            veth(&spate, "vA", &kernel, "vB");
        }
        spate.must(&["ip", "link", "set", "vA", "address", "02:53:50:41:54:45"]);
        spate.disable_ipv6("vA");
        kernel_peer(&kernel, "vB");
        Net { spate, kernel, relay }
    }

    /// Stops the relay; what it did each way: `(a->b, b->a)`.
    fn relay_counts(&mut self) -> (RelayLeg, RelayLeg) {
        // The namespace stays until the relay has reported (dropping it
        // kills what runs inside).
        let (_ns, mut p) = self.relay.take().expect("a relay");
        stop_relay(&mut p)
    }
}

/// `lost/total` from the report line iperf prints after "Server Report:"
/// (client side) or under its header (server side).
fn lost_total(out: &str) -> (u64, u64) {
    let line = out
        .lines()
        .rev()
        .find(|l| l.contains(" ms ") && l.contains('%') && l.contains('/'))
        .unwrap_or_else(|| panic!("no iperf report line in:\n{out}"));
    let word = line.split_whitespace().find(|w| w.contains('/') && !w.contains("sec")).unwrap();
    let (l, t) = word.split_once('/').unwrap();
    (l.parse().unwrap(), t.parse().unwrap())
}

#[test]
fn iperf_server_answers_the_kernel_iperf_client() {
    let _serial = device_lock();
    let net = Net::new(None);
    let server = SpateApp::start(&net.spate, IPERF, &stack_args(&["-s", "-u"]), "Server listening on UDP port 5001");
    let out = net.kernel.exec(&["timeout", "60", "iperf", "-u", "-c", "198.18.0.2", "-l", "40", "-b", "1M", "-t", "2"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("Server Report:"), "the iperf client printed no server report:\n{text}");
    let (lost, total) = lost_total(&text);
    assert!(total > 5000, "a 2 s test at 1 Mbit/s of 40-byte datagrams: {total}");
    assert_eq!(lost, 0, "no loss on a direct veth:\n{text}");
    let (counters, server_out) = server.stop();
    assert_eq!(lost_total(&server_out), (0, total), "the server printed the same report");
    assert_eq!(spate_testkit::counter(&counters, "Udp.InDatagrams"), total, "every datagram, the last included");
}

/// The loss iperf reports through a relay dropping about 10% of the UDP
/// frames towards the receiver matches the path's: what the relay dropped,
/// what its capture missed, and what the sender counted as dropped before
/// the wire (`before`: a sending spate's datagrams that waited for the
/// peer's address longer than its neighbour queue holds, the relay's
/// scheduling delaying the first ARP reply by up to tens of milliseconds).
fn assert_loss_matches(reported: (u64, u64), relay: RelayLeg, before: u64, text: &str) {
    let (lost, total) = reported;
    let path_dropped = relay.dropped + relay.missed + before;
    let path_total = relay.udp + relay.missed + before;
    let reported_pct = 100.0 * lost as f64 / total as f64;
    let path_pct = 100.0 * path_dropped as f64 / path_total as f64;
    assert!(
        (reported_pct - path_pct).abs() <= 1.0,
        "iperf reports {lost}/{total} ({reported_pct:.2}%), the path dropped {path_dropped}/{path_total} \
         ({path_pct:.2}%: the relay {relay:?}, before the wire {before}):\n{text}"
    );
    let relay_pct = 100.0 * relay.dropped as f64 / relay.udp as f64;
    assert!((5.0..15.0).contains(&relay_pct), "the relay drops about 10%: {relay_pct:.2}%");
}

#[test]
fn iperf_server_reports_the_loss_a_relay_made() {
    let _serial = device_lock();
    let mut net = Net::new(Some((0.0, 10.0)));
    let server = SpateApp::start(&net.spate, IPERF, &stack_args(&["-s", "-u"]), "Server listening");
    let out =
        net.kernel.exec(&["timeout", "60", "iperf", "-u", "-c", "198.18.0.2", "-l", "100", "-b", "4M", "-t", "3"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("Server Report:"), "no server report:\n{text}");
    let reported = lost_total(&text);
    let (_, server_out) = server.stop();
    assert_eq!(lost_total(&server_out), reported, "server and client print the same report");
    let (_, b_to_a) = net.relay_counts();
    // The kernel's queue for an unresolved neighbour holds far more than
    // the first ARP reply's delay fills at 4 Mbit/s.
    assert_loss_matches(reported, b_to_a, 0, &text);
}

#[test]
fn iperf_client_drives_the_kernel_iperf_server_through_a_lossy_relay() {
    let _serial = device_lock();
    let mut net = Net::new(Some((10.0, 0.0)));
    let mut kernel_server = net
        .kernel
        .spawn("iperf-s", "iperf", &["-s".into(), "-u".into()], Duration::from_secs(120))
        .expect("start iperf -s -u");
    assert!(kernel_server.wait_for_output("Server listening", Duration::from_secs(10)));
    let mut client = net
        .spate
        .spawn(
            "iperf-c",
            IPERF,
            &stack_args(&["-c", "198.18.0.1", "-u", "-l", "100", "-b", "4M", "-t", "3"]),
            Duration::from_secs(120),
        )
        .expect("start spate-iperf -c");
    assert!(client.wait_exit(Duration::from_secs(60)), "spate-iperf -c did not finish:\n{}", client.output());
    let text = client.output();
    assert!(text.contains("Server Report:"), "spate-iperf printed no server report:\n{text}");
    let reported = lost_total(&text);
    assert!(kernel_server.wait_for_output("%)", Duration::from_secs(10)), "{}", kernel_server.output());
    assert_eq!(lost_total(&kernel_server.output()), reported, "the kernel server printed what spate-iperf received");
    kernel_server.stop();
    let counters = spate_testkit::parse_counters(&text);
    let before =
        spate_testkit::counter(&counters, "Neigh.QueueDrops") + spate_testkit::counter(&counters, "Tx.RingFull");
    let (a_to_b, _) = net.relay_counts();
    assert_loss_matches(reported, a_to_b, before, &text);
}

#[test]
fn flood_reaches_a_linux_socket_exactly() {
    let _serial = device_lock();
    let net = Net::new(None);
    // The kernel side: a socket on 198.18.0.1:9 counting until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let (ready, st) = (Arc::new(AtomicBool::new(false)), stop.clone());
    let r = ready.clone();
    let counter = net.kernel.thread(move || {
        let s = UdpSocket::bind("198.18.0.1:9").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        r.store(true, Ordering::Release);
        let mut buf = [0u8; 2048];
        let (mut n, mut next) = (0u64, 0u64);
        let mut in_order = true;
        while !st.load(Ordering::Acquire) {
            if let Ok(len) = s.recv(&mut buf) {
                let seq = u64::from_be_bytes(buf[..8].try_into().unwrap());
                in_order &= len == 18 && seq >= next;
                next = seq + 1;
                n += 1;
            }
        }
        (n, in_order)
    });
    while !ready.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let overflows_before = net.kernel.udp_counter("RcvbufErrors");
    let mut flood = net
        .spate
        .spawn(
            "flood",
            FLOOD,
            &stack_args(&["--dst", "198.18.0.1:9", "--rate", "20000", "--time", "2", "--streams", "4"]),
            Duration::from_secs(60),
        )
        .unwrap();
    assert!(flood.wait_exit(Duration::from_secs(30)), "spate-flood did not finish:\n{}", flood.output());
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Release);
    let (received, in_order) = counter.join().unwrap();
    let out = flood.output();
    let on_wire: u64 = out
        .lines()
        .find_map(|l| l.split("on the wire ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no 'on the wire' in:\n{out}"));
    assert!((36_000..=44_000).contains(&on_wire), "2 s at 20,000/s: {on_wire}\n{out}");
    // On these 2 vCPUs the kernel's reader can fall behind: what its
    // socket buffer refused, the kernel counts.
    let overflows = net.kernel.udp_counter("RcvbufErrors") - overflows_before;
    assert_eq!(
        received + overflows,
        on_wire,
        "the kernel socket counted what spate-flood says went on the wire ({overflows} refused by its buffer):\n{out}"
    );
    assert!(in_order, "18-byte datagrams, sequence numbers rising per socket stream order");
}

#[test]
fn sink_counts_what_testpmd_sent() {
    let _serial = device_lock();
    let ns = Netns::new("sink");
    let sock = unique_socket_path("sink");
    let _ = std::fs::remove_file(&sock);
    let mut source = TestPmdBuilder::new("0,1", 1)
        .interactive()
        .vdev(&format!("net_vhost0,iface={},queues=1", sock.display()))
        .args([
            "--forward-mode=txonly",
            "--txpkts=64",
            "--eth-peer=0,02:53:50:41:54:45",
            "--tx-ip=198.18.0.1,198.18.0.2",
            "--tx-udp=9,9",
            "--nb-cores=1",
            "--total-num-mbufs=8192",
        ])
        .limit(Duration::from_secs(120))
        .spawn("sink-src")
        .unwrap();
    source.proc.remove_on_drop(&sock);
    source.wait_prompt(Duration::from_secs(30)).unwrap();
    let args: Vec<String> = [
        "--vdev",
        &format!("net_virtio_user0,path={},queues=1,queue_size=1024,mac=02:53:50:41:54:45", sock.display()),
        "--ip",
        "198.18.0.2/24",
        "--lcores",
        "1",
        "--json",
        "--interval",
        "0.5",
    ]
    .map(String::from)
    .to_vec();
    let sink = SpateApp::start(&ns, SINK, &args, "spate-sink: port 9");
    std::thread::sleep(Duration::from_millis(500));
    source.command("start", "packet forwarding - ports=").unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let out = source.command("stop", "Done.").unwrap();
    let sent = FwdStats::parse(&out).map(|s| s.tx).expect("testpmd's totals");
    std::thread::sleep(Duration::from_millis(500));
    let (_, text) = sink.stop();
    let _ = source.command("quit", "Bye");
    let summary: serde_json::Value = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["summary"] == true)
        .unwrap_or_else(|| panic!("no JSON summary in:\n{text}"));
    let interval = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["delivered_pps"].as_f64().is_some_and(|p| p > 0.0))
        .unwrap_or_else(|| panic!("no interval line with traffic in:\n{text}"));
    for key in ["rx_pps", "delivered_pps", "drops", "busy_cycles_per_dgram", "cpu_ns_per_dgram"] {
        assert!(!interval[key].is_null(), "interval lines carry {key}: {interval}");
    }
    let frames = summary["rx_frames"].as_u64().unwrap();
    let consumed = summary["consumed"].as_u64().unwrap();
    let drops: u64 = summary["drops"].as_object().unwrap().values().filter_map(|v| v.as_u64()).sum();
    assert!(sent > 100_000, "testpmd sent {sent}");
    assert_eq!(frames, sent, "every frame testpmd sent reached spate-sink");
    assert_eq!(consumed + drops, sent, "consumed {consumed} + counted drops {drops} = sent {sent}: {summary}");
    let in_use = summary["mbufs_in_use"].as_u64().unwrap();
    assert!(in_use <= 1024 + 64, "only the RX ring (1024) and a burst hold mbufs at the end, not {in_use}: {summary}");
}

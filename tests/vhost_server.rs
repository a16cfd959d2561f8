//! spate's `net_virtio_user` port in server mode (`server=1`), the mode in
//! which OVS-DPDK's `dpdkvhostuserclient` ports connect and which survives
//! the switch restarting. Here dpdk-testpmd plays the vhost-user client
//! (txonly into spate-sink) and is restarted twice while traffic flows,
//! once with SIGTERM and once with SIGKILL: spate-sink keeps running, logs
//! the link going down and coming up, and takes traffic again by itself; a
//! stale socket file left at its path beforehand is removed, not fatal.

use std::time::{Duration, Instant};

use spate_testkit::testpmd::txonly_client;
use spate_testkit::{Netns, Proc, device_lock, unique_socket_path};

const SINK: &str = env!("CARGO_BIN_EXE_spate-sink");

/// Datagrams the sink delivered so far: the sum of its JSON interval
/// lines' `delivered`.
fn delivered(sink: &Proc) -> u64 {
    sink.output()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["delivered"].as_u64())
        .sum()
}

/// Waits until the sink delivered more than `than`.
fn wait_traffic(sink: &Proc, than: u64, what: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let d = delivered(sink);
        if d > than + 1000 {
            return d;
        }
        assert!(Instant::now() < deadline, "no traffic {what} (delivered {d})\n{}", sink.output());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits for the `n`th occurrence of `needle` in the sink's output.
fn wait_count(sink: &Proc, needle: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while sink.output().matches(needle).count() < n {
        assert!(Instant::now() < deadline, "{needle:?} not seen {n} times\n{}", sink.output());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn server_mode_port_survives_its_peer_restarting() {
    let _serial = device_lock();
    let ns = Netns::new("vhs");
    let sock = unique_socket_path("vhs");
    // A socket file nobody listens on, as a crashed run leaves it.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let args: Vec<String> = [
        "--vdev",
        &format!("net_virtio_user0,path={},server=1,queues=1,queue_size=1024,mac=02:53:50:41:54:45", sock.display()),
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
    let mut sink = ns.spawn("sink", SINK, &args, Duration::from_secs(300)).unwrap();
    sink.remove_on_drop(&sock);
    // A server-mode port waits for its first client before the port starts.
    assert!(sink.wait_for_output("waiting for client connection", Duration::from_secs(60)), "{}", sink.output());
    assert!(sink.output().contains("stale vhost-user socket"), "{}", sink.output());
    let client = txonly_client(&sock, Duration::from_secs(120));
    assert!(sink.wait_for_output("spate-sink: port 9", Duration::from_secs(60)), "{}", sink.output());
    let mut seen = wait_traffic(&sink, 0, "from the first client");

    // SIGTERM: testpmd closes the connection.
    let mut client = client;
    client.proc.stop_with(libc::SIGTERM, Duration::from_secs(10));
    wait_count(&sink, "link down", 1);
    drop(client);
    let gap = delivered(&sink);
    let client = txonly_client(&sock, Duration::from_secs(120));
    wait_count(&sink, "link up", 2);
    seen = wait_traffic(&sink, seen.max(gap), "after the peer's SIGTERM restart");

    // SIGKILL: the connection just breaks.
    let out = std::process::Command::new("pkill").args(["-KILL", "-f", client.prefix()]).output().unwrap();
    assert!(out.status.success(), "pkill found testpmd");
    wait_count(&sink, "link down", 2);
    drop(client);
    let client = txonly_client(&sock, Duration::from_secs(120));
    wait_count(&sink, "link up", 3);
    wait_traffic(&sink, seen, "after the peer's SIGKILL restart");
    drop(client);

    let status = sink.stop();
    let out = sink.output();
    assert!(status.is_some_and(|s| s.success()), "spate-sink kept running and exits 0:\n{out}");
    let summary: serde_json::Value = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["summary"] == true)
        .unwrap_or_else(|| panic!("no JSON summary in:\n{out}"));
    let in_use = summary["mbufs_in_use"].as_u64().unwrap();
    assert!(in_use <= 1024 + 64, "only the RX ring and a burst hold mbufs at the end, not {in_use}: {summary}");
}

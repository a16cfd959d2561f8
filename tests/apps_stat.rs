//! `spate-stat` reading a running `spate-echo` (on `net_af_packet`,
//! echoing a kernel peer in its namespace) through its control endpoint:
//! the counters it prints as JSON are the ones spate-echo prints at exit,
//! the sockets and lcores are there, `-i` gives deltas, the text form lists
//! the same, and a user other than root is refused; its Prometheus
//! metrics, scraped with `curl`, pass `promtool check metrics` and say
//! the same.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use spate_testkit::{PROMTOOL, SpateApp, device_lock, spate_and_kernel, unique};

const ECHO: &str = env!("CARGO_BIN_EXE_spate-echo");
const STAT: &str = env!("CARGO_BIN_EXE_spate-stat");

/// Runs spate-stat (as `user`, root if none) with `args`: success and output.
fn stat(args: &[&str], user: Option<u32>) -> (bool, String) {
    let mut cmd = match user {
        Some(uid) => {
            let mut c = std::process::Command::new("setpriv");
            c.args([&format!("--reuid={uid}"), &format!("--regid={uid}"), "--clear-groups", "timeout", "20", STAT]);
            c
        }
        None => {
            let mut c = std::process::Command::new("timeout");
            c.args(["20", STAT]);
            c
        }
    };
    let out = cmd.args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn counters(json: &serde_json::Value) -> BTreeMap<String, u64> {
    json["counters"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap())).collect()
}

#[test]
fn spate_stat_reads_a_running_spate_echo() {
    let _serial = device_lock();
    let (spate_ns, kernel) = spate_and_kernel("stat");
    // IPv4 only: no neighbour discovery or MLD arriving while counters
    // are compared.
    kernel.must(&["sysctl", "-qw", "net.ipv6.conf.vB.disable_ipv6=1"]);
    let name = unique("echo-");
    let args: Vec<String> = [
        "--vdev",
        "net_af_packet0,iface=vA",
        "--ip",
        "198.18.0.2/24",
        "--lcores",
        "0",
        "--interval",
        "0",
        "--name",
        &name,
        "--metrics",
        "127.0.0.1:9464",
        "--read-delay-histograms",
    ]
    .map(String::from)
    .to_vec();
    let echo = SpateApp::start(&spate_ns, ECHO, &args, "UDP echo on");

    let sent = kernel.run(|| {
        let s = std::net::UdpSocket::bind("198.18.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let mut back = 0;
        let mut buf = [0u8; 64];
        for i in 0..100u32 {
            s.send_to(&i.to_le_bytes(), "198.18.0.2:7").unwrap();
            if s.recv_from(&mut buf).is_ok() {
                back += 1;
            }
        }
        back
    });
    assert!(sent >= 99, "echoed {sent} of 100");

    // Prometheus: scraped in spate-echo's namespace, checked by promtool.
    let scrape = spate_ns.must(&["curl", "-sf", "http://127.0.0.1:9464/metrics"]);
    let file = std::env::temp_dir().join(format!("{}.prom", unique("spate-metrics-")));
    std::fs::write(&file, &scrape).unwrap();
    let check = std::process::Command::new("sh")
        .args(["-c", &format!("{PROMTOOL} check metrics < {}", file.display())])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(
        check.status.success(),
        "promtool: {}{}\n{scrape}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let series = |name: &str| -> u64 {
        let line = scrape.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in:\n{scrape}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(series(&format!("spate_udp_in_datagrams_total{{stack=\"{name}\"}}")), 100);
    assert!(scrape.contains("# HELP spate_udp_in_datagrams_total UDP/IPv4 datagrams delivered to sockets."));
    assert!(scrape.contains("spate_socket_drops_total{local=\"[::]:7\""), "{scrape}");
    assert!(series("spate_lcore_loops_total{lcore=\"0\"") > 0);
    assert!(scrape.contains("spate_mempool_mbufs_in_use{"), "{scrape}");
    // The echo's socket keeps its read delays (spate-echo reads what the
    // lcore staged: none counted), as a histogram.
    assert!(scrape.contains("# TYPE spate_socket_read_delay_seconds histogram"), "{scrape}");
    assert!(scrape.contains("spate_socket_read_delay_seconds_bucket{local=\"[::]:7\""), "{scrape}");
    let code = spate_ns.must(&["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:9464/"]);
    assert_eq!(code, "404");

    // The text form.
    let (ok, text) = stat(&["--name", &name], None);
    assert!(ok, "{text}");
    for want in [
        "#counters",
        "UdpInDatagrams",
        "#sockets",
        "[::]:7",
        "#lcores",
        "#ports",
        "net_af_packet0",
        "#neighbors",
        "198.18.0.1 dev if0",
        "read delay: no reads yet",
    ] {
        assert!(text.contains(want), "{want} not in:\n{text}");
    }
    // Deltas: two intervals, the lcore's share of busy cycles among them.
    let (ok, text) = stat(&["--name", &name, "--json", "-i", "0.2", "-c", "2"], None);
    assert!(ok, "{text}");
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{text}");
    for l in &lines {
        assert!(l["interval_secs"].as_f64().unwrap() > 0.1, "{l}");
        let share = l["lcores"][0]["busy_share"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&share), "{l}");
        assert_eq!(l["deltas"]["UdpInDatagrams"], 0, "{l}");
    }
    // A user who is not root is refused by the socket's mode.
    let (ok, text) = stat(&["--name", &name], Some(65534));
    assert!(!ok && text.contains("Permission denied") && text.contains("its owner and root only"), "{text}");
    let (ok, text) = stat(&[], Some(65534));
    assert!(!ok && text.contains("no running stack this user may open"), "{text}");

    // Quiet now: the last snapshot is what spate-echo says at exit.
    let until = Instant::now() + Duration::from_secs(10);
    let snapshot = loop {
        let (ok, a) = stat(&["--name", &name, "--json"], None);
        assert!(ok, "{a}");
        std::thread::sleep(Duration::from_millis(300));
        let (_, b) = stat(&["--name", &name, "--json"], None);
        let (a, b): (serde_json::Value, serde_json::Value) =
            (serde_json::from_str(&a).unwrap(), serde_json::from_str(&b).unwrap());
        if counters(&a) == counters(&b) || Instant::now() > until {
            break b;
        }
    };
    let echo_sock =
        snapshot["sockets"].as_array().unwrap().iter().find(|s| s["local"] == "[::]:7").expect("the echo socket");
    assert_eq!(echo_sock["family"], "ipv6");
    assert_eq!(snapshot["lcores"][0]["datagrams"], 100);
    let json = counters(&snapshot);
    let (final_counters, out) = echo.stop();
    let groups = ["Port", "Mempool", "Reassembly", "Neighbours", "Lcores", "Sockets"];
    let mut compared = 0;
    for (key, v) in &final_counters {
        let (group, name) = key.split_once('.').unwrap();
        if groups.contains(&group) {
            continue;
        }
        assert_eq!(json.get(&format!("{group}{name}")), Some(v), "{key} at exit: {v}; spate-stat: {json:?}\n{out}");
        compared += 1;
    }
    let nonzero = json.values().filter(|v| **v > 0).count();
    assert_eq!(compared, nonzero, "every non-zero counter spate-stat saw is in the summary:\n{out}");
    assert!(json["UdpInDatagrams"] == 100 && json["UdpOutDatagrams"] == 100, "{json:?}");
    assert!(!std::path::Path::new(&format!("/run/spate/{name}.sock")).exists(), "the endpoint went with spate-echo");
}

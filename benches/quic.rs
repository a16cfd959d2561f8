//! QUIC bulk throughput and handshakes per second: quinn 0.11 on spate
//! against the same quinn on a kernel UDP socket (`spate-quic` and
//! `spate-quic --kernel`: one program, one quinn), each with the CPU time
//! its process used per GB and per handshake, and what the peer used.
//!
//! The measured side sits in one namespace, the peer in another; two veth
//! pairs join them, configured alike (TX checksum offload off at both
//! ends: spate's raw receiver needs it, so the kernel's path has it too):
//! `vA`-`vB` carries spate (`net_af_packet` on `vA`, 198.18.0.2), `kA`-`kB`
//! the kernel's sockets (198.19.0.2). The peer is always quinn on the
//! kernel's sockets (`spate-quic --kernel`) on CPU 1, serving both links.
//!
//! Measured sides (2 vCPUs, so where each thread runs is part of it):
//! - `kernel`: quinn on a kernel socket, pinned to CPU 0;
//! - `spate, beside`: spate-quic as it runs by default: quinn's drivers
//!   and the application's tasks on the lcore (`--drivers lcore`), the
//!   lcore on CPU 0 on adaptive polling (`--poll adaptive`: it polls up
//!   to 50 us without work, its window, then sleeps until a frame, a
//!   hand-off or its next timer wakes it), the thread that drives tokio's
//!   timers and file reads on CPU 0 too;
//! - `other build` (with `--against PATH`): `spate, beside` run by
//!   another build's spate-quic, to set two builds side by side in one
//!   run (the binary keeps its name, `spate-quic`, in a folder of its own);
//! - `beside, idle 0`: the same, the lcore sleeping as soon as it is idle
//!   (`--poll-idle-us 0`);
//! - `beside, thread`: quinn on tokio in a thread of its own on CPU 0
//!   beside the adaptive lcore (`--drivers thread`): each datagram handed
//!   between the two;
//! - `spate, apart`: the lcore busy-polling CPU 0, quinn's thread on CPU 1
//!   beside the peer (`--drivers thread`);
//! - `spate to spate` (client jobs): both ends on spate as `spate, beside`
//!   runs, over a vhost-user pair (the server on `net_vhost`, CPU 1; the
//!   client on `net_virtio_user`, CPU 0), against the kernel's row, whose
//!   peer is quinn on the kernel's sockets over the veth: the second
//!   table sets both processes' CPU side by side.
//!
//! Jobs: a client downloading a file over `hq-interop` from the peer; a
//! server the peer's client downloads from; a client making handshakes
//! one after another (ALPN `echo`, one byte echoed each); a server the
//! peer's client makes them with. Each job is timed from the client's
//! first connect to its last close (the stack's start and stop and the
//! endpoint's wait for its closes to drain are outside it); CPU time is
//! the process's threads' time on a CPU over it (`schedstat`, to the
//! nanosecond: the measured client's own reading, a measured server's
//! from outside over the peer client's run), a busy-polling lcore's idle
//! polls included; the handshake column is the client's median
//! handshake. Medians of the rounds, sides taking turns in each round
//! (the kernel's first, the others in an order turned by one every other
//! round and reversed in between);
//! then each side's ratios to the kernel's run of the same round, their
//! median, least and most (slow drift of the host cancels within a round).
//!
//! ```text
//! cargo bench --bench quic -- [--quick] [--only JOB] [--sides LIST] [--against PATH] [--rounds N] [--handshakes N] [--json PATH]
//! ```
//!
//! `--only` runs the jobs whose name holds JOB (`handshakes`,
//! `client`...); `--sides` the sides a comma-separated list names
//! (`beside`, `against`, `idle0`, `thread`, `apart`, `pair`), the
//! kernel's always; `--against PATH` adds `other build`: `spate, beside`
//! run by another build's spate-quic (two builds side by side in one
//! run); `--rounds` (3; 1 with `--quick`) and `--handshakes` (200 a round)
//! set the run's size.

use spate_testkit::stats::median;
use std::path::PathBuf;
use std::time::Duration;

use spate_testkit::{Netns, Proc, cpu_model, unique, unique_socket_path, veth};

const QUIC: &str = env!("CARGO_BIN_EXE_spate-quic");

/// The peer's namespace and the measured side's, both links up.
struct Net {
    measured: Netns,
    peer: Netns,
    root: PathBuf,
    /// The `--against` build's spate-quic (none: the side is not run).
    against: String,
}

impl Net {
    fn new(file_bytes: usize) -> Net {
        let measured = Netns::new("quicm");
        let peer = Netns::new("quicp");
        veth(&measured, "vA", &peer, "vB");
        veth(&measured, "kA", &peer, "kB");
        measured.must(&["ip", "link", "set", "vA", "address", "02:53:50:41:54:45"]);
        measured.disable_ipv6("vA");
        measured.must(&["ip", "addr", "add", "198.19.0.2/24", "dev", "kA"]);
        peer.must(&["ip", "addr", "add", "198.18.0.1/24", "dev", "vB"]);
        peer.must(&["ip", "addr", "add", "198.19.0.1/24", "dev", "kB"]);
        for (ns, dev) in [(&measured, "kA"), (&peer, "vB"), (&peer, "kB")] {
            ns.must(&["ethtool", "-K", dev, "tx", "off"]);
        }
        let root = PathBuf::from(format!("/tmp/{}", unique("spate-quic-bench-")));
        std::fs::create_dir_all(&root).unwrap();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let body: Vec<u8> = (0..file_bytes / 8)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect();
        std::fs::write(root.join("bulk.bin"), body).unwrap();
        Net { measured, peer, root, against: String::new() }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Side {
    Kernel,
    SpateBeside,
    /// `spate, beside` run by the binary `--against` names (another build).
    Against,
    SpateBesideNoIdle,
    SpateBesideThread,
    SpateApart,
    /// Both ends on spate over a vhost-user pair (client jobs only).
    SpatePair,
}

impl Side {
    const ALL: [Side; 7] = [
        Side::Kernel,
        Side::SpateBeside,
        Side::Against,
        Side::SpateBesideNoIdle,
        Side::SpateBesideThread,
        Side::SpateApart,
        Side::SpatePair,
    ];

    fn name(self) -> &'static str {
        match self {
            Side::Kernel => "kernel",
            Side::SpateBeside => "spate, beside",
            Side::Against => "other build",
            Side::SpateBesideNoIdle => "beside, idle 0",
            Side::SpateBesideThread => "beside, thread",
            Side::SpateApart => "spate, apart",
            Side::SpatePair => "spate to spate",
        }
    }

    /// Its key for `--sides`.
    fn key(self) -> &'static str {
        match self {
            Side::Kernel => "kernel",
            Side::SpateBeside => "beside",
            Side::Against => "against",
            Side::SpateBesideNoIdle => "idle0",
            Side::SpateBesideThread => "thread",
            Side::SpateApart => "apart",
            Side::SpatePair => "pair",
        }
    }

    /// The measured side's own address.
    fn addr(self) -> &'static str {
        if self == Side::Kernel { "198.19.0.2" } else { "198.18.0.2" }
    }

    /// The peer's address on this side's link.
    fn peer_addr(self) -> &'static str {
        match self {
            Side::Kernel => "198.19.0.1",
            Side::SpatePair => "198.18.0.2",
            _ => "198.18.0.1",
        }
    }

    /// The program and its flags (before the role's own), pinned as the
    /// side says.
    fn command(self, role: &str, against: &str) -> (String, Vec<String>) {
        if self == Side::Against {
            let (_, args) = Side::SpateBeside.command(role, against);
            return (against.to_string(), args);
        }
        let spate = ["--vdev", "net_af_packet0,iface=vA", "--ip", "198.18.0.2/24", "--lcores", "0", "--mbufs", "32767"];
        let side: &[&str] = match self {
            Side::Kernel => return ("taskset".into(), ["-c", "0", QUIC, role, "--kernel"].map(String::from).to_vec()),
            Side::SpateBeside | Side::Against => &["--app-cpus", "0", "--poll", "adaptive"],
            Side::SpateBesideNoIdle => &["--app-cpus", "0", "--poll", "adaptive", "--poll-idle-us", "0"],
            Side::SpateBesideThread => &["--app-cpus", "0", "--poll", "adaptive", "--drivers", "thread"],
            Side::SpateApart => &["--app-cpus", "1", "--drivers", "thread"],
            Side::SpatePair => unreachable!("the pair's commands are pair_command's"),
        };
        (QUIC.into(), [role].iter().chain(&spate).chain(side).map(|a| a.to_string()).collect())
    }
}

/// What one job cost: seconds, the measured process's CPU seconds, the
/// peer's, and the bytes or handshakes done.
#[derive(Debug, Clone, Copy, Default)]
struct Cost {
    secs: f64,
    cpu: f64,
    peer_cpu: f64,
    units: f64,
    /// The median handshake's milliseconds (the client's).
    hs: f64,
}

/// CPU seconds a process's live threads have used, to the nanosecond
/// (`/proc/PID/task/*/schedstat`: the measured servers' threads outlive
/// each job).
fn cpu_of(pid: u32) -> f64 {
    spate_apps::quic::threads_cpu_seconds(Some(pid))
}

/// The pid of the spate-quic process in `ns` (not its `timeout` wrappers).
fn quic_pid(ns: &Netns) -> u32 {
    let out = std::process::Command::new("ip").args(["netns", "pids", ns.name()]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .find(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "spate-quic"))
        .unwrap_or_else(|| panic!("no spate-quic in {}", ns.name()))
}

/// A spate-quic server in `ns`, started with `program args`.
fn server(ns: &Netns, label: &str, program: &str, args: &[String], root: &std::path::Path) -> (Proc, u32) {
    let mut args = args.to_vec();
    args.extend(["--root".into(), root.display().to_string()]);
    let mut p = ns.spawn(label, program, &args, Duration::from_secs(3600)).unwrap();
    assert!(p.wait_for_output("QUIC server on", Duration::from_secs(60)), "{label}: {}", p.output());
    let pid = quic_pid(ns);
    (p, pid)
}

/// Runs a client to its end: the JSON line it printed.
fn client(ns: &Netns, label: &str, program: &str, args: &[String]) -> serde_json::Value {
    let mut p = ns.spawn(label, program, args, Duration::from_secs(600)).unwrap();
    assert!(p.wait_exit(Duration::from_secs(610)), "{label} did not end: {}", p.output());
    let out = p.output();
    let v: serde_json::Value = out
        .lines()
        .find_map(|l| l.starts_with("{\"alpn\"").then(|| serde_json::from_str(l).unwrap()))
        .unwrap_or_else(|| panic!("{label}: no result in:\n{out}"));
    assert!(v["ok"] == true, "{label}: {out}");
    v
}

/// spate to spate over vhost-user: the server on `net_vhost` serving
/// `sock` (198.18.0.2, its lcore and quinn on CPU 1), the client on
/// `net_virtio_user` (198.18.0.1, on CPU 0), both polling adaptively.
fn pair_command(role: &str, sock: &std::path::Path) -> (String, Vec<String>) {
    let server = role == "server";
    let (vdev, ip, cpu) = if server {
        (format!("net_vhost0,iface={},queues=1", sock.display()), "198.18.0.2/24", "1")
    } else {
        (format!("net_virtio_user0,path={},queues=1,queue_size=1024", sock.display()), "198.18.0.1/24", "0")
    };
    let args = [role, "--vdev", &vdev, "--ip", ip, "--lcores", cpu, "--app-cpus", cpu, "--poll", "adaptive"];
    (QUIC.into(), args.iter().chain(&["--mbufs", "32767"]).map(|a| a.to_string()).collect())
}

/// The peer's quinn on CPU 1, on kernel sockets.
fn peer_command(role: &str) -> (String, Vec<String>) {
    ("taskset".into(), ["-c", "1", QUIC, role, "--kernel"].map(String::from).to_vec())
}

/// The client jobs' flags: a download of the bulk file, or `n` handshakes.
fn job_args(download: bool, n: u32, server: &str) -> Vec<String> {
    let mut a: Vec<String> = ["--insecure", "--json"].map(String::from).to_vec();
    if download {
        a.push(format!("https://{server}:4433/bulk.bin"));
    } else {
        let n = n.to_string();
        a.extend(["--alpn", "echo", "--bytes", "1", "--connections", &n].map(String::from));
        a.push(format!("https://{server}:4433/"));
    }
    a
}

/// The measured side as a client, the peer serving.
fn as_client(net: &Net, side: Side, download: bool, n: u32) -> Cost {
    let vhost = unique_socket_path("quic-bench");
    let pair = side == Side::SpatePair;
    let (prog, args) = if pair { pair_command("server", &vhost) } else { peer_command("server") };
    let (mut peer, peer_pid) = server(&net.peer, "quic-peer", &prog, &args, &net.root);
    peer.remove_on_drop(&vhost);
    let (prog, mut args) = if pair { pair_command("client", &vhost) } else { side.command("client", &net.against) };
    args.extend(job_args(download, n, side.peer_addr()));
    let before = cpu_of(peer_pid);
    let v = client(&net.measured, "quic-measured", &prog, &args);
    let units = if download { v["bytes_received"].as_f64().unwrap() } else { n as f64 };
    Cost {
        secs: v["job_secs"].as_f64().unwrap(),
        cpu: v["job_cpu_secs"].as_f64().unwrap(),
        peer_cpu: cpu_of(peer_pid) - before,
        units,
        hs: v["handshake_ms"]["median"].as_f64().unwrap(),
    }
}

/// The measured side as a server, the peer's client fetching.
fn as_server(net: &Net, side: Side, download: bool, n: u32) -> Cost {
    let (prog, args) = side.command("server", &net.against);
    let (_server, pid) = server(&net.measured, "quic-measured", &prog, &args, &net.root);
    let (prog, mut args) = peer_command("client");
    args.extend(job_args(download, n, side.addr()));
    let before = cpu_of(pid);
    let v = client(&net.peer, "quic-peer", &prog, &args);
    let cpu = cpu_of(pid) - before;
    let units = if download { v["bytes_received"].as_f64().unwrap() } else { n as f64 };
    Cost {
        secs: v["job_secs"].as_f64().unwrap(),
        cpu,
        peer_cpu: v["job_cpu_secs"].as_f64().unwrap(),
        units,
        hs: v["handshake_ms"]["median"].as_f64().unwrap(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let json = args.iter().position(|a| a == "--json").and_then(|i| args.get(i + 1)).cloned();
    let only = args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)).cloned();
    let (bytes, handshakes, rounds) = if quick { (100_000_000, 200, 1) } else { (400_000_000, 200, 3) };
    // A run's own counts: handshakes move by a third from one 200-handshake
    // round to the next on a 2-vCPU guest.
    let number = |flag: &str| -> Option<u32> {
        let at = args.iter().position(|a| a == flag)?;
        Some(args.get(at + 1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{flag} takes a number")))
    };
    let handshakes = number("--handshakes").unwrap_or(handshakes);
    let rounds = number("--rounds").unwrap_or(rounds);
    assert!(handshakes > 0 && rounds > 0, "--handshakes and --rounds take a positive number");
    // The kernel's side always runs: every ratio is to it.
    let sides: Vec<Side> = match args.iter().position(|a| a == "--sides") {
        None => Side::ALL.to_vec(),
        Some(at) => {
            let list = args.get(at + 1).expect("--sides takes a list");
            let keys: Vec<&str> = list.split(',').collect();
            for k in &keys {
                assert!(
                    Side::ALL.iter().any(|s| s.key() == *k),
                    "--sides: {k}? (kernel, beside, against, idle0, thread, apart, pair)"
                );
            }
            Side::ALL.into_iter().filter(|s| *s == Side::Kernel || keys.contains(&s.key())).collect()
        }
    };
    let against = args.iter().position(|a| a == "--against").map(|at| {
        let path = args.get(at + 1).expect("--against takes a spate-quic binary");
        assert!(std::path::Path::new(path).is_file(), "--against {path}: no such file");
        path.clone()
    });
    let named = args.iter().any(|a| a == "--sides");
    match (&against, sides.contains(&Side::Against)) {
        (None, true) if named => panic!("--sides against needs --against PATH"),
        (Some(_), false) => panic!("--against PATH: --sides does not name against"),
        _ => {}
    }
    let sides: Vec<Side> = sides.into_iter().filter(|s| *s != Side::Against || against.is_some()).collect();
    let mut net = Net::new(bytes);
    net.against = against.unwrap_or_default();
    let jobs: [(&str, bool, bool); 4] = [
        ("client downloads", true, true),
        ("server uploads", false, true),
        ("client handshakes", true, false),
        ("server handshakes", false, false),
    ];
    let mut results: Vec<(String, Side, Cost)> = Vec::new();
    // Each round's CPU a unit and rate against the kernel's in that round.
    let mut by_round: Vec<(String, Side, Vec<f64>, Vec<f64>)> = Vec::new();
    for (job, as_a_client, download) in
        jobs.into_iter().filter(|(j, ..)| only.as_ref().is_none_or(|o| j.contains(o.as_str())))
    {
        let mut costs: Vec<Vec<Cost>> = vec![Vec::new(); Side::ALL.len()];
        // The job's sides but the kernel's, by their index in Side::ALL.
        let others: Vec<usize> = (1..Side::ALL.len())
            .filter(|&i| sides.contains(&Side::ALL[i]) && (Side::ALL[i] != Side::SpatePair || as_a_client))
            .collect();
        for round in 0..rounds as usize {
            // The kernel's first (its ratios' reference), then the others
            // turned by one each round, and reversed every other turn
            // (a Williams design): no side always follows another.
            let mut order: Vec<usize> = (0..others.len()).map(|k| others[(k + round / 2) % others.len()]).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for i in std::iter::once(0).chain(order) {
                let side = Side::ALL[i];
                let c = if as_a_client {
                    as_client(&net, side, download, handshakes)
                } else {
                    as_server(&net, side, download, handshakes)
                };
                costs[i].push(c);
            }
        }
        for (i, side) in Side::ALL.into_iter().enumerate() {
            let c = &costs[i];
            if c.is_empty() {
                continue;
            }
            let m = |f: fn(&Cost) -> f64| median(&c.iter().map(f).collect::<Vec<_>>());
            let cost = Cost {
                secs: m(|c| c.secs),
                cpu: m(|c| c.cpu),
                peer_cpu: m(|c| c.peer_cpu),
                units: c[0].units,
                hs: m(|c| c.hs),
            };
            results.push((job.to_string(), side, cost));
            if side != Side::Kernel {
                let kernel = &costs[0];
                let cpu = c.iter().zip(kernel).map(|(s, k)| (s.cpu / s.units) / (k.cpu / k.units)).collect();
                let rate = c.iter().zip(kernel).map(|(s, k)| (s.units / s.secs) / (k.units / k.secs)).collect();
                by_round.push((job.to_string(), side, cpu, rate));
            }
        }
    }

    println!(
        "QUIC over spate and over the kernel's sockets ({}; quinn 0.11, {} rounds, {} handshakes a round)",
        cpu_model(),
        rounds,
        handshakes
    );
    println!(
        "peer: quinn on kernel sockets, CPU 1; kernel side on CPU 0; spate beside: quinn on the lcore (adaptive polling), CPU 0; other build: the same, --against's binary; idle 0: --poll-idle-us 0; thread: quinn on a thread beside the lcore, CPU 0; apart: lcore busy on CPU 0, quinn's thread CPU 1; spate to spate: vhost-user, client CPU 0, server CPU 1"
    );
    println!(
        "{:<18} {:<14} {:>12} {:>14} {:>14} {:>10} {:>12}",
        "job", "side", "rate", "CPU/unit", "peer CPU/unit", "vs kernel", "handshake"
    );
    let mut rows = Vec::new();
    for (job, side, c) in &results {
        let download = job.contains("load");
        let kernel = results.iter().find(|(j, s, _)| j == job && *s == Side::Kernel).map(|r| r.2).unwrap();
        let per = |cpu: f64, c: &Cost| if download { cpu / (c.units / 1e9) } else { cpu / c.units * 1e3 };
        let (rate, unit) = if download { (c.units / c.secs / 1e6, "MB/s") } else { (c.units / c.secs, "hs/s") };
        let cpu_unit = if download { "s/GB" } else { "ms/hs" };
        println!(
            "{:<18} {:<14} {:>7.1} {:<4} {:>8.2} {:<5} {:>8.2} {:<5} {:>9.2}x {:>12}",
            job,
            side.name(),
            rate,
            unit,
            per(c.cpu, c),
            cpu_unit,
            per(c.peer_cpu, c),
            cpu_unit,
            per(c.cpu, c) / per(kernel.cpu, &kernel),
            if download { "-".to_string() } else { format!("{:.3} ms", c.hs) }
        );
        rows.push(serde_json::json!({
            "job": job, "side": side.name(), "rate": rate, "rate_unit": unit,
            "cpu_per_unit": per(c.cpu, c), "peer_cpu_per_unit": per(c.peer_cpu, c), "cpu_unit": cpu_unit,
            "cpu_vs_kernel": per(c.cpu, c) / per(kernel.cpu, &kernel), "handshake_ms": c.hs,
        }));
    }
    println!("both processes' CPU: kernel to kernel over the veth, spate to spate over vhost-user");
    println!("{:<18} {:>16} {:>16} {:>10}", "job", "kernel-kernel", "spate-spate", "ratio");
    let mut pairs = Vec::new();
    for (job, _, p) in results.iter().filter(|(_, s, _)| *s == Side::SpatePair) {
        let k = results.iter().find(|(j, s, _)| j == job && *s == Side::Kernel).map(|r| r.2).unwrap();
        let download = job.contains("load");
        let unit = if download { "s/GB" } else { "ms/hs" };
        let both = |c: &Cost| {
            let cpu = c.cpu + c.peer_cpu;
            if download { cpu / (c.units / 1e9) } else { cpu / c.units * 1e3 }
        };
        println!(
            "{:<18} {:>10.2} {:<5} {:>10.2} {:<5} {:>9.2}x",
            job,
            both(&k),
            unit,
            both(p),
            unit,
            both(p) / both(&k)
        );
        pairs.push(serde_json::json!({
            "job": job, "kernel_pair": both(&k), "spate_pair": both(p), "unit": unit, "ratio": both(p) / both(&k),
        }));
    }
    println!("each round against the kernel's run of the same round: median [least, most]");
    println!("{:<18} {:<14} {:>24} {:>24}", "job", "side", "CPU/unit vs kernel", "rate vs kernel");
    let spread = |v: &[f64]| {
        let least = v.iter().copied().fold(f64::INFINITY, f64::min);
        let most = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (median(v), least, most)
    };
    let mut rounds_json = Vec::new();
    for (job, side, cpu, rate) in &by_round {
        let (c, rt) = (spread(cpu), spread(rate));
        println!(
            "{:<18} {:<14} {:>8.2}x [{:.2}, {:.2}] {:>8.2}x [{:.2}, {:.2}]",
            job,
            side.name(),
            c.0,
            c.1,
            c.2,
            rt.0,
            rt.1,
            rt.2
        );
        rounds_json
            .push(serde_json::json!({ "job": job, "side": side.name(), "cpu_vs_kernel": cpu, "rate_vs_kernel": rate }));
    }
    if let Some(path) = json {
        let body = serde_json::json!({ "cpu": cpu_model(), "rounds": rounds, "handshakes": handshakes, "rows": rows, "pairs": pairs, "by_round": rounds_json });
        std::fs::write(&path, serde_json::to_string_pretty(&body).unwrap()).unwrap();
    }
}

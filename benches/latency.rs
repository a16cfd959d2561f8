//! Round-trip latency of one datagram at a time (the next is sent when the
//! reply to the last is back), as p50, p99 and p99.9, over two paths:
//!
//! 1. A kernel UDP client in one namespace, a veth pair, and in the other
//!    namespace either the kernel's own echo (a UDP socket answering on
//!    198.18.0.2:7) or `spate-echo` on `net_af_packet` over the same veth
//!    end. The client, the veth and the kernel's receive path are the
//!    same for both: the difference is the server.
//! 2. spate to spate over vhost-user: `spate-echo` on `net_vhost` (CPU 1)
//!    and a spate client in this process on `net_virtio_user` (CPU 0)
//!    that sends from its run-to-completion callback and timestamps the
//!    reply with the TSC there.
//!
//! ```text
//! cargo bench --bench latency -- [--quick] [--json PATH]
//! cargo bench --bench latency -- --poll-table [--quick]
//! ```
//!
//! `--poll-table`: `spate-echo --poll busy` against `--poll adaptive` on
//! path 1 (`net_af_packet`) and over `net_tap` (the client on the tap's
//! kernel side), beside the kernel's echo on the veth, with the CPUs
//! otherwise idle and with a busy process on CPU 1, 20,000 round trips
//! each; every server once held to CPU 1 (the kernel's echo thread
//! pinned, `--lcores 1`) and once free to use either CPU (unpinned,
//! `--lcores 1@(0-1)`).

use std::net::{SocketAddr, UdpSocket as KernelSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spate::{DatagramBatch, LcoreCtx, PortSpec, Stack, StackConfig, UdpSocket};
use spate_testkit::process::Proc;
use spate_testkit::{Netns, SpateApp, cpu_model, kernel_peer, unique, unique_socket_path, veth};

const ECHO: &str = env!("CARGO_BIN_EXE_spate-echo");
const SPATE_MAC: &str = "02:53:50:41:54:45";
/// The pause between a run's setup and its first round trip.
const SETTLE: Duration = Duration::from_millis(500);

/// Round-trip times in nanoseconds, sorted.
struct Rtts(Vec<u64>);

impl Rtts {
    fn new(mut v: Vec<u64>) -> Rtts {
        assert!(!v.is_empty(), "no round trip completed");
        v.sort_unstable();
        Rtts(v)
    }

    fn pct(&self, p: f64) -> f64 {
        let i = ((self.0.len() as f64 * p / 100.0).ceil() as usize).clamp(1, self.0.len()) - 1;
        self.0[i] as f64 / 1000.0
    }
}

/// `n` ping-pongs of a 32-byte datagram to `target` from a kernel socket
/// (after `warm` unrecorded ones); a reply lost is a datagram resent and
/// not recorded.
fn kernel_client(target: SocketAddr, warm: usize, n: usize) -> (Vec<u64>, usize) {
    // The namespaces of the run before are torn down in the background
    // (RCU callbacks on the CPUs for tens of milliseconds): they would
    // land on this run's first round trips.
    std::thread::sleep(SETTLE);
    let s = KernelSocket::bind("198.18.0.1:0").expect("client socket");
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut buf = [0u8; 64];
    let mut rtts = Vec::with_capacity(n);
    let mut lost = 0;
    let mut seq = 0u64;
    while rtts.len() < n && lost < 1000 {
        seq += 1;
        let t0 = Instant::now();
        s.send_to(&seq.to_le_bytes().repeat(4), target).expect("send");
        loop {
            match s.recv_from(&mut buf) {
                Ok((32, _)) if buf[..8] == seq.to_le_bytes() => {
                    if seq as usize > warm {
                        rtts.push(t0.elapsed().as_nanos() as u64);
                    }
                    break;
                }
                Ok(_) => continue, // a late reply to an earlier one
                Err(_) => {
                    lost += 1;
                    break;
                }
            }
        }
    }
    (rtts, lost)
}

/// The kernel path: namespaces `latc` (client, vB 198.18.0.1) and `lats`
/// (server side, vA); first the kernel's echo on vA, then spate-echo on
/// it. Returns (kernel, spate) round trips and the datagrams lost.
fn over_veth(warm: usize, n: usize) -> ((Rtts, usize), (Rtts, usize)) {
    let server_ns = Netns::new("lats");
    let client_ns = Netns::new("latc");
    veth(&server_ns, "vA", &client_ns, "vB");
    server_ns.disable_ipv6("vA");
    kernel_peer(&client_ns, "vB");
    let target: SocketAddr = "198.18.0.2:7".parse().unwrap();

    // The kernel's echo on the server side.
    let kernel = kernel_echo(&server_ns, &client_ns, None, warm, n);

    // spate-echo on the same veth end, the kernel's address gone from it.
    server_ns.must(&["ip", "addr", "flush", "dev", "vA"]);
    server_ns.must(&["ip", "link", "set", "vA", "address", SPATE_MAC]);
    client_ns.must(&["ip", "neigh", "flush", "dev", "vB"]);
    let args: Vec<String> =
        ["--vdev", "net_af_packet0,iface=vA", "--ip", "198.18.0.2/24", "--lcores", "1", "--interval", "0"]
            .map(String::from)
            .to_vec();
    let app = SpateApp::start(&server_ns, ECHO, &args, "UDP echo on");
    let spate = client_ns.run(move || kernel_client(target, warm, n));
    let (_, out) = app.stop();
    assert!(out.contains("Udp: InDatagrams="), "spate-echo counted datagrams:\n{out}");
    ((Rtts::new(kernel.0), kernel.1), (Rtts::new(spate.0), spate.1))
}

/// spate to spate over vhost-user: spate-echo serves `net_vhost`, this
/// process is the `net_virtio_user` client, polling on CPU 0.
fn over_vhost(warm: usize, n: usize) -> (Rtts, usize) {
    let sock = unique_socket_path("latency");
    let _ = std::fs::remove_file(&sock);
    let args: Vec<String> = [
        "--vdev".to_string(),
        format!("net_vhost0,iface={},queues=1", sock.display()),
        "--ip".into(),
        "198.18.0.2/24".into(),
        "--lcores".into(),
        "1".into(),
        "--interval".into(),
        "0".into(),
    ]
    .to_vec();
    let log = std::path::PathBuf::from(format!("/tmp/{}.log", unique("spate-latency-echo-")));
    let mut echo = Proc::spawn("spate-echo", ECHO, &args, &log, Duration::from_secs(600)).expect("start spate-echo");
    echo.remove_on_drop(&sock);
    assert!(echo.wait_for_output("UDP echo on", Duration::from_secs(60)), "{}", echo.output());
    let cfg = StackConfig {
        lcores: "0".into(),
        ports: vec![
            PortSpec::new(&format!("net_virtio_user0,path={},queues=1,queue_size=1024", sock.display()))
                .addr("198.18.0.1/24")
                .unwrap(),
        ],
        stop_on_signal: false,
        mempool_size: 8191,
        ..StackConfig::default()
    };
    let stack = Stack::new(cfg).expect("the client stack");
    let sock = Arc::new(UdpSocket::bind(&stack, "198.18.0.1:40000").expect("client socket"));
    sock.set_nonblocking(true).unwrap();
    let result = Arc::new(Mutex::new((Vec::with_capacity(n), 0usize)));
    let (s, r) = (sock.clone(), result.clone());
    let target: SocketAddr = "198.18.0.2:7".parse().unwrap();
    stack
        .run(move |_| {
            let (s, r) = (s.clone(), r.clone());
            let hz = spate::dpdk::lcore::tsc_hz() as f64;
            let (mut seq, mut sent_at, mut rtts, mut lost) = (0u64, 0u64, Vec::with_capacity(n), 0usize);
            let mut buf = [0u8; 64];
            let mut staged = DatagramBatch::with_capacity(32);
            move |ctx: &mut LcoreCtx<'_>| {
                let now = spate::dpdk::lcore::tsc();
                // The burst's datagrams where the lcore staged them, then
                // what the queue holds.
                ctx.recv_staged(|_, st| st.move_to(&mut staged));
                let mut from_burst = staged.drain();
                while let Some(len) = from_burst
                    .next()
                    .map(|d| d.copy_to(&mut buf))
                    .or_else(|| s.recv_from(&mut buf).ok().map(|(len, _)| len))
                {
                    if len == 32 && buf[..8] == seq.to_le_bytes() && sent_at != 0 {
                        if seq as usize > warm {
                            rtts.push(((now - sent_at) as f64 * 1e9 / hz) as u64);
                        }
                        sent_at = 0;
                    }
                }
                // 200 ms without a reply: lost (the first waits for ARP).
                if sent_at != 0 && (now - sent_at) as f64 > hz * 0.2 {
                    lost += 1;
                    sent_at = 0;
                }
                if rtts.len() >= n || lost >= 1000 {
                    *r.lock().unwrap() = (std::mem::take(&mut rtts), lost);
                    ctx.stack().stop();
                    return;
                }
                if sent_at == 0 {
                    seq += 1;
                    if s.send_to(&seq.to_le_bytes().repeat(4), target).is_ok() {
                        sent_at = spate::dpdk::lcore::tsc();
                    }
                }
            }
        })
        .expect("run the client");
    drop(sock);
    // The client's port closes before the server goes.
    drop(stack);
    let status = echo.stop();
    assert!(status.is_some_and(|s| s.success()), "spate-echo failed:\n{}", echo.output());
    let (rtts, lost) = std::mem::take(&mut *result.lock().unwrap());
    (Rtts::new(rtts), lost)
}

/// `spate-echo --poll mode --lcores lcores` on `net_af_packet` (veth) or
/// `net_tap`: the round trips of a kernel client.
fn spate_echo_rtts(tap: bool, mode: &str, lcores: &str, warm: usize, n: usize) -> (Rtts, usize) {
    let target: SocketAddr = "198.18.0.2:7".parse().unwrap();
    let server_ns = Netns::new("lpoll");
    let client_ns = match tap {
        true => None,
        false => {
            let c = Netns::new("lpollc");
            veth(&server_ns, "vA", &c, "vB");
            server_ns.disable_ipv6("vA");
            server_ns.must(&["ip", "link", "set", "vA", "address", SPATE_MAC]);
            kernel_peer(&c, "vB");
            Some(c)
        }
    };
    let device = if tap { "net_tap0,iface=sp0" } else { "net_af_packet0,iface=vA" };
    let args: Vec<String> = ["--vdev", device, "--ip", "198.18.0.2/24", "--lcores", lcores, "--interval", "0"]
        .into_iter()
        .chain(["--poll", mode])
        .map(String::from)
        .collect();
    let app = SpateApp::start(&server_ns, ECHO, &args, "UDP echo on");
    if tap {
        kernel_peer(&server_ns, "sp0");
    }
    let client = client_ns.as_ref().unwrap_or(&server_ns);
    let (rtts, lost) = client.run(move || kernel_client(target, warm, n));
    let _ = app.stop();
    (Rtts::new(rtts), lost)
}

/// The kernel's own echo over the veth pair, its thread on `cpu` or
/// wherever the kernel puts it: its round trips.
fn kernel_echo_rtts(cpu: Option<usize>, warm: usize, n: usize) -> (Rtts, usize) {
    let server_ns = Netns::new("lker");
    let client_ns = Netns::new("lkerc");
    veth(&server_ns, "vA", &client_ns, "vB");
    server_ns.disable_ipv6("vA");
    kernel_peer(&client_ns, "vB");
    let (rtts, lost) = kernel_echo(&server_ns, &client_ns, cpu, warm, n);
    (Rtts::new(rtts), lost)
}

/// The kernel's UDP echo on 198.18.0.2:7 on `vA` of `server_ns` (the
/// address added there; its thread on `cpu` if given) and a kernel client
/// in `client_ns`: its round trips and the datagrams lost.
fn kernel_echo(server_ns: &Netns, client_ns: &Netns, cpu: Option<usize>, warm: usize, n: usize) -> (Vec<u64>, usize) {
    server_ns.must(&["ip", "addr", "add", "198.18.0.2/24", "dev", "vA"]);
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let server = server_ns.thread(move || {
        if let Some(cpu) = cpu {
            spate_testkit::pin_to_cpu(cpu).expect("pin the kernel echo");
        }
        let s = KernelSocket::bind("198.18.0.2:7").expect("echo socket");
        s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let mut buf = [0u8; 2048];
        while !stop2.load(Ordering::Relaxed) {
            if let Ok((len, from)) = s.recv_from(&mut buf) {
                let _ = s.send_to(&buf[..len], from);
            }
        }
    });
    let target: SocketAddr = "198.18.0.2:7".parse().unwrap();
    let result = client_ns.run(move || kernel_client(target, warm, n));
    stop.store(true, Ordering::Relaxed);
    server.join().expect("kernel echo");
    result
}

/// Busy against adaptive polling, with the CPUs idle and beside a busy
/// process on CPU 1: each server once on CPU 1 (the kernel's echo thread
/// pinned there, spate's lcore `--lcores 1`) and once free to run on
/// either CPU (the kernel's thread unpinned, `--lcores 1@(0-1)`).
fn poll_table(quick: bool) {
    let (warm, n) = if quick { (500, 5_000) } else { (2_000, 20_000) };
    println!("round trip of one 32-byte datagram at a time, {n} of them (after {warm} unrecorded)");
    println!("CPU: {}", cpu_model());
    println!("| CPUs | server on | path | server | p50 us | p99 us | p99.9 us | lost |");
    println!("|---|---|---|---|---|---|---|---|");
    for noisy in [false, true] {
        // A process's worth of busy polling on CPU 1 (a noisy neighbour).
        let spinner = noisy.then(|| spate_testkit::Spinners::pinned(1));
        let cpus = if noisy { "a busy process on CPU 1" } else { "otherwise idle" };
        let mut rows = Vec::new();
        for (on, cpu, lcores) in [("CPU 1", Some(1), "1"), ("CPU 0 or 1", None, "1@(0-1)")] {
            rows.push((on, "veth", "kernel UDP echo".to_string(), kernel_echo_rtts(cpu, warm, n)));
            for (tap, path) in [(false, "veth"), (true, "net_tap")] {
                for mode in ["busy", "adaptive"] {
                    let dev = if tap { "net_tap" } else { "net_af_packet" };
                    let rtts = spate_echo_rtts(tap, mode, lcores, warm, n);
                    rows.push((on, path, format!("spate-echo --poll {mode} ({dev})"), rtts));
                }
            }
        }
        for (on, path, server, (r, lost)) in &rows {
            println!(
                "| {cpus} | {on} | {path} | {server} | {:.1} | {:.1} | {:.1} | {lost} |",
                r.pct(50.0),
                r.pct(99.0),
                r.pct(99.9)
            );
        }
        drop(spinner);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    if args.iter().any(|a| a == "--poll-table") {
        poll_table(quick);
        return;
    }
    let json = args.iter().position(|a| a == "--json").and_then(|i| args.get(i + 1)).cloned();
    let (warm, n) = if quick { (500, 5_000) } else { (2_000, 50_000) };
    let ((kernel, kernel_lost), (spate_veth, spate_lost)) = over_veth(warm, n);
    let (vhost, vhost_lost) = over_vhost(warm, n);
    println!("round trip of one 32-byte datagram at a time, {n} of them (after {warm} unrecorded)");
    println!("CPU: {}", cpu_model());
    println!("| path | server | p50 us | p99 us | p99.9 us | lost |");
    println!("|---|---|---|---|---|---|");
    let rows = [
        ("kernel client, veth", "kernel UDP echo", &kernel, kernel_lost),
        ("kernel client, veth", "spate-echo (net_af_packet)", &spate_veth, spate_lost),
        ("spate client, vhost-user", "spate-echo (net_vhost)", &vhost, vhost_lost),
    ];
    for (path, server, r, lost) in rows {
        println!("| {path} | {server} | {:.1} | {:.1} | {:.1} | {lost} |", r.pct(50.0), r.pct(99.0), r.pct(99.9));
    }
    if let Some(path) = json {
        let row = |r: &Rtts| serde_json::json!({"p50_us": r.pct(50.0), "p99_us": r.pct(99.0), "p999_us": r.pct(99.9)});
        let body = serde_json::json!({
            "bench": "latency", "cpu": cpu_model(), "round_trips": n,
            "veth_kernel_echo": row(&kernel), "veth_spate_echo": row(&spate_veth), "vhost_spate_to_spate": row(&vhost),
        });
        std::fs::write(path, body.to_string()).expect("write JSON");
    }
}

//! Echo side by side: one `dpdk-testpmd --forward-mode=flowgen` source
//! (CPU 0; DPDK 22.11's flowgen sends 60-byte UDP frames from
//! 00:01:02:03:04:00, 10.254.0.0:1000 to 00:01:02:03:04:01,
//! 10.253.0.0:1001, fixed in its code, and counts and frees what comes
//! back) on the server end of a vhost-user pair feeds, one after the
//! other on CPU 1:
//!
//! - `dpdk-testpmd --forward-mode=5tswap --record-core-cycles`: an echo
//!   without a stack (MACs, addresses and ports swapped in place);
//! - `spate-echo` (the reply in the request's mbuf, the source answered
//!   through a static neighbour entry, as flowgen never answers ARP).
//!
//! Each prints busy cycles per echoed datagram (testpmd's own count of the
//! iterations that moved packets; spate's of its loop iterations that
//! found work) and the echo rate; the table gives spate's ratio to
//! 5tswap, with the CPU model. The two take turns for 7 rounds (1 with
//! `--quick`); the table gives each side's median with the least and the
//! most, and the ratio's median with every round's, so a reader sees how
//! far one round strays. Beside the cycles, spate's own instructions per
//! echoed datagram as perf-guard counts them (callgrind, the pipeline
//! benchmark's echo paths: the reply in the request's mbuf, and one
//! datagram per loop iteration), unless `--no-instructions`.
//!
//! ```text
//! cargo bench --bench echo -- [--quick] [--rounds N] [--no-instructions] [--json PATH]
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use spate_testkit::process::Proc;
use spate_testkit::stats::median_and_spread;
use spate_testkit::testpmd::measuring_client;
use spate_testkit::{FwdStats, TestPmd, TestPmdBuilder, cpu_model, unique, unique_socket_path};

const ECHO: &str = env!("CARGO_BIN_EXE_spate-echo");
const RING: u16 = 1024;

/// One measured echo.
#[derive(Debug, Clone)]
struct Point {
    name: &'static str,
    /// Busy cycles per echoed datagram.
    cycles: f64,
    /// Datagrams echoed per second (as the source counted them back).
    pps: f64,
    echoed: u64,
}

/// The addresses flowgen writes into every frame (testpmd's flowgen.c).
const FLOWGEN_SRC_MAC: &str = "00:01:02:03:04:00";
const FLOWGEN_DST_MAC: &str = "00:01:02:03:04:01";
const FLOWGEN_SRC_IP: &str = "10.254.0.0";
const FLOWGEN_DST: (&str, u16) = ("10.253.0.0", 1001);

/// The flowgen source on the vhost-user server end, driven interactively.
struct Source {
    pmd: TestPmd,
}

impl Source {
    fn new(sock: &Path) -> Source {
        let _ = std::fs::remove_file(sock);
        let mut pmd = TestPmdBuilder::new("0,1", 1)
            .interactive()
            .vdev(&format!("net_vhost0,iface={},queues=1", sock.display()))
            .args([
                "--forward-mode=flowgen".to_string(),
                "--flowgen-flows=1".into(),
                "--nb-cores=1".into(),
                "--burst=32".into(),
                format!("--rxd={RING}"),
                format!("--txd={RING}"),
                "--total-num-mbufs=32768".into(),
            ])
            .limit(Duration::from_secs(900))
            .spawn("flowgen")
            .expect("start the flowgen source");
        pmd.proc.remove_on_drop(sock);
        pmd.wait_prompt(Duration::from_secs(30)).expect("source prompt");
        Source { pmd }
    }

    fn start(&mut self) {
        self.pmd.command("start", "packet forwarding - ports=").expect("start the source");
    }

    /// Stops it; (sent, received back) since `start`.
    fn stop(&mut self) -> (u64, u64) {
        let out = self.pmd.command("stop", "Done.").expect("stop the source");
        let got = FwdStats::parse(&out).map(|s| (s.tx, s.rx)).unwrap_or((0, 0));
        assert!(got.0 > 0, "the source sent nothing:\n{}", self.pmd.proc.output());
        got
    }
}

fn virtio(sock: &Path) -> String {
    format!("net_virtio_user0,path={},queues=1,queue_size={RING},mac={FLOWGEN_DST_MAC}", sock.display())
}

/// testpmd 5tswap on the virtio-user end, forwarding on CPU 1.
fn five_tuple_swap(src: &mut Source, sock: &Path, warmup: u64, seconds: u64) -> Point {
    let limit = Duration::from_secs(warmup + seconds + 60);
    let mut pmd = measuring_client(sock, RING, "5tswap", &["--port-topology=loop"], limit);
    src.start();
    std::thread::sleep(Duration::from_secs(warmup + seconds));
    let (_, back) = src.stop();
    let out = pmd.finish();
    let stats = FwdStats::parse(&out).unwrap_or_else(|| panic!("no 5tswap stats:\n{out}"));
    Point {
        name: "dpdk-testpmd 5tswap",
        cycles: stats.cycles_per_packet.unwrap_or_else(|| panic!("no cycles from 5tswap:\n{out}")),
        pps: back as f64 / (warmup + seconds) as f64,
        echoed: stats.tx,
    }
}

/// spate-echo on the virtio-user end, lcore 1 polling.
fn spate_echo(src: &mut Source, sock: &Path, warmup: u64, seconds: u64) -> Point {
    let args: Vec<String> = [
        "--vdev".to_string(),
        virtio(sock),
        "--ip".into(),
        format!("{}/8", FLOWGEN_DST.0),
        "--lcores".into(),
        "1".into(),
        "--port".into(),
        FLOWGEN_DST.1.to_string(),
        "--neighbor".into(),
        format!("{FLOWGEN_SRC_IP}={FLOWGEN_SRC_MAC}"),
        "--interval".into(),
        "0".into(),
    ]
    .to_vec();
    let log = PathBuf::from(format!("/tmp/{}.log", unique("spate-echo-bench-")));
    let mut echo = Proc::spawn("spate-echo", ECHO, &args, &log, Duration::from_secs(warmup + seconds + 120))
        .expect("start spate-echo");
    assert!(echo.wait_for_output("spate-echo: UDP echo on", Duration::from_secs(60)), "{}", echo.output());
    std::thread::sleep(Duration::from_millis(300));
    src.start();
    std::thread::sleep(Duration::from_secs(warmup + seconds));
    let (_, back) = src.stop();
    std::thread::sleep(Duration::from_millis(300));
    let status = echo.stop();
    let text = echo.output();
    assert!(status.is_some_and(|s| s.success()), "spate-echo failed:\n{text}");
    // `key=` on the summary line starting `line`.
    let word = |line: &str, key: &str| -> u64 {
        text.lines()
            .filter(|l| l.starts_with(line))
            .flat_map(str::split_whitespace)
            .find_map(|w| w.strip_prefix(key))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {line} {key} in:\n{text}"))
    };
    // What spate did with what it got, for the reader of the table.
    for l in text.lines() {
        eprintln!("spate-echo {l}");
    }
    let busy = word("Lcores:", "BusyCycles=");
    let echoed = word("Udp:", "OutDatagrams=");
    Point {
        name: "spate-echo",
        cycles: busy as f64 / echoed.max(1) as f64,
        pps: back as f64 / (warmup + seconds) as f64,
        echoed,
    }
}

/// spate's own instructions per echoed datagram as perf-guard counts
/// them: the pipeline benchmark's `--guard` run, (echo, echo with one
/// datagram per loop iteration).
fn echo_instructions() -> (f64, f64) {
    // The benchmarks are spate-apps' targets: the workspace is one up.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("apps/ sits in the workspace");
    let json = std::env::temp_dir().join(format!("{}.json", unique("spate-echo-guard-")));
    let status = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .args(["bench", "-p", "spate-apps", "--bench", "pipeline", "--", "--guard", "--json"])
        .arg(&json)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("cargo bench --bench pipeline");
    assert!(status.success(), "the pipeline benchmark's --guard run failed");
    let text = std::fs::read_to_string(&json).expect("the guard run's JSON");
    let _ = std::fs::remove_file(&json);
    let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let get = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("no {k} in {text}"));
    (get("echo"), get("echo_burst_1"))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let json = args.iter().position(|a| a == "--json").and_then(|i| args.get(i + 1)).cloned();
    let (warmup, seconds) = if quick { (1, 3) } else { (2, 10) };
    let rounds: usize = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(if quick { 1 } else { 7 });
    let sock = unique_socket_path("spate-echo-bench");
    let mut src = Source::new(&sock);
    // Alternating rounds, medians: this machine's drift moves both alike
    // within a round, not across rounds.
    let (mut swaps, mut spates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds.max(1) {
        let swap = five_tuple_swap(&mut src, &sock, warmup, seconds);
        let spate = spate_echo(&mut src, &sock, warmup, seconds);
        ratios.push(spate.cycles / swap.cycles);
        swaps.push(swap);
        spates.push(spate);
    }
    drop(src);
    let swap_cycles: Vec<f64> = swaps.iter().map(|p| p.cycles).collect();
    let spate_cycles: Vec<f64> = spates.iter().map(|p| p.cycles).collect();
    let median_point = |v: &mut Vec<Point>| {
        v.sort_by(|a, b| a.cycles.total_cmp(&b.cycles));
        v.swap_remove(v.len() / 2)
    };
    let (swap, spate) = (median_point(&mut swaps), median_point(&mut spates));
    let (ratio, ratio_lo, ratio_hi) = median_and_spread(&ratios);
    let instructions = (!args.iter().any(|a| a == "--no-instructions")).then(echo_instructions);
    println!(
        "echo of 60-byte UDP frames over vhost-user, fed by dpdk-testpmd flowgen (CPU 0), echo on CPU 1; {} round(s), taking turns",
        ratios.len()
    );
    println!("CPU: {}", cpu_model());
    println!(
        "| echo | busy cycles per datagram, median | least | most | echoed per second (source's count, median round) | echoed |"
    );
    println!("|---|---|---|---|---|---|");
    for (p, all) in [(&swap, &swap_cycles), (&spate, &spate_cycles)] {
        let (med, lo, hi) = median_and_spread(all);
        println!("| {} | {med:.1} | {lo:.1} | {hi:.1} | {:.2} M | {} |", p.name, p.pps / 1e6, p.echoed);
    }
    let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
    println!(
        "spate-echo / 5tswap busy cycles: {ratio:.2}x, the median of the rounds' ratios (spread {ratio_lo:.2} to {ratio_hi:.2}; each: {}) (target <= 1.6x)",
        each.join(", ")
    );
    if let Some((echo, thin)) = instructions {
        println!(
            "spate's own instructions per echoed datagram (perf-guard's count, callgrind): {echo:.1}; one datagram per loop iteration: {thin:.1}"
        );
    }
    assert!(swap.echoed > 0 && spate.echoed > 0, "both echoed traffic");
    if let Some(path) = json {
        let body = serde_json::json!({
            "bench": "echo", "cpu": cpu_model(),
            "five_tuple_swap_cycles": swap.cycles, "spate_cycles": spate.cycles, "ratio": ratio,
            "five_tuple_swap_pps": swap.pps, "spate_pps": spate.pps,
            "ratio_least": ratio_lo, "ratio_most": ratio_hi, "ratios": ratios,
            "five_tuple_swap_rounds": swap_cycles, "spate_rounds": spate_cycles,
            "spate_instructions": instructions.map(|i| i.0), "spate_instructions_burst_1": instructions.map(|i| i.1),
        });
        std::fs::write(path, body.to_string()).expect("write JSON");
    }
}

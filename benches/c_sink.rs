//! The C API against the Rust API on one receive: three sinks read every
//! payload byte of 64-byte datagrams to port 9, 32 at most per call, on
//! the program's main thread while spate polls on lcore 1:
//! `benches/c/sink.c` with `spate_recvmmsg` (mmsg) and with the zero-copy
//! calls (zc), this benchmark itself as a Rust program with
//! `UdpSocket::recv_batch` (rust), and `benches/c/plain_sink.c`, the same
//! work on the C library's `recvmmsg`, under libspate-preload (preload:
//! what spate-run adds over the C API).
//!
//! - Instructions: each sink under `valgrind --tool=callgrind
//!   --separate-threads=yes`, reading N and then 2N datagrams; the main
//!   thread's count difference over N is what reading one datagram costs
//!   that thread (spate's lcore is another thread, the same for all
//!   three). The source sits in the process (net_pcap reading a file of
//!   exactly the datagrams the sink reads, every one queued, the queues
//!   sized for them all), so the counts repeat: valgrind runs one thread
//!   at a time, and a source in another process, or one without end,
//!   would be read at its pace, not the sink's.
//! - Cycles: natively, from `dpdk-testpmd txonly` over a vhost-user pair
//!   into `net_virtio_user`, the sinks taking turns for 7 rounds; the
//!   reading thread's CPU time per datagram (`CLOCK_THREAD_CPUTIME_ID`)
//!   at the TSC's rate, the median and the spread.
//!
//! The C sink is built against a release install of libspate:
//! `cargo xtask bench` makes it (`cargo xtask install --prefix
//! target/c-api-release`); `SPATE_C_PREFIX` names another.
//!
//! `cargo bench --bench c_sink -- [--quick] [--instructions] [--keep-callgrind DIR] [--json PATH]`:
//! `--instructions` runs no cycle rounds; `--keep-callgrind DIR` keeps
//! the main thread's callgrind counts of each sink's 2N run in DIR, for
//! `callgrind_annotate --inclusive=yes`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use clap::Parser;
use spate::{DatagramBatch, Stack, UdpSocket};
use spate_apps::cli::StackArgs;
use spate_testkit::testpmd::{SPATE_MAC, txonly_source};
use spate_testkit::unique_socket_path;
use spate_testkit::wire_peer::udp_frame;

const SINKS: [&str; 4] = ["rust", "mmsg", "zc", "preload"];
/// The MAC of the first net_pcap port.
const PCAP_MAC: &str = "02:70:63:61:70:00";

/// This benchmark as the Rust sink: `--rust-sink N [spate flags]`.
#[derive(Debug, Parser)]
struct SinkArgs {
    #[arg(long = "rust-sink")]
    n: u64,
    #[command(flatten)]
    stack: StackArgs,
}

/// The Rust sink: the same work as sink.c's, with `recv_batch`.
fn rust_sink(args: SinkArgs) {
    let stack = Stack::new(args.stack.to_config().expect("flags")).expect("stack");
    let sock = UdpSocket::builder(&stack).recv_buffer_size(256 << 20).bind("0.0.0.0:9").expect("bind");
    let _running = stack.spawn_polling().expect("spawn");
    println!("READY");
    let mut batch = DatagramBatch::with_capacity(32);
    let (mut got, mut calls, mut sum, mut start) = (0u64, 0u64, 0u64, 0i128);
    while got < args.n {
        let n = rust_receive(&sock, &mut batch);
        for d in batch.iter() {
            for b in d.data() {
                sum = sum.wrapping_add(*b as u64);
            }
        }
        rust_release(&mut batch);
        if got == 0 {
            start = thread_ns();
        }
        got += n as u64;
        calls += 1;
    }
    println!("sink datagrams={got} calls={calls} cpu_ns={} sum={sum}", thread_ns() - start);
}

/// The Rust sink's receive, out of line so callgrind counts it alone.
#[inline(never)]
fn rust_receive(sock: &UdpSocket, batch: &mut DatagramBatch) -> usize {
    sock.recv_batch(batch, 32).expect("recv_batch")
}

/// The Rust sink's release of what it read.
#[inline(never)]
fn rust_release(batch: &mut DatagramBatch) {
    batch.clear();
}

/// The calling thread's time on a CPU, in ns (`/proc/thread-self/schedstat`,
/// what `CLOCK_THREAD_CPUTIME_ID` reads).
fn thread_ns() -> i128 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    s.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The install the C sink is built from.
fn prefix() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let p = std::env::var_os("SPATE_C_PREFIX").map(PathBuf::from).unwrap_or_else(|| root.join("target/c-api-release"));
    assert!(
        p.join("lib/pkgconfig/spate.pc").exists(),
        "no release libspate at {}: cargo xtask install --prefix target/c-api-release",
        p.display()
    );
    p
}

fn build_c_sink() -> PathBuf {
    let bin = std::env::temp_dir().join(format!("spate-c-sink-{}", std::process::id()));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/c/sink.c");
    spate_testkit::c_build::build_against(&prefix(), "/usr/bin/gcc", &src, &bin, &["-O2", "-g", "-Wall"], &[])
}

/// benches/c/plain_sink.c, built with plain gcc (no spate in it).
fn build_plain_sink() -> PathBuf {
    let bin = std::env::temp_dir().join(format!("spate-plain-sink-{}", std::process::id()));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/c/plain_sink.c");
    let o = Command::new("/usr/bin/gcc").args(["-O2", "-g", "-Wall", "-o"]).arg(&bin).arg(&src).output().expect("gcc");
    assert!(o.status.success(), "gcc plain_sink.c: {}", String::from_utf8_lossy(&o.stderr));
    bin
}

/// The sinks' programs.
struct Sinks {
    c: PathBuf,
    plain: PathBuf,
}

/// The program, arguments and environment of sink `which` reading `n`
/// datagrams.
fn sink_command(which: &str, sinks: &Sinks, n: u64, flags: &[String]) -> (PathBuf, Vec<String>, Vec<(String, String)>) {
    match which {
        "rust" => {
            let mut a = vec!["--rust-sink".to_string(), n.to_string()];
            a.extend(flags.iter().cloned());
            (std::env::current_exe().expect("own path"), a, vec![])
        }
        "preload" => {
            let env = vec![
                ("LD_PRELOAD".to_string(), prefix().join("lib/libspate-preload.so").display().to_string()),
                ("SPATE_ARGS".to_string(), spate_apps::run::join_words(flags)),
            ];
            (sinks.plain.clone(), vec![n.to_string()], env)
        }
        mode => {
            let mut a = vec![mode.to_string(), n.to_string()];
            a.extend(flags.iter().cloned());
            (sinks.c.clone(), a, vec![])
        }
    }
}

/// `sink datagrams=.. calls=.. cpu_ns=..` of a run's output.
fn parse_sink(out: &str) -> (f64, f64, f64) {
    let line = out.lines().find(|l| l.starts_with("sink datagrams=")).unwrap_or_else(|| panic!("no result: {out}"));
    let field = |k: &str| -> f64 {
        line.split_whitespace().find_map(|w| w.strip_prefix(k)).and_then(|v| v.parse().ok()).unwrap()
    };
    (field("datagrams="), field("calls="), field("cpu_ns="))
}

/// A pcap file of `n` 64-byte frames to spate's port 9 (16 source ports).
fn pcap_of_frames(n: u64) -> PathBuf {
    let path = std::env::temp_dir().join(format!("spate-c-sink-{}-{n}.pcap", std::process::id()));
    let mut f = vec![];
    // Global header: magic, 2.4, no zone, no sigfigs, snaplen, Ethernet.
    f.extend(0xa1b2c3d4u32.to_le_bytes());
    f.extend(2u16.to_le_bytes());
    f.extend(4u16.to_le_bytes());
    f.extend(0u32.to_le_bytes());
    f.extend(0u32.to_le_bytes());
    f.extend(65535u32.to_le_bytes());
    f.extend(1u32.to_le_bytes());
    // net_pcap's port MAC (DPDK's pcap driver gives its first port this).
    let mac = PCAP_MAC.parse().expect("a MAC");
    for k in 0..n {
        let i = (k % 16) as u16;
        // 64-byte frames: 14 + 20 + 8 + 22 bytes of payload.
        let payload: Vec<u8> = (0..22).map(|j| (i as u8).wrapping_mul(7).wrapping_add(j)).collect();
        let frame = udp_frame(mac, false, 10_000 + i, 9, &payload);
        for w in [0u32, 0, frame.len() as u32, frame.len() as u32] {
            f.extend(w.to_le_bytes());
        }
        f.extend(&frame);
    }
    std::fs::write(&path, f).expect("write the pcap file");
    path
}

/// The calls each sink makes, whose inclusive instructions are counted:
/// receiving and giving the mbufs back.
fn calls_of(which: &str) -> &'static [&'static str] {
    match which {
        "rust" => &["*rust_receive*", "*rust_release*"],
        "mmsg" => &["spate_recvmmsg"],
        // The preload's recvmmsg (the C library's is not called).
        "preload" => &["recvmmsg"],
        _ => &["spate_recv_zc", "spate_release"],
    }
}

/// The instructions per datagram of the sink's receive calls (and all
/// they call: the copy for recvmmsg, the mbufs' release) under callgrind.
fn instructions(which: &str, sinks: &Sinks, n: u64, keep: Option<&Path>) -> (f64, f64) {
    // Without hugepages (valgrind cannot give the EAL the address space
    // it reserves for them), room for every datagram of a run.
    let config = std::env::temp_dir().join(format!("spate-c-sink-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        "hugepages = \"off\"\nmemory_mb = 1024\nmempool_size = 131071\nudp_mem_bytes = 209715200\n",
    )
    .expect("write the configuration");
    let run = |count: u64| -> (u64, f64) {
        let pcap = pcap_of_frames(count);
        let flags: Vec<String> = [
            "--config".to_string(),
            config.display().to_string(),
            "--vdev".into(),
            format!("net_pcap0,rx_pcap={}", pcap.display()),
            "--lcores".into(),
            "1".into(),
            "--ip".into(),
            "198.18.0.2/24".into(),
        ]
        .to_vec();
        let out = std::env::temp_dir().join(format!("spate-c-sink-cg-{}-{which}-{count}.out", std::process::id()));
        let (prog, args, env) = sink_command(which, sinks, count, &flags);
        let o = Command::new("valgrind")
            .envs(env)
            .args([
                "--tool=callgrind",
                "--quiet",
                // The lcore polls without pause: without a fair lock the
                // woken reader waits long for its turn.
                "--fair-sched=yes",
                "--separate-threads=yes",
                // Counts per instruction, for callgrind_annotate of a
                // kept file (--keep-callgrind) down to the assembly.
                "--dump-instr=yes",
                &format!("--callgrind-out-file={}", out.display()),
            ])
            .args(calls_of(which).iter().map(|f| format!("--toggle-collect={f}")))
            .arg(&prog)
            .args(&args)
            .output()
            .expect("valgrind (apt-get install valgrind)");
        let _ = std::fs::remove_file(&pcap);
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(o.status.success(), "{which} under callgrind: {text}{}", String::from_utf8_lossy(&o.stderr));
        let (got, calls, _) = parse_sink(&text);
        let main = std::fs::read_to_string(format!("{}-01", out.display())).expect("the main thread's counts");
        if let Some(dir) = keep {
            let kept = dir.join(format!("{which}-{count}.callgrind"));
            std::fs::copy(format!("{}-01", out.display()), &kept).expect("keep the counts");
            println!("kept {}", kept.display());
        }
        for t in 1..=64 {
            let _ = std::fs::remove_file(format!("{}-{t:02}", out.display()));
        }
        let ir = main
            .lines()
            .find_map(|l| l.strip_prefix("summary: ").or_else(|| l.strip_prefix("totals: ")))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("callgrind summary");
        (ir, got / calls)
    };
    let (one, batch) = run(n);
    let (two, _) = run(2 * n);
    ((two as f64 - one as f64) / n as f64, batch)
}

/// One native run of sink `which` from the txonly source: cycles per
/// datagram of the reading thread.
fn cycles(which: &str, sinks: &Sinks, n: u64, tsc_ghz: f64) -> f64 {
    let sock = unique_socket_path("spate-c-sink");
    let mut source = txonly_source(&sock, 64, Duration::from_secs(120), false);
    let flags: Vec<String> = [
        "--vdev".to_string(),
        format!("net_virtio_user0,path={},queues=1,queue_size=1024,mac={SPATE_MAC}", sock.display()),
        "--lcores".into(),
        "1".into(),
        "--ip".into(),
        "198.18.0.2/24".into(),
        "--mbufs".into(),
        "16383".into(),
    ]
    .to_vec();
    let (prog, args, env) = sink_command(which, sinks, n, &flags);
    let o = Command::new(&prog).args(&args).envs(env).output().expect("the sink");
    source.finish();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{which}: {text}{}", String::from_utf8_lossy(&o.stderr));
    let (got, _, ns) = parse_sink(&text);
    ns * tsc_ghz / got
}

/// The TSC's rate as the kernel measured it, else the CPU's nominal one.
fn tsc_ghz() -> f64 {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    cpuinfo
        .lines()
        .find(|l| l.starts_with("cpu MHz"))
        .and_then(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .map_or(2.0, |mhz| mhz / 1000.0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--rust-sink") {
        rust_sink(SinkArgs::parse_from(args.iter().filter(|a| *a != "--bench")));
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let json = args.iter().position(|a| a == "--json").and_then(|i| args.get(i + 1)).cloned();
    let keep = args.iter().position(|a| a == "--keep-callgrind").and_then(|i| args.get(i + 1)).map(PathBuf::from);
    let only_instructions = args.iter().any(|a| a == "--instructions");
    let sinks = Sinks { c: build_c_sink(), plain: build_plain_sink() };
    let n = if quick { 10_000 } else { 20_000 };
    println!("CPU: {}", spate_testkit::cpu_model());
    let mut ins = vec![];
    for s in SINKS {
        ins.push(instructions(s, &sinks, n, keep.as_deref()));
    }
    let (rounds, datagrams) = match (quick, only_instructions) {
        (_, true) => (0, 0),
        (true, _) => (3, 1_000_000),
        _ => (7, 4_000_000),
    };
    let ghz = tsc_ghz();
    let mut cyc: Vec<Vec<f64>> = vec![vec![]; SINKS.len()];
    for _ in 0..rounds {
        for (i, s) in SINKS.iter().enumerate() {
            cyc[i].push(cycles(s, &sinks, datagrams, ghz));
        }
    }
    let _ = std::fs::remove_file(&sinks.c);
    let _ = std::fs::remove_file(&sinks.plain);
    println!(
        "Reading 64-byte datagrams on the program's thread, 32 per call at most: instructions per datagram of the \
         receive calls and the release of their mbufs (callgrind, inclusive, {n} and {} datagrams from an \
         in-process pcap source: recv_batch and DatagramBatch::clear; spate_recvmmsg with its copy; spate_recv_zc \
         and spate_release; the preload's recvmmsg); cycles per datagram of the whole reading thread (its CPU time at {ghz:.2} GHz, \
         {datagrams} datagrams from testpmd txonly over vhost-user, median of {rounds} rounds)",
        2 * n
    );
    println!("| sink | instructions | over recv_batch | datagrams per call | cycles (median) | cycles (min..max) |");
    println!("|---|---|---|---|---|---|");
    let base = ins[0].0;
    let mut rows = vec![];
    for (i, s) in SINKS.iter().enumerate() {
        let (med, lo, hi) = spate_testkit::stats::median_and_spread(&cyc[i]);
        let name = match *s {
            "rust" => "Rust recv_batch",
            "mmsg" => "C spate_recvmmsg",
            "preload" => "C recvmmsg under libspate-preload",
            _ => "C spate_recv_zc + spate_release",
        };
        println!(
            "| {name} | {:.1} | {:+.1} | {:.1} | {med:.1} | {lo:.1}..{hi:.1} |",
            ins[i].0,
            ins[i].0 - base,
            ins[i].1
        );
        rows.push(serde_json::json!({"sink": s, "instructions": ins[i].0, "over_recv_batch": ins[i].0 - base,
            "per_call": ins[i].1, "cycles_median": med, "cycles_min": lo, "cycles_max": hi}));
    }
    println!(
        "libspate-preload over the C API (recvmmsg against spate_recvmmsg): {:+.1} instructions per datagram \
         (at most +40)",
        ins[3].0 - ins[1].0
    );
    if let Some(path) = json {
        let body = serde_json::json!({"bench": "c_sink", "cpu": spate_testkit::cpu_model(), "rows": rows});
        std::fs::write(path, body.to_string()).expect("write JSON");
    }
}

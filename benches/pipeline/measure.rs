//! Running this benchmark again as a child: under callgrind (instructions
//! per datagram) or natively (cycles per datagram), and the build without
//! the GRO stage.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Total instructions of a run of `exe` (this benchmark, or another build
/// of it) under callgrind.
pub(crate) fn callgrind_of(me: &Path, extra: &[String], datagrams: u64) -> u64 {
    let out = PathBuf::from(format!("/tmp/spate-callgrind-{}-{datagrams}.out", std::process::id()));
    let status = callgrind(&out, &[], me, extra, datagrams).status().expect("valgrind (apt-get install valgrind)");
    assert!(status.success(), "callgrind run failed");
    let text = std::fs::read_to_string(&out).expect("callgrind output");
    let _ = std::fs::remove_file(&out);
    text.lines()
        .find_map(|l| l.strip_prefix("summary: ").or_else(|| l.strip_prefix("totals: ")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("callgrind summary line")
}

/// Like [`instructions_per_datagram`], counting the main thread alone
/// (the polling lcore in these runs): a capture's writer thread does work
/// whose amount depends on how valgrind schedules it.
pub(crate) fn lcore_instructions_per_datagram(extra: &[String], n: u64) -> f64 {
    let me = std::env::current_exe().expect("own path");
    let main_thread = |datagrams: u64| -> u64 {
        let out = PathBuf::from(format!("/tmp/spate-callgrind-t-{}-{datagrams}.out", std::process::id()));
        let tool = ["--separate-threads=yes".to_string()];
        let status = callgrind(&out, &tool, &me, extra, datagrams).status().expect("valgrind");
        assert!(status.success(), "callgrind run failed");
        // One file per thread, `-01` the main one.
        let first = PathBuf::from(format!("{}-01", out.display()));
        let text = std::fs::read_to_string(&first).expect("callgrind output of the main thread");
        for t in 1..=64 {
            let _ = std::fs::remove_file(format!("{}-{t:02}", out.display()));
        }
        text.lines()
            .find_map(|l| l.strip_prefix("summary: ").or_else(|| l.strip_prefix("totals: ")))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("callgrind summary line")
    };
    let (one, two) = (main_thread(n), main_thread(2 * n));
    (two as f64 - one as f64) / n as f64
}

/// `exe extra --datagrams N` under callgrind (with `tool` options too),
/// writing its counts to `out`.
pub(crate) fn callgrind(out: &Path, tool: &[String], exe: &Path, extra: &[String], datagrams: u64) -> Command {
    let mut cmd = Command::new("valgrind");
    cmd.args(["--tool=callgrind", "--quiet", &format!("--callgrind-out-file={}", out.display())])
        .args(tool)
        .arg(exe)
        .args(extra)
        .args(["--datagrams", &datagrams.to_string()]);
    cmd
}

/// Instructions per datagram: (Ir(2N) - Ir(N)) / N.
pub(crate) fn instructions_per_datagram(extra: &[String], n: u64) -> f64 {
    let me = std::env::current_exe().expect("own path");
    instructions_of(&me, extra, n)
}

pub(crate) fn instructions_of(exe: &Path, extra: &[String], n: u64) -> f64 {
    let one = callgrind_of(exe, extra, n);
    let two = callgrind_of(exe, extra, 2 * n);
    (two - one) as f64 / n as f64
}

/// Cycles per datagram, natively, for each argument list: the runs take
/// turns, five rounds, and each keeps its median.
pub(crate) fn cycles_per_datagram(runs: &[Vec<String>], datagrams: u64) -> Vec<f64> {
    native(runs, datagrams).into_iter().map(|r| r.cycles / r.datagrams).collect()
}

/// What one native run printed: `datagrams cycles calls hz`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    pub(crate) datagrams: f64,
    pub(crate) cycles: f64,
    pub(crate) calls: f64,
    pub(crate) hz: f64,
    /// Cycles of the benchmark's source (receive and inject-only modes).
    pub(crate) source: f64,
    /// Cycles the first lcore spent steering (receive mode).
    pub(crate) steer: f64,
    /// Frames handed to another lcore (receive mode).
    pub(crate) handed: f64,
    /// Busy cycles of the first two lcores (receive mode).
    pub(crate) busy: [f64; 2],
}

impl Run {
    pub(crate) fn per_second(&self, n: f64) -> f64 {
        n * self.hz / self.cycles
    }
}

/// Native runs for each argument list, taking turns, five rounds; each
/// keeps the round with its median cycles per datagram.
pub(crate) fn native(runs: &[Vec<String>], datagrams: u64) -> Vec<Run> {
    let me = std::env::current_exe().expect("own path");
    let mut rounds: Vec<Vec<Run>> = vec![Vec::new(); runs.len()];
    for _ in 0..5 {
        for (r, extra) in runs.iter().enumerate() {
            let out = Command::new(&me)
                .args(extra)
                .args(["--datagrams", &datagrams.to_string()])
                .output()
                .expect("run the pipeline");
            assert!(out.status.success(), "pipeline run failed: {}", String::from_utf8_lossy(&out.stderr));
            let text = String::from_utf8_lossy(&out.stdout);
            let v: Vec<f64> = text.split_whitespace().filter_map(|w| w.parse().ok()).collect();
            assert!(v.len() >= 4, "expected `datagrams cycles calls hz`, got {text:?}");
            let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
            rounds[r].push(Run {
                datagrams: v[0],
                cycles: v[1],
                calls: v[2],
                hz: v[3],
                source: at(4),
                steer: at(5),
                handed: at(6),
                busy: [at(8), at(9)],
            });
        }
    }
    rounds
        .into_iter()
        .map(|mut r| {
            r.sort_by(|a, b| (a.cycles / a.datagrams).total_cmp(&(b.cycles / b.datagrams)));
            r[r.len() / 2]
        })
        .collect()
}

/// The same benchmark built without the GRO stage (`--features
/// no-gro-stage`, in a target directory of its own).
pub(crate) fn no_gro_stage_build() -> PathBuf {
    // The benchmarks are spate-apps' targets: the workspace is one up.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("apps/ sits in the workspace");
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .env("CARGO_TARGET_DIR", root.join("target/no-gro-stage"))
        .args(["build", "--release", "-p", "spate-apps", "--bench", "pipeline", "--features", "no-gro-stage"])
        .arg("--message-format=json")
        .output()
        .expect("cargo build");
    assert!(out.status.success(), "building without the GRO stage: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"]["name"] == "pipeline")
        .find_map(|v| v["executable"].as_str().map(PathBuf::from))
        .expect("the no-gro-stage benchmark's path")
}

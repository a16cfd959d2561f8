//! Instruction counts for the benchmarks: a program run under valgrind's
//! callgrind, and the total its output file's summary line gives.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The instructions callgrind output file `file` counted in all (its
/// `summary:` or `totals:` line).
pub fn summary(file: &Path) -> u64 {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("callgrind output {}: {e}", file.display()));
    text.lines()
        .find_map(|l| l.strip_prefix("summary: ").or_else(|| l.strip_prefix("totals: ")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("callgrind summary line")
}

/// Runs `exe args` under callgrind (quietly, its output in a file of its
/// own under /tmp, removed after) and returns the instructions it ran.
pub fn total(exe: &Path, args: &[String]) -> u64 {
    let out = PathBuf::from(format!("/tmp/{}.out", crate::unique("spate-callgrind-")));
    let status = Command::new("valgrind")
        .args(["--tool=callgrind", "--quiet", &format!("--callgrind-out-file={}", out.display())])
        .arg(exe)
        .args(args)
        .status()
        .expect("valgrind (apt-get install valgrind)");
    assert!(status.success(), "callgrind run of {} failed", exe.display());
    let n = summary(&out);
    let _ = std::fs::remove_file(&out);
    n
}

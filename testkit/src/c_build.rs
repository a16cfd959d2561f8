//! Building C programs against an install of libspate, as a user builds
//! them: `pkg-config spate` from the install's `lib/pkgconfig`, and the
//! install's `lib` as the run path.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `src` into `out` with `compiler` (a real path, such as
/// `/usr/bin/gcc`), `flags` before the source and `libs` after
/// `pkg-config --cflags --libs spate`; panics with the compiler's words
/// when it fails.
pub fn build_against(prefix: &Path, compiler: &str, src: &Path, out: &Path, flags: &[&str], libs: &[&str]) -> PathBuf {
    let pc = Command::new("pkg-config")
        .args(["--cflags", "--libs", "spate"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
        .expect("pkg-config");
    assert!(pc.status.success(), "pkg-config spate: {}", String::from_utf8_lossy(&pc.stderr));
    let pc = String::from_utf8_lossy(&pc.stdout).into_owned();
    let o = Command::new(compiler)
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(src)
        .args(pc.split_whitespace())
        .args(libs)
        .arg(format!("-Wl,-rpath,{}", prefix.join("lib").display()))
        .output()
        .expect("the compiler");
    assert!(o.status.success(), "{compiler} {}: {}", src.display(), String::from_utf8_lossy(&o.stderr));
    out.to_path_buf()
}

/// The install the C tests build from and run: `$SPATE_C_PREFIX`, else
/// `target/c-api-prefix` (`cargo xtask install --debug --prefix
/// target/c-api-prefix`, which `cargo xtask test` runs first).
pub fn install_prefix() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf();
    let p = std::env::var_os("SPATE_C_PREFIX").map(PathBuf::from).unwrap_or_else(|| root.join("target/c-api-prefix"));
    assert!(
        p.join("lib/pkgconfig/spate.pc").exists(),
        "no libspate install at {} (cargo xtask install --debug --prefix target/c-api-prefix)",
        p.display()
    );
    p
}

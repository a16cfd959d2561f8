//! spate's task runner. It builds without DPDK, so it can install what the
//! rest of the workspace needs before building it.
//!
//! ```text
//! cargo xtask demo     install what is missing, build, run spate's main job
//! cargo xtask test     install what the tests need, run the whole suite
//! cargo xtask setup    only install packages and reserve hugepages
//! cargo xtask bench [--quick] [NAME...]   run the benchmarks (see docs/performance.md)
//! cargo xtask leftovers  fail if a test left a process, folder or namespace
//! cargo xtask layers   check stack/src against its layer table
//! cargo xtask deps     check that the spate library brings no app dependency
//! cargo xtask perf-guard [--update]   spate's own instructions per datagram against perf-budget.toml
//! cargo xtask fuzz [--secs N] [TARGET...]   every cargo-fuzz target (or those named) for N s each
//! cargo xtask soak [--minutes M]   hostile and legitimate traffic for M minutes, memory sampled (not in CI)
//! cargo xtask install [--prefix DIR] [--debug]   libspate, spate.h, spate.pc and the tools under DIR (/usr/local)
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

mod layers;
mod perf;
mod toml_lite;

/// What building and running spate needs (testpmd is in dpdk-dev).
const RUN_PACKAGES: &[&str] = &["dpdk", "dpdk-dev", "libdpdk-dev", "pkg-config", "clang", "libclang-dev", "iproute2"];
/// What the tests need on top.
const TEST_PACKAGES: &[&str] = &[
    "ethtool",
    "iperf",
    "iperf3",
    "python3-scapy",
    // The aioquic peer's virtual environment (see AIOQUIC_VENV).
    "python3-venv",
    // Scraping /metrics.
    "curl",
    "tcpdump",
    // Reading spate-dump's pcapng files.
    "tshark",
    "util-linux",
    "procps",
    "iputils-ping",
    "openvswitch-switch-dpdk",
    // The container build and smoke test (docker/smoke.sh).
    "podman",
    "buildah",
    "runc",
    "conmon",
    "catatonit",
    "fuse-overlayfs",
    "uidmap",
    "slirp4netns",
    "netavark",
    "aardvark-dns",
    "iptables",
    "golang-github-containers-common",
    "debootstrap",
    "podman-compose",
    // docker/k8s/check.py reads the manifests.
    "python3-yaml",
    "binutils",
    "valgrind",
    // Unmodified programs under spate-run (tests/preload.rs).
    "socat",
    "netcat-openbsd",
    // The C API's test programs (C, C++, with the sanitizers).
    "gcc",
    "g++",
    // The pps harness labels its plot with this font.
    "fonts-dejavu-core",
];
/// Where the tests find aioquic (PyPI), an independent QUIC implementation
/// (testkit's `AIOQUIC_PYTHON` names its interpreter).
const AIOQUIC_VENV: &str = "/opt/spate-test/aioquic";
/// The aioquic release the tests were written against.
const AIOQUIC: &str = "aioquic==1.7.2";
/// Where the tests find `promtool` (testkit's `PROMTOOL`): Debian's
/// `prometheus` package unpacked, not installed (installing it would start
/// a Prometheus server).
const PROMETHEUS_DIR: &str = "/opt/spate-test/prometheus";
const HUGEPAGES_2M: u32 = 1024;
const HUGEPAGE_SYSFS: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (task, rest) = match args.split_first() {
        Some((t, r)) => (t.as_str(), r),
        None => ("help", &[][..]),
    };
    let result = match task {
        "setup" => setup(rest.iter().any(|a| a == "--tests")),
        "demo" => demo(rest),
        "demo-peer" => demo_peer(),
        "test" => test(rest),
        "bench" => bench(rest),
        "leftovers" => leftovers(),
        "inline-check" => inline_check(),
        "layers" => layer_check(),
        "deps" => dependency_check(),
        "perf-guard" => perf_guard(rest.iter().any(|a| a == "--update")),
        "fuzz" => fuzz(rest),
        "soak" => soak(rest),
        "install" => install(rest),
        _ => {
            eprintln!(
                "usage: cargo xtask <demo | test | setup [--tests] | bench [--quick] | leftovers | layers | deps | perf-guard [--update] | fuzz [--secs N] [TARGET...] | install [--prefix DIR] [--debug]>\n\
                 demo: install what is missing, build, and run spate's main job\n\
                 test: install what the tests need and run the whole suite"
            );
            return if task == "help" { ExitCode::SUCCESS } else { ExitCode::from(2) };
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask {task}: {e}");
            ExitCode::FAILURE
        }
    }
}

type Result<T = ()> = std::result::Result<T, String>;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace").to_path_buf()
}

fn run(cmd: &mut Command) -> Result {
    eprintln!("+ {cmd:?}");
    let status = cmd.status().map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("{cmd:?} failed: {status}")) }
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0\n")).unwrap_or(false)
}

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// Installs missing Debian packages and reserves hugepages.
fn setup(tests: bool) -> Result {
    let mut wanted: Vec<&str> = RUN_PACKAGES.to_vec();
    if tests {
        wanted.extend(TEST_PACKAGES);
    }
    let missing: Vec<&str> = wanted.into_iter().filter(|p| !installed(p)).collect();
    if !missing.is_empty() {
        if !is_root() {
            return Err(format!(
                "packages missing: {}; run as root or: sudo apt-get install {}",
                missing.join(" "),
                missing.join(" ")
            ));
        }
        let apt = |args: &[&str]| {
            let mut c = Command::new("apt-get");
            c.env("DEBIAN_FRONTEND", "noninteractive").args(["-o", "DPkg::Lock::Timeout=600"]).args(args);
            c
        };
        run(&mut apt(&["update", "-q"]))?;
        let mut install = apt(&["install", "-y", "-q", "--no-install-recommends"]);
        install.args(&missing);
        run(&mut install)?;
    }
    if tests {
        aioquic()?;
        promtool()?;
    }
    hugepages();
    Ok(())
}

/// promtool from Debian's `prometheus` package, unpacked into
/// [`PROMETHEUS_DIR`] unless there.
fn promtool() -> Result {
    let bin = format!("{PROMETHEUS_DIR}/usr/bin/promtool");
    if Path::new(&bin).exists() {
        return Ok(());
    }
    let work = std::env::temp_dir().join(format!("spate-promtool-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let download = |update: bool| {
        if update {
            let _ = run(Command::new("apt-get").args(["update", "-q"]));
        }
        run(Command::new("apt-get").current_dir(&work).args(["download", "-q", "prometheus"]))
    };
    let got = download(false).or_else(|_| download(true));
    let deb = std::fs::read_dir(&work)
        .ok()
        .and_then(|d| d.flatten().map(|e| e.path()).find(|p| p.extension().is_some_and(|x| x == "deb")));
    let result = match (got, deb) {
        (Ok(()), Some(deb)) => run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(PROMETHEUS_DIR)),
        (Err(e), _) => Err(e),
        (Ok(()), None) => Err("apt-get download prometheus left no package".into()),
    };
    let _ = std::fs::remove_dir_all(&work);
    result?;
    if Path::new(&bin).exists() { Ok(()) } else { Err(format!("{bin} is not in Debian's prometheus package")) }
}

/// aioquic in a virtual environment of its own, from PyPI, unless there.
fn aioquic() -> Result {
    let python = format!("{AIOQUIC_VENV}/bin/python3");
    let has = |python: &str| {
        Command::new(python).args(["-c", "import aioquic"]).output().map(|o| o.status.success()).unwrap_or(false)
    };
    if has(&python) {
        return Ok(());
    }
    // Debian's interpreter by its real path (another python3 may come
    // first on PATH).
    run(Command::new("/usr/bin/python3").args(["-m", "venv", "--clear", AIOQUIC_VENV]))?;
    run(Command::new(&python).args(["-m", "pip", "install", "-q", "--disable-pip-version-check", AIOQUIC]))?;
    if has(&python) { Ok(()) } else { Err(format!("{python} cannot import aioquic after installing it")) }
}

/// Reserves 2 MiB hugepages and mounts hugetlbfs where permitted; without
/// them spate runs with --no-huge (vhost-user needs them).
fn hugepages() {
    let current: u32 = std::fs::read_to_string(HUGEPAGE_SYSFS).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
    if current < HUGEPAGES_2M
        && let Err(e) = std::fs::write(HUGEPAGE_SYSFS, HUGEPAGES_2M.to_string())
    {
        eprintln!("note: cannot reserve hugepages ({e}); DPDK will run with --no-huge where it can");
        return;
    }
    let mounted = std::fs::read_to_string("/proc/mounts")
        .map(|m| m.lines().any(|l| l.split_whitespace().nth(2) == Some("hugetlbfs")))
        .unwrap_or(false);
    if !mounted {
        let _ = std::fs::create_dir_all("/dev/hugepages");
        if run(Command::new("mount").args(["-t", "hugetlbfs", "nodev", "/dev/hugepages"])).is_err() {
            eprintln!("note: cannot mount hugetlbfs; DPDK will run with --no-huge where it can");
        }
    }
}

/// The programs `cargo xtask install` puts under `bin/`.
const TOOLS: &[&str] = &[
    "spate-echo",
    "spate-sink",
    "spate-flood",
    "spate-iperf",
    "spate-relay",
    "spate-stat",
    "spate-dump",
    "spate-quic",
    "spate-run",
];

/// Where the C API's tests find their install (`cargo xtask test`
/// installs the debug build there first).
const C_PREFIX: &str = "target/c-api-prefix";

/// `cargo xtask install [--prefix DIR] [--debug]`: builds libspate and
/// the tools (release, or the dev profile with `--debug`) and installs
/// `lib/libspate.so` (soname `libspate.so.0`), `lib/libspate.a`,
/// `lib/libspate-preload.so`, `include/spate.h`, `lib/pkgconfig/spate.pc`
/// and the tools (`spate-run` among them) under `bin/`.
fn install(args: &[String]) -> Result {
    let mut prefix = PathBuf::from("/usr/local");
    let mut debug = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--prefix" => prefix = PathBuf::from(it.next().ok_or("--prefix needs a folder")?),
            "--debug" => debug = true,
            other => return Err(format!("install: unknown argument {other:?} (--prefix DIR, --debug)")),
        }
    }
    let prefix = if prefix.is_absolute() { prefix } else { root().join(prefix) };
    let mut build = cargo();
    build.args(["build", "-p", "spate-capi", "-p", "spate-preload", "-p", "spate-apps", "--bins", "--lib"]);
    if !debug {
        build.arg("--release");
    }
    run(&mut build)?;
    let out = root().join("target").join(if debug { "debug" } else { "release" });
    let (lib, include, pc, bin) =
        (prefix.join("lib"), prefix.join("include"), prefix.join("lib/pkgconfig"), prefix.join("bin"));
    for d in [&lib, &include, &pc, &bin] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let copy = |from: &Path, to: &Path| -> Result {
        // Replaced, not written over: a running program may map the old
        // one. A link where it can be (the debug build's files are large).
        let _ = std::fs::remove_file(to);
        if std::fs::hard_link(from, to).is_ok() {
            return Ok(());
        }
        std::fs::copy(from, to).map(|_| ()).map_err(|e| format!("{} -> {}: {e}", from.display(), to.display()))
    };
    copy(&out.join("libspate_capi.so"), &lib.join("libspate.so.0"))?;
    let link = lib.join("libspate.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("libspate.so.0", &link).map_err(|e| format!("{}: {e}", link.display()))?;
    copy(&out.join("libspate_capi.a"), &lib.join("libspate.a"))?;
    copy(&out.join("libspate_preload.so"), &lib.join("libspate-preload.so"))?;
    copy(&root().join("capi/include/spate.h"), &include.join("spate.h"))?;
    for t in TOOLS {
        copy(&out.join(t), &bin.join(t))?;
    }
    let version = env!("CARGO_PKG_VERSION");
    let pc_text = format!(
        "prefix={}\nlibdir=${{prefix}}/lib\nincludedir=${{prefix}}/include\n\n\
         Name: spate\nDescription: spate's userspace UDP/IP stack on DPDK, its C API\nVersion: {version}\n\
         Libs: -L${{libdir}} -lspate\n\
         Libs.private: -lrte_bus_vdev -lrte_net_ring -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc\n\
         Requires.private: libdpdk\nCflags: -I${{includedir}}\n",
        prefix.display()
    );
    let pc_file = pc.join("spate.pc");
    std::fs::write(&pc_file, pc_text).map_err(|e| format!("{}: {e}", pc_file.display()))?;
    eprintln!("installed libspate {version} under {}", prefix.display());
    Ok(())
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

/// spate's main job on its embedded default, shown end to end: spate-echo
/// runs in a network namespace of its own on a TAP device; the Linux side
/// of that namespace sends it datagrams and prints what comes back.
fn demo(args: &[String]) -> Result {
    setup(false)?;
    run(cargo().args(["build", "--release", "--bin", "spate-echo"]))?;
    let ns = Namespace::new()?;
    let bin = root().join("target/release/spate-echo");
    let log = std::env::temp_dir().join(format!("spate-demo-{}.log", std::process::id()));
    let out = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    eprintln!("+ ip netns exec {} {} --idle-sleep 50 --interval 1 {}", ns.0, bin.display(), args.join(" "));
    let child = Command::new("ip")
        .args(["netns", "exec", &ns.0, "timeout", "-s", "INT", "120"])
        .arg(&bin)
        .args(["--idle-sleep", "50", "--interval", "1"])
        .args(args)
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot start spate-echo: {e}"))?;
    let mut echo = Child { child, log: log.clone() };
    let started = std::time::Instant::now();
    while !echo.output().contains("UDP echo on") {
        if started.elapsed() > std::time::Duration::from_secs(30) || echo.exited() {
            return Err(format!("spate-echo did not start:\n{}", echo.output()));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    print!("{}", echo.output());
    let peer =
        ["ip addr add 198.18.0.1/24 dev spate0", "ip -6 addr add fd00::1/64 dev spate0 nodad", "ip link set spate0 up"];
    for cmd in peer {
        eprintln!("+ ip netns exec {} {cmd}", ns.0);
        ns.exec(&cmd.split(' ').collect::<Vec<_>>())?;
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let status = Command::new("ip")
        .args(["netns", "exec", &ns.0])
        .arg(me)
        .arg("demo-peer")
        .status()
        .map_err(|e| e.to_string())?;
    let shown = echo.output().len();
    echo.interrupt();
    let rest = echo.output();
    print!("{}", &rest[shown.min(rest.len())..]);
    if !status.success() {
        return Err("the Linux side did not get its datagrams back".into());
    }
    println!("demo: done; namespace {} removed", ns.0);
    Ok(())
}

/// The Linux side of the demo (run inside the demo's namespace).
fn demo_peer() -> Result {
    use std::net::UdpSocket;
    let targets = [("198.18.0.1:0", "198.18.0.2:7"), ("[fd00::1]:0", "[fd00::2]:7")];
    for (bind, to) in targets {
        let s = UdpSocket::bind(bind).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(2))).map_err(|e| e.to_string())?;
        for i in 1..=3 {
            let msg = format!("hello spate, datagram {i} from Linux");
            let t = std::time::Instant::now();
            s.send_to(msg.as_bytes(), to).map_err(|e| e.to_string())?;
            let mut buf = [0u8; 128];
            let (n, from) = s.recv_from(&mut buf).map_err(|e| format!("no answer from {to}: {e}"))?;
            let back = String::from_utf8_lossy(&buf[..n]);
            println!(
                "linux: sent {msg:?} to {to}, {from} sent back {back:?} in {:.2} ms",
                t.elapsed().as_secs_f64() * 1e3
            );
            if back != msg {
                return Err("the echo differs".into());
            }
        }
    }
    Ok(())
}

/// A network namespace for the demo, deleted on drop.
struct Namespace(String);

impl Namespace {
    fn new() -> Result<Namespace> {
        let name = format!("spate-demo-{}", std::process::id());
        run(Command::new("ip").args(["netns", "add", &name]))?;
        let ns = Namespace(name);
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    fn exec(&self, cmd: &[&str]) -> Result {
        let st = Command::new("ip").args(["netns", "exec", &self.0]).args(cmd).status().map_err(|e| e.to_string())?;
        if st.success() { Ok(()) } else { Err(format!("{cmd:?} failed")) }
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// spate-echo under `timeout`, interrupted (then killed) on drop.
struct Child {
    child: std::process::Child,
    log: PathBuf,
}

impl Child {
    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// SIGINT through `timeout`, then up to 10 s for the summary.
    fn interrupt(&mut self) {
        let _ = Command::new("kill").args(["-INT", &self.child.id().to_string()]).status();
        for _ in 0..200 {
            if self.exited() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if !self.exited() {
            self.interrupt();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

fn test(args: &[String]) -> Result {
    layer_check()?;
    setup(true)?;
    dependency_check()?;
    let before = leftover_report();
    let result = install(&["--debug".into(), "--prefix".into(), C_PREFIX.into()])
        .and_then(|()| run(cargo().args(["test", "--workspace"]).args(args)))
        .and_then(|()| loom())
        .and_then(|()| inline_check())
        .and_then(|()| perf_guard(false))
        .and_then(|()| fuzz(&["--secs".to_string(), FUZZ_CI_SECS.to_string()]))
        .and_then(|()| container_smoke());
    let after = leftover_report();
    let new: Vec<&String> = after.iter().filter(|l| !before.contains(l)).collect();
    result?;
    if !new.is_empty() {
        return Err(format!(
            "the tests left behind:\n  {}",
            new.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n  ")
        ));
    }
    eprintln!("no process, socket, DPDK folder or namespace left behind");
    Ok(())
}

/// stack/src against stack/layers.toml (see `layers`), then the negative
/// controls: the same tree with an upward import, a circle of modules and
/// a circle of files (through `super::`) planted must fail, so the check
/// is known to be able to.
fn layer_check() -> Result {
    let table_path = root().join("stack/layers.toml");
    let table = std::fs::read_to_string(&table_path).map_err(|e| format!("{}: {e}", table_path.display()))?;
    let table = layers::parse_table(&table).map_err(|e| format!("{}: {e}", table_path.display()))?;
    let tree = layers::read_tree(&root().join("stack/src"))?;
    let problems = layers::check(&table, &tree);
    if !problems.is_empty() {
        return Err(format!("layer check: stack/src breaks stack/layers.toml:\n  {}", problems.join("\n  ")));
    }
    eprintln!("layer check: {} files of stack/src import only down their layers, in no circle", tree.len());
    let plant = |file: &str, line: &str| -> Result<Vec<String>> {
        let mut t = tree.clone();
        let text = t.get_mut(file).ok_or_else(|| format!("layer check: negative control: no {file}"))?;
        text.push_str(line);
        Ok(layers::check(&table, &t))
    };
    let up = plant("wire/mod.rs", "\nuse crate::setup::Running;\n")?;
    if !up.iter().any(|p| p.contains("a layer above")) {
        return Err(format!("layer check: the negative control (wire importing setup) was not caught: {up:?}"));
    }
    let mut t = tree.clone();
    for (file, to) in [("iface.rs", "hdr"), ("hdr.rs", "iface")] {
        t.get_mut(file)
            .ok_or_else(|| format!("layer check: negative control: no {file}"))?
            .push_str(&format!("\n#[allow(unused_imports)]\nuse crate::{to} as _planted;\n"));
    }
    let circle = layers::check(&table, &t);
    if !circle.iter().any(|p| p.starts_with("circle: hdr -> iface -> hdr")) {
        return Err(format!(
            "layer check: the negative control (hdr and iface importing each other) was not caught: {circle:?}"
        ));
    }
    let mut t = tree.clone();
    t.get_mut("engine/gro.rs")
        .ok_or("layer check: negative control: no engine/gro.rs")?
        .push_str("\n#[allow(unused_imports)]\nuse super::rx as _planted;\n");
    let files = layers::check(&table, &t);
    if !files.iter().any(|p| p.starts_with("circle: engine/gro.rs -> engine/rx.rs -> engine/gro.rs")) {
        return Err(format!(
            "layer check: the negative control (engine/gro.rs importing engine/rx.rs through super::) was not caught: {files:?}"
        ));
    }
    eprintln!("layer check: negative controls caught (an upward import, a circle of modules, a circle of files)");
    Ok(())
}

/// What the programs need and the library must not bring along.
const APP_ONLY: &[&str] = &["clap", "mimalloc", "env_logger"];

/// `cargo tree -p spate -e normal` lists none of [`APP_ONLY`]: depending on
/// spate brings the stack and the DPDK layer alone. The negative control:
/// the same listing for spate-apps must show all of them.
fn dependency_check() -> Result {
    let tree = |pkg: &str| -> Result<Vec<String>> {
        let out = cargo()
            .args(["tree", "-p", pkg, "-e", "normal", "--prefix", "none", "--format", "{p}"])
            .output()
            .map_err(|e| format!("cargo tree: {e}"))?;
        if !out.status.success() {
            return Err(format!("cargo tree -p {pkg} failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.split(' ').next()).map(String::from).collect())
    };
    let lib = tree("spate")?;
    let leaked: Vec<&&str> = APP_ONLY.iter().filter(|d| lib.iter().any(|l| l == *d)).collect();
    if !leaked.is_empty() {
        return Err(format!("dependency check: cargo tree -p spate -e normal lists {leaked:?}"));
    }
    let apps = tree("spate-apps")?;
    if let Some(missing) = APP_ONLY.iter().find(|d| !apps.iter().any(|l| l == *d)) {
        return Err(format!(
            "dependency check: the negative control (spate-apps) does not list {missing}, so the check cannot fail"
        ));
    }
    eprintln!(
        "dependency check: spate depends on none of {APP_ONLY:?} ({} lines of cargo tree); spate-apps on all",
        lib.len()
    );
    Ok(())
}

/// spate's own instructions per datagram (the pipeline benchmark's
/// `--guard` paths, under callgrind) against `perf-budget.toml`: more than
/// [`perf::TOLERANCE`] over a budget fails. `--update` writes what was
/// measured as the new budgets (after a compiler or DPDK change, or when
/// the work brings a path below its budget).
fn perf_guard(update: bool) -> Result {
    if !installed("valgrind") {
        return Err("perf-guard needs valgrind: cargo xtask setup --tests".into());
    }
    let out = cargo()
        .args(["bench", "--bench", "pipeline", "--", "--guard"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cargo bench: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{}", text.lines().filter(|l| !l.starts_with("perf-guard ")).map(|l| format!("{l}\n")).collect::<String>());
    if !out.status.success() {
        return Err(format!("the pipeline benchmark failed: {}", out.status));
    }
    let measured = perf::parse_measured(&text)?;
    let path = root().join("perf-budget.toml");
    let budget_text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    if update {
        std::fs::write(&path, perf::rewrite(&budget_text, &measured)?).map_err(|e| e.to_string())?;
        eprintln!("perf-guard: {} updated to what was measured", path.display());
        return Ok(());
    }
    let budgets = perf::parse_budgets(&budget_text)?;
    let report = perf::judge(&budgets, &measured)?;
    for line in &report.lines {
        eprintln!("perf-guard: {line}");
    }
    // The negative control: 5% less than measured must fail, so the
    // comparison is known to be able to.
    let tight: Vec<(String, f64)> = measured.iter().map(|(k, v)| (k.clone(), v / 1.05)).collect();
    if perf::judge(&tight, &measured)?.over.is_empty() {
        return Err("perf-guard: the negative control (budgets 5% under the measurement) passed".into());
    }
    if !report.over.is_empty() {
        return Err(format!(
            "perf-guard: over budget by more than {:.0}%: {} (see docs/performance.md, the guard)",
            perf::TOLERANCE * 100.0,
            report.over.join(", ")
        ));
    }
    Ok(())
}

/// The receive queue's and the sleep hand-off's loom models: the production code built with
/// `--cfg loom`, in a target directory of its own so the normal build is
/// not invalidated.
fn loom() -> Result {
    run(cargo().env("RUSTFLAGS", "--cfg loom").env("CARGO_TARGET_DIR", root().join("target/loom")).args([
        "test",
        "-p",
        "spate-stack",
        "--test",
        "loom_rx_queue",
        "--test",
        "loom_doorbell",
        "--features",
        "internals",
        "--release",
    ]))
}

/// The soak: `tests/stack_hostile.rs`'s traffic for `--minutes` M (30 by
/// default), process memory and mbufs in use sampled every second into
/// `target/soak/soak.csv` and `target/soak/soak.png`; fails when either
/// grows (see the test).
fn soak(args: &[String]) -> Result {
    let minutes = match args {
        [] => "30".to_string(),
        [flag, m] if flag == "--minutes" && m.parse::<f64>().is_ok_and(|v| v > 0.0) => m.clone(),
        _ => return Err("usage: cargo xtask soak [--minutes M]".into()),
    };
    setup(true)?;
    run(cargo().env("SPATE_SOAK_MINUTES", &minutes).args([
        "test",
        "--release",
        "-p",
        "spate-apps",
        "--test",
        "stack_hostile",
        "--",
        "--ignored",
        "--exact",
        "soak",
        "--nocapture",
    ]))
}

/// Seconds `cargo xtask test` fuzzes each target for.
const FUZZ_CI_SECS: u32 = 10;

/// Every cargo-fuzz target under `fuzz/` (or those named) for `--secs` N
/// seconds each (60 by default), starting from the corpus kept in
/// `fuzz/corpus/<target>` (read, never written: what a run finds goes to
/// `target/fuzz/corpus/<target>`, a crash's input to
/// `target/fuzz/artifacts/<target>`). Installs cargo-fuzz when it is
/// missing; builds on the stable compiler (`RUSTC_BOOTSTRAP=1` lets
/// libFuzzer's instrumentation flags through), without a sanitizer.
fn fuzz(args: &[String]) -> Result {
    let mut secs = 60u32;
    let mut named = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--secs" => {
                secs = it.next().and_then(|v| v.parse().ok()).ok_or("--secs needs a number of seconds")?;
            }
            t => named.push(t.to_string()),
        }
    }
    let has_fuzz = cargo().args(["fuzz", "--version"]).output().map(|o| o.status.success()).unwrap_or(false);
    if !has_fuzz {
        run(cargo().args(["install", "cargo-fuzz", "--locked"]))?;
    }
    let dir = root().join("fuzz");
    let list =
        cargo().current_dir(&dir).args(["fuzz", "list"]).output().map_err(|e| format!("cargo fuzz list: {e}"))?;
    let all: Vec<String> = String::from_utf8_lossy(&list.stdout).lines().map(str::trim).map(String::from).collect();
    if all.is_empty() {
        return Err(format!("cargo fuzz list found no target: {}", String::from_utf8_lossy(&list.stderr)));
    }
    let targets = if named.is_empty() { all.clone() } else { named };
    for t in &targets {
        if !all.contains(t) {
            return Err(format!("no fuzz target {t} (there are: {})", all.join(", ")));
        }
        let seeds = dir.join("corpus").join(t);
        if !seeds.is_dir() {
            return Err(format!("fuzz target {t} has no corpus in {}", seeds.display()));
        }
        let work = root().join("target/fuzz/corpus").join(t);
        let artifacts = root().join("target/fuzz/artifacts").join(t);
        for d in [&work, &artifacts] {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        let start = std::time::Instant::now();
        run(cargo()
            .current_dir(&dir)
            .env("RUSTC_BOOTSTRAP", "1")
            .env("CARGO_TARGET_DIR", root().join("target/fuzz/build"))
            .args(["fuzz", "run", "--sanitizer", "none", t])
            .arg(&work)
            .arg(&seeds)
            .arg("--")
            .arg(format!("-max_total_time={secs}"))
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .arg("-print_final_stats=1"))?;
        eprintln!("fuzz {t}: {secs} s, no crash ({:.0} s with the build)", start.elapsed().as_secs_f64());
    }
    Ok(())
}

/// Every benchmark (or those named), each printing its table.
fn bench(args: &[String]) -> Result {
    setup(true)?;
    if !installed("valgrind") {
        run(Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-q", "valgrind"]))?;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let named: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let all = [
        ("dpdk_forward", vec![]),
        ("stack_rx", vec![]),
        ("pipeline", vec!["--callgrind"]),
        ("pipeline", vec!["--gro-table"]),
        ("pipeline", vec!["--frag-table"]),
        ("pipeline", vec!["--scale-table"]),
        ("ip_id", vec![]),
        ("lookup", vec!["--callgrind"]),
        ("rx_queue", vec![]),
        ("group_copy", vec![]),
        ("echo", vec![]),
        ("latency", vec![]),
        ("pps", vec![]),
        ("async_sockets", vec![]),
        ("quic", vec![]),
        ("af_xdp", vec![]),
        ("c_sink", vec![]),
        ("preload", vec![]),
    ];
    for (name, extra) in all {
        if !named.is_empty() && !named.iter().any(|n| *n == name) {
            continue;
        }
        if name == "c_sink" || name == "preload" {
            // Its C sink is built against a release install of libspate.
            install(&["--prefix".into(), "target/c-api-release".into()])?;
        }
        let mut cmd = cargo();
        cmd.args(["bench", "--bench", name, "--"]).args(&extra);
        if quick && !extra.contains(&"--callgrind") {
            cmd.arg("--quick");
        }
        run(&mut cmd)?;
    }
    Ok(())
}

/// The container image built with podman from the host's release binaries
/// and smoke-run with and without hugepages (docker/smoke.sh).
fn container_smoke() -> Result {
    run(cargo().args(["build", "--release", "--bins"]))?;
    run(Command::new("bash").arg(root().join("docker/smoke.sh")).current_dir(root()))
}

/// Whether the release build of spate-echo holds a standalone
/// `compute_score`: it must not (Linux lost 7-12% when the compiler stopped
/// inlining its twin, seed 000). The negative control builds it with
/// `compute_score` marked `#[inline(never)]` first and requires the check
/// to find the symbol then, so the check is known to be able to fail.
fn inline_check() -> Result {
    let bin = root().join("target/release/spate-echo");
    let has_symbol = |bin: &Path| -> Result<bool> {
        let out = Command::new("nm").arg("-C").arg(bin).output().map_err(|e| format!("nm: {e}"))?;
        if !out.status.success() {
            return Err(format!("nm {} failed", bin.display()));
        }
        Ok(String::from_utf8_lossy(&out.stdout).lines().any(|l| l.contains("compute_score")))
    };
    run(cargo().args(["build", "--release", "--bin", "spate-echo", "--features", "no-inline-score"]))?;
    if !has_symbol(&bin)? {
        return Err("inline check: the negative control (compute_score marked #[inline(never)]) shows no symbol, so the check cannot fail".into());
    }
    eprintln!("inline check: negative control found a standalone compute_score, as it must");
    run(cargo().args(["build", "--release", "--bin", "spate-echo"]))?;
    if has_symbol(&bin)? {
        return Err(
            "inline check: the release spate-echo has a standalone compute_score: it is no longer inlined".into()
        );
    }
    eprintln!("inline check: compute_score is inlined everywhere in the release spate-echo");
    Ok(())
}

fn leftovers() -> Result {
    let found = leftover_report();
    if found.is_empty() {
        eprintln!("nothing left behind");
        Ok(())
    } else {
        Err(format!("left behind:\n  {}", found.join("\n  ")))
    }
}

/// DPDK processes, runtime folders, sockets and namespaces that spate's
/// tests create, as one line each.
fn leftover_report() -> Vec<String> {
    let mut found = Vec::new();
    if let Ok(out) = Command::new("pgrep")
        .args(["-a", "-f", "dpdk-testpmd|spate-echo|spate-sink|spate-flood|spate-iperf|spate-quic|spate-stat"])
        .output()
    {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if !line.contains("pgrep") {
                found.push(format!("process: {line}"));
            }
        }
    }
    if let Ok(out) = Command::new("podman").args(["ps", "-a", "--format", "{{.Names}}"]).output() {
        for name in String::from_utf8_lossy(&out.stdout).lines().filter(|n| n.starts_with("spate-smoke")) {
            found.push(format!("container: {name}"));
        }
    }
    for dir in ["/var/run/dpdk", "/tmp"] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("spate-") && (dir == "/var/run/dpdk" || name.ends_with(".sock")) {
                    found.push(format!("file: {dir}/{name}"));
                }
            }
        }
    }
    // Control endpoints nobody serves: a stack that was never dropped (a
    // process that exited around it) or a killed one.
    if let Ok(entries) = std::fs::read_dir("/run/spate") {
        for e in entries.flatten() {
            let served = std::os::unix::net::UnixStream::connect(e.path()).is_ok();
            if !served {
                found.push(format!("file: {}", e.path().display()));
            }
        }
    }
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if line.starts_with("spate") {
                found.push(format!("namespace: {line}"));
            }
        }
    }
    found
}

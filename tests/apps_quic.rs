//! `spate-quic` against QUIC peers on the Linux kernel's sockets in a peer
//! namespace: quinn (spate-quic `--kernel`: the same quinn on a kernel
//! UDP socket) and aioquic (PyPI), an independent implementation whose
//! own HTTP/0.9 (`H0Connection`) speaks `hq-interop`.
//!
//! - spate-quic's server on spate: 1,000 streams echoed byte-exact to
//!   quinn, 100 MB fetched intact by quinn over IPv6, files fetched by
//!   aioquic (a missing one and one outside the root refused with 404);
//! - spate-quic's client on spate: 1,000 streams echoed byte-exact by
//!   quinn (with quinn's drivers on the lcore, the default, and on the
//!   QUIC thread, `--drivers thread`), 100 MB fetched intact from it,
//!   files fetched from aioquic's server, a missing one reported as a
//!   failure.
//!
//! Certificates are rcgen's, checked by every client.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use spate_testkit::{AIOQUIC_PYTHON, Netns, Proc, SpateApp, counter, device_lock, parse_counters, spate_and_kernel};

const QUIC: &str = env!("CARGO_BIN_EXE_spate-quic");
const HQ: &str = include_str!("peers/hq.py");
const BIG: usize = 100_000_000;
const ECHO_STREAMS: u64 = 1000;
const ECHO_BYTES: u64 = 16 << 10;

/// A folder of the test's, removed on drop: the served root, certificates
/// and what the clients saved.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Scratch {
    /// `root/` with `hello.txt`, `sub/nested.txt`, `one.bin` (1 MB) and
    /// `big.bin` (100 MB) of pseudo-random bytes; `secret` beside it; a
    /// certificate and key for each side's addresses.
    fn new() -> Scratch {
        let dir = PathBuf::from(format!("/tmp/{}", spate_testkit::unique("spate-quic-")));
        let s = Scratch(dir);
        std::fs::create_dir_all(s.path("root/sub")).unwrap();
        std::fs::write(s.path("root/hello.txt"), b"hello from spate-quic's root\n").unwrap();
        std::fs::write(s.path("root/sub/nested.txt"), b"a file one folder down\n").unwrap();
        std::fs::write(s.path("secret"), b"outside the root\n").unwrap();
        std::fs::write(s.path("root/one.bin"), noise(1_000_000, 1)).unwrap();
        std::fs::write(s.path("root/big.bin"), noise(BIG, 2)).unwrap();
        for (name, addrs) in [("spate", ["198.18.0.2", "fd00::2"]), ("peer", ["198.18.0.1", "fd00::1"])] {
            let c = rcgen::generate_simple_self_signed(addrs.map(String::from).to_vec()).unwrap();
            std::fs::write(s.path(&format!("{name}.pem")), c.cert.pem()).unwrap();
            std::fs::write(s.path(&format!("{name}.key")), c.key_pair.serialize_pem()).unwrap();
        }
        s
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }

    fn arg(&self, rel: &str) -> String {
        self.path(rel).display().to_string()
    }
}

/// `len` bytes of xorshift64 from `seed`.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Whether two files hold the same bytes (read in chunks).
fn same_file(a: &Path, b: &Path) -> bool {
    let (Ok(mut fa), Ok(mut fb)) = (std::fs::File::open(a), std::fs::File::open(b)) else { return false };
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let (na, nb) = (read_full(&mut fa, &mut ba), read_full(&mut fb, &mut bb));
        if na != nb || ba[..na] != bb[..nb] {
            return false;
        }
        if na == 0 {
            return true;
        }
    }
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    n
}

/// spate's stack flags on `vA` of the standard link.
fn on_spate<S: AsRef<str>>(args: &[S]) -> Vec<String> {
    let stack = ["--vdev", "net_af_packet0,iface=vA", "--ip", "198.18.0.2/24", "--ip6", "fd00::2/64"];
    let stack = stack.iter().chain(&["--lcores", "0", "--mbufs", "32767"]).map(|s| s.to_string());
    args.iter().map(|s| s.as_ref().to_string()).chain(stack).collect()
}

/// Runs `program args` in `ns` to its end (at most 120 s); its exit
/// success and output.
fn run_in(ns: &Netns, label: &str, program: &str, args: &[String]) -> (bool, String) {
    let mut p: Proc = ns.spawn(label, program, args, Duration::from_secs(120)).unwrap();
    assert!(p.wait_exit(Duration::from_secs(125)), "{label} did not end: {}", p.output());
    let ok = p.stop().is_some_and(|s| s.success());
    (ok, p.output())
}

/// The JSON line spate-quic's client printed with `--json`.
fn result(out: &str) -> serde_json::Value {
    out.lines()
        .find_map(|l| l.starts_with("{\"alpn\"").then(|| serde_json::from_str(l).unwrap()))
        .unwrap_or_else(|| panic!("no result line in:\n{out}"))
}

/// An echo client's checks: every stream came back byte-exact.
fn assert_echoed(ok: bool, out: &str) {
    let r = result(out);
    assert!(ok && r["ok"] == true, "{out}");
    assert_eq!(r["streams"], ECHO_STREAMS, "{out}");
    assert_eq!(r["bytes_received"], ECHO_STREAMS * ECHO_BYTES, "{out}");
}

fn echo_args(ca: &str, url: &str) -> Vec<String> {
    let n = ECHO_STREAMS.to_string();
    let b = ECHO_BYTES.to_string();
    ["--ca", ca, "--alpn", "echo", "--streams", &n, "--bytes", &b, "--json", url].map(String::from).to_vec()
}

/// aioquic's JSON lines: each path's byte count or error.
fn aioquic_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines().filter(|l| l.starts_with("{\"path\"")).map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn spate_quic_serves_quinn_and_aioquic_on_the_kernel() {
    let _serial = device_lock();
    let s = Scratch::new();
    let (spate_ns, kernel) = spate_and_kernel("quicsrv");
    let mut server_args = vec!["server".to_string()];
    server_args.extend(on_spate::<&str>(&[]));
    server_args.extend(
        ["--root", &s.arg("root"), "--cert", &s.arg("spate.pem"), "--key", &s.arg("spate.key")].map(String::from),
    );
    let server = SpateApp::start(&spate_ns, QUIC, &server_args, "QUIC server on");

    // quinn on the kernel's socket: 1,000 streams echoed over IPv4.
    let mut args = vec!["client".to_string(), "--kernel".into()];
    args.extend(echo_args(&s.arg("spate.pem"), "https://198.18.0.2:4433/"));
    let (ok, out) = run_in(&kernel, "quinn-echo", QUIC, &args);
    assert_echoed(ok, &out);

    // quinn fetches 100 MB and a nested file over IPv6.
    let saved = s.path("quinn");
    let mut args = vec!["client".to_string(), "--kernel".into(), "--ca".into(), s.arg("spate.pem")];
    args.extend(["--output".into(), saved.display().to_string(), "--json".into()]);
    args.extend(["https://[fd00::2]:4433/big.bin".into(), "https://[fd00::2]:4433/sub/nested.txt".into()]);
    let (ok, out) = run_in(&kernel, "quinn-fetch", QUIC, &args);
    let r = result(&out);
    assert!(ok && r["ok"] == true && r["streams"] == 2, "{out}");
    assert!(same_file(&saved.join("big.bin"), &s.path("root/big.bin")), "100 MB came back different");
    assert!(same_file(&saved.join("nested.txt"), &s.path("root/sub/nested.txt")));

    // aioquic: three files, one missing, one outside the root.
    let saved = s.path("aioquic");
    std::fs::create_dir_all(&saved).unwrap();
    let paths = ["/hello.txt", "/one.bin", "/sub/nested.txt", "/missing.txt", "/../secret"];
    let mut args = vec!["-c".into(), HQ.into(), "get".into(), "198.18.0.2".into(), "4433".into()];
    args.extend([saved.display().to_string(), s.arg("spate.pem")]);
    args.extend(paths.map(String::from));
    let (ok, out) = run_in(&kernel, "aioquic-get", AIOQUIC_PYTHON, &args);
    assert!(ok && out.contains("{\"done\": 5}"), "aioquic: {out}");
    let lines = aioquic_lines(&out);
    for (l, p) in lines.iter().zip(&paths[..3]) {
        assert_eq!(l["path"], *p, "{out}");
        let name = Path::new(p).file_name().unwrap().to_str().unwrap();
        let served = s.path(&format!("root{p}"));
        assert_eq!(l["bytes"], std::fs::metadata(&served).unwrap().len(), "{out}");
        assert!(same_file(&saved.join(name), &served), "{p} came back different");
    }
    for l in &lines[3..] {
        assert_eq!(l["error"], "reset with code 404", "{out}");
    }
    assert!(!saved.join("secret").exists());

    let (c, out) = server.stop();
    println!("{out}");
    assert_eq!(counter(&c, "Quic.Connections"), 3, "{out}");
    assert_eq!(counter(&c, "Quic.EchoStreams"), ECHO_STREAMS, "{out}");
    assert_eq!(counter(&c, "Quic.HqStreams"), 5, "{out}");
    assert_eq!(counter(&c, "Quic.Refused"), 2, "{out}");
    assert_eq!(counter(&c, "Quic.StreamErrors") + counter(&c, "Quic.HandshakeFailures"), 0, "{out}");
    assert!(counter(&c, "Quic.BytesOut") > (BIG as u64) + ECHO_STREAMS * ECHO_BYTES, "{out}");
    // 100 MB went out in GSO sends; the echoed streams came in coalesced.
    assert!(counter(&c, "Gso.Sends") > 0 && counter(&c, "Gso.Segments") > counter(&c, "Gso.Sends"), "{out}");
    assert!(counter(&c, "Gro.Coalesced") > 0, "{out}");
    assert!(counter(&c, "QuinnSocket.RecvEct0") > 0, "quinn and aioquic mark ECT(0)? {out}");
    assert_eq!(counter(&c, "Mempool.InUse"), 0, "{out}");
}

#[test]
fn spate_quic_fetches_from_quinn_and_aioquic_on_the_kernel() {
    let _serial = device_lock();
    let s = Scratch::new();
    let (spate_ns, kernel) = spate_and_kernel("quiccli");
    let args: Vec<String> = ["server", "--kernel", "--root", &s.arg("root"), "--cert", &s.arg("peer.pem")]
        .into_iter()
        .map(String::from)
        .chain(["--key".into(), s.arg("peer.key")])
        .collect();
    let quinn = SpateApp::start(&kernel, QUIC, &args, "QUIC server on");
    let args = ["-c", HQ, "serve", "::", "4434", &s.arg("root"), &s.arg("peer.pem"), &s.arg("peer.key"), "120"];
    let mut aioquic =
        kernel.spawn("aioquic-serve", AIOQUIC_PYTHON, &args.map(String::from), Duration::from_secs(130)).unwrap();
    assert!(aioquic.wait_for_output("\"ready\"", Duration::from_secs(20)), "aioquic: {}", aioquic.output());

    // spate's client echoes 1,000 streams through quinn on the kernel.
    let mut args = vec!["client".to_string()];
    args.extend(on_spate(&echo_args(&s.arg("peer.pem"), "https://198.18.0.1:4433/")));
    let (ok, out) = run_in(&spate_ns, "spate-echo-client", QUIC, &args);
    assert_echoed(ok, &out);
    assert_eq!(counter(&parse_counters(&out), "Mempool.InUse"), 0, "{out}");
    // The same with quinn's drivers on the QUIC thread instead of the lcore.
    let mut args = vec!["client".to_string(), "--drivers".into(), "thread".into()];
    args.extend(on_spate(&echo_args(&s.arg("peer.pem"), "https://198.18.0.1:4433/")));
    let (ok, out) = run_in(&spate_ns, "spate-echo-client-thread", QUIC, &args);
    assert_echoed(ok, &out);
    assert_eq!(counter(&parse_counters(&out), "Mempool.InUse"), 0, "{out}");

    // 100 MB from quinn over IPv6, received coalesced.
    let saved = s.path("from-quinn");
    let mut args = vec!["client".to_string()];
    let urls = ["https://[fd00::1]:4433/big.bin", "https://[fd00::1]:4433/sub/nested.txt"];
    let flags = ["--ca", &s.arg("peer.pem"), "--output", &saved.display().to_string(), "--json"].map(String::from);
    args.extend(on_spate(&flags.iter().map(String::as_str).chain(urls).collect::<Vec<_>>()));
    let (ok, out) = run_in(&spate_ns, "spate-fetch-quinn", QUIC, &args);
    assert!(ok && result(&out)["streams"] == 2, "{out}");
    assert!(same_file(&saved.join("big.bin"), &s.path("root/big.bin")), "100 MB came back different");
    assert!(same_file(&saved.join("nested.txt"), &s.path("root/sub/nested.txt")));
    let c = parse_counters(&out);
    assert!(counter(&c, "Gro.Coalesced") > 0 && counter(&c, "QuinnSocket.RecvEct0") > 0, "{out}");
    assert_eq!(counter(&c, "Mempool.InUse"), 0, "{out}");

    // aioquic's server: two files, each fetched twice; the copies agree.
    let saved = s.path("from-aioquic");
    let mut args = vec!["client".to_string()];
    let urls = ["https://198.18.0.1:4434/one.bin", "https://198.18.0.1:4434/hello.txt"];
    let flags =
        ["--ca", &s.arg("peer.pem"), "--output", &saved.display().to_string(), "--streams", "2"].map(String::from);
    args.extend(on_spate(&flags.iter().map(String::as_str).chain(urls).collect::<Vec<_>>()));
    let (ok, out) = run_in(&spate_ns, "spate-fetch-aioquic", QUIC, &args);
    assert!(ok && out.contains("4 stream(s) fetched, all checked"), "{out}");
    for f in ["one.bin", "hello.txt"] {
        assert!(same_file(&saved.join(f), &s.path(&format!("root/{f}"))), "{f} came back different");
    }
    // A missing file is the client's failure, said.
    let mut args = vec!["client".to_string()];
    args.extend(on_spate(&["--ca", &s.arg("peer.pem"), "https://198.18.0.1:4434/missing.txt"]));
    let (ok, out) = run_in(&spate_ns, "spate-fetch-missing", QUIC, &args);
    assert!(!ok && out.contains("GET /missing.txt: stream reset by peer: error 404"), "{out}");

    drop(aioquic);
    let (c, out) = quinn.stop();
    assert_eq!(counter(&c, "Quic.Connections"), 3, "{out}");
    assert_eq!(counter(&c, "Quic.EchoStreams"), 2 * ECHO_STREAMS, "{out}");
    assert_eq!(counter(&c, "Quic.HqStreams"), 2, "{out}");
}

//! spate's C API as a C program uses it: tests/c/capi_peer.c and
//! tests/c/header_check.cpp built with gcc and g++ from an install
//! (`cargo xtask install --debug --prefix target/c-api-prefix`, which
//! `cargo xtask test` runs first) through `pkg-config spate`, run in a
//! network namespace over net_tap with the kernel as the peer: an epoll
//! event loop echoing with recvmmsg/sendmmsg over IPv4 and IPv6 (fragments
//! too), control messages both ways, signals during blocking calls,
//! threads blocked when the stack stops, the errno of bad arguments (also
//! under AddressSanitizer and UBSan), and the header from C++.

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use spate_testkit::c_build::install_prefix;
use spate_testkit::{Netns, Proc, device_lock, echo_every_size, kernel_peer};

/// Builds `source` with `compiler` and `flags` against the install; the
/// binary's path.
fn build(compiler: &str, source: &str, out: &str, flags: &[&str]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("spate-capi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/c").join(source);
    build_in(&dir, compiler, &src, out, flags)
}

/// Builds `src` into `dir/out` (see [`build`]).
fn build_in(dir: &Path, compiler: &str, src: &Path, out: &str, flags: &[&str]) -> PathBuf {
    let mut all = vec!["-Wall", "-Wextra", "-Werror", "-g", "-O1"];
    all.extend(flags);
    spate_testkit::c_build::build_against(&install_prefix(), compiler, src, &dir.join(out), &all, &["-lpthread"])
}

/// The test program, built once per test process (plain, or with the
/// sanitizers' `flags`): the tests run side by side.
fn capi_peer(flags: &[&str]) -> PathBuf {
    static PLAIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    static SANITIZED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    match flags.is_empty() {
        true => PLAIN.get_or_init(|| build("/usr/bin/gcc", "capi_peer.c", "capi_peer", flags)),
        false => SANITIZED.get_or_init(|| build("/usr/bin/gcc", "capi_peer.c", "capi_peer_san", flags)),
    }
    .clone()
}

/// Runs `bin MODE` in a new namespace on the default TAP device (spate
/// 198.18.0.2 and fd00::2, the kernel .1 and ::1), waits for READY.
fn start(bin: &Path, mode: &str, ns: &Netns) -> Proc {
    let args: Vec<String> = [mode, "--lcores", "1", "--mbufs", "4095"].iter().map(|s| s.to_string()).collect();
    let mut p = ns.spawn(&format!("capi-{mode}"), bin.to_str().unwrap(), &args, Duration::from_secs(120)).unwrap();
    assert!(p.wait_for_output("READY", Duration::from_secs(60)), "{mode} did not start:\n{}", p.output());
    p
}

/// Waits for the program to end and returns its output, which must say
/// `failures 0`; the exit status must be 0, and its stack's control
/// endpoint gone with it.
fn finish(mut p: Proc, limit: Duration) -> String {
    assert!(p.wait_exit(limit), "it did not end:\n{}", p.output());
    let out = p.output();
    assert!(out.contains("failures 0"), "{out}");
    let status = p.stop();
    assert!(status.is_some_and(|s| s.success()), "exit {status:?}:\n{out}");
    let pid = out.lines().find_map(|l| l.strip_prefix("pid ")).unwrap_or_else(|| panic!("no pid line:\n{out}"));
    let endpoint = format!("/run/spate/{pid}-1.sock");
    assert!(!Path::new(&endpoint).exists(), "{endpoint} outlived the program:\n{out}");
    out
}

fn kernel_side(ns: &Netns) {
    kernel_peer(ns, "spate0");
}

#[test]
fn an_epoll_event_loop_echoes_with_recvmmsg_and_sendmmsg() {
    let _serial = device_lock();
    let bin = capi_peer(&[]);
    let ns = Netns::new("capiecho");
    let p = start(&bin, "echo", &ns);
    kernel_side(&ns);
    let echoed = echo_every_size(&ns, &[("198.18.0.1:0", "198.18.0.2:7"), ("[fd00::1]:0", "[fd00::2]:7")]);
    assert_eq!(echoed, 2 * 209);
    // SIGTERM's handler writes the self-pipe, which ends the loop.
    let mut p = p;
    let status = p.stop_with(libc::SIGTERM, Duration::from_secs(20));
    let out = p.output();
    assert!(status.is_some_and(|s| s.success()) && out.contains("failures 0"), "exit {status:?}:\n{out}");
    let line = out.lines().find(|l| l.starts_with("echoed")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.starts_with("echoed v4 209 v6 209"), "{line}");
    let second: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(second > 0, "the socket was readable in a second epoll set too: {line}");
}

#[test]
fn a_program_that_exits_without_spate_fini_leaves_no_control_endpoint() {
    let _serial = device_lock();
    let bin = capi_peer(&[]);
    let ns = Netns::new("capiexit");
    let p = start(&bin, "exit", &ns);
    let out = finish(p, Duration::from_secs(20));
    assert!(out.contains("READY"), "{out}");
}

#[test]
fn the_zero_copy_calls_echo_and_send_in_place() {
    let _serial = device_lock();
    let bin = capi_peer(&[]);
    let ns = Netns::new("capizc");
    let p = start(&bin, "zerocopy", &ns);
    kernel_side(&ns);
    let echoed = ns.run(|| {
        let s = UdpSocket::bind("198.18.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let target: SocketAddr = "198.18.0.2:7".parse().unwrap();
        let mut buf = vec![0u8; 65536];
        let mut n_echoed = 0;
        for (i, len) in [1usize, 64, 1472, 3000, 20000].into_iter().enumerate() {
            let payload: Vec<u8> = (0..len).map(|j| (i * 13 + j * 5) as u8).collect();
            s.send_to(&payload, target).unwrap();
            let (n, _) = s.recv_from(&mut buf).unwrap_or_else(|e| panic!("{len} bytes: {e}"));
            let mut want = payload.clone();
            // Contiguous ones come back with the first byte flipped in place.
            if len <= 1472 {
                want[0] = !want[0];
            }
            assert_eq!(&buf[..n], &want[..], "{len} bytes");
            n_echoed += 1;
        }
        s.send_to(b"gen", target).unwrap();
        for k in 0..3u8 {
            let (n, _) = s.recv_from(&mut buf).expect("a datagram from a send buffer");
            assert_eq!(&buf[..n], &vec![b'a' + k; 10 * (k as usize + 1)][..]);
        }
        s.send_to(b"quit", target).unwrap();
        n_echoed
    });
    assert_eq!(echoed, 5);
    let out = finish(p, Duration::from_secs(20));
    assert!(out.contains("zero-copy echoed 5"), "{out}");
}

#[test]
fn control_messages_in_and_out() {
    let _serial = device_lock();
    let bin = capi_peer(&[]);
    let ns = Netns::new("capicmsg");
    let p = start(&bin, "cmsg", &ns);
    kernel_side(&ns);
    // The kernel peer: three datagrams per family with chosen TOS/TTL, the
    // reply's segments read with their ECN.
    let script = r#"
import socket, struct
out = []
for fam, src, dst, tos_opt, ttl_opt, lvl in [
        (socket.AF_INET, "198.18.0.1", "198.18.0.2", socket.IP_TOS, socket.IP_TTL, socket.IPPROTO_IP),
        (socket.AF_INET6, "fd00::1", "fd00::2", socket.IPV6_TCLASS, socket.IPV6_UNICAST_HOPS, socket.IPPROTO_IPV6)]:
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.bind((src, 0))
    s.settimeout(5)
    s.setsockopt(lvl, socket.IP_RECVTOS if fam == socket.AF_INET else socket.IPV6_RECVTCLASS, 1)
    # IP_RECVTTL (12), which Python does not name; IPV6_RECVHOPLIMIT.
    s.setsockopt(lvl, 12 if fam == socket.AF_INET else socket.IPV6_RECVHOPLIMIT, 1)
    ttl_types = (socket.IP_TTL, socket.IPV6_HOPLIMIT)
    for i, (tos, ttl) in enumerate([(0x28, 17), (0xb8, 33), (0, 9)]):
        s.setsockopt(lvl, tos_opt, tos)
        s.setsockopt(lvl, ttl_opt, ttl)
        s.sendto(b"x" * (10 + i), (dst, 5000))
        if i == 0:
            for k in range(3):
                data, anc, flags, _ = s.recvmsg(4096, 256)
                ecn = [c[2][0] & 3 for c in anc if c[1] not in ttl_types]
                ttl = [struct.unpack("i", c[2])[0] for c in anc if c[1] in ttl_types]
                out.append("%s seg %d ecn %s ttl %s" % ("v4" if fam == socket.AF_INET else "v6", len(data), ecn, ttl))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for n in range(10, 14):
    s.sendto(b"y" * n, ("198.18.0.2", 5001))
for z in (b"z1", b"z2", b"z3"):
    s.sendto(z, ("198.18.0.2", 5001))
print("\n".join(out))
"#;
    let peer = ns.exec(&["python3", "-c", script]);
    let peer_out = String::from_utf8_lossy(&peer.stdout).into_owned();
    assert!(peer.status.success(), "{peer_out}{}", String::from_utf8_lossy(&peer.stderr));
    let out = finish(p, Duration::from_secs(20));
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("v4 len") || l.starts_with("v6 len")).collect();
    assert_eq!(lines.len(), 6, "{out}");
    assert!(lines[0].starts_with("v4 len=10 pktinfo=198.18.0.2,1 tos=40 ttl=17 stamp-age-ok=1"), "{}", lines[0]);
    assert!(lines[1].starts_with("v4 len=11 pktinfo=198.18.0.2,1 tos=184 ttl=33 stamp-age-ok=1"), "{}", lines[1]);
    // 20 bytes hold no whole message: cut and flagged.
    assert!(lines[2].starts_with("v4 len=12") && lines[2].ends_with("ctrunc"), "{}", lines[2]);
    assert_eq!(lines[3], "v6 len=10 pktinfo6=fd00::2,1 tclass=40 hoplimit=17");
    assert_eq!(lines[4], "v6 len=11 pktinfo6=fd00::2,1 tclass=184 hoplimit=33");
    assert!(lines[5].starts_with("v6 len=12") && lines[5].ends_with("ctrunc"), "{}", lines[5]);
    // recvmmsg of the bytes alone: lengths whole (MSG_TRUNC), cut at 11.
    let plain: Vec<&str> = out.lines().filter(|l| l.starts_with("plain ")).collect();
    assert_eq!(
        plain,
        [10, 11, 12, 13].map(|n| format!("plain len={n} trunc={} ctl=0 bytes-ok=1", (n > 11) as u8)),
        "{out}"
    );
    // Peeked into two messages: the head datagram twice, left queued.
    assert!(out.lines().any(|l| l == "peek n=2 z1 z1"), "{out}");
    // A bad second message: one datagram, the others left queued in order.
    assert!(out.lines().any(|l| l == "bad-second first=1 z1 rest=2 z2 z3"), "{out}");
    // The replies: 3000 bytes as three 1,000-byte datagrams, ECN CE (3),
    // TTL or hop limit 21.
    for fam in ["v4", "v6"] {
        let segs = peer_out.lines().filter(|l| *l == format!("{fam} seg 1000 ecn [3] ttl [21]")).count();
        assert_eq!(segs, 3, "{peer_out}");
    }
}

#[test]
fn signals_interrupt_or_restart_blocking_calls() {
    let _serial = device_lock();
    let bin = capi_peer(&[]);
    let ns = Netns::new("capisig");
    let p = start(&bin, "signals", &ns);
    kernel_side(&ns);
    // The restarted receive gets this datagram.
    ns.run(|| {
        let s = UdpSocket::bind("198.18.0.1:0").unwrap();
        s.send_to(b"hello", "198.18.0.2:5001").unwrap();
    });
    let out = finish(p, Duration::from_secs(30));
    for l in ["eintr ok", "restart ok", "timeout ok"] {
        assert!(out.contains(l), "{out}");
    }
}

#[test]
fn threads_blocked_when_the_stack_stops_get_enetdown() {
    let _serial = device_lock();
    let bin = capi_peer(&[]);
    let ns = Netns::new("capistop");
    let p = start(&bin, "stop", &ns);
    let out = finish(p, Duration::from_secs(30));
    assert!(out.contains("stopped ok"), "{out}");
    // spate_run's callback stopping the stack wakes them too. Room for
    // a full queue to the lcore (8,192 packets) in the pool.
    let args: Vec<String> = ["runstop", "--lcores", "1", "--mbufs", "16383"].map(String::from).to_vec();
    let mut p = ns.spawn("capi-runstop", bin.to_str().unwrap(), &args, Duration::from_secs(120)).unwrap();
    assert!(p.wait_for_output("READY", Duration::from_secs(60)), "{}", p.output());
    let out = finish(p, Duration::from_secs(30));
    assert!(out.contains("run stopped ok"), "{out}");
}

#[test]
fn bad_arguments_get_linux_errno_also_under_the_sanitizers() {
    let _serial = device_lock();
    for flags in [&[][..], &["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]] {
        let bin = capi_peer(flags);
        let ns = Netns::new("capierrno");
        let p = start_errno(&bin, &ns);
        let out = finish(p, Duration::from_secs(60));
        let line = out.lines().find(|l| l.starts_with("errno checks")).unwrap_or_else(|| panic!("{out}"));
        let checks: u32 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
        assert!(checks >= 45, "{line}");
        assert!(!out.contains("ERROR: AddressSanitizer") && !out.contains("runtime error"), "{out}");
    }
}

/// The errno mode prints READY only at its end: it needs no peer.
fn start_errno(bin: &Path, ns: &Netns) -> Proc {
    let args: Vec<String> = ["errno", "--lcores", "1", "--mbufs", "4095"].iter().map(|s| s.to_string()).collect();
    ns.spawn("capi-errno", bin.to_str().unwrap(), &args, Duration::from_secs(120)).unwrap()
}

#[test]
fn the_readme_c_example_builds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let start = readme.find("```c\n").expect("the README's C example") + "```c\n".len();
    let code = &readme[start..start + readme[start..].find("```").unwrap()];
    let dir = std::env::temp_dir().join(format!("spate-capi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("readme_echo.c"), code).unwrap();
    build_in(&dir, "/usr/bin/gcc", &dir.join("readme_echo.c"), "readme_echo", &[]);
}

#[test]
fn the_header_compiles_as_cpp() {
    let bin = build("/usr/bin/g++", "header_check.cpp", "header_check", &["-std=c++17"]);
    let o = Command::new(&bin).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out.starts_with("spate 0.1.0"), "{out}");
}

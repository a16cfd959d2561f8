//! Unmodified programs on spate under `spate-run` (libspate-preload),
//! from an install (`cargo xtask install --debug --prefix
//! target/c-api-prefix`, which `cargo xtask test` runs first): Debian's
//! python3, socat, netcat-openbsd and iperf 2, and tests/c/preload_peer.c
//! built with plain gcc (no spate header, no libspate), each in a network
//! namespace on `net_pcap` over a veth whose other end is the
//! kernel's (198.18.0.1 and fd00::1; spate has .2 and ::2, which the
//! kernel of the program's namespace does not, so every datagram that
//! comes back from them came through spate).

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::time::Duration;

use spate_testkit::c_build::install_prefix;
use spate_testkit::netns::EVERY_SIZE;
use spate_testkit::{Netns, Proc, device_lock, echo_every_size, echo_sizes, spate_and_kernel};

/// spate's flags for every program here: the veth end `vA` of
/// [`spate_and_kernel`] through `net_pcap` (which, unlike
/// `net_af_packet`, hands spate the kernel's fragments), one polling
/// lcore.
const FLAGS: &[&str] = &["--vdev", "net_pcap0,iface=vA,phy_mac=1", "--lcores", "1", "--mbufs", "4095"];

/// Runs `program args` under `spate-run` in `ns`.
fn spate_run(ns: &Netns, label: &str, program: &str, args: &[&str]) -> Proc {
    let run = install_prefix().join("bin/spate-run");
    let mut all: Vec<String> = FLAGS.iter().map(|s| s.to_string()).collect();
    all.push("--".into());
    all.push(program.into());
    all.extend(args.iter().map(|s| s.to_string()));
    ns.spawn(label, run.to_str().unwrap(), &all, Duration::from_secs(120)).unwrap()
}

/// Waits for `needle` in `p`'s output, failing with the output.
fn expect(p: &mut Proc, needle: &str) {
    assert!(p.wait_for_output(needle, Duration::from_secs(60)), "no {needle:?}:\n{}", p.output());
}

/// Waits for `p` to end on its own with status 0 and `failures 0`.
fn finish(mut p: Proc) -> String {
    assert!(p.wait_exit(Duration::from_secs(60)), "it did not end:\n{}", p.output());
    let out = p.output();
    let status = p.stop();
    assert!(status.is_some_and(|s| s.success()), "exit {status:?}:\n{out}");
    assert!(out.contains("failures 0"), "{out}");
    out
}

/// The test program, built once per test process with `_FORTIFY_SOURCE`
/// (so glibc's checked forms are what it calls).
fn preload_peer() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("spate-preload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/c/preload_peer.c");
        let out = dir.join("preload_peer");
        let o = std::process::Command::new("/usr/bin/gcc")
            .args(["-Wall", "-Wextra", "-Werror", "-g", "-O2", "-D_FORTIFY_SOURCE=2", "-o"])
            .arg(&out)
            .arg(&src)
            .arg("-lpthread")
            .output()
            .expect("gcc");
        assert!(o.status.success(), "gcc: {}", String::from_utf8_lossy(&o.stderr));
        out
    })
    .clone()
}

/// Writes `text` to a temporary file named `name`; its path.
fn script(name: &str, text: &str) -> String {
    let dir = std::env::temp_dir().join(format!("spate-preload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// From the kernel's namespace: `payload` to `to`, from a socket bound
/// to `from`.
fn send_from_kernel(kernel: &Netns, from: &str, to: &str, payload: &[u8]) {
    let (from, to, payload) = (from.to_string(), to.to_string(), payload.to_vec());
    kernel.run(move || {
        let s = UdpSocket::bind(from.as_str()).unwrap();
        s.send_to(&payload, to.as_str()).unwrap();
    })
}

/// Every size class both ways over IPv4 and IPv6 against an echo on
/// port 7, then "quit" to each.
fn echo_and_quit(kernel: &Netns) -> usize {
    let n = echo_every_size(kernel, &[("198.18.0.1:0", "198.18.0.2:7"), ("[fd00::1]:0", "[fd00::2]:7")]);
    send_from_kernel(kernel, "198.18.0.1:0", "198.18.0.2:7", b"quit");
    send_from_kernel(kernel, "[fd00::1]:0", "[fd00::2]:7", b"quit");
    n
}

const PY_BLOCKING: &str = r#"
import os, select, socket
def kind(s):
    link = os.readlink("/proc/self/fd/%d" % s.fileno())
    return "socket" if link.startswith("socket:") else "eventfd" if "eventfd" in link else link
# Options set before bind are the kernel's, then set again on spate's
# socket: a receive buffer for the test's burst, read one at a time.
v4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
v4.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
v4.bind(("0.0.0.0", 7))
v6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
v6.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
v6.bind(("::", 7))
lo = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
lo.bind(("127.0.0.1", 0))
lo.sendto(b"loop", lo.getsockname())
failures = 0
for name, s, want in (("v4", v4, "eventfd"), ("v6", v6, "eventfd"), ("loopback", lo, "socket")):
    if kind(s) != want:
        print("FAIL %s is %s" % (name, kind(s))); failures += 1
if lo.recv(16) != b"loop":
    print("FAIL loopback"); failures += 1
if v6.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) != 1:
    print("FAIL V6ONLY"); failures += 1
if v4.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) < 1 << 20:
    print("FAIL SO_RCVBUF", v4.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)); failures += 1
# A child started with subprocess (vfork, then close_range over every
# descriptor but stdio in the child, sharing the parent's memory) leaves
# the parent's spate sockets as they were.
import subprocess
subprocess.run(["/bin/true"], check=True)
for name, s in (("v4", v4), ("v6", v6)):
    if kind(s) != "eventfd":
        print("FAIL %s after subprocess is %s" % (name, kind(s))); failures += 1
print("pid", os.getpid())
print("READY", flush=True)
quits = 0
echoed = 0
while quits < 2:
    r, _, _ = select.select([v4, v6], [], [], 30)
    if not r:
        print("FAIL select timed out"); failures += 1; break
    for s in r:
        data, peer = s.recvfrom(65535)
        if data == b"quit":
            quits += 1
        else:
            s.sendto(data, peer); echoed += 1
print("echoed", echoed)
print("failures", failures, flush=True)
"#;

#[test]
fn python3_blocking_sockets_echo_every_size_over_ipv4_and_ipv6() {
    let _serial = device_lock();
    let (ns, kernel) = spate_and_kernel("plpy");
    let mut p = spate_run(&ns, "py-blocking", "/usr/bin/python3", &[&script("blocking.py", PY_BLOCKING)]);
    expect(&mut p, "READY");
    // spate-stat sees the program's stack and its two sockets.
    let out = p.output();
    let pid = out.lines().find_map(|l| l.strip_prefix("pid ")).unwrap_or_else(|| panic!("{out}")).to_string();
    let stat = std::process::Command::new("timeout")
        .args(["20", install_prefix().join("bin/spate-stat").to_str().unwrap(), "--pid", &pid])
        .output()
        .expect("spate-stat");
    let stat = String::from_utf8_lossy(&stat.stdout).into_owned();
    assert!(stat.contains(&format!("pid {pid}")) && stat.contains("0.0.0.0:7") && stat.contains("[::]:7"), "{stat}");
    // What reaches the wildcard sockets through the kernel (loopback in
    // spate's namespace) reaches the program too; the echo goes back
    // through the kernel.
    for (from, to) in [("127.0.0.1:0", "127.0.0.1:7"), ("[::1]:0", "[::1]:7")] {
        let back = ns.run(move || {
            let s = UdpSocket::bind(from).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.send_to(b"through the kernel", to).unwrap();
            let mut buf = [0u8; 64];
            s.recv_from(&mut buf).map(|(n, peer)| (buf[..n].to_vec(), peer.to_string())).map_err(|e| e.to_string())
        });
        assert_eq!(back, Ok((b"through the kernel".to_vec(), to.to_string())), "{}", p.output());
    }
    assert_eq!(echo_and_quit(&kernel), 2 * 209);
    let out = finish(p);
    assert!(out.contains("echoed 420"), "{out}");
}

const PY_ASYNCIO: &str = r#"
import asyncio, socket
class Echo(asyncio.DatagramProtocol):
    def __init__(self, done):
        self.done = done
        self.echoed = 0
    def connection_made(self, transport):
        self.transport = transport
    def datagram_received(self, data, addr):
        if data == b"quit":
            self.done.set_result(self.echoed) if not self.done.done() else None
        else:
            self.transport.sendto(data, addr); self.echoed += 1
async def main():
    loop = asyncio.get_running_loop()
    d4, d6 = loop.create_future(), loop.create_future()
    s4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s4.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    s4.bind(("0.0.0.0", 7))
    t4, _ = await loop.create_datagram_endpoint(lambda: Echo(d4), sock=s4)
    s6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s6.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    s6.bind(("::", 7))
    t6, _ = await loop.create_datagram_endpoint(lambda: Echo(d6), sock=s6)
    print("READY", flush=True)
    n4, n6 = await asyncio.wait_for(asyncio.gather(d4, d6), 60)
    print("echoed", n4, n6)
    t4.close(); t6.close()
    print("failures 0", flush=True)
asyncio.run(main())
"#;

#[test]
fn python3_asyncio_datagram_endpoints_echo_every_size() {
    let _serial = device_lock();
    let (ns, kernel) = spate_and_kernel("plaio");
    let mut p = spate_run(&ns, "py-asyncio", "/usr/bin/python3", &[&script("asyncio_echo.py", PY_ASYNCIO)]);
    expect(&mut p, "READY");
    // asyncio's transport sends nothing for an empty datagram.
    let pairs = [("198.18.0.1:0", "198.18.0.2:7"), ("[fd00::1]:0", "[fd00::2]:7")];
    assert_eq!(echo_sizes(&kernel, &pairs, &EVERY_SIZE[1..]), 2 * 208);
    send_from_kernel(&kernel, "198.18.0.1:0", "198.18.0.2:7", b"quit");
    send_from_kernel(&kernel, "[fd00::1]:0", "[fd00::2]:7", b"quit");
    let out = finish(p);
    assert!(out.contains("echoed 208 208"), "{out}");
}

/// Datagrams of every size class from the kernel to `to` (spate's), and
/// what the kernel's socket at `back` received of them, in order.
fn relayed(kernel: &Netns, from: &str, to: &str, back: &str) {
    let (from, to, back) = (from.to_string(), to.to_string(), back.to_string());
    kernel.run(move || {
        let rx = UdpSocket::bind(back.as_str()).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let tx = UdpSocket::bind(from.as_str()).unwrap();
        let mut buf = vec![0u8; 65536];
        for (i, len) in [1usize, 64, 1472, 3000, 9000, 30000, 60000].into_iter().enumerate() {
            let payload: Vec<u8> = (0..len).map(|j| (i * 13 + j * 5) as u8).collect();
            // socat may not be listening on the first try: resend until relayed.
            let mut got = None;
            for _ in 0..10 {
                tx.send_to(&payload, to.as_str()).unwrap();
                if let Ok((n, _)) = rx.recv_from(&mut buf) {
                    got = Some(buf[..n].to_vec());
                    break;
                }
            }
            let ok = got.as_deref() == Some(&payload[..]);
            assert!(ok, "{len} bytes relayed through spate to {back}: {:?} bytes came", got.map(|g| g.len()));
        }
    })
}

#[test]
fn socat_relays_udp_through_spate_over_ipv4_and_ipv6() {
    let _serial = device_lock();
    for (v, recv, send, from, to, back) in [
        ("4", "UDP4-RECV:7", "UDP4-SENDTO:198.18.0.1:9000", "198.18.0.1:0", "198.18.0.2:7", "198.18.0.1:9000"),
        ("6", "UDP6-RECV:7", "UDP6-SENDTO:[fd00::1]:9000", "[fd00::1]:0", "[fd00::2]:7", "[fd00::1]:9000"),
    ] {
        let (ns, kernel) = spate_and_kernel(&format!("plsocat{v}"));
        let mut p = spate_run(&ns, "socat", "/usr/bin/socat", &["-u", "-b", "65536", recv, send]);
        // socat says nothing when it listens: give the stack its start.
        std::thread::sleep(Duration::from_secs(3));
        relayed(&kernel, from, to, back);
        let out = p.output();
        assert!(!out.contains("stay the kernel's"), "{out}");
        p.stop();
    }
}

#[test]
fn netcat_openbsd_listens_and_sends_over_ipv4_and_ipv6() {
    let _serial = device_lock();
    for (v, flag, from, to) in [("4", "-4", "198.18.0.1:0", "198.18.0.2:7"), ("6", "-6", "[fd00::1]:0", "[fd00::2]:7")]
    {
        let (ns, kernel) = spate_and_kernel(&format!("plnc{v}"));
        let mut p =
            spate_run(&ns, "nc-listen", "/usr/bin/nc.openbsd", &[flag, "-n", "-u", "-l", "-d", "-k", "-v", "7"]);
        expect(&mut p, "Bound on");
        let line = format!("hello netcat over IPv{v}\n");
        send_from_kernel(&kernel, from, to, line.as_bytes());
        expect(&mut p, line.trim());
        p.stop();
        // nc as the sender: its datagram reaches the kernel's socket.
        let (host, port) = if v == "4" { ("198.18.0.1", "9000") } else { ("fd00::1", "9000") };
        let back = if v == "4" { "198.18.0.1:9000" } else { "[fd00::1]:9000" }.to_string();
        let rx = kernel.thread(move || {
            let rx = UdpSocket::bind(back.as_str()).unwrap();
            rx.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut buf = [0u8; 256];
            rx.recv(&mut buf).map(|n| buf[..n].to_vec())
        });
        std::thread::sleep(Duration::from_millis(300));
        let cmd = format!("echo sent by netcat | /usr/bin/nc.openbsd {flag} -n -u -w 1 {host} {port}");
        let mut s = spate_run(&ns, "nc-send", "/bin/sh", &["-c", &cmd]);
        let got = rx.join().unwrap().expect("netcat's datagram");
        assert_eq!(got, b"sent by netcat\n", "{}", s.output());
        s.stop();
    }
}

#[test]
fn iperf2_serves_and_sends_through_spate() {
    let _serial = device_lock();
    let (ns, kernel) = spate_and_kernel("pliperf");
    let mut server = spate_run(&ns, "iperf-server", "/usr/bin/iperf", &["-s", "-u", "-p", "5001", "-l", "1400"]);
    expect(&mut server, "Server listening");
    let client =
        kernel.must(&["/usr/bin/iperf", "-c", "198.18.0.2", "-u", "-p", "5001", "-b", "20M", "-t", "2", "-l", "1400"]);
    assert!(client.contains("Server Report"), "the server reported back through spate:\n{client}");
    server.stop();
    let out = server.output();
    let report = out.lines().find(|l| l.contains("datagrams") || l.contains("/sec")).unwrap_or_default().to_string();
    assert!(report.contains("Bytes"), "the server's report:\n{out}");
    // iperf as the client, over IPv6 to the kernel's server.
    let mut ks = kernel
        .spawn(
            "iperf-kserver",
            "/usr/bin/iperf",
            &["-s", "-u", "-V", "-p", "5002"].map(String::from),
            Duration::from_secs(60),
        )
        .unwrap();
    expect(&mut ks, "Server listening");
    let c = spate_run(
        &ns,
        "iperf-client",
        "/usr/bin/iperf",
        &["-c", "fd00::1", "-V", "-u", "-p", "5002", "-b", "20M", "-t", "2", "-l", "3000"],
    );
    let out = finish_ok(c);
    assert!(out.contains("Server Report"), "the kernel's server reported back:\n{out}");
    ks.stop();
}

/// Waits for `p` to end with status 0; its output.
fn finish_ok(mut p: Proc) -> String {
    assert!(p.wait_exit(Duration::from_secs(60)), "it did not end:\n{}", p.output());
    let out = p.output();
    let status = p.stop();
    assert!(status.is_some_and(|s| s.success()), "exit {status:?}:\n{out}");
    out
}

#[test]
fn a_c_epoll_loop_holds_spate_sockets_a_pipe_and_tcp_together() {
    let _serial = device_lock();
    let bin = preload_peer();
    let (ns, kernel) = spate_and_kernel("plepoll");
    let mut p = spate_run(&ns, "c-epoll", bin.to_str().unwrap(), &["epoll"]);
    expect(&mut p, "READY");
    assert_eq!(echo_and_quit(&kernel), 2 * 209);
    let out = finish(p);
    // And one through the kernel (loopback) to the wildcard socket.
    assert!(out.contains("echoed v4 210 v6 209"), "{out}");
}

#[test]
fn a_c_program_daemonizes_forks_and_execs() {
    let _serial = device_lock();
    let bin = preload_peer();
    let (ns, kernel) = spate_and_kernel("plfork");
    let mut p = spate_run(&ns, "c-fork", bin.to_str().unwrap(), &["fork"]);
    expect(&mut p, "daemon eventfd READY");
    let echo = |kernel: &Netns, n: usize| {
        kernel.run(move || {
            let s = UdpSocket::bind("198.18.0.1:0").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            for i in 0..n {
                let msg = format!("echo {i}");
                s.send_to(msg.as_bytes(), "198.18.0.2:7").unwrap();
                let mut buf = [0u8; 64];
                let (k, _) = s.recv_from(&mut buf).expect("the daemon echoes");
                assert_eq!(&buf[..k], msg.as_bytes());
            }
        })
    };
    echo(&kernel, 3);
    expect(&mut p, "after fork READY");
    echo(&kernel, 1);
    let out = finish(p);
    for line in ["child failures 0", "execd socket", "daemon failures 0", "daemon ok"] {
        assert!(out.contains(line), "no {line:?}:\n{out}");
    }
    assert!(!out.contains("FAIL"), "{out}");
}

#[test]
fn bad_calls_fail_with_linux_errno() {
    let _serial = device_lock();
    let bin = preload_peer();
    let (ns, _kernel) = spate_and_kernel("plerrno");
    let p = spate_run(&ns, "c-errno", bin.to_str().unwrap(), &["errno"]);
    let out = finish(p);
    let checks: usize = out.lines().find_map(|l| l.strip_prefix("checks ")).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(checks >= 17, "{out}");
}

#[test]
fn a_blocking_receive_is_interrupted_or_restarted_as_the_handler_says() {
    let _serial = device_lock();
    let bin = preload_peer();
    let (ns, kernel) = spate_and_kernel("plsig");
    let mut p = spate_run(&ns, "c-signals", bin.to_str().unwrap(), &["signals"]);
    expect(&mut p, "READY");
    send_from_kernel(&kernel, "198.18.0.1:0", "198.18.0.2:5001", b"hello");
    let out = finish(p);
    assert!(out.contains("eintr ok") && out.contains("restart ok"), "{out}");
}

#[test]
fn a_program_killed_with_sigkill_leaves_nothing_that_stops_the_next() {
    let _serial = device_lock();
    let bin = preload_peer();
    let (ns, kernel) = spate_and_kernel("plkill");
    for round in 0..2 {
        let mut p = spate_run(&ns, "c-hold", bin.to_str().unwrap(), &["hold"]);
        // Its socket is spate's each time: the first's lock died with it.
        expect(&mut p, "hold eventfd READY");
        send_from_kernel(&kernel, "198.18.0.1:0", "198.18.0.2:7", b"x");
        let out = p.output();
        let pid = out.lines().find_map(|l| l.strip_prefix("pid ")).unwrap_or_else(|| panic!("{out}")).to_string();
        let status = p.stop_with(libc::SIGKILL, Duration::from_secs(5));
        assert!(status.is_some_and(|s| !s.success()), "round {round}: {status:?}");
        // SIGKILL reaches the program as its parent's death signal: wait
        // until it is gone.
        let proc = PathBuf::from(format!("/proc/{pid}"));
        for _ in 0..200 {
            if !proc.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(!proc.exists(), "round {round}: {pid} outlived SIGKILL");
    }
}

const PY_MAPS: &str = r#"
import socket, sys
def mapped(lib):
    return any(lib in line for line in open("/proc/self/maps"))
failures = 0
lo = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
lo.bind(("127.0.0.1", 0))
lo.sendto(b"x", lo.getsockname())
lo.recv(4)
before = (mapped("libspate-preload"), mapped("librte_eal"), mapped("libspate.so"))
print("before", before)
# With LD_PRELOAD alone, the first UDP socket loads libspate to read the
# flags (spate-run hands the preload their routes).
if before != ((True, False, False) if sys.argv[1] == "spate-run" else (True, True, True)):
    print("FAIL a loopback socket loaded", before); failures += 1
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 7))
after = (mapped("librte_eal"), mapped("libspate.so"))
print("after", after)
if after != (True, True):
    print("FAIL a spate socket without libspate", after); failures += 1
print("READY", flush=True)
data, peer = s.recvfrom(100)
s.sendto(data, peer)
print("failures", failures, flush=True)
"#;

#[test]
fn libspate_and_dpdk_load_only_when_a_socket_needs_spate_and_ld_preload_alone_works() {
    let _serial = device_lock();
    let script = script("maps.py", PY_MAPS);
    for how in ["spate-run", "LD_PRELOAD"] {
        let (ns, kernel) = spate_and_kernel("plmaps");
        let mut p = match how {
            "spate-run" => spate_run(&ns, "py-maps", "/usr/bin/python3", &[&script, how]),
            _ => {
                let lib = install_prefix().join("lib/libspate-preload.so");
                let args: Vec<String> = [
                    format!("LD_PRELOAD={}", lib.display()),
                    format!("SPATE_ARGS={}", FLAGS.join(" ")),
                    "/usr/bin/python3".into(),
                    script.clone(),
                    how.into(),
                ]
                .into();
                ns.spawn("py-maps-ld", "/usr/bin/env", &args, Duration::from_secs(120)).unwrap()
            }
        };
        expect(&mut p, "READY");
        kernel.run(|| {
            let s = UdpSocket::bind("198.18.0.1:0").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.send_to(b"maps", "198.18.0.2:7").unwrap();
            let mut buf = [0u8; 16];
            let (n, _) = s.recv_from(&mut buf).expect("the echo through spate");
            assert_eq!(&buf[..n], b"maps");
        });
        finish(p);
    }
}

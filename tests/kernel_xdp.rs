//! spate on `net_af_xdp` sharing its interface with the kernel of its own
//! namespace, against the kernel in a peer namespace over a veth (the
//! peer's TX checksum offload left on, as a veth comes up):
//!
//! - spate's XDP program gives spate the frames to its addresses and its
//!   group (echo of 1 to 65,000 bytes in fragments, ping, `ECONNREFUSED`
//!   from its port unreachable, IPv4 and IPv6, a datagram to the group
//!   spate-echo joined) while the kernel keeps an address of its
//!   own on the same interface and answers ping and its own UDP echo
//!   there; its IPv6 link-local address stays the kernel's;
//! - the queries go to the kernel, so spate reports its group unasked
//!   (here every second: `mcast_refresh_secs = 1`);
//! - addresses added through the control endpoint at run time reach spate
//!   (it answers their pings), and one removed goes back to the kernel;
//! - a spate killed with SIGKILL leaves its program attached: the next
//!   start detaches it (DPDK would refuse to attach its own) and works;
//!   a start beside a running spate is refused and leaves it working; a
//!   program that is not spate's is refused with the way out.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{SocketAddr, UdpSocket};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use spate_testkit::{Netns, SpateApp, counter, device_lock, kernel_peer, veth};

const ECHO: &str = env!("CARGO_BIN_EXE_spate-echo");

/// spate's namespace with `vA`, its kernel keeping 198.18.0.3/24 and
/// fd00::3/64 there (IPv6 on), and the peer's with `vB` (198.18.0.1,
/// fd00::1), TX checksum offload on.
fn shared_link(what: &str) -> (Netns, Netns) {
    let spate = Netns::new(what);
    let kernel = Netns::new("peer");
    veth(&spate, "vA", &kernel, "vB");
    spate.must(&["ip", "addr", "add", "198.18.0.3/24", "dev", "vA"]);
    spate.must(&["ip", "-6", "addr", "add", "fd00::3/64", "dev", "vA", "nodad"]);
    spate.must(&["ip", "link", "set", "lo", "up"]);
    kernel_peer(&kernel, "vB");
    kernel.must(&["ethtool", "-K", "vB", "tx", "on"]);
    (spate, kernel)
}

fn echo_args(name: &str) -> Vec<String> {
    [
        "--vdev",
        "net_af_xdp0,iface=vA",
        "--ip",
        "198.18.0.2/24",
        "--ip6",
        "fd00::2/64",
        "--lcores",
        "0",
        "--poll",
        "adaptive",
        "--interval",
        "0",
        "--name",
        name,
    ]
    .map(String::from)
    .to_vec()
}

/// A file removed when the test ends, however it ends.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(what: &str, text: &str) -> TempFile {
        let path = std::env::temp_dir().join(format!("spate-xdp-{}-{what}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        TempFile(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The IGMP reports naming `group` that reach `vB` in 3 s, counted in
/// the peer's namespace.
fn igmp_reports(peer: &Netns, group: &str) -> u32 {
    peer.must(&["/usr/bin/python3", "-c", IGMP_REPORTS, group]).trim().parse().unwrap()
}

/// A control request to the stack named `name`; its reply line.
fn control(name: &str, request: &str) -> String {
    let mut s = UnixStream::connect(format!("/run/spate/{name}.sock")).expect("the control endpoint");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(format!("{request}\n").as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    line
}

/// Whether `len` bytes sent from `bind` to `to` come back unchanged.
fn echoes(bind: &str, to: &str, len: usize) -> bool {
    let s = UdpSocket::bind(bind).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let to: SocketAddr = to.parse().unwrap();
    let payload: Vec<u8> = (0..len).map(|i| (i * 11 + len) as u8).collect();
    s.send_to(&payload, to).unwrap();
    let mut buf = vec![0u8; 70_000];
    matches!(s.recv_from(&mut buf), Ok((n, from)) if from == to && buf[..n] == payload[..])
}

/// Whether a connected socket hears `ECONNREFUSED` from `to`.
fn refused(bind: &str, to: &str) -> bool {
    let s = UdpSocket::bind(bind).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.connect(to).unwrap();
    s.send(b"is anyone there").unwrap();
    s.recv(&mut [0u8; 16]).is_err_and(|e| e.kind() == ErrorKind::ConnectionRefused)
}

fn pings(ns: &Netns, target: &str) -> bool {
    ns.exec(&["ping", "-c", "2", "-i", "0.2", "-W", "2", target]).status.success()
}

/// The kernel's own UDP echo on 198.18.0.3:7 and [fd00::3]:7 in spate's
/// namespace, until `stop` is set (at most a minute); returns how many it
/// answered.
fn kernel_echo(ns: &Netns, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    ns.thread(move || {
        let socks: Vec<UdpSocket> =
            ["198.18.0.3:7", "[fd00::3]:7"].iter().map(|a| UdpSocket::bind(a).unwrap()).collect();
        for s in &socks {
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        }
        let (end, mut n, mut buf) = (Instant::now() + Duration::from_secs(60), 0, vec![0u8; 70_000]);
        while Instant::now() < end && !stop.load(Ordering::Relaxed) {
            for s in &socks {
                if let Ok((len, from)) = s.recv_from(&mut buf) {
                    s.send_to(&buf[..len], from).unwrap();
                    n += 1;
                }
            }
        }
        n
    })
}

#[test]
fn spate_and_the_kernel_share_an_interface_through_xdp() {
    let _serial = device_lock();
    let (spate, kernel) = shared_link("xdp");
    let name = format!("xdp-{}", std::process::id());
    let stop = Arc::new(AtomicBool::new(false));
    let served = kernel_echo(&spate, stop.clone());
    // Reports of its groups unasked every second (the kernel gets the
    // queries), for the test to see them.
    let config = TempFile::new("refresh-1.toml", "mcast_refresh_secs = 1\n");
    let args =
        [echo_args(&name), ["--join", "239.1.2.3", "--config", config.path()].map(String::from).to_vec()].concat();
    let app = SpateApp::start(&spate, ECHO, &args, "UDP echo on");
    assert!(app.proc.output().contains("spate's XDP program"), "{}", app.proc.output());
    assert!(app.proc.output().contains("gives spate 239.1.2.3's frames"), "{}", app.proc.output());
    kernel.must(&["ip", "route", "add", "224.0.0.0/4", "dev", "vB"]);

    for target in ["198.18.0.3", "fd00::3", "198.18.0.2", "fd00::2"] {
        assert!(pings(&kernel, target), "ping {target}\n{}", app.proc.output());
    }
    let (to_spate, to_kernel) = kernel.run(|| {
        let mut to_spate = Vec::new();
        for (bind, to) in [("198.18.0.1:0", "198.18.0.2:7"), ("[fd00::1]:0", "[fd00::2]:7")] {
            for len in [1, 100, 1472, 3000, 65_000] {
                to_spate.push((to, len, echoes(bind, to, len)));
            }
            to_spate.push((to, 0, refused(bind, &to.replace(":7", ":9"))));
        }
        let to_kernel: Vec<bool> = [("198.18.0.1:0", "198.18.0.3:7"), ("[fd00::1]:0", "[fd00::3]:7")]
            .iter()
            .flat_map(|(bind, to)| [echoes(bind, to, 100), echoes(bind, to, 3000)])
            .collect();
        (to_spate, to_kernel)
    });
    // The group spate's socket joined is spate's: answered from its address.
    let group = kernel.run(|| {
        let s = UdpSocket::bind("198.18.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s.send_to(b"to the group", "239.1.2.3:7").unwrap();
        let mut buf = [0u8; 64];
        s.recv_from(&mut buf).ok().map(|(n, from)| (buf[..n].to_vec(), from))
    });
    assert_eq!(group, Some((b"to the group".to_vec(), "198.18.0.2:7".parse().unwrap())), "{}", app.proc.output());
    // After the join's own reports: the refreshes, a second apart.
    let reports = igmp_reports(&kernel, "239.1.2.3");
    assert!((2..=4).contains(&reports), "{reports} reports of 239.1.2.3 in 3 s\n{}", app.proc.output());
    for (to, len, ok) in &to_spate {
        assert!(ok, "{to}: {} (len {len})\n{}", if *len == 0 { "ECONNREFUSED" } else { "echo" }, app.proc.output());
    }
    assert_eq!(to_kernel, vec![true; 4], "the kernel's own echo on its address of the same interface");

    // The link-local address both make from the MAC is the kernel's.
    let ll = spate.must(&["ip", "-6", "addr", "show", "dev", "vA", "scope", "link"]);
    let ll = ll.split_whitespace().skip_while(|w| *w != "inet6").nth(1).expect("a link-local address").to_string();
    let ll = ll.split('/').next().unwrap();
    assert!(pings(&kernel, &format!("{ll}%vB")), "the kernel's link-local address answers");

    // Added at run time: spate's; removed: the kernel's again (not answered).
    for addr in ["198.18.0.9/24", "fd00::9/64"] {
        let reply = control(&name, &format!(r#"{{"op": "add_address", "iface": 0, "addr": "{addr}"}}"#));
        assert!(!reply.contains("error"), "{reply}");
    }
    assert!(app.proc.output().contains("gives spate 198.18.0.9's frames"), "{}", app.proc.output());
    // spate-echo's sockets are bound to its first addresses: spate answers
    // pings to the new ones (the kernel of its namespace does not have them).
    for target in ["198.18.0.9", "fd00::9"] {
        assert!(pings(&kernel, target), "{target}, added at run time, reaches spate\n{}", app.proc.output());
    }
    let reply = control(&name, r#"{"op": "remove_address", "iface": 0, "ip": "198.18.0.9"}"#);
    assert!(!reply.contains("error"), "{reply}");
    assert!(app.proc.output().contains("gives 198.18.0.9's frames back to the kernel"), "{}", app.proc.output());
    assert!(!pings(&kernel, "198.18.0.9"), "removed: the kernel has it not, nobody answers");

    let (c, out) = app.stop();
    stop.store(true, Ordering::Relaxed);
    assert_eq!(served.join().unwrap(), 4, "the kernel's echo answered its four");
    assert_eq!(counter(&c, "Udp.InDatagrams"), 5 + 1, "{out}");
    assert_eq!(counter(&c, "Udp6.InDatagrams"), 5, "{out}");
    assert_eq!((counter(&c, "Udp.NoPorts"), counter(&c, "Udp6.NoPorts")), (1, 1), "{out}");
    assert_eq!(counter(&c, "Icmp.InEchos") + counter(&c, "Icmp6.InEchos"), 2 * 4, "{out}");
    assert!(counter(&c, "Csum.Partial") >= 4, "the peer's checksums left to its offload\n{out}");
    assert_eq!(counter(&c, "Rx.UdpCsumErrors"), 0, "{out}");
    // Nothing of the kernel's reached spate.
    assert_eq!(counter(&c, "Rx.Ipv4NotForUs") + counter(&c, "Rx.Ipv6NotForUs"), 0, "{out}");
    assert!(!spate.must(&["ip", "link", "show", "dev", "vA"]).contains("xdp"), "detached at the end");
}

#[test]
fn a_killed_spate_leaves_nothing_that_stops_the_next_on_net_af_xdp() {
    let _serial = device_lock();
    let (spate, kernel) = shared_link("xdpkill");
    let name = format!("xdpkill-{}", std::process::id());
    let mut first = SpateApp::start(&spate, ECHO, &echo_args(&name), "UDP echo on");
    assert!(kernel.run(|| echoes("198.18.0.1:0", "198.18.0.2:7", 100)));
    first.proc.stop_with(libc::SIGKILL, Duration::from_secs(5));
    let link = spate.must(&["ip", "-d", "link", "show", "dev", "vA"]);
    assert!(link.contains("name spate_xdp"), "the killed spate's program stays attached: {link}");

    // This one joins a group and reports it only when it joins (the
    // control of the refresh the other test sees).
    let config = TempFile::new("refresh-0.toml", "mcast_refresh_secs = 0\n");
    let args =
        [echo_args(&name), ["--join", "239.1.2.4", "--config", config.path()].map(String::from).to_vec()].concat();
    let second = SpateApp::start(&spate, ECHO, &args, "UDP echo on");
    assert!(second.proc.output().contains("that ended without closing its port (killed): detached"));
    let echoed =
        kernel.run(|| [echoes("198.18.0.1:0", "198.18.0.2:7", 100), echoes("[fd00::1]:0", "[fd00::2]:7", 100)]);
    assert_eq!(echoed, [true, true], "{}", second.proc.output());
    assert!(pings(&kernel, "198.18.0.3"), "the kernel answers on its address");
    // The join's own reports are over within a second of the start.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(igmp_reports(&kernel, "239.1.2.4"), 0, "no report unasked with mcast_refresh_secs = 0");
    // A third beside the running one is refused and leaves it working.
    let mut third = spate.spawn("third", ECHO, &echo_args(&format!("{name}-3")), Duration::from_secs(60)).unwrap();
    assert!(third.wait_exit(Duration::from_secs(30)), "{}", third.output());
    assert!(third.output().contains("a spate runs on it already"), "{}", third.output());
    assert!(kernel.run(|| echoes("198.18.0.1:0", "198.18.0.2:7", 100)), "{}", second.proc.output());
    second.stop();

    // A program that is not spate's: refused, with the way out, and left
    // attached.
    let src = TempFile::new("pass.c", FOREIGN);
    let obj = TempFile(std::env::temp_dir().join(format!("spate-xdp-{}-pass.o", std::process::id())));
    let built = std::process::Command::new("/usr/bin/clang")
        .args(["-O2", "-target", "bpfel", &format!("-I/usr/include/{}-linux-gnu", std::env::consts::ARCH), "-c"])
        .arg(src.path())
        .arg("-o")
        .arg(obj.path())
        .status()
        .unwrap();
    assert!(built.success() && std::path::Path::new(obj.path()).exists(), "clang built no {}", obj.path());
    spate.must(&["ip", "link", "set", "dev", "vA", "xdp", "obj", obj.path(), "sec", "xdp"]);
    let mut refused = spate.spawn("foreign", ECHO, &echo_args(&name), Duration::from_secs(60)).unwrap();
    assert!(refused.wait_exit(Duration::from_secs(30)), "{}", refused.output());
    let out = refused.output();
    assert!(out.contains("that is not spate's") && out.contains("xdp off"), "{out}");
    assert!(spate.must(&["ip", "-d", "link", "show", "dev", "vA"]).contains("name other_pass"));
    spate.must(&["ip", "link", "set", "dev", "vA", "xdp", "off"]);
}

/// Counts the IGMP reports naming the group (its argument) that reach `vB`
/// in 3 s.
const IGMP_REPORTS: &str = r#"
import socket, sys, time
group = bytes(int(b) for b in sys.argv[1].split("."))
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
s.bind(("vB", 0))
s.settimeout(0.2)
n, end = 0, time.time() + 3
while time.time() < end:
    try:
        f = s.recv(2048)
    except socket.timeout:
        continue
    ihl = (f[14] & 15) * 4
    if f[14 + 9] == 2 and group in f[14 + ihl:]:
        n += 1
print(n)
"#;

/// An XDP program that is not spate's.
const FOREIGN: &str = r#"
#include <linux/bpf.h>
__attribute__((section("xdp"), used)) int other_pass(struct xdp_md *ctx) { return XDP_PASS; }
char _license[] __attribute__((section("license"), used)) = "GPL";
"#;

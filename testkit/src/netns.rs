//! Network namespaces a test creates and removes, veth pairs between them,
//! and threads and processes that run inside them. Tests send traffic only
//! to addresses inside namespaces they created (198.18.0.0/15, fd00::/8).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use crate::names::unique;
use crate::process::Proc;

/// A network namespace, deleted (with every process still in it) on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

fn ip(args: &[&str]) -> std::io::Result<Output> {
    Command::new("ip").args(args).output()
}

fn must(out: std::io::Result<Output>, what: &str) {
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!("{what} failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => panic!("{what}: {e}"),
    }
}

/// The kernel's `Udp:` counters of `/proc/net/snmp` in namespace `ns`, by
/// name, read at once (for a closure that outlives the [`Netns`]).
pub fn kernel_udp_counters(ns: &str) -> HashMap<String, u64> {
    let o = Command::new("timeout")
        .args(["60", "ip", "netns", "exec", ns, "cat", "/proc/net/snmp"])
        .output()
        .unwrap_or_else(|e| panic!("/proc/net/snmp in {ns}: {e}"));
    assert!(o.status.success(), "/proc/net/snmp in {ns}: {}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    let mut udp = text.lines().filter(|l| l.starts_with("Udp: "));
    let (names, values) = (udp.next().unwrap_or_default(), udp.next().unwrap_or_default());
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .filter_map(|(n, v)| Some((n.to_string(), v.parse().ok()?)))
        .collect()
}

impl Netns {
    /// A fresh namespace named `spate-<what>-<pid>_<n>` with loopback up.
    pub fn new(what: &str) -> Netns {
        let name = unique(&format!("spate-{what}-"));
        must(ip(&["netns", "add", &name]), "ip netns add");
        let ns = Netns { name };
        ns.must(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its path for setns.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    /// Runs a command inside it (bounded to 60 s).
    pub fn exec(&self, cmd: &[&str]) -> Output {
        Command::new("timeout")
            .args(["60", "ip", "netns", "exec", &self.name])
            .args(cmd)
            .output()
            .unwrap_or_else(|e| panic!("ip netns exec {} {cmd:?}: {e}", self.name))
    }

    /// Runs a command inside it and panics with its stderr if it fails.
    pub fn must(&self, cmd: &[&str]) -> String {
        let o = self.exec(cmd);
        assert!(o.status.success(), "{cmd:?} in {} failed: {}", self.name, String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// The kernel's `Udp:` counter `name` of `/proc/net/snmp` inside it
    /// (`InDatagrams`, `RcvbufErrors`...); panics if there is none.
    pub fn udp_counter(&self, name: &str) -> u64 {
        kernel_udp_counters(&self.name).get(name).copied().unwrap_or_else(|| panic!("no Udp {name} in {}", self.name))
    }

    /// Starts a bounded process inside it.
    pub fn spawn(&self, label: &str, program: &str, args: &[String], limit: Duration) -> std::io::Result<Proc> {
        let log = PathBuf::from(format!("/tmp/{}.log", unique(&format!("spate-{label}-"))));
        let mut full = vec![
            "netns".to_string(),
            "exec".into(),
            self.name.clone(),
            "setpriv".into(),
            "--pdeathsig".into(),
            "KILL".into(),
            program.into(),
        ];
        full.extend(args.iter().cloned());
        Proc::spawn(label, "ip", &full, &log, limit)
    }

    /// Runs `f` on a thread that lives in this namespace (for kernel
    /// sockets on the peer side) and returns its result.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.thread(f).join().unwrap_or_else(|e| std::panic::resume_unwind(e))
    }

    /// Starts `f` on a thread that lives in this namespace.
    pub fn thread<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> std::thread::JoinHandle<T> {
        let path = self.path();
        std::thread::spawn(move || {
            crate::unsafe_libc::enter_netns(&path).expect("setns into the test namespace");
            f()
        })
    }

    /// Disables IPv6 on an interface (the side spate drives, so the kernel
    /// does not speak on the wire from it).
    pub fn disable_ipv6(&self, dev: &str) {
        self.must(&["sysctl", "-qw", &format!("net.ipv6.conf.{dev}.disable_ipv6=1")]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Processes left inside (if a test failed) go first.
        if let Ok(o) = ip(&["netns", "pids", &self.name]) {
            for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
        }
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// A veth pair `a` (in `ns_a`) <-> `b` (in `ns_b`), both up.
pub fn veth(ns_a: &Netns, a: &str, ns_b: &Netns, b: &str) {
    // Created in ns_a directly, so nothing appears in the root namespace.
    ns_a.must(&["ip", "link", "add", a, "type", "veth", "peer", "name", b, "netns", ns_b.name()]);
    ns_a.must(&["ip", "link", "set", a, "up"]);
    ns_b.must(&["ip", "link", "set", b, "up"]);
}

/// The standard test link: spate's namespace (`spate-<what>-...`) with
/// `vA` (spate's MAC 02:53:50:41:54:45, the kernel's IPv6 off on it) and
/// the kernel's (`peer`) with `vB` set up by [`kernel_peer`].
pub fn spate_and_kernel(what: &str) -> (Netns, Netns) {
    let spate = Netns::new(what);
    let kernel = Netns::new("peer");
    veth(&spate, "vA", &kernel, "vB");
    spate.must(&["ip", "link", "set", "vA", "address", "02:53:50:41:54:45"]);
    spate.disable_ipv6("vA");
    kernel_peer(&kernel, "vB");
    (spate, kernel)
}

/// The kernel peer's side of the standard test link: 198.18.0.1/24 and
/// fd00::1/64 on `dev`, TX checksum offload off (veth would leave UDP
/// checksums for a raw receiver to find unfinished).
pub fn kernel_peer(ns: &Netns, dev: &str) {
    ns.must(&["ip", "addr", "add", "198.18.0.1/24", "dev", dev]);
    ns.must(&["ip", "-6", "addr", "add", "fd00::1/64", "dev", dev, "nodad"]);
    ns.must(&["ip", "link", "set", dev, "up"]);
    ns.must(&["ethtool", "-K", dev, "tx", "off"]);
}

/// A stack made in this process on `vA` of [`spate_and_kernel`]'s link
/// (`net_af_packet`, opened inside `ns`), polling lcore 1 once started,
/// with `addrs` (`198.18.0.2/24`, ...) and a pool of `mbufs`.
pub fn af_packet_stack(ns: &Netns, addrs: &[&str], mbufs: u32) -> spate_stack::Stack {
    let mut port = spate_stack::PortSpec::new("net_af_packet0,iface=vA");
    for a in addrs {
        port = port.addr(a).expect("an address");
    }
    let cfg = spate_stack::StackConfig {
        lcores: "1".into(),
        ports: vec![port],
        stop_on_signal: false,
        mempool_size: mbufs,
        ..spate_stack::StackConfig::default()
    };
    ns.run(move || spate_stack::Stack::new(cfg).expect("the stack"))
}

/// spate behind a router whose far link carries 1,280-byte packets:
/// spate's namespace with `vA` (spate's MAC, no kernel IPv6) to the
/// router's `rA` (198.18.0.1/24, fd00::1/64), the router's `rB` (MTU
/// 1,280; 198.20.0.1/24, fd01::1/64) to the kernel's `vB` (MTU 1,280;
/// 198.20.0.2/24, fd01::2/64, routed back through the router). Returns
/// (spate's, the router's, the kernel's) namespaces.
pub fn behind_a_small_link(what: &str) -> (Netns, Netns, Netns) {
    let spate = Netns::new(what);
    let router = Netns::new("router");
    let kernel = Netns::new("far");
    veth(&spate, "vA", &router, "rA");
    veth(&router, "rB", &kernel, "vB");
    spate.must(&["ip", "link", "set", "vA", "address", "02:53:50:41:54:45"]);
    spate.disable_ipv6("vA");
    router.must(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    router.must(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
    for (dev, v4, v6) in [("rA", "198.18.0.1/24", "fd00::1/64"), ("rB", "198.20.0.1/24", "fd01::1/64")] {
        router.must(&["ip", "addr", "add", v4, "dev", dev]);
        router.must(&["ip", "-6", "addr", "add", v6, "dev", dev, "nodad"]);
    }
    router.must(&["ip", "link", "set", "rB", "mtu", "1280"]);
    kernel.must(&["ip", "link", "set", "vB", "mtu", "1280"]);
    kernel.must(&["ip", "addr", "add", "198.20.0.2/24", "dev", "vB"]);
    kernel.must(&["ip", "-6", "addr", "add", "fd01::2/64", "dev", "vB", "nodad"]);
    kernel.must(&["ip", "route", "add", "default", "via", "198.20.0.1"]);
    kernel.must(&["ip", "-6", "route", "add", "default", "via", "fd01::1"]);
    for (ns, dev) in [(&router, "rA"), (&router, "rB"), (&kernel, "vB")] {
        ns.must(&["ethtool", "-K", dev, "tx", "off"]);
    }
    (spate, router, kernel)
}

/// Every size class of datagram: empty, small, a full frame, fragments,
/// the largest.
pub const EVERY_SIZE: &[usize] = &[0, 1, 64, 1400, 1472, 3000, 9000, 30000, 65000];

/// [`echo_sizes`] of [`EVERY_SIZE`].
pub fn echo_every_size(peer: &Netns, pairs: &[(&str, &str)]) -> usize {
    echo_sizes(peer, pairs, EVERY_SIZE)
}

/// From inside `peer`, sends a datagram of each of `sizes` to each
/// `(bind, target)` pair's echo server and checks each comes back whole
/// from the target, then a burst of 200 small ones (read back in any
/// order); the datagrams echoed.
pub fn echo_sizes(peer: &Netns, pairs: &[(&str, &str)], sizes: &'static [usize]) -> usize {
    let pairs: Vec<(String, String)> = pairs.iter().map(|(b, t)| (b.to_string(), t.to_string())).collect();
    peer.run(move || {
        let mut echoed = 0;
        for (bind, target) in &pairs {
            let s = std::net::UdpSocket::bind(bind.as_str()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let target: std::net::SocketAddr = target.parse().unwrap();
            let mut buf = vec![0u8; 65536];
            for (i, &len) in sizes.iter().enumerate() {
                let payload: Vec<u8> = (0..len).map(|j| (i * 31 + j * 7) as u8).collect();
                s.send_to(&payload, target).unwrap();
                let (n, from) = s.recv_from(&mut buf).unwrap_or_else(|e| panic!("{len} bytes to {target}: {e}"));
                assert_eq!((from, &buf[..n]), (target, &payload[..]), "{len} bytes to {target}");
                echoed += 1;
            }
            for k in 0..200u32 {
                s.send_to(&k.to_be_bytes(), target).unwrap();
            }
            let mut seen = std::collections::HashSet::new();
            while seen.len() < 200 {
                let (n, _) = s.recv_from(&mut buf).expect("the burst comes back");
                assert_eq!(n, 4);
                seen.insert(u32::from_be_bytes(buf[..4].try_into().unwrap()));
            }
            echoed += 200;
        }
        echoed
    })
}

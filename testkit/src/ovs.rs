//! OVS-DPDK (Debian's `openvswitch-switch-dpdk`: OVS 3.1 on DPDK 22.11) as
//! a test fixture, without systemd: its own database, `ovsdb-server` and
//! the DPDK build of `ovs-vswitchd`, all state in a private directory, run
//! inside a test namespace (so its TAP devices go with the namespace), a
//! netdev bridge with the ports a test asks for and explicit flows (OVS
//! does not keep them across a restart: they are added after every start).
//! Dropping it deletes the bridge, stops both daemons and removes the
//! directory and OVS's DPDK runtime folder.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::names::{unique, unique_socket_path};
use crate::netns::{Netns, kernel_peer, veth};

/// The DPDK build of ovs-vswitchd, run directly (no alternatives switch).
const VSWITCHD: &str = "/usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk";

/// A port of the bridge.
#[derive(Debug, Clone)]
pub enum OvsPort {
    /// A vhost-user client port: OVS connects to `path`, which the other
    /// side (spate, testpmd) serves as `net_virtio_user` with `server=1`.
    VhostClient(PathBuf),
    /// A DPDK `net_af_packet` port on interface `iface` of OVS's namespace.
    AfPacket(String),
    /// A vhost-user client port as [`OvsPort::VhostClient`] whose frames
    /// OVS spreads over the queues by their 5-tuple hash
    /// (`other_config:tx-steering=hash`).
    VhostClientHashed(PathBuf),
    /// A plain `system` port: kernel interface `iface` of OVS's namespace,
    /// whose frames reach OVS as the kernel has them (a `net_af_packet`
    /// DPDK port would get fragments the kernel reassembled).
    System(String),
}

/// spate-echo (the binary `echo`) behind OVS-DPDK: namespaces `<tag>`
/// (OVS and spate, veth `vO`) and `<tag>peer` (the kernel, `vB`);
/// spate-echo serves a `net_virtio_user` port of `queues` queues with
/// `extra` arguments, and OVS joins `kernel_side` (on `vO`) to
/// `spate_side(socket)`, flows both ways. Returns once spate echoes.
pub fn echo_behind_ovs(
    echo: &str,
    tag: &str,
    queues: u16,
    extra: &[&str],
    kernel_side: OvsPort,
    spate_side: fn(std::path::PathBuf) -> OvsPort,
) -> (Netns, Netns, crate::process::Proc, Ovs) {
    let ovs_ns = Netns::new(tag);
    let kernel_ns = Netns::new(&format!("{tag}peer"));
    veth(&ovs_ns, "vO", &kernel_ns, "vB");
    ovs_ns.must(&["ip", "link", "set", "vO", "up"]);
    ovs_ns.must(&["ethtool", "-K", "vO", "tx", "off"]);
    ovs_ns.disable_ipv6("vO");
    kernel_peer(&kernel_ns, "vB");
    let sock = unique_socket_path(tag);
    let vdev = format!(
        "net_virtio_user0,path={},server=1,queues={queues},queue_size=1024,mac=02:53:50:41:54:45",
        sock.display()
    );
    let mut args: Vec<String> =
        ["--vdev", &vdev, "--ip", "198.18.0.2/24", "--idle-sleep", "20", "--interval", "0"].map(String::from).to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    let mut app = ovs_ns.spawn("echo", echo, &args, Duration::from_secs(600)).unwrap();
    app.remove_on_drop(&sock);
    assert!(app.wait_for_output("waiting for client connection", Duration::from_secs(60)), "{}", app.output());
    let ovs = Ovs::start(
        &ovs_ns,
        &[kernel_side, spate_side(sock)],
        &["in_port=1,actions=output:2", "in_port=2,actions=output:1"],
    );
    assert!(app.wait_for_output("UDP echo on", Duration::from_secs(60)), "{}\n{}", app.output(), ovs.log());
    (ovs_ns, kernel_ns, app, ovs)
}

/// A running OVS-DPDK.
#[derive(Debug)]
pub struct Ovs {
    ns: String,
    dir: PathBuf,
    prefix: String,
    bridge: String,
    flows: Vec<String>,
}

impl Ovs {
    /// Starts OVS-DPDK in `ns` with `ports` (OpenFlow port numbers 1, 2,
    /// ... in this order) and `flows` (`ovs-ofctl add-flow` syntax).
    pub fn start(ns: &Netns, ports: &[OvsPort], flows: &[&str]) -> Ovs {
        let dir = std::env::temp_dir().join(unique("spate-ovs-"));
        std::fs::create_dir_all(&dir).expect("OVS directory");
        let ovs = Ovs {
            ns: ns.name().to_string(),
            prefix: unique("spate-ovs-"),
            bridge: "spbr0".into(),
            flows: flows.iter().map(|f| f.to_string()).collect(),
            dir,
        };
        let db = ovs.dir.join("conf.db");
        ovs.must(&["ovsdb-tool", "create", &db.display().to_string(), "/usr/share/openvswitch/vswitch.ovsschema"]);
        let run = ovs.dir.display().to_string();
        ovs.must(&[
            "ovsdb-server",
            &db.display().to_string(),
            &format!("--remote=punix:{run}/db.sock"),
            &format!("--pidfile={run}/ovsdb-server.pid"),
            &format!("--unixctl={run}/ovsdb-server.ctl"),
            &format!("--log-file={run}/ovsdb-server.log"),
            "--detach",
            "--no-chdir",
            "-vconsole:off",
        ]);
        ovs.vsctl(&["--no-wait", "init"]);
        ovs.vsctl(&[
            "--no-wait",
            "set",
            "Open_vSwitch",
            ".",
            "other_config:dpdk-init=true",
            &format!(
                "other_config:dpdk-extra=--no-pci --in-memory --single-file-segments --no-telemetry --file-prefix {}",
                ovs.prefix
            ),
            "other_config:dpdk-socket-mem=256",
            "other_config:dpdk-socket-limit=256",
            "other_config:pmd-cpu-mask=0x2",
        ]);
        let mut cmd: Vec<String> =
            ["--no-wait", "--", "add-br", &ovs.bridge, "--", "set", "Bridge", &ovs.bridge].map(String::from).to_vec();
        cmd.extend(["datapath_type=netdev".into(), "fail_mode=secure".into()]);
        for (i, p) in ports.iter().enumerate() {
            // A system port is named as its kernel interface.
            let name = match p {
                OvsPort::System(iface) => iface.clone(),
                _ => format!("p{}", i + 1),
            };
            cmd.extend(["--".into(), "add-port".into(), ovs.bridge.clone(), name.clone()]);
            cmd.extend(["--".into(), "set".into(), "Interface".into(), name]);
            match p {
                OvsPort::VhostClient(path) => cmd.extend([
                    "type=dpdkvhostuserclient".into(),
                    format!("options:vhost-server-path={}", path.display()),
                ]),
                OvsPort::VhostClientHashed(path) => cmd.extend([
                    "type=dpdkvhostuserclient".into(),
                    format!("options:vhost-server-path={}", path.display()),
                    "other_config:tx-steering=hash".into(),
                ]),
                OvsPort::System(_) => cmd.push("type=system".into()),
                OvsPort::AfPacket(iface) => {
                    cmd.extend(["type=dpdk".into(), format!("options:dpdk-devargs=net_af_packet{i},iface={iface}")])
                }
            }
            cmd.push(format!("ofport_request={}", i + 1));
        }
        let refs: Vec<&str> = cmd.iter().map(String::as_str).collect();
        ovs.vsctl(&refs);
        ovs.start_vswitchd();
        ovs
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    /// Runs a command in OVS's namespace with OVS's directories; panics
    /// with its output when it fails.
    fn must(&self, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .args(args)
            .env("OVS_RUNDIR", &self.dir)
            .env("OVS_LOGDIR", &self.dir)
            .env("OVS_DBDIR", &self.dir)
            .env("OVS_SYSCONFDIR", &self.dir)
            .output()
            .expect("run an OVS command");
        assert!(
            out.status.success(),
            "{args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn vsctl(&self, args: &[&str]) -> String {
        let db = format!("--db=unix:{}", self.path("db.sock"));
        let mut a = vec!["ovs-vsctl", &db, "--timeout=20"];
        a.extend(args);
        self.must(&a)
    }

    fn ofctl(&self, args: &[&str]) -> String {
        let mut a = vec!["ovs-ofctl"];
        a.extend(args);
        self.must(&a)
    }

    fn mgmt(&self) -> String {
        format!("unix:{}", self.path(&format!("{}.mgmt", self.bridge)))
    }

    /// Starts ovs-vswitchd (it returns once DPDK is up and the bridge
    /// configured) and adds the flows.
    fn start_vswitchd(&self) {
        let db = format!("unix:{}", self.path("db.sock"));
        self.must(&[
            VSWITCHD,
            &db,
            &format!("--pidfile={}", self.path("ovs-vswitchd.pid")),
            &format!("--unixctl={}", self.path("ovs-vswitchd.ctl")),
            &format!("--log-file={}", self.path("ovs-vswitchd.log")),
            "--detach",
            "--no-chdir",
            "-vconsole:off",
        ]);
        let mgmt = self.mgmt();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !Path::new(&self.path(&format!("{}.mgmt", self.bridge))).exists() {
            assert!(Instant::now() < deadline, "the bridge did not come up:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        self.ofctl(&["del-flows", &mgmt]);
        for f in &self.flows {
            self.ofctl(&["add-flow", &mgmt, f]);
        }
    }

    /// OpenFlow port `port`'s counters: (rx packets, rx dropped, tx
    /// packets, tx dropped).
    pub fn port_stats(&self, port: u16) -> (u64, u64, u64, u64) {
        let out = self.ofctl(&["dump-ports", &self.mgmt(), &port.to_string()]);
        let field = |line: &str, key: &str| -> u64 {
            line.split([' ', ','])
                .find_map(|w| w.strip_prefix(&format!("{key}=")))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let rx = out.lines().find(|l| l.contains("rx pkts")).unwrap_or("");
        let tx = out.lines().find(|l| l.contains("tx pkts")).unwrap_or("");
        (field(rx, "pkts"), field(rx, "drop"), field(tx, "pkts"), field(tx, "drop"))
    }

    /// ovs-vswitchd's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("ovs-vswitchd.log")).unwrap_or_default()
    }

    fn pid(&self, daemon: &str) -> Option<u32> {
        std::fs::read_to_string(self.path(&format!("{daemon}.pid"))).ok()?.trim().parse().ok()
    }

    /// Stops ovs-vswitchd with `signal` (SIGTERM or SIGKILL) and starts it
    /// again, as an operator's restart or a crash and its recovery.
    pub fn restart(&self, signal: i32) {
        let pid = self.pid("ovs-vswitchd").expect("ovs-vswitchd pid");
        stop_pid(pid, signal);
        // A killed vswitchd leaves its pid file, and until the init process
        // reaps the zombie the new one would take it for still running.
        let _ = std::fs::remove_file(self.path("ovs-vswitchd.pid"));
        self.start_vswitchd();
    }
}

/// Sends `signal`, waits up to 5 s for the exit, then SIGKILL.
fn stop_pid(pid: u32, signal: i32) {
    let alive = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.rsplit(')').next().and_then(|r| r.split_whitespace().next()) != Some("Z"))
    };
    if pid == 0 || !alive(pid) {
        return;
    }
    let _ = Command::new("kill").args([format!("-{signal}"), pid.to_string()]).status();
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if alive(pid) {
        let _ = Command::new("kill").args(["-9".to_string(), pid.to_string()]).status();
    }
}

impl Drop for Ovs {
    fn drop(&mut self) {
        let db = format!("--db=unix:{}", self.path("db.sock"));
        let _ = Command::new("ip")
            .args(["netns", "exec", &self.ns, "ovs-vsctl", &db, "--timeout=10", "--if-exists", "del-br", &self.bridge])
            .output();
        let ctl = self.path("ovs-vswitchd.ctl");
        let _ = Command::new("ip")
            .args(["netns", "exec", &self.ns, "ovs-appctl", "-t", &ctl, "exit", "--cleanup"])
            .output();
        if let Some(pid) = self.pid("ovs-vswitchd") {
            stop_pid(pid, 15);
        }
        if let Some(pid) = self.pid("ovsdb-server") {
            stop_pid(pid, 15);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/{}", self.prefix));
    }
}

//! `dpdk-testpmd` as a peer and as the reference a benchmark compares with.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::names::unique;
use crate::process::Proc;

/// Builds a testpmd command line with spate's safety rules: `--no-pci`,
/// a unique file prefix, hugepages in memory with single-file segments
/// (what vhost-user needs) or no hugepages.
#[derive(Debug, Clone)]
pub struct TestPmdBuilder {
    lcores: String,
    main_lcore: u32,
    vdevs: Vec<String>,
    hugepages: bool,
    memory_mb: u32,
    app_args: Vec<String>,
    limit: Duration,
    interactive: bool,
    netns: Option<String>,
}

impl TestPmdBuilder {
    /// testpmd on lcores `lcores` with `main_lcore` as its (mostly idle) main one.
    pub fn new(lcores: &str, main_lcore: u32) -> Self {
        TestPmdBuilder {
            lcores: lcores.into(),
            main_lcore,
            vdevs: Vec::new(),
            hugepages: true,
            memory_mb: 512,
            app_args: Vec::new(),
            limit: Duration::from_secs(300),
            interactive: false,
            netns: None,
        }
    }

    /// Runs it inside network namespace `ns` (for `net_tap`, whose device
    /// appears where testpmd runs).
    pub fn in_netns(mut self, ns: &crate::Netns) -> Self {
        self.netns = Some(ns.name().to_string());
        self
    }

    /// Adds a `--vdev`.
    pub fn vdev(mut self, spec: &str) -> Self {
        self.vdevs.push(spec.into());
        self
    }

    /// Runs without hugepages.
    pub fn no_huge(mut self) -> Self {
        self.hugepages = false;
        self
    }

    /// testpmd's own arguments (after `--`).
    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.app_args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Runs it interactively (`-i`), driven by [`TestPmd::command`]:
    /// forwarding starts at `start` and `stop` prints exact totals while the
    /// ports stay up.
    pub fn interactive(mut self) -> Self {
        self.interactive = true;
        self
    }

    /// The longest it may run.
    pub fn limit(mut self, limit: Duration) -> Self {
        self.limit = limit;
        self
    }

    /// Starts it; the log goes to a file under /tmp.
    pub fn spawn(self, role: &str) -> std::io::Result<TestPmd> {
        let prefix = unique(&format!("spate-tpmd-{role}-"));
        // Line-buffered, so what it prints reaches the log as it happens.
        let mut args = match &self.netns {
            Some(ns) => vec!["netns".to_string(), "exec".into(), ns.clone(), "stdbuf".into()],
            None => Vec::new(),
        };
        args.extend([
            "-oL".to_string(),
            "dpdk-testpmd".into(),
            "-l".to_string(),
            self.lcores.clone(),
            "--main-lcore".into(),
            self.main_lcore.to_string(),
            "--no-pci".into(),
            "--no-telemetry".into(),
            "--file-prefix".into(),
            prefix.clone(),
            "-m".into(),
            self.memory_mb.to_string(),
        ]);
        if self.hugepages {
            args.extend(["--in-memory".into(), "--single-file-segments".into()]);
        } else {
            args.extend(["--no-huge".into(), "--no-shconf".into()]);
        }
        for v in &self.vdevs {
            args.extend(["--vdev".into(), v.clone()]);
        }
        args.push("--".into());
        if self.interactive {
            args.push("-i".into());
        }
        args.extend(self.app_args.iter().cloned());
        let log = PathBuf::from(format!("/tmp/{prefix}.log"));
        let name = format!("testpmd {role}");
        let program = if self.netns.is_some() { "ip" } else { "stdbuf" };
        let mut proc = if self.interactive {
            Proc::spawn_interactive(&name, program, &args, &log, self.limit)?
        } else {
            Proc::spawn(&name, program, &args, &log, self.limit)?
        };
        proc.remove_on_drop(format!("/var/run/dpdk/{prefix}"));
        Ok(TestPmd { proc, prefix })
    }
}

/// A running testpmd.
#[derive(Debug)]
pub struct TestPmd {
    /// The process guard.
    pub proc: Proc,
    prefix: String,
}

impl TestPmd {
    /// Waits until forwarding has started.
    pub fn wait_started(&mut self, limit: Duration) -> Result<(), String> {
        if self.proc.wait_for_output("packet forwarding - ports=", limit) {
            Ok(())
        } else {
            Err(format!("testpmd did not start forwarding; its log:\n{}", self.proc.output()))
        }
    }

    /// Sends an interactive command and waits until the output grows by
    /// `expect` (or 10 s pass).
    pub fn command(&mut self, cmd: &str, expect: &str) -> Result<String, String> {
        let before = self.proc.output().len();
        self.proc.send_line(cmd).map_err(|e| format!("testpmd {cmd}: {e}"))?;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let out = self.proc.output();
            if out.len() > before && out[before..].contains(expect) {
                return Ok(out[before..].to_string());
            }
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "testpmd did not answer {cmd:?} with {expect:?}:\n{}",
                    &out[before.min(out.len())..]
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the interactive prompt.
    pub fn wait_prompt(&mut self, limit: Duration) -> Result<(), String> {
        if self.proc.wait_for_output("testpmd> ", limit) {
            Ok(())
        } else {
            Err(format!("no testpmd prompt; its log:\n{}", self.proc.output()))
        }
    }

    /// Stops it with SIGINT and returns everything it printed.
    pub fn finish(&mut self) -> String {
        self.proc.stop();
        self.proc.output()
    }

    /// Its file prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

/// The MAC spate's benchmarks give the receiving side.
pub const SPATE_MAC: &str = "02:53:50:41:54:45";

/// The arguments every `txonly` source here starts from: `frame`-byte UDP
/// frames from 198.18.0.1:9 to 198.18.0.2:9 and [`SPATE_MAC`], one
/// forwarding core. Each source adds its rings, pool and reporting.
pub fn txonly_args(frame: usize) -> Vec<String> {
    vec![
        "--forward-mode=txonly".into(),
        format!("--txpkts={frame}"),
        format!("--eth-peer=0,{SPATE_MAC}"),
        "--tx-ip=198.18.0.1,198.18.0.2".into(),
        "--tx-udp=9,9".into(),
        "--nb-cores=1".into(),
    ]
}

/// dpdk-testpmd `txonly` serving `net_vhost` at `sock`: UDP frames of
/// `frame` bytes from 198.18.0.1:9 to 198.18.0.2:9 and [`SPATE_MAC`], one
/// forwarding core on CPU 0 (main lcore 1). Interactive, it sends from
/// `start` to `stop` and then reports the exact count while the link stays
/// up; otherwise it starts at once and prints rates every second.
pub fn txonly_source(sock: &Path, frame: usize, limit: Duration, interactive: bool) -> TestPmd {
    txonly_source_on_queues(sock, frame, 1, limit, interactive)
}

/// A `dpdk-testpmd txonly` source of `frame`-byte UDP frames to
/// 198.18.0.2:9 (spate's MAC) on a TAP device `iface` it creates in `ns`,
/// sending from its start: frames the kernel of `ns` receives once the
/// device has the address (a kernel receiver's source). The kernel's
/// receive path runs inside testpmd's writes, as its system time.
pub fn txonly_tap_source(ns: &crate::Netns, iface: &str, frame: usize, limit: Duration) -> TestPmd {
    // The device exists once testpmd forwards (its port started first).
    txonly_kernel_source(ns, &format!("net_tap0,iface={iface}"), frame, limit, "tap-src")
}

/// A `dpdk-testpmd txonly` source of `frame`-byte UDP frames to
/// 198.18.0.2:9 (spate's MAC) through `net_af_packet` on veth end `iface`
/// of `ns`, sending from its start: the kernel behind the other end
/// receives them in its NET_RX softirq (run on the sending CPU when
/// testpmd's transmit enables bottom halves), as it would from a NIC.
pub fn txonly_veth_source(ns: &crate::Netns, iface: &str, frame: usize, limit: Duration) -> TestPmd {
    txonly_kernel_source(ns, &format!("net_af_packet0,iface={iface}"), frame, limit, "veth-src")
}

/// `txonly` on a kernel-backed `vdev` opened in `ns`, forwarding core on
/// CPU 0, main lcore 1, rates printed every second; returned once it
/// forwards.
fn txonly_kernel_source(ns: &crate::Netns, vdev: &str, frame: usize, limit: Duration, role: &str) -> TestPmd {
    let mut g = TestPmdBuilder::new("0,1", 1)
        .in_netns(ns)
        .vdev(vdev)
        .args(txonly_args(frame))
        .args(["--total-num-mbufs=8192", "--stats-period=1"])
        .limit(limit)
        .spawn(role)
        .unwrap_or_else(|e| panic!("testpmd on {vdev}: {e}"));
    if let Err(e) = g.wait_started(Duration::from_secs(30)) {
        panic!("testpmd on {vdev}: {e}");
    }
    g
}

/// [`txonly_source`] on a vhost-user port of `queues` queues, its one
/// forwarding core sending on each; with more than one queue each frame
/// from another source address (`--txonly-multi-flow`).
pub fn txonly_source_on_queues(
    sock: &Path,
    frame: usize,
    queues: usize,
    limit: Duration,
    interactive: bool,
) -> TestPmd {
    let _ = std::fs::remove_file(sock);
    let b = TestPmdBuilder::new("0,1", 1);
    let b = if interactive { b.interactive() } else { b };
    let mut g = b
        .vdev(&format!("net_vhost0,iface={},queues={queues}", sock.display()))
        .args(txonly_args(frame))
        .args([
            format!("--rxq={queues}"),
            format!("--txq={queues}"),
            "--burst=32".into(),
            "--rxd=1024".into(),
            "--txd=1024".into(),
            "--total-num-mbufs=16384".into(),
        ])
        .args(if queues > 1 { vec!["--txonly-multi-flow".to_string()] } else { vec![] })
        .args(if interactive { vec![] } else { vec!["--stats-period=1".to_string()] })
        .limit(limit)
        .spawn("gen")
        .expect("start the txonly source");
    g.proc.remove_on_drop(sock);
    if interactive {
        g.wait_prompt(Duration::from_secs(30)).expect("source prompt");
    } else {
        g.wait_started(Duration::from_secs(30)).expect("source starts");
    }
    g
}

/// dpdk-testpmd `txonly` as a vhost-user *client* of `sock` (the socket
/// spate's `net_virtio_user` port serves with `server=1`, as OVS's
/// `dpdkvhostuserclient` ports connect): 64-byte frames from 198.18.0.1:9
/// to 198.18.0.2:9 and [`SPATE_MAC`], rates every second. It leaves the
/// socket to its owner.
pub fn txonly_client(sock: &Path, limit: Duration) -> TestPmd {
    let mut g = TestPmdBuilder::new("0,1", 1)
        .vdev(&format!("net_vhost0,iface={},queues=1,client=1", sock.display()))
        .args(txonly_args(64))
        .args(["--rxd=1024", "--txd=1024", "--total-num-mbufs=16384", "--stats-period=1"])
        .limit(limit)
        .spawn("client")
        .expect("start the txonly client");
    g.wait_started(Duration::from_secs(30)).expect("client starts");
    g
}

/// dpdk-testpmd in forwarding mode `mode` (with `extra` arguments) as the
/// `net_virtio_user` client of `sock` (ring of `ring` descriptors,
/// forwarding on CPU 1), counting its busy cycles (`--record-core-cycles`)
/// and printing rates every second; started and forwarding.
pub fn measuring_client(sock: &Path, ring: u16, mode: &str, extra: &[&str], limit: Duration) -> TestPmd {
    let mut pmd = TestPmdBuilder::new("0,1", 0)
        .vdev(&format!("net_virtio_user0,path={},queues=1,queue_size={ring}", sock.display()))
        .args(
            [
                &format!("--forward-mode={mode}"),
                "--record-core-cycles",
                "--nb-cores=1",
                "--burst=32",
                "--rxd=1024",
                "--txd=1024",
                "--total-num-mbufs=16384",
                // Also what keeps it running: without it testpmd waits for
                // Enter, and its stdin is closed.
                "--stats-period=1",
            ]
            .into_iter()
            .chain(extra.iter().copied())
            .map(String::from),
        )
        .limit(limit)
        .spawn(mode)
        .unwrap_or_else(|e| panic!("start testpmd {mode}: {e}"));
    pmd.wait_started(Duration::from_secs(30)).unwrap_or_else(|e| panic!("testpmd {mode}: {e}"));
    pmd
}

/// dpdk-testpmd `rxonly --record-core-cycles` as the `net_virtio_user`
/// client of `sock` (ring of `ring` descriptors, forwarding on CPU 1) for
/// `warmup + seconds`: its mean Rx-pps after the warm-up, its cycles per
/// packet and the TSC rate it counted them with. The ceiling spate is
/// measured against.
pub fn rxonly(sock: &Path, ring: u16, warmup: u64, seconds: u64) -> RxOnly {
    let mut rx = measuring_client(sock, ring, "rxonly", &[], Duration::from_secs(warmup + seconds + 60));
    std::thread::sleep(Duration::from_secs(warmup + seconds));
    let out = rx.finish();
    let stats = FwdStats::parse(&out).unwrap_or_else(|| panic!("no rxonly stats:\n{out}"));
    let samples: Vec<u64> = pps_samples(&out, "Rx").into_iter().skip(warmup as usize).filter(|&v| v > 0).collect();
    RxOnly {
        pps: samples.iter().sum::<u64>() as f64 / samples.len().max(1) as f64,
        cycles: stats.cycles_per_packet.expect("--record-core-cycles"),
        hz: stats.mhz.map(|m| m * 1e6),
        drop_share: stats.rx_dropped as f64 / (stats.rx + stats.rx_dropped).max(1) as f64,
    }
}

/// What [`rxonly`] measured.
#[derive(Debug, Clone, Copy)]
pub struct RxOnly {
    /// Packets per second received.
    pub pps: f64,
    /// Busy cycles per packet.
    pub cycles: f64,
    /// The TSC rate testpmd reported.
    pub hz: Option<f64>,
    /// Share of what reached the port that it dropped (`RX-dropped` over
    /// `RX-packets` + `RX-dropped`, the whole run).
    pub drop_share: f64,
}

/// What testpmd printed in its final forward statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FwdStats {
    /// Accumulated RX-packets.
    pub rx: u64,
    /// Accumulated RX-dropped (the port's missed and no-mbuf counts).
    pub rx_dropped: u64,
    /// Accumulated TX-packets.
    pub tx: u64,
    /// Accumulated TX-dropped.
    pub tx_dropped: u64,
    /// "CPU cycles/packet", with `--record-core-cycles`.
    pub cycles_per_packet: Option<f64>,
    /// The TSC clock in MHz it reported.
    pub mhz: Option<f64>,
}

impl FwdStats {
    /// Parses the accumulated block and the cycles line of testpmd's output.
    pub fn parse(output: &str) -> Option<FwdStats> {
        let acc = output.rfind("Accumulated forward statistics")?;
        let tail = &output[acc..];
        let field = |name: &str| -> Option<u64> {
            let at = tail.find(name)? + name.len();
            tail[at..].split_whitespace().next()?.parse().ok()
        };
        let mut stats = FwdStats {
            rx: field("RX-packets:")?,
            rx_dropped: field("RX-dropped:").unwrap_or(0),
            tx: field("TX-packets:")?,
            tx_dropped: field("TX-dropped:").unwrap_or(0),
            ..FwdStats::default()
        };
        if let Some(at) = tail.find("CPU cycles/packet=") {
            let rest = &tail[at + "CPU cycles/packet=".len()..];
            stats.cycles_per_packet = rest.split_whitespace().next().and_then(|v| v.parse().ok());
            if let Some(m) = rest.find(" at ") {
                stats.mhz = rest[m + 4..].split_whitespace().next().and_then(|v| v.parse().ok());
            }
        }
        Some(stats)
    }
}

/// The `Rx-pps:` / `Tx-pps:` samples of `--stats-period` output, in order.
pub fn pps_samples(output: &str, which: &str) -> Vec<u64> {
    let key = format!("{which}-pps:");
    output
        .lines()
        .filter_map(|l| {
            let at = l.find(&key)? + key.len();
            l[at..].split_whitespace().next()?.parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "
  Throughput (since last show)
  Rx-pps:     10981269          Rx-bps:   5271009240
  Tx-pps:     10981045          Tx-bps:   5270901736
  +++++++++++++++ Accumulated forward statistics for all ports+++++++++++++++
  RX-packets: 77110368       RX-dropped: 512           RX-total: 77110880
  TX-packets: 77108896       TX-dropped: 1472          TX-total: 77110368
  ++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++

  CPU cycles/packet=106.93 (total cycles=8245549621 / total io packets=77110368) at 2300 MHz Clock
";

    #[test]
    fn parses_forward_stats() {
        let s = FwdStats::parse(SAMPLE).unwrap();
        assert_eq!((s.rx, s.tx, s.tx_dropped), (77110368, 77108896, 1472));
        assert_eq!(s.rx_dropped, 512);
        assert_eq!(s.cycles_per_packet, Some(106.93));
        assert_eq!(s.mhz, Some(2300.0));
        assert_eq!(pps_samples(SAMPLE, "Rx"), vec![10981269]);
        assert!(FwdStats::parse("no stats").is_none());
    }
}

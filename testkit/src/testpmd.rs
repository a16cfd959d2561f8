//! `dpdk-testpmd` as a peer and as the reference a benchmark compares with.

use std::path::PathBuf;
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
        }
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
        let mut args = vec![
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
        ];
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
        let mut proc = if self.interactive {
            Proc::spawn_interactive(&name, "stdbuf", &args, &log, self.limit)?
        } else {
            Proc::spawn(&name, "stdbuf", &args, &log, self.limit)?
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

/// What testpmd printed in its final forward statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FwdStats {
    /// Accumulated RX-packets.
    pub rx: u64,
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
  RX-packets: 77110368       RX-dropped: 0             RX-total: 77110368
  TX-packets: 77108896       TX-dropped: 1472          TX-total: 77110368
  ++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++

  CPU cycles/packet=106.93 (total cycles=8245549621 / total io packets=77110368) at 2300 MHz Clock
";

    #[test]
    fn parses_forward_stats() {
        let s = FwdStats::parse(SAMPLE).unwrap();
        assert_eq!((s.rx, s.tx, s.tx_dropped), (77110368, 77108896, 1472));
        assert_eq!(s.cycles_per_packet, Some(106.93));
        assert_eq!(s.mhz, Some(2300.0));
        assert_eq!(pps_samples(SAMPLE, "Rx"), vec![10981269]);
        assert!(FwdStats::parse("no stats").is_none());
    }
}

//! spate-stat: a running stack seen from outside, through its control
//! endpoint: counters by Linux's names (as `nstat`), sockets (as `ss -u`),
//! lcores, ports, neighbours, path MTUs and memory; `--json` for all of
//! it; `-i SECS` for deltas every SECS.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use clap::Parser;
use spate::control::{Client, Snapshot};

/// Command line of spate-stat.
#[derive(Debug, Parser)]
#[command(name = "spate-stat", version, about = "Counters, sockets, lcores, ports and tables of a running spate stack")]
pub struct StatArgs {
    /// Which stack.
    #[command(flatten)]
    pub target: crate::cli::TargetArgs,
    /// One JSON object (a line each interval with -i).
    #[arg(long)]
    pub json: bool,
    /// Every SECS seconds, what changed (counters and lcores as deltas).
    #[arg(short = 'i', long = "interval", value_name = "SECS")]
    pub interval: Option<f64>,
    /// Intervals to print with -i (0: until interrupted).
    #[arg(short = 'c', long, value_name = "N", default_value_t = 0)]
    pub count: u64,
    /// Counters that are zero too.
    #[arg(short = 'a', long)]
    pub all: bool,
}

/// Runs spate-stat; returns the process exit code.
pub fn main(args: StatArgs) -> i32 {
    if let Err(e) = spate::dpdk::signal::install_stop_handlers() {
        eprintln!("spate-stat: cannot install signal handlers: {e}");
        return 1;
    }
    match run(&args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("spate-stat: {e}");
            1
        }
    }
}

fn run(args: &StatArgs) -> std::io::Result<()> {
    let path = args.target.endpoint()?;
    let mut client = Client::connect(&path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            std::io::Error::new(e.kind(), format!("{}: {e} (its owner and root only)", path.display()))
        } else {
            std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
        }
    })?;
    let mut prev = client.snapshot()?;
    let Some(secs) = args.interval else {
        if args.json {
            println!("{}", serde_json::to_string(&prev).map_err(std::io::Error::other)?);
        } else {
            print!("{}", render(&prev, None, args.all));
        }
        return Ok(());
    };
    let step = Duration::from_secs_f64(secs.max(0.01));
    let mut shown = 0u64;
    while args.count == 0 || shown < args.count {
        let until = Instant::now() + step;
        while Instant::now() < until {
            if spate::dpdk::signal::stop_requested() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20).min(step));
        }
        let now = client.snapshot()?;
        if args.json {
            let d = Delta::new(&prev, &now);
            let v = serde_json::json!({ "interval_secs": d.secs, "deltas": d.counters, "lcores": d.lcores, "snapshot": now });
            println!("{v}");
        } else {
            print!("{}", render(&now, Some(&prev), args.all));
        }
        prev = now;
        shown += 1;
    }
    Ok(())
}

/// What changed between two snapshots.
struct Delta {
    secs: f64,
    counters: std::collections::BTreeMap<String, u64>,
    lcores: Vec<serde_json::Value>,
}

impl Delta {
    fn new(prev: &Snapshot, now: &Snapshot) -> Delta {
        let cycles = now.info.tsc.wrapping_sub(prev.info.tsc).max(1);
        let secs = cycles as f64 / now.info.tsc_hz.max(1) as f64;
        let counters = now
            .counters
            .iter()
            .map(|(k, v)| (k.clone(), v.wrapping_sub(prev.counters.get(k).copied().unwrap_or(0))))
            .collect();
        let lcores = now
            .lcores
            .iter()
            .zip(&prev.lcores)
            .map(|(n, p)| {
                let busy = n.busy_cycles.wrapping_sub(p.busy_cycles);
                let dgrams = n.datagrams.wrapping_sub(p.datagrams);
                serde_json::json!({
                    "lcore": n.lcore,
                    "busy_share": busy as f64 / cycles as f64,
                    "cycles_per_datagram": if dgrams > 0 { busy as f64 / dgrams as f64 } else { 0.0 },
                    "datagrams": dgrams,
                    "rx_frames": n.rx_frames.wrapping_sub(p.rx_frames),
                })
            })
            .collect();
        Delta { secs, counters, lcores }
    }
}

/// The text form: with `prev`, counters and lcores over the interval.
fn render(s: &Snapshot, prev: Option<&Snapshot>, all: bool) -> String {
    let mut out = String::new();
    let i = &s.info;
    let _ = writeln!(
        out,
        "spate {} pid {}{} stack {}, {}",
        i.version,
        i.pid,
        i.name.as_deref().map(|n| format!(" name {n}")).unwrap_or_default(),
        i.id,
        if i.running { "polling" } else { "not polling" }
    );
    for f in &i.interfaces {
        let _ = writeln!(out, "  if{} {} {} mtu {} {}", f.index, f.name, f.mac, f.mtu, f.addrs.join(" "));
    }
    let delta = prev.map(|p| Delta::new(p, s));
    match &delta {
        Some(d) => {
            let _ = writeln!(out, "#counters over {:.2} s (delta, per second)", d.secs);
            for (k, v) in d.counters.iter().filter(|(_, v)| all || **v > 0) {
                let _ = writeln!(out, "{k:<32} {v:>14} {:>14.1}", *v as f64 / d.secs.max(1e-9));
            }
        }
        None => {
            let _ = writeln!(out, "#counters");
            for (k, v) in s.counters.iter().filter(|(_, v)| all || **v > 0) {
                let _ = writeln!(out, "{k:<32} {v:>14}");
            }
        }
    }
    let _ = writeln!(
        out,
        "#lcores\n{:<6} {:<6} {:>8} {:>16} {:>14} {:>14}",
        "index", "lcore", "busy", "cycles/dgram", "rx frames", "datagrams"
    );
    for (k, l) in s.lcores.iter().enumerate() {
        let (busy, per, frames, dgrams) = match &delta {
            Some(d) => {
                let v = &d.lcores[k];
                (
                    v["busy_share"].as_f64().unwrap_or(0.0),
                    v["cycles_per_datagram"].as_f64().unwrap_or(0.0),
                    v["rx_frames"].as_u64().unwrap_or(0),
                    v["datagrams"].as_u64().unwrap_or(0),
                )
            }
            None => {
                let per = if l.datagrams > 0 { l.busy_cycles as f64 / l.datagrams as f64 } else { 0.0 };
                (f64::NAN, per, l.rx_frames, l.datagrams)
            }
        };
        let busy = if busy.is_nan() { "-".to_string() } else { format!("{:.1}%", busy * 100.0) };
        let _ = writeln!(out, "{:<6} {:<6} {busy:>8} {per:>16.1} {frames:>14} {dgrams:>14}", l.index, l.lcore);
    }
    let _ = writeln!(
        out,
        "#sockets\n{:<6} {:<5} {:<40} {:<40} {:>8} {:>10} {:>10} {:>8} {:>8} {:>5}",
        "id", "fam", "local", "peer", "queued", "bytes", "rcvbuf", "drops", "wakeups", "group"
    );
    for k in &s.sockets {
        let fam = match (k.family.as_str(), k.v6only) {
            ("ipv6", false) => "dual",
            ("ipv6", true) => "ipv6",
            _ => "ipv4",
        };
        let _ = writeln!(
            out,
            "{:<6} {fam:<5} {:<40} {:<40} {:>8} {:>10} {:>10} {:>8} {:>8} {:>5}{}",
            k.id,
            k.local,
            k.peer.as_deref().unwrap_or("*"),
            k.queued,
            k.queued_bytes,
            k.rcvbuf,
            k.drops,
            k.reader_wakeups,
            k.reuseport_group.map(|g| g.to_string()).unwrap_or_else(|| "-".into()),
            if k.tunnel { " (tunnel)" } else { "" }
        );
        if let Some(d) = &k.read_delay {
            let _ = writeln!(out, "       read delay: {}", delay_line(d));
        }
    }
    let _ = writeln!(out, "#ports");
    for p in &s.ports {
        let stats: Vec<String> = p.stats.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(
            out,
            "if{} {} link {}{} {}",
            p.index,
            p.name,
            if p.link_up { "up" } else { "down" },
            if p.speed_mbps > 0 { format!(" {} Mbit/s", p.speed_mbps) } else { String::new() },
            stats.join(" ")
        );
        let xs: Vec<String> =
            p.xstats.iter().filter(|(_, v)| all || **v > 0).map(|(k, v)| format!("{k}={v}")).collect();
        if !xs.is_empty() {
            let _ = writeln!(out, "  xstats {}", xs.join(" "));
        }
    }
    let _ = writeln!(out, "#neighbors");
    for n in &s.neighbors {
        let _ = writeln!(
            out,
            "{} dev if{} lladdr {} {}{}",
            n.ip,
            n.iface,
            n.mac.as_deref().unwrap_or("-"),
            n.state,
            if n.waiting > 0 { format!(" ({} waiting)", n.waiting) } else { String::new() }
        );
    }
    let _ = writeln!(out, "#path mtus");
    for m in &s.path_mtus {
        let _ = writeln!(out, "{} mtu {} expires {:.0}s", m.dst, m.mtu, m.expires_secs);
    }
    let m = &s.memory;
    let _ = writeln!(
        out,
        "#memory\nmbufs {} of {} in use; receive queues {} of {} bytes; reassembly {} bytes",
        m.mbufs_in_use, m.mbufs, m.receive_bytes, m.receive_limit, m.reassembly_bytes
    );
    if let Some(c) = &s.capture {
        let _ = writeln!(
            out,
            "#capture
attached: snaplen {}, {} frames captured, {} dropped",
            c.snaplen, c.captured, c.dropped
        );
    }
    out
}

/// A read-delay histogram in a line: reads, mean, and the bounds under
/// which half, 99% and all of them fell.
fn delay_line(d: &spate::control::DelayInfo) -> String {
    if d.count == 0 {
        return "no reads yet".into();
    }
    let bound = |q: f64| match d.quantile_bound_ns(q) {
        Some(ns) => format!("< {}", duration(ns)),
        None => format!(">= {}", duration(d.buckets.iter().rev().find_map(|(b, _)| *b).unwrap_or(0))),
    };
    format!(
        "{} reads, mean {}, p50 {}, p99 {}, max {}",
        d.count,
        duration(d.sum_ns / d.count),
        bound(0.5),
        bound(0.99),
        bound(1.0)
    )
}

/// Nanoseconds as ns, us, ms or s.
fn duration(ns: u64) -> String {
    match ns {
        0..1_000 => format!("{ns} ns"),
        1_000..1_000_000 => format!("{:.1} us", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} ms", ns as f64 / 1e6),
        _ => format!("{:.2} s", ns as f64 / 1e9),
    }
}

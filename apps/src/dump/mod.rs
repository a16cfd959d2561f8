//! spate-dump: capture a running stack's frames to a pcapng file, as
//! `tcpdump -w` does for a kernel interface. It attaches a capture through
//! the stack's control endpoint (see `spate::control::Capture`): the
//! stack's lcores copy the frames they receive and send, those the filter
//! keeps, and spate-dump writes them with their direction, interface and
//! nanosecond timestamps; what the capture dropped goes into the file's
//! interface statistics and onto standard error at the end.

use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use spate::control::{CaptureRequest, Client, Message};

mod libpcap_ffi;
pub mod pcapng;

/// Command line of spate-dump.
#[derive(Debug, Parser)]
#[command(name = "spate-dump", version, about = "Capture a running spate stack's frames to a pcapng file")]
pub struct DumpArgs {
    /// Which stack.
    #[command(flatten)]
    pub target: crate::cli::TargetArgs,
    /// The pcapng file to write (`-` for standard output).
    #[arg(short = 'w', value_name = "FILE")]
    pub write: PathBuf,
    /// Stop after this many frames.
    #[arg(short = 'c', value_name = "COUNT")]
    pub count: Option<u64>,
    /// Bytes of each frame to keep (1 to 65,535).
    #[arg(short = 's', long = "snaplen", value_name = "SNAPLEN", default_value_t = 65_535)]
    pub snaplen: u32,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Only this interface (its index or name, as `spate-stat` lists them).
    #[arg(short = 'i', long = "interface", value_name = "IFACE")]
    pub iface: Option<String>,
    /// Records each lcore may have waiting for the writer.
    #[arg(long, value_name = "N")]
    pub records: Option<usize>,
    /// A filter in tcpdump's language (`udp port 7000 and host
    /// 198.18.0.1`), compiled with libpcap.
    #[arg(value_name = "FILTER", trailing_var_arg = true)]
    pub filter: Vec<String>,
}

/// Runs spate-dump; returns the process exit code.
pub fn main(args: DumpArgs) -> i32 {
    if let Err(e) = spate::dpdk::signal::install_stop_handlers() {
        eprintln!("spate-dump: cannot install signal handlers: {e}");
        return 1;
    }
    match run(&args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("spate-dump: {e}");
            1
        }
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

fn run(args: &DumpArgs) -> Result<(), String> {
    let snaplen = args.snaplen;
    if snaplen == 0 || snaplen > 65_535 {
        return Err(format!("-s {snaplen}: 1 to 65,535"));
    }
    if args.count == Some(0) {
        return Err("-c 0: at least one frame".into());
    }
    if let Some(d) = args.duration.filter(|d| !d.is_finite() || *d <= 0.0 || *d > 1e9) {
        return Err(format!("--duration {d}: a number of seconds above 0"));
    }
    let expr = args.filter.join(" ");
    let filter = if expr.trim().is_empty() {
        None
    } else {
        Some(libpcap_ffi::compile(&expr, snaplen).map_err(|e| format!("filter {expr:?}: {e}"))?)
    };
    let path = args.target.endpoint().map_err(|e| e.to_string())?;
    let mut client = Client::connect(&path).map_err(|e| {
        let only = if e.kind() == std::io::ErrorKind::PermissionDenied { " (its owner and root only)" } else { "" };
        format!("{}: {e}{only}", path.display())
    })?;
    let iface = match &args.iface {
        None => None,
        Some(want) => {
            let info = client.info().map_err(|e| e.to_string())?;
            let found = info.interfaces.iter().find(|i| i.name == *want || i.index.to_string() == *want);
            Some(found.ok_or_else(|| format!("no interface {want} (spate-stat lists them)"))?.index)
        }
    };
    let req = CaptureRequest { snaplen: Some(snaplen), filter, iface, records: args.records };
    let (start, mut capture) = client.capture(req).map_err(|e| format!("{}: {e}", path.display()))?;

    let out: Box<dyn Write> = if args.write.as_os_str() == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(std::fs::File::create(&args.write).map_err(|e| format!("{}: {e}", args.write.display()))?)
    };
    let ifaces: Vec<pcapng::Iface> = start
        .interfaces
        .iter()
        .map(|i| pcapng::Iface {
            name: i.name.clone(),
            description: format!("spate interface {} ({}, MTU {}, {})", i.index, i.mac, i.mtu, i.addrs.join(" ")),
        })
        .collect();
    let mut file = pcapng::Writer::new(BufWriter::with_capacity(1 << 20, out), "spate-dump", &ifaces, start.snaplen)
        .map_err(|e| e.to_string())?;
    let started = now_ns();
    eprintln!(
        "spate-dump: capturing from {}{}, snaplen {}",
        path.display(),
        if expr.is_empty() { String::new() } else { format!(", filter {expr:?}") },
        start.snaplen
    );

    // Signals and the duration end the capture from a thread of their own:
    // the stack answers with what its lcores copied so far and the last
    // counts.
    let stopper = capture.stopper().map_err(|e| e.to_string())?;
    let done = Arc::new(AtomicBool::new(false));
    let until = args.duration.map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    let watch = {
        let done = done.clone();
        std::thread::spawn(move || {
            while !done.load(Ordering::Acquire) {
                if spate::dpdk::signal::stop_requested() || until.is_some_and(|u| Instant::now() >= u) {
                    let _ = stopper.stop();
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let mut written = 0u64;
    let mut per_iface = vec![0u64; ifaces.len()];
    let mut last = None;
    let mut asked_stop = false;
    let result = loop {
        match capture.next_message() {
            Ok(Some(Message::Frame { iface, outbound, wire_len, time_ns, data })) => {
                if args.count.is_some_and(|c| written >= c) {
                    continue;
                }
                if let Err(e) = file.frame(iface as u32, time_ns, wire_len, &data, outbound) {
                    break Err(format!("{}: {e}", args.write.display()));
                }
                if let Some(n) = per_iface.get_mut(iface as usize) {
                    *n += 1;
                }
                written += 1;
                if args.count.is_some_and(|c| written >= c) && !asked_stop {
                    asked_stop = true;
                    let _ = capture.stopper().and_then(|s| s.stop());
                }
            }
            Ok(Some(Message::Counts { captured, dropped, last: end })) => {
                last = Some((captured, dropped));
                if end {
                    break Ok(());
                }
                // Every 200 ms: a reader of the file (`-w - | tcpdump -r -`)
                // sees the frames so far.
                if let Err(e) = file.flush() {
                    break Err(format!("{}: {e}", args.write.display()));
                }
            }
            Ok(None) => break Err("the stack closed the capture (it stopped?)".into()),
            Err(e) => break Err(format!("reading the capture: {e}")),
        }
    };
    done.store(true, Ordering::Release);
    let _ = watch.join();
    let ended = now_ns();
    let (captured, dropped) = last.unwrap_or((written, 0));
    for (i, n) in per_iface.iter().enumerate() {
        // The drops are the capture's, over all interfaces: said once.
        let (d, comment) = if i == 0 {
            (Some(dropped), format!("spate capture: {captured} frames copied, {dropped} dropped (all interfaces)"))
        } else {
            (None, String::new())
        };
        if let Err(e) = file.stats(i as u32, started, ended, *n, d, &comment) {
            return Err(format!("{}: {e}", args.write.display()));
        }
    }
    file.finish().map_err(|e| format!("{}: {e}", args.write.display()))?;
    eprintln!("spate-dump: {written} frames written; the stack copied {captured}, dropped {dropped}");
    result
}

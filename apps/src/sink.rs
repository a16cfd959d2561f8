//! spate-sink: receives UDP datagrams on one port and throws them away,
//! after reading every payload byte of every datagram it counts. The
//! datagrams are consumed run-to-completion on the polling lcores
//! (`--reader lcore`) or by one application thread per socket
//! (`--reader thread`). Each interval it reports what arrived, what was
//! dropped and why, and what each datagram cost in CPU.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use spate::dpdk::lcore::{self, ThreadClock};
use spate::{Counter, DatagramBatch, LcoreCtx, Stack, UdpSocket};

use crate::cli::{self, StackArgs};
use crate::report::{self, Sample};

/// Who consumes the datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Reader {
    /// The polling lcores, in their run-to-completion callback.
    Lcore,
    /// One application thread per socket, blocked in `recv_batch`.
    Thread,
}

/// Command line of spate-sink.
#[derive(Debug, Parser)]
#[command(name = "spate-sink", version, about = "A UDP sink on spate: counts, reads and drops datagrams")]
pub struct SinkArgs {
    /// Devices, addresses, lcores.
    #[command(flatten)]
    pub stack: StackArgs,
    /// The UDP port to receive on (9, where dpdk-testpmd's txonly sends).
    #[arg(long, default_value_t = 9)]
    pub port: u16,
    /// Receive on a reuseport group of this many sockets.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub sockets: u16,
    /// Who reads the datagrams.
    #[arg(long, value_enum, default_value_t = Reader::Lcore)]
    pub reader: Reader,
    /// Each socket's receive buffer in bytes (default: the stack's, 212992).
    #[arg(long, value_name = "BYTES")]
    pub rcvbuf: Option<usize>,
    /// Reader threads nap this many µs on an empty socket before asking to
    /// be woken (the stack's `reader_nap_us`; 0 asks at once).
    #[arg(long, value_name = "US", default_value_t = 20)]
    pub reader_nap: u32,
    /// Pin reader threads to these CPUs (`0`, `0-1`; default: any CPU).
    #[arg(long, value_name = "LIST")]
    pub reader_cpus: Option<String>,
    /// Seconds between reports (0: none).
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Reports and the summary as JSON, one object per line.
    #[arg(long)]
    pub json: bool,
    /// Verify every payload as `spate_apps::check` writes them (sequence
    /// number, hash of the rest) and count the intact and the corrupted.
    #[arg(long)]
    pub check: bool,
}

/// What `--check` found.
#[derive(Debug, Default)]
struct Checked {
    intact: AtomicU64,
    corrupted: AtomicU64,
}

/// Reads every payload byte of `d` (all its segments); with `check`, also
/// verifies it (copied into `scratch` when it is not contiguous).
#[inline]
fn consume(d: &spate::Datagram, check: Option<&Checked>, scratch: &mut Vec<u8>) -> u64 {
    let sum = d.segments().fold(0u64, |acc, s| acc.wrapping_add(read_every_byte(s)));
    if let Some(c) = check {
        let ok = if d.is_contiguous() {
            crate::check::verify(d.data()).is_some()
        } else {
            scratch.resize(d.len(), 0);
            d.copy_to(scratch);
            crate::check::verify(scratch).is_some()
        };
        let counter = if ok { &c.intact } else { &c.corrupted };
        counter.fetch_add(1, Ordering::Relaxed);
    }
    sum
}

/// Datagrams taken per receive call.
const BATCH: usize = 64;

/// Runs spate-sink; returns the process exit code.
pub fn main(args: SinkArgs) -> i32 {
    cli::init_logging();
    if let Err(e) = spate::dpdk::signal::install_stop_handlers() {
        eprintln!("spate-sink: cannot install signal handlers: {e}");
        return 1;
    }
    match run(&args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("spate-sink: {e}");
            1
        }
    }
}

/// The reader threads' CPU clocks, and what finished threads used.
#[derive(Debug, Default)]
struct ReaderCpu {
    clocks: Mutex<Vec<ThreadClock>>,
    finished_ns: AtomicU64,
}

impl ReaderCpu {
    fn ns(&self) -> u64 {
        let clocks = self.clocks.lock().unwrap_or_else(|p| p.into_inner());
        clocks.iter().filter_map(ThreadClock::ns).sum::<u64>() + self.finished_ns.load(Ordering::Acquire)
    }

    /// Moves the calling thread from the live clocks to the finished sum,
    /// in one step so no reading counts it twice or not at all.
    fn finish(&self) {
        let mut clocks = self.clocks.lock().unwrap_or_else(|p| p.into_inner());
        if let Ok(me) = ThreadClock::current() {
            clocks.retain(|c| *c != me);
        }
        self.finished_ns.fetch_add(lcore::thread_cpu_ns(), Ordering::AcqRel);
    }
}

/// Reads every payload byte, eight at a time.
#[inline]
fn read_every_byte(data: &[u8]) -> u64 {
    let mut chunks = data.chunks_exact(8);
    let mut acc = 0u64;
    for c in &mut chunks {
        acc = acc.wrapping_add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
    }
    chunks.remainder().iter().fold(acc, |a, &b| a.wrapping_add(b as u64))
}

fn run(args: &SinkArgs) -> Result<(), Box<dyn std::error::Error>> {
    let mut cfg = args.stack.to_config()?;
    if args.reader == Reader::Thread {
        cfg.reader_nap_us = args.reader_nap;
    }
    let reader_cpus = match &args.reader_cpus {
        Some(list) => spate::config::parse_lcores(list)?.into_iter().map(|c| c as usize).collect(),
        None => Vec::new(),
    };
    let stack = Stack::new(cfg)?;
    let mut sockets = Vec::new();
    for _ in 0..args.sockets {
        let mut b = UdpSocket::builder(&stack).reuseport(args.sockets > 1);
        if let Some(bytes) = args.rcvbuf {
            b = b.recv_buffer_size(bytes);
        }
        let sock = b.bind(("::", args.port))?;
        args.stack.join_groups(&sock)?;
        match args.reader {
            Reader::Lcore => sock.set_nonblocking(true)?,
            Reader::Thread => sock.set_read_timeout(Some(Duration::from_millis(100)))?,
        }
        sockets.push(sock);
    }
    let sockets = Arc::new(sockets);
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..sockets.len()).map(|_| AtomicU64::new(0)).collect());
    let cpu = Arc::new(ReaderCpu::default());
    let stop = Arc::new(AtomicBool::new(false));
    let checked: Option<Arc<Checked>> = args.check.then(|| Arc::new(Checked::default()));
    announce(args, &stack);

    let mut readers = Vec::new();
    if args.reader == Reader::Thread {
        for i in 0..sockets.len() {
            let (socks, counts, cpu, stop, pin, check) =
                (sockets.clone(), counts.clone(), cpu.clone(), stop.clone(), reader_cpus.clone(), checked.clone());
            readers.push(std::thread::Builder::new().name(format!("sink-reader-{i}")).spawn(move || {
                // Threads inherit the EAL main lcore's pinning: undo it.
                let _ = if pin.is_empty() { lcore::unpin_current_thread() } else { lcore::set_affinity(&pin) };
                if let Ok(c) = ThreadClock::current() {
                    cpu.clocks.lock().unwrap_or_else(|p| p.into_inner()).push(c);
                }
                let s = &socks[i];
                let mut batch = DatagramBatch::with_capacity(BATCH);
                let mut sum = 0u64;
                let mut scratch = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(n) = s.recv_batch(&mut batch, BATCH) {
                        for d in batch.iter() {
                            sum = sum.wrapping_add(consume(d, check.as_deref(), &mut scratch));
                        }
                        counts[i].fetch_add(n as u64, Ordering::Relaxed);
                        batch.clear();
                    }
                }
                cpu.finish();
                std::hint::black_box(sum)
            })?);
        }
    }

    let hz = stack.tsc_hz() as f64;
    let json = args.json;
    let reporter = (args.interval > 0.0).then(|| {
        let cpu = cpu.clone();
        let mut prev_cpu = cpu.ns();
        report::print_every(stack.clone(), Duration::from_secs_f64(args.interval), move |prev, now| {
            let reader_ns = cpu.ns();
            let line = Report::new(prev, now, reader_ns - prev_cpu, hz);
            prev_cpu = reader_ns;
            if json { line.json() } else { line.text(prev, now) }
        })
    });

    let (socks, cnts, chk) = (sockets.clone(), counts.clone(), checked.clone());
    let reader = args.reader;
    stack.run(move |_| {
        let socks = socks.clone();
        let counts = cnts.clone();
        let check = chk.clone();
        let mut scratch = Vec::new();
        let by_id: HashMap<u64, usize> = socks.iter().enumerate().map(|(i, s)| (s.id(), i)).collect();
        let mut batch = DatagramBatch::with_capacity(BATCH);
        let mut sum = 0u64;
        move |ctx: &mut LcoreCtx<'_>| {
            if reader == Reader::Thread {
                return;
            }
            // This burst's datagrams where the lcore staged them, then the
            // sockets with queued ones.
            ctx.recv_staged(|id, staged| {
                let n = staged.len();
                // Into the batch, so that the mbufs are freed in bulk.
                staged.move_to(&mut batch);
                for d in batch.iter() {
                    sum = sum.wrapping_add(consume(d, check.as_deref(), &mut scratch));
                }
                counts[by_id[&id]].fetch_add(n as u64, Ordering::Relaxed);
                batch.clear();
            });
            for id in ctx.ready() {
                let i = by_id[id];
                while let Ok(n) = socks[i].recv_batch(&mut batch, BATCH) {
                    for d in batch.iter() {
                        sum = sum.wrapping_add(consume(d, check.as_deref(), &mut scratch));
                    }
                    counts[i].fetch_add(n as u64, Ordering::Relaxed);
                    batch.clear();
                }
            }
            std::hint::black_box(sum);
        }
    })?;
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        let _ = r.join();
    }
    if let Some(r) = reporter {
        r.finish();
    }
    let per_socket: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    let c = stack.counters();
    if json {
        let drops: serde_json::Map<String, serde_json::Value> =
            report::drop_counts(&c).into_iter().map(|(k, v)| (k, v.into())).collect();
        println!(
            "{}",
            serde_json::json!({
                "summary": true,
                "consumed": per_socket.iter().sum::<u64>(),
                "per_socket": per_socket,
                "rx_frames": c[Counter::RxFrames],
                "delivered": c[Counter::RxDelivered],
                "drops": drops,
                "reader_cpu_ns": cpu.ns(),
                "mbufs_in_use": stack.mempool().in_use(),
                "check_intact": checked.as_ref().map(|c| c.intact.load(Ordering::Relaxed)),
                "check_corrupted": checked.as_ref().map(|c| c.corrupted.load(Ordering::Relaxed)),
            })
        );
    } else {
        println!("{}", report::summary(&stack));
        let words: Vec<String> = per_socket.iter().enumerate().map(|(i, n)| format!("{i}={n}")).collect();
        println!("Consumed: {} (sockets {})", per_socket.iter().sum::<u64>(), words.join(" "));
        if let Some(c) = &checked {
            println!(
                "Checked: intact={} corrupted={}",
                c.intact.load(Ordering::Relaxed),
                c.corrupted.load(Ordering::Relaxed)
            );
        }
    }
    Ok(())
}

/// One interval's figures.
struct Report {
    secs: f64,
    rx: u64,
    delivered: u64,
    busy_cycles: u64,
    reader_ns: u64,
    hz: f64,
    drops: Vec<(String, u64)>,
    ports: Vec<(String, u64)>,
}

impl Report {
    fn new(prev: &Sample, now: &Sample, reader_ns: u64, hz: f64) -> Report {
        let d = now.counters.delta(&prev.counters);
        let ports: Vec<(String, u64)> = prev
            .ports
            .iter()
            .zip(&now.ports)
            .map(|((name, a), (_, b))| (name.clone(), b.ipackets.wrapping_sub(a.ipackets)))
            .collect();
        Report {
            secs: now.at.duration_since(prev.at).as_secs_f64().max(1e-9),
            rx: ports.iter().map(|(_, n)| n).sum(),
            delivered: d[Counter::RxDelivered],
            busy_cycles: now.busy_cycles - prev.busy_cycles,
            reader_ns,
            hz,
            drops: report::drop_counts(&d),
            ports,
        }
    }

    fn busy_cycles_per_dgram(&self) -> f64 {
        self.busy_cycles as f64 / self.delivered.max(1) as f64
    }

    fn cpu_ns_per_dgram(&self) -> f64 {
        (self.busy_cycles as f64 * 1e9 / self.hz + self.reader_ns as f64) / self.delivered.max(1) as f64
    }

    fn text(&self, prev: &Sample, now: &Sample) -> String {
        format!(
            "{} | {:.1} busy cycles/datagram | {:.1} ns CPU/datagram",
            report::line(prev, now),
            self.busy_cycles_per_dgram(),
            self.cpu_ns_per_dgram()
        )
    }

    fn json(&self) -> String {
        let drops: serde_json::Map<String, serde_json::Value> =
            self.drops.iter().map(|(k, v)| (k.clone(), (*v).into())).collect();
        let ports: serde_json::Map<String, serde_json::Value> =
            self.ports.iter().map(|(k, v)| (k.clone(), (*v as f64 / self.secs).round().into())).collect();
        serde_json::json!({
            "secs": self.secs,
            "rx_pps": (self.rx as f64 / self.secs).round(),
            "port_rx_pps": ports,
            "delivered_pps": (self.delivered as f64 / self.secs).round(),
            "delivered": self.delivered,
            "drops": drops,
            "busy_cycles": self.busy_cycles,
            "reader_cpu_ns": self.reader_ns,
            "busy_cycles_per_dgram": self.busy_cycles_per_dgram(),
            "cpu_ns_per_dgram": self.cpu_ns_per_dgram(),
        })
        .to_string()
    }
}

fn announce(args: &SinkArgs, stack: &Stack) {
    let iface = &stack.interfaces()[0];
    let what = format!(
        "spate-sink: port {} on {} (MAC {}), {} socket{}, read by {}, lcores {:?}",
        args.port,
        iface.ipv4.iter().chain(&iface.ipv6).map(|c| c.addr.to_string()).collect::<Vec<_>>().join(" "),
        iface.mac,
        args.sockets,
        if args.sockets == 1 { "" } else { "s" },
        match args.reader {
            Reader::Lcore => "the polling lcores",
            Reader::Thread => "one thread per socket",
        },
        stack.lcores()
    );
    if args.json {
        eprintln!("{what}");
    } else {
        println!("{what}");
    }
}

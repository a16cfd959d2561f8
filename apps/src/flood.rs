//! spate-flood: a UDP traffic generator on spate's own send path. The
//! polling lcores write the datagrams run-to-completion, each into an mbuf
//! of its own, from `--streams` sockets (one source port each), at a fixed
//! rate or as fast as the port takes them. It reports like `iperf -u -c`:
//! an interval line while it runs and a summary at the end, with what the
//! stack could not put on the wire and why.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use spate::{Counter, LcoreCtx, Stack, UdpSocket};

use crate::cli::{self, StackArgs};
use crate::report::{self, Sample};

/// Command line of spate-flood.
#[derive(Debug, Parser)]
#[command(name = "spate-flood", version, about = "A UDP traffic generator on spate's send path")]
pub struct FloodArgs {
    /// Devices, addresses, lcores.
    #[command(flatten)]
    pub stack: StackArgs,
    /// Where to send (`198.18.0.1:9`, `[fd00::1]:9`).
    #[arg(long)]
    pub dst: SocketAddr,
    /// Streams, each from a source port of its own.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub streams: u16,
    /// UDP payload bytes per datagram (18 makes 64-byte frames over IPv4).
    /// The first 8 carry the datagram's sequence number when there is room.
    #[arg(long, default_value_t = 18)]
    pub len: usize,
    /// Datagrams per second in all (0: as fast as the port takes them).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Seconds to send (0: until SIGINT or SIGTERM, or `--count`).
    #[arg(long, default_value_t = 10.0)]
    pub time: f64,
    /// Datagrams to send in all (0: no limit): the flood ends when it
    /// sent them, however long that takes at the rate the machine allows
    /// (and at `--time`, if that comes first).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
    /// Seconds between reports (0: none).
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Self-checking payloads (`spate_apps::check`: sequence number, hash
    /// of the rest), so a receiver can tell corrupted from lost.
    #[arg(long)]
    pub check: bool,
    /// TTL (hop limit) of the datagrams: to a group, its multicast TTL
    /// (1 by default, the link only); to a unicast address, its TTL (64).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=255))]
    pub ttl: Option<u32>,
}

/// Datagrams written per lcore iteration at most.
const BURST: u64 = 32;

/// Runs spate-flood; returns the process exit code.
pub fn main(args: FloodArgs) -> i32 {
    cli::init_logging();
    if let Err(e) = spate::dpdk::signal::install_stop_handlers() {
        eprintln!("spate-flood: cannot install signal handlers: {e}");
        return 1;
    }
    match run(&args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("spate-flood: {e}");
            1
        }
    }
}

fn run(args: &FloodArgs) -> Result<(), Box<dyn std::error::Error>> {
    if args.time < 0.0 || args.interval < 0.0 {
        return Err("--time and --interval cannot be negative".into());
    }
    let stack = Stack::new(args.stack.to_config()?)?;
    let any: SocketAddr = if args.dst.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse()?;
    let mut sockets = Vec::new();
    for _ in 0..args.streams {
        let s = UdpSocket::bind(&stack, any)?;
        s.set_nonblocking(true)?;
        match (args.ttl, args.dst.ip()) {
            (Some(t), IpAddr::V4(g)) if g.is_multicast() => s.set_multicast_ttl_v4(t)?,
            (Some(t), IpAddr::V6(g)) if g.is_multicast() => s.set_multicast_hops_v6(t)?,
            (Some(t), IpAddr::V4(_)) => s.set_ttl(t)?,
            (Some(t), IpAddr::V6(_)) => s.set_unicast_hops_v6(t)?,
            (None, _) => {}
        }
        sockets.push(s);
    }
    if args.check && args.len < crate::check::MIN_LEN {
        return Err(format!("--check needs --len of at least {}", crate::check::MIN_LEN).into());
    }
    // Datagrams that fit one mbuf are written in place; longer ones (sent
    // as IP fragments) are copied from a buffer.
    let in_place = args.len <= (stack.mempool().data_room() as usize).saturating_sub(64);
    let sockets = Arc::new(sockets);
    let sent = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let lcores = stack.lcores().len() as u64;
    println!(
        "spate-flood: {} stream{} to {}, {} byte datagrams, {} for {}",
        args.streams,
        if args.streams == 1 { "" } else { "s" },
        args.dst,
        args.len,
        if args.rate == 0 { "unlimited rate".to_string() } else { format!("{} datagrams/s", args.rate) },
        match (args.count, args.time == 0.0) {
            (0, true) => "until stopped".to_string(),
            (0, false) => format!("{} s", args.time),
            (c, true) => format!("{c} datagrams"),
            (c, false) => format!("{c} datagrams, at most {} s", args.time),
        },
    );
    let start_sample = Sample::take(&stack);
    let reporter = (args.interval > 0.0).then(|| {
        let len = args.len;
        let start = start_sample.at;
        report::print_every(stack.clone(), Duration::from_secs_f64(args.interval), move |prev, now| {
            interval_line(prev, now, start, len)
        })
    });
    let (socks, total, refusals) = (sockets.clone(), sent.clone(), refused.clone());
    let (dst, len, rate, time, check, count) = (args.dst, args.len, args.rate, args.time, args.check, args.count);
    // The lcores with a stream (stream i is lcore i % lcores's), and how
    // many of them have sent their share of `--count`.
    let active = lcores.min(u64::from(args.streams));
    let finished = Arc::new(AtomicU64::new(0));
    stack.run(move |index| {
        let (socks, total, refusals, finished) = (socks.clone(), total.clone(), refusals.clone(), finished.clone());
        // This lcore's share: its streams, its part of the rate and of the count.
        let mine: Vec<usize> = (0..socks.len()).filter(|i| *i as u64 % lcores == index as u64).collect();
        let my_rate = rate / lcores + u64::from((index as u64) < rate % lcores);
        let my_count = count / active + u64::from((index as u64) < count % active);
        let mut done = false;
        let mut start = None;
        let (mut seq, mut next) = (0u64, 0usize);
        let mut scratch = if in_place { Vec::new() } else { vec![0u8; len] };
        // Each lcore numbers its own datagrams, from its index up.
        let lanes = lcores.max(1);
        let first_seq = index as u64;
        move |ctx: &mut LcoreCtx<'_>| {
            if mine.is_empty() || done {
                return;
            }
            if count > 0 && seq >= my_count {
                done = true;
                if finished.fetch_add(1, Ordering::AcqRel) + 1 == active {
                    ctx.stack().stop();
                }
                return;
            }
            let now = ctx.now();
            let t0 = *start.get_or_insert(now);
            let elapsed = now.since(t0).as_secs_f64();
            if time > 0.0 && elapsed >= time {
                ctx.stack().stop();
                return;
            }
            let due = if my_rate == 0 { seq + BURST } else { (elapsed * my_rate as f64) as u64 + 1 };
            let mut n = due.saturating_sub(seq).min(BURST);
            if count > 0 {
                n = n.min(my_count - seq);
            }
            while n > 0 {
                let s = &socks[mine[next]];
                next = (next + 1) % mine.len();
                let number = first_seq + seq * lanes;
                let sent = if in_place {
                    let Ok(mut buf) = s.alloc_send_buf(len) else {
                        refusals.fetch_add(1, Ordering::Relaxed);
                        break;
                    };
                    write_payload(&mut buf, number, check);
                    s.send_buf_to(buf, dst).is_ok()
                } else {
                    write_payload(&mut scratch, number, check);
                    s.send_to(&scratch, dst).is_ok()
                };
                if !sent {
                    refusals.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                seq += 1;
                n -= 1;
                total.fetch_add(1, Ordering::Relaxed);
            }
        }
    })?;
    if let Some(r) = reporter {
        r.finish();
    }
    let end = Sample::take(&stack);
    let d = end.counters.delta(&start_sample.counters);
    let secs = end.at.duration_since(start_sample.at).as_secs_f64().max(1e-9);
    let sent = sent.load(Ordering::Relaxed);
    let lost = d[Counter::NeighQueueDrops] + d[Counter::TxRingFull] + d[Counter::TxNoRoute] + d[Counter::TxNoMbuf];
    println!(
        "[SUM] 0.00-{secs:.2} sec  {}  {}  Sent {sent} datagrams ({:.0} datagrams/sec)",
        bytes(sent * args.len as u64),
        bits(sent * args.len as u64, secs),
        sent as f64 / secs
    );
    println!(
        "[SUM] on the wire {} datagrams; not sent: {} (neighbour queue {}, TX ring full {}, no route {}, no mbuf {}); \
         refused by the socket {}",
        sent.saturating_sub(lost),
        lost,
        d[Counter::NeighQueueDrops],
        d[Counter::TxRingFull],
        d[Counter::TxNoRoute],
        d[Counter::TxNoMbuf],
        refused.load(Ordering::Relaxed)
    );
    println!("{}", report::summary(&stack));
    Ok(())
}

/// The sequence number (and with `check`, the hash and pattern).
fn write_payload(buf: &mut [u8], seq: u64, check: bool) {
    if check {
        crate::check::fill(buf, seq);
    } else if buf.len() >= 8 {
        buf[..8].copy_from_slice(&seq.to_be_bytes());
    }
}

fn interval_line(prev: &Sample, now: &Sample, start: std::time::Instant, len: usize) -> String {
    let d = now.counters.delta(&prev.counters);
    let n = d[Counter::UdpOutDatagrams] + d[Counter::Udp6OutDatagrams];
    let secs = now.at.duration_since(prev.at).as_secs_f64().max(1e-9);
    let from = prev.at.duration_since(start).as_secs_f64();
    let to = now.at.duration_since(start).as_secs_f64();
    format!(
        "[SUM] {from:.2}-{to:.2} sec  {}  {}  {:.0} datagrams/sec  drops {}",
        bytes(n * len as u64),
        bits(n * len as u64, secs),
        n as f64 / secs,
        {
            let s = report::drops(&d);
            if s.is_empty() { "0".to_string() } else { s }
        }
    )
}

/// Bytes the way iperf prints them.
pub fn bytes(n: u64) -> String {
    let n = n as f64;
    if n >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2} GBytes", n / (1024.0 * 1024.0 * 1024.0))
    } else if n >= 1024.0 * 1024.0 {
        format!("{:.2} MBytes", n / (1024.0 * 1024.0))
    } else {
        format!("{:.1} KBytes", n / 1024.0)
    }
}

/// A bit rate the way iperf prints it.
pub fn bits(bytes: u64, secs: f64) -> String {
    let b = bytes as f64 * 8.0 / secs;
    if b >= 1e9 {
        format!("{:.2} Gbits/sec", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.2} Mbits/sec", b / 1e6)
    } else {
        format!("{:.1} Kbits/sec", b / 1e3)
    }
}

//! spate-iperf: iperf 2's UDP test on spate, as server (`-s`) or client
//! (`-c HOST`). The server answers the Debian `iperf` 2 client with the
//! report it prints (bandwidth, jitter, loss); the client drives a Linux
//! `iperf -s -u` the same way. The protocol is in [`wire`].

pub mod wire;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use spate::{DatagramBatch, LcoreCtx, Stack, UdpSocket};

use crate::cli::{self, StackArgs};
use crate::flood::{bits, bytes};
use wire::{Datagram, Report, TestState};

/// Command line of spate-iperf (iperf 2's flags for a UDP test).
#[derive(Debug, Parser)]
#[command(name = "spate-iperf", version, about = "iperf 2's UDP test on spate")]
pub struct IperfArgs {
    /// Devices, addresses, lcores.
    #[command(flatten)]
    pub stack: StackArgs,
    /// Run as a server.
    #[arg(short = 's', long = "server", conflicts_with = "client")]
    pub server: bool,
    /// Run as a client of the server at HOST.
    #[arg(short = 'c', long = "client", value_name = "HOST")]
    pub client: Option<IpAddr>,
    /// UDP (the only test spate-iperf runs; accepted for iperf's sake).
    #[arg(short = 'u', long = "udp")]
    pub udp: bool,
    /// Datagram payload length in bytes.
    #[arg(short = 'l', long = "len", default_value_t = 1470)]
    pub len: usize,
    /// Target bandwidth in bits/s, with k, m or g (`100M`); 0 is unlimited.
    #[arg(short = 'b', long = "bandwidth", default_value = "1M", value_parser = parse_rate)]
    pub bandwidth: u64,
    /// Seconds to send.
    #[arg(short = 't', long = "time", default_value_t = 10.0)]
    pub time: f64,
    /// Server port.
    #[arg(short = 'p', long = "port", default_value_t = 5001)]
    pub port: u16,
}

/// Parses iperf's rates: a number with an optional k, m or g (powers of 10).
fn parse_rate(s: &str) -> Result<u64, String> {
    let (digits, scale) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (
            &s[..i],
            match c.to_ascii_lowercase() {
                'k' => 1e3,
                'm' => 1e6,
                'g' => 1e9,
                _ => return Err(format!("{s:?}: the unit is k, m or g")),
            },
        ),
        _ => (s, 1.0),
    };
    let v: f64 = digits.parse().map_err(|_| format!("{s:?} is not a rate like 100M"))?;
    if !(v >= 0.0 && v.is_finite()) {
        return Err(format!("{s:?} is not a rate"));
    }
    Ok((v * scale) as u64)
}

/// Runs spate-iperf; returns the process exit code.
pub fn main(args: IperfArgs) -> i32 {
    cli::init_logging();
    if let Err(e) = spate::dpdk::signal::install_stop_handlers() {
        eprintln!("spate-iperf: cannot install signal handlers: {e}");
        return 1;
    }
    let result = match (args.server, args.client) {
        _ if !args.udp => Err("spate-iperf runs UDP tests only: give -u".into()),
        (true, _) => server(&args),
        (false, Some(host)) => client(&args, host),
        (false, None) => Err("give -s (server) or -c HOST (client)".into()),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("spate-iperf: {e}");
            1
        }
    }
}

fn wall_clock() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

fn rule() {
    println!("------------------------------------------------------------");
}

/// One test the server follows.
struct Test {
    id: u32,
    started: f64,
    state: TestState,
    report: Option<Report>,
    finished: Option<Instant>,
}

/// How long a finished test is kept to answer the client's repeated ends.
const LINGER: Duration = Duration::from_secs(10);

fn server(args: &IperfArgs) -> Result<(), Box<dyn std::error::Error>> {
    let stack = Stack::new(args.stack.to_config()?)?;
    let sock = Arc::new(UdpSocket::bind(&stack, ("::", args.port))?);
    sock.set_nonblocking(true)?;
    rule();
    println!("Server listening on UDP port {} (spate)", args.port);
    rule();
    let s = sock.clone();
    stack.run(move |_| {
        let s = s.clone();
        let mut tests: HashMap<SocketAddr, Test> = HashMap::new();
        let mut next_id = 1u32;
        let mut batch = DatagramBatch::with_capacity(64);
        move |ctx: &mut LcoreCtx<'_>| {
            // The burst's datagrams where the lcore staged them, then what
            // the queue holds.
            ctx.recv_staged(|_, staged| staged.move_to(&mut batch));
            while !batch.is_empty() || s.recv_batch(&mut batch, 64).is_ok() {
                let now = wall_clock();
                for d in batch.drain() {
                    let Some(h) = Datagram::parse(d.data()) else { continue };
                    let (from, to) = (d.src(), d.dst());
                    let len = d.data().len();
                    drop(d);
                    let test = tests.entry(from).or_insert_with(|| {
                        let id = next_id;
                        next_id += 1;
                        if !h.is_fin() {
                            println!(
                                "[{id:3}] local {} port {} connected with {} port {}",
                                to.ip(),
                                to.port(),
                                from.ip(),
                                from.port()
                            );
                            println!(
                                "[ ID] Interval       Transfer     Bandwidth        Jitter   Lost/Total Datagrams"
                            );
                        }
                        Test { id, started: now, state: TestState::default(), report: None, finished: None }
                    });
                    if !h.is_fin() {
                        if test.report.is_none() {
                            test.state.datagram(&h, len, now);
                        }
                        continue;
                    }
                    let report = *test.report.get_or_insert_with(|| {
                        test.state.fin(len);
                        let r = test.state.report(h.seq.unsigned_abs(), now - test.started);
                        println!("{}", report_line(test.id, &r));
                        r
                    });
                    test.finished.get_or_insert_with(Instant::now);
                    if let Ok(mut buf) = s.alloc_send_buf(wire::REPORT_DATAGRAM_LEN) {
                        report.emit(&mut buf);
                        let _ = s.send_buf_to(buf, from);
                    }
                }
            }
            tests.retain(|_, t| t.finished.is_none_or(|at| at.elapsed() < LINGER));
        }
    })?;
    println!("{}", crate::report::summary(&stack));
    Ok(())
}

/// A report line as iperf prints it.
fn report_line(id: u32, r: &Report) -> String {
    format!(
        "[{id:3}] 0.0000-{:.4} sec  {}  {}  {:6.3} ms {}/{} ({}%)",
        r.duration,
        bytes(r.bytes),
        bits(r.bytes, r.duration.max(1e-9)),
        r.jitter * 1e3,
        r.lost,
        r.total,
        two_digits(r.loss_percent())
    )
}

/// A number with two significant digits, as C's `%.2g` prints it.
fn two_digits(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return "0".into();
    }
    let decimals = (1 - x.abs().log10().floor() as i32).max(0) as usize;
    let s = format!("{x:.decimals$}");
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s }
}

fn client(args: &IperfArgs, host: IpAddr) -> Result<(), Box<dyn std::error::Error>> {
    if args.len < wire::MIN_LEN {
        return Err(format!("-l {} is shorter than iperf's {}-byte header", args.len, wire::MIN_LEN).into());
    }
    if args.time.is_nan() || args.time <= 0.0 {
        return Err("-t must be positive".into());
    }
    let stack = Stack::new(args.stack.to_config()?)?;
    let server = SocketAddr::new(host, args.port);
    let sock = UdpSocket::bind(&stack, if host.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })?;
    sock.connect(server)?;
    let local = sock.local_addr()?;
    let ipg = (args.bandwidth > 0).then(|| Duration::from_secs_f64(args.len as f64 * 8.0 / args.bandwidth as f64));
    rule();
    println!("Client connecting to {host}, UDP port {} (spate)", args.port);
    match ipg {
        Some(g) => println!("Sending {} byte datagrams, IPG target: {:.2} us", args.len, g.as_secs_f64() * 1e6),
        None => println!("Sending {} byte datagrams, no rate limit", args.len),
    }
    rule();
    println!("[  1] local {} port {} connected with {host} port {}", local.ip(), local.port(), args.port);
    let done = Arc::new(AtomicBool::new(false));
    let (len, time, port, rate) = (args.len, args.time, args.port, args.bandwidth);
    let (st, d) = (stack.clone(), done.clone());
    let sender = std::thread::spawn(move || -> Result<(), String> {
        let _ = spate::dpdk::lcore::unpin_current_thread();
        let outcome = run_client(&sock, len, time, port, rate, ipg);
        d.store(true, Ordering::Release);
        st.stop();
        outcome
    });
    stack.run(|_| |_: &mut LcoreCtx<'_>| {})?;
    println!("{}", crate::report::summary(&stack));
    if !done.load(Ordering::Acquire) {
        // Stopped by a signal before the test ended.
        let _ = sender.join();
        return Err("interrupted".into());
    }
    sender.join().map_err(|_| "the sending thread panicked")?.map_err(|e| e.into())
}

fn run_client(
    sock: &UdpSocket,
    len: usize,
    time: f64,
    port: u16,
    rate: u64,
    ipg: Option<Duration>,
) -> Result<(), String> {
    let mut buf = vec![0u8; len];
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(time);
    let mut seq: i64 = 0;
    let mut next = start;
    while Instant::now() < end {
        if let Some(g) = ipg {
            let now = Instant::now();
            if next > now {
                let wait = next - now;
                if wait > Duration::from_micros(200) {
                    std::thread::sleep(wait - Duration::from_micros(100));
                }
                continue;
            }
            next += g;
        }
        seq += 1;
        let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        Datagram { seq, sec: t.as_secs() as u32, usec: t.subsec_micros() }.emit(&mut buf);
        wire::emit_client_header(&mut buf, port, len, rate, time);
        if sock.send(&buf).is_err() {
            seq -= 1; // not sent: the same number goes again
            std::thread::yield_now();
        }
    }
    let sent_for = start.elapsed().as_secs_f64();
    let sent_bytes = seq as u64 * len as u64;
    println!("[ ID] Interval       Transfer     Bandwidth");
    println!("[  1] 0.0000-{sent_for:.4} sec  {}  {}", bytes(sent_bytes), bits(sent_bytes, sent_for));
    println!("[  1] Sent {} datagrams", seq + 1);
    // The end: the next number negated, until the server reports.
    sock.set_read_timeout(Some(Duration::from_millis(250))).map_err(|e| e.to_string())?;
    let mut reply = vec![0u8; 2048];
    for _ in 0..10 {
        let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        Datagram { seq: -(seq + 1), sec: t.as_secs() as u32, usec: t.subsec_micros() }.emit(&mut buf);
        let _ = sock.send(&buf);
        let deadline = Instant::now() + Duration::from_millis(250);
        while Instant::now() < deadline {
            match sock.recv(&mut reply) {
                Ok(n) => {
                    if let Some(r) = Report::parse(&reply[..n]) {
                        println!("[  1] Server Report:");
                        println!("[ ID] Interval       Transfer     Bandwidth        Jitter   Lost/Total Datagrams");
                        println!("{}", report_line(1, &r));
                        if r.out_of_order > 0 {
                            println!(
                                "[  1] 0.0000-{:.4} sec  {} datagrams received out-of-order",
                                r.duration, r.out_of_order
                            );
                        }
                        return Ok(());
                    }
                }
                Err(_) => break,
            }
        }
    }
    println!("[  1] WARNING: did not receive ack of last datagram after 10 tries.");
    Err("no server report".into())
}

#[cfg(test)]
mod tests {
    use super::parse_rate;

    #[test]
    fn percentages_like_iperf() {
        use super::two_digits;
        assert_eq!(two_digits(0.0), "0");
        assert_eq!(two_digits(4.8), "4.8");
        assert_eq!(two_digits(10.0), "10");
        assert_eq!(two_digits(0.048), "0.048");
        assert_eq!(two_digits(33.3333), "33");
        assert_eq!(two_digits(100.0), "100");
    }

    #[test]
    fn rates_like_iperf() {
        assert_eq!(parse_rate("100M"), Ok(100_000_000));
        assert_eq!(parse_rate("1.5k"), Ok(1500));
        assert_eq!(parse_rate("2g"), Ok(2_000_000_000));
        assert_eq!(parse_rate("0"), Ok(0));
        assert!(parse_rate("10x").is_err());
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("-5M").is_err());
    }
}

//! spate-echo: the UDP echo service (RFC 862) over IPv4 and IPv6, answered
//! run-to-completion on the polling lcores, each reply in the request's
//! own mbuf.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use spate::{Datagram, DatagramBatch, LcoreCtx, Stack, UdpSocket};

use crate::cli::{self, StackArgs};
use crate::report;

/// Command line of spate-echo.
#[derive(Debug, Parser)]
#[command(name = "spate-echo", version, about = "UDP echo (RFC 862) on spate, over IPv4 and IPv6")]
pub struct EchoArgs {
    /// Devices, addresses, lcores.
    #[command(flatten)]
    pub stack: StackArgs,
    /// The UDP port to answer on.
    #[arg(long, default_value_t = 7)]
    pub port: u16,
    /// Serve the port from a reuseport group of this many sockets.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub sockets: u16,
    /// Seconds between statistics lines (0: none).
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
}

/// Datagrams taken per socket per loop iteration.
const BATCH: usize = 32;

/// Runs spate-echo; returns the process exit code.
pub fn main(args: EchoArgs) -> i32 {
    cli::init_logging();
    if let Err(e) = spate::dpdk::signal::install_stop_handlers() {
        eprintln!("spate-echo: cannot install signal handlers: {e}");
        return 1;
    }
    match run(&args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("spate-echo: {e}");
            1
        }
    }
}

fn run(args: &EchoArgs) -> Result<(), Box<dyn std::error::Error>> {
    let cfg = args.stack.to_config()?;
    let stack = Stack::new(cfg)?;
    let mut sockets = Vec::new();
    for _ in 0..args.sockets {
        let sock = UdpSocket::builder(&stack).reuseport(args.sockets > 1).bind(("::", args.port))?;
        sock.set_nonblocking(true)?;
        args.stack.join_groups(&sock)?;
        sockets.push(sock);
    }
    let sockets = Arc::new(sockets);
    let echoed: Arc<Vec<AtomicU64>> = Arc::new((0..sockets.len()).map(|_| AtomicU64::new(0)).collect());
    announce(args, &stack);
    let reporter = (args.interval > 0.0)
        .then(|| report::print_every(stack.clone(), Duration::from_secs_f64(args.interval), report::line));
    let (socks, counts) = (sockets.clone(), echoed.clone());
    stack.run(move |_lcore| {
        let socks = socks.clone();
        let counts = counts.clone();
        let by_id: HashMap<u64, usize> = socks.iter().enumerate().map(|(i, s)| (s.id(), i)).collect();
        let mut batch = DatagramBatch::with_capacity(BATCH);
        move |ctx: &mut LcoreCtx<'_>| {
            // This burst's datagrams where the lcore staged them, then the
            // sockets with queued ones: a group of many stays cheap.
            ctx.recv_staged(|id, staged| {
                let i = by_id[&id];
                counts[i].fetch_add(staged.len() as u64, Ordering::Relaxed);
                let _ = socks[i].send_replies(staged.drain().map(Datagram::into_send_buf));
            });
            for id in ctx.ready() {
                let i = by_id[id];
                let s = &socks[i];
                while let Ok(got) = s.recv_batch(&mut batch, BATCH) {
                    counts[i].fetch_add(got as u64, Ordering::Relaxed);
                    // One call for the batch; a full queue drops the
                    // replies, as a kernel would.
                    let _ = s.send_replies(batch.drain().map(Datagram::into_send_buf));
                    // A short batch: the queue is empty, no call just to
                    // hear WouldBlock.
                    if got < BATCH {
                        break;
                    }
                }
            }
        }
    })?;
    if let Some(r) = reporter {
        r.finish();
    }
    println!("{}", report::summary(&stack));
    let per_socket: Vec<String> =
        echoed.iter().enumerate().map(|(i, c)| format!("{i}={}", c.load(Ordering::Relaxed))).collect();
    println!("Sockets: {}", per_socket.join(" "));
    Ok(())
}

fn announce(args: &EchoArgs, stack: &Stack) {
    let iface = &stack.interfaces()[0];
    let addrs: Vec<String> = iface
        .ipv4
        .iter()
        .map(|c| format!("{}:{}", c.addr, args.port))
        .chain(
            iface
                .ipv6
                .iter()
                .filter(|c| !c.addr.to_string().starts_with("fe80"))
                .map(|c| format!("[{}]:{}", c.addr, args.port)),
        )
        .collect();
    println!(
        "spate-echo: UDP echo on {} (port {}, MAC {}, lcores {:?}, {} socket{})",
        addrs.join(" and "),
        iface.name,
        iface.mac,
        stack.lcores(),
        args.sockets,
        if args.sockets == 1 { "" } else { "s in a reuseport group" }
    );
    if args.stack.uses_default_device() {
        println!(
            "spate-echo: reach it through the TAP device {tap} in this network namespace: \
             ip addr add {ip} dev {tap}; ip -6 addr add {ip6} dev {tap} nodad; ip link set {tap} up; \
             then send UDP to {addr} port {port}",
            tap = cli::DEFAULT_TAP,
            ip = cli::PEER_IP,
            ip6 = cli::PEER_IP6,
            addr = cli::DEFAULT_IP.split('/').next().unwrap_or(""),
            port = args.port
        );
    }
}

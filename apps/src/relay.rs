//! spate-relay: an impairment relay for tests (these machines' kernel has
//! no netem). Run in a network namespace of its own between two veths, it
//! forwards every frame from one to the other through DPDK `net_pcap`
//! ports (not `net_af_packet`: its fanout socket asks the kernel to
//! reassemble IP fragments, and the datagram it hands over no longer fits
//! the other link), and to UDP frames (ARP and neighbour discovery
//! always pass, undelayed, so addresses still resolve) it does what netem
//! would: drops a share, delays by a fixed time plus uniform jitter, and
//! sends a share at once, ahead of the delayed ones (reordering). The
//! decisions come from a seeded generator, so a run repeats; the counts it
//! prints at the end say exactly what it forwarded, dropped and reordered.

use std::time::{Duration, Instant};

use clap::Parser;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use spate::dpdk::{Burst, EalBuilder, Mbuf, Memory, Mempool, MempoolConfig, Port, PortConfig, RxQueue, TxQueue};

/// Command line of spate-relay.
#[derive(Debug, Parser)]
#[command(name = "spate-relay", version, about = "Forwards frames between two interfaces, dropping some UDP")]
pub struct RelayArgs {
    /// The first interface.
    #[arg(long)]
    pub a: String,
    /// The second interface.
    #[arg(long)]
    pub b: String,
    /// Percent of UDP frames from a to b to drop.
    #[arg(long, default_value_t = 0.0)]
    pub loss_a_b: f64,
    /// Percent of UDP frames from b to a to drop.
    #[arg(long, default_value_t = 0.0)]
    pub loss_b_a: f64,
    /// Delay of UDP frames, ms (both directions).
    #[arg(long, default_value_t = 0.0)]
    pub delay_ms: f64,
    /// Uniform jitter around the delay, +- ms.
    #[arg(long, default_value_t = 0.0)]
    pub jitter_ms: f64,
    /// Percent of delayed UDP frames sent at once instead (ahead of the others).
    #[arg(long, default_value_t = 0.0)]
    pub reorder: f64,
    /// Seed of the decisions.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Stop after this many seconds (0: at SIGINT or SIGTERM).
    #[arg(long, default_value_t = 0.0)]
    pub time: f64,
}

/// What one direction did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Direction {
    /// Frames sent on.
    pub forwarded: u64,
    /// UDP frames dropped on purpose.
    pub dropped: u64,
    /// UDP frames seen (forwarded or dropped).
    pub udp: u64,
    /// Frames the egress port refused (not counted as forwarded).
    pub refused: u64,
    /// UDP frames sent at once, overtaking delayed ones.
    pub reordered: u64,
    /// Frames the ingress port's capture lost before the relay saw them
    /// (libpcap's drops, the port's `imissed`): not in `udp`.
    pub missed: u64,
}

/// Whether an Ethernet frame carries UDP over IPv4 or IPv6 (without
/// extension headers, which is what the tests send).
fn is_udp(f: &[u8]) -> bool {
    if f.len() < 14 {
        return false;
    }
    match u16::from_be_bytes([f[12], f[13]]) {
        0x0800 => f.len() > 23 && f[23] == 17,
        0x86dd => f.len() > 20 && f[20] == 17,
        _ => false,
    }
}

/// xorshift64*: reproducible drop decisions.
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// How UDP frames are delayed.
#[derive(Debug, Clone, Copy)]
struct Delay {
    base: Duration,
    jitter: Duration,
    /// Percent sent at once.
    reorder: f64,
}

/// One direction's ports, policy and frames waiting for their time.
struct Leg {
    rx: RxQueue,
    tx: TxQueue,
    loss: f64,
    delay: Delay,
    /// (release time, arrival order, frame), earliest first.
    waiting: BinaryHeap<Reverse<(Instant, u64, Held)>>,
    arrivals: u64,
    stats: Direction,
}

/// A frame in the delay queue (ordered by the heap's other fields only).
struct Held(Mbuf);

impl PartialEq for Held {
    fn eq(&self, _: &Held) -> bool {
        true
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Held) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, _: &Held) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl Leg {
    fn pump(&mut self, rng: &mut Rng) -> usize {
        let mut inn: Burst = Burst::new();
        let n = self.rx.rx_burst(&mut inn);
        let now = Instant::now();
        let mut out: Burst = Burst::new();
        for m in inn.drain() {
            if is_udp(m.data()) {
                self.stats.udp += 1;
                if self.loss > 0.0 && rng.next_f64() * 100.0 < self.loss {
                    self.stats.dropped += 1;
                    continue;
                }
                if !self.delay.base.is_zero() || !self.delay.jitter.is_zero() {
                    let at_once = self.delay.reorder > 0.0 && rng.next_f64() * 100.0 < self.delay.reorder;
                    if at_once && !self.waiting.is_empty() {
                        self.stats.reordered += 1;
                    } else {
                        let jitter = self.delay.jitter.as_secs_f64() * (2.0 * rng.next_f64() - 1.0);
                        let wait = (self.delay.base.as_secs_f64() + jitter).max(0.0);
                        self.arrivals += 1;
                        self.waiting.push(Reverse((now + Duration::from_secs_f64(wait), self.arrivals, Held(m))));
                        continue;
                    }
                }
            }
            if let Err(m) = out.push(m) {
                drop(m);
                self.stats.refused += 1;
            }
        }
        // Frames whose time came, after the ones just taken.
        while out.len() < out.capacity() {
            match self.waiting.peek() {
                Some(Reverse((t, _, _))) if *t <= now => {
                    let Reverse((_, _, Held(m))) = self.waiting.pop().expect("peeked");
                    let _ = out.push(m);
                }
                _ => break,
            }
        }
        let offered = out.len();
        let mut sent = 0;
        for _ in 0..100 {
            if out.is_empty() {
                break;
            }
            sent += self.tx.tx_burst(&mut out);
        }
        self.stats.forwarded += sent as u64;
        self.stats.refused += (offered - sent) as u64;
        n + offered
    }
}

/// Runs spate-relay; returns the process exit code.
pub fn main(args: RelayArgs) -> i32 {
    crate::cli::init_logging();
    if let Err(e) = spate::dpdk::signal::install_stop_handlers() {
        eprintln!("spate-relay: cannot install signal handlers: {e}");
        return 1;
    }
    match run(&args) {
        Ok((ab, ba)) => {
            println!(
                "spate-relay: a->b forwarded={} dropped={} udp={} refused={} reordered={} missed={}; \
                 b->a forwarded={} dropped={} udp={} refused={} reordered={} missed={}",
                ab.forwarded,
                ab.dropped,
                ab.udp,
                ab.refused,
                ab.reordered,
                ab.missed,
                ba.forwarded,
                ba.dropped,
                ba.udp,
                ba.refused,
                ba.reordered,
                ba.missed
            );
            0
        }
        Err(e) => {
            eprintln!("spate-relay: {e}");
            1
        }
    }
}

fn run(args: &RelayArgs) -> Result<(Direction, Direction), Box<dyn std::error::Error>> {
    for pct in [args.loss_a_b, args.loss_b_a, args.reorder] {
        if !(0.0..=100.0).contains(&pct) {
            return Err(format!("{pct} is not a percentage").into());
        }
    }
    if args.delay_ms < 0.0 || args.jitter_ms < 0.0 || args.jitter_ms > args.delay_ms {
        return Err("--delay-ms and --jitter-ms must be positive, the jitter no larger than the delay".into());
    }
    let _eal = EalBuilder::new().program("spate-relay").lcores("0").memory(Memory::NoHuge).memory_mb(512).init()?;
    // Enough to hold what the delay keeps in flight.
    let pool = std::sync::Arc::new(Mempool::new(&MempoolConfig::new("relay", 65535))?);
    let delay = Delay {
        base: Duration::from_secs_f64(args.delay_ms.max(0.0) / 1e3),
        jitter: Duration::from_secs_f64(args.jitter_ms.max(0.0) / 1e3),
        reorder: args.reorder,
    };
    let mut ports = Vec::new();
    for (i, iface) in [&args.a, &args.b].into_iter().enumerate() {
        let mut p = Port::create(&format!("net_pcap{i},iface={iface}"))?;
        p.configure(&PortConfig::default(), pool.clone())?;
        p.start()?;
        ports.push(p);
    }
    let leg = |rx: usize, tx: usize, loss: f64| -> spate::dpdk::Result<Leg> {
        Ok(Leg {
            rx: ports[rx].rx_queue(0)?,
            tx: ports[tx].tx_queue(0)?,
            loss,
            delay,
            waiting: BinaryHeap::new(),
            arrivals: 0,
            stats: Direction::default(),
        })
    };
    let mut ab = leg(0, 1, args.loss_a_b)?;
    let mut ba = leg(1, 0, args.loss_b_a)?;
    let mut rng = Rng(args.seed.max(1));
    println!(
        "spate-relay: {} <-> {} (loss {}% a->b, {}% b->a; delay {} ms +- {} ms, {}% sent at once)",
        args.a, args.b, args.loss_a_b, args.loss_b_a, args.delay_ms, args.jitter_ms, args.reorder
    );
    let end = (args.time > 0.0).then(|| Instant::now() + Duration::from_secs_f64(args.time));
    let mut idle = 0u32;
    while !spate::dpdk::signal::stop_requested() && end.is_none_or(|e| Instant::now() < e) {
        let n = ab.pump(&mut rng) + ba.pump(&mut rng);
        if n == 0 {
            idle += 1;
            if idle > 100 {
                std::thread::sleep(Duration::from_micros(20));
            }
        } else {
            idle = 0;
        }
    }
    let (mut a, mut b) = (ab.stats, ba.stats);
    drop((ab, ba));
    // Read before the ports stop: net_pcap takes its drops from libpcap.
    a.missed = ports[0].stats()?.imissed;
    b.missed = ports[1].stats()?.imissed;
    for mut p in ports {
        let _ = p.stop();
    }
    Ok((a, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_is_told_from_the_rest() {
        let mut v4 = vec![0u8; 42];
        v4[12..14].copy_from_slice(&[0x08, 0x00]);
        v4[23] = 17;
        assert!(is_udp(&v4));
        v4[23] = 1;
        assert!(!is_udp(&v4), "ICMP passes");
        let mut v6 = vec![0u8; 62];
        v6[12..14].copy_from_slice(&[0x86, 0xdd]);
        v6[20] = 17;
        assert!(is_udp(&v6));
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(!is_udp(&arp));
        assert!(!is_udp(&[0u8; 10]));
    }

    #[test]
    fn drop_share_follows_the_percentage() {
        let mut rng = Rng(7);
        let drops = (0..100_000).filter(|_| rng.next_f64() * 100.0 < 10.0).count();
        assert!((9_500..10_500).contains(&drops), "{drops}");
    }
}

//! spate-relay: an impairment relay for tests. Run in a network namespace
//! of its own between two veths, it forwards every frame from one to the
//! other through DPDK `net_af_packet` ports and drops a chosen share of
//! the UDP frames in each direction (ARP and neighbour discovery always
//! pass, so addresses still resolve). The drops come from a seeded
//! generator, so a run repeats; the counts it prints at the end say exactly
//! what it forwarded and dropped.

use std::time::{Duration, Instant};

use clap::Parser;
use spate_dpdk::{Burst, EalBuilder, Memory, Mempool, MempoolConfig, Port, PortConfig, RxQueue, TxQueue};

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
    /// Seed of the drop decisions.
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

/// One direction's ports and policy.
struct Leg {
    rx: RxQueue,
    tx: TxQueue,
    loss: f64,
    stats: Direction,
}

impl Leg {
    fn pump(&mut self, rng: &mut Rng) -> usize {
        let mut inn: Burst = Burst::new();
        let n = self.rx.rx_burst(&mut inn);
        if n == 0 {
            return 0;
        }
        let mut out: Burst = Burst::new();
        for m in inn.drain() {
            if is_udp(m.data()) {
                self.stats.udp += 1;
                if self.loss > 0.0 && rng.next_f64() * 100.0 < self.loss {
                    self.stats.dropped += 1;
                    continue;
                }
            }
            let _ = out.push(m);
        }
        let offered = out.len();
        let mut sent = 0;
        for _ in 0..100 {
            sent += self.tx.tx_burst(&mut out);
            if out.is_empty() {
                break;
            }
        }
        self.stats.forwarded += sent as u64;
        self.stats.refused += (offered - sent) as u64;
        n
    }
}

/// Runs spate-relay; returns the process exit code.
pub fn main(args: RelayArgs) -> i32 {
    crate::cli::init_logging();
    if let Err(e) = spate_dpdk::signal::install_stop_handlers() {
        eprintln!("spate-relay: cannot install signal handlers: {e}");
        return 1;
    }
    match run(&args) {
        Ok((ab, ba)) => {
            println!(
                "spate-relay: a->b forwarded={} dropped={} udp={} refused={}; b->a forwarded={} dropped={} udp={} refused={}",
                ab.forwarded, ab.dropped, ab.udp, ab.refused, ba.forwarded, ba.dropped, ba.udp, ba.refused
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
    for loss in [args.loss_a_b, args.loss_b_a] {
        if !(0.0..=100.0).contains(&loss) {
            return Err(format!("loss {loss} is not a percentage").into());
        }
    }
    let _eal = EalBuilder::new().program("spate-relay").lcores("0").memory(Memory::NoHuge).memory_mb(256).init()?;
    let pool = std::sync::Arc::new(Mempool::new(&MempoolConfig::new("relay", 8191))?);
    let mut ports = Vec::new();
    for (i, iface) in [&args.a, &args.b].into_iter().enumerate() {
        let mut p = Port::create(&format!("net_af_packet{i},iface={iface}"))?;
        p.configure(&PortConfig::default(), pool.clone())?;
        p.start()?;
        ports.push(p);
    }
    let mut ab =
        Leg { rx: ports[0].rx_queue(0)?, tx: ports[1].tx_queue(0)?, loss: args.loss_a_b, stats: Direction::default() };
    let mut ba =
        Leg { rx: ports[1].rx_queue(0)?, tx: ports[0].tx_queue(0)?, loss: args.loss_b_a, stats: Direction::default() };
    let mut rng = Rng(args.seed.max(1));
    println!("spate-relay: {} <-> {} (loss {}% a->b, {}% b->a)", args.a, args.b, args.loss_a_b, args.loss_b_a);
    let end = (args.time > 0.0).then(|| Instant::now() + Duration::from_secs_f64(args.time));
    let mut idle = 0u32;
    while !spate_dpdk::signal::stop_requested() && end.is_none_or(|e| Instant::now() < e) {
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
    let (a, b) = (ab.stats, ba.stats);
    drop((ab, ba));
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

//! The mbuf budget: what the bounds on held packets (receive queues,
//! packets waiting for address resolution, fragments) may hold together,
//! worked out against the pool when the stack starts, so that however full
//! they get the RX rings can still refill. Unset bounds share what the rings
//! leave; bounds set that do not fit are a configuration error that names
//! every term.

use crate::config::{MbufBudget, StackConfig};
use crate::error::{Error, Result};

/// Linux's `ipfrag_high_thresh`, the most a lcore holds of fragments when
/// the pool has room for it.
const REASSEMBLY_HIGH: usize = 4 << 20;

/// A mempool cache holds up to one and a half times its size before it
/// flushes to the pool (DPDK's `RTE_MEMPOOL_CACHE_FLUSHTHRESH_MULTIPLIER`).
fn cache_hold(cache: usize) -> usize {
    cache * 3 / 2
}

/// What the stack knows of its pool and ports when it works the budget out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pool {
    /// Mbufs in the pool.
    pub size: usize,
    /// What a queued datagram is charged (its mbuf's buffer and the
    /// datagram itself).
    pub truesize: usize,
    /// What a held fragment is charged (its mbuf's buffer).
    pub frag_charge: usize,
    /// Polling lcores.
    pub lcores: usize,
    /// The per-lcore mempool cache.
    pub cache: usize,
    /// Packets an lcore has in hand at once (its receive burst, the burst
    /// staged for its callback with its group copies, its transmit burst).
    pub bursts: usize,
    /// Mbufs in use once the ports started: what their RX rings hold.
    pub rx_rings: usize,
    /// Mbufs the TX rings may keep after sending them, until their
    /// descriptors are reused.
    pub tx_rings: usize,
}

/// Works out the bounds for `cfg` on `pool`: those set are checked, those
/// unset take a share of what the rings, caches and bursts leave (the
/// receive queues half the pool at most, unresolved neighbours an eighth,
/// each lcore's fragments a quarter shared among the lcores and 4 MiB at
/// most, the receive queues what remains).
pub(crate) fn plan(cfg: &StackConfig, pool: &Pool) -> Result<MbufBudget> {
    let in_flight = pool.lcores * (cache_hold(pool.cache) + pool.bursts);
    let reserved = pool.rx_rings + pool.tx_rings + in_flight;
    let free = pool.size.saturating_sub(reserved);
    // Below this the receive queues could not take a few bursts.
    let least = 8 * crate::shared::BURST;
    if free < 2 * least {
        return Err(Error::Config(format!(
            "mempool_size {}: the RX rings hold {}, the TX rings may keep {}, the lcores' caches and bursts {}, \
             leaving {free} mbufs for the receive queues, unresolved neighbours and fragments; raise \
             mempool_size or lower rx_desc, tx_desc or mempool_cache",
            pool.size, pool.rx_rings, pool.tx_rings, in_flight
        )));
    }
    let mbufs_of = |bytes: usize, charge: usize| bytes.div_ceil(charge);
    let pending_total = cfg.neighbor.pending_total.unwrap_or((pool.size / 8).min(free / 8));
    let reassembly_high_bytes = cfg
        .reassembly_high_bytes
        .unwrap_or(REASSEMBLY_HIGH.min(free / 4 / pool.lcores * pool.frag_charge).max(pool.frag_charge));
    let reassembly_low_bytes = cfg.reassembly_low_bytes.unwrap_or(reassembly_high_bytes / 4 * 3);
    if reassembly_low_bytes > reassembly_high_bytes {
        return Err(Error::Config(format!(
            "reassembly_low_bytes {reassembly_low_bytes} is above reassembly_high_bytes {reassembly_high_bytes}"
        )));
    }
    // An lcore evicts once it holds more than the high mark: one fragment
    // past it at most.
    let reassembly = pool.lcores * (mbufs_of(reassembly_high_bytes, pool.frag_charge) + 1);
    let left = free.saturating_sub(pending_total + reassembly);
    let udp_mem_bytes = cfg.udp_mem_bytes.unwrap_or((pool.size / 2).min(left) * pool.truesize);
    let receive_queues = mbufs_of(udp_mem_bytes, pool.truesize);
    let held = receive_queues + pending_total + reassembly;
    // A cap set smaller is the operator's choice; one left to the budget
    // must take a few bursts.
    let starved = cfg.udp_mem_bytes.is_none() && receive_queues < least;
    if held > free || starved {
        let set = |v: bool| if v { "set" } else { "default" };
        return Err(Error::Config(format!(
            "mempool_size {}: the receive queues ({receive_queues} mbufs, udp_mem_bytes {udp_mem_bytes}, {}), \
             unresolved neighbours (neighbor.pending_total {pending_total}, {}) and fragments ({reassembly} \
             mbufs over {} lcore(s), reassembly_high_bytes {reassembly_high_bytes}, {}) could hold {held} mbufs, \
             but the RX rings ({}), TX rings ({}) and the lcores' caches and bursts ({in_flight}) leave {free}{}; \
             lower the bounds or raise mempool_size",
            pool.size,
            set(cfg.udp_mem_bytes.is_some()),
            set(cfg.neighbor.pending_total.is_some()),
            pool.lcores,
            set(cfg.reassembly_high_bytes.is_some()),
            pool.rx_rings,
            pool.tx_rings,
            if starved { format!(" and the receive queues need {least} at least") } else { "".into() }
        )));
    }
    Ok(MbufBudget {
        pool: pool.size,
        rx_rings: pool.rx_rings,
        tx_rings: pool.tx_rings,
        in_flight,
        udp_mem_bytes,
        pending_total,
        reassembly_high_bytes,
        reassembly_low_bytes,
        receive_queues,
        reassembly,
        spare: free - held,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRUESIZE: usize = 2304;
    const FRAG: usize = 2176;

    fn pool(size: usize, lcores: usize, rx_rings: usize, tx_rings: usize) -> Pool {
        Pool {
            size,
            truesize: TRUESIZE,
            frag_charge: FRAG,
            lcores,
            cache: 256,
            bursts: 3 * crate::shared::BURST,
            rx_rings,
            tx_rings,
        }
    }

    fn sums(b: &MbufBudget) -> usize {
        b.rx_rings + b.tx_rings + b.in_flight + b.receive_queues + b.pending_total + b.reassembly + b.spare
    }

    #[test]
    fn the_defaults_fit_every_pool_they_accept() {
        for size in [1023, 2047, 4095, 8191, 16383, 65535] {
            for lcores in 1..=4 {
                for (rx, tx) in [(0, 0), (1024 * lcores, 0), (512 * lcores, 1024 * lcores)] {
                    let p = pool(size, lcores, rx, tx);
                    match plan(&StackConfig::default(), &p) {
                        Ok(b) => {
                            assert_eq!(sums(&b), size, "{b}");
                            assert!(b.receive_queues <= size / 2, "{b}");
                            assert!(b.reassembly_high_bytes <= REASSEMBLY_HIGH, "{b}");
                            assert!(b.reassembly_low_bytes <= b.reassembly_high_bytes, "{b}");
                        }
                        Err(e) => assert!(rx + tx + lcores * (384 + 96) + 512 > size, "{size} {lcores} {rx} {tx}: {e}"),
                    }
                }
            }
        }
    }

    #[test]
    fn the_default_pool_keeps_its_bounds_on_one_lcore() {
        let b = plan(&StackConfig::default(), &pool(16383, 1, 1024, 0)).unwrap();
        // An eighth of what the RX ring and the cache and bursts leave.
        let free = 16383 - 1024 - (384 + 96);
        assert_eq!((b.receive_queues, b.pending_total, b.reassembly_high_bytes), (8191, free / 8, REASSEMBLY_HIGH));
        assert_eq!(b.reassembly_low_bytes, 3 << 20);
    }

    #[test]
    fn bounds_set_beyond_the_pool_are_refused_with_every_term() {
        let cfg = StackConfig { udp_mem_bytes: Some(15000 * TRUESIZE), ..StackConfig::default() };
        let e = plan(&cfg, &pool(16383, 1, 1024, 0)).unwrap_err().to_string();
        for term in ["udp_mem_bytes", "set", "pending_total", "reassembly_high_bytes", "RX rings (1024)"] {
            assert!(e.contains(term), "{term} missing from: {e}");
        }
        let mut cfg = StackConfig::default();
        cfg.neighbor.pending_total = Some(8000);
        cfg.reassembly_high_bytes = Some(8 << 20);
        assert!(plan(&cfg, &pool(16383, 2, 2048, 0)).is_err());
    }

    #[test]
    fn rings_that_take_the_pool_are_refused() {
        let e = plan(&StackConfig::default(), &pool(2047, 1, 1024, 1024)).unwrap_err().to_string();
        assert!(e.contains("raise mempool_size or lower rx_desc"), "{e}");
    }

    #[test]
    fn unset_bounds_shrink_to_what_the_rings_leave() {
        let b = plan(&StackConfig::default(), &pool(16383, 2, 2048, 2048)).unwrap();
        assert_eq!(sums(&b), 16383);
        assert!(b.reassembly_high_bytes < REASSEMBLY_HIGH, "{b}");
        assert!(b.receive_queues < 16383 / 2, "{b}");
    }

    #[test]
    fn low_mark_above_the_high_one_is_refused() {
        let cfg = StackConfig { reassembly_low_bytes: Some(2 << 20), ..StackConfig::default() };
        let p = pool(4095, 1, 0, 0);
        assert!(plan(&cfg, &p).unwrap_err().to_string().contains("reassembly_low_bytes"));
    }

    /// The example in docs/configuration.md ("The mbuf budget") is what
    /// `plan` says for its configuration.
    #[test]
    fn the_configuration_docs_example_is_what_plan_says() {
        let cfg = StackConfig { udp_mem_bytes: Some(1000 * TRUESIZE), ..StackConfig::default() };
        let e = plan(&cfg, &pool(2047, 1, 1024, 0)).unwrap_err().to_string();
        let e = e.trim_start_matches("configuration: ");
        let docs = include_str!("../../../docs/configuration.md").split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(docs.contains(e), "docs/configuration.md should show: {e}");
    }
}

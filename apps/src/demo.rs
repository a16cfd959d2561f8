//! The demo the README's first command runs: packets through a DPDK
//! virtual device, counted and checked.

use std::sync::Arc;
use std::time::Instant;

use spate_dpdk::{Burst, EalBuilder, Mempool, MempoolConfig, Port, PortConfig};

/// Sends `packets` numbered frames around a `net_ring` loopback port in
/// bursts, checks each one that comes back and prints what happened.
pub fn ring_demo(packets: usize) -> Result<(), Box<dyn std::error::Error>> {
    let eal = EalBuilder::new().program("spate-echo").lcores("0").init()?;
    println!(
        "spate: {} started ({})",
        spate_dpdk::Eal::version(),
        if eal.hugepages() {
            "hugepages"
        } else {
            "no hugepages"
        }
    );
    let pool = Arc::new(Mempool::new(&MempoolConfig::new("demo", 4095))?);
    let mut port = Port::create("net_ring_demo0")?;
    port.configure(&PortConfig::default(), pool.clone())?;
    port.start()?;
    println!(
        "spate: port {} ({}) up, MAC {}",
        port.name(),
        port.info().driver,
        mac(port.mac()?)
    );
    let (mut rx, mut tx) = (port.rx_queue(0)?, port.tx_queue(0)?);
    let (mut out, mut inn): (Burst, Burst) = (Burst::new(), Burst::new());
    let (mut sent, mut received, mut bytes) = (0usize, 0usize, 0usize);
    let started = Instant::now();
    while received < packets {
        while sent + out.len() < packets && !out.is_full() {
            let seq = (sent + out.len()) as u64;
            let mut m = pool.try_alloc()?;
            m.append(64)?
                .iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b = (seq as usize ^ i) as u8);
            m.data_mut()[..8].copy_from_slice(&seq.to_be_bytes());
            out.push(m).map_err(|_| "burst full")?;
        }
        sent += tx.tx_burst(&mut out);
        rx.rx_burst(&mut inn);
        for m in inn.drain() {
            let seq = u64::from_be_bytes(m.data()[..8].try_into()?);
            if seq != received as u64 {
                return Err(format!("packet {received} came back as {seq}").into());
            }
            bytes += m.pkt_len();
            received += 1;
        }
    }
    let elapsed = started.elapsed();
    let stats = port.stats()?;
    println!(
        "spate: sent {sent} and received {received} packets ({bytes} bytes) in bursts of up to {} in {:.1} ms, every one in order and intact",
        out.capacity(),
        elapsed.as_secs_f64() * 1e3
    );
    println!(
        "spate: port counters: {} out, {} in; mbufs in use: {}",
        stats.opackets,
        stats.ipackets,
        pool.in_use()
    );
    Ok(())
}

fn mac(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

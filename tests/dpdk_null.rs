//! net_null: configure, start, stop, statistics, link, and a worker lcore
//! polling it.

use std::sync::Arc;

use spate::dpdk::{Burst, Memory, Mempool, MempoolConfig, Port, PortConfig, lcore};
use spate_testkit::{device_lock, shared_eal, unique};

#[test]
fn null_port_lifecycle_stats_and_link() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let pool = Arc::new(Mempool::new(&MempoolConfig::new(&unique("null"), 8191)).unwrap());
    {
        let mut port = Port::create(&format!("{},size=64", unique("net_null"))).unwrap();
        assert_eq!(port.info().driver, "net_null");
        port.configure(&PortConfig { rx_desc: 512, tx_desc: 512, ..PortConfig::default() }, pool.clone()).unwrap();
        assert!(!port.link().unwrap().up, "down before start");
        port.start().unwrap();
        assert!(port.is_started());
        assert!(port.link().unwrap().up, "up after start");
        assert_eq!(port.mac().unwrap().len(), 6);

        let mut rx = port.rx_queue(0).unwrap();
        let mut tx = port.tx_queue(0).unwrap();
        let mut burst: Burst = Burst::new();
        let (mut received, mut sent) = (0u64, 0u64);
        for _ in 0..100 {
            received += rx.rx_burst(&mut burst) as u64;
            assert!(burst.as_slice().iter().all(|m| m.pkt_len() == 64));
            sent += tx.tx_burst(&mut burst) as u64;
            burst.clear();
        }
        assert_eq!(received, 3200, "net_null fills every burst");
        let stats = port.stats().unwrap();
        assert_eq!(stats.ipackets, received);
        assert_eq!(stats.opackets, sent);
        let xstats = port.xstats().unwrap();
        let good = xstats.iter().find(|(n, _)| n == "rx_good_packets").map(|(_, v)| *v);
        assert_eq!(good, Some(received), "xstats: {xstats:?}");
        port.reset_stats().unwrap();
        assert_eq!(port.stats().unwrap().ipackets, 0);

        drop((rx, tx));
        port.stop().unwrap();
        assert!(!port.is_started());
        assert!(!port.link().unwrap().up, "down after stop");
        // Restart after stop works and keeps the configuration.
        port.start().unwrap();
        assert!(port.link().unwrap().up);
    }
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn worker_lcore_polls_a_port_and_returns() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let worker = *lcore::workers().first().expect("the test EAL has lcores 0-1");
    let pool = Arc::new(Mempool::new(&MempoolConfig::new(&unique("nullw"), 8191)).unwrap());
    {
        let mut port = Port::create(&unique("net_null")).unwrap();
        port.configure(&PortConfig::default(), pool.clone()).unwrap();
        port.start().unwrap();
        let mut rx = port.rx_queue(0).unwrap();
        let job = lcore::launch(worker, move || {
            assert_eq!(lcore::current(), Some(worker));
            let mut burst: Burst = Burst::new();
            let mut n = 0;
            for _ in 0..50 {
                n += rx.rx_burst(&mut burst);
                burst.clear();
            }
            n as i32
        })
        .unwrap();
        assert_eq!(job.lcore(), worker);
        assert_eq!(job.join(), 50 * 32);
        // A panicking job is reported, not propagated across the FFI boundary.
        let job = lcore::launch(worker, || panic!("on purpose")).unwrap();
        assert_eq!(job.join(), -1);
        assert!(lcore::launch(lcore::main_lcore(), || 0).is_err(), "the main lcore is the caller's");
    }
    assert_eq!(pool.in_use(), 0);
}

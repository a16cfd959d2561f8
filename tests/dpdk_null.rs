//! net_null: configure, start, stop, statistics, link, and a worker lcore
//! polling it; joining a worker's job sleeps until it ends.

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
        // The caller sleeps until the job ends, without waking to look (a
        // caller sharing a CPU with an lcore would take it away).
        let job = lcore::launch(worker, || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            3
        })
        .unwrap();
        let before = voluntary_switches();
        assert_eq!(job.join(), 3);
        let woke = voluntary_switches() - before;
        assert!(woke <= 5, "the joining thread woke {woke} times in 300 ms");
        assert!(lcore::launch(lcore::main_lcore(), || 0).is_err(), "the main lcore is the caller's");
    }
    assert_eq!(pool.in_use(), 0);
}

/// The calling thread's voluntary context switches (its sleeps).
fn voluntary_switches() -> u64 {
    let status = std::fs::read_to_string("/proc/thread-self/status").expect("the thread's status");
    let line = status.lines().find_map(|l| l.strip_prefix("voluntary_ctxt_switches:")).expect("a count");
    line.trim().parse().expect("a number")
}

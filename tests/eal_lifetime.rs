//! The EAL's lifetime (a process of its own: one EAL per process). What
//! needs the EAL keeps it up: dropping the `Eal` handle while a mempool,
//! its mbufs, a port and an lcore job live leaves them working, and
//! `rte_eal_cleanup` runs after the last of them. (Before, dropping the
//! handle cleaned the EAL up under them: the pool's memory went with it.)

use spate::dpdk::{Burst, Eal, EalBuilder, Memory, Mempool, MempoolConfig, Port, PortConfig};

#[test]
fn the_eal_outlives_what_needs_it() {
    let _ = env_logger::builder().is_test(true).try_init();
    let eal = EalBuilder::new().lcores("0-1").memory(Memory::NoHuge).init().expect("EAL starts");
    spate::dpdk::lcore::unpin_current_thread().unwrap();
    let pool = std::sync::Arc::new(Mempool::new(&MempoolConfig::new("life", 511)).unwrap());
    let mut port = Port::create(&spate_testkit::unique("net_ring")).unwrap();
    port.configure(&PortConfig::default(), pool.clone()).unwrap();
    port.start().unwrap();
    let mut held = pool.alloc().unwrap();
    let worker = spate::dpdk::lcore::launch(1, || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        7
    })
    .unwrap();

    drop(eal);
    assert!(Eal::is_running(), "the pool, an mbuf, a port and a job still need it");
    // All of it still works.
    held.append(64).unwrap().fill(0xab);
    assert_eq!(held.data()[63], 0xab);
    let mut b: Burst = Burst::new();
    pool.alloc_bulk(&mut b, 8).unwrap();
    let mut txq = port.tx_queue(0).unwrap();
    txq.tx_burst(&mut b);
    drop(b);
    assert_eq!(worker.join(), 7);
    drop(txq);
    drop(held);
    port.stop().unwrap();
    drop(port);
    assert!(Eal::is_running(), "the pool still needs it");
    drop(pool);
    assert!(!Eal::is_running(), "cleaned up after the last user");
    assert!(Mempool::new(&MempoolConfig::new("late", 63)).is_err());
}

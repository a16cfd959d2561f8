//! Misuse of a running DPDK layer gets a clear error: nothing panics or
//! hangs. One test function, because the order matters: the EAL starts once
//! per process. (Arguments that stop the EAL from starting are in
//! eal_errors.rs, a process of its own.)

use std::sync::Arc;

use spate::dpdk::{Burst, EalBuilder, Error, Memory, Mempool, MempoolConfig, Port, PortConfig, Rss};
use spate_testkit::unique;

#[test]
fn bad_input_gets_clear_errors() {
    let _ = env_logger::builder().is_test(true).try_init();

    // Before the EAL runs.
    assert!(matches!(Port::open("net_ring0"), Err(Error::EalNotRunning)));
    assert!(matches!(Mempool::new(&MempoolConfig::new("early", 63)), Err(Error::EalNotRunning)));

    let eal = EalBuilder::new().lcores("0-1").memory(Memory::NoHuge).init().expect("EAL starts");
    assert!(!eal.hugepages());
    assert!(!eal.runtime_dir().exists(), "the runtime folder is removed right after init");
    spate::dpdk::lcore::unpin_current_thread().unwrap();

    // A second start in the same process.
    let e = EalBuilder::new().memory(Memory::NoHuge).init().unwrap_err();
    assert!(matches!(e, Error::EalAlreadyStarted(_)), "{e}");
    assert!(e.to_string().contains("started already"), "{e}");

    // Devices that do not exist.
    match Port::open("net_nothing_here0") {
        Err(Error::NoSuchPort { name, .. }) => assert_eq!(name, "net_nothing_here0"),
        other => panic!("unexpected {other:?}"),
    }
    let e = Port::create("net_doesnotexist0").unwrap_err();
    assert!(matches!(e, Error::Vdev { .. }), "{e}");
    assert!(e.to_string().contains("net_doesnotexist0"));

    // Pools: bad names, duplicates, exhaustion.
    let long = "x".repeat(40);
    assert!(matches!(Mempool::new(&MempoolConfig::new(&long, 63)), Err(Error::MempoolCreate { .. })));
    let name = unique("tiny");
    let mut cfg = MempoolConfig::new(&name, 63);
    cfg.cache_size = 0;
    let pool = Arc::new(Mempool::new(&cfg).unwrap());
    let dup = Mempool::new(&cfg).unwrap_err();
    assert!(matches!(dup, Error::MempoolCreate { errno, .. } if errno == libc::EEXIST), "{dup}");
    let held: Vec<_> = (0..63).map(|_| pool.try_alloc().unwrap()).collect();
    match pool.try_alloc() {
        Err(Error::MempoolExhausted { in_use, size, wanted, .. }) => assert_eq!((in_use, size, wanted), (63, 63, 1)),
        other => panic!("unexpected {other:?}"),
    }
    let mut b: Burst = Burst::new();
    assert!(matches!(pool.alloc_bulk(&mut b, 8), Err(Error::MempoolExhausted { .. })));
    assert!(b.is_empty(), "a failed bulk allocation hands out nothing");
    drop(held);
    assert_eq!(pool.in_use(), 0);
    pool.alloc_bulk(&mut b, 8).unwrap();
    assert_eq!(pool.in_use(), 8);
    drop(b);
    assert_eq!(pool.in_use(), 0);

    // Port configuration the device cannot honour.
    let mut ring = Port::create(&unique("net_ring")).unwrap();
    let rss = PortConfig { rss: Rss::Required, ..PortConfig::default() };
    let e = ring.configure(&rss, pool.clone()).unwrap_err();
    assert!(e.to_string().contains("RSS"), "{e}");
    assert!(!ring.info().supports_rss());
    let many = PortConfig { rx_queues: 1000, ..PortConfig::default() };
    assert!(matches!(ring.configure(&many, pool.clone()), Err(Error::Unsupported { .. })));
    assert!(ring.start().is_err(), "start before configure");
    assert!(ring.rx_queue(0).is_err(), "no queues before configure");
    ring.configure(&PortConfig::default(), pool.clone()).unwrap();
    ring.start().unwrap();
    let q = ring.rx_queue(0).unwrap();
    assert!(ring.rx_queue(0).is_err(), "one handle per queue");
    assert!(ring.rx_queue(1).is_err(), "no such queue");
    assert!(ring.stop().is_err(), "no stop while a queue handle lives");
    drop(q);
    ring.stop().unwrap();

    // Configuring again resets which queues have handles: refused while
    // one lives (it used to pass, and a second handle to the same queue
    // could then be taken: two pollers on one queue).
    let q = ring.rx_queue(0).unwrap();
    let e = ring.configure(&PortConfig::default(), pool.clone()).unwrap_err();
    assert!(e.to_string().contains("handles are alive"), "{e}");
    assert!(ring.rx_queue(0).is_err(), "still one handle per queue");
    drop(q);
    ring.configure(&PortConfig::default(), pool.clone()).unwrap();

    // A second `Port` handle to the device is no queue handle: stop is
    // not refused for it (it used to count every handle).
    ring.start().unwrap();
    let twin = Port::open(ring.name()).unwrap();
    ring.stop().unwrap();
    assert!(!twin.is_started());
    // And both handles change the port's state under its one lock.
    twin.set_promiscuous(true).unwrap();
    assert!(ring.promiscuous());
}

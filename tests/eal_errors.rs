//! EAL arguments that are wrong get a clear error, before or from DPDK, and
//! a failed start is not retried with DPDK's leftover state.

use spate::dpdk::{EalBuilder, Error, Memory, Mempool, MempoolConfig, Port};

#[test]
fn invalid_eal_arguments_get_clear_errors() {
    let _ = env_logger::builder().is_test(true).try_init();

    // Before the EAL runs.
    assert!(matches!(Port::open("net_ring0"), Err(Error::EalNotRunning)));
    assert!(matches!(Mempool::new(&MempoolConfig::new("early", 63)), Err(Error::EalNotRunning)));

    // Arguments spate refuses before DPDK sees them; these do not count as a start.
    let e = EalBuilder::new().args(["--no-huge", "--in-memory"]).init().unwrap_err();
    assert!(e.to_string().contains("cannot be combined"), "{e}");
    let e = EalBuilder::new().lcores("0").args(["-l", "1"]).init().unwrap_err();
    assert!(matches!(e, Error::InvalidEalArgs(_)), "{e}");
    let e = EalBuilder::new().pci("0000:00:04.0").args(["--no-pci"]).init().unwrap_err();
    assert!(matches!(e, Error::InvalidEalArgs(_)), "{e}");

    // Arguments DPDK refuses: rte_errno and its text.
    let e = EalBuilder::new().memory(Memory::NoHuge).lcores("0").args(["--no-such-eal-flag"]).init().unwrap_err();
    match &e {
        Error::EalInit { errno, text, reason } => {
            assert_eq!(*errno, libc::EINVAL);
            assert_eq!(text, "Invalid argument");
            assert!(reason.contains("--no-such-eal-flag"));
        }
        other => panic!("unexpected {other}"),
    }

    // DPDK keeps what it parsed; spate says so instead of retrying.
    let e = EalBuilder::new().memory(Memory::NoHuge).lcores("0").init().unwrap_err();
    assert!(matches!(e, Error::EalAlreadyStarted(_)), "{e}");
    assert!(e.to_string().contains("failed to start"), "{e}");
    assert!(!spate::dpdk::Eal::is_running());
}

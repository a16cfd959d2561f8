//! One EAL per test process, and a lock that keeps device tests serial.

use std::sync::{Mutex, MutexGuard, OnceLock};

use spate_dpdk::{Eal, EalBuilder, Memory};

static EAL: OnceLock<Eal> = OnceLock::new();
static DEVICES: Mutex<()> = Mutex::new(());

/// The process's EAL, started on first use with lcores 0-1 and `memory`.
/// Later callers share it; one that needs hugepages fails clearly when the
/// first caller started it without them.
pub fn shared_eal(memory: Memory) -> &'static Eal {
    let _ = env_logger::builder().is_test(true).try_init();
    let eal = EAL.get_or_init(|| {
        let eal =
            EalBuilder::new().program("spate-test").lcores("0-1").memory(memory).memory_mb(512).init().unwrap_or_else(
                |e| panic!("{e}\nthe tests need DPDK and, for vhost-user, hugepages: run `cargo xtask setup` as root"),
            );
        // The EAL pinned this (test harness) thread to the main lcore's CPU.
        spate_dpdk::lcore::unpin_current_thread().expect("unpin test thread");
        eal
    });
    assert!(
        memory != Memory::Hugepages || eal.hugepages(),
        "this test needs hugepages but the process's EAL runs without them"
    );
    eal
}

/// Serialises tests that use devices, hugepages or child processes.
pub fn device_lock() -> MutexGuard<'static, ()> {
    DEVICES.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

//! Shared by spate's integration tests and benchmarks: one EAL per test
//! process, a lock that runs device tests one at a time, guards that end
//! child processes (also when a test fails or dies), a `dpdk-testpmd`
//! driver, and unique names for everything a test creates.

pub mod c_build;
pub mod callgrind;
pub mod eal;
pub mod names;
pub mod netns;
pub mod ovs;
pub mod process;
pub mod rig;
pub mod spate;
pub mod stats;
pub mod testpmd;
mod unsafe_libc;
pub mod wire_peer;

pub use eal::{device_lock, shared_eal};
pub use names::{unique, unique_socket_path};
pub use netns::{
    Netns, af_packet_stack, behind_a_small_link, echo_every_size, echo_sizes, kernel_peer, kernel_udp_counters,
    spate_and_kernel, veth,
};
pub use process::Proc;
pub use rig::{WireRig, recv_datagrams, spate_port, spate_port_dual, stack_config};
pub use spate::{
    RelayLeg, SpateApp, capture_frames, counter, echo_after_gaps, parse_counters, port_counter, start_dump, stop_relay,
};
pub use testpmd::{FwdStats, TestPmd, TestPmdBuilder};
pub use unsafe_libc::{pin_to_cpu, recvmmsg, set_recv_buffer};
pub use wire_peer::{Rng, WirePeer};

/// The interpreter of the virtual environment with aioquic (PyPI), an
/// independent QUIC implementation, that `cargo xtask setup --tests` makes.
pub const AIOQUIC_PYTHON: &str = "/opt/spate-test/aioquic/bin/python3";

/// `promtool` (Debian's `prometheus` package, unpacked by `cargo xtask
/// setup --tests`).
pub const PROMTOOL: &str = "/opt/spate-test/prometheus/usr/bin/promtool";

/// Keeps the calling thread's CPU busy (a noisy neighbour, arithmetic the
/// compiler may not drop) until `stop` is set.
pub fn spin_until(stop: &std::sync::atomic::AtomicBool) {
    let mut x = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
}

/// Threads spinning ([`spin_until`]) until dropped, also when a test
/// fails: noisy neighbours that keep CPUs busy.
#[derive(Debug)]
pub struct Spinners {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Spinners {
    /// `n` threads, each free to run on any CPU.
    pub fn unpinned(n: usize) -> Spinners {
        Spinners::start(n, None)
    }

    /// One thread on CPU `cpu`.
    pub fn pinned(cpu: usize) -> Spinners {
        Spinners::start(1, Some(cpu))
    }

    fn start(n: usize, cpu: Option<usize>) -> Spinners {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    if let Some(cpu) = cpu {
                        pin_to_cpu(cpu).expect("pin the spinning thread");
                    }
                    spin_until(&stop)
                })
            })
            .collect();
        Spinners { stop, threads }
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The CPU's model name (`/proc/cpuinfo`), printed with every benchmark
/// table: the same code costs different cycles on different machines.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name").map(|m| m.trim_start_matches([' ', '\t', ':']).to_string()))
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

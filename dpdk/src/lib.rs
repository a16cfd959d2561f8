//! spate's DPDK layer, and the only crate of spate with FFI.
//!
//! `sys` holds the raw bindings bindgen generates from the system DPDK
//! (>= 22.11, found with pkg-config) plus a C shim for DPDK's static-inline
//! functions. Everything else is a safe API over it:
//!
//! - [`EalBuilder`] / [`Eal`]: the EAL, started once per process, always
//!   with `--no-pci` unless PCI devices are named.
//! - [`Mempool`], [`Mbuf`], [`Burst`]: packet buffers, owned and freed
//!   exactly once, moved in fixed-size bursts without heap allocation.
//! - [`Port`], [`RxQueue`], [`TxQueue`]: ethdev configuration, link,
//!   statistics and burst I/O.
//! - [`lcore`]: running closures on worker lcores, affinity, the TSC.
//! - [`signal`]: SIGINT/SIGTERM to a stop flag, SIGPIPE ignored.
//!
//! ```no_run
//! use std::sync::Arc;
//! use spate_dpdk::{Burst, EalBuilder, Mempool, MempoolConfig, Port, PortConfig};
//!
//! let _eal = EalBuilder::new().lcores("0").vdev("net_ring0").init()?;
//! let pool = Arc::new(Mempool::new(&MempoolConfig::new("pool", 8191))?);
//! let mut port = Port::open("net_ring0")?;
//! port.configure(&PortConfig::default(), pool.clone())?;
//! port.start()?;
//! let (mut rx, mut tx) = (port.rx_queue(0)?, port.tx_queue(0)?);
//! let mut burst: Burst = Burst::new();
//! rx.rx_burst(&mut burst);
//! tx.tx_burst(&mut burst); // what the device did not take stays in `burst`
//! # Ok::<(), spate_dpdk::Error>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod burst;
pub mod eal;
pub mod error;
pub mod lcore;
pub mod mbuf;
pub mod mempool;
pub mod port;
pub mod process;
pub mod ring;
pub mod sched;
pub mod signal;
pub mod sleep;
pub mod sys;
pub mod xdp;

pub use burst::{BURST_SIZE, Burst};
pub use eal::{Eal, EalBuilder, EalRef, Memory};
pub use error::{Error, Result};
pub use mbuf::{Mbuf, RxChecksum, SharedMbuf};
pub use mempool::{Mempool, MempoolConfig, PoolOrder};
pub use port::{DeviceInfo, Link, Port, PortConfig, PortStats, Rss, RxQueue, TxQueue};
pub use ring::{RingConsumer, RingProducer, mbuf_ring};
pub use sleep::{Bell, Sleeper, Woke};

//! spate's UDP/IP stack.
//!
//! Build a [`Stack`] from a [`StackConfig`], bind [`UdpSocket`]s on it, and
//! either let the stack poll on its lcores while ordinary threads use the
//! sockets ([`Stack::spawn`]), or run the application on the lcores
//! themselves ([`Stack::run`], run-to-completion).
//!
//! The modules are in layers whose imports only point down (the table is
//! `stack/layers.toml`; `cargo xtask test` checks it):
//!
//! - leaves: `wire`, `stats`, `time`, `config`, `error`, `addr`, `sync`,
//!   `app_thread`;
//! - protocol state, without I/O where it can be: `hdr` (header writers),
//!   `iface`, `route`, `rss`, `ip_id`, `lookup`, `rx_queue`, `datagram`,
//!   `neigh`, `frag`;
//! - shared state: `shared` (`Shared`, the [`Stack`] handle, the socket's
//!   core, the hand-off types);
//! - the engine (`engine`: the polling loop and the receive stages) beside
//!   the sockets (`socket`), which never import each other;
//! - setup (`setup`: building a stack, running it).
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod addr;
mod app_thread;
mod buf;
mod capture;
pub mod config;
mod control_plane;
mod datagram;
mod engine;
mod error;
mod frag;
mod hdr;
mod iface;
mod ip_id;
mod lookup;
mod mcast;
mod neigh;
mod route;
mod rss;
mod rx_queue;
mod setup;
mod shared;
mod socket;
mod stats;
mod sync;
mod time;
pub mod wire;

pub use config::{Cidr, MbufBudget, PortSpec, StackConfig, StaticNeighbor};
pub use control_plane::Stack;
pub use control_plane::filters::DeviceFilter;
pub use datagram::{Datagram, DatagramBatch, Ecn, RecvMeta, SendBuf, SendMeta, Staged};
pub use engine::LcoreCtx;
pub use error::{Error, Result};
pub use iface::{Interface, Tunnel};
pub use route::StaticRoute;
pub use setup::{Running, control};
pub use socket::{Event, GSO_MAX_SEGMENTS, Interest, Poller, SocketBuilder, UdpSocket};
pub use stats::{Counter, Counters};
pub use time::Instant;

/// What spate's own benchmarks and property tests reach inside the stack:
/// a fixed list, behind the `internals` feature. Not part of the API.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals {
    pub use crate::buf::{MemBuf, PacketBuf};
    pub use crate::ip_id::{BUCKETS, FRESH, IDLE_STEP_MAX, IpIdGen, LEASE};
    pub use crate::lookup::{Binding, Family, FlowKey, SocketTable};
    pub use crate::rx_queue::{Refusal, SocketQueue, Truesize, Wait};
    pub use crate::shared::doorbell::Doorbell;
    /// The I/O-free reassembly table (the fuzz target drives it).
    pub mod reassembly {
        pub use crate::frag::reassembly::*;
        pub use crate::time::Instant;
    }
    /// The capture's filter language (the fuzz target runs programs).
    pub use crate::capture::bpf;
    /// Frames captured from Linux (the fuzz test mutates them).
    pub mod fixtures {
        pub use crate::wire::fixtures::*;
    }
}

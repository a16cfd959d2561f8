//! spate: a userspace UDP/IP stack on DPDK.
//!
//! Applications depend on this crate: the stack's user-facing types are at
//! its root ([`Stack`], [`StackConfig`], [`UdpSocket`], [`Datagram`], ...),
//! the configuration and wire formats in [`config`] and [`wire`], and the
//! DPDK layer it runs on in [`dpdk`]. It pulls in no command-line parser,
//! allocator or logger: the programs live in `spate-apps`.
//!
//! The README follows; its examples are compiled as part of the tests.
#![doc = include_str!("../README.md")]

pub use spate_dpdk as dpdk;
pub use spate_stack::{
    Cidr, Counter, Counters, Datagram, DatagramBatch, DeviceFilter, Ecn, Error, Event, GSO_MAX_SEGMENTS, Instant,
    Interest, Interface, LcoreCtx, Poller, PortSpec, RecvMeta, Result, Running, SendBuf, SendMeta, SocketBuilder,
    Stack, StackConfig, StaticNeighbor, StaticRoute, Tunnel, UdpSocket, config, control, wire,
};

#[cfg(feature = "internals")]
#[doc(hidden)]
pub use spate_stack::internals;

#[cfg(feature = "quinn")]
mod quinn_socket;
#[cfg(feature = "quinn")]
pub use quinn_socket::QuinnSocket;
#[cfg(feature = "quinn")]
mod quinn_runtime;
#[cfg(feature = "quinn")]
pub use quinn_runtime::LcoreRuntime;

/// The guides in `docs/`, compiled as doctests so their examples keep
/// working.
#[cfg(doctest)]
mod docs {
    #[doc = include_str!("../docs/configuration.md")]
    struct Configuration;
    #[doc = include_str!("../docs/deployment.md")]
    struct Deployment;
    #[doc = include_str!("../docs/design.md")]
    struct Design;
    #[doc = include_str!("../docs/dpdk.md")]
    struct Dpdk;
    #[doc = include_str!("../docs/performance.md")]
    struct Performance;
    #[doc = include_str!("../docs/testing.md")]
    struct Testing;
}

//! spate: a userspace UDP/IP stack on DPDK.
//!
//! Applications depend on this crate. It re-exports the stack's public API
//! as [`stack`] and the DPDK layer it runs on as [`dpdk`].
//!
//! The README follows; its examples are compiled as part of the tests.
#![doc = include_str!("../README.md")]

pub use spate_dpdk as dpdk;
pub use spate_stack as stack;

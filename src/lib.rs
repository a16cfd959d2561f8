//! spate: a userspace UDP/IP stack on DPDK.
//!
//! Applications depend on this crate. It re-exports the stack's public API
//! ([`stack`]) and the DPDK layer it runs on ([`dpdk`]).

pub use spate_dpdk as dpdk;
pub use spate_stack as stack;

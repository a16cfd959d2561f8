//! spate's UDP/IP stack.
#![deny(unsafe_code)]

pub mod config;
pub mod error;
pub mod iface;
pub mod neigh;
pub mod route;
pub mod stats;
pub mod time;
pub mod wire;

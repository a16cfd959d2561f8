//! spate's UDP/IP stack.
#![deny(unsafe_code)]

pub mod wire;

//! spate's UDP/IP stack.
//!
//! Build a [`Stack`] from a [`StackConfig`], bind [`UdpSocket`]s on it, and
//! either let the stack poll on its lcores while ordinary threads use the
//! sockets ([`Stack::spawn`]), or run the application on the lcores
//! themselves ([`Stack::run`], run-to-completion).
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod app_thread;
pub mod config;
pub mod datagram;
pub mod error;
pub mod frag;
mod icmp;
pub mod iface;
pub mod ip_id;
pub mod lookup;
pub mod neigh;
pub mod pipeline;
pub mod route;
pub mod rss;
pub mod rx_queue;
pub mod socket;
pub mod stack;
pub mod stats;
mod sync;
pub mod time;
pub mod wire;
mod worker;

pub use config::{Cidr, PortSpec, StackConfig};
pub use datagram::{Datagram, DatagramBatch, SendBuf};
pub use error::{Error, Result};
pub use socket::{SocketBuilder, UdpSocket};
pub use stack::{Running, Stack};
pub use stats::{Counter, Counters};
pub use worker::LcoreCtx;

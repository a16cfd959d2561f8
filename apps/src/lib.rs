//! Programs built on spate's public API. The binaries in `src/bin/` are
//! declared by the root package (so integration tests can name them with
//! `CARGO_BIN_EXE_*`); their logic lives here.

pub mod check;
pub mod cli;
pub mod echo;
pub mod flood;
pub mod iperf;
pub mod relay;
pub mod report;
pub mod sink;

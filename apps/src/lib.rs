//! Programs built on spate's public API (the `spate` crate alone). The
//! binaries in `src/bin/` are this package's, and so are spate's
//! integration tests and benchmarks (the workspace's `tests/` and
//! `benches/`), which name them with `CARGO_BIN_EXE_*`; their logic lives
//! here.

pub mod check;
pub mod cli;
pub mod dump;
pub mod echo;
pub mod flood;
pub mod iperf;
pub mod quic;
pub mod relay;
pub mod report;
pub mod run;
pub mod sink;
pub mod stat;

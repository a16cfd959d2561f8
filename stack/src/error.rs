//! Errors of building and running a stack. Socket calls return
//! `std::io::Result`, as `std::net::UdpSocket` does.

/// What went wrong setting up or running a stack.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The DPDK layer failed.
    #[error(transparent)]
    Dpdk(#[from] spate_dpdk::Error),
    /// The configuration is wrong.
    #[error("configuration: {0}")]
    Config(String),
    /// The stack cannot do what was asked in its current state.
    #[error("{0}")]
    State(String),
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

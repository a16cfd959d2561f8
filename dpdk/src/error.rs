//! One error type for the DPDK layer, carrying `rte_errno` and its text.

use std::ffi::CStr;

use crate::sys;

/// What went wrong in the DPDK layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `rte_eal_init` refused its arguments or failed to start.
    #[error("EAL initialisation failed: {reason} (rte_errno {errno}: {text})")]
    EalInit {
        /// What spate was doing.
        reason: String,
        /// `rte_errno` after the failure.
        errno: i32,
        /// `rte_strerror(errno)`.
        text: String,
    },
    /// EAL arguments that spate rejects before DPDK sees them.
    #[error("invalid EAL arguments: {0}")]
    InvalidEalArgs(String),
    /// The EAL starts once per process; it is running, has been shut down,
    /// or failed to start.
    #[error("the EAL starts once per process, and in this one it has {0}")]
    EalAlreadyStarted(&'static str),
    /// An operation needs a running EAL.
    #[error("the EAL is not running: start it with spate_dpdk::Eal first")]
    EalNotRunning,
    /// No port has this name.
    #[error("no DPDK port named {name:?} (ports present: {present:?})")]
    NoSuchPort {
        /// The name asked for.
        name: String,
        /// The names of the ports that do exist.
        present: Vec<String>,
    },
    /// A virtual device could not be created.
    #[error("cannot create virtual device {spec:?}: rte_errno {errno}: {text}")]
    Vdev {
        /// The device string given.
        spec: String,
        /// The error DPDK returned.
        errno: i32,
        /// Its text.
        text: String,
    },
    /// A port operation failed.
    #[error("port {port} ({name}): {op} failed: error {errno}: {text}")]
    Port {
        /// Port id.
        port: u16,
        /// Port name.
        name: String,
        /// The ethdev call.
        op: &'static str,
        /// The (positive) error number DPDK returned.
        errno: i32,
        /// Its text.
        text: String,
    },
    /// A port configuration the device cannot honour.
    #[error("port {port} ({name}, driver {driver}): {what}")]
    Unsupported {
        /// Port id.
        port: u16,
        /// Port name.
        name: String,
        /// The PMD's name.
        driver: String,
        /// What it cannot do.
        what: String,
    },
    /// A mempool could not be created.
    #[error("cannot create mempool {name:?} of {size} mbufs: rte_errno {errno}: {text}")]
    MempoolCreate {
        /// Pool name.
        name: String,
        /// Requested number of mbufs.
        size: u32,
        /// `rte_errno`.
        errno: i32,
        /// Its text.
        text: String,
    },
    /// Every mbuf of the pool is in use.
    #[error("mempool {name:?} is exhausted: {in_use} of {size} mbufs in use, {wanted} more wanted")]
    MempoolExhausted {
        /// Pool name.
        name: String,
        /// Mbufs handed out.
        in_use: u32,
        /// Pool size.
        size: u32,
        /// How many the caller asked for.
        wanted: u32,
    },
    /// A ring could not be created.
    #[error("cannot create a ring of {capacity}: {what}")]
    Ring {
        /// Requested capacity.
        capacity: u32,
        /// Why.
        what: String,
    },
    /// An mbuf operation that would leave its bounds.
    #[error("mbuf has no room: {0}")]
    MbufRoom(&'static str),
    /// A system call failed.
    #[error("{op} failed: error {errno}: {}", std::io::Error::from_raw_os_error(*errno))]
    Os {
        /// The call.
        op: String,
        /// Its errno.
        errno: i32,
    },
    /// Launching work on an lcore failed.
    #[error("lcore {lcore}: {what}")]
    Lcore {
        /// The lcore id.
        lcore: u32,
        /// What went wrong.
        what: String,
    },
}

/// Result alias of the DPDK layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The current thread's `rte_errno`.
pub fn rte_errno() -> i32 {
    // SAFETY: reads a thread-local integer through the shim.
    unsafe { sys::spate_errno() }
}

/// `rte_strerror(errno)` as an owned string.
pub fn strerror(errno: i32) -> String {
    // SAFETY: rte_strerror returns a pointer to a static or thread-local
    // NUL-terminated string, valid until the next call on this thread.
    unsafe {
        let text = sys::rte_strerror(errno);
        if text.is_null() { format!("error {errno}") } else { CStr::from_ptr(text).to_string_lossy().into_owned() }
    }
}

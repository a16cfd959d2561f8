//! Unique names: vdevs, pools, sockets and file prefixes never collide
//! between tests, processes or runs.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// `prefix` + this process's id + a sequence number, e.g. `net_ring12345_0`.
/// Kept short: DPDK mempool names hold at most 25 bytes.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}{}_{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed))
}

/// A fresh unix socket path under /tmp (removed by whoever starts the server).
pub fn unique_socket_path(what: &str) -> PathBuf {
    PathBuf::from(format!("/tmp/{}.sock", unique(&format!("spate-{what}-"))))
}

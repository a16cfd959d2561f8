//! The threads that serve the stack from outside the datapath (the
//! control endpoint, the metrics endpoint), as the control plane keeps
//! them: stopped, and their unix socket removed, when the stack goes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A thread that serves the stack from outside the datapath (the control
/// endpoint, the metrics endpoint: `setup` starts them, holding the stack
/// only weakly between requests), blocked in `accept` on its listener
/// (with a timeout) until `stop` is set.
#[derive(Debug)]
pub(crate) struct ServiceThread {
    pub listener: Listener,
    pub stop: Arc<AtomicBool>,
    pub thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// Where a [`ServiceThread`] listens.
#[derive(Debug)]
pub(crate) enum Listener {
    /// A unix socket (its path and inode), removed when the thread stops
    /// if it is still ours.
    Unix(std::path::PathBuf, u64),
    /// A TCP address.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    Tcp(std::net::SocketAddr),
}

impl ServiceThread {
    /// Stops the thread and removes its unix socket if it is still ours;
    /// once (a second call finds the thread gone and does nothing).
    pub fn close(&self) {
        use std::os::unix::fs::MetadataExt;
        if self.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        // A connection wakes the thread blocked in accept; if it cannot
        // reach it, the accept timeout does, within a second.
        let ours = match &self.listener {
            Listener::Unix(p, ino) => {
                // Only our own socket: another stack may have its name now.
                let ours = std::fs::symlink_metadata(p).is_ok_and(|m| m.ino() == *ino);
                if ours {
                    drop(std::os::unix::net::UnixStream::connect(p));
                }
                ours
            }
            Listener::Tcp(a) => {
                drop(std::net::TcpStream::connect_timeout(a, std::time::Duration::from_millis(200)));
                false
            }
        };
        let t = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        // The last handle may go on that thread itself, within a request.
        if let Some(t) = t.filter(|t| t.thread().id() != std::thread::current().id()) {
            let _ = t.join();
        }
        if let (Listener::Unix(p, _), true) = (&self.listener, ours) {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for ServiceThread {
    fn drop(&mut self) {
        self.close();
    }
}

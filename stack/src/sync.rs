//! The synchronisation primitives the concurrent structures use:
//! parking_lot's locks (no poisoning: a panic elsewhere must not wedge the
//! datapath, and an uncontended lock and unlock are one atomic each,
//! inline) and std's atomics, or loom's of both when the crate is built
//! with `--cfg loom` for model checking.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use parking_lot::{Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};

/// Locks.
#[inline(always)]
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(loom)]
    {
        m.lock().unwrap()
    }
    #[cfg(not(loom))]
    {
        m.lock()
    }
}

/// Waits on `cv` with `g` held, up to `timeout` if there is one (loom
/// models no time: it waits for a notification).
pub(crate) fn wait<'a, T>(
    cv: &Condvar,
    g: MutexGuard<'a, T>,
    timeout: Option<std::time::Duration>,
) -> MutexGuard<'a, T> {
    #[cfg(loom)]
    {
        let _ = timeout;
        cv.wait(g).unwrap()
    }
    #[cfg(not(loom))]
    {
        let mut g = g;
        match timeout {
            Some(t) => {
                cv.wait_for(&mut g, t);
            }
            None => cv.wait(&mut g),
        }
        g
    }
}

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

/// Sets up this thread's part of the locks' waiting, which parking_lot
/// allocates (with its table of waiting threads, grown for each new
/// thread) the first time a thread waits: a polling lcore does it before
/// its loop, so a lock first contended on the datapath allocates nothing
/// there. A wait of no time on a lock of its own; nothing under loom.
pub(crate) fn prepare_thread() {
    #[cfg(not(loom))]
    {
        let m = Mutex::new(());
        drop(wait(&Condvar::new(), lock(&m), Some(std::time::Duration::ZERO)));
    }
}

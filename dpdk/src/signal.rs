//! SIGINT/SIGTERM set a flag that polling loops check; SIGPIPE is ignored
//! on request (a vhost-user peer that goes away must not kill spate).
//! [`block_all`] keeps the signals of the program away from the threads
//! DPDK creates (they inherit a mask with every signal blocked), and takes
//! a SIGPIPE raised meanwhile instead of delivering it.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
static SIGNALS: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_signal(_sig: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
    // A second signal restores the default action, so a stuck program can
    // still be stopped by signalling it again.
    if SIGNALS.fetch_add(1, Ordering::SeqCst) >= 1 {
        // SAFETY: signal() is async-signal-safe.
        unsafe {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
        }
    }
}

/// Installs the SIGINT and SIGTERM handlers.
pub fn install_stop_handlers() -> std::io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only touches atomics and calls signal().
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as *const () as usize;
            act.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            if libc::sigaction(sig, &act, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// Ignores SIGPIPE for the whole process.
pub fn ignore_sigpipe() {
    // SAFETY: setting a signal disposition.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

/// Whether a stop was requested (by signal or [`request_stop`]).
#[inline]
pub fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Requests a stop, as a signal would.
pub fn request_stop() {
    STOP.store(true, Ordering::SeqCst);
}

/// Every signal blocked on the calling thread while it lives (see
/// [`block_all`]).
#[derive(Debug)]
#[must_use]
pub struct AllBlocked {
    old: libc::sigset_t,
}

/// Blocks every signal on the calling thread until the guard goes: the
/// threads it creates meanwhile (the EAL's lcores and service threads,
/// drivers' threads) keep every signal blocked for good, so the program's
/// signals reach the program's threads and a write of theirs to a closed
/// socket raises no SIGPIPE that could end it. When the guard goes, a
/// SIGPIPE raised on this thread meanwhile (a vhost-user peer gone while
/// the port started) is taken, not delivered, and the old mask comes back.
pub fn block_all() -> AllBlocked {
    // SAFETY: sigset_t is plain data; pthread_sigmask reads a full set and
    // writes the old one into a set we own.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        AllBlocked { old }
    }
}

impl Drop for AllBlocked {
    fn drop(&mut self) {
        // SAFETY: a set we own with SIGPIPE alone; sigtimedwait with a zero
        // timeout takes a pending SIGPIPE or returns at once; then the old
        // mask is set back.
        unsafe {
            let mut pipe: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut pipe);
            libc::sigaddset(&mut pipe, libc::SIGPIPE);
            let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            while libc::sigtimedwait(&pipe, std::ptr::null_mut(), &zero) == libc::SIGPIPE {}
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut());
        }
    }
}

/// Unblocks `sig` on the calling thread (an lcore that takes net_tap's
/// signal, its thread made with every signal blocked).
pub fn unblock(sig: i32) {
    // SAFETY: a set we own with one signal.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked(sig: i32) -> bool {
        // SAFETY: reads the mask into a set we own.
        unsafe {
            let mut cur: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
            libc::sigismember(&cur, sig) == 1
        }
    }

    #[test]
    fn threads_made_under_the_guard_block_every_signal_and_a_sigpipe_is_taken() {
        std::thread::spawn(|| {
            assert!(!blocked(libc::SIGUSR1));
            let guard = block_all();
            let child = std::thread::spawn(|| (blocked(libc::SIGUSR1), blocked(libc::SIGPIPE))).join().unwrap();
            assert_eq!(child, (true, true));
            // A SIGPIPE raised on this thread now stays pending...
            // SAFETY: raise signals the calling thread, which blocks it.
            unsafe { libc::raise(libc::SIGPIPE) };
            // ...and is taken when the guard goes (else it would end the test).
            drop(guard);
            assert!(!blocked(libc::SIGUSR1) && !blocked(libc::SIGPIPE));
        })
        .join()
        .unwrap();
    }
}

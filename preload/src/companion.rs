//! The kernel's socket beside a spate socket bound to a wildcard
//! address, so that what reaches the port through the kernel (loopback,
//! the kernel's own interfaces) reaches the program too, and replies to
//! where only the kernel goes leave through it.
//!
//! As a socket bound to a wildcard moves onto spate, the kernel socket
//! it was is kept under a number of the preload's (close-on-exec) and
//! bound to the same port in the kernel. One thread of the preload's
//! ("spate-kernel-side", every signal blocked) sleeps in an epoll of
//! these kernel sockets, each armed once (`EPOLLONESHOT`): when one has
//! something it marks it ([`ready`]) and makes the spate socket readable
//! (libspate's `spate_preload_wake`), so `poll`, `epoll` and a blocked
//! receive see it. A receive takes from the kernel socket while it is
//! marked, and when it finds it empty clears the mark and arms it again;
//! the mark is set before the wake, and a receive looks at it after
//! spate's queue was found empty, so no arrival goes unseen.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use crate::dlopen::loaded as lib;
use crate::fds::FDS;
use crate::libc_next as real;

/// Per program number: its spate socket's kernel socket's number, plus
/// one (0: none).
static KERNEL_OF: [AtomicI32; FDS] = [const { AtomicI32::new(0) }; FDS];
/// Per kernel socket number: it has something the program has not taken.
static READY: [AtomicBool; FDS] = [const { AtomicBool::new(false) }; FDS];
/// Per kernel socket number: a program number of its spate socket, plus
/// one, to wake.
static NAME: [AtomicI32; FDS] = [const { AtomicI32::new(0) }; FDS];

/// The kernel socket beside spate socket `fd`, if it has one.
#[inline(always)]
pub fn of(fd: i32) -> Option<i32> {
    match KERNEL_OF.get(fd as usize).map(|k| k.load(Ordering::Acquire)) {
        Some(k) if k > 0 => Some(k - 1),
        _ => None,
    }
}

/// Whether kernel socket `k` has something for the program: the flag
/// itself, for a wait to watch.
pub fn ready(k: i32) -> &'static AtomicBool {
    &READY[k as usize]
}

/// Kernel socket `k` was found empty: the mark cleared, then the socket
/// armed again (so what came in between marks it again).
pub fn rearm(k: i32) {
    READY[k as usize].store(false, Ordering::SeqCst);
    if let Some(ep) = watcher()
        && let Err(e) = real::epoll_once(ep, k, k as u64, false)
    {
        crate::state::say(&format!("kernel socket {k} beside a spate socket cannot be watched again: errno {e}"));
    }
}

/// Keeps kernel socket `k` (bound as spate socket `fd` is) beside `fd`;
/// false, when it cannot be watched, leaves `k` to the caller to close.
pub fn attach(fd: i32, k: i32) -> bool {
    if fd as usize >= FDS || k as usize >= FDS {
        return false;
    }
    let Some(ep) = watcher() else { return false };
    READY[k as usize].store(false, Ordering::SeqCst);
    NAME[k as usize].store(fd + 1, Ordering::SeqCst);
    KERNEL_OF[fd as usize].store(k + 1, Ordering::Release);
    if real::epoll_once(ep, k, k as u64, true).is_err() {
        KERNEL_OF[fd as usize].store(0, Ordering::Release);
        NAME[k as usize].store(0, Ordering::SeqCst);
        return false;
    }
    true
}

/// `new` is another name of spate socket `fd`.
pub fn duplicated(fd: i32, new: i32) {
    if let (Some(k), Some(slot)) = (of(fd), KERNEL_OF.get(new as usize)) {
        slot.store(k + 1, Ordering::Release);
    }
}

/// Name `fd` of a spate socket is gone; with the socket's `last` name
/// its kernel socket is closed.
pub fn name_gone(fd: i32, last: bool) {
    let Some(k) = of(fd) else { return };
    KERNEL_OF[fd as usize].store(0, Ordering::Release);
    let name = &NAME[k as usize];
    if last {
        name.store(0, Ordering::SeqCst);
        READY[k as usize].store(false, Ordering::SeqCst);
        // Closing it takes it out of the watcher's epoll.
        real::close_own(k);
    } else if name.load(Ordering::SeqCst) == fd + 1 {
        // Another name to wake (a close of a duplicated socket: rare).
        let other = KERNEL_OF.iter().position(|o| o.load(Ordering::Acquire) == k + 1);
        name.store(other.map_or(0, |o| o as i32 + 1), Ordering::SeqCst);
    }
}

/// The watcher's epoll instance, its thread started on first use; `None`
/// (said once) when it cannot be.
fn watcher() -> Option<i32> {
    static WATCHER: OnceLock<Option<i32>> = OnceLock::new();
    *WATCHER.get_or_init(|| {
        let started = real::epoll_new().and_then(|ep| {
            real::with_signals_blocked(|| {
                std::thread::Builder::new().name("spate-kernel-side".into()).spawn(move || watch(ep))
            })
            .map(|_| ep)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EAGAIN))
        });
        started
            .map_err(|e| {
                crate::state::say(&format!(
                    "no thread to watch the kernel's side of wildcard sockets (errno {e}): they get spate's traffic only"
                ))
            })
            .ok()
    })
}

/// The watcher's loop: marks each kernel socket that has something and
/// wakes its spate socket.
fn watch(ep: i32) {
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
    loop {
        let n = match real::epoll_wait_all(ep, &mut events) {
            Ok(n) => n,
            Err(libc::EINTR) => continue,
            Err(e) => {
                crate::state::say(&format!("the kernel side's watcher stops: errno {e}"));
                return;
            }
        };
        for e in &events[..n] {
            let k = e.u64 as usize;
            READY[k].store(true, Ordering::SeqCst);
            let name = NAME[k].load(Ordering::SeqCst);
            if name > 0 {
                lib().wake(name - 1);
            }
        }
    }
}

//! The kernel's socket beside a spate socket bound to a wildcard
//! address, so that what reaches the port through the kernel (loopback,
//! the kernel's own interfaces) reaches the program too, and replies to
//! where only the kernel goes leave through it.
//!
//! As a socket bound to a wildcard moves onto spate, the kernel socket
//! it was is kept under a number of the preload's (close-on-exec) and
//! bound to the same port in the kernel. One thread of the preload's
//! ("spate-kernside", every signal blocked) sleeps in an epoll of
//! these kernel sockets, each armed once (`EPOLLONESHOT`): when one has
//! something it marks it ([`ready`]) and makes the spate socket readable
//! (libspate's `spate_preload_wake`), so `poll`, `epoll` and a blocked
//! receive see it. A receive takes from the kernel socket while it is
//! marked, and when it finds it empty clears the mark and arms it again.
//! The mark is set before the wake, and every receive looks at it again
//! after spate's side (whose settling may reset the descriptor the wake
//! signalled): still marked, it wakes the socket again, so an arrival is
//! not left unseen. The kernel socket sits at a high number (from half
//! the descriptor limit); a program that closes or replaces that number
//! unknowingly takes it from beside its spate socket.

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

/// `new` is another name of spate socket `fd` (or of a spate socket
/// without a kernel socket beside it: `new`'s entry is cleared).
pub fn duplicated(fd: i32, new: i32) {
    if let Some(slot) = KERNEL_OF.get(new as usize) {
        slot.store(of(fd).map_or(0, |k| k + 1), Ordering::Release);
    }
}

/// Number `fd` became a spate socket: no kernel socket beside it yet.
pub fn none(fd: i32) {
    if let Some(slot) = KERNEL_OF.get(fd as usize) {
        slot.store(0, Ordering::Release);
    }
}

/// Whether number `fd` is a kernel socket beside a spate socket.
#[inline]
pub fn is_kernel_side(fd: i32) -> bool {
    NAME.get(fd as usize).is_some_and(|n| n.load(Ordering::Relaxed) != 0)
}

/// Spate socket `fd` goes on without its kernel socket (it connected:
/// Linux's connected socket hears only its peer), which is closed.
pub fn detach(fd: i32) {
    if let Some(k) = of(fd) {
        forget_kernel(k);
        real::close_own(k);
    }
}

/// Kernel socket `k` is no longer beside any name (the program closes
/// or replaces its number, not knowing it is the preload's, or its
/// socket connected): every name's entry is cleared.
pub fn forget_kernel(k: i32) {
    let Some(name) = NAME.get(k as usize) else { return };
    name.store(0, Ordering::SeqCst);
    READY[k as usize].store(false, Ordering::SeqCst);
    for slot in KERNEL_OF.iter() {
        let _ = slot.compare_exchange(k + 1, 0, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// In a child forked after the stack started: the kernel sockets beside
/// the parent's sockets are closed (the parent's stay open, and the
/// child does not hold their ports). Async-signal-safe.
pub fn close_all_in_child() {
    for (k, name) in NAME.iter().enumerate() {
        if name.swap(0, Ordering::Relaxed) != 0 {
            real::close_own(k as i32);
        }
    }
}

/// A duplicate of kernel socket `fd` under a number of the preload's:
/// close-on-exec, and high (from half the descriptor limit up), where a
/// program's `dup2` onto 0, 1 or 2 or its own low numbers do not meet it.
pub fn keep(fd: i32) -> Option<i32> {
    let low = (real::open_limit() / 2).clamp(3, FDS as u64 / 2) as i32;
    real::dup_from(fd, low).ok().filter(|&k| (k as usize) < FDS).or_else(|| {
        crate::state::say("no descriptor for the kernel's side of a wildcard socket: it gets spate's traffic only");
        None
    })
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
        // Another name to wake (a close of a duplicated socket: rare),
        // woken now if the watcher woke the old one meanwhile.
        let other = KERNEL_OF.iter().position(|o| o.load(Ordering::Acquire) == k + 1);
        name.store(other.map_or(0, |o| o as i32 + 1), Ordering::SeqCst);
        if let Some(o) = other
            && READY[k as usize].load(Ordering::SeqCst)
        {
            lib().wake(o as i32);
        }
    }
}

/// The watcher's epoll instance, its thread started on first use; `None`
/// (said once) when it cannot be.
fn watcher() -> Option<i32> {
    static WATCHER: OnceLock<Option<i32>> = OnceLock::new();
    *WATCHER.get_or_init(|| {
        let started = real::epoll_new().and_then(|ep| {
            real::with_signals_blocked(|| {
                std::thread::Builder::new().name("spate-kernside".into()).spawn(move || watch(ep))
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
            if e.events & libc::EPOLLIN as u32 == 0 {
                // Only an error queued (IP_RECVERR set before the move):
                // the kernel's side's errors are not the program's to
                // read; dropped, so they do not wake it over and over.
                real::drain_errors(k as i32);
                rearm(k as i32);
                continue;
            }
            READY[k].store(true, Ordering::SeqCst);
            let name = NAME[k].load(Ordering::SeqCst);
            if name > 0 {
                lib().wake(name - 1);
            }
        }
    }
}

//! The system calls libspate makes itself: event descriptors (a socket's
//! readiness, a thread's wake-ups), waits on them that a signal
//! interrupts as Linux's socket waits are interrupted, and `errno`.
//!
//! Each goes to the kernel by its number (`syscall(2)`), not through the
//! C library's wrapper: under libspate-preload a socket's descriptor is
//! the program's socket, whose `read` and `write` the preload takes for
//! spate's receive and send.
#![allow(unsafe_code)]

use std::io;
use std::time::Duration;

/// A new event descriptor: `nonblocking` for a socket's readiness (read
/// only to reset it), blocking for a thread's wake-ups (read to sleep).
pub fn eventfd(nonblocking: bool) -> io::Result<i32> {
    let flags = libc::EFD_CLOEXEC | if nonblocking { libc::EFD_NONBLOCK } else { 0 };
    // SAFETY: eventfd takes no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_eventfd2, 0, flags) };
    if fd < 0 { Err(io::Error::last_os_error()) } else { Ok(fd as i32) }
}

/// A new event descriptor, also put at number `fd` (atomically closing
/// what was there, as `dup3`, close-on-exec there if `cloexec`): the
/// number the program holds is one name of it, and the one returned
/// (close-on-exec) stays libspate's, so that the program may close or
/// `dup` its own names freely.
pub fn eventfd_at(fd: i32, cloexec: bool) -> io::Result<i32> {
    let new = eventfd(true)?;
    let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
    // SAFETY: dup3 takes no pointers; `new` is ours.
    let r = unsafe { libc::syscall(libc::SYS_dup3, new, fd, flags) };
    if r < 0 {
        let err = io::Error::last_os_error();
        close(new);
        return Err(err);
    }
    Ok(new)
}

/// Makes event descriptor `fd` readable (adds one to its count).
pub fn signal(fd: i32) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a local. A full count (2^64 - 2
    // signals unread) fails with EAGAIN, and the descriptor is readable
    // then anyway.
    let _ = unsafe { libc::syscall(libc::SYS_write, fd, &one as *const u64, 8) };
}

/// Empties non-blocking event descriptor `fd` (not readable after).
pub fn reset(fd: i32) {
    let mut count: u64 = 0;
    // SAFETY: reads 8 bytes into a local; the descriptor does not block.
    let _ = unsafe { libc::syscall(libc::SYS_read, fd, &mut count as *mut u64, 8) };
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// The descriptor was signalled.
    Signalled,
    /// The timeout passed.
    TimedOut,
    /// A signal handler ran (and, for a wait without timeout, its
    /// `SA_RESTART` did not restart the read).
    Interrupted,
}

/// Sleeps on blocking event descriptor `fd`, which only the calling
/// thread reads, until it is signalled (and reads it), `timeout` passes,
/// or a signal handler interrupts. Without a timeout the sleep is a
/// blocking `read`, which the kernel restarts after a handler installed
/// with `SA_RESTART` and ends with `EINTR` after one without, as it
/// does a blocking `recv`; with one, a `ppoll`, which a handler always
/// interrupts, as Linux's `SO_RCVTIMEO` wait is.
pub fn sleep(fd: i32, timeout: Option<Duration>) -> Woken {
    if let Some(t) = timeout {
        // The kernel writes the time left into it.
        let mut ts = libc::timespec {
            tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: t.subsec_nanos() as libc::c_long,
        };
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd and a timespec, both locals the kernel may
        // write; no signal mask.
        let n = unsafe {
            libc::syscall(
                libc::SYS_ppoll,
                &mut p as *mut libc::pollfd,
                1,
                &mut ts as *mut libc::timespec,
                0usize,
                8usize,
            )
        };
        match n {
            0 => return Woken::TimedOut,
            n if n < 0 => return Woken::Interrupted,
            _ => {}
        }
    }
    let mut count: u64 = 0;
    // SAFETY: reads 8 bytes into a local. After a ppoll that saw it
    // readable it does not block: no other thread reads this descriptor.
    let n = unsafe { libc::syscall(libc::SYS_read, fd, &mut count as *mut u64, 8) };
    if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
        return Woken::Interrupted;
    }
    Woken::Signalled
}

/// Closes `fd`.
pub fn close(fd: i32) {
    // SAFETY: `fd` is a descriptor libspate opened and owns.
    unsafe { libc::syscall(libc::SYS_close, fd) };
}

/// Sets the calling thread's `errno`.
pub fn set_errno(code: i32) {
    // SAFETY: __errno_location returns the calling thread's errno.
    unsafe { *libc::__errno_location() = code };
}

/// Has `f` run when the process exits (`exit` or a return from `main`);
/// false if the C library cannot register it.
pub fn at_exit(f: extern "C" fn()) -> bool {
    // SAFETY: `f` is a function of this library, which stays loaded.
    unsafe { libc::atexit(f) == 0 }
}

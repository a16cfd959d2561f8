//! The C library's own socket calls, found with `dlsym(RTLD_NEXT)`: what
//! a call on a kernel descriptor is passed to. Each is looked up once, on
//! its first use (the program may call before any constructor ran).
//! Also the few other C calls the preload makes itself.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{
    c_int, c_long, c_uint, c_ulong, c_void, iovec, mmsghdr, msghdr, size_t, sockaddr, socklen_t, ssize_t, timespec,
};

/// The next definition of `name` (a NUL-terminated symbol) after this
/// library's, cached in `slot`.
#[inline]
fn next(slot: &AtomicUsize, name: &[u8]) -> usize {
    let f = slot.load(Ordering::Relaxed);
    if f != 0 {
        return f;
    }
    // SAFETY: `name` is NUL-terminated; RTLD_NEXT is a valid handle.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) } as usize;
    if f == 0 {
        // Without the C library's own call nothing can go on.
        let msg = b"libspate-preload: the C library has no such call\n";
        // SAFETY: a static buffer to standard error.
        unsafe { libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len()) };
        std::process::abort();
    }
    slot.store(f, Ordering::Relaxed);
    f
}

macro_rules! real {
    ($(fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {$(
        /// The C library's own call of this name.
        ///
        /// # Safety
        /// As the C call's.
        #[inline]
        pub unsafe fn $name($($arg: $ty),*) -> $ret {
            static SLOT: AtomicUsize = AtomicUsize::new(0);
            let f = next(&SLOT, concat!(stringify!($name), "\0").as_bytes());
            // SAFETY: the symbol is the C library's function of this
            // signature.
            let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(f) };
            unsafe { f($($arg),*) }
        }
    )*};
}

real! {
    fn socket(domain: c_int, kind: c_int, protocol: c_int) -> c_int;
    fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    fn close(fd: c_int) -> c_int;
    fn shutdown(fd: c_int, how: c_int) -> c_int;
    fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    fn setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
    fn getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
    fn send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t;
    fn sendto(fd: c_int, buf: *const c_void, len: size_t, flags: c_int, addr: *const sockaddr, alen: socklen_t) -> ssize_t;
    fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
    fn sendmmsg(fd: c_int, msgs: *mut mmsghdr, vlen: c_uint, flags: c_int) -> c_int;
    fn recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t;
    fn recvfrom(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int, addr: *mut sockaddr, alen: *mut socklen_t) -> ssize_t;
    fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
    fn recvmmsg(fd: c_int, msgs: *mut mmsghdr, vlen: c_uint, flags: c_int, timeout: *mut timespec) -> c_int;
    fn read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t;
    fn write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t;
    fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t;
    fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t;
    fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int;
    fn fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int;
    fn fcntl64(fd: c_int, cmd: c_int, arg: c_long) -> c_int;
    fn dup(fd: c_int) -> c_int;
    fn dup2(fd: c_int, to: c_int) -> c_int;
    fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int;
    fn __recv_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int) -> ssize_t;
    fn __recvfrom_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int, addr: *mut sockaddr, alen: *mut socklen_t) -> ssize_t;
    fn __read_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t) -> ssize_t;
    fn __chk_fail() -> ();
    fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, event: *mut libc::epoll_event) -> c_int;
    fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int;
    fn closefrom(first: c_int) -> ();
}

/// Has `f` run in the child after every `fork`.
pub fn at_fork_child(f: extern "C" fn()) {
    // SAFETY: `f` is a function of this library, which stays loaded.
    unsafe { libc::pthread_atfork(None, None, Some(f)) };
}

/// A datagram UNIX socket (close-on-exec) bound to abstract name
/// `name` of the network namespace: its descriptor, or the errno
/// (`EADDRINUSE` while another socket has the name).
pub fn abstract_bind(name: &str) -> Result<c_int, c_int> {
    // SAFETY: all-zero is a valid sockaddr_un.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = name.as_bytes();
    if bytes.len() + 1 > a.sun_path.len() {
        return Err(libc::ENAMETOOLONG);
    }
    // The first byte stays 0: an abstract name.
    for (d, s) in a.sun_path[1..].iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + bytes.len()) as socklen_t;
    // SAFETY: no pointers.
    let fd = unsafe { socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: a local sockaddr_un and the length of its used part.
    if unsafe { bind(fd, (&a as *const libc::sockaddr_un).cast(), len) } < 0 {
        let e = errno();
        close_own(fd);
        return Err(e);
    }
    Ok(fd)
}

/// Closes `fd`, a descriptor the preload owns (async-signal-safe, for a
/// fork handler).
pub fn close_own(fd: c_int) {
    // SAFETY: no pointers; the descriptor is the caller's own.
    unsafe { libc::close(fd) };
}

/// A new epoll instance (close-on-exec), or the errno.
pub fn epoll_new() -> Result<c_int, c_int> {
    // SAFETY: no pointers.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 { Err(errno()) } else { Ok(ep) }
}

/// Adds `fd` to epoll instance `ep` (`add`) or arms it again, readable
/// once (`EPOLLONESHOT`) with `data`; the errno if it cannot.
pub fn epoll_once(ep: c_int, fd: c_int, data: u64, add: bool) -> Result<(), c_int> {
    let mut ev = libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLONESHOT) as u32, u64: data };
    let op = if add { libc::EPOLL_CTL_ADD } else { libc::EPOLL_CTL_MOD };
    // SAFETY: a local event.
    match unsafe { epoll_ctl(ep, op, fd, &mut ev) } {
        0 => Ok(()),
        _ => Err(errno()),
    }
}

/// Waits on epoll instance `ep` without timeout; the data of the
/// descriptors ready, or the errno.
pub fn epoll_wait_all(ep: c_int, out: &mut [libc::epoll_event]) -> Result<usize, c_int> {
    // SAFETY: `out` has room for its length of events.
    let n = unsafe { libc::epoll_wait(ep, out.as_mut_ptr(), out.len().min(c_int::MAX as usize) as c_int, -1) };
    if n < 0 { Err(errno()) } else { Ok(n as usize) }
}

/// Runs `f` with every signal blocked in the calling thread (a thread
/// it spawns inherits the mask), then restores the thread's mask.
pub fn with_signals_blocked<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: sigset_t is plain data; all-zero is a valid start for
    // sigfillset, and both sets are locals.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    let r = f();
    // SAFETY: the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    r
}

/// A duplicate of `fd` under the lowest free number from `low`
/// (close-on-exec), or the errno.
pub fn dup_from(fd: c_int, low: c_int) -> Result<c_int, c_int> {
    // SAFETY: no pointers.
    let r = unsafe { fcntl(fd, libc::F_DUPFD_CLOEXEC, low as c_long) };
    if r < 0 { Err(errno()) } else { Ok(r) }
}

/// The process's soft limit of descriptors (`RLIMIT_NOFILE`).
pub fn open_limit() -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: a local rlimit.
    match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } {
        0 => r.rlim_cur,
        _ => 1024,
    }
}

/// Reads and drops what socket `fd`'s error queue holds (at most 64).
pub fn drain_errors(fd: c_int) {
    let mut buf = [0u8; 256];
    for _ in 0..64 {
        let mut iov = iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let mut control = [0u8; 256];
        // SAFETY: all-zero is a valid msghdr; its buffers are locals.
        let mut m: msghdr = unsafe { std::mem::zeroed() };
        m.msg_iov = &mut iov;
        m.msg_iovlen = 1;
        m.msg_control = control.as_mut_ptr().cast();
        m.msg_controllen = control.len();
        // SAFETY: the message's buffers live through the call.
        if unsafe { recvmsg(fd, &mut m, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) } < 0 {
            return;
        }
    }
}

/// Whether `fd` is readable now (`poll` without waiting).
pub fn readable(fd: c_int) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one local pollfd.
    unsafe { libc::poll(&mut p, 1, 0) > 0 }
}

/// The calling process's `errno`.
pub fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

//! The C library's socket calls as the program sees them: each looks at
//! what its descriptor is ([`fds::kind`], one load) and goes to spate's
//! call of the C API or to the C library's own. A UDP socket the program
//! opens is the kernel's until a `bind`, `connect` or send that spate
//! must carry ([`Routes`](crate::route::Routes)); then spate takes it
//! ([`take`]) under the same number.
#![allow(unsafe_code)]

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use libc::{
    c_int, c_long, c_uint, c_ulong, c_void, iovec, mmsghdr, msghdr, size_t, sockaddr, socklen_t, ssize_t, timespec,
};

use crate::companion;
use crate::dlopen::loaded as lib;
use crate::fds::{self, Kind};
use crate::libc_next as real;
use crate::state;

/// A socket's address as the program gave it, if it is an IPv4 or IPv6
/// one of the right length.
///
/// # Safety
/// `p` is NULL or points to `len` readable bytes.
unsafe fn addr_of(p: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    if p.is_null() || (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return None;
    }
    // SAFETY: per the contract; the family is read first, then the
    // structure its length holds, unaligned.
    unsafe {
        match c_int::from((*p).sa_family) {
            libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
                let a = std::ptr::read_unaligned(p.cast::<libc::sockaddr_in>());
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                    u16::from_be(a.sin_port),
                )))
            }
            libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
                let a = std::ptr::read_unaligned(p.cast::<libc::sockaddr_in6>());
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(a.sin6_addr.s6_addr),
                    u16::from_be(a.sin6_port),
                    a.sin6_flowinfo,
                    a.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// The destination of message `msg`, if it names one.
///
/// # Safety
/// `msg` is NULL or a valid msghdr.
unsafe fn msg_to(msg: *const msghdr) -> Option<SocketAddr> {
    // SAFETY: per the contract.
    unsafe { msg.as_ref().and_then(|m| addr_of(m.msg_name.cast(), m.msg_namelen)) }
}

/// The destination of the first of `vlen` messages at `msgs`, if it
/// names one.
///
/// # Safety
/// `msgs` is NULL or `vlen` valid mmsghdrs.
unsafe fn mmsg_to(msgs: *const mmsghdr, vlen: c_uint) -> Option<SocketAddr> {
    match vlen {
        0 => None,
        // SAFETY: per the contract.
        _ => unsafe { msgs.as_ref().and_then(|m| msg_to(&m.msg_hdr)) },
    }
}

/// Adds `fd` to each epoll instance of `epolls` (epoll descriptor,
/// events, data); each that fails, with its errno.
fn into_epolls(fd: c_int, epolls: &[(i32, u32, u64)]) -> Vec<(i32, c_int)> {
    let mut failed = Vec::new();
    for &(epfd, events, data) in epolls {
        let mut ev = libc::epoll_event { events, u64: data };
        // SAFETY: a local event.
        if unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
            failed.push((epfd, real::errno()));
        }
    }
    failed
}

/// Makes open socket `fd` spate's, under its number, with the options
/// the program set on it; `Ok(false)` when no stack runs (it stays the
/// kernel's).
fn take(fd: c_int) -> Result<bool, c_int> {
    if !state::stack_up() {
        return Ok(false);
    }
    let mut domain: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: an int and its length, locals.
    let r = unsafe {
        real::getsockopt(fd, libc::SOL_SOCKET, libc::SO_DOMAIN, (&mut domain as *mut c_int).cast(), &mut len)
    };
    if r < 0 {
        return Err(real::errno());
    }
    // SAFETY: no pointers.
    let (fl, fdfl) = unsafe { (real::fcntl(fd, libc::F_GETFL, 0), real::fcntl(fd, libc::F_GETFD, 0)) };
    let pending = fds::take_pending(fd);
    // The kernel socket may live on (beside spate's, module companion):
    // out of the program's epoll sets under this number first.
    for &(epfd, _, _) in &pending.epolls {
        // SAFETY: no event for a delete.
        unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
    }
    if let Err(e) = lib().adopt(fd, domain == libc::AF_INET6, fl & libc::O_NONBLOCK != 0, fdfl & libc::FD_CLOEXEC != 0)
    {
        // Still the kernel's socket: back into its epoll sets.
        into_epolls(fd, &pending.epolls);
        return Err(e);
    }
    fds::set(fd, Kind::Spate);
    companion::none(fd);
    // The kernel socket left the epoll instances it was in as its number
    // took the event descriptor: the number goes back into each.
    for (epfd, e) in into_epolls(fd, &pending.epolls) {
        said_once(&format!(
            "descriptor {fd} moved onto spate but could not go back into epoll instance {epfd}: {}",
            std::io::Error::from_raw_os_error(e)
        ));
    }
    for (level, name, value) in pending.options {
        // SAFETY: the value's bytes and length.
        let r = unsafe { (lib().spate_setsockopt)(fd, level, name, value.as_ptr().cast(), value.len() as socklen_t) };
        if r < 0 {
            said_once(&format!(
                "socket option (level {level}, name {name}) set before the socket moved onto spate is not spate's: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(true)
}

/// `line` on stderr, the first time only of any such line.
fn said_once(line: &str) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        state::say(line);
    }
}

/// -1 with `errno` = `e`.
fn fail<T: From<i8>>(e: c_int) -> T {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = e };
    T::from(-1)
}

/// A spate socket in a child forked after the stack started: the stack
/// is the parent's (its memory shared, its lcores running), never
/// touched here; every call but `close` fails with `ENETDOWN`.
macro_rules! spate_or_down {
    ($e:expr) => {
        if state::forked() { fail(libc::ENETDOWN) } else { $e }
    };
}

/// The kernel socket beside spate socket `fd` when a send to `to` must
/// leave through it: spate's routes do not reach the destination
/// (loopback, where only the kernel goes). A batch (`sendmmsg`) goes the
/// way of its first message.
#[inline(always)]
fn kernel_side(fd: c_int, to: impl FnOnce() -> Option<SocketAddr>) -> Option<c_int> {
    let k = companion::of(fd)?;
    if state::forked() {
        return None;
    }
    match (to(), state::routes()) {
        (Some(a), Some(r)) if !r.reaches(&a) => Some(k),
        _ => None,
    }
}

/// Whether an open socket should move onto spate for destination `to`:
/// spate carries it and a stack runs; the socket is taken then.
fn take_for(fd: c_int, to: Option<SocketAddr>) -> Result<bool, c_int> {
    match (to, state::routes()) {
        (Some(a), Some(r)) if r.reaches(&a) => take(fd),
        _ => Ok(false),
    }
}

/// Socket `fd` stays the kernel's for good after call result `r` (it
/// is bound or connected there now) when `r` is not an error.
fn kernel_after<T: PartialOrd + From<i8>>(fd: c_int, r: T) -> T {
    if r >= T::from(0) {
        fds::set(fd, Kind::Kernel);
    }
    r
}

/// `socket(2)`: an IPv4 or IPv6 UDP socket is the kernel's, open for
/// spate to take.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, kind: c_int, protocol: c_int) -> c_int {
    // SAFETY: no pointers.
    let fd = unsafe { real::socket(domain, kind, protocol) };
    let udp = matches!(domain, libc::AF_INET | libc::AF_INET6)
        && kind & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) == libc::SOCK_DGRAM
        && (protocol == 0 || protocol == libc::IPPROTO_UDP);
    if fd >= 0 && udp && !state::forked() && state::routes().is_some() && !fds::set(fd, Kind::Open) {
        said_once(&format!("descriptor {fd} is past {}: its UDP socket stays the kernel's", fds::FDS));
    }
    fd
}

/// `bind(2)`: an open socket bound to a wildcard or one of spate's
/// addresses moves onto spate; to any other (loopback, the kernel's own
/// addresses) it stays the kernel's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    match fds::kind(fd) {
        Kind::Spate => spate_or_down!(unsafe { (lib().spate_bind)(fd, addr, len) }),
        Kind::Open => {
            // SAFETY: as bind's contract.
            let to = unsafe { addr_of(addr, len) };
            let (spate, kernel) = match (to, state::routes()) {
                (Some(a), Some(r)) if r.binds(&a) => {
                    // A wildcard keeps the kernel socket it was beside
                    // spate's (module companion).
                    let kernel = a.ip().is_unspecified().then(|| companion::keep(fd)).flatten();
                    (take(fd), kernel)
                }
                _ => (Ok(false), None),
            };
            let r = match spate {
                Ok(true) => unsafe { (lib().spate_bind)(fd, addr, len) },
                Ok(false) => kernel_after(fd, unsafe { real::bind(fd, addr, len) }),
                Err(e) => fail(e),
            };
            if let Some(k) = kernel {
                if r == 0 && spate == Ok(true) {
                    beside(fd, k, to);
                } else {
                    real::close_own(k);
                }
            }
            r
        }
        Kind::Kernel => unsafe { real::bind(fd, addr, len) },
    }
}

/// Binds kernel socket `k` (what spate socket `fd` was) to the port
/// spate gave `fd` on the wildcard `to`, and keeps it beside `fd`; when
/// the kernel has the port taken, says so once and closes `k` (the
/// socket gets spate's traffic only).
fn beside(fd: c_int, k: c_int, to: Option<SocketAddr>) {
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
    // SAFETY: a sockaddr_storage and its length, locals.
    let named = unsafe { (lib().spate_getsockname)(fd, (&mut ss as *mut libc::sockaddr_storage).cast(), &mut len) };
    let port = match (named, unsafe { addr_of((&ss as *const libc::sockaddr_storage).cast(), len) }) {
        (0, Some(a)) => a.port(),
        _ => {
            real::close_own(k);
            return;
        }
    };
    let r = match to {
        Some(SocketAddr::V4(_)) => {
            let a = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: port.to_be(),
                sin_addr: libc::in_addr { s_addr: 0 },
                sin_zero: [0; 8],
            };
            // SAFETY: a local sockaddr_in and its length.
            unsafe { real::bind(k, (&a as *const libc::sockaddr_in).cast(), std::mem::size_of_val(&a) as socklen_t) }
        }
        Some(SocketAddr::V6(v6)) => {
            // SAFETY: all-zero is the wildcard sockaddr_in6.
            let mut a: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
            a.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            a.sin6_port = port.to_be();
            a.sin6_scope_id = v6.scope_id();
            // SAFETY: a local sockaddr_in6 and its length.
            unsafe { real::bind(k, (&a as *const libc::sockaddr_in6).cast(), std::mem::size_of_val(&a) as socklen_t) }
        }
        None => -1,
    };
    if r != 0 {
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            state::say(&format!(
                "UDP port {port} is taken in the kernel: socket {fd} gets what comes through spate only ({})",
                std::io::Error::last_os_error()
            ));
        }
        real::close_own(k);
    } else if !companion::attach(fd, k) {
        real::close_own(k);
    }
}

/// `connect(2)`: an open socket connected to a destination spate
/// carries moves onto spate.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    match fds::kind(fd) {
        Kind::Spate => {
            let r = spate_or_down!(unsafe { (lib().spate_connect)(fd, addr, len) });
            if r == 0 {
                // Connected, it hears its peer only: no kernel's side.
                companion::detach(fd);
            }
            r
        }
        Kind::Open => match take_for(fd, unsafe { addr_of(addr, len) }) {
            Ok(true) => unsafe { (lib().spate_connect)(fd, addr, len) },
            Ok(false) => kernel_after(fd, unsafe { real::connect(fd, addr, len) }),
            Err(e) => fail(e),
        },
        Kind::Kernel => unsafe { real::connect(fd, addr, len) },
    }
}

/// `sendto(2)`: from an open socket to a destination spate carries, the
/// socket moves onto spate first.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    match fds::kind(fd) {
        Kind::Spate => match kernel_side(fd, || unsafe { addr_of(addr, alen) }) {
            Some(k) => unsafe { real::sendto(k, buf, n, flags, addr, alen) },
            None => spate_or_down!(unsafe { (lib().spate_sendto)(fd, buf, n, flags, addr, alen) }),
        },
        Kind::Open => match take_for(fd, unsafe { addr_of(addr, alen) }) {
            Ok(true) => unsafe { (lib().spate_sendto)(fd, buf, n, flags, addr, alen) },
            Ok(false) if addr.is_null() => unsafe { real::sendto(fd, buf, n, flags, addr, alen) },
            Ok(false) => kernel_after(fd, unsafe { real::sendto(fd, buf, n, flags, addr, alen) }),
            Err(e) => fail(e),
        },
        Kind::Kernel => unsafe { real::sendto(fd, buf, n, flags, addr, alen) },
    }
}

/// `sendmsg(2)`, as [`sendto`] with the message's address.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    match fds::kind(fd) {
        // SAFETY (both): `msg` is NULL or a valid msghdr, per the contract.
        Kind::Spate => match kernel_side(fd, || unsafe { msg_to(msg) }) {
            Some(k) => unsafe { real::sendmsg(k, msg, flags) },
            None => spate_or_down!(unsafe { (lib().spate_sendmsg)(fd, msg, flags) }),
        },
        Kind::Open => {
            let to = unsafe { msg_to(msg) };
            match take_for(fd, to) {
                Ok(true) => unsafe { (lib().spate_sendmsg)(fd, msg, flags) },
                Ok(false) if to.is_none() => unsafe { real::sendmsg(fd, msg, flags) },
                Ok(false) => kernel_after(fd, unsafe { real::sendmsg(fd, msg, flags) }),
                Err(e) => fail(e),
            }
        }
        Kind::Kernel => unsafe { real::sendmsg(fd, msg, flags) },
    }
}

/// `sendmmsg(2)`, as [`sendto`] with the first message's address.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmmsg(fd: c_int, msgs: *mut mmsghdr, vlen: c_uint, flags: c_int) -> c_int {
    match fds::kind(fd) {
        // SAFETY (both): `msgs` is NULL or `vlen` valid mmsghdrs, per the
        // contract.
        Kind::Spate => match kernel_side(fd, || unsafe { mmsg_to(msgs, vlen) }) {
            Some(k) => unsafe { real::sendmmsg(k, msgs, vlen, flags) },
            None => spate_or_down!(unsafe { (lib().spate_sendmmsg)(fd, msgs, vlen, flags) }),
        },
        Kind::Open => {
            let to = unsafe { mmsg_to(msgs, vlen) };
            match take_for(fd, to) {
                Ok(true) => unsafe { (lib().spate_sendmmsg)(fd, msgs, vlen, flags) },
                Ok(false) if to.is_none() => unsafe { real::sendmmsg(fd, msgs, vlen, flags) },
                Ok(false) => kernel_after(fd, unsafe { real::sendmmsg(fd, msgs, vlen, flags) }),
                Err(e) => fail(e),
            }
        }
        Kind::Kernel => unsafe { real::sendmmsg(fd, msgs, vlen, flags) },
    }
}

/// Calls that go to spate for a spate socket and to the C library for
/// any other descriptor, unchanged.
macro_rules! either {
    ($($(#[$doc:meta])* fn $name:ident($fd:ident: c_int $(, $arg:ident: $ty:ty)*) -> $ret:ty => $spate:expr;)*) => {$(
        $(#[$doc])*
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($fd: c_int $(, $arg: $ty)*) -> $ret {
            match fds::kind($fd) {
                // SAFETY: the C call's contract is the program's.
                #[allow(unused_unsafe)]
                Kind::Spate => spate_or_down!(unsafe { ($spate)($fd $(, $arg)*) } as $ret),
                _ => unsafe { real::$name($fd $(, $arg)*) },
            }
        }
    )*};
}

either! {
    /// `send(2)`.
    fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t => lib().spate_send;
    /// `getsockname(2)`.
    fn getsockname(fd: c_int, addr: *mut sockaddr, alen: *mut socklen_t) -> c_int => lib().spate_getsockname;
    /// `getpeername(2)`.
    fn getpeername(fd: c_int, addr: *mut sockaddr, alen: *mut socklen_t) -> c_int => lib().spate_getpeername;
    /// `getsockopt(2)`.
    fn getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int
        => lib().spate_getsockopt;
    /// `shutdown(2)`.
    fn shutdown(fd: c_int, how: c_int) -> c_int => lib().spate_shutdown;
    /// `write(2)`: on a spate socket, `send` without flags.
    fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t => spate_write;
    /// `writev(2)`: on a spate socket, `sendmsg` of the vector.
    fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t => spate_writev;
    /// `ioctl(2)`: `FIONREAD` and `FIONBIO` on a spate socket.
    fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int => spate_ioctl;
}

/// A receive on spate socket `fd` with `flags`: `spate` (the C API's
/// call with the flags it is given) alone, or, when the socket has a
/// kernel socket beside it ([`companion`]), `kernel` (the C library's
/// call on that socket with the flags it is given) too, waiting for
/// either as the call's flags, the socket's mode and its `SO_RCVTIMEO`
/// say.
#[inline(always)]
fn receive<T: Copy + PartialOrd + From<i8>>(
    fd: c_int,
    flags: c_int,
    spate: impl Fn(c_int) -> T,
    kernel: impl Fn(c_int, c_int) -> T,
) -> T {
    if state::forked() {
        return fail(libc::ENETDOWN);
    }
    match companion::of(fd) {
        // Linux never waits for the error queue; spate's is empty.
        Some(k) if flags & libc::MSG_ERRQUEUE == 0 => receive_both(fd, k, flags, spate, kernel),
        _ => spate(flags),
    }
}

/// [`receive`] on a socket with a kernel socket beside it: every
/// receive on a wildcard-bound socket, servers' usual case, so not cold.
fn receive_both<T: Copy + PartialOrd + From<i8>>(
    fd: c_int,
    k: c_int,
    flags: c_int,
    spate: impl Fn(c_int) -> T,
    kernel: impl Fn(c_int, c_int) -> T,
) -> T {
    let ready = companion::ready(k);
    let mut deadline: Option<Option<Instant>> = None;
    loop {
        if ready.load(Ordering::SeqCst) {
            let r = kernel(k, flags | libc::MSG_DONTWAIT);
            if r >= T::from(0) {
                if !real::readable(k) {
                    // The kernel's side emptied: the socket is readable
                    // only if spate's is, unless something came since.
                    companion::rearm(k);
                    lib().settle(fd);
                }
                // More on the kernel's side, or it came since: the
                // socket stays readable (a receive of spate's may have
                // reset it after the watcher's wake).
                if ready.load(Ordering::SeqCst) {
                    lib().wake(fd);
                }
                return r;
            }
            if real::errno() != libc::EAGAIN {
                return r;
            }
            companion::rearm(k);
        }
        let r = spate(flags | libc::MSG_DONTWAIT);
        if r >= T::from(0) || real::errno() != libc::EAGAIN {
            // spate's receive may have reset the descriptor after the
            // watcher's wake: readable again while the mark is set.
            if ready.load(Ordering::SeqCst) {
                lib().wake(fd);
            }
            return r;
        }
        // Marked before its wake: a mark set while spate's queue was
        // looked at is seen here.
        if ready.load(Ordering::SeqCst) {
            continue;
        }
        // SAFETY: no pointers.
        let mode = unsafe { (lib().spate_fcntl)(fd, libc::F_GETFL, 0) };
        if mode < 0 {
            return fail(real::errno());
        }
        if flags & libc::MSG_DONTWAIT != 0 || mode & libc::O_NONBLOCK != 0 {
            return fail(libc::EAGAIN);
        }
        let deadline = *deadline.get_or_insert_with(|| rcvtimeo(fd).map(|t| Instant::now() + t));
        let left = match deadline.map(|d| d.checked_duration_since(Instant::now())) {
            None => None,
            Some(Some(t)) if !t.is_zero() => Some(t),
            Some(_) => return fail(libc::EAGAIN),
        };
        match lib().wait(fd, left, ready) {
            Ok(false) => {}
            // Shut down for reading or stopped: spate's blocking call
            // says what, at once.
            Ok(true) => return spate(flags),
            Err(e) => return fail(e),
        }
    }
}

/// Socket `fd`'s `SO_RCVTIMEO`, if it has one.
fn rcvtimeo(fd: c_int) -> Option<Duration> {
    let mut tv = libc::timeval { tv_sec: 0, tv_usec: 0 };
    let mut len = std::mem::size_of::<libc::timeval>() as socklen_t;
    // SAFETY: a timeval and its length, locals.
    let r = unsafe {
        (lib().spate_getsockopt)(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&mut tv as *mut libc::timeval).cast(),
            &mut len,
        )
    };
    let t = Duration::from_secs(tv.tv_sec.max(0) as u64) + Duration::from_micros(tv.tv_usec.max(0) as u64);
    (r == 0 && !t.is_zero()).then_some(t)
}

/// Receives that go to spate for a spate socket (with its kernel
/// socket beside it, see [`receive`]) and to the C library for any other
/// descriptor: `$spate` is the C API's call, `$flags` the argument that
/// holds the flags.
macro_rules! receiving {
    ($($(#[$doc:meta])* fn $name:ident($fd:ident: c_int $(, $arg:ident: $ty:ty)*) -> $ret:ty
        => $spate:ident, $flags:ident;)*) => {$(
        $(#[$doc])*
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($fd: c_int $(, $arg: $ty)*) -> $ret {
            match fds::kind($fd) {
                // SAFETY: the C call's contract is the program's, for both.
                Kind::Spate => receive(
                    $fd,
                    $flags,
                    |$flags| unsafe { (lib().$spate)($fd $(, $arg)*) },
                    |k, $flags| unsafe { real::$name(k $(, $arg)*) },
                ),
                _ => unsafe { real::$name($fd $(, $arg)*) },
            }
        }
    )*};
}

receiving! {
    /// `recv(2)`.
    fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t => spate_recv, flags;
    /// `recvfrom(2)`.
    fn recvfrom(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, alen: *mut socklen_t)
        -> ssize_t => spate_recvfrom, flags;
    /// `recvmsg(2)`.
    fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t => spate_recvmsg, flags;
}

/// `recvmmsg(2)`. A blocking call without `MSG_WAITFORONE` goes on until
/// `vlen` messages are filled, as Linux's and `spate_recvmmsg` do, also
/// when the socket has a kernel socket beside it (each [`receive`] of it
/// takes from one side, without waiting once it has something); the
/// timeout is looked at after each receive, as Linux's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    msgs: *mut mmsghdr,
    vlen: c_uint,
    flags: c_int,
    timeout: *mut timespec,
) -> c_int {
    if fds::kind(fd) != Kind::Spate {
        return unsafe { real::recvmmsg(fd, msgs, vlen, flags, timeout) };
    }
    // SAFETY (both): the C call's contract is the program's, for the
    // messages from `at` on.
    let one = |at: c_uint| {
        let (m, v) = (unsafe { msgs.add(at as usize) }, vlen - at);
        receive(
            fd,
            flags,
            |f| unsafe { (lib().spate_recvmmsg)(fd, m, v, f, timeout) },
            |k, f| unsafe { real::recvmmsg(k, m, v, f, timeout) },
        )
    };
    let first = one(0);
    if first <= 0 || companion::of(fd).is_none() || flags & (libc::MSG_WAITFORONE | libc::MSG_DONTWAIT) != 0 {
        return first;
    }
    // SAFETY: NULL or a valid timespec, per the contract (spate's call
    // above has checked it).
    let deadline = unsafe { timeout.as_ref() }.and_then(|t| {
        Instant::now().checked_add(Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32))
    });
    let vlen = vlen.min(libc::UIO_MAXIOV as c_uint);
    let mut got = first as c_uint;
    while got < vlen && deadline.is_none_or(|d| Instant::now() < d) {
        match one(got) {
            // An error after some messages: what was received (a
            // non-blocking socket's EAGAIN ends it here).
            r if r <= 0 => break,
            r => got += r as c_uint,
        }
    }
    got as c_int
}

/// `read(2)`: on a spate socket, `recv` without flags.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    match fds::kind(fd) {
        Kind::Spate => unsafe { recv(fd, buf, n, 0) },
        _ => unsafe { real::read(fd, buf, n) },
    }
}

/// `readv(2)`: on a spate socket, `recvmsg` of the vector.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    match fds::kind(fd) {
        Kind::Spate => match vector_msg(iov, n) {
            Ok(mut m) => unsafe { recvmsg(fd, &mut m, 0) },
            Err(e) => fail(e),
        },
        _ => unsafe { real::readv(fd, iov, n) },
    }
}

unsafe fn spate_write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    unsafe { (lib().spate_send)(fd, buf, n, 0) }
}

fn vector_msg(iov: *const iovec, n: c_int) -> Result<msghdr, c_int> {
    if n < 0 || n as usize > libc::UIO_MAXIOV as usize {
        return Err(libc::EINVAL);
    }
    // SAFETY: all-zero is a valid msghdr (no address, no control).
    let mut m: msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = iov.cast_mut();
    m.msg_iovlen = n as usize;
    Ok(m)
}

unsafe fn spate_writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    match vector_msg(iov, n) {
        Ok(m) => unsafe { (lib().spate_sendmsg)(fd, &m, 0) },
        Err(e) => fail(e),
    }
}

unsafe fn spate_ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    match request {
        // The descriptor's own flag (close-on-exec), not the socket's.
        libc::FIOCLEX | libc::FIONCLEX => unsafe { real::ioctl(fd, request, arg) },
        libc::FIONREAD => match companion::of(fd) {
            // The next receive takes the kernel's side first while it is
            // marked: its datagram is the one to tell.
            Some(k) if companion::ready(k).load(Ordering::SeqCst) && real::readable(k) => unsafe {
                real::ioctl(k, request, arg)
            },
            _ => unsafe { (lib().spate_ioctl)(fd, request, arg.cast()) },
        },
        _ => unsafe { (lib().spate_ioctl)(fd, request, arg.cast()) },
    }
}

/// `setsockopt(2)`: on an open socket, the kernel's, remembered to be set
/// again on spate's socket should it move.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int {
    match fds::kind(fd) {
        Kind::Spate => {
            let r = spate_or_down!(unsafe { (lib().spate_setsockopt)(fd, level, name, val, len) });
            if r == 0
                && let Some(k) = companion::of(fd)
            {
                // The kernel's side too (control messages, TOS...), as
                // far as the kernel takes it.
                unsafe { real::setsockopt(k, level, name, val, len) };
            }
            r
        }
        Kind::Open => {
            let r = unsafe { real::setsockopt(fd, level, name, val, len) };
            if r == 0 && !val.is_null() {
                // SAFETY: the kernel read `len` bytes there.
                let value = unsafe { std::slice::from_raw_parts(val.cast::<u8>(), len as usize) };
                fds::remember_option(fd, level, name, value);
            }
            r
        }
        Kind::Kernel => unsafe { real::setsockopt(fd, level, name, val, len) },
    }
}

/// `close(2)`: the number is closed; a spate socket is closed on the
/// stack when it was its last name, and its other names go on untouched
/// (in a forked child, only the child's descriptor is closed).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    match fds::kind(fd) {
        Kind::Kernel => {
            if companion::is_kernel_side(fd) && !state::shares_memory() {
                companion::forget_kernel(fd);
            }
            unsafe { real::close(fd) }
        }
        // A vfork child's writes are its parent's.
        _ if state::shares_memory() => unsafe { real::close(fd) },
        Kind::Spate if !state::forked() => {
            fds::set(fd, Kind::Kernel);
            companion::name_gone(fd, lib().forget(fd));
            unsafe { real::close(fd) }
        }
        _ => {
            fds::set(fd, Kind::Kernel);
            unsafe { real::close(fd) }
        }
    }
}

/// `epoll_ctl(2)`, the C library's; for an open socket, remembered to
/// be done again on its number should it move onto spate.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, event: *mut libc::epoll_event) -> c_int {
    // SAFETY: as epoll_ctl's contract.
    let r = unsafe { real::epoll_ctl(epfd, op, fd, event) };
    if r == 0 && fds::kind(fd) == Kind::Open {
        // SAFETY: the kernel read the event for an ADD or a MOD.
        let ev = match (op, unsafe { event.as_ref() }) {
            (libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD, Some(e)) => Some((e.events, e.u64)),
            _ => None,
        };
        fds::remember_epoll(fd, epfd, ev);
    }
    r
}

/// Numbers `first` to `last` are about to be closed without `close`
/// (`close_range`, `closefrom`): the spate sockets' names among them
/// are forgotten, and open sockets' marks cleared.
fn closing(first: c_uint, last: c_uint) {
    if state::shares_memory() {
        return;
    }
    let last = last.min(fds::FDS as c_uint - 1);
    for fd in first..=last {
        let fd = fd as c_int;
        match fds::kind(fd) {
            Kind::Kernel => {
                if companion::is_kernel_side(fd) {
                    companion::forget_kernel(fd);
                }
            }
            Kind::Spate => {
                fds::set(fd, Kind::Kernel);
                if !state::forked() {
                    companion::name_gone(fd, lib().forget(fd));
                }
            }
            Kind::Open => {
                fds::set(fd, Kind::Kernel);
            }
        }
    }
}

/// `close_range(2)`: as the C library's, the spate sockets among the
/// numbers closed as `close` closes them (with `CLOSE_RANGE_CLOEXEC`
/// nothing is closed now).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 && first <= last {
        closing(first, last);
    }
    unsafe { real::close_range(first, last, flags) }
}

/// `closefrom(3)`: as the C library's, the spate sockets among the
/// numbers closed as `close` closes them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn closefrom(first: c_int) {
    closing(first.max(0) as c_uint, c_uint::MAX);
    unsafe { real::closefrom(first) }
}

/// A duplicate `new` (or the C library's error) of descriptor `fd`: the
/// same socket under another number. A duplicate of an open socket, and
/// that socket itself, stay the kernel's (two numbers of one kernel
/// socket cannot move onto spate one at a time).
fn duplicated(fd: c_int, new: c_int) -> c_int {
    if new < 0 {
        return new;
    }
    if fds::kind(fd) != Kind::Kernel && state::shares_memory() {
        return new;
    }
    match fds::kind(fd) {
        Kind::Spate => {
            let forked = state::forked();
            if !forked && let Err(e) = lib().alias(new, fd) {
                // SAFETY: our own new number.
                unsafe { real::close(new) };
                return fail(e);
            }
            if !forked {
                companion::duplicated(fd, new);
            }
            if !fds::set(new, Kind::Spate) {
                said_once(&format!(
                    "descriptor {new} is past {}: a duplicate of a spate socket there is closed",
                    fds::FDS
                ));
                if !forked {
                    companion::name_gone(new, lib().forget(new));
                }
                // SAFETY: our own new number.
                unsafe { real::close(new) };
                return fail(libc::EMFILE);
            }
        }
        Kind::Open => {
            fds::set(fd, Kind::Kernel);
            fds::set(new, Kind::Kernel);
        }
        Kind::Kernel => {
            fds::set(new, Kind::Kernel);
        }
    }
    new
}

/// Number `to` is about to hold another file (`dup2`, `dup3`): a spate
/// socket's name there is forgotten.
fn replaced(fd: c_int, to: c_int) {
    if fd == to || (fds::kind(to) == Kind::Kernel && !companion::is_kernel_side(to)) || state::shares_memory() {
        return;
    }
    if companion::is_kernel_side(to) {
        companion::forget_kernel(to);
    }
    if fds::kind(to) == Kind::Spate {
        fds::set(to, Kind::Kernel);
        if !state::forked() {
            companion::name_gone(to, lib().forget(to));
        }
    }
}

/// `dup(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    duplicated(fd, unsafe { real::dup(fd) })
}

/// `dup2(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(fd: c_int, to: c_int) -> c_int {
    let r = unsafe { real::dup2(fd, to) };
    if r >= 0 && fd != to {
        replaced(fd, to);
        return duplicated(fd, r);
    }
    r
}

/// `dup3(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int {
    let r = unsafe { real::dup3(fd, to, flags) };
    if r >= 0 {
        replaced(fd, to);
        return duplicated(fd, r);
    }
    r
}

/// `fcntl(2)`: on a spate socket, `F_GETFL`/`F_SETFL` (`O_NONBLOCK`) are
/// the socket's; the descriptor's own commands (`F_GETFD`/`F_SETFD`,
/// `F_DUPFD`, `F_DUPFD_CLOEXEC`) go to the C library on the number.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    unsafe { fcntl_with(fd, cmd, arg, real::fcntl) }
}

/// `fcntl64`, as glibc's headers name `fcntl` for programs built with
/// 64-bit file offsets; as [`fcntl`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    unsafe { fcntl_with(fd, cmd, arg, real::fcntl64) }
}

unsafe fn fcntl_with(fd: c_int, cmd: c_int, arg: c_long, libc_call: unsafe fn(c_int, c_int, c_long) -> c_int) -> c_int {
    match (fds::kind(fd), cmd) {
        (Kind::Spate, libc::F_GETFL | libc::F_SETFL) => spate_or_down!(unsafe { (lib().spate_fcntl)(fd, cmd, arg) }),
        (_, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) => duplicated(fd, unsafe { libc_call(fd, cmd, arg) }),
        _ => unsafe { libc_call(fd, cmd, arg) },
    }
}

/// glibc's `_FORTIFY_SOURCE` form of `recv`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recv_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int) -> ssize_t {
    match fds::kind(fd) {
        Kind::Spate => {
            overflow_check(n, buflen);
            unsafe { recv(fd, buf, n, flags) }
        }
        _ => unsafe { real::__recv_chk(fd, buf, n, buflen, flags) },
    }
}

/// glibc's `_FORTIFY_SOURCE` form of `recvfrom`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    match fds::kind(fd) {
        Kind::Spate => {
            overflow_check(n, buflen);
            unsafe { recvfrom(fd, buf, n, flags, addr, alen) }
        }
        _ => unsafe { real::__recvfrom_chk(fd, buf, n, buflen, flags, addr, alen) },
    }
}

/// glibc's `_FORTIFY_SOURCE` form of `read`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t {
    match fds::kind(fd) {
        Kind::Spate => {
            overflow_check(n, buflen);
            unsafe { recv(fd, buf, n, 0) }
        }
        _ => unsafe { real::__read_chk(fd, buf, n, buflen) },
    }
}

/// As glibc's checks: a length past the buffer the compiler saw ends the
/// program.
fn overflow_check(n: size_t, buflen: size_t) {
    if n > buflen {
        // SAFETY: no arguments; it does not return.
        unsafe { real::__chk_fail() };
        std::process::abort();
    }
}

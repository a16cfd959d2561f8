//! The C entry points (`spate_*`): each checks its pointers and lengths
//! as Linux's system calls do, turns them into slices and addresses, and
//! calls the safe layer; errors set `errno` and return -1. A panic never
//! crosses into C: it becomes `EIO`.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int, c_long, c_uint, c_ulong, c_void};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::Arc;

use libc::{mmsghdr, msghdr, size_t, sockaddr, socklen_t, ssize_t, timespec};
use spate::dpdk::Burst;
use spate::{Datagram, DatagramBatch};

use crate::cmsg;
use crate::global;
use crate::options;
use crate::socket::{CResult, CSocket, Received, Want, os};
use crate::syscalls::set_errno;

/// spate's version: major.
pub const SPATE_VERSION_MAJOR: c_int = 0;
/// spate's version: minor.
pub const SPATE_VERSION_MINOR: c_int = 1;
/// spate's version: patch.
pub const SPATE_VERSION_PATCH: c_int = 0;
/// `MAJOR * 10000 + MINOR * 100 + PATCH`, for `#if`.
pub const SPATE_VERSION_NUMBER: c_int = 100;

/// Linux's `UIO_MAXIOV`: the most iovecs and (clamped) messages a call takes.
const UIO_MAXIOV: usize = 1024;

/// Runs `f`, turning its error into `errno` and -1, and a panic into `EIO`.
pub(crate) fn call<T: From<i8>>(f: impl FnOnce() -> CResult<T>) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_errno(e);
            T::from(-1)
        }
        Err(_) => {
            set_errno(libc::EIO);
            T::from(-1)
        }
    }
}

/// spate's version, as "MAJOR.MINOR.PATCH".
#[unsafe(no_mangle)]
pub extern "C" fn spate_version() -> *const c_char {
    c"0.1.0".as_ptr()
}

/// Builds the stack from the flags of spate's tools (`argv[0]` ignored;
/// without a port flag, the embedded default). `EALREADY` the second time.
///
/// # Safety
/// `argv` holds `argc` C strings (or is NULL with `argc` 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_init(argc: c_int, argv: *const *const c_char) -> c_int {
    call(|| {
        if argc < 0 || (argc > 0 && argv.is_null()) {
            return Err(libc::EFAULT);
        }
        let mut args = vec!["spate".to_string()];
        for i in 1..argc as usize {
            // SAFETY: the caller gives `argc` pointers.
            let p = unsafe { *argv.add(i) };
            if p.is_null() {
                return Err(libc::EFAULT);
            }
            // SAFETY: a C string, per the contract.
            args.push(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
        }
        global::init(args).map(|()| 0)
    })
}

/// Starts the polling lcores in the background; the caller's threads use
/// the sockets.
#[unsafe(no_mangle)]
pub extern "C" fn spate_start() -> c_int {
    call(|| global::start().map(|()| 0))
}

/// A `spate_run` callback: called once per loop iteration on each polling
/// lcore; a negative return stops the stack.
pub type spate_loop_fn = Option<extern "C" fn(arg: *mut c_void) -> c_int>;

/// Runs `fn(arg)` on the polling lcores, once per loop iteration, until it
/// returns a negative number or `spate_fini` runs; calls made from it
/// never wait.
#[unsafe(no_mangle)]
pub extern "C" fn spate_run(callback: spate_loop_fn, arg: *mut c_void) -> c_int {
    call(|| {
        let f = callback.ok_or(libc::EFAULT)?;
        let arg = arg as usize;
        global::run(move || f(arg as *mut c_void)).map(|()| 0)
    })
}

/// Stops the stack: every blocked call returns `ENETDOWN`, as do later ones.
#[unsafe(no_mangle)]
pub extern "C" fn spate_fini() -> c_int {
    call(|| global::fini().map(|()| 0))
}

/// A UDP socket (`AF_INET` or `AF_INET6`, `SOCK_DGRAM`, protocol 0 or
/// `IPPROTO_UDP`; `SOCK_NONBLOCK` and `SOCK_CLOEXEC` taken): a descriptor
/// of the process, readable while the socket is.
#[unsafe(no_mangle)]
pub extern "C" fn spate_socket(domain: c_int, kind: c_int, protocol: c_int) -> c_int {
    call(|| {
        global::stack()?;
        let v6 = match domain {
            libc::AF_INET => false,
            libc::AF_INET6 => true,
            _ => return Err(libc::EAFNOSUPPORT),
        };
        if kind & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) != libc::SOCK_DGRAM {
            return Err(libc::ESOCKTNOSUPPORT);
        }
        if protocol != 0 && protocol != libc::IPPROTO_UDP {
            return Err(libc::EPROTONOSUPPORT);
        }
        let s = CSocket::new(v6)?;
        if kind & libc::SOCK_NONBLOCK != 0 {
            s.set_nonblocking(true)?;
        }
        let fd = s.ready.fd;
        global::insert(s);
        Ok(fd)
    })
}

/// The descriptor to wait on for socket `fd` (the socket's own).
#[unsafe(no_mangle)]
pub extern "C" fn spate_poll_fd(fd: c_int) -> c_int {
    call(|| global::socket(fd).map(|s| s.ready.fd))
}

/// An address a call was given, as Linux reads it.
enum Given {
    Unspec,
    Addr(SocketAddr),
}

/// Reads `len` bytes of address at `p`.
///
/// # Safety
/// `p` is NULL or points to `len` readable bytes.
unsafe fn read_addr(p: *const sockaddr, len: socklen_t) -> CResult<Given> {
    if len as usize > std::mem::size_of::<libc::sockaddr_storage>() {
        return Err(libc::EINVAL);
    }
    if p.is_null() {
        return Err(if len == 0 { libc::EINVAL } else { libc::EFAULT });
    }
    if (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: at least the family's two bytes are readable.
    let family = unsafe { std::ptr::read_unaligned(p.cast::<libc::sa_family_t>()) } as c_int;
    match family {
        libc::AF_UNSPEC => Ok(Given::Unspec),
        libc::AF_INET if (len as usize) < std::mem::size_of::<libc::sockaddr_in>() => Err(libc::EINVAL),
        libc::AF_INET => {
            // SAFETY: a sockaddr_in's bytes are readable (checked above).
            let a = unsafe { std::ptr::read_unaligned(p.cast::<libc::sockaddr_in>()) };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Ok(Given::Addr(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(a.sin_port)))))
        }
        // SIN6_LEN_RFC2133: a sockaddr_in6 without its scope id.
        libc::AF_INET6 if (len as usize) < 24 => Err(libc::EINVAL),
        libc::AF_INET6 => {
            // SAFETY: all-zero is a valid sockaddr_in6.
            let mut a: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
            let n = (len as usize).min(std::mem::size_of::<libc::sockaddr_in6>());
            // SAFETY: `n` bytes are readable at `p` and fit in `a`.
            unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), (&mut a as *mut libc::sockaddr_in6).cast(), n) };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Ok(Given::Addr(SocketAddr::V6(SocketAddrV6::new(ip, u16::from_be(a.sin6_port), 0, a.sin6_scope_id))))
        }
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// An address given to socket `s`: the other family is `EAFNOSUPPORT`
/// (an IPv4 address to an IPv6 socket is taken as mapped where Linux
/// takes it: sends).
fn for_socket(s: &CSocket, a: SocketAddr, v4_ok: bool) -> CResult<SocketAddr> {
    match (s.v6, a) {
        (false, SocketAddr::V6(_)) => Err(libc::EAFNOSUPPORT),
        (true, SocketAddr::V4(v4)) if v4_ok => {
            Ok(SocketAddr::V6(SocketAddrV6::new(v4.ip().to_ipv6_mapped(), v4.port(), 0, 0)))
        }
        (true, SocketAddr::V4(_)) => Err(libc::EINVAL),
        _ => Ok(a),
    }
}

/// Writes `a` at `p` as the socket's family shows it, cut to `*lenp`
/// bytes, and the whole length to `*lenp`. Nothing when `p` is NULL.
///
/// # Safety
/// `p` is NULL or points to `*lenp` writable bytes; `lenp` is NULL or
/// points to a socklen_t.
pub(crate) unsafe fn write_addr(a: SocketAddr, v6: bool, p: *mut sockaddr, lenp: *mut socklen_t) -> CResult<()> {
    if p.is_null() {
        return Ok(());
    }
    if lenp.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: `lenp` is valid (checked not NULL; the caller's contract).
    let room = unsafe { *lenp } as i32;
    if room < 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = fill_addr(&mut st, a, v6);
    let n = (room as usize).min(len);
    // SAFETY: `n` bytes fit both the local storage and the caller's room.
    unsafe {
        std::ptr::copy_nonoverlapping((&st as *const libc::sockaddr_storage).cast::<u8>(), p.cast::<u8>(), n);
        *lenp = len as socklen_t;
    }
    Ok(())
}

/// `a` in `st` as a sockaddr of the socket's family; returns its length.
fn fill_addr(st: &mut libc::sockaddr_storage, a: SocketAddr, v6: bool) -> usize {
    // SAFETY: sockaddr_storage is large and aligned enough for either.
    match (a, v6) {
        (SocketAddr::V4(a), false) => {
            let sin = unsafe { &mut *(st as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        (a, _) => {
            let (ip, port, scope) = match a {
                SocketAddr::V4(a) => (a.ip().to_ipv6_mapped(), a.port(), 0),
                SocketAddr::V6(a) => (*a.ip(), a.port(), a.scope_id()),
            };
            let sin6 = unsafe { &mut *(st as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = port.to_be();
            sin6.sin6_addr.s6_addr = ip.octets();
            sin6.sin6_scope_id = scope;
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    }
}

/// Binds socket `fd` to `addr`.
///
/// # Safety
/// `addr` points to `len` readable bytes (or is NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    call(|| {
        let s = global::socket(fd)?;
        // SAFETY: per the contract.
        let a = match unsafe { read_addr(addr, len) }? {
            Given::Addr(a) => for_socket(&s, a, false)?,
            Given::Unspec if !s.v6 => SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)),
            Given::Unspec => return Err(libc::EAFNOSUPPORT),
        };
        s.bind(a).map(|()| 0)
    })
}

/// Connects socket `fd` to `addr`; `AF_UNSPEC` disconnects.
///
/// # Safety
/// `addr` points to `len` readable bytes (or is NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    call(|| {
        let s = global::socket(fd)?;
        // SAFETY: per the contract.
        match unsafe { read_addr(addr, len) }? {
            Given::Unspec => s.connect(None),
            Given::Addr(a) => s.connect(Some(for_socket(&s, a, true)?)),
        }
        .map(|()| 0)
    })
}

/// The socket's local address.
///
/// # Safety
/// `addr` points to `*len` writable bytes; `len` to a socklen_t.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    call(|| {
        let s = global::socket(fd)?;
        if addr.is_null() || len.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: per the contract.
        unsafe { write_addr(s.local()?, s.v6, addr, len) }.map(|()| 0)
    })
}

/// The socket's connected peer (`ENOTCONN`).
///
/// # Safety
/// As [`spate_getsockname`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    call(|| {
        let s = global::socket(fd)?;
        if addr.is_null() || len.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: per the contract.
        unsafe { write_addr(s.peer()?, s.v6, addr, len) }.map(|()| 0)
    })
}

/// A byte buffer from C, or `EFAULT` for NULL with a length.
///
/// # Safety
/// `p` points to `len` readable bytes, or is NULL.
unsafe fn bytes<'a>(p: *const c_void, len: usize) -> CResult<&'a [u8]> {
    match (p.is_null(), len) {
        (_, 0) => Ok(&[]),
        // No buffer is that long: the kernel would fault on it.
        (true, _) | (_, 0x8000_0000_0000_0000..) => Err(libc::EFAULT),
        // SAFETY: per the contract.
        (false, n) => Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) }),
    }
}

/// # Safety
/// `p` points to `len` writable bytes, or is NULL.
unsafe fn bytes_mut<'a>(p: *mut c_void, len: usize) -> CResult<&'a mut [u8]> {
    match (p.is_null(), len) {
        (_, 0) => Ok(&mut []),
        (true, _) | (_, 0x8000_0000_0000_0000..) => Err(libc::EFAULT),
        // SAFETY: per the contract.
        (false, n) => Ok(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), n) }),
    }
}

/// Sends `len` bytes to the connected peer.
///
/// # Safety
/// `buf` points to `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t {
    // SAFETY: per the contract.
    unsafe { spate_sendto(fd, buf, len, flags, std::ptr::null(), 0) }
}

/// Sends `len` bytes to `to` (or the connected peer when NULL).
///
/// # Safety
/// `buf` points to `len` readable bytes; `to` to `tolen` (or is NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_sendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    to: *const sockaddr,
    tolen: socklen_t,
) -> ssize_t {
    call(|| {
        let s = global::socket(fd)?;
        // SAFETY: per the contract.
        let data = unsafe { bytes(buf, len) }?;
        // SAFETY: per the contract.
        let to = unsafe { destination(&s, to, tolen) }?;
        s.send(&[data], to, &Default::default(), flags).map(|n| n as ssize_t)
    })
}

/// A send's destination: NULL (or `AF_UNSPEC`) for the connected peer.
///
/// # Safety
/// `to` points to `tolen` readable bytes, or is NULL.
pub(crate) unsafe fn destination(s: &CSocket, to: *const sockaddr, tolen: socklen_t) -> CResult<Option<SocketAddr>> {
    if to.is_null() {
        return Ok(None);
    }
    // SAFETY: per the contract.
    match unsafe { read_addr(to, tolen) }? {
        Given::Unspec if s.v6 => Ok(None),
        // Linux's udp_sendmsg takes AF_UNSPEC as AF_INET.
        Given::Unspec => Err(libc::EAFNOSUPPORT),
        Given::Addr(a) => for_socket(s, a, true).map(Some),
    }
}

/// The iovecs of a message as slices.
///
/// # Safety
/// `iov` points to `n` iovecs whose buffers are valid for their lengths.
unsafe fn iovecs<'a>(iov: *const libc::iovec, n: usize) -> CResult<Vec<&'a mut [u8]>> {
    if n > UIO_MAXIOV {
        return Err(libc::EMSGSIZE);
    }
    if n > 0 && iov.is_null() {
        return Err(libc::EFAULT);
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: `i < n` iovecs, per the contract.
        out.push(unsafe { iov_at(iov, i) }?);
    }
    Ok(out)
}

/// The buffer of iovec `i`.
///
/// # Safety
/// `iov` points to more than `i` iovecs whose buffers are valid for their
/// lengths.
unsafe fn iov_at<'a>(iov: *const libc::iovec, i: usize) -> CResult<&'a mut [u8]> {
    // SAFETY: per the contract.
    let v = unsafe { &*iov.add(i) };
    // SAFETY: per the contract.
    unsafe { bytes_mut(v.iov_base, v.iov_len) }
}

/// Runs `f` over message `m`'s buffers, without allocating for one iovec.
///
/// # Safety
/// As [`iovecs`].
unsafe fn with_iov<R>(m: &msghdr, f: impl FnOnce(&mut [&mut [u8]]) -> CResult<R>) -> CResult<R> {
    if m.msg_iovlen == 1 && !m.msg_iov.is_null() {
        // SAFETY: one iovec, per the contract.
        let mut one = [unsafe { iov_at(m.msg_iov, 0) }?];
        return f(&mut one);
    }
    if m.msg_iovlen <= FEW_IOVECS {
        if m.msg_iov.is_null() && m.msg_iovlen > 0 {
            return Err(libc::EFAULT);
        }
        // On the stack: no allocation for a header and payload scatter.
        let mut few = arrayvec::ArrayVec::<&mut [u8], FEW_IOVECS>::new();
        for i in 0..m.msg_iovlen {
            // SAFETY: `i < msg_iovlen` iovecs, per the contract.
            few.push(unsafe { iov_at(m.msg_iov, i) }?);
        }
        return f(&mut few);
    }
    // SAFETY: per the contract.
    let mut all = unsafe { iovecs(m.msg_iov, m.msg_iovlen) }?;
    f(&mut all)
}

/// Messages with this many iovecs at most are gathered on the stack.
const FEW_IOVECS: usize = 8;

/// Whether `m` asks for the bytes alone into one buffer that is not NULL
/// (a message that is not plain, an empty NULL buffer included, is
/// checked with [`check_msg`]).
///
/// # Safety
/// `m`'s iovec array is valid for `msg_iovlen` entries when not NULL.
#[inline(always)]
unsafe fn is_plain(m: &msghdr) -> bool {
    m.msg_iovlen == 1
        && m.msg_name.is_null()
        && !m.msg_iov.is_null()
        && (m.msg_controllen == 0 || !m.msg_control.is_null())
        // SAFETY: one iovec, per the contract.
        && unsafe { !(*m.msg_iov).iov_base.is_null() && (*m.msg_iov).iov_len <= isize::MAX as usize }
}

/// A plain message's buffer.
///
/// # Safety
/// `v` passed [`is_plain`]'s check: not NULL, valid for its length.
#[inline(always)]
unsafe fn plain_buf<'a>(v: &libc::iovec) -> &'a mut [u8] {
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts_mut(v.iov_base.cast::<u8>(), v.iov_len) }
}

/// What Linux checks of a message before it receives into it: its
/// iovecs, its address and control buffers.
///
/// # Safety
/// `m`'s iovec array is valid for `msg_iovlen` entries when not NULL.
#[inline(always)]
unsafe fn check_msg(m: &msghdr) -> CResult<()> {
    let iovs = match m.msg_iovlen {
        0 => Ok(()),
        1 if m.msg_iov.is_null() => Err(libc::EFAULT),
        // SAFETY: one iovec, per the contract.
        1 => check_iov(unsafe { &*m.msg_iov }),
        // SAFETY: per the contract.
        n => unsafe { check_iovs(m.msg_iov, n) },
    };
    iovs?;
    // A NULL address has no length, as Linux's.
    if !m.msg_name.is_null() && (m.msg_namelen as i32) < 0 {
        return Err(libc::EINVAL);
    }
    if m.msg_controllen > 0 && m.msg_control.is_null() {
        return Err(libc::EFAULT);
    }
    Ok(())
}

#[inline(always)]
fn check_iov(v: &libc::iovec) -> CResult<()> {
    match v.iov_len > 0 && (v.iov_base.is_null() || v.iov_len > isize::MAX as usize) {
        true => Err(libc::EFAULT),
        false => Ok(()),
    }
}

/// # Safety
/// `iov` points to `n` iovecs.
#[cold]
unsafe fn check_iovs(iov: *const libc::iovec, n: usize) -> CResult<()> {
    if n > UIO_MAXIOV {
        return Err(libc::EMSGSIZE);
    }
    if iov.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(iov, n) }.iter().try_for_each(check_iov)
}

/// Sends one message: its iovecs gathered, to `msg_name` (or the peer),
/// with its control messages (`IP_PKTINFO`, `IPV6_PKTINFO`, `IP_TOS`,
/// `IPV6_TCLASS`, `UDP_SEGMENT`).
///
/// # Safety
/// `msg` is a valid msghdr whose pointers are valid for their lengths.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    call(|| {
        let s = global::socket(fd)?;
        if msg.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: per the contract.
        unsafe { send_one(&s, &*msg, flags) }.map(|n| n as ssize_t)
    })
}

/// # Safety
/// As [`spate_sendmsg`].
unsafe fn send_one(s: &CSocket, m: &msghdr, flags: c_int) -> CResult<usize> {
    // A name of length 0 is none, as Linux takes it.
    let name = if m.msg_namelen == 0 { std::ptr::null() } else { m.msg_name.cast_const().cast() };
    // SAFETY: per the contract.
    let to = unsafe { destination(s, name, m.msg_namelen) }?;
    // SAFETY: per the contract.
    let control = unsafe { bytes(m.msg_control, m.msg_controllen) }?;
    let meta = if control.is_empty() { Default::default() } else { cmsg::to_send(control)? };
    // SAFETY: per the contract.
    unsafe {
        with_iov(m, |bufs| {
            let bufs: &[&mut [u8]] = bufs;
            match bufs {
                [one] => s.send(&[&**one], to, &meta, flags),
                many => {
                    let shared: Vec<&[u8]> = many.iter().map(|b| &**b).collect();
                    s.send(&shared, to, &meta, flags)
                }
            }
        })
    }
}

/// Sends up to `vlen` messages (at most 1,024); returns how many went, or
/// -1 when the first failed. Each message's `msg_len` is set.
///
/// # Safety
/// `msgs` points to `vlen` valid mmsghdrs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_sendmmsg(fd: c_int, msgs: *mut mmsghdr, vlen: c_uint, flags: c_int) -> c_int {
    call(|| {
        let s = global::socket(fd)?;
        let n = (vlen as usize).min(UIO_MAXIOV);
        if n == 0 {
            return Ok(0);
        }
        if msgs.is_null() {
            return Err(libc::EFAULT);
        }
        let mut sent = 0;
        for i in 0..n {
            // SAFETY: `i < vlen` messages, per the contract.
            let m = unsafe { &mut *msgs.add(i) };
            // SAFETY: per the contract.
            match unsafe { send_one(&s, &m.msg_hdr, flags) } {
                Ok(len) => {
                    m.msg_len = len as c_uint;
                    sent += 1;
                }
                Err(e) if sent == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(sent)
    })
}

thread_local! {
    /// The receive calls' batch: its capacity is kept, so a receive
    /// allocates nothing once warm.
    static BATCH: std::cell::RefCell<DatagramBatch> = std::cell::RefCell::new(DatagramBatch::with_capacity(64));
}

/// Receives one datagram into `buf`.
///
/// # Safety
/// `buf` points to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t {
    // SAFETY: per the contract.
    unsafe { spate_recvfrom(fd, buf, len, flags, std::ptr::null_mut(), std::ptr::null_mut()) }
}

/// Receives one datagram into `buf` and its sender into `from`.
///
/// # Safety
/// `buf` points to `len` writable bytes; `from` to `*fromlen` (or NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    from: *mut sockaddr,
    fromlen: *mut socklen_t,
) -> ssize_t {
    call(|| {
        let s = global::socket(fd)?;
        check_recv_flags(flags)?;
        // SAFETY: per the contract.
        let data = unsafe { bytes_mut(buf, len) }?;
        let want = Want { src: !from.is_null(), meta: false };
        let r = BATCH.with(|b| s.recv_one(&mut [data], flags, &mut b.borrow_mut(), want))?;
        // SAFETY: per the contract.
        unsafe { write_addr(r.src, s.v6, from, fromlen) }?;
        Ok(returned(&r, flags) as ssize_t)
    })
}

fn check_recv_flags(flags: c_int) -> CResult<()> {
    if flags & libc::MSG_OOB != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    // spate keeps no error queue: nothing is ever on it.
    if flags & libc::MSG_ERRQUEUE != 0 {
        return Err(libc::EAGAIN);
    }
    Ok(())
}

/// A receive's return: the bytes copied, or with `MSG_TRUNC` the
/// datagram's length.
fn returned(r: &Received, flags: c_int) -> usize {
    if flags & libc::MSG_TRUNC != 0 { r.len } else { r.copied }
}

/// Receives one message: the datagram into the iovecs, its sender into
/// `msg_name`, the control messages asked for into `msg_control`,
/// `MSG_TRUNC` and `MSG_CTRUNC` in `msg_flags`.
///
/// # Safety
/// `msg` is a valid msghdr whose pointers are valid for their lengths.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    call(|| {
        let s = global::socket(fd)?;
        check_recv_flags(flags)?;
        if msg.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: per the contract.
        unsafe { recv_msg(&s, &mut *msg, flags) }.map(|n| n as ssize_t)
    })
}

/// Receives one message (checked first) as `recvmsg` does; returns what
/// `recvmsg` returns.
///
/// # Safety
/// `m` is a msghdr whose pointers are valid for their lengths.
unsafe fn recv_msg(s: &CSocket, m: &mut msghdr, flags: c_int) -> CResult<usize> {
    // SAFETY: per the contract.
    unsafe { into_msg(s, m, flags, |bufs, want| BATCH.with(|b| s.recv_one(bufs, flags, &mut b.borrow_mut(), want))) }
}

/// Checks message `m` and fills it from `receive` (given its buffers and
/// what the message asks for): the payload, the sender, the control
/// messages, the flags. Returns what `recvmsg` returns.
///
/// # Safety
/// `m` is a msghdr whose pointers are valid for their lengths.
unsafe fn into_msg(
    s: &CSocket,
    m: &mut msghdr,
    flags: c_int,
    receive: impl FnOnce(&mut [&mut [u8]], Want) -> CResult<Received>,
) -> CResult<usize> {
    // SAFETY: per the contract.
    unsafe { check_msg(m) }?;
    let want = want_for(s, m);
    // SAFETY: per the contract (checked).
    let r = unsafe { with_iov(m, |bufs| receive(bufs, want)) }?;
    // SAFETY: per the contract.
    unsafe { finish_msg(s, m, &r) }?;
    Ok(returned(&r, flags))
}

/// What a message asks of its datagram: the sender when it has room for
/// an address, the metadata when the socket asked for control messages.
fn want_for(s: &CSocket, m: &msghdr) -> Want {
    Want { src: !m.msg_name.is_null(), meta: s.cmsgs.load(std::sync::atomic::Ordering::Relaxed) != 0 }
}

/// Writes a received datagram's sender, control messages and flags into
/// its message.
///
/// # Safety
/// As [`spate_recvmsg`].
unsafe fn finish_msg(s: &CSocket, m: &mut msghdr, r: &Received) -> CResult<()> {
    let mut flags = 0;
    if !m.msg_name.is_null() {
        let mut len = m.msg_namelen;
        // SAFETY: per the contract.
        unsafe { write_addr(r.src, s.v6, m.msg_name.cast(), &mut len) }?;
        m.msg_namelen = len;
    }
    let wants = s.cmsgs.load(std::sync::atomic::Ordering::Relaxed);
    // SAFETY: per the contract.
    let control = unsafe { bytes_mut(m.msg_control, m.msg_controllen) }?;
    let mut w = cmsg::Writer::new(control);
    if wants != 0
        && let Some(meta) = &r.meta
    {
        cmsg::received(&mut w, wants, meta);
    }
    if w.truncated {
        flags |= libc::MSG_CTRUNC;
    }
    m.msg_controllen = w.len();
    if r.copied < r.len {
        flags |= libc::MSG_TRUNC;
    }
    m.msg_flags = flags;
    Ok(())
}

/// Receives up to `vlen` messages (at most 1,024), as Linux's `recvmmsg`:
/// a blocking socket waits for each until `vlen` arrived, unless
/// `MSG_WAITFORONE` (then only for the first); `timeout`, when given, is
/// looked at after each datagram.
///
/// # Safety
/// `msgs` points to `vlen` valid mmsghdrs; `timeout` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_recvmmsg(
    fd: c_int,
    msgs: *mut mmsghdr,
    vlen: c_uint,
    flags: c_int,
    timeout: *mut timespec,
) -> c_int {
    call(|| {
        let s = global::socket(fd)?;
        check_recv_flags(flags)?;
        let n = (vlen as usize).min(UIO_MAXIOV);
        if n == 0 {
            return Ok(0);
        }
        if msgs.is_null() {
            return Err(libc::EFAULT);
        }
        let deadline = match timeout.is_null() {
            true => None,
            false => {
                // SAFETY: per the contract.
                let t = unsafe { *timeout };
                if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) {
                    return Err(libc::EINVAL);
                }
                // A deadline past what the clock holds is none.
                std::time::Instant::now().checked_add(std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32))
            }
        };
        if flags & libc::MSG_PEEK != 0 {
            // As Linux's: one peek per message, each the datagram at the
            // head, which stays queued.
            let mut flags_now = flags;
            for i in 0..n {
                // SAFETY: `i < vlen` messages, per the contract.
                let m = unsafe { &mut *msgs.add(i) };
                // SAFETY: per the contract.
                match unsafe { recv_msg(&s, &mut m.msg_hdr, flags_now) } {
                    Ok(len) => m.msg_len = len as c_uint,
                    Err(e) if i == 0 => return Err(e),
                    Err(_) => return Ok(i as c_int),
                }
                if flags & libc::MSG_WAITFORONE != 0 {
                    flags_now |= libc::MSG_DONTWAIT;
                }
            }
            return Ok(n as c_int);
        }
        // Each message is checked before a datagram is put in it, as
        // Linux's: the first before anything is taken (a bad one fails
        // at once, waiting for nothing), each other one as it is filled;
        // a bad one ends the call with the messages before it, the
        // datagrams taken for it and after it put back.
        // SAFETY: `vlen` > 0 messages, per the contract.
        unsafe { check_msg(&(*msgs).msg_hdr) }?;
        let plain = s.cmsgs.load(std::sync::atomic::Ordering::Relaxed) == 0;
        let mut got = 0;
        let mut flags_now = flags;
        while got < n {
            // Each datagram goes straight into its message under the
            // queue's lock, its mbuf into a burst freed after it: a burst
            // at a time.
            let mut done: Burst = Burst::new();
            let mut bad = None;
            let mut i = got;
            let r = s.recv_each((n - got).min(done.capacity()), flags_now, |d| {
                // SAFETY: `i < vlen` messages, per the contract.
                let m = unsafe { &mut *msgs.add(i) };
                // SAFETY: per the contract.
                if plain && unsafe { is_plain(&m.msg_hdr) } {
                    // SAFETY: per the contract.
                    unsafe { fill_plain(&d, m, flags) };
                    i += 1;
                    let _ = done.push(d.into_mbuf());
                    return Ok(());
                }
                // SAFETY: per the contract.
                match unsafe { fill(&s, d, m, flags) } {
                    Ok(mbuf) => {
                        i += 1;
                        let _ = done.push(mbuf);
                        Ok(())
                    }
                    Err((d, e)) => {
                        bad = Some(e);
                        Err(d)
                    }
                }
            });
            done.clear();
            match (r, bad) {
                (Ok(k), None) if k > 0 => got += k,
                // A bad message ends the call with those before it, the
                // datagram it was to take still queued, as Linux's (which
                // keeps the error for the next call, SO_ERROR; spate
                // reports it only when nothing was received).
                (Ok(k), Some(e)) => return if got + k == 0 { Err(e) } else { Ok((got + k) as c_int) },
                // Shut down for reading: nothing more.
                (Ok(_), None) => break,
                (Err(e), _) if got == 0 => return Err(e),
                (Err(_), _) => break,
            }
            if flags & libc::MSG_WAITFORONE != 0 {
                flags_now |= libc::MSG_DONTWAIT;
            }
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                break;
            }
        }
        Ok(got as c_int)
    })
}

/// Delivers datagram `d` into plain message `m` (see [`is_plain`]) of a
/// socket that asks for no control message: the payload alone, reading
/// no header and checking nothing more.
///
/// # Safety
/// `m` is a message as the caller of `spate_recvmmsg` gives it, and
/// plain.
#[inline(always)]
unsafe fn fill_plain(d: &Datagram, m: &mut mmsghdr, flags: c_int) {
    // SAFETY: a plain message's one iovec.
    let buf = unsafe { plain_buf(&*m.msg_hdr.msg_iov) };
    let copied = d.copy_to(buf);
    let len = d.len();
    m.msg_hdr.msg_controllen = 0;
    m.msg_hdr.msg_flags = if copied < len { libc::MSG_TRUNC } else { 0 };
    m.msg_len = if flags & libc::MSG_TRUNC != 0 { len } else { copied } as c_uint;
}

/// Delivers datagram `d` into message `m`, checked first
/// ([`check_msg`]): the payload, and the sender and control messages it
/// asks for; its mbuf to free, or the datagram back with the error. Out
/// of line, taking the datagram by value: the plain path's datagram
/// then stays in registers.
///
/// # Safety
/// `m` is a message as the caller of `spate_recvmmsg` gives it.
#[inline(never)]
unsafe fn fill(
    s: &CSocket,
    d: Datagram,
    m: &mut mmsghdr,
    flags: c_int,
) -> Result<spate::dpdk::Mbuf, (Datagram, c_int)> {
    // SAFETY: per the contract.
    match unsafe { into_msg(s, &mut m.msg_hdr, flags, |bufs, want| Ok(s.deliver(&d, bufs, want))) } {
        Ok(len) => {
            m.msg_len = len as c_uint;
            Ok(d.into_mbuf())
        }
        Err(e) => Err((d, e)),
    }
}

/// Shuts the socket down for reading (blocked receives return 0),
/// writing (sends fail with `EPIPE`), or both; `ENOTCONN` unless
/// connected, taking effect all the same, as Linux's.
#[unsafe(no_mangle)]
pub extern "C" fn spate_shutdown(fd: c_int, how: c_int) -> c_int {
    call(|| global::socket(fd)?.shutdown(how).map(|()| 0))
}

/// Closes the socket and its descriptor.
#[unsafe(no_mangle)]
pub extern "C" fn spate_close(fd: c_int) -> c_int {
    call(|| {
        let s: Arc<CSocket> = global::remove(fd)?;
        // Threads blocked in it wake (and find it closed).
        s.ready.notify();
        Ok(0)
    })
}

/// `FIONREAD` (the next datagram's length, 0 for none) and `FIONBIO`
/// (`*arg` non-zero: non-blocking); `arg` points to an int.
///
/// # Safety
/// `arg` points to an int.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_ioctl(fd: c_int, request: c_ulong, arg: *mut c_int) -> c_int {
    call(|| {
        let s = global::socket(fd)?;
        if arg.is_null() {
            return Err(libc::EFAULT);
        }
        match request {
            libc::FIONREAD => {
                // SAFETY: per the contract.
                unsafe { *arg = s.next_len().min(i32::MAX as usize) as c_int };
            }
            libc::FIONBIO => {
                // SAFETY: per the contract.
                s.set_nonblocking(unsafe { *arg } != 0)?;
            }
            _ => return Err(libc::ENOTTY),
        }
        Ok(0)
    })
}

/// `F_GETFL` (`O_RDWR`, with `O_NONBLOCK` when set) and `F_SETFL`
/// (`O_NONBLOCK` taken, other flags ignored as Linux ignores them on a
/// socket); `F_GETFD`/`F_SETFD` act on the descriptor.
#[unsafe(no_mangle)]
pub extern "C" fn spate_fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    call(|| {
        let s = global::socket(fd)?;
        match cmd {
            libc::F_GETFL => {
                let nb = s.nonblocking.load(std::sync::atomic::Ordering::Relaxed);
                Ok(libc::O_RDWR | if nb { libc::O_NONBLOCK } else { 0 })
            }
            libc::F_SETFL => s.set_nonblocking(arg as c_int & libc::O_NONBLOCK != 0).map(|()| 0),
            libc::F_GETFD | libc::F_SETFD => {
                // SAFETY: fcntl on the socket's own descriptor.
                let r = unsafe { libc::fcntl(s.ready.fd, cmd, arg as c_int) };
                if r < 0 { Err(os(std::io::Error::last_os_error())) } else { Ok(r) }
            }
            _ => Err(libc::EINVAL),
        }
    })
}

/// Sets an option (Linux's levels, names and layouts); `ENOPROTOOPT` for
/// one spate lacks.
///
/// # Safety
/// `value` points to `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    value: *const c_void,
    len: socklen_t,
) -> c_int {
    call(|| {
        let s = global::socket(fd)?;
        if (len as i32) < 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: per the contract.
        let v = unsafe { bytes(value, len as usize) }?;
        options::set(&s, level, name, v).map(|()| 0)
    })
}

/// Reads an option into `value` (`*len` bytes at most; `*len` set).
///
/// # Safety
/// `value` points to `*len` writable bytes; `len` to a socklen_t.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    value: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    call(|| {
        let s = global::socket(fd)?;
        if len.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: per the contract.
        let room = unsafe { *len } as i32;
        if room < 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: per the contract.
        let out = unsafe { bytes_mut(value, room as usize) }?;
        let n = options::get(&s, level, name, out)?;
        // SAFETY: per the contract.
        unsafe { *len = n as socklen_t };
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn version_constants_match_the_crate() {
        let v = env!("CARGO_PKG_VERSION");
        let parts: Vec<i32> = v.split('.').map(|p| p.parse().unwrap()).collect();
        assert_eq!(parts, [super::SPATE_VERSION_MAJOR, super::SPATE_VERSION_MINOR, super::SPATE_VERSION_PATCH]);
        assert_eq!(super::SPATE_VERSION_NUMBER, parts[0] * 10000 + parts[1] * 100 + parts[2]);
        let s = unsafe { std::ffi::CStr::from_ptr(super::spate_version()) };
        assert_eq!(s.to_str().unwrap(), v);
    }
}

#![no_main]
//! libspate's entry points with arbitrary arguments, as a C program could
//! pass them: any descriptor, family, level, option name, flag and length,
//! NULL or a real buffer for each pointer (a wild pointer is the one input
//! no userspace library can refuse). Every call answers 0, a count, or -1
//! with an errno; never a panic (which `call` would turn into `EIO`),
//! never an error without Linux's errno (`EIO` too), never a crash.
//!
//! One stack for the whole run, on `net_null` with no receive side: no
//! frame leaves the process. Receives always carry `MSG_DONTWAIT` (the
//! socket may have been made blocking), so no input waits; every socket
//! and send buffer an input made is closed or freed at its end.
use std::ffi::{CString, c_int, c_uint, c_void};
use std::sync::Once;

use libc::{iovec, mmsghdr, msghdr, sockaddr, socklen_t, timespec};
use libfuzzer_sys::fuzz_target;
use spate_capi::ffi::*;
use spate_capi::ffi_zerocopy::*;

/// The bytes of an input, read as the arguments of calls.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }
    /// Up to `max` bytes of the input.
    fn bytes(&mut self, max: usize) -> &[u8] {
        let n = (self.byte() as usize * 4).min(max).min(self.0.len());
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        b
    }
    /// A length: small most of the time, sometimes past any limit.
    fn len(&mut self) -> usize {
        match self.byte() % 8 {
            0 => self.u32() as usize,
            1 => 65_508 + self.byte() as usize,
            2 => usize::MAX - self.byte() as usize,
            _ => self.u16() as usize % 2_048,
        }
    }
    /// One of the input's sockets, or any descriptor.
    fn fd(&mut self, fds: &[c_int]) -> c_int {
        match self.byte() {
            b @ 0..=239 if !fds.is_empty() => fds[b as usize % fds.len()],
            b if b % 2 == 0 => -(b as c_int),
            b => b as c_int * 1_000,
        }
    }
    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

/// Buffers a call's pointers point into: large enough for any length
/// `Input::len` yields below 70,000 (a larger length comes with a short
/// buffer only where the call must check it first).
struct Arena {
    data: Vec<u8>,
    addr: [u8; 256],
    addr_len: socklen_t,
    opt: [u8; 256],
    iov: [iovec; 4],
    msgs: [mmsghdr; 4],
    control: [u8; 256],
    dgrams: [spate_datagram; 8],
    bufs: Vec<spate_sendbuf>,
}

const DATA: usize = 70_000;

/// A pointer for `len` bytes of `buf`: NULL when asked, or when `len` is
/// longer than the buffer (the call sees a NULL with a length).
fn ptr_for(buf: &mut [u8], len: usize, null: bool) -> *mut c_void {
    match null || len > buf.len() {
        true => std::ptr::null_mut(),
        false => buf.as_mut_ptr().cast(),
    }
}

fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let config = std::env::temp_dir().join(format!("spate-fuzz-c-api-{}.toml", std::process::id()));
        std::fs::write(&config, "hugepages = \"off\"\nmemory_mb = 256\n\n[control]\nenabled = false\n").expect("write the configuration");
        let args = [
            "fuzz",
            "--config",
            config.to_str().expect("a UTF-8 path"),
            "--vdev",
            "net_null0,no-rx=1",
            "--ip",
            "198.18.0.2/24",
            "--ip6",
            "2001:db8::2/64",
            "--lcores",
            "1",
        ];
        let c: Vec<CString> = args.iter().map(|a| CString::new(*a).expect("no NUL")).collect();
        let argv: Vec<*const libc::c_char> = c.iter().map(|a| a.as_ptr()).collect();
        // SAFETY: argv holds argc C strings.
        assert_eq!(unsafe { spate_init(argv.len() as c_int, argv.as_ptr()) }, 0, "spate_init");
        assert_eq!(spate_start(), 0, "spate_start");
        let _ = std::fs::remove_file(&config);
    });
}

/// A result of -1 carries an errno that is not `EIO`.
fn check(call: &str, r: isize) {
    if r < 0 {
        let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        assert!(r == -1 && e != 0 && e != libc::EIO, "{call} returned {r} with errno {e}");
    }
}

fuzz_target!(|data: &[u8]| {
    init();
    let mut input = Input(data);
    let mut a = Box::new(Arena {
        data: vec![0; DATA],
        addr: [0; 256],
        addr_len: 0,
        opt: [0; 256],
        // SAFETY: plain C structs, zero is a valid value (NULL pointers).
        iov: unsafe { std::mem::zeroed() },
        // SAFETY: as above.
        msgs: unsafe { std::mem::zeroed() },
        control: [0; 256],
        // SAFETY: as above: an all-zero handle holds nothing.
        dgrams: unsafe { std::mem::zeroed() },
        bufs: Vec::new(),
    });
    let mut fds: Vec<c_int> = vec![];
    let mut steps = 0;
    while !input.done() && steps < 64 {
        steps += 1;
        let op = input.byte() % 24;
        let fd = input.fd(&fds);
        let null = input.byte() % 8 == 0;
        let flags = match input.byte() % 4 {
            0 => input.u32() as c_int,
            1 => libc::MSG_TRUNC | libc::MSG_PEEK,
            _ => 0,
        };
        // An address: any bytes, any length up to the buffer's, or past it.
        let bytes = input.bytes(256);
        a.addr[..bytes.len()].copy_from_slice(bytes);
        if let Some(f) = a.addr.get_mut(..2) {
            // A family the calls know, most of the time.
            match input.byte() % 4 {
                0 => f.copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes()),
                1 => f.copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes()),
                _ => {}
            }
        }
        let addr_len = match input.byte() % 4 {
            0 => 16,
            1 => 28,
            2 => input.u32(),
            _ => input.byte() as socklen_t,
        };
        let addr = if null || addr_len as usize > a.addr.len() {
            std::ptr::null()
        } else {
            a.addr.as_ptr().cast::<sockaddr>()
        };
        let len = input.len();
        let r: isize = match op {
            0 => {
                let domain = [libc::AF_INET, libc::AF_INET6, libc::AF_UNIX, input.u16() as c_int][input.byte() as usize % 4];
                let kind = [libc::SOCK_DGRAM, libc::SOCK_DGRAM | libc::SOCK_NONBLOCK, libc::SOCK_STREAM, input.u32() as c_int]
                    [input.byte() as usize % 4];
                let s = spate_socket(domain, kind, [0, libc::IPPROTO_UDP, input.byte() as c_int][input.byte() as usize % 3]);
                if s >= 0 && fds.len() < 16 {
                    fds.push(s);
                } else if s >= 0 {
                    spate_close(s);
                }
                s as isize
            }
            // SAFETY: addr is NULL or `addr_len` bytes.
            1 => unsafe { spate_bind(fd, addr, addr_len) as isize },
            // SAFETY: as above.
            2 => unsafe { spate_connect(fd, addr, addr_len) as isize },
            3 | 4 => {
                a.addr_len = addr_len;
                let lenp: *mut socklen_t = if input.byte() % 8 == 0 { std::ptr::null_mut() } else { &mut a.addr_len };
                let out = if null || a.addr_len as usize > a.addr.len() {
                    std::ptr::null_mut()
                } else {
                    a.addr.as_mut_ptr().cast::<sockaddr>()
                };
                // SAFETY: out is NULL or `*lenp` bytes.
                unsafe {
                    match op {
                        3 => spate_getsockname(fd, out, lenp) as isize,
                        _ => spate_getpeername(fd, out, lenp) as isize,
                    }
                }
            }
            5 => {
                let buf = ptr_for(&mut a.data, len, null);
                // SAFETY: buf is NULL or `len` bytes.
                unsafe { spate_sendto(fd, buf, len, flags | libc::MSG_DONTWAIT, addr, addr_len) }
            }
            6 => {
                let buf = ptr_for(&mut a.data, len, null);
                // SAFETY: as above.
                unsafe { spate_send(fd, buf, len, flags | libc::MSG_DONTWAIT) }
            }
            7 | 8 => {
                let buf = ptr_for(&mut a.data, len, null);
                a.addr_len = addr_len;
                let out = if addr.is_null() { std::ptr::null_mut() } else { a.addr.as_mut_ptr().cast::<sockaddr>() };
                let lenp: *mut socklen_t = if input.byte() % 4 == 0 { std::ptr::null_mut() } else { &mut a.addr_len };
                // SAFETY: buf NULL or `len` bytes; out NULL or `*lenp` bytes.
                unsafe {
                    match op {
                        7 => spate_recvfrom(fd, buf, len, flags | libc::MSG_DONTWAIT, out, lenp),
                        _ => spate_recv(fd, buf, len, flags | libc::MSG_DONTWAIT),
                    }
                }
            }
            9..=12 => {
                // Messages over the arena: iovecs, addresses and control
                // buffers of any length the arena holds, or NULL.
                let control = input.bytes(256);
                a.control[..control.len()].copy_from_slice(control);
                let data = a.data.as_mut_ptr();
                for (i, v) in a.iov.iter_mut().enumerate() {
                    let l = input.u16() as usize % 4_096;
                    // SAFETY: four iovecs of at most 4 KiB, 16 KiB apart, in 70,000 bytes.
                    *v = iovec { iov_base: unsafe { data.add(i * 16_384) }.cast(), iov_len: l };
                }
                if input.byte() % 8 == 0 {
                    a.iov[0].iov_base = std::ptr::null_mut();
                }
                let iov = a.iov.as_mut_ptr();
                let addr_p = a.addr.as_mut_ptr();
                let control_p = a.control.as_mut_ptr();
                for m in a.msgs.iter_mut() {
                    let iovlen = match input.byte() % 8 {
                        0 => input.u32() as usize,
                        k => (k as usize - 1) % 5,
                    };
                    let namelen = input.byte() as socklen_t;
                    let controllen = input.byte() as usize;
                    m.msg_hdr = msghdr {
                        msg_name: if input.byte() % 2 == 0 { std::ptr::null_mut() } else { addr_p.cast() },
                        msg_namelen: namelen,
                        // More iovecs than four only with NULL.
                        msg_iov: if iovlen > 4 || input.byte() % 8 == 0 { std::ptr::null_mut() } else { iov },
                        msg_iovlen: iovlen,
                        msg_control: if input.byte() % 2 == 0 { std::ptr::null_mut() } else { control_p.cast() },
                        msg_controllen: controllen,
                        msg_flags: 0,
                    };
                    m.msg_len = 0;
                }
                // A vlen past the array comes with NULL.
                let vlen = match input.byte() % 8 {
                    0 => input.u32(),
                    k => (k as c_uint - 1) % 5,
                };
                let msgs = if vlen > 4 || null { std::ptr::null_mut() } else { a.msgs.as_mut_ptr() };
                let mut t = timespec { tv_sec: input.byte() as i64 - 128, tv_nsec: input.u32() as i64 };
                let timeout: *mut timespec = if input.byte() % 2 == 0 { std::ptr::null_mut() } else { &mut t };
                // SAFETY: every pointer is NULL or valid for what it claims.
                unsafe {
                    match op {
                        9 => spate_sendmsg(fd, msgs.cast::<msghdr>(), flags | libc::MSG_DONTWAIT),
                        10 => spate_recvmsg(fd, msgs.cast::<msghdr>(), flags | libc::MSG_DONTWAIT),
                        11 => spate_sendmmsg(fd, msgs, vlen, flags | libc::MSG_DONTWAIT) as isize,
                        _ => spate_recvmmsg(fd, msgs, vlen, flags | libc::MSG_DONTWAIT, timeout) as isize,
                    }
                }
            }
            13 | 14 => {
                let level = [libc::SOL_SOCKET, libc::IPPROTO_IP, libc::IPPROTO_IPV6, libc::IPPROTO_UDP, input.u32() as c_int]
                    [input.byte() as usize % 5];
                let name = input.byte() as c_int;
                let value = input.bytes(256);
                a.opt[..value.len()].copy_from_slice(value);
                let opt_len = match input.byte() % 4 {
                    0 => input.u32(),
                    1 => 4,
                    _ => input.byte() as socklen_t,
                };
                let p = if null || opt_len as usize > a.opt.len() { std::ptr::null_mut() } else { a.opt.as_mut_ptr() };
                if op == 13 {
                    // SO_RCVTIMEO and blocking modes are harmless: every
                    // receive here carries MSG_DONTWAIT.
                    // SAFETY: p is NULL or `opt_len` bytes.
                    unsafe { spate_setsockopt(fd, level, name, p.cast(), opt_len) as isize }
                } else {
                    let mut l = opt_len;
                    let lp: *mut socklen_t = if input.byte() % 8 == 0 { std::ptr::null_mut() } else { &mut l };
                    // SAFETY: as above.
                    unsafe { spate_getsockopt(fd, level, name, p.cast(), lp) as isize }
                }
            }
            15 => {
                let mut v: c_int = input.u32() as c_int;
                let arg: *mut c_int = if null { std::ptr::null_mut() } else { &mut v };
                let request = [libc::FIONREAD, libc::FIONBIO, input.u32() as u64][input.byte() as usize % 3];
                // SAFETY: arg is NULL or an int.
                unsafe { spate_ioctl(fd, request, arg) as isize }
            }
            16 => {
                let cmd = [libc::F_GETFL, libc::F_SETFL, input.byte() as c_int][input.byte() as usize % 3];
                spate_fcntl(fd, cmd, input.u32() as libc::c_long) as isize
            }
            17 => spate_shutdown(fd, input.byte() as c_int % 4) as isize,
            18 => {
                let r = spate_close(fd);
                if r == 0 {
                    fds.retain(|f| *f != fd);
                }
                r as isize
            }
            19 => spate_poll_fd(fd) as isize,
            20 => {
                let max = input.byte() as c_uint % 9;
                let out = if null { std::ptr::null_mut() } else { a.dgrams.as_mut_ptr() };
                // SAFETY: out is NULL or 8 handles, `max` at most 8.
                let n = unsafe { spate_recv_zc(fd, out, max, flags | libc::MSG_DONTWAIT) };
                if n > 0 {
                    let (dst, dst_len) = (a.addr.as_mut_ptr().cast::<sockaddr>(), &mut a.addr_len);
                    *dst_len = 128;
                    // SAFETY: a held handle; the addresses 128 bytes each in 256.
                    unsafe {
                        check("spate_datagram_addrs", spate_datagram_addrs(fd, a.dgrams.as_ptr(), dst, dst_len, std::ptr::null_mut(), std::ptr::null_mut()) as isize);
                        check("spate_datagram_copy", spate_datagram_copy(a.dgrams.as_ptr(), a.data.as_mut_ptr(), len.min(DATA)));
                    }
                    // Half the time replied in place, else released.
                    if input.byte() % 2 == 0 {
                        // SAFETY: `n` held handles.
                        check("spate_reply_zc", unsafe { spate_reply_zc(fd, a.dgrams.as_mut_ptr(), n as c_uint) } as isize);
                    }
                    // SAFETY: released or replied handles are passed over.
                    unsafe { spate_release(a.dgrams.as_mut_ptr(), n as c_uint) };
                }
                n as isize
            }
            21 => {
                // SAFETY: an all-zero handle holds nothing.
                let mut b: spate_sendbuf = unsafe { std::mem::zeroed() };
                let out: *mut spate_sendbuf = if null { std::ptr::null_mut() } else { &mut b };
                // SAFETY: out is NULL or one handle.
                let r = unsafe { spate_sendbuf_alloc(fd, out, len) };
                if r == 0 && !out.is_null() {
                    let fill = (b.cap as usize).min(input.byte() as usize * 8);
                    // SAFETY: `cap` writable bytes at `data`.
                    unsafe { std::ptr::write_bytes(b.data, 0x5a, fill) };
                    b.len = fill as u32;
                    a.bufs.push(b);
                }
                r as isize
            }
            22 => {
                let n = (input.byte() as usize % 3).min(a.bufs.len());
                let start = a.bufs.len() - n;
                // SAFETY: `n` handles from spate_sendbuf_alloc; addr NULL or `addr_len` bytes.
                let r = unsafe { spate_send_zc(fd, a.bufs[start..].as_mut_ptr(), n as c_uint, addr, addr_len) };
                // Sent ones are taken, the rest freed below.
                r as isize
            }
            _ => {
                let n = a.bufs.len() as c_uint;
                // SAFETY: `n` handles, held or cleared.
                unsafe { spate_sendbuf_free(a.bufs.as_mut_ptr(), n) };
                a.bufs.clear();
                0
            }
        };
        check(&format!("call {op} on {fd}"), r);
    }
    let n = a.bufs.len() as c_uint;
    // SAFETY: as above.
    unsafe { spate_sendbuf_free(a.bufs.as_mut_ptr(), n) };
    for fd in fds {
        assert_eq!(spate_close(fd), 0, "closing a socket of the input");
    }
});

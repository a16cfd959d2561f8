//! The zero-copy C calls: datagrams that own their mbufs handed to the
//! program (a pointer to the payload, its length, and the datagram itself
//! kept in the caller's `spate_datagram`), released in bulk, sent back in
//! their own buffers; send buffers filled in place. The datagram and the
//! send buffer live in C memory between calls: moved there with
//! `ptr::write`, taken back with `ptr::read`, and the handle cleared so a
//! second release finds nothing.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_uint};
use std::mem::{align_of, size_of};

use libc::{sockaddr, socklen_t};
use spate::dpdk::Burst;
use spate::{Datagram, SendBuf};

use crate::ffi::{call, destination, write_addr};
use crate::global;
use crate::socket::CResult;

/// A received datagram owned by the program until `spate_release` or
/// `spate_reply_zc`: `data` points to its payload in the mbuf (the first
/// `seg_len` bytes of `len`: a datagram reassembled from fragments or
/// coalesced by UDP GRO continues in further segments, which
/// `spate_datagram_copy` gathers). The program may write the payload in
/// place (a reply) and lower `len`; it must not copy the struct to
/// release it twice.
#[repr(C)]
#[derive(Debug)]
pub struct spate_datagram {
    /// The payload.
    pub data: *mut u8,
    /// Its length.
    pub len: u32,
    /// Bytes at `data`.
    pub seg_len: u32,
    /// The datagram (spate's, opaque).
    pub opaque: [u64; 2],
}

/// A send buffer from `spate_sendbuf_alloc`: write `len` bytes (at most
/// the length asked for) at `data`, then send it with `spate_send_zc` or
/// free it with `spate_sendbuf_free`.
#[repr(C)]
#[derive(Debug)]
pub struct spate_sendbuf {
    /// Where to write the payload.
    pub data: *mut u8,
    /// The payload's length (lower it to send less).
    pub len: u32,
    /// Bytes that may be written at `data`.
    pub cap: u32,
    /// The buffer (spate's, opaque).
    pub opaque: [u64; 2],
}

const _: () = assert!(size_of::<Datagram>() <= size_of::<[u64; 2]>() && align_of::<Datagram>() <= 8);
const _: () = assert!(size_of::<SendBuf>() <= size_of::<[u64; 2]>() && align_of::<SendBuf>() <= 8);

/// Whether a handle holds a datagram or buffer (not yet released).
fn held(opaque: &[u64; 2]) -> bool {
    opaque != &[0, 0]
}

/// Takes the datagram out of `d`, clearing the handle.
///
/// # Safety
/// `d.opaque` holds a datagram written by `spate_recv_zc` (checked not
/// cleared by the caller).
unsafe fn take(d: &mut spate_datagram) -> Datagram {
    // SAFETY: per the contract; the handle is cleared at once, so the
    // datagram has one owner.
    let g = unsafe { std::ptr::read(d.opaque.as_ptr().cast::<Datagram>()) };
    d.opaque = [0, 0];
    d.data = std::ptr::null_mut();
    g
}

thread_local! {
    /// The buffers of a reply or send call: their capacity is kept, so a
    /// call allocates nothing once warm.
    static BUFS: std::cell::RefCell<Vec<SendBuf>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Receives up to `max` datagrams into `out` without copying them; waits
/// (as the socket's mode and `flags` allow) for the first only. Returns
/// how many.
///
/// # Safety
/// `out` points to `max` writable `spate_datagram`s, whose earlier
/// datagrams were released.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_recv_zc(fd: c_int, out: *mut spate_datagram, max: c_uint, flags: c_int) -> c_int {
    call(|| {
        let s = global::socket(fd)?;
        if max == 0 {
            return Ok(0);
        }
        if out.is_null() {
            return Err(libc::EFAULT);
        }
        // A datagram handed over is taken: nothing to peek at.
        if flags & libc::MSG_PEEK != 0 {
            return Err(libc::EINVAL);
        }
        // Each straight into its slot, under the queue's lock.
        let mut i = 0;
        let n = s.recv_each(max as usize, flags, |d| {
            // SAFETY: `i < max` slots, per the contract.
            let slot = unsafe { &mut *out.add(i) };
            let first = d.data();
            slot.data = first.as_ptr().cast_mut();
            slot.seg_len = first.len() as u32;
            slot.len = d.len() as u32;
            // SAFETY: the slot's opaque words hold a Datagram (size and
            // alignment asserted above); it is moved there.
            unsafe { std::ptr::write(slot.opaque.as_mut_ptr().cast::<Datagram>(), d) };
            i += 1;
            Ok(())
        })?;
        Ok(n as c_int)
    })
}

/// Gives `n` datagrams back (their mbufs freed in bulk); released or
/// empty handles are passed over.
///
/// # Safety
/// `d` points to `n` `spate_datagram`s from `spate_recv_zc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_release(d: *mut spate_datagram, n: c_uint) {
    if d.is_null() {
        return;
    }
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { release(d, n) }));
}

/// # Safety
/// As [`spate_release`].
unsafe fn release(d: *mut spate_datagram, n: c_uint) {
    // Their mbufs go back 32 at a time, straight from the handles.
    let mut burst: Burst = Burst::new();
    for i in 0..n as usize {
        // SAFETY: `i < n`, per the contract.
        let slot = unsafe { &mut *d.add(i) };
        if held(&slot.opaque) {
            // SAFETY: a datagram spate_recv_zc wrote.
            let m = unsafe { take(slot) }.into_mbuf();
            if let Err(m) = burst.push(m) {
                burst.clear();
                let _ = burst.push(m);
            }
        }
    }
    burst.clear();
}

/// Copies datagram `d`'s payload (every segment) into `buf`; returns the
/// bytes copied.
///
/// # Safety
/// `d` is a held `spate_datagram`; `buf` points to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_datagram_copy(d: *const spate_datagram, buf: *mut u8, len: usize) -> libc::ssize_t {
    call(|| {
        // SAFETY: per the contract.
        let g = unsafe { datagram(d) }?;
        if buf.is_null() && len > 0 {
            return Err(libc::EFAULT);
        }
        // SAFETY: per the contract.
        let out = if len == 0 { &mut [][..] } else { unsafe { std::slice::from_raw_parts_mut(buf, len) } };
        Ok(g.copy_to(out) as libc::ssize_t)
    })
}

/// The datagram a held handle keeps, by reference.
///
/// # Safety
/// `d` is NULL or a `spate_datagram` from `spate_recv_zc`.
unsafe fn datagram<'a>(d: *const spate_datagram) -> CResult<&'a Datagram> {
    if d.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: per the contract.
    let slot = unsafe { &*d };
    if !held(&slot.opaque) {
        return Err(libc::EINVAL);
    }
    // SAFETY: a datagram spate_recv_zc wrote, not taken since.
    Ok(unsafe { &*slot.opaque.as_ptr().cast::<Datagram>() })
}

/// Datagram `d`'s sender and destination as socket `fd`'s family shows
/// them (either pointer may be NULL), as `recvfrom` writes an address.
///
/// # Safety
/// `d` is a held `spate_datagram`; each address points to `*len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_datagram_addrs(
    fd: c_int,
    d: *const spate_datagram,
    src: *mut sockaddr,
    srclen: *mut socklen_t,
    dst: *mut sockaddr,
    dstlen: *mut socklen_t,
) -> c_int {
    call(|| {
        let s = global::socket(fd)?;
        // SAFETY: per the contract.
        let g = unsafe { datagram(d) }?;
        let meta = g.meta();
        // SAFETY: per the contract.
        unsafe {
            write_addr(s.present(meta.src), s.v6, src, srclen)?;
            write_addr(s.present(meta.dst), s.v6, dst, dstlen)?;
        }
        Ok(0)
    })
}

/// Sends each datagram back to its sender from socket `fd`, in its own
/// buffer (the payload as the program left it at `data`, `len` bytes: no
/// longer than received), all in one batch; the handles are consumed,
/// sent or not. Returns how many went, or -1 when none could.
///
/// # Safety
/// `d` points to `n` `spate_datagram`s from `spate_recv_zc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_reply_zc(fd: c_int, d: *mut spate_datagram, n: c_uint) -> c_int {
    call(|| {
        let s = global::socket(fd);
        if n > 0 && d.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: per the contract.
        BUFS.with(|v| {
            let mut bufs = v.borrow_mut();
            let r = unsafe { reply(s, d, n, &mut bufs) };
            bufs.clear();
            r
        })
    })
}

/// [`spate_reply_zc`] with the thread's buffer vector.
///
/// # Safety
/// As [`spate_reply_zc`].
unsafe fn reply(
    s: CResult<std::sync::Arc<crate::socket::CSocket>>,
    d: *mut spate_datagram,
    n: c_uint,
    bufs: &mut Vec<SendBuf>,
) -> CResult<c_int> {
    {
        bufs.clear();
        let mut too_long = false;
        for i in 0..n as usize {
            // SAFETY: `i < n`, per the contract.
            let slot = unsafe { &mut *d.add(i) };
            if !held(&slot.opaque) {
                continue;
            }
            let len = slot.len as usize;
            // SAFETY: a datagram spate_recv_zc wrote.
            let g = unsafe { take(slot) };
            if len > g.len() {
                too_long = true;
                continue;
            }
            let mut b = g.into_send_buf();
            // The payload may have been written in place: its checksum is
            // summed again (truncate forgets the request's).
            b.truncate(len);
            bufs.push(b);
        }
        let s = s?;
        let sock = s.bound().ok_or(libc::EDESTADDRREQ)?;
        match (sock.send_replies(bufs.drain(..)).map_err(crate::socket::os)?, too_long) {
            (0, true) => Err(libc::EMSGSIZE),
            (sent, _) => Ok(sent as c_int),
        }
    }
}

/// A send buffer of `len` bytes to fill in place (`EMSGSIZE` past one
/// mbuf's room).
///
/// # Safety
/// `out` points to a writable `spate_sendbuf`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_sendbuf_alloc(fd: c_int, out: *mut spate_sendbuf, len: usize) -> c_int {
    call(|| {
        let s = global::socket(fd)?;
        if out.is_null() {
            return Err(libc::EFAULT);
        }
        let sock = s.autobind()?;
        let mut b = sock.alloc_send_buf(len).map_err(crate::socket::os)?;
        // SAFETY: per the contract.
        let slot = unsafe { &mut *out };
        slot.data = b.as_mut_ptr();
        slot.len = len as u32;
        slot.cap = len as u32;
        // SAFETY: the slot's opaque words hold a SendBuf (asserted above).
        unsafe { std::ptr::write(slot.opaque.as_mut_ptr().cast::<SendBuf>(), b) };
        Ok(0)
    })
}

/// Takes the send buffer out of `b`, clearing the handle.
///
/// # Safety
/// `b.opaque` holds a buffer from `spate_sendbuf_alloc`.
unsafe fn take_buf(b: &mut spate_sendbuf) -> SendBuf {
    // SAFETY: per the contract; cleared at once, one owner.
    let s = unsafe { std::ptr::read(b.opaque.as_ptr().cast::<SendBuf>()) };
    b.opaque = [0, 0];
    b.data = std::ptr::null_mut();
    s
}

/// Sends `n` filled buffers to `to` (or the connected peer when NULL) in
/// one batch; the handles are consumed. Returns how many went, or -1
/// when none could.
///
/// # Safety
/// `bufs` points to `n` buffers from `spate_sendbuf_alloc`; `to` to
/// `tolen` bytes, or is NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_send_zc(
    fd: c_int,
    bufs: *mut spate_sendbuf,
    n: c_uint,
    to: *const sockaddr,
    tolen: socklen_t,
) -> c_int {
    call(|| {
        if n > 0 && bufs.is_null() {
            return Err(libc::EFAULT);
        }
        BUFS.with(|v| {
            let mut taken = v.borrow_mut();
            taken.clear();
            // SAFETY: per the contract.
            let r = unsafe { send_bufs(fd, bufs, n, to, tolen, &mut taken) };
            // What a failed call took is freed now.
            taken.clear();
            r
        })
    })
}

/// [`spate_send_zc`] with the thread's buffer vector.
///
/// # Safety
/// As [`spate_send_zc`].
unsafe fn send_bufs(
    fd: c_int,
    bufs: *mut spate_sendbuf,
    n: c_uint,
    to: *const sockaddr,
    tolen: socklen_t,
    taken: &mut Vec<SendBuf>,
) -> CResult<c_int> {
    {
        for i in 0..n as usize {
            // SAFETY: `i < n`, per the contract.
            let slot = unsafe { &mut *bufs.add(i) };
            if held(&slot.opaque) {
                let len = (slot.len.min(slot.cap)) as usize;
                // SAFETY: a buffer spate_sendbuf_alloc wrote.
                let mut b = unsafe { take_buf(slot) };
                b.truncate(len);
                taken.push(b);
            }
        }
        let s = global::socket(fd)?;
        // SAFETY: per the contract.
        let dst = unsafe { destination(&s, to, tolen) }?;
        let sock = s.autobind()?;
        let dst = match dst {
            Some(a) => a,
            None => sock.peer_addr().map_err(|_| libc::EDESTADDRREQ)?,
        };
        let sent = sock.send_batch_to(taken.drain(..).map(|b| (b, dst))).map_err(crate::socket::os)?;
        Ok(sent as c_int)
    }
}

/// Frees `n` send buffers not sent.
///
/// # Safety
/// `bufs` points to `n` buffers from `spate_sendbuf_alloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_sendbuf_free(bufs: *mut spate_sendbuf, n: c_uint) {
    if bufs.is_null() {
        return;
    }
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { free_bufs(bufs, n) }));
}

/// # Safety
/// As [`spate_sendbuf_free`].
unsafe fn free_bufs(bufs: *mut spate_sendbuf, n: c_uint) {
    for i in 0..n as usize {
        // SAFETY: `i < n`, per the contract.
        let slot = unsafe { &mut *bufs.add(i) };
        if held(&slot.opaque) {
            // SAFETY: a buffer spate_sendbuf_alloc wrote.
            drop(unsafe { take_buf(slot) });
        }
    }
}

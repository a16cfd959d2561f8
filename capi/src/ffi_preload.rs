//! The calls libspate-preload finds in libspate when it loads it
//! (`dlopen`, on the first UDP socket spate may carry), C strings and
//! numbers over [`crate::preload`]. Not in spate.h: they are the
//! preload's, not a program's.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int};

use crate::ffi::call;
use crate::preload;

/// `text` of a C string, or `EINVAL`.
///
/// # Safety
/// `p` is NULL or NUL-terminated.
unsafe fn text<'a>(p: *const c_char) -> Result<&'a str, i32> {
    if p.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: per the contract.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| libc::EINVAL)
}

/// Writes the `SPATE_ROUTES` line of flags `args` (as `SPATE_ARGS` has
/// them) to `out` (`len` bytes, NUL-terminated); its length, or -1 with
/// `EINVAL` (what is wrong said on stderr) or `ERANGE` (too long).
///
/// # Safety
/// `args` is NUL-terminated; `out` has `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_preload_routes(args: *const c_char, out: *mut c_char, len: usize) -> c_int {
    call(|| {
        // SAFETY: per the contract.
        let args = unsafe { text(args) }?;
        let line = preload::routes(args).map_err(|e| {
            eprintln!("SPATE_ARGS: {e}");
            libc::EINVAL
        })?;
        if out.is_null() || line.len() >= len {
            return Err(libc::ERANGE);
        }
        // SAFETY: `line` and its NUL fit in `out`'s `len` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(line.as_ptr(), out.cast::<u8>(), line.len());
            *out.add(line.len()) = 0;
        }
        Ok(line.len() as c_int)
    })
}

/// Builds and starts the stack from flags `args` (as `SPATE_ARGS` has
/// them): 0, or -1 with the errno.
///
/// # Safety
/// `args` is NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_preload_start(args: *const c_char) -> c_int {
    // SAFETY: per the contract.
    call(|| preload::start_from(unsafe { text(args) }?).map(|()| 0))
}

/// [`preload::adopt`]: 0, or -1 with the errno.
#[unsafe(no_mangle)]
pub extern "C" fn spate_preload_adopt(fd: c_int, v6: c_int, nonblocking: c_int, cloexec: c_int) -> c_int {
    call(|| preload::adopt(fd, v6 != 0, nonblocking != 0, cloexec != 0).map(|()| 0))
}

/// [`preload::alias`]: 0, or -1 with the errno.
#[unsafe(no_mangle)]
pub extern "C" fn spate_preload_alias(new: c_int, old: c_int) -> c_int {
    call(|| preload::alias(new, old).map(|()| 0))
}

/// [`preload::forget`]: 1 when `fd` was the socket's last name (it is
/// closed), 0 when others go on, or -1 with `EBADF`.
#[unsafe(no_mangle)]
pub extern "C" fn spate_preload_forget(fd: c_int) -> c_int {
    call(|| preload::forget(fd).map(c_int::from))
}

/// [`preload::wait`] with `timeout_ns` (negative: none) and the flag at
/// `also` (a byte the preload sets atomically): 0 to look again, 1 when
/// a blocking receive would return at once (shut down, stopped), or -1
/// with the errno.
///
/// # Safety
/// `also` points to a byte that lives while the call does and is only
/// accessed atomically.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn spate_preload_wait(fd: c_int, timeout_ns: i64, also: *const u8) -> c_int {
    call(|| {
        if also.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: per the contract; AtomicBool has u8's size and layout.
        let also = unsafe { &*also.cast::<std::sync::atomic::AtomicBool>() };
        let timeout = u64::try_from(timeout_ns).ok().map(std::time::Duration::from_nanos);
        preload::wait(fd, timeout, also).map(c_int::from)
    })
}

/// [`preload::wake`]: 0, or -1 with `EBADF`.
#[unsafe(no_mangle)]
pub extern "C" fn spate_preload_wake(fd: c_int) -> c_int {
    call(|| preload::wake(fd).map(|()| 0))
}

/// [`preload::settle`]: 0, or -1 with `EBADF`.
#[unsafe(no_mangle)]
pub extern "C" fn spate_preload_settle(fd: c_int) -> c_int {
    call(|| preload::settle(fd).map(|()| 0))
}

//! libspate, loaded on demand (`dlopen`) rather than linked: a process
//! whose sockets never need spate loads neither libspate nor DPDK. The
//! preload finds it as `SPATE_LIBSPATE` names it, else beside itself
//! (`libspate.so.0` as `cargo xtask install` puts it, `libspate_capi.so`
//! as cargo builds it), else by the loader's search; and takes from it
//! the C API's socket calls and libspate's calls for the preload
//! (capi/src/ffi_preload.rs).
#![allow(unsafe_code)]

use std::ffi::{CString, c_char};
use std::sync::OnceLock;
use std::sync::atomic::AtomicBool;

use libc::{c_int, c_long, c_uint, c_ulong, c_void, mmsghdr, msghdr, size_t, sockaddr, socklen_t, ssize_t, timespec};

macro_rules! calls {
    ($($name:ident: fn($($ty:ty),*) -> $ret:ty;)*) => {
        /// libspate's calls, found once it is loaded.
        pub struct Libspate {
            $(pub $name: unsafe extern "C" fn($($ty),*) -> $ret,)*
        }

        impl Libspate {
            /// Each call of `handle`, or the name of the first missing.
            fn find(handle: *mut c_void) -> Result<Libspate, &'static str> {
                Ok(Libspate {$(
                    $name: {
                        let name = concat!(stringify!($name), "\0");
                        // SAFETY: a loaded library's handle and a NUL-terminated name.
                        let f = unsafe { libc::dlsym(handle, name.as_ptr().cast()) };
                        if f.is_null() {
                            return Err(stringify!($name));
                        }
                        // SAFETY: libspate's function of this name has this signature (spate.h,
                        // capi/src/ffi_preload.rs).
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) -> $ret>(f) }
                    },
                )*})
            }
        }
    };
}

calls! {
    spate_bind: fn(c_int, *const sockaddr, socklen_t) -> c_int;
    spate_connect: fn(c_int, *const sockaddr, socklen_t) -> c_int;
    spate_send: fn(c_int, *const c_void, size_t, c_int) -> ssize_t;
    spate_sendto: fn(c_int, *const c_void, size_t, c_int, *const sockaddr, socklen_t) -> ssize_t;
    spate_sendmsg: fn(c_int, *const msghdr, c_int) -> ssize_t;
    spate_sendmmsg: fn(c_int, *mut mmsghdr, c_uint, c_int) -> c_int;
    spate_recv: fn(c_int, *mut c_void, size_t, c_int) -> ssize_t;
    spate_recvfrom: fn(c_int, *mut c_void, size_t, c_int, *mut sockaddr, *mut socklen_t) -> ssize_t;
    spate_recvmsg: fn(c_int, *mut msghdr, c_int) -> ssize_t;
    spate_recvmmsg: fn(c_int, *mut mmsghdr, c_uint, c_int, *mut timespec) -> c_int;
    spate_getsockname: fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
    spate_getpeername: fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
    spate_getsockopt: fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int;
    spate_setsockopt: fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int;
    spate_shutdown: fn(c_int, c_int) -> c_int;
    spate_fcntl: fn(c_int, c_int, c_long) -> c_int;
    spate_ioctl: fn(c_int, c_ulong, *mut c_int) -> c_int;
    spate_preload_routes: fn(*const c_char, *mut c_char, usize) -> c_int;
    spate_preload_start: fn(*const c_char) -> c_int;
    spate_preload_adopt: fn(c_int, c_int, c_int, c_int) -> c_int;
    spate_preload_alias: fn(c_int, c_int) -> c_int;
    spate_preload_forget: fn(c_int) -> c_int;
    spate_preload_wait: fn(c_int, i64, *const u8) -> c_int;
    spate_preload_wake: fn(c_int) -> c_int;
    spate_preload_settle: fn(c_int) -> c_int;
}

impl Libspate {
    /// The `SPATE_ROUTES` line of flags `args` (as `SPATE_ARGS` has
    /// them), or the errno.
    pub fn routes(&self, args: &str) -> Result<String, c_int> {
        let args = CString::new(args).map_err(|_| libc::EINVAL)?;
        let mut out = vec![0u8; 4096];
        // SAFETY: a NUL-terminated string and a buffer of its length.
        let n = unsafe { (self.spate_preload_routes)(args.as_ptr(), out.as_mut_ptr().cast(), out.len()) };
        if n < 0 {
            return Err(crate::libc_next::errno());
        }
        out.truncate(n as usize);
        String::from_utf8(out).map_err(|_| libc::EINVAL)
    }

    /// Builds and starts the stack from flags `args`, or the errno.
    pub fn start(&self, args: &str) -> Result<(), c_int> {
        let args = CString::new(args).map_err(|_| libc::EINVAL)?;
        // SAFETY: a NUL-terminated string.
        match unsafe { (self.spate_preload_start)(args.as_ptr()) } {
            0 => Ok(()),
            _ => Err(crate::libc_next::errno()),
        }
    }

    /// Makes `fd` a spate socket (see libspate's `preload::adopt`), or
    /// the errno.
    pub fn adopt(&self, fd: c_int, v6: bool, nonblocking: bool, cloexec: bool) -> Result<(), c_int> {
        // SAFETY: no pointers.
        match unsafe { (self.spate_preload_adopt)(fd, v6 as c_int, nonblocking as c_int, cloexec as c_int) } {
            0 => Ok(()),
            _ => Err(crate::libc_next::errno()),
        }
    }

    /// Enters `new` as a name of `old`'s socket, or the errno.
    pub fn alias(&self, new: c_int, old: c_int) -> Result<(), c_int> {
        // SAFETY: no pointers.
        match unsafe { (self.spate_preload_alias)(new, old) } {
            0 => Ok(()),
            _ => Err(crate::libc_next::errno()),
        }
    }

    /// Forgets name `fd` of a spate socket, closing the socket when it
    /// was its last name; whether it was.
    pub fn forget(&self, fd: c_int) -> bool {
        // SAFETY: no pointers.
        unsafe { (self.spate_preload_forget)(fd) == 1 }
    }

    /// Sleeps once as a blocking receive on `fd` does, for at most
    /// `timeout`, ending early once `also` is set; `Ok` to look again
    /// (`true`: a blocking receive returns at once, the socket shut down
    /// or the stack stopped), or the errno (`EAGAIN` when the time
    /// passed, `EINTR`).
    pub fn wait(&self, fd: c_int, timeout: Option<std::time::Duration>, also: &AtomicBool) -> Result<bool, c_int> {
        let ns = timeout.map_or(-1, |t| t.as_nanos().min(i64::MAX as u128) as i64);
        // SAFETY: the flag lives while the call does; libspate reads it
        // atomically.
        match unsafe { (self.spate_preload_wait)(fd, ns, also.as_ptr().cast::<u8>().cast_const()) } {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(crate::libc_next::errno()),
        }
    }

    /// Resets socket `fd`'s descriptor when spate has nothing for it.
    pub fn settle(&self, fd: c_int) {
        // SAFETY: no pointers.
        unsafe { (self.spate_preload_settle)(fd) };
    }

    /// Makes socket `fd` readable and wakes its sleeping threads.
    pub fn wake(&self, fd: c_int) {
        // SAFETY: no pointers.
        unsafe { (self.spate_preload_wake)(fd) };
    }
}

static LIBSPATE: OnceLock<Result<Libspate, String>> = OnceLock::new();

/// libspate, loaded on the first call; what went wrong, said once by
/// the caller, if it cannot be.
pub fn load() -> Result<&'static Libspate, &'static str> {
    LIBSPATE.get_or_init(open).as_ref().map_err(String::as_str)
}

/// libspate once loaded (always, for a spate socket: the stack runs).
#[inline(always)]
pub fn loaded() -> &'static Libspate {
    match LIBSPATE.get() {
        Some(Ok(l)) => l,
        // A descriptor is spate's only once libspate runs its stack.
        _ => std::process::abort(),
    }
}

/// Where libspate may be, in order.
fn candidates() -> Vec<String> {
    if let Ok(p) = std::env::var("SPATE_LIBSPATE") {
        return vec![p];
    }
    let mut out = vec![];
    // SAFETY: dladdr fills `info` for an address of this library.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let here = candidates as *const c_void;
    if unsafe { libc::dladdr(here, &mut info) } != 0 && !info.dli_fname.is_null() {
        // SAFETY: dladdr's file name is NUL-terminated.
        let me = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
        if let Some(dir) = std::path::Path::new(&me).parent() {
            for name in ["libspate.so.0", "libspate_capi.so"] {
                let p = dir.join(name);
                if p.is_file() {
                    out.push(p.display().to_string());
                }
            }
        }
    }
    out.push("libspate.so.0".into());
    out
}

fn open() -> Result<Libspate, String> {
    let mut tried = vec![];
    for path in candidates() {
        let Ok(c) = CString::new(path.clone()) else { continue };
        // SAFETY: a NUL-terminated path.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            // SAFETY: dlerror's text is NUL-terminated (or NULL).
            let err = unsafe { libc::dlerror() };
            let why = match err.is_null() {
                true => "not loaded".to_string(),
                // SAFETY: as above.
                false => unsafe { std::ffi::CStr::from_ptr(err) }.to_string_lossy().into_owned(),
            };
            tried.push(why);
            continue;
        }
        return Libspate::find(handle).map_err(|missing| format!("{path} has no {missing}"));
    }
    Err(format!("libspate could not be loaded ({})", tried.join("; ")))
}

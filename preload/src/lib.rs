//! libspate-preload: an unmodified program's UDP sockets on spate.
//! Preloaded (`spate-run [stack flags] -- PROGRAM`, or `LD_PRELOAD` with
//! the flags in `SPATE_ARGS`), it defines the C library's socket calls;
//! each goes to spate's C API for a socket spate carries and to the C
//! library's own call for every other descriptor. It links only the C
//! library: libspate (and with it DPDK) is loaded when a socket may need
//! it.
//! docs/preload.md says which sockets move, the calls, fork, exec and
//! signals, and the limits.
//!
//! The modules: `interpose` (the calls the program makes), `dlopen`
//! (libspate, loaded on demand), `libc_next`
//! (the C library's own calls, and the other C calls the preload makes),
//! `fds` (what each descriptor is), `companion` (the kernel socket
//! beside a spate socket bound to a wildcard), `route` (which sockets spate
//! carries, from the flags), `state` (the stack: started on first use,
//! one per device, and not in a forked child).
#![deny(unsafe_code)]

mod companion;
mod dlopen;
pub mod fds;
mod interpose;
mod libc_next;
pub mod route;
mod state;

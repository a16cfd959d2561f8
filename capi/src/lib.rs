//! libspate: spate's C API. The BSD socket calls with a `spate_` prefix
//! (`spate_socket`, `spate_bind`, `spate_recvmmsg`...), taking the
//! system's own types and returning -1 with Linux's `errno`, over one
//! spate stack per process (`spate_init` from the tools' flags,
//! `spate_start` or `spate_run`, `spate_fini`). `include/spate.h` is
//! generated from this crate by cbindgen; docs/c-api.md lists every call
//! and where it differs from Linux.
//!
//! The modules: `ffi` (the entry points: C pointers and lengths checked
//! and turned into slices), `ffi_zerocopy` (the zero-copy calls, whose
//! datagrams and buffers live in the caller's memory), `socket` (a C socket over a spate socket, in
//! safe Rust), `options` (socket options), `cmsg` (control messages),
//! `readiness` (the socket's descriptor and blocking waits), `global`
//! (the stack and the descriptor table), `syscalls` (the system calls
//! libspate makes itself), `preload` and `ffi_preload` (what libspate-preload needs).
#![deny(unsafe_code)]
#![allow(non_camel_case_types)]

mod cmsg;
pub mod ffi;
pub mod ffi_preload;
pub mod ffi_zerocopy;
mod global;
mod options;
pub mod preload;
mod readiness;
mod socket;
mod syscalls;

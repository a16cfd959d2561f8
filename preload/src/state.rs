//! The process's stack under the preload: its flags (`SPATE_ARGS`), read
//! once; the stack itself, built and started on the first socket spate
//! must carry; and whether this process may use it.
//!
//! One stack per device: the process that starts it holds the abstract
//! UNIX socket `@spate-preload-DEVICES` of its network namespace bound
//! for as long as it lives. A program started with the preload inherited
//! (a fork and `exec` from a process that runs a stack, another
//! `spate-run` on the same device) finds the name taken and leaves its
//! sockets to the kernel; the kernel frees the name when the holder
//! ends, however it ends (SIGKILL too), and no file is left behind.

use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use crate::dlopen;
use crate::route::Routes;

/// What spate carries, or `None` when the flags are wrong or absent
/// (said once on stderr; every socket stays the kernel's): from
/// `SPATE_ROUTES` (spate-run's), else made by libspate from
/// `SPATE_ARGS`, which loads it.
pub fn routes() -> Option<&'static Routes> {
    static ROUTES: OnceLock<Option<Routes>> = OnceLock::new();
    ROUTES
        .get_or_init(|| {
            let text = match std::env::var("SPATE_ROUTES") {
                Ok(t) => t,
                Err(_) => routes_from_libspate()?,
            };
            Routes::from_text(&text)
                .map_err(|e| say(&format!("SPATE_ROUTES: {e}; the program's sockets stay the kernel's")))
                .ok()
        })
        .as_ref()
}

/// The `SPATE_ROUTES` line libspate makes of `SPATE_ARGS`.
fn routes_from_libspate() -> Option<String> {
    let lib = dlopen::load().map_err(|e| say(&format!("{e}; the program's sockets stay the kernel's"))).ok()?;
    lib.routes(&std::env::var("SPATE_ARGS").unwrap_or_default())
        .map_err(|_| say("SPATE_ARGS: the flags are wrong; the program's sockets stay the kernel's"))
        .ok()
}

/// A line on stderr, written straight to the kernel (the log may not be
/// set up, and the program's stderr buffer is its own).
pub fn say(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "spate-preload[{}]: {line}", std::process::id());
}

/// Set in a child forked after the stack started: the stack's memory is
/// shared with the parent, whose lcores still use it.
static FORKED: AtomicBool = AtomicBool::new(false);

/// Whether this process is a child forked after its parent's stack
/// started.
pub fn forked() -> bool {
    FORKED.load(Ordering::Relaxed)
}

/// The process that started the stack (0: none started).
static OWNER: AtomicI32 = AtomicI32::new(0);

/// Whether this is a child that shares the stack's process's memory
/// (`vfork`, `clone(CLONE_VM)`: no fork handler ran, and what it writes
/// is the parent's): the calls that change the tables (`close`,
/// `close_range`, `closefrom`, `dup2`...) then only pass through to the
/// C library. A system call (the C library keeps no pid), made only on
/// those calls.
pub fn shares_memory() -> bool {
    let owner = OWNER.load(Ordering::Relaxed);
    owner != 0 && !forked() && owner != std::process::id() as i32
}

/// Builds and starts the stack on first use; whether it runs. A stack
/// that cannot start is said once, and every socket stays the kernel's.
pub fn stack_up() -> bool {
    if FORKED.load(Ordering::Relaxed) {
        return false;
    }
    static UP: OnceLock<bool> = OnceLock::new();
    *UP.get_or_init(|| {
        let Some(routes) = routes() else { return false };
        let Some(lock) = device_lock(&routes.lock) else { return false };
        let lib = match dlopen::load() {
            Ok(l) => l,
            Err(e) => {
                say(&format!("{e}; the program's sockets stay the kernel's"));
                crate::libc_next::close_own(lock);
                return false;
            }
        };
        let started = lib.start(&std::env::var("SPATE_ARGS").unwrap_or_default());
        if started.is_err() {
            crate::libc_next::close_own(lock);
        }
        match started {
            Ok(()) => {
                // Held (and open) for the process's life; a forked child
                // closes its copy (see `mark_forked`).
                LOCK_FD.store(lock, Ordering::Relaxed);
                OWNER.store(std::process::id() as i32, Ordering::Relaxed);
                crate::libc_next::at_fork_child(mark_forked);
                true
            }
            Err(e) => {
                say(&format!(
                    "the stack did not start ({}); the program's sockets stay the kernel's",
                    std::io::Error::from_raw_os_error(e)
                ));
                false
            }
        }
    })
}

/// The device lock's descriptor once the stack runs.
static LOCK_FD: AtomicI32 = AtomicI32::new(-1);

/// In a child forked after the stack started: it is marked, and its copy
/// of the lock's descriptor closed, so that a child outliving its parent
/// does not keep the device locked (the name is the socket's,
/// which the parent's copy holds while the parent lives).
extern "C" fn mark_forked() {
    FORKED.store(true, Ordering::Relaxed);
    let fd = LOCK_FD.swap(-1, Ordering::Relaxed);
    if fd >= 0 {
        crate::libc_next::close_own(fd);
    }
    // Nor the kernel sockets beside the parent's wildcard sockets.
    crate::companion::close_all_in_child();
}

/// Takes the lock of the devices named `name` (see the module's text);
/// its descriptor, or `None`, said, when another process holds it.
fn device_lock(name: &str) -> Option<i32> {
    // An abstract UNIX socket's name is the network namespace's own: two
    // namespaces each have their own `net_af_packet0`, and no file is
    // left behind however the holder ends.
    let addr = format!("spate-preload-{name}");
    match crate::libc_next::abstract_bind(&addr) {
        Ok(fd) => Some(fd),
        Err(libc::EADDRINUSE) => {
            say(&format!(
                "another process runs a stack on {name} (@{addr} is bound); this one's sockets stay the kernel's"
            ));
            None
        }
        Err(e) => {
            say(&format!("@{addr}: errno {e}; the program's sockets stay the kernel's"));
            None
        }
    }
}

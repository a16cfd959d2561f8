//! The process's one stack and its C sockets: `spate_init`,
//! `spate_start`, `spate_run`, `spate_fini`, and the table from a
//! socket's descriptor to its state.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use clap::Parser;
use spate::{LcoreCtx, Running, Stack};
use spate_apps::cli::StackArgs;

use crate::socket::CSocket;

/// The stack flags of spate's tools, as `spate_init` takes them.
#[derive(Debug, Parser)]
#[command(name = "spate_init", about = "spate's stack flags")]
struct InitArgs {
    #[command(flatten)]
    stack: StackArgs,
}

/// The stack, once `spate_init` made it.
static STACK: OnceLock<Stack> = OnceLock::new();
/// The lcores polling in the background (`spate_start`).
static RUNNING: Mutex<Option<Running>> = Mutex::new(None);
/// `spate_fini` ran: every call fails with `ENETDOWN`.
static FINISHED: AtomicBool = AtomicBool::new(false);
/// Sockets by descriptor.
static SOCKETS: RwLock<Vec<Option<Arc<CSocket>>>> = RwLock::new(Vec::new());

thread_local! {
    /// The thread runs `spate_run`'s callback on a polling lcore: its
    /// calls never wait (the lcore would wait for itself).
    static ON_LCORE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The configuration the tools' flags (`args[0]` ignored) give, or what
/// is wrong with them.
pub fn config_of(args: Vec<String>) -> Result<spate::config::StackConfig, String> {
    let parsed = InitArgs::try_parse_from(args).map_err(|e| e.to_string())?;
    parsed.stack.to_config().map_err(|e| e.to_string())
}

/// Builds the stack from the tools' flags (`args[0]` is ignored).
pub fn init(args: Vec<String>) -> Result<(), i32> {
    static LOGGING: std::sync::Once = std::sync::Once::new();
    LOGGING.call_once(|| {
        let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).try_init();
    });
    let mut made = INIT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if *made {
        return Err(libc::EALREADY);
    }
    let mut cfg = config_of(args).map_err(|e| {
        log::error!("spate_init: {e}");
        libc::EINVAL
    })?;
    // The program's signals are its own: no stop on SIGINT or SIGTERM,
    // its SIGPIPE disposition as it was.
    cfg.stop_on_signal = false;
    cfg.ignore_sigpipe = false;
    let stack = Stack::new(cfg).map_err(|e| {
        log::error!("spate_init: {e}");
        match e {
            spate::Error::Config(_) => libc::EINVAL,
            _ => libc::EIO,
        }
    })?;
    *made = true;
    OWNER.store(std::process::id(), Ordering::Relaxed);
    let _ = STACK.set(stack);
    if !crate::syscalls::at_exit(close_at_exit) {
        log::warn!("spate_init: atexit failed: a program that exits without spate_fini leaves its control socket");
    }
    Ok(())
}

/// The stack lives as long as the process and is never dropped: at exit
/// its control endpoint's socket file goes, as spate_fini's does (the
/// next stack would sweep it, but a process leaves nothing behind).
/// Only the process that built the stack: a child it forked shares the
/// stack's memory and its endpoint's name, and must touch neither.
extern "C" fn close_at_exit() {
    if OWNER.load(Ordering::Relaxed) != std::process::id() {
        return;
    }
    let _ = std::panic::catch_unwind(|| STACK.get().map(Stack::close_endpoints));
}

/// The process that built the stack.
static OWNER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Whether `spate_init` ran (even if it then failed past its checks).
static INIT_LOCK: Mutex<bool> = Mutex::new(false);

/// The stack, or `ENETDOWN` before `spate_init` and after `spate_fini`.
pub fn stack() -> Result<&'static Stack, i32> {
    match STACK.get() {
        Some(s) if !FINISHED.load(Ordering::Acquire) => Ok(s),
        _ => Err(libc::ENETDOWN),
    }
}

/// Whether the stack is gone (`spate_fini`) or down (stopped, as
/// `spate_run`'s callback stops it, and not run since).
pub fn is_down() -> bool {
    FINISHED.load(Ordering::Acquire) || STACK.get().is_some_and(Stack::is_down)
}

/// Wakes every thread blocked in a socket's call, to find the stack
/// gone or down: a bound socket's queue wakes its own, an unbound one
/// has nothing else to.
fn wake_every_socket() {
    for s in SOCKETS.read().unwrap_or_else(|p| p.into_inner()).iter().flatten() {
        s.ready.notify();
    }
}

/// Starts the polling lcores in the background.
pub fn start() -> Result<(), i32> {
    let stack = stack()?;
    let mut r = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
    if r.is_some() || stack.is_running() {
        return Err(libc::EALREADY);
    }
    *r = Some(stack.spawn_polling().map_err(|e| {
        log::error!("spate_start: {e}");
        libc::EIO
    })?);
    Ok(())
}

/// Runs `callback` once per loop iteration on every polling lcore until
/// it returns a negative number or `spate_fini` runs in another thread.
pub fn run(callback: impl Fn() -> i32 + Send + Sync + Clone + 'static) -> Result<(), i32> {
    let stack = stack()?;
    if RUNNING.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
        return Err(libc::EALREADY);
    }
    let handle = stack.clone();
    let ran = stack
        .run(move |_| {
            let (stack, callback) = (handle.clone(), callback.clone());
            move |_: &mut LcoreCtx<'_>| {
                ON_LCORE.with(|c| c.set(true));
                if callback() < 0 {
                    stack.stop();
                }
                ON_LCORE.with(|c| c.set(false));
            }
        })
        .map_err(|e| {
            log::error!("spate_run: {e}");
            libc::EIO
        });
    // Stopped: down until it runs again.
    wake_every_socket();
    ran
}

/// Stops the lcores; every socket's calls fail with `ENETDOWN` from then
/// on, and the threads blocked in them wake with it.
pub fn fini() -> Result<(), i32> {
    let stack = stack()?;
    FINISHED.store(true, Ordering::Release);
    stack.stop();
    if let Some(r) = RUNNING.lock().unwrap_or_else(|p| p.into_inner()).take() {
        r.stop();
    }
    wake_every_socket();
    stack.close_endpoints();
    Ok(())
}

/// Whether the calling thread is a polling lcore running the callback.
pub fn on_lcore() -> bool {
    ON_LCORE.with(|c| c.get())
}

/// The socket of descriptor `fd`, or `EBADF`.
#[inline]
pub fn socket(fd: i32) -> Result<Arc<CSocket>, i32> {
    let t = SOCKETS.read().unwrap_or_else(|p| p.into_inner());
    usize::try_from(fd).ok().and_then(|i| t.get(i)).and_then(|s| s.clone()).ok_or(libc::EBADF)
}

/// Enters a new socket under its descriptor.
pub fn insert(s: Arc<CSocket>) {
    let fd = s.ready.fd;
    insert_at(fd, s);
}

/// Enters socket `s` under descriptor `fd` (one of its names).
pub fn insert_at(fd: i32, s: Arc<CSocket>) {
    let mut t = SOCKETS.write().unwrap_or_else(|p| p.into_inner());
    let i = fd as usize;
    if t.len() <= i {
        t.resize(i + 1, None);
    }
    t[i] = Some(s);
}

/// Takes socket `fd` out of the table (closing it when the last call
/// using it returns).
pub fn remove(fd: i32) -> Result<Arc<CSocket>, i32> {
    let mut t = SOCKETS.write().unwrap_or_else(|p| p.into_inner());
    usize::try_from(fd).ok().and_then(|i| t.get_mut(i)).and_then(Option::take).ok_or(libc::EBADF)
}

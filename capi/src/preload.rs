//! What libspate-preload (the `preload/` crate, `spate-run`) needs of
//! libspate beyond the C calls: the stack built and started from the
//! tools' flags in one step, and a program's own UDP socket made a spate
//! socket under the descriptor number the program holds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::global;
use crate::socket::CSocket;

/// The flags in `SPATE_ARGS` (as a shell splits words) as
/// libspate-preload reads them (`SPATE_ROUTES`, spate_apps::run's
/// `routes_text`), or what is wrong with them.
pub fn routes(args: &str) -> Result<String, String> {
    let mut all = vec!["SPATE_ARGS".to_string()];
    all.extend(spate_apps::run::split_words(args)?);
    Ok(spate_apps::run::routes_text(&global::config_of(all)?))
}

/// [`start`] from the flags of `SPATE_ARGS` (as a shell splits words).
pub fn start_from(args: &str) -> Result<(), i32> {
    let mut all = vec!["SPATE_ARGS".to_string()];
    all.extend(spate_apps::run::split_words(args).map_err(|_| libc::EINVAL)?);
    start(all)
}

/// Builds the stack from the tools' flags (`args[0]` ignored) and starts
/// its polling lcores: `spate_init` and `spate_start`.
pub fn start(args: Vec<String>) -> Result<(), i32> {
    global::init(args)?;
    global::start()
}

/// Makes descriptor `fd` a new unbound spate socket of the family
/// (IPv6 if `v6`), non-blocking if `nonblocking`: an event descriptor
/// takes the number (what was there, a kernel socket, is closed). The
/// number is the program's to close (`spate_close` then the C library's
/// `close`) and duplicate ([`alias`]); the socket lives while any of its
/// numbers does.
pub fn adopt(fd: i32, v6: bool, nonblocking: bool, cloexec: bool) -> Result<(), i32> {
    global::stack()?;
    let s = CSocket::at(fd, v6, cloexec)?;
    if nonblocking {
        s.set_nonblocking(true)?;
    }
    global::insert_at(fd, s);
    Ok(())
}

/// Extra names of a socket (its duplicates), by the socket's address:
/// a socket absent has one name, the number it was adopted under.
static EXTRA_NAMES: Mutex<Option<HashMap<usize, u32>>> = Mutex::new(None);

fn extra_names() -> std::sync::MutexGuard<'static, Option<HashMap<usize, u32>>> {
    EXTRA_NAMES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Enters number `new` (a duplicate of `old` the C library made) as a
/// name of `old`'s socket; `EBADF` when `old` is no spate socket.
pub fn alias(new: i32, old: i32) -> Result<(), i32> {
    let s = global::socket(old)?;
    *extra_names().get_or_insert_with(HashMap::new).entry(Arc::as_ptr(&s) as usize).or_default() += 1;
    global::insert_at(new, s);
    Ok(())
}

/// Forgets number `fd` (the program closed it, or `dup2` put another
/// file there): the socket's other names go on, and only when it was
/// the last does the socket close (its waiters woken, as `spate_close`).
/// Whether it was the last; `EBADF` when `fd` is no spate socket.
pub fn forget(fd: i32) -> Result<bool, i32> {
    let s = global::remove(fd)?;
    let last = drop_name(extra_names().get_or_insert_with(HashMap::new), Arc::as_ptr(&s) as usize);
    if last {
        s.ready.notify();
    }
    Ok(last)
}

/// Sleeps once as a blocking receive on `fd` does between attempts,
/// for at most `timeout`, ending early once `also` is set (the preload's
/// mark that the kernel socket beside it has something): `Ok` to look
/// again (`true`: the socket is shut down for reading or the stack
/// stopped, so a blocking receive returns at once), else `EAGAIN` (the
/// time passed), `EINTR` or `EBADF`.
pub fn wait(fd: i32, timeout: Option<std::time::Duration>, also: &AtomicBool) -> Result<bool, i32> {
    let s = global::socket(fd)?;
    s.wait_also(timeout, || also.load(Ordering::SeqCst))?;
    Ok(s.shut_rd.load(Ordering::SeqCst) || global::is_down())
}

/// Makes socket `fd` readable and wakes its sleeping threads (the kernel
/// socket beside it has something).
pub fn wake(fd: i32) -> Result<(), i32> {
    global::socket(fd)?.ready.notify();
    Ok(())
}

/// Resets socket `fd`'s descriptor when spate has nothing for it (the
/// kernel socket beside it was just emptied).
pub fn settle(fd: i32) -> Result<(), i32> {
    global::socket(fd)?.settle();
    Ok(())
}

/// One name of socket `key` gone: whether it was its last.
fn drop_name(extra: &mut HashMap<usize, u32>, key: usize) -> bool {
    match extra.get_mut(&key) {
        Some(n) if *n > 1 => *n -= 1,
        Some(_) => {
            extra.remove(&key);
        }
        None => return true,
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_closes_with_its_last_name() {
        let mut extra = HashMap::new();
        extra.insert(0x1000, 2);
        // Three names (two duplicates) of one socket, closed in turn.
        let gone: Vec<bool> = (0..3).map(|_| drop_name(&mut extra, 0x1000)).collect();
        assert_eq!(gone, [false, false, true]);
        assert!(extra.is_empty());
        assert!(drop_name(&mut extra, 0x2000), "a socket never duplicated has one name");
    }
}

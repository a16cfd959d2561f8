//! What each descriptor of the process is to the interposer: the
//! kernel's (everything the program and spate open that is not a UDP
//! socket, and UDP sockets that stayed the kernel's), a UDP socket of the
//! kernel's that spate may still take (created, not yet bound, connected
//! or sent from), or spate's. One byte per descriptor, read with one load
//! on every call the interposer sees.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};

/// Descriptors the table covers; one above is always the kernel's (a
/// UDP socket there stays the kernel's, logged once).
pub const FDS: usize = 1 << 16;

/// What a descriptor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// The kernel's: calls go to the C library.
    Kernel = 0,
    /// A kernel UDP socket spate takes on a bind, connect or send that it
    /// must carry.
    Open = 1,
    /// spate's.
    Spate = 2,
}

static KINDS: [AtomicU8; FDS] = [const { AtomicU8::new(0) }; FDS];

/// Options set on an [`Kind::Open`] socket, to set again on the spate
/// socket that takes its place: (level, name, value).
pub type Options = Vec<(i32, i32, Vec<u8>)>;

/// What the program did to an [`Kind::Open`] socket that its spate socket
/// must have too.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pending {
    /// Options set, in order, the last value of each.
    pub options: Options,
    /// The epoll instances it was added to: (epoll descriptor, events,
    /// data), the last of each instance.
    pub epolls: Vec<(i32, u32, u64)>,
}

static PENDING: Mutex<Option<HashMap<i32, Pending>>> = Mutex::new(None);

fn pending<R>(fd: i32, f: impl FnOnce(&mut Pending) -> R) -> R {
    let mut t = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    f(t.get_or_insert_with(HashMap::new).entry(fd).or_default())
}

/// What `fd` is.
#[inline(always)]
pub fn kind(fd: i32) -> Kind {
    match KINDS.get(fd as usize).map(|k| k.load(Ordering::Acquire)) {
        Some(1) => Kind::Open,
        Some(2) => Kind::Spate,
        _ => Kind::Kernel,
    }
}

/// Records what `fd` is now; false for a descriptor past the table.
pub fn set(fd: i32, k: Kind) -> bool {
    match KINDS.get(fd as usize) {
        Some(slot) => {
            let was = slot.swap(k as u8, Ordering::AcqRel);
            if was == Kind::Open as u8 && k != Kind::Open {
                forget_pending(fd);
            }
            true
        }
        None => false,
    }
}

/// Remembers option (`level`, `name`) = `value` of open socket `fd`.
pub fn remember_option(fd: i32, level: i32, name: i32, value: &[u8]) {
    pending(fd, |p| {
        p.options.retain(|(l, n, _)| (*l, *n) != (level, name));
        p.options.push((level, name, value.to_vec()));
    })
}

/// Remembers that open socket `fd` is in epoll instance `epfd` with
/// `events` and `data` (`None`: it was taken out).
pub fn remember_epoll(fd: i32, epfd: i32, event: Option<(u32, u64)>) {
    pending(fd, |p| {
        p.epolls.retain(|(e, _, _)| *e != epfd);
        if let Some((events, data)) = event {
            p.epolls.push((epfd, events, data));
        }
    })
}

/// Takes what was remembered of `fd`.
pub fn take_pending(fd: i32) -> Pending {
    let mut t = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    t.as_mut().and_then(|m| m.remove(&fd)).unwrap_or_default()
}

fn forget_pending(fd: i32) {
    let mut t = PENDING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = t.as_mut() {
        m.remove(&fd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_what_was_done_to_an_open_socket_follow_the_descriptor() {
        let fd = 4321;
        assert_eq!(kind(fd), Kind::Kernel);
        assert!(set(fd, Kind::Open));
        assert_eq!(kind(fd), Kind::Open);
        remember_option(fd, 1, 2, &[1, 0, 0, 0]);
        remember_option(fd, 1, 2, &[0, 0, 0, 0]);
        remember_option(fd, 1, 15, &[1, 0, 0, 0]);
        remember_epoll(fd, 7, Some((1, 99)));
        remember_epoll(fd, 8, Some((1, 5)));
        remember_epoll(fd, 7, Some((5, 100)));
        remember_epoll(fd, 8, None);
        assert_eq!(
            take_pending(fd),
            Pending { options: vec![(1, 2, vec![0, 0, 0, 0]), (1, 15, vec![1, 0, 0, 0])], epolls: vec![(7, 5, 100)] }
        );
        remember_option(fd, 1, 2, &[1, 0, 0, 0]);
        remember_epoll(fd, 7, Some((1, 1)));
        assert!(set(fd, Kind::Spate));
        assert_eq!(take_pending(fd), Pending::default(), "a socket that moved keeps nothing");
        assert_eq!(kind(fd), Kind::Spate);
        assert!(!set(FDS as i32, Kind::Open));
        assert_eq!(kind(-1), Kind::Kernel);
        assert_eq!(kind(FDS as i32 + 5), Kind::Kernel);
        set(fd, Kind::Kernel);
    }
}

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

static OPTIONS: Mutex<Option<HashMap<i32, Options>>> = Mutex::new(None);

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
            slot.store(k as u8, Ordering::Release);
            if k != Kind::Open {
                forget_options(fd);
            }
            true
        }
        None => false,
    }
}

/// Remembers option (`level`, `name`) = `value` of open socket `fd`.
pub fn remember_option(fd: i32, level: i32, name: i32, value: &[u8]) {
    let mut t = OPTIONS.lock().unwrap_or_else(|p| p.into_inner());
    let opts = t.get_or_insert_with(HashMap::new).entry(fd).or_default();
    opts.retain(|(l, n, _)| (*l, *n) != (level, name));
    opts.push((level, name, value.to_vec()));
}

/// Takes the options remembered for `fd`.
pub fn take_options(fd: i32) -> Options {
    let mut t = OPTIONS.lock().unwrap_or_else(|p| p.into_inner());
    t.as_mut().and_then(|m| m.remove(&fd)).unwrap_or_default()
}

fn forget_options(fd: i32) {
    let mut t = OPTIONS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = t.as_mut() {
        m.remove(&fd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_options_follow_the_descriptor() {
        let fd = 4321;
        assert_eq!(kind(fd), Kind::Kernel);
        assert!(set(fd, Kind::Open));
        assert_eq!(kind(fd), Kind::Open);
        remember_option(fd, 1, 2, &[1, 0, 0, 0]);
        remember_option(fd, 1, 2, &[0, 0, 0, 0]);
        remember_option(fd, 1, 15, &[1, 0, 0, 0]);
        assert_eq!(take_options(fd), vec![(1, 2, vec![0, 0, 0, 0]), (1, 15, vec![1, 0, 0, 0])]);
        remember_option(fd, 1, 2, &[1, 0, 0, 0]);
        assert!(set(fd, Kind::Spate));
        assert!(take_options(fd).is_empty(), "a socket that moved keeps no options");
        assert_eq!(kind(fd), Kind::Spate);
        assert!(!set(FDS as i32, Kind::Open));
        assert_eq!(kind(-1), Kind::Kernel);
        assert_eq!(kind(FDS as i32 + 5), Kind::Kernel);
        set(fd, Kind::Kernel);
    }
}

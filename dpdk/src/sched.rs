//! What the scheduler and the kernel's signals tell an idle lcore: whether
//! threads wait for a CPU ([`RunQueue`]), and the signal a descriptor
//! sends when it turns readable ([`IoSignal`]), which an lcore may raise
//! on itself.

/// The system's run queues: whether some thread waits for a CPU. Read from
/// `/proc/loadavg`, whose fourth field (`running/total`) counts the
/// threads running or waiting to run on every online CPU, the caller among
/// them: one system call, about half a microsecond here. Linux 6.12's
/// scheduler leaves some sleeping threads on their run queue for a while
/// (delayed dequeue), and counts them: the figure errs towards contention.
#[derive(Debug)]
pub struct RunQueue {
    file: std::fs::File,
    cpus: u32,
}

impl RunQueue {
    /// Opens `/proc/loadavg`; none where it cannot be read.
    pub fn open() -> Option<RunQueue> {
        let file = std::fs::File::open("/proc/loadavg").ok()?;
        let q = RunQueue { file, cpus: u32::try_from(crate::lcore::online_cpus()?).ok()? };
        q.runnable()?;
        Some(q)
    }

    /// Threads running or waiting to run, now.
    pub fn runnable(&self) -> Option<u32> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 128];
        let n = self.file.read_at(&mut buf, 0).ok()?;
        parse_runnable(buf.get(..n)?)
    }

    /// The online CPUs.
    pub fn cpus(&self) -> u32 {
        self.cpus
    }

    /// Whether more threads are runnable than there are online CPUs: one
    /// waits for a CPU.
    pub fn contended(&self) -> bool {
        self.runnable().is_some_and(|r| r > self.cpus)
    }
}

/// The running count of `/proc/loadavg`'s text (`0.10 0.05 0.01 3/120 4567`).
fn parse_runnable(text: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(text).ok()?;
    let field = text.split_ascii_whitespace().nth(3)?;
    field.split_once('/')?.0.parse().ok()
}

/// `F_GETSIG` (fcntl.h).
const F_GETSIG: libc::c_int = 11;

/// The signal a descriptor sends its owner when it turns readable
/// (`O_ASYNC`), where the process handles it: raised on the calling thread
/// it runs that handler, as the kernel's own signal would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoSignal(i32);

impl IoSignal {
    /// The signal of `fd`: none unless the descriptor signals (`O_ASYNC`)
    /// and the process has a handler for its signal (`F_GETSIG`; 0 means
    /// `SIGIO`, whose default action would end the process).
    pub fn of(fd: std::os::fd::RawFd) -> Option<IoSignal> {
        // SAFETY: F_GETFL and F_GETSIG take no argument.
        let (flags, sig) = unsafe { (libc::fcntl(fd, libc::F_GETFL), libc::fcntl(fd, F_GETSIG)) };
        if flags < 0 || flags & libc::O_ASYNC == 0 || sig < 0 {
            return None;
        }
        let sig = if sig == 0 { libc::SIGIO } else { sig };
        // SAFETY: sigaction with no new action reads the current one into
        // a sigaction we own.
        let handled = unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction != libc::SIG_DFL
                && old.sa_sigaction != libc::SIG_IGN
        };
        handled.then_some(IoSignal(sig))
    }

    /// Its number.
    pub fn number(&self) -> i32 {
        self.0
    }

    /// Raises it on the calling thread: the process's handler has run when
    /// this returns (unless the thread blocks the signal).
    pub fn raise(&self) {
        // SAFETY: raise signals the calling thread only, with a signal the
        // process handles (checked in `of`).
        unsafe { libc::raise(self.0) };
    }
}

/// `F_SETOWN_EX` and `F_OWNER_TID` (fcntl.h).
const F_SETOWN_EX: libc::c_int = 15;
const F_OWNER_TID: libc::c_int = 0;

/// `struct f_owner_ex`.
#[repr(C)]
struct OwnerEx {
    kind: libc::c_int,
    pid: libc::pid_t,
}

/// Sends the signals of the process's TAP descriptors (net_tap's queues,
/// `O_ASYNC` to the process) to the calling thread instead of the whole
/// process: any thread of the process may take a process-wide signal,
/// and the application's threads would see their system calls end with
/// `EINTR`. net_tap's handler only counts the signals, in one counter for
/// every queue, so the lcore that takes them may be any that polls a TAP
/// port. Returns how many descriptors it redirected.
pub fn direct_tap_signals_here() -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    // SAFETY: gettid and getpid take no arguments.
    let (tid, pid) = unsafe { (libc::gettid(), libc::getpid()) };
    let mut n = 0;
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|f| f.parse::<libc::c_int>().ok()) else {
            continue;
        };
        if std::fs::read_link(e.path()).ok().as_deref() != Some(std::path::Path::new("/dev/net/tun")) {
            continue;
        }
        // SAFETY: F_GETFL and F_GETOWN take no argument; F_SETOWN_EX
        // reads an f_owner_ex we own. A descriptor closed meanwhile fails.
        unsafe {
            if libc::fcntl(fd, libc::F_GETFL) & libc::O_ASYNC == 0 {
                continue;
            }
            // The process, or a thread of it (an lcore of an earlier run).
            let owner = libc::fcntl(fd, libc::F_GETOWN);
            if owner != pid && (owner <= 0 || !std::path::Path::new(&format!("/proc/self/task/{owner}")).exists()) {
                continue;
            }
            let owner = OwnerEx { kind: F_OWNER_TID, pid: tid };
            if libc::fcntl(fd, F_SETOWN_EX, &owner as *const OwnerEx) == 0 {
                n += 1;
                // The lcore's thread was made with every signal blocked.
                if let Some(sig) = IoSignal::of(fd) {
                    crate::signal::unblock(sig.number());
                }
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_running_count() {
        assert_eq!(parse_runnable(b"0.10 0.05 0.01 3/120 4567\n"), Some(3));
        assert_eq!(parse_runnable(b"1.50 1.26 1.32 12/80 18743"), Some(12));
        assert_eq!(parse_runnable(b"0.10 0.05 0.01"), None);
        assert_eq!(parse_runnable(b"0.10 0.05 0.01 x/120 4567"), None);
    }

    #[test]
    fn a_descriptor_without_o_async_has_no_signal() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&a);
        assert_eq!(IoSignal::of(fd), None);
        assert_eq!(IoSignal::of(-1), None);
        // O_ASYNC with the default signal, SIGIO, which this process does
        // not handle: raising it would end the process.
        // SAFETY: sets a flag on a descriptor this test owns.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            assert_eq!(libc::fcntl(fd, libc::F_SETFL, flags | libc::O_ASYNC), 0);
        }
        assert_eq!(IoSignal::of(fd), None);
    }

    #[test]
    fn reads_this_system() {
        let q = RunQueue::open().expect("/proc/loadavg");
        // The calling thread runs.
        assert!(q.runnable().expect("a count") >= 1);
    }
}

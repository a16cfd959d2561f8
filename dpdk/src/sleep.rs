//! Sleeping until there is work: a polling lcore that finds nothing to do
//! waits on its thread's epoll set (EAL's, where its RX queues'
//! interrupts are registered: [`RxQueue::intr_register`]) for a frame, a
//! ring of its [`Bell`] (another thread handed it work), a watched
//! descriptor turning readable ([`Sleeper::watch`]: `net_af_packet`'s
//! packet sockets) or a timeout; or, where the devices have no RX
//! interrupts, naps on its bell and watched descriptors for a given time.
//!
//! [`RxQueue::intr_register`]: crate::RxQueue::intr_register

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::sys;

/// `RTE_EPOLL_PER_THREAD`: the calling thread's epoll set.
pub(crate) const EPOLL_PER_THREAD: i32 = -1;
/// `RTE_INTR_EVENT_ADD`.
pub(crate) const INTR_EVENT_ADD: i32 = 1;
/// `RTE_INTR_EVENT_DEL`.
pub(crate) const INTR_EVENT_DEL: i32 = 2;
/// The `data` of the bell's event, told apart from the queues' (their
/// queue index).
const BELL_DATA: usize = usize::MAX;
/// The `data` of a watched descriptor's event.
const WATCHED_DATA: usize = usize::MAX - 1;
/// Events taken per wait.
const EVENTS: usize = 16;

/// What ends a sleep: another thread rings it (an eventfd), from any
/// thread, as often as it likes; a ring while nobody sleeps wakes the
/// next sleep at once.
#[derive(Debug)]
pub struct Bell {
    fd: OwnedFd,
}

impl Bell {
    /// A new bell.
    pub fn new() -> Result<Bell> {
        // SAFETY: eventfd makes a new descriptor this call owns.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(os_error("eventfd"));
        }
        // SAFETY: a valid descriptor nothing else owns.
        Ok(Bell { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Rings it.
    #[inline]
    pub fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd; a full
        // counter (EAGAIN) already rings.
        unsafe { libc::write(self.fd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
    }

    /// Takes the rings so far; whether there were any.
    fn clear(&self) -> bool {
        let mut n: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking
        // eventfd.
        let got = unsafe { libc::read(self.fd.as_raw_fd(), &mut n as *mut u64 as *mut libc::c_void, 8) };
        got == 8 && n > 0
    }
}

/// What ended a wait.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Woke {
    /// An RX queue signalled.
    pub rx: bool,
    /// The bell rang.
    pub bell: bool,
}

impl Woke {
    /// Neither: the time ran out.
    pub fn timed_out(&self) -> bool {
        !self.rx && !self.bell
    }
}

/// One thread's sleeps: its bell's descriptor in the thread's epoll set
/// beside its RX queues'. Made on the thread that sleeps, and used there
/// only (not `Send`).
pub struct Sleeper {
    bell: Arc<Bell>,
    /// The bell's registration: EAL keeps its address until removed.
    event: Box<sys::rte_epoll_event>,
    /// Descriptors watched beside the RX queues' interrupts (this
    /// sleeper's duplicates of them), with their registrations.
    watched: Vec<(OwnedFd, Box<sys::rte_epoll_event>)>,
    /// The bell and the watched descriptors, for naps.
    nap_fds: Vec<libc::pollfd>,
    events: Vec<sys::rte_epoll_event>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl std::fmt::Debug for Sleeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sleeper").field("bell", &self.bell).finish_non_exhaustive()
    }
}

impl Sleeper {
    /// Adds `bell` to the calling thread's epoll set.
    pub fn new(bell: Arc<Bell>) -> Result<Sleeper> {
        let mut event = Box::<sys::rte_epoll_event>::default();
        event.epdata.event = libc::EPOLLIN as u32;
        event.epdata.data = BELL_DATA as *mut libc::c_void;
        // SAFETY: the event lives in a box this sleeper keeps until it
        // removes the registration in drop; the descriptor is the bell's,
        // which the sleeper keeps alive too.
        let ret =
            unsafe { sys::rte_epoll_ctl(EPOLL_PER_THREAD, libc::EPOLL_CTL_ADD, bell.fd.as_raw_fd(), &mut *event) };
        if ret != 0 {
            return Err(os_error("rte_epoll_ctl"));
        }
        let nap_fds = vec![libc::pollfd { fd: bell.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        Ok(Sleeper {
            bell,
            event,
            watched: Vec::new(),
            nap_fds,
            events: vec![Default::default(); EVENTS],
            _not_send: std::marker::PhantomData,
        })
    }

    /// Also wakes for descriptor `fd` turning readable (level-triggered:
    /// a wait returns at once while it is), in waits and naps alike: a
    /// queue whose device has no RX interrupt but a descriptor readable
    /// while frames wait ([`packet_sockets`]). The sleeper watches its own
    /// duplicate, so the registration stays sound whatever becomes of
    /// `fd`.
    pub fn watch(&mut self, fd: std::os::fd::RawFd) -> Result<()> {
        // SAFETY: duplicates a descriptor; an invalid one says EBADF.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(os_error("fcntl(F_DUPFD_CLOEXEC)"));
        }
        // SAFETY: a new descriptor this sleeper owns.
        let dup = unsafe { OwnedFd::from_raw_fd(dup) };
        let mut event = Box::<sys::rte_epoll_event>::default();
        event.epdata.event = libc::EPOLLIN as u32;
        event.epdata.data = WATCHED_DATA as *mut libc::c_void;
        // SAFETY: the event lives in a box kept in `watched`, beside the
        // descriptor, until drop removes the registration.
        let ret = unsafe { sys::rte_epoll_ctl(EPOLL_PER_THREAD, libc::EPOLL_CTL_ADD, dup.as_raw_fd(), &mut *event) };
        if ret != 0 {
            return Err(os_error("rte_epoll_ctl"));
        }
        self.nap_fds.push(libc::pollfd { fd: dup.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        self.watched.push((dup, event));
        Ok(())
    }

    /// A watched socket in error (its interface went down: `ENETDOWN`)
    /// reports it on every wait until the error is read; reads them.
    fn clear_errors(&self) {
        for (fd, _) in &self.watched {
            // Reading the pending error clears it.
            let _ = socket_option(fd.as_raw_fd(), libc::SO_ERROR);
        }
    }

    /// [`wait`](Self::wait) to the microsecond: up to `ns`, which EAL's
    /// wait would round to its milliseconds. Under a millisecond, the
    /// thread's epoll set is itself waited on with `ppoll` (it turns
    /// readable when one of its events is ready) and then read without
    /// waiting: two calls instead of one.
    pub fn wait_ns(&mut self, ns: u64) -> Woke {
        if ns >= 1_000_000 {
            return self.wait((ns / 1_000_000).min(i32::MAX as u64) as i32);
        }
        // SAFETY: a plain query of this thread's EAL epoll descriptor.
        let epfd = unsafe { sys::rte_intr_tls_epfd() };
        if epfd >= 0 {
            let ts = libc::timespec { tv_sec: 0, tv_nsec: ns as libc::c_long };
            let mut p = libc::pollfd { fd: epfd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one live pollfd, a live timespec, no signal mask.
            unsafe { libc::ppoll(&mut p, 1, &ts, std::ptr::null()) };
        }
        self.wait(0)
    }

    /// Waits up to `timeout_ms` (rounded to EAL's milliseconds) for an RX
    /// interrupt of a queue this thread registered, or the bell.
    pub fn wait(&mut self, timeout_ms: i32) -> Woke {
        // SAFETY: the events buffer holds EVENTS entries for EAL to fill.
        let n = unsafe {
            sys::rte_epoll_wait(EPOLL_PER_THREAD, self.events.as_mut_ptr(), EVENTS as i32, timeout_ms.max(0))
        };
        let mut woke = Woke::default();
        let mut errors = false;
        for e in self.events.iter().take(n.max(0) as usize) {
            match e.epdata.data as usize {
                BELL_DATA => woke.bell = true,
                WATCHED_DATA if e.epdata.event & libc::EPOLLERR as u32 != 0 => errors = true,
                _ => woke.rx = true,
            }
        }
        if errors {
            self.clear_errors();
        }
        // The bell's descriptor counts rings (it stays readable until
        // they are taken).
        if woke.bell {
            self.bell.clear();
        }
        woke
    }

    /// Naps up to `ns` nanoseconds, or until the bell rings (no RX
    /// interrupts: the devices have none).
    pub fn nap(&mut self, ns: u64) -> Woke {
        let ts = libc::timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        };
        for p in &mut self.nap_fds {
            p.revents = 0;
        }
        // SAFETY: live pollfds (the bell's first, then the watched
        // descriptors'), a live timespec, no signal mask.
        let n = unsafe {
            libc::ppoll(self.nap_fds.as_mut_ptr(), self.nap_fds.len() as libc::nfds_t, &ts, std::ptr::null())
        };
        let bell = n > 0 && self.nap_fds[0].revents & libc::POLLIN != 0;
        if bell {
            self.bell.clear();
        }
        let watched = &self.nap_fds[1..];
        if n > 0 && watched.iter().any(|p| p.revents & libc::POLLERR != 0) {
            self.clear_errors();
        }
        let rx = n > 0 && watched.iter().any(|p| p.revents & libc::POLLIN != 0);
        Woke { rx, bell }
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        for (fd, mut event) in self.watched.drain(..) {
            // SAFETY: removes a registration `watch` made, with its event;
            // should that fail, the event is leaked rather than freed
            // under EAL's epoll set.
            let ret = unsafe { sys::rte_epoll_ctl(EPOLL_PER_THREAD, libc::EPOLL_CTL_DEL, fd.as_raw_fd(), &mut *event) };
            if ret != 0 {
                std::mem::forget(event);
            }
        }
        // SAFETY: removes the registration `new` made, with its event.
        unsafe {
            sys::rte_epoll_ctl(EPOLL_PER_THREAD, libc::EPOLL_CTL_DEL, self.bell.fd.as_raw_fd(), &mut *self.event);
        }
    }
}

/// Whether descriptor `fd` is readable now (a `poll` that does not wait).
pub fn readable(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one live pollfd; no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & libc::POLLIN != 0
}

/// This process's `AF_PACKET` sockets bound to kernel interface
/// `if_index`, in the order they were opened (lowest descriptor first):
/// `net_af_packet` opens one per queue pair, in queue order, and each is
/// readable while frames wait in its receive ring. Found by looking at
/// every open descriptor (`/proc/self/fd`): once per lcore at start.
pub fn packet_sockets(if_index: u32) -> Vec<std::os::fd::RawFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let mut fds: Vec<std::os::fd::RawFd> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd| packet_socket_on(fd) == Some(if_index))
        .collect();
    fds.sort_unstable();
    fds
}

/// The interface an `AF_PACKET` socket `fd` is bound to, if it is one.
fn packet_socket_on(fd: std::os::fd::RawFd) -> Option<u32> {
    if socket_option(fd, libc::SO_DOMAIN)? != libc::AF_PACKET {
        return None;
    }
    // SAFETY: an all-zero sockaddr_ll is valid.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: writes at most `len` bytes into the live address.
    let ret = unsafe { libc::getsockname(fd, &mut addr as *mut libc::sockaddr_ll as *mut libc::sockaddr, &mut len) };
    (ret == 0 && addr.sll_ifindex > 0).then_some(addr.sll_ifindex as u32)
}

/// Socket option `opt` (an int, at `SOL_SOCKET`) of descriptor `fd`, or
/// none where it is no socket.
pub(crate) fn socket_option(fd: std::os::fd::RawFd, opt: libc::c_int) -> Option<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: reads an int option into a live int of the given length; a
    // descriptor that is not a socket says ENOTSOCK.
    let ret = unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, opt, &mut value as *mut libc::c_int as *mut libc::c_void, &mut len)
    };
    (ret == 0).then_some(value)
}

/// Asks the kernel to wake the calling thread's timed sleeps within `ns`
/// of their time (`PR_SET_TIMERSLACK`; 50 us by default, which would
/// stretch a short nap tenfold).
pub fn set_timer_slack(ns: u64) {
    // SAFETY: prctl with an integer argument changes only this thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong) };
}

fn os_error(op: &str) -> Error {
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    Error::Os { op: op.to_string(), errno }
}

//! A socket's readiness as a descriptor of the process, and the sleep of
//! a thread blocked in a call.
//!
//! Each C socket owns a non-blocking event descriptor, the number
//! `spate_socket` returns: readable while the socket has a datagram, an
//! error or a stopped stack to report, so a program's `epoll`, `poll` or
//! `select` waits on it beside its other descriptors. The socket's
//! receive queue holds a waker ([`Readiness`]) while the descriptor is
//! reset: the polling lcore that queues the next datagram wakes it, which
//! makes the descriptor readable (one `write`) and wakes the threads
//! sleeping in a blocking call on the socket. After a receive that left
//! the queue empty, the descriptor is reset and the waker armed again
//! (one `read`), so it stays readable exactly while there is something to
//! take. A blocked thread sleeps on an event descriptor of its own
//! (blocking `read`, see [`syscalls::sleep`]), so a signal interrupts it
//! as Linux's blocking socket calls are interrupted.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use spate::UdpSocket;

use crate::syscalls::{self, Woken};

/// A socket's readiness descriptor and its sleeping threads.
#[derive(Debug)]
pub struct Readiness {
    /// The socket's descriptor (non-blocking event descriptor).
    pub fd: i32,
    /// The waker sits in the socket's queue and the descriptor is reset.
    armed: AtomicBool,
    /// Serializes resets, so two readers never reset over a signal.
    reset_lock: Mutex<()>,
    /// The event descriptors of threads sleeping in a call on the socket.
    sleepers: Mutex<Vec<i32>>,
    asleep: AtomicUsize,
}

impl Readiness {
    /// A readiness with a new descriptor.
    pub fn new() -> std::io::Result<Arc<Readiness>> {
        Ok(Self::with_fd(syscalls::eventfd(true)?))
    }

    /// A readiness whose descriptor is also number `fd`, closing what was
    /// there (libspate-preload's: a program's socket becomes spate's
    /// under the number the program holds, which the program closes and
    /// duplicates as its own; the readiness signals through a number of
    /// its own).
    pub fn at(fd: i32, cloexec: bool) -> std::io::Result<Arc<Readiness>> {
        Ok(Self::with_fd(syscalls::eventfd_at(fd, cloexec)?))
    }

    fn with_fd(fd: i32) -> Arc<Readiness> {
        Arc::new(Readiness {
            fd,
            armed: AtomicBool::new(false),
            reset_lock: Mutex::new(()),
            sleepers: Mutex::new(Vec::new()),
            asleep: AtomicUsize::new(0),
        })
    }

    /// Makes the descriptor readable and wakes the sleeping threads.
    pub fn notify(&self) {
        self.armed.store(false, Ordering::SeqCst);
        syscalls::signal(self.fd);
        if self.asleep.load(Ordering::SeqCst) > 0 {
            for fd in self.sleepers.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                syscalls::signal(*fd);
            }
        }
    }

    /// After a receive: when `sock` has nothing left to report and the
    /// waker fired since it was armed, resets the descriptor and arms the
    /// waker again (signalling at once if something came meanwhile).
    #[inline]
    pub fn settle(self: &Arc<Self>, sock: &UdpSocket) {
        if self.armed.load(Ordering::Acquire) || sock.recv_ready() {
            return;
        }
        self.rearm(sock);
    }

    /// Resets the descriptor and arms the waker, whatever the queue holds
    /// (a socket just bound), signalling again when it is not empty.
    #[cold]
    pub fn rearm(self: &Arc<Self>, sock: &UdpSocket) {
        let _g = self.reset_lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.armed.load(Ordering::Acquire) {
            return;
        }
        // Armed before the reset: a wake in between leaves it unarmed
        // (and the descriptor signalled, or the look below finds why).
        self.armed.store(true, Ordering::SeqCst);
        syscalls::reset(self.fd);
        let waker = Waker::from(self.clone());
        if sock.poll_recv_ready(&mut Context::from_waker(&waker)).is_ready() {
            self.notify();
        }
    }

    /// Sleeps the calling thread until the socket may have something to
    /// report, `timeout` passes or a signal interrupts: `Ok` to look
    /// again, else the errno (`EAGAIN`, `EINTR`). A thread woken with
    /// nothing to take looks again and sleeps again. `bound` and `done`
    /// are asked once the thread is registered, so a bind, a shutdown or a
    /// stop just before is not missed: `bound` gives the spate socket
    /// once there is one, `done` whether the call should end without
    /// waiting (shut down, the stack stopped).
    pub fn sleep<'a>(
        self: &Arc<Self>,
        bound: impl Fn() -> Option<&'a UdpSocket>,
        done: impl Fn() -> bool,
        timeout: Option<Duration>,
    ) -> Result<(), i32> {
        THREAD_FD.with(|t| {
            let tfd = t.0.as_ref().map_err(|e| *e)?.0;
            {
                let mut s = self.sleepers.lock().unwrap_or_else(|p| p.into_inner());
                s.push(tfd);
                self.asleep.fetch_add(1, Ordering::SeqCst);
            }
            // Registered before arming and looking: a wake, a bind, a
            // shutdown or a stop after this finds us.
            let ready = done()
                || match bound() {
                    Some(sock) => {
                        if !self.armed.load(Ordering::Acquire) {
                            self.rearm(sock);
                        }
                        let waker = Waker::from(self.clone());
                        sock.poll_recv_ready(&mut Context::from_waker(&waker)).is_ready()
                    }
                    None => false,
                };
            let out = match ready {
                true => Ok(()),
                false => match syscalls::sleep(tfd, timeout) {
                    Woken::Signalled => Ok(()),
                    Woken::TimedOut => Err(libc::EAGAIN),
                    Woken::Interrupted => Err(libc::EINTR),
                },
            };
            let mut s = self.sleepers.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = s.iter().position(|f| *f == tfd) {
                s.swap_remove(i);
            }
            self.asleep.fetch_sub(1, Ordering::SeqCst);
            out
        })
    }
}

impl Drop for Readiness {
    fn drop(&mut self) {
        syscalls::close(self.fd);
    }
}

impl Wake for Readiness {
    fn wake(self: Arc<Self>) {
        self.notify();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.notify();
    }
}

/// The calling thread's blocking event descriptor (or the errno that
/// making it gave), closed when the thread ends.
struct ThreadFd(Result<Arc<OwnedFd>, i32>);

/// Sleeps the calling thread until `sock`'s lcore has room for a send
/// (its queue drained), `timeout` passes or a signal interrupts, as
/// [`Readiness::sleep`] does for a receive: `Ok` to try again, else
/// `EAGAIN` or `EINTR`.
pub fn sleep_until_writable(sock: &UdpSocket, timeout: Option<Duration>) -> Result<(), i32> {
    THREAD_FD.with(|t| {
        let fd = t.0.clone()?;
        let tfd = fd.0;
        // The waker holds the descriptor: a drain after the thread ended
        // writes to it, not to whatever took its number.
        let waker = THREAD_WAKER.with(|w| w.get_or_init(|| Waker::from(Arc::new(FdWaker(fd)))).clone());
        if sock.poll_writable(&mut Context::from_waker(&waker)).is_ready() {
            return Ok(());
        }
        match syscalls::sleep(tfd, timeout) {
            Woken::Signalled => Ok(()),
            Woken::TimedOut => Err(libc::EAGAIN),
            Woken::Interrupted => Err(libc::EINTR),
        }
    })
}

/// Wakes a thread sleeping on its own event descriptor.
struct FdWaker(Arc<OwnedFd>);

impl Wake for FdWaker {
    fn wake(self: Arc<Self>) {
        syscalls::signal(self.0.0);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        syscalls::signal(self.0.0);
    }
}

/// A descriptor closed when its last holder drops it.
#[derive(Debug)]
struct OwnedFd(i32);

impl Drop for OwnedFd {
    fn drop(&mut self) {
        syscalls::close(self.0);
    }
}

thread_local! {
    /// The calling thread's waker for its own descriptor (made once).
    static THREAD_WAKER: std::cell::OnceCell<Waker> = const { std::cell::OnceCell::new() };
    static THREAD_FD: ThreadFd = ThreadFd(
        syscalls::eventfd(false).map(|fd| Arc::new(OwnedFd(fd))).map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE)),
    );
}

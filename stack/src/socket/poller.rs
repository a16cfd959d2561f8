//! Readiness for many sockets from one thread, in epoll's shape: register
//! sockets with a token and an interest, wait with a timeout, get the
//! tokens that are ready. Level-triggered: a socket with datagrams left is
//! reported at every wait until they are read.
//!
//! No socket is scanned while it is not ready: each registered socket is
//! either armed (the poller's waker for it sits in its receive queue, or
//! in its lcore's send queue for writing, where the polling lcores wake
//! it as they wake a blocked reader or sender) or on the poller's list of
//! candidates, which a wait looks at and re-arms from. A wait costs what
//! is ready, not what is registered.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::task::{Wake, Waker};
use std::time::{Duration, Instant};

use super::{UdpSocket, errno};
use crate::control_plane::Stack;
use crate::shared::SocketCore;

/// What a registration waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Interest {
    /// A datagram (or an error) to receive.
    pub readable: bool,
    /// Room in the lcore's queue for a send.
    pub writable: bool,
}

impl Interest {
    /// Receiving.
    pub const READABLE: Interest = Interest { readable: true, writable: false };
    /// Sending.
    pub const WRITABLE: Interest = Interest { readable: false, writable: true };
    /// Both.
    pub const BOTH: Interest = Interest { readable: true, writable: true };
}

/// A ready socket, as [`Poller::wait`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// The token it was registered with.
    pub token: u64,
    /// A receive would not block (a datagram or an error is there).
    pub readable: bool,
    /// A send would not block.
    pub writable: bool,
}

/// Many sockets' readiness, waited for together (epoll's shape,
/// level-triggered). A socket registered here should not also be awaited
/// by a task (its receive queue keeps one waker: the latest wins).
#[derive(Debug, Clone)]
pub struct Poller {
    inner: Arc<PollerInner>,
}

#[derive(Debug)]
struct PollerInner {
    state: Mutex<PollState>,
    /// Tokens the lcores woke since the last look: the only lock an lcore
    /// takes (briefly, to push), never the poller's state.
    woken: Mutex<Vec<u64>>,
    wake: Condvar,
}

#[derive(Debug, Default)]
struct PollState {
    sockets: HashMap<u64, Registered>,
    /// Tokens to look at in the next wait: woken, or ready at the last.
    candidates: Vec<u64>,
}

#[derive(Debug)]
struct Registered {
    core: Arc<SocketCore>,
    stack: Stack,
    tx_worker: usize,
    id: u64,
    interest: Interest,
    waker: Waker,
    /// On `candidates` already.
    listed: bool,
}

/// The waker the lcores wake for one registration: it lists the token
/// and wakes the waiting thread.
struct TokenWake {
    poller: Weak<PollerInner>,
    token: u64,
}

impl Wake for TokenWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let Some(p) = self.poller.upgrade() else { return };
        p.woken.lock().unwrap_or_else(|e| e.into_inner()).push(self.token);
        p.wake.notify_all();
    }
}

impl Default for Poller {
    fn default() -> Self {
        Self::new()
    }
}

impl Poller {
    /// An empty poller.
    pub fn new() -> Poller {
        Poller {
            inner: Arc::new(PollerInner {
                state: Mutex::new(PollState::default()),
                woken: Mutex::new(Vec::new()),
                wake: Condvar::new(),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PollState> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Watches `sock` for `interest`, reported with `token`. `EEXIST` for a
    /// token or socket registered already (as `EPOLL_CTL_ADD`), `EINVAL`
    /// for an interest in nothing.
    pub fn register(&self, sock: &UdpSocket, token: u64, interest: Interest) -> io::Result<()> {
        if !interest.readable && !interest.writable {
            return Err(errno(libc::EINVAL, "an interest in nothing"));
        }
        let mut st = self.state();
        if st.sockets.contains_key(&token) || st.sockets.values().any(|r| r.id == sock.id()) {
            return Err(errno(libc::EEXIST, "token or socket registered already"));
        }
        let waker = Waker::from(Arc::new(TokenWake { poller: Arc::downgrade(&self.inner), token }));
        let r = Registered {
            core: sock.core.clone(),
            stack: sock.stack.clone(),
            tx_worker: sock.tx_worker,
            id: sock.id(),
            interest,
            waker,
            // Looked at by the next wait, which arms it when not ready.
            listed: true,
        };
        st.sockets.insert(token, r);
        st.candidates.push(token);
        drop(st);
        self.nudge(token);
        Ok(())
    }

    /// Changes what the registration of `token` waits for. `ENOENT` when
    /// there is none.
    pub fn modify(&self, token: u64, interest: Interest) -> io::Result<()> {
        if !interest.readable && !interest.writable {
            return Err(errno(libc::EINVAL, "an interest in nothing"));
        }
        let mut st = self.state();
        let r = st.sockets.get_mut(&token).ok_or_else(|| errno(libc::ENOENT, "no such registration"))?;
        r.interest = interest;
        drop(st);
        // Looked at by the waiting thread, as a wake would have it.
        self.nudge(token);
        Ok(())
    }

    /// Tells a thread blocked in `wait` to look at `token`, through the
    /// list the lcores' wakes use (a notification alone could land
    /// between its look and its sleep).
    fn nudge(&self, token: u64) {
        self.inner.woken.lock().unwrap_or_else(|e| e.into_inner()).push(token);
        self.inner.wake.notify_all();
    }

    /// Stops watching the socket of `token`. `ENOENT` when there is none.
    pub fn deregister(&self, token: u64) -> io::Result<()> {
        let mut st = self.state();
        st.sockets.remove(&token).ok_or_else(|| errno(libc::ENOENT, "no such registration"))?;
        st.candidates.retain(|t| *t != token);
        Ok(())
    }

    /// Registrations.
    pub fn len(&self) -> usize {
        self.state().sockets.len()
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until a registered socket is ready or `timeout` passes
    /// (`None`: for ever), and puts the ready ones in `events` (cleared
    /// first, at most its capacity or 64 when it has none); returns how
    /// many. A socket closed since it was registered is dropped from the
    /// poller, as epoll drops a closed descriptor.
    pub fn wait(&self, events: &mut Vec<Event>, timeout: Option<Duration>) -> io::Result<usize> {
        events.clear();
        let max = if events.capacity() == 0 { 64 } else { events.capacity() };
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let mut st = self.state();
            let woken = std::mem::take(&mut *self.inner.woken.lock().unwrap_or_else(|e| e.into_inner()));
            for token in woken {
                if let Some(r) = st.sockets.get_mut(&token)
                    && !r.listed
                {
                    r.listed = true;
                    st.candidates.push(token);
                }
            }
            let candidates = std::mem::take(&mut st.candidates);
            let mut keep = Vec::new();
            for token in candidates {
                let Some(r) = st.sockets.get_mut(&token) else { continue };
                if r.core.queue.is_closed() {
                    st.sockets.remove(&token);
                    continue;
                }
                match readiness(r) {
                    Some(ev) if events.len() < max => {
                        events.push(Event { token, ..ev });
                        // Level-triggered: looked at again next time.
                        keep.push(token);
                    }
                    Some(_) => keep.push(token),
                    None => {
                        // Not ready: armed, or listed again when it became
                        // ready as it was armed.
                        r.listed = false;
                        if !arm(r) {
                            // (An error's alert, taken by a reader already,
                            // would refuse every arming: cleared.)
                            r.core.queue.clear_alert();
                            r.listed = true;
                            keep.push(token);
                        }
                    }
                }
            }
            let again = keep.len() > events.len();
            st.candidates.extend(keep);
            drop(st);
            if !events.is_empty() {
                return Ok(events.len());
            }
            if again {
                // Armed ones that turned out ready: look at them at once.
                continue;
            }
            let woken = self.inner.woken.lock().unwrap_or_else(|e| e.into_inner());
            if !woken.is_empty() {
                continue;
            }
            match deadline {
                None => drop(self.inner.wake.wait(woken).unwrap_or_else(|e| e.into_inner())),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(0);
                    }
                    drop(self.inner.wake.wait_timeout(woken, d - now).unwrap_or_else(|e| e.into_inner()));
                }
            }
        }
    }
}

/// What `r` is ready for now, if anything it waits for.
fn readiness(r: &Registered) -> Option<Event> {
    let readable = r.interest.readable
        && (!r.core.queue.looks_empty() || r.core.error.load(std::sync::atomic::Ordering::Relaxed) != 0);
    let writable = r.interest.writable && !r.stack.shared.inbox[r.tx_worker].is_full();
    (readable || writable).then_some(Event { token: 0, readable, writable })
}

/// Leaves `r`'s waker where the lcores wake it; false when it is ready
/// already (nothing armed needs waking).
fn arm(r: &Registered) -> bool {
    let read = !r.interest.readable || r.core.queue.register_waker(&r.waker);
    let write = !r.interest.writable || r.stack.shared.inbox[r.tx_worker].register_waker(&r.waker);
    read && write
}

//! quinn's endpoint and connections driven on a spate lcore (behind the
//! `quinn` feature): [`LcoreRuntime`].

#![deny(unsafe_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use quinn::{AsyncTimer, AsyncUdpSocket, Runtime};
use spate_stack::{LcoreCtx, Stack};

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// quinn's tasks and timers on one polling lcore of a stack: give it to
/// `quinn::Endpoint::new_with_abstract_socket` with a [`QuinnSocket`]
/// and call [`poll`](Self::poll) from that lcore's callback: a
/// [`quinn::Runtime`] whose tasks and timers run there (behind the
/// `quinn` feature).
///
/// With quinn's tokio runtime, every datagram crosses threads twice: the
/// lcore queues it to the socket and wakes quinn's thread, which decrypts
/// it, answers, and hands the answer to the lcore's inbox, ringing its
/// bell. Beside each other on one CPU, that is four context switches per
/// exchange, where the kernel's socket needs none. `LcoreRuntime` runs
/// quinn's drivers (the endpoint's and each connection's: where packets
/// are decrypted, acknowledged, retransmitted and built) on the lcore
/// itself, from its callback: a datagram is read from the socket and the
/// answer sent into the lcore's own transmit queue in one thread, without
/// a hand-off. The application's own tasks (what it does with streams and
/// connections) may stay on its threads and runtime; they reach quinn's
/// drivers through quinn's shared state and wakers, which wake the lcore
/// ([`Stack::wake_lcore`]). Or they run on the lcore too
/// ([`LcoreRuntime::spawn`]): then a connection's whole life, from the
/// frame to the application's read and back, stays on one thread, as a
/// kernel socket's does, without its system calls.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use spate::{LcoreRuntime, QuinnSocket, Stack, StackConfig, UdpSocket};
/// let stack = Stack::new(StackConfig::default())?;
/// let sock = QuinnSocket::new(UdpSocket::bind(&stack, "198.18.0.2:4433")?)?;
/// let rt = LcoreRuntime::new(&stack, 0);
/// let endpoint = quinn::Endpoint::new_with_abstract_socket(
///     quinn::EndpointConfig::default(), None, sock, rt.clone())?;
/// // The lcore's callback runs quinn's tasks and timers.
/// let polled = rt.clone();
/// let running = stack.spawn(move |_| {
///     let rt = polled.clone();
///     move |ctx: &mut spate::LcoreCtx<'_>| rt.poll(ctx)
/// })?;
/// # drop(endpoint);
/// running.stop();
/// rt.shutdown();
/// # Ok(()) }
/// ```
///
/// Once the lcores stopped, [`LcoreRuntime::shutdown`] drops the tasks
/// left (an endpoint's driver lives as long as its endpoint, and holds
/// the stack).
///
/// Timers: the callback's turn fires those due and asks the lcore to
/// wake by the next ([`LcoreCtx::wake_at`]); on adaptive polling one due
/// within 20 us keeps the lcore polling. What quinn's drivers
/// cost runs on the lcore: a handshake's cryptography delays the lcore's
/// other work by its time.
///
/// [`QuinnSocket`]: crate::QuinnSocket
pub struct LcoreRuntime {
    shared: Arc<Shared>,
    /// Wakers of the timers the turn fires, called outside the lock (only
    /// the lcore's callback uses it: kept for its capacity).
    fired: Mutex<Vec<Waker>>,
}

/// What the tasks' wakers and the timers share with the lcore's turn.
struct Shared {
    stack: Stack,
    lcore: usize,
    state: Mutex<State>,
    /// Set (under the lock) when a task joins the ready queue, cleared by
    /// the turn that takes the queue's length: a turn with nothing woken
    /// takes no lock for the tasks.
    woken: AtomicBool,
    /// The first timer's deadline in nanoseconds after `epoch`, or
    /// [`NO_TIMER`]; written under the lock whenever the table changes, so
    /// that a turn with no timer due takes no lock for the timers.
    first_timer: AtomicU64,
    epoch: Instant,
}

/// `first_timer` when no timer is pending.
const NO_TIMER: u64 = u64::MAX;

#[derive(Default)]
struct State {
    /// Tasks woken, in order.
    ready: VecDeque<Arc<Spawned>>,
    /// Timers pending, by deadline (and a number, for equal ones).
    timers: BTreeMap<(Instant, u64), Waker>,
    next_timer: u64,
    /// Tasks spawned and not finished, by number (for the shutdown).
    live: HashMap<u64, Arc<Spawned>>,
    next_task: u64,
    /// Shut down: what is spawned now is dropped.
    closed: bool,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The first timer's deadline, from `first_timer`.
    fn first_timer(&self) -> Option<Instant> {
        match self.first_timer.load(Ordering::Acquire) {
            NO_TIMER => None,
            ns => Some(self.epoch + Duration::from_nanos(ns)),
        }
    }

    /// Publishes the table's first deadline after a change (`st` is the
    /// locked state).
    fn timers_changed(&self, st: &State) {
        let ns = st.timers.keys().next().map_or(NO_TIMER, |&(at, _)| {
            // A deadline centuries away (quinn takes idle timeouts up to
            // 2^62 ms) is kept as the latest one, not wrapped.
            u64::try_from(at.saturating_duration_since(self.epoch).as_nanos())
                .map_or(NO_TIMER - 1, |n| n.min(NO_TIMER - 1))
        });
        self.first_timer.store(ns, Ordering::Release);
    }
}

/// A spawned future and its place in the ready queue.
struct Spawned {
    id: u64,
    future: Mutex<Option<Task>>,
    queued: AtomicBool,
    shared: Weak<Shared>,
}

impl Wake for Spawned {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(shared) = self.shared.upgrade() {
            let mut st = shared.state();
            st.ready.push_back(self.clone());
            shared.woken.store(true, Ordering::Release);
            drop(st);
            shared.stack.wake_lcore(shared.lcore);
        }
    }
}

impl fmt::Debug for LcoreRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.shared.state();
        f.debug_struct("LcoreRuntime")
            .field("lcore", &self.shared.lcore)
            .field("tasks", &st.live.len())
            .field("ready", &st.ready.len())
            .field("timers", &st.timers.len())
            .finish()
    }
}

impl LcoreRuntime {
    /// A runtime whose tasks and timers run on `stack`'s polling lcore
    /// `lcore` (its index, as [`LcoreCtx::index`]), from its callback.
    ///
    /// # Panics
    ///
    /// If the stack has no lcore `lcore` (its tasks would never run).
    pub fn new(stack: &Stack, lcore: usize) -> Arc<LcoreRuntime> {
        assert!(
            lcore < stack.lcores().len(),
            "LcoreRuntime on lcore index {lcore}: the stack polls on {} lcore(s)",
            stack.lcores().len()
        );
        let shared = Arc::new(Shared {
            stack: stack.clone(),
            lcore,
            state: Mutex::new(State::default()),
            woken: AtomicBool::new(false),
            first_timer: AtomicU64::new(NO_TIMER),
            epoch: Instant::now(),
        });
        Arc::new(LcoreRuntime { shared, fired: Mutex::new(Vec::new()) })
    }

    /// The lcore's turn, from its callback: fires the timers due, polls
    /// each task woken before the turn began once (those woken during it
    /// wait for the next turn, which comes before the lcore sleeps), and
    /// asks the lcore to wake by the next timer. A callback on another
    /// lcore than the runtime's does nothing. A turn with no task woken
    /// and no timer due reads two atomics (and the clock when a timer is
    /// pending), and takes no lock.
    pub fn poll(&self, ctx: &mut LcoreCtx<'_>) {
        if ctx.index() != self.shared.lcore {
            return;
        }
        if self.shared.first_timer().is_some_and(|at| at <= Instant::now()) {
            self.fire_timers();
        }
        if self.shared.woken.load(Ordering::Acquire) {
            self.run_woken();
        }
        if let Some(at) = self.shared.first_timer() {
            ctx.wake_at(at);
        }
    }

    /// Wakes the tasks of the timers due.
    fn fire_timers(&self) {
        let now = Instant::now();
        let mut fired = self.fired.lock().unwrap_or_else(|p| p.into_inner());
        {
            let mut st = self.shared.state();
            while let Some(entry) = st.timers.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                fired.push(entry.remove());
            }
            self.shared.timers_changed(&st);
        }
        for w in fired.drain(..) {
            w.wake();
        }
    }

    /// Polls each task woken so far once, those of the timers just fired
    /// included.
    fn run_woken(&self) {
        let ready = {
            let st = self.shared.state();
            // Woken from now on: set again.
            self.shared.woken.store(false, Ordering::Relaxed);
            st.ready.len()
        };
        for _ in 0..ready {
            let Some(task) = self.shared.state().ready.pop_front() else { break };
            // Woken from now on: queued again. A swap, not a store: a waker
            // whose swap finds the flag still set must have written what
            // it woke the task for before this poll reads it (a plain
            // store could be passed by the poll's loads, and the wake-up
            // lost).
            task.queued.swap(false, Ordering::AcqRel);
            let waker = Waker::from(task.clone());
            let mut slot = task.future.lock().unwrap_or_else(|p| p.into_inner());
            let Some(future) = slot.as_mut() else { continue };
            // A task that panics ends there; the lcore goes on.
            let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                future.as_mut().poll(&mut Context::from_waker(&waker)).is_ready()
            }));
            let done = polled.unwrap_or_else(|_| {
                log::error!("spate: a task on lcore {} panicked: dropped", self.shared.lcore);
                true
            });
            // A task that shut the runtime down is dropped after its poll.
            if done || self.shared.state().closed {
                let done = slot.take();
                drop(slot);
                self.shared.state().live.remove(&task.id);
                drop(done);
            }
        }
    }

    /// Runs `future` on the lcore, from its callback's turns: the
    /// application's own tasks beside quinn's, where what they do with
    /// streams and connections needs no hand-off to quinn's drivers. A
    /// task must not block (the lcore stops polling while it does); one
    /// that panics is dropped, logged.
    pub fn spawn(&self, future: impl Future<Output = ()> + Send + 'static) {
        Runtime::spawn(self, Box::pin(future));
    }

    /// Tasks spawned that have not finished.
    pub fn tasks(&self) -> usize {
        self.shared.state().live.len()
    }

    /// Drops every task and timer, and any task spawned from then on:
    /// for once the lcore stopped. A task that never ends (an endpoint's
    /// driver while the endpoint lives) holds what it uses, the stack and
    /// this runtime included, as they hold it: without a shutdown, none of
    /// them is freed (a stack's ports stay open).
    pub fn shutdown(&self) {
        let tasks: Vec<Arc<Spawned>> = {
            let mut st = self.shared.state();
            st.closed = true;
            st.ready.clear();
            st.timers.clear();
            self.shared.timers_changed(&st);
            st.live.drain().map(|(_, t)| t).collect()
        };
        // Dropped outside the lock: a future's drop may drop its timers.
        // The task being polled (a shutdown from a task) goes after its
        // poll.
        for t in tasks {
            let future = match t.future.try_lock() {
                Ok(mut f) => f.take(),
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().take(),
                Err(std::sync::TryLockError::WouldBlock) => None,
            };
            drop(future);
        }
    }
}

impl Runtime for LcoreRuntime {
    fn new_timer(&self, at: Instant) -> Pin<Box<dyn AsyncTimer>> {
        Box::pin(LcoreTimer { at, key: None, shared: self.shared.clone() })
    }

    fn spawn(&self, future: Pin<Box<dyn Future<Output = ()> + Send>>) {
        let task = {
            let mut st = self.shared.state();
            if st.closed {
                drop(st);
                drop(future);
                return;
            }
            let id = st.next_task;
            st.next_task += 1;
            let task = Arc::new(Spawned {
                id,
                future: Mutex::new(Some(future)),
                queued: AtomicBool::new(false),
                shared: Arc::downgrade(&self.shared),
            });
            st.live.insert(id, task.clone());
            task
        };
        task.wake();
    }

    fn wrap_udp_socket(&self, _: std::net::UdpSocket) -> io::Result<Arc<dyn AsyncUdpSocket>> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "LcoreRuntime drives a spate socket: make the endpoint with Endpoint::new_with_abstract_socket and a QuinnSocket",
        ))
    }
}

/// A timer of the lcore's: its deadline, and its entry in the table while
/// a task waits on it.
struct LcoreTimer {
    at: Instant,
    key: Option<(Instant, u64)>,
    shared: Arc<Shared>,
}

impl LcoreTimer {
    fn forget(&mut self) {
        if let Some(key) = self.key.take() {
            let mut st = self.shared.state();
            st.timers.remove(&key);
            self.shared.timers_changed(&st);
        }
    }
}

impl fmt::Debug for LcoreTimer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LcoreTimer").field("at", &self.at).finish()
    }
}

impl AsyncTimer for LcoreTimer {
    fn reset(mut self: Pin<&mut Self>, at: Instant) {
        if self.at != at {
            self.forget();
            self.at = at;
        }
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context) -> Poll<()> {
        if Instant::now() >= self.at {
            self.forget();
            return Poll::Ready(());
        }
        let at = self.at;
        let shared = self.shared.clone();
        let mut st = shared.state();
        match self.key {
            Some(key) if st.timers.contains_key(&key) => {
                let w = st.timers.get_mut(&key).expect("looked up");
                if !w.will_wake(cx.waker()) {
                    w.clone_from(cx.waker());
                }
            }
            _ => {
                let key = (at, st.next_timer);
                st.next_timer += 1;
                st.timers.insert(key, cx.waker().clone());
                shared.timers_changed(&st);
                self.key = Some(key);
            }
        }
        Poll::Pending
    }
}

impl Drop for LcoreTimer {
    fn drop(&mut self) {
        self.forget();
    }
}

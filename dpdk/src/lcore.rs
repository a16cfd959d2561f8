//! Lcores: launching work on EAL worker lcores, thread affinity, the TSC.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Condvar, Mutex};

use crate::error::{Error, Result};
use crate::sys;

/// The calling thread's lcore id, or `None` on a thread unknown to the EAL.
#[inline]
pub fn current() -> Option<u32> {
    // SAFETY: reads a thread-local through the shim.
    let id = unsafe { sys::spate_lcore_id() };
    (id != sys::LCORE_ID_ANY).then_some(id)
}

/// The main lcore.
pub fn main_lcore() -> u32 {
    // SAFETY: plain getter.
    unsafe { sys::rte_get_main_lcore() }
}

/// Every enabled lcore, main first.
pub fn all() -> Vec<u32> {
    let mut out = vec![main_lcore()];
    out.extend(workers());
    out
}

/// The enabled worker lcores (every lcore but the main one).
pub fn workers() -> Vec<u32> {
    let mut out = Vec::new();
    let mut id = u32::MAX;
    loop {
        // SAFETY: rte_get_next_lcore walks the lcore table; -1 starts it.
        id = unsafe { sys::rte_get_next_lcore(id, 1, 0) };
        if id >= sys::RTE_MAX_LCORE {
            return out;
        }
        out.push(id);
    }
}

/// The NUMA socket of an lcore.
pub fn socket_of(lcore: u32) -> u32 {
    // SAFETY: plain getter; out-of-range ids return SOCKET_ID_ANY.
    unsafe { sys::rte_lcore_to_socket_id(lcore) }
}

/// The CPU an lcore runs on (its first, when given a set).
pub fn cpu_of(lcore: u32) -> Option<usize> {
    // SAFETY: plain getter.
    let cpu = unsafe { sys::rte_lcore_to_cpu_id(lcore as c_int) };
    (cpu >= 0).then_some(cpu as usize)
}

/// Registers the calling (non-EAL) thread with the EAL so it gets an lcore
/// id and mempool caches; returns that id.
pub fn register_thread() -> Result<u32> {
    // SAFETY: registers the calling thread only.
    let ret = unsafe { sys::rte_thread_register() };
    if ret != 0 {
        let errno = crate::error::rte_errno();
        return Err(Error::Lcore {
            lcore: u32::MAX,
            what: format!("rte_thread_register: {}", crate::error::strerror(errno)),
        });
    }
    current().ok_or_else(|| Error::Lcore { lcore: u32::MAX, what: "registered but no lcore id".into() })
}

/// Gives back the lcore id `register_thread` gave the calling thread. What
/// its mempool caches hold stays there, counted as available, for the next
/// thread that gets the id.
pub fn unregister_thread() {
    // SAFETY: unregisters the calling thread only; a no-op for threads the
    // EAL did not register.
    unsafe { sys::rte_thread_unregister() }
}

type Job = Box<dyn FnOnce() -> i32 + Send + 'static>;

/// A closure running on a worker lcore; `join` waits for its return value.
/// Dropping the handle waits too, so no work is left running unseen.
#[derive(Debug)]
#[must_use = "a launched lcore should be joined"]
pub struct LcoreJoin {
    lcore: u32,
    joined: bool,
    /// Set when the closure has returned (or unwound).
    done: Arc<Done>,
    /// The EAL stays up while the job may run (given back once it has
    /// ended, by whoever waits for it; leaked with a forgotten handle).
    _eal: crate::eal::EalRef,
}

impl LcoreJoin {
    /// The lcore it runs on.
    pub fn lcore(&self) -> u32 {
        self.lcore
    }

    /// Waits for the closure and returns its value (-1 if it panicked).
    /// The caller sleeps until the closure ends, without waking to look:
    /// `rte_eal_wait_lcore` alone spins, and a caller on a CPU shared
    /// with other work (an adaptive lcore's, its peers') would take it
    /// away.
    pub fn join(mut self) -> i32 {
        self.joined = true;
        self.wait()
    }

    fn wait(&self) -> i32 {
        self.done.wait();
        // The closure has returned; the lcore's state leaves RUNNING once
        // its thread is back in the EAL's loop. The caller gives its CPU
        // away meanwhile: that thread may wait for this very CPU.
        // SAFETY: reads the state of a valid worker lcore.
        while unsafe { sys::rte_eal_get_lcore_state(self.lcore) } == sys::RUNNING {
            std::thread::yield_now();
        }
        // SAFETY: collects the return value of the finished job.
        unsafe { sys::rte_eal_wait_lcore(self.lcore) }
    }
}

/// The end of a launched closure, told to whoever waits for it.
#[derive(Debug, Default)]
struct Done {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Done {
    fn set(&self) {
        *self.done.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }

    fn wait(&self) {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        while !*done {
            done = self.cv.wait(done).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Sets its [`Done`] when dropped: after the closure returned, or while it
/// unwinds.
struct SetOnDrop(Arc<Done>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.set();
    }
}

impl Drop for LcoreJoin {
    fn drop(&mut self) {
        if !self.joined {
            self.wait();
        }
    }
}

/// Runs `job` on worker lcore `lcore`.
pub fn launch<F>(lcore: u32, job: F) -> Result<LcoreJoin>
where
    F: FnOnce() -> i32 + Send + 'static,
{
    if lcore == main_lcore() {
        return Err(Error::Lcore { lcore, what: "the main lcore runs the caller; launch on a worker".into() });
    }
    let eal = crate::eal::EalRef::get()?;
    let done = Arc::new(Done::default());
    let end = SetOnDrop(done.clone());
    let job = move || {
        let _end = end;
        job()
    };
    let job: Box<Job> = Box::new(Box::new(job));
    let arg = Box::into_raw(job) as *mut c_void;
    // SAFETY: trampoline takes back the box exactly once when it runs.
    let ret = unsafe { sys::rte_eal_remote_launch(Some(trampoline), arg, lcore) };
    if ret != 0 {
        // SAFETY: the job did not start, so the box is still ours.
        drop(unsafe { Box::from_raw(arg as *mut Job) });
        let what = if ret == -libc::EBUSY {
            "busy: it runs another job".to_string()
        } else {
            format!("not a worker lcore ({ret})")
        };
        return Err(Error::Lcore { lcore, what });
    }
    Ok(LcoreJoin { lcore, joined: false, done, _eal: eal })
}

unsafe extern "C" fn trampoline(arg: *mut c_void) -> c_int {
    // SAFETY: arg is the Box<Job> leaked by launch, taken back once here.
    let job = unsafe { Box::from_raw(arg as *mut Job) };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || (*job)())) {
        Ok(v) => v,
        Err(_) => {
            log::error!("a job on lcore {:?} panicked", current());
            -1
        }
    }
}

/// How many CPUs the calling thread may run on (its affinity mask; a
/// cgroup's CPU quota does not count).
pub fn cpus_allowed() -> usize {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills the set we
    // own, of the size given.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return 1;
        }
        libc::CPU_COUNT(&set) as usize
    }
}

/// Pins the calling thread to `cpus`.
pub fn set_affinity(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET bounds-checks against its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The CPUs the calling thread may run on (its affinity), to set back
/// with [`set_affinity`]; none where it cannot be read.
pub fn current_cpus() -> Option<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills the set we
    // own, of the size given; CPU_ISSET reads it within its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        Some((0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect())
    }
}

/// Lets the calling thread run on every online CPU again: threads spawned
/// after EAL init inherit the main lcore's single-CPU affinity.
pub fn unpin_current_thread() -> std::io::Result<()> {
    // available_parallelism honours the current mask: the online count
    // first.
    let n = online_cpus().unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    set_affinity(&(0..n).collect::<Vec<_>>())
}

/// The system's online CPUs (`_SC_NPROCESSORS_ONLN`), whatever the calling
/// thread's affinity; none where the count cannot be read.
pub fn online_cpus() -> Option<usize> {
    // SAFETY: sysconf reads a system value.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(online).ok().filter(|&n| n > 0)
}

/// CPU time the calling thread has used, in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    let ret = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    debug_assert_eq!(ret, 0, "CLOCK_THREAD_CPUTIME_ID exists on Linux");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A thread's CPU-time clock, readable from any thread of the process
/// while that thread lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadClock(libc::clockid_t);

impl ThreadClock {
    /// The calling thread's clock.
    pub fn current() -> std::io::Result<ThreadClock> {
        let mut id: libc::clockid_t = 0;
        // SAFETY: pthread_self is the calling thread; the id is written to a
        // local we own.
        let ret = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) };
        if ret != 0 {
            return Err(std::io::Error::from_raw_os_error(ret));
        }
        Ok(ThreadClock(id))
    }

    /// CPU time the thread has used, in nanoseconds; `None` once it exited.
    pub fn ns(&self) -> Option<u64> {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes one timespec we own; a stale clock id
        // fails with EINVAL rather than touching memory.
        let ret = unsafe { libc::clock_gettime(self.0, &mut ts) };
        (ret == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
    }
}

/// The time-stamp counter.
#[inline]
pub fn tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions on x86_64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: reads the counter through the shim.
        unsafe { sys::spate_rdtsc() }
    }
}

/// TSC ticks per second, as the EAL measured them.
pub fn tsc_hz() -> u64 {
    // SAFETY: plain getter, valid after EAL init.
    unsafe { sys::rte_get_tsc_hz() }
}

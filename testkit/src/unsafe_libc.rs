//! libc calls the standard library does not wrap: sending a chosen signal
//! to a child process, entering a network namespace, pinning a thread to a
//! CPU, reading a thread's CPU time.
#![allow(unsafe_code)]

/// Sends `sig` to process `pid`; false when it no longer exists.
pub fn kill(pid: u32, sig: libc::c_int) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false; // never signal a process group or every process
    }
    // SAFETY: kill(2) on a positive pid has no memory-safety preconditions.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// Moves the calling thread into the network namespace at `path`
/// (`/run/netns/NAME`); other threads keep theirs.
pub fn enter_netns(path: &std::path::Path) -> std::io::Result<()> {
    let f = std::fs::File::open(path)?;
    use std::os::fd::AsRawFd;
    // SAFETY: setns on a valid namespace fd affects only this thread.
    let ret = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if ret != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Pins the calling thread to CPU `cpu`.
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; zeroed is its empty set, CPU_SET
    // writes within it (cpu is checked against its size), and
    // sched_setaffinity(0, ...) only changes the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
            return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
        }
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// CPU time the calling thread has used, in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    let ret = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(ret, 0, "CLOCK_THREAD_CPUTIME_ID is always there on Linux");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

//! libc calls the standard library does not wrap: sending a chosen signal
//! to a child process, entering a network namespace.
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

//! libc calls the standard library does not wrap: sending a chosen signal
//! to a child process, pinning a thread to a CPU, entering a network
//! namespace, receiving many datagrams with one `recvmmsg`, sizing a
//! socket's receive buffer.
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

/// Pins the calling thread to CPU `cpu`; other threads keep theirs.
pub fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("CPU {cpu} past CPU_SETSIZE")));
    }
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes inside
    // it (cpu checked above); sched_setaffinity with pid 0 changes only
    // the calling thread and reads the set it is given.
    let ret = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if ret != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
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

/// Receives up to `bufs.len()` datagrams with one `recvmmsg(2)` (blocking
/// for the first as the socket's timeout says); returns how many came.
pub fn recvmmsg(sock: &std::net::UdpSocket, bufs: &mut [[u8; 2048]]) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    let n = bufs.len().min(1024);
    // SAFETY: zeroed iovec and mmsghdr are valid empty values.
    let mut iov: Vec<libc::iovec> = vec![unsafe { std::mem::zeroed() }; n];
    let mut msgs: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; n];
    for i in 0..n {
        iov[i] = libc::iovec { iov_base: bufs[i].as_mut_ptr().cast(), iov_len: bufs[i].len() };
        msgs[i].msg_hdr.msg_iov = &mut iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: every header points at one iovec over a buffer we own for the
    // whole call; the kernel writes at most iov_len bytes into each.
    let got = unsafe {
        libc::recvmmsg(
            sock.as_raw_fd(),
            msgs.as_mut_ptr(),
            n as libc::c_uint,
            libc::MSG_WAITFORONE,
            std::ptr::null_mut(),
        )
    };
    if got < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(got as usize)
}

/// Sets `SO_RCVBUF` (the kernel doubles it and caps it at rmem_max unless
/// the caller may exceed it, as root may with `SO_RCVBUFFORCE`).
pub fn set_recv_buffer(sock: &std::net::UdpSocket, bytes: usize) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    // SAFETY: setsockopt reads one c_int we own.
    let ret = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if ret != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

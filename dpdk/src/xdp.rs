//! spate's XDP program for `net_af_xdp` ports that share their interface
//! with the kernel, and the kernel calls around it that DPDK 22.11's PMD
//! does not make: which program an interface has attached (rtnetlink),
//! which XDP sockets are bound to it (sock_diag), the detaching of a
//! program a killed spate left behind, the program's address maps
//! (`bpf(2)`), which spate fills with its addresses and groups, and the
//! kernel's own addresses on the interface.
//!
//! The program (`xdp/spate_xdp.c`, built with clang's BPF target by this
//! crate's build) redirects to spate only the frames to its addresses, ARP
//! and neighbour solicitations for them; the PMD loads it from a file
//! (`xdp_prog=`) and fills its `xsks_map`.

use std::ffi::CString;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The program's object file: empty when the build found no clang able
/// to target BPF.
pub const PROGRAM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/spate_xdp.o"));

/// The program's name, as the kernel reports it (`ip link` shows it).
pub const PROGRAM_NAME: &str = "spate_xdp";

/// The maps spate fills: IPv4 (4-byte keys) and IPv6 (16-byte keys)
/// addresses whose frames are spate's.
const MAP_V4: &str = "spate_v4";
const MAP_V6: &str = "spate_v6";

/// The kernel's index of interface `name` (in the calling thread's
/// network namespace).
pub fn if_index(name: &str) -> io::Result<u32> {
    let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-terminated name that lives through the call.
    match unsafe { libc::if_nametoindex(c.as_ptr()) } {
        0 => Err(io::Error::last_os_error()),
        i => Ok(i),
    }
}

// Netlink: rtnetlink's link messages and their XDP attribute, and
// sock_diag's XDP sockets.
const IFLA_XDP: u16 = 43;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_FLAGS: u16 = 3;
const IFLA_XDP_PROG_ID: u16 = 4;
const IFLA_XDP_DRV_PROG_ID: u16 = 5;
const IFLA_XDP_SKB_PROG_ID: u16 = 6;
const IFLA_XDP_HW_PROG_ID: u16 = 7;
const IFLA_XDP_EXPECTED_FD: u16 = 8;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
const XDP_FLAGS_HW_MODE: u32 = 1 << 3;
const XDP_FLAGS_REPLACE: u32 = 1 << 4;
const NLA_F_NESTED: u16 = 0x8000;
const NLMSG_HDR: usize = 16;
const IFINFOMSG: usize = 16;
const NETLINK_SOCK_DIAG: libc::c_int = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const XDP_SHOW_INFO: u32 = 1;
const XDP_DIAG_INFO: u16 = 1;

/// Sends one netlink request (`kind`, `flags`, `body`) on a fresh socket
/// of `protocol` and returns the bodies of the messages that answer it,
/// to the end of a dump or the first message otherwise; an error message
/// (an acknowledgement's error 0 aside) is the error.
fn netlink(protocol: libc::c_int, kind: u16, flags: u16, body: &[u8]) -> io::Result<Vec<Vec<u8>>> {
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, protocol) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned from here on.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = NLMSG_HDR + body.len();
    let mut msg = Vec::with_capacity(len);
    msg.extend_from_slice(&(len as u32).to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(&(flags | libc::NLM_F_REQUEST as u16).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    msg.extend_from_slice(&0u32.to_ne_bytes()); // the kernel fills in the port
    msg.extend_from_slice(body);
    // SAFETY: sends `msg`'s bytes; the kernel is the default destination.
    if unsafe { libc::send(sock.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let dump = flags & libc::NLM_F_DUMP as u16 != 0;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    // A dump ends with NLMSG_DONE; bounded all the same.
    for _ in 0..4096 {
        // SAFETY: receives at most `buf.len()` bytes into it; MSG_TRUNC
        // makes it say how long the message was.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_TRUNC) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize > buf.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "a netlink answer longer than 64 KiB"));
        }
        let mut rest = &buf[..n as usize];
        while rest.len() >= NLMSG_HDR {
            let len = u32::from_ne_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
            let kind = u16::from_ne_bytes([rest[4], rest[5]]);
            if len < NLMSG_HDR || len > rest.len() {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "a malformed netlink message"));
            }
            let body = &rest[NLMSG_HDR..len];
            match kind as libc::c_int {
                libc::NLMSG_DONE => return Ok(out),
                libc::NLMSG_ERROR => {
                    let code = body.get(..4).map_or(0, |c| i32::from_ne_bytes(c.try_into().expect("4 bytes")));
                    if code != 0 {
                        return Err(io::Error::from_raw_os_error(-code));
                    }
                    return Ok(out);
                }
                _ => out.push(body.to_vec()),
            }
            if !dump {
                return Ok(out);
            }
            rest = rest.get((len + 3) & !3..).unwrap_or(&[]);
        }
    }
    Err(io::Error::new(io::ErrorKind::InvalidData, "a netlink dump that did not end"))
}

/// An rtnetlink link request for interface `if_index` with `attrs`.
fn link_request(kind: u16, flags: u16, if_index: u32, attrs: &[u8]) -> io::Result<Vec<Vec<u8>>> {
    // ifinfomsg: family, pad, type, index, flags, change.
    let mut body = vec![libc::AF_UNSPEC as u8, 0, 0, 0];
    body.extend_from_slice(&(if_index as i32).to_ne_bytes());
    body.extend_from_slice(&[0; 8]);
    body.extend_from_slice(attrs);
    netlink(libc::NETLINK_ROUTE, kind, flags, &body)
}

/// The attributes of a netlink attribute list, as (type, payload).
fn attributes(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let kind = u16::from_ne_bytes([b[2], b[3]]) & !NLA_F_NESTED;
        if len < 4 || len > b.len() {
            return None;
        }
        let payload = &b[4..len];
        b = b.get((len + 3) & !3..).unwrap_or(&[]);
        Some((kind, payload))
    })
}

fn u32_of(v: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(v.get(..4)?.try_into().ok()?))
}

/// The XDP program attached to an interface: its id and the mode it runs
/// in (`IFLA_XDP_ATTACHED`: 1 the driver's, 2 generic, 3 the device's, 4
/// several).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attached {
    /// The program's id.
    pub id: u32,
    mode: u8,
}

/// The XDP program attached to interface `if_index`, if any.
pub fn attached_program(if_index: u32) -> io::Result<Option<Attached>> {
    let answer = link_request(libc::RTM_GETLINK, 0, if_index, &[])?;
    let Some(body) = answer.first().and_then(|m| m.get(IFINFOMSG..)) else { return Ok(None) };
    let Some((_, xdp)) = attributes(body).find(|(kind, _)| *kind == IFLA_XDP) else { return Ok(None) };
    let mode = attributes(xdp).find(|(k, _)| *k == IFLA_XDP_ATTACHED).and_then(|(_, v)| v.first().copied());
    // With programs in several modes the kernel names each mode's only.
    let id = [IFLA_XDP_PROG_ID, IFLA_XDP_DRV_PROG_ID, IFLA_XDP_SKB_PROG_ID, IFLA_XDP_HW_PROG_ID]
        .iter()
        .find_map(|want| attributes(xdp).find(|(k, _)| k == want).and_then(|(_, v)| u32_of(v)))
        .filter(|&id| id != 0);
    Ok(id.map(|id| Attached { id, mode: mode.unwrap_or(0) }))
}

/// Detaches program `attached` from interface `if_index`, in the mode it
/// runs in, only if it is still the one attached (the kernel compares it
/// with the descriptor it is given: `XDP_FLAGS_REPLACE`).
pub fn detach_program(if_index: u32, attached: Attached) -> io::Result<()> {
    let mode = match attached.mode {
        1 => XDP_FLAGS_DRV_MODE,
        2 => XDP_FLAGS_SKB_MODE,
        3 => XDP_FLAGS_HW_MODE,
        _ => return Err(io::Error::new(io::ErrorKind::InvalidInput, "programs attached in several modes")),
    };
    let prog = program_fd(attached.id)?;
    let mut attrs = Vec::new();
    // IFLA_XDP { FD = -1, EXPECTED_FD = the program, FLAGS = REPLACE | mode }
    attrs.extend_from_slice(&28u16.to_ne_bytes());
    attrs.extend_from_slice(&(IFLA_XDP | NLA_F_NESTED).to_ne_bytes());
    for (kind, value) in [
        (IFLA_XDP_FD, -1i32 as u32),
        (IFLA_XDP_EXPECTED_FD, prog.as_raw_fd() as u32),
        (IFLA_XDP_FLAGS, XDP_FLAGS_REPLACE | mode),
    ] {
        attrs.extend_from_slice(&8u16.to_ne_bytes());
        attrs.extend_from_slice(&kind.to_ne_bytes());
        attrs.extend_from_slice(&value.to_ne_bytes());
    }
    link_request(libc::RTM_SETLINK, libc::NLM_F_ACK as u16, if_index, &attrs)?;
    match attached_program(if_index)? {
        Some(still) if still.id == attached.id => {
            Err(io::Error::other(format!("XDP program {} is still attached", attached.id)))
        }
        _ => Ok(()),
    }
}

/// The XDP sockets bound to interface `if_index` in this network
/// namespace, whoever holds them (sock_diag): their inodes and queues.
pub fn sockets_on(if_index: u32) -> io::Result<Vec<(u64, u32)>> {
    // xdp_diag_req: family, protocol, pad, inode, show, cookie.
    let mut req = vec![libc::AF_XDP as u8, 0, 0, 0];
    req.extend_from_slice(&0u32.to_ne_bytes());
    req.extend_from_slice(&XDP_SHOW_INFO.to_ne_bytes());
    req.extend_from_slice(&[0xff; 8]);
    let answers = netlink(NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, libc::NLM_F_DUMP as u16, &req)?;
    // xdp_diag_msg: family, type, pad, inode, cookie; then attributes.
    Ok(answers
        .iter()
        .filter_map(|m| {
            let ino = u32_of(m.get(4..8)?)? as u64;
            let info = attributes(m.get(16..)?).find(|(k, _)| *k == XDP_DIAG_INFO)?.1;
            let (ifindex, queue) = (u32_of(info)?, u32_of(info.get(4..)?)?);
            (ifindex == if_index).then_some((ino, queue))
        })
        .collect())
}

/// This process's XDP sockets bound to interface `if_index`, by queue
/// (lowest first): their descriptors, found by the inodes sock_diag gives.
/// Where the kernel has no XDP sock_diag (`xsk_diag`), every XDP socket of
/// the process in the order they were opened (lowest descriptor first):
/// `net_af_xdp` opens one per queue, in queue order, and a second
/// `net_af_xdp` port's are not told apart then.
pub fn own_sockets(if_index: u32) -> Vec<RawFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return Vec::new() };
    let fds: Vec<(RawFd, String)> = dir
        .flatten()
        .filter_map(|e| {
            Some((e.file_name().to_str()?.parse().ok()?, std::fs::read_link(e.path()).ok()?.to_str()?.to_string()))
        })
        .collect();
    match sockets_on(if_index) {
        Ok(mut bound) => {
            bound.sort_by_key(|&(_, q)| q);
            bound
                .iter()
                .filter_map(|(ino, _)| {
                    let want = format!("socket:[{ino}]");
                    fds.iter().find(|(_, link)| *link == want).map(|(fd, _)| *fd)
                })
                .collect()
        }
        Err(_) => {
            let mut xsks: Vec<RawFd> = fds
                .iter()
                .filter(|(_, link)| link.starts_with("socket:"))
                .map(|(fd, _)| *fd)
                .filter(|&fd| crate::sleep::socket_option(fd, libc::SO_DOMAIN) == Some(libc::AF_XDP))
                .collect();
            xsks.sort_unstable();
            xsks
        }
    }
}

/// A process holding a descriptor of loaded program `id`, if one does (a
/// running spate's PMD keeps its program's): found in `/proc/*/fdinfo`,
/// whose BPF program entries name their id. Only the processes this one
/// can see and read (its PID namespace; root reads them all there).
pub fn program_holder(id: u32) -> Option<u32> {
    let line = format!("prog_id:\t{id}\n");
    for p in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(p.path().join("fdinfo")) else { continue };
        for fd in fds.flatten() {
            if std::fs::read_to_string(fd.path()).is_ok_and(|info| info.contains(&line)) {
                return Some(pid);
            }
        }
    }
    None
}

/// A file holding the program, for the PMD's `xdp_prog=`: an anonymous
/// memory file (nothing on disk another user could swap, nothing left
/// behind), named by its path under `/proc/self/fd` while the descriptor
/// lives.
pub fn program_file() -> io::Result<(OwnedFd, String)> {
    let name = CString::new("spate_xdp.o").expect("no NUL");
    // SAFETY: a NUL-terminated name; flags are constants.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned from here on.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    std::io::Write::write_all(&mut &file, PROGRAM)?;
    let fd = OwnedFd::from(file);
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    Ok((fd, path))
}

/// The addresses the kernel has on interface `interface` (`getifaddrs`, in
/// the calling thread's network namespace).
pub fn kernel_addresses(interface: u32) -> Vec<IpAddr> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut at = head;
    while !at.is_null() {
        // SAFETY: a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*at };
        at = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a NUL-terminated name of the node, alive until freeifaddrs.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy();
        // An IPv4 address with a label (`eth0:1`) is named by it.
        if if_index(name.split(':').next().unwrap_or_default()).ok() != Some(interface) {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr of the family it names.
        let ip = unsafe {
            match (*ifa.ifa_addr).sa_family as libc::c_int {
                libc::AF_INET => {
                    let a = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    Some(IpAddr::from(a.sin_addr.s_addr.to_ne_bytes()))
                }
                libc::AF_INET6 => {
                    let a = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    Some(IpAddr::from(a.sin6_addr.s6_addr))
                }
                _ => None,
            }
        };
        out.extend(ip);
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

// bpf(2) commands.
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// `bpf(cmd, attr)` with `attr`: the union's first 64 bytes, the fields
/// a command does not use zero.
fn bpf(cmd: libc::c_long, attr: &mut [u64; 8]) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, zero-padded bpf_attr for `cmd`; pointers in
    // it point to live buffers of the sizes it names.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), std::mem::size_of_val(attr)) };
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

/// A descriptor `bpf(2)` returned.
fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: a descriptor just returned to this process, owned from here.
    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
}

/// `BPF_OBJ_GET_INFO_BY_FD` into `info` (as many bytes as it has).
fn object_info(fd: &OwnedFd, info: &mut [u8]) -> io::Result<()> {
    let mut attr = [0u64; 8];
    attr[0] = fd.as_raw_fd() as u32 as u64 | (info.len() as u64) << 32;
    attr[1] = info.as_mut_ptr() as u64;
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).map(drop)
}

/// An object's name from its info's 16 bytes at `at`.
fn name_at(info: &[u8], at: usize) -> String {
    let raw = &info[at..at + 16];
    String::from_utf8_lossy(&raw[..raw.iter().position(|&b| b == 0).unwrap_or(16)]).into_owned()
}

/// A descriptor of loaded program `id`.
fn program_fd(id: u32) -> io::Result<OwnedFd> {
    let mut attr = [0u64; 8];
    attr[0] = id as u64;
    bpf(BPF_PROG_GET_FD_BY_ID, &mut attr).map(owned)
}

/// A loaded program: its name and its maps' ids.
fn program(id: u32) -> io::Result<(String, Vec<u32>)> {
    let fd = program_fd(id)?;
    // bpf_prog_info: nr_map_ids at 52, map_ids at 56, name at 64.
    let mut ids = [0u32; 16];
    let mut info = [0u8; 80];
    info[52..56].copy_from_slice(&(ids.len() as u32).to_ne_bytes());
    info[56..64].copy_from_slice(&(ids.as_mut_ptr() as u64).to_ne_bytes());
    object_info(&fd, &mut info)?;
    let n = u32::from_ne_bytes(info[52..56].try_into().expect("4 bytes")) as usize;
    Ok((name_at(&info, 64), ids[..n.min(ids.len())].to_vec()))
}

/// The name of loaded program `id`.
pub fn program_name(id: u32) -> io::Result<String> {
    program(id).map(|(name, _)| name)
}

/// The address maps of a loaded spate program: an address in them is
/// spate's, its frames redirected to spate's sockets.
#[derive(Debug)]
pub struct AddressMaps {
    v4: OwnedFd,
    v6: OwnedFd,
}

impl AddressMaps {
    /// The maps of loaded program `id` (spate's: `InvalidData` otherwise).
    pub fn of_program(id: u32) -> io::Result<AddressMaps> {
        let (name, ids) = program(id)?;
        let (mut v4, mut v6) = (None, None);
        for map in ids {
            let mut attr = [0u64; 8];
            attr[0] = map as u64;
            let fd = owned(bpf(BPF_MAP_GET_FD_BY_ID, &mut attr)?);
            // bpf_map_info: name at 24.
            let mut info = [0u8; 40];
            object_info(&fd, &mut info)?;
            match name_at(&info, 24).as_str() {
                MAP_V4 => v4 = Some(fd),
                MAP_V6 => v6 = Some(fd),
                _ => {}
            }
        }
        match (v4, v6) {
            (Some(v4), Some(v6)) => Ok(AddressMaps { v4, v6 }),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("XDP program {id} ({name}) has no maps {MAP_V4} and {MAP_V6}: not spate's"),
            )),
        }
    }

    /// Makes `ip`'s frames spate's.
    pub fn insert(&self, ip: IpAddr) -> io::Result<()> {
        let (fd, key) = self.key(ip);
        let value = 1u8;
        let mut attr = [0u64; 8];
        attr[0] = fd as u32 as u64;
        attr[1] = key.as_ptr() as u64;
        attr[2] = &value as *const u8 as u64;
        bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
    }

    /// Gives `ip`'s frames back to the kernel.
    pub fn remove(&self, ip: IpAddr) -> io::Result<()> {
        let (fd, key) = self.key(ip);
        let mut attr = [0u64; 8];
        attr[0] = fd as u32 as u64;
        attr[1] = key.as_ptr() as u64;
        match bpf(BPF_MAP_DELETE_ELEM, &mut attr) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            r => r.map(drop),
        }
    }

    /// The map and key of `ip`: its bytes in network order.
    fn key(&self, ip: IpAddr) -> (RawFd, Vec<u8>) {
        match ip {
            IpAddr::V4(a) => (self.v4.as_raw_fd(), a.octets().to_vec()),
            IpAddr::V6(a) => (self.v6.as_raw_fd(), a.octets().to_vec()),
        }
    }
}

/// Whether XDP socket `fd` moves frames without a copy (its driver's
/// zero-copy mode; `getsockopt(SOL_XDP, XDP_OPTIONS)`); None when `fd` is
/// no XDP socket.
pub fn zero_copy(fd: RawFd) -> Option<bool> {
    const SOL_XDP: libc::c_int = 283;
    const XDP_OPTIONS: libc::c_int = 8;
    const XDP_OPTIONS_ZEROCOPY: u32 = 1;
    let mut flags: u32 = 0;
    let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
    // SAFETY: reads struct xdp_options (one u32) into a live u32 of that
    // length; another descriptor fails.
    let ret = unsafe { libc::getsockopt(fd, SOL_XDP, XDP_OPTIONS, (&mut flags as *mut u32).cast(), &mut len) };
    (ret == 0).then_some(flags & XDP_OPTIONS_ZEROCOPY != 0)
}

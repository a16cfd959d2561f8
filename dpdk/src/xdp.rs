//! spate's XDP program for `net_af_xdp` ports that share their interface
//! with the kernel, and the kernel calls around it that DPDK 22.11's PMD
//! does not make: which program an interface has attached (netlink), the
//! detaching of one a killed spate left behind, and the program's address
//! maps (`bpf(2)`), which spate fills with its addresses and groups.
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

// Netlink: rtnetlink's link messages and their XDP attribute.
const IFLA_XDP: u16 = 43;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_FLAGS: u16 = 3;
const IFLA_XDP_PROG_ID: u16 = 4;
const NLA_F_NESTED: u16 = 0x8000;
const NLMSG_HDR: usize = 16;
const IFINFOMSG: usize = 16;

/// One rtnetlink request on a fresh socket; returns the answer's bytes
/// (several messages may lie in them).
fn rtnetlink(kind: u16, flags: u16, if_index: u32, attrs: &[u8]) -> io::Result<Vec<u8>> {
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned from here on.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = NLMSG_HDR + IFINFOMSG + attrs.len();
    let mut msg = Vec::with_capacity(len);
    msg.extend_from_slice(&(len as u32).to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(&(flags | libc::NLM_F_REQUEST as u16).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    msg.extend_from_slice(&0u32.to_ne_bytes()); // the kernel fills in the port
    // ifinfomsg: family, pad, type, index, flags, change.
    msg.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]);
    msg.extend_from_slice(&(if_index as i32).to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(attrs);
    // SAFETY: sends `msg`'s bytes; the kernel is the default destination.
    if unsafe { libc::send(sock.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: receives at most `buf.len()` bytes into it.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    // An error message (or an acknowledgement: error 0) answers first.
    if buf.len() >= NLMSG_HDR + 4 && u16::from_ne_bytes([buf[4], buf[5]]) == libc::NLMSG_ERROR as u16 {
        let code = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
        if code != 0 {
            return Err(io::Error::from_raw_os_error(-code));
        }
    }
    Ok(buf)
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

/// The id of the XDP program attached to interface `if_index`, if any.
pub fn attached_program(if_index: u32) -> io::Result<Option<u32>> {
    let answer = rtnetlink(libc::RTM_GETLINK, 0, if_index, &[])?;
    let body = answer.get(NLMSG_HDR + IFINFOMSG..).unwrap_or(&[]);
    let id = attributes(body)
        .find(|(kind, _)| *kind == IFLA_XDP)
        .and_then(|(_, xdp)| attributes(xdp).find(|(kind, _)| *kind == IFLA_XDP_PROG_ID))
        .and_then(|(_, v)| Some(u32::from_ne_bytes(v.get(..4)?.try_into().ok()?)));
    Ok(id.filter(|&id| id != 0))
}

/// Detaches the XDP program attached to interface `if_index` (in the
/// mode DPDK attached it: the driver's where it has one).
pub fn detach_program(if_index: u32) -> io::Result<()> {
    let mut attrs = Vec::new();
    // IFLA_XDP { IFLA_XDP_FD = -1, IFLA_XDP_FLAGS = 0 }
    attrs.extend_from_slice(&20u16.to_ne_bytes());
    attrs.extend_from_slice(&(IFLA_XDP | NLA_F_NESTED).to_ne_bytes());
    attrs.extend_from_slice(&8u16.to_ne_bytes());
    attrs.extend_from_slice(&IFLA_XDP_FD.to_ne_bytes());
    attrs.extend_from_slice(&(-1i32).to_ne_bytes());
    attrs.extend_from_slice(&8u16.to_ne_bytes());
    attrs.extend_from_slice(&IFLA_XDP_FLAGS.to_ne_bytes());
    attrs.extend_from_slice(&0u32.to_ne_bytes());
    rtnetlink(libc::RTM_SETLINK, libc::NLM_F_ACK as u16, if_index, &attrs).map(drop)
}

// bpf(2) commands.
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// `bpf(cmd, attr)` with `attr` (the union's first bytes; the kernel
/// wants the rest zero) of `size` bytes.
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

/// A loaded program: its name and its maps' ids.
fn program(id: u32) -> io::Result<(String, Vec<u32>)> {
    let mut attr = [0u64; 8];
    attr[0] = id as u64;
    let fd = owned(bpf(BPF_PROG_GET_FD_BY_ID, &mut attr)?);
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

/// The process (other than this one) holding a descriptor of loaded
/// program `id`, if one does: a running spate's PMD keeps its program's.
/// Found in `/proc/*/fdinfo`, whose BPF program entries name their id.
pub fn program_holder(id: u32) -> Option<u32> {
    let me = std::process::id();
    let line = format!("prog_id:\t{id}\n");
    for p in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fdinfo")) else { continue };
        for fd in fds.flatten() {
            if std::fs::read_to_string(fd.path()).is_ok_and(|info| info.contains(&line)) {
                return Some(pid);
            }
        }
    }
    None
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

//! `spate_setsockopt` and `spate_getsockopt`: Linux's levels, names and
//! value layouts, mapped onto the spate socket's options. An option spate
//! does not have is `ENOPROTOOPT`. Options of the bound socket set before
//! `bind` are checked at once and applied when it binds.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::Ordering;

use spate::UdpSocket;

use crate::global;
use crate::socket::{CResult, CSocket, os, want};

/// Linux's `SO_TIMESTAMPNS` (`SO_TIMESTAMPNS_OLD` on 64-bit machines).
pub(crate) const SO_TIMESTAMPNS: i32 = 35;
/// `UDP_SEGMENT` and `UDP_GRO` (level `SOL_UDP`).
pub(crate) const UDP_SEGMENT: i32 = 103;
pub(crate) const UDP_GRO: i32 = 104;
/// `IP_MULTICAST_ALL` and `IPV6_MULTICAST_ALL`.
pub(crate) const IP_MULTICAST_ALL: i32 = 49;
pub(crate) const IPV6_MULTICAST_ALL: i32 = 29;

/// An option of the bound spate socket, parsed and checked.
#[derive(Debug, Clone, Copy)]
enum Bound {
    Ttl(u32),
    Tos(u32),
    Hops(u32),
    TClass(u32),
    Broadcast(bool),
    McastTtl(u32),
    McastHops(u32),
    McastLoop4(bool),
    McastLoop6(bool),
    McastAll(bool),
    McastIf(Option<u16>),
    Group4(Change, Ipv4Addr, Option<Ipv4Addr>, Ipv4Addr),
    Group6(Change, Ipv6Addr, Option<Ipv6Addr>, u32),
    DontFragment(bool),
    Segment(u16),
    Gro(bool),
    Timestamps(bool),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Join,
    Leave,
    Block,
    Unblock,
}

/// `setsockopt(level, name, value)`.
pub fn set(s: &CSocket, level: i32, name: i32, value: &[u8]) -> CResult<()> {
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO | libc::SO_SNDTIMEO) => {
            let ns = timeval(value)?;
            if name == libc::SO_RCVTIMEO {
                s.rcvtimeo.store(ns, Ordering::Relaxed);
            } else {
                s.sndtimeo.store(ns, Ordering::Relaxed);
                if let Some(b) = s.bound() {
                    let t = (ns > 0).then(|| std::time::Duration::from_nanos(ns));
                    b.set_write_timeout(t).map_err(os)?;
                }
            }
            return Ok(());
        }
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
            // Sends queue in the lcore's inbox, not per socket: kept and
            // reported as Linux reports it.
            let v = int(value)?.max(0) as u32;
            s.sndbuf.store(v.saturating_mul(2).max(4608), Ordering::Relaxed);
            return Ok(());
        }
        (libc::SOL_SOCKET, libc::SO_TYPE | libc::SO_DOMAIN | libc::SO_PROTOCOL | libc::SO_ERROR) => {
            return Err(libc::ENOPROTOOPT);
        }
        _ => {}
    }
    let mut setup = s.setup.lock().unwrap_or_else(|p| p.into_inner());
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => setup.reuseaddr = int(value)? != 0,
        (libc::SOL_SOCKET, libc::SO_REUSEPORT) => setup.reuseport = int(value)? != 0,
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
            let bytes = (int(value)?.max(0) as usize).saturating_mul(2).max(2304);
            match s.bound() {
                Some(b) => b.set_recv_buffer_size(bytes).map_err(os)?,
                None => setup.rcvbuf = Some(bytes),
            }
        }
        (libc::SOL_SOCKET, libc::SO_BINDTODEVICE) => {
            let dev = device(value)?;
            match s.bound() {
                // spate binds a device with the address.
                Some(_) if dev != setup.device => return Err(libc::EINVAL),
                _ => setup.device = dev,
            }
        }
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) if s.v6 => {
            if s.bound().is_some() {
                return Err(libc::EINVAL);
            }
            setup.v6only = int(value)? != 0;
        }
        _ => {
            if let Some(bit) = cmsg_bit(s.v6, level, name) {
                let on = int(value)? != 0;
                if bit == want::GRO || bit == want::TIMESTAMPNS {
                    // Also an option of the spate socket (below).
                } else {
                    toggle(s, bit, on);
                    return Ok(());
                }
            }
            let opt = parse(s.v6, level, name, value)?;
            match s.bound() {
                Some(b) => apply(s, b, opt)?,
                None => {
                    note(s, opt);
                    setup.deferred.push((level, name, value.to_vec()));
                }
            }
        }
    }
    Ok(())
}

/// Applies an option set before `bind` to the socket it bound.
pub fn set_bound(s: &CSocket, b: &UdpSocket, level: i32, name: i32, value: &[u8]) -> CResult<()> {
    let opt = parse(s.v6, level, name, value)?;
    apply(s, b, opt)
}

fn toggle(s: &CSocket, bit: u32, on: bool) {
    match on {
        true => s.cmsgs.fetch_or(bit, Ordering::Relaxed),
        false => s.cmsgs.fetch_and(!bit, Ordering::Relaxed),
    };
}

/// What an option changes in the C socket itself (the control messages
/// it asks for), set or deferred.
fn note(s: &CSocket, opt: Bound) {
    match opt {
        Bound::Gro(on) => toggle(s, want::GRO, on),
        Bound::Timestamps(on) => toggle(s, want::TIMESTAMPNS, on),
        _ => {}
    }
}

/// The control message a receive option asks for.
fn cmsg_bit(v6: bool, level: i32, name: i32) -> Option<u32> {
    Some(match (level, name) {
        (libc::IPPROTO_IP, libc::IP_PKTINFO) => want::PKTINFO,
        (libc::IPPROTO_IP, libc::IP_RECVTOS) => want::TOS,
        (libc::IPPROTO_IP, libc::IP_RECVTTL) => want::TTL,
        (libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO) if v6 => want::PKTINFO6,
        (libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS) if v6 => want::TCLASS,
        (libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT) if v6 => want::HOPLIMIT,
        (libc::SOL_SOCKET, SO_TIMESTAMPNS) => want::TIMESTAMPNS,
        (libc::SOL_UDP, UDP_GRO) => want::GRO,
        _ => return None,
    })
}

fn parse(v6: bool, level: i32, name: i32, v: &[u8]) -> CResult<Bound> {
    let default = |x: i32, d: u32| if x == -1 { Ok(d) } else { u32::try_from(x).map_err(|_| libc::EINVAL) };
    Ok(match (level, name) {
        (libc::SOL_SOCKET, libc::SO_BROADCAST) => Bound::Broadcast(int(v)? != 0),
        (libc::SOL_SOCKET, SO_TIMESTAMPNS) => Bound::Timestamps(int(v)? != 0),
        (libc::IPPROTO_IP, libc::IP_TTL) => Bound::Ttl(default(int_or_byte(v)?, 64)?),
        (libc::IPPROTO_IP, libc::IP_TOS) => Bound::Tos((int_or_byte(v)? & 0xff) as u32),
        (libc::IPPROTO_IP, libc::IP_MTU_DISCOVER) => match int(v)? {
            x @ 0..=5 => Bound::DontFragment(x == libc::IP_PMTUDISC_DO || x == libc::IP_PMTUDISC_PROBE),
            _ => return Err(libc::EINVAL),
        },
        (libc::IPPROTO_IP, libc::IP_MULTICAST_TTL) => Bound::McastTtl(default(int_or_byte(v)?, 1)?),
        (libc::IPPROTO_IP, libc::IP_MULTICAST_LOOP) => Bound::McastLoop4(int_or_byte(v)? != 0),
        (libc::IPPROTO_IP, IP_MULTICAST_ALL) => Bound::McastAll(int(v)? != 0),
        (libc::IPPROTO_IP, libc::IP_MULTICAST_IF) => {
            // in_addr, ip_mreq or ip_mreqn: the interface's address, or
            // (ip_mreqn) its index.
            let (addr, index) = match v.len() {
                12.. => (ipv4(&v[4..8]), i32::from_ne_bytes(v[8..12].try_into().map_err(|_| libc::EINVAL)?)),
                4.. => (ipv4(&v[..4]), 0),
                _ => return Err(libc::EINVAL),
            };
            Bound::McastIf(iface_v4(addr, index)?)
        }
        (libc::IPPROTO_IP, libc::IP_ADD_MEMBERSHIP | libc::IP_DROP_MEMBERSHIP) => {
            let (group, iface) = match v.len() {
                12.. => {
                    let index = i32::from_ne_bytes(v[8..12].try_into().map_err(|_| libc::EINVAL)?);
                    (ipv4(&v[..4]), iface_addr_v4(ipv4(&v[4..8]), index)?)
                }
                8.. => (ipv4(&v[..4]), ipv4(&v[4..8])),
                _ => return Err(libc::EINVAL),
            };
            let c = if name == libc::IP_ADD_MEMBERSHIP { Change::Join } else { Change::Leave };
            Bound::Group4(c, group, None, iface)
        }
        (
            libc::IPPROTO_IP,
            libc::IP_ADD_SOURCE_MEMBERSHIP
            | libc::IP_DROP_SOURCE_MEMBERSHIP
            | libc::IP_BLOCK_SOURCE
            | libc::IP_UNBLOCK_SOURCE,
        ) => {
            // ip_mreq_source: group, interface, source.
            if v.len() < 12 {
                return Err(libc::EINVAL);
            }
            let c = match name {
                libc::IP_ADD_SOURCE_MEMBERSHIP => Change::Join,
                libc::IP_DROP_SOURCE_MEMBERSHIP => Change::Leave,
                libc::IP_BLOCK_SOURCE => Change::Block,
                _ => Change::Unblock,
            };
            Bound::Group4(c, ipv4(&v[..4]), Some(ipv4(&v[8..12])), ipv4(&v[4..8]))
        }
        (libc::IPPROTO_IP | libc::IPPROTO_IPV6, libc::MCAST_JOIN_GROUP | libc::MCAST_LEAVE_GROUP) => {
            // group_req: interface, then the group as a sockaddr_storage at 8.
            if v.len() < 136 {
                return Err(libc::EINVAL);
            }
            let index = u32::from_ne_bytes(v[..4].try_into().map_err(|_| libc::EINVAL)?);
            let c = if name == libc::MCAST_JOIN_GROUP { Change::Join } else { Change::Leave };
            group_of(v6, c, index, &v[8..136], None)?
        }
        (
            libc::IPPROTO_IP | libc::IPPROTO_IPV6,
            libc::MCAST_JOIN_SOURCE_GROUP
            | libc::MCAST_LEAVE_SOURCE_GROUP
            | libc::MCAST_BLOCK_SOURCE
            | libc::MCAST_UNBLOCK_SOURCE,
        ) => {
            if v.len() < 264 {
                return Err(libc::EINVAL);
            }
            let index = u32::from_ne_bytes(v[..4].try_into().map_err(|_| libc::EINVAL)?);
            let c = match name {
                libc::MCAST_JOIN_SOURCE_GROUP => Change::Join,
                libc::MCAST_LEAVE_SOURCE_GROUP => Change::Leave,
                libc::MCAST_BLOCK_SOURCE => Change::Block,
                _ => Change::Unblock,
            };
            group_of(v6, c, index, &v[8..136], Some(&v[136..264]))?
        }
        (libc::IPPROTO_IPV6, _) if !v6 => return Err(libc::ENOPROTOOPT),
        (libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS) => Bound::Hops(default(int(v)?, 64)?),
        (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => Bound::TClass(default(int(v)?, 0)?),
        (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_HOPS) => Bound::McastHops(default(int(v)?, 1)?),
        (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_LOOP) => match int(v)? {
            x @ 0..=1 => Bound::McastLoop6(x == 1),
            _ => return Err(libc::EINVAL),
        },
        (libc::IPPROTO_IPV6, IPV6_MULTICAST_ALL) => Bound::McastAll(int(v)? != 0),
        (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_IF) => Bound::McastIf(match int(v)? {
            0 => None,
            i => Some(iface_index(i)?),
        }),
        (libc::IPPROTO_IPV6, libc::IPV6_ADD_MEMBERSHIP | libc::IPV6_DROP_MEMBERSHIP) => {
            // ipv6_mreq: the group, then the interface index.
            if v.len() < 20 {
                return Err(libc::EINVAL);
            }
            let index = i32::from_ne_bytes(v[16..20].try_into().map_err(|_| libc::EINVAL)?);
            let c = if name == libc::IPV6_ADD_MEMBERSHIP { Change::Join } else { Change::Leave };
            Bound::Group6(c, ipv6(&v[..16]), None, index.max(0) as u32)
        }
        (libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER) => match int(v)? {
            x @ 0..=5 => Bound::DontFragment(x == libc::IPV6_PMTUDISC_DO || x == libc::IPV6_PMTUDISC_PROBE),
            _ => return Err(libc::EINVAL),
        },
        (libc::SOL_UDP, UDP_SEGMENT) => match int(v)? {
            x @ 0..=0xffff => Bound::Segment(x as u16),
            _ => return Err(libc::EINVAL),
        },
        (libc::SOL_UDP, UDP_GRO) => Bound::Gro(int(v)? != 0),
        _ => {
            log_once(level, name);
            return Err(libc::ENOPROTOOPT);
        }
    })
}

/// Says once per option that a program asked for one spate lacks.
fn log_once(level: i32, name: i32) {
    static SEEN: std::sync::Mutex<Vec<(i32, i32)>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if !seen.contains(&(level, name)) && seen.len() < 256 {
        seen.push((level, name));
        log::warn!("setsockopt level {level} option {name}: spate does not have it (ENOPROTOOPT)");
    }
}

fn apply(s: &CSocket, b: &UdpSocket, opt: Bound) -> CResult<()> {
    note(s, opt);
    let r = match opt {
        Bound::Ttl(t) => b.set_ttl(t),
        Bound::Tos(t) => b.set_tos(t),
        Bound::Hops(h) => b.set_unicast_hops_v6(h),
        Bound::TClass(t) => b.set_tclass_v6(t),
        Bound::Broadcast(on) => b.set_broadcast(on),
        Bound::McastTtl(t) => b.set_multicast_ttl_v4(t),
        Bound::McastHops(h) => b.set_multicast_hops_v6(h),
        Bound::McastLoop4(on) => b.set_multicast_loop_v4(on),
        Bound::McastLoop6(on) => b.set_multicast_loop_v6(on),
        Bound::McastAll(on) => b.set_multicast_all(on),
        Bound::McastIf(i) => b.set_multicast_if(i),
        Bound::Group4(c, g, src, i) => match (c, src) {
            (Change::Join, None) => b.join_multicast_v4(&g, &i),
            (Change::Leave, None) => b.leave_multicast_v4(&g, &i),
            (Change::Join, Some(x)) => b.join_source_multicast_v4(&g, &x, &i),
            (Change::Leave, Some(x)) => b.leave_source_multicast_v4(&g, &x, &i),
            (Change::Block, Some(x)) => b.block_source_v4(&g, &x, &i),
            (Change::Unblock, Some(x)) => b.unblock_source_v4(&g, &x, &i),
            (_, None) => return Err(libc::EINVAL),
        },
        Bound::Group6(c, g, src, i) => match (c, src) {
            (Change::Join, None) => b.join_multicast_v6(&g, i),
            (Change::Leave, None) => b.leave_multicast_v6(&g, i),
            (Change::Join, Some(x)) => b.join_source_multicast_v6(&g, &x, i),
            (Change::Leave, Some(x)) => b.leave_source_multicast_v6(&g, &x, i),
            (Change::Block, Some(x)) => b.block_source_v6(&g, &x, i),
            (Change::Unblock, Some(x)) => b.unblock_source_v6(&g, &x, i),
            (_, None) => return Err(libc::EINVAL),
        },
        Bound::DontFragment(on) => b.set_dont_fragment(on),
        Bound::Segment(n) => b.set_segment_size((n > 0).then_some(n)),
        Bound::Gro(on) => b.set_gro(on),
        Bound::Timestamps(on) => b.set_recv_timestamps(on),
    };
    r.map_err(os)
}

/// `getsockopt(level, name)` into `out`; returns the length written.
pub fn get(s: &CSocket, level: i32, name: i32, out: &mut [u8]) -> CResult<usize> {
    let bound = s.bound();
    let cm = s.cmsgs.load(Ordering::Relaxed);
    let flag = |bit: u32| i32::from(cm & bit != 0);
    let v: i32 = match (level, name) {
        (libc::SOL_SOCKET, libc::SO_TYPE) => libc::SOCK_DGRAM,
        (libc::SOL_SOCKET, libc::SO_DOMAIN) => {
            if s.v6 {
                libc::AF_INET6
            } else {
                libc::AF_INET
            }
        }
        (libc::SOL_SOCKET, libc::SO_PROTOCOL) => libc::IPPROTO_UDP,
        (libc::SOL_SOCKET, libc::SO_ERROR) => match bound {
            Some(b) => b.take_error().map_err(os)?.map_or(0, os),
            None => 0,
        },
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => i32::from(lock(s).reuseaddr),
        (libc::SOL_SOCKET, libc::SO_REUSEPORT) => i32::from(lock(s).reuseport),
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => match bound {
            Some(b) => b.recv_buffer_size().map_err(os)? as i32,
            None => lock(s).rcvbuf.unwrap_or(212_992) as i32,
        },
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => s.sndbuf.load(Ordering::Relaxed) as i32,
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO | libc::SO_SNDTIMEO) => {
            let ns = if name == libc::SO_RCVTIMEO { &s.rcvtimeo } else { &s.sndtimeo }.load(Ordering::Relaxed);
            let tv = [(ns / 1_000_000_000) as i64, ((ns % 1_000_000_000) / 1000) as i64];
            let bytes: Vec<u8> = tv.iter().flat_map(|x| x.to_ne_bytes()).collect();
            return Ok(put(out, &bytes));
        }
        (libc::SOL_SOCKET, libc::SO_BINDTODEVICE) => {
            let name = match lock(s).device {
                Some(i) => global::stack()?.interfaces().get(i as usize).map(|f| f.name.clone()).unwrap_or_default(),
                None => String::new(),
            };
            let mut bytes = name.into_bytes();
            if !bytes.is_empty() {
                bytes.push(0);
            }
            return Ok(put(out, &bytes));
        }
        (libc::SOL_SOCKET, libc::SO_BROADCAST) => b_or(bound, s, level, name, 0, |b| b.broadcast().map(i32::from))?,
        (libc::SOL_SOCKET, SO_TIMESTAMPNS) => flag(want::TIMESTAMPNS),
        (libc::IPPROTO_IP, libc::IP_PKTINFO) => flag(want::PKTINFO),
        (libc::IPPROTO_IP, libc::IP_RECVTOS) => flag(want::TOS),
        (libc::IPPROTO_IP, libc::IP_RECVTTL) => flag(want::TTL),
        (libc::IPPROTO_IP, libc::IP_TTL) => b_or(bound, s, level, name, 64, |b| b.ttl().map(|x| x as i32))?,
        (libc::IPPROTO_IP, libc::IP_TOS) => b_or(bound, s, level, name, 0, |b| b.tos().map(|x| x as i32))?,
        (libc::IPPROTO_IP, libc::IP_MTU_DISCOVER) => b_or(bound, s, level, name, libc::IP_PMTUDISC_WANT, |b| {
            b.dont_fragment().map(|d| if d { libc::IP_PMTUDISC_DO } else { libc::IP_PMTUDISC_WANT })
        })?,
        (libc::IPPROTO_IP, libc::IP_MULTICAST_TTL) => {
            b_or(bound, s, level, name, 1, |b| b.multicast_ttl_v4().map(|x| x as i32))?
        }
        (libc::IPPROTO_IP, libc::IP_MULTICAST_LOOP) => {
            b_or(bound, s, level, name, 1, |b| b.multicast_loop_v4().map(i32::from))?
        }
        (libc::IPPROTO_IP, IP_MULTICAST_ALL) | (libc::IPPROTO_IPV6, IPV6_MULTICAST_ALL) => {
            b_or(bound, s, level, name, 1, |b| b.multicast_all().map(i32::from))?
        }
        (libc::IPPROTO_IP, libc::IP_MULTICAST_IF) => {
            let iface = match bound {
                Some(b) => b.multicast_if().map_err(os)?,
                None => None,
            };
            let addr = match iface {
                Some(i) => global::stack()?
                    .interfaces()
                    .get(i as usize)
                    .and_then(|f| f.ipv4_addrs.first().copied())
                    .unwrap_or(Ipv4Addr::UNSPECIFIED),
                None => Ipv4Addr::UNSPECIFIED,
            };
            return Ok(put(out, &addr.octets()));
        }
        (libc::IPPROTO_IPV6, _) if !s.v6 => return Err(libc::ENOPROTOOPT),
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => i32::from(lock(s).v6only),
        (libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO) => flag(want::PKTINFO6),
        (libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS) => flag(want::TCLASS),
        (libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT) => flag(want::HOPLIMIT),
        (libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS) => {
            b_or(bound, s, level, name, 64, |b| b.unicast_hops_v6().map(|x| x as i32))?
        }
        (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => b_or(bound, s, level, name, 0, |b| b.tclass_v6().map(|x| x as i32))?,
        (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_HOPS) => {
            b_or(bound, s, level, name, 1, |b| b.multicast_hops_v6().map(|x| x as i32))?
        }
        (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_LOOP) => {
            b_or(bound, s, level, name, 1, |b| b.multicast_loop_v6().map(i32::from))?
        }
        (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_IF) => match bound {
            Some(b) => b.multicast_if().map_err(os)?.map_or(0, |i| i as i32 + 1),
            None => 0,
        },
        (libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER) => b_or(bound, s, level, name, libc::IPV6_PMTUDISC_WANT, |b| {
            b.dont_fragment().map(|d| if d { libc::IPV6_PMTUDISC_DO } else { libc::IPV6_PMTUDISC_WANT })
        })?,
        (libc::SOL_UDP, UDP_SEGMENT) => {
            b_or(bound, s, level, name, 0, |b| b.segment_size().map(|x| x.map_or(0, i32::from)))?
        }
        (libc::SOL_UDP, UDP_GRO) => flag(want::GRO),
        _ => return Err(libc::ENOPROTOOPT),
    };
    Ok(put(out, &v.to_ne_bytes()))
}

/// The value from the bound socket, or (unbound) the last one set before
/// `bind`, or Linux's default.
fn b_or(
    bound: Option<&UdpSocket>,
    s: &CSocket,
    level: i32,
    name: i32,
    default: i32,
    f: impl FnOnce(&UdpSocket) -> std::io::Result<i32>,
) -> CResult<i32> {
    if let Some(b) = bound {
        return f(b).map_err(os);
    }
    let setup = lock(s);
    let last = setup.deferred.iter().rev().find(|(l, n, _)| *l == level && *n == name);
    Ok(match last {
        Some((_, _, v)) => int_or_byte(v).unwrap_or(default),
        None => default,
    })
}

fn lock(s: &CSocket) -> std::sync::MutexGuard<'_, crate::socket::BindOptions> {
    s.setup.lock().unwrap_or_else(|p| p.into_inner())
}

/// Copies what fits of `bytes` into `out`; returns the length copied.
fn put(out: &mut [u8], bytes: &[u8]) -> usize {
    let n = out.len().min(bytes.len());
    out[..n].copy_from_slice(&bytes[..n]);
    n
}

/// An `int` value: shorter is `EINVAL`.
fn int(v: &[u8]) -> CResult<i32> {
    v.get(..4).and_then(|b| b.try_into().ok()).map(i32::from_ne_bytes).ok_or(libc::EINVAL)
}

/// An `int`, or one byte (the IPv4 options Linux also takes as a char).
fn int_or_byte(v: &[u8]) -> CResult<i32> {
    match v.len() {
        4.. => int(v),
        1..=3 => Ok(v[0] as i32),
        _ => Err(libc::EINVAL),
    }
}

/// A `struct timeval` as nanoseconds (0: none): shorter is `EINVAL`,
/// microseconds out of range `EDOM`, as Linux.
fn timeval(v: &[u8]) -> CResult<u64> {
    if v.len() < 16 {
        return Err(libc::EINVAL);
    }
    let sec = i64::from_ne_bytes(v[..8].try_into().map_err(|_| libc::EINVAL)?);
    let usec = i64::from_ne_bytes(v[8..16].try_into().map_err(|_| libc::EINVAL)?);
    if !(0..1_000_000).contains(&usec) {
        return Err(libc::EDOM);
    }
    if sec < 0 {
        // Linux: a negative timeout does not wait at all.
        return Ok(1);
    }
    Ok((sec as u64).saturating_mul(1_000_000_000).saturating_add(usec as u64 * 1000))
}

fn ipv4(b: &[u8]) -> Ipv4Addr {
    Ipv4Addr::new(b[0], b[1], b[2], b[3])
}

fn ipv6(b: &[u8]) -> Ipv6Addr {
    let mut o = [0u8; 16];
    o.copy_from_slice(&b[..16]);
    Ipv6Addr::from(o)
}

/// Interface `ifindex` (spate's index plus one) as spate's index.
fn iface_index(ifindex: i32) -> CResult<u16> {
    let n = global::stack()?.interfaces().len() as i32;
    if ifindex < 1 || ifindex > n {
        return Err(libc::ENODEV);
    }
    Ok((ifindex - 1) as u16)
}

/// The interface an IPv4 multicast option names: by index when given,
/// else by its address; `None` for neither.
fn iface_v4(addr: Ipv4Addr, ifindex: i32) -> CResult<Option<u16>> {
    if ifindex > 0 {
        return iface_index(ifindex).map(Some);
    }
    if addr.is_unspecified() {
        return Ok(None);
    }
    let ifaces = global::stack()?.interfaces();
    ifaces.iter().find(|f| f.ipv4_addrs.contains(&addr)).map(|f| Some(f.index)).ok_or(libc::EADDRNOTAVAIL)
}

/// The address spate's IPv4 membership calls take for interface
/// `ifindex` (its first address), or `addr` when no index is given.
fn iface_addr_v4(addr: Ipv4Addr, ifindex: i32) -> CResult<Ipv4Addr> {
    if ifindex <= 0 {
        return Ok(addr);
    }
    let i = iface_index(ifindex)?;
    let ifaces = global::stack()?.interfaces();
    ifaces.get(i as usize).and_then(|f| f.ipv4_addrs.first().copied()).ok_or(libc::EADDRNOTAVAIL)
}

/// A `group_req`'s or `group_source_req`'s membership.
fn group_of(v6: bool, c: Change, ifindex: u32, group: &[u8], source: Option<&[u8]>) -> CResult<Bound> {
    let family = u16::from_ne_bytes([group[0], group[1]]) as i32;
    if source.is_some_and(|s| u16::from_ne_bytes([s[0], s[1]]) as i32 != family) {
        return Err(libc::EINVAL);
    }
    match family {
        libc::AF_INET => {
            let iface = iface_addr_v4(Ipv4Addr::UNSPECIFIED, ifindex as i32)?;
            Ok(Bound::Group4(c, ipv4(&group[4..8]), source.map(|s| ipv4(&s[4..8])), iface))
        }
        libc::AF_INET6 if v6 => Ok(Bound::Group6(c, ipv6(&group[8..24]), source.map(|s| ipv6(&s[8..24])), ifindex)),
        libc::AF_INET6 => Err(libc::EINVAL),
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// `SO_BINDTODEVICE`'s interface name: empty for none, else one of the
/// stack's interfaces (`ENODEV`).
fn device(v: &[u8]) -> CResult<Option<u16>> {
    let name = v.split(|b| *b == 0).next().unwrap_or(&[]);
    if name.is_empty() {
        return Ok(None);
    }
    if name.len() >= libc::IFNAMSIZ {
        return Err(libc::EINVAL);
    }
    let ifaces = global::stack()?.interfaces();
    ifaces.iter().find(|f| f.name.as_bytes() == name).map(|f| Some(f.index)).ok_or(libc::ENODEV)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_as_linux_reads_them() {
        assert_eq!(int(&7i32.to_ne_bytes()), Ok(7));
        assert_eq!(int(&[1, 2]), Err(libc::EINVAL));
        assert_eq!(int_or_byte(&[9]), Ok(9));
        let tv = |s: i64, u: i64| [s.to_ne_bytes(), u.to_ne_bytes()].concat();
        assert_eq!(timeval(&tv(1, 500_000)), Ok(1_500_000_000));
        assert_eq!(timeval(&tv(0, 1_000_000)), Err(libc::EDOM));
        assert_eq!(timeval(&tv(-1, 0)), Ok(1));
        assert_eq!(timeval(&[0; 8]), Err(libc::EINVAL));
    }

    #[test]
    fn unknown_options_are_enoprotoopt() {
        assert_eq!(
            parse(false, libc::SOL_SOCKET, libc::SO_KEEPALIVE, &1i32.to_ne_bytes()).err(),
            Some(libc::ENOPROTOOPT)
        );
        assert_eq!(
            parse(false, libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS, &1i32.to_ne_bytes()).err(),
            Some(libc::ENOPROTOOPT)
        );
        assert_eq!(parse(true, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, &9i32.to_ne_bytes()).err(), Some(libc::EINVAL));
    }
}

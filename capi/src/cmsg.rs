//! Control messages in Linux's layouts, read from and written into the
//! bytes of a `msghdr`'s control buffer, so the `CMSG_*` macros work on
//! them (x86-64 and arm64: a 16-byte header, data aligned to 8 bytes).

use std::net::IpAddr;

use spate::{Ecn, RecvMeta, SendMeta};

use crate::options::{SO_TIMESTAMPNS, UDP_GRO, UDP_SEGMENT};
use crate::socket::{CResult, want};

/// `sizeof(struct cmsghdr)`.
const HDR: usize = std::mem::size_of::<libc::cmsghdr>();
const ALIGN: usize = std::mem::size_of::<usize>();

fn align(n: usize) -> usize {
    (n + ALIGN - 1) & !(ALIGN - 1)
}

/// Writes control messages into a control buffer as Linux's `put_cmsg`
/// does: one that does not fit whole is cut (or left out) and the
/// receive is flagged `MSG_CTRUNC`.
#[derive(Debug)]
pub struct Writer<'a> {
    buf: &'a mut [u8],
    at: usize,
    /// A message did not fit.
    pub truncated: bool,
}

impl<'a> Writer<'a> {
    /// A writer over the control buffer (empty when the caller gave none).
    pub fn new(buf: &'a mut [u8]) -> Writer<'a> {
        Writer { buf, at: 0, truncated: false }
    }

    /// The bytes written (the new `msg_controllen`).
    pub fn len(&self) -> usize {
        self.at
    }

    /// Appends one message.
    pub fn push(&mut self, level: i32, kind: i32, data: &[u8]) {
        let room = self.buf.len() - self.at;
        if self.truncated || room < HDR {
            self.truncated = true;
            return;
        }
        let (len, cut) = match HDR + data.len() {
            n if n > room => (room, true),
            n => (n, false),
        };
        let b = &mut self.buf[self.at..];
        b[..ALIGN].copy_from_slice(&len.to_ne_bytes());
        b[ALIGN..ALIGN + 4].copy_from_slice(&level.to_ne_bytes());
        b[ALIGN + 4..HDR].copy_from_slice(&kind.to_ne_bytes());
        b[HDR..len].copy_from_slice(&data[..len - HDR]);
        self.at += align(len).min(room);
        self.truncated = cut;
    }
}

/// Writes the control messages `wants` asks for about datagram `meta`
/// (addresses as the wire had them, IPv4 unmapped).
pub fn received(w: &mut Writer<'_>, wants: u32, meta: &RecvMeta) {
    let ifindex = meta.iface as i32 + 1;
    match meta.dst.ip() {
        IpAddr::V4(dst) => {
            if wants & want::PKTINFO != 0 {
                // in_pktinfo: ifindex, the local address, the header's destination.
                let mut p = [0u8; 12];
                p[..4].copy_from_slice(&ifindex.to_ne_bytes());
                p[4..8].copy_from_slice(&dst.octets());
                p[8..12].copy_from_slice(&dst.octets());
                w.push(libc::IPPROTO_IP, libc::IP_PKTINFO, &p);
            }
            if wants & want::TOS != 0 {
                w.push(libc::IPPROTO_IP, libc::IP_TOS, &[meta.tos]);
            }
            if wants & want::TTL != 0 {
                w.push(libc::IPPROTO_IP, libc::IP_TTL, &(meta.ttl as i32).to_ne_bytes());
            }
            // A dual-stack socket's IPv6 options, with the address mapped.
            v6(w, wants, &dst.to_ipv6_mapped().octets(), ifindex, meta);
        }
        IpAddr::V6(dst) => v6(w, wants, &dst.octets(), ifindex, meta),
    }
    if wants & want::TIMESTAMPNS != 0
        && let Some(t) = meta.timestamp.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
    {
        let mut ts = [0u8; 16];
        ts[..8].copy_from_slice(&(t.as_secs() as i64).to_ne_bytes());
        ts[8..].copy_from_slice(&(t.subsec_nanos() as i64).to_ne_bytes());
        w.push(libc::SOL_SOCKET, SO_TIMESTAMPNS, &ts);
    }
    if wants & want::GRO != 0
        && let Some(g) = meta.gso_size
    {
        w.push(libc::SOL_UDP, UDP_GRO, &(g as i32).to_ne_bytes());
    }
}

fn v6(w: &mut Writer<'_>, wants: u32, dst: &[u8; 16], ifindex: i32, meta: &RecvMeta) {
    if wants & want::PKTINFO6 != 0 {
        // in6_pktinfo: the destination, ifindex.
        let mut p = [0u8; 20];
        p[..16].copy_from_slice(dst);
        p[16..].copy_from_slice(&ifindex.to_ne_bytes());
        w.push(libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, &p);
    }
    if wants & want::TCLASS != 0 {
        w.push(libc::IPPROTO_IPV6, libc::IPV6_TCLASS, &(meta.tos as i32).to_ne_bytes());
    }
    if wants & want::HOPLIMIT != 0 {
        w.push(libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT, &(meta.ttl as i32).to_ne_bytes());
    }
}

/// What a send's control messages ask: its source address, ECN
/// codepoint and segment size. Malformed messages and ones spate does not
/// take are `EINVAL`, as Linux's unknown ones are.
pub fn to_send(control: &[u8]) -> CResult<SendMeta> {
    let mut meta = SendMeta::default();
    let mut at = 0;
    while control.len() - at >= HDR {
        let b = &control[at..];
        let len = usize::from_ne_bytes(b[..ALIGN].try_into().map_err(|_| libc::EINVAL)?);
        if len < HDR || len > b.len() {
            return Err(libc::EINVAL);
        }
        let level = i32::from_ne_bytes(b[ALIGN..ALIGN + 4].try_into().map_err(|_| libc::EINVAL)?);
        let kind = i32::from_ne_bytes(b[ALIGN + 4..HDR].try_into().map_err(|_| libc::EINVAL)?);
        let data = &b[HDR..len];
        let int = || data.get(..4).and_then(|x| x.try_into().ok()).map(i32::from_ne_bytes).ok_or(libc::EINVAL);
        match (level, kind) {
            (libc::IPPROTO_IP, libc::IP_PKTINFO) if data.len() >= 12 => {
                // ipi_spec_dst is the source; else ipi_addr.
                let spec: [u8; 4] = data[4..8].try_into().map_err(|_| libc::EINVAL)?;
                let addr: [u8; 4] = data[8..12].try_into().map_err(|_| libc::EINVAL)?;
                let src = if spec != [0; 4] { spec } else { addr };
                meta.src_ip = Some(IpAddr::from(src));
            }
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) if data.len() >= 20 => {
                let a: [u8; 16] = data[..16].try_into().map_err(|_| libc::EINVAL)?;
                meta.src_ip = Some(IpAddr::from(a));
            }
            (libc::IPPROTO_IP, libc::IP_TOS) => {
                let tos = if data.len() >= 4 { int()? } else { *data.first().ok_or(libc::EINVAL)? as i32 };
                meta.ecn = Some(ecn(tos)?);
            }
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => meta.ecn = Some(ecn(int()?)?),
            // Exactly an int, 1 to 255, as Linux's.
            (libc::IPPROTO_IP, libc::IP_TTL) if data.len() == 4 => match int()? {
                t @ 1..=255 => meta.ttl = Some(t as u8),
                _ => return Err(libc::EINVAL),
            },
            // -1 is the socket's own.
            (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) if data.len() == 4 => match int()? {
                -1 => meta.ttl = None,
                h @ 0..=255 => meta.ttl = Some(h as u8),
                _ => return Err(libc::EINVAL),
            },
            (libc::SOL_UDP, UDP_SEGMENT) if data.len() >= 2 => {
                meta.segment_size = Some(u16::from_ne_bytes([data[0], data[1]]) as usize);
            }
            _ => return Err(libc::EINVAL),
        }
        at += align(len);
        if at > control.len() {
            break;
        }
    }
    Ok(meta)
}

/// The ECN codepoint of a TOS or traffic class (spate takes a send's
/// ECN from its control message, its DSCP from the socket's option).
fn ecn(tos: i32) -> CResult<Ecn> {
    if !(0..=255).contains(&tos) {
        return Err(libc::EINVAL);
    }
    Ok(match tos & 3 {
        0 => Ecn::NotEct,
        1 => Ecn::Ect1,
        2 => Ecn::Ect0,
        _ => Ecn::Ce,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_that_does_not_fit_is_cut_and_flagged() {
        let mut buf = [0u8; 24];
        let mut w = Writer::new(&mut buf);
        w.push(libc::IPPROTO_IP, libc::IP_TTL, &64i32.to_ne_bytes());
        assert_eq!((w.len(), w.truncated), (24, false));
        w.push(libc::IPPROTO_IP, libc::IP_TOS, &[1]);
        assert!(w.truncated);
        let mut small = [0u8; 8];
        let mut w = Writer::new(&mut small);
        w.push(libc::IPPROTO_IP, libc::IP_TTL, &64i32.to_ne_bytes());
        assert_eq!((w.len(), w.truncated), (0, true));
    }

    #[test]
    fn send_messages_parse_and_bad_ones_are_einval() {
        let mut buf = [0u8; 64];
        let mut w = Writer::new(&mut buf);
        w.push(libc::SOL_UDP, UDP_SEGMENT, &1200u16.to_ne_bytes());
        w.push(libc::IPPROTO_IP, libc::IP_TOS, &2i32.to_ne_bytes());
        let n = w.len();
        let m = to_send(&buf[..n]).unwrap();
        assert_eq!((m.segment_size, m.ecn), (Some(1200), Some(Ecn::Ect0)));
        let mut bad = buf;
        bad[..8].copy_from_slice(&400usize.to_ne_bytes());
        assert_eq!(to_send(&bad[..n]), Err(libc::EINVAL));
        let mut w = Writer::new(&mut buf);
        w.push(libc::SOL_SOCKET, libc::SCM_RIGHTS, &[0; 4]);
        let n = w.len();
        assert_eq!(to_send(&buf[..n]), Err(libc::EINVAL));
    }

    #[test]
    fn a_send_s_ttl_and_hop_limit_are_linux_s_ints() {
        let one = |level, kind, data: &[u8]| {
            let mut buf = [0u8; 32];
            let mut w = Writer::new(&mut buf);
            w.push(level, kind, data);
            let n = w.len();
            to_send(&buf[..n]).map(|m| m.ttl)
        };
        let (ip, v6) = (libc::IPPROTO_IP, libc::IPPROTO_IPV6);
        assert_eq!(one(ip, libc::IP_TTL, &9i32.to_ne_bytes()), Ok(Some(9)));
        for bad in [0i32, 256, -1] {
            assert_eq!(one(ip, libc::IP_TTL, &bad.to_ne_bytes()), Err(libc::EINVAL), "TTL {bad}");
        }
        assert_eq!(one(ip, libc::IP_TTL, &[9]), Err(libc::EINVAL), "not an int");
        assert_eq!(one(v6, libc::IPV6_HOPLIMIT, &0i32.to_ne_bytes()), Ok(Some(0)));
        assert_eq!(one(v6, libc::IPV6_HOPLIMIT, &(-1i32).to_ne_bytes()), Ok(None), "the socket's own");
        assert_eq!(one(v6, libc::IPV6_HOPLIMIT, &(-2i32).to_ne_bytes()), Err(libc::EINVAL));
    }
}

//! Sends longer than one datagram: UDP GSO segments, and IP fragments for
//! datagrams longer than the path MTU.

use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::Ordering;

use super::GSO_MAX_SEGMENTS;
use super::path::Path;
use crate::datagram::{SendBuf, SendMeta};
use crate::hdr::{MAX_UDP_PAYLOAD_V4, MAX_UDP_PAYLOAD_V6, UdpHeaders, push_udp_ip};
use crate::shared::{TxPacket, mark_mcast_loop};
use crate::socket::{UdpSocket, errno};
use crate::stats::Counter;
use crate::wire::{ipv4, ipv6, udp};

impl UdpSocket {
    /// Sends `buf` to `addr` as datagrams of `segment` bytes each (the last
    /// one possibly shorter), in one call: Linux's UDP GSO (`UDP_SEGMENT`),
    /// segmented in software. Errors as Linux gives them: a segment that
    /// does not fit the path MTU with its headers is `EMSGSIZE`, as is a
    /// payload longer than one IP datagram could carry; a segment size of
    /// 0, or more than [`GSO_MAX_SEGMENTS`] segments, is `EINVAL`. Returns
    /// `buf.len()`.
    pub fn send_to_segmented(&self, buf: &[u8], segment: usize, addr: impl ToSocketAddrs) -> io::Result<usize> {
        let addr = addr.to_socket_addrs()?.next().ok_or_else(|| errno(libc::EINVAL, "no address"))?;
        let dst = self.destination(addr)?;
        self.send_segments(buf, segment, dst, None)
    }

    /// Sets a segment size for every later `send` and `send_to` longer than
    /// it (Linux's `UDP_SEGMENT` socket option); `None` turns it off.
    pub fn set_segment_size(&self, segment: Option<u16>) -> io::Result<()> {
        if segment == Some(0) {
            return Err(errno(libc::EINVAL, "segment size 0"));
        }
        self.inner.gso_size.store(segment.unwrap_or(0) as u32, Ordering::Relaxed);
        Ok(())
    }

    /// The segment size set with [`set_segment_size`](Self::set_segment_size).
    pub fn segment_size(&self) -> io::Result<Option<u16>> {
        Ok(match self.inner.gso_size.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n as u16),
        })
    }

    pub(super) fn send_segments(
        &self,
        buf: &[u8],
        segment: usize,
        dst: SocketAddr,
        meta: Option<&SendMeta>,
    ) -> io::Result<usize> {
        crate::app_thread::enter();
        self.pending_error()?;
        if segment == 0 {
            return Err(errno(libc::EINVAL, "segment size 0"));
        }
        let shared = self.shared();
        let v4 = dst.is_ipv4();
        let path = self.path_for(dst, meta)?;
        let (port, connected, route) = (path.port, path.peer == Some(dst), path.route);
        let ip_hdr = if v4 { ipv4::HEADER_LEN } else { ipv6::HEADER_LEN };
        let max_payload = if v4 { MAX_UDP_PAYLOAD_V4 } else { MAX_UDP_PAYLOAD_V6 };
        if segment + udp::HEADER_LEN + ip_hdr > route.mtu as usize {
            return Err(errno(libc::EMSGSIZE, "segment larger than the path MTU allows"));
        }
        if buf.len() > max_payload {
            return Err(errno(libc::EMSGSIZE, "longer than one IP datagram"));
        }
        let count = buf.len().div_ceil(segment).max(1);
        if count > GSO_MAX_SEGMENTS {
            return Err(errno(libc::EINVAL, "more segments than UDP GSO allows"));
        }
        // Every mbuf first: all the segments go, or none.
        let mut mbufs: spate_dpdk::Burst<GSO_MAX_SEGMENTS> = spate_dpdk::Burst::new();
        shared.pool.alloc_bulk(&mut mbufs, count).map_err(|_| self.mem_error())?;
        let src = SocketAddr::new(route.src, port);
        let first_ident = match src.ip() {
            IpAddr::V4(_) if connected => self.core.ident.fetch_add(count as u32, Ordering::Relaxed) as u16,
            _ => 0,
        };
        for (i, mut m) in mbufs.drain().enumerate() {
            let chunk = &buf[(i * segment).min(buf.len())..((i + 1) * segment).min(buf.len())];
            let room = m.append(chunk.len()).map_err(|_| errno(libc::EMSGSIZE, "segment longer than one mbuf"))?;
            room.copy_from_slice(chunk);
            let ident = if connected { first_ident.wrapping_add(i as u16) } else { 0 };
            let (ttl, tos) = (path.ttl, path.tos);
            let headers =
                UdpHeaders { src, dst, ident, dont_frag: true, ttl, tos, zero_checksum: false, known_checksum: None };
            push_udp_ip(&mut m, &headers, route.offload).map_err(|e| errno(libc::EMSGSIZE, e))?;
            mark_mcast_loop(&mut m, path.mcast_loop);
            let pkt = TxPacket { mbuf: m, iface: route.iface, next_hop: route.next_hop, datagram: true };
            if let Err(e) = self.submit(pkt, v4) {
                if i == 0 {
                    return Err(e);
                }
                // Some segments went: the rest are lost (counted in
                // SndbufErrors by the refusal), as on a lossy path; a
                // retry would send the first ones twice.
                return Ok(buf.len());
            }
        }
        // Once per call, from the sending thread (an atomic add each on
        // the shared block, amortised over up to 128 segments).
        let stats = shared.stats.shared();
        stats.add_shared(Counter::GsoSends, 1);
        stats.add_shared(Counter::GsoSegments, count as u64);
        Ok(buf.len())
    }

    /// Sends a datagram longer than the path as fragments, copied out of
    /// its buffer.
    #[cold]
    pub(super) fn send_long(&self, buf: SendBuf, dst: SocketAddr, path: &Path) -> io::Result<()> {
        let len = buf.len();
        self.send_fragments(buf.mbuf.segment_data(), len, dst, path)
    }

    /// Sends a datagram larger than the path MTU as IP fragments (unless
    /// the socket asked for don't-fragment: then `EMSGSIZE`, as Linux's
    /// `IP_PMTUDISC_DO`). IPv4 fragments carry an ID from the generator
    /// (they are not atomic); IPv6 ones a random 32-bit identification.
    pub(super) fn send_fragments<'a>(
        &self,
        parts: impl Iterator<Item = &'a [u8]> + Clone,
        len: usize,
        dst: SocketAddr,
        path: &Path,
    ) -> io::Result<()> {
        let (route, local_port) = (path.route, path.port);
        let shared = self.shared();
        let v4 = dst.is_ipv4();
        let (fails, oks, creates) = if v4 {
            (Counter::IpFragFails, Counter::IpFragOKs, Counter::IpFragCreates)
        } else {
            (Counter::Ip6FragFails, Counter::Ip6FragOKs, Counter::Ip6FragCreates)
        };
        let max = if v4 { MAX_UDP_PAYLOAD_V4 } else { MAX_UDP_PAYLOAD_V6 };
        if len > max {
            return Err(errno(libc::EMSGSIZE, "longer than one IP datagram"));
        }
        if self.inner.dont_fragment.load(Ordering::Relaxed) {
            shared.stats.shared().add_shared(fails, 1);
            return Err(errno(libc::EMSGSIZE, "larger than the path MTU and don't-fragment is set"));
        }
        let src = SocketAddr::new(route.src, local_port);
        let ident = match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => shared.ip_id.reserve(s, d, crate::wire::ip_proto::UDP, 1) as u32,
            _ => crate::ip_id::random_u32(),
        };
        let plan = crate::frag::fragment::Plan {
            src,
            dst,
            mtu: route.mtu as usize,
            ident,
            ttl: path.ttl,
            tos: path.tos,
            offload_ip_checksum: route.offload,
        };
        let mut out: spate_dpdk::Burst<{ crate::frag::fragment::MAX_FRAGMENTS }> = spate_dpdk::Burst::new();
        let n = crate::frag::fragment::fragment_udp(&shared.pool, &plan, parts, len, &mut out).map_err(|e| {
            shared.stats.shared().add_shared(fails, 1);
            match e {
                crate::frag::fragment::FragError::NoMbufs => self.mem_error(),
                crate::frag::fragment::FragError::TooLong => {
                    errno(libc::EMSGSIZE, "cannot be fragmented to the path MTU")
                }
            }
        })?;
        for (i, mut m) in out.drain().enumerate() {
            mark_mcast_loop(&mut m, path.mcast_loop);
            let pkt = TxPacket { mbuf: m, iface: route.iface, next_hop: route.next_hop, datagram: i == 0 };
            if let Err(e) = self.submit(pkt, v4) {
                if i == 0 {
                    return Err(e);
                }
                // A fragment went: the datagram is lost at the receiver
                // (the refusal counted), not sent again with a new ID.
                break;
            }
        }
        let stats = shared.stats.shared();
        stats.add_shared(oks, 1);
        stats.add_shared(creates, n as u64);
        Ok(())
    }

    /// Asks that datagrams never be fragmented (Linux's `IP_MTU_DISCOVER`
    /// with `IP_PMTUDISC_DO`, `IPV6_DONTFRAG`): a send larger than the
    /// path MTU fails with `EMSGSIZE`. Off by default: larger datagrams are
    /// fragmented, smaller ones go with DF set so routers report the path
    /// MTU (`IP_PMTUDISC_WANT`).
    pub fn set_dont_fragment(&self, on: bool) -> io::Result<()> {
        self.inner.dont_fragment.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// Whether don't-fragment is asked for.
    pub fn dont_fragment(&self) -> io::Result<bool> {
        Ok(self.inner.dont_fragment.load(Ordering::Relaxed))
    }
}

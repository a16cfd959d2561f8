//! Batched sends (`send_batch_to`) and replies (`send_replies`): headers
//! written per datagram, the destination's path kept from the last one.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::Ordering;

use super::path::{Path, Path4};
use super::submit::Outgoing;
use crate::datagram::SendBuf;
use crate::hdr::{Udp4, UdpHeaders, push_udp_ip, push_udp_ipv4};
use crate::lookup::Family;
use crate::shared::{TxPacket, mark_mcast_loop};
use crate::socket::{DEFAULT_TTL, UdpSocket, errno};
use crate::wire::{ipv4, ipv6, udp};

impl UdpSocket {
    /// Sends each buffer to its address, as `sendmmsg` does: one call for
    /// a batch, its datagrams handed to the transmit path together, the
    /// route looked up once for consecutive datagrams to one place. Each
    /// datagram stands alone: one that cannot be sent (a bad address, a
    /// full queue) is dropped and counted as its own send would count it,
    /// and the rest still go. Returns how many were sent, or, when none
    /// could be, the first error.
    pub fn send_batch_to<I>(&self, msgs: I) -> io::Result<usize>
    where
        I: IntoIterator<Item = (SendBuf, SocketAddr)>,
    {
        self.pending_error()?;
        let mut batch = Batch::new();
        for (buf, addr) in msgs {
            // IPv4, the common case (IPv4-mapped on an IPv6 socket too),
            // with its addresses by value.
            let to = match addr {
                SocketAddr::V4(d) => Ok(d),
                SocketAddr::V6(a) if self.family == Family::V6 => {
                    let (o, port) = (a.ip().octets(), a.port());
                    match o[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
                        true => Ok(SocketAddrV4::new(Ipv4Addr::new(o[12], o[13], o[14], o[15]), port)),
                        false => Err(addr),
                    }
                }
                SocketAddr::V6(_) => Err(addr),
            };
            self.batch_one(&mut batch, buf, to);
        }
        self.batch_end(&mut batch)
    }

    /// Sends each buffer back to the sender of the datagram it was made
    /// from ([`Datagram::into_send_buf`](crate::Datagram::into_send_buf)),
    /// from this socket, as [`send_batch_to`](Self::send_batch_to) sends
    /// each to its address: a service's replies, the destination read
    /// from the request's headers in the buffer's headroom instead of
    /// passed as a `SocketAddr`. A buffer not made from a received
    /// datagram fails on its own with `EDESTADDRREQ`; one made from a
    /// coalesced datagram (UDP GRO) goes back as one datagram, as
    /// `send_batch_to` would send it. Returns how many were sent, or, when
    /// none could be, the first error.
    #[inline(always)]
    pub fn send_replies<I>(&self, bufs: I) -> io::Result<usize>
    where
        I: IntoIterator<Item = SendBuf>,
    {
        self.pending_error()?;
        let mut batch = Batch::new();
        for buf in bufs {
            match buf.reply_to() {
                Some(to) => self.batch_one(&mut batch, buf, to),
                None => {
                    batch.first_error.get_or_insert(errno(libc::EDESTADDRREQ, "not made from a received datagram"));
                }
            }
        }
        self.batch_end(&mut batch)
    }

    /// One datagram of a batch send to `to` (an IPv4 destination by
    /// value, or any): staged, or sent as fragments after what was staged
    /// before it; a failure kept as the batch's first error.
    #[inline(always)]
    pub(super) fn batch_one(&self, b: &mut Batch, buf: SendBuf, to: Result<SocketAddrV4, SocketAddr>) {
        let (buf, addr) = match to {
            Ok(d) => match self.prepare_v4(buf, d, &mut b.last4) {
                Ok(Ok(pkt)) => {
                    b.staged.push(pkt);
                    if b.staged.is_full() {
                        b.sent += self.submit_outgoing(&mut b.staged, &mut b.first_error);
                    }
                    return;
                }
                Ok(Err(buf)) => (buf, SocketAddr::V4(d)),
                Err(e) => {
                    b.first_error.get_or_insert(e);
                    return;
                }
            },
            Err(addr) => (buf, addr),
        };
        let step = self.destination(addr).and_then(|dst| {
            let path = match b.last {
                Some((ip, p)) if ip == dst.ip() => p,
                _ => {
                    let p = self.path_to(dst)?;
                    b.last = Some((dst.ip(), p));
                    p
                }
            };
            match self.prepare(buf, dst, path)? {
                Prepared::Packet(pkt) => b.staged.push(pkt),
                Prepared::TooLong(buf, path) => {
                    // After what was staged before it, in order.
                    b.sent += self.submit_outgoing(&mut b.staged, &mut b.first_error);
                    self.send_long(buf, dst, &path)?;
                    b.sent += 1;
                }
            }
            Ok(())
        });
        if let Err(e) = step {
            b.first_error.get_or_insert(e);
        }
        if b.staged.is_full() {
            b.sent += self.submit_outgoing(&mut b.staged, &mut b.first_error);
        }
    }

    /// Hands over what is left of a batch send; how many went, or the
    /// first error when none did.
    #[inline(always)]
    pub(super) fn batch_end(&self, b: &mut Batch) -> io::Result<usize> {
        b.sent += self.submit_outgoing(&mut b.staged, &mut b.first_error);
        match b.first_error.take() {
            Some(e) if b.sent == 0 => Err(e),
            _ => Ok(b.sent),
        }
    }

    /// [`prepare`](Self::prepare) for an IPv4 destination, the addresses
    /// kept by value; `last` keeps the path of the batch's last IPv4
    /// destination. A buffer comes back (`Ok(Err)`) for the general path:
    /// longer than the path MTU, or a socket whose source is not IPv4.
    #[inline(always)]
    pub(super) fn prepare_v4(
        &self,
        mut buf: SendBuf,
        d: SocketAddrV4,
        last: &mut Option<Path4>,
    ) -> io::Result<Result<TxPacket, SendBuf>> {
        self.v4_destination(d)?;
        let path = match *last {
            Some(p) if p.dst == *d.ip() => p,
            _ => {
                let p = self.path_to(SocketAddr::V4(d))?;
                let (IpAddr::V4(src), IpAddr::V4(next_hop)) = (p.route.src, p.route.next_hop) else {
                    return Ok(Err(buf));
                };
                let peer = match p.peer {
                    Some(SocketAddr::V4(a)) => Some(a),
                    _ => None,
                };
                let (iface, mtu, ttl, tos) = (p.route.iface, p.route.mtu, p.ttl, p.tos);
                let offload = p.route.offload;
                let plain = ttl == DEFAULT_TTL && tos == 0;
                *last = Some(Path4 {
                    dst: *d.ip(),
                    src,
                    port: p.port,
                    peer,
                    iface,
                    mtu,
                    next_hop,
                    ttl,
                    tos,
                    offload,
                    plain,
                    mcast_loop: p.mcast_loop,
                });
                last.expect("just set")
            }
        };
        if buf.len() + udp::HEADER_LEN + ipv4::HEADER_LEN > path.mtu as usize {
            return Ok(Err(buf));
        }
        let src = SocketAddrV4::new(path.src, path.port);
        // As `prepare`: connected sockets count IDs, others send 0.
        let ident = if path.peer == Some(d) { self.core.ident.fetch_add(1, Ordering::Relaxed) as u16 } else { 0 };
        buf.mbuf.set_ol_flags(0);
        let known = buf.reply_checksum_v4(src, d);
        let offload = path.offload;
        // Two copies of the header writer: with Linux's defaults, the TTL
        // and TOS are constants folded into the header and its checksum
        // (the common case, 20 instructions less per datagram).
        let pushed = if path.plain {
            push_udp_ipv4(&mut buf.mbuf, src, d, Udp4::datagram(ident, DEFAULT_TTL, 0), known, offload)
        } else {
            push_udp_ipv4(&mut buf.mbuf, src, d, Udp4::datagram(ident, path.ttl, path.tos), known, offload)
        };
        pushed.map_err(|e| errno(libc::EMSGSIZE, e))?;
        mark_mcast_loop(&mut buf.mbuf, path.mcast_loop);
        Ok(Ok(TxPacket { mbuf: buf.mbuf, iface: path.iface, next_hop: IpAddr::V4(path.next_hop), datagram: true }))
    }

    /// The packet for one send to `dst` by `route`: headers written in
    /// front of the payload. A datagram longer than the path comes back,
    /// to go as fragments.
    #[inline(always)]
    pub(super) fn prepare(&self, mut buf: SendBuf, dst: SocketAddr, path: Path) -> io::Result<Prepared> {
        let v4 = dst.is_ipv4();
        let ip_hdr = if v4 { ipv4::HEADER_LEN } else { ipv6::HEADER_LEN };
        let (route, connected) = (path.route, path.peer == Some(dst));
        if buf.len() + udp::HEADER_LEN + ip_hdr > route.mtu as usize {
            return Ok(Prepared::TooLong(buf, path));
        }
        let src = SocketAddr::new(route.src, path.port);
        // Linux: connected sockets count on their own; unconnected
        // datagrams that may not be fragmented carry 0 (RFC 6864).
        let ident = if v4 && connected { self.core.ident.fetch_add(1, Ordering::Relaxed) as u16 } else { 0 };
        buf.mbuf.set_ol_flags(0);
        let known_checksum = buf.reply_checksum(&src, &dst);
        let (ttl, tos) = (path.ttl, path.tos);
        let headers = UdpHeaders { src, dst, ident, dont_frag: true, ttl, tos, zero_checksum: false, known_checksum };
        push_udp_ip(&mut buf.mbuf, &headers, route.offload).map_err(|e| errno(libc::EMSGSIZE, e))?;
        mark_mcast_loop(&mut buf.mbuf, path.mcast_loop);
        Ok(Prepared::Packet(TxPacket { mbuf: buf.mbuf, iface: route.iface, next_hop: route.next_hop, datagram: true }))
    }
}

/// What [`UdpSocket::prepare`] made of a send.
pub(super) enum Prepared {
    /// Headers written: ready for the transmit path.
    Packet(TxPacket),
    /// Longer than the path MTU: to be fragmented.
    TooLong(SendBuf, Path),
}

/// A batch send under way: what is staged, what went, the first error,
/// and the paths of its last destinations.
pub(super) struct Batch {
    pub(super) staged: Outgoing,
    pub(super) sent: usize,
    pub(super) first_error: Option<io::Error>,
    pub(super) last: Option<(IpAddr, Path)>,
    pub(super) last4: Option<Path4>,
}

impl Batch {
    pub(super) fn new() -> Batch {
        Batch { staged: Outgoing::new(), sent: 0, first_error: None, last: None, last4: None }
    }
}

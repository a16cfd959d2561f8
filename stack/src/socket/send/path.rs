//! Where a socket's sends go: the route, the source address, and what
//! the sends to one address share ([`Path`], [`Path4`] for IPv4 batches).

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};

use crate::datagram::SendMeta;
use crate::socket::{UdpSocket, errno};
use crate::stats::Counter;

impl UdpSocket {
    /// The path of one send: the socket's, or what `meta` makes of it.
    pub(super) fn path_for(&self, dst: SocketAddr, meta: Option<&SendMeta>) -> io::Result<Path> {
        let Some(meta) = meta else { return self.path_to(dst) };
        let src = match meta.src_ip {
            None => None,
            Some(ip) if ip.is_unspecified() => None,
            Some(ip) => {
                let ip = crate::addr::normalize(SocketAddr::new(ip, 0)).ip();
                if ip.is_ipv4() != dst.is_ipv4() {
                    return Err(errno(libc::EINVAL, "source and destination of different families"));
                }
                if !self.shared().is_local(&ip) {
                    return Err(errno(libc::EADDRNOTAVAIL, "the source is not an address of this stack"));
                }
                Some(ip)
            }
        };
        let mut path = self.path_from(dst, src)?;
        if let Some(ecn) = meta.ecn {
            path.tos = (path.tos & !3) | ecn as u8;
        }
        match meta.ttl {
            Some(0) if dst.is_ipv4() => return Err(errno(libc::EINVAL, "a TTL of 0")),
            Some(ttl) => path.ttl = ttl,
            None => {}
        }
        Ok(path)
    }

    /// The socket's local port and connected peer, and the route to
    /// `dst`'s address from its bound address (the last send's when it went
    /// to the same address from the same one), under one lock; the path MTU
    /// applied; the socket's TTL and TOS for the family. All of it depends
    /// on `dst`'s address alone, not its port. Inlined: out of line, its
    /// result goes through memory on every send.
    #[inline(always)]
    pub(super) fn path_to(&self, dst: SocketAddr) -> io::Result<Path> {
        self.path_from(dst, None)
    }

    /// [`path_to`](Self::path_to) from source address `src` (one of the
    /// stack's, of `dst`'s family) instead of the bound one.
    #[inline(always)]
    pub(super) fn path_from(&self, dst: SocketAddr, src: Option<IpAddr>) -> io::Result<Path> {
        let shared = self.shared();
        let mut st = self.lock_state();
        if st.shut_write {
            return Err(errno(libc::EPIPE, "shut down for writing"));
        }
        let local = src.unwrap_or(st.local.ip());
        let net_gen = shared.net_generation();
        let mut route = match st.last_route {
            Some((d, l, r)) if d == dst.ip() && l == local && st.route_gen == net_gen => r,
            _ => {
                let net = shared.net();
                let bound_ip = crate::socket::bound_source(local).filter(|ip| ip.is_ipv4() == dst.is_ipv4());
                crate::socket::check_source(&net, bound_ip)?;
                let found = net.routes.socket_route(&net.ifaces, &dst.ip(), bound_ip.as_ref(), st.ip.mcast_if);
                let Some(r) = found else {
                    let c = if dst.is_ipv4() { Counter::IpOutNoRoutes } else { Counter::Ip6OutNoRoutes };
                    shared.stats.shared().add_shared(c, 1);
                    return Err(errno(libc::ENETUNREACH, "no route"));
                };
                crate::socket::check_broadcast(&net, &dst.ip(), &r, st.ip.broadcast)?;
                st.last_route = Some((dst.ip(), local, r));
                st.route_gen = net_gen;
                r
            }
        };
        if let Some(mtu) = shared.pmtu.get(&dst.ip()) {
            route.mtu = route.mtu.min(mtu);
        }
        let (mut ttl, tos) = st.ip.for_family(dst.is_ipv4());
        let mut mcast_loop = false;
        if dst.ip().is_multicast() {
            (ttl, mcast_loop) = match dst.is_ipv4() {
                true => (st.ip.mcast_ttl, st.ip.mcast_loop_v4),
                false => (st.ip.mcast_hops, st.ip.mcast_loop_v6),
            };
        }
        Ok(Path { port: st.local.port(), peer: st.peer, route, ttl, tos, mcast_loop })
    }
}

/// Where a socket's sends to one address go (see [`UdpSocket::path_to`]).
#[derive(Clone, Copy)]
pub(super) struct Path {
    pub(super) port: u16,
    pub(super) peer: Option<SocketAddr>,
    pub(super) route: crate::route::Route,
    /// TTL or hop limit.
    pub(super) ttl: u8,
    /// TOS or traffic class.
    pub(super) tos: u8,
    /// To a group, looped back to local members too.
    pub(super) mcast_loop: bool,
}

/// What a batch's datagrams to one IPv4 destination share, compact (a
/// [`Path`] is four times its size, and was copied for every batch).
#[derive(Clone, Copy)]
pub(super) struct Path4 {
    pub(super) dst: Ipv4Addr,
    pub(super) src: Ipv4Addr,
    pub(super) port: u16,
    /// The connected peer, when it is an IPv4 one.
    pub(super) peer: Option<SocketAddrV4>,
    pub(super) iface: u16,
    pub(super) mtu: u16,
    pub(super) next_hop: Ipv4Addr,
    pub(super) ttl: u8,
    pub(super) tos: u8,
    /// The interface computes the checksums.
    pub(super) offload: bool,
    /// TTL and TOS are Linux's defaults.
    pub(super) plain: bool,
    /// To a group, looped back to local members too.
    pub(super) mcast_loop: bool,
}

//! IPv6 neighbour discovery (RFC 4861): validating and answering
//! solicitations, learning from advertisements, and the messages spate
//! sends. No I/O here.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv6Addr};

use super::{Learn, NeighTable};
use crate::iface::Interface;
use crate::time::Instant;
use crate::wire::icmpv6::{NaFlags, Repr};
use crate::wire::{MacAddr, ipv6};

/// Why a neighbour-discovery message was refused (RFC 4861 7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invalid {
    /// Hop limit other than 255: it crossed a router.
    HopLimit,
    /// A multicast target.
    MulticastTarget,
    /// A duplicate-address probe with a source link-layer option, or not
    /// sent to a solicited-node group.
    BadProbe,
    /// A solicited advertisement sent to a multicast group.
    SolicitedMulticast,
}

/// An ND message to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outgoing {
    /// The ICMPv6 message.
    pub msg: Repr<'static>,
    /// IPv6 source.
    pub src: Ipv6Addr,
    /// IPv6 destination.
    pub dst: Ipv6Addr,
    /// Ethernet destination.
    pub dst_mac: MacAddr,
}

/// What a received ND message asks of the stack.
#[derive(Debug)]
pub struct Handled<P> {
    /// A message to send back.
    pub reply: Option<Outgoing>,
    /// Packets that waited for the neighbour.
    pub released: Option<(MacAddr, VecDeque<P>)>,
}

/// Everything about a received ND message the handlers need.
#[derive(Debug, Clone, Copy)]
pub struct Received<'a> {
    /// IPv6 source.
    pub src: Ipv6Addr,
    /// IPv6 destination.
    pub dst: Ipv6Addr,
    /// IPv6 hop limit.
    pub hop_limit: u8,
    /// Ethernet source.
    pub eth_src: MacAddr,
    /// The message.
    pub msg: &'a Repr<'a>,
}

/// Handles a solicitation, advertisement or router advertisement.
pub fn handle<P>(
    table: &NeighTable<P>,
    now: Instant,
    ifc: &Interface,
    rx: &Received<'_>,
) -> Result<Handled<P>, Invalid> {
    if rx.hop_limit != 255 {
        return Err(Invalid::HopLimit);
    }
    let mut out = Handled { reply: None, released: None };
    match *rx.msg {
        Repr::NeighborSolicit { target, source_ll } => {
            if target.is_multicast() {
                return Err(Invalid::MulticastTarget);
            }
            let dad = rx.src.is_unspecified();
            if dad && (source_ll.is_some() || !ipv6::is_solicited_node_of(&rx.dst, &target)) {
                return Err(Invalid::BadProbe);
            }
            if !ifc.has_ipv6(&target) {
                return Ok(out);
            }
            // As for ARP: a source off the link's prefixes is answered but
            // not learnt.
            let on_link = ifc.on_link(&IpAddr::V6(rx.src));
            if let (false, true, Some(mac)) = (dad, on_link, source_ll) {
                out.released = table.learn(now, (ifc.index, IpAddr::V6(rx.src)), mac, Learn::Heard);
            }
            let (dst, dst_mac, solicited) = if dad {
                (ipv6::ALL_NODES, MacAddr::ipv6_multicast(&ipv6::ALL_NODES), false)
            } else {
                (rx.src, source_ll.unwrap_or(rx.eth_src), true)
            };
            out.reply = Some(Outgoing {
                msg: Repr::NeighborAdvert {
                    flags: NaFlags { router: false, solicited, override_: true },
                    target,
                    target_ll: Some(ifc.mac),
                },
                src: target,
                dst,
                dst_mac,
            });
        }
        Repr::NeighborAdvert { flags, target, target_ll } => {
            if target.is_multicast() {
                return Err(Invalid::MulticastTarget);
            }
            if flags.solicited && rx.dst.is_multicast() {
                return Err(Invalid::SolicitedMulticast);
            }
            let mac = target_ll.unwrap_or(rx.eth_src);
            let how = if flags.solicited { Learn::Confirmed } else { Learn::Announced };
            out.released = table.learn(now, (ifc.index, IpAddr::V6(target)), mac, how);
        }
        Repr::RouterAdvert(ra) => {
            // RFC 4861 sends an RA from a link-local address.
            if let (true, Some(mac)) = (crate::config::is_link_local(&rx.src), ra.source_ll) {
                out.released = table.learn(now, (ifc.index, IpAddr::V6(rx.src)), mac, Learn::Heard);
            }
        }
        _ => {}
    }
    Ok(out)
}

/// A solicitation for `target`: to its solicited-node group, or unicast to
/// `probe_mac` when confirming a stale entry.
pub fn solicitation(ifc: &Interface, target: Ipv6Addr, probe_mac: Option<MacAddr>) -> Option<Outgoing> {
    let src = match ifc.source_for(&IpAddr::V6(target))? {
        IpAddr::V6(a) => a,
        IpAddr::V4(_) => return None,
    };
    let (dst, dst_mac) = match probe_mac {
        Some(mac) => (target, mac),
        None => {
            let g = ipv6::solicited_node(&target);
            (g, MacAddr::ipv6_multicast(&g))
        }
    };
    Some(Outgoing { msg: Repr::NeighborSolicit { target, source_ll: Some(ifc.mac) }, src, dst, dst_mac })
}

/// An unsolicited advertisement of `addr` to all nodes.
pub fn unsolicited_advert(ifc: &Interface, addr: Ipv6Addr) -> Outgoing {
    Outgoing {
        msg: Repr::NeighborAdvert {
            flags: NaFlags { router: false, solicited: false, override_: true },
            target: addr,
            target_ll: Some(ifc.mac),
        },
        src: addr,
        dst: ipv6::ALL_NODES,
        dst_mac: MacAddr::ipv6_multicast(&ipv6::ALL_NODES),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NeighborConfig;
    use crate::wire::fixtures::{NA, NS, hex};
    use crate::wire::icmpv6::Packet;

    fn iface() -> Interface {
        crate::neigh::arp::tests::iface()
    }

    fn parse(frame: &[u8]) -> (Repr<'_>, Ipv6Addr, Ipv6Addr, u8) {
        let ip = ipv6::Packet::new_checked(&frame[14..]).unwrap();
        let (s, d, h) = (ip.src(), ip.dst(), ip.hop_limit());
        (Repr::parse(&Packet::new_checked(&frame[54..]).unwrap(), &s, &d, false).unwrap(), s, d, h)
    }

    #[test]
    fn answers_the_kernels_solicitation_as_the_kernel_did() {
        let table = NeighTable::<u8>::new(NeighborConfig::default());
        let f = hex(NS);
        let (msg, src, dst, hop_limit) = parse(&f);
        let eth_src = MacAddr(f[6..12].try_into().unwrap());
        let rx = Received { src, dst, hop_limit, eth_src, msg: &msg };
        let h = handle(&table, Instant(0), &iface(), &rx).unwrap();
        let r = h.reply.unwrap();
        let mut out = vec![0u8; r.msg.buffer_len()];
        r.msg.emit(&mut out, &r.src, &r.dst);
        assert_eq!(out[..], hex(NA)[54..], "the same NA Linux sent");
        assert_eq!(r.dst_mac, eth_src);
        assert_eq!(table.peek((0, IpAddr::V6(src))), Some(eth_src));
    }

    #[test]
    fn validation() {
        let table = NeighTable::<u8>::new(NeighborConfig::default());
        let f = hex(NS);
        let (msg, src, dst, _) = parse(&f);
        let rx = Received { src, dst, hop_limit: 64, eth_src: MacAddr::ZERO, msg: &msg };
        assert_eq!(handle(&table, Instant(0), &iface(), &rx).unwrap_err(), Invalid::HopLimit);
        let dad = Received { src: Ipv6Addr::UNSPECIFIED, dst, hop_limit: 255, eth_src: MacAddr::ZERO, msg: &msg };
        assert_eq!(handle(&table, Instant(0), &iface(), &dad).unwrap_err(), Invalid::BadProbe, "DAD without SLLA only");
        let m = Repr::NeighborSolicit { target: "ff02::1".parse().unwrap(), source_ll: None };
        let rx = Received { src, dst, hop_limit: 255, eth_src: MacAddr::ZERO, msg: &m };
        assert_eq!(handle(&table, Instant(0), &iface(), &rx).unwrap_err(), Invalid::MulticastTarget);
        let other = Repr::NeighborSolicit { target: "fd00::99".parse().unwrap(), source_ll: None };
        let rx = Received { src, dst, hop_limit: 255, eth_src: MacAddr::ZERO, msg: &other };
        assert!(handle(&table, Instant(0), &iface(), &rx).unwrap().reply.is_none(), "not our address");
    }

    #[test]
    fn sources_off_the_link_are_answered_but_not_learnt() {
        let table = NeighTable::<u8>::new(NeighborConfig::default());
        let f = hex(NS);
        let (msg, _, dst, hop_limit) = parse(&f);
        let src: Ipv6Addr = "2001:db8::7".parse().unwrap();
        let rx = Received { src, dst, hop_limit, eth_src: MacAddr(f[6..12].try_into().unwrap()), msg: &msg };
        let h = handle(&table, Instant(0), &iface(), &rx).unwrap();
        assert!(h.reply.is_some_and(|r| r.dst == src));
        assert!(table.is_empty(), "an off-link source is not a neighbour");
    }

    #[test]
    fn duplicate_address_probes_get_a_multicast_answer() {
        let table = NeighTable::<u8>::new(NeighborConfig::default());
        let me: Ipv6Addr = "fd00::2".parse().unwrap();
        let m = Repr::NeighborSolicit { target: me, source_ll: None };
        let rx = Received {
            src: Ipv6Addr::UNSPECIFIED,
            dst: ipv6::solicited_node(&me),
            hop_limit: 255,
            eth_src: MacAddr::ZERO,
            msg: &m,
        };
        let r = handle(&table, Instant(0), &iface(), &rx).unwrap().reply.unwrap();
        assert_eq!(r.dst, ipv6::ALL_NODES);
        assert!(matches!(r.msg, Repr::NeighborAdvert { flags: NaFlags { solicited: false, .. }, .. }));
    }

    #[test]
    fn solicitations() {
        let s = solicitation(&iface(), "fd00::1".parse().unwrap(), None).unwrap();
        assert_eq!(s.dst, "ff02::1:ff00:1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(s.dst_mac, MacAddr([0x33, 0x33, 0xff, 0, 0, 1]));
        let p = solicitation(&iface(), "fd00::1".parse().unwrap(), Some(MacAddr([2, 0, 0, 0, 0, 1]))).unwrap();
        assert_eq!(p.dst, "fd00::1".parse::<Ipv6Addr>().unwrap());
    }
}

//! ARP (RFC 826): answering requests for our addresses, learning senders,
//! and the requests spate sends. No I/O here: the caller sends what these
//! functions return.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr};

use super::{Learn, NeighTable};
use crate::iface::Interface;
use crate::time::Instant;
use crate::wire::MacAddr;
use crate::wire::arp::{Operation, Repr};

/// What an ARP packet asks of the stack.
#[derive(Debug)]
pub struct Handled<P> {
    /// A reply to send to `reply.target_mac`.
    pub reply: Option<Repr>,
    /// Packets that waited for the sender, now resolved.
    pub released: Option<(MacAddr, VecDeque<P>)>,
    /// Whether the packet was a request for one of our addresses.
    pub request_for_us: bool,
}

/// Handles a received ARP packet on `ifc`.
pub fn handle<P>(table: &NeighTable<P>, now: Instant, ifc: &Interface, arp: &Repr) -> Handled<P> {
    let for_us = ifc.has_ipv4(arp.target_ip);
    let key = (ifc.index, IpAddr::V4(arp.sender_ip));
    // Only a sender on one of the interface's prefixes is a neighbour: one
    // from elsewhere gets its answer but no entry (packets to it go by a
    // gateway), so requests from spoofed addresses off the link cannot
    // fill the table.
    let sender_valid = !arp.sender_ip.is_unspecified()
        && !arp.sender_ip.is_broadcast()
        && arp.sender_mac.is_unicast()
        && ifc.on_link(&key.1);
    let released = if !sender_valid {
        None
    } else if arp.operation == Operation::Reply && for_us {
        table.learn(now, key, arp.sender_mac, Learn::Confirmed)
    } else if for_us {
        table.learn(now, key, arp.sender_mac, Learn::Heard)
    } else {
        // Gratuitous ARP and traffic between others: update what we know.
        table.learn(now, key, arp.sender_mac, Learn::Announced)
    };
    let request_for_us = for_us && arp.operation == Operation::Request;
    // RFC 5227 probes (sender 0.0.0.0) for our address get an answer too:
    // that is how the prober learns the address is taken.
    let reply = request_for_us.then_some(Repr {
        operation: Operation::Reply,
        sender_mac: ifc.mac,
        sender_ip: arp.target_ip,
        target_mac: arp.sender_mac,
        target_ip: arp.sender_ip,
    });
    Handled { reply, released, request_for_us }
}

/// A request for `target`, broadcast, or unicast to `probe_mac` when
/// confirming a stale entry.
pub fn request(ifc: &Interface, target: Ipv4Addr, probe_mac: Option<MacAddr>) -> Option<Repr> {
    let sender_ip = match ifc.source_for(&IpAddr::V4(target))? {
        IpAddr::V4(a) => a,
        IpAddr::V6(_) => return None,
    };
    Some(Repr {
        operation: Operation::Request,
        sender_mac: ifc.mac,
        sender_ip,
        target_mac: probe_mac.unwrap_or(MacAddr::ZERO),
        target_ip: target,
    })
}

/// A gratuitous ARP announcing `ip` (a request with sender = target).
pub fn gratuitous(ifc: &Interface, ip: Ipv4Addr) -> Repr {
    Repr { operation: Operation::Request, sender_mac: ifc.mac, sender_ip: ip, target_mac: MacAddr::ZERO, target_ip: ip }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::NeighborConfig;
    use crate::wire::arp::Packet;
    use crate::wire::fixtures::{ARP_REQUEST, hex};

    pub(crate) fn iface() -> Interface {
        Interface::new(
            0,
            0,
            "t".into(),
            MacAddr([2, 0x53, 0x50, 0x41, 0x54, 0x45]),
            1500,
            None,
            &["198.18.0.2/24".parse().unwrap()],
            &["fd00::2/64".parse().unwrap()],
        )
    }

    #[test]
    fn answers_the_kernels_request_as_the_kernel_did() {
        let table = NeighTable::<u8>::new(NeighborConfig::default());
        let f = hex(ARP_REQUEST);
        let req = Repr::parse(&Packet::new_checked(&f[14..]).unwrap()).unwrap();
        let h = handle(&table, Instant(0), &iface(), &req);
        let reply = h.reply.expect("a reply");
        let mut out = [0u8; 28];
        reply.emit(&mut out);
        assert_eq!(out[..], hex(crate::wire::fixtures::ARP_REPLY)[14..]);
        assert!(h.request_for_us);
        assert_eq!(table.peek((0, "198.18.0.1".parse().unwrap())), Some(req.sender_mac), "sender learnt");
    }

    #[test]
    fn requests_for_others_are_not_answered() {
        let table = NeighTable::<u8>::new(NeighborConfig::default());
        let f = hex(ARP_REQUEST);
        let mut req = Repr::parse(&Packet::new_checked(&f[14..]).unwrap()).unwrap();
        req.target_ip = "198.18.0.77".parse().unwrap();
        let h = handle(&table, Instant(0), &iface(), &req);
        assert!(h.reply.is_none() && !h.request_for_us);
        assert!(table.is_empty(), "and strangers are not learnt");
    }

    #[test]
    fn senders_off_the_link_are_answered_but_not_learnt() {
        let table = NeighTable::<u8>::new(NeighborConfig::default());
        let f = hex(ARP_REQUEST);
        let mut req = Repr::parse(&Packet::new_checked(&f[14..]).unwrap()).unwrap();
        req.sender_ip = "203.0.113.7".parse().unwrap();
        let h = handle(&table, Instant(0), &iface(), &req);
        assert!(h.request_for_us && h.reply.is_some_and(|r| r.target_ip == req.sender_ip));
        assert!(table.is_empty(), "an off-link sender is not a neighbour");
    }

    #[test]
    fn our_requests() {
        let r = request(&iface(), "198.18.0.1".parse().unwrap(), None).unwrap();
        assert_eq!((r.sender_ip, r.target_mac), ("198.18.0.2".parse().unwrap(), MacAddr::ZERO));
        let g = gratuitous(&iface(), "198.18.0.2".parse().unwrap());
        assert_eq!(g.sender_ip, g.target_ip);
    }
}

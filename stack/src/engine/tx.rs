//! The transmit stage: neighbour resolution, Ethernet headers, bursts to
//! the port's TX queue (or the hand-off to the lcore owning it), and the
//! frames spate makes itself (ARP, neighbour discovery).

use std::net::IpAddr;

use spate_dpdk::Mbuf;

use super::Worker;
use crate::hdr::{ethertype_for, push_ethernet};
use crate::neigh::{Resolve, Solicit, arp as neigh_arp, nd};
use crate::shared::{BURST, Direct, LOOPED_MAX, MCAST_LOOP_MARK, TxPacket};
use crate::stats::Counter;
use crate::time::Instant;
use crate::wire::{MacAddr, ethernet, ip_proto, ipv6};

/// How often a full TX ring is retried before its frames are dropped.
const TX_RETRIES: usize = 16;

impl Worker<'_> {
    /// Sends an IP packet: Ethernet header from the neighbour cache, or a
    /// wait in the neighbour's queue while it is resolved.
    #[inline]
    pub(super) fn transmit(&mut self, pkt: TxPacket) {
        if let Some(mac) = self.memo.get(pkt.iface, &pkt.next_hop, self.now) {
            self.send_ip(pkt, mac);
            return;
        }
        if pkt.next_hop.is_multicast() {
            self.transmit_group(pkt);
            return;
        }
        let key = (pkt.iface, pkt.next_hop);
        match self.shared.neigh.resolve(self.now, key, pkt) {
            Resolve::Ready { mac, pkt, until, probe } => {
                if until > self.now {
                    self.memo.put(key.0, key.1, mac, until);
                }
                self.send_ip(pkt, mac);
                if let Some(s) = probe {
                    self.solicit(s);
                }
            }
            Resolve::Queued { solicit, dropped } => {
                self.inc(Counter::NeighQueued);
                if dropped.is_some() {
                    self.inc(Counter::NeighQueueDrops);
                }
                if let Some(s) = solicit {
                    self.solicit(s);
                }
            }
        }
    }

    /// Sends a packet to a group: to the group's MAC (no ARP or ND); a copy
    /// to this host's members first when its socket loops them back
    /// (`IP_MULTICAST_LOOP`) and the interface is in the group; with a TTL
    /// or hop limit of 0, only that copy, as Linux's `ip_mc_output`.
    #[cold]
    #[inline(never)]
    fn transmit_group(&mut self, pkt: TxPacket) {
        // A membership joined before the packet was sent holds for it (from
        // the inbox or the callback), as on Linux: a socket that joins a
        // group and then sends to it gets its copy back.
        self.sync_net();
        let group = pkt.next_hop;
        if pkt.mbuf.port() == MCAST_LOOP_MARK && self.net.mcast.iface_in(pkt.iface, &group) {
            self.loop_back(&pkt);
        }
        let hops_at = if group.is_ipv4() { 8 } else { 7 };
        if pkt.mbuf.data().get(hops_at) == Some(&0) {
            // IPv6 counts it (`ip6_finish_output2`), IPv4 does not.
            if group.is_ipv6() {
                self.inc(Counter::Ip6OutDiscards);
            }
            return;
        }
        self.inc(if group.is_ipv4() { Counter::IpExtOutMcastPkts } else { Counter::Ip6OutMcastPkts });
        self.send_ip(pkt, crate::mcast::report::group_mac(&group));
    }

    /// Queues a copy of `pkt` (an IP packet to a group) for this lcore's
    /// receive path, as a frame from the group's MAC interface it leaves
    /// by, its checksums taken as good (an offload may not have finished
    /// them). A copy the pool cannot give, or past [`LOOPED_MAX`], is not
    /// made, and counted.
    fn loop_back(&mut self, pkt: &TxPacket) {
        let v4 = pkt.next_hop.is_ipv4();
        let copy = match self.looped.len() < LOOPED_MAX {
            true => super::group::copy_packet(&self.shared.pool, &pkt.mbuf),
            false => None,
        };
        let Some(mut copy) = copy else {
            self.inc(if v4 { Counter::IpOutDiscards } else { Counter::Ip6OutDiscards });
            return;
        };
        let ifc = &self.shared.links[pkt.iface as usize];
        // As a frame of the interface carries it (reassembly and
        // steering read it).
        copy.set_port(ifc.port_id);
        let mac = crate::mcast::report::group_mac(&pkt.next_hop);
        if push_ethernet(&mut copy, ifc, mac, ethertype_for(&pkt.next_hop)).is_err() {
            self.inc(if v4 { Counter::IpOutDiscards } else { Counter::Ip6OutDiscards });
            return;
        }
        copy.set_rx_checksums_good();
        self.looped.push((pkt.iface, copy));
    }

    /// Sends what the application queued in its callback, in order: a run
    /// of packets to the neighbour before them takes its MAC from the last
    /// one (one memo look-up per neighbour, not per packet), and the
    /// counters are added once for the lot. Returns the last neighbour
    /// found in the memo and until when the memo holds it, for the next
    /// callback to finish its frames for (see [`Direct`]), when its
    /// interface takes them.
    pub(super) fn transmit_all(&mut self, queue: &mut Vec<TxPacket>) -> Option<(Direct, Instant)> {
        let mut known: Option<(u16, IpAddr, MacAddr, Instant)> = None;
        let (mut udp4, mut udp6, mut ip4, mut ip6) = (0, 0, 0, 0);
        for pkt in queue.drain(..) {
            let v4 = pkt.next_hop.is_ipv4();
            if pkt.datagram {
                (udp4, udp6) = if v4 { (udp4 + 1, udp6) } else { (udp4, udp6 + 1) };
            }
            let mac = match known {
                Some((i, hop, mac, _)) if i == pkt.iface && hop == pkt.next_hop => mac,
                _ => match self.memo.get_until(pkt.iface, &pkt.next_hop, self.now) {
                    Some((mac, until)) => {
                        known = Some((pkt.iface, pkt.next_hop, mac, until));
                        mac
                    }
                    None => {
                        self.transmit(pkt);
                        continue;
                    }
                },
            };
            (ip4, ip6) = if v4 { (ip4 + 1, ip6) } else { (ip4, ip6 + 1) };
            self.send_frame(pkt.iface, pkt.mbuf, mac, ethertype_for(&pkt.next_hop));
        }
        self.add(Counter::UdpOutDatagrams, udp4);
        self.add(Counter::Udp6OutDatagrams, udp6);
        self.add(Counter::IpOutRequests, ip4);
        self.add(Counter::Ip6OutRequests, ip6);
        let (iface, hop, mac, until) = known?;
        let ifc = &self.shared.links[iface as usize];
        (ifc.vlan.is_none() && ifc.tunnel.is_none()).then(|| (Direct::new(iface, ifc.mac, hop, mac), until))
    }

    /// Sends the frames the callback finished for its direct neighbour on
    /// interface `iface` (IPv4 or not), of which `datagrams` are UDP
    /// datagrams (the rest fragments after a datagram's first), and counts
    /// them as `transmit_all` would.
    #[inline]
    pub(super) fn transmit_frames(&mut self, iface: u16, v4: bool, frames: &mut Vec<Mbuf>, datagrams: u64) {
        if frames.is_empty() {
            return;
        }
        let (n, i) = (frames.len() as u64, iface as usize);
        let burst = &mut self.txbuf[i];
        if frames.len() <= BURST - burst.len() {
            // All fit: one look at the port's burst for all of them.
            for m in frames.drain(..) {
                let _ = burst.push(m);
            }
        } else {
            for m in frames.drain(..) {
                self.queue_tx(i, m);
            }
        }
        if v4 {
            self.add(Counter::UdpOutDatagrams, datagrams);
            self.add(Counter::IpOutRequests, n);
        } else {
            self.add(Counter::Udp6OutDatagrams, datagrams);
            self.add(Counter::Ip6OutRequests, n);
        }
    }

    /// Sends an IP packet to a known MAC.
    #[inline]
    pub(super) fn send_ip(&mut self, pkt: TxPacket, mac: MacAddr) {
        let ethertype = ethertype_for(&pkt.next_hop);
        self.inc(if pkt.next_hop.is_ipv4() { Counter::IpOutRequests } else { Counter::Ip6OutRequests });
        self.send_frame(pkt.iface, pkt.mbuf, mac, ethertype);
    }

    /// Adds the Ethernet header and queues the frame for its port.
    #[inline]
    pub(super) fn send_frame(&mut self, iface: u16, mut m: Mbuf, dst: MacAddr, ethertype: u16) {
        let ifc = &self.shared.links[iface as usize];
        if push_ethernet(&mut m, ifc, dst, ethertype).is_err() {
            return;
        }
        if let Some(t) = ifc.tunnel {
            self.tap(iface, true, std::slice::from_ref(&m));
            self.vxlan_encap(t, m);
            return;
        }
        self.queue_tx(iface as usize, m);
    }

    /// Queues a finished frame for port `i`, flushing first when full.
    #[inline(always)]
    pub(super) fn queue_tx(&mut self, i: usize, m: Mbuf) {
        if let Err(m) = self.txbuf[i].push(m) {
            self.flush(i);
            let _ = self.txbuf[i].push(m);
        }
    }

    /// Sends what waits for port `i`, retrying a full ring a few times.
    pub(super) fn flush(&mut self, i: usize) {
        if self.tx[i].is_none() {
            // Captured by the lcore that sends them.
            self.hand_tx(i);
            return;
        }
        self.tap(i as u16, true, self.txbuf[i].as_slice());
        let mut tries = 0;
        while !self.txbuf[i].is_empty() {
            let sent = self.tx[i].as_mut().map_or(0, |q| q.tx_burst(&mut self.txbuf[i]));
            self.add(Counter::TxFrames, sent as u64);
            if sent == 0 {
                tries += 1;
                if tries >= TX_RETRIES {
                    self.add(Counter::TxRingFull, self.txbuf[i].len() as u64);
                    self.txbuf[i].clear();
                    return;
                }
                std::hint::spin_loop();
            }
        }
    }

    /// Flushes every port.
    pub(super) fn flush_all(&mut self) {
        for i in 0..self.txbuf.len() {
            if !self.txbuf[i].is_empty() {
                self.flush(i);
            }
        }
    }

    /// Sends an ARP request or neighbour solicitation.
    pub(super) fn solicit(&mut self, s: Solicit) {
        let ifc = &self.net.ifaces[s.iface as usize];
        match s.target {
            IpAddr::V4(t) => {
                if let Some(req) = neigh_arp::request(ifc, t, s.unicast) {
                    self.send_arp(s.iface, req, s.unicast.unwrap_or(MacAddr::BROADCAST));
                }
            }
            IpAddr::V6(t) => {
                if let Some(out) = nd::solicitation(ifc, t, s.unicast) {
                    self.send_nd(s.iface, out);
                }
            }
        }
    }

    /// Gratuitous ARP and unsolicited neighbour advertisements for every
    /// address, so peers update their caches when spate (re)starts.
    pub(super) fn announce(&mut self) {
        let net = self.net.clone();
        for ifc in net.ifaces.iter() {
            for c in &ifc.ipv4 {
                if let IpAddr::V4(a) = c.addr {
                    self.send_arp(ifc.index, neigh_arp::gratuitous(ifc, a), MacAddr::BROADCAST);
                }
            }
            for c in &ifc.ipv6 {
                if let IpAddr::V6(a) = c.addr {
                    self.send_nd(ifc.index, nd::unsolicited_advert(ifc, a));
                }
            }
        }
    }

    /// Announces addresses added while the stack runs, as `announce` does
    /// at the start.
    pub(super) fn announce_added(&mut self, added: &[(u16, IpAddr)]) {
        let net = self.shared.net();
        for &(i, ip) in added {
            let Some(ifc) = net.ifaces.get(i as usize) else { continue };
            match ip {
                IpAddr::V4(a) if ifc.has_ipv4(a) => self.send_arp(i, neigh_arp::gratuitous(ifc, a), MacAddr::BROADCAST),
                IpAddr::V6(a) if ifc.has_ipv6(&a) => self.send_nd(i, nd::unsolicited_advert(ifc, a)),
                _ => {}
            }
        }
        self.flush_all();
    }

    /// Sends an ARP packet in a fresh mbuf.
    pub(super) fn send_arp(&mut self, iface: u16, repr: crate::wire::arp::Repr, dst: MacAddr) {
        let Some(mut m) = self.shared.pool.alloc() else {
            self.inc(Counter::TxNoMbuf);
            return;
        };
        let Ok(body) = m.append(crate::wire::arp::PACKET_LEN) else {
            return;
        };
        repr.emit(body);
        self.inc(if repr.operation == crate::wire::arp::Operation::Request {
            Counter::ArpOutRequests
        } else {
            Counter::ArpOutReplies
        });
        self.send_frame(iface, m, dst, ethernet::ethertype::ARP);
    }

    /// Sends a neighbour-discovery message in a fresh mbuf (hop limit 255).
    pub(super) fn send_nd(&mut self, iface: u16, out: nd::Outgoing) {
        let Some(mut m) = self.shared.pool.alloc() else {
            self.inc(Counter::TxNoMbuf);
            return;
        };
        let len = out.msg.buffer_len();
        let Ok(body) = m.append(len) else { return };
        out.msg.emit(body, &out.src, &out.dst);
        let ip = ipv6::Repr {
            src: out.src,
            dst: out.dst,
            next_header: ip_proto::ICMPV6,
            payload_len: len as u16,
            hop_limit: 255,
        };
        let Ok(h) = m.prepend(ipv6::HEADER_LEN) else {
            return;
        };
        ip.emit(h);
        self.inc(Counter::Icmp6OutMsgs);
        self.inc(match out.msg {
            crate::wire::icmpv6::Repr::NeighborSolicit { .. } => Counter::Icmp6OutNeighborSolicits,
            _ => Counter::Icmp6OutNeighborAdvertisements,
        });
        self.send_frame(iface, m, out.dst_mac, ethernet::ethertype::IPV6);
    }
}

//! Counters. The SNMP groups (`Ip`, `Ip6`, `Icmp`, `Icmp6`, `Udp`, `Udp6`)
//! keep Linux's `/proc/net/snmp` names and meanings; `Rx` accounts for every
//! received frame exactly once (`Rx.Frames` equals the sum of the other
//! `Rx` counters), `Tx`, `Arp` and `Neigh` explain the transmit side.
//!
//! Each polling lcore writes its own cache-padded block; readers sum the
//! blocks. Threads outside the lcores (application senders) write a
//! shared block with atomic adds, on error paths only.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

macro_rules! counters {
    ($( $id:ident = $group:literal . $name:literal : $doc:literal; )*) => {
        /// A counter.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(usize)]
        pub enum Counter {
            $( #[doc = $doc] $id, )*
        }

        impl Counter {
            /// Every counter, in display order.
            pub const ALL: &'static [Counter] = &[ $( Counter::$id, )* ];

            /// Its group (`Udp`, `Ip`, `Rx`, ...).
            pub const fn group(self) -> &'static str {
                match self { $( Counter::$id => $group, )* }
            }

            /// Its name within the group (`InDatagrams`, ...).
            pub const fn name(self) -> &'static str {
                match self { $( Counter::$id => $name, )* }
            }
        }
    };
}

counters! {
    RxFrames = "Rx"."Frames": "Frames received from ports.";
    RxDelivered = "Rx"."Delivered": "UDP datagrams queued to a socket.";
    RxNoPort = "Rx"."NoPort": "UDP datagrams for a port nobody listens on.";
    RxIgnoredMulti = "Rx"."IgnoredMulti": "Broadcast or multicast UDP nobody listens for.";
    RxRcvbufFull = "Rx"."RcvbufFull": "UDP datagrams dropped because the socket's receive buffer was full.";
    RxSocketClosed = "Rx"."SocketClosed": "UDP datagrams for a socket closed while they were on their way.";
    RxUdpErrors = "Rx"."UdpErrors": "UDP datagrams with a bad length.";
    RxUdpCsumErrors = "Rx"."UdpCsumErrors": "UDP datagrams with a bad checksum (or a zero one over IPv6).";
    RxIcmp = "Rx"."Icmp": "ICMP and ICMPv6 messages handled (echo answered, errors noted, others counted).";
    RxIcmpErrors = "Rx"."IcmpErrors": "ICMP and ICMPv6 messages that were malformed or had a bad checksum.";
    RxArp = "Rx"."Arp": "ARP packets handled.";
    RxArpErrors = "Rx"."ArpErrors": "ARP packets that were short or not Ethernet/IPv4.";
    RxNd = "Rx"."Nd": "Neighbour-discovery messages handled.";
    RxNdErrors = "Rx"."NdErrors": "Neighbour-discovery messages that failed RFC 4861 validation.";
    RxEthTruncated = "Rx"."EthTruncated": "Frames shorter than an Ethernet header.";
    RxNotForUs = "Rx"."NotForUs": "Frames for another MAC address.";
    RxUnknownEtherType = "Rx"."UnknownEtherType": "Frames of an EtherType spate does not speak.";
    RxVlanMismatch = "Rx"."VlanMismatch": "Frames with a VLAN tag other than the port's (or tagged on an untagged port).";
    RxIpv4HdrErrors = "Rx"."Ipv4HdrErrors": "IPv4 packets with a bad version, header length or checksum.";
    RxIpv4Truncated = "Rx"."Ipv4Truncated": "IPv4 packets longer than the frame that carried them.";
    RxIpv4NotForUs = "Rx"."Ipv4NotForUs": "IPv4 packets for an address that is not ours.";
    RxReasmHeld = "Rx"."ReasmHeld": "IP fragments kept for reassembly (the datagram counts with the fragment that completes it).";
    RxReasmDropped = "Rx"."ReasmDropped": "IP fragments refused or dropped with their datagram (overlap, past 64 KiB, too many, tiny first, non-UDP datagram).";
    RxReasmDuplicates = "Rx"."ReasmDuplicates": "IP fragments identical to one held.";
    RxSteerDropped = "Rx"."SteerDropped": "Frames (or reassembled datagrams) dropped because the ring to the lcore owning their flow was full.";
    RxIpv4UnknownProto = "Rx"."Ipv4UnknownProto": "IPv4 packets of a protocol spate does not speak.";
    RxIpv6HdrErrors = "Rx"."Ipv6HdrErrors": "IPv6 packets with a bad version.";
    RxIpv6Truncated = "Rx"."Ipv6Truncated": "IPv6 packets longer than the frame that carried them.";
    RxIpv6NotForUs = "Rx"."Ipv6NotForUs": "IPv6 packets for an address that is not ours.";
    RxIpv6ExtErrors = "Rx"."Ipv6ExtErrors": "IPv6 packets whose extension headers are malformed, too many, or ask for routing.";
    RxIpv6UnknownProto = "Rx"."Ipv6UnknownProto": "IPv6 packets of a protocol spate does not speak.";
    RxGroMerged = "Rx"."GroMerged": "UDP datagrams merged into the one before them (UDP GRO): delivered as its segments.";
    RxVxlanErrors = "Rx"."VxlanErrors": "VXLAN packets with a bad header, an unknown VNI or an inner frame too short.";

    GroLookups = "Gro"."Lookups": "UDP datagrams the GRO stage looked up (only while a tunnel or a GRO socket exists).";
    GroCoalesced = "Gro"."Coalesced": "Datagrams of more than one segment delivered to GRO sockets.";
    VxlanInPackets = "Vxlan"."InPackets": "VXLAN packets decapsulated.";
    VxlanOutPackets = "Vxlan"."OutPackets": "Frames encapsulated into VXLAN.";

    TxFrames = "Tx"."Frames": "Frames handed to ports.";
    TxRingFull = "Tx"."RingFull": "Frames dropped because a TX ring stayed full through the retries.";
    TxHandoffDropped = "Tx"."HandoffDropped": "Frames dropped because the ring to the lcore owning the port's TX queue was full.";
    SteerFrames = "Steer"."Frames": "Frames this lcore handed to the lcore owning their flow (counted there in their Rx outcome).";
    SteerDatagrams = "Steer"."Datagrams": "Reassembled datagrams handed to the lcore owning their flow.";
    SteerTx = "Steer"."TxFrames": "Frames handed to the lcore owning the port's TX queue.";
    TxNoRoute = "Tx"."NoRoute": "Locally made packets (ICMP) without a route.";
    TxNoMbuf = "Tx"."NoMbuf": "Control frames (ARP, ND) not sent for lack of mbufs.";

    ArpInRequests = "Arp"."InRequests": "ARP requests for our addresses.";
    ArpInReplies = "Arp"."InReplies": "ARP replies.";
    ArpOutRequests = "Arp"."OutRequests": "ARP requests sent (gratuitous ones included).";
    ArpOutReplies = "Arp"."OutReplies": "ARP replies sent.";
    NeighResolved = "Neigh"."Resolved": "Neighbours resolved.";
    NeighFailed = "Neigh"."Failed": "Neighbours that did not answer.";
    NeighQueued = "Neigh"."Queued": "Packets queued while their neighbour was resolved.";
    NeighQueueDrops = "Neigh"."QueueDrops": "Packets dropped because their neighbour did not answer or the queue was full.";

    IpInReceives = "Ip"."InReceives": "IPv4 packets received.";
    IpInHdrErrors = "Ip"."InHdrErrors": "IPv4 packets with header errors.";
    IpInAddrErrors = "Ip"."InAddrErrors": "IPv4 packets for an address that is not ours.";
    IpInUnknownProtos = "Ip"."InUnknownProtos": "IPv4 packets of an unknown protocol.";
    IpInTruncatedPkts = "Ip"."InTruncatedPkts": "IPv4 packets shorter than their total length.";
    IpInDiscards = "Ip"."InDiscards": "IPv4 packets discarded for lack of resources or support.";
    IpInDelivers = "Ip"."InDelivers": "IPv4 packets delivered to ICMP or UDP.";
    IpReasmTimeout = "Ip"."ReasmTimeout": "IPv4 datagrams whose fragments did not all come in time.";
    IpReasmReqds = "Ip"."ReasmReqds": "IPv4 fragments received.";
    IpReasmOKs = "Ip"."ReasmOKs": "IPv4 datagrams reassembled.";
    IpReasmFails = "Ip"."ReasmFails": "IPv4 datagrams not reassembled (bad or overlapping fragments, timeouts, memory).";
    IpFragOKs = "Ip"."FragOKs": "IPv4 datagrams fragmented.";
    IpFragFails = "Ip"."FragFails": "IPv4 datagrams that needed fragmenting but could not be (DF asked for).";
    IpFragCreates = "Ip"."FragCreates": "IPv4 fragments made.";
    IpOutRequests = "Ip"."OutRequests": "IPv4 packets sent.";
    IpOutNoRoutes = "Ip"."OutNoRoutes": "IPv4 packets without a route.";
    Ip6InReceives = "Ip6"."InReceives": "IPv6 packets received.";
    Ip6InHdrErrors = "Ip6"."InHdrErrors": "IPv6 packets with header errors.";
    Ip6InAddrErrors = "Ip6"."InAddrErrors": "IPv6 packets for an address that is not ours.";
    Ip6InUnknownProtos = "Ip6"."InUnknownProtos": "IPv6 packets of an unknown protocol.";
    Ip6InTruncatedPkts = "Ip6"."InTruncatedPkts": "IPv6 packets shorter than their payload length.";
    Ip6InDiscards = "Ip6"."InDiscards": "IPv6 packets discarded for lack of resources or support.";
    Ip6InDelivers = "Ip6"."InDelivers": "IPv6 packets delivered to ICMPv6 or UDP.";
    Ip6ReasmTimeout = "Ip6"."ReasmTimeout": "IPv6 datagrams whose fragments did not all come in time.";
    Ip6ReasmReqds = "Ip6"."ReasmReqds": "IPv6 fragments received.";
    Ip6ReasmOKs = "Ip6"."ReasmOKs": "IPv6 datagrams reassembled.";
    Ip6ReasmFails = "Ip6"."ReasmFails": "IPv6 datagrams not reassembled (bad or overlapping fragments, timeouts, memory).";
    Ip6FragOKs = "Ip6"."FragOKs": "IPv6 datagrams fragmented.";
    Ip6FragFails = "Ip6"."FragFails": "IPv6 datagrams that needed fragmenting but could not be.";
    Ip6FragCreates = "Ip6"."FragCreates": "IPv6 fragments made.";
    Ip6OutRequests = "Ip6"."OutRequests": "IPv6 packets sent.";
    Ip6OutNoRoutes = "Ip6"."OutNoRoutes": "IPv6 packets without a route.";

    IcmpInMsgs = "Icmp"."InMsgs": "ICMP messages received.";
    IcmpInErrors = "Icmp"."InErrors": "ICMP messages with errors.";
    IcmpInCsumErrors = "Icmp"."InCsumErrors": "ICMP messages with a bad checksum.";
    IcmpInDestUnreachs = "Icmp"."InDestUnreachs": "Destination unreachable messages received.";
    IcmpInTimeExcds = "Icmp"."InTimeExcds": "Time exceeded messages received.";
    IcmpInEchos = "Icmp"."InEchos": "Echo requests received.";
    IcmpInEchoReps = "Icmp"."InEchoReps": "Echo replies received.";
    IcmpOutMsgs = "Icmp"."OutMsgs": "ICMP messages sent.";
    IcmpOutDestUnreachs = "Icmp"."OutDestUnreachs": "Destination unreachable messages sent.";
    IcmpOutEchoReps = "Icmp"."OutEchoReps": "Echo replies sent.";
    IcmpOutRateLimited = "Icmp"."OutRateLimited": "ICMP errors not sent because of the rate limit.";
    Icmp6InMsgs = "Icmp6"."InMsgs": "ICMPv6 messages received.";
    Icmp6InErrors = "Icmp6"."InErrors": "ICMPv6 messages with errors.";
    Icmp6InCsumErrors = "Icmp6"."InCsumErrors": "ICMPv6 messages with a bad checksum.";
    Icmp6InDestUnreachs = "Icmp6"."InDestUnreachs": "Destination unreachable messages received.";
    Icmp6InPktTooBigs = "Icmp6"."InPktTooBigs": "Packet too big messages received.";
    Icmp6InEchos = "Icmp6"."InEchos": "Echo requests received.";
    Icmp6InEchoReplies = "Icmp6"."InEchoReplies": "Echo replies received.";
    Icmp6InRouterAdvertisements = "Icmp6"."InRouterAdvertisements": "Router advertisements received.";
    Icmp6InNeighborSolicits = "Icmp6"."InNeighborSolicits": "Neighbour solicitations received.";
    Icmp6InNeighborAdvertisements = "Icmp6"."InNeighborAdvertisements": "Neighbour advertisements received.";
    Icmp6OutMsgs = "Icmp6"."OutMsgs": "ICMPv6 messages sent.";
    Icmp6OutDestUnreachs = "Icmp6"."OutDestUnreachs": "Destination unreachable messages sent.";
    Icmp6OutEchoReplies = "Icmp6"."OutEchoReplies": "Echo replies sent.";
    Icmp6OutNeighborSolicits = "Icmp6"."OutNeighborSolicits": "Neighbour solicitations sent.";
    Icmp6OutNeighborAdvertisements = "Icmp6"."OutNeighborAdvertisements": "Neighbour advertisements sent.";
    Icmp6OutRateLimited = "Icmp6"."OutRateLimited": "ICMPv6 errors not sent because of the rate limit.";

    UdpInDatagrams = "Udp"."InDatagrams": "UDP/IPv4 datagrams delivered to sockets.";
    UdpNoPorts = "Udp"."NoPorts": "UDP/IPv4 datagrams for a port with no socket.";
    UdpInErrors = "Udp"."InErrors": "UDP/IPv4 datagrams not delivered for reasons other than NoPorts.";
    UdpOutDatagrams = "Udp"."OutDatagrams": "UDP/IPv4 datagrams sent.";
    UdpRcvbufErrors = "Udp"."RcvbufErrors": "UDP/IPv4 datagrams dropped because the receive buffer was full.";
    UdpSndbufErrors = "Udp"."SndbufErrors": "UDP/IPv4 sends that found no room to queue.";
    UdpInCsumErrors = "Udp"."InCsumErrors": "UDP/IPv4 datagrams with a bad checksum.";
    UdpIgnoredMulti = "Udp"."IgnoredMulti": "Broadcast or multicast UDP/IPv4 datagrams with no socket.";
    UdpMemErrors = "Udp"."MemErrors": "UDP/IPv4 datagrams dropped for lack of mbufs.";
    Udp6InDatagrams = "Udp6"."InDatagrams": "UDP/IPv6 datagrams delivered to sockets.";
    Udp6NoPorts = "Udp6"."NoPorts": "UDP/IPv6 datagrams for a port with no socket.";
    Udp6InErrors = "Udp6"."InErrors": "UDP/IPv6 datagrams not delivered for reasons other than NoPorts.";
    Udp6OutDatagrams = "Udp6"."OutDatagrams": "UDP/IPv6 datagrams sent.";
    Udp6RcvbufErrors = "Udp6"."RcvbufErrors": "UDP/IPv6 datagrams dropped because the receive buffer was full.";
    Udp6SndbufErrors = "Udp6"."SndbufErrors": "UDP/IPv6 sends that found no room to queue.";
    Udp6InCsumErrors = "Udp6"."InCsumErrors": "UDP/IPv6 datagrams with a bad checksum.";
    Udp6IgnoredMulti = "Udp6"."IgnoredMulti": "Multicast UDP/IPv6 datagrams with no socket.";
    Udp6MemErrors = "Udp6"."MemErrors": "UDP/IPv6 datagrams dropped for lack of mbufs.";
}

/// Number of counters.
pub const COUNTERS: usize = Counter::ALL.len();

/// One writer's block of counters.
#[derive(Debug)]
pub struct CounterBlock {
    values: [AtomicU64; COUNTERS],
}

impl Default for CounterBlock {
    fn default() -> Self {
        CounterBlock { values: [const { AtomicU64::new(0) }; COUNTERS] }
    }
}

impl CounterBlock {
    /// Adds `n`; only the block's single writer may call this (no locked
    /// instruction: a plain load and store).
    #[inline]
    pub fn add_local(&self, c: Counter, n: u64) {
        let v = &self.values[c as usize];
        v.store(v.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    /// Adds one (single writer).
    #[inline]
    pub fn inc_local(&self, c: Counter) {
        self.add_local(c, 1);
    }

    /// Adds `n` from any thread.
    #[inline]
    pub fn add_shared(&self, c: Counter, n: u64) {
        self.values[c as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Reads a counter.
    #[inline]
    pub fn get(&self, c: Counter) -> u64 {
        self.values[c as usize].load(Ordering::Relaxed)
    }
}

/// Per-lcore counter blocks plus one shared block.
#[derive(Debug)]
pub struct StatsRegistry {
    lcores: Box<[CachePadded<CounterBlock>]>,
    shared: CachePadded<CounterBlock>,
}

impl StatsRegistry {
    /// Blocks for `lcores` polling lcores.
    pub fn new(lcores: usize) -> StatsRegistry {
        StatsRegistry {
            lcores: (0..lcores).map(|_| CachePadded::new(CounterBlock::default())).collect(),
            shared: CachePadded::default(),
        }
    }

    /// The block of polling lcore `index` (its only writer).
    pub fn lcore(&self, index: usize) -> &CounterBlock {
        &self.lcores[index]
    }

    /// The block shared by application threads.
    pub fn shared(&self) -> &CounterBlock {
        &self.shared
    }

    /// Counters of one lcore.
    pub fn lcore_snapshot(&self, index: usize) -> Counters {
        let mut c = Counters::default();
        for &id in Counter::ALL {
            c.values[id as usize] = self.lcores[index].get(id);
        }
        c
    }

    /// Everything summed.
    pub fn snapshot(&self) -> Counters {
        let mut c = Counters::default();
        for block in self.lcores.iter().map(|b| &**b).chain(std::iter::once(&*self.shared)) {
            for &id in Counter::ALL {
                c.values[id as usize] += block.get(id);
            }
        }
        c
    }
}

/// A snapshot of counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counters {
    values: [u64; COUNTERS],
}

impl Default for Counters {
    fn default() -> Self {
        Counters { values: [0; COUNTERS] }
    }
}

impl std::ops::Index<Counter> for Counters {
    type Output = u64;
    fn index(&self, c: Counter) -> &u64 {
        &self.values[c as usize]
    }
}

impl Counters {
    /// One counter's value.
    pub fn get(&self, c: Counter) -> u64 {
        self.values[c as usize]
    }

    /// Looks a counter up by `Group.Name` (`Udp.InDatagrams`).
    pub fn by_name(&self, full: &str) -> Option<u64> {
        let (g, n) = full.split_once('.')?;
        Counter::ALL.iter().find(|c| c.group() == g && c.name() == n).map(|&c| self[c])
    }

    /// (counter, value) for every counter.
    pub fn iter(&self) -> impl Iterator<Item = (Counter, u64)> + '_ {
        Counter::ALL.iter().map(move |&c| (c, self[c]))
    }

    /// The difference `self - earlier` (for rates).
    pub fn delta(&self, earlier: &Counters) -> Counters {
        let mut d = Counters::default();
        for i in 0..COUNTERS {
            d.values[i] = self.values[i].wrapping_sub(earlier.values[i]);
        }
        d
    }

    /// `Rx.Frames` minus the sum of every other `Rx` counter: 0 when each
    /// received frame is accounted for exactly once.
    pub fn unaccounted_frames(&self) -> i64 {
        let outcomes: u64 =
            Counter::ALL.iter().filter(|c| c.group() == "Rx" && **c != Counter::RxFrames).map(|&c| self[c]).sum();
        self[Counter::RxFrames] as i64 - outcomes as i64
    }

    /// Frames dropped on receive: every `Rx` outcome but delivery and the
    /// handled control messages.
    pub fn rx_drops(&self) -> u64 {
        Counter::ALL
            .iter()
            .filter(|c| {
                c.group() == "Rx"
                    && !matches!(
                        c,
                        Counter::RxFrames
                            | Counter::RxDelivered
                            | Counter::RxGroMerged
                            | Counter::RxIcmp
                            | Counter::RxArp
                            | Counter::RxNd
                    )
            })
            .map(|&c| self[c])
            .sum()
    }

    /// The non-zero counters as `Group.Name=value` words, one group per line.
    pub fn render_nonzero(&self) -> String {
        let mut out = String::new();
        let mut group = "";
        for (c, v) in self.iter().filter(|(_, v)| *v != 0) {
            if c.group() != group {
                if !out.is_empty() {
                    out.push('\n');
                }
                group = c.group();
                out.push_str(group);
                out.push(':');
            }
            out.push_str(&format!(" {}={v}", c.name()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_linux_like() {
        let mut seen = std::collections::HashSet::new();
        for c in Counter::ALL {
            assert!(seen.insert((c.group(), c.name())), "{c:?} twice");
        }
        assert_eq!(Counter::UdpRcvbufErrors.name(), "RcvbufErrors");
        assert_eq!(Counter::UdpInCsumErrors.group(), "Udp");
    }

    #[test]
    fn sums_and_accounting() {
        let r = StatsRegistry::new(2);
        r.lcore(0).inc_local(Counter::RxFrames);
        r.lcore(0).inc_local(Counter::RxDelivered);
        r.lcore(1).add_local(Counter::RxFrames, 2);
        r.lcore(1).inc_local(Counter::RxNotForUs);
        r.shared().add_shared(Counter::UdpSndbufErrors, 3);
        let s = r.snapshot();
        assert_eq!(s[Counter::RxFrames], 3);
        assert_eq!(s.unaccounted_frames(), 1);
        assert_eq!(s.by_name("Udp.SndbufErrors"), Some(3));
        assert_eq!(s.rx_drops(), 1);
        assert!(s.render_nonzero().contains("Rx: Frames=3 Delivered=1 NotForUs=1"));
    }
}

//! Counters. The SNMP groups (`Ip`, `Ip6`, `Icmp`, `Icmp6`, `Udp`, `Udp6`)
//! keep Linux's `/proc/net/snmp` names and meanings; `Rx` accounts for every
//! received frame exactly once (`Rx.Frames` equals the sum of the other
//! `Rx` counters), `Tx`, `Arp` and `Neigh` explain the transmit side.
//!
//! Each polling lcore writes its own cache-padded block; readers sum the
//! blocks. Threads outside the lcores (application senders) write a
//! shared block with atomic adds, on error paths only.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

macro_rules! counters {
    ($( $id:ident = $kind:ident $group:literal . $name:literal : $doc:literal; )*) => {
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

            /// What it counts, in a sentence (the table's text).
            pub const fn doc(self) -> &'static str {
                match self { $( Counter::$id => $doc, )* }
            }

            /// Whether it counts frames, packets or datagrams spate lost or
            /// refused (`drop` in the table below), rather than work done,
            /// outcomes handled, or a loss some other counter already
            /// counts (the SNMP groups' errors repeat the `Rx` outcomes).
            /// Every counter is marked one way or the other, so a new one
            /// cannot be left out of the drop reports by accident.
            pub const fn is_drop(self) -> bool {
                match self { $( Counter::$id => counter_kind!($kind), )* }
            }
        }
    };
}

/// A counter's mark in the table: `drop` or `kept`; anything else does
/// not compile.
macro_rules! counter_kind {
    (drop) => {
        true
    };
    (kept) => {
        false
    };
}

counters! {
    RxFrames = kept "Rx"."Frames": "Frames received from ports.";
    RxDelivered = kept "Rx"."Delivered": "UDP datagrams queued to a socket, or taken by the run-to-completion callback where they were staged.";
    RxNoPort = drop "Rx"."NoPort": "UDP datagrams for a port nobody listens on.";
    RxIgnoredMulti = drop "Rx"."IgnoredMulti": "Broadcast or multicast UDP nobody listens for.";
    RxRcvbufFull = drop "Rx"."RcvbufFull": "UDP datagrams dropped because the socket's receive buffer was full.";
    RxMemFull = drop "Rx"."MemFull": "UDP datagrams dropped because the receive queues of all sockets together held the stack's cap (`udp_mem_bytes`, Linux's udp_mem).";
    RxSocketClosed = drop "Rx"."SocketClosed": "UDP datagrams for a socket closed while they were on their way.";
    RxUdpErrors = drop "Rx"."UdpErrors": "UDP datagrams with a bad length.";
    RxUdpCsumErrors = drop "Rx"."UdpCsumErrors": "UDP datagrams with a bad checksum (or a zero one over IPv6).";
    RxIcmp = kept "Rx"."Icmp": "ICMP and ICMPv6 messages handled (echo answered, errors noted, others counted).";
    RxIcmpErrors = drop "Rx"."IcmpErrors": "ICMP and ICMPv6 messages that were malformed or had a bad checksum.";
    RxArp = kept "Rx"."Arp": "ARP packets handled.";
    RxIgmp = kept "Rx"."Igmp": "IGMP messages handled (queries answered, reports of other hosts ignored).";
    RxArpErrors = drop "Rx"."ArpErrors": "ARP packets that were short or not Ethernet/IPv4.";
    RxNd = kept "Rx"."Nd": "Neighbour-discovery messages handled.";
    RxNdErrors = drop "Rx"."NdErrors": "Neighbour-discovery messages that failed RFC 4861 validation.";
    RxEthTruncated = drop "Rx"."EthTruncated": "Frames shorter than an Ethernet header.";
    RxNotForUs = drop "Rx"."NotForUs": "Frames for another MAC address.";
    RxUnknownEtherType = drop "Rx"."UnknownEtherType": "Frames of an EtherType spate does not speak.";
    RxVlanMismatch = drop "Rx"."VlanMismatch": "Frames with a VLAN tag other than the port's (or tagged on an untagged port).";
    RxIpv4HdrErrors = drop "Rx"."Ipv4HdrErrors": "IPv4 packets with a bad version, header length or checksum.";
    RxIpv4Truncated = drop "Rx"."Ipv4Truncated": "IPv4 packets longer than the frame that carried them.";
    RxIpv4NotForUs = drop "Rx"."Ipv4NotForUs": "IPv4 packets for an address that is not ours.";
    RxReasmHeld = kept "Rx"."ReasmHeld": "IP fragments kept for reassembly (the datagram counts with the fragment that completes it).";
    RxReasmDropped = drop "Rx"."ReasmDropped": "IP fragments refused or dropped with their datagram (overlap, past 64 KiB, too many, tiny first, non-UDP datagram).";
    RxReasmDuplicates = drop "Rx"."ReasmDuplicates": "IP fragments identical to one held.";
    RxSteerDropped = drop "Rx"."SteerDropped": "Frames (or reassembled datagrams) dropped because the ring to the lcore owning their flow was full.";
    RxIpv4UnknownProto = drop "Rx"."Ipv4UnknownProto": "IPv4 packets of a protocol spate does not speak.";
    RxIpv6HdrErrors = drop "Rx"."Ipv6HdrErrors": "IPv6 packets with a bad version.";
    RxIpv6Truncated = drop "Rx"."Ipv6Truncated": "IPv6 packets longer than the frame that carried them.";
    RxIpv6NotForUs = drop "Rx"."Ipv6NotForUs": "IPv6 packets for an address that is not ours.";
    RxIpv6ExtErrors = drop "Rx"."Ipv6ExtErrors": "IPv6 packets whose extension headers are malformed, too many, or ask for routing.";
    RxIpv6UnknownProto = drop "Rx"."Ipv6UnknownProto": "IPv6 packets of a protocol spate does not speak.";
    RxGroMerged = kept "Rx"."GroMerged": "UDP datagrams merged into the one before them (UDP GRO): delivered as its segments.";
    RxVxlanErrors = drop "Rx"."VxlanErrors": "VXLAN packets with a bad header, an unknown VNI or an inner frame too short.";
    RxVxlanWrongSource = drop "Rx"."VxlanWrongSource": "VXLAN packets for a tunnel's VNI that did not come from its remote, to its local address, over its outer interface.";
    RxVxlanFragmented = drop "Rx"."VxlanFragmented": "VXLAN packets that arrived in IP fragments, reassembled and then dropped: RFC 7348 lets an endpoint discard them, and spate decapsulates only whole frames.";

    GroLookups = kept "Gro"."Lookups": "UDP datagrams the GRO stage looked up (only while a tunnel or a GRO socket exists).";
    GroCoalesced = kept "Gro"."Coalesced": "Datagrams of more than one segment delivered to GRO sockets.";
    GsoSends = kept "Gso"."Sends": "Sends a socket made as several datagrams (UDP GSO), counted by the sending thread.";
    GsoSegments = kept "Gso"."Segments": "Datagrams UDP GSO sends made.";
    PmtuLearnt = kept "Pmtu"."Learnt": "Fragmentation-needed and packet-too-big messages believed (the datagram they quote is one a socket of spate's could have sent).";
    PmtuIgnored = kept "Pmtu"."Ignored": "Fragmentation-needed and packet-too-big messages ignored: the datagram they quote is not one a socket of spate's could have sent.";
    CsumPartial = kept "Csum"."Partial": "UDP datagrams whose checksum field held only the pseudo-header's sum: a sender on the same host left the checksum to an offload (Linux's CHECKSUM_PARTIAL over a veth) and the kernel handed the frame to `net_af_packet` or `net_af_xdp` as it was. Accepted unverified, as the kernel itself accepts them.";
    VxlanInPackets = kept "Vxlan"."InPackets": "VXLAN packets decapsulated.";
    VxlanOutPackets = kept "Vxlan"."OutPackets": "Frames encapsulated into VXLAN.";

    PollSleeps = kept "Poll"."Sleeps": "Times an lcore slept, idle (poll = \"adaptive\").";
    PollSleepsContended = kept "Poll"."SleepsContended": "Sleeps begun before the idle time was up: threads waited for a CPU and the lcore may run on every CPU (its lcores entry a CPU set of them all).";
    PollSleepsAborted = kept "Poll"."SleepsAborted": "Sleeps given up at the last look: work came while the lcore said it was going to sleep and armed its interrupts.";
    PollWakesRx = kept "Poll"."WakesRx": "Sleeps an RX queue's interrupt ended.";
    PollWakesHandoff = kept "Poll"."WakesHandoff": "Sleeps a hand-off ended: an application thread's send, another lcore's frames, the stack stopping.";
    PollWakesTimer = kept "Poll"."WakesTimer": "Sleeps that lasted until the stack's next timer, or naps to their end (ports without RX interrupts).";
    PollWindowGrown = kept "Poll"."WindowGrown": "Times an lcore's idle poll grew (or probed the whole poll_idle_us after 64 idle times closed): work woke it from a sleep, a second time since the window closed (more after a window that closed having caught fewer than two idle times, up to eight), soon enough after its idle time began (within poll_idle_us and as much again, that room at least 50 us, for the wake-up's latency) that a longer poll might have caught it, or was found at the sleep's last look.";
    PollWindowShrunk = kept "Poll"."WindowShrunk": "Times an lcore's idle poll ended: its window was the whole poll_idle_us and the idle time outlasted it, or the idle time was later than poll_idle_us and as much again (that room at least 50 us), so the poll before its sleep was spent for nothing.";
    PollSignalsRaised = kept "Poll"."SignalsRaised": "Times an idle lcore raised a net_tap queue's signal itself: frames waited that the driver reads only once its signal was handled.";
    PollAsleepMicros = kept "Poll"."AsleepMicros": "Microseconds the lcores slept.";

    TxFrames = kept "Tx"."Frames": "Frames handed to ports.";
    TxRingFull = drop "Tx"."RingFull": "Frames dropped because a TX ring stayed full through the retries.";
    TxHandoffDropped = drop "Tx"."HandoffDropped": "Frames dropped because the ring to the lcore owning the port's TX queue was full.";
    SteerFrames = kept "Steer"."Frames": "Frames this lcore handed to the lcore owning their flow (counted there in their Rx outcome).";
    SteerDatagrams = kept "Steer"."Datagrams": "Reassembled datagrams handed to the lcore owning their flow.";
    SteerTx = kept "Steer"."TxFrames": "Frames handed to the lcore owning the port's TX queue.";
    SteerFragments = kept "Steer"."Fragments": "IP fragments this lcore handed to the lcore where their datagram's fragments meet (chosen by addresses and ID) under rss = \"device\".";
    SteerFlowMoved = kept "Steer"."FlowMoved": "Datagrams of a flow that arrived on this lcore's queue after the flow's last ones arrived on another lcore's, under rss = \"device\": the device moved the flow, or does not keep flows on one queue.";
    TxNoRoute = drop "Tx"."NoRoute": "Locally made packets (ICMP) without a route.";
    TxNoMbuf = drop "Tx"."NoMbuf": "Control frames (ARP, ND) not sent for lack of mbufs.";

    ArpInRequests = kept "Arp"."InRequests": "ARP requests for our addresses.";
    ArpInReplies = kept "Arp"."InReplies": "ARP replies.";
    ArpOutRequests = kept "Arp"."OutRequests": "ARP requests sent (gratuitous ones included).";
    ArpOutReplies = kept "Arp"."OutReplies": "ARP replies sent.";
    NeighResolved = kept "Neigh"."Resolved": "Neighbours resolved.";
    NeighFailed = kept "Neigh"."Failed": "Neighbours that did not answer.";
    NeighQueued = kept "Neigh"."Queued": "Packets queued while their neighbour was resolved.";
    NeighQueueDrops = drop "Neigh"."QueueDrops": "Packets dropped because their neighbour did not answer or the queue was full.";
    ConfAddrAdds = kept "Conf"."AddrAdds": "Addresses added while the stack ran.";
    ConfAddrRemoves = kept "Conf"."AddrRemoves": "Addresses removed while the stack ran.";
    ConfRouteAdds = kept "Conf"."RouteAdds": "Routes added while the stack ran.";
    ConfRouteRemoves = kept "Conf"."RouteRemoves": "Routes removed while the stack ran.";
    ConfNeighAdds = kept "Conf"."NeighAdds": "Static neighbour entries added while the stack ran.";
    ConfNeighRemoves = kept "Conf"."NeighRemoves": "Neighbour entries removed while the stack ran.";

    IpInReceives = kept "Ip"."InReceives": "IPv4 packets received.";
    IpInHdrErrors = kept "Ip"."InHdrErrors": "IPv4 packets with header errors.";
    IpInAddrErrors = kept "Ip"."InAddrErrors": "IPv4 packets for an address that is not ours.";
    IpInUnknownProtos = kept "Ip"."InUnknownProtos": "IPv4 packets of an unknown protocol.";
    IpInTruncatedPkts = kept "Ip"."InTruncatedPkts": "IPv4 packets shorter than their total length.";
    IpInDiscards = kept "Ip"."InDiscards": "IPv4 packets discarded for lack of resources or support.";
    IpInDelivers = kept "Ip"."InDelivers": "IPv4 packets delivered to ICMP or UDP.";
    IpReasmTimeout = kept "Ip"."ReasmTimeout": "IPv4 datagrams whose fragments did not all come in time.";
    IpReasmReqds = kept "Ip"."ReasmReqds": "IPv4 fragments received.";
    IpReasmOKs = kept "Ip"."ReasmOKs": "IPv4 datagrams reassembled.";
    IpReasmFails = drop "Ip"."ReasmFails": "IPv4 datagrams not reassembled (bad or overlapping fragments, timeouts, memory).";
    IpFragOKs = kept "Ip"."FragOKs": "IPv4 datagrams fragmented.";
    IpFragFails = kept "Ip"."FragFails": "IPv4 datagrams that needed fragmenting but could not be (DF asked for).";
    IpFragCreates = kept "Ip"."FragCreates": "IPv4 fragments made.";
    IpOutRequests = kept "Ip"."OutRequests": "IPv4 packets sent.";
    IpOutNoRoutes = kept "Ip"."OutNoRoutes": "IPv4 packets without a route.";
    IpOutDiscards = drop "Ip"."OutDiscards": "IPv4 packets not made: copies of datagrams to a group for this host's own members, for lack of mbufs or headroom, or past the loop's bound.";
    IpExtInMcastPkts = kept "IpExt"."InMcastPkts": "IPv4 packets received for a multicast group the interface is in (or every host's).";
    IpExtOutMcastPkts = kept "IpExt"."OutMcastPkts": "IPv4 packets sent to a multicast group.";
    Ip6InReceives = kept "Ip6"."InReceives": "IPv6 packets received.";
    Ip6InHdrErrors = kept "Ip6"."InHdrErrors": "IPv6 packets with header errors.";
    Ip6InAddrErrors = kept "Ip6"."InAddrErrors": "IPv6 packets for an address that is not ours.";
    Ip6InUnknownProtos = kept "Ip6"."InUnknownProtos": "IPv6 packets of an unknown protocol.";
    Ip6InTruncatedPkts = kept "Ip6"."InTruncatedPkts": "IPv6 packets shorter than their payload length.";
    Ip6InDiscards = kept "Ip6"."InDiscards": "IPv6 packets discarded for lack of resources or support.";
    Ip6InDelivers = kept "Ip6"."InDelivers": "IPv6 packets delivered to ICMPv6 or UDP.";
    Ip6ReasmTimeout = kept "Ip6"."ReasmTimeout": "IPv6 datagrams whose fragments did not all come in time.";
    Ip6ReasmReqds = kept "Ip6"."ReasmReqds": "IPv6 fragments received.";
    Ip6ReasmOKs = kept "Ip6"."ReasmOKs": "IPv6 datagrams reassembled.";
    Ip6ReasmFails = drop "Ip6"."ReasmFails": "IPv6 datagrams not reassembled (bad or overlapping fragments, timeouts, memory).";
    Ip6FragOKs = kept "Ip6"."FragOKs": "IPv6 datagrams fragmented.";
    Ip6FragFails = kept "Ip6"."FragFails": "IPv6 datagrams that needed fragmenting but could not be.";
    Ip6FragCreates = kept "Ip6"."FragCreates": "IPv6 fragments made.";
    Ip6OutRequests = kept "Ip6"."OutRequests": "IPv6 packets sent.";
    Ip6OutNoRoutes = kept "Ip6"."OutNoRoutes": "IPv6 packets without a route.";
    Ip6OutDiscards = drop "Ip6"."OutDiscards": "IPv6 packets not made or sent: copies of datagrams to a group for this host's own members (for lack of mbufs or headroom, or past the loop's bound), and datagrams to a group with a hop limit of 0 (Linux's ip6_finish_output2).";
    Ip6InMcastPkts = kept "Ip6"."InMcastPkts": "IPv6 packets received for a multicast group.";
    Ip6OutMcastPkts = kept "Ip6"."OutMcastPkts": "IPv6 packets sent to a multicast group.";
    IgmpInQueries = kept "Igmp"."InQueries": "IGMP membership queries received (every version).";
    IgmpOutReports = kept "Igmp"."OutReports": "IGMP reports sent (joins, leaves as IGMPv3 records, answers to queries, the unasked states of `mcast_refresh_secs`; IGMPv3, or v2 or v1 while an older querier is heard).";
    IgmpOutLeaves = kept "Igmp"."OutLeaves": "IGMPv2 leave messages sent (while an IGMPv2 querier is heard).";
    IgmpAnswersLimited = kept "Igmp"."AnswersLimited": "Answers to IGMP queries not sent: past the rate limit (3 at once, 2 a second, per interface and group or general).";
    Mld6InQueries = kept "Mld6"."InQueries": "MLD queries received (both versions).";
    Mld6OutReports = kept "Mld6"."OutReports": "MLD reports sent (joins, leaves as MLDv2 records, answers to queries, the unasked states of `mcast_refresh_secs`; MLDv2, or v1 while an MLDv1 querier is heard).";
    Mld6OutDones = kept "Mld6"."OutDones": "MLDv1 done messages sent (while an MLDv1 querier is heard).";
    Mld6AnswersLimited = kept "Mld6"."AnswersLimited": "Answers to MLD queries not sent: past the rate limit (3 at once, 2 a second, per interface and group or general).";

    IcmpInMsgs = kept "Icmp"."InMsgs": "ICMP messages received.";
    IcmpInErrors = kept "Icmp"."InErrors": "ICMP messages with errors.";
    IcmpInCsumErrors = kept "Icmp"."InCsumErrors": "ICMP messages with a bad checksum.";
    IcmpInDestUnreachs = kept "Icmp"."InDestUnreachs": "Destination unreachable messages received.";
    IcmpInTimeExcds = kept "Icmp"."InTimeExcds": "Time exceeded messages received.";
    IcmpInEchos = kept "Icmp"."InEchos": "Echo requests received.";
    IcmpInEchoReps = kept "Icmp"."InEchoReps": "Echo replies received.";
    IcmpOutMsgs = kept "Icmp"."OutMsgs": "ICMP messages sent.";
    IcmpOutDestUnreachs = kept "Icmp"."OutDestUnreachs": "Destination unreachable messages sent.";
    IcmpOutEchoReps = kept "Icmp"."OutEchoReps": "Echo replies sent.";
    IcmpOutRateLimited = kept "Icmp"."OutRateLimited": "ICMP errors not sent because of the rate limit.";
    Icmp6InMsgs = kept "Icmp6"."InMsgs": "ICMPv6 messages received.";
    Icmp6InErrors = kept "Icmp6"."InErrors": "ICMPv6 messages with errors.";
    Icmp6InCsumErrors = kept "Icmp6"."InCsumErrors": "ICMPv6 messages with a bad checksum.";
    Icmp6InDestUnreachs = kept "Icmp6"."InDestUnreachs": "Destination unreachable messages received.";
    Icmp6InPktTooBigs = kept "Icmp6"."InPktTooBigs": "Packet too big messages received.";
    Icmp6InEchos = kept "Icmp6"."InEchos": "Echo requests received.";
    Icmp6InEchoReplies = kept "Icmp6"."InEchoReplies": "Echo replies received.";
    Icmp6InRouterAdvertisements = kept "Icmp6"."InRouterAdvertisements": "Router advertisements received.";
    Icmp6InNeighborSolicits = kept "Icmp6"."InNeighborSolicits": "Neighbour solicitations received.";
    Icmp6InNeighborAdvertisements = kept "Icmp6"."InNeighborAdvertisements": "Neighbour advertisements received.";
    Icmp6OutMsgs = kept "Icmp6"."OutMsgs": "ICMPv6 messages sent.";
    Icmp6OutDestUnreachs = kept "Icmp6"."OutDestUnreachs": "Destination unreachable messages sent.";
    Icmp6OutEchoReplies = kept "Icmp6"."OutEchoReplies": "Echo replies sent.";
    Icmp6OutNeighborSolicits = kept "Icmp6"."OutNeighborSolicits": "Neighbour solicitations sent.";
    Icmp6OutNeighborAdvertisements = kept "Icmp6"."OutNeighborAdvertisements": "Neighbour advertisements sent.";
    Icmp6OutRateLimited = kept "Icmp6"."OutRateLimited": "ICMPv6 errors not sent because of the rate limit.";

    UdpInDatagrams = kept "Udp"."InDatagrams": "UDP/IPv4 datagrams delivered to sockets.";
    UdpNoPorts = kept "Udp"."NoPorts": "UDP/IPv4 datagrams for a port with no socket.";
    UdpInErrors = kept "Udp"."InErrors": "UDP/IPv4 datagrams not delivered for reasons other than NoPorts.";
    UdpOutDatagrams = kept "Udp"."OutDatagrams": "UDP/IPv4 datagrams sent.";
    UdpRcvbufErrors = kept "Udp"."RcvbufErrors": "UDP/IPv4 datagrams dropped because the receive buffer was full.";
    UdpSndbufErrors = kept "Udp"."SndbufErrors": "UDP/IPv4 sends that found no room to queue.";
    UdpInCsumErrors = kept "Udp"."InCsumErrors": "UDP/IPv4 datagrams with a bad checksum.";
    UdpIgnoredMulti = kept "Udp"."IgnoredMulti": "Broadcast or multicast UDP/IPv4 datagrams with no socket.";
    UdpMemErrors = kept "Udp"."MemErrors": "UDP/IPv4 datagrams dropped because all receive queues together held the stack's cap (Linux's udp_mem).";
    Udp6InDatagrams = kept "Udp6"."InDatagrams": "UDP/IPv6 datagrams delivered to sockets.";
    Udp6NoPorts = kept "Udp6"."NoPorts": "UDP/IPv6 datagrams for a port with no socket.";
    Udp6InErrors = kept "Udp6"."InErrors": "UDP/IPv6 datagrams not delivered for reasons other than NoPorts.";
    Udp6OutDatagrams = kept "Udp6"."OutDatagrams": "UDP/IPv6 datagrams sent.";
    Udp6RcvbufErrors = kept "Udp6"."RcvbufErrors": "UDP/IPv6 datagrams dropped because the receive buffer was full.";
    Udp6SndbufErrors = kept "Udp6"."SndbufErrors": "UDP/IPv6 sends that found no room to queue.";
    Udp6InCsumErrors = kept "Udp6"."InCsumErrors": "UDP/IPv6 datagrams with a bad checksum.";
    Udp6IgnoredMulti = kept "Udp6"."IgnoredMulti": "Multicast UDP/IPv6 datagrams with no socket.";
    Udp6MemErrors = kept "Udp6"."MemErrors": "UDP/IPv6 datagrams dropped because all receive queues together held the stack's cap (Linux's udp_mem).";
}

/// Number of counters.
pub const COUNTERS: usize = Counter::ALL.len();

/// Adds `n` to an atomic only one thread writes: a plain load and store,
/// no locked instruction; readers on other threads see one or the other.
#[inline]
pub(crate) fn add_single_writer(a: &AtomicU64, n: u64) {
    a.store(a.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

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
        add_single_writer(&self.values[c as usize], n);
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

    /// Frames and datagrams dropped on receive: the `Rx` outcomes marked
    /// as drops (not delivery, the handled control messages, or
    /// fragments held for reassembly, which are still on their way).
    pub fn rx_drops(&self) -> u64 {
        Counter::ALL.iter().filter(|c| c.group() == "Rx" && c.is_drop()).map(|&c| self[c]).sum()
    }

    /// Every drop counter's value, summed ([`Counter::is_drop`]).
    pub fn drops(&self) -> u64 {
        Counter::ALL.iter().filter(|c| c.is_drop()).map(|&c| self[c]).sum()
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

    #[test]
    fn held_fragments_are_not_drops_and_hand_off_losses_are() {
        let r = StatsRegistry::new(2);
        // Two fragments held, the third completes the datagram.
        r.lcore(0).add_local(Counter::RxFrames, 3);
        r.lcore(0).add_local(Counter::RxReasmHeld, 2);
        r.lcore(0).inc_local(Counter::RxDelivered);
        // A frame lost on the ring to another lcore, a packet on the ring
        // to the TX lcore, and an ICMP error withheld by the rate limit.
        r.lcore(1).inc_local(Counter::RxFrames);
        r.lcore(1).inc_local(Counter::RxSteerDropped);
        r.lcore(1).inc_local(Counter::TxHandoffDropped);
        r.lcore(1).inc_local(Counter::IcmpOutRateLimited);
        let s = r.snapshot();
        assert_eq!(s.unaccounted_frames(), 0);
        assert_eq!(s.rx_drops(), 1, "the steering loss, not the held fragments");
        assert_eq!(s.drops(), 2, "and the hand-off loss; a withheld error is no drop");
        assert!(!Counter::RxReasmHeld.is_drop() && !Counter::UdpInErrors.is_drop());
    }
}

/// Buckets of a [`DelayHistogram`].
pub const DELAY_BUCKETS: usize = 24;
/// The first bucket's upper bound, in nanoseconds; each next one doubles.
const DELAY_FIRST_NS: u64 = 250;

/// How long datagrams waited from their RX burst to the application's
/// read, in buckets of powers of two from 250 ns to about a second (the
/// last bucket: longer). Kept by a socket that asks for it; its readers
/// add to it, relaxed.
#[derive(Debug, Default)]
pub struct DelayHistogram {
    on: AtomicBool,
    buckets: [AtomicU64; DELAY_BUCKETS],
    sum_ns: AtomicU64,
}

impl DelayHistogram {
    /// Whether it is kept.
    #[inline]
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Turns it on or off; returns whether it was on.
    pub fn set_on(&self, on: bool) -> bool {
        self.on.swap(on, Ordering::AcqRel)
    }

    /// The bucket of a delay: 0 below 250 ns, then `i` for
    /// `[250 << (i - 1), 250 << i)`, the last for the rest.
    #[inline]
    pub fn bucket_of(ns: u64) -> usize {
        ((u64::BITS - (ns / DELAY_FIRST_NS).leading_zeros()) as usize).min(DELAY_BUCKETS - 1)
    }

    /// Bucket `i`'s upper bound in nanoseconds (exclusive); `None` for the
    /// last.
    pub fn bound_ns(i: usize) -> Option<u64> {
        (i < DELAY_BUCKETS - 1).then(|| DELAY_FIRST_NS << i)
    }

    /// Notes one delay.
    #[inline]
    pub fn record(&self, ns: u64) {
        self.buckets[Self::bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The counts, by bucket.
    pub fn counts(&self) -> [u64; DELAY_BUCKETS] {
        std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed))
    }

    /// The delays' sum in nanoseconds.
    pub fn sum_ns(&self) -> u64 {
        self.sum_ns.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod delay_tests {
    use super::{DELAY_BUCKETS, DelayHistogram};

    #[test]
    fn delays_fall_in_power_of_two_buckets() {
        assert_eq!(DelayHistogram::bucket_of(0), 0);
        assert_eq!(DelayHistogram::bucket_of(249), 0);
        assert_eq!(DelayHistogram::bucket_of(250), 1);
        assert_eq!(DelayHistogram::bucket_of(499), 1);
        assert_eq!(DelayHistogram::bucket_of(500), 2);
        assert_eq!(DelayHistogram::bucket_of(1_000_000), 12);
        assert_eq!(DelayHistogram::bucket_of(u64::MAX), DELAY_BUCKETS - 1);
        // Each delay lies below its bucket's bound and at or above the one
        // before.
        for ns in [1, 250, 777, 40_000, 50_000_000, 1 << 40] {
            let b = DelayHistogram::bucket_of(ns);
            assert!(DelayHistogram::bound_ns(b).is_none_or(|up| ns < up), "{ns} in {b}");
            assert!(b == 0 || ns >= DelayHistogram::bound_ns(b - 1).unwrap(), "{ns} in {b}");
        }
        let h = DelayHistogram::default();
        h.record(300);
        h.record(2_000_000_000);
        assert_eq!(h.counts()[1], 1);
        assert_eq!(h.counts()[DELAY_BUCKETS - 1], 1);
        assert_eq!(h.sum_ns(), 2_000_000_300);
    }
}

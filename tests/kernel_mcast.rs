//! Multicast against the Linux kernel: a stack made in the test process
//! drives `vA` (net_af_packet); the kernel in the peer namespace sends to
//! groups from two source addresses and joins a group spate sends to.
//!
//! - Receiving: members of two groups on several sockets of one port get
//!   what their memberships ask (any source, a source included, a source
//!   blocked), a socket that joined nothing hears every group the
//!   interface is in (Linux's `IP_MULTICAST_ALL`), a group nobody joined
//!   reaches nobody; over IPv6 too; leaving stops it.
//! - Reporting: spate's IGMPv3 and MLDv2 reports for its joins and leaves
//!   are on the wire, and it answers the kernel's queries.
//! - Sending: a datagram to a group reaches a kernel member, with TTL 1.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket as KernelSocket};
use std::time::Duration;

use spate::UdpSocket;
use spate::dpdk::Memory;
use spate_testkit::{af_packet_stack, capture_frames, device_lock, shared_eal, spate_and_kernel, unique};

const G1: Ipv4Addr = Ipv4Addr::new(239, 1, 1, 1);
const G2: Ipv4Addr = Ipv4Addr::new(239, 2, 2, 2);
const G3: Ipv4Addr = Ipv4Addr::new(239, 3, 3, 3);
const S1: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const S3: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 3);
const ANY: Ipv4Addr = Ipv4Addr::UNSPECIFIED;

/// What each socket received within `wait` of the last datagram.
fn drain(socks: &[(&str, &UdpSocket)], wait: Duration) -> BTreeMap<String, Vec<String>> {
    let mut got = BTreeMap::new();
    for (name, s) in socks {
        s.set_read_timeout(Some(wait)).unwrap();
        let mut all = Vec::new();
        let mut buf = [0u8; 256];
        while let Ok((n, _)) = s.recv_from(&mut buf) {
            all.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        all.sort();
        got.insert(name.to_string(), all);
    }
    got
}

fn want(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect())).collect()
}

/// A kernel socket in `kernel` on port `port`, a member of `group` on
/// vB (S1's interface), its reads waiting `wait` at most.
fn kernel_member(kernel: &spate_testkit::Netns, group: Ipv4Addr, port: u16, wait: Duration) -> KernelSocket {
    kernel.run(move || {
        let k = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
        k.set_reuse_address(true).unwrap();
        k.bind(&SocketAddr::new(ANY.into(), port).into()).unwrap();
        k.join_multicast_v4(&group, &S1).unwrap();
        let k: KernelSocket = k.into();
        k.set_read_timeout(Some(wait)).unwrap();
        k
    })
}

/// The kernel in `kernel` sends `<group's tag>-s1` and `-s3` to each of
/// `groups` on port 5000, from S1 and from S3, and `g6` to `g6` out of vB.
fn kernel_sends(kernel: &spate_testkit::Netns, groups: &'static [(Ipv4Addr, &'static str)], g6: Ipv6Addr) {
    let vb_index: u32 = kernel.must(&["cat", "/sys/class/net/vB/ifindex"]).trim().parse().unwrap();
    kernel.run(move || {
        for (src, tag) in [(S1, "s1"), (S3, "s3")] {
            let k = KernelSocket::bind(SocketAddr::new(src.into(), 0)).unwrap();
            for (g, gt) in groups {
                k.send_to(format!("{gt}-{tag}").as_bytes(), SocketAddr::new((*g).into(), 5000)).unwrap();
            }
        }
        let k6 = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::DGRAM, None).unwrap();
        k6.set_multicast_if_v6(vb_index).unwrap();
        k6.send_to(b"g6", &SocketAddr::new(g6.into(), 5000).into()).unwrap();
    });
}

#[test]
fn members_get_what_their_memberships_ask_and_spate_reaches_kernel_members() {
    let _serial = device_lock();
    shared_eal(Memory::Hugepages);
    let (spate_ns, kernel) = spate_and_kernel("mcast");
    kernel.must(&["ip", "addr", "add", "198.18.0.3/24", "dev", "vB"]);
    kernel.must(&["ip", "-6", "addr", "add", "fd00::3/64", "dev", "vB", "nodad"]);
    kernel.must(&["ip", "route", "add", "224.0.0.0/4", "dev", "vB"]);
    // The kernel's view of the wire: spate's reports.
    let kfile = std::env::temp_dir().join(format!("{}.pcap", unique("spate-mcast-")));
    let mut tcpdump = kernel
        .spawn(
            "tcpdump",
            "tcpdump",
            &[
                "-i",
                "vB",
                "-U",
                "--immediate-mode",
                "-w",
                &kfile.display().to_string(),
                "igmp or icmp6 or dst host 239.5.5.5",
            ]
            .map(String::from),
            Duration::from_secs(120),
        )
        .unwrap();
    tcpdump.remove_on_drop(&kfile);
    assert!(tcpdump.wait_for_output("listening on vB", Duration::from_secs(10)), "{}", tcpdump.output());

    let stack = af_packet_stack(&spate_ns, &["198.18.0.2/24", "fd00::2/64"], 4095);
    let running = stack.spawn_polling().unwrap();
    let bind = |addr: &str| UdpSocket::builder(&stack).reuseport(true).bind(addr).unwrap();
    let any_g1 = bind("0.0.0.0:5000");
    any_g1.join_multicast_v4(&G1, &ANY).unwrap();
    let only_s3 = bind("0.0.0.0:5000");
    only_s3.join_source_multicast_v4(&G1, &S3, &ANY).unwrap();
    let not_s1 = bind("0.0.0.0:5000");
    not_s1.join_multicast_v4(&G2, &ANY).unwrap();
    not_s1.block_source_v4(&G2, &S1, &ANY).unwrap();
    // Only what they joined (IP_MULTICAST_ALL off)...
    for s in [&any_g1, &only_s3, &not_s1] {
        s.set_multicast_all(false).unwrap();
    }
    // ...and Linux's default: a group this socket did not join reaches
    // it when the interface is in it.
    // SO_REUSEADDR, what multicast receivers set, joins the same group.
    let g1_and_all = UdpSocket::builder(&stack).reuse_address(true).bind("0.0.0.0:5000").unwrap();
    g1_and_all.join_multicast_v4(&G1, &ANY).unwrap();
    let e = UdpSocket::bind(&stack, "0.0.0.0:5000").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "neither option set: {e}");
    assert!(g1_and_all.multicast_all().unwrap());
    let no_join = bind("0.0.0.0:5000");
    let v6 = UdpSocket::builder(&stack).reuseport(true).only_v6(true).bind("[::]:5000").unwrap();
    let g6: Ipv6Addr = "ff0e::5:6".parse().unwrap();
    v6.join_multicast_v6(&g6, 1).unwrap();

    // Linux's errors.
    let e = any_g1.join_multicast_v4(&G1, &ANY).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
    let e = any_g1.join_multicast_v4(&Ipv4Addr::new(198, 18, 0, 9), &ANY).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
    let e = only_s3.block_source_v4(&G1, &S1, &ANY).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "a block on a source-specific membership: {e}");
    let e = no_join.block_source_v4(&G3, &S1, &ANY).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "a block without a prior join: {e}");
    let e = only_s3.join_source_multicast_v4(&G1, &S3, &ANY).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrNotAvailable, "a source twice: {e}");
    let e = any_g1.leave_multicast_v4(&G3, &ANY).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrNotAvailable, "{e}");
    let e = any_g1.join_multicast_v4(&G3, &Ipv4Addr::new(198, 18, 0, 77)).unwrap_err();
    assert!(e.to_string().contains("No such device"), "ENODEV: {e}");
    let e = any_g1.join_multicast_v6(&g6, 1).unwrap_err();
    assert!(e.to_string().contains("Protocol not available"), "ENOPROTOOPT: {e}");

    // The kernel sends to each group from each source.
    kernel_sends(&kernel, &[(G1, "g1"), (G2, "g2"), (G3, "g3")], g6);
    let got = drain(
        &[
            ("any_g1", &any_g1),
            ("only_s3", &only_s3),
            ("not_s1", &not_s1),
            ("g1_and_all", &g1_and_all),
            ("no_join", &no_join),
            ("v6", &v6),
        ],
        Duration::from_millis(300),
    );
    assert_eq!(
        got,
        want(&[
            ("any_g1", &["g1-s1", "g1-s3"]),
            ("only_s3", &["g1-s3"]),
            ("not_s1", &["g2-s3"]),
            ("g1_and_all", &["g1-s1", "g1-s3", "g2-s3"]),
            // Every group the interface is in, through the interface's
            // filter (G2 from S1 is excluded there).
            ("no_join", &["g1-s1", "g1-s3", "g2-s3"]),
            ("v6", &["g6"]),
        ]),
    );

    // spate sends to a group the kernel joined: TTL 1 by default.
    let g5 = Ipv4Addr::new(239, 5, 5, 5);
    let member = kernel_member(&kernel, g5, 6000, Duration::from_secs(3));
    let sender = UdpSocket::bind(&stack, "0.0.0.0:0").unwrap();
    assert_eq!(sender.multicast_ttl_v4().unwrap(), 1, "Linux's default");
    sender.send_to(b"to-g5", SocketAddr::new(g5.into(), 6000)).unwrap();
    let (text, from) = kernel.run(move || {
        let mut buf = [0u8; 64];
        let (n, from) = member.recv_from(&mut buf).expect("the kernel member gets spate's datagram");
        (String::from_utf8_lossy(&buf[..n]).into_owned(), from)
    });
    assert_eq!((text.as_str(), from.ip()), ("to-g5", "198.18.0.2".parse::<std::net::IpAddr>().unwrap()));

    // Leaving: nothing more for that socket.
    only_s3.leave_source_multicast_v4(&G1, &S3, &ANY).unwrap();
    kernel.run(move || {
        let k = KernelSocket::bind(SocketAddr::new(S3.into(), 0)).unwrap();
        k.send_to(b"g1-after", SocketAddr::new(G1.into(), 5000)).unwrap();
    });
    let got = drain(&[("any_g1", &any_g1), ("only_s3", &only_s3)], Duration::from_millis(300));
    assert_eq!(got, want(&[("any_g1", &["g1-after"]), ("only_s3", &[])]));
    let c = stack.counters();
    // g1-s1, g1-s3, g2-s3, g1-after: g2-s1 and g3 stop at the interface.
    let named: Vec<String> = c.iter().filter(|(_, v)| *v > 0).map(|(k, v)| format!("{k:?}={v}")).collect();
    assert!(c[spate::Counter::IpExtInMcastPkts] == 4 && c[spate::Counter::Ip6InMcastPkts] >= 1, "{named:?}");
    assert!(c[spate::Counter::IgmpOutReports] >= 4, "joins reported: {named:?}");

    // Closing leaves: the interface's leave (TO_IN with no source) goes
    // out while the lcores still poll.
    drop((any_g1, only_s3, not_s1, g1_and_all, no_join, v6, sender));
    std::thread::sleep(Duration::from_millis(300));
    running.stop();
    tcpdump.stop();
    let frames = capture_frames(&kfile);
    // IGMPv3 reports (IPv4 protocol 2 to 224.0.0.22, type 0x22) naming G1.
    let reports = frames
        .iter()
        .filter(|(_, f)| f.len() > 46 && f[23] == 2 && f[30..34] == [224, 0, 0, 22] && f[38] == 0x22)
        .count();
    assert!(reports >= 4, "{reports} IGMPv3 reports on the wire");
    // A leave of G1: a record of type TO_IN (3) with no source for it.
    let leave = [3, 0, 0, 0, 239, 1, 1, 1];
    let left = frames.iter().any(|(_, f)| f.len() > 46 && f[38] == 0x22 && f[46..].windows(8).any(|w| w == leave));
    assert!(left, "the leave of 239.1.1.1 on the wire");
    // spate's datagram to the group: TTL 1, to 01:00:5e:05:05:05.
    let to_g5 = frames.iter().find(|(_, f)| f.len() > 34 && f[12..14] == [8, 0] && f[30..34] == [239, 5, 5, 5]);
    let (_, f) = to_g5.expect("spate's datagram to 239.5.5.5 on the wire");
    assert_eq!((&f[..6], f[22]), (&[1, 0, 0x5e, 5, 5, 5][..], 1));
}

/// The groups `bridge mdb show` lists on port `vB` of `br0`.
fn mdb(kernel: &spate_testkit::Netns) -> String {
    kernel.must(&["bridge", "mdb", "show", "dev", "br0"])
}

/// A snooping bridge with a querier of IGMP version `igmp` and MLD
/// version `mld` in the kernel's namespace lists spate's memberships of
/// 239.7.7.7 and ff0e::7:7 in `bridge mdb`, keeps them through its queries
/// past its membership interval (only because spate answers) and forgets
/// them after spate leaves. Returns the frames the bridge's port saw and
/// spate's counters.
fn bridge_learns_and_forgets(tag: &str, igmp: u8, mld: u8) -> (Vec<(f64, Vec<u8>)>, spate::Counters) {
    let _serial = device_lock();
    shared_eal(Memory::Hugepages);
    let (spate_ns, kernel) = spate_and_kernel(tag);
    // The kernel's side becomes a snooping bridge with a querier (a query
    // every 2 s, answers within 1 s, a membership lasts 5 s unless
    // reported again).
    kernel.must(&["ip", "addr", "flush", "dev", "vB"]);
    let (igmp, mld) = (igmp.to_string(), mld.to_string());
    kernel.must(&[
        "ip",
        "link",
        "add",
        "br0",
        "type",
        "bridge",
        "mcast_snooping",
        "1",
        "mcast_querier",
        "1",
        "mcast_igmp_version",
        &igmp,
        "mcast_mld_version",
        &mld,
        "mcast_query_interval",
        "200",
        "mcast_query_response_interval",
        "100",
        "mcast_startup_query_interval",
        "100",
        "mcast_membership_interval",
        "500",
    ]);
    kernel.must(&["ip", "link", "set", "vB", "master", "br0"]);
    kernel.must(&["ip", "addr", "add", "198.18.0.1/24", "dev", "br0"]);
    kernel.must(&["ip", "-6", "addr", "add", "fd00::1/64", "dev", "br0", "nodad"]);
    kernel.must(&["ip", "link", "set", "br0", "up"]);
    let kfile = std::env::temp_dir().join(format!("{}.pcap", unique("spate-mdb-")));
    // MLD comes after a hop-by-hop header, which `icmp6` does not match.
    let filter = "igmp or icmp6 or (ip6 and ip6[6] == 0)";
    let args = ["-i", "vB", "-U", "--immediate-mode", "-w", &kfile.display().to_string(), filter];
    let mut tcpdump = kernel.spawn("tcpdump", "tcpdump", &args.map(String::from), Duration::from_secs(120)).unwrap();
    tcpdump.remove_on_drop(&kfile);
    assert!(tcpdump.wait_for_output("listening on vB", Duration::from_secs(10)), "{}", tcpdump.output());

    let stack = af_packet_stack(&spate_ns, &["198.18.0.2/24", "fd00::2/64"], 4095);
    let running = stack.spawn_polling().unwrap();
    let s = UdpSocket::bind(&stack, "[::]:5000").unwrap();
    let g4 = Ipv4Addr::new(239, 7, 7, 7);
    let g6: Ipv6Addr = "ff0e::7:7".parse().unwrap();
    s.join_multicast_v4(&g4, &ANY).unwrap();
    s.join_multicast_v6(&g6, 1).unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let mut seen = mdb(&kernel);
    while !(seen.contains("239.7.7.7") && seen.contains("ff0e::7:7")) && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(200));
        seen = mdb(&kernel);
    }
    assert!(seen.contains("port vB grp 239.7.7.7") && seen.contains("port vB grp ff0e::7:7"), "{seen}");
    // Past the bridge's membership interval (5 s) the entries live on
    // only if spate answers the queries.
    std::thread::sleep(Duration::from_secs(7));
    let seen = mdb(&kernel);
    assert!(seen.contains("239.7.7.7") && seen.contains("ff0e::7:7"), "kept through queries: {seen}");
    let answered = stack.counters();
    assert!(answered[spate::Counter::IgmpInQueries] >= 1, "the querier's queries arrived");
    assert!(answered[spate::Counter::Mld6InQueries] >= 1, "the querier's MLD queries arrived");

    // Leaving: the bridge forgets the groups (after its last-member
    // queries, a few seconds at most).
    drop(s);
    let until = std::time::Instant::now() + Duration::from_secs(15);
    let mut seen = mdb(&kernel);
    while (seen.contains("239.7.7.7") || seen.contains("ff0e::7:7")) && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(200));
        seen = mdb(&kernel);
    }
    assert!(!seen.contains("239.7.7.7") && !seen.contains("ff0e::7:7"), "forgotten after the leave: {seen}");
    let counters = stack.counters();
    running.stop();
    tcpdump.stop();
    (capture_frames(&kfile), counters)
}

/// spate's IGMP messages on the wire: (type, IPv4 destination).
fn igmp_messages(frames: &[(f64, Vec<u8>)]) -> Vec<(u8, [u8; 4])> {
    let from_spate = |f: &[u8]| f.len() >= 42 && f[12..14] == [8, 0] && f[23] == 2 && f[26..30] == [198, 18, 0, 2];
    frames.iter().filter(|(_, f)| from_spate(f)).map(|(_, f)| (f[38], f[30..34].try_into().unwrap())).collect()
}

/// spate's MLD messages on the wire (ICMPv6 after a hop-by-hop header):
/// (type, IPv6 destination).
fn mld_messages(frames: &[(f64, Vec<u8>)]) -> Vec<(u8, Ipv6Addr)> {
    let spate_mac = [0x02, 0x53, 0x50, 0x41, 0x54, 0x45];
    let from_spate = |f: &[u8]| f.len() >= 70 && f[6..12] == spate_mac && f[12..14] == [0x86, 0xdd] && f[20] == 0;
    frames
        .iter()
        .filter(|(_, f)| from_spate(f) && f[54] == 58)
        .map(|(_, f)| (f[62], Ipv6Addr::from(<[u8; 16]>::try_from(&f[38..54]).unwrap())))
        .collect()
}

#[test]
fn a_snooping_bridge_learns_spates_memberships_and_forgets_them() {
    let (frames, c) = bridge_learns_and_forgets("mdb", 3, 2);
    // Reports of the latest versions only: IGMPv3 to 224.0.0.22, MLDv2
    // (143) to ff02::16.
    let igmp = igmp_messages(&frames);
    assert!(!igmp.is_empty() && igmp.iter().all(|m| *m == (0x22, [224, 0, 0, 22])), "{igmp:?}");
    let mld = mld_messages(&frames);
    assert!(!mld.is_empty() && mld.iter().all(|m| *m == (143, "ff02::16".parse().unwrap())), "{mld:?}");
    assert_eq!(c[spate::Counter::IgmpOutLeaves] + c[spate::Counter::Mld6OutDones], 0);
}

#[test]
fn an_igmpv2_and_mldv1_querier_is_answered_in_its_version() {
    let (frames, c) = bridge_learns_and_forgets("mdbv2", 2, 1);
    // Once the older querier is heard (RFC 3376 7.2.1, RFC 3810 8.2.1):
    // IGMPv2 reports (0x16) to the group and a leave (0x17) to 224.0.0.2;
    // MLDv1 reports (131) to the group and a done (132) to ff02::2.
    let igmp = igmp_messages(&frames);
    let g4 = [239, 7, 7, 7];
    assert!(igmp.contains(&(0x16, g4)) && igmp.contains(&(0x17, [224, 0, 0, 2])), "{igmp:?}");
    let first_v2 = igmp.iter().position(|m| m.0 == 0x16).unwrap();
    assert!(igmp[first_v2..].iter().all(|m| m.0 != 0x22), "no IGMPv3 report after the v2 querier: {igmp:?}");
    let mld = mld_messages(&frames);
    let g6: Ipv6Addr = "ff0e::7:7".parse().unwrap();
    assert!(mld.contains(&(131, g6)) && mld.contains(&(132, "ff02::2".parse().unwrap())), "{mld:?}");
    assert!(c[spate::Counter::IgmpOutLeaves] >= 1 && c[spate::Counter::Mld6OutDones] >= 1);
}

#[test]
fn spate_echo_joins_a_group_and_answers_from_its_own_address() {
    let _serial = device_lock();
    let (spate_ns, kernel) = spate_and_kernel("mecho");
    kernel.must(&["ip", "route", "add", "224.0.0.0/4", "dev", "vB"]);
    let args: Vec<String> = ["--vdev", "net_af_packet0,iface=vA", "--ip", "198.18.0.2/24", "--lcores", "0"]
        .into_iter()
        .chain(["--interval", "0", "--join", "239.1.2.3", "--join", "239.1.2.4,198.18.0.9"])
        .map(String::from)
        .collect();
    let echo = spate_testkit::SpateApp::start(&spate_ns, env!("CARGO_BIN_EXE_spate-echo"), &args, "UDP echo on");
    let got = kernel.run(|| {
        let k = KernelSocket::bind("198.18.0.1:0").unwrap();
        k.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 64];
        // The any-source group is answered from spate's unicast address;
        // the source-specific one only takes 198.18.0.9's.
        k.send_to(b"to the group", "239.1.2.3:7").unwrap();
        let first = k.recv_from(&mut buf).map(|(n, from)| (buf[..n].to_vec(), from));
        k.send_to(b"not from its source", "239.1.2.4:7").unwrap();
        let second = k.recv_from(&mut buf).map(|(n, _)| buf[..n].to_vec());
        (first.ok(), second.is_err())
    });
    let (first, refused) = got;
    assert_eq!(first, Some((b"to the group".to_vec(), "198.18.0.2:7".parse().unwrap())));
    assert!(refused, "a datagram from a source the join does not include is not answered");
    let (c, out) = echo.stop();
    assert_eq!(spate_testkit::counter(&c, "Udp.InDatagrams"), 1, "{out}");
}

#[test]
fn every_member_socket_gets_every_datagram_and_spates_own_sends_loop_back() {
    let _serial = device_lock();
    shared_eal(Memory::Hugepages);
    let (spate_ns, kernel) = spate_and_kernel("mmany");
    kernel.must(&["ip", "route", "add", "224.0.0.0/4", "dev", "vB"]);
    let stack = af_packet_stack(&spate_ns, &["198.18.0.2/24", "fd00::2/64"], 4095);
    let running = stack.spawn_polling().unwrap();
    let g = Ipv4Addr::new(239, 6, 6, 6);
    let builder = || UdpSocket::builder(&stack).reuseport(true);
    // Eight members: four in one reuseport group, each joined; two bound
    // to the group itself (Linux allows it), one of them joined; a
    // dual-stack IPv6 socket; one bound to the interface.
    let mut members: Vec<(String, UdpSocket)> = Vec::new();
    for i in 0..4 {
        let s = builder().bind("0.0.0.0:6000").unwrap();
        s.join_multicast_v4(&g, &ANY).unwrap();
        members.push((format!("reuseport{i}"), s));
    }
    for i in 0..2 {
        let s = builder().bind("239.6.6.6:6000").unwrap();
        assert_eq!(s.local_addr().unwrap(), "239.6.6.6:6000".parse().unwrap());
        if i == 0 {
            s.join_multicast_v4(&g, &ANY).unwrap();
        }
        members.push((format!("group-bound{i}"), s));
    }
    members.push(("dual-stack".into(), builder().bind("[::]:6000").unwrap()));
    members.push(("on-vA".into(), builder().bind_device(0).bind("0.0.0.0:6000").unwrap()));
    // Not members: bound to the unicast address, and to another group.
    let unicast = builder().bind("198.18.0.2:6000").unwrap();
    let other_group = builder().bind("239.9.9.9:6000").unwrap();

    // The kernel sends a burst of datagrams to the group: each member gets
    // each one (every copy but the last made per member, more than one
    // burst's worth of copies).
    const N: usize = 40;
    kernel.run(|| {
        let k = KernelSocket::bind("198.18.0.1:0").unwrap();
        for i in 0..N {
            k.send_to(format!("k{i:02}").as_bytes(), "239.6.6.6:6000").unwrap();
        }
    });
    let all: Vec<String> = (0..N).map(|i| format!("k{i:02}")).collect();
    let mut socks: Vec<(&str, &UdpSocket)> = members.iter().map(|(n, s)| (n.as_str(), s)).collect();
    socks.push(("unicast", &unicast));
    socks.push(("other-group", &other_group));
    let got = drain(&socks, Duration::from_millis(100));
    for (name, _) in &members {
        assert_eq!(got[name], all, "{name} gets every datagram");
    }
    assert!(got["unicast"].is_empty() && got["other-group"].is_empty(), "{got:?}");
    let c = stack.counters();
    assert_eq!(c[spate::Counter::UdpRcvbufErrors], 0, "no copy dropped");

    // spate's own send to the group: the kernel's member gets it and so
    // does every local member (IP_MULTICAST_LOOP, on by default)...
    let member = kernel_member(&kernel, g, 6000, Duration::from_millis(500));
    let kernel_got = |member: &KernelSocket| {
        let mut buf = [0u8; 64];
        member.recv_from(&mut buf).ok().map(|(n, _)| String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    let sender = UdpSocket::bind(&stack, "0.0.0.0:0").unwrap();
    assert!(sender.multicast_loop_v4().unwrap(), "Linux's default");
    let to = SocketAddr::new(g.into(), 6000);
    sender.send_to(b"own", to).unwrap();
    let member = kernel.run(move || {
        assert_eq!(kernel_got(&member).as_deref(), Some("own"));
        member
    });
    let got = drain(&socks, Duration::from_millis(100));
    for (name, _) in &members {
        assert_eq!(got[name], ["own"], "{name} hears spate's own datagram");
    }
    assert!(got["unicast"].is_empty() && got["other-group"].is_empty(), "{got:?}");
    // ...but none with the loop off...
    sender.set_multicast_loop_v4(false).unwrap();
    sender.send_to(b"not-looped", to).unwrap();
    let member = kernel.run(move || {
        assert_eq!(kernel_got(&member).as_deref(), Some("not-looped"));
        member
    });
    let got = drain(&socks, Duration::from_millis(100));
    assert!(got.values().all(|v| v.is_empty()), "{got:?}");
    // ...and with TTL 0 only the local members (Linux's ip_mc_output).
    sender.set_multicast_loop_v4(true).unwrap();
    sender.set_multicast_ttl_v4(0).unwrap();
    sender.send_to(b"host-only", to).unwrap();
    let got = drain(&socks, Duration::from_millis(100));
    for (name, _) in &members {
        assert_eq!(got[name], ["host-only"], "{name}");
    }
    kernel.run(move || assert_eq!(kernel_got(&member), None, "a TTL 0 datagram stays in the host"));

    // IPv6 too: a member of ff0e::6:6 hears its own stack's datagram.
    let g6: Ipv6Addr = "ff0e::6:6".parse().unwrap();
    let v6 = UdpSocket::builder(&stack).only_v6(true).bind("[::]:6001").unwrap();
    v6.join_multicast_v6(&g6, 1).unwrap();
    let sender6 = UdpSocket::bind(&stack, "[::]:0").unwrap();
    assert!(sender6.multicast_loop_v6().unwrap());
    sender6.send_to(b"own6", SocketAddr::new(g6.into(), 6001)).unwrap();
    let got = drain(&[("v6", &v6)], Duration::from_millis(100));
    assert_eq!(got["v6"], ["own6"]);
    let c = stack.counters();
    assert_eq!(c[spate::Counter::IpOutDiscards] + c[spate::Counter::Ip6OutDiscards], 0);

    // A flood of general queries (IGMPv3, answers within 100 ms) for a
    // second: answers stay within the rate limit (3 at once, 2 a second
    // for general queries), the rest counted.
    let before = stack.counters();
    let t = std::time::Instant::now();
    let queries = kernel.run(|| {
        let raw =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::RAW, Some(socket2::Protocol::from(2))).unwrap();
        raw.set_multicast_if_v4(&S1).unwrap();
        let mut q = [0x11u8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let sum = q.chunks(2).map(|w| u16::from_be_bytes([w[0], w[1]]) as u32).sum::<u32>();
        let sum = !(((sum & 0xffff) + (sum >> 16)) as u16);
        q[2..4].copy_from_slice(&sum.to_be_bytes());
        let to = SocketAddr::new(Ipv4Addr::new(224, 0, 0, 1).into(), 0).into();
        let start = std::time::Instant::now();
        let mut sent = 0u64;
        while start.elapsed() < Duration::from_secs(1) {
            raw.send_to(&q, &to).unwrap();
            sent += 1;
            std::thread::sleep(Duration::from_micros(500));
        }
        sent
    });
    std::thread::sleep(Duration::from_millis(300));
    let elapsed = t.elapsed().as_secs_f64();
    let after = stack.counters();
    let heard = after[spate::Counter::IgmpInQueries] - before[spate::Counter::IgmpInQueries];
    let answers = after[spate::Counter::IgmpOutReports] - before[spate::Counter::IgmpOutReports];
    let limited = after[spate::Counter::IgmpAnswersLimited] - before[spate::Counter::IgmpAnswersLimited];
    println!("{queries} queries sent, {heard} heard, {answers} answered, {limited} answers limited in {elapsed:.2} s");
    assert!(heard * 10 >= queries * 9, "the queries arrived");
    assert!(limited > 0, "the flood met the limit");
    assert!(answers as f64 <= 3.0 + 2.0 * elapsed + 1.0, "{answers} answers in {elapsed:.2} s");

    // A send right after the join loops back, as on Linux, also when the
    // lcore's loop iteration began before the join: 1,000 joins, each
    // followed at once by a send (TTL 0: nothing leaves the host), each
    // copy back within a second.
    let g7 = Ipv4Addr::new(239, 6, 6, 7);
    let quick = UdpSocket::bind(&stack, "0.0.0.0:6002").unwrap();
    quick.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut missed = Vec::new();
    // Ten misses say enough (each costs a second).
    for i in 0..1000u32 {
        if missed.len() == 10 {
            break;
        }
        quick.join_multicast_v4(&g7, &ANY).unwrap();
        sender.send_to(&i.to_be_bytes(), SocketAddr::new(g7.into(), 6002)).unwrap();
        let mut buf = [0u8; 8];
        match quick.recv(&mut buf) {
            Ok(4) if buf[..4] == i.to_be_bytes() => {}
            other => missed.push((i, other.map(|n| buf[..n].to_vec()).map_err(|e| e.kind()))),
        }
        quick.leave_multicast_v4(&g7, &ANY).unwrap();
    }
    assert!(missed.is_empty(), "sends right after a join not looped back: {missed:?}");
    running.stop();
}

/// A stack on lcore 1 on `device`, its port not promiscuous (the device
/// filters), at 198.18.0.2/24 and fd00::2/64.
fn device_filtered_config(device: &str) -> spate::StackConfig {
    let mut port = spate::PortSpec::new(device).addr("198.18.0.2/24").unwrap().addr("fd00::2/64").unwrap();
    port.promiscuous = false;
    spate::StackConfig {
        lcores: "1".into(),
        ports: vec![port],
        stop_on_signal: false,
        mempool_size: 4095,
        ..spate::StackConfig::default()
    }
}

/// A stack in `ns` on `device` that does not run promiscuous, with a
/// member of 239.10.11.12 that the kernel in `kernel` sends to: returns
/// how the port hears its groups, once the datagram arrived.
fn not_promiscuous(
    ns: &spate_testkit::Netns,
    device: String,
    kernel: &spate_testkit::Netns,
    dev: &str,
) -> spate::DeviceFilter {
    let cfg = device_filtered_config(&device);
    let stack = ns.run(move || spate::Stack::new(cfg).expect("the stack"));
    if dev == "mtap0" {
        spate_testkit::kernel_peer(kernel, dev);
    }
    kernel.must(&["ip", "route", "add", "224.0.0.0/4", "dev", dev]);
    let running = stack.spawn_polling().unwrap();
    let s = UdpSocket::bind(&stack, "0.0.0.0:5000").unwrap();
    let g = Ipv4Addr::new(239, 10, 11, 12);
    s.join_multicast_v4(&g, &ANY).unwrap();
    kernel.run(|| {
        let k = KernelSocket::bind("198.18.0.1:0").unwrap();
        k.send_to(b"through the filter", "239.10.11.12:5000").unwrap();
    });
    let got = drain(&[("member", &s)], Duration::from_millis(500));
    assert_eq!(got["member"], ["through the filter"], "{device}");
    let filter = stack.multicast_filter(0).expect("configured not promiscuous");
    if filter == spate::DeviceFilter::Promiscuous {
        let link = ns.must(&["ip", "link", "show", "vA"]);
        assert!(link.contains("PROMISC"), "{link}");
    }
    drop(s);
    running.stop();
    filter
}

#[test]
fn a_port_that_is_not_promiscuous_hears_its_groups() {
    let _serial = device_lock();
    shared_eal(Memory::Hugepages);
    // net_tap takes a multicast list (and filters nothing: its
    // `set_mc_addr_list` accepts any and the kernel hands it every frame).
    let ns = spate_testkit::Netns::new("mtap");
    let tap = not_promiscuous(&ns, format!("{},iface=mtap0", unique("net_tap")), &ns, "mtap0");
    assert_eq!(tap, spate::DeviceFilter::List);
    // net_af_packet has neither a list nor all-multicast: spate turns the
    // port promiscuous (the kernel shows it on vA).
    let (spate_ns, kernel) = spate_and_kernel("mpromisc");
    assert!(!spate_ns.must(&["ip", "link", "show", "vA"]).contains("PROMISC"));
    let af = not_promiscuous(&spate_ns, format!("{},iface=vA", unique("net_af_packet")), &kernel, "vB");
    assert_eq!(af, spate::DeviceFilter::Promiscuous);
}

/// Removes a file when dropped (a vhost-user socket the test named).
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn multicast_over_net_virtio_user_through_ovs_dpdk() {
    let _serial = device_lock();
    shared_eal(Memory::Hugepages);
    // The kernel (vB) to OVS-DPDK (vO, net_af_packet) to spate in this
    // process (net_virtio_user serving a vhost-user socket OVS connects
    // to); OVS forwards every frame, group traffic included.
    let ovs_ns = spate_testkit::Netns::new("movs");
    let kernel = spate_testkit::Netns::new("movspeer");
    spate_testkit::veth(&ovs_ns, "vO", &kernel, "vB");
    ovs_ns.must(&["ip", "link", "set", "vO", "up"]);
    ovs_ns.must(&["ethtool", "-K", "vO", "tx", "off"]);
    ovs_ns.disable_ipv6("vO");
    spate_testkit::kernel_peer(&kernel, "vB");
    kernel.must(&["ip", "addr", "add", "198.18.0.3/24", "dev", "vB"]);
    kernel.must(&["ip", "route", "add", "224.0.0.0/4", "dev", "vB"]);
    let sock = spate_testkit::unique_socket_path("movs");
    let _sock = RemoveOnDrop(sock.clone());
    let device = format!(
        "{},path={},server=1,queues=1,queue_size=1024,mac=02:53:50:41:54:45",
        unique("net_virtio_user"),
        sock.display()
    );
    let cfg = device_filtered_config(&device);
    // In server mode the port waits for OVS to connect.
    let starting = std::thread::spawn(move || spate::Stack::new(cfg).expect("the stack"));
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while !sock.exists() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(sock.exists(), "spate made no vhost-user socket");
    let ovs = spate_testkit::ovs::Ovs::start(
        &ovs_ns,
        &[spate_testkit::ovs::OvsPort::AfPacket("vO".into()), spate_testkit::ovs::OvsPort::VhostClient(sock.clone())],
        &["in_port=1,actions=output:2", "in_port=2,actions=output:1"],
    );
    let stack = starting.join().expect("the stack starts once OVS connects");
    let running = stack.spawn_polling().unwrap();
    // OVS offers no control queue: no list, no all-multicast, no
    // promiscuous mode; the device filters nothing.
    assert_eq!(stack.multicast_filter(0), Some(spate::DeviceFilter::Unfiltered));

    let bind = |addr: &str| UdpSocket::builder(&stack).reuseport(true).bind(addr).unwrap();
    let any = bind("0.0.0.0:5000");
    any.join_multicast_v4(&G1, &ANY).unwrap();
    let not_s1 = bind("0.0.0.0:5000");
    not_s1.join_multicast_v4(&G1, &ANY).unwrap();
    not_s1.block_source_v4(&G1, &S1, &ANY).unwrap();
    let only_s1 = bind("0.0.0.0:5000");
    only_s1.join_source_multicast_v4(&G1, &S1, &ANY).unwrap();
    for s in [&any, &not_s1, &only_s1] {
        s.set_multicast_all(false).unwrap();
    }
    let v6 = UdpSocket::builder(&stack).only_v6(true).bind("[::]:5000").unwrap();
    let g6: Ipv6Addr = "ff0e::8:8".parse().unwrap();
    v6.join_multicast_v6(&g6, 1).unwrap();
    // The kernel's senders: from two sources to the group; IPv6.
    kernel_sends(&kernel, &[(G1, "g1")], g6);
    let got =
        drain(&[("any", &any), ("not_s1", &not_s1), ("only_s1", &only_s1), ("v6", &v6)], Duration::from_millis(300));
    assert_eq!(
        got,
        want(&[("any", &["g1-s1", "g1-s3"]), ("not_s1", &["g1-s3"]), ("only_s1", &["g1-s1"]), ("v6", &["g6"])]),
        "{}",
        ovs.log()
    );

    // spate's send reaches a kernel member through OVS.
    let g5 = Ipv4Addr::new(239, 5, 5, 5);
    let member = kernel_member(&kernel, g5, 6000, Duration::from_secs(3));
    let sender = UdpSocket::bind(&stack, "0.0.0.0:0").unwrap();
    sender.send_to(b"to-g5", SocketAddr::new(g5.into(), 6000)).unwrap();
    let text = kernel.run(move || {
        let mut buf = [0u8; 64];
        let (n, _) = member.recv_from(&mut buf).expect("the kernel member gets spate's datagram");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    });
    assert_eq!(text, "to-g5");
    let c = stack.counters();
    assert!(c[spate::Counter::IgmpOutReports] >= 1 && c[spate::Counter::Mld6OutReports] >= 1);
    drop((any, not_s1, only_s1, v6, sender));
    running.stop();
    drop(stack);
    drop(ovs);
}

#[test]
fn spate_flood_sends_to_a_group_with_its_ttl() {
    let _serial = device_lock();
    let (spate_ns, kernel) = spate_and_kernel("mflood");
    let g = Ipv4Addr::new(239, 1, 2, 5);
    let member = kernel_member(&kernel, g, 6000, Duration::from_secs(5));
    let kfile = std::env::temp_dir().join(format!("{}.pcap", unique("spate-mflood-")));
    let args =
        ["-i", "vB", "-U", "--immediate-mode", "-c", "5", "-w", &kfile.display().to_string(), "dst host 239.1.2.5"];
    let mut tcpdump = kernel.spawn("tcpdump", "tcpdump", &args.map(String::from), Duration::from_secs(60)).unwrap();
    tcpdump.remove_on_drop(&kfile);
    assert!(tcpdump.wait_for_output("listening on vB", Duration::from_secs(10)), "{}", tcpdump.output());
    let flood_args: Vec<String> = ["--vdev", "net_af_packet0,iface=vA", "--ip", "198.18.0.2/24", "--lcores", "0"]
        .into_iter()
        .chain(["--dst", "239.1.2.5:6000", "--ttl", "3", "--rate", "200", "--time", "1", "--interval", "0"])
        .map(String::from)
        .collect();
    let mut flood =
        spate_ns.spawn("flood", env!("CARGO_BIN_EXE_spate-flood"), &flood_args, Duration::from_secs(60)).unwrap();
    let got = kernel.run(move || {
        let mut buf = [0u8; 64];
        member.recv_from(&mut buf).map(|(_, from)| from.ip())
    });
    assert_eq!(got.ok(), Some("198.18.0.2".parse().unwrap()), "the kernel member gets spate-flood's datagrams");
    assert!(flood.wait_exit(Duration::from_secs(30)), "{}", flood.output());
    assert!(tcpdump.wait_exit(Duration::from_secs(10)), "{}", tcpdump.output());
    let frames = capture_frames(&kfile);
    assert!(!frames.is_empty() && frames.iter().all(|(_, f)| f[22] == 3 && f[..6] == [1, 0, 0x5e, 1, 2, 5]), "TTL 3");
}

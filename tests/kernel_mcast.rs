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
    let g1_and_all = bind("0.0.0.0:5000");
    g1_and_all.join_multicast_v4(&G1, &ANY).unwrap();
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
    let vb_index: u32 = kernel.must(&["cat", "/sys/class/net/vB/ifindex"]).trim().parse().unwrap();
    kernel.run(move || {
        for (src, tag) in [(S1, "s1"), (S3, "s3")] {
            let k = KernelSocket::bind(SocketAddr::new(src.into(), 0)).unwrap();
            for (g, gt) in [(G1, "g1"), (G2, "g2"), (G3, "g3")] {
                k.send_to(format!("{gt}-{tag}").as_bytes(), SocketAddr::new(g.into(), 5000)).unwrap();
            }
        }
        let k6 = socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::DGRAM, None).unwrap();
        k6.set_multicast_if_v6(vb_index).unwrap();
        k6.send_to(b"g6", &SocketAddr::new(g6.into(), 5000).into()).unwrap();
    });
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
    let member = kernel.run(move || {
        let k = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
        k.set_reuse_address(true).unwrap();
        k.bind(&SocketAddr::new(ANY.into(), 6000).into()).unwrap();
        k.join_multicast_v4(&g5, &S1).unwrap();
        let k: KernelSocket = k.into();
        k.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        k
    });
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

#[test]
fn a_snooping_bridge_learns_spates_memberships_and_forgets_them() {
    let _serial = device_lock();
    shared_eal(Memory::Hugepages);
    let (spate_ns, kernel) = spate_and_kernel("mdb");
    // The kernel's side becomes a snooping bridge with a querier (IGMPv3,
    // MLDv2; a query every 2 s, answers within 1 s, a membership lasts
    // 5 s unless reported again).
    kernel.must(&["ip", "addr", "flush", "dev", "vB"]);
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
        "3",
        "mcast_mld_version",
        "2",
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
    assert!(answered[spate::Counter::RxIgmp] >= 1, "the querier's queries arrived");

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
    running.stop();
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

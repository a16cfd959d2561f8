//! spate-echo against the Linux kernel in a peer namespace, over veth with
//! net_pcap and net_af_packet, and over net_tap: ARP and ND resolve, the
//! kernel pings spate over IPv4 and IPv6, 1,000 datagrams of every size up
//! to the MTU echo byte-exact, a closed port gives ECONNREFUSED, and
//! spate's counters match what was sent.

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use spate_testkit::{Netns, SpateApp, counter, device_lock, kernel_peer, veth};

const ECHO: &str = env!("CARGO_BIN_EXE_spate-echo");
const DATAGRAMS: usize = 1000;

enum Mode {
    Pcap,
    AfPacket,
    Tap,
}

/// What the kernel side did.
#[derive(Debug, Default)]
struct Sent {
    v4: u64,
    v6: u64,
}

/// spate-echo's arguments; `lcores` "1" leaves the EAL main lcore 0 idle
/// and the calling thread waiting for the polling lcore.
fn echo_args(device: Option<String>, lcores: &str) -> Vec<String> {
    let mut a = vec![];
    if let Some(d) = device {
        a.extend(["--vdev".to_string(), d]);
    }
    a.extend(["--lcores".to_string(), lcores.to_string()]);
    a.extend(
        ["--ip", "198.18.0.2/24", "--ip6", "fd00::2/64", "--idle-sleep", "20", "--interval", "0.5", "--mbufs", "4095"]
            .map(String::from),
    );
    a
}

/// Echoes every size from 0 to `max` bytes (DATAGRAMS of them), byte-exact.
fn echo_sizes(target: SocketAddr, max: usize) -> u64 {
    let bind = if target.is_ipv4() { "198.18.0.1:0" } else { "[fd00::1]:0" };
    let s = UdpSocket::bind(bind).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut sent = 0;
    let mut buf = vec![0u8; 2048];
    for i in 0..DATAGRAMS {
        let len = i * max / (DATAGRAMS - 1);
        let payload: Vec<u8> = (0..len).map(|j| (i * 7 + j * 13) as u8).collect();
        let mut attempt = 0;
        loop {
            s.send_to(&payload, target).unwrap();
            sent += 1;
            match s.recv_from(&mut buf) {
                Ok((n, from)) => {
                    assert_eq!(from, target);
                    assert_eq!(&buf[..n], &payload[..], "datagram {i} ({len} bytes) came back different");
                    break;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock && attempt < 3 => attempt += 1,
                Err(e) => panic!("datagram {i} ({len} bytes): {e}"),
            }
        }
    }
    sent
}

fn refused(target: SocketAddr) {
    let bind = if target.is_ipv4() { "198.18.0.1:0" } else { "[fd00::1]:0" };
    let s = UdpSocket::bind(bind).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    s.connect(target).unwrap();
    s.send(b"is anyone there").unwrap();
    let err = s.recv(&mut [0u8; 16]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "spate's ICMP port unreachable reaches the socket");
}

fn run(mode: Mode) {
    let _serial = device_lock();
    let spate_ns = Netns::new("echo");
    let (app, peer_ns) = match mode {
        Mode::Pcap | Mode::AfPacket => {
            let kernel_ns = Netns::new("peer");
            veth(&spate_ns, "vA", &kernel_ns, "vB");
            spate_ns.must(&["ip", "link", "set", "vA", "address", "02:53:50:41:54:45"]);
            spate_ns.disable_ipv6("vA");
            kernel_peer(&kernel_ns, "vB");
            let (dev, lcores) = match mode {
                Mode::Pcap => ("net_pcap0,iface=vA,phy_mac=1", "0"),
                _ => ("net_af_packet0,iface=vA", "1"),
            };
            let app = SpateApp::start(&spate_ns, ECHO, &echo_args(Some(dev.into()), lcores), "UDP echo on");
            (app, Some(kernel_ns))
        }
        Mode::Tap => {
            let app = SpateApp::start(&spate_ns, ECHO, &echo_args(None, "0"), "UDP echo on");
            kernel_peer(&spate_ns, "spate0");
            (app, None)
        }
    };
    let peer = peer_ns.as_ref().unwrap_or(&spate_ns);

    for target in ["198.18.0.2", "fd00::2"] {
        let out = peer.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", target]);
        assert!(out.status.success(), "ping {target}: {}", String::from_utf8_lossy(&out.stdout));
    }
    let neigh = peer.must(&["ip", "neigh", "show"]);
    assert!(neigh.contains("198.18.0.2") && neigh.contains("02:53:50:41:54:45"), "ARP resolved: {neigh}");
    assert!(neigh.contains("fd00::2"), "ND resolved: {neigh}");

    let sent = peer.run(|| {
        let v4 = echo_sizes("198.18.0.2:7".parse().unwrap(), 1472);
        let v6 = echo_sizes("[fd00::2]:7".parse().unwrap(), 1452);
        refused("198.18.0.2:9".parse().unwrap());
        refused("[fd00::2]:9".parse().unwrap());
        Sent { v4, v6 }
    });

    let (c, out) = app.stop();
    assert_eq!(counter(&c, "Udp.InDatagrams"), sent.v4, "{out}");
    assert_eq!(counter(&c, "Udp6.InDatagrams"), sent.v6, "{out}");
    assert_eq!(counter(&c, "Udp.OutDatagrams"), sent.v4, "{out}");
    assert_eq!(counter(&c, "Udp6.OutDatagrams"), sent.v6, "{out}");
    assert_eq!((counter(&c, "Udp.NoPorts"), counter(&c, "Udp6.NoPorts")), (1, 1), "{out}");
    assert_eq!(counter(&c, "Icmp.InEchos"), 3, "{out}");
    assert_eq!(counter(&c, "Icmp6.InEchos"), 3, "{out}");
    assert!(counter(&c, "Arp.OutReplies") + counter(&c, "Arp.InReplies") >= 1, "{out}");
    assert_eq!(counter(&c, "Udp.InErrors") + counter(&c, "Udp6.InErrors"), 0, "{out}");
    drop(peer_ns);
}

#[test]
fn kernel_peer_over_veth_and_net_pcap() {
    run(Mode::Pcap);
}

#[test]
fn kernel_peer_over_veth_and_net_af_packet() {
    run(Mode::AfPacket);
}

#[test]
fn kernel_peer_over_net_tap() {
    run(Mode::Tap);
}

/// The mbuf budget over net_tap, whose RX ring holds mbufs from the start:
/// the budget counts what the ring holds, and bounds set past what the
/// ring leaves of the pool are refused before a packet moves (before,
/// receive queues of 1,000 mbufs were accepted beside a ring of 1,024 in a
/// pool of 2,047: stalled readers could leave the ring nothing to refill
/// with).
#[test]
fn the_mbuf_budget_counts_the_tap_ring_and_refuses_bounds_past_it() {
    let _serial = device_lock();
    let spate_ns = Netns::new("budget");
    let config = std::env::temp_dir().join(format!("spate-budget-{}.toml", std::process::id()));
    let write = |udp_mem: &str| {
        std::fs::write(
            &config,
            format!(
                "lcores = \"0\"\nmempool_size = 2047\nrx_desc = 1024\n{udp_mem}\n[[ports]]\n\
                 device = \"net_tap0,iface=spate0\"\nipv4 = [\"198.18.0.2/24\"]\n"
            ),
        )
        .unwrap()
    };
    let args = vec!["--config".to_string(), config.display().to_string(), "--interval".into(), "0.5".into()];
    write("");
    let app = SpateApp::start(&spate_ns, ECHO, &args, "UDP echo on");
    let (_, out) = app.stop();
    let line = out.lines().find(|l| l.contains("mbuf budget")).unwrap_or_else(|| panic!("no budget line: {out}"));
    let rx_rings: usize = line.split("RX rings ").nth(1).and_then(|r| r.split(',').next()).unwrap().parse().unwrap();
    assert!(rx_rings >= 512, "the tap's RX ring holds mbufs: {line}");
    write(&format!("udp_mem_bytes = {}", 1000 * 2304));
    let mut proc = spate_ns.spawn("budget", ECHO, &args, Duration::from_secs(60)).unwrap();
    assert!(proc.wait_exit(Duration::from_secs(30)), "spate-echo started: {}", proc.output());
    std::fs::remove_file(&config).unwrap();
    let out = proc.output();
    assert!(out.contains("udp_mem_bytes") && out.contains("set") && out.contains("RX rings"), "{out}");
    assert!(!out.contains("UDP echo on"), "{out}");
}

/// Namespaces `<tag>` (spate's side, veth `vA` with spate's MAC) and
/// `<tag>peer` (the peer's, `vB`), joined by a veth pair, IPv6 off on both.
fn ipv4_veth_pair(tag: &str) -> (Netns, Netns) {
    let spate_ns = Netns::new(tag);
    let kernel_ns = Netns::new(&format!("{tag}peer"));
    veth(&spate_ns, "vA", &kernel_ns, "vB");
    spate_ns.must(&["ip", "link", "set", "vA", "address", "02:53:50:41:54:45"]);
    spate_ns.disable_ipv6("vA");
    kernel_ns.disable_ipv6("vB");
    (spate_ns, kernel_ns)
}

/// An 802.1Q-tagged port described in a TOML config file. This kernel has
/// no VLAN driver (8021q), so scapy plays the tagged peer on the veth:
/// spate answers its ARP and echoes its datagrams with tag 42, and refuses
/// untagged frames.
#[test]
fn vlan_tagged_port_from_a_config_file() {
    let _serial = device_lock();
    let (spate_ns, kernel_ns) = ipv4_veth_pair("vlan");
    let config = std::env::temp_dir().join(format!("spate-vlan-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        r#"
lcores = "0"
idle_sleep_us = 20
mempool_size = 4095
[[ports]]
device = "net_pcap0,iface=vA,phy_mac=1"
vlan = 42
ipv4 = ["198.18.0.2/24"]
"#,
    )
    .unwrap();
    let args = vec!["--config".to_string(), config.display().to_string(), "--interval".into(), "0.5".into()];
    let app = SpateApp::start(&spate_ns, ECHO, &args, "UDP echo on");
    std::fs::remove_file(&config).unwrap();
    let script = r#"
import logging
logging.getLogger('scapy.runtime').setLevel(logging.ERROR)
from scapy.all import *
PM='6a:1f:3c:55:10:9e'; SM='02:53:50:41:54:45'
a = srp1(Ether(src=PM,dst='ff:ff:ff:ff:ff:ff')/Dot1Q(vlan=42)/ARP(op=1,hwsrc=PM,psrc='198.18.0.1',pdst='198.18.0.2'), iface='vB', timeout=3, verbose=False)
assert a is not None and a[Dot1Q].vlan == 42 and a[ARP].op == 2 and a[ARP].hwsrc == SM, a
ok = 0
for i in range(10):
    p = Ether(src=PM,dst=SM)/Dot1Q(vlan=42)/IP(src='198.18.0.1',dst='198.18.0.2')/UDP(sport=40000+i,dport=7)/(bytes([i])*100)
    r = srp1(p, iface='vB', timeout=3, verbose=False)
    assert r is not None and r[Dot1Q].vlan == 42 and bytes(r[UDP].payload) == bytes([i])*100, r
    ok += 1
sendp(Ether(src=PM,dst=SM)/IP(src='198.18.0.1',dst='198.18.0.2')/UDP(sport=41000,dport=7)/b'untagged', iface='vB', count=3, verbose=False)
print('echoed', ok)
"#;
    let out = kernel_ns.must(&["/usr/bin/python3", "-c", script]);
    assert!(out.contains("echoed 10"), "{out}");
    let (c, out) = app.stop();
    assert_eq!(counter(&c, "Udp.InDatagrams"), 10, "{out}");
    assert_eq!(counter(&c, "Rx.VlanMismatch"), 3, "untagged frames refused: {out}");
}

/// `spate-echo --sockets 4`: a reuseport group answers flows from many
/// source ports, and the group shares them.
#[test]
fn reuseport_group_answers_many_flows() {
    let _serial = device_lock();
    let spate_ns = Netns::new("group");
    let kernel_ns = Netns::new("grouppeer");
    veth(&spate_ns, "vA", &kernel_ns, "vB");
    spate_ns.must(&["ip", "link", "set", "vA", "address", "02:53:50:41:54:45"]);
    spate_ns.disable_ipv6("vA");
    kernel_peer(&kernel_ns, "vB");
    let mut args = echo_args(Some("net_pcap0,iface=vA,phy_mac=1".into()), "0");
    args.extend(["--sockets".to_string(), "4".into()]);
    let app = SpateApp::start(&spate_ns, ECHO, &args, "4 sockets in a reuseport group");
    let flows = 200;
    kernel_ns.run(move || {
        for i in 0..flows {
            let s = UdpSocket::bind("198.18.0.1:0").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let msg = format!("flow {i}");
            s.send_to(msg.as_bytes(), "198.18.0.2:7").unwrap();
            let mut buf = [0u8; 64];
            let (n, _) = s.recv_from(&mut buf).unwrap_or_else(|e| panic!("flow {i}: {e}"));
            assert_eq!(&buf[..n], msg.as_bytes());
        }
    });
    let (c, out) = app.stop();
    assert_eq!(counter(&c, "Udp.InDatagrams"), flows, "{out}");
    assert_eq!(counter(&c, "Udp.OutDatagrams"), flows, "{out}");
    let shares: Vec<u64> = (0..4).map(|i| counter(&c, &format!("Sockets.{i}"))).collect();
    assert_eq!(shares.iter().sum::<u64>(), flows, "{out}");
    assert!(shares.iter().all(|&n| n >= 20), "every member takes a share of 200 flows: {shares:?}");
}

/// spate-echo on two lcores over net_pcap (one queue pair, no RSS: software
/// RSS): 64 kernel sockets (64 flows) each echo datagrams of 1 to 4,000
/// bytes byte-exact, the larger ones as IP fragments both ways; flows were
/// handed to the second lcore, fragments reassembled and handed to their
/// flow's lcore, and the second lcore's replies left through the first's
/// TX queue.
#[test]
fn two_lcores_echo_many_flows_and_fragments() {
    let _serial = device_lock();
    let spate_ns = Netns::new("echo2");
    let kernel_ns = Netns::new("peer2");
    veth(&spate_ns, "vA", &kernel_ns, "vB");
    spate_ns.must(&["ip", "link", "set", "vA", "address", "02:53:50:41:54:45"]);
    spate_ns.disable_ipv6("vA");
    kernel_peer(&kernel_ns, "vB");
    let app =
        SpateApp::start(&spate_ns, ECHO, &echo_args(Some("net_pcap0,iface=vA,phy_mac=1".into()), "0-1"), "UDP echo on");
    let sizes = [1usize, 100, 1472, 1473, 2000, 4000];
    let (sent, fragmented) = kernel_ns.run(move || {
        let socks: Vec<UdpSocket> = (0..64).map(|_| UdpSocket::bind("198.18.0.1:0").unwrap()).collect();
        let target: SocketAddr = "198.18.0.2:7".parse().unwrap();
        let (mut sent, mut fragmented) = (0u64, 0u64);
        let mut buf = vec![0u8; 8192];
        for round in 0..5 {
            for (k, s) in socks.iter().enumerate() {
                s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                let len = sizes[(k + round) % sizes.len()];
                let payload: Vec<u8> = (0..len).map(|j| (k * 31 + round * 7 + j) as u8).collect();
                let mut attempt = 0;
                loop {
                    s.send_to(&payload, target).unwrap();
                    sent += 1;
                    fragmented += (len > 1472) as u64;
                    match s.recv_from(&mut buf) {
                        Ok((n, _)) => {
                            assert_eq!(&buf[..n], &payload[..], "flow {k}, {len} bytes, came back different");
                            break;
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock && attempt < 3 => attempt += 1,
                        Err(e) => panic!("flow {k}, {len} bytes: {e}"),
                    }
                }
            }
        }
        (sent, fragmented)
    });
    let (c, out) = app.stop();
    assert_eq!(counter(&c, "Udp.InDatagrams"), sent, "{out}");
    assert_eq!(counter(&c, "Udp.OutDatagrams"), sent, "{out}");
    assert_eq!(counter(&c, "Ip.ReasmOKs"), fragmented, "{out}");
    assert!(counter(&c, "Steer.Frames") > 0, "flows went to the second lcore\n{out}");
    assert!(counter(&c, "Steer.TxFrames") > 0, "the second lcore sent through the first's queue\n{out}");
    assert!(out.contains("software RSS"), "{out}");
    drop(kernel_ns);
}

/// Echo to a peer that never answers ARP (the kernel with `arp off` on its
/// veth, as `testpmd txonly` would be): with a static neighbour entry
/// (`--neighbor`) every datagram is echoed and nothing waits for
/// resolution; without one (the negative control) the replies wait for an
/// ARP answer that never comes.
#[test]
fn a_static_neighbour_answers_a_peer_without_arp() {
    const PEER_MAC: &str = "02:00:00:00:00:01";
    let _serial = device_lock();
    for with_entry in [false, true] {
        let (spate_ns, kernel_ns) = ipv4_veth_pair("sneigh");
        kernel_ns.must(&["ip", "link", "set", "vB", "address", PEER_MAC]);
        kernel_ns.must(&["ip", "link", "set", "vB", "arp", "off"]);
        kernel_ns.must(&["ip", "addr", "add", "198.18.0.1/24", "dev", "vB"]);
        kernel_ns.must(&["ip", "link", "set", "vB", "up"]);
        kernel_ns.must(&["ethtool", "-K", "vB", "tx", "off"]);
        kernel_ns.must(&[
            "ip",
            "neigh",
            "replace",
            "198.18.0.2",
            "lladdr",
            "02:53:50:41:54:45",
            "dev",
            "vB",
            "nud",
            "permanent",
        ]);
        let mut args = vec!["--vdev".to_string(), "net_pcap0,iface=vA,phy_mac=1".into()];
        args.extend(
            ["--lcores", "0", "--ip", "198.18.0.2/24", "--idle-sleep", "20", "--interval", "0.5"].map(String::from),
        );
        if with_entry {
            args.extend(["--neighbor".to_string(), format!("198.18.0.1={PEER_MAC}")]);
        }
        let app = SpateApp::start(&spate_ns, ECHO, &args, "UDP echo on");
        let target: SocketAddr = "198.18.0.2:7".parse().unwrap();
        let tries = if with_entry { 50 } else { 3 };
        let echoed = kernel_ns.run(move || {
            let s = UdpSocket::bind("198.18.0.1:0").unwrap();
            s.set_read_timeout(Some(Duration::from_millis(if with_entry { 2000 } else { 500 }))).unwrap();
            let mut buf = [0u8; 256];
            let mut echoed = 0u64;
            for i in 0..tries {
                let payload = [i as u8; 100];
                s.send_to(&payload, target).unwrap();
                if let Ok((n, _)) = s.recv_from(&mut buf) {
                    assert_eq!(&buf[..n], &payload[..], "datagram {i}");
                    echoed += 1;
                }
            }
            echoed
        });
        let (c, out) = app.stop();
        assert_eq!(counter(&c, "Udp.InDatagrams"), tries, "{out}");
        if with_entry {
            assert_eq!(echoed, tries, "every datagram echoed: {out}");
            assert_eq!(counter(&c, "Neigh.Queued"), 0, "nothing waited for ARP: {out}");
        } else {
            assert_eq!(echoed, 0, "without the entry no reply can go: {out}");
            assert!(counter(&c, "Neigh.Queued") >= 1, "the replies waited for ARP: {out}");
        }
    }
}

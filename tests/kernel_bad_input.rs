//! Crafted bad frames from the kernel's side of a veth (scapy), into
//! spate-echo on net_pcap: each is dropped and counted under the right
//! counter, nothing panics, echo works afterwards, and the mempool's
//! in-use count is back at its baseline.
//!
//! Frames shorter than an Ethernet header cannot cross a veth (the kernel
//! refuses to send them); the in-process fuzz test covers those. Hostile
//! fragments have a test of their own (kernel_frag.rs).

use std::collections::HashMap;
use std::net::UdpSocket;
use std::time::Duration;

use spate_testkit::{Netns, SpateApp, counter, device_lock, kernel_peer, veth};

const ECHO: &str = env!("CARGO_BIN_EXE_spate-echo");
const REPEAT: u64 = 5;

/// (name, scapy expression, counter it must land in).
const CASES: &[(&str, &str, &str)] = &[
    ("IPv4 header cut short", "Ether(dst=M,type=0x800)/Raw(bytes(IP(dst=S4))[:10])", "Rx.Ipv4Truncated"),
    ("IHL below 5", "Ether(dst=M)/IP(dst=S4,ihl=4)/UDP(dport=7)/b'x'", "Rx.Ipv4HdrErrors"),
    ("total length beyond the frame", "Ether(dst=M)/IP(dst=S4,len=1000)/UDP(dport=7)/b'x'", "Rx.Ipv4Truncated"),
    ("bad IPv4 header checksum", "Ether(dst=M)/IP(dst=S4,chksum=0x1234)/UDP(dport=7)/b'x'", "Rx.Ipv4HdrErrors"),
    ("UDP header cut short", "Ether(dst=M)/IP(dst=S4,proto=17)/Raw(b'\\x9c\\x40\\x00')", "Rx.UdpErrors"),
    ("UDP length beyond the packet", "Ether(dst=M)/IP(dst=S4)/UDP(dport=7,len=100)/(b'x'*20)", "Rx.UdpErrors"),
    ("UDP length below 8", "Ether(dst=M)/IP(dst=S4)/UDP(dport=7,len=4)/(b'x'*20)", "Rx.UdpErrors"),
    ("bad UDP checksum", "Ether(dst=M)/IP(dst=S4)/UDP(dport=7,chksum=0x1234)/b'hello'", "Rx.UdpCsumErrors"),
    ("IPv6 UDP with checksum 0", "Ether(dst=M)/IPv6(dst=S6)/UDP(dport=7,chksum=0)/b'hello'", "Rx.UdpCsumErrors"),
    (
        "IPv6 payload length beyond the frame",
        "Ether(dst=M)/IPv6(dst=S6,plen=500)/UDP(dport=7)/b'x'",
        "Rx.Ipv6Truncated",
    ),
    (
        "IPv6 extension chain longer than the frame",
        "Ether(dst=M)/IPv6(dst=S6,nh=60)/Raw(b'\\x3c\\xff'+b'\\x00'*14)",
        "Rx.Ipv6ExtErrors",
    ),
    ("bad ICMP checksum", "Ether(dst=M)/IP(dst=S4)/ICMP(chksum=0x1234)", "Rx.IcmpErrors"),
    (
        "neighbour solicitation that crossed a router",
        "Ether(dst=M)/IPv6(src='fd00::1',dst=S6,hlim=64)/ICMPv6ND_NS(tgt=S6)",
        "Rx.NdErrors",
    ),
    ("a frame for another MAC", "Ether(dst='02:00:00:00:00:99')/IP(dst=S4)/UDP(dport=7)/b'x'", "Rx.NotForUs"),
    ("unknown EtherType", "Ether(dst=M,type=0x88b5)/(b'x'*50)", "Rx.UnknownEtherType"),
    ("IPv4 for another address", "Ether(dst=M)/IP(dst='198.18.0.77')/UDP(dport=7)/b'x'", "Rx.Ipv4NotForUs"),
    ("802.1Q tag on an untagged port", "Ether(dst=M)/Dot1Q(vlan=42)/IP(dst=S4)/UDP(dport=7)/b'x'", "Rx.VlanMismatch"),
];

fn scapy_script() -> String {
    let mut s = String::from(
        "import logging\nlogging.getLogger('scapy.runtime').setLevel(logging.ERROR)\n\
         from scapy.all import *\nM='02:53:50:41:54:45'\nS4='198.18.0.2'\nS6='fd00::2'\nframes=[]\n",
    );
    for (_, expr, _) in CASES {
        s.push_str(&format!("frames += [{expr}]*{REPEAT}\n"));
    }
    s.push_str("sendp(frames, iface='vB', verbose=False)\nprint('sent', len(frames))\n");
    s
}

fn mbufs_at_start(out: &str) -> u32 {
    let line = out.lines().find(|l| l.contains("| mbufs ")).expect("a stats line");
    line.rsplit("| mbufs ").next().unwrap().trim().parse().unwrap()
}

#[test]
fn crafted_bad_frames_are_counted_and_harmless() {
    let _serial = device_lock();
    let spate_ns = Netns::new("bad");
    let kernel_ns = Netns::new("badpeer");
    veth(&spate_ns, "vA", &kernel_ns, "vB");
    spate_ns.must(&["ip", "link", "set", "vA", "address", "02:53:50:41:54:45"]);
    spate_ns.disable_ipv6("vA");
    kernel_peer(&kernel_ns, "vB");
    let args: Vec<String> = [
        "--vdev",
        "net_pcap0,iface=vA,phy_mac=1",
        "--ip",
        "198.18.0.2/24",
        "--ip6",
        "fd00::2/64",
        "--lcores",
        "0",
        "--idle-sleep",
        "20",
        "--interval",
        "0.2",
        "--mbufs",
        "4095",
    ]
    .map(String::from)
    .to_vec();
    let mut app = SpateApp::start(&spate_ns, ECHO, &args, "UDP echo on");
    assert!(app.proc.wait_for_output("| mbufs ", Duration::from_secs(10)));
    let baseline = mbufs_at_start(&app.proc.output());

    let out = kernel_ns.must(&["/usr/bin/python3", "-c", &scapy_script()]);
    assert!(out.contains(&format!("sent {}", CASES.len() as u64 * REPEAT)), "{out}");

    // Echo still works, over both families.
    kernel_ns.run(|| {
        for (bind, to) in [("198.18.0.1:0", "198.18.0.2:7"), ("[fd00::1]:0", "[fd00::2]:7")] {
            let s = UdpSocket::bind(bind).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            s.send_to(b"still here?", to).unwrap();
            let mut buf = [0u8; 32];
            let (n, _) = s.recv_from(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"still here?");
        }
    });

    let (c, out) = app.stop();
    let mut expected: HashMap<&str, u64> = HashMap::new();
    for (_, _, counter) in CASES {
        *expected.entry(counter).or_default() += REPEAT;
    }
    for (name, want) in &expected {
        // The kernel's own IPv6 chatter (MLD, router solicitations) lands
        // in NotForUs counters too, so those are lower bounds.
        let got = counter(&c, name);
        if name.ends_with("NotForUs") {
            assert!(got >= *want, "{name}: {got} < {want}\n{out}");
        } else {
            assert_eq!(got, *want, "{name}\n{out}");
        }
    }
    assert_eq!(counter(&c, "Udp.InDatagrams"), 1, "{out}");
    assert_eq!(counter(&c, "Udp6.InDatagrams"), 1, "{out}");
    assert_eq!(counter(&c, "Mempool.InUse"), baseline as u64, "mbufs back at the baseline\n{out}");
    let frames = counter(&c, "Rx.Frames");
    let accounted: u64 = c.iter().filter(|(k, _)| k.starts_with("Rx.") && *k != "Rx.Frames").map(|(_, v)| v).sum();
    assert_eq!(frames, accounted, "every frame counted once\n{out}");
}

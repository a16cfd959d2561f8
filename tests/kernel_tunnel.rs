//! VXLAN against the Linux kernel's own, and UDP GSO into a kernel socket.
//!
//! VXLAN: `spate-echo --vxlan 42@PEER --inner-ip 198.19.0.2/24` on a veth
//! (net_af_packet); the peer namespace runs `ip link add vx0 type vxlan id
//! 42` with 198.19.0.1/24 inside. The kernel pings spate's inner address
//! and echoes datagrams of every size the inner MTU allows through it,
//! byte-exact, over an IPv4 and over an IPv6 underlay.
//!
//! GSO: a stack made in the test process (its port opened inside a test
//! namespace) sends one buffer as segments; a kernel socket in the peer
//! namespace gets every segment, byte-exact, in order; the error rules
//! hold.

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket as KernelSocket};
use std::time::Duration;

use spate::dpdk::Memory;
use spate::{Counter, PortSpec, Stack, StackConfig, UdpSocket};
use spate_testkit::{
    Netns, SpateApp, capture_frames, counter, device_lock, shared_eal, spate_and_kernel, start_dump, unique,
};

const ECHO: &str = env!("CARGO_BIN_EXE_spate-echo");
const DUMP: &str = env!("CARGO_BIN_EXE_spate-dump");

/// Echoes payloads of 0 to `max` bytes through `target` from a kernel
/// socket bound to `local`; returns how many came back.
fn echo_through(kernel: &Netns, local: &str, target: SocketAddr, max: usize) -> usize {
    let local = local.to_string();
    kernel.run(move || {
        let s = KernelSocket::bind(local).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = vec![0u8; 2048];
        let sizes: Vec<usize> = (0..=max).step_by(97).chain([max]).collect();
        for (i, &len) in sizes.iter().enumerate() {
            let payload: Vec<u8> = (0..len).map(|j| (i * 13 + j * 7) as u8).collect();
            let mut tries = 0;
            loop {
                s.send_to(&payload, target).unwrap();
                match s.recv_from(&mut buf) {
                    Ok((n, from)) => {
                        assert_eq!(from, target);
                        assert_eq!(&buf[..n], &payload[..], "{len} bytes came back different");
                        break;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock && tries < 3 => tries += 1,
                    Err(e) => panic!("{len} bytes through the tunnel: {e}"),
                }
            }
        }
        sizes.len()
    })
}

fn vxlan_case(outer_v6: bool) {
    let _serial = device_lock();
    let (spate_ns, kernel) = spate_and_kernel("vxlan");
    let (peer, local) = if outer_v6 { ("fd00::1", "fd00::2") } else { ("198.18.0.1", "198.18.0.2") };
    // The kernel's tunnel: VNI 42 to spate, inner 198.19.0.1/24.
    kernel.must(&[
        "ip", "link", "add", "vx0", "type", "vxlan", "id", "42", "remote", local, "local", peer, "dstport", "4789",
        "dev", "vB",
    ]);
    kernel.must(&["ip", "addr", "add", "198.19.0.1/24", "dev", "vx0"]);
    kernel.must(&["ip", "link", "set", "vx0", "up"]);
    kernel.must(&["ethtool", "-K", "vx0", "tx", "off"]);
    let remote = if outer_v6 { format!("42@[{peer}]:4789") } else { format!("42@{peer}") };
    let mut args: Vec<String> =
        ["--vdev", "net_af_packet0,iface=vA", "--lcores", "0", "--interval", "0.5", "--mbufs", "4095"]
            .map(String::from)
            .to_vec();
    args.extend(["--ip".into(), "198.18.0.2/24".into(), "--ip6".into(), "fd00::2/64".into()]);
    args.extend(["--vxlan".into(), remote, "--inner-ip".into(), "198.19.0.2/24".into()]);
    let name = unique("vxlan-");
    args.extend(["--name".into(), name.clone()]);
    let app = SpateApp::start(&spate_ns, ECHO, &args, "UDP echo on");

    // The pings captured on the tunnel's own interface (1) by spate-dump,
    // and on vx0 by the kernel's tcpdump: the same inner frames.
    let kfile = std::env::temp_dir().join(format!("{}.pcap", unique("spate-vx0-")));
    let mut ktcpdump = kernel
        .spawn(
            "tcpdump",
            "tcpdump",
            &["-i", "vx0", "-U", "--immediate-mode", "-w", &kfile.display().to_string(), "icmp"].map(String::from),
            Duration::from_secs(120),
        )
        .unwrap();
    ktcpdump.remove_on_drop(&kfile);
    assert!(ktcpdump.wait_for_output("listening on vx0", Duration::from_secs(10)), "{}", ktcpdump.output());
    let sfile = std::env::temp_dir().join(format!("{}.pcapng", unique("spate-dump-vxlan-")));
    let mut dump = start_dump(DUMP, &sfile, &["--name", &name, "-i", "1", "-c", "6", "icmp"]);
    assert!(dump.wait_for_output("capturing from", Duration::from_secs(10)), "{}", dump.output());

    let ping = kernel.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "198.19.0.2"]);
    assert!(ping.status.success(), "ping through the tunnel: {}", String::from_utf8_lossy(&ping.stdout));
    assert!(dump.wait_exit(Duration::from_secs(10)), "{}", dump.output());
    std::thread::sleep(Duration::from_millis(200));
    ktcpdump.stop();
    let mut inner: Vec<Vec<u8>> = capture_frames(&sfile).into_iter().map(|(_, f)| f).collect();
    let mut kernels: Vec<Vec<u8>> = capture_frames(&kfile).into_iter().map(|(_, f)| f).collect();
    inner.sort();
    kernels.sort();
    assert_eq!(inner.len(), 6, "{}", dump.output());
    assert_eq!(inner, kernels, "the tunnel's inner frames, as spate-dump and the kernel's vx0 saw them");
    let ids = std::process::Command::new("/usr/bin/tshark")
        .args(["-r", &sfile.display().to_string(), "-T", "fields", "-e", "frame.interface_id"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&ids.stdout).lines().collect::<Vec<_>>(), ["1"; 6], "the tunnel's interface");
    // The inner MTU is the outer 1500 less VXLAN's overhead.
    let max = if outer_v6 { 1500 - 70 - 28 } else { 1500 - 50 - 28 };
    let echoed = echo_through(&kernel, "198.19.0.1:0", "198.19.0.2:7".parse().unwrap(), max);
    let (c, out) = app.stop();
    assert!(counter(&c, "Vxlan.InPackets") >= 3 + echoed as u64, "{out}");
    assert!(counter(&c, "Vxlan.OutPackets") >= 3 + echoed as u64, "{out}");
    assert_eq!(counter(&c, "Rx.VxlanErrors"), 0, "{out}");
    assert!(counter(&c, "Udp.InDatagrams") >= echoed as u64, "{out}");
}

#[test]
fn vxlan_with_the_kernel_over_ipv4() {
    vxlan_case(false);
}

#[test]
fn vxlan_with_the_kernel_over_ipv6() {
    vxlan_case(true);
}

#[test]
fn gso_segments_reach_a_kernel_socket_byte_exact() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (spate_ns, kernel) = spate_and_kernel("gso");
    let device = format!("{},iface=vA", unique("net_af_packet"));
    // The port opens its socket in the namespace of the thread that makes it.
    let stack = spate_ns.run(move || {
        let mut spec = PortSpec::new(&device).addr("198.18.0.2/24").unwrap();
        spec.mac = Some("02:53:50:41:54:45".parse().unwrap());
        Stack::new(StackConfig {
            lcores: "1".into(),
            ports: vec![spec],
            stop_on_signal: false,
            announce: false,
            ..StackConfig::default()
        })
        .unwrap()
    });
    let running = stack.spawn_polling().unwrap();
    let (bound_tx, bound) = std::sync::mpsc::channel();
    let receiver = kernel.thread(move || {
        let s = KernelSocket::bind("198.18.0.1:9").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        bound_tx.send(()).unwrap();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 2048];
        while let Ok(n) = s.recv(&mut buf) {
            got.push(buf[..n].to_vec());
        }
        got
    });
    bound.recv_timeout(Duration::from_secs(10)).expect("the kernel socket is bound");
    let sock = UdpSocket::bind(&stack, "0.0.0.0:0").unwrap();
    let to: SocketAddr = "198.18.0.1:9".parse().unwrap();
    // One datagram first: it resolves the kernel's MAC.
    sock.send_to(b"hello", to).unwrap();
    std::thread::sleep(Duration::from_millis(300));

    let big: Vec<u8> = (0..64_000).map(|i| (i * 7 + i / 251) as u8).collect();
    assert_eq!(sock.send_to_segmented(&big, 1000, to).unwrap(), big.len());
    // The socket option does the same for plain sends longer than it.
    sock.set_segment_size(Some(1472)).unwrap();
    assert_eq!(sock.send_to(&big[..5000], to).unwrap(), 5000);
    assert_eq!(sock.send_to(&big[..100], to).unwrap(), 100, "shorter than a segment: one datagram");
    sock.set_segment_size(None).unwrap();

    // Linux's error rules.
    let e = sock.send_to_segmented(&big[..3000], 1473, to).unwrap_err();
    assert!(e.to_string().contains("Message too long"), "a segment over the MTU: {e}");
    let e = sock.send_to_segmented(&big[..12_900], 100, to).unwrap_err();
    assert!(e.to_string().contains("Invalid argument"), "129 segments: {e}");
    let e = sock.send_to_segmented(&big[..100], 0, to).unwrap_err();
    assert!(e.to_string().contains("Invalid argument"), "segment size 0: {e}");
    let e = sock.send_to_segmented(&vec![0u8; 70_000], 1000, to).unwrap_err();
    assert!(e.to_string().contains("Message too long"), "more than an IP datagram: {e}");
    assert!(sock.set_segment_size(Some(0)).is_err());

    let got = receiver.join().unwrap();
    let mut want: Vec<Vec<u8>> = vec![b"hello".to_vec()];
    want.extend(big.chunks(1000).map(<[u8]>::to_vec));
    want.extend(big[..5000].chunks(1472).map(<[u8]>::to_vec));
    want.push(big[..100].to_vec());
    assert_eq!(got.len(), want.len(), "every segment arrived");
    assert!(got == want, "segments came back different or out of order");
    running.stop();
    let c = stack.counters();
    assert_eq!(c[Counter::UdpOutDatagrams], want.len() as u64);
    drop(sock);
    assert_eq!(stack.mempool().in_use(), 0, "no mbuf held after the sends");
}

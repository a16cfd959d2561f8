//! spate on a 2-queue port behind OVS-DPDK's hash steering, with
//! `rss = "device"`: flows spread over both lcores and each stays on one,
//! and fragmented datagrams, whose fragments OVS spreads over both
//! queues, meet and are answered. Its lcore 1 shares CPU 1 with OVS's
//! PMD; it idles (`--idle-sleep`) between the kernel's requests.

use std::io::ErrorKind;
use std::net::UdpSocket;
use std::time::Duration;

use spate_testkit::ovs::{OvsPort, echo_behind_ovs};
use spate_testkit::{counter, device_lock};

const ECHO: &str = env!("CARGO_BIN_EXE_spate-echo");

/// `spate-echo --lcores 0-1 --rss device` on a 2-queue server-mode
/// `net_virtio_user` port that OVS feeds with `tx-steering=hash`, the
/// kernel's 1,000 flows arriving through a plain `system` port on its
/// veth: the flows spread over both lcores and each stays on one (no flow
/// seen on two queues, no unfragmented frame handed over), every echo is
/// byte-exact; then datagrams of 1,473 to 9,000 bytes, whose fragments OVS
/// hashes onto both queues (a first fragment with its ports, the others
/// without), all meet, are reassembled and answered. Before `device`, with
/// `rss off` the same datagrams were all lost (0 of 60: their fragments
/// timed out apart).
#[test]
fn device_steered_queues_under_ovs_hash_steering() {
    let _serial = device_lock();
    let (_ovs_ns, kernel_ns, mut app, ovs) = echo_behind_ovs(
        ECHO,
        "ovsmq",
        2,
        &["--lcores", "0-1", "--rss", "device"],
        OvsPort::System("vO".into()),
        OvsPort::VhostClientHashed,
    );
    assert!(app.output().contains("steered by the device over 2 RX queues"), "{}", app.output());
    let (flows, rounds) = (1000usize, 2usize);
    let (sent, fragmented) = kernel_ns.run(move || {
        // Each flow its own socket (source port), answered byte-exact.
        let sockets: Vec<UdpSocket> = (0..flows).map(|_| UdpSocket::bind("198.18.0.1:0").unwrap()).collect();
        let mut buf = vec![0u8; 9100];
        let mut sent = 0u64;
        let mut ask = |s: &UdpSocket, payload: &[u8], what: &str| {
            s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
            for attempt in 0..4 {
                s.send_to(payload, "198.18.0.2:7").unwrap();
                sent += 1;
                match s.recv_from(&mut buf) {
                    Ok((len, _)) => {
                        assert_eq!(&buf[..len], payload, "{what} came back different");
                        return;
                    }
                    Err(e) if attempt < 3 && matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                    Err(e) => panic!("{what}: {e}"),
                }
            }
        };
        for round in 0..rounds {
            for (i, s) in sockets.iter().enumerate() {
                let payload: Vec<u8> = (0..16 + i % 64).map(|j| (i * 7 + j + round) as u8).collect();
                ask(s, &payload, &format!("flow {i} round {round}"));
            }
        }
        // Fragmented: 60 sizes from 1,473 to 9,000 bytes on flows whose
        // owner the lcores already know.
        let sizes: Vec<usize> = (0..60).map(|k| 1473 + k * (9000 - 1473) / 59).collect();
        for (k, &len) in sizes.iter().enumerate() {
            let payload: Vec<u8> = (0..len).map(|j| (j * 13 + k) as u8).collect();
            ask(&sockets[k * 16], &payload, &format!("{len}-byte datagram"));
        }
        (sent, sizes.len() as u64)
    });
    drop(ovs);
    app.stop_with(libc::SIGINT, Duration::from_secs(10));
    let out = app.output();
    let c = spate_testkit::parse_counters(&out);
    let echoed = (flows * rounds) as u64 + fragmented;
    let got = counter(&c, "Udp.InDatagrams");
    assert!(got >= echoed && got <= sent, "spate got {got}: {echoed} answered, {sent} sent\n{out}");
    assert_eq!(counter(&c, "Udp.OutDatagrams"), got, "{out}");
    assert!(counter(&c, "Ip.ReasmOKs") >= fragmented, "{out}");
    let lcore = |i: usize, name: &str| counter(&c, &format!("Lcore{i}.{name}"));
    let per: Vec<u64> = (0..2).map(|i| lcore(i, "UdpInDatagrams")).collect();
    println!(
        "per lcore: datagrams {per:?}, fragments handed {:?}, reassembled handed {:?}",
        (0..2).map(|i| lcore(i, "SteerFragments")).collect::<Vec<_>>(),
        (0..2).map(|i| lcore(i, "SteerDatagrams")).collect::<Vec<_>>()
    );
    // 1,000 flows hashed over two queues: each lcore gets a good share.
    assert!(per.iter().all(|&n| n * 4 > got), "flows spread over both lcores: {per:?}\n{out}");
    assert_eq!(counter(&c, "Steer.FlowMoved"), 0, "a flow arrived on two queues\n{out}");
    // Under `device` only fragments are handed over, each at most once.
    let (handed, fragments) = (counter(&c, "Steer.Fragments"), counter(&c, "Ip.ReasmReqds"));
    assert!(handed <= fragments, "{handed} handed over, {fragments} fragments: no whole frame moved\n{out}");
    assert_eq!(counter(&c, "Steer.Frames"), 0, "{out}");
    assert!(counter(&c, "Steer.Fragments") > 0, "OVS split fragments over the queues\n{out}");
    assert_eq!(counter(&c, "Rx.SteerDropped"), 0, "{out}");
}

//! A vhost-user pair across two processes: dpdk-testpmd serves
//! `net_vhost` and swaps MAC addresses of what it receives; this process is
//! the `net_virtio_user` client. Packets go both ways, byte-exact.

use std::sync::Arc;
use std::time::{Duration, Instant};

use spate::dpdk::{Burst, Memory, Mempool, MempoolConfig, Port, PortConfig};
use spate_testkit::{FwdStats, TestPmdBuilder, device_lock, shared_eal, unique, unique_socket_path};

const PACKETS: usize = 10_000;
const SRC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const DST: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

fn frame(seq: usize) -> Vec<u8> {
    let len = 60 + (seq * 13) % 1000;
    let mut f = Vec::with_capacity(len);
    f.extend_from_slice(&DST);
    f.extend_from_slice(&SRC);
    f.extend_from_slice(&[0x88, 0xb5]); // local experimental EtherType
    f.extend_from_slice(&(seq as u64).to_be_bytes());
    f.extend((f.len()..len).map(|i| (seq ^ (i * 7)) as u8));
    f
}

#[test]
fn vhost_user_pair_moves_packets_both_ways() {
    let _serial = device_lock();
    shared_eal(Memory::Hugepages);
    let sock = unique_socket_path("vhost");
    let _ = std::fs::remove_file(&sock);
    let mut peer = TestPmdBuilder::new("0,1", 0)
        .vdev(&format!("net_vhost0,iface={},queues=1", sock.display()))
        .args(["--forward-mode=macswap", "--nb-cores=1", "--stats-period=1", "--total-num-mbufs=8192"])
        .limit(Duration::from_secs(120))
        .spawn("vhost")
        .unwrap();
    peer.proc.remove_on_drop(&sock);
    peer.wait_started(Duration::from_secs(30)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(sock.exists(), "testpmd made no vhost-user socket");

    let pool = Arc::new(Mempool::new(&MempoolConfig::new(&unique("vhu"), 8191)).unwrap());
    {
        let spec = format!("{},path={},queues=1,queue_size=1024", unique("net_virtio_user"), sock.display());
        let mut port = Port::create(&spec).unwrap();
        assert_eq!(port.info().driver, "net_virtio_user");
        assert!(!port.info().supports_rss(), "virtio_user offers no RSS here");
        // virtio offers a UDP checksum offload without the IPv4 one: asked
        // for both, it is given neither.
        let udp_rx = spate::dpdk::sys::RTE_ETH_RX_OFFLOAD_UDP_CKSUM as u64;
        let udp_tx = spate::dpdk::sys::RTE_ETH_TX_OFFLOAD_UDP_CKSUM as u64;
        let info = port.info().clone();
        assert!(info.rx_offload_capa & udp_rx != 0 && !info.rx_checksum(), "{info:?}");
        assert!(info.tx_offload_capa & udp_tx != 0 && !info.tx_checksum(), "{info:?}");
        let cfg = PortConfig::default();
        assert!(cfg.rx_checksum && cfg.tx_checksum);
        port.configure(&cfg, pool.clone()).unwrap();
        assert_eq!((port.rx_offloads() & udp_rx, port.tx_offloads() & udp_tx), (0, 0), "half a pair is not asked for");
        port.start().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !port.link().unwrap().up && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(port.link().unwrap().up, "virtio_user link comes up once connected");

        let mut rx = port.rx_queue(0).unwrap();
        let mut tx = port.tx_queue(0).unwrap();
        let (mut sent, mut received) = (0, 0);
        let mut out: Burst = Burst::new();
        let mut inn: Burst = Burst::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while received < PACKETS {
            assert!(Instant::now() < deadline, "stalled: sent {sent}, received {received}");
            // Keep at most 256 in flight so neither ring overflows.
            while sent + out.len() < PACKETS && sent + out.len() - received < 256 && !out.is_full() {
                let f = frame(sent + out.len());
                let mut m = pool.try_alloc().unwrap();
                m.append(f.len()).unwrap().copy_from_slice(&f);
                out.push(m).unwrap();
            }
            sent += tx.tx_burst(&mut out);
            rx.rx_burst(&mut inn);
            for m in inn.drain() {
                let want = frame(received);
                let got = m.data();
                assert_eq!(got.len(), want.len(), "frame {received} length");
                assert_eq!(&got[..6], &SRC, "frame {received}: macswap puts our source first");
                assert_eq!(&got[6..12], &DST);
                assert_eq!(&got[12..], &want[12..], "frame {received} payload");
                received += 1;
            }
        }
        let stats = port.stats().unwrap();
        assert_eq!((stats.opackets, stats.ipackets), (PACKETS as u64, PACKETS as u64));
    }
    let out = peer.finish();
    let fwd = FwdStats::parse(&out).unwrap_or_else(|| panic!("no forward stats in:\n{out}"));
    assert_eq!((fwd.rx, fwd.tx), (PACKETS as u64, PACKETS as u64));
    assert_eq!(pool.in_use(), 0);
}

//! net_ring loopback: 10,000 distinct packets out and back in, byte-exact,
//! in bursts, with the mempool's in-use count back at its baseline.

use std::sync::Arc;

use spate::dpdk::{Burst, Memory, Mempool, MempoolConfig, Port, PortConfig};
use spate_testkit::{device_lock, shared_eal, unique};

const PACKETS: usize = 10_000;

/// Payload of packet `seq`: its number, then bytes derived from it; the
/// length varies too, so a swapped, truncated or stale packet shows.
fn payload(seq: usize) -> Vec<u8> {
    let len = 16 + (seq * 7) % 1400;
    let mut p = Vec::with_capacity(len);
    p.extend_from_slice(&(seq as u64).to_be_bytes());
    p.extend((8..len).map(|i| (seq.wrapping_mul(31) ^ i) as u8));
    p
}

#[test]
fn ring_loopback_is_byte_exact_and_leaks_nothing() {
    let _serial = device_lock();
    let eal = shared_eal(Memory::Auto);
    assert!(!eal.runtime_dir().exists(), "the EAL runtime folder is removed after init");

    let pool = Arc::new(Mempool::new(&MempoolConfig::new(&unique("ring"), 4095)).unwrap());
    let baseline = pool.in_use();
    {
        let mut port = Port::create(&unique("net_ring")).unwrap();
        assert_eq!(port.info().driver, "net_ring");
        port.configure(&PortConfig::default(), pool.clone()).unwrap();
        port.start().unwrap();
        let mut rx = port.rx_queue(0).unwrap();
        let mut tx = port.tx_queue(0).unwrap();

        let mut sent = 0;
        let mut received = 0;
        let mut out: Burst = Burst::new();
        let mut inn: Burst = Burst::new();
        let mut rounds = 0;
        while received < PACKETS {
            rounds += 1;
            assert!(rounds < 100_000, "loopback stalled: sent {sent}, received {received}");
            // Fill a burst of up to 32 packets; send what the ring takes.
            while sent + out.len() < PACKETS && !out.is_full() {
                let seq = sent + out.len();
                let mut m = pool.try_alloc().unwrap();
                let p = payload(seq);
                m.append(p.len()).unwrap().copy_from_slice(&p);
                out.push(m).unwrap();
            }
            sent += tx.tx_burst(&mut out);
            rx.rx_burst(&mut inn);
            for m in inn.drain() {
                assert_eq!(m.data(), payload(received).as_slice(), "packet {received} differs");
                received += 1;
            }
        }
        assert!(out.is_empty());
        assert_eq!(sent, PACKETS);
        assert_eq!(rx.rx_burst(&mut inn), 0, "nothing beyond what was sent");
        let stats = port.stats().unwrap();
        assert_eq!(stats.opackets, PACKETS as u64);
        assert_eq!(stats.ipackets, PACKETS as u64);
    }
    assert_eq!(pool.in_use(), baseline, "every mbuf is back in the pool");
}

#[test]
fn unsent_mbufs_come_back_to_the_caller() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let pool = Arc::new(Mempool::new(&MempoolConfig::new(&unique("ringfull"), 4095)).unwrap());
    {
        let mut port = Port::create(&unique("net_ring")).unwrap();
        port.configure(&PortConfig::default(), pool.clone()).unwrap();
        port.start().unwrap();
        let mut tx = port.tx_queue(0).unwrap();
        // The ring behind net_ring holds fewer than 4,000 packets: fill it.
        let mut total = 0;
        let mut refused = 0;
        for _ in 0..200 {
            let mut b: Burst = Burst::new();
            pool.alloc_bulk(&mut b, 32).unwrap();
            total += tx.tx_burst(&mut b);
            refused += b.len();
            // Whatever the device refused is still ours, in the burst.
            assert!(b.len() <= 32);
        }
        assert!(refused > 0, "the ring should fill up ({total} accepted)");
        assert_eq!(pool.in_use() as usize, total, "refused mbufs were freed with their bursts");
    }
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn wire_pair_carries_frames_both_ways() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let pool = Arc::new(Mempool::new(&MempoolConfig::new(&unique("wire"), 4095)).unwrap());
    {
        let (mut a, mut b) = Port::wire_pair(&unique("t")).unwrap();
        for p in [&mut a, &mut b] {
            p.configure(&PortConfig::default(), pool.clone()).unwrap();
            p.start().unwrap();
        }
        let (mut a_rx, mut a_tx) = (a.rx_queue(0).unwrap(), a.tx_queue(0).unwrap());
        let (mut b_rx, mut b_tx) = (b.rx_queue(0).unwrap(), b.tx_queue(0).unwrap());
        let mut burst: Burst = Burst::new();
        for (seq, tx) in [(1usize, &mut a_tx), (2, &mut b_tx)] {
            let mut m = pool.try_alloc().unwrap();
            m.append(payload(seq).len()).unwrap().copy_from_slice(&payload(seq));
            burst.push(m).unwrap();
            assert_eq!(tx.tx_burst(&mut burst), 1);
        }
        assert_eq!(b_rx.rx_burst(&mut burst), 1);
        assert_eq!(burst.pop().unwrap().data(), payload(1).as_slice(), "a -> b");
        assert_eq!(a_rx.rx_burst(&mut burst), 1);
        assert_eq!(burst.pop().unwrap().data(), payload(2).as_slice(), "b -> a");
        // Frames left in flight when the ports go are freed with the rings.
        pool.alloc_bulk(&mut burst, 16).unwrap();
        assert_eq!(a_tx.tx_burst(&mut burst), 16);
    }
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn mbuf_headroom_and_chain_operations() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let pool = Mempool::new(&MempoolConfig::new(&unique("ops"), 63)).unwrap();
    {
        let mut m = pool.try_alloc().unwrap();
        assert_eq!(m.pkt_len(), 0);
        let head = m.headroom();
        assert!(head >= 64);
        m.append(10).unwrap().copy_from_slice(b"0123456789");
        m.prepend(4).unwrap().copy_from_slice(b"hdr:");
        assert_eq!(m.data(), b"hdr:0123456789");
        assert_eq!(m.headroom(), head - 4);
        m.adj(4).unwrap();
        m.trim(2).unwrap();
        assert_eq!(m.data(), b"01234567");
        assert!(m.prepend(m.headroom() + 1).is_err());
        assert!(m.adj(9).is_err());
        assert!(m.trim(9).is_err());
        assert!(m.append(m.tailroom() + 1).is_err());
        assert_eq!(m.data(), b"01234567", "failed operations change nothing");

        let mut tail = pool.try_alloc().unwrap();
        tail.append(3).unwrap().copy_from_slice(b"xyz");
        m.chain(tail).unwrap();
        assert_eq!((m.segments(), m.pkt_len(), m.data_len()), (2, 11, 8));
        assert_eq!(m.segment_data().collect::<Vec<_>>(), vec![&b"01234567"[..], &b"xyz"[..]]);
        let mut buf = [0u8; 5];
        assert!(m.read_at(6, &mut buf));
        assert_eq!(&buf, b"67xyz");
        assert!(!m.read_at(7, &mut buf), "past the end");
        assert_eq!(m.buf_len(), 2 * (pool.data_room() as usize + 128), "two buffers of data room plus headroom");
        m.trim(1).unwrap();
        assert_eq!(m.pkt_len(), 10);
        let rest = m.split_first_segment().unwrap();
        assert_eq!((m.pkt_len(), rest.pkt_len(), rest.data()), (8, 2, &b"xy"[..]));
        assert_eq!(pool.in_use(), 2);
    }
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn spsc_mbuf_ring_moves_bursts_between_threads_in_order() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let pool = Arc::new(Mempool::new(&MempoolConfig::new(&unique("spsc"), 4095)).unwrap());
    assert!(spate::dpdk::mbuf_ring(1000).is_err(), "a capacity that is not a power of two is refused");
    const N: u32 = 200_000;
    let (mut prod, mut cons) = spate::dpdk::mbuf_ring(256).unwrap();
    std::thread::scope(|s| {
        let pool = pool.clone();
        s.spawn(move || {
            let mut next = 0u32;
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            let mut b: Burst = Burst::new();
            while next < N {
                assert!(std::time::Instant::now() < deadline, "producer stalled at {next}");
                while b.len() < 32 && next < N {
                    let mut one: Burst<1> = Burst::new();
                    if pool.alloc_bulk(&mut one, 1).is_err() {
                        break;
                    }
                    let mut m = one.pop().unwrap();
                    m.append(4).unwrap().copy_from_slice(&next.to_be_bytes());
                    next += 1;
                    let _ = b.push(m);
                }
                // What did not fit stays in the burst for the next round.
                prod.enqueue(&mut b);
            }
            while !b.is_empty() {
                assert!(std::time::Instant::now() < deadline, "producer stalled at the end");
                prod.enqueue(&mut b);
            }
        });
        let mut expect = 0u32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut b: Burst = Burst::new();
        while expect < N {
            assert!(std::time::Instant::now() < deadline, "consumer stalled at {expect}");
            cons.dequeue(&mut b);
            for m in b.drain() {
                assert_eq!(u32::from_be_bytes(m.data()[..4].try_into().unwrap()), expect, "in order, none lost");
                expect += 1;
            }
        }
        assert!(cons.is_empty());
    });
    // A ring dropped with mbufs in it frees them.
    let (mut prod, cons) = spate::dpdk::mbuf_ring(64).unwrap();
    let mut b: Burst = Burst::new();
    pool.alloc_bulk(&mut b, 32).unwrap();
    assert_eq!(prod.enqueue(&mut b), 32);
    assert_eq!(cons.len(), 32);
    drop((prod, cons));
    assert_eq!(pool.in_use(), 0, "every mbuf is back in the pool");
}

#[test]
fn retain_with_keeps_what_it_is_given_back_in_order() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let pool = Arc::new(Mempool::new(&MempoolConfig::new(&unique("retain"), 255)).unwrap());
    let mut b: Burst = Burst::new();
    for i in 0..32u8 {
        let mut m = pool.try_alloc().unwrap();
        m.append(1).unwrap()[0] = i;
        b.push(m).unwrap();
    }
    let mut taken: Burst = Burst::new();
    // Every third mbuf taken, the rest kept.
    b.retain_with(|m| if m.data()[0] % 3 == 0 { taken.push(m).err() } else { Some(m) });
    let kept: Vec<u8> = b.as_slice().iter().map(|m| m.data()[0]).collect();
    let gone: Vec<u8> = taken.as_slice().iter().map(|m| m.data()[0]).collect();
    assert_eq!(kept, (0..32).filter(|i| i % 3 != 0).collect::<Vec<u8>>());
    assert_eq!(gone, (0..32).filter(|i| i % 3 == 0).collect::<Vec<u8>>());
    assert_eq!(pool.in_use(), 32, "nothing freed or duplicated");
    // Taken and dropped: freed once each.
    b.retain_with(|m| {
        drop(m);
        None
    });
    assert!(b.is_empty());
    assert_eq!(pool.in_use(), gone.len() as u32);
    drop(taken);
    assert_eq!(pool.in_use(), 0);
}

/// `Mbuf::free_all` frees every item's mbuf once, chains whole, across
/// its 64-mbuf bulk calls, and drops what else an item holds; the vector
/// keeps its buffer, empty.
#[test]
fn free_all_frees_each_items_mbuf_once_in_bulk_calls() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let pool = Mempool::new(&MempoolConfig::new(&unique("freeall"), 511)).unwrap();
    let dropped = Arc::new(());
    for n in [0usize, 1, 63, 64, 65, 130] {
        let mut items: Vec<(spate::dpdk::Mbuf, Arc<()>)> = (0..n)
            .map(|i| {
                let mut m = pool.try_alloc().unwrap();
                m.append(1).unwrap()[0] = i as u8;
                if i % 5 == 0 {
                    // Every fifth a chain of two.
                    let mut tail = pool.try_alloc().unwrap();
                    tail.append(1).unwrap();
                    m.chain(tail).unwrap();
                }
                (m, dropped.clone())
            })
            .collect();
        assert_eq!(pool.in_use() as usize, n + n.div_ceil(5));
        let cap = items.capacity();
        spate::dpdk::Mbuf::free_all(&mut items, |(m, _)| m);
        assert_eq!(pool.in_use(), 0, "{n} items: every mbuf and chain back, once");
        assert!(items.is_empty() && items.capacity() == cap);
        assert_eq!(Arc::strong_count(&dropped), 1, "{n} items: what else they held was dropped");
    }
}

/// A pool reuses the mbufs that pass its per-lcore caches in the order
/// asked: the last freed first (the `lf_stack` driver, the default: warm
/// lines for the reader thread's and other lcores' frees), or the first
/// freed first (DPDK's ring). Without a cache every free and allocation
/// goes to that store.
#[test]
fn pools_reuse_free_mbufs_in_the_order_asked() {
    use spate::dpdk::PoolOrder;
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    for order in [PoolOrder::Lifo, PoolOrder::Fifo] {
        let mut cfg = MempoolConfig::new(&unique("order"), 8);
        assert_eq!(cfg.order, PoolOrder::Lifo, "the default");
        (cfg.order, cfg.cache_size) = (order, 0);
        let pool = Mempool::new(&cfg).unwrap();
        assert_eq!(pool.order(), order, "this machine's DPDK has both drivers");
        let mut all: Vec<_> = (0..8).map(|_| pool.alloc().unwrap()).collect();
        assert!(pool.alloc().is_none(), "all 8 out");
        let (first, second) = (all.remove(0), all.remove(0));
        let (a, b) = (first.as_ptr(), second.as_ptr());
        drop(first);
        drop(second);
        let again = pool.alloc().unwrap();
        let want = if order == PoolOrder::Lifo { b } else { a };
        assert_eq!(again.as_ptr(), want, "{order:?}: the mbuf freed {}", if want == b { "last" } else { "first" });
        drop(again);
        drop(all);
        assert_eq!(pool.in_use(), 0);
    }
}

/// `Mbuf::truncate` keeps the first bytes of a chain whatever segment the
/// cut falls in, and frees the segments after it: inside the first, at a
/// segment's end, inside a later one, and past the end (nothing).
#[test]
fn truncate_cuts_a_chain_anywhere_and_frees_the_rest() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let pool = Mempool::new(&MempoolConfig::new(&unique("trunc"), 63)).unwrap();
    let chain = || {
        let mut head = pool.try_alloc().unwrap();
        head.append(4).unwrap().copy_from_slice(b"abcd");
        for part in [&b"efg"[..], b"hijkl"] {
            let mut seg = pool.try_alloc().unwrap();
            seg.append(part.len()).unwrap().copy_from_slice(part);
            head.chain(seg).unwrap();
        }
        head
    };
    let all = b"abcdefghijkl";
    for (len, segs) in [(2, 1), (4, 1), (5, 2), (7, 2), (9, 3), (12, 3), (20, 3), (0, 1)] {
        let mut m = chain();
        m.truncate(len);
        let kept = len.min(all.len());
        let got: Vec<u8> = m.segment_data().flatten().copied().collect();
        assert_eq!((&got[..], m.pkt_len(), m.segments()), (&all[..kept], kept, segs), "truncate({len})");
        assert_eq!(pool.in_use(), segs as u32, "truncate({len}): the segments after the cut are freed");
    }
    assert_eq!(pool.in_use(), 0);
}

//! A group datagram for several member sockets: copies (what spate's
//! group delivery makes, `engine/group.rs`) against indirect mbufs
//! (`rte_pktmbuf_clone`, [`Mbuf::share`]), for 8 members and three sizes.
//! Each delivery makes the packet (as a port would hand it over), the
//! other members' handles, reads each handle's first and last byte (a
//! reader looking at its datagram) and frees them all.
//!
//! `cargo bench --bench group_copy` prints instructions per delivery
//! (callgrind, the difference of two runs, so the EAL's start cancels
//! out) and cycles per delivery (the two ways take turns, seven rounds,
//! the median of each), with the CPU's model.

use std::hint::black_box;
use std::process::Command;

use spate::dpdk::{Eal, EalBuilder, Mbuf, Memory, Mempool, MempoolConfig, SharedMbuf};

const MEMBERS: usize = 8;
/// Frame sizes: a 64-byte payload, a middle one, a full 1,500-byte packet.
const SIZES: [usize; 3] = [14 + 20 + 8 + 64, 14 + 20 + 8 + 512, 14 + 1500];

/// The received packet: `size` bytes.
fn packet(pool: &Mempool, size: usize) -> Mbuf {
    let mut m = pool.alloc().expect("an mbuf");
    let d = m.append(size).expect("room");
    for (i, b) in d.iter_mut().enumerate() {
        *b = i as u8;
    }
    m
}

/// Copies, as `engine/group.rs` makes them: a new mbuf per member but the
/// last, the packet's bytes copied in; the last member gets the packet.
fn by_copies(pool: &Mempool, size: usize, out: &mut Vec<Mbuf>) -> u64 {
    let m = packet(pool, size);
    for _ in 1..MEMBERS {
        let mut c = pool.alloc().expect("an mbuf");
        c.append(m.data().len()).expect("room").copy_from_slice(m.data());
        out.push(c);
    }
    out.push(m);
    let seen = out.iter().map(|m| *m.data().first().unwrap() as u64 + *m.data().last().unwrap() as u64).sum();
    out.clear();
    seen
}

/// Indirect mbufs: every member a read-only share of the one packet.
fn by_shares(pool: &Mempool, size: usize, out: &mut Vec<SharedMbuf>) -> u64 {
    let m = packet(pool, size);
    assert_eq!(m.share(pool, MEMBERS - 1, out), MEMBERS - 1);
    let seen = out.iter().map(|m| *m.data().first().unwrap() as u64 + *m.data().last().unwrap() as u64).sum();
    out.clear();
    seen
}

fn deliveries(pool: &Mempool, way: &str, size: usize, n: usize) -> u64 {
    let (mut copies, mut shares) = (Vec::with_capacity(MEMBERS), Vec::with_capacity(MEMBERS));
    let mut seen = 0;
    for _ in 0..n {
        seen += match way {
            "copy" => by_copies(pool, black_box(size), &mut copies),
            _ => by_shares(pool, black_box(size), &mut shares),
        };
    }
    black_box(seen)
}

/// The pool, and the EAL it lives in (dropped after it).
fn pool() -> (Mempool, Eal) {
    let eal = EalBuilder::new().program("spate-group-copy").lcores("0").memory(Memory::NoHuge).init().expect("EAL");
    (Mempool::new(&MempoolConfig::new("gcopy", 4095)).expect("pool"), eal)
}

fn callgrind(way: &str, size: usize, n: usize) -> u64 {
    let me = std::env::current_exe().expect("own path");
    spate_testkit::callgrind::total(&me, &["--child".into(), way.into(), size.to_string(), n.to_string()])
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        let (pool, _eal) = pool();
        let (way, size, n) = (&args[2], args[3].parse().unwrap(), args[4].parse().unwrap());
        deliveries(&pool, way, size, n);
        return;
    }
    let valgrind = Command::new("valgrind").arg("--version").output().is_ok();
    let (pool, _eal) = pool();
    println!("group delivery to {MEMBERS} member sockets, per datagram; CPU: {}", spate_testkit::cpu_model());
    println!(
        "{:>6} | {:>14} {:>14} | {:>12} {:>12}",
        "frame", "copy instr", "share instr", "copy cycles", "share cycles"
    );
    for size in SIZES {
        let instr = |way: &str| {
            let n = 20_000;
            (callgrind(way, size, 2 * n) as f64 - callgrind(way, size, n) as f64) / n as f64
        };
        let (ic, is) = if valgrind { (instr("copy"), instr("share")) } else { (f64::NAN, f64::NAN) };
        let n = 200_000;
        let mut rounds = [Vec::new(), Vec::new()];
        for _ in 0..7 {
            for (i, way) in ["copy", "share"].iter().enumerate() {
                let t = spate::dpdk::lcore::tsc();
                deliveries(&pool, way, size, n);
                rounds[i].push(spate::dpdk::lcore::tsc().wrapping_sub(t) as f64 / n as f64);
            }
        }
        let [cc, cs] = rounds.map(|mut r| {
            r.sort_by(f64::total_cmp);
            r[r.len() / 2]
        });
        println!("{size:>6} | {ic:>14.1} {is:>14.1} | {cc:>12.1} {cs:>12.1}");
    }
}

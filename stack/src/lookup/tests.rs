use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::*;

const SECRET: [u64; 4] = [0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210, 0x1111_2222_3333_4444, 0x5555_6666_7777_8888];

fn b(id: u64, local: &str) -> Binding<u64> {
    let local: SocketAddr = local.parse().unwrap();
    Binding {
        id,
        family: if local.is_ipv4() { Family::V4 } else { Family::V6 },
        local,
        bound: local.ip(),
        peer: None,
        v6only: false,
        iface: None,
        reuseport: false,
        incoming_lcore: None,
        epoch: 0,
        sock: id,
    }
}

fn rp(mut x: Binding<u64>) -> Binding<u64> {
    x.reuseport = true;
    x
}

fn connected(mut x: Binding<u64>, local: &str, peer: &str) -> Binding<u64> {
    x.local = local.parse().unwrap();
    x.peer = Some(peer.parse().unwrap());
    x
}

fn key(src: &str, dst: &str) -> FlowKey {
    FlowKey::new(&src.parse().unwrap(), &dst.parse().unwrap(), 0)
}

fn winner(t: &SocketTable<u64>, k: &FlowKey) -> Option<u64> {
    t.snapshot().lookup(k).map(|(_, b)| b.id)
}

/// Each row: the sockets bound, a datagram, and who must get it. Sockets
/// sharing a port set reuseport, as Linux requires of them.
#[test]
fn precedence_table() {
    struct Case {
        what: &'static str,
        bind: Vec<Binding<u64>>,
        src: &'static str,
        dst: &'static str,
        iface: u16,
        want: Option<u64>,
    }
    let v6only = |mut x: Binding<u64>| {
        x.v6only = true;
        x
    };
    let dev = |mut x: Binding<u64>, i| {
        x.iface = Some(i);
        x
    };
    let cases = vec![
        Case {
            what: "specific beats wildcard",
            bind: vec![rp(b(1, "0.0.0.0:7")), rp(b(2, "198.18.0.2:7"))],
            src: "198.18.0.1:999",
            dst: "198.18.0.2:7",
            iface: 0,
            want: Some(2),
        },
        Case {
            what: "wildcard takes other addresses",
            bind: vec![rp(b(1, "0.0.0.0:7")), rp(b(2, "198.18.0.2:7"))],
            src: "198.18.0.1:999",
            dst: "198.18.0.3:7",
            iface: 0,
            want: Some(1),
        },
        Case {
            what: "IPv4 socket beats dual-stack IPv6 for IPv4",
            bind: vec![rp(b(1, "[::]:7")), rp(b(2, "0.0.0.0:7"))],
            src: "198.18.0.1:999",
            dst: "198.18.0.2:7",
            iface: 0,
            want: Some(2),
        },
        Case {
            what: "dual-stack IPv6 takes IPv6",
            bind: vec![rp(b(1, "[::]:7")), rp(b(2, "0.0.0.0:7"))],
            src: "[fd00::1]:999",
            dst: "[fd00::2]:7",
            iface: 0,
            want: Some(1),
        },
        Case {
            what: "dual-stack IPv6 alone takes IPv4",
            bind: vec![b(1, "[::]:7")],
            src: "198.18.0.1:999",
            dst: "198.18.0.2:7",
            iface: 0,
            want: Some(1),
        },
        Case {
            what: "IPv6-only refuses IPv4",
            bind: vec![v6only(b(1, "[::]:7"))],
            src: "198.18.0.1:999",
            dst: "198.18.0.2:7",
            iface: 0,
            want: None,
        },
        Case {
            what: "IPv4 socket refuses IPv6",
            bind: vec![b(1, "0.0.0.0:7")],
            src: "[fd00::1]:999",
            dst: "[fd00::2]:7",
            iface: 0,
            want: None,
        },
        Case {
            what: "specific IPv6 beats wildcard IPv6",
            bind: vec![rp(b(1, "[::]:7")), rp(b(2, "[fd00::2]:7"))],
            src: "[fd00::1]:9",
            dst: "[fd00::2]:7",
            iface: 0,
            want: Some(2),
        },
        Case {
            what: "connected beats unconnected for its peer",
            bind: vec![rp(b(1, "0.0.0.0:7")), connected(rp(b(2, "0.0.0.0:7")), "198.18.0.2:7", "198.18.0.1:999")],
            src: "198.18.0.1:999",
            dst: "198.18.0.2:7",
            iface: 0,
            want: Some(2),
        },
        Case {
            what: "connected refuses others",
            bind: vec![rp(b(1, "0.0.0.0:7")), connected(rp(b(2, "0.0.0.0:7")), "198.18.0.2:7", "198.18.0.1:999")],
            src: "198.18.0.1:998",
            dst: "198.18.0.2:7",
            iface: 0,
            want: Some(1),
        },
        Case {
            what: "connected alone refuses others",
            bind: vec![connected(b(2, "0.0.0.0:7"), "198.18.0.2:7", "198.18.0.1:999")],
            src: "198.18.0.9:999",
            dst: "198.18.0.2:7",
            iface: 0,
            want: None,
        },
        Case {
            what: "bound device wins on its device",
            bind: vec![rp(b(1, "0.0.0.0:7")), rp(dev(b(2, "0.0.0.0:7"), 1))],
            src: "198.18.0.1:9",
            dst: "198.18.0.2:7",
            iface: 1,
            want: Some(2),
        },
        Case {
            what: "bound device refuses others",
            bind: vec![dev(b(2, "0.0.0.0:7"), 1)],
            src: "198.18.0.1:9",
            dst: "198.18.0.2:7",
            iface: 0,
            want: None,
        },
        Case {
            what: "other port",
            bind: vec![b(1, "0.0.0.0:7")],
            src: "198.18.0.1:9",
            dst: "198.18.0.2:8",
            iface: 0,
            want: None,
        },
    ];
    for c in cases {
        let t = SocketTable::new(SECRET);
        for x in c.bind {
            t.bind(x).unwrap_or_else(|e| panic!("{}: bind {e:?}", c.what));
        }
        let mut k = key(c.src, c.dst);
        k.iface = c.iface;
        assert_eq!(winner(&t, &k), c.want, "{}", c.what);
    }
}

#[test]
fn bind_conflicts_and_ephemeral_ports() {
    let t = SocketTable::new(SECRET);
    t.bind(b(1, "0.0.0.0:7")).unwrap();
    assert_eq!(t.bind(b(2, "198.18.0.2:7")).unwrap_err(), BindError::InUse);
    assert_eq!(t.bind(b(3, "[::]:7")).unwrap_err(), BindError::InUse, "dual-stack :: covers 0.0.0.0");
    let mut v6only = b(4, "[::]:7");
    v6only.v6only = true;
    t.bind(v6only).unwrap();
    let a = t.bind(b(5, "0.0.0.0:0")).unwrap();
    assert!(EPHEMERAL.contains(&a.port()));
    let c = t.bind(b(6, "0.0.0.0:0")).unwrap();
    assert_ne!(a.port(), c.port());
    assert!(t.unbind(1, 7).is_some());
    t.bind(b(7, "198.18.0.2:7")).unwrap();
    t.bind(rp(b(8, "0.0.0.0:8"))).unwrap();
    t.bind(rp(b(9, "0.0.0.0:8"))).unwrap();
    assert_eq!(t.bind(b(10, "0.0.0.0:8")).unwrap_err(), BindError::InUse, "the group needs reuseport from everyone");
}

#[test]
fn generation_moves_with_every_change() {
    let t = SocketTable::new(SECRET);
    let g0 = t.generation();
    t.bind(b(1, "0.0.0.0:7")).unwrap();
    let g1 = t.generation();
    assert!(g1 > g0);
    assert!(t.update(1, "198.18.0.2:7".parse().unwrap(), Some("198.18.0.1:9".parse().unwrap()), 1));
    assert!(t.generation() > g1);
    assert_eq!(winner(&t, &key("198.18.0.1:10", "198.18.0.2:7")), None, "connected: other peers refused");
    assert_eq!(winner(&t, &key("198.18.0.1:9", "198.18.0.2:7")), Some(1));
    assert!(t.update(1, "0.0.0.0:7".parse().unwrap(), None, 2));
    assert_eq!(winner(&t, &key("198.18.0.1:10", "198.18.0.2:7")), Some(1), "disconnected");
}

/// (src port, src addr) spread over `n` flows.
fn flows(n: u32) -> impl Iterator<Item = FlowKey> {
    (0..n)
        .map(|i| key(&format!("198.18.{}.{}:{}", 1 + i % 200, 1 + (i / 200) % 250, 1024 + i % 50_000), "198.18.0.2:9"))
}

#[test]
fn reuseport_group_shares_flows_evenly() {
    let t = SocketTable::new(SECRET);
    for id in 1..=4 {
        t.bind(rp(b(id, "0.0.0.0:9"))).unwrap();
    }
    let s = t.snapshot();
    let mut counts: HashMap<u64, u32> = HashMap::new();
    for k in flows(10_000) {
        let (_, w) = s.lookup(&k).expect("a member");
        *counts.entry(w.id).or_default() += 1;
        assert_eq!(s.lookup(&k).unwrap().1.id, w.id, "one flow, one socket");
    }
    for id in 1..=4 {
        let c = counts[&id];
        assert!((2250..=2750).contains(&c), "socket {id}: {c} of 10,000 ({counts:?})");
    }

    // A connected member takes its peer's flow only; the others still share
    // the rest evenly (Linux's skip gave its share to one neighbour).
    t.bind(connected(rp(b(5, "0.0.0.0:9")), "198.18.0.2:9", "198.18.99.1:4444")).unwrap();
    let s = t.snapshot();
    let peer = key("198.18.99.1:4444", "198.18.0.2:9");
    assert_eq!(s.lookup(&peer).unwrap().1.id, 5);
    let mut counts: HashMap<u64, u32> = HashMap::new();
    for k in flows(10_000) {
        *counts.entry(s.lookup(&k).unwrap().1.id).or_default() += 1;
    }
    assert!(!counts.contains_key(&5), "the connected member gets no other flow: {counts:?}");
    for id in 1..=4 {
        let c = counts[&id];
        assert!((2250..=2750).contains(&c), "socket {id}: {c} of 10,000 ({counts:?})");
    }
}

/// Two threads stand in for two lcores: with one group member per lcore,
/// every datagram stays on the lcore that looked it up.
#[test]
fn incoming_lcore_preference_keeps_flows_on_their_lcore() {
    let t = Arc::new(SocketTable::new(SECRET));
    for l in 0..2u32 {
        let mut x = rp(b(10 + l as u64, "0.0.0.0:9"));
        x.incoming_lcore = Some(l);
        t.bind(x).unwrap();
    }
    let threads: Vec<_> = (0..2u32)
        .map(|l| {
            let t = t.clone();
            std::thread::spawn(move || {
                let s = t.snapshot();
                for mut k in flows(5_000) {
                    k.lcore = l;
                    assert_eq!(s.lookup(&k).unwrap().1.id, 10 + l as u64);
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    // The +1 of compute_score: a lone socket with an incoming lcore still
    // takes traffic looked up elsewhere.
    let t = SocketTable::new(SECRET);
    let mut x = b(1, "0.0.0.0:9");
    x.incoming_lcore = Some(1);
    t.bind(x).unwrap();
    assert_eq!(winner(&t, &key("198.18.0.1:1", "198.18.0.2:9").on_lcore(0)), Some(1));
}

#[test]
fn many_connected_sockets_on_one_port() {
    let t = SocketTable::new(SECRET);
    for i in 0..500u64 {
        let x = connected(rp(b(i + 1, "0.0.0.0:9")), "198.18.0.2:9", &format!("198.18.1.{}:{}", 1 + i % 250, 2000 + i));
        t.bind(x).unwrap();
    }
    let s = t.snapshot();
    for i in 0..500u64 {
        let k = key(&format!("198.18.1.{}:{}", 1 + i % 250, 2000 + i), "198.18.0.2:9");
        assert_eq!(s.lookup(&k).unwrap().1.id, i + 1);
    }
    assert!(s.lookup(&key("198.18.1.1:1", "198.18.0.2:9")).is_none(), "no unconnected member");
}

/// A socket as the churn test sees it.
#[derive(Debug)]
struct Sink {
    id: u64,
    got: Mutex<Vec<u64>>,
}

/// Sockets join and leave a group and connect and disconnect while another
/// thread delivers a stream: every datagram reaches exactly one socket, one
/// that matched it in the table state its lookup saw.
#[test]
fn churn_never_misdelivers() {
    let t: Arc<SocketTable<Arc<Sink>>> = Arc::new(SocketTable::new(SECRET));
    let mk = |id: u64| {
        let mut x = Binding {
            id,
            family: Family::V4,
            local: "0.0.0.0:9".parse().unwrap(),
            bound: "0.0.0.0".parse().unwrap(),
            peer: None,
            v6only: false,
            iface: None,
            reuseport: true,
            incoming_lcore: None,
            epoch: 0,
            sock: Arc::new(Sink { id, got: Mutex::new(Vec::new()) }),
        };
        x.reuseport = true;
        x
    };
    let all: Arc<Mutex<Vec<Arc<Sink>>>> = Arc::new(Mutex::new(Vec::new()));
    for id in 1..=4 {
        let x = mk(id);
        all.lock().unwrap().push(x.sock.clone());
        t.bind(x).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let changes = Arc::new(AtomicU64::new(0));
    let writer = {
        let (t, stop, all, changes) = (t.clone(), stop.clone(), all.clone(), changes.clone());
        std::thread::spawn(move || {
            let mut next = 100u64;
            let mut members: Vec<u64> = (1..=4).collect();
            let mut step = 0u64;
            while !stop.load(Ordering::Relaxed) {
                step += 1;
                match step % 4 {
                    0 => {
                        let x = mk(next);
                        all.lock().unwrap().push(x.sock.clone());
                        t.bind(x).unwrap();
                        members.push(next);
                        next += 1;
                    }
                    1 if members.len() > 2 => {
                        let id = members.remove(0);
                        t.unbind(id, 9).unwrap();
                    }
                    2 => {
                        let id = members[members.len() / 2];
                        t.update(id, "198.18.0.2:9".parse().unwrap(), Some("198.18.7.7:7777".parse().unwrap()), step);
                    }
                    _ => {
                        for &id in &members {
                            t.update(id, "0.0.0.0:9".parse().unwrap(), None, step);
                        }
                    }
                }
                changes.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let sent = 200_000u64;
    let mut none = 0u64;
    let mut snap = t.snapshot();
    let mut generation = t.generation();
    for id in 0..sent {
        if id % 32 == 0 && t.generation() != generation {
            generation = t.generation();
            snap = t.snapshot();
        }
        let src = if id % 10 == 0 {
            "198.18.7.7:7777".to_string()
        } else {
            format!("198.18.1.{}:{}", 1 + id % 200, 1024 + id % 5000)
        };
        let k = key(&src, "198.18.0.2:9");
        match snap.lookup(&k) {
            Some((i, b)) => {
                // The pick matched the key in the state this lookup saw.
                let m = super::score::Matcher::of(b);
                let wildcard = b.local.ip().is_unspecified();
                assert!(
                    compute_score(&m, &k, wildcard) >= 0,
                    "datagram {id} from {src} went to {} ({:?} peer {:?})",
                    b.id,
                    b.local,
                    b.peer
                );
                assert_eq!(snap.get(i).id, b.id);
                b.sock.got.lock().unwrap().push(id);
            }
            None => none += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    assert!(changes.load(Ordering::Relaxed) > 100, "the table changed while datagrams flowed");
    let mut seen = vec![false; sent as usize];
    let mut delivered = 0u64;
    for s in all.lock().unwrap().iter() {
        for &id in s.got.lock().unwrap().iter() {
            assert!(!seen[id as usize], "datagram {id} reached two sockets (second: {})", s.id);
            seen[id as usize] = true;
            delivered += 1;
        }
    }
    assert_eq!(delivered + none, sent, "every datagram reached one socket or was counted as having none");
    let _ = IpAddr::from([0u8; 4]);
}

/// The lookup's shortcuts (a port's sole socket, a port's only group)
/// answer as the walk does, for the tables they take and the ones next to
/// them they must leave to the walk: every family, v6only, a device, a
/// connected member, a specific address, an incoming lcore.
#[test]
fn shortcuts_answer_as_the_walk_does() {
    let v6only = |mut x: Binding<u64>| {
        x.v6only = true;
        x
    };
    let dev = |mut x: Binding<u64>| {
        x.iface = Some(1);
        x
    };
    let lcore = |mut x: Binding<u64>, l: u32| {
        x.incoming_lcore = Some(l);
        x
    };
    let tables: Vec<Vec<Binding<u64>>> = vec![
        vec![b(1, "0.0.0.0:9")],
        vec![b(1, "[::]:9")],
        vec![v6only(b(1, "[::]:9"))],
        vec![dev(b(1, "0.0.0.0:9"))],
        (1..=8).map(|i| rp(b(i, "0.0.0.0:9"))).collect(),
        (1..=8).map(|i| rp(b(i, "[::]:9"))).collect(),
        (1..=8).map(|i| v6only(rp(b(i, "[::]:9")))).collect(),
        (1..=8).map(|i| lcore(rp(b(i, "0.0.0.0:9")), (i % 2) as u32)).collect(),
        // One member per lcore (and none for lcore 3), IPv6 as well.
        (0..3).map(|i| lcore(rp(b(i + 1, "[::]:9")), i as u32)).collect(),
        // Lcore 0 has one member, lcore 1 two.
        [0, 1, 1].iter().enumerate().map(|(i, &l)| lcore(rp(b(i as u64 + 1, "0.0.0.0:9")), l)).collect(),
        (1..=4).map(|i| rp(b(i, "0.0.0.0:9"))).chain((5..=8).map(|i| rp(b(i, "[::]:9")))).collect(),
        (1..=4).map(|i| rp(b(i, "0.0.0.0:9"))).chain([dev(rp(b(5, "0.0.0.0:9")))]).collect(),
        (1..=4).map(|i| rp(b(i, "0.0.0.0:9"))).chain([rp(b(5, "198.18.0.2:9"))]).collect(),
        (1..=4)
            .map(|i| rp(b(i, "0.0.0.0:9")))
            .chain([connected(rp(b(5, "0.0.0.0:9")), "198.18.0.2:9", "198.18.1.1:1024")])
            .collect(),
    ];
    let mut keys: Vec<FlowKey> = flows(200).collect();
    keys.extend((0..200).map(|i| key(&format!("[2001:db8::{:x}]:{}", i + 1, 1024 + i), "[2001:db8::2]:9")));
    keys.push(key("198.18.1.1:1024", "198.18.0.2:9"));
    let (mut shortcuts, mut spreads) = (0, 0);
    for (n, bind) in tables.into_iter().enumerate() {
        let t = SocketTable::new(SECRET);
        for x in bind {
            t.bind(x).unwrap_or_else(|e| panic!("table {n}: {e:?}"));
        }
        let s = t.snapshot();
        for (i, k) in keys.iter().enumerate() {
            for iface in [0, 1] {
                // Lcores 0 to 3: with one member, with two, with none.
                let mut k = k.on_lcore((i % 4) as u32);
                k.iface = iface;
                k.rss_hash = (i % 3 == 0).then_some((i as u32).wrapping_mul(0x9e37_79b9));
                let fast = s.lookup(&k).map(|(i, b)| (i, b.id));
                let walked = s.lookup_walked(&k).map(|(i, b)| (i, b.id));
                assert_eq!(fast, walked, "table {n}, key {k:?}");
                // The receive fast path's form: the shortcut before a key.
                let short = match s.shortcut(k.dst_port, k.v4) {
                    Shortcut::Found(found) => Some(found),
                    Shortcut::LcoreGroup(g) if let Some(found) = s.sole_member(g, k.lcore) => Some(Some(found)),
                    Shortcut::Group(g) | Shortcut::LcoreGroup(g) => {
                        let hash = k.rss_hash.unwrap_or_else(|| s.flow_hash_of(k.src, k.src_port, k.dst, k.dst_port));
                        let picked = s.pick(g, hash, k.lcore);
                        // The burst's memo of a group without lcore
                        // members: the hash scaled onto its block.
                        if let Some((first, members, v6)) = s.spread(g) {
                            spreads += 1;
                            let (i, b) = picked.expect("a spread group always picks");
                            assert_eq!(first + super::reciprocal_scale(hash, members), i, "table {n}, spread, {k:?}");
                            assert_eq!(b.family == Family::V6, v6, "table {n}, spread's family, {k:?}");
                        }
                        Some(picked)
                    }
                    Shortcut::Walk => None,
                };
                if let Some(short) = short {
                    assert_eq!(short.map(|(i, b)| (i, b.id)), walked, "table {n}, shortcut, key {k:?}");
                }
                shortcuts += fast.is_some() as u32;
            }
        }
    }
    assert!(shortcuts > 1000, "the tables take datagrams: {shortcuts}");
    assert!(spreads > 100, "groups without lcore members were spread: {spreads}");
}

/// A broadcast reaches every socket that matches it, as Linux's
/// `__udp4_lib_mcast_deliver` finds them: both members of a reuseport
/// group on the wildcard, a dual-stack IPv6 socket; not a socket bound to
/// the unicast address, a connected one (connect fixed its local address,
/// as Linux's sets `inet_rcv_saddr`, to the sender too), one on another
/// interface, an IPv6-only one, another port.
#[test]
fn group_matches_every_socket_that_matches() {
    let t = SocketTable::new(SECRET);
    let mut on_iface_1 = rp(b(6, "0.0.0.0:9"));
    on_iface_1.iface = Some(1);
    let mut v6only = rp(b(8, "[::]:9"));
    v6only.v6only = true;
    for x in [
        rp(b(1, "0.0.0.0:9")),
        rp(b(2, "0.0.0.0:9")),
        rp(b(3, "198.18.0.2:9")),
        rp(connected(b(4, "0.0.0.0:9"), "198.18.0.2:9", "198.18.0.1:4000")),
        rp(connected(b(5, "0.0.0.0:9"), "198.18.0.2:9", "198.18.0.7:4000")),
        on_iface_1,
        rp(b(7, "[::]:9")),
        v6only,
        b(9, "0.0.0.0:10"),
    ] {
        t.bind(x).unwrap();
    }
    let snap = t.snapshot();
    let mut out = Vec::new();
    let ids = |out: &Vec<u32>| {
        let mut v: Vec<u64> = out.iter().map(|&i| snap.binding(i).id).collect();
        v.sort();
        v
    };
    snap.group_matches(&key("198.18.0.1:4000", "198.18.0.255:9"), &mut out);
    assert_eq!(ids(&out), [1, 2, 7]);
    snap.group_matches(&key("198.18.0.1:4000", "255.255.255.255:9"), &mut out);
    assert_eq!(ids(&out), [1, 2, 7]);
    snap.group_matches(&key("198.18.0.1:4000", "255.255.255.255:11"), &mut out);
    assert!(out.is_empty(), "no socket on the port");
}

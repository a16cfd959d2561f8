//! What a snapshot reads: the counters, loads and tables the lcores keep
//! anyway, off the datapath.

use std::sync::Mutex;
use std::sync::atomic::Ordering;

use super::*;
use crate::control_plane::Stack;

pub(crate) fn info(stack: &Stack) -> Info {
    let s = &stack.shared;
    Info {
        pid: std::process::id(),
        name: s.cfg.name.clone(),
        id: s.id,
        version: env!("CARGO_PKG_VERSION").into(),
        running: stack.is_running(),
        tsc_hz: stack.tsc_hz(),
        tsc: spate_dpdk::lcore::tsc(),
        interfaces: stack
            .interfaces()
            .iter()
            .map(|i| InterfaceInfo {
                index: i.index,
                name: i.name.clone(),
                mac: i.mac.to_string(),
                mtu: i.mtu,
                addrs: i.ipv4.iter().chain(&i.ipv6).map(|c| c.to_string()).collect(),
            })
            .collect(),
    }
}

/// Everything at once, off the datapath: locks the tables the lcores take
/// only on their slow paths (the socket table's master copy, the
/// neighbour table, the path-MTU table), none they take per packet.
pub(crate) fn snapshot(stack: &Stack) -> Snapshot {
    let s = &stack.shared;
    let counters = stack.counters();
    let lcores = (0..s.lcores.len())
        .map(|i| {
            let (busy_cycles, loops) = stack.lcore_load(i);
            let c = stack.lcore_counters(i);
            LcoreInfo {
                index: i,
                lcore: s.lcores[i],
                busy_cycles,
                loops,
                rx_frames: c[Counter::RxFrames],
                datagrams: c[Counter::UdpInDatagrams] + c[Counter::Udp6InDatagrams],
            }
        })
        .collect();
    // Not every driver's statistics calls may run on two threads at once
    // (the control endpoint's clients and the metrics endpoint).
    static PORT_STATS: Mutex<()> = Mutex::new(());
    let _one_at_a_time = PORT_STATS.lock().unwrap_or_else(|p| p.into_inner());
    let ports = s
        .ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let st = p.stats().unwrap_or_default();
            let stats = [
                ("ipackets", st.ipackets),
                ("opackets", st.opackets),
                ("ibytes", st.ibytes),
                ("obytes", st.obytes),
                ("imissed", st.imissed),
                ("ierrors", st.ierrors),
                ("oerrors", st.oerrors),
                ("rx_nombuf", st.rx_nombuf),
            ];
            let link = p.link().ok();
            PortInfo {
                index: i as u16,
                name: p.name().to_string(),
                link_up: link.is_some_and(|l| l.up),
                speed_mbps: link.map_or(0, |l| l.speed_mbps),
                stats: stats.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
                xstats: p.xstats().unwrap_or_default().into_iter().collect(),
            }
        })
        .collect();
    let mut bindings = s.sockets.bindings();
    bindings.sort_by_key(|b| (b.local.port(), b.id));
    let mut groups: Vec<(bool, bool, IpAddr, u16, Option<u16>)> = Vec::new();
    let sockets = bindings
        .iter()
        .map(|b| {
            let key = (b.family == crate::lookup::Family::V4, b.v6only, b.bound, b.local.port(), b.iface);
            let reuseport_group = b.reuseport.then(|| match groups.iter().position(|g| *g == key) {
                Some(i) => i,
                None => {
                    groups.push(key);
                    groups.len() - 1
                }
            });
            let q = &b.sock.queue;
            SocketInfo {
                id: b.id,
                family: if b.family == crate::lookup::Family::V4 { "ipv4" } else { "ipv6" }.into(),
                v6only: b.v6only,
                local: b.local.to_string(),
                peer: b.peer.map(|p| p.to_string()),
                iface: b.iface,
                reuseport_group,
                queued: q.queued(),
                queued_bytes: q.rmem(),
                rcvbuf: q.rcvbuf(),
                drops: q.total_drops(),
                reader_wakeups: q.wakeups(),
                gro: b.sock.gro.load(Ordering::Relaxed),
                tunnel: b.sock.tunnel.is_some(),
                read_delay: {
                    let h = &b.sock.read_delay;
                    let counts = h.counts();
                    let count = counts.iter().sum::<u64>();
                    (h.is_on() || count > 0).then(|| DelayInfo {
                        count,
                        sum_ns: h.sum_ns(),
                        buckets: counts.iter().enumerate().map(|(i, n)| (DelayHistogram::bound_ns(i), *n)).collect(),
                    })
                },
            }
        })
        .collect();
    let neighbors = s
        .neigh
        .entries(s.clock.now())
        .into_iter()
        .map(|((iface, ip), mac, state, waiting)| NeighborInfo {
            iface,
            ip,
            mac: mac.map(|m| m.to_string()),
            state: state.into(),
            waiting,
        })
        .collect();
    let path_mtus = s
        .pmtu
        .entries()
        .into_iter()
        .map(|(dst, mtu, left)| PathMtuInfo { dst, mtu, expires_secs: left.as_secs_f64() })
        .collect();
    let (receive_bytes, receive_limit) = stack.receive_memory();
    Snapshot {
        info: info(stack),
        counters: counters.iter().map(|(c, v)| (nstat_name(c), v)).collect(),
        lcores,
        ports,
        sockets,
        neighbors,
        path_mtus,
        memory: MemoryInfo {
            mbufs_in_use: s.pool.in_use(),
            mbufs: s.pool.size(),
            receive_bytes,
            receive_limit,
            reassembly_bytes: stack.reassembly_bytes(),
        },
        capture: s.capture.current().map(|t| {
            let (captured, dropped) = t.totals();
            CaptureInfo { snaplen: t.snaplen(), captured, dropped }
        }),
    }
}

//! The control endpoint of a stack on an in-memory wire pair: what a
//! snapshot shows (counters, sockets and their reuseport groups, queued
//! datagrams, lcores, ports, neighbours, memory), changes made through it,
//! its socket's mode, a stale socket replaced, a name in use refused, two
//! stacks with two endpoints, clients that leave mid-request leaving
//! nothing attached, and a capture that holds every frame that arrives
//! once it started.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use spate::control::{self, Client, Request, Snapshot};
use spate::dpdk::Memory;
use spate::{PortSpec, Stack, StackConfig, UdpSocket};
use spate_testkit::wire_peer::udp_frame;
use spate_testkit::{WirePeer, device_lock, shared_eal, unique};

const DIR: &str = "/run/spate";

fn stack_on(port: &str, name: Option<String>) -> spate::Result<Stack> {
    stack_sleeping(port, name, 50)
}

fn stack_sleeping(port: &str, name: Option<String>, idle_sleep_us: u32) -> spate::Result<Stack> {
    let cfg = StackConfig {
        lcores: "1".into(),
        ports: vec![PortSpec::new(port).addr("198.18.0.2/24").unwrap()],
        mempool_size: 2047,
        idle_sleep_us,
        stop_on_signal: false,
        name,
        ..StackConfig::default()
    };
    Stack::new(cfg)
}

fn path_of(name: &str) -> PathBuf {
    Path::new(DIR).join(format!("{name}.sock"))
}

/// Snapshots until `f` holds (at most 5 s).
fn wait_for(client: &mut Client, f: impl Fn(&Snapshot) -> bool) -> Snapshot {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let s = client.snapshot().unwrap();
        if f(&s) || Instant::now() > until {
            return s;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_control_endpoint_shows_the_stack_and_changes_it() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (mut peer, port, _p) = WirePeer::new(1023);
    let name = unique("ctl-");
    let stack = stack_on(&port, Some(name.clone())).unwrap();
    let mac = stack.interfaces()[0].mac;
    let plain = UdpSocket::bind(&stack, "0.0.0.0:7").unwrap();
    let group: Vec<UdpSocket> =
        (0..2).map(|_| UdpSocket::builder(&stack).reuseport(true).bind("0.0.0.0:9").unwrap()).collect();
    let running = stack.spawn_polling().unwrap();

    let path = path_of(&name);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}: its owner and root only", path.display());
    assert_eq!(control::find(Path::new(DIR), None, Some(&name)).unwrap(), path);
    let mut client = Client::connect(&path).unwrap();

    for i in 0..5u8 {
        peer.send(&udp_frame(mac, false, 4000, 7, &[i; 100]));
    }
    // A snapshot reads the counters before the sockets: both are waited for.
    let s = wait_for(&mut client, |s| {
        s.counters["UdpInDatagrams"] == 5 && s.sockets.iter().any(|k| k.local == "0.0.0.0:7" && k.queued == 5)
    });
    assert_eq!(s.info.name.as_deref(), Some(name.as_str()));
    assert_eq!(s.info.pid, std::process::id());
    assert!(s.info.running);
    assert_eq!(s.counters["UdpInDatagrams"], 5, "{:?}", s.counters);
    assert_eq!(s.counters["UdpInDatagrams"], stack.counters()[spate::Counter::UdpInDatagrams]);
    let seven = s.sockets.iter().find(|k| k.local == "0.0.0.0:7").unwrap();
    assert_eq!((seven.id, seven.queued, seven.reuseport_group), (plain.id(), 5, None));
    assert!(seven.queued_bytes >= 500 && seven.rcvbuf > 0, "{seven:?}");
    let nines: Vec<_> = s.sockets.iter().filter(|k| k.local == "0.0.0.0:9").collect();
    assert_eq!(nines.len(), 2);
    assert!(nines[0].reuseport_group.is_some() && nines[0].reuseport_group == nines[1].reuseport_group);
    let mut ids: Vec<u64> = nines.iter().map(|k| k.id).collect();
    ids.sort();
    let mut want: Vec<u64> = group.iter().map(|g| g.id()).collect();
    want.sort();
    assert_eq!(ids, want);
    assert_eq!(s.lcores.len(), 1);
    assert_eq!((s.lcores[0].lcore, s.lcores[0].datagrams), (1, 5));
    assert!(s.lcores[0].loops > 0);
    assert_eq!(s.ports.len(), 1);
    assert!(s.ports[0].stats["ipackets"] >= 5, "{:?}", s.ports[0]);
    // (The frames are the peer's pool's mbufs.)
    assert!(s.memory.receive_bytes >= 500 && s.memory.mbufs == 2047, "{:?}", s.memory);
    // Reading them empties the queue the snapshot shows.
    let mut buf = [0u8; 200];
    for _ in 0..5 {
        assert_eq!(plain.recv_from(&mut buf).unwrap().0, 100);
    }
    let s = wait_for(&mut client, |s| s.sockets.iter().any(|k| k.id == plain.id() && k.queued == 0));
    assert_eq!(s.sockets.iter().find(|k| k.id == plain.id()).unwrap().queued_bytes, 0);

    // Changes through the endpoint.
    let ok = |c: &mut Client, r: Request| c.request(&r).unwrap_or_else(|e| panic!("{r:?}: {e}"));
    ok(&mut client, Request::AddAddress { iface: 0, addr: "198.18.0.9/24".into() });
    assert!(client.info().unwrap().interfaces[0].addrs.contains(&"198.18.0.9/24".to_string()));
    ok(&mut client, Request::RemoveAddress { iface: 0, ip: "198.18.0.9".parse().unwrap() });
    assert!(!client.info().unwrap().interfaces[0].addrs.iter().any(|a| a.starts_with("198.18.0.9/")));
    let nb = "198.18.0.77".parse().unwrap();
    ok(&mut client, Request::AddNeighbor { iface: 0, ip: nb, mac: "02:00:00:00:00:77".into() });
    let s = client.snapshot().unwrap();
    let e = s.neighbors.iter().find(|n| n.ip == nb).expect("the neighbour listed");
    assert_eq!((e.mac.as_deref(), e.state.as_str()), (Some("02:00:00:00:00:77"), "PERMANENT"));
    ok(&mut client, Request::RemoveNeighbor { iface: 0, ip: nb });
    assert!(!client.snapshot().unwrap().neighbors.iter().any(|n| n.ip == nb));
    let err = client.request(&Request::RemoveNeighbor { iface: 0, ip: nb }).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
    ok(
        &mut client,
        Request::AddRoute { dst: "203.0.113.0/24".into(), via: Some("198.18.0.1".parse().unwrap()), iface: None },
    );
    assert!(stack.routes().iter().any(|r| r.dst.to_string() == "203.0.113.0/24"));
    ok(&mut client, Request::RemoveRoute { dst: "203.0.113.0/24".into() });
    assert!(stack.routes().is_empty());
    let err = client.request(&Request::AddAddress { iface: 0, addr: "not an address".into() }).unwrap_err();
    assert_eq!(err.raw_os_error(), None);
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
    let s = client.snapshot().unwrap();
    assert_eq!((s.counters["ConfAddrAdds"], s.counters["ConfNeighRemoves"], s.counters["ConfRouteAdds"]), (1, 1, 1));

    running.stop();
    drop((plain, group, client));
    drop(stack);
    assert!(!path.exists(), "the socket goes with the stack");
}

#[test]
fn stale_sockets_are_replaced_and_names_are_unique() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    std::fs::create_dir_all(DIR).unwrap();
    // A killed process's socket: there, nobody listening.
    let name = unique("stale-");
    let path = path_of(&name);
    drop(UnixListener::bind(&path).unwrap());
    assert!(UnixStream::connect(&path).is_err());
    // A process that is gone left one named by its pid (pids stop short
    // of 4,194,304).
    let gone = Path::new(DIR).join("4194999-0.sock");
    drop(UnixListener::bind(&gone).unwrap());

    let (_peer, port, _p) = WirePeer::new(255);
    let stack = stack_on(&port, Some(name.clone())).unwrap();
    assert_eq!(Client::connect(&path).unwrap().info().unwrap().name.as_deref(), Some(name.as_str()));
    assert!(!gone.exists(), "the gone process's socket was swept");

    // The name is taken while the stack runs.
    let (_peer2, port2, _p2) = WirePeer::new(255);
    let err = stack_on(&port2, Some(name.clone())).unwrap_err().to_string();
    assert!(err.contains("a running stack serves it"), "{err}");

    // Two unnamed stacks in one process: two endpoints.
    let (_peer3, port3, _p3) = WirePeer::new(255);
    let (_peer4, port4, _p4) = WirePeer::new(255);
    let (a, b) = (stack_on(&port3, None).unwrap(), stack_on(&port4, None).unwrap());
    let mine: Vec<_> = control::endpoints(Path::new(DIR))
        .into_iter()
        .filter(|(_, i)| i.pid == std::process::id() && i.name.is_none())
        .collect();
    assert_eq!(mine.len(), 2, "{mine:?}");
    assert_ne!(mine[0].0, mine[1].0);
    let err = control::find(Path::new(DIR), Some(std::process::id()), None).unwrap_err().to_string();
    assert!(err.contains("3 stacks run"), "{err}");
    drop((a, b));
    assert!(mine.iter().all(|(p, _)| !p.exists()));
    drop(stack);
    assert!(!path.exists());
}

#[test]
fn clients_that_leave_mid_request_leave_nothing_attached() {
    use std::io::{BufRead, BufReader, Write};
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (_peer, port, _p) = WirePeer::new(255);
    let name = unique("half-");
    let _stack = stack_on(&port, Some(name.clone())).unwrap();
    let path = path_of(&name);
    // More than the endpoint serves at once (16), each gone half-way.
    for _ in 0..40 {
        let mut s = UnixStream::connect(&path).unwrap();
        s.write_all(b"{\"op\": \"snap").unwrap();
    }
    // Room for clients again once the halves are noticed gone.
    let until = Instant::now() + Duration::from_secs(5);
    let info = loop {
        match Client::connect(&path).and_then(|mut c| c.info()) {
            Ok(i) => break i,
            Err(e) if Instant::now() < until => {
                assert!(e.to_string().contains("too many clients"), "{e}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("the endpoint still refuses: {e}"),
        }
    };
    assert_eq!(info.name.as_deref(), Some(name.as_str()));
    // A line that is no request: an error, and the connection goes on.
    let mut s = UnixStream::connect(&path).unwrap();
    s.write_all(b"{\"op\": \"reboot\"}\n").unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.contains("\"error\"") && line.contains("not a request"), "{line}");
    s.write_all(b"{\"op\": \"info\"}\n").unwrap();
    line.clear();
    r.read_line(&mut line).unwrap();
    assert!(line.starts_with("{\"ok\""), "{line}");
}

#[test]
fn a_socket_keeps_its_read_delays_when_asked() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (mut peer, port, _p) = WirePeer::new(1023);
    let name = unique("delay-");
    let stack = stack_on(&port, Some(name.clone())).unwrap();
    let mac = stack.interfaces()[0].mac;
    let kept = UdpSocket::bind(&stack, "0.0.0.0:7").unwrap();
    let plain = UdpSocket::bind(&stack, "0.0.0.0:8").unwrap();
    kept.set_read_delay_histogram(true).unwrap();
    assert!(kept.read_delay_histogram().unwrap() && !plain.read_delay_histogram().unwrap());
    kept.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let running = stack.spawn_polling().unwrap();
    let mut client = Client::connect(&path_of(&name)).unwrap();

    // Five read 100 ms after they arrived, five as they arrive.
    let mut buf = [0u8; 200];
    for i in 0..5u8 {
        peer.send(&udp_frame(mac, false, 4000, 7, &[i; 10]));
        peer.send(&udp_frame(mac, false, 4000, 8, &[i; 10]));
    }
    wait_for(&mut client, |s| s.sockets.iter().any(|k| k.id == kept.id() && k.queued == 5));
    std::thread::sleep(Duration::from_millis(100));
    for _ in 0..5 {
        kept.recv_from(&mut buf).unwrap();
        plain.recv_from(&mut buf).unwrap();
    }
    for i in 0..5u8 {
        peer.send(&udp_frame(mac, false, 4000, 7, &[i; 10]));
        kept.recv_from(&mut buf).unwrap();
    }
    let s = client.snapshot().unwrap();
    let d = s.sockets.iter().find(|k| k.id == kept.id()).unwrap().read_delay.clone().expect("kept");
    assert_eq!(d.count, 10, "{d:?}");
    // 100 ms lies in the bucket from 65.5 to 131 ms; a read at once, even
    // on a loaded machine, below it.
    let late: u64 = d.buckets.iter().filter(|(b, _)| b.is_none_or(|ns| ns > 65_536_000)).map(|(_, n)| n).sum();
    assert_eq!(late, 5, "five waited 100 ms or more: {d:?}");
    assert!(d.sum_ns >= 500_000_000, "{d:?}");
    assert!(d.quantile_bound_ns(0.5).is_some_and(|b| b <= 65_536_000), "half were read at once: {d:?}");
    assert!(s.sockets.iter().find(|k| k.id == plain.id()).unwrap().read_delay.is_none());
    // Off: nothing more is counted, what was stays.
    kept.set_read_delay_histogram(false).unwrap();
    peer.send(&udp_frame(mac, false, 4000, 7, &[9; 10]));
    kept.recv_from(&mut buf).unwrap();
    let s = client.snapshot().unwrap();
    assert_eq!(s.sockets.iter().find(|k| k.id == kept.id()).unwrap().read_delay.as_ref().unwrap().count, 10);

    running.stop();
    drop((kept, plain, client));
}

#[test]
fn a_capture_stops_when_asked_while_frames_keep_coming() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (mut peer, port, _p) = WirePeer::new(16383);
    let name = unique("flood-");
    let stack = stack_on(&port, Some(name.clone())).unwrap();
    let mac = stack.interfaces()[0].mac;
    // Nobody reads it: its buffer fills and the rest is dropped, cheaply.
    let _unread = UdpSocket::bind(&stack, "0.0.0.0:7").unwrap();
    let running = stack.spawn_polling().unwrap();
    let client = Client::connect(&path_of(&name)).unwrap();
    let req = control::CaptureRequest { snaplen: Some(64), ..Default::default() };
    let (_, mut capture) = client.capture(req).unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    // The reader, slower than the flood (so the stack always has records
    // to write), asks to stop once frames flow, and times the answer.
    let reader = std::thread::spawn(move || {
        let stopper = capture.stopper().unwrap();
        let (mut frames, mut asked) = (0u64, None::<Instant>);
        let result = loop {
            match capture.next_message() {
                Ok(Some(control::Message::Frame { .. })) => {
                    frames += 1;
                    if frames % 20 == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    if frames == 5_000 && asked.is_none() {
                        stopper.stop().unwrap();
                        asked = Some(Instant::now());
                    }
                }
                Ok(Some(control::Message::Counts { last: true, .. })) => {
                    break Ok((frames, asked.map(|a| a.elapsed())));
                }
                Ok(Some(_)) => {}
                Ok(None) => break Err("the stream ended without its last counts".to_string()),
                Err(e) => break Err(e.to_string()),
            }
        };
        flag.store(true, std::sync::atomic::Ordering::Release);
        result
    });
    // A flood until the capture ended, 10 s at most.
    let frame = udp_frame(mac, false, 4000, 7, &[7; 18]);
    let until = Instant::now() + Duration::from_secs(10);
    let mut sent = 0u64;
    while !done.load(std::sync::atomic::Ordering::Acquire) && Instant::now() < until {
        let mut b: spate::dpdk::Burst = spate::dpdk::Burst::new();
        for _ in 0..32 {
            let _ = b.push(peer.mbuf(&frame));
        }
        sent += peer.send_burst(&mut b) as u64;
    }
    let (frames, took) = reader.join().unwrap().unwrap();
    let took = took.expect("frames flowed");
    eprintln!("capture: {frames} frames read, stopped in {took:?}, {sent} sent");
    assert!(frames >= 5_000, "{frames}");
    // The flood went on past the stop: the capture ended while frames came.
    assert!(took < Duration::from_secs(3), "the capture took {took:?} to stop under a flood of {sent} frames");
    assert!(Instant::now() < until, "the flood outlasted the capture's stop");
    running.stop();
}

/// A capture holds every frame that arrives once the client heard back:
/// 300 captures, each sent one frame at once, each frame in its capture.
/// The lcore polls without a pause and shares its CPU with a busy thread:
/// taken off the CPU between its look at the tap and its burst, it would
/// carry an iteration begun before the attach past the answer.
#[test]
fn a_capture_holds_what_arrives_once_it_started() {
    let _serial = device_lock();
    shared_eal(Memory::Auto);
    let (mut peer, port, _p) = WirePeer::new(1023);
    let name = unique("capstart-");
    let stack = stack_sleeping(&port, Some(name.clone()), 0).unwrap();
    let mac = stack.interfaces()[0].mac;
    let _sink = UdpSocket::bind(&stack, "0.0.0.0:7").unwrap();
    let running = stack.spawn_polling().unwrap();
    // Stopped also when the test fails: the next test's lcore runs on
    // that CPU.
    let spinning = spate_testkit::Spinners::pinned(1);
    let mut missed = Vec::new();
    // Ten misses say enough (each costs a second).
    for i in 0..300u32 {
        if missed.len() == 10 {
            break;
        }
        let client = Client::connect(&path_of(&name)).unwrap();
        let (_, mut capture) = client.capture(control::CaptureRequest::default()).unwrap();
        // 18 bytes: a frame of 60, no padding after them.
        let payload = format!("capture-start-{i:04}").into_bytes();
        peer.send(&udp_frame(mac, false, 4000, 7, &payload));
        let has = |m: &control::Message| matches!(m, control::Message::Frame { data, outbound: false, .. } if data.ends_with(&payload));
        // Counts come every 200 ms: the frame, or a second of them.
        let until = Instant::now() + Duration::from_secs(1);
        let mut seen = false;
        while !seen && Instant::now() < until {
            match capture.next_message().unwrap() {
                Some(m) => seen = has(&m),
                None => panic!("the capture ended by itself"),
            }
        }
        capture.stopper().unwrap().stop().unwrap();
        let mut last = None;
        while let Some(m) = capture.next_message().unwrap() {
            seen |= has(&m);
            if let control::Message::Counts { last: true, captured, dropped } = m {
                last = Some((captured, dropped));
                break;
            }
        }
        if !seen {
            missed.push((i, last));
        }
    }
    drop(spinning);
    assert!(missed.is_empty(), "frames sent once the capture started not in it (round, last counts): {missed:?}");
    running.stop();
}

//! Adaptive polling against the kernel: `spate-echo --poll adaptive` on
//! each kind of device here, net_tap (RX interrupts), net_af_packet (none,
//! but its packet socket wakes the lcore) and net_pcap (none: naps on the
//! hand-off bell), with the kernel as the peer. Idle, it uses almost no CPU where `--poll busy` uses a whole
//! one; datagrams after idle gaps are answered, woken by their frames
//! (tap) or found by a nap; a stack's own sends from an application
//! thread wake its sleeping lcore through the bell; an lcore on a CPU set
//! sleeps at once while threads wait for a CPU. (net_virtio_user
//! behind OVS-DPDK: `ovs_dpdk.rs`.)

use std::net::UdpSocket;
use std::time::Duration;

use spate::config::PollMode;
use spate::dpdk::Memory;
use spate_testkit::{Netns, SpateApp, counter, device_lock, kernel_peer, shared_eal, spate_and_kernel};

const ECHO: &str = env!("CARGO_BIN_EXE_spate-echo");

/// CPU seconds process `pid` used (all its threads: user and system).
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the process's stat");
    // The fields after the command's closing parenthesis; utime and stime
    // are the 14th and 15th of the line.
    let rest = &stat[stat.rfind(')').expect("a command name") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // USER_HZ: 100 on Linux.
    ticks as f64 / 100.0
}

/// The spate-echo process under `pid` (its `timeout` wrapper).
fn echo_pid(pid: u32) -> u32 {
    let mut look = vec![pid];
    while let Some(p) = look.pop() {
        let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
        if comm.trim() == "spate-echo" {
            return p;
        }
        let children = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        look.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
    }
    panic!("no spate-echo under {pid}");
}

/// The share of a CPU `app` used over `secs` seconds.
fn cpu_share(app: &SpateApp, secs: f64) -> f64 {
    let pid = echo_pid(app.proc.pid());
    let before = cpu_secs(pid);
    std::thread::sleep(Duration::from_secs_f64(secs));
    (cpu_secs(pid) - before) / secs
}

/// The CPUs the threads named `comm` of process `pid` may run on
/// (`Cpus_allowed_list`).
fn thread_cpus(pid: u32, comm: &str) -> Vec<String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process's threads");
    tasks
        .filter_map(|t| {
            let dir = t.ok()?.path();
            (std::fs::read_to_string(dir.join("comm")).ok()?.trim() == comm).then_some(dir)
        })
        .filter_map(|dir| {
            let status = std::fs::read_to_string(dir.join("status")).ok()?;
            status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:").map(|v| v.trim().to_string()))
        })
        .collect()
}

/// spate-echo on `device` in `ns` with `--poll mode`, on lcore 0.
fn echo(ns: &Netns, device: &str, mode: &str) -> SpateApp {
    echo_on(ns, device, mode, "0", &[])
}

/// spate-echo on `device` in `ns` with `--poll mode --lcores lcores` and
/// the flags `extra`.
fn echo_on(ns: &Netns, device: &str, mode: &str, lcores: &str, extra: &[&str]) -> SpateApp {
    let args: Vec<String> = ["--vdev", device, "--ip", "198.18.0.2/24", "--lcores", lcores, "--interval", "0"]
        .into_iter()
        .chain(["--poll", mode, "--mbufs", "4095"])
        .chain(extra.iter().copied())
        .map(String::from)
        .collect();
    SpateApp::start(ns, ECHO, &args, "UDP echo on")
}

/// Five datagrams from the kernel in `peer`, 150 ms apart: each answered.
fn echo_after_gaps(peer: &Netns) {
    peer.run(|| spate_testkit::echo_after_gaps(5, 20, Duration::from_millis(150)));
}

#[test]
fn adaptive_echo_sleeps_when_idle_and_wakes_for_frames() {
    let _serial = device_lock();
    // net_tap: RX interrupts. The kernel's side of the tap is the peer.
    let ns = Netns::new("ptap");
    let busy = echo(&ns, "net_tap0,iface=sp0", "busy");
    kernel_peer(&ns, "sp0");
    let busy_share = cpu_share(&busy, 2.0);
    echo_after_gaps(&ns);
    busy.stop();
    let app = echo(&ns, "net_tap0,iface=sp0", "adaptive");
    kernel_peer(&ns, "sp0");
    std::thread::sleep(Duration::from_millis(300));
    let idle_share = cpu_share(&app, 3.0);
    echo_after_gaps(&ns);
    let (c, out) = app.stop();
    println!("net_tap: busy {:.1}% of a CPU, adaptive idle {:.2}%", busy_share * 100.0, idle_share * 100.0);
    assert!(busy_share > 0.3, "busy polling uses a CPU: {busy_share}");
    // A debug build's wake-ups cost more than a release build's.
    assert!(idle_share < 0.05, "idle adaptive: {:.2}% of a CPU\n{out}", idle_share * 100.0);
    assert!(counter(&c, "Poll.WakesRx") >= 5, "each datagram's frame woke the lcore\n{out}");
    // Idle, it sleeps 100 ms at a time.
    assert!(counter(&c, "Poll.Sleeps") >= 10, "{out}");
    assert_eq!(counter(&c, "Udp.InDatagrams"), 5, "{out}");

    // net_af_packet: no RX interrupts, but its queue's packet socket,
    // readable while frames wait, wakes the lcore. Its thread may run on
    // either CPU (`--lcores 1@(0-1)`, EAL's CPU sets), where the kernel
    // finds room. net_pcap: none, naps.
    for (device, lcores) in [("net_af_packet0,iface=vA", "1@(0-1)"), ("net_pcap0,iface=vA,phy_mac=1", "0")] {
        let (spate_ns, kernel) = spate_and_kernel("pnap");
        let app = echo_on(&spate_ns, device, "adaptive", lcores, &[]);
        let socket = device.starts_with("net_af_packet");
        if socket {
            let cpus = thread_cpus(echo_pid(app.proc.pid()), "rte-worker-1");
            assert_eq!(cpus, ["0-1"], "lcore 1's thread may run on CPUs 0 and 1");
        }
        std::thread::sleep(Duration::from_millis(300));
        let idle_share = cpu_share(&app, 3.0);
        echo_after_gaps(&kernel);
        let (c, out) = app.stop();
        println!("{device}: adaptive idle {:.2}% of a CPU", idle_share * 100.0);
        assert!(idle_share < 0.05, "{device} idle adaptive: {:.2}% of a CPU\n{out}", idle_share * 100.0);
        if socket {
            assert!(out.contains("waits on its packet socket"), "said in the log: {out}");
            assert!(counter(&c, "Poll.WakesRx") >= 5, "each datagram's frame woke the lcore\n{out}");
            assert!(counter(&c, "Poll.Sleeps") >= 10, "{out}");
        } else {
            assert!(out.contains("has no RX interrupts"), "said in the log: {out}");
            assert!(counter(&c, "Poll.Sleeps") > 100 && counter(&c, "Poll.WakesRx") == 0, "{out}");
        }
        assert_eq!(counter(&c, "Udp.InDatagrams"), 5, "{out}");
    }
}

#[test]
fn poll_idle_us_sets_how_long_an_idle_lcore_polls_before_it_sleeps() {
    let _serial = device_lock();
    // Datagrams 2 ms apart, each after the last one's echo: an lcore that
    // polls 10 ms idle sleeps between them only while its window opens
    // again after the quiet before the first ended it (a wake for the
    // first, then two with none: the second of two short idle times opens
    // the window to twice the gap; a gap held up past 20 ms ends it again:
    // three more); one that sleeps at once is woken by every frame, and
    // so is one polling 50 us: the quiet ended its window, and 2 ms gaps
    // are too late to open it again.
    let mut wakes = Vec::new();
    for idle_us in ["10000", "0", "50"] {
        let (spate_ns, kernel) = spate_and_kernel("pidle");
        let app = echo_on(&spate_ns, "net_af_packet0,iface=vA", "adaptive", "0", &["--poll-idle-us", idle_us]);
        std::thread::sleep(Duration::from_millis(300));
        kernel.run(|| spate_testkit::echo_after_gaps(30, 20, Duration::from_millis(2)));
        let (c, out) = app.stop();
        assert_eq!(counter(&c, "Udp.InDatagrams"), 30, "{out}");
        let window = (counter(&c, "Poll.WindowGrown"), counter(&c, "Poll.WindowShrunk"));
        wakes.push((counter(&c, "Poll.WakesRx"), window, out));
    }
    let [(long, (grown, shrunk_long), out_long), (none, (grown_none, _), out_none), (short, (_, shrunk), out_short)] =
        &wakes[..]
    else {
        unreachable!()
    };
    println!(
        "Poll.WakesRx for 30 datagrams 2 ms apart: {long} polling 10 ms idle, {none} sleeping at once, {short} polling 50 us"
    );
    assert!(*long <= 10, "a 10 ms idle poll spans the 2 ms gaps: {long} wakes\n{out_long}");
    assert!(*shrunk_long >= 1, "the quiet (300 ms) ended the window\n{out_long}");
    assert!(*grown >= 1, "the window grew back after the quiet\n{out_long}");
    assert!(*none >= 25, "no idle poll: a wake per frame: {none}\n{out_none}");
    assert_eq!(*grown_none, 0, "nothing to grow\n{out_none}");
    assert!(*short >= 25, "2 ms gaps keep a 50 us window closed: a wake per frame: {short}\n{out_short}");
    assert!(*shrunk >= 1, "the quiet before the first datagram ended the window\n{out_short}");
}

/// An adaptive stack in this process on `device` in `ns`: its lcore
/// sleeps when idle.
fn adaptive_stack(ns: &Netns, device: &str) -> spate::Stack {
    let port = spate::PortSpec::new(device).addr("198.18.0.2/24").unwrap();
    stack_on_lcore_1(ns, vec![port], PollMode::Adaptive)
}

/// A stack in this process on lcore 1 in `ns` with `ports`, polling as
/// `poll` says.
fn stack_on_lcore_1(ns: &Netns, ports: Vec<spate::PortSpec>, poll: PollMode) -> spate::Stack {
    let cfg = spate::StackConfig {
        lcores: "1".into(),
        ports,
        stop_on_signal: false,
        mempool_size: 4095,
        poll,
        ..spate::StackConfig::default()
    };
    ns.run(move || spate::Stack::new(cfg).expect("the stack"))
}

/// Ten sends from this thread to a kernel socket in `kernel`, each after
/// the stack's lcore fell asleep: each arrives, and the bell woke the
/// lcore for most (one landing while it is awake needs none); then five
/// datagrams from the kernel, each reaching a socket while the lcore
/// sleeps (woken by their frames where the port has RX interrupts).
fn sends_wake_the_lcore(stack: &spate::Stack, kernel: &Netns, what: &str, rx_intr: bool) {
    let running = stack.spawn_polling().unwrap();
    let member = kernel.run(|| {
        let k = UdpSocket::bind("198.18.0.1:6000").unwrap();
        k.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        k
    });
    let s = spate::UdpSocket::bind(stack, "0.0.0.0:0").unwrap();
    // The first send resolves the neighbour; the rest find it known.
    s.send_to(b"first", "198.18.0.1:6000").unwrap();
    let member = kernel.run(move || {
        let mut buf = [0u8; 16];
        member.recv_from(&mut buf).expect("the first datagram");
        member
    });
    let before = stack.counters();
    let mut late = Vec::new();
    for i in 0..10u8 {
        // Idle long enough that the lcore sleeps (after its window, 50 us
        // at most).
        std::thread::sleep(Duration::from_millis(25));
        let t = std::time::Instant::now();
        s.send_to(&[i; 8], "198.18.0.1:6000").unwrap();
        let got = kernel.run({
            let member = member.try_clone().unwrap();
            move || {
                let mut buf = [0u8; 16];
                member.recv_from(&mut buf).map(|(n, _)| buf[..n].to_vec())
            }
        });
        assert_eq!(got.ok(), Some(vec![i; 8]), "{what}: datagram {i} sent from a sleeping lcore's thread");
        late.push(t.elapsed());
    }
    // A batch (`send_batch_to`) rings the bell once, after its last
    // datagram: all eight arrive.
    std::thread::sleep(Duration::from_millis(25));
    let rung = stack.counters()[spate::Counter::PollWakesHandoff];
    let dst: std::net::SocketAddr = "198.18.0.1:6000".parse().unwrap();
    let batch: Vec<_> = (0..8u8)
        .map(|i| {
            let mut b = s.alloc_send_buf(4).unwrap();
            b.copy_from_slice(&[100 + i; 4]);
            (b, dst)
        })
        .collect();
    assert_eq!(s.send_batch_to(batch).unwrap(), 8);
    let got = kernel.run({
        let member = member.try_clone().unwrap();
        move || {
            let mut buf = [0u8; 16];
            (0..8).map(|_| member.recv_from(&mut buf).map(|(n, _)| buf[..n].to_vec()).ok()).collect::<Vec<_>>()
        }
    });
    let want: Vec<_> = (0..8u8).map(|i| Some(vec![100 + i; 4])).collect();
    assert_eq!(got, want, "{what}: a batch sent to a sleeping lcore arrives whole");
    let rung = stack.counters()[spate::Counter::PollWakesHandoff] - rung;
    assert!(rung >= 1, "{what}: the batch rang the bell");
    let c = stack.counters();
    let handoffs = c[spate::Counter::PollWakesHandoff] - before[spate::Counter::PollWakesHandoff];
    late.sort();
    println!("{what}: 10 sends to a sleeping lcore, {handoffs} woken by the bell; median {:?} to the kernel", late[5]);
    assert!(handoffs >= 5, "{what}: the bell woke the lcore: {handoffs} of 10");
    // And the other way: the kernel's datagrams to a sleeping lcore.
    let r = spate::UdpSocket::bind(stack, "0.0.0.0:7000").unwrap();
    r.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let before = stack.counters();
    for i in 0..5u8 {
        std::thread::sleep(Duration::from_millis(25));
        kernel.run(move || UdpSocket::bind("198.18.0.1:0").unwrap().send_to(&[i; 4], "198.18.0.2:7000").unwrap());
        let mut buf = [0u8; 8];
        let (n, _) = r.recv_from(&mut buf).expect("the kernel's datagram reaches a sleeping lcore's socket");
        assert_eq!(&buf[..n], &[i; 4]);
    }
    let c = stack.counters();
    let rx = c[spate::Counter::PollWakesRx] - before[spate::Counter::PollWakesRx];
    if rx_intr {
        assert!(rx >= 3, "{what}: frames woke the lcore: {rx} of 5");
    }
    running.stop();
}

#[test]
fn a_send_from_a_thread_wakes_a_sleeping_lcore() {
    let _serial = device_lock();
    shared_eal(Memory::Hugepages);
    // No RX interrupts: the bell, and the packet socket for frames.
    let (spate_ns, kernel) = spate_and_kernel("pwake");
    let stack = adaptive_stack(&spate_ns, "net_af_packet0,iface=vA");
    sends_wake_the_lcore(&stack, &kernel, "net_af_packet", true);
    drop(stack);
    // RX interrupts: the bell beside the queue in the lcore's epoll set.
    let ns = Netns::new("pwaket");
    let stack = adaptive_stack(&ns, &format!("{},iface=sp1", spate_testkit::unique("net_tap")));
    kernel_peer(&ns, "sp1");
    sends_wake_the_lcore(&stack, &ns, "net_tap", true);
    // Run again: the lcore registers its queue's interrupt anew (the
    // first run took it out of its thread's epoll set at its end).
    sends_wake_the_lcore(&stack, &ns, "net_tap, run again", true);
}

/// A stack on lcore 1 in `ns` with `ports` (each a fresh net_tap) and
/// `poll` for the stack: `Poll.Sleeps` after 300 ms without traffic.
fn sleeps_when_idle(ns: &Netns, poll: PollMode, ports: &[Option<PollMode>]) -> u64 {
    let ports = ports
        .iter()
        .enumerate()
        .map(|(i, mode)| spate::PortSpec {
            poll: *mode,
            ..spate::PortSpec::new(&format!("{},iface=sp{}", spate_testkit::unique("net_tap"), i + 3))
                .addr(&format!("198.18.{i}.2/24"))
                .unwrap()
        })
        .collect();
    let stack = stack_on_lcore_1(ns, ports, poll);
    let running = stack.spawn_polling().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let sleeps = stack.counters()[spate::Counter::PollSleeps];
    running.stop();
    sleeps
}

#[test]
fn a_port_polled_busy_keeps_its_lcore_awake() {
    let _serial = device_lock();
    shared_eal(Memory::Hugepages);
    let ns = Netns::new("pmix");
    let (busy, adaptive) = (Some(PollMode::Busy), Some(PollMode::Adaptive));
    // The stack busy, its one port adaptive: the lcore sleeps.
    let n = sleeps_when_idle(&ns, PollMode::Busy, &[adaptive]);
    assert!(n >= 2, "an adaptive port's lcore sleeps: {n} sleeps");
    // The stack adaptive, one of the lcore's two ports busy: it polls on.
    let n = sleeps_when_idle(&ns, PollMode::Adaptive, &[None, busy]);
    assert_eq!(n, 0, "an lcore polling a busy port does not sleep");
    // Both adaptive: it sleeps.
    let n = sleeps_when_idle(&ns, PollMode::Adaptive, &[None, None]);
    assert!(n >= 2, "{n} sleeps");
}

#[test]
fn a_cpu_set_lcore_yields_to_threads_waiting_for_a_cpu() {
    let _serial = device_lock();
    // An lcore free to run on every CPU sleeps as soon as it is idle while
    // threads wait for a CPU; a pinned one polls out its idle time. A
    // thread spinning on each CPU keeps them all busy. The datagrams come
    // 2 ms apart, within a 10 ms idle poll: idle times longer than the
    // poll would end it (the lcore then sleeps at once, threads waiting or
    // not), as the quiet before the first datagram does; the sleeps of the
    // first two gaps open it again, and after that each idle time begins
    // with a poll, whose first look finds the threads waiting (or, pinned,
    // which polls until the datagram).
    let all = format!("1@(0-{})", spate::dpdk::lcore::online_cpus().expect("the online CPUs").max(2) - 1);
    for (lcores, yields) in [(all.as_str(), true), ("1", false)] {
        let (spate_ns, kernel) = spate_and_kernel("pyld");
        let app = echo_on(&spate_ns, "net_af_packet0,iface=vA", "adaptive", lcores, &["--poll-idle-us", "10000"]);
        // A thread spinning per online CPU: with an lcore awake, more
        // threads are runnable than there are CPUs.
        let spinners = spate_testkit::Spinners::unpinned(spate::dpdk::lcore::online_cpus().expect("the online CPUs"));
        kernel.run(|| spate_testkit::echo_after_gaps(10, 20, Duration::from_millis(2)));
        drop(spinners);
        let (c, out) = app.stop();
        assert_eq!(counter(&c, "Udp.InDatagrams"), 10, "{out}");
        let contended = counter(&c, "Poll.SleepsContended");
        println!("--lcores {lcores}: {contended} contended sleeps");
        if yields {
            assert!(out.contains("sleeps at once while threads wait for a CPU"), "said in the log: {out}");
            // After each reply once the window is open again (the quiet
            // before the first datagram ended it), the first idle look
            // finds the spinners waiting.
            assert!(contended >= 6, "{contended} contended sleeps of 10 replies\n{out}");
        } else {
            assert!(!out.contains("sleeps at once while threads wait"), "{out}");
            assert_eq!(contended, 0, "a pinned lcore keeps its CPU\n{out}");
        }
    }
}

#[test]
fn a_tap_queue_signals_with_a_signal_the_process_handles() {
    // What an idle lcore raises on itself for net_tap frames: the signal
    // the driver asked for its queue's descriptor (a real-time one, with
    // its handler), never a default SIGIO that would end the process.
    let _serial = device_lock();
    shared_eal(Memory::Hugepages);
    let ns = Netns::new("psig");
    let sig = ns.run(|| {
        use spate::dpdk::{Mempool, MempoolConfig, Port, PortConfig};
        let pool =
            std::sync::Arc::new(Mempool::new(&MempoolConfig::new(&spate_testkit::unique("psig"), 4095)).unwrap());
        let mut port = Port::create(&format!("{},iface=sg0", spate_testkit::unique("net_tap"))).unwrap();
        let cfg = PortConfig { rx_interrupts: true, ..PortConfig::default() };
        port.configure(&cfg, pool).unwrap();
        port.start().unwrap();
        let rx = port.rx_queue(0).unwrap();
        let fd = rx.intr_fd().expect("net_tap's queue descriptor");
        let sig = spate::dpdk::sched::IoSignal::of(fd).map(|s| s.number());
        drop(rx);
        port.stop().unwrap();
        sig
    });
    let sig = sig.expect("the tap queue's descriptor signals, with a handler");
    assert_ne!(sig, libc::SIGIO, "net_tap asks for a real-time signal");
    assert!(sig >= libc::SIGRTMIN(), "{sig}");
}

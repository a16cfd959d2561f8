//! Sockets an async runtime awaits, against the Linux kernel in a peer
//! namespace (a stack in the test process on `net_af_packet`), under
//! tokio without its reactor:
//!
//! - four tasks on one thread each await 200 datagrams from the kernel:
//!   every one arrives, in order, each task woken by the polling lcore;
//! - a task sending 20,000 datagrams while the lcores are not polling
//!   finds the queue to them full and waits (`Pending`, not an error)
//!   until the lcore starts and drains it; all 20,000 are counted sent;
//! - a waker that panics when the lcore wakes it does not stop the lcore;
//! - a `Poller` over 1,000 sockets reports the ready ones only, is woken
//!   by the lcore, and is level-triggered.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use spate::dpdk::Memory;
use spate::{Counter, Stack, UdpSocket};
use spate_testkit::{Netns, af_packet_stack, device_lock, shared_eal, spate_and_kernel};

/// A stack on spate's side of the standard link (198.18.0.2/24), not
/// polling yet.
fn stack(what: &str) -> (Netns, Netns, Stack) {
    shared_eal(Memory::Hugepages);
    let (spate_ns, kernel) = spate_and_kernel(what);
    let stack = af_packet_stack(&spate_ns, &["198.18.0.2/24"], 16383);
    (spate_ns, kernel, stack)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
}

#[test]
fn tasks_await_datagrams_the_lcore_wakes_them_for() {
    let _serial = device_lock();
    let (_spate_ns, kernel, stack) = stack("async");
    // Room for all 200 (about 95 fit the default buffer): a stalled task
    // must not turn into drops.
    let sockets: Vec<Arc<UdpSocket>> = (0..4)
        .map(|i| Arc::new(UdpSocket::builder(&stack).recv_buffer_size(8 << 20).bind(("0.0.0.0", 7200 + i)).unwrap()))
        .collect();
    let running = stack.spawn_polling().unwrap();
    const EACH: usize = 200;
    let sender = kernel.thread(|| {
        let k = std::net::UdpSocket::bind("198.18.0.1:7299").unwrap();
        // Let the tasks wait first, then trickle: most datagrams find
        // their task asleep.
        std::thread::sleep(Duration::from_millis(200));
        for i in 0..EACH {
            for port in 7200..7204u16 {
                k.send_to(format!("{port} {i}").as_bytes(), ("198.18.0.2", port)).unwrap();
            }
            if i % 10 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    let got = runtime().block_on(async {
        let tasks: Vec<_> = sockets
            .iter()
            .map(|s| {
                let s = s.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    let mut seen = Vec::new();
                    while seen.len() < EACH {
                        let (n, from) = tokio::time::timeout(Duration::from_secs(10), s.recv_from_async(&mut buf))
                            .await
                            .expect("a datagram within 10 s")
                            .unwrap();
                        assert_eq!(from, "198.18.0.1:7299".parse::<SocketAddr>().unwrap());
                        seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                    }
                    seen
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.push(t.await.unwrap());
        }
        all
    });
    sender.join().unwrap();
    running.stop();
    for (i, seen) in got.iter().enumerate() {
        let port = 7200 + i;
        let want: Vec<String> = (0..EACH).map(|n| format!("{port} {n}")).collect();
        assert_eq!(seen, &want, "socket {port}: every datagram, in order");
        let wakes = sockets[i].reader_wakeups();
        assert!(wakes > 0 && wakes <= EACH as u64, "socket {port}: woken {wakes} times for {EACH} datagrams");
    }
}

/// `send_to_async` polled by hand, counting the times it was pending.
struct Counted<'a> {
    sock: &'a UdpSocket,
    buf: &'a [u8],
    to: SocketAddr,
    pending: &'a AtomicUsize,
}

impl std::future::Future for Counted<'_> {
    type Output = std::io::Result<usize>;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let p = self.sock.poll_send_to(cx, self.buf, self.to);
        if p.is_pending() {
            self.pending.fetch_add(1, Ordering::Relaxed);
        }
        p
    }
}

#[test]
fn a_full_queue_to_the_lcore_is_pending_until_the_lcore_drains_it() {
    let _serial = device_lock();
    let (_spate_ns, kernel, stack) = stack("asyncsend");
    let sock = UdpSocket::bind(&stack, "0.0.0.0:7300").unwrap();
    let to: SocketAddr = "198.18.0.1:7301".parse().unwrap();
    let sink = kernel.thread(|| {
        let k = std::net::UdpSocket::bind("198.18.0.1:7301").unwrap();
        k.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 64];
        let mut n = 0u64;
        while k.recv(&mut buf).is_ok() {
            n += 1;
        }
        n
    });
    // The lcores start only after the queue to them has filled.
    let (tx, started) = std::sync::mpsc::channel();
    let starter = {
        let stack = stack.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            tx.send(stack.spawn_polling().unwrap()).unwrap();
        })
    };
    const N: usize = 20_000;
    let pending = AtomicUsize::new(0);
    runtime().block_on(async {
        for i in 0..N {
            let payload = (i as u32).to_be_bytes();
            let sent = Counted { sock: &sock, buf: &payload, to, pending: &pending }.await;
            assert_eq!(sent.unwrap(), 4, "datagram {i}");
        }
    });
    starter.join().unwrap();
    let running = started.recv().unwrap();
    let received = sink.join().unwrap();
    running.stop();
    let c = stack.counters();
    assert!(pending.load(Ordering::Relaxed) > 0, "the queue filled and the task waited");
    assert_eq!(c[Counter::UdpOutDatagrams], N as u64, "{}", c.render_nonzero());
    assert_eq!(c[Counter::UdpSndbufErrors], 0, "a full queue is Pending, not an error");
    assert!(received > 0, "the kernel got them");
}

/// A waker whose `wake` panics.
struct Panics;
impl Wake for Panics {
    fn wake(self: Arc<Self>) {
        panic!("a task's waker panicked");
    }
}

#[test]
fn a_panicking_waker_does_not_stop_the_lcore() {
    let _serial = device_lock();
    let (_spate_ns, kernel, stack) = stack("asyncpanic");
    let sock = UdpSocket::bind(&stack, "0.0.0.0:7400").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let running = stack.spawn_polling().unwrap();
    let waker = Waker::from(Arc::new(Panics));
    let mut buf = [0u8; 16];
    assert!(sock.poll_recv_from(&mut Context::from_waker(&waker), &mut buf).is_pending());
    kernel.run(|| {
        let k = std::net::UdpSocket::bind("198.18.0.1:7401").unwrap();
        k.send_to(b"first", "198.18.0.2:7400").unwrap();
        std::thread::sleep(Duration::from_millis(100));
        k.send_to(b"second", "198.18.0.2:7400").unwrap();
    });
    for want in [&b"first"[..], b"second"] {
        let (n, _) = sock.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], want, "the lcore kept delivering after the waker panicked");
    }
    assert!(sock.reader_wakeups() >= 1, "the lcore woke the task");
    running.stop();
}

/// One thread waits on 1,000 sockets: only the ones the kernel sends to
/// are reported, a blocked wait is woken by the polling lcore, a socket
/// stays reported while datagrams are left (level-triggered), and one
/// registered for writing is ready at once.
#[test]
fn a_poller_reports_the_sockets_that_are_ready() {
    use spate::{Event, Interest, Poller};
    let _serial = device_lock();
    let (_spate_ns, kernel, stack) = stack("poller");
    let sockets: Vec<UdpSocket> =
        (0..1000u16).map(|i| UdpSocket::bind(&stack, ("0.0.0.0", 8000 + i)).unwrap()).collect();
    let poller = Poller::new();
    for s in &sockets {
        poller.register(s, s.local_addr().unwrap().port() as u64, Interest::READABLE).unwrap();
    }
    assert_eq!(poller.len(), 1000);
    let e = poller.register(&sockets[0], 1, Interest::READABLE).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "a socket once");
    let running = stack.spawn_polling().unwrap();
    let mut events: Vec<Event> = Vec::with_capacity(64);
    let t = std::time::Instant::now();
    assert_eq!(poller.wait(&mut events, Some(Duration::from_millis(100))).unwrap(), 0);
    assert!(t.elapsed() >= Duration::from_millis(90), "the timeout, not at once");

    // A thread blocked in wait, woken by the lcore.
    let waiter = {
        let poller = poller.clone();
        std::thread::spawn(move || {
            let mut ev = Vec::with_capacity(64);
            let t = std::time::Instant::now();
            poller.wait(&mut ev, Some(Duration::from_secs(10))).unwrap();
            (ev, t.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    kernel.run(|| {
        let k = std::net::UdpSocket::bind("198.18.0.1:7999").unwrap();
        for port in [8005u16, 8500, 8999] {
            k.send_to(b"ready", ("198.18.0.2", port)).unwrap();
        }
    });
    let (first, waited) = waiter.join().unwrap();
    assert!(!first.is_empty() && waited < Duration::from_secs(5), "woken, not timed out: {first:?} after {waited:?}");
    let ready = |poller: &Poller, events: &mut Vec<Event>, want: usize| {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            poller.wait(events, Some(Duration::from_millis(200))).unwrap();
            let mut tokens: Vec<u64> = events.iter().map(|e| e.token).collect();
            tokens.sort();
            if tokens.len() >= want || std::time::Instant::now() > deadline {
                assert!(events.iter().all(|e| e.readable && !e.writable));
                return tokens;
            }
        }
    };
    assert_eq!(ready(&poller, &mut events, 3), [8005, 8500, 8999], "exactly the three");
    assert_eq!(ready(&poller, &mut events, 3), [8005, 8500, 8999], "still ready: level-triggered");
    let mut buf = [0u8; 16];
    sockets[500].recv(&mut buf).unwrap();
    assert_eq!(ready(&poller, &mut events, 2), [8005, 8999], "read: not reported");
    sockets[5].recv(&mut buf).unwrap();
    sockets[999].recv(&mut buf).unwrap();
    assert_eq!(poller.wait(&mut events, Some(Duration::from_millis(100))).unwrap(), 0, "all read");

    // Writing: the lcore's queue has room.
    let w = UdpSocket::bind(&stack, "0.0.0.0:0").unwrap();
    poller.register(&w, 1, Interest::WRITABLE).unwrap();
    assert_eq!(poller.wait(&mut events, Some(Duration::from_secs(1))).unwrap(), 1);
    assert_eq!(events[0], Event { token: 1, readable: false, writable: true });
    poller.deregister(1).unwrap();
    assert_eq!(poller.deregister(1).unwrap_err().kind(), std::io::ErrorKind::NotFound);
    running.stop();
}

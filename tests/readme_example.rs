//! The README's example program: the same code as apps/examples/readme.rs,
//! and blocked in `recv_batch` it ends within a second of the first
//! SIGINT (the stopped stack ends the receive with ENETDOWN). It echoes
//! the kernel's datagrams first, over net_tap in a namespace.

use std::net::UdpSocket;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use spate_testkit::{Netns, device_lock, kernel_peer};

/// The example's binary, which `cargo test` builds beside the tests.
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).expect("target/debug");
    let bin = dir.join("examples/readme");
    assert!(bin.exists(), "{} (built by cargo test)", bin.display());
    bin
}

#[test]
fn the_example_is_the_readme_s() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let start = readme.find("```rust,no_run\n").expect("the README's example") + "```rust,no_run\n".len();
    let code = &readme[start..start + readme[start..].find("```").unwrap()];
    let example = std::fs::read_to_string(root.join("apps/examples/readme.rs")).unwrap();
    assert!(example.ends_with(code), "apps/examples/readme.rs differs from the README's example");
}

#[test]
fn the_example_ends_on_its_first_sigint() {
    let _serial = device_lock();
    let ns = Netns::new("readme");
    let mut p = ns.spawn("readme", example().to_str().unwrap(), &[], Duration::from_secs(120)).unwrap();
    // The TAP device appears once the stack is up.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ns.exec(&["ip", "link", "show", "spate0"]).status.success() {
        assert!(Instant::now() < deadline, "no spate0: {}", p.output());
        std::thread::sleep(Duration::from_millis(100));
    }
    kernel_peer(&ns, "spate0");
    let echoed = ns.run(|| {
        let s = UdpSocket::bind("198.18.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut buf = [0u8; 64];
        (0..20).any(|_| {
            s.send_to(b"are you there", "198.18.0.2:7").unwrap();
            s.recv_from(&mut buf).is_ok_and(|(n, _)| &buf[..n] == b"are you there")
        })
    });
    assert!(echoed, "the example echoes: {}", p.output());
    // Now idle, blocked in recv_batch.
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let status = p.stop_with(libc::SIGINT, Duration::from_secs(1));
    assert!(status.is_some_and(|s| s.success()), "exit {status:?} after {:?}: {}", t.elapsed(), p.output());
}

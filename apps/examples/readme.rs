//! The README's example, as it stands there (tests/readme_example.rs
//! checks that the two match, and that the program ends on its first
//! SIGINT while blocked in a receive).

use spate::{DatagramBatch, PortSpec, Stack, StackConfig, UdpSocket};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = StackConfig {
        lcores: "1".into(), // spate polls on lcore 1; this thread stays free
        ports: vec![PortSpec::new("net_tap0,iface=spate0").addr("198.18.0.2/24")?],
        ..StackConfig::default()
    };
    let stack = Stack::new(cfg)?;
    let sock = UdpSocket::bind(&stack, "0.0.0.0:7")?;
    spate::dpdk::signal::install_stop_handlers()?; // Ctrl-C stops the stack
    let _polling = stack.spawn_polling()?;
    let mut batch = DatagramBatch::with_capacity(32);
    loop {
        match sock.recv_batch(&mut batch, 32) {
            Ok(_) => {} // it waited for the first datagram
            // The stack stopped: every call, blocked or not, says so.
            Err(e) if e.kind() == std::io::ErrorKind::NetworkDown => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        // Each reply reuses its request's mbuf and goes back to its
        // sender; all of them in one call.
        sock.send_replies(batch.drain().map(|d| d.into_send_buf()))?;
    }
}

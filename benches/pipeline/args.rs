//! The benchmark's flags.

/// The flags of one run.
pub(crate) struct Args {
    pub(crate) datagrams: u64,
    pub(crate) flows: usize,
    pub(crate) sockets: usize,
    pub(crate) inject_only: bool,
    /// A VXLAN tunnel registered on the stack (traffic does not use it).
    pub(crate) tunnel: bool,
    /// The sockets take coalesced datagrams (UDP GRO).
    pub(crate) gro: bool,
    /// Transmit instead: datagrams of this payload, sent by the callback.
    pub(crate) send: Option<usize>,
    /// With `send`: 64 at a time with UDP GSO, one call per 64.
    pub(crate) gso: bool,
    /// Receive one datagram per call (as `recvmsg` does) instead of batches.
    pub(crate) one_by_one: bool,
    /// Echo datagrams of this payload (fragmented above 1,472 bytes).
    pub(crate) echo: Option<usize>,
    /// Polling lcores (receive mode): with 2, software RSS hands half the
    /// flows to the second lcore.
    pub(crate) lcores: usize,
    /// Frames the source writes per loop iteration (1 to 32): 1 is a
    /// stream so thin that every datagram is a burst of its own.
    pub(crate) burst: u64,
    /// Lcores that found nothing to do yield the CPU: under valgrind,
    /// which runs one thread at a time, the other lcore then runs at once
    /// instead of after a spinning time slice.
    pub(crate) yield_idle: bool,
    /// The reader takes its datagrams through the receive queue
    /// (`UdpSocket::recv_batch`, as a thread reads) instead of where the
    /// lcore staged them (`LcoreCtx::recv_staged`).
    pub(crate) queued: bool,
    /// A capture is attached through the control endpoint (as
    /// `spate-dump` attaches one, snap length 128, room for every frame),
    /// read by a thread that discards it.
    pub(crate) capture: bool,
    /// `--poll adaptive`: the stack polls adaptively (the load keeps it
    /// awake: what that costs a busy lcore).
    pub(crate) adaptive: bool,
    /// The source's frames carry an RSS hash in their mbufs, as a NIC
    /// with RSS gives one (a per-flow constant here; net_ring gives none).
    pub(crate) rss_hash: bool,
}

pub(crate) fn parse() -> (Args, bool, Option<String>) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let a = Args {
        datagrams: flag("--datagrams").and_then(|v| v.parse().ok()).unwrap_or(200_000),
        flows: flag("--flows").and_then(|v| v.parse().ok()).unwrap_or(16),
        sockets: flag("--sockets").and_then(|v| v.parse().ok()).unwrap_or(1),
        inject_only: args.iter().any(|a| a == "--inject-only"),
        tunnel: args.iter().any(|a| a == "--tunnel"),
        gro: args.iter().any(|a| a == "--gro"),
        send: flag("--send").and_then(|v| v.parse().ok()),
        gso: args.iter().any(|a| a == "--gso"),
        one_by_one: args.iter().any(|a| a == "--one-by-one"),
        echo: flag("--echo").and_then(|v| v.parse().ok()),
        lcores: flag("--lcores").and_then(|v| v.parse().ok()).unwrap_or(1),
        burst: flag("--burst").and_then(|v| v.parse().ok()).unwrap_or(32u64).clamp(1, 32),
        yield_idle: args.iter().any(|a| a == "--yield-idle"),
        queued: args.iter().any(|a| a == "--queued"),
        capture: args.iter().any(|a| a == "--capture"),
        adaptive: flag("--poll").as_deref() == Some("adaptive"),
        rss_hash: args.iter().any(|a| a == "--rss-hash"),
    };
    (a, args.iter().any(|a| a == "--callgrind"), flag("--json"))
}

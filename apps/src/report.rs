//! Periodic statistics lines and the final summary.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use spate::dpdk::PortStats;
use spate::{Counter, Counters, Stack};

/// Rates between two samples.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When it was taken.
    pub at: Instant,
    /// The stack's counters.
    pub counters: Counters,
    /// Each port's name and counters.
    pub ports: Vec<(String, PortStats)>,
    /// Mbufs out of the pool.
    pub mbufs_in_use: u32,
    /// Busy TSC cycles of all polling lcores (iterations that found work).
    pub busy_cycles: u64,
}

impl Sample {
    /// Takes a sample of `stack`.
    pub fn take(stack: &Stack) -> Sample {
        Sample {
            at: Instant::now(),
            counters: stack.counters(),
            ports: stack.port_stats(),
            mbufs_in_use: stack.mempool().in_use(),
            busy_cycles: (0..stack.lcores().len()).map(|i| stack.lcore_load(i).0).sum(),
        }
    }
}

/// One line: per-port packet rates, datagrams delivered per second, drops
/// by counter.
pub fn line(prev: &Sample, now: &Sample) -> String {
    let secs = now.at.duration_since(prev.at).as_secs_f64().max(1e-9);
    let rate = |a: u64, b: u64| (b.wrapping_sub(a)) as f64 / secs;
    let mut out = String::new();
    for ((name, a), (_, b)) in prev.ports.iter().zip(&now.ports) {
        let _ = write!(
            out,
            "{name}: rx {:.0} pps tx {:.0} pps | ",
            rate(a.ipackets, b.ipackets),
            rate(a.opackets, b.opackets)
        );
    }
    let d = now.counters.delta(&prev.counters);
    let delivered = d[Counter::RxDelivered] as f64 / secs;
    let _ = write!(
        out,
        "delivered {delivered:.0}/s | sent {:.0}/s",
        (d[Counter::UdpOutDatagrams] + d[Counter::Udp6OutDatagrams]) as f64 / secs
    );
    let drops = drops(&d);
    if drops.is_empty() {
        out.push_str(" | drops 0");
    } else {
        let _ = write!(out, " | drops {drops}");
    }
    let _ = write!(out, " | mbufs {}", now.mbufs_in_use);
    out
}

/// The non-zero drop counters as `Group.Name=n` words.
pub fn drops(c: &Counters) -> String {
    drop_counts(c).iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
}

/// The non-zero drop counters, named `Group.Name` ([`Counter::is_drop`]).
pub fn drop_counts(c: &Counters) -> Vec<(String, u64)> {
    c.iter().filter(|(k, v)| k.is_drop() && *v > 0).map(|(k, v)| (format!("{}.{}", k.group(), k.name()), v)).collect()
}

/// The final summary: port counters and every non-zero stack counter.
pub fn summary(stack: &Stack) -> String {
    let mut out = String::from("spate: final counters\n");
    for (name, s) in stack.port_stats() {
        let _ = writeln!(
            out,
            "Port {name}: ipackets={} opackets={} ibytes={} obytes={} imissed={} ierrors={} oerrors={} rx_nombuf={}",
            s.ipackets, s.opackets, s.ibytes, s.obytes, s.imissed, s.ierrors, s.oerrors, s.rx_nombuf
        );
    }
    out.push_str(&stack.counters().render_nonzero());
    let _ = write!(out, "\nMempool: InUse={} Size={}", stack.mempool().in_use(), stack.mempool().size());
    let _ =
        write!(out, "\nReassembly: HeldBytes={} PeakBytes={}", stack.reassembly_bytes(), stack.reassembly_peak_bytes());
    // Packets still waiting for an address when the lcores stopped: neither
    // sent nor dropped yet.
    let _ = write!(out, "\nNeighbours: Entries={} Waiting={}", stack.neighbors(), stack.neighbor_waiting());
    let (busy, loops) = (0..stack.lcores().len())
        .map(|i| stack.lcore_load(i))
        .fold((0, 0), |(b, l), (busy, loops)| (b + busy, l + loops));
    let _ = write!(out, "\nLcores: BusyCycles={busy} Loops={loops} TscHz={}", spate::dpdk::lcore::tsc_hz());
    if stack.lcores().len() > 1 {
        // Where the traffic went: what each lcore received and handed on.
        for i in 0..stack.lcores().len() {
            let c = stack.lcore_counters(i);
            let _ = write!(
                out,
                "\nLcore{i}: RxFrames={} UdpInDatagrams={} SteerFrames={} SteerFragments={} SteerDatagrams={} FlowMoved={}",
                c[Counter::RxFrames],
                c[Counter::UdpInDatagrams] + c[Counter::Udp6InDatagrams],
                c[Counter::SteerFrames],
                c[Counter::SteerFragments],
                c[Counter::SteerDatagrams],
                c[Counter::SteerFlowMoved]
            );
        }
    }
    out
}

/// The thread `print_every` started; `finish` ends it.
#[derive(Debug)]
pub struct Reporter {
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reporter {
    /// Ends the reports (the lcores have returned) and waits for the
    /// thread. A stop that came before the lcores were first seen polling
    /// ends it too: it does not wait for a start that already happened.
    pub fn finish(mut self) {
        self.end();
    }

    fn end(&mut self) {
        self.done.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Reporter {
    /// A run that returned early (an error) ends the reports too.
    fn drop(&mut self) {
        self.end();
    }
}

/// Prints `format(previous sample, this sample)` every `interval` while the
/// stack polls, until it stops or `Reporter::finish`.
pub fn print_every<F>(stack: Stack, interval: Duration, mut format: F) -> Reporter
where
    F: FnMut(&Sample, &Sample) -> String + Send + 'static,
{
    let done = Arc::new(AtomicBool::new(false));
    let over = done.clone();
    let thread = std::thread::spawn(move || {
        let _ = spate::dpdk::lcore::unpin_current_thread();
        let over = || over.load(Ordering::Acquire);
        // Wait until the lcores run (or ran and returned), then report
        // while they do.
        let start = Instant::now();
        while !stack.is_running() && !over() && start.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut prev = Sample::take(&stack);
        let step = Duration::from_millis(50);
        'outer: loop {
            let until = Instant::now() + interval;
            while Instant::now() < until {
                if !stack.is_running() || over() {
                    break 'outer;
                }
                std::thread::sleep(step.min(interval));
            }
            let now = Sample::take(&stack);
            println!("{}", format(&prev, &now));
            prev = now;
        }
    });
    Reporter { done, thread: Some(thread) }
}

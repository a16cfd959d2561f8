//! Prometheus metrics (`metrics = "ADDR:PORT"`, feature `metrics`):
//! `GET /metrics` on a kernel TCP socket, served by a thread of the
//! stack's own off the datapath, in Prometheus's text format (0.0.4, which
//! `promtool check metrics` reads; the OpenMetrics form names a counter's
//! family without its `_total` and promtool 2.42 refuses it). Each scrape
//! renders a control [`Snapshot`](super::control::Snapshot): every counter
//! (`spate_udp_in_datagrams_total`, its help the counter's own text), each
//! socket's queued datagrams and bytes, receive buffer, drops and reader
//! wake-ups, each lcore's busy cycles, loops and datagrams, the ports'
//! statistics, the pool and the receive queues' memory; every series
//! labelled with the stack (its name, or `PID-ID`).

use crate::control_plane::Stack;
use crate::error::Result;

/// Opens the metrics endpoint when one is configured.
pub(super) fn open(stack: &Stack) -> Result<()> {
    let Some(addr) = stack.shared.cfg.metrics else { return Ok(()) };
    #[cfg(feature = "metrics")]
    {
        server::open(stack, addr)
    }
    #[cfg(not(feature = "metrics"))]
    {
        Err(crate::error::Error::Config(format!(
            "metrics = \"{addr}\": this build of spate has no metrics (its `metrics` feature is off)"
        )))
    }
}

#[cfg(feature = "metrics")]
mod server {
    use std::io::{self, Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder};

    use crate::control_plane::service::{Listener, ServiceThread};
    use crate::control_plane::{Stack, WeakStack};
    use crate::error::{Error, Result};
    use crate::setup::control::snapshot;
    use crate::stats::Counter;

    /// A request's head at most.
    const MAX_HEAD: usize = 8 << 10;
    /// How long a request's head may take to arrive, and a reply to leave.
    const HEAD_TIME: Duration = Duration::from_secs(5);

    pub(super) fn open(stack: &Stack, addr: SocketAddr) -> Result<()> {
        let listener = TcpListener::bind(addr).map_err(|e| Error::Config(format!("metrics = \"{addr}\": {e}")))?;
        let bound = listener.local_addr().map_err(|e| Error::Config(format!("metrics: {e}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (weak, flag) = (stack.downgrade(), stop.clone());
        let thread = crate::setup::service_thread("spate-metrics", move || serve(listener, weak, flag))
            .map_err(|e| Error::Config(format!("metrics: no thread: {e}")))?;
        let service = ServiceThread { listener: Listener::Tcp(bound), stop, thread: Mutex::new(Some(thread)) };
        if stack.control.metrics.set(service).is_err() {
            return Err(Error::State("the metrics endpoint was opened twice".into()));
        }
        log::info!("spate: metrics at http://{bound}/metrics");
        Ok(())
    }

    /// One connection at a time: scrapes are seconds apart. Woken and
    /// timed out as the control endpoint's.
    fn serve(listener: TcpListener, shared: WeakStack, stop: Arc<AtomicBool>) {
        let _ = spate_dpdk::lcore::unpin_current_thread();
        if socket2::SockRef::from(&listener).set_read_timeout(Some(crate::setup::control::ACCEPT_TICK)).is_err() {
            return;
        }
        while !stop.load(Ordering::Acquire) {
            let conn = match listener.accept() {
                Ok((c, _)) if !stop.load(Ordering::Acquire) => c,
                Ok(_) => break,
                Err(_) => continue,
            };
            if shared.is_gone() {
                break;
            }
            let _ = answer(conn, &shared);
        }
    }

    /// Answers one request: its head must come within [`HEAD_TIME`]
    /// (whatever the client's pace), and the stack is held only while the
    /// snapshot is rendered.
    fn answer(mut conn: TcpStream, shared: &WeakStack) -> io::Result<()> {
        conn.set_write_timeout(Some(HEAD_TIME))?;
        let deadline = std::time::Instant::now() + HEAD_TIME;
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            conn.set_read_timeout(Some(left))?;
            let n = conn.read(&mut buf)?;
            if n == 0 || head.len() + n > MAX_HEAD {
                return Ok(());
            }
            head.extend_from_slice(&buf[..n]);
        }
        let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
        let mut words = line.split(|b| *b == b' ');
        let (method, path) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
        let (status, kind, body) = match (method, path) {
            (b"GET", b"/metrics") => match shared.upgrade().map(|stack| render(&stack)) {
                Some(Ok(text)) => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", text),
                Some(Err(e)) => ("500 Internal Server Error", "text/plain", format!("{e}\n")),
                None => ("503 Service Unavailable", "text/plain", "the stack is gone\n".into()),
            },
            (b"GET", _) => ("404 Not Found", "text/plain", "spate serves /metrics\n".into()),
            _ => ("405 Method Not Allowed", "text/plain", "GET /metrics\n".into()),
        };
        let reply = format!(
            "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(reply.as_bytes())
    }

    /// `UdpInDatagrams` in its parts: `udp_in_datagrams`. promtool reads
    /// a word `us` as microseconds and refuses it: `NotForUs` is
    /// `not_for_this_host`.
    fn snake(parts: &[&str]) -> String {
        let mut out = String::new();
        for p in parts {
            for (i, c) in p.chars().enumerate() {
                if c.is_ascii_uppercase() {
                    // A word starts: after the first, an underscore.
                    if !out.is_empty() && (i > 0 || !out.ends_with('_')) {
                        out.push('_');
                    }
                    out.push(c.to_ascii_lowercase());
                } else {
                    out.push(c);
                }
            }
        }
        match out.strip_suffix("_for_us") {
            Some(head) => format!("{head}_for_this_host"),
            None => out,
        }
    }

    fn render(stack: &Stack) -> prometheus::Result<String> {
        let s = snapshot(stack);
        let label = match &s.info.name {
            Some(n) => n.clone(),
            None => format!("{}-{}", s.info.pid, s.info.id),
        };
        let labels = [("stack".to_string(), label.clone())].into_iter().collect();
        let reg = Registry::new_custom(Some("spate".into()), Some(labels))?;
        for c in Counter::ALL {
            let m = IntCounter::with_opts(Opts::new(format!("{}_total", snake(&[c.group(), c.name()])), c.doc()))?;
            m.inc_by(s.counters.get(&crate::setup::control::nstat_name(*c)).copied().unwrap_or(0));
            reg.register(Box::new(m))?;
        }
        let counter_vec = |name: &str, help: &str, labels: &[&str]| -> prometheus::Result<IntCounterVec> {
            let v = IntCounterVec::new(Opts::new(name, help), labels)?;
            reg.register(Box::new(v.clone()))?;
            Ok(v)
        };
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| -> prometheus::Result<IntGaugeVec> {
            let v = IntGaugeVec::new(Opts::new(name, help), labels)?;
            reg.register(Box::new(v.clone()))?;
            Ok(v)
        };
        let gauge = |name: &str, help: &str, value: i64| -> prometheus::Result<()> {
            let g = IntGauge::with_opts(Opts::new(name, help))?;
            g.set(value);
            reg.register(Box::new(g))
        };

        let sl = ["socket", "local", "peer"];
        let queued = gauge_vec("socket_queued_datagrams", "Datagrams queued to be read.", &sl)?;
        let queued_bytes = gauge_vec("socket_queued_bytes", "Bytes the queued datagrams are charged.", &sl)?;
        let rcvbuf = gauge_vec("socket_rcvbuf_bytes", "The socket's receive buffer.", &sl)?;
        let drops = counter_vec("socket_drops_total", "Datagrams dropped on a full receive buffer.", &sl)?;
        let wakeups = counter_vec("socket_reader_wakeups_total", "Times a blocked reader was woken.", &sl)?;
        for k in &s.sockets {
            let id = k.id.to_string();
            let v = [id.as_str(), k.local.as_str(), k.peer.as_deref().unwrap_or("")];
            queued.with_label_values(&v).set(k.queued as i64);
            queued_bytes.with_label_values(&v).set(k.queued_bytes as i64);
            rcvbuf.with_label_values(&v).set(k.rcvbuf as i64);
            drops.with_label_values(&v).inc_by(k.drops);
            wakeups.with_label_values(&v).inc_by(k.reader_wakeups);
        }

        let busy = counter_vec("lcore_busy_cycles_total", "TSC cycles of loop iterations that did work.", &["lcore"])?;
        let loops = counter_vec("lcore_loops_total", "Polling loop iterations.", &["lcore"])?;
        let dgrams = counter_vec("lcore_datagrams_total", "UDP datagrams the lcore delivered.", &["lcore"])?;
        for l in &s.lcores {
            let id = l.lcore.to_string();
            busy.with_label_values(&[id.as_str()]).inc_by(l.busy_cycles);
            loops.with_label_values(&[id.as_str()]).inc_by(l.loops);
            dgrams.with_label_values(&[id.as_str()]).inc_by(l.datagrams);
        }
        gauge("tsc_hz", "TSC cycles per second (busy cycles over this are CPU seconds).", s.info.tsc_hz as i64)?;

        let port_stats = [
            ("ipackets", "port_rx_packets_total", "Packets the port received."),
            ("opackets", "port_tx_packets_total", "Packets the port sent."),
            ("ibytes", "port_rx_bytes_total", "Bytes the port received."),
            ("obytes", "port_tx_bytes_total", "Bytes the port sent."),
            ("imissed", "port_rx_missed_total", "Packets the port dropped for want of room in its RX ring."),
            ("ierrors", "port_rx_errors_total", "Packets the port received in error."),
            ("oerrors", "port_tx_errors_total", "Packets the port failed to send."),
            ("rx_nombuf", "port_rx_nombuf_total", "RX mbuf allocation failures."),
        ];
        for (key, name, help) in port_stats {
            let v = counter_vec(name, help, &["port"])?;
            for p in &s.ports {
                v.with_label_values(&[p.name.as_str()]).inc_by(p.stats.get(key).copied().unwrap_or(0));
            }
        }

        let m = &s.memory;
        gauge("mempool_mbufs_in_use", "Mbufs out of the packet pool.", m.mbufs_in_use as i64)?;
        gauge("mempool_mbufs", "Mbufs in the packet pool.", m.mbufs as i64)?;
        gauge("receive_queue_bytes", "Bytes all receive queues hold.", m.receive_bytes as i64)?;
        gauge("receive_queue_limit_bytes", "What all receive queues may hold.", m.receive_limit as i64)?;
        gauge("reassembly_bytes", "Bytes held for IP reassembly.", m.reassembly_bytes as i64)?;

        let mut out = Vec::new();
        TextEncoder::new().encode(&reg.gather(), &mut out)?;
        let mut text = String::from_utf8_lossy(&out).into_owned();
        read_delays(&mut text, &label, &s);
        Ok(text)
    }

    /// The sockets' read-delay histograms, in the text format (the
    /// prometheus crate's histograms observe values one by one; these
    /// are counted already).
    fn read_delays(out: &mut String, stack: &str, s: &crate::setup::control::Snapshot) {
        use std::fmt::Write;
        let name = "spate_socket_read_delay_seconds";
        let mut head = false;
        for k in &s.sockets {
            let Some(d) = &k.read_delay else { continue };
            if !head {
                let _ = writeln!(
                    out,
                    "# HELP {name} How long datagrams waited from their RX burst to the application's read."
                );
                let _ = writeln!(out, "# TYPE {name} histogram");
                head = true;
            }
            let labels = format!(
                "local=\"{}\",peer=\"{}\",socket=\"{}\",stack=\"{stack}\"",
                k.local,
                k.peer.as_deref().unwrap_or(""),
                k.id
            );
            let mut seen = 0;
            for (bound, n) in &d.buckets {
                seen += n;
                let le = match bound {
                    Some(ns) => format!("{}", *ns as f64 / 1e9),
                    None => "+Inf".into(),
                };
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {seen}");
            }
            let _ = writeln!(out, "{name}_sum{{{labels}}} {}", d.sum_ns as f64 / 1e9);
            let _ = writeln!(out, "{name}_count{{{labels}}} {}", d.count);
        }
    }

    #[cfg(test)]
    mod tests {
        use super::snake;

        #[test]
        fn counter_names_in_snake_case() {
            assert_eq!(snake(&["Udp", "InDatagrams"]), "udp_in_datagrams");
            assert_eq!(snake(&["Ip6", "InReceives"]), "ip6_in_receives");
            assert_eq!(snake(&["Rx", "Ipv6NotForUs"]), "rx_ipv6_not_for_this_host");
        }
    }
}

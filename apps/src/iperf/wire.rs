//! iperf 2's UDP test on the wire, as iperf 2.1 (Debian 12 ships 2.1.8)
//! writes it. All fields are big-endian 32-bit words.
//!
//! Every datagram of a test starts with a 16-byte header: the sequence
//! number's low word (`id`, signed), the sender's clock in seconds and
//! microseconds, and the sequence number's high word (`id2`). Sequence
//! numbers start at 1. The client then writes a 24-byte client header
//! (flags, threads, port, buffer length, window or rate, amount) where the
//! datagram has room; flags 0 asks for a plain one-way test. The client
//! ends the test with a datagram carrying the next sequence number negated
//! (after n test datagrams, `id` and `id2` of -(n+1)): it is the test's
//! last datagram, counted with its bytes, and it is resent until the
//! server answers with a report:
//! the same 16-byte header, then ten words: flags (`0x80000000`, version
//! 1), bytes received (high and low word), the test's duration (seconds,
//! microseconds), datagrams lost, datagrams out of order, the last
//! sequence number, and the jitter (seconds, microseconds).

/// Bytes of the datagram header.
pub const HEADER_LEN: usize = 16;
/// Bytes of the client header that follows it.
pub const CLIENT_HEADER_LEN: usize = 24;
/// Bytes of a server report after the datagram header.
pub const REPORT_LEN: usize = 40;
/// The smallest datagram a client may send (iperf's own minimum).
pub const MIN_LEN: usize = HEADER_LEN;
/// The report's version flag.
pub const HEADER_VERSION1: u32 = 0x8000_0000;
/// Bytes the server puts in a report datagram (iperf 2.1 sends 128).
pub const REPORT_DATAGRAM_LEN: usize = 128;

fn get(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn put(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// The header of a test datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram {
    /// Sequence number; negative on the datagrams that end a test.
    pub seq: i64,
    /// Sender's clock, seconds.
    pub sec: u32,
    /// Sender's clock, microseconds.
    pub usec: u32,
}

impl Datagram {
    /// Parses the header; `None` when the datagram is too short.
    pub fn parse(b: &[u8]) -> Option<Datagram> {
        if b.len() < HEADER_LEN {
            return None;
        }
        let low = get(b, 0);
        let high = get(b, 12);
        // iperf 2.0 sends no high word (it is zero), and negative ids then
        // need sign extension; 2.1 writes it.
        let seq =
            if high == 0 && (low as i32) < 0 { low as i32 as i64 } else { ((high as u64) << 32 | low as u64) as i64 };
        Some(Datagram { seq, sec: get(b, 4), usec: get(b, 8) })
    }

    /// Writes the header into the first 16 bytes of `b`.
    pub fn emit(&self, b: &mut [u8]) {
        put(b, 0, self.seq as u32);
        put(b, 4, self.sec);
        put(b, 8, self.usec);
        put(b, 12, (self.seq >> 32) as u32);
    }

    /// Whether it ends a test.
    pub fn is_fin(&self) -> bool {
        self.seq < 0
    }

    /// The sender's clock in seconds.
    pub fn sent_at(&self) -> f64 {
        self.sec as f64 + self.usec as f64 / 1e6
    }
}

/// The client header of a plain one-way test, written after the datagram
/// header when `b` has room: flags 0, one thread, `port`, the datagram
/// length, the rate, and the test's length (negative hundredths of a
/// second, as iperf writes a timed test).
pub fn emit_client_header(b: &mut [u8], port: u16, len: usize, rate_bps: u64, secs: f64) {
    if b.len() < HEADER_LEN + CLIENT_HEADER_LEN {
        return;
    }
    let at = HEADER_LEN;
    put(b, at, 0);
    put(b, at + 4, 1);
    put(b, at + 8, port as u32);
    put(b, at + 12, len as u32);
    put(b, at + 16, rate_bps.min(u32::MAX as u64) as u32);
    put(b, at + 20, (-((secs * 100.0) as i64)) as i32 as u32);
}

/// A server's report on one test.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Report {
    /// Payload bytes received.
    pub bytes: u64,
    /// From the first datagram to the last, seconds.
    pub duration: f64,
    /// Datagrams lost.
    pub lost: u64,
    /// Datagrams that came out of order.
    pub out_of_order: u64,
    /// Datagrams the client sent (its last sequence number).
    pub total: u64,
    /// RFC 1889 interarrival jitter, seconds.
    pub jitter: f64,
}

impl Report {
    /// Writes the report datagram into `b`, which must hold `HEADER_LEN +
    /// REPORT_LEN` bytes: a zero datagram header (as iperf's server
    /// writes it), the report, zeros after it.
    pub fn emit(&self, b: &mut [u8]) {
        b.fill(0);
        let at = HEADER_LEN;
        put(b, at, HEADER_VERSION1);
        put(b, at + 4, (self.bytes >> 32) as u32);
        put(b, at + 8, self.bytes as u32);
        let whole = self.duration.max(0.0);
        put(b, at + 12, whole.trunc() as u32);
        put(b, at + 16, (whole.fract() * 1e6) as u32);
        put(b, at + 20, self.lost.min(i32::MAX as u64) as u32);
        put(b, at + 24, self.out_of_order.min(i32::MAX as u64) as u32);
        put(b, at + 28, self.total.min(i32::MAX as u64) as u32);
        put(b, at + 32, self.jitter.trunc() as u32);
        put(b, at + 36, (self.jitter.fract() * 1e6).round() as u32);
    }

    /// Parses a report datagram; `None` when it is not one.
    pub fn parse(b: &[u8]) -> Option<Report> {
        if b.len() < HEADER_LEN + REPORT_LEN || get(b, HEADER_LEN) & HEADER_VERSION1 == 0 {
            return None;
        }
        let at = HEADER_LEN;
        Some(Report {
            bytes: (get(b, at + 4) as u64) << 32 | get(b, at + 8) as u64,
            duration: get(b, at + 12) as f64 + get(b, at + 16) as f64 / 1e6,
            lost: get(b, at + 20) as i32 as i64 as u64,
            out_of_order: get(b, at + 24) as i32 as i64 as u64,
            total: get(b, at + 28) as i32 as i64 as u64,
            jitter: get(b, at + 32) as f64 + get(b, at + 36) as f64 / 1e6,
        })
    }

    /// Lost as a percentage of the total.
    pub fn loss_percent(&self) -> f64 {
        if self.total == 0 { 0.0 } else { 100.0 * self.lost as f64 / self.total as f64 }
    }
}

/// What a server keeps for one test, updated per datagram as iperf does:
/// a gap in sequence numbers counts as lost until the late datagrams come
/// (then as out of order), and the jitter follows RFC 1889.
#[derive(Debug, Clone, Default)]
pub struct TestState {
    /// Payload bytes received (test datagrams, not the final ones).
    pub bytes: u64,
    /// Test datagrams received.
    pub received: u64,
    /// The highest sequence number seen.
    pub last: u64,
    /// Datagrams that came after a higher sequence number.
    pub out_of_order: u64,
    /// The jitter so far, seconds.
    pub jitter: f64,
    transit: Option<f64>,
}

impl TestState {
    /// Accounts a test datagram of `len` payload bytes that arrived at
    /// `arrived` (seconds, the receiver's clock).
    pub fn datagram(&mut self, d: &Datagram, len: usize, arrived: f64) {
        self.bytes += len as u64;
        self.received += 1;
        let seq = d.seq.max(0) as u64;
        if seq < self.last {
            self.out_of_order += 1;
        } else {
            self.last = seq;
        }
        let transit = arrived - d.sent_at();
        if let Some(prev) = self.transit {
            let delta = (transit - prev).abs();
            self.jitter += (delta - self.jitter) / 16.0;
        }
        self.transit = Some(transit);
    }

    /// Accounts the datagram that ends the test (its bytes count; its
    /// negated number is the test's total).
    pub fn fin(&mut self, len: usize) {
        self.bytes += len as u64;
        self.received += 1;
    }

    /// The report, once the client's last sequence number is known.
    pub fn report(&self, total: u64, duration: f64) -> Report {
        Report {
            bytes: self.bytes,
            duration,
            lost: total.saturating_sub(self.received),
            out_of_order: self.out_of_order,
            total,
            jitter: self.jitter,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first datagram and the report of a 1-second test between the
    /// Debian iperf 2.1.8 client and server (`-u -l 40 -b 100k`), as
    /// tcpdump captured them on loopback.
    const CLIENT_FIRST: &str =
        "0000 0001 6b0d 2ca4 0004 40e4 0000 0000 4801 0098 0000 0001 0000 1389 0000 0028 0000 0000 ffff ff9c";
    const CLIENT_FIN: &str =
        "ffff fec4 6b0d 2ca5 0004 5448 ffff ffff 4801 0098 0000 0001 0000 1389 0000 0028 0000 0000 ffff ff9c";
    const SERVER_REPORT: &str = "0000 0000 0000 0000 0000 0000 0000 0000 8800 0000 0000 0000 0000 3184 0000 0001 0000 1310 \
        0000 0000 0000 0000 0000 013c 0000 0000 0000 0000 0000 0001 0000 0000";

    fn hex(s: &str) -> Vec<u8> {
        let digits: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
        (0..digits.len()).step_by(2).map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap()).collect()
    }

    #[test]
    fn parses_what_iperf_sends() {
        let first = Datagram::parse(&hex(CLIENT_FIRST)).unwrap();
        assert_eq!((first.seq, first.sec, first.usec), (1, 0x6b0d_2ca4, 0x0004_40e4));
        let fin = Datagram::parse(&hex(CLIENT_FIN)).unwrap();
        assert!(fin.is_fin());
        assert_eq!(fin.seq, -316);
        let r = Report::parse(&hex(SERVER_REPORT)).unwrap();
        assert_eq!((r.bytes, r.lost, r.out_of_order, r.total), (12676, 0, 0, 316));
        assert!((r.duration - 1.004880).abs() < 1e-9);
    }

    #[test]
    fn round_trips() {
        for seq in [1i64, 300, -316, 1 << 33, -(1 << 33)] {
            let d = Datagram { seq, sec: 7, usec: 999_999 };
            let mut b = [0u8; HEADER_LEN];
            d.emit(&mut b);
            assert_eq!(Datagram::parse(&b), Some(d));
        }
        let r = Report { bytes: 5 << 32 | 77, duration: 2.5, lost: 3, out_of_order: 1, total: 1000, jitter: 0.000125 };
        let mut b = [0u8; REPORT_DATAGRAM_LEN];
        r.emit(&mut b);
        assert_eq!(Report::parse(&b), Some(r));
        assert!(Report::parse(&b[..HEADER_LEN + 8]).is_none(), "too short");
    }

    #[test]
    fn loss_reorder_and_jitter() {
        let mut t = TestState::default();
        let at = |seq: i64, sent: f64| Datagram { seq, sec: sent as u32, usec: (sent.fract() * 1e6) as u32 };
        // 1, 2, 4, 3 (late), 6: 5 never comes; the end carries -7.
        for (seq, sent, arrived) in
            [(1, 0.0, 0.010), (2, 0.1, 0.110), (4, 0.3, 0.310), (3, 0.2, 0.330), (6, 0.5, 0.510)]
        {
            t.datagram(&at(seq, sent), 100, arrived);
        }
        t.fin(100);
        let r = t.report(7, 0.5);
        assert_eq!((r.lost, r.out_of_order, r.total, r.bytes), (1, 1, 7, 600));
        // Transit 10, 10, 10, 130, 10 ms: two jumps of 120 ms.
        let expect = {
            let mut j = 0.0f64;
            for d in [0.0, 0.0, 0.12, 0.12] {
                j += (d - j) / 16.0;
            }
            j
        };
        assert!((r.jitter - expect).abs() < 1e-9, "{} vs {expect}", r.jitter);
        assert!((r.loss_percent() - 100.0 / 7.0).abs() < 1e-9);
    }
}

//! A capture over the control endpoint (`{"op": "capture", ...}`): the
//! connection's thread attaches a [`Tap`], answers with the interfaces
//! (a frame that arrives after the answer is captured: the lcores look
//! for a new tap after every burst), then writes the records the lcores
//! copy as a stream of [`Message`]s until the client sends anything or
//! closes, the stack goes, or a write fails (the client was killed); then
//! it detaches the tap. The lcores let
//! go of it at their next loop iteration, and what they copied meanwhile
//! is still written, with a last count of what was captured and dropped.
//!
//! The stream's messages are `control::stream`'s.

use std::io::{self, BufWriter, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::control::{CaptureRequest, CaptureStart, Message, Reply, info, reply};
use crate::capture::bpf::Program;
use crate::capture::{DEFAULT_RECORDS, MAX_SNAPLEN, Tap, TapConfig};
use crate::control_plane::{Stack, WeakStack};

/// How often the counts go out while frames flow or not.
const COUNTS_EVERY: Duration = Duration::from_millis(200);
/// How long the writer pauses when the lanes are empty.
const IDLE_WAIT: Duration = Duration::from_millis(2);
/// How often the writer looks for a word from the client and the stop
/// flag while records keep coming.
const LOOK_EVERY: Duration = Duration::from_millis(2);
/// What a capture's records may take at most, over all lcores.
const MAX_TAP_BYTES: usize = 256 << 20;
/// How long a write may block before the client counts as gone.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the lcores get to let go of a detached tap.
const LET_GO: Duration = Duration::from_secs(2);

/// Checks a request and makes its tap.
fn tap_for(stack: &Stack, req: &CaptureRequest) -> Result<Tap, String> {
    let snaplen = req.snaplen.unwrap_or(MAX_SNAPLEN);
    if snaplen == 0 || snaplen > MAX_SNAPLEN {
        return Err(format!("snaplen {snaplen}: 1 to {MAX_SNAPLEN}"));
    }
    let filter = match &req.filter {
        Some(insns) => Some(Program::new(insns.clone()).map_err(|e| format!("filter: {e}"))?),
        None => None,
    };
    let links = &stack.shared.links;
    if let Some(i) = req.iface.filter(|i| *i as usize >= links.len()) {
        return Err(format!("no interface {i}"));
    }
    let records = req.records.unwrap_or(DEFAULT_RECORDS);
    if !(1..=1 << 20).contains(&records) {
        return Err(format!("records {records}: 1 to 1,048,576"));
    }
    // The largest frame: MTU, Ethernet header and a VLAN tag.
    let frame_max = links.iter().map(|l| l.mtu as usize + 18).max().unwrap_or(1518);
    let bytes = records.saturating_mul((snaplen as usize).min(frame_max)).saturating_mul(stack.shared.workers);
    if bytes > MAX_TAP_BYTES {
        return Err(format!(
            "records {records} of {} bytes on {} lcores: {} MiB, more than {} MiB (fewer records or a shorter snaplen)",
            (snaplen as usize).min(frame_max),
            stack.shared.workers,
            bytes >> 20,
            MAX_TAP_BYTES >> 20
        ));
    }
    Ok(Tap::new(TapConfig { snaplen, filter, records, iface: req.iface }, stack.shared.workers, frame_max))
}

/// Serves a capture on `conn` until it ends; holds the stack only
/// weakly meanwhile, and ends when it goes or `stop` is set.
pub(super) fn session(conn: UnixStream, shared: &WeakStack, stop: &AtomicBool, req: CaptureRequest) {
    let Some(stack) = shared.upgrade() else { return };
    let mut out = match conn.try_clone() {
        Ok(o) => o,
        Err(_) => return,
    };
    let refuse = |out: &mut UnixStream, message: String, errno: i32| {
        let _ = reply(out, &Reply::Error { message, errno: Some(errno) });
    };
    let tap = match tap_for(&stack, &req) {
        Ok(t) => Arc::new(t),
        Err(e) => return refuse(&mut out, e, libc::EINVAL),
    };
    if !stack.shared.attach_capture(tap.clone()) {
        return refuse(&mut out, "a capture is attached already (one at a time)".into(), libc::EBUSY);
    }
    log::info!("spate: capture attached (snaplen {})", tap.snaplen());
    let start = CaptureStart { interfaces: info(&stack).interfaces, snaplen: tap.snaplen() };
    let started = match serde_json::to_value(start) {
        Ok(v) => reply(&mut out, &Reply::Ok(v)).is_ok(),
        Err(_) => false,
    };
    drop(stack);
    let result = if started { stream(&conn, out, shared, stop, &tap) } else { Err(io::ErrorKind::BrokenPipe.into()) };
    if let Some(s) = shared.shared() {
        s.detach_capture(&tap);
    }
    let (captured, dropped) = tap.totals();
    match result {
        Ok(()) => log::info!("spate: capture detached: {captured} frames captured, {dropped} dropped"),
        Err(e) => log::info!("spate: capture detached ({e}): {captured} frames captured, {dropped} dropped"),
    }
}

/// Writes records until the client asks to stop, the stack goes or
/// `stop` is set (then the last ones and the last counts), or a write
/// fails. The client and the flag are looked at every [`LOOK_EVERY`]
/// also while records keep coming, and the stack is held only to read
/// its clock, never across a write.
fn stream(conn: &UnixStream, out: UnixStream, shared: &WeakStack, stop: &AtomicBool, tap: &Arc<Tap>) -> io::Result<()> {
    out.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let mut w = BufWriter::with_capacity(256 << 10, out);
    let (mut counts_at, mut looked_at) = (Instant::now(), Instant::now());
    while let Some(offset) = realtime_offset(shared) {
        let n = write_records(&mut w, offset, tap)?;
        if counts_at.elapsed() >= COUNTS_EVERY {
            Message::write_counts(&mut w, tap.totals(), false)?;
            w.flush()?;
            counts_at = Instant::now();
        }
        if n > 0 && looked_at.elapsed() < LOOK_EVERY {
            continue;
        }
        looked_at = Instant::now();
        if n == 0 {
            w.flush()?;
        }
        if stop.load(Ordering::Acquire) || client_spoke(conn)? {
            break;
        }
        if n == 0 {
            std::thread::sleep(IDLE_WAIT);
        }
    }
    // The lcores drop their handle at their next iteration; what they
    // copied before goes out too.
    let offset = realtime_offset(shared);
    if let Some(s) = shared.shared() {
        s.detach_capture(tap);
    }
    let waited = Instant::now();
    while Arc::strong_count(tap) > 1 && waited.elapsed() < LET_GO {
        if let Some(o) = offset {
            write_records(&mut w, o, tap)?;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    // What the lcores counted before they let go.
    std::sync::atomic::fence(Ordering::Acquire);
    if let Some(o) = offset {
        while write_records(&mut w, o, tap)? > 0 {}
    }
    Message::write_counts(&mut w, tap.totals(), true)?;
    w.flush()
}

/// `CLOCK_REALTIME` less the stack's clock, in nanoseconds; `None` once
/// the stack is gone.
fn realtime_offset(shared: &WeakStack) -> Option<u64> {
    let s = shared.shared()?;
    Some(crate::time::realtime_ns().wrapping_sub(s.clock.now().0))
}

/// Whether the client sent anything or closed, without waiting.
fn client_spoke(conn: &UnixStream) -> io::Result<bool> {
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 64];
    match socket2::SockRef::from(conn).recv_with_flags(&mut buf, libc::MSG_DONTWAIT) {
        // Bytes, or the end of the stream.
        Ok(_) => Ok(true),
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Writes what waits in the lanes, a batch at most, their times moved by
/// `offset` onto `CLOCK_REALTIME`; returns how many.
fn write_records(w: &mut impl Write, offset: u64, tap: &Tap) -> io::Result<usize> {
    let mut failed = None;
    let n = tap.drain(1024, |r| {
        if failed.is_some() {
            return;
        }
        let mut h = [0u8; 20];
        h[0] = b'F';
        h[1..3].copy_from_slice(&r.iface.to_le_bytes());
        h[3] = r.outbound as u8;
        h[4..8].copy_from_slice(&r.wire_len.to_le_bytes());
        h[8..16].copy_from_slice(&r.time.wrapping_add(offset).to_le_bytes());
        h[16..20].copy_from_slice(&(r.data.len() as u32).to_le_bytes());
        if let Err(e) = w.write_all(&h).and_then(|_| w.write_all(&r.data)) {
            failed = Some(e);
        }
    });
    match failed {
        Some(e) => Err(e),
        None => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::Message;

    #[test]
    fn messages_read_back_as_written() {
        let mut buf = Vec::new();
        buf.push(b'F');
        buf.extend_from_slice(&3u16.to_le_bytes());
        buf.push(1);
        buf.extend_from_slice(&60u32.to_le_bytes());
        buf.extend_from_slice(&1_700_000_000_123_456_789u64.to_le_bytes());
        buf.extend_from_slice(&4u32.to_le_bytes());
        buf.extend_from_slice(&[1, 2, 3, 4]);
        Message::write_counts(&mut buf, (7, 2), true).unwrap();
        let mut r = &buf[..];
        let frame = Message::read(&mut r).unwrap().unwrap();
        assert_eq!(
            frame,
            Message::Frame {
                iface: 3,
                outbound: true,
                wire_len: 60,
                time_ns: 1_700_000_000_123_456_789,
                data: vec![1, 2, 3, 4]
            }
        );
        assert_eq!(Message::read(&mut r).unwrap(), Some(Message::Counts { captured: 7, dropped: 2, last: true }));
        assert_eq!(Message::read(&mut r).unwrap(), None);
        // A frame cut short is an error, not an end.
        assert!(Message::read(&mut &buf[..10]).is_err());
        assert!(Message::read(&mut &[b'X'][..]).is_err());
    }
}

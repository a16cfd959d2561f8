//! Receiving and sending without blocking a thread: `poll_*` calls for
//! an async runtime (a task's waker is woken by the polling lcore once per
//! burst that reached the socket, or when the lcore drains its queue of
//! sends), and, behind the `async` feature, `async fn` forms of them that
//! need no reactor (there is no file descriptor to watch).

use std::io;
use std::net::SocketAddr;
use std::task::{Context, Poll};

use super::UdpSocket;
use crate::datagram::{Datagram, DatagramBatch};
use crate::rx_queue::Wait;

impl UdpSocket {
    /// Receives one datagram into `buf` (bytes beyond it are cut off), or
    /// asks the lcores to wake the task in `cx` when one arrives and
    /// returns `Pending`. Only the task of the latest call is woken, as
    /// with tokio's `UdpSocket::poll_recv_from`: one task at a time may
    /// await a socket's receive (nor may a [`Poller`](crate::Poller) watch
    /// it meanwhile), or the earlier one is never woken. A pending error
    /// (ICMP) is returned first.
    pub fn poll_recv_from(&self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<(usize, SocketAddr)>> {
        match self.poll_recv_datagram(cx) {
            // Shut down for reading: 0 bytes, as a blocking receive.
            Poll::Ready(Err(e)) if e.raw_os_error() == Some(libc::ESHUTDOWN) => Poll::Ready(Ok((0, self.nobody()))),
            p => p.map_ok(|d| (d.copy_to(buf), self.present(d.src()))),
        }
    }

    /// [`poll_recv_from`](Self::poll_recv_from) without the copy: the
    /// datagram, in its mbuf.
    pub fn poll_recv_datagram(&self, cx: &mut Context<'_>) -> Poll<io::Result<Datagram>> {
        crate::app_thread::enter();
        let queue = &self.core.queue;
        // Twice at most: what made the registration say "look again" (a
        // datagram, an error) is found the second time.
        for _ in 0..2 {
            if let Err(e) = self.pending_error() {
                return Poll::Ready(Err(e));
            }
            if let Some(d) = queue.pop(Wait::No) {
                self.note_delay(std::slice::from_ref(&d));
                return Poll::Ready(Ok(d));
            }
            if queue.register_waker(cx.waker()) {
                return Poll::Pending;
            }
            if queue.is_shut() && queue.looks_empty() {
                // What a blocking receive returns: nothing will come.
                return Poll::Ready(Err(Self::shut_error()));
            }
            queue.clear_alert();
        }
        Poll::Pending
    }
}

impl UdpSocket {
    /// Whether a receive would not block: `Ready` when a datagram, a
    /// pending error or a stopped stack is there to report; otherwise
    /// the task in `cx` is woken (once) when one comes, and `Pending`.
    /// Nothing is taken. The waker takes the place of the one an earlier
    /// poll left, as [`poll_recv_from`](Self::poll_recv_from)'s does (the
    /// C API's readiness descriptor is built on it).
    pub fn poll_recv_ready(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.recv_ready() {
            return Poll::Ready(());
        }
        match self.core.queue.register_waker(cx.waker()) {
            true => Poll::Pending,
            false => Poll::Ready(()),
        }
    }

    /// Whether a receive would not block (a datagram, a pending error, a
    /// stopped stack, a shutdown for reading), without registering
    /// anything: two loads while a datagram or an error is there.
    #[inline]
    pub fn recv_ready(&self) -> bool {
        self.core.error.load(std::sync::atomic::Ordering::Relaxed) != 0
            || !self.core.queue.looks_empty()
            || self.core.queue.is_shut()
    }

    /// [`recv_batch`](Self::recv_batch) that never waits, whatever the
    /// socket's mode: `WouldBlock` when nothing is queued.
    #[inline]
    pub fn try_recv_batch(&self, out: &mut DatagramBatch, max: usize) -> io::Result<usize> {
        self.recv_batch_waiting(out, max, Wait::No)
    }

    /// Hands up to `max` queued datagrams, oldest first, to `take` one at
    /// a time, never waiting: a reader that puts each straight where it
    /// goes, without a [`DatagramBatch`] between (libspate fills C
    /// arrays so). A datagram `take` gives back (`Err`) stays at the head
    /// of the queue and ends the call. `Ok(n)`: how many `take` kept (0
    /// when it gave back the first); `WouldBlock` when nothing is queued.
    /// `take` runs under the queue's reader lock: other readers of the
    /// socket wait meanwhile, the lcores do not.
    #[inline]
    pub fn try_recv_each(
        &self,
        max: usize,
        mut take: impl FnMut(Datagram) -> Result<(), Datagram>,
    ) -> io::Result<usize> {
        crate::app_thread::enter();
        self.pending_error()?;
        let mut refused = false;
        let delays = self.read_delays();
        let n = self.core.queue.try_pop_each(max, |d| {
            if let Some((h, now)) = delays
                && let Some(t) = d.stamp_ns()
            {
                h.record(now.saturating_sub(t));
            }
            take(d).inspect_err(|_| refused = true)
        });
        match n {
            0 if max > 0 && !refused => self.found_nothing(Wait::No, || Ok(0)),
            n => Ok(n),
        }
    }

    /// [`peek_from`](Self::peek_from) that never waits.
    pub fn try_peek_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.peek_waiting(buf, Wait::No)
    }

    /// The payload length of the next datagram, if one is queued (what
    /// Linux's `FIONREAD` answers for a UDP socket).
    pub fn next_len(&self) -> Option<usize> {
        self.core.queue.peek(Wait::No, |d| d.len())
    }
}

#[cfg(feature = "async")]
impl UdpSocket {
    /// Receives one datagram, as `recv_from` does, as a future: no thread
    /// waits, the polling lcore wakes the task. Runs under any executor
    /// (tokio's included) without its reactor.
    pub async fn recv_from_async(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        std::future::poll_fn(|cx| self.poll_recv_from(cx, buf)).await
    }

    /// Receives one datagram without copying it, as a future.
    pub async fn recv_datagram_async(&self) -> io::Result<Datagram> {
        std::future::poll_fn(|cx| self.poll_recv_datagram(cx)).await
    }

    /// Sends `buf` to `addr`, as `send_to` does, as a future: a full queue
    /// to the lcore waits for the lcore's drain, not a thread.
    pub async fn send_to_async(&self, buf: &[u8], addr: SocketAddr) -> io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_send_to(cx, buf, addr)).await
    }
}

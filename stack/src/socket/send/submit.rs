//! The hand-off to the transmit path: the lcore's own queue inside its
//! callback, else the socket's lcore's inbox, and its back-pressure.

use std::io;
use std::sync::atomic::Ordering;
use std::time::Instant as StdInstant;

use arrayvec::ArrayVec;

use super::NO_WAIT;
use crate::shared::{LOCAL_TX, TxPacket};
use crate::socket::UdpSocket;
use crate::stats::Counter;

impl UdpSocket {
    /// Hands a packet to the transmit path: the lcore's own queue when
    /// called from its callback (finished there when it goes to the
    /// lcore's direct neighbour), else the inbox of this socket's lcore.
    pub(super) fn submit(&self, pkt: TxPacket, v4: bool) -> io::Result<()> {
        self.submit_waking(pkt, v4, true)
    }

    /// `submit`, ringing the lcore for a packet queued in its inbox only
    /// if `wake` (a batch rings it once, after its last packet); a sender
    /// about to wait for room always rings it first.
    pub(super) fn submit_waking(&self, pkt: TxPacket, v4: bool, wake: bool) -> io::Result<()> {
        let shared = self.shared();
        let pkt = match LOCAL_TX.with(|l| match &mut *l.borrow_mut() {
            Some(local) if local.stack_id == shared.id => local.take(pkt).map_err(Err),
            _ => Err(Ok(pkt)),
        }) {
            Ok(()) => return Ok(()),
            Err(Err(_full)) => return Err(self.sndbuf_error(v4)),
            Err(Ok(pkt)) => pkt,
        };
        let inbox = &shared.inbox[self.tx_worker];
        let pkt = match inbox.push(pkt) {
            Ok(()) => {
                if wake {
                    shared.wake(self.tx_worker);
                }
                return Ok(());
            }
            Err(p) => p,
        };
        if self.inner.nonblocking.load(Ordering::Relaxed) || NO_WAIT.get() || !shared.is_running() {
            return Err(self.sndbuf_error(v4));
        }
        // What this batch queued so far must be taken for room to come.
        shared.wake(self.tx_worker);
        // Backpressure: sleep until the lcore drains the inbox (it wakes
        // waiting senders), the timeout passes or the stack stops.
        let timeout = *self.inner.write_timeout.lock().unwrap_or_else(|p| p.into_inner());
        let deadline = timeout.map(|t| StdInstant::now() + t);
        match inbox.push_wait(pkt, deadline, || shared.is_running() && !shared.should_stop()) {
            Ok(()) => {
                shared.wake(self.tx_worker);
                Ok(())
            }
            Err(_) => Err(self.sndbuf_error(v4)),
        }
    }

    /// Hands the staged packets to the transmit path in one go (the
    /// lcore's own queue inside its callback, frames finished there for
    /// its direct neighbour; else one by one into the lcore's inbox, which
    /// is rung once at the end); returns how many went, keeping the first
    /// error of those that did not.
    pub(super) fn submit_outgoing(&self, staged: &mut Outgoing, first_error: &mut Option<io::Error>) -> usize {
        let shared = self.shared();
        let n = staged.len();
        if n == 0 {
            return 0;
        }
        let local = LOCAL_TX.with(|l| match &mut *l.borrow_mut() {
            Some(local) if local.stack_id == shared.id && local.has_room(n) => {
                for pkt in staged.drain() {
                    // Room checked above: never refused.
                    let _ = local.take(pkt);
                }
                true
            }
            _ => false,
        });
        if local {
            return n;
        }
        let mut sent = 0;
        for pkt in staged.drain() {
            let v4 = pkt.next_hop.is_ipv4();
            match self.submit_waking(pkt, v4, false) {
                Ok(()) => sent += 1,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if sent > 0 {
            shared.wake(self.tx_worker);
        }
        sent
    }

    pub(super) fn sndbuf_error(&self, v4: bool) -> io::Error {
        let c = if v4 { Counter::UdpSndbufErrors } else { Counter::Udp6SndbufErrors };
        self.shared().stats.shared().add_shared(c, 1);
        io::Error::from_raw_os_error(libc::EAGAIN)
    }
}

/// Packets of a batch send on their way to the transmit path.
pub(super) struct Outgoing {
    slots: ArrayVec<TxPacket, OUTGOING>,
}

/// Packets a batch send stages before it hands them over.
const OUTGOING: usize = 8;

impl Outgoing {
    pub(super) fn new() -> Outgoing {
        Outgoing { slots: ArrayVec::new() }
    }

    #[inline]
    pub(super) fn push(&mut self, pkt: TxPacket) {
        // Never full here: a full stage is handed over first.
        debug_assert!(!self.slots.is_full(), "a full stage is handed over first");
        let _ = self.slots.try_push(pkt);
    }

    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(super) fn is_full(&self) -> bool {
        self.slots.is_full()
    }

    /// Takes the staged packets out, oldest first.
    pub(super) fn drain(&mut self) -> arrayvec::Drain<'_, TxPacket, OUTGOING> {
        self.slots.drain(..)
    }
}

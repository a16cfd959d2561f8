//! The socket's IP-level options (TTL and hop limit, TOS and traffic
//! class, broadcast), receive timestamps, a second handle, and the reads
//! that return a datagram's metadata or leave it queued.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use super::{UdpSocket, errno};
use crate::datagram::RecvMeta;
use crate::lookup::Family;
use crate::rx_queue::Wait;

impl UdpSocket {
    /// Sets the TTL of the IPv4 datagrams this socket sends (`IP_TTL`;
    /// an IPv6 socket's IPv4-mapped sends too). 1 to 255; 0 or more than
    /// 255 is `EINVAL`. The default is 64, Linux's `ip_default_ttl`.
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        let ttl = byte(ttl, 1, "a TTL is 1 to 255")?;
        self.lock_state().ip.ttl = ttl;
        Ok(())
    }

    /// The TTL of IPv4 sends.
    pub fn ttl(&self) -> io::Result<u32> {
        Ok(self.state().ip.ttl as u32)
    }

    /// Sets the hop limit of the IPv6 datagrams this socket sends
    /// (`IPV6_UNICAST_HOPS`): 0 to 255, as Linux takes it; more is
    /// `EINVAL`, and an IPv4 socket has no such option (`ENOPROTOOPT`).
    /// The default is 64.
    pub fn set_unicast_hops_v6(&self, hops: u32) -> io::Result<()> {
        self.v6_option()?;
        let hops = byte(hops, 0, "a hop limit is 0 to 255")?;
        self.lock_state().ip.hops = hops;
        Ok(())
    }

    /// The hop limit of IPv6 sends.
    pub fn unicast_hops_v6(&self) -> io::Result<u32> {
        self.v6_option()?;
        Ok(self.state().ip.hops as u32)
    }

    /// Sets the TOS byte of the IPv4 datagrams this socket sends (`IP_TOS`):
    /// DSCP in the top six bits, ECN in the low two, as given (a UDP socket
    /// may set ECN itself, as on Linux). More than 255 is `EINVAL` (Linux
    /// keeps the low byte of what it is given; spate refuses it).
    pub fn set_tos(&self, tos: u32) -> io::Result<()> {
        let tos = byte(tos, 0, "a TOS is one byte")?;
        self.lock_state().ip.tos = tos;
        Ok(())
    }

    /// The TOS byte of IPv4 sends.
    pub fn tos(&self) -> io::Result<u32> {
        Ok(self.state().ip.tos as u32)
    }

    /// Sets the traffic class of the IPv6 datagrams this socket sends
    /// (`IPV6_TCLASS`): DSCP and ECN, as [`set_tos`](Self::set_tos) for
    /// IPv4. More than 255 is `EINVAL`, as on Linux; an IPv4 socket has no
    /// such option (`ENOPROTOOPT`).
    pub fn set_tclass_v6(&self, tclass: u32) -> io::Result<()> {
        self.v6_option()?;
        let tclass = byte(tclass, 0, "a traffic class is one byte")?;
        self.lock_state().ip.tclass = tclass;
        Ok(())
    }

    /// The traffic class of IPv6 sends.
    pub fn tclass_v6(&self) -> io::Result<u32> {
        self.v6_option()?;
        Ok(self.state().ip.tclass as u32)
    }

    /// Lets the socket send to broadcast addresses: the limited broadcast
    /// address and the broadcast address of an interface's subnet
    /// (`SO_BROADCAST`). Without it such a send, or a connect there, is
    /// `EACCES`, as on Linux. Broadcasts go to the Ethernet broadcast
    /// address, unresolved; the limited broadcast leaves by the interface
    /// of the socket's bound address, else by the first with IPv4.
    pub fn set_broadcast(&self, on: bool) -> io::Result<()> {
        let mut st = self.lock_state();
        st.ip.broadcast = on;
        // A route kept for a broadcast address is asked about again.
        st.last_route = None;
        Ok(())
    }

    /// Whether the socket may send to broadcast addresses.
    pub fn broadcast(&self) -> io::Result<bool> {
        Ok(self.state().ip.broadcast)
    }

    /// Asks for receive timestamps (`SO_TIMESTAMPNS`): while any socket
    /// of the stack has them on, the polling lcores note the time of each
    /// burst with its datagrams, and [`recv_msg`](Self::recv_msg) and
    /// [`Datagram::timestamp`](crate::Datagram::timestamp) tell it. The
    /// time is `CLOCK_REALTIME`, read once per receive burst after the
    /// device handed the burst over (as Linux stamps a packet when its
    /// driver passes it up). A datagram handed from the lcore that
    /// received it to the one that owns its flow gets the second one's
    /// time.
    pub fn set_recv_timestamps(&self, on: bool) -> io::Result<()> {
        let shared = self.shared();
        if on && !self.inner.timestamps.swap(true, Ordering::AcqRel) {
            shared.stamp_user(true);
        } else if !on && self.inner.timestamps.swap(false, Ordering::AcqRel) {
            shared.stamp_user(false);
        }
        Ok(())
    }

    /// Whether receive timestamps are on.
    pub fn recv_timestamps(&self) -> io::Result<bool> {
        Ok(self.inner.timestamps.load(Ordering::Acquire))
    }

    /// Keeps a histogram of how long this socket's datagrams wait from
    /// their RX burst to the application's read (`recv_from`, `recv_batch`,
    /// `recv_datagram`, `recv_msg`, the poll calls), which `spate-stat`
    /// and the metrics show: the receive timestamps' clock (the stamps are
    /// taken while the histogram is on, as for
    /// [`set_recv_timestamps`](Self::set_recv_timestamps)). Datagrams a
    /// run-to-completion callback takes where the lcore staged them are
    /// read in the loop iteration that received them, and not counted.
    /// The stack's `read_delay_histograms` turns it on for every socket.
    pub fn set_read_delay_histogram(&self, on: bool) -> io::Result<()> {
        let shared = self.shared();
        if on && !self.core.read_delay.set_on(true) {
            shared.stamp_user(true);
        } else if !on && self.core.read_delay.set_on(false) {
            shared.stamp_user(false);
        }
        Ok(())
    }

    /// Whether the read-delay histogram is kept.
    pub fn read_delay_histogram(&self) -> io::Result<bool> {
        Ok(self.core.read_delay.is_on())
    }

    /// A second handle to this socket (as `dup` makes one): both send and
    /// receive on the same binding and queue and share every option; the
    /// socket is closed when the last handle is dropped.
    pub fn try_clone(&self) -> io::Result<UdpSocket> {
        Ok(UdpSocket {
            inner: self.inner.clone(),
            stack: self.stack.clone(),
            core: self.core.clone(),
            family: self.family,
            v6only: self.v6only,
            tx_worker: self.tx_worker,
        })
    }

    /// Receives one datagram and what its headers and arrival say of it
    /// (`recvmsg` with `IP_PKTINFO`, `IP_RECVTOS`, `IP_RECVTTL` and
    /// `SO_TIMESTAMPNS`, or their IPv6 forms). Bytes beyond `buf` are cut
    /// off. The timestamp is there only when this socket asked for it.
    pub fn recv_msg(&self, buf: &mut [u8]) -> io::Result<(usize, RecvMeta)> {
        let d = self.recv_datagram()?;
        let n = d.copy_to(buf);
        let mut meta = d.meta();
        meta.src = self.present(meta.src);
        meta.dst = self.present(meta.dst);
        if !self.inner.timestamps.load(Ordering::Relaxed) {
            meta.timestamp = None;
        }
        Ok((n, meta))
    }

    /// Copies the next datagram into `buf` without taking it from the
    /// queue (`MSG_PEEK`): the next receive gets it again. Waits as a
    /// receive would.
    pub fn peek_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.peek_waiting(buf, self.wait_mode())
    }

    pub(super) fn peek_waiting(&self, buf: &mut [u8], wait: Wait) -> io::Result<(usize, SocketAddr)> {
        crate::app_thread::enter();
        self.pending_error()?;
        let Some((n, src)) = self.core.queue.peek(wait, |d| (d.copy_to(buf), d.src())) else {
            return self.found_nothing(wait, || Ok((0, self.nobody())));
        };
        Ok((n, self.present(src)))
    }

    /// [`peek_from`](Self::peek_from) without the sender.
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.peek_from(buf).map(|(n, _)| n)
    }

    /// Options that exist only on an IPv6 socket.
    fn v6_option(&self) -> io::Result<()> {
        match self.family {
            Family::V6 => Ok(()),
            Family::V4 => Err(errno(libc::ENOPROTOOPT, "an IPv6 option on an IPv4 socket")),
        }
    }
}

/// `v` as a byte no smaller than `min`, or `EINVAL` saying `what`.
fn byte(v: u32, min: u32, what: &'static str) -> io::Result<u8> {
    if v < min || v > 255 {
        return Err(errno(libc::EINVAL, what));
    }
    Ok(v as u8)
}

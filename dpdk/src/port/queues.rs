//! The per-queue burst handles the datapath polls, and draining RX queues
//! before a port stops.

use std::sync::Arc;

use super::{Port, PortShared};
use crate::burst::Burst;
use crate::error::Result;
use crate::sys;

/// The handle to one RX queue: owned by the lcore that polls it.
#[derive(Debug)]
pub struct RxQueue {
    port: u16,
    queue: u16,
    shared: Arc<PortShared>,
}

impl RxQueue {
    /// The queue's index on its port.
    pub fn index(&self) -> u16 {
        self.queue
    }

    /// Receives into the free slots of `burst`; returns how many arrived.
    #[inline]
    pub fn rx_burst<const N: usize>(&mut self, burst: &mut Burst<N>) -> usize {
        let spare = burst.spare();
        if spare == 0 {
            return 0;
        }
        // SAFETY: the spare slots take up to `spare` mbuf pointers; DPDK
        // hands over ownership of the `got` it writes.
        unsafe {
            let got = sys::spate_rx_burst(self.port, self.queue, burst.spare_ptr(), spare as u16) as usize;
            burst.set_len(burst.len() + got);
            got
        }
    }

    /// The port id.
    pub fn port_id(&self) -> u16 {
        self.port
    }

    /// The queue index.
    pub fn queue_id(&self) -> u16 {
        self.queue
    }

    /// Adds this queue's interrupt to the calling thread's epoll set (the
    /// one [`Sleeper::wait`](crate::Sleeper::wait) waits on), on the port
    /// started with `rx_interrupts`; the thread that sleeps calls it. An
    /// `Error::Port` (`ENOTSUP`, `EPERM`) where the device has none.
    pub fn intr_register(&self) -> Result<()> {
        let ret = self.intr_ctl(crate::sleep::INTR_EVENT_ADD);
        // Registered already (a stack run again on this thread): DPDK says
        // EEXIST, or 0 where it hides that.
        if ret == -libc::EEXIST {
            return Ok(());
        }
        self.check("rte_eth_dev_rx_intr_ctl_q", ret)
    }

    /// Takes this queue's interrupt out of the calling thread's epoll set
    /// again (the thread that registered it, before the queue goes).
    pub fn intr_unregister(&self) -> Result<()> {
        let ret = self.intr_ctl(crate::sleep::INTR_EVENT_DEL);
        self.check("rte_eth_dev_rx_intr_ctl_q", ret)
    }

    /// `rte_eth_dev_rx_intr_ctl_q` of this queue on the calling thread's
    /// epoll set: `op` is `RTE_INTR_EVENT_ADD` or `_DEL`.
    fn intr_ctl(&self, op: i32) -> std::os::raw::c_int {
        // SAFETY: valid port and queue; the per-thread epoll set is EAL's,
        // the event's data a plain number (the queue index).
        unsafe {
            sys::rte_eth_dev_rx_intr_ctl_q(
                self.port,
                self.queue,
                crate::sleep::EPOLL_PER_THREAD,
                op,
                self.queue as usize as *mut std::os::raw::c_void,
            )
        }
    }

    /// The descriptor the queue's interrupt is signalled on, if it has
    /// one (`rte_eth_dev_rx_intr_ctl_q_get_fd`; for `net_tap`, the queue's
    /// own tap descriptor, readable while frames wait in it).
    pub fn intr_fd(&self) -> Option<std::os::fd::RawFd> {
        // SAFETY: valid port and queue; returns a descriptor the port owns.
        let fd = unsafe { sys::rte_eth_dev_rx_intr_ctl_q_get_fd(self.port, self.queue) };
        (fd >= 0).then_some(fd)
    }

    /// Arms the queue's interrupt: the device signals the next frame
    /// (`ENOTSUP` where it is always armed, as `net_tap`'s is).
    pub fn intr_enable(&self) -> Result<()> {
        // SAFETY: valid port and queue.
        let ret = unsafe { sys::rte_eth_dev_rx_intr_enable(self.port, self.queue) };
        self.check("rte_eth_dev_rx_intr_enable", ret)
    }

    /// Disarms it: polling takes over.
    pub fn intr_disable(&self) -> Result<()> {
        // SAFETY: valid port and queue.
        let ret = unsafe { sys::rte_eth_dev_rx_intr_disable(self.port, self.queue) };
        self.check("rte_eth_dev_rx_intr_disable", ret)
    }

    fn check(&self, op: &'static str, ret: std::os::raw::c_int) -> Result<()> {
        if ret == 0 {
            return Ok(());
        }
        Err(super::port_error(self.port, &self.shared.name, op, ret))
    }
}

impl Drop for RxQueue {
    fn drop(&mut self) {
        if let Ok(mut s) = self.shared.state.lock()
            && let Some(t) = s.rx_taken.get_mut(self.queue as usize)
        {
            *t = false;
        }
    }
}

/// The handle to one TX queue: owned by the lcore that sends on it.
#[derive(Debug)]
pub struct TxQueue {
    port: u16,
    queue: u16,
    shared: Arc<PortShared>,
}

impl TxQueue {
    /// Sends from the front of `burst`; the mbufs the device did not take
    /// stay in `burst`, in order. Returns how many were sent.
    #[inline]
    pub fn tx_burst<const N: usize>(&mut self, burst: &mut Burst<N>) -> usize {
        let len = burst.len();
        if len == 0 {
            return 0;
        }
        // SAFETY: the first `len` slots hold owned mbufs; DPDK takes the
        // first `sent` of them.
        unsafe {
            let sent = sys::spate_tx_burst(self.port, self.queue, burst.as_raw_ptr(), len as u16) as usize;
            burst.consume_front(sent);
            sent
        }
    }

    /// The port id.
    pub fn port_id(&self) -> u16 {
        self.port
    }

    /// The queue index.
    pub fn queue_id(&self) -> u16 {
        self.queue
    }
}

impl Drop for TxQueue {
    fn drop(&mut self) {
        if let Ok(mut s) = self.shared.state.lock()
            && let Some(t) = s.tx_taken.get_mut(self.queue as usize)
        {
            *t = false;
        }
    }
}

impl Port {
    /// The handle for RX queue `queue`; one handle per queue at a time.
    pub fn rx_queue(&self, queue: u16) -> Result<RxQueue> {
        self.take_queue(queue, true)?;
        Ok(RxQueue { port: self.id(), queue, shared: self.shared.clone() })
    }

    /// The handle for TX queue `queue`; one handle per queue at a time.
    pub fn tx_queue(&self, queue: u16) -> Result<TxQueue> {
        self.take_queue(queue, false)?;
        Ok(TxQueue { port: self.id(), queue, shared: self.shared.clone() })
    }

    fn take_queue(&self, queue: u16, rx: bool) -> Result<()> {
        let mut state = self.shared.state.lock().expect("port state lock");
        let kind = if rx { "RX" } else { "TX" };
        let slots = if rx { &mut state.rx_taken } else { &mut state.tx_taken };
        match slots.get_mut(queue as usize) {
            None => Err(self.unsupported(format!("{kind} queue {queue} does not exist (configure the port first)"))),
            Some(true) => Err(self.unsupported(format!("{kind} queue {queue} already has a handle"))),
            Some(taken) => {
                *taken = true;
                Ok(())
            }
        }
    }
}

/// Frees what still waits in the RX queues of a started port before it
/// stops: software devices such as net_ring keep queued mbufs across a stop
/// and a close, and would leak them.
pub(super) fn drain_rx(port: u16, queues: u16) {
    const MOST: usize = 1 << 20;
    let mut burst: Burst = Burst::new();
    for queue in 0..queues {
        let mut drained = 0;
        while drained < MOST {
            // SAFETY: the caller holds the only handle to the port, so no
            // lcore polls these queues; the burst takes ownership.
            let got = unsafe {
                let got = sys::spate_rx_burst(port, queue, burst.spare_ptr(), burst.spare() as u16) as usize;
                burst.set_len(got);
                got
            };
            burst.clear();
            if got == 0 {
                break;
            }
            drained += got;
        }
    }
}

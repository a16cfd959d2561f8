//! Link state: polled, and counted by the link-state-change interrupt callback.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{Port, port_name};
use crate::error::Result;
use crate::sys;

/// Link state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// Up or down.
    pub up: bool,
    /// Speed in Mbit/s (0 when unknown).
    pub speed_mbps: u32,
    /// Full duplex.
    pub full_duplex: bool,
}

/// Link-state events seen by the interrupt callback.
#[derive(Debug, Default)]
pub(super) struct LinkEvents {
    changes: AtomicU64,
    up: AtomicBool,
}

impl Port {
    /// The link state, without waiting.
    pub fn link(&self) -> Result<Link> {
        let mut link = sys::rte_eth_link::default();
        // SAFETY: valid port and out pointer.
        let ret = unsafe { sys::rte_eth_link_get_nowait(self.id(), &mut link) };
        if ret != 0 {
            return Err(self.err("rte_eth_link_get_nowait", ret));
        }
        Ok(Link { up: link.link_status() == 1, speed_mbps: link.link_speed, full_duplex: link.link_duplex() == 1 })
    }

    /// Link-state changes reported by interrupts since the port was opened.
    pub fn link_changes(&self) -> u64 {
        self.shared.events.changes.load(Ordering::Relaxed)
    }

    /// The link state the last interrupt reported (false before the first).
    pub fn link_up_by_interrupt(&self) -> bool {
        self.shared.events.up.load(Ordering::Relaxed)
    }
}

pub(super) unsafe extern "C" fn lsc_callback(
    port_id: u16,
    _event: sys::rte_eth_event_type,
    cb_arg: *mut c_void,
    _ret: *mut c_void,
) -> c_int {
    // SAFETY: cb_arg is the LinkEvents registered with this callback,
    // alive until it is unregistered.
    let events = unsafe { &*(cb_arg as *const LinkEvents) };
    let mut link = sys::rte_eth_link::default();
    // SAFETY: valid port and out pointer.
    let up = unsafe { sys::rte_eth_link_get_nowait(port_id, &mut link) } == 0 && link.link_status() == 1;
    events.up.store(up, Ordering::Relaxed);
    events.changes.fetch_add(1, Ordering::Relaxed);
    log::info!("port {port_id} ({}): link {}", port_name(port_id), if up { "up" } else { "down" });
    0
}

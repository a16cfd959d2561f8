//! Port counters: the basic `rte_eth_stats` and the driver's extended ones.

use std::ffi::CStr;

use super::Port;
use crate::error::Result;
use crate::sys;

/// Basic port counters (`rte_eth_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Packets received.
    pub ipackets: u64,
    /// Packets sent.
    pub opackets: u64,
    /// Bytes received.
    pub ibytes: u64,
    /// Bytes sent.
    pub obytes: u64,
    /// Packets the device dropped because RX queues were full.
    pub imissed: u64,
    /// Erroneous received packets.
    pub ierrors: u64,
    /// Failed transmissions.
    pub oerrors: u64,
    /// RX mbuf allocation failures.
    pub rx_nombuf: u64,
}

impl Port {
    /// Basic counters.
    pub fn stats(&self) -> Result<PortStats> {
        let mut s = sys::rte_eth_stats::default();
        // SAFETY: valid port and out pointer.
        let ret = unsafe { sys::rte_eth_stats_get(self.id(), &mut s) };
        if ret != 0 {
            return Err(self.err("rte_eth_stats_get", ret));
        }
        Ok(PortStats {
            ipackets: s.ipackets,
            opackets: s.opackets,
            ibytes: s.ibytes,
            obytes: s.obytes,
            imissed: s.imissed,
            ierrors: s.ierrors,
            oerrors: s.oerrors,
            rx_nombuf: s.rx_nombuf,
        })
    }

    /// Resets the basic counters.
    pub fn reset_stats(&self) -> Result<()> {
        // SAFETY: valid port.
        let ret = unsafe { sys::rte_eth_stats_reset(self.id()) };
        if ret != 0 {
            return Err(self.err("rte_eth_stats_reset", ret));
        }
        Ok(())
    }

    /// The driver's extended counters, by name.
    pub fn xstats(&self) -> Result<Vec<(String, u64)>> {
        let id = self.id();
        // SAFETY: a null array asks for the count.
        let n = unsafe { sys::rte_eth_xstats_get_names(id, std::ptr::null_mut(), 0) };
        if n < 0 {
            return Err(self.err("rte_eth_xstats_get_names", n));
        }
        let mut names = vec![sys::rte_eth_xstat_name { name: [0; 64] }; n as usize];
        let mut values = vec![sys::rte_eth_xstat::default(); n as usize];
        // SAFETY: both arrays hold n entries.
        let got_names = unsafe { sys::rte_eth_xstats_get_names(id, names.as_mut_ptr(), n as u32) };
        // SAFETY: as above.
        let got = unsafe { sys::rte_eth_xstats_get(id, values.as_mut_ptr(), n as u32) };
        if got_names < 0 || got < 0 {
            return Err(self.err("rte_eth_xstats_get", got.min(got_names)));
        }
        let count = (got as usize).min(got_names as usize).min(n as usize);
        Ok(values[..count]
            .iter()
            .map(|v| {
                let name = names.get(v.id as usize).map(|x| {
                    // SAFETY: DPDK writes NUL-terminated names into the 64-byte arrays.
                    unsafe { CStr::from_ptr(x.name.as_ptr()) }.to_string_lossy().into_owned()
                });
                (name.unwrap_or_default(), v.value)
            })
            .collect())
    }
}

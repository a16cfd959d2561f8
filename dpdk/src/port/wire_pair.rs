//! The in-memory wire for tests and benchmarks: two ring-PMD ports, each
//! receiving what the other transmits.

use std::ffi::CString;
use std::sync::Arc;

use super::Port;
use crate::burst::Burst;
use crate::error::{Error, Result, strerror};
use crate::sys;

impl Port {
    /// Two ports wired to each other in memory (DPDK's ring PMD over two
    /// rte_rings): what one transmits the other receives. Tests and
    /// benchmarks drive one end while spate runs on the other.
    pub fn wire_pair(name: &str) -> Result<(Port, Port)> {
        let eal = crate::eal::EalRef::get()?;
        let rings = Arc::new(WireRings::new(name, eal)?);
        let open = |end: &str, rx: *mut sys::rte_ring, tx: *mut sys::rte_ring| -> Result<Port> {
            // DPDK names the port "net_ring_" + the name it is given.
            let given = format!("{name}_{end}");
            let port_name = format!("net_ring_{given}");
            let cname = CString::new(given.as_str())
                .map_err(|_| Error::NoSuchPort { name: port_name.clone(), present: vec![] })?;
            let (mut rxq, mut txq) = ([rx], [tx]);
            // SAFETY: the rings are valid and outlive the port (it holds an Arc).
            let ret = unsafe { sys::rte_eth_from_rings(cname.as_ptr(), rxq.as_mut_ptr(), 1, txq.as_mut_ptr(), 1, 0) };
            if ret < 0 {
                let errno = crate::error::rte_errno();
                return Err(Error::Vdev { spec: port_name, errno, text: strerror(errno) });
            }
            let port = Self::open_inner(&port_name, Some(port_name.clone()))?;
            *port.shared.rings.lock().unwrap_or_else(|p| p.into_inner()) = Some(rings.clone());
            Ok(port)
        };
        // a receives what b sends and the other way round.
        let a = open("a", rings.b_to_a, rings.a_to_b)?;
        let b = open("b", rings.a_to_b, rings.b_to_a)?;
        Ok((a, b))
    }
}

/// The two rings under a [`Port::wire_pair`], freed after both ports.
#[derive(Debug)]
pub(super) struct WireRings {
    a_to_b: *mut sys::rte_ring,
    b_to_a: *mut sys::rte_ring,
    /// The EAL stays up until the rings are freed.
    _eal: crate::eal::EalRef,
}

// SAFETY: rte_rings are thread-safe; the pointers are only freed on drop.
unsafe impl Send for WireRings {}
// SAFETY: as above.
unsafe impl Sync for WireRings {}

/// Slots per direction of a wire pair.
const WIRE_RING_SIZE: u32 = 4096;

impl WireRings {
    fn new(name: &str, eal: crate::eal::EalRef) -> Result<WireRings> {
        let make = |dir: &str| -> Result<*mut sys::rte_ring> {
            let ring_name = format!("w{name}{dir}");
            let c = CString::new(ring_name.as_str()).map_err(|_| Error::Vdev {
                spec: ring_name.clone(),
                errno: libc::EINVAL,
                text: "NUL in name".into(),
            })?;
            // SAFETY: valid name; DPDK copies it.
            let r = unsafe { sys::rte_ring_create(c.as_ptr(), WIRE_RING_SIZE, 0, 0) };
            if r.is_null() {
                let errno = crate::error::rte_errno();
                return Err(Error::Vdev { spec: ring_name, errno, text: strerror(errno) });
            }
            Ok(r)
        };
        let a_to_b = make("ab")?;
        let b_to_a = match make("ba") {
            Ok(r) => r,
            Err(e) => {
                // SAFETY: created above, used by nothing yet.
                unsafe { sys::rte_ring_free(a_to_b) };
                return Err(e);
            }
        };
        Ok(WireRings { a_to_b, b_to_a, _eal: eal })
    }
}

impl Drop for WireRings {
    fn drop(&mut self) {
        // Whatever is still queued belongs to nobody: free it with the rings.
        let mut burst: Burst = Burst::new();
        for ring in [self.a_to_b, self.b_to_a] {
            loop {
                // SAFETY: both ports are gone; only we touch the ring now.
                let n = unsafe {
                    let n = sys::spate_ring_dequeue_burst(ring, burst.spare_ptr(), burst.spare() as u32);
                    burst.set_len(n as usize);
                    n
                };
                burst.clear();
                if n == 0 {
                    break;
                }
            }
            // SAFETY: no port uses the ring any more.
            unsafe { sys::rte_ring_free(ring) };
        }
    }
}

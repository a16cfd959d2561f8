//! Ethernet ports: configuration, start/stop, link, statistics and the
//! per-queue burst handles the datapath polls.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_int, c_void};
use std::sync::{Arc, Mutex, Weak};

use crate::error::{Error, Result, strerror};
use crate::mempool::Mempool;
use crate::sys;

mod config;
mod link;
mod queues;
mod stats;
mod wire_pair;

pub use config::{DeviceInfo, PortConfig, Rss};
pub use link::Link;
pub use queues::{RxQueue, TxQueue};
pub use stats::PortStats;

use link::{LinkEvents, lsc_callback};
use queues::drain_rx;
use wire_pair::WireRings;

#[derive(Debug, Default)]
struct PortState {
    configured: bool,
    started: bool,
    rx_taken: Vec<bool>,
    tx_taken: Vec<bool>,
    pool: Option<Arc<Mempool>>,
    lsc_registered: bool,
    rx_offloads: u64,
    tx_offloads: u64,
    rss: bool,
    promiscuous: bool,
}

impl PortState {
    /// Whether any RX or TX queue has a live handle.
    fn queues_taken(&self) -> bool {
        self.rx_taken.iter().chain(&self.tx_taken).any(|&t| t)
    }
}

#[derive(Debug)]
struct PortShared {
    id: u16,
    name: String,
    info: DeviceInfo,
    vdev: Option<String>,
    // Dropped after Drop::drop closed the port: the rings outlive it.
    rings: Mutex<Option<Arc<WireRings>>>,
    state: Mutex<PortState>,
    // Boxed so the LSC callback's argument keeps its address.
    events: Box<LinkEvents>,
    /// The EAL stays up while the port (or a queue handle) lives; dropped
    /// after the port is closed.
    _eal: crate::eal::EalRef,
}

/// Every port this process has open, so that opening a port twice yields
/// two handles to one state (and one close), not two owners.
static OPEN: Mutex<Option<HashMap<u16, Weak<PortShared>>>> = Mutex::new(None);

/// An Ethernet port. `Port` handles to the same device share one state;
/// queue handles ([`RxQueue`], [`TxQueue`]) keep it alive too. The port is
/// stopped and closed when the last handle goes.
#[derive(Debug)]
pub struct Port {
    shared: Arc<PortShared>,
}

impl Port {
    /// Opens the port DPDK knows by `name` (a `--vdev` name or PCI address).
    pub fn open(name: &str) -> Result<Port> {
        Self::open_inner(name, None)
    }

    /// Creates a virtual device from a `--vdev` style string
    /// (`net_ring0`, `net_null0,size=64`) and opens its port; the device is
    /// removed again when the port goes.
    pub fn create(spec: &str) -> Result<Port> {
        // Held through the device's creation (the port takes its own).
        let _eal = crate::eal::EalRef::get()?;
        let (name, args) = spec.split_once(',').unwrap_or((spec, ""));
        let vdev_err = |errno: i32| Error::Vdev { spec: spec.into(), errno, text: strerror(errno) };
        let cname = CString::new(name).map_err(|_| vdev_err(libc::EINVAL))?;
        let cargs = CString::new(args).map_err(|_| vdev_err(libc::EINVAL))?;
        // SAFETY: the EAL runs; both strings are valid and copied by DPDK.
        let ret = unsafe { sys::rte_vdev_init(cname.as_ptr(), cargs.as_ptr()) };
        if ret < 0 {
            let errno = -ret;
            let text = if errno == libc::EINVAL {
                format!(
                    "{} (is there a driver for {name:?}? DPDK loads drivers from its plugin folder)",
                    strerror(errno)
                )
            } else {
                strerror(errno)
            };
            return Err(Error::Vdev { spec: spec.into(), errno, text });
        }
        Self::open_inner(name, Some(name.to_string()))
    }

    fn open_inner(name: &str, vdev: Option<String>) -> Result<Port> {
        let eal = crate::eal::EalRef::get()?;
        let cname = CString::new(name).map_err(|_| Error::NoSuchPort { name: name.into(), present: list_names() })?;
        let mut id = 0u16;
        // SAFETY: valid C string and out pointer.
        let ret = unsafe { sys::rte_eth_dev_get_port_by_name(cname.as_ptr(), &mut id) };
        if ret != 0 {
            return Err(Error::NoSuchPort { name: name.into(), present: list_names() });
        }
        let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
        let open = open.get_or_insert_with(HashMap::new);
        if let Some(shared) = open.get(&id).and_then(Weak::upgrade) {
            return Ok(Port { shared });
        }
        let info = device_info(id, name)?;
        let shared = Arc::new(PortShared {
            id,
            name: name.into(),
            info,
            vdev,
            rings: Mutex::new(None),
            state: Mutex::new(PortState::default()),
            events: Box::default(),
            _eal: eal,
        });
        open.insert(id, Arc::downgrade(&shared));
        Ok(Port { shared })
    }

    /// Every port DPDK knows: (id, name).
    pub fn list() -> Vec<(u16, String)> {
        let mut out = Vec::new();
        // SAFETY: rte_eth_find_next walks valid port ids.
        let mut id = unsafe { sys::rte_eth_find_next(0) };
        while (id as u32) < sys::RTE_MAX_ETHPORTS {
            out.push((id, port_name(id)));
            // SAFETY: as above.
            id = unsafe { sys::rte_eth_find_next(id + 1) };
        }
        out
    }

    /// The port id.
    pub fn id(&self) -> u16 {
        self.shared.id
    }

    /// The port name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// What the device can do.
    pub fn info(&self) -> &DeviceInfo {
        &self.shared.info
    }

    fn err(&self, op: &'static str, ret: c_int) -> Error {
        port_error(self.id(), self.name(), op, ret)
    }

    fn unsupported(&self, what: String) -> Error {
        Error::Unsupported { port: self.id(), name: self.name().into(), driver: self.info().driver.clone(), what }
    }

    /// Starts the port (and sets promiscuous mode when configured).
    pub fn start(&mut self) -> Result<()> {
        let mut state = self.shared.state.lock().expect("port state lock");
        if !state.configured {
            return Err(self.unsupported("start before configure".into()));
        }
        if state.started {
            return Ok(());
        }
        // SAFETY: the port is configured.
        let ret = unsafe { sys::rte_eth_dev_start(self.id()) };
        if ret != 0 {
            return Err(self.err("rte_eth_dev_start", ret));
        }
        state.started = true;
        // Applied after start (some PMDs accept it only on a started
        // port), under the same lock as every change of the port's state.
        if state.promiscuous
            && let Err(e) = self.promiscuous_locked(true)
        {
            log::warn!("{e}: the port receives only frames for its own MAC address");
        }
        Ok(())
    }

    /// Whether promiscuous mode is on.
    pub fn promiscuous(&self) -> bool {
        // SAFETY: valid port.
        unsafe { sys::rte_eth_promiscuous_get(self.id()) == 1 }
    }

    /// Stops the port. Refused while queue handles are alive, because a
    /// queue must not be polled while its port stops (other `Port` handles
    /// to the device are no obstacle). The handles are counted under the
    /// lock that taking one holds, so none can be taken meanwhile.
    pub fn stop(&mut self) -> Result<()> {
        let mut state = self.shared.state.lock().expect("port state lock");
        if state.queues_taken() {
            return Err(self.unsupported("stop while RX/TX queue handles are alive: drop them first".into()));
        }
        if !state.started {
            return Ok(());
        }
        drain_rx(self.id(), state.rx_taken.len() as u16);
        // SAFETY: no queue handle exists, so nothing polls the port.
        let ret = unsafe { sys::rte_eth_dev_stop(self.id()) };
        if ret != 0 {
            return Err(self.err("rte_eth_dev_stop", ret));
        }
        state.started = false;
        Ok(())
    }

    /// Whether the port is started.
    pub fn is_started(&self) -> bool {
        self.shared.state.lock().expect("port state lock").started
    }

    /// The port's MAC address.
    pub fn mac(&self) -> Result<[u8; 6]> {
        let mut addr = sys::rte_ether_addr::default();
        // SAFETY: valid port and out pointer.
        let ret = unsafe { sys::rte_eth_macaddr_get(self.id(), &mut addr) };
        if ret != 0 {
            return Err(self.err("rte_eth_macaddr_get", ret));
        }
        Ok(addr.addr_bytes)
    }

    /// Sets the port's MAC address (under the port's state lock, as every
    /// change is, whichever handle makes it).
    pub fn set_mac(&mut self, mac: [u8; 6]) -> Result<()> {
        let _state = self.shared.state.lock().expect("port state lock");
        let mut addr = sys::rte_ether_addr { addr_bytes: mac };
        // SAFETY: valid port and address.
        let ret = unsafe { sys::rte_eth_dev_default_mac_addr_set(self.id(), &mut addr) };
        if ret != 0 {
            return Err(self.err("rte_eth_dev_default_mac_addr_set", ret));
        }
        Ok(())
    }

    /// The current MTU.
    pub fn mtu(&self) -> Result<u16> {
        let mut mtu = 0u16;
        // SAFETY: valid port and out pointer.
        let ret = unsafe { sys::rte_eth_dev_get_mtu(self.id(), &mut mtu) };
        if ret != 0 {
            return Err(self.err("rte_eth_dev_get_mtu", ret));
        }
        Ok(mtu)
    }
}

impl Drop for PortShared {
    fn drop(&mut self) {
        if let Ok(mut open) = OPEN.lock()
            && let Some(map) = open.as_mut()
            && map.get(&self.id).is_some_and(|w| w.strong_count() == 0)
        {
            map.remove(&self.id);
        }
        let state = self.state.get_mut().expect("port state lock");
        if state.started {
            drain_rx(self.id, state.rx_taken.len() as u16);
        }
        // SAFETY: this is the last handle, so nothing polls the port.
        unsafe {
            if state.started {
                sys::rte_eth_dev_stop(self.id);
            }
            if state.lsc_registered {
                let arg = &*self.events as *const LinkEvents as *mut c_void;
                // EAGAIN means the callback is running right now: retry briefly.
                for _ in 0..1000 {
                    let ret = sys::rte_eth_dev_callback_unregister(
                        self.id,
                        sys::RTE_ETH_EVENT_INTR_LSC,
                        Some(lsc_callback),
                        arg,
                    );
                    if ret != -libc::EAGAIN {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            if state.configured || self.vdev.is_some() {
                sys::rte_eth_dev_close(self.id);
            }
            if let Some(name) = &self.vdev
                && let Ok(c) = CString::new(name.as_str())
            {
                let ret = sys::rte_vdev_uninit(c.as_ptr());
                if ret < 0 {
                    log::warn!("rte_vdev_uninit({name}): {}", strerror(-ret));
                }
            }
        }
    }
}

fn port_name(id: u16) -> String {
    let mut buf = [0 as std::ffi::c_char; 64];
    // SAFETY: the buffer holds RTE_ETH_NAME_MAX_LEN (64) bytes.
    let ret = unsafe { sys::rte_eth_dev_get_name_by_port(id, buf.as_mut_ptr()) };
    if ret != 0 {
        return format!("port{id}");
    }
    // SAFETY: DPDK wrote a NUL-terminated name.
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

fn list_names() -> Vec<String> {
    Port::list().into_iter().map(|(_, n)| n).collect()
}

fn device_info(id: u16, name: &str) -> Result<DeviceInfo> {
    let mut raw = sys::rte_eth_dev_info::default();
    // SAFETY: valid port and out pointer.
    let ret = unsafe { sys::rte_eth_dev_info_get(id, &mut raw) };
    if ret != 0 {
        let errno = ret.abs();
        return Err(Error::Port {
            port: id,
            name: name.into(),
            op: "rte_eth_dev_info_get",
            errno,
            text: strerror(errno),
        });
    }
    // SAFETY: driver_name and dev_flags point into the device, valid while it exists.
    let (driver, flags) = unsafe {
        let driver = if raw.driver_name.is_null() {
            String::new()
        } else {
            CStr::from_ptr(raw.driver_name).to_string_lossy().into_owned()
        };
        let flags = if raw.dev_flags.is_null() { 0 } else { *raw.dev_flags };
        (driver, flags)
    };
    Ok(DeviceInfo {
        driver,
        max_rx_queues: raw.max_rx_queues,
        max_tx_queues: raw.max_tx_queues,
        rx_offload_capa: raw.rx_offload_capa,
        tx_offload_capa: raw.tx_offload_capa,
        rss_offloads: raw.flow_type_rss_offloads,
        reta_size: raw.reta_size,
        min_mtu: raw.min_mtu,
        max_mtu: raw.max_mtu,
        lsc_interrupt: flags & sys::RTE_ETH_DEV_INTR_LSC != 0,
        if_index: raw.if_index,
    })
}

/// The error of ethdev call `op` on port `port` (`name`) that returned
/// `ret` (a negative errno).
fn port_error(port: u16, name: &str, op: &'static str, ret: c_int) -> Error {
    let errno = ret.abs();
    Error::Port { port, name: name.into(), op, errno, text: strerror(errno) }
}

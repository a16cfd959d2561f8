//! Ethernet ports: configuration, start/stop, link, statistics and the
//! per-queue burst handles the datapath polls.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::burst::Burst;
use crate::eal::Eal;
use crate::error::{Error, Result, strerror};
use crate::mempool::Mempool;
use crate::sys;

/// Whether to spread received flows over queues with the NIC's RSS hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Rss {
    /// One queue's worth of hashing: RSS off.
    Off,
    /// RSS when the device offers it (and more than one RX queue is asked for).
    #[default]
    Auto,
    /// RSS or an error: for callers that cannot work without it.
    Required,
}

/// How to configure a port.
#[derive(Debug, Clone)]
pub struct PortConfig {
    /// RX queues (one per polling lcore).
    pub rx_queues: u16,
    /// TX queues.
    pub tx_queues: u16,
    /// RX descriptors per queue (adjusted to the device's limits).
    pub rx_desc: u16,
    /// TX descriptors per queue (adjusted to the device's limits).
    pub tx_desc: u16,
    /// MTU to set, or the device's default.
    pub mtu: Option<u16>,
    /// Receive frames for any MAC address.
    pub promiscuous: bool,
    /// Link-state-change interrupts, where the device has them (a
    /// server-mode virtio_user port needs them to renegotiate with a
    /// restarted vhost-user peer).
    pub lsc_interrupt: bool,
    /// RSS mode.
    pub rss: Rss,
    /// Ask for RX IPv4/UDP checksum checking where the device offers it.
    pub rx_checksum: bool,
    /// Ask for TX IPv4/UDP checksum computation where the device offers it.
    pub tx_checksum: bool,
}

impl Default for PortConfig {
    fn default() -> Self {
        PortConfig {
            rx_queues: 1,
            tx_queues: 1,
            rx_desc: 1024,
            tx_desc: 1024,
            mtu: None,
            promiscuous: true,
            lsc_interrupt: true,
            rss: Rss::Auto,
            rx_checksum: true,
            tx_checksum: true,
        }
    }
}

/// What a device says it can do.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// The PMD's name (`net_ring`, `net_virtio_user`, ...).
    pub driver: String,
    /// Most RX queues.
    pub max_rx_queues: u16,
    /// Most TX queues.
    pub max_tx_queues: u16,
    /// `RTE_ETH_RX_OFFLOAD_*` capabilities.
    pub rx_offload_capa: u64,
    /// `RTE_ETH_TX_OFFLOAD_*` capabilities.
    pub tx_offload_capa: u64,
    /// `RTE_ETH_RSS_*` flow types the device can hash; 0 means no RSS.
    pub rss_offloads: u64,
    /// Size of the RSS redirection table.
    pub reta_size: u16,
    /// Smallest MTU.
    pub min_mtu: u16,
    /// Largest MTU.
    pub max_mtu: u16,
    /// Whether the device raises link-state-change interrupts.
    pub lsc_interrupt: bool,
}

const RX_CKSUM: u64 = (sys::RTE_ETH_RX_OFFLOAD_IPV4_CKSUM | sys::RTE_ETH_RX_OFFLOAD_UDP_CKSUM) as u64;
const TX_CKSUM: u64 = (sys::RTE_ETH_TX_OFFLOAD_IPV4_CKSUM | sys::RTE_ETH_TX_OFFLOAD_UDP_CKSUM) as u64;
const RSS_WANTED: u64 = (sys::RTE_ETH_RSS_IP | sys::RTE_ETH_RSS_UDP) as u64;

impl DeviceInfo {
    /// Whether the device can hash flows over queues.
    pub fn supports_rss(&self) -> bool {
        self.rss_offloads != 0
    }

    /// Whether the device checks IPv4 and UDP checksums on receive.
    pub fn rx_checksum(&self) -> bool {
        self.rx_offload_capa & RX_CKSUM == RX_CKSUM
    }

    /// Whether the device computes IPv4 and UDP checksums on transmit.
    pub fn tx_checksum(&self) -> bool {
        self.tx_offload_capa & TX_CKSUM == TX_CKSUM
    }
}

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

/// Link-state events seen by the interrupt callback.
#[derive(Debug, Default)]
struct LinkEvents {
    changes: AtomicU64,
    up: AtomicBool,
}

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
        if !Eal::is_running() {
            return Err(Error::EalNotRunning);
        }
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
        if !Eal::is_running() {
            return Err(Error::EalNotRunning);
        }
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
        });
        open.insert(id, Arc::downgrade(&shared));
        Ok(Port { shared })
    }

    /// Two ports wired to each other in memory (DPDK's ring PMD over two
    /// rte_rings): what one transmits the other receives. Tests and
    /// benchmarks drive one end while spate runs on the other.
    pub fn wire_pair(name: &str) -> Result<(Port, Port)> {
        if !Eal::is_running() {
            return Err(Error::EalNotRunning);
        }
        let rings = Arc::new(WireRings::new(name)?);
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
        let errno = ret.abs();
        Error::Port { port: self.id(), name: self.name().into(), op, errno, text: strerror(errno) }
    }

    fn unsupported(&self, what: String) -> Error {
        Error::Unsupported { port: self.id(), name: self.name().into(), driver: self.info().driver.clone(), what }
    }

    /// Configures queues, descriptors, offloads, RSS and interrupts, with
    /// every RX queue filling from `pool`.
    pub fn configure(&mut self, cfg: &PortConfig, pool: Arc<Mempool>) -> Result<()> {
        let info = self.info().clone();
        let mut state = self.shared.state.lock().expect("port state lock");
        if state.started {
            return Err(self.unsupported("configure while started: stop it first".into()));
        }
        if cfg.rx_queues == 0 || cfg.tx_queues == 0 {
            return Err(self.unsupported("a port needs at least one RX and one TX queue".into()));
        }
        if cfg.rx_queues > info.max_rx_queues || cfg.tx_queues > info.max_tx_queues {
            return Err(self.unsupported(format!(
                "{} RX / {} TX queues asked for, the device has at most {} / {}",
                cfg.rx_queues, cfg.tx_queues, info.max_rx_queues, info.max_tx_queues
            )));
        }
        let rss = match cfg.rss {
            Rss::Off => false,
            Rss::Auto => info.supports_rss() && cfg.rx_queues > 1,
            Rss::Required if !info.supports_rss() => {
                return Err(self.unsupported(
                    "RSS was required but the device hashes no flow types (flow_type_rss_offloads = 0); \
                     spread flows in software instead"
                        .into(),
                ));
            }
            Rss::Required => true,
        };
        if let Some(mtu) = cfg.mtu {
            if mtu < info.min_mtu || mtu > info.max_mtu {
                return Err(self.unsupported(format!(
                    "MTU {mtu} is outside the device's range {}..={}",
                    info.min_mtu, info.max_mtu
                )));
            }
        }
        let mut conf = sys::rte_eth_conf::default();
        let mut rx_offloads = 0;
        if cfg.rx_checksum {
            rx_offloads |= RX_CKSUM & info.rx_offload_capa;
        }
        let mut tx_offloads = sys::RTE_ETH_TX_OFFLOAD_MULTI_SEGS as u64 & info.tx_offload_capa;
        if cfg.tx_checksum {
            tx_offloads |= TX_CKSUM & info.tx_offload_capa;
        }
        if rss {
            conf.rxmode.mq_mode = sys::RTE_ETH_MQ_RX_RSS;
            conf.rx_adv_conf.rss_conf.rss_hf = RSS_WANTED & info.rss_offloads;
            rx_offloads |= sys::RTE_ETH_RX_OFFLOAD_RSS_HASH as u64 & info.rx_offload_capa;
        }
        conf.rxmode.offloads = rx_offloads;
        conf.txmode.offloads = tx_offloads;
        if let Some(mtu) = cfg.mtu {
            conf.rxmode.mtu = mtu as u32;
        }
        let lsc = cfg.lsc_interrupt && info.lsc_interrupt;
        conf.intr_conf.set_lsc(lsc as u32);

        let id = self.id();
        // SAFETY: conf is a valid, fully initialised configuration.
        let ret = unsafe { sys::rte_eth_dev_configure(id, cfg.rx_queues, cfg.tx_queues, &conf) };
        if ret != 0 {
            return Err(self.err("rte_eth_dev_configure", ret));
        }
        let (mut rxd, mut txd) = (cfg.rx_desc, cfg.tx_desc);
        // SAFETY: valid port and out pointers.
        let ret = unsafe { sys::rte_eth_dev_adjust_nb_rx_tx_desc(id, &mut rxd, &mut txd) };
        if ret != 0 {
            return Err(self.err("rte_eth_dev_adjust_nb_rx_tx_desc", ret));
        }
        // SAFETY: valid port.
        let socket = unsafe { sys::rte_eth_dev_socket_id(id) };
        let socket = if socket < 0 { 0 } else { socket as u32 };
        let mut raw_info = sys::rte_eth_dev_info::default();
        // SAFETY: valid port and out pointer.
        let ret = unsafe { sys::rte_eth_dev_info_get(id, &mut raw_info) };
        if ret != 0 {
            return Err(self.err("rte_eth_dev_info_get", ret));
        }
        for q in 0..cfg.rx_queues {
            let mut rxconf = raw_info.default_rxconf;
            rxconf.offloads = rx_offloads;
            // SAFETY: the pool outlives the queue (the port keeps an Arc).
            let ret = unsafe { sys::rte_eth_rx_queue_setup(id, q, rxd, socket, &rxconf, pool.as_ptr()) };
            if ret != 0 {
                return Err(self.err("rte_eth_rx_queue_setup", ret));
            }
        }
        for q in 0..cfg.tx_queues {
            let mut txconf = raw_info.default_txconf;
            txconf.offloads = tx_offloads;
            // SAFETY: valid port and configuration.
            let ret = unsafe { sys::rte_eth_tx_queue_setup(id, q, txd, socket, &txconf) };
            if ret != 0 {
                return Err(self.err("rte_eth_tx_queue_setup", ret));
            }
        }
        if lsc && !state.lsc_registered {
            let arg = &*self.shared.events as *const LinkEvents as *mut c_void;
            // SAFETY: the callback and its argument live until unregistered
            // in PortShared's drop.
            let ret =
                unsafe { sys::rte_eth_dev_callback_register(id, sys::RTE_ETH_EVENT_INTR_LSC, Some(lsc_callback), arg) };
            if ret != 0 {
                return Err(self.err("rte_eth_dev_callback_register", ret));
            }
            state.lsc_registered = true;
        }
        state.configured = true;
        state.rx_taken = vec![false; cfg.rx_queues as usize];
        state.tx_taken = vec![false; cfg.tx_queues as usize];
        state.pool = Some(pool);
        state.rx_offloads = rx_offloads;
        state.tx_offloads = tx_offloads;
        state.rss = rss;
        log::info!(
            "port {id} ({}, {}): {} rxq x {rxd} / {} txq x {txd}, rss {}, lsc {}, rx offloads {rx_offloads:#x}, tx offloads {tx_offloads:#x}",
            self.name(),
            info.driver,
            cfg.rx_queues,
            cfg.tx_queues,
            if rss { "on" } else { "off" },
            if lsc { "on" } else { "off" }
        );
        state.promiscuous = cfg.promiscuous;
        Ok(())
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
        let promiscuous = state.promiscuous;
        drop(state);
        // Applied after start: some PMDs accept it only on a started port.
        if promiscuous {
            if let Err(e) = self.set_promiscuous(true) {
                log::warn!("{e}: the port receives only frames for its own MAC address");
            }
        }
        Ok(())
    }

    /// Sets promiscuous mode.
    pub fn set_promiscuous(&mut self, on: bool) -> Result<()> {
        // SAFETY: valid port.
        let ret = unsafe {
            if on { sys::rte_eth_promiscuous_enable(self.id()) } else { sys::rte_eth_promiscuous_disable(self.id()) }
        };
        if ret != 0 {
            let op = if on { "rte_eth_promiscuous_enable" } else { "rte_eth_promiscuous_disable" };
            return Err(self.err(op, ret));
        }
        Ok(())
    }

    /// Whether promiscuous mode is on.
    pub fn promiscuous(&self) -> bool {
        // SAFETY: valid port.
        unsafe { sys::rte_eth_promiscuous_get(self.id()) == 1 }
    }

    /// Stops the port. Refused while queue handles are alive, because a
    /// queue must not be polled while its port stops.
    pub fn stop(&mut self) -> Result<()> {
        if Arc::strong_count(&self.shared) > 1 {
            return Err(self.unsupported("stop while RX/TX queue handles are alive: drop them first".into()));
        }
        let mut state = self.shared.state.lock().expect("port state lock");
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

    /// The RX offloads in effect (`RTE_ETH_RX_OFFLOAD_*`).
    pub fn rx_offloads(&self) -> u64 {
        self.shared.state.lock().expect("port state lock").rx_offloads
    }

    /// The TX offloads in effect (`RTE_ETH_TX_OFFLOAD_*`).
    pub fn tx_offloads(&self) -> u64 {
        self.shared.state.lock().expect("port state lock").tx_offloads
    }

    /// Whether RSS is in effect.
    pub fn rss_enabled(&self) -> bool {
        self.shared.state.lock().expect("port state lock").rss
    }

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

    /// Sets the port's MAC address.
    pub fn set_mac(&mut self, mac: [u8; 6]) -> Result<()> {
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

impl Drop for PortShared {
    fn drop(&mut self) {
        if let Ok(mut open) = OPEN.lock() {
            if let Some(map) = open.as_mut() {
                if map.get(&self.id).is_some_and(|w| w.strong_count() == 0) {
                    map.remove(&self.id);
                }
            }
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
            if let Some(name) = &self.vdev {
                if let Ok(c) = CString::new(name.as_str()) {
                    let ret = sys::rte_vdev_uninit(c.as_ptr());
                    if ret < 0 {
                        log::warn!("rte_vdev_uninit({name}): {}", strerror(-ret));
                    }
                }
            }
        }
    }
}

unsafe extern "C" fn lsc_callback(
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

/// The two rings under a [`Port::wire_pair`], freed after both ports.
#[derive(Debug)]
struct WireRings {
    a_to_b: *mut sys::rte_ring,
    b_to_a: *mut sys::rte_ring,
}

// SAFETY: rte_rings are thread-safe; the pointers are only freed on drop.
unsafe impl Send for WireRings {}
// SAFETY: as above.
unsafe impl Sync for WireRings {}

/// Slots per direction of a wire pair.
const WIRE_RING_SIZE: u32 = 4096;

impl WireRings {
    fn new(name: &str) -> Result<WireRings> {
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
        Ok(WireRings { a_to_b, b_to_a })
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

/// Frees what still waits in the RX queues of a started port before it
/// stops: software devices such as net_ring keep queued mbufs across a stop
/// and a close, and would leak them.
fn drain_rx(port: u16, queues: u16) {
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
    })
}

/// The handle to one RX queue: owned by the lcore that polls it.
#[derive(Debug)]
pub struct RxQueue {
    port: u16,
    queue: u16,
    shared: Arc<PortShared>,
}

impl RxQueue {
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
}

impl Drop for RxQueue {
    fn drop(&mut self) {
        if let Ok(mut s) = self.shared.state.lock() {
            if let Some(t) = s.rx_taken.get_mut(self.queue as usize) {
                *t = false;
            }
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
        if let Ok(mut s) = self.shared.state.lock() {
            if let Some(t) = s.tx_taken.get_mut(self.queue as usize) {
                *t = false;
            }
        }
    }
}

//! Port configuration: RSS mode, [`PortConfig`], [`DeviceInfo`], and
//! configuring queues, offloads, RSS and interrupts.

use std::ffi::c_void;
use std::sync::Arc;

use super::Port;
use super::link::{LinkEvents, lsc_callback};
use crate::error::Result;
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
    /// RX queue interrupts (`intr_conf.rxq`), for lcores that sleep when
    /// idle: a device without them ignores the request (its queues then
    /// refuse [`RxQueue::intr_register`](crate::RxQueue::intr_register)).
    pub rx_interrupts: bool,
    /// RSS mode.
    pub rss: Rss,
    /// Ask for RX IPv4 and UDP checksum checking where the device offers
    /// both (a device that offers one of them is asked for neither).
    pub rx_checksum: bool,
    /// Ask for TX IPv4 and UDP checksum computation where the device
    /// offers both (likewise).
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
            rx_interrupts: false,
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
    /// The kernel interface the device sits on (`net_af_packet`,
    /// `net_tap`: its ifindex), or 0.
    pub if_index: u32,
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

impl Port {
    /// Configures queues, descriptors, offloads, RSS and interrupts, with
    /// every RX queue filling from `pool`.
    pub fn configure(&mut self, cfg: &PortConfig, pool: Arc<Mempool>) -> Result<()> {
        let info = self.info().clone();
        let mut state = self.shared.state.lock().expect("port state lock");
        if state.started {
            return Err(self.unsupported("configure while started: stop it first".into()));
        }
        if state.queues_taken() {
            // Configuring resets which queues have handles: a live one
            // would then be handed out twice.
            return Err(self.unsupported("configure while RX/TX queue handles are alive: drop them first".into()));
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
        if let Some(mtu) = cfg.mtu
            && (mtu < info.min_mtu || mtu > info.max_mtu)
        {
            return Err(self
                .unsupported(format!("MTU {mtu} is outside the device's range {}..={}", info.min_mtu, info.max_mtu)));
        }
        let mut conf = sys::rte_eth_conf::default();
        // Checksum offloads as a pair or not at all: spate uses them only
        // together. virtio offers UDP without IPv4: asked for it, its PMD
        // reads or writes every packet's virtio-net header for nothing
        // spate uses, and the host may then hand over UDP checksums it
        // left partial (`RX_L4_CKSUM_NONE`), which spate does not take.
        let mut rx_offloads = 0;
        if cfg.rx_checksum && info.rx_checksum() {
            rx_offloads |= RX_CKSUM;
        }
        let mut tx_offloads = sys::RTE_ETH_TX_OFFLOAD_MULTI_SEGS as u64 & info.tx_offload_capa;
        if cfg.tx_checksum && info.tx_checksum() {
            tx_offloads |= TX_CKSUM;
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
        conf.intr_conf.set_rxq(cfg.rx_interrupts as u32);

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

    /// The multicast MAC addresses the port takes besides its own
    /// (`rte_eth_dev_set_mc_addr_list`; an empty list takes none). An
    /// `Error::Port` with `ENOTSUP` where the device keeps no such list.
    pub fn set_mc_addr_list(&self, macs: &[[u8; 6]]) -> Result<()> {
        let _state = self.shared.state.lock().expect("port state lock");
        let mut list: Vec<sys::rte_ether_addr> = macs.iter().map(|m| sys::rte_ether_addr { addr_bytes: *m }).collect();
        let ptr = if list.is_empty() { std::ptr::null_mut() } else { list.as_mut_ptr() };
        // SAFETY: valid port; `list` outlives the call, which copies it.
        let ret = unsafe { sys::rte_eth_dev_set_mc_addr_list(self.id(), ptr, list.len() as u32) };
        if ret != 0 {
            return Err(self.err("rte_eth_dev_set_mc_addr_list", ret));
        }
        Ok(())
    }

    /// Sets all-multicast mode: every multicast frame taken
    /// (`rte_eth_allmulticast_enable`).
    pub fn set_allmulticast(&self, on: bool) -> Result<()> {
        let _state = self.shared.state.lock().expect("port state lock");
        self.switch(
            on,
            (sys::rte_eth_allmulticast_enable, "rte_eth_allmulticast_enable"),
            (sys::rte_eth_allmulticast_disable, "rte_eth_allmulticast_disable"),
        )
    }

    /// Whether all-multicast mode is on.
    pub fn allmulticast(&self) -> bool {
        // SAFETY: valid port.
        unsafe { sys::rte_eth_allmulticast_get(self.id()) == 1 }
    }

    /// Sets promiscuous mode (under the port's state lock, as every change
    /// is, whichever handle makes it).
    pub fn set_promiscuous(&self, on: bool) -> Result<()> {
        let _state = self.shared.state.lock().expect("port state lock");
        self.promiscuous_locked(on)
    }

    /// [`set_promiscuous`](Self::set_promiscuous) with the state lock held.
    pub(super) fn promiscuous_locked(&self, on: bool) -> Result<()> {
        self.switch(
            on,
            (sys::rte_eth_promiscuous_enable, "rte_eth_promiscuous_enable"),
            (sys::rte_eth_promiscuous_disable, "rte_eth_promiscuous_disable"),
        )
    }

    /// Turns a mode of the port on or off with its ethdev pair of calls
    /// (each named for the error), the state lock held by the caller.
    fn switch(&self, on: bool, enable: (ModeCall, &'static str), disable: (ModeCall, &'static str)) -> Result<()> {
        let (call, op) = if on { enable } else { disable };
        // SAFETY: valid port; the calls take a port id alone.
        let ret = unsafe { call(self.id()) };
        if ret != 0 {
            return Err(self.err(op, ret));
        }
        Ok(())
    }

    /// The RX offloads in effect (`RTE_ETH_RX_OFFLOAD_*`).
    pub fn rx_offloads(&self) -> u64 {
        self.shared.state.lock().expect("port state lock").rx_offloads
    }

    /// The TX offloads in effect (`RTE_ETH_TX_OFFLOAD_*`).
    pub fn tx_offloads(&self) -> u64 {
        self.shared.state.lock().expect("port state lock").tx_offloads
    }

    /// Whether the port checks IPv4 and UDP checksums on receive, as it
    /// was configured (the pair, as `configure` asks for it).
    pub fn rx_checksum(&self) -> bool {
        self.rx_offloads() & RX_CKSUM == RX_CKSUM
    }

    /// Whether the port computes IPv4 and UDP checksums on transmit, as
    /// it was configured.
    pub fn tx_checksum(&self) -> bool {
        self.tx_offloads() & TX_CKSUM == TX_CKSUM
    }

    /// Whether RSS is in effect.
    pub fn rss_enabled(&self) -> bool {
        self.shared.state.lock().expect("port state lock").rss
    }
}

/// An ethdev call that turns a mode of a port on or off.
type ModeCall = unsafe extern "C" fn(u16) -> std::os::raw::c_int;

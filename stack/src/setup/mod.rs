//! Setup: building a [`Stack`] from a [`StackConfig`] (the EAL, the pool,
//! the ports and their queues, interfaces, routes, tunnels and the tables),
//! its accessors, and running it ([`run`]). The only layer that sees both
//! the engine and the sockets.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crossbeam_utils::CachePadded;
use spate_dpdk::{Eal, EalBuilder, Memory, Mempool, MempoolConfig, Port, PortConfig, PortStats, lcore};

use crate::config::{Hugepages, PollMode, StackConfig, lcore_ids, mac_from_device};
use crate::control_plane::Stack;
use crate::control_plane::xdp::XdpPort;
use crate::error::{Error, Result};
use crate::iface::Interface;
use crate::ip_id::IpIdGen;
use crate::lookup::SocketTable;
use crate::neigh::NeighTable;
use crate::route::Routes;
use crate::shared::{Lanes, LcoreLoad, Lifecycle, Shared, Steering, WorkerQueues};
use crate::stats::{Counters, StatsRegistry};
use crate::time::Clock;
use crate::wire::MacAddr;

mod af_xdp;
mod budget;
mod capture;
pub mod control;
mod live;
mod metrics;
mod ports;
pub(crate) mod run;
mod tunnels;

pub use run::Running;

/// Drivers besides PCI devices' that keep a sent mbuf until they reuse its
/// descriptor; the other virtual ones copy the frame (tap, af_packet, pcap,
/// vhost) or pass it on (ring) and keep none.
const KEEPS_SENT: &[&str] = &["net_virtio", "net_virtio_user"];

/// Packets an application thread may queue for one lcore.
const INBOX: usize = 8192;

/// An EAL the stack started itself: kept until the process ends, because
/// mbufs an application still holds point into its memory.
static STACK_EAL: OnceLock<Eal> = OnceLock::new();
static NEXT_STACK: AtomicU64 = AtomicU64::new(1);

/// Where the keyed hashes' secrets come from: the OS, or a seed
/// (`StackConfig::hash_seed`) stretched with splitmix64.
struct Secrets(Option<u64>);

impl Secrets {
    fn new(seed: Option<u64>) -> Secrets {
        Secrets(seed)
    }

    fn next(&mut self) -> u64 {
        match &mut self.0 {
            None => os_random(),
            Some(state) => {
                *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = *state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                (z ^ (z >> 31)) | 1
            }
        }
    }
}

fn os_random() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_ok() {
        return u64::from_ne_bytes(b) | 1;
    }
    let t =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
    t ^ (std::process::id() as u64) << 32 | 1
}

/// Starts one of spate's service threads (the control and metrics
/// endpoints) with every signal blocked: the program's signals stay the
/// program's threads'.
fn service_thread(name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<std::thread::JoinHandle<()>> {
    let _blocked = spate_dpdk::signal::block_all();
    std::thread::Builder::new().name(name.into()).spawn(f)
}

impl Stack {
    /// Builds a stack: starts the EAL if it does not run yet, opens or
    /// creates the ports, configures and starts them.
    pub fn new(cfg: StackConfig) -> Result<Stack> {
        cfg.validate()?;
        let lcores = lcore_ids(&cfg.lcores)?;
        if !Eal::is_running() {
            // The calling thread becomes the EAL's main lcore. When lcore 0
            // does not poll, it is that main lcore and the thread gets its
            // CPUs back afterwards, so the application's threads run where
            // they ran while the stack polls on workers.
            let main_polls = lcores.contains(&0);
            let cpus_before = lcore::current_cpus();
            let eal_lcores = if main_polls { cfg.lcores.clone() } else { format!("0,{}", cfg.lcores) };
            let mut b = EalBuilder::new()
                .program("spate")
                .lcores(&eal_lcores)
                .main_lcore(0)
                .memory(match cfg.hugepages {
                    Hugepages::Auto => Memory::Auto,
                    Hugepages::On => Memory::Hugepages,
                    Hugepages::Off => Memory::NoHuge,
                })
                .memory_mb(cfg.memory_mb)
                .args(cfg.eal_args.iter().cloned());
            for p in cfg.ports.iter().filter(|p| p.is_pci()) {
                b = b.pci(p.device.split(',').next().unwrap_or(""));
            }
            let eal = b.init()?;
            let _ = STACK_EAL.set(eal);
            if !main_polls {
                let restored = match &cpus_before {
                    Some(cpus) => lcore::set_affinity(cpus),
                    None => lcore::unpin_current_thread(),
                };
                if let Err(e) = restored {
                    log::warn!("cannot give the main thread its CPUs back: {e}");
                }
            }
        } else if cfg.lcores.contains('@') {
            log::warn!("spate: the EAL runs already: the CPU sets of lcores {:?} are not applied", cfg.lcores);
        }
        let enabled = lcore::all();
        if let Some(l) = lcores.iter().find(|l| !enabled.contains(l)) {
            return Err(Error::Config(format!("lcore {l} is not enabled in the EAL (enabled: {enabled:?})")));
        }
        let workers = lcores.len();
        // A port's own mode, else the stack's.
        let port_polls: Vec<PollMode> = cfg.ports.iter().map(|p| p.poll.unwrap_or(cfg.poll)).collect();
        let adaptive = cfg.poll == PollMode::Adaptive || port_polls.contains(&PollMode::Adaptive);
        // Adaptive polling: each lcore's bell, rung when it is given work.
        let bells = match adaptive {
            true => {
                (0..workers).map(|_| spate_dpdk::Bell::new().map(Arc::new)).collect::<spate_dpdk::Result<Vec<_>>>()?
            }
            false => Vec::new(),
        };
        let id = NEXT_STACK.fetch_add(1, Ordering::Relaxed);
        let mut pool_cfg = MempoolConfig::new(&format!("spate{}_{id}", std::process::id() % 100_000), cfg.mempool_size);
        pool_cfg.cache_size = cfg.mempool_cache.min(cfg.mempool_size / 2);
        pool_cfg.order = match cfg.mempool_order {
            crate::config::MempoolOrder::Lifo => spate_dpdk::PoolOrder::Lifo,
            crate::config::MempoolOrder::Fifo => spate_dpdk::PoolOrder::Fifo,
        };
        let pool = Arc::new(Mempool::new(&pool_cfg)?);

        let mut ports = Vec::new();
        let mut ifaces = Vec::new();
        // How each port not configured promiscuous starts hearing groups.
        let mut device_filters = Vec::new();
        let mut queues: Vec<WorkerQueues> =
            (0..workers).map(|_| WorkerQueues { rx: Vec::new(), tx: Vec::new(), steer: None }).collect();
        let (mut port_iface, mut steered, mut tx_queues) = (Vec::new(), Vec::new(), Vec::new());
        let mut tx_rings = 0;
        // A vhost-user peer that goes away (OVS restarting) makes the next
        // write to its socket raise SIGPIPE, which would end the process
        // (the C API leaves the program's disposition alone).
        if cfg.ignore_sigpipe {
            spate_dpdk::signal::ignore_sigpipe();
        }
        // Drivers' threads (vhost-user's, the TAP's) are made with every
        // signal blocked, and a SIGPIPE raised here is taken.
        let blocked = spate_dpdk::signal::block_all();
        let mut xdp_ports = Vec::new();
        for (index, spec) in cfg.ports.iter().enumerate() {
            ports::remove_stale_vhost_socket(&spec.device);
            let af_xdp = af_xdp::prepare(spec, index)?;
            let mut port = if spec.is_pci() {
                Port::open(spec.device.split(',').next().unwrap_or(""))?
            } else {
                match Port::open(&spec.device) {
                    Ok(p) => p,
                    Err(_) => Port::create(af_xdp.as_ref().map_or(&spec.device, |p| &p.device))?,
                }
            };
            let info = port.info().clone();
            let plan = ports::plan_port(cfg.rss, workers, &info, &spec.device)?;
            let pc = PortConfig {
                rx_interrupts: port_polls[index] == PollMode::Adaptive,
                rx_queues: plan.rx_queues,
                tx_queues: plan.tx_queues,
                rss: plan.rss,
                rx_desc: cfg.rx_desc,
                tx_desc: cfg.tx_desc,
                mtu: spec.mtu,
                rx_checksum: spec.rx_checksum_offload,
                tx_checksum: spec.tx_checksum_offload,
                promiscuous: spec.promiscuous,
                ..PortConfig::default()
            };
            if let Err(e) = port.configure(&pc, pool.clone()) {
                if !pc.rx_interrupts {
                    return Err(e.into());
                }
                // A device may refuse RX interrupts outright: it naps then.
                log::info!("{e}: configured again without RX interrupts");
                let pc = PortConfig { rx_interrupts: false, ..pc.clone() };
                port.configure(&pc, pool.clone())?;
            }
            let loaded = match af_xdp {
                Some(prepared) => prepared.loaded()?,
                None => None,
            };
            let report_refresh_ns = if loaded.is_some() { cfg.mcast_refresh_secs as u64 * 1_000_000_000 } else { 0 };
            xdp_ports.push(loaded);
            let mut soft_mac = None;
            if let Some(mac) = spec.mac
                && let Err(e) = port.set_mac(mac.0)
            {
                // The port runs promiscuous: spate filters and writes
                // the configured MAC itself.
                log::info!("{e}: spate uses {mac} in software");
                soft_mac = Some(mac);
            }
            port.start()?;
            let mut filter = crate::control_plane::filters::DeviceFilter::List;
            if soft_mac.is_some() && !spec.promiscuous {
                log::info!("{}: promiscuous after all, to hear the MAC spate uses in software", port.name());
                port.set_promiscuous(true)?;
                filter = crate::control_plane::filters::DeviceFilter::Promiscuous;
            }
            device_filters.push(filter);
            let mac = soft_mac.unwrap_or(MacAddr(port.mac()?));
            let mac = if mac == MacAddr::ZERO { mac_from_device(&spec.device).unwrap_or(mac) } else { mac };
            let mtu = port.mtu().unwrap_or(1500).min(spec.mtu.unwrap_or(u16::MAX));
            let mut ifc = Interface::new(
                index as u16,
                port.id(),
                port.name().to_string(),
                mac,
                mtu,
                spec.vlan,
                &spec.ipv4,
                &spec.ipv6,
            );
            (ifc.rx_checksum, ifc.tx_checksum) = (port.rx_checksum(), port.tx_checksum());
            ifc.partial_checksums = ports::hands_over_as_sent(&info.driver, &spec.device);
            ifc.report_refresh_ns = report_refresh_ns;
            ifaces.push(ifc);
            for (w, q) in queues.iter_mut().enumerate() {
                if w < plan.rx_queues as usize {
                    q.rx.push((index as u16, port.rx_queue(w as u16)?));
                }
                q.tx.push(if w < plan.tx_queues as usize { Some(port.tx_queue(w as u16)?) } else { None });
            }
            let pid = port.id() as usize;
            if port_iface.len() <= pid {
                port_iface.resize(pid + 1, 0);
            }
            port_iface[pid] = index as u16;
            steered.push(plan.steered);
            tx_queues.push(plan.tx_queues as usize);
            if spec.is_pci() || KEEPS_SENT.contains(&info.driver.as_str()) {
                tx_rings += plan.tx_queues as usize * cfg.tx_desc as usize;
            }
            log::info!(
                "spate: interface {index} on port {} ({}): {}; MAC {mac}, MTU {mtu}, {}",
                port.name(),
                info.driver,
                plan.describe(workers),
                ifaces[index]
                    .ipv4
                    .iter()
                    .chain(&ifaces[index].ipv6)
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            if ifaces[index].partial_checksums {
                log::info!(
                    "spate: interface {index} ({}): the kernel hands its frames over as they were sent; a UDP \
                     checksum a sender on this host left to an offload (a veth peer with TX checksum offload on) \
                     is accepted unverified in a packet of at most the MTU, as the kernel accepts it, and counted \
                     in Csum.Partial",
                    info.driver
                );
            }
            if let Some(limit) = ports::af_packet_ipv4_limit(&info.driver, &spec.device) {
                log::warn!(
                    "spate: interface {index} (net_af_packet): the kernel reassembles IPv4 fragments before the \
                     PMD's ring (DPDK 22.11 joins a defragmenting fanout group), so an IPv4 datagram that arrives \
                     in fragments reaches spate only up to {limit} bytes of IP packet ({} of UDP payload): longer ones are \
                     truncated by the ring's frames (`framesz=`, at most the mbufs' data room) and counted in \
                     Rx.Ipv4Truncated. IPv6 fragments arrive as sent and spate reassembles them; net_pcap, \
                     net_tap and net_af_xdp deliver IPv4 fragments as sent too",
                    limit.saturating_sub(28)
                );
            }
            ports.push(port);
        }
        drop(blocked);
        let budget = budget::plan(
            &cfg,
            &budget::Pool {
                size: pool.size() as usize,
                truesize: crate::datagram::truesize_of(pool.buf_len() as usize),
                frag_charge: pool.buf_len() as usize,
                lcores: workers,
                cache: pool_cfg.cache_size as usize,
                // The receive burst, the burst staged for the callback
                // (both while a second one arrives) and the transmit burst.
                bursts: 3 * crate::shared::BURST + crate::shared::GROUP_COPIES,
                // What the PMDs put on their RX rings when they started.
                rx_rings: pool.in_use() as usize,
                tx_rings,
            },
        )?;
        log::info!("spate: mbuf budget: {budget}");
        let mut secrets = Secrets::new(cfg.hash_seed);
        let outer_routes = Routes::new(&ifaces, &cfg.gateways);
        for spec in &cfg.vxlan {
            ifaces.push(tunnels::inner_interface(spec, ifaces.len() as u16, &ifaces, &outer_routes)?);
        }
        let routes = Routes::new(&ifaces, &cfg.gateways);
        if workers > 1 {
            let keys = [secrets.next(), secrets.next(), secrets.next(), secrets.next(), secrets.next()];
            let hash = crate::rss::FlowHash::new(keys);
            let meshes = (Lanes::mesh(workers)?, Lanes::mesh(workers)?, Lanes::mesh(workers)?);
            let (mut frames, mut datagrams, mut tx) = meshes;
            for (w, q) in queues.iter_mut().enumerate().rev() {
                q.steer = Some(Steering {
                    hash: hash.clone(),
                    reta: crate::rss::Reta::round_robin(workers),
                    frames: frames.pop().expect("one per lcore"),
                    datagrams: datagrams.pop().expect("one per lcore"),
                    tx: tx.pop().expect("one per lcore"),
                });
                debug_assert_eq!(frames.len(), w);
            }
        }
        let flow_owners = steered.contains(&crate::shared::PortSteering::Fragments).then(|| {
            let keys = [secrets.next(), secrets.next(), secrets.next(), secrets.next(), secrets.next()];
            crate::shared::flow_owners::FlowOwners::new(crate::rss::FlowHash::new(keys))
        });
        // An lcore sleeps when every port it polls is adaptive; one without
        // RX queues (it serves steered flows and hand-offs) when every port
        // is.
        let all_adaptive = match port_polls.is_empty() {
            true => cfg.poll == PollMode::Adaptive,
            false => port_polls.iter().all(|p| *p == PollMode::Adaptive),
        };
        let sleeps = queues
            .iter()
            .map(|q| match q.rx.is_empty() {
                true => all_adaptive,
                false => q.rx.iter().all(|(iface, _)| port_polls[*iface as usize] == PollMode::Adaptive),
            })
            .collect();
        let shared = Shared {
            id,
            neigh: NeighTable::new(crate::config::NeighborConfig {
                pending_total: Some(budget.pending_total),
                ..cfg.neighbor.clone()
            }),
            sockets: SocketTable::new([secrets.next(), secrets.next(), secrets.next(), secrets.next()]),
            ip_id: IpIdGen::new([secrets.next(), secrets.next()]),
            stats: StatsRegistry::new(workers),
            load: (0..workers).map(|_| CachePadded::new(LcoreLoad::default())).collect(),
            inbox: (0..workers).map(|_| CachePadded::new(crate::shared::inbox::Inbox::new(INBOX))).collect(),
            adaptive,
            sleeps,
            doorbells: (0..workers).map(|_| CachePadded::new(crate::shared::doorbell::Doorbell::new())).collect(),
            bells,
            workers,
            lcores,
            clock: Clock::new(),
            next_socket_id: AtomicU64::new(1),
            next_tx_worker: AtomicUsize::new(0),
            gro_users: CachePadded::new(AtomicUsize::new(0)),
            stamp_users: CachePadded::new(AtomicUsize::new(0)),
            rcv_mem: Arc::new(crate::rx_queue::MemCap::new(budget.udp_mem_bytes, cfg.udp_rmem_min)),
            pmtu: crate::frag::pmtu::PathMtu::new(
                std::time::Duration::from_secs(cfg.pmtu_expiry_secs),
                cfg.pmtu_max_entries,
            ),
            port_iface,
            steered,
            flow_owners,
            tx_queues,
            lifecycle: Lifecycle::new(queues),
            rng: Mutex::new(secrets.next()),
            ports,
            net: Mutex::new(Arc::new(crate::shared::Net { ifaces: ifaces.clone(), routes, mcast: Default::default() })),
            net_gen: CachePadded::new(AtomicU64::new(0)),
            changes: CachePadded::new(AtomicU64::new(0)),
            links: ifaces,
            announce: Mutex::new(Vec::new()),
            announce_pending: std::sync::atomic::AtomicBool::new(false),
            capture: Default::default(),
            mcast_reports: Default::default(),
            mcast_pending: std::sync::atomic::AtomicBool::new(false),
            cfg,
            budget,
            pool,
        };
        for (index, spec) in shared.cfg.ports.iter().enumerate() {
            for n in &spec.neighbors {
                shared.neigh.add_permanent((index as u16, n.ip), n.mac);
            }
        }
        // Broadcast addresses are neighbours at the broadcast MAC, for good
        // (Linux's NUD_NOARP entries): a send there asks nobody.
        for iface in shared.links.iter().filter(|i| !i.ipv4.is_empty()) {
            shared.add_broadcast_neighbors(iface.index, &iface.ipv4_broadcast);
        }
        let stack = Stack::from_parts(shared, device_filters);
        *stack.control.xdp.lock().unwrap_or_else(|p| p.into_inner()) = xdp_ports
            .into_iter()
            .map(|p| {
                p.map(|l| XdpPort {
                    maps: l.maps,
                    installed: Default::default(),
                    kernel: l.kernel,
                    warned: Default::default(),
                })
            })
            .collect();
        for iface in 0..stack.shared.ports.len() as u16 {
            stack.sync_multicast_filter(iface);
            stack
                .sync_xdp(iface)
                .map_err(|e| Error::Config(format!("interface {iface}: filling its XDP program's maps: {e}")))?;
        }
        tunnels::register_endpoints(&stack.shared)?;
        control::open(&stack)?;
        metrics::open(&stack)?;
        Ok(stack)
    }

    /// Builds a stack from a TOML file.
    pub fn from_file(path: &std::path::Path) -> Result<Stack> {
        Self::new(StackConfig::from_file(path)?)
    }

    /// The interfaces, with their addresses now.
    pub fn interfaces(&self) -> Vec<Interface> {
        self.shared.net().ifaces.clone()
    }

    /// The polling lcores' ids.
    pub fn lcores(&self) -> &[u32] {
        &self.shared.lcores
    }

    /// All counters, summed over lcores.
    pub fn counters(&self) -> Counters {
        self.shared.stats.snapshot()
    }

    /// Counters of polling lcore `index`.
    pub fn lcore_counters(&self, index: usize) -> Counters {
        self.shared.stats.lcore_snapshot(index)
    }

    /// (busy TSC cycles, loop iterations) of polling lcore `index`.
    pub fn lcore_load(&self, index: usize) -> (u64, u64) {
        let l = &self.shared.load[index];
        (l.busy_cycles.load(Ordering::Relaxed), l.loops.load(Ordering::Relaxed))
    }

    /// TSC cycles polling lcore `index` spent steering the bursts of
    /// steered ports (`rss = "sw"` or `"device"`), inside its busy cycles.
    pub fn lcore_steer_cycles(&self, index: usize) -> u64 {
        self.shared.load[index].steer_cycles.load(Ordering::Relaxed)
    }

    /// Bytes of fragments the lcores hold for reassembly (both families).
    pub fn reassembly_bytes(&self) -> u64 {
        self.shared.load.iter().map(|l| l.reasm_bytes.load(Ordering::Relaxed)).sum()
    }

    /// The most bytes of fragments one lcore has held at once.
    pub fn reassembly_peak_bytes(&self) -> u64 {
        self.shared.load.iter().map(|l| l.reasm_peak.load(Ordering::Relaxed)).max().unwrap_or(0)
    }

    /// The path MTU learnt for `dst` (from ICMP), if any is current.
    pub fn path_mtu(&self, dst: &IpAddr) -> Option<u16> {
        self.shared.pmtu.get(dst)
    }

    /// TSC ticks per second.
    pub fn tsc_hz(&self) -> u64 {
        self.shared.clock.hz()
    }

    /// How interface `iface`'s port hears the multicast groups it is in:
    /// `None` while it runs promiscuous (spate's software filter), else
    /// its device's multicast list, all-multicast or promiscuous mode, as
    /// far as the device went (see `promiscuous` in the configuration).
    pub fn multicast_filter(&self, iface: u16) -> Option<crate::control_plane::filters::DeviceFilter> {
        self.device_filter(iface)
    }

    /// Each port's name and counters.
    pub fn port_stats(&self) -> Vec<(String, PortStats)> {
        self.shared.ports.iter().map(|p| (p.name().to_string(), p.stats().unwrap_or_default())).collect()
    }

    /// The packet pool (for leak checks: its in-use count).
    pub fn mempool(&self) -> &Arc<Mempool> {
        &self.shared.pool
    }

    /// What a datagram in one mbuf is charged against a receive buffer:
    /// the mbuf's whole buffer and the datagram's own bytes, as Linux
    /// charges an skb's truesize. A receive buffer of `n` times this holds
    /// `n` such datagrams.
    pub fn datagram_truesize(&self) -> usize {
        crate::datagram::truesize_of(self.shared.pool.buf_len() as usize)
    }

    /// Destinations whose path MTU the stack keeps (at most
    /// `pmtu_max_entries`).
    pub fn path_mtu_entries(&self) -> usize {
        self.shared.pmtu.len()
    }

    /// Bytes the sockets' receive queues hold together, and the cap on
    /// them (`udp_mem_bytes`).
    pub fn receive_memory(&self) -> (usize, usize) {
        (self.shared.rcv_mem.held(), self.shared.rcv_mem.limit())
    }

    /// Where the pool's mbufs go when every bound is full (worked out when
    /// the stack started, and logged).
    pub fn mbuf_budget(&self) -> &crate::config::MbufBudget {
        &self.shared.budget
    }

    /// Neighbour entries known.
    pub fn neighbors(&self) -> usize {
        self.shared.neigh.len()
    }

    /// Packets waiting for their neighbours' addresses (at most
    /// `neighbor.pending_total`).
    pub fn neighbor_waiting(&self) -> usize {
        self.shared.neigh.waiting()
    }

    /// Tells polling lcore `index` (0-based, as [`LcoreCtx::index`]) that
    /// work waits for its callback: a task woken, a message queued for it.
    /// Its next iteration counts as busy, so it runs the callback again
    /// before any sleep; one on adaptive polling that is asleep or going
    /// to sleep is woken (a fence and a load when it is not). From any
    /// thread, the lcore's own included. An index past the lcores is
    /// ignored.
    ///
    /// [`LcoreCtx::index`]: crate::LcoreCtx::index
    pub fn wake_lcore(&self, index: usize) {
        if let Some(bell) = self.shared.doorbells.get(index) {
            bell.note_app_work();
            self.shared.wake(index);
        }
    }

    /// Asks the lcores to stop. The stack is down from then on until it
    /// runs again: its sockets' calls fail with `ENETDOWN`, and threads
    /// blocked in them wake with it (at once when it does not run).
    pub fn stop(&self) {
        self.shared.request_stop();
        self.shared.down_if_idle();
    }

    /// Whether lcores are polling.
    pub fn is_running(&self) -> bool {
        self.shared.is_running()
    }

    /// Whether the stack is down: it ran and stopped, and has not run
    /// since (its sockets' calls fail with `ENETDOWN`). A stack not yet
    /// run is not.
    pub fn is_down(&self) -> bool {
        self.shared.is_down()
    }

    /// Closes the control and metrics endpoints now, as the stack's drop
    /// does: their threads stop and the control socket's file goes. For a
    /// stack that will not be dropped (libspate's, which lives as long
    /// as the process); the datapath is untouched. A second call does
    /// nothing.
    pub fn close_endpoints(&self) {
        if let Some(e) = self.control.endpoint.get() {
            e.close();
        }
        if let Some(e) = self.control.metrics.get() {
            e.close();
        }
    }
}

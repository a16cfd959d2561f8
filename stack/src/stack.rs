//! The stack: ports, addresses, tables and the polling lcores, built from
//! a [`StackConfig`].

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crossbeam::queue::ArrayQueue;
use crossbeam_utils::CachePadded;
use spate_dpdk::{Eal, EalBuilder, Memory, Mempool, MempoolConfig, Port, PortConfig, PortStats, lcore};

use crate::config::{Hugepages, StackConfig, mac_from_device, parse_lcores};
use crate::error::{Error, Result};
use crate::iface::Interface;
use crate::ip_id::IpIdGen;
use crate::lookup::SocketTable;
use crate::neigh::NeighTable;
use crate::pipeline::steer::{Lanes, Steering};
use crate::pipeline::tx::TxPacket;
use crate::route::{Route, Routes};
use crate::socket::SocketCore;
use crate::stats::{Counters, StatsRegistry};
use crate::time::Clock;
use crate::wire::MacAddr;
use crate::worker::{LcoreCtx, LcoreLoad, Worker, WorkerQueues};

/// Packets an application thread may queue for one lcore.
const INBOX: usize = 8192;

/// An EAL the stack started itself: kept until the process ends, because
/// mbufs an application still holds point into its memory.
static STACK_EAL: OnceLock<Eal> = OnceLock::new();
static NEXT_STACK: AtomicU64 = AtomicU64::new(1);

/// State shared by the lcores and the sockets.
#[derive(Debug)]
pub(crate) struct Shared {
    pub id: u64,
    pub cfg: StackConfig,
    pub ifaces: Vec<Interface>,
    pub routes: Routes,
    pub neigh: NeighTable<TxPacket>,
    pub sockets: SocketTable<Arc<SocketCore>>,
    pub ip_id: IpIdGen,
    pub stats: StatsRegistry,
    pub load: Box<[CachePadded<LcoreLoad>]>,
    pub inbox: Box<[CachePadded<ArrayQueue<TxPacket>>]>,
    pub workers: usize,
    pub lcores: Vec<u32>,
    pub clock: Clock,
    pub next_socket_id: AtomicU64,
    pub next_tx_worker: AtomicUsize,
    /// Sockets with UDP GRO on and registered tunnels: while zero, the
    /// lcores skip the GRO stage (one load per burst).
    pub gro_users: CachePadded<AtomicUsize>,
    /// Path MTUs learnt from ICMP.
    pub pmtu: crate::frag::pmtu::PathMtu,
    /// Per port id: its interface (ports are few; DPDK numbers them from 0).
    port_iface: Vec<u16>,
    /// Per interface: whether its frames are steered in software.
    steered: Vec<bool>,
    /// Per interface: its TX queues (lcore `i` uses queue `i % n`; only the
    /// first `n` lcores own one).
    tx_queues: Vec<usize>,
    stop: AtomicBool,
    running: AtomicBool,
    rng: Mutex<u64>,
    queues: Mutex<Vec<Option<WorkerQueues>>>,
    ports: Vec<Port>,
    // Last: queued packets above must go back to the pool first.
    pub pool: Arc<Mempool>,
}

/// A `net_virtio_user` port in server mode binds its `path`; a socket file
/// left there by an earlier run that nobody listens on any more would make
/// the bind fail ("Address already in use"): remove it.
fn remove_stale_vhost_socket(device: &str) {
    if !device.starts_with("net_virtio_user") {
        return;
    }
    let args: Vec<&str> = device.split(',').skip(1).collect();
    let server = args.contains(&"server=1");
    let Some(path) = args.iter().find_map(|a| a.strip_prefix("path=")) else { return };
    use std::os::unix::fs::FileTypeExt;
    let is_socket = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket());
    if server && is_socket {
        if let Err(e) = std::os::unix::net::UnixStream::connect(path) {
            if e.kind() == std::io::ErrorKind::ConnectionRefused {
                log::info!("spate: removing the stale vhost-user socket {path} (nobody listens on it)");
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

impl Shared {
    /// Logs ports whose link went down or came up since the last call
    /// (`seen`: the link-change counts last looked at).
    pub fn log_link_changes(&self, seen: &mut Vec<u64>) {
        seen.resize(self.ports.len(), 0);
        for (i, port) in self.ports.iter().enumerate() {
            let n = port.link_changes();
            if n != seen[i] {
                seen[i] = n;
                let up = port.link_up_by_interrupt();
                log::warn!("spate: port {} link {}", port.name(), if up { "up" } else { "down" });
            }
        }
    }

    /// The interface of a port id.
    #[inline]
    pub fn iface_of_port(&self, port: u16) -> u16 {
        self.port_iface.get(port as usize).copied().unwrap_or(0)
    }

    /// Whether the interface's frames are steered in software.
    #[inline]
    pub fn iface_steered(&self, iface: u16) -> bool {
        self.steered.get(iface as usize).copied().unwrap_or(false)
    }

    /// Whether the port's frames are steered in software.
    #[inline]
    pub fn port_steered(&self, port: u16) -> bool {
        self.iface_steered(self.iface_of_port(port))
    }

    /// The lcore that transmits for lcore `idx` on interface `iface`.
    #[inline]
    pub fn tx_owner(&self, iface: usize, idx: usize) -> usize {
        idx % self.tx_queues.get(iface).copied().unwrap_or(1).max(1)
    }

    /// Whether `ip` is one of our addresses.
    pub fn is_local(&self, ip: &IpAddr) -> bool {
        self.ifaces.iter().any(|i| match ip {
            IpAddr::V4(a) => i.has_ipv4(*a),
            IpAddr::V6(a) => i.has_ipv6(a),
        })
    }

    /// The route to `dst`.
    #[inline]
    pub fn route(&self, dst: &IpAddr, src: Option<&IpAddr>) -> Option<Route> {
        let mut r = self.routes.lookup(&self.ifaces, dst, src)?;
        if let Some(mtu) = self.pmtu.get(dst) {
            r.mtu = r.mtu.min(mtu);
        }
        Some(r)
    }

    /// Whether the lcores should stop.
    #[inline]
    pub fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || (self.cfg.stop_on_signal && spate_dpdk::signal::stop_requested())
    }

    /// Whether lcores are polling.
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// A random number (xorshift over a seed from the OS, or from
    /// `StackConfig::hash_seed`).
    pub fn random_u32(&self) -> u32 {
        let mut s = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        (*s >> 16) as u32
    }
}

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

/// A UDP/IP stack on DPDK ports. Cheap to clone (a handle).
#[derive(Debug, Clone)]
pub struct Stack {
    pub(crate) shared: Arc<Shared>,
}

/// A stack polling on worker lcores in the background (from [`Stack::spawn`]).
#[derive(Debug)]
pub struct Running {
    stack: Stack,
    joins: Vec<lcore::LcoreJoin>,
}

impl Running {
    /// Stops the lcores and waits for them.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stack.shared.stop.store(true, Ordering::SeqCst);
        for j in self.joins.drain(..) {
            j.join();
        }
        self.stack.shared.running.store(false, Ordering::Release);
    }

    /// The stack.
    pub fn stack(&self) -> &Stack {
        &self.stack
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.halt();
    }
}

impl Stack {
    /// Builds a stack: starts the EAL if it does not run yet, opens or
    /// creates the ports, configures and starts them.
    pub fn new(cfg: StackConfig) -> Result<Stack> {
        cfg.validate()?;
        let lcores = parse_lcores(&cfg.lcores)?;
        if !Eal::is_running() {
            // The calling thread becomes the EAL's main lcore. When lcore 0
            // does not poll, it is that main lcore and the thread is unpinned
            // afterwards, so the application's threads are free to run
            // anywhere while the stack polls on workers.
            let main_polls = lcores.contains(&0);
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
                if let Err(e) = lcore::unpin_current_thread() {
                    log::warn!("cannot unpin the main thread: {e}");
                }
            }
        }
        let enabled = lcore::all();
        if let Some(l) = lcores.iter().find(|l| !enabled.contains(l)) {
            return Err(Error::Config(format!("lcore {l} is not enabled in the EAL (enabled: {enabled:?})")));
        }
        let workers = lcores.len();
        let id = NEXT_STACK.fetch_add(1, Ordering::Relaxed);
        let mut pool_cfg = MempoolConfig::new(&format!("spate{}_{id}", std::process::id() % 100_000), cfg.mempool_size);
        pool_cfg.cache_size = cfg.mempool_cache.min(cfg.mempool_size / 2);
        let pool = Arc::new(Mempool::new(&pool_cfg)?);

        let mut ports = Vec::new();
        let mut ifaces = Vec::new();
        let mut queues: Vec<WorkerQueues> =
            (0..workers).map(|_| WorkerQueues { rx: Vec::new(), tx: Vec::new(), steer: None }).collect();
        let (mut port_iface, mut steered, mut tx_queues) = (Vec::new(), Vec::new(), Vec::new());
        // A vhost-user peer that goes away (OVS restarting) makes the next
        // write to its socket raise SIGPIPE, which would end the process.
        spate_dpdk::signal::ignore_sigpipe();
        for (index, spec) in cfg.ports.iter().enumerate() {
            remove_stale_vhost_socket(&spec.device);
            let mut port = if spec.is_pci() {
                Port::open(spec.device.split(',').next().unwrap_or(""))?
            } else {
                match Port::open(&spec.device) {
                    Ok(p) => p,
                    Err(_) => Port::create(&spec.device)?,
                }
            };
            let info = port.info().clone();
            let plan = crate::pipeline::steer::plan_port(cfg.rss, workers, &info, &spec.device)?;
            let pc = PortConfig {
                rx_queues: plan.rx_queues,
                tx_queues: plan.tx_queues,
                rss: plan.rss,
                rx_desc: cfg.rx_desc,
                tx_desc: cfg.tx_desc,
                mtu: spec.mtu,
                rx_checksum: spec.rx_checksum_offload,
                tx_checksum: spec.tx_checksum_offload,
                ..PortConfig::default()
            };
            port.configure(&pc, pool.clone())?;
            let mut soft_mac = None;
            if let Some(mac) = spec.mac {
                if let Err(e) = port.set_mac(mac.0) {
                    // The port runs promiscuous: spate filters and writes
                    // the configured MAC itself.
                    log::info!("{e}: spate uses {mac} in software");
                    soft_mac = Some(mac);
                }
            }
            port.start()?;
            let mac = soft_mac.unwrap_or(MacAddr(port.mac()?));
            let mac = if mac == MacAddr::ZERO { mac_from_device(&spec.device).unwrap_or(mac) } else { mac };
            let mtu = port.mtu().unwrap_or(1500).min(spec.mtu.unwrap_or(u16::MAX));
            let rx_flags = port.rx_offloads();
            let tx_flags = port.tx_offloads();
            let rx_sum =
                (spate_dpdk::sys::RTE_ETH_RX_OFFLOAD_IPV4_CKSUM | spate_dpdk::sys::RTE_ETH_RX_OFFLOAD_UDP_CKSUM) as u64;
            let tx_sum =
                (spate_dpdk::sys::RTE_ETH_TX_OFFLOAD_IPV4_CKSUM | spate_dpdk::sys::RTE_ETH_TX_OFFLOAD_UDP_CKSUM) as u64;
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
            ifc.rx_checksum = rx_flags & rx_sum == rx_sum;
            ifc.tx_checksum = tx_flags & tx_sum == tx_sum;
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
            ports.push(port);
        }
        let mut secrets = Secrets::new(cfg.hash_seed);
        let outer_routes = Routes::new(&ifaces, &cfg.gateways);
        for spec in &cfg.vxlan {
            ifaces.push(crate::pipeline::vxlan::inner_interface(spec, ifaces.len() as u16, &ifaces, &outer_routes)?);
        }
        let routes = Routes::new(&ifaces, &cfg.gateways);
        if workers > 1 {
            let toeplitz = Arc::new(crate::rss::Toeplitz::new(&crate::rss::DEFAULT_KEY));
            let meshes = (Lanes::mesh(workers)?, Lanes::mesh(workers)?, Lanes::mesh(workers)?);
            let (mut frames, mut datagrams, mut tx) = meshes;
            for (w, q) in queues.iter_mut().enumerate().rev() {
                q.steer = Some(Steering {
                    toeplitz: toeplitz.clone(),
                    reta: crate::rss::Reta::round_robin(workers),
                    frames: frames.pop().expect("one per lcore"),
                    datagrams: datagrams.pop().expect("one per lcore"),
                    tx: tx.pop().expect("one per lcore"),
                });
                debug_assert_eq!(frames.len(), w);
            }
        }
        let shared = Shared {
            id,
            neigh: NeighTable::new(cfg.neighbor.clone()),
            sockets: SocketTable::new([secrets.next(), secrets.next(), secrets.next(), secrets.next()]),
            ip_id: IpIdGen::new([secrets.next(), secrets.next()]),
            stats: StatsRegistry::new(workers),
            load: (0..workers).map(|_| CachePadded::new(LcoreLoad::default())).collect(),
            inbox: (0..workers).map(|_| CachePadded::new(ArrayQueue::new(INBOX))).collect(),
            workers,
            lcores,
            clock: Clock::new(),
            next_socket_id: AtomicU64::new(1),
            next_tx_worker: AtomicUsize::new(0),
            gro_users: CachePadded::new(AtomicUsize::new(0)),
            pmtu: crate::frag::pmtu::PathMtu::new(std::time::Duration::from_secs(cfg.pmtu_expiry_secs)),
            port_iface,
            steered,
            tx_queues,
            stop: AtomicBool::new(false),
            running: AtomicBool::new(false),
            rng: Mutex::new(secrets.next()),
            queues: Mutex::new(queues.into_iter().map(Some).collect()),
            ports,
            routes,
            ifaces,
            cfg,
            pool,
        };
        crate::pipeline::vxlan::register_endpoints(&shared)?;
        Ok(Stack { shared: Arc::new(shared) })
    }

    /// Builds a stack from a TOML file.
    pub fn from_file(path: &std::path::Path) -> Result<Stack> {
        Self::new(StackConfig::from_file(path)?)
    }

    /// The interfaces.
    pub fn interfaces(&self) -> &[Interface] {
        &self.shared.ifaces
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

    /// Neighbour entries known.
    pub fn neighbors(&self) -> usize {
        self.shared.neigh.len()
    }

    /// Asks the lcores to stop.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }

    /// Whether lcores are polling.
    pub fn is_running(&self) -> bool {
        self.shared.is_running()
    }

    fn take_queues(&self) -> Result<Vec<WorkerQueues>> {
        let mut q = self.shared.queues.lock().unwrap_or_else(|p| p.into_inner());
        if q.iter().any(Option::is_none) || self.shared.running.swap(true, Ordering::AcqRel) {
            return Err(Error::State("the stack is already running".into()));
        }
        self.shared.stop.store(false, Ordering::SeqCst);
        Ok(q.iter_mut().map(|x| x.take().expect("checked")).collect())
    }

    fn give_back(&self, idx: usize, q: WorkerQueues) {
        self.shared.queues.lock().unwrap_or_else(|p| p.into_inner())[idx] = Some(q);
    }

    /// Polls on every lcore of the stack until [`stop`](Self::stop) or a
    /// signal. `app(index)` is called on each lcore to make its callback,
    /// which then runs once per loop iteration (run-to-completion). The
    /// calling thread must be the EAL main lcore if that is one of the
    /// stack's lcores; it polls as that lcore.
    pub fn run<F, H>(&self, app: F) -> Result<()>
    where
        F: Fn(usize) -> H + Send + Sync + 'static,
        H: FnMut(&mut LcoreCtx<'_>) + 'static,
    {
        let here = lcore::current();
        let main = lcore::main_lcore();
        if self.shared.lcores.contains(&main) && here != Some(main) {
            return Err(Error::State(format!(
                "lcore {main} is the EAL main lcore: call run() on the thread that started the EAL"
            )));
        }
        let app = Arc::new(app);
        let mut queues = self.take_queues()?;
        let mut joins = Vec::new();
        let mut local = None;
        for (idx, q) in queues.drain(..).enumerate() {
            let l = self.shared.lcores[idx];
            if Some(l) == here {
                local = Some((idx, l, q));
                continue;
            }
            match self.launch(idx, l, q, app.clone()) {
                Ok(j) => joins.push(j),
                Err(e) => {
                    self.stop();
                    for j in joins {
                        j.join();
                    }
                    self.shared.running.store(false, Ordering::Release);
                    return Err(e);
                }
            }
        }
        if let Some((idx, l, q)) = local {
            let mut w = Worker::new(idx, l, self, q);
            let mut h = app(idx);
            w.run(&mut h);
            self.give_back(idx, w.into_queues());
            // This lcore stopped (a signal, `stop`): the others follow.
            self.stop();
        }
        // Without a local lcore the calling thread waits here until the
        // lcores stop on their own (a signal, `stop` from another thread).
        for j in joins {
            j.join();
        }
        self.shared.running.store(false, Ordering::Release);
        Ok(())
    }

    /// Polls on the stack's lcores in the background (none of them may be
    /// the calling thread's); application threads use sockets meanwhile.
    pub fn spawn<F, H>(&self, app: F) -> Result<Running>
    where
        F: Fn(usize) -> H + Send + Sync + 'static,
        H: FnMut(&mut LcoreCtx<'_>) + 'static,
    {
        let here = lcore::current();
        if let Some(l) = self.shared.lcores.iter().find(|l| Some(**l) == here || **l == lcore::main_lcore()) {
            return Err(Error::State(format!("lcore {l} is the calling thread's or the EAL main lcore: use run()")));
        }
        let app = Arc::new(app);
        let mut queues = self.take_queues()?;
        let mut joins = Vec::new();
        for (idx, q) in queues.drain(..).enumerate() {
            match self.launch(idx, self.shared.lcores[idx], q, app.clone()) {
                Ok(j) => joins.push(j),
                Err(e) => {
                    drop(Running { stack: self.clone(), joins });
                    return Err(e);
                }
            }
        }
        Ok(Running { stack: self.clone(), joins })
    }

    /// Polls in the background with no application callback (thread mode).
    pub fn spawn_polling(&self) -> Result<Running> {
        self.spawn(|_| |_: &mut LcoreCtx<'_>| {})
    }

    fn launch<F, H>(&self, idx: usize, l: u32, q: WorkerQueues, app: Arc<F>) -> Result<lcore::LcoreJoin>
    where
        F: Fn(usize) -> H + Send + Sync + 'static,
        H: FnMut(&mut LcoreCtx<'_>) + 'static,
    {
        let stack = self.clone();
        let job = lcore::launch(l, move || {
            let mut w = Worker::new(idx, l, &stack, q);
            let mut h = app(idx);
            w.run(&mut h);
            let q = w.into_queues();
            stack.give_back(idx, q);
            0
        });
        job.map_err(Error::from)
    }
}

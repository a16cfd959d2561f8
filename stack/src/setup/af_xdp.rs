//! `net_af_xdp` ports that share their interface with the kernel: spate's
//! XDP program handed to the PMD (DPDK's default program takes every
//! frame, and the kernel stops answering on the interface), a program a
//! killed spate left attached detached first (the PMD attaches only where
//! none is), and the program's address maps found once it is loaded.

use std::net::IpAddr;
use std::os::fd::OwnedFd;

use spate_dpdk::xdp::{self, AddressMaps};

use crate::config::{PortSpec, devarg};
use crate::error::{Error, Result};

/// A `net_af_xdp` port about to be created.
#[derive(Debug)]
pub(super) struct Prepared {
    /// The device string the port is created with (`xdp_prog=` added).
    pub device: String,
    /// The program's file (an anonymous memory file), while the PMD may
    /// still load it; None for a port with a program of its own.
    program: Option<OwnedFd>,
    iface: String,
    if_index: u32,
}

/// What the control plane keeps of a port with spate's program.
#[derive(Debug)]
pub(super) struct Loaded {
    pub maps: AddressMaps,
    /// The kernel's own addresses on the interface at start.
    pub kernel: Vec<IpAddr>,
}

/// For a `net_af_xdp` port: the interface made ready (a stale spate
/// program detached) and the device string with spate's program; None for
/// other devices. A port given an `xdp_prog=` of its own keeps it, and
/// spate fills no maps for it.
pub(super) fn prepare(spec: &PortSpec, index: usize) -> Result<Option<Prepared>> {
    let device = spec.device.as_str();
    if !device.starts_with("net_af_xdp") {
        return Ok(None);
    }
    let fail = |what: String| Error::Config(format!("port {device}: {what}"));
    let Some(iface) = devarg(device, "iface") else {
        return Err(fail("net_af_xdp needs iface=INTERFACE".into()));
    };
    if spec.vlan.is_some() {
        // With the NIC's VLAN offload on (most have it on), XDP sees the
        // frames with their tag stripped, and the XDP socket does not
        // carry it: a tagged port would receive nothing.
        return Err(fail(format!(
            "a VLAN on net_af_xdp is not supported: give spate the kernel's VLAN interface instead (iface={iface}.VID)"
        )));
    }
    let if_index = xdp::if_index(iface).map_err(|e| fail(format!("interface {iface}: {e}")))?;
    let attached = xdp::attached_program(if_index).map_err(|e| fail(format!("the XDP program of {iface}: {e}")))?;
    if let Some(attached) = attached {
        let id = attached.id;
        let name = xdp::program_name(id).unwrap_or_else(|e| format!("name unknown: {e}"));
        if name != xdp::PROGRAM_NAME {
            return Err(fail(format!(
                "interface {iface} has an XDP program attached (id {id}, {name}) that is not spate's, and \
                 net_af_xdp attaches only where none is: detach it (`ip link set dev {iface} xdp off`) if nothing \
                 needs it"
            )));
        }
        // In use: XDP sockets are bound to the interface (sock_diag, this
        // network namespace), or, where the kernel cannot say, a process
        // holds the program.
        match xdp::sockets_on(if_index) {
            Ok(bound) if !bound.is_empty() => {
                let queues: Vec<String> = bound.iter().map(|(_, q)| q.to_string()).collect();
                return Err(fail(format!(
                    "interface {iface}'s XDP program (spate's, id {id}) serves XDP sockets bound to its queues {}: \
                     a spate runs on it already (in this process or another)",
                    queues.join(", ")
                )));
            }
            Ok(_) => {}
            Err(_) => {
                if let Some(pid) = xdp::program_holder(id) {
                    return Err(fail(format!(
                        "interface {iface}'s XDP program (spate's, id {id}) is held by process {pid}: a spate runs \
                         on it already"
                    )));
                }
            }
        }
        log::warn!(
            "spate: interface {iface} has spate's XDP program attached (id {id}) and nothing using it, left by a \
             spate that ended without closing its port (killed): detached"
        );
        xdp::detach_program(if_index, attached)
            .map_err(|e| fail(format!("detaching {iface}'s stale XDP program: {e}")))?;
    }
    warn_uncovered_queues(device, iface);
    let mut device = device.to_string();
    if devarg(&device, "busy_budget").is_none() && copy_mode(&device, iface) {
        // Without a zero-copy driver the fill ring never asks for a
        // wake-up, and the PMD's busy polling only adds a system call to
        // every empty receive.
        log::info!(
            "spate: interface {iface} moves frames by copy (no device of its own, or force_copy=1): \
             busy_budget=0, so an empty receive makes no system call"
        );
        device.push_str(",busy_budget=0");
    }
    if devarg(&device, "xdp_prog").is_some() {
        log::info!("spate: port {device} brings its own XDP program: spate keeps no address map in it");
        return Ok(Some(Prepared { device, program: None, iface: iface.to_string(), if_index }));
    }
    if xdp::PROGRAM.is_empty() {
        return Err(fail(
            "spate was built without its XDP program (no clang able to target BPF): install clang and rebuild \
             (cargo clean -p spate-dpdk), or give the port an xdp_prog= of its own"
                .into(),
        ));
    }
    let (program, path) = xdp::program_file().map_err(|e| fail(format!("the XDP program's file: {e}")))?;
    log::debug!("spate: port {index}: spate's XDP program at {path}");
    let device = format!("{device},xdp_prog={path}");
    Ok(Some(Prepared { device, program: Some(program), iface: iface.to_string(), if_index }))
}

/// Whether the port's XDP sockets will copy frames: `force_copy=1`, or an
/// interface with no device behind it (a veth, a bridge: drivers with no
/// zero-copy mode).
fn copy_mode(device: &str, iface: &str) -> bool {
    devarg(device, "force_copy") == Some("1")
        || !std::path::Path::new(&format!("/sys/class/net/{iface}/device")).exists()
}

/// Warns when the interface receives on more queues than the port's
/// sockets cover: a frame to spate on another queue goes to the kernel,
/// which drops it (no program can hand it to another queue's socket).
fn warn_uncovered_queues(device: &str, iface: &str) {
    let Ok(dir) = std::fs::read_dir(format!("/sys/class/net/{iface}/queues")) else { return };
    let rx = dir.flatten().filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("rx-"))).count();
    let first: usize = devarg(device, "start_queue").and_then(|v| v.parse().ok()).unwrap_or(0);
    let count: usize = devarg(device, "queue_count").and_then(|v| v.parse().ok()).unwrap_or(1).max(1);
    if rx > 0 && (first > 0 || first + count < rx) {
        log::warn!(
            "spate: interface {iface} receives on {rx} queues and port {device} covers queues {first} to {}: \
             frames to spate on the others reach the kernel, which drops them; give the port every queue \
             (queue_count={rx}) or the interface fewer (ethtool -L {iface} combined {count})",
            first + count - 1
        );
    }
}

impl Prepared {
    /// Once the port is configured (the PMD loaded and attached the
    /// program at its first queue's set-up): spate's program's address
    /// maps and the kernel's addresses on the interface.
    pub(super) fn loaded(self) -> Result<Option<Loaded>> {
        let fail = |what: String| Error::Config(format!("interface {}: {what}", self.iface));
        // With busy_budget=0 the PMD's receive waits in poll(2), up to a
        // second, whenever its fill ring asks for a wake-up: what a
        // zero-copy driver's idle queue does. The lcore would stall.
        if devarg(&self.device, "busy_budget") == Some("0")
            && xdp::own_sockets(self.if_index).into_iter().any(|fd| xdp::zero_copy(fd) == Some(true))
        {
            return Err(fail(
                "busy_budget=0 with a zero-copy XDP socket: an idle receive would wait up to a second in the PMD's \
                 poll(2), stalling the lcore's timers and sends; give the port busy_budget=64 (the PMD's default)"
                    .into(),
            ));
        }
        if self.program.is_none() {
            return Ok(None);
        }
        let attached = xdp::attached_program(self.if_index)
            .map_err(|e| fail(format!("its XDP program: {e}")))?
            .ok_or_else(|| fail("net_af_xdp attached no XDP program".into()))?;
        let maps =
            AddressMaps::of_program(attached.id).map_err(|e| fail(format!("XDP program {}: {e}", attached.id)))?;
        log::info!(
            "spate: interface {} (net_af_xdp): spate's XDP program (id {}) gives spate the frames to its \
             addresses and groups, ARP and neighbour solicitations for them; every other frame is the kernel's",
            self.iface,
            attached.id
        );
        Ok(Some(Loaded { maps, kernel: xdp::kernel_addresses(self.if_index) }))
    }
}

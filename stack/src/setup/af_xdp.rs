//! `net_af_xdp` ports that share their interface with the kernel: spate's
//! XDP program handed to the PMD (DPDK's default program takes every
//! frame, and the kernel stops answering on the interface), a program a
//! killed spate left attached detached first (the PMD attaches only where
//! none is), and the program's address maps found once it is loaded.

use std::path::PathBuf;

use spate_dpdk::xdp::{self, AddressMaps};

use crate::error::{Error, Result};

/// A `net_af_xdp` port about to be created.
#[derive(Debug)]
pub(super) struct Prepared {
    /// The device string the port is created with (`xdp_prog=` added).
    pub device: String,
    /// The program's object file spate wrote, removed once it is loaded.
    object: Option<PathBuf>,
    iface: String,
    if_index: u32,
}

/// A device argument's value.
fn devarg<'a>(device: &'a str, key: &str) -> Option<&'a str> {
    device.split(',').skip(1).find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// For a `net_af_xdp` device string: the interface made ready (a stale
/// spate program detached) and the device string with spate's program;
/// None for other devices. A port given an `xdp_prog=` of its own keeps
/// it, and spate fills no maps for it.
pub(super) fn prepare(device: &str, index: usize) -> Result<Option<Prepared>> {
    if !device.starts_with("net_af_xdp") {
        return Ok(None);
    }
    let Some(iface) = devarg(device, "iface") else {
        return Err(Error::Config(format!("port {device}: net_af_xdp needs iface=INTERFACE")));
    };
    let if_index = xdp::if_index(iface).map_err(|e| Error::Config(format!("port {device}: interface {iface}: {e}")))?;
    let attached = xdp::attached_program(if_index)
        .map_err(|e| Error::Config(format!("port {device}: the XDP program of {iface}: {e}")))?;
    if let Some(id) = attached {
        let name = xdp::program_name(id).unwrap_or_else(|e| format!("name unknown: {e}"));
        if name != xdp::PROGRAM_NAME {
            return Err(Error::Config(format!(
                "port {device}: interface {iface} has an XDP program attached (id {id}, {name}) that is not \
                 spate's, and net_af_xdp attaches only where none is: detach it (`ip link set dev {iface} xdp \
                 off`) if nothing needs it"
            )));
        }
        if let Some(pid) = xdp::program_holder(id) {
            return Err(Error::Config(format!(
                "port {device}: interface {iface}'s XDP program (spate's, id {id}) belongs to process {pid}, a \
                 running spate: one interface queue takes one AF_XDP socket"
            )));
        }
        log::warn!(
            "spate: interface {iface} has spate's XDP program attached (id {id}) with no process holding it, left \
             by a spate that ended without closing its port (killed): detached"
        );
        xdp::detach_program(if_index)
            .map_err(|e| Error::Config(format!("port {device}: detaching {iface}'s stale XDP program: {e}")))?;
    }
    if devarg(device, "xdp_prog").is_some() {
        log::info!("spate: port {device} brings its own XDP program: spate keeps no address map in it");
        return Ok(Some(Prepared { device: device.to_string(), object: None, iface: iface.to_string(), if_index }));
    }
    if xdp::PROGRAM.is_empty() {
        return Err(Error::Config(format!(
            "port {device}: spate was built without its XDP program (no clang able to target BPF: apt-get install \
             clang): give the port an xdp_prog= of its own, or rebuild spate"
        )));
    }
    let object = std::env::temp_dir().join(format!("spate-xdp-{}-{index}.o", std::process::id()));
    std::fs::write(&object, xdp::PROGRAM)
        .map_err(|e| Error::Config(format!("port {device}: writing the XDP program to {}: {e}", object.display())))?;
    let device = format!("{device},xdp_prog={}", object.display());
    Ok(Some(Prepared { device, object: Some(object), iface: iface.to_string(), if_index }))
}

impl Prepared {
    /// Once the port is configured (the PMD loaded and attached the
    /// program at its first queue's set-up): the object file removed, and
    /// spate's program's address maps.
    pub(super) fn loaded(self) -> Result<Option<(u32, AddressMaps)>> {
        // With busy_budget=0 the PMD's receive waits in poll(2), up to a
        // second, whenever its fill ring asks for a wake-up: what a
        // zero-copy driver's idle queue does. The lcore would stall.
        if devarg(&self.device, "busy_budget") == Some("0") {
            let zero_copy = spate_dpdk::sleep::xdp_sockets().into_iter().any(|fd| xdp::zero_copy(fd) == Some(true));
            if zero_copy {
                return Err(Error::Config(format!(
                    "interface {}: busy_budget=0 with a zero-copy XDP socket: an idle receive would wait up to a \
                     second in the PMD's poll(2), stalling the lcore's timers and sends; leave busy_budget at the \
                     PMD's default",
                    self.iface
                )));
            }
        }
        let Some(object) = &self.object else { return Ok(None) };
        let _ = std::fs::remove_file(object);
        let fail = |what: String| Error::Config(format!("interface {}: {what}", self.iface));
        let id = xdp::attached_program(self.if_index)
            .map_err(|e| fail(format!("its XDP program: {e}")))?
            .ok_or_else(|| fail("net_af_xdp attached no XDP program".into()))?;
        let maps = AddressMaps::of_program(id).map_err(|e| fail(format!("XDP program {id}: {e}")))?;
        log::info!(
            "spate: interface {} (net_af_xdp): spate's XDP program (id {id}) gives spate the frames to its \
             addresses and groups, ARP and neighbour solicitations for them; every other frame is the kernel's",
            self.iface
        );
        Ok(Some((self.if_index, maps)))
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if let Some(object) = &self.object {
            let _ = std::fs::remove_file(object);
        }
    }
}

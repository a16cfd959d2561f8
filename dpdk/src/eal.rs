//! The Environment Abstraction Layer: started once per process.
//!
//! [`EalBuilder`] turns spate's intent into EAL arguments and refuses
//! combinations DPDK would reject or that would be unsafe on a shared
//! machine: `--no-pci` is always added unless PCI devices are named, and the
//! memory mode is either hugepages (`--in-memory`, `--single-file-segments`)
//! or no hugepages (`--no-huge --no-shconf`), never both.

use std::ffi::{CStr, CString, c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::error::{Error, Result, rte_errno, strerror};
use crate::sys;

const IDLE: u8 = 0;
const STARTING: u8 = 1;
const RUNNING: u8 = 2;
const SHUT_DOWN: u8 = 3;
const FAILED: u8 = 4;

static STATE: AtomicU8 = AtomicU8::new(IDLE);
/// The running EAL, for what needs it to stay up (see [`EalRef`]).
static LIVE: Mutex<Weak<EalInner>> = Mutex::new(Weak::new());
const DEFAULT_MEMORY_MB: u32 = 256;
static PREFIX_SEQ: AtomicU32 = AtomicU32::new(0);

/// How the EAL gets its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Memory {
    /// Hugepages when the machine has free ones mounted, else no hugepages
    /// with a logged warning.
    #[default]
    Auto,
    /// Hugepages or an error (vhost-user pairs need them).
    Hugepages,
    /// Ordinary memory (`--no-huge --no-shconf`): enough for net_ring,
    /// net_null, net_tap, net_pcap and net_af_packet, not for vhost-user.
    NoHuge,
}

/// Builds the EAL argument list; [`EalBuilder::init`] starts the EAL.
#[derive(Debug, Clone)]
pub struct EalBuilder {
    program: String,
    lcores: Option<String>,
    main_lcore: Option<u32>,
    vdevs: Vec<String>,
    pci: Vec<String>,
    memory: Memory,
    memory_mb: Option<u32>,
    file_prefix: Option<String>,
    telemetry: bool,
    extra: Vec<String>,
}

impl Default for EalBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl EalBuilder {
    /// Defaults: lcores from DPDK's default (all), automatic memory mode,
    /// 256 MiB (`-m`), a unique file prefix, telemetry off.
    pub fn new() -> Self {
        EalBuilder {
            program: "spate".into(),
            lcores: None,
            main_lcore: None,
            vdevs: Vec::new(),
            pci: Vec::new(),
            memory: Memory::Auto,
            memory_mb: None,
            file_prefix: None,
            telemetry: false,
            extra: Vec::new(),
        }
    }

    /// The program name EAL prints in its messages.
    pub fn program(mut self, name: &str) -> Self {
        self.program = name.into();
        self
    }

    /// The lcores to run, in EAL's `-l` syntax (`0`, `0-1`, `0,2`), or in
    /// its `--lcores` syntax where an lcore runs on a set of CPUs
    /// (`0,1@(0-1)`).
    pub fn lcores(mut self, list: &str) -> Self {
        self.lcores = Some(list.into());
        self
    }

    /// Which of the lcores is the main one (the thread that calls init).
    pub fn main_lcore(mut self, lcore: u32) -> Self {
        self.main_lcore = Some(lcore);
        self
    }

    /// A virtual device such as `net_ring0` or `net_pcap0,iface=veth0`.
    pub fn vdev(mut self, spec: &str) -> Self {
        self.vdevs.push(spec.into());
        self
    }

    /// A PCI device to use (`0000:00:04.0`); naming one drops `--no-pci`.
    pub fn pci(mut self, addr: &str) -> Self {
        self.pci.push(addr.into());
        self
    }

    /// The memory mode.
    pub fn memory(mut self, memory: Memory) -> Self {
        self.memory = memory;
        self
    }

    /// Memory to reserve, in MiB (`-m`; 256 unless given).
    pub fn memory_mb(mut self, mb: u32) -> Self {
        self.memory_mb = Some(mb);
        self
    }

    /// The file prefix (unique per process; a default one is generated).
    pub fn file_prefix(mut self, prefix: &str) -> Self {
        self.file_prefix = Some(prefix.into());
        self
    }

    /// Keep DPDK's telemetry socket (off by default: it lives in the
    /// runtime folder spate removes).
    pub fn telemetry(mut self, on: bool) -> Self {
        self.telemetry = on;
        self
    }

    /// EAL arguments passed through unchanged, after spate's checks.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.extra.extend(args.into_iter().map(Into::into));
        self
    }

    /// The argument vector `init` would pass to `rte_eal_init`, with the
    /// memory mode resolved against what this machine offers.
    pub fn to_args(&self) -> Result<Vec<String>> {
        self.build_args(hugepages_available())
    }

    fn build_args(&self, huge_available: bool) -> Result<Vec<String>> {
        let has = |names: &[&str]| {
            self.extra
                .iter()
                .any(|a| names.iter().any(|n| a == n || (n.starts_with("--") && a.starts_with(&format!("{n}=")))))
        };
        let bad = |msg: String| Err(Error::InvalidEalArgs(msg));

        if self.lcores.is_some() && has(&["-l", "-c", "--lcores"]) {
            return bad("lcores are given twice: by spate's --lcores and by an EAL -l/-c/--lcores argument".into());
        }
        if self.main_lcore.is_some() && has(&["--main-lcore"]) {
            return bad("the main lcore is given twice".into());
        }
        if self.file_prefix.is_some() && has(&["--file-prefix"]) {
            return bad("the file prefix is given twice".into());
        }
        if self.memory_mb.is_some() && has(&["-m", "--socket-mem"]) {
            return bad("memory is given twice: by memory_mb and by an EAL -m/--socket-mem argument".into());
        }
        let extra_no_huge = has(&["--no-huge"]);
        let extra_in_memory = has(&["--in-memory"]);
        if extra_no_huge && extra_in_memory {
            return bad(
                "--no-huge and --in-memory cannot be combined (DPDK: --legacy-mem is not compatible with --in-memory)"
                    .into(),
            );
        }
        let memory = match (self.memory, extra_no_huge, extra_in_memory) {
            (Memory::Hugepages, true, _) => {
                return bad("hugepages were required but --no-huge was given".into());
            }
            (Memory::NoHuge, _, true) => {
                return bad("no-huge mode was chosen but --in-memory (a hugepage mode) was given".into());
            }
            (_, true, _) => Memory::NoHuge,
            (_, _, true) => Memory::Hugepages,
            (Memory::Auto, _, _) if huge_available => Memory::Hugepages,
            (Memory::Auto, _, _) => {
                log::warn!(
                    "no free hugepages are mounted: starting DPDK with --no-huge --no-shconf \
                     (enough for net_ring, net_null, net_tap, net_pcap, net_af_packet; \
                     vhost-user needs hugepages: run `cargo xtask setup` as root)"
                );
                Memory::NoHuge
            }
            (mode, _, _) => mode,
        };
        if memory == Memory::Hugepages && !huge_available && !extra_in_memory {
            return bad("hugepages were required but none are free and mounted (reserve them: echo 1024 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages and mount hugetlbfs)".into());
        }
        let names_pci = !self.pci.is_empty() || has(&["-a", "--allow", "-b", "--block", "--pci-whitelist", "-w"]);
        if !self.pci.is_empty() && has(&["--no-pci"]) {
            return bad("PCI devices are named but --no-pci was given".into());
        }

        let mut args = vec![self.program.clone()];
        if let Some(l) = &self.lcores {
            // CPU sets (`1@(0-1)`) are `--lcores` syntax.
            let flag = if l.contains(['@', '(']) { "--lcores" } else { "-l" };
            args.extend([flag.into(), l.clone()]);
        }
        if let Some(m) = self.main_lcore {
            args.extend(["--main-lcore".into(), m.to_string()]);
        }
        if !names_pci && !has(&["--no-pci"]) {
            args.push("--no-pci".into());
        }
        for addr in &self.pci {
            args.extend(["-a".into(), addr.clone()]);
        }
        for vdev in &self.vdevs {
            args.extend(["--vdev".into(), vdev.clone()]);
        }
        match memory {
            Memory::Hugepages if !extra_in_memory => {
                args.extend(["--in-memory".into(), "--single-file-segments".into()])
            }
            Memory::NoHuge if !extra_no_huge => args.extend(["--no-huge".into(), "--no-shconf".into()]),
            _ => {}
        }
        if !has(&["-m", "--socket-mem"]) {
            args.extend(["-m".into(), self.memory_mb.unwrap_or(DEFAULT_MEMORY_MB).to_string()]);
        }
        if !has(&["--file-prefix"]) {
            let prefix = self.file_prefix.clone().unwrap_or_else(|| {
                format!("spate-{}-{}", std::process::id(), PREFIX_SEQ.fetch_add(1, Ordering::Relaxed))
            });
            args.extend(["--file-prefix".into(), prefix]);
        }
        if !self.telemetry && !has(&["--no-telemetry", "--telemetry"]) {
            args.push("--no-telemetry".into());
        }
        args.extend(self.extra.iter().cloned());
        Ok(args)
    }

    /// Starts the EAL. Fails with [`Error::EalAlreadyStarted`] when it runs
    /// already, has been shut down, or failed to start in this process.
    /// Arguments spate refuses itself ([`Error::InvalidEalArgs`]) do not
    /// count as a start; arguments DPDK refuses do.
    pub fn init(self) -> Result<Eal> {
        let args = self.to_args()?;
        Eal::start(args)
    }
}

/// The running EAL. `rte_eal_cleanup` runs (and its runtime folder goes)
/// when the last of it goes: this handle, and every mempool, port, ring
/// and lcore job, each of which keeps the EAL alive while it lives (an
/// [`EalRef`] inside), so no safe code can clean the EAL up under them. It
/// is usually kept until the process ends.
#[derive(Debug)]
pub struct Eal {
    inner: Arc<EalInner>,
}

#[derive(Debug)]
struct EalInner {
    args: Vec<String>,
    runtime_dir: PathBuf,
    hugepages: bool,
}

/// A share in the running EAL's life, held by what needs it (mempools,
/// ports, rings, lcore jobs): the EAL is cleaned up after the last share
/// goes.
#[derive(Debug, Clone)]
pub struct EalRef(#[allow(dead_code)] Arc<EalInner>);

impl EalRef {
    /// A share of the running EAL; [`Error::EalNotRunning`] when none runs
    /// (never started, or being cleaned up).
    pub fn get() -> Result<EalRef> {
        if !Eal::is_running() {
            return Err(Error::EalNotRunning);
        }
        LIVE.lock().unwrap_or_else(|p| p.into_inner()).upgrade().map(EalRef).ok_or(Error::EalNotRunning)
    }
}

impl Eal {
    fn start(args: Vec<String>) -> Result<Eal> {
        match STATE.compare_exchange(IDLE, STARTING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {}
            Err(SHUT_DOWN) => return Err(Error::EalAlreadyStarted("been shut down")),
            Err(FAILED) => {
                return Err(Error::EalAlreadyStarted(
                    "failed to start (DPDK keeps state from a failed rte_eal_init, so it is not retried)",
                ));
            }
            Err(_) => return Err(Error::EalAlreadyStarted("started already")),
        }
        let c_args: Vec<CString> = match args.iter().map(|a| CString::new(a.as_str())).collect() {
            Ok(v) => v,
            Err(_) => {
                STATE.store(IDLE, Ordering::Release);
                return Err(Error::InvalidEalArgs("an argument contains a NUL byte".into()));
            }
        };
        // rte_eal_init may keep pointers into argv and permute it, so the
        // strings and the vector live as long as the process.
        let c_args: &'static [CString] = Vec::leak(c_args);
        let argv: &'static mut [*mut c_char] = Vec::leak(c_args.iter().map(|a| a.as_ptr() as *mut c_char).collect());
        log::debug!("rte_eal_init {:?}", args);
        let ret = {
            // The EAL's threads (lcores, interrupts, multi-process) are
            // made with every signal blocked: the program's are its own.
            let _blocked = crate::signal::block_all();
            // SAFETY: argv holds argc valid NUL-terminated strings that
            // outlive the EAL; the STATE guard makes this the only caller.
            unsafe { sys::rte_eal_init(argv.len() as c_int, argv.as_mut_ptr()) }
        };
        if ret < 0 {
            let errno = rte_errno();
            // DPDK clears its run-once guard after an argument error, but the
            // options it parsed stay set ("Option -l is ignored, because (-l)
            // is set"), so a retry would run with a mix of old and new
            // arguments: refuse it instead.
            STATE.store(FAILED, Ordering::Release);
            // A start that failed after DPDK made its runtime folder (a
            // device that would not probe, no memory) leaves the folder.
            let prefix = args.iter().position(|a| a == "--file-prefix").and_then(|i| args.get(i + 1));
            // SAFETY: returns a static string, empty before the arguments
            // were parsed.
            let dir =
                PathBuf::from(unsafe { CStr::from_ptr(sys::rte_eal_get_runtime_dir()) }.to_string_lossy().as_ref());
            if prefix.is_some_and(|p| dir.file_name().is_some_and(|n| n == p.as_str())) {
                remove_runtime_dir(&dir);
            }
            return Err(Error::EalInit {
                reason: format!("rte_eal_init({})", args[1..].join(" ")),
                errno,
                text: strerror(errno),
            });
        }
        STATE.store(RUNNING, Ordering::Release);
        // SAFETY: valid after a successful init; returns a static string.
        let runtime_dir = unsafe { CStr::from_ptr(sys::rte_eal_get_runtime_dir()) };
        let runtime_dir = PathBuf::from(runtime_dir.to_string_lossy().into_owned());
        // With --in-memory or --no-shconf and no telemetry nothing uses the
        // runtime folder after init; removing it now means even a killed
        // process leaves nothing behind.
        remove_runtime_dir(&runtime_dir);
        let hugepages = !args.iter().any(|a| a == "--no-huge");
        let inner = Arc::new(EalInner { args, runtime_dir, hugepages });
        *LIVE.lock().unwrap_or_else(|p| p.into_inner()) = Arc::downgrade(&inner);
        Ok(Eal { inner })
    }

    /// Whether an EAL runs in this process.
    pub fn is_running() -> bool {
        STATE.load(Ordering::Acquire) == RUNNING
    }

    /// The arguments the EAL was started with.
    pub fn args(&self) -> &[String] {
        &self.inner.args
    }

    /// Whether the EAL runs on hugepages.
    pub fn hugepages(&self) -> bool {
        self.inner.hugepages
    }

    /// The runtime folder (`/var/run/dpdk/<prefix>` as root), removed after init.
    pub fn runtime_dir(&self) -> &Path {
        &self.inner.runtime_dir
    }

    /// DPDK's version string.
    pub fn version() -> String {
        // SAFETY: rte_version returns a static string.
        unsafe { CStr::from_ptr(sys::rte_version()).to_string_lossy().into_owned() }
    }
}

impl Drop for EalInner {
    fn drop(&mut self) {
        // The last share went; nothing of the EAL's is left to use it.
        let on_worker = crate::lcore::current().is_some_and(|l| {
            // SAFETY: reads the role of an lcore id the EAL gave this thread.
            l != crate::lcore::main_lcore() && unsafe { sys::rte_eal_lcore_role(l) } == sys::ROLE_RTE
        });
        if on_worker {
            // An lcore job held the last share: DPDK cleans up from the
            // main lcore or an outside thread only, so the EAL stays up.
            log::warn!("the EAL's last user went on a worker lcore: not cleaning the EAL up");
            return;
        }
        // SAFETY: the EAL runs (an EalInner exists only after a successful
        // init), nothing that needs it is left (each holds a share), and
        // this is the only cleanup call.
        let ret = unsafe { sys::rte_eal_cleanup() };
        if ret < 0 {
            log::warn!("rte_eal_cleanup: {}", strerror(-ret));
        }
        STATE.store(SHUT_DOWN, Ordering::Release);
        remove_runtime_dir(&self.runtime_dir);
    }
}

fn remove_runtime_dir(dir: &Path) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => log::warn!("cannot remove DPDK runtime folder {}: {e}", dir.display()),
    }
}

/// Whether the machine has free default-size hugepages and a hugetlbfs mount.
pub fn hugepages_available() -> bool {
    let free = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().find_map(|l| l.strip_prefix("HugePages_Free:")).and_then(|v| v.trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    let mounted = std::fs::read_to_string("/proc/mounts")
        .map(|m| m.lines().any(|l| l.split_whitespace().nth(2) == Some("hugetlbfs")))
        .unwrap_or(false);
    free > 0 && mounted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(b: &EalBuilder, huge: bool) -> Vec<String> {
        b.build_args(huge).unwrap()
    }

    #[test]
    fn no_pci_unless_pci_named() {
        let a = args(&EalBuilder::new(), true);
        assert!(a.contains(&"--no-pci".to_string()));
        let a = args(&EalBuilder::new().pci("0000:00:04.0"), true);
        assert!(!a.contains(&"--no-pci".to_string()));
        assert!(a.windows(2).any(|w| w == ["-a", "0000:00:04.0"]));
        let a = args(&EalBuilder::new().args(["-a", "0000:00:05.0"]), true);
        assert!(!a.contains(&"--no-pci".to_string()));
    }

    #[test]
    fn memory_modes_never_combine() {
        let a = args(&EalBuilder::new(), true);
        assert!(a.contains(&"--in-memory".to_string()) && !a.contains(&"--no-huge".to_string()));
        let a = args(&EalBuilder::new(), false);
        assert!(a.contains(&"--no-huge".to_string()) && a.contains(&"--no-shconf".to_string()));
        assert!(!a.contains(&"--in-memory".to_string()));
        let e = EalBuilder::new().args(["--no-huge", "--in-memory"]).build_args(true);
        assert!(matches!(e, Err(Error::InvalidEalArgs(_))));
        let e = EalBuilder::new().memory(Memory::Hugepages).build_args(false);
        assert!(matches!(e, Err(Error::InvalidEalArgs(m)) if m.contains("hugepages")));
        let e = EalBuilder::new().memory(Memory::Hugepages).args(["--no-huge"]).build_args(true);
        assert!(e.is_err());
        let a = args(&EalBuilder::new().args(["--no-huge"]), true);
        assert_eq!(a.iter().filter(|x| *x == "--no-huge").count(), 1);
        assert!(!a.contains(&"--in-memory".to_string()));
    }

    #[test]
    fn cpu_sets_use_the_lcores_flag() {
        let a = args(&EalBuilder::new().lcores("0,1"), true);
        assert!(a.windows(2).any(|w| w[0] == "-l" && w[1] == "0,1"));
        let a = args(&EalBuilder::new().lcores("0,1@(0-1)"), true);
        assert!(a.windows(2).any(|w| w[0] == "--lcores" && w[1] == "0,1@(0-1)"));
    }

    #[test]
    fn conflicts_are_named() {
        let e = EalBuilder::new().lcores("0").args(["-l", "1"]).build_args(true);
        assert!(matches!(e, Err(Error::InvalidEalArgs(m)) if m.contains("lcores")));
        let e = EalBuilder::new().file_prefix("a").args(["--file-prefix=b"]).build_args(true);
        assert!(e.is_err());
        let e = EalBuilder::new().pci("0000:00:04.0").args(["--no-pci"]).build_args(true);
        assert!(e.is_err());
    }

    #[test]
    fn prefixes_are_unique() {
        let a = args(&EalBuilder::new(), true);
        let b = args(&EalBuilder::new(), true);
        let p = |v: &Vec<String>| v[v.iter().position(|x| x == "--file-prefix").unwrap() + 1].clone();
        assert_ne!(p(&a), p(&b));
        assert!(a.contains(&"--no-telemetry".to_string()));
    }
}

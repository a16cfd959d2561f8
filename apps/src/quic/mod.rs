//! spate-quic: QUIC on spate with quinn 0.11 ([`spate::QuinnSocket`]).
//!
//! `spate-quic server` answers two ALPNs: `hq-interop` (HTTP/0.9 over QUIC
//! as the QUIC interop runner uses it: a bidirectional stream carries
//! `GET /PATH`, the reply is the file's bytes under `--root`, then FIN) and
//! `echo` (each stream's bytes sent back, then FIN). `spate-quic client`
//! fetches URLs over `hq-interop`, or echoes streams over `echo`, and
//! checks what came back. With `--kernel` either side runs the same quinn
//! on a kernel UDP socket instead of a spate stack: the baseline the QUIC
//! benchmark measures spate against.

mod client;
mod server;
mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use quinn::{Endpoint, EndpointConfig, ServerConfig, TokioRuntime};
use spate::{LcoreRuntime, QuinnSocket, Stack, UdpSocket};

use crate::cli::{self, StackArgs};
use crate::report;

pub use client::ClientArgs;
pub use server::ServerArgs;

/// The ALPN of HTTP/0.9 over QUIC (the interop runner's `hq-interop`).
pub const ALPN_HQ: &str = "hq-interop";
/// The ALPN of the echo service.
pub const ALPN_ECHO: &str = "echo";

/// Command line of spate-quic.
#[derive(Debug, Parser)]
#[command(name = "spate-quic", version, about = "QUIC (quinn) on spate: an hq-interop and echo server, and its client")]
pub struct QuicArgs {
    /// Server or client.
    #[command(subcommand)]
    pub role: Role,
}

/// What spate-quic runs as.
#[derive(Debug, Subcommand)]
pub enum Role {
    /// Serve `hq-interop` (files under --root) and `echo`.
    Server(ServerArgs),
    /// Fetch URLs over `hq-interop` or echo streams over `echo`, and check them.
    Client(ClientArgs),
}

/// The flags server and client share: the stack's, or `--kernel`.
#[derive(Debug, Clone, Args)]
pub struct NetArgs {
    /// Devices, addresses, lcores.
    #[command(flatten)]
    pub stack: StackArgs,
    /// Run quinn on a kernel UDP socket in this network namespace instead
    /// of a spate stack (the same quinn, for comparison).
    #[arg(long, conflicts_with_all = ["vdevs", "pcis", "config", "lcores", "vxlan"])]
    pub kernel: bool,
    /// The socket's receive buffer in bytes (quinn's windows arrive in
    /// bursts; the kernel's and spate's default of 212,992 bytes drops them).
    #[arg(long, value_name = "BYTES", default_value_t = 8 << 20)]
    pub rcvbuf: usize,
    /// Where quinn's drivers (the endpoint's and the connections': where
    /// packets are decrypted, answered and built) run: `lcore`, on the
    /// stack's first lcore, from its callback ([`spate::LcoreRuntime`]:
    /// no hand-off between threads per datagram), or `thread`, on the
    /// QUIC thread's tokio runtime beside the application's tasks.
    #[arg(long, value_name = "WHERE", default_value = "lcore", conflicts_with = "kernel")]
    pub drivers: Drivers,
    /// CPUs for quinn's thread (EAL -l syntax); by default any CPU.
    #[arg(long, value_name = "LIST")]
    pub app_cpus: Option<String>,
    /// Seconds between the stack's statistics lines (0: none).
    #[arg(long, default_value_t = 0.0)]
    pub interval: f64,
}

/// Where quinn's drivers run on a spate stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Drivers {
    /// On the stack's first lcore, from its callback.
    Lcore,
    /// On the QUIC thread's tokio runtime.
    Thread,
}

/// Runs spate-quic; returns the process exit code.
pub fn main(args: QuicArgs) -> i32 {
    cli::init_logging();
    if let Err(e) = spate::dpdk::signal::install_stop_handlers() {
        eprintln!("spate-quic: cannot install signal handlers: {e}");
        return 1;
    }
    let result = match &args.role {
        Role::Server(a) => server::run(a),
        Role::Client(a) => client::run(a),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("spate-quic: {e}");
            1
        }
    }
}

/// Boxed errors of the tool's own: each says what failed.
pub type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Where quinn's datagrams go: a spate stack's socket or the kernel's.
enum Net {
    Spate { stack: Stack, sock: Arc<QuinnSocket>, rt: Option<Arc<LcoreRuntime>> },
    Kernel(std::net::UdpSocket),
}

impl Net {
    /// A socket bound to `addr` on a new stack (or the kernel's, with
    /// `--kernel`), with `--rcvbuf`.
    fn bind(args: &NetArgs, addr: SocketAddr) -> Result<Net> {
        if args.kernel {
            let s = socket2::Socket::new(
                socket2::Domain::for_address(addr),
                socket2::Type::DGRAM,
                Some(socket2::Protocol::UDP),
            )?;
            if addr.is_ipv6() {
                s.set_only_v6(false)?;
            }
            s.set_recv_buffer_size(args.rcvbuf)?;
            // Linux doubles what it grants, up to net.core.rmem_max.
            let got = s.recv_buffer_size()?;
            if got < args.rcvbuf {
                log::info!("the kernel socket's receive buffer is {got} bytes (net.core.rmem_max caps it)");
            }
            s.set_nonblocking(true)?;
            s.bind(&addr.into())?;
            return Ok(Net::Kernel(s.into()));
        }
        let mut cfg = args.stack.to_config()?;
        // The QUIC thread closes its connections before the lcores stop.
        cfg.stop_on_signal = false;
        let stack = Stack::new(cfg)?;
        let sock = UdpSocket::builder(&stack).recv_buffer_size(args.rcvbuf).bind(addr)?;
        let rt = (args.drivers == Drivers::Lcore).then(|| LcoreRuntime::new(&stack, 0));
        if let Some(rt) = &rt {
            // Tasks the job spawns run there too.
            let _ = LCORE.set(Arc::downgrade(rt));
        }
        Ok(Net::Spate { stack, sock: QuinnSocket::new(sock)?, rt })
    }

    fn local_addr(&self) -> Result<SocketAddr> {
        Ok(match self {
            Net::Spate { sock, .. } => quinn::AsyncUdpSocket::local_addr(&**sock)?,
            Net::Kernel(s) => s.local_addr()?,
        })
    }

    /// The socket, for the QUIC thread to make its endpoint on.
    fn socket(&self) -> Result<Sock> {
        Ok(match self {
            Net::Spate { sock, rt, .. } => Sock::Spate(sock.clone(), rt.clone()),
            Net::Kernel(s) => Sock::Kernel(s.try_clone()?),
        })
    }

    /// Runs the future `job` makes to its end with a tokio runtime for
    /// its timers and files, while the stack polls on this thread (the
    /// kernel's socket needs no polling: the job runs here). With quinn's
    /// drivers on the lcore, the job runs there too, as every task it
    /// spawns ([`spawn`]), in the tokio runtime's context, which a thread
    /// of its own drives; else the job runs on that thread. The job's end,
    /// also by a panic, stops the stack, waking lcores asleep; the lcore's
    /// callback sees it at its next iteration too, whether the job ended
    /// before the lcores started or after; a signal ends the job, which
    /// sees [`stop_requested`].
    fn run<T, F>(&self, args: &NetArgs, job: impl FnOnce() -> Result<F> + Send + 'static) -> Result<T>
    where
        T: Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        let Net::Spate { stack, rt, .. } = self else {
            return runtime()?.block_on(job()?);
        };
        let rt = rt.clone();
        let cpus = match &args.app_cpus {
            Some(list) => spate::config::parse_lcores(list)?.into_iter().map(|c| c as usize).collect(),
            None => Vec::new(),
        };
        let reporter = (args.interval > 0.0)
            .then(|| report::print_every(stack.clone(), Duration::from_secs_f64(args.interval), report::line));
        /// Says the job ended when dropped, however it ended, and stops
        /// the stack: its lcores, asleep on adaptive polling, are woken.
        struct Ended(Arc<AtomicBool>, Stack);
        impl Drop for Ended {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
                self.1.stop();
            }
        }
        let ended = Arc::new(AtomicBool::new(false));
        let mark = Ended(ended.clone(), stack.clone());
        // The tokio runtime's handle, for the lcore to run the job's tasks
        // in its context.
        let handle: Arc<OnceLock<tokio::runtime::Handle>> = Arc::new(OnceLock::new());
        let (on_lcore, tokio_handle) = (rt.clone(), handle.clone());
        let quic: JoinHandle<Result<T>> = std::thread::Builder::new().name("quic".into()).spawn(move || {
            let _mark = mark;
            // Threads inherit the EAL main lcore's pinning: undo it.
            let _ = if cpus.is_empty() {
                spate::dpdk::lcore::unpin_current_thread()
            } else {
                spate::dpdk::lcore::set_affinity(&cpus)
            };
            let tokio = runtime()?;
            let Some(lcore) = on_lcore else {
                return tokio.block_on(job()?);
            };
            let _ = tokio_handle.set(tokio.handle().clone());
            let (tx, rx) = tokio::sync::oneshot::channel();
            let future = job()?;
            lcore.spawn(async move {
                let _ = tx.send(future.await);
            });
            // This thread drives the runtime's timers and files.
            tokio.block_on(rx).map_err(|_| "the QUIC job ended without a result (it panicked)")?
        })?;
        let polled = stack.run(move |_| {
            let (ended, rt, handle) = (ended.clone(), rt.clone(), handle.clone());
            move |ctx: &mut spate::LcoreCtx<'_>| {
                if let (Some(rt), Some(handle)) = (&rt, handle.get()) {
                    let _context = handle.enter();
                    rt.poll(ctx);
                }
                if ended.load(Ordering::Acquire) {
                    ctx.stack().stop();
                }
            }
        });
        if polled.is_err() {
            // The lcores never ran: end the job instead of waiting for it.
            spate::dpdk::signal::request_stop();
        }
        if let Net::Spate { rt: Some(rt), .. } = self {
            // The lcores stopped: the tasks left go (they hold the stack),
            // the job's too if the lcores never ran it, which ends the
            // QUIC thread's wait for its result.
            rt.shutdown();
        }
        let out = quic.join().map_err(|_| "the QUIC thread panicked")?;
        if let Some(r) = reporter {
            r.finish();
        }
        polled?;
        out
    }

    /// What the stack counted, and what the quinn socket did.
    fn summary(&self) -> String {
        let Net::Spate { stack, sock, .. } = self else {
            return "spate: final counters\n(a kernel socket: no stack counters)".into();
        };
        let [not_ect, ect1, ect0, ce] = sock.ecn_received();
        format!(
            "{}\nQuinnSocket: SendErrors={} RecvNotEct={not_ect} RecvEct1={ect1} RecvEct0={ect0} RecvCe={ce}",
            report::summary(stack),
            sock.send_errors()
        )
    }
}

/// A socket moved to the QUIC thread.
enum Sock {
    Spate(Arc<QuinnSocket>, Option<Arc<LcoreRuntime>>),
    Kernel(std::net::UdpSocket),
}

impl Sock {
    /// A quinn endpoint on it (a server when `server` is given), inside
    /// the tokio runtime that drives it.
    fn endpoint(self, server: Option<ServerConfig>) -> Result<Endpoint> {
        let tokio = Arc::new(TokioRuntime);
        Ok(match self {
            Sock::Spate(sock, Some(lcore)) => {
                Endpoint::new_with_abstract_socket(EndpointConfig::default(), server, sock, lcore)?
            }
            Sock::Spate(sock, None) => {
                Endpoint::new_with_abstract_socket(EndpointConfig::default(), server, sock, tokio)?
            }
            Sock::Kernel(s) => Endpoint::new(EndpointConfig::default(), server, s, tokio)?,
        })
    }
}

/// The runtime of quinn's drivers on the lcore, when they run there: the
/// job's tasks join them.
static LCORE: OnceLock<std::sync::Weak<LcoreRuntime>> = OnceLock::new();

/// Runs `task` beside the job: on the lcore when quinn's drivers run
/// there, else on the tokio runtime. Its output comes through the
/// receiver (an error: it panicked).
fn spawn<T: Send + 'static>(task: impl Future<Output = T> + Send + 'static) -> tokio::sync::oneshot::Receiver<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = async move {
        let _ = tx.send(task.await);
    };
    match LCORE.get() {
        // Gone with its stack: the task goes too.
        Some(rt) => {
            if let Some(rt) = rt.upgrade() {
                rt.spawn(task);
            }
        }
        None => drop(tokio::spawn(task)),
    }
    rx
}

/// Whether a signal asked the tool to stop.
fn stop_requested() -> bool {
    spate::dpdk::signal::stop_requested()
}

/// A current-thread tokio runtime (with timers; quinn's file reads use
/// its blocking pool).
fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

/// Resolves once a signal asks the tool to stop (checked every 50 ms).
async fn stopped() {
    while !stop_requested() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// This process's CPU time so far (user and system, `/proc/self/stat`),
/// in seconds.
pub fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return 0.0 };
    // The fields after the command's closing parenthesis: utime and stime
    // are the 12th and 13th of them, in clock ticks (100 per second here;
    // USER_HZ is 100 on every Linux architecture spate builds for).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = rest.split_whitespace().skip(11).take(2).filter_map(|v| v.parse().ok()).collect();
    f.iter().sum::<u64>() as f64 / 100.0
}

/// The time the live threads of process `pid` (this one: `None`) have
/// spent on a CPU, in seconds, to the nanosecond (each
/// `/proc/PID/task/*/schedstat`'s first field): for a window its threads
/// all outlive, where the clock ticks of [`cpu_seconds`] (10 ms) are too
/// coarse.
pub fn threads_cpu_seconds(pid: Option<u32>) -> f64 {
    let dir = pid.map_or_else(|| "/proc/self/task".to_string(), |p| format!("/proc/{p}/task"));
    let Ok(tasks) = std::fs::read_dir(dir) else { return 0.0 };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
}

/// A file the server serves, its path under the root checked.
fn served_path(root: &std::path::Path, request: &str) -> Option<PathBuf> {
    use std::path::Component;
    let rel = std::path::Path::new(request.strip_prefix('/')?);
    // Only plain names: no `..`, no root, no prefix.
    if rel.as_os_str().is_empty() || !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return None;
    }
    let full = root.join(rel).canonicalize().ok()?;
    // A symbolic link may still point outside the root.
    (full.starts_with(root) && full.is_file()).then_some(full)
}

#[cfg(test)]
mod tests {
    use super::served_path;

    #[test]
    fn served_paths_stay_under_the_root() {
        let dir = std::env::temp_dir().join(format!("spate-quic-root-{}", std::process::id()));
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("a.txt"), b"a").unwrap();
        std::fs::write(root.join("sub/b.txt"), b"b").unwrap();
        std::fs::write(dir.join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(dir.join("secret"), root.join("link")).unwrap();
        let root = root.canonicalize().unwrap();
        assert_eq!(served_path(&root, "/a.txt"), Some(root.join("a.txt")));
        assert_eq!(served_path(&root, "/sub/b.txt"), Some(root.join("sub/b.txt")));
        for bad in ["a.txt", "/", "/../secret", "/sub/../../secret", "/link", "/sub", "/missing", "//etc/passwd"] {
            assert_eq!(served_path(&root, bad), None, "{bad}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! The serving thread: the endpoint's socket (private folder, mode
//! 0600, stale sockets swept), one thread per connection, and each
//! request's answer.

use std::io::{self, BufRead, BufReader};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Reply, Request, info, reply, snapshot};
use crate::config::Cidr;
use crate::control_plane::service::{Listener, ServiceThread};
use crate::control_plane::{Stack, WeakStack};
use crate::error::{Error, Result};
use crate::setup::capture;
use crate::wire::MacAddr;

/// Connections served at once at most (more are refused).
const MAX_CLIENTS: usize = 16;
/// A request line's length at most.
const MAX_LINE: usize = 64 << 10;
/// How often a waiting connection looks whether the stack is gone.
const READ_TICK: Duration = Duration::from_secs(1);
/// How long `accept` waits before the serving thread looks at its stop
/// flag again (a wake-up connection normally ends the wait at once).
pub(crate) const ACCEPT_TICK: Duration = Duration::from_secs(1);

/// Opens `stack`'s endpoint, unless configured off; where its folder
/// cannot be made (not root), the stack goes on without it, said in the
/// log. A named stack whose socket a running stack serves is an error.
pub(in crate::setup) fn open(stack: &Stack) -> Result<()> {
    let shared = &stack.shared;
    let cfg = &shared.cfg.control;
    if !cfg.enabled {
        return Ok(());
    }
    if let Err(e) = std::fs::create_dir_all(&cfg.dir) {
        log::warn!("spate: no control endpoint: cannot make {}: {e}", cfg.dir.display());
        return Ok(());
    }
    if let Err(why) = trusted_dir(&cfg.dir) {
        log::warn!("spate: no control endpoint: {}: {why}", cfg.dir.display());
        return Ok(());
    }
    sweep(&cfg.dir);
    let pid = std::process::id();
    let file = match &shared.cfg.name {
        Some(n) => format!("{n}.sock"),
        None => format!("{pid}-{}.sock", shared.id),
    };
    let path = cfg.dir.join(file);
    let (listener, ino) = match bind_private(&path) {
        Ok(l) => l,
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            return Err(Error::Config(format!("control endpoint {}: a running stack serves it", path.display())));
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            log::warn!("spate: no control endpoint: {}: {e}", path.display());
            return Ok(());
        }
        Err(e) => return Err(Error::Config(format!("control endpoint {}: {e}", path.display()))),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (weak, flag) = (stack.downgrade(), stop.clone());
    let thread = crate::setup::service_thread("spate-control", move || serve(listener, weak, flag))
        .map_err(|e| Error::Config(format!("control endpoint: no thread: {e}")))?;
    let endpoint =
        ServiceThread { listener: Listener::Unix(path.clone(), ino), stop, thread: Mutex::new(Some(thread)) };
    if stack.control.endpoint.set(endpoint).is_err() {
        return Err(Error::State("the control endpoint was opened twice".into()));
    }
    log::info!("spate: control endpoint {}", path.display());
    Ok(())
}

/// Binds `path` with mode 0600: in a folder of mode 0700, then linked
/// into place (a link fails where a name exists: of two stacks starting
/// with one name, the second is `AddrInUse`, never silently replacing the
/// first). A stale socket there (nobody listening) is replaced; a live one
/// is `AddrInUse`; anything else there is left alone. Returns the
/// listener and the socket's inode.
fn bind_private(path: &Path) -> io::Result<(UnixListener, u64)> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, "not a socket: left alone"));
        }
        match UnixStream::connect(path) {
            Ok(_) => return Err(io::Error::from(io::ErrorKind::AddrInUse)),
            // Nobody listens: a killed process's.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => std::fs::remove_file(path)?,
            Err(e) => return Err(e),
        }
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let private = dir.join(format!(".bind-{}-{}", std::process::id(), NEXT_BIND.fetch_add(1, Ordering::Relaxed)));
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let result = (|| {
        let inside = private.join("s");
        let listener = UnixListener::bind(&inside)?;
        std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o600))?;
        let ino = std::fs::metadata(&inside)?.ino();
        std::fs::hard_link(&inside, path).map_err(|e| match e.kind() {
            io::ErrorKind::AlreadyExists => io::Error::from(io::ErrorKind::AddrInUse),
            _ => e,
        })?;
        Ok((listener, ino))
    })();
    let _ = std::fs::remove_dir_all(&private);
    result
}

static NEXT_BIND: AtomicUsize = AtomicUsize::new(0);

/// The control folder is this user's or root's, and nobody else may
/// write in it (else another user could put a socket of theirs where
/// clients look, or remove ours).
fn trusted_dir(dir: &Path) -> std::result::Result<(), String> {
    let meta = std::fs::metadata(dir).map_err(|e| e.to_string())?;
    let me = spate_dpdk::process::effective_uid();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(format!("owned by user {}, neither this user ({me}) nor root", meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!("mode {:o}: others may write in it", meta.mode() & 0o7777));
    }
    Ok(())
}

/// Removes the sockets (`PID-ID.sock`) of processes that are gone: only
/// those nobody listens on (a connect refused), whatever their name says.
fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_suffix(".sock")?.split_once('-')?.0.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if UnixStream::connect(e.path()).is_err_and(|err| err.kind() == io::ErrorKind::ConnectionRefused) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Accepts until the stack goes: a thread per connection, at most
/// [`MAX_CLIENTS`] at once. The stack's drop wakes `accept` with a
/// connection; should that miss (the socket's path is gone or another's),
/// the accept timeout ends the wait within [`ACCEPT_TICK`].
fn serve(listener: UnixListener, shared: WeakStack, stop: Arc<AtomicBool>) {
    // Threads started by the EAL's main thread inherit its pinning.
    let _ = spate_dpdk::lcore::unpin_current_thread();
    if socket2::SockRef::from(&listener).set_read_timeout(Some(ACCEPT_TICK)).is_err() {
        return;
    }
    let clients = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Acquire) {
        let mut conn = match listener.accept() {
            Ok((c, _)) if !stop.load(Ordering::Acquire) => c,
            Ok(_) => break,
            // The timeout (EAGAIN), or a connection gone before accept.
            Err(_) => continue,
        };
        if clients.load(Ordering::Relaxed) >= MAX_CLIENTS {
            let _ = reply(&mut conn, &Reply::Error { message: "too many clients".into(), errno: Some(libc::EBUSY) });
            continue;
        }
        clients.fetch_add(1, Ordering::Relaxed);
        let (shared, stop, clients, mine) = (shared.clone(), stop.clone(), clients.clone(), clients.clone());
        let spawned = std::thread::Builder::new().name("spate-control-client".into()).spawn(move || {
            client(conn, &shared, &stop);
            clients.fetch_sub(1, Ordering::Relaxed);
        });
        if spawned.is_err() {
            // The connection went with the closure: its place is free.
            mine.fetch_sub(1, Ordering::Relaxed);
            log::warn!("spate: control endpoint: no thread for a client");
        }
    }
}

/// One connection's requests, until it closes, the stack goes, or a line
/// is not a request.
fn client(conn: UnixStream, shared: &WeakStack, stop: &AtomicBool) {
    if conn.set_read_timeout(Some(READ_TICK)).is_err() {
        return;
    }
    let Ok(mut out) = conn.try_clone() else { return };
    let mut input = BufReader::new(conn);
    let mut line = Vec::new();
    loop {
        match read_line(&mut input, &mut line) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                if stop.load(Ordering::Acquire) || shared.is_gone() {
                    return;
                }
                continue;
            }
            Err(_) => return,
        }
        let answer = match serde_json::from_slice::<Request>(&line) {
            Ok(Request::Capture(req)) => {
                drop(out);
                return capture::session(input.into_inner(), shared, stop, req);
            }
            Ok(req) => match shared.upgrade() {
                Some(s) => handle(&s, req),
                None => return,
            },
            Err(e) => Reply::Error { message: format!("not a request: {e}"), errno: Some(libc::EINVAL) },
        };
        line.clear();
        if reply(&mut out, &answer).is_err() {
            return;
        }
    }
}

/// Reads up to a newline into `line` (kept across timeouts); false at
/// the end of the stream.
fn read_line(input: &mut BufReader<UnixStream>, line: &mut Vec<u8>) -> io::Result<bool> {
    loop {
        let buf = input.fill_buf()?;
        if buf.is_empty() {
            return Ok(false);
        }
        let (take, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        line.extend_from_slice(&buf[..take]);
        input.consume(take);
        if line.len() > MAX_LINE {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "request line too long"));
        }
        if done {
            return Ok(true);
        }
    }
}

fn handle(stack: &Stack, req: Request) -> Reply {
    let done = |r: io::Result<()>| match r {
        Ok(()) => Reply::Ok(serde_json::Value::Null),
        Err(e) => {
            let code = e.get_ref().and_then(|x| x.downcast_ref::<super::Errno>()).map(|x| x.code);
            Reply::Error { message: e.to_string(), errno: e.raw_os_error().or(code) }
        }
    };
    let bad = |what: &str, e: String| Reply::Error { message: format!("{what}: {e}"), errno: Some(libc::EINVAL) };
    let value = |v: serde_json::Result<serde_json::Value>| match v {
        Ok(v) => Reply::Ok(v),
        Err(e) => Reply::Error { message: e.to_string(), errno: None },
    };
    match req {
        Request::Info => value(serde_json::to_value(info(stack))),
        Request::Snapshot => value(serde_json::to_value(snapshot(stack))),
        Request::AddAddress { iface, addr } => match addr.parse::<Cidr>() {
            Ok(c) => done(stack.add_address(iface, c)),
            Err(e) => bad(&addr, e.to_string()),
        },
        Request::RemoveAddress { iface, ip } => done(stack.remove_address(iface, ip)),
        Request::AddRoute { dst, via, iface } => match dst.parse::<Cidr>() {
            Ok(c) => done(stack.add_route(c, via, iface)),
            Err(e) => bad(&dst, e.to_string()),
        },
        Request::RemoveRoute { dst } => match dst.parse::<Cidr>() {
            Ok(c) => done(stack.remove_route(c)),
            Err(e) => bad(&dst, e.to_string()),
        },
        Request::AddNeighbor { iface, ip, mac } => match mac.parse::<MacAddr>() {
            Ok(m) => done(stack.add_neighbor(iface, ip, m)),
            Err(e) => bad(&mac, e.to_string()),
        },
        Request::RemoveNeighbor { iface, ip } => done(stack.remove_neighbor(iface, ip)),
        // Served by the connection's loop.
        Request::Capture(_) => Reply::Error { message: "not here".into(), errno: Some(libc::EINVAL) },
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::{bind_private, trusted_dir};

    #[test]
    fn a_folder_others_may_write_in_is_not_trusted() {
        let dir = std::env::temp_dir().join(format!("spate-control-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(trusted_dir(&dir), Ok(()));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(trusted_dir(&dir).unwrap_err().contains("others may write"), "{:?}", trusted_dir(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_name_in_use_is_never_taken_over() {
        let dir = std::env::temp_dir().join(format!("spate-control-bind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.sock");
        let (_first, ino) = bind_private(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        let second = bind_private(&path).unwrap_err();
        assert_eq!(second.kind(), std::io::ErrorKind::AddrInUse);
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), ino, "the first stack's socket is still there");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

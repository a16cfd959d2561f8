//! The client side of the endpoint: a connection and its requests, a
//! capture's stream, and finding a stack's endpoint.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;

/// A connection to a stack's control endpoint.
#[derive(Debug)]
pub struct Client {
    input: BufReader<UnixStream>,
    output: UnixStream,
}

impl Client {
    /// Connects to the endpoint at `path` (`PermissionDenied` for a user
    /// other than its owner and root).
    pub fn connect(path: &Path) -> io::Result<Client> {
        let s = UnixStream::connect(path)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Client { output: s.try_clone()?, input: BufReader::new(s) })
    }

    /// Sends `req` and reads its answer; a refusal is an error with its
    /// errno.
    pub fn request(&mut self, req: &Request) -> io::Result<serde_json::Value> {
        let mut text = serde_json::to_vec(req).map_err(io::Error::other)?;
        text.push(b'\n');
        self.output.write_all(&text)?;
        let mut line = String::new();
        if self.input.read_line(&mut line)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the stack closed the connection"));
        }
        match serde_json::from_str::<Reply>(&line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))? {
            Reply::Ok(v) => Ok(v),
            Reply::Error { message, errno: Some(n) } => Err(io::Error::new(
                io::Error::from_raw_os_error(n).kind(),
                Errno::new(n, format!("{message} (errno {n})")),
            )),
            Reply::Error { message, errno: None } => Err(io::Error::other(message)),
        }
    }

    /// [`Request::Info`].
    pub fn info(&mut self) -> io::Result<Info> {
        serde_json::from_value(self.request(&Request::Info)?).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// [`Request::Snapshot`].
    pub fn snapshot(&mut self) -> io::Result<Snapshot> {
        serde_json::from_value(self.request(&Request::Snapshot)?)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Attaches a capture ([`Request::Capture`]): the connection carries
    /// its messages from now on.
    pub fn capture(mut self, req: CaptureRequest) -> io::Result<(CaptureStart, Capture)> {
        let start = serde_json::from_value(self.request(&Request::Capture(req))?)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        // Frames may be seconds apart.
        self.output.set_read_timeout(None)?;
        Ok((start, Capture { input: self.input, output: self.output }))
    }
}

/// An attached capture's stream.
#[derive(Debug)]
pub struct Capture {
    input: BufReader<UnixStream>,
    output: UnixStream,
}

impl Capture {
    /// The next message; `None` once the stack closed the stream (after
    /// the last counts, or when it went away).
    pub fn next_message(&mut self) -> io::Result<Option<Message>> {
        Message::read(&mut self.input)
    }

    /// A handle that ends the capture from another thread: the stack
    /// writes what its lcores copied so far, the last counts, and closes.
    pub fn stopper(&self) -> io::Result<CaptureStopper> {
        Ok(CaptureStopper(self.output.try_clone()?))
    }
}

/// Ends a [`Capture`] ([`Capture::stopper`]).
#[derive(Debug)]
pub struct CaptureStopper(UnixStream);

impl CaptureStopper {
    /// Asks the stack to end the capture.
    pub fn stop(&self) -> io::Result<()> {
        (&self.0).write_all(b"\n")
    }
}

/// The endpoints in `dir` that answer, with who they are; stale sockets
/// (nobody listening) are left out, and so are those this user may not
/// open.
pub fn endpoints(dir: &Path) -> Vec<(PathBuf, Info)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<(PathBuf, Info)> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sock"))
        .filter_map(|p| Client::connect(&p).and_then(|mut c| c.info()).ok().map(|i| (p, i)))
        .collect();
    out.sort_by_key(|(_, i)| (i.pid, i.id));
    out
}

/// The endpoint of the stack of process `pid`, or named `name`, or the
/// only one in `dir`.
pub fn find(dir: &Path, pid: Option<u32>, name: Option<&str>) -> io::Result<PathBuf> {
    if let Some(n) = name {
        let p = dir.join(format!("{n}.sock"));
        return if p.exists() {
            Ok(p)
        } else {
            Err(io::Error::new(io::ErrorKind::NotFound, format!("no stack named {n} ({} is not there)", p.display())))
        };
    }
    let all = endpoints(dir);
    let chosen: Vec<&(PathBuf, Info)> = all.iter().filter(|(_, i)| pid.is_none_or(|p| i.pid == p)).collect();
    match (chosen.as_slice(), pid) {
        ([one], _) => Ok(one.0.clone()),
        ([], Some(p)) => {
            Err(io::Error::new(io::ErrorKind::NotFound, format!("no stack of process {p} in {}", dir.display())))
        }
        ([], None) => {
            // Say why when it is the permissions.
            let denied =
                std::fs::read_dir(dir).ok().into_iter().flatten().flatten().any(|e| {
                    UnixStream::connect(e.path()).is_err_and(|err| err.kind() == io::ErrorKind::PermissionDenied)
                });
            let why = if denied { " this user may open (their owner and root only)" } else { "" };
            Err(io::Error::new(io::ErrorKind::NotFound, format!("no running stack{why} in {}", dir.display())))
        }
        (many, _) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} stacks run: choose with --pid or --name ({})",
                many.len(),
                many.iter().map(|(p, i)| format!("pid {} {}", i.pid, p.display())).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

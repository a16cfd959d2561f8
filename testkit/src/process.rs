//! Child processes that cannot outlive their test.
//!
//! Every child runs as `setpriv --pdeathsig KILL timeout -k 5 LIMIT setpriv
//! --pdeathsig KILL PROGRAM ...`: if the test process dies, the outer
//! `timeout` is killed and with it the program; if the test hangs, `timeout`
//! ends the program after LIMIT. [`Proc`]'s drop stops it (SIGTERM, then
//! SIGKILL) and removes the paths registered for cleanup.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::unsafe_libc::kill;

/// A bounded child process.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
    cleanup: Vec<PathBuf>,
    status: Option<ExitStatus>,
    stdin: Option<std::process::ChildStdin>,
}

impl Proc {
    /// Starts `program args...` with stdout and stderr to `log`, ended by
    /// `timeout` after `limit`.
    pub fn spawn(name: &str, program: &str, args: &[String], log: &Path, limit: Duration) -> std::io::Result<Proc> {
        Self::spawn_with(name, program, args, log, limit, false)
    }

    /// Like [`spawn`](Self::spawn), with a pipe to its standard input for
    /// [`send_line`](Self::send_line) (interactive programs).
    pub fn spawn_interactive(
        name: &str,
        program: &str,
        args: &[String],
        log: &Path,
        limit: Duration,
    ) -> std::io::Result<Proc> {
        Self::spawn_with(name, program, args, log, limit, true)
    }

    fn spawn_with(
        name: &str,
        program: &str,
        args: &[String],
        log: &Path,
        limit: Duration,
        interactive: bool,
    ) -> std::io::Result<Proc> {
        let out = File::create(log)?;
        let err = out.try_clone()?;
        let secs = limit.as_secs().max(1).to_string();
        let child = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "timeout", "-k", "5", &secs, "setpriv", "--pdeathsig", "KILL", program])
            .args(args)
            .stdin(if interactive { Stdio::piped() } else { Stdio::null() })
            .stdout(out)
            .stderr(err)
            .spawn()?;
        let mut child = child;
        let stdin = child.stdin.take();
        Ok(Proc { name: name.into(), child, log: log.into(), cleanup: vec![log.into()], status: None, stdin })
    }

    /// Writes a line to its standard input (interactive processes only).
    pub fn send_line(&mut self, line: &str) -> std::io::Result<()> {
        use std::io::Write;
        let stdin = self.stdin.as_mut().ok_or_else(|| std::io::Error::other("not interactive"))?;
        writeln!(stdin, "{line}")?;
        stdin.flush()
    }

    /// Removes `path` (file or folder) when the process is dropped.
    pub fn remove_on_drop(&mut self, path: impl Into<PathBuf>) {
        self.cleanup.push(path.into());
    }

    /// Keeps the log file after drop (for a benchmark's record).
    pub fn keep_log(&mut self) {
        let log = self.log.clone();
        self.cleanup.retain(|p| p != &log);
    }

    /// The log so far.
    pub fn output(&self) -> String {
        std::fs::read(&self.log).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Waits until the log contains `needle`; false on timeout or exit.
    pub fn wait_for_output(&mut self, needle: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.output().contains(needle) {
                return true;
            }
            if self.exited() {
                return self.output().contains(needle);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Waits up to `limit` for it to exit; whether it did.
    pub fn wait_exit(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while !self.exited() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }

    /// Whether it has exited.
    pub fn exited(&mut self) -> bool {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status.is_some()
    }

    /// Sends `sig` (timeout passes SIGINT/SIGTERM on to the program) and
    /// waits up to `grace` for the exit, then kills it.
    pub fn stop_with(&mut self, sig: i32, grace: Duration) -> Option<ExitStatus> {
        if !self.exited() {
            kill(self.child.id(), sig);
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline && !self.exited() {
                std::thread::sleep(Duration::from_millis(20));
            }
            if !self.exited() {
                log::warn!("{} did not exit within {grace:?}: killing it", self.name);
                let _ = self.child.kill();
                self.status = self.child.wait().ok();
            }
        }
        self.status
    }

    /// SIGINT with a 10 s grace period.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.stop_with(libc::SIGINT, Duration::from_secs(10))
    }

    /// The child's pid (that of its `timeout` wrapper).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // An interactive program may be waiting for its input to end.
        drop(self.stdin.take());
        self.stop_with(libc::SIGTERM, Duration::from_secs(5));
        for path in &self.cleanup {
            let _ = if path.is_dir() { std::fs::remove_dir_all(path) } else { std::fs::remove_file(path) };
        }
    }
}

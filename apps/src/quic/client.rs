//! `spate-quic client`: URLs fetched over `hq-interop`, or streams echoed
//! over `echo`, each checked; the job repeated over `--connections` new
//! connections one after another (a full handshake each).

use std::hash::Hasher;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use quinn::{ClientConfig, Connection, Endpoint};

use super::{ALPN_ECHO, ALPN_HQ, Net, NetArgs, Result, stopped, tls};

/// `spate-quic client`'s flags.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// `https://ADDR[:PORT]/PATH` (an address, not a name: spate has no
    /// resolver), all of one server; with `--alpn echo` the path is unused.
    #[arg(required = true, value_name = "URL")]
    pub urls: Vec<String>,
    // (Before the stack's flags: their EAL arguments after `--` must be
    // the last positional.)
    /// Where quinn's datagrams go.
    #[command(flatten)]
    pub net: NetArgs,
    /// `hq-interop` (fetch each URL) or `echo` (echo --streams streams).
    #[arg(long, default_value = ALPN_HQ, value_parser = [ALPN_HQ, ALPN_ECHO])]
    pub alpn: String,
    /// Streams per connection: each URL fetched this many times (all copies
    /// must agree), or this many echo streams.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub streams: u32,
    /// Bytes each echo stream carries.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub bytes: u64,
    /// Run the job over this many connections, one after another.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub connections: u32,
    /// Save each fetched file (its first copy) in this folder.
    #[arg(long, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Trust the certificates in this PEM file.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Take any certificate (the connection is encrypted, the server unproven).
    #[arg(long, conflicts_with = "ca")]
    pub insecure: bool,
    /// The name the server's certificate must carry (default: the URL's address).
    #[arg(long, value_name = "NAME")]
    pub server_name: Option<String>,
    /// The whole job's limit in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 300.0)]
    pub timeout: f64,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// A URL's server and path.
fn parse_url(url: &str) -> Result<(SocketAddr, String)> {
    let rest = url.strip_prefix("https://").ok_or_else(|| format!("{url}: not https://ADDR[:PORT]/PATH"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let bad =
        || format!("{url}: {authority:?} is not ADDR, ADDR:PORT, [ADDR6] or [ADDR6]:PORT (spate has no resolver)");
    let addr = if let Ok(a) = authority.parse::<SocketAddr>() {
        a
    } else if let Some(v6) = authority.strip_prefix('[').and_then(|a| a.strip_suffix(']')) {
        SocketAddr::new(v6.parse::<Ipv6Addr>().map_err(|_| bad())?.into(), 443)
    } else {
        SocketAddr::new(authority.parse::<Ipv4Addr>().map_err(|_| bad())?.into(), 443)
    };
    Ok((addr, path.to_string()))
}

/// One URL's copies: their length and hash must agree.
#[derive(Debug, Clone, Default)]
struct Fetched {
    bytes: u64,
    hash: u64,
}

/// What the job did.
#[derive(Debug, Default)]
struct Outcome {
    handshakes: Vec<Duration>,
    streams: u64,
    bytes_sent: u64,
    bytes_received: u64,
    path_mtu: u16,
    errors: Vec<String>,
    /// The connections' own time and the process's CPU time over it: from
    /// the first connect to the last close, without the stack's start and
    /// stop or the endpoint's wait for its closes to drain.
    job_secs: f64,
    job_cpu: f64,
}

/// Runs the client's job; an error when any check failed.
pub fn run(args: &ClientArgs) -> Result {
    let targets = args.urls.iter().map(|u| parse_url(u)).collect::<Result<Vec<_>>>()?;
    let server = targets[0].0;
    if let Some((other, _)) = targets.iter().find(|(a, _)| *a != server) {
        return Err(format!("the URLs name two servers ({server} and {other}): give one").into());
    }
    if !args.insecure && args.ca.is_none() {
        return Err("the server's certificate cannot be checked: give --ca FILE or --insecure".into());
    }
    if let Some(dir) = &args.output {
        std::fs::create_dir_all(dir).map_err(|e| format!("--output {}: {e}", dir.display()))?;
    }
    let crypto = tls::client(args.ca.as_deref(), &args.alpn)?;
    let mut cfg = ClientConfig::new(crypto);
    let mut transport = quinn::TransportConfig::default();
    transport.max_idle_timeout(Some(Duration::from_secs(10).try_into()?));
    cfg.transport_config(Arc::new(transport));
    let name = args.server_name.clone().unwrap_or_else(|| server.ip().to_string());
    let local: SocketAddr = match server.ip() {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let net = Net::bind(&args.net, local)?;
    let job = Job {
        server,
        name,
        cfg,
        paths: targets.into_iter().map(|(_, p)| p).collect(),
        echo: args.alpn == ALPN_ECHO,
        streams: args.streams,
        bytes: args.bytes,
        connections: args.connections,
        output: args.output.clone(),
    };
    let (sock, limit) = (net.socket()?, Duration::from_secs_f64(args.timeout));
    let (started, cpu) = (Instant::now(), super::cpu_seconds());
    let out = net.run(&args.net, move || {
        Ok(async move {
            let ep = sock.endpoint(None)?;
            let (started, cpu) = (Instant::now(), super::threads_cpu_seconds(None));
            let mut out = tokio::select! {
                o = tokio::time::timeout(limit, job.run(&ep)) => o.map_err(|_| format!("not done within {limit:?}"))?,
                () = stopped() => return Err("stopped by a signal".into()),
            };
            (out.job_secs, out.job_cpu) = (started.elapsed().as_secs_f64(), super::threads_cpu_seconds(None) - cpu);
            // The close frames go out while the lcores still poll.
            let _ = tokio::time::timeout(Duration::from_secs(1), ep.wait_idle()).await;
            Ok(out)
        })
    });
    let (secs, cpu) = (started.elapsed().as_secs_f64(), super::cpu_seconds() - cpu);
    let out = out?;
    report(args, &out, secs, cpu);
    println!("{}", net.summary());
    if out.errors.is_empty() {
        Ok(())
    } else {
        Err(format!("{} check(s) failed: {}", out.errors.len(), out.errors.join("; ")).into())
    }
}

/// The outcome; `cpu` is the process's CPU time over the job (the stack's
/// set-up and the EAL's start before it not counted; a busy-polling
/// lcore's idle polls counted).
fn report(args: &ClientArgs, out: &Outcome, secs: f64, cpu: f64) {
    let mut hs: Vec<f64> = out.handshakes.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    hs.sort_by(f64::total_cmp);
    let median = hs.get(hs.len() / 2).copied().unwrap_or(0.0);
    let (min, max) = (hs.first().copied().unwrap_or(0.0), hs.last().copied().unwrap_or(0.0));
    if args.json {
        let errors: Vec<serde_json::Value> = out.errors.iter().map(|e| e.as_str().into()).collect();
        let v = serde_json::json!({
            "alpn": args.alpn,
            "kernel": args.net.kernel,
            "connections": out.handshakes.len(),
            "streams": out.streams,
            "bytes_sent": out.bytes_sent,
            "bytes_received": out.bytes_received,
            "secs": secs,
            "handshake_ms": { "min": min, "median": median, "max": max },
            "path_mtu": out.path_mtu,
            "cpu_secs": cpu,
            "job_secs": out.job_secs,
            "job_cpu_secs": out.job_cpu,
            "ok": out.errors.is_empty(),
            "errors": errors,
        });
        println!("{v}");
        return;
    }
    let what = if args.alpn == ALPN_ECHO { "echoed" } else { "fetched" };
    println!(
        "spate-quic: {} connection(s), {} stream(s) {what}{}: {} bytes sent, {} received in {secs:.3} s ({:.1} Mbit/s); \
         handshake {median:.2} ms median ({min:.2} to {max:.2}); path MTU {}; CPU {cpu:.2} s",
        out.handshakes.len(),
        out.streams,
        if out.errors.is_empty() { ", all checked" } else { ", some wrong" },
        out.bytes_sent,
        out.bytes_received,
        out.bytes_received as f64 * 8.0 / secs.max(1e-9) / 1e6,
        out.path_mtu
    );
    for e in &out.errors {
        println!("spate-quic: {e}");
    }
}

/// The client's job, the same on every connection.
struct Job {
    server: SocketAddr,
    name: String,
    cfg: ClientConfig,
    paths: Vec<String>,
    echo: bool,
    streams: u32,
    bytes: u64,
    connections: u32,
    output: Option<PathBuf>,
}

impl Job {
    async fn run(&self, ep: &Endpoint) -> Outcome {
        let mut out = Outcome::default();
        for round in 0..self.connections {
            let t0 = Instant::now();
            let conn = match ep.connect_with(self.cfg.clone(), self.server, &self.name) {
                Ok(c) => c.await,
                Err(e) => {
                    out.errors.push(format!("connection {round}: {e}"));
                    break;
                }
            };
            let conn = match conn {
                Ok(c) => c,
                Err(e) => {
                    out.errors.push(format!("connection {round}: handshake: {e}"));
                    break;
                }
            };
            out.handshakes.push(t0.elapsed());
            if self.echo {
                self.echo(&conn, &mut out).await;
            } else {
                self.fetch(&conn, round == 0, &mut out).await;
            }
            out.path_mtu = conn.stats().path.current_mtu;
            conn.close(0u32.into(), b"done");
        }
        out
    }

    /// `--streams` streams of `--bytes` each, written and read back at once
    /// (the server echoes as it reads: waiting would fill both windows).
    async fn echo(&self, conn: &Connection, out: &mut Outcome) {
        let tasks: Vec<_> = (0..self.streams as u64)
            .map(|i| {
                let (conn, len) = (conn.clone(), self.bytes);
                super::spawn(async move { echo_stream(&conn, i, len).await })
            })
            .collect();
        for (i, t) in tasks.into_iter().enumerate() {
            match t.await {
                Ok(Ok(())) => {
                    out.streams += 1;
                    out.bytes_sent += self.bytes;
                    out.bytes_received += self.bytes;
                }
                Ok(Err(e)) => out.errors.push(format!("echo stream {i}: {e}")),
                Err(e) => out.errors.push(format!("echo stream {i}: {e}")),
            }
        }
    }

    /// Each path `--streams` times at once; the copies must agree. The
    /// first connection saves the first copy under `--output`.
    async fn fetch(&self, conn: &Connection, save: bool, out: &mut Outcome) {
        let mut tasks = Vec::new();
        for path in &self.paths {
            for copy in 0..self.streams {
                let file = match (&self.output, save && copy == 0) {
                    (Some(dir), true) => Some(dir.join(file_name(path))),
                    _ => None,
                };
                let (conn, path, hashed) = (conn.clone(), path.clone(), self.streams > 1);
                tasks.push(super::spawn(async move { fetch(&conn, &path, file.as_deref(), hashed).await }));
            }
        }
        let mut first: Vec<Option<Fetched>> = vec![None; self.paths.len()];
        for (i, t) in tasks.into_iter().enumerate() {
            let path = &self.paths[i / self.streams as usize];
            let got = match t.await {
                Ok(Ok(f)) => f,
                Ok(Err(e)) => {
                    out.errors.push(format!("GET {path}: {e}"));
                    continue;
                }
                Err(e) => {
                    out.errors.push(format!("GET {path}: {e}"));
                    continue;
                }
            };
            out.streams += 1;
            out.bytes_sent += format!("GET {path}\r\n").len() as u64;
            out.bytes_received += got.bytes;
            match &first[i / self.streams as usize] {
                None => first[i / self.streams as usize] = Some(got),
                Some(f) if f.bytes != got.bytes || f.hash != got.hash => out.errors.push(format!(
                    "GET {path}: copies differ ({} and {} bytes, or their contents)",
                    f.bytes, got.bytes
                )),
                Some(_) => {}
            }
        }
    }
}

/// The name a fetched path is saved under (its last part; `index.html`
/// for `/`).
fn file_name(path: &str) -> String {
    match path.rsplit('/').next() {
        Some(n) if !n.is_empty() && n != "." && n != ".." => n.to_string(),
        _ => "index.html".into(),
    }
}

/// Byte `j` of echo stream `i`: every stream different, no short period.
fn pattern(i: u64, j: u64) -> u8 {
    (i.wrapping_mul(31) + j.wrapping_mul(7) + j / 251) as u8
}

async fn echo_stream(conn: &Connection, i: u64, len: u64) -> Result {
    let (mut send, mut recv) = conn.open_bi().await?;
    let write = async move {
        let mut buf = Vec::with_capacity(16 << 10);
        let mut at = 0;
        while at < len {
            buf.clear();
            buf.extend((at..len.min(at + (16 << 10))).map(|j| pattern(i, j)));
            send.write_all(&buf).await?;
            at += buf.len() as u64;
        }
        send.finish()?;
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    };
    let read = async move {
        let mut at = 0u64;
        while let Some(chunk) = recv.read_chunk(usize::MAX, true).await? {
            if let Some(k) = chunk.bytes.iter().zip(at..).position(|(b, j)| *b != pattern(i, j)) {
                return Err(format!("byte {} differs", at + k as u64).into());
            }
            at += chunk.bytes.len() as u64;
            if at > len {
                return Err(format!("{at} bytes came back for {len}").into());
            }
        }
        if at != len {
            return Err(format!("{at} bytes came back for {len}").into());
        }
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    };
    let (w, r) = tokio::join!(write, read);
    w.and(r)
}

/// `GET PATH`: the reply's length and, when `hashed` (there are copies to
/// compare), its hash; saved to `save` when given.
async fn fetch(conn: &Connection, path: &str, save: Option<&Path>, hashed: bool) -> Result<Fetched> {
    use tokio::io::AsyncWriteExt;
    let (mut send, mut recv) = conn.open_bi().await?;
    send.write_all(format!("GET {path}\r\n").as_bytes()).await?;
    send.finish()?;
    // Written through tokio's blocking threads in 1 MiB writes (the task
    // may run on the lcore, which must not wait for the disk).
    let mut file = match save {
        Some(p) => {
            let f = tokio::fs::File::create(p).await.map_err(|e| format!("{}: {e}", p.display()))?;
            Some(tokio::io::BufWriter::with_capacity(1 << 20, f))
        }
        None => None,
    };
    let mut hash = std::hash::DefaultHasher::new();
    let mut got = Fetched::default();
    // A reset (404, 400) is an error here, as is a connection lost
    // before FIN.
    while let Some(chunk) = recv.read_chunk(usize::MAX, true).await? {
        if hashed {
            hash.write(&chunk.bytes);
        }
        got.bytes += chunk.bytes.len() as u64;
        if let Some(f) = &mut file {
            f.write_all(&chunk.bytes).await?;
        }
    }
    if let Some(f) = &mut file {
        f.flush().await?;
    }
    got.hash = hash.finish();
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::{file_name, parse_url};

    #[test]
    fn urls() {
        let (a, p) = parse_url("https://198.18.0.2:4433/a/b.bin").unwrap();
        assert_eq!((a.to_string(), p.as_str()), ("198.18.0.2:4433".into(), "/a/b.bin"));
        let (a, p) = parse_url("https://[fd00::2]:4433").unwrap();
        assert_eq!((a.to_string(), p.as_str()), ("[fd00::2]:4433".into(), "/"));
        assert_eq!(parse_url("https://[fd00::2]/x").unwrap().0.to_string(), "[fd00::2]:443");
        assert_eq!(parse_url("https://198.18.0.2/x").unwrap().0.to_string(), "198.18.0.2:443");
        for bad in ["http://198.18.0.2/x", "https://localhost/x", "https://198.18.0.2:x/", "https://[fd00::2/"] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn saved_names() {
        assert_eq!(file_name("/a/b.bin"), "b.bin");
        assert_eq!(file_name("/"), "index.html");
        assert_eq!(file_name("/a/.."), "index.html");
    }
}

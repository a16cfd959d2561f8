//! `spate-quic server`: files under `--root` over `hq-interop`, and `echo`.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use quinn::{Connection, Endpoint, Incoming, RecvStream, SendStream, ServerConfig, VarInt};
use tokio::io::AsyncReadExt;

use super::{ALPN_ECHO, ALPN_HQ, Net, NetArgs, Result, served_path, stopped, tls};

/// `spate-quic server`'s flags.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Where quinn's datagrams go.
    #[command(flatten)]
    pub net: NetArgs,
    /// The UDP port to serve on (IPv4 and IPv6).
    #[arg(long, value_name = "PORT", default_value_t = 4433)]
    pub listen: u16,
    /// The folder `hq-interop` serves files from (without it, only `echo`
    /// is offered).
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// The certificate chain (PEM); without --cert and --key, a
    /// self-signed certificate for localhost and the server's addresses.
    #[arg(long, value_name = "FILE", requires = "key")]
    pub cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "cert")]
    pub key: Option<PathBuf>,
    /// Bidirectional streams a client may have open at once.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub max_streams: u32,
}

/// What the server did, printed at exit as `Quic:` counters.
#[derive(Debug, Default)]
struct Served {
    connections: AtomicU64,
    handshake_failures: AtomicU64,
    hq_streams: AtomicU64,
    echo_streams: AtomicU64,
    refused: AtomicU64,
    stream_errors: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

impl Served {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    fn render(&self) -> String {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "Quic: Connections={} HandshakeFailures={} HqStreams={} EchoStreams={} Refused={} StreamErrors={} BytesIn={} BytesOut={}",
            v(&self.connections),
            v(&self.handshake_failures),
            v(&self.hq_streams),
            v(&self.echo_streams),
            v(&self.refused),
            v(&self.stream_errors),
            v(&self.bytes_in),
            v(&self.bytes_out)
        )
    }
}

/// The longest request line read (`GET /PATH`).
const REQUEST_LIMIT: usize = 8 << 10;
/// The file bytes read per chunk handed to quinn: a read goes through
/// tokio's blocking threads (a hand-off each way), so a large one.
const CHUNK: usize = 1 << 20;
/// Stream reset codes: the request was not `GET /PATH`; no such file under
/// the root (HTTP/0.9 has no status line).
const BAD_REQUEST: u32 = 400;
const NOT_FOUND: u32 = 404;

/// Runs the server until SIGINT or SIGTERM.
pub fn run(args: &ServerArgs) -> Result {
    let root = match &args.root {
        Some(r) => {
            let r = r.canonicalize().map_err(|e| format!("--root {}: {e}", r.display()))?;
            if !r.is_dir() {
                return Err(format!("--root {} is not a folder", r.display()).into());
            }
            Some(Arc::new(r))
        }
        None => None,
    };
    let net = Net::bind(&args.net, SocketAddr::from((Ipv6Addr::UNSPECIFIED, args.listen)))?;
    let (addrs, on): (Vec<IpAddr>, String) = match &net {
        Net::Spate { stack, .. } => {
            let ifaces = stack.interfaces();
            let addrs: Vec<IpAddr> = ifaces.iter().flat_map(|i| i.ipv4.iter().chain(&i.ipv6).map(|c| c.addr)).collect();
            let shown: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
            (addrs, format!("spate port {}, {}, lcores {:?}", ifaces[0].name, shown.join(" "), stack.lcores()))
        }
        Net::Kernel(_) => (Vec::new(), "a kernel socket".into()),
    };
    let alpns: Vec<&str> = root.iter().map(|_| ALPN_HQ).chain([ALPN_ECHO]).collect();
    let crypto = tls::server(args.cert.as_deref(), args.key.as_deref(), &addrs, &alpns)?;
    let mut cfg = ServerConfig::with_crypto(crypto);
    let mut transport = quinn::TransportConfig::default();
    transport.max_concurrent_bidi_streams(args.max_streams.into()).max_concurrent_uni_streams(0u32.into());
    cfg.transport_config(Arc::new(transport));
    println!("spate-quic: QUIC server on {} (ALPN {}; {on})", net.local_addr()?, alpns.join(" "));

    let served = Arc::new(Served::default());
    let (sock, s) = (net.socket()?, served.clone());
    let out = net.run(&args.net, move || Ok(async move { serve(sock.endpoint(Some(cfg))?, root, s).await }));
    println!("{}", net.summary());
    println!("{}", served.render());
    out
}

/// Accepts connections until a signal, then closes them.
async fn serve(ep: Endpoint, root: Option<Arc<PathBuf>>, served: Arc<Served>) -> Result {
    loop {
        let incoming = tokio::select! {
            i = ep.accept() => i,
            () = stopped() => None,
        };
        let Some(incoming) = incoming else { break };
        drop(super::spawn(connection(incoming, root.clone(), served.clone())));
    }
    ep.close(0u32.into(), b"server stopping");
    // The close frames go out while the lcores still poll.
    let _ = tokio::time::timeout(Duration::from_secs(1), ep.wait_idle()).await;
    Ok(())
}

/// One connection: every bidirectional stream served by its ALPN.
async fn connection(incoming: Incoming, root: Option<Arc<PathBuf>>, served: Arc<Served>) {
    let conn = match incoming.await {
        Ok(c) => c,
        Err(e) => {
            log::debug!("handshake failed: {e}");
            Served::add(&served.handshake_failures, 1);
            return;
        }
    };
    Served::add(&served.connections, 1);
    let hq = alpn(&conn).as_deref() == Some(ALPN_HQ.as_bytes());
    while let Ok((send, recv)) = conn.accept_bi().await {
        let served = served.clone();
        match (&root, hq) {
            (Some(root), true) => {
                drop(super::spawn(hq_stream(send, recv, root.clone(), served)));
            }
            _ => {
                drop(super::spawn(echo_stream(send, recv, served)));
            }
        }
    }
}

fn alpn(conn: &Connection) -> Option<Vec<u8>> {
    conn.handshake_data()?.downcast::<quinn::crypto::rustls::HandshakeData>().ok()?.protocol
}

/// The path of an HTTP/0.9 request line, `GET /PATH` (CRLF optional).
fn request_path(req: &[u8]) -> Option<&str> {
    let line = std::str::from_utf8(req).ok()?.lines().next()?;
    let path = line.strip_prefix("GET ")?.split_ascii_whitespace().next()?;
    path.starts_with('/').then_some(path)
}

/// `GET /PATH`: the file's bytes, then FIN; a stream reset with 400 or
/// 404 for what cannot be served.
async fn hq_stream(mut send: SendStream, mut recv: RecvStream, root: Arc<PathBuf>, served: Arc<Served>) {
    let req = match recv.read_to_end(REQUEST_LIMIT).await {
        Ok(r) => r,
        Err(e) => {
            log::debug!("request not read: {e}");
            Served::add(&served.refused, 1);
            let _ = send.reset(VarInt::from_u32(BAD_REQUEST));
            return;
        }
    };
    Served::add(&served.bytes_in, req.len() as u64);
    let Some(path) = request_path(&req) else {
        Served::add(&served.refused, 1);
        let _ = send.reset(VarInt::from_u32(BAD_REQUEST));
        return;
    };
    let Some(file) = served_path(&root, path) else {
        log::debug!("{path}: not under {}", root.display());
        Served::add(&served.refused, 1);
        let _ = send.reset(VarInt::from_u32(NOT_FOUND));
        return;
    };
    match send_file(&mut send, &file, &served).await {
        Ok(()) => {
            let _ = send.finish();
            Served::add(&served.hq_streams, 1);
        }
        Err(e) => {
            log::debug!("{path}: {e}");
            Served::add(&served.stream_errors, 1);
        }
    }
}

/// The file in chunks quinn sends without copying them again.
async fn send_file(send: &mut SendStream, file: &Path, served: &Served) -> Result {
    let mut f = tokio::fs::File::open(file).await?;
    loop {
        let mut buf = Vec::with_capacity(CHUNK);
        if f.read_buf(&mut buf).await? == 0 {
            return Ok(());
        }
        let n = buf.len() as u64;
        send.write_chunk(Bytes::from(buf)).await?;
        Served::add(&served.bytes_out, n);
    }
}

/// Each chunk sent back as it arrives, then FIN.
async fn echo_stream(mut send: SendStream, mut recv: RecvStream, served: Arc<Served>) {
    loop {
        match recv.read_chunk(usize::MAX, true).await {
            Ok(Some(chunk)) => {
                let n = chunk.bytes.len() as u64;
                Served::add(&served.bytes_in, n);
                if send.write_chunk(chunk.bytes).await.is_err() {
                    Served::add(&served.stream_errors, 1);
                    return;
                }
                Served::add(&served.bytes_out, n);
            }
            Ok(None) => break,
            Err(e) => {
                log::debug!("echo stream: {e}");
                Served::add(&served.stream_errors, 1);
                let _ = send.reset(VarInt::from_u32(0));
                return;
            }
        }
    }
    let _ = send.finish();
    Served::add(&served.echo_streams, 1);
}

#[cfg(test)]
mod tests {
    use super::request_path;

    #[test]
    fn http_0_9_request_lines() {
        assert_eq!(request_path(b"GET /index.html\r\n"), Some("/index.html"));
        assert_eq!(request_path(b"GET /a/b"), Some("/a/b"));
        assert_eq!(request_path(b"GET /x HTTP/1.0\r\n\r\n"), Some("/x"));
        for bad in [&b""[..], b"GET", b"GET \r\n", b"POST /x\r\n", b"GET x\r\n", b"\xffGET /x"] {
            assert_eq!(request_path(bad), None, "{bad:?}");
        }
    }
}

//! TLS 1.3 for spate-quic: the server's certificate (from PEM files, or
//! self-signed for `localhost` and the server's addresses) and what the
//! client trusts (a CA file, or nothing checked with `--insecure`).

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use pki_types::pem::PemObject;
use pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::rustls::{self, pki_types};

use super::Result;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The server's TLS configuration offering `alpns`: the certificate chain
/// and key from `cert` and `key` (PEM), or a self-signed certificate for
/// `localhost` and `addrs` when neither is given.
pub fn server(
    cert: Option<&Path>,
    key: Option<&Path>,
    addrs: &[IpAddr],
    alpns: &[&str],
) -> Result<Arc<QuicServerConfig>> {
    let (chain, key) = match (cert, key) {
        (Some(c), Some(k)) => {
            let chain = CertificateDer::pem_file_iter(c)
                .map_err(|e| format!("{}: {e}", c.display()))?
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| format!("{}: {e}", c.display()))?;
            if chain.is_empty() {
                return Err(format!("{}: no certificate in it", c.display()).into());
            }
            let key = PrivateKeyDer::from_pem_file(k).map_err(|e| format!("{}: {e}", k.display()))?;
            (chain, key)
        }
        (None, None) => {
            let mut names = vec!["localhost".to_string()];
            names.extend(addrs.iter().map(|a| a.to_string()));
            let c = rcgen::generate_simple_self_signed(names)?;
            let key = PrivateKeyDer::Pkcs8(c.key_pair.serialize_der().into());
            (vec![c.cert.der().clone()], key)
        }
        _ => return Err("give both --cert and --key, or neither (a self-signed certificate)".into()),
    };
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    tls.alpn_protocols = alpns.iter().map(|a| a.as_bytes().to_vec()).collect();
    tls.max_early_data_size = 0;
    Ok(Arc::new(QuicServerConfig::try_from(tls)?))
}

/// The client's TLS configuration asking for `alpn`: trusting the
/// certificates in `ca` (PEM), or any certificate when `ca` is `None`.
pub fn client(ca: Option<&Path>, alpn: &str) -> Result<Arc<QuicClientConfig>> {
    let builder =
        rustls::ClientConfig::builder_with_provider(provider()).with_protocol_versions(&[&rustls::version::TLS13])?;
    let mut tls = match ca {
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(path).map_err(|e| format!("{}: {e}", path.display()))? {
                roots.add(c.map_err(|e| format!("{}: {e}", path.display()))?)?;
            }
            if roots.is_empty() {
                return Err(format!("{}: no certificate in it", path.display()).into());
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => {
            builder.dangerous().with_custom_certificate_verifier(Arc::new(Unchecked(provider()))).with_no_client_auth()
        }
    };
    tls.alpn_protocols = vec![alpn.as_bytes().to_vec()];
    Ok(Arc::new(QuicClientConfig::try_from(tls)?))
}

/// `--insecure`: any certificate is taken, its handshake signatures still
/// checked (the connection is encrypted, its peer unproven).
#[derive(Debug)]
struct Unchecked(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

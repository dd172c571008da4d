//! What TLS interception needs, below the front end that does it (`http1/intercept/`): the
//! CA clients trust for intercepted hosts (`ca.rs`), and the client configuration an
//! intercepted request's upstream must verify against (the system's trust store, never the
//! interception CA).
//!
//! Interception applies only to a CONNECT whose host and port only allow entries with
//! methods or paths allow (docs/policy.md, Methods and paths); every other tunnel stays
//! blind, SNI-checked and never decrypted.

pub mod ca;

use std::sync::Arc;

pub use ca::{CaError, InterceptCa};

/// Why interception cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error(transparent)]
    Ca(#[from] CaError),
    #[error(
        "no trusted root certificates found (SSL_CERT_FILE, SSL_CERT_DIR or the system's store): an intercepted request's upstream could not be verified"
    )]
    NoRoots,
    #[error("cannot set up TLS: {0}")]
    Tls(#[from] rustls::Error),
}

/// The CA and the upstream verification, shared by every intercepted tunnel.
#[derive(Debug)]
pub struct Interceptor {
    ca: InterceptCa,
    upstream: Arc<rustls::ClientConfig>,
    /// The system's roots as PEM, for a bundle that adds the CA to them.
    roots_pem: String,
}

impl Interceptor {
    /// A new CA named `name`, and the system's trust store for upstreams (as
    /// `rustls-native-certs` reads it: `SSL_CERT_FILE` and `SSL_CERT_DIR` first).
    pub fn new(name: &str) -> Result<Interceptor, InspectError> {
        let found = rustls_native_certs::load_native_certs();
        let mut roots_pem = String::new();
        for cert in &found.certs {
            roots_pem.push_str(&pem("CERTIFICATE", cert.as_ref()));
        }
        let mut roots = rustls::RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            return Err(InspectError::NoRoots);
        }
        let mut made = Interceptor::with_roots(InterceptCa::generate(name)?, roots)?;
        made.roots_pem = roots_pem;
        Ok(made)
    }

    /// The system's roots and the CA, PEM: a bundle for clients that take one file
    /// (`SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE`, `GIT_SSL_CAINFO`), so they trust both.
    pub fn bundle_pem(&self) -> String {
        format!("{}{}", self.roots_pem, self.ca.cert_pem())
    }

    /// `ca`, and `roots` for upstreams.
    pub fn with_roots(ca: InterceptCa, roots: rustls::RootCertStore) -> Result<Interceptor, InspectError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut upstream = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        // The requests relayed are HTTP/1.1, whatever the client spoke.
        upstream.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Interceptor {
            ca,
            upstream: Arc::new(upstream),
            roots_pem: String::new(),
        })
    }

    pub fn ca(&self) -> &InterceptCa {
        &self.ca
    }

    /// The client configuration for upstreams.
    pub fn upstream(&self) -> Arc<rustls::ClientConfig> {
        self.upstream.clone()
    }

    /// The server configuration presented to a client that asked for `host`: the leaf the
    /// CA issued for it, HTTP/2 or HTTP/1.1 by ALPN.
    pub fn server_config(
        &self,
        host: &sandgate_policy::Host,
    ) -> Result<Arc<rustls::ServerConfig>, InspectError> {
        let leaf = self.ca.leaf(host)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Fixed(leaf)));
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// `der` as a PEM block labelled `label`.
fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in text.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// One certificate whatever the client names: the tunnel decides the host, and a client
/// that names another in its SNI is refused after the handshake.
#[derive(Debug)]
struct Fixed(Arc<rustls::sign::CertifiedKey>);

impl rustls::server::ResolvesServerCert for Fixed {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }
}

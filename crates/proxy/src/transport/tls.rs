//! The TLS of the node-to-central transport: PEM files into rustls configurations (a central
//! listener that requires client certificates from one CA; a node's client that trusts one
//! CA and presents its own certificate), both offering only HTTP/2, and a node's names read
//! from its certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

/// Why TLS files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: {reason}", path.display())]
    File { path: PathBuf, reason: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn file_error(path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File {
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

/// The largest TLS file read: a certificate chain or a key is a few KiB.
const MAX_TLS_FILE: u64 = 1 << 20;

/// A TLS file's bytes. Only a regular file (checked before and after opening: a FIFO at the
/// path would block the reader for good, a device might never end) of at most
/// [`MAX_TLS_FILE`] bytes.
pub(crate) fn read_tls_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    use std::io::Read;
    let regular = |m: std::io::Result<std::fs::Metadata>| match m {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err(file_error(path, "not a regular file")),
        Err(e) => Err(file_error(path, e)),
    };
    regular(std::fs::metadata(path))?;
    let file = std::fs::File::open(path).map_err(|e| file_error(path, e))?;
    regular(file.metadata())?;
    let mut bytes = Vec::new();
    file.take(MAX_TLS_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| file_error(path, e))?;
    if bytes.len() as u64 > MAX_TLS_FILE {
        return Err(file_error(path, "larger than 1 MiB: not a certificate or a key"));
    }
    Ok(bytes)
}

/// Every certificate in a PEM file (at least one).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read_tls_file(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

/// When the first of `certs` to expire does (Unix seconds): a chain's intermediate or one
/// CA of a bundle ends trust as surely as the leaf. `None` when none parses.
fn earliest_expiry(certs: &[CertificateDer<'_>]) -> Option<i64> {
    certs
        .iter()
        .filter_map(|c| x509_parser::parse_x509_certificate(c.as_ref()).ok())
        .map(|(_, parsed)| parsed.validity().not_after.timestamp())
        .min()
}

/// When each certificate file of a configuration expires (Unix seconds), taken from the
/// very certificates the configuration was built from.
pub type Expiries = Vec<(PathBuf, Option<i64>)>;

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(&read_tls_file(path)?)
        .map_err(|e| file_error(path, format!("no usable private key: {e}")))
}

/// The CA certificates in a PEM file as trust anchors; a CA that is not valid now is refused.
pub fn roots(path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    roots_expiring(path).map(|(roots, _)| roots)
}

/// [`roots`], and when the first of them expires.
fn roots_expiring(path: &Path) -> Result<(rustls::RootCertStore, Option<i64>), TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    let certs = load_certs(path)?;
    let expiry = earliest_expiry(&certs);
    for cert in certs {
        // webpki does not check a trust anchor's own dates: an expired CA would go on
        // vouching for every certificate it signed.
        if let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref())
            && !parsed.validity().is_valid()
        {
            let v = parsed.validity();
            return Err(file_error(
                path,
                format!(
                    "the CA certificate is not valid now (valid {} to {})",
                    v.not_before, v.not_after
                ),
            ));
        }
        roots
            .add(cert)
            .map_err(|e| file_error(path, format!("not a CA certificate: {e}")))?;
    }
    Ok((roots, expiry))
}

pub(super) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// ALPN identifiers: HTTP/2 (the transport), HTTP/1.1 (one tunnel per connection, for
/// comparison).
const H2: &[u8] = b"h2";
pub(super) const HTTP1: &[u8] = b"http/1.1";

/// The files of a central's node listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

impl ServerFiles {
    /// A server configuration that requires a client certificate chaining to `client_ca`
    /// (unexpired; webpki checks the validity period against the clock).
    pub fn load(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        self.load_expiring().map(|(config, _)| config)
    }

    /// [`ServerFiles::load`], and when its certificate and client CA files expire.
    pub(crate) fn load_expiring(&self) -> Result<(Arc<rustls::ServerConfig>, Expiries), TlsError> {
        let (roots, ca_expiry) = roots_expiring(&self.client_ca)?;
        let certs = load_certs(&self.cert)?;
        let expiries = vec![
            (self.cert.clone(), earliest_expiry(&certs)),
            (self.client_ca.clone(), ca_expiry),
        ];
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| TlsError::Config(format!("{}: {e}", self.client_ca.display())))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, load_key(&self.key)?)
            .map_err(|e| file_error(&self.key, format!("does not match {}: {e}", self.cert.display())))?;
        config.alpn_protocols = vec![H2.to_vec(), HTTP1.to_vec()];
        Ok((Arc::new(config), expiries))
    }
}

/// The files of an admin listener that serves TLS. No client certificate: its callers
/// authenticate with bearer tokens; TLS keeps those and the answers private, and proves
/// the listener to a follower that holds the CA. Loaded, and read again when they change,
/// by `admin_cert.rs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The files of a node's client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFiles {
    /// The CA the central proxies' certificates chain to.
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Offer HTTP/1.1 instead of HTTP/2 (a TLS connection per tunnel, for comparison).
    pub http1: bool,
}

impl ClientFiles {
    /// A client configuration presenting the node's certificate, trusting only `ca`.
    pub fn load(&self) -> Result<Arc<rustls::ClientConfig>, TlsError> {
        self.load_expiring().map(|(config, _)| config)
    }

    /// [`ClientFiles::load`], and when its CA and certificate files expire.
    pub(crate) fn load_expiring(&self) -> Result<(Arc<rustls::ClientConfig>, Expiries), TlsError> {
        let (roots, ca_expiry) = roots_expiring(&self.ca)?;
        let certs = load_certs(&self.cert)?;
        let expiries = vec![
            (self.ca.clone(), ca_expiry),
            (self.cert.clone(), earliest_expiry(&certs)),
        ];
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, load_key(&self.key)?)
            .map_err(|e| file_error(&self.key, format!("does not match {}: {e}", self.cert.display())))?;
        config.alpn_protocols = vec![if self.http1 { HTTP1 } else { H2 }.to_vec()];
        Ok((Arc::new(config), expiries))
    }
}

/// The name a node is known by: the first name of the first certificate in its PEM file
/// (`None`: the certificate has no DNS or IP subject alternative name). Centrals find it
/// in `spec.nodes` by this name, and a run that is a node names its task under it.
pub fn node_name(cert_file: &Path) -> Result<Option<String>, TlsError> {
    let certs = load_certs(cert_file)?;
    Ok(certs.first().and_then(|c| cert_names(c).into_iter().next()))
}

/// The names a certificate carries: its DNS and IP subject alternative names, lower case
/// (a node is known by one of them). Empty when the certificate cannot be parsed.
pub fn cert_names(cert: &CertificateDer<'_>) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Vec::new();
    };
    let Ok(Some(san)) = parsed.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(d) => Some(d.to_ascii_lowercase()),
            GeneralName::IPAddress(b) => match b.len() {
                4 => <[u8; 4]>::try_from(*b)
                    .ok()
                    .map(|a| std::net::IpAddr::from(a).to_string()),
                16 => <[u8; 16]>::try_from(*b)
                    .ok()
                    .map(|a| std::net::IpAddr::from(a).to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO, a device or an endless file at a TLS path is refused at once: the reader
    /// (the watcher's thread, SIGHUP's, a start-up) never blocks on it or fills memory.
    #[test]
    fn a_fifo_a_device_or_a_huge_file_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("ca.pem");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        let refused = |path: &Path| read_tls_file(path).unwrap_err().to_string();
        assert!(refused(&fifo).contains("not a regular file"));
        assert!(refused(Path::new("/dev/zero")).contains("not a regular file"));
        let big = dir.path().join("big.pem");
        std::fs::write(&big, vec![b'A'; 2 << 20]).unwrap();
        assert!(refused(&big).contains("larger than 1 MiB"));
        assert!(load_certs(&fifo).is_err() && load_key(&big).is_err() && roots(&fifo).is_err());
    }
}

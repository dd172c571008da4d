//! A throwaway certificate authority (rcgen) and a server certificate for test names, and a
//! blocking TLS client that trusts only the CAs a test gives it (for a test's own client
//! through a proxy's tunnel).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

/// A CA and one leaf certificate it signed.
#[derive(Debug)]
pub struct TestCa {
    /// The CA certificate, PEM (give it to curl with `--cacert`).
    pub ca_pem: String,
    /// A rustls server config presenting the leaf certificate.
    pub server_config: Arc<rustls::ServerConfig>,
    /// The leaf certificate and its private key, PEM (for a server run as a program).
    pub leaf_pem: String,
    pub leaf_key_pem: String,
}

impl TestCa {
    /// Makes a CA and a leaf certificate valid for `names`.
    pub fn new(names: &[&str]) -> TestCa {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // Distinct names, or the leaf looks self-signed (issuer == subject).
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "sandgate test CA");
        let ca_key = KeyPair::generate().expect("CA key");
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key).expect("CA cert");
        let leaf_names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut leaf_params = CertificateParams::new(leaf_names).expect("leaf params");
        leaf_params
            .distinguished_name
            .push(DnType::CommonName, names.first().copied().unwrap_or("leaf"));
        let leaf_key = KeyPair::generate().expect("leaf key");
        let leaf = leaf_params.signed_by(&leaf_key, &ca).expect("leaf cert");
        let leaf_pem = leaf.pem();
        let leaf_key_pem = leaf_key.serialize_pem();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server_config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone()], key)
            .expect("server cert");
        TestCa {
            ca_pem: ca.pem(),
            server_config: Arc::new(server_config),
            leaf_pem,
            leaf_key_pem,
        }
    }
}

/// A real TLS ClientHello for `name` (a DNS name, or an IP address: then it carries no
/// server name), as rustls's client writes it: one handshake record.
pub fn client_hello(name: &str) -> Vec<u8> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let server = rustls::pki_types::ServerName::try_from(name.to_owned()).expect("server name");
    let mut conn = rustls::ClientConnection::new(Arc::new(config), server).expect("client");
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).expect("write to a Vec");
    }
    out
}

/// The same handshake bytes as the single record `record`, split over two records `at`
/// bytes into its payload (as a client may send them, or an attacker may to hide a name).
pub fn split_record(record: &[u8], at: usize) -> Vec<u8> {
    let (head, payload) = record.split_at(5);
    let (a, b) = payload.split_at(at);
    let mut out = Vec::new();
    for part in [a, b] {
        out.extend_from_slice(&head[..3]);
        out.extend_from_slice(&(part.len() as u16).to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

/// A blocking TLS client (rustls) on a connected TCP stream, such as a tunnel a proxy opened.
/// It trusts only the CA certificates it is given, offers ALPN `http/1.1`, and reads within
/// the stream's own read timeout.
#[derive(Debug)]
pub struct TlsClient(rustls::StreamOwned<rustls::ClientConnection, TcpStream>);

impl TlsClient {
    /// Completes a handshake for `server_name` (a DNS name goes in the SNI; an IP address
    /// sends none) trusting only the certificates in `roots_pem`. `Err` says why it failed: an
    /// unknown issuer, a name the certificate lacks, an alert, the connection closing.
    pub fn handshake(mut tcp: TcpStream, server_name: &str, roots_pem: &str) -> Result<TlsClient, String> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(roots_pem.as_bytes()) {
            let cert = cert.map_err(|e| format!("roots: {e}"))?;
            roots.add(cert).map_err(|e| format!("roots: {e}"))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name =
            rustls::pki_types::ServerName::try_from(server_name.to_owned()).map_err(|e| e.to_string())?;
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
        while conn.is_handshaking() {
            match conn.complete_io(&mut tcp) {
                Ok((0, 0)) => return Err("the connection closed during the handshake".to_owned()),
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(TlsClient(rustls::StreamOwned::new(conn, tcp)))
    }

    /// The certificate the server presented (its leaf, DER).
    pub fn peer_certificate(&self) -> Option<Vec<u8>> {
        let certs = self.0.conn.peer_certificates()?;
        certs.first().map(|c| c.as_ref().to_vec())
    }

    /// The protocol the server chose by ALPN.
    pub fn alpn(&self) -> Option<Vec<u8>> {
        self.0.conn.alpn_protocol().map(<[u8]>::to_vec)
    }
}

impl Read for TlsClient {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for TlsClient {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// The first certificate of `pem`, DER (to compare with [`TlsClient::peer_certificate`]).
pub fn cert_der(pem: &str) -> Vec<u8> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("a PEM certificate")
        .as_ref()
        .to_vec()
}

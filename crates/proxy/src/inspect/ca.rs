//! The interception CA: made in memory when the proxy (or the run) starts, its key never
//! written anywhere, its certificate handed to clients to trust; and the leaf certificate
//! it issues for each intercepted host, kept for reuse.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;
use sandgate_policy::Host;

/// How long the CA is valid from when it is made: a run or a proxy that lives longer needs a
/// restart to renew it.
const CA_DAYS: i64 = 30;
/// Leaf certificates issued and kept, at most; the cache starts over when full.
const MAX_LEAVES: usize = 1024;
/// How long a leaf is valid (from an hour before it is made, for clocks a little behind).
const LEAF_DAYS: i64 = 1;
/// A kept leaf is issued again once this old: half its life, so none is served expired.
const LEAF_RENEW: std::time::Duration = std::time::Duration::from_secs(12 * 3600);

/// Why the CA or a leaf could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot make the interception certificate: {0}")]
pub struct CaError(#[from] rcgen::Error);

/// The interception CA.
pub struct InterceptCa {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    /// Each host's leaf, and when it was issued.
    leaves: Mutex<HashMap<Host, (Arc<CertifiedKey>, std::time::SystemTime)>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl std::fmt::Debug for InterceptCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InterceptCa").finish_non_exhaustive()
    }
}

impl InterceptCa {
    /// A new CA named `name` (`sandgate run-123 interception CA`), valid from an hour ago
    /// for [`CA_DAYS`] days, that may sign leaf certificates only.
    pub fn generate(name: &str) -> Result<InterceptCa, CaError> {
        let now = time::OffsetDateTime::now_utc();
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        params.distinguished_name.push(DnType::CommonName, name);
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(CA_DAYS);
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(InterceptCa {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
            leaves: Mutex::new(HashMap::new()),
            provider: Arc::new(rustls::crypto::ring::default_provider()),
        })
    }

    /// The CA certificate, PEM: what clients trust.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The certificate and key to present for `host`, issued once and kept until half its
    /// life has passed (then issued again).
    pub fn leaf(&self, host: &Host) -> Result<Arc<CertifiedKey>, CaError> {
        self.leaf_at(host, std::time::SystemTime::now())
    }

    fn leaf_at(&self, host: &Host, now: std::time::SystemTime) -> Result<Arc<CertifiedKey>, CaError> {
        let mut leaves = match self.leaves.lock() {
            Ok(l) => l,
            Err(poisoned) => poisoned.into_inner(),
        };
        let fresh =
            |issued: &std::time::SystemTime| now.duration_since(*issued).is_ok_and(|age| age < LEAF_RENEW);
        if let Some((found, _)) = leaves.get(host).filter(|(_, issued)| fresh(issued)) {
            return Ok(found.clone());
        }
        let issued = Arc::new(self.issue(host, now)?);
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(host.clone(), (issued.clone(), now));
        Ok(issued)
    }

    fn issue(&self, host: &Host, at: std::time::SystemTime) -> Result<CertifiedKey, CaError> {
        let now = time::OffsetDateTime::from(at);
        let name = match host {
            Host::Name(n) => n.as_str().to_owned(),
            Host::Ip(ip) => ip.to_string(),
        };
        let mut params = CertificateParams::new(vec![name.clone()])?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(LEAF_DAYS);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signing = self
            .provider
            .key_provider
            .load_private_key(der)
            .map_err(|_| rcgen::Error::CouldNotParseKeyPair)?;
        Ok(CertifiedKey::new(
            vec![CertificateDer::from(cert.der().to_vec())],
            signing,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_are_issued_once_per_host_and_chain_to_the_ca() {
        use rustls::client::danger::ServerCertVerifier;
        let ca = InterceptCa::generate("test CA").unwrap();
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let host = Host::parse("git.example").unwrap();
        let a = ca.leaf(&host).unwrap();
        let b = ca.leaf(&host).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let ip = ca.leaf(&Host::parse("127.0.0.1").unwrap()).unwrap();
        assert!(!Arc::ptr_eq(&a, &ip));
        // The leaf verifies against the CA as a client would.
        let mut roots = rustls::RootCertStore::empty();
        let ca_der = rustls_pemfile_der(ca.cert_pem());
        roots.add(ca_der).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let name = rustls::pki_types::ServerName::try_from("git.example").unwrap();
        let now = rustls::pki_types::UnixTime::now();
        verifier
            .verify_server_cert(&a.cert[0], &[], &name, &[], now)
            .unwrap();
        let other = rustls::pki_types::ServerName::try_from("other.example").unwrap();
        assert!(
            verifier
                .verify_server_cert(&a.cert[0], &[], &other, &[], now)
                .is_err()
        );
    }

    /// A proxy that runs for days never serves a leaf past its end: a kept one is issued
    /// again after half its life.
    #[test]
    fn a_kept_leaf_is_issued_again_before_it_expires() {
        let ca = InterceptCa::generate("test CA").unwrap();
        let host = Host::parse("git.example").unwrap();
        let start = std::time::SystemTime::now();
        let first = ca.leaf_at(&host, start).unwrap();
        let later = ca.leaf_at(&host, start + LEAF_RENEW / 2).unwrap();
        assert!(Arc::ptr_eq(&first, &later));
        let renewed = ca.leaf_at(&host, start + LEAF_RENEW).unwrap();
        assert!(!Arc::ptr_eq(&first, &renewed));
        assert!(LEAF_RENEW < std::time::Duration::from_secs(LEAF_DAYS as u64 * 86_400));
    }

    fn rustls_pemfile_der(pem: &str) -> CertificateDer<'static> {
        use rustls::pki_types::pem::PemObject;
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }
}

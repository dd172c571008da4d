//! The admin listener's certificate, read again when its files change: cert-manager (or any
//! renewal) rewrites the certificate and key in place, and the next TLS handshake after it
//! presents the new pair, with no restart. A rustls certificate resolver, so the listener's
//! configuration stays one value: each handshake asks it for the pair in force, and at most
//! once a second it looks at the files (their contents' length and hash: a Secret volume's
//! symlink swap and a rewrite in place both show) and, when they changed, loads them.
//!
//! Never fails open: new files that do not load (unreadable, not PEM, a key that does not
//! match the certificate, a pair caught half-written) leave the pair in force, with a
//! warning; the files are tried again when they change again. Connections already up keep
//! the certificate they were made with. The node listener's TLS reloads differently
//! (`reload.rs`: swapped whole, so its connections can tell they are older).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::reload::{Stamp, stamps};
use super::tls::{AdminFiles, HTTP1, TlsError, load_certs, load_key, provider};

/// How often, at most, the files are looked at (only when a handshake asks).
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The certificate and key in force, and what the files were when last looked at.
#[derive(Debug)]
struct InForce {
    pair: Arc<CertifiedKey>,
    checked: Instant,
    /// The files' stamps when last loaded or tried: a change from these is tried once.
    seen: Vec<Stamp>,
}

/// The admin listener's certificate resolver.
#[derive(Debug)]
struct AdminCert {
    files: AdminFiles,
    provider: Arc<rustls::crypto::CryptoProvider>,
    in_force: Mutex<InForce>,
}

impl AdminCert {
    /// Loads the files now: an error here stops the start (the caller reports it).
    fn new(files: AdminFiles, provider: Arc<rustls::crypto::CryptoProvider>) -> Result<AdminCert, TlsError> {
        let seen = stamps(&files.paths());
        let pair = Arc::new(certified(&files, &provider)?);
        Ok(AdminCert {
            files,
            provider,
            in_force: Mutex::new(InForce {
                pair,
                checked: Instant::now(),
                seen,
            }),
        })
    }

    /// The pair in force, after loading the files if they changed since last looked at
    /// (at most once a second).
    fn current(&self) -> Arc<CertifiedKey> {
        let mut in_force = self
            .in_force
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if in_force.checked.elapsed() < CHECK_EVERY {
            return in_force.pair.clone();
        }
        in_force.checked = Instant::now();
        // Stamped before loading: files changed in between are loaded again next time.
        let seen = stamps(&self.files.paths());
        if seen != in_force.seen {
            in_force.seen = seen;
            match certified(&self.files, &self.provider) {
                Ok(pair) => {
                    in_force.pair = Arc::new(pair);
                    tracing::info!(cert = %self.files.cert.display(), "admin TLS certificate reloaded");
                }
                Err(error) => tracing::warn!(
                    %error,
                    "admin TLS: the changed certificate files do not load; the certificate in force stays"
                ),
            }
        }
        in_force.pair.clone()
    }
}

impl ResolvesServerCert for AdminCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The certificate chain and key of `files`, the key proven to be the certificate's.
fn certified(
    files: &AdminFiles,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let mismatch = |e: rustls::Error| TlsError::File {
        path: files.key.clone(),
        reason: format!("does not match {}: {e}", files.cert.display()),
    };
    let certs = load_certs(&files.cert)?;
    let pair = CertifiedKey::from_der(certs, load_key(&files.key)?, provider).map_err(mismatch)?;
    // `from_der` lets a key whose public half it cannot read pass; here it must match.
    pair.keys_match().map_err(mismatch)?;
    Ok(pair)
}

impl AdminFiles {
    /// The listener's configuration: the pair read now (an error is the caller's to
    /// report), and read again after the files change.
    pub fn load(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let certs = AdminCert::new(self.clone(), provider())?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(certs));
        config.alpn_protocols = vec![HTTP1.to_vec()];
        Ok(Arc::new(config))
    }

    fn paths(&self) -> Vec<PathBuf> {
        vec![self.cert.clone(), self.key.clone()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate for 127.0.0.1 and its key, PEM.
    fn leaf() -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn a_changed_pair_is_taken_and_a_broken_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let files = AdminFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
        };
        let write = |(cert, key): &(String, String)| {
            std::fs::write(&files.cert, cert).unwrap();
            std::fs::write(&files.key, key).unwrap();
        };
        let (first, second) = (leaf(), leaf());
        write(&first);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let resolver = AdminCert::new(files.clone(), provider).unwrap();
        let der = |pem: &str| {
            use rustls::pki_types::pem::PemObject;
            rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
        };
        let in_force = |r: &AdminCert| {
            // As if a second had passed since the files were last looked at.
            r.in_force.lock().unwrap().checked -= CHECK_EVERY;
            r.current().cert[0].clone()
        };
        assert_eq!(in_force(&resolver), der(&first.0));
        write(&second);
        assert_eq!(in_force(&resolver), der(&second.0), "the renewed pair");
        // The first certificate with the second's key: a mismatch keeps the second.
        std::fs::write(&files.cert, &first.0).unwrap();
        assert_eq!(
            in_force(&resolver),
            der(&second.0),
            "a mismatched pair is refused"
        );
        std::fs::write(&files.cert, "not a certificate").unwrap();
        assert_eq!(in_force(&resolver), der(&second.0), "a broken file is refused");
        write(&first);
        assert_eq!(in_force(&resolver), der(&first.0), "a good pair again");
        // Within the second, the files are not looked at.
        write(&second);
        assert_eq!(resolver.current().cert[0], der(&first.0));
        // At start, a mismatched pair is an error, as a broken file is.
        std::fs::write(&files.key, &first.1).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let err = AdminCert::new(files.clone(), provider).unwrap_err();
        assert!(err.to_string().contains("does not match"), "{err}");
    }
}

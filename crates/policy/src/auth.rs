//! Task credentials for shared listeners: `Proxy-Authorization: Basic` (RFC 7617, sent to a
//! proxy per RFC 9110 section 11.7.2) with a task id as the user and a per-task secret.
//!
//! Only the SHA-256 of each secret is kept. Secrets are meant to be random tokens (128 bits
//! or more) issued per task, not human passwords, so a fast hash is enough; comparison runs
//! in constant time. Pure: the header value in, the task's identity or a refusal out.

use std::collections::HashMap;

use base64::Engine as _;
use sha2::{Digest, Sha256};

/// What a verified credential stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskCredential {
    pub task: String,
    pub project: Option<String>,
    sha256: [u8; 32],
}

impl TaskCredential {
    /// A credential from the hex SHA-256 of the secret.
    pub fn from_hex(task: String, project: Option<String>, hex: &str) -> Result<TaskCredential, AuthError> {
        let hex = hex.trim();
        if hex.len() != 64 {
            return Err(AuthError::BadHash);
        }
        let mut sha256 = [0u8; 32];
        for (i, byte) in sha256.iter_mut().enumerate() {
            let pair = hex.get(i * 2..i * 2 + 2).ok_or(AuthError::BadHash)?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| AuthError::BadHash)?;
        }
        Ok(TaskCredential {
            task,
            project,
            sha256,
        })
    }
}

/// Why credentials were refused (each becomes 407).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("proxy credentials required")]
    Missing,
    #[error("malformed proxy credentials")]
    Malformed,
    #[error("wrong proxy credentials")]
    Wrong,
    #[error("secret hash must be 64 hex digits (SHA-256)")]
    BadHash,
}

impl AuthError {
    pub fn code(self) -> &'static str {
        match self {
            AuthError::Missing => "proxy_auth_missing",
            AuthError::Malformed => "proxy_auth_malformed",
            AuthError::Wrong | AuthError::BadHash => "proxy_auth_wrong",
        }
    }
}

/// Every task's credential, by task id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    by_task: HashMap<String, TaskCredential>,
}

/// Longest Proxy-Authorization value looked at.
const MAX_HEADER: usize = 1024;

impl Credentials {
    pub fn new(list: Vec<TaskCredential>) -> Credentials {
        Credentials {
            by_task: list.into_iter().map(|c| (c.task.clone(), c)).collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_task.is_empty()
    }

    /// Verifies a `Proxy-Authorization` value (`None` when the header is absent).
    pub fn verify(&self, header: Option<&[u8]>) -> Result<&TaskCredential, AuthError> {
        let value = header.ok_or(AuthError::Missing)?;
        if value.len() > MAX_HEADER {
            return Err(AuthError::Malformed);
        }
        let text = std::str::from_utf8(value)
            .map_err(|_| AuthError::Malformed)?
            .trim();
        let (scheme, token) = text.split_once(' ').ok_or(AuthError::Malformed)?;
        if !scheme.eq_ignore_ascii_case("basic") {
            return Err(AuthError::Malformed);
        }
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(token.trim())
            .map_err(|_| AuthError::Malformed)?;
        let decoded = String::from_utf8(decoded).map_err(|_| AuthError::Malformed)?;
        let (task, secret) = decoded.split_once(':').ok_or(AuthError::Malformed)?;
        let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        let Some(cred) = self.by_task.get(task) else {
            // Same work either way, so timing does not tell which task ids exist.
            let _ = constant_time_eq(&digest, &[0u8; 32]);
            return Err(AuthError::Wrong);
        };
        if constant_time_eq(&digest, &cred.sha256) {
            Ok(cred)
        } else {
            Err(AuthError::Wrong)
        }
    }
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Hex SHA-256 of a secret, for writing policy files (`sandgate` prints it on request).
pub fn secret_hash(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds() -> Credentials {
        let hash = secret_hash("s3cret-token");
        Credentials::new(vec![
            TaskCredential::from_hex("t-1".into(), Some("p-9".into()), &hash).unwrap(),
        ])
    }

    fn basic(user_pass: &str) -> Vec<u8> {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(user_pass)
        )
        .into_bytes()
    }

    #[test]
    fn right_wrong_missing_malformed() {
        let c = creds();
        let ok = c.verify(Some(&basic("t-1:s3cret-token"))).unwrap();
        assert_eq!((ok.task.as_str(), ok.project.as_deref()), ("t-1", Some("p-9")));
        assert_eq!(c.verify(Some(&basic("t-1:wrong"))), Err(AuthError::Wrong));
        assert_eq!(c.verify(Some(&basic("t-2:s3cret-token"))), Err(AuthError::Wrong));
        assert_eq!(c.verify(None), Err(AuthError::Missing));
        for bad in [&b"Bearer abc"[..], b"Basic !!!", b"Basic", &basic("no-colon")] {
            assert_eq!(
                c.verify(Some(bad)),
                Err(AuthError::Malformed),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(c.verify(Some(&vec![b'a'; 2000])), Err(AuthError::Malformed));
    }

    #[test]
    fn hashes_must_be_sha256_hex() {
        assert!(TaskCredential::from_hex("t".into(), None, "abc").is_err());
        assert!(TaskCredential::from_hex("t".into(), None, &"zz".repeat(32)).is_err());
        assert_eq!(
            secret_hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}

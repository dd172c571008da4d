//! Task credentials for shared listeners: a task id as the user and a per-task secret, as
//! front ends carry them (HTTP's `Proxy-Authorization: Basic`, SOCKS5's RFC 1929 login; the
//! wire parsing is theirs).
//!
//! Only the SHA-256 of each secret is kept. Secrets are meant to be random tokens (128 bits
//! or more) issued per task, not human passwords, so a fast hash is enough; comparison runs
//! in constant time. Pure: a login in, the task's identity or a refusal out.

use std::collections::HashMap;

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

impl Credentials {
    pub fn new(list: Vec<TaskCredential>) -> Credentials {
        Credentials {
            by_task: list.into_iter().map(|c| (c.task.clone(), c)).collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_task.is_empty()
    }

    /// Verifies a login (a task id and its secret), however the front end carried it:
    /// HTTP's `Proxy-Authorization: Basic`, SOCKS5's username/password (RFC 1929).
    pub fn verify_login(&self, task: &str, secret: &str) -> Result<&TaskCredential, AuthError> {
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

/// What an admin API token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Files exception requests for the tasks its token names, and reads their state.
    Requester,
    /// Approves, denies and revokes; reads everything.
    Approver,
    /// Reads everything.
    Viewer,
    /// Reads exceptions and their changes, nothing else: the token of a proxy that follows
    /// a control plane it does not host (`--exceptions-from`). It cannot request, decide or
    /// log in to the approvals page, and its live events are the exception changes only.
    Follower,
}

impl Role {
    pub fn parse(text: &str) -> Option<Role> {
        match text {
            "requester" => Some(Role::Requester),
            "approver" => Some(Role::Approver),
            "viewer" => Some(Role::Viewer),
            "follower" => Some(Role::Follower),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Requester => "requester",
            Role::Approver => "approver",
            Role::Viewer => "viewer",
            Role::Follower => "follower",
        }
    }

    /// Whether the role may log in to the approvals page (to look, or to decide).
    pub fn uses_page(self) -> bool {
        matches!(self, Role::Approver | Role::Viewer)
    }
}

/// A verified admin API caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub role: Role,
    /// For requesters: the tasks they may ask for.
    pub tasks: Vec<String>,
    sha256: [u8; 32],
}

/// The admin API's bearer tokens (SHA-256 only, compared in constant time).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Principals {
    list: Vec<Principal>,
}

impl Principals {
    /// From `(name, role, hex SHA-256, tasks)`.
    pub fn new(tokens: Vec<(String, Role, String, Vec<String>)>) -> Result<Principals, AuthError> {
        let mut list = Vec::with_capacity(tokens.len());
        for (name, role, hex, tasks) in tokens {
            let sha256 = TaskCredential::from_hex(String::new(), None, &hex)?.sha256;
            list.push(Principal {
                name,
                role,
                tasks,
                sha256,
            });
        }
        Ok(Principals { list })
    }

    /// The principal a bearer token belongs to. Every token is compared, so timing does not
    /// tell how many there are or which one matched.
    pub fn verify_bearer(&self, token: &str) -> Option<&Principal> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for p in &self.list {
            if constant_time_eq(&digest, &p.sha256) && found.is_none() {
                found = Some(p);
            }
        }
        found
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
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

    #[test]
    fn right_and_wrong_logins() {
        let c = creds();
        let ok = c.verify_login("t-1", "s3cret-token").unwrap();
        assert_eq!((ok.task.as_str(), ok.project.as_deref()), ("t-1", Some("p-9")));
        assert_eq!(c.verify_login("t-1", "wrong"), Err(AuthError::Wrong));
        assert_eq!(c.verify_login("t-2", "s3cret-token"), Err(AuthError::Wrong));
        assert_eq!(c.verify_login("", ""), Err(AuthError::Wrong));
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

//! The MCP server's own audit log: one JSON line per tool call (who, which tool and
//! sandbox, the command's SHA-256, how it ended, how long it took), fsynced per line. It
//! fails closed: a call whose start cannot be recorded does not run.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use serde_json::{Map, Value, json};

/// The schema of each line (`schema_version`).
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug)]
pub struct ToolAudit {
    file: Mutex<File>,
}

impl ToolAudit {
    /// Opens (creates) the log for appending; the server does not start without it.
    pub fn open(path: &Path) -> std::io::Result<ToolAudit> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(ToolAudit {
            file: Mutex::new(file),
        })
    }

    /// Writes one event (`event` and the fields of `fields`) and syncs it to disk.
    pub fn record(&self, event: &str, fields: Value) -> Result<(), String> {
        let mut line = Map::new();
        line.insert("schema_version".into(), json!(SCHEMA_VERSION));
        line.insert("event".into(), json!(event));
        line.insert("created_at".into(), json!(jiff::Timestamp::now().to_string()));
        if let Value::Object(more) = fields {
            line.extend(more);
        }
        let mut text = Value::Object(line).to_string();
        text.push('\n');
        let mut file = self
            .file
            .lock()
            .map_err(|_| "the audit log is unusable".to_owned())?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_data())
            .map_err(|e| format!("the MCP audit log cannot be written ({e}); nothing runs unrecorded"))
    }
}

/// The hex SHA-256 of a command line (its arguments NUL-separated), so the audit names
/// exactly what ran without keeping secrets an agent put in arguments.
pub fn command_digest(command: &[String]) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for (i, a) in command.iter().enumerate() {
        if i > 0 {
            h.update([0u8]);
        }
        h.update(a.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_separate_arguments() {
        let a = command_digest(&["echo".into(), "a b".into()]);
        let b = command_digest(&["echo".into(), "a".into(), "b".into()]);
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
    }

    #[test]
    fn a_log_that_cannot_be_written_refuses() {
        // /dev/full accepts the open and fails every write, like a full disk.
        let audit = ToolAudit::open(Path::new("/dev/full")).unwrap_or_else(|e| unreachable!("{e}"));
        let Err(err) = audit.record("tool_call", json!({"tool": "run"})) else {
            unreachable!("a write to /dev/full succeeded")
        };
        assert!(err.contains("nothing runs unrecorded"), "{err}");
    }
}

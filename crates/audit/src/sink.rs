//! Where audit lines end up: stdout or an append-only file that rotates by size, behind a
//! buffer of whole lines that is never dropped on a write error.
//!
//! Every line handed to [`Sink::push`] stays in `pending` until the operating system has
//! taken all of its bytes. A failed write (a full disk, `EMFILE` while rotating, a closed
//! stdout) keeps what was not written, and the next [`Sink::flush`] carries on from the
//! exact byte where the last one stopped, so a recovered sink writes every line once and
//! whole. Rotation happens between lines, by the one writer thread; a rotation that failed
//! half way resumes where it stopped (the file renamed but the new one not yet opened is
//! reopened, not renamed again).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Instant;

use crate::{AuditDestination, AuditOptions};

/// A destination with its unwritten lines.
pub(crate) struct Sink {
    target: Target,
    /// Whole lines not yet taken by the OS (a prefix may have been, after a short write).
    pending: Vec<u8>,
}

enum Target {
    Stdout,
    File(RotatingFile),
}

impl Sink {
    /// Opens the destination; a file that cannot be opened is an error (the proxy then
    /// does not start).
    pub fn open(dest: &AuditDestination, options: &AuditOptions) -> io::Result<Sink> {
        let target = match dest {
            AuditDestination::Stdout => Target::Stdout,
            AuditDestination::File(path) => Target::File(RotatingFile::open(path.clone(), options.clone())?),
        };
        Ok(Sink {
            target,
            pending: Vec::with_capacity(64 * 1024),
        })
    }

    /// Queues one whole line. Never fails and never writes: [`Sink::flush`] does.
    pub fn push(&mut self, line: &[u8]) {
        if let Target::File(f) = &mut self.target {
            f.before_line(line.len() as u64, self.pending.len());
        }
        self.pending.extend_from_slice(line);
    }

    /// Bytes waiting to be written.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Writes everything pending (rotating where due) and, for a file, fsyncs when due or
    /// when `last`. On error the unwritten remainder stays for the next call.
    pub fn flush(&mut self, last: bool) -> io::Result<()> {
        match &mut self.target {
            Target::Stdout => {
                let mut out = io::stdout().lock();
                write_prefix(&mut out, &mut self.pending, usize::MAX).1?;
                out.flush()
            }
            Target::File(f) => f.flush(&mut self.pending, last),
        }
    }

    /// The lines that could not be written, for a last-resort copy on stderr at shutdown.
    pub fn take_pending(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.pending)
    }
}

/// Writes up to `limit` bytes from the front of `pending`, removing what was written even
/// when a later write fails. Returns the bytes written and how the writing ended.
fn write_prefix(out: &mut dyn Write, pending: &mut Vec<u8>, limit: usize) -> (usize, io::Result<()>) {
    let want = limit.min(pending.len());
    let mut written = 0;
    let result = loop {
        if written == want {
            break Ok(());
        }
        match out.write(pending.get(written..want).unwrap_or_default()) {
            Ok(0) => break Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    pending.drain(..written);
    (written, result)
}

/// An append-only file that rotates by size.
struct RotatingFile {
    path: PathBuf,
    /// `None` after a rotation renamed the file but could not open the new one.
    file: Option<File>,
    /// Bytes in the current file plus the pending bytes bound for it.
    size: u64,
    /// Offsets into `pending` where rotations fall, in order (the lines before the first go
    /// to the current file, those between two to one rotated file each).
    rotate_at: std::collections::VecDeque<usize>,
    options: AuditOptions,
    last_sync: Instant,
    unsynced: bool,
}

impl RotatingFile {
    fn open(path: PathBuf, options: AuditOptions) -> io::Result<RotatingFile> {
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        let size = file.metadata()?.len();
        Ok(RotatingFile {
            path,
            file: Some(file),
            size,
            rotate_at: std::collections::VecDeque::new(),
            options,
            last_sync: Instant::now(),
            unsynced: false,
        })
    }

    /// Called before a line of `len` bytes joins `pending` (now `pending_len` long): marks
    /// a rotation point when the line would take the file past its size limit.
    fn before_line(&mut self, len: u64, pending_len: usize) {
        let over = self
            .options
            .max_bytes
            .is_some_and(|max| self.size > 0 && self.size + len > max);
        if over {
            self.rotate_at.push_back(pending_len);
            self.size = 0;
        }
        self.size += len;
    }

    /// `audit.jsonl` with `.N` appended.
    fn numbered(&self, n: usize) -> PathBuf {
        let mut name = self.path.clone().into_os_string();
        name.push(format!(".{n}"));
        name.into()
    }

    fn reopen(&mut self) -> io::Result<()> {
        if self.file.is_none() {
            self.file = Some(OpenOptions::new().create(true).append(true).open(&self.path)?);
        }
        Ok(())
    }

    fn flush(&mut self, pending: &mut Vec<u8>, last: bool) -> io::Result<()> {
        while let Some(&at) = self.rotate_at.front() {
            self.reopen()?;
            let Some(file) = self.file.as_mut() else {
                return Err(not_open());
            };
            let (written, result) = write_prefix(file, pending, at);
            // What was written left `pending`; every rotation point moves with it.
            self.rotate_at.iter_mut().for_each(|p| *p -= written);
            result?;
            self.rotate()?;
            self.rotate_at.pop_front();
        }
        self.reopen()?;
        let Some(file) = self.file.as_mut() else {
            return Err(not_open());
        };
        if !pending.is_empty() {
            let (written, result) = write_prefix(file, pending, usize::MAX);
            self.unsynced |= written > 0;
            result?;
        }
        let due = self
            .options
            .fsync_interval
            .is_some_and(|every| self.last_sync.elapsed() >= every);
        if self.unsynced && (last || due) {
            file.sync_data()?;
            self.last_sync = Instant::now();
            self.unsynced = false;
        }
        Ok(())
    }

    /// Renames the full file away and opens a fresh one. The old file is synced first; if
    /// opening the new one fails, the next flush opens it (the renames are not repeated).
    fn rotate(&mut self) -> io::Result<()> {
        if let Some(old) = &self.file {
            old.sync_data()?;
            let keep = self.options.keep;
            if keep == 0 {
                std::fs::remove_file(&self.path)?;
            } else {
                let _ = std::fs::remove_file(self.numbered(keep));
                for n in (1..keep).rev() {
                    let from = self.numbered(n);
                    if from.exists() {
                        std::fs::rename(&from, self.numbered(n + 1))?;
                    }
                }
                std::fs::rename(&self.path, self.numbered(1))?;
            }
            self.file = None;
            self.unsynced = false;
        }
        self.reopen()
    }
}

fn not_open() -> io::Error {
    io::Error::other("audit file not open")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: std::ops::Range<usize>) -> Vec<String> {
        n.map(|i| format!("{{\"n\":{i:04}}}\n")).collect()
    }

    #[test]
    fn a_failed_rotation_keeps_every_line_and_resumes_where_it_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let options = AuditOptions {
            max_bytes: Some(100),
            keep: 1,
            fsync_interval: None,
            aggregate_window: None,
        };
        let mut sink = Sink::open(&AuditDestination::File(path.clone()), &options).unwrap();
        // `audit.jsonl.1` is a non-empty directory, so the rename of a full file fails.
        let blocker = dir.path().join("audit.jsonl.1");
        std::fs::create_dir(&blocker).unwrap();
        std::fs::write(blocker.join("x"), "").unwrap();
        let all = lines(0..18);
        for l in &all {
            sink.push(l.as_bytes());
        }
        assert!(sink.flush(false).is_err());
        assert!(
            sink.flush(false).is_err(),
            "still failing, nothing lost or repeated"
        );
        assert!(sink.pending_len() > 0);
        std::fs::remove_dir_all(&blocker).unwrap();
        sink.flush(true).unwrap();
        assert_eq!(sink.pending_len(), 0);
        let rotated = std::fs::read_to_string(&blocker).unwrap();
        let current = std::fs::read_to_string(&path).unwrap();
        // Each file holds whole lines, under the limit, and together every line once.
        assert!(
            rotated.len() <= 100 && current.len() <= 100,
            "{rotated:?} {current:?}"
        );
        assert_eq!(format!("{rotated}{current}"), all.concat());
        assert_eq!((rotated.len(), current.len()), (99, 99));
    }
}

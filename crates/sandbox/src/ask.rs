//! `sandgate run --ask`: when only the allowlist refuses a destination, the run's proxy
//! holds the request and asks on the controlling terminal (`/dev/tty`): allow it once, for
//! this run, for 15 minutes, or deny. No terminal, or no answer within the timeout, is a
//! deny. One question at a time; an answer for the run (or a deny) is remembered, so the same
//! destination is not asked twice. The answer becomes an exception recorded like any other
//! (see `sandgate_proxy::ask`), decided by the local user.

use std::collections::HashMap;
use std::future::Future;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::pin::Pin;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use sandgate_policy::{Access, Target};
use sandgate_proxy::ask::{Answer, Asker};

/// Answers given, by destination (host, port): the answer and until when it holds (`None`:
/// the whole run).
type Memo = HashMap<(String, u16), (Answer, Option<Instant>)>;

/// Asks the person at the controlling terminal.
#[derive(Debug)]
pub struct TerminalAsker {
    timeout: Duration,
    user: String,
    memo: tokio::sync::Mutex<Memo>,
}

impl TerminalAsker {
    pub fn new(timeout: Duration) -> TerminalAsker {
        let user = std::env::var("USER")
            .or_else(|_| std::env::var("LOGNAME"))
            .unwrap_or_else(|_| format!("uid-{}", rustix::process::getuid().as_raw()));
        TerminalAsker {
            timeout,
            user: format!("{user} (terminal)"),
            memo: tokio::sync::Mutex::new(HashMap::new()),
        }
    }
}

impl Asker for TerminalAsker {
    fn ask<'a>(
        &'a self,
        _task: &'a str,
        target: &'a Target,
        access: Access,
    ) -> Pin<Box<dyn Future<Output = Answer> + Send + 'a>> {
        Box::pin(async move {
            // One question at a time: the lock is held while the person answers.
            let mut memo = self.memo.lock().await;
            let key = (target.host.to_string(), target.port);
            if let Some((answer, until)) = memo.get(&key)
                && until.is_none_or(|u| Instant::now() < u)
            {
                return *answer;
            }
            let question = format!(
                "\r\nsandgate: the sandbox asks for {target} ({}). Allow [o]nce, for this [r]un, for [1]5 minutes, or [d]eny? (deny in {} s) ",
                access.scheme(),
                self.timeout.as_secs()
            );
            let answer = match prompt(&question, Instant::now() + self.timeout).await {
                Ok(line) => parse(&line),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    say("\r\nsandgate: no answer in time; denied\r\n");
                    Answer::Deny
                }
                Err(e) => {
                    tracing::warn!(error = %e, "no terminal to ask on; denied");
                    Answer::Deny
                }
            };
            say(&format!("sandgate: {target}: {}\r\n", describe(answer)));
            match answer {
                Answer::ForRun | Answer::Deny => {
                    memo.insert(key, (answer, None));
                }
                Answer::ForSeconds(s) => {
                    memo.insert(
                        key,
                        (answer, Some(Instant::now() + Duration::from_secs(u64::from(s)))),
                    );
                }
                Answer::Once => {}
            }
            answer
        })
    }

    fn decider(&self) -> String {
        self.user.clone()
    }
}

/// The first letter decides; anything else is a deny.
fn parse(line: &str) -> Answer {
    match line.trim().chars().next().map(|c| c.to_ascii_lowercase()) {
        Some('o') => Answer::Once,
        Some('r') => Answer::ForRun,
        Some('1') => Answer::ForSeconds(15 * 60),
        _ => Answer::Deny,
    }
}

fn describe(a: Answer) -> &'static str {
    match a {
        Answer::Once => "allowed once",
        Answer::ForRun => "allowed for this run",
        Answer::ForSeconds(_) => "allowed for 15 minutes",
        Answer::Deny => "denied",
    }
}

fn say(text: &str) {
    if let Ok(mut tty) = std::fs::OpenOptions::new().write(true).open("/dev/tty") {
        let _ = tty.write_all(text.as_bytes());
    }
}

/// Writes the question to the terminal and reads one line (at most 256 bytes), on a
/// blocking thread that polls in short slices and gives up at the deadline by itself.
async fn prompt(question: &str, deadline: Instant) -> std::io::Result<String> {
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open("/dev/tty")?;
    (&tty).write_all(question.as_bytes())?;
    tokio::task::spawn_blocking(move || read_line(tty, deadline))
        .await
        .map_err(std::io::Error::other)?
}

fn read_line(mut tty: std::fs::File, deadline: Instant) -> std::io::Result<String> {
    use std::os::fd::AsFd;
    let mut line = Vec::new();
    while Instant::now() < deadline {
        let mut fds = [PollFd::new(tty.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(200u16)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
        let mut chunk = [0u8; 64];
        match tty.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                line.extend_from_slice(chunk.get(..n).unwrap_or_default());
                if line.contains(&b'\n') || line.len() > 256 {
                    return Ok(String::from_utf8_lossy(&line).into_owned());
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Err(std::io::ErrorKind::TimedOut.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_by_first_letter_and_anything_else_denies() {
        assert_eq!(parse("o\n"), Answer::Once);
        assert_eq!(parse(" Run\n"), Answer::ForRun);
        assert_eq!(parse("15\n"), Answer::ForSeconds(900));
        for no in ["d\n", "\n", "yes\n", "x"] {
            assert_eq!(parse(no), Answer::Deny, "{no:?}");
        }
    }
}

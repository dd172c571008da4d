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

/// Questions that may go unanswered (denied or timed out) in one run before the run stops
/// asking and denies at once: a command cannot keep the person, and every other request,
/// busy with a stream of new names.
const MAX_UNANSWERED: u32 = 5;

/// Asks the person at the controlling terminal.
#[derive(Debug)]
pub struct TerminalAsker {
    timeout: Duration,
    /// bwrap's pid, once the sandbox runs: its processes are stopped while a question is on
    /// the screen, so the command cannot redraw it.
    sandbox: std::sync::Arc<std::sync::OnceLock<i32>>,
    user: String,
    unanswered: std::sync::atomic::AtomicU32,
    memo: tokio::sync::Mutex<Memo>,
}

impl TerminalAsker {
    pub fn new(timeout: Duration, sandbox: std::sync::Arc<std::sync::OnceLock<i32>>) -> TerminalAsker {
        let user = std::env::var("USER")
            .or_else(|_| std::env::var("LOGNAME"))
            .unwrap_or_else(|_| format!("uid-{}", rustix::process::getuid().as_raw()));
        TerminalAsker {
            timeout,
            sandbox,
            user: format!("{user} (terminal)"),
            unanswered: std::sync::atomic::AtomicU32::new(0),
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
            if self.unanswered.load(std::sync::atomic::Ordering::Relaxed) >= MAX_UNANSWERED {
                return Answer::Deny;
            }
            // The command shares the terminal: running, it could redraw the question (the
            // host name, over another) while the person reads it. It is stopped first, every
            // process of it, and continues once the answer is in; one that will not hold
            // still is denied.
            let Some(root) = self.sandbox.get().copied() else {
                return Answer::Deny;
            };
            let frozen = tokio::task::spawn_blocking(move || crate::processes::freeze(root))
                .await
                .ok()
                .flatten();
            let Some(frozen) = frozen else {
                say("\r\nsandgate: the sandbox would not hold still to be asked; denied\r\n");
                return Answer::Deny;
            };
            let frozen = std::sync::Arc::new(frozen);
            // The answer must carry a code only the terminal shows: whatever the command
            // inside made the person type (or typed ahead) cannot approve anything.
            let code = random_code();
            // A soft terminal reset first (DECSTR: scrolling region, insert mode, character
            // sets, attributes), so nothing the command set before it stopped (an invisible
            // attribute, another character set) changes how the question reads.
            let question = format!(
                "\x1b[!p\x1b[0m\r\nsandgate: the sandbox asks for {target} ({}). Type o-{code} to allow once, r-{code} for this run, 15-{code} for 15 minutes; anything else denies (in {} s): ",
                access.scheme(),
                self.timeout.as_secs()
            );
            let answer = match prompt(question, Instant::now() + self.timeout, frozen.clone()).await {
                Ok(line) => parse(&line, &code),
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    say(&format!("\r\nsandgate: {e}; denied\r\n"));
                    Answer::Deny
                }
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
            if answer == Answer::Deny
                && self.unanswered.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 == MAX_UNANSWERED
            {
                say("sandgate: too many questions went unanswered; the rest of this run is not asked\r\n");
            }
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

/// `o-CODE`, `r-CODE` or `15-CODE` with this question's code; anything else is a deny.
fn parse(line: &str, code: &str) -> Answer {
    let line = line.trim().to_ascii_lowercase();
    let Some((choice, given)) = line.split_once('-') else {
        return Answer::Deny;
    };
    if given != code {
        return Answer::Deny;
    }
    match choice {
        "o" => Answer::Once,
        "r" => Answer::ForRun,
        "15" => Answer::ForSeconds(15 * 60),
        _ => Answer::Deny,
    }
}

/// Four random digits from the kernel (fixed digits if it has none: then nothing matches
/// a typed-ahead single letter either).
fn random_code() -> String {
    let mut bytes = [0u8; 2];
    let ok = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    let n = if ok.is_ok() {
        u16::from_le_bytes(bytes) % 10_000
    } else {
        4711
    };
    format!("{n:04}")
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
///
/// The sandbox shares the terminal and could have made its own process group the
/// terminal's foreground before it was frozen: sandgate's writes would then stop it
/// (SIGTTOU), and the shell's `fg` would continue the whole job, the frozen sandbox with it,
/// while the question is on the screen. So, with SIGTTOU blocked in this thread, sandgate
/// takes the foreground for its own process group, checks that the freeze still holds, and
/// only then asks; once the line is read it checks both again (an error of kind
/// `PermissionDenied` when either moved: the answer does not count). The foreground goes
/// back to the group that had it.
async fn prompt(
    question: String,
    deadline: Instant,
    frozen: std::sync::Arc<crate::processes::Frozen>,
) -> std::io::Result<String> {
    tokio::task::spawn_blocking(move || {
        let tty = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open("/dev/tty")?;
        let _quiet = BlockTtou::new();
        let _foreground = Foreground::take(&tty)?;
        let moved = || {
            std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "the sandbox moved while asked",
            )
        };
        if !frozen.holds() {
            return Err(moved());
        }
        // Whatever was typed before the question (typeahead, an answer meant for the
        // command) is discarded.
        let _ = nix::sys::termios::tcflush(&tty, nix::sys::termios::FlushArg::TCIFLUSH);
        (&tty).write_all(question.as_bytes())?;
        let line = read_line(&tty, deadline)?;
        if !frozen.holds() || !Foreground::ours(&tty) {
            return Err(moved());
        }
        Ok(line)
    })
    .await
    .map_err(std::io::Error::other)?
}

/// SIGTTOU blocked in this thread while it lives: a background process that blocks it may
/// set the terminal's foreground, write and flush without being stopped (POSIX tcsetpgrp).
struct BlockTtou(nix::sys::signal::SigSet);

impl BlockTtou {
    fn new() -> BlockTtou {
        use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
        let mut set = SigSet::empty();
        set.add(Signal::SIGTTOU);
        let mut old = SigSet::empty();
        let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), Some(&mut old));
        BlockTtou(old)
    }
}

impl Drop for BlockTtou {
    fn drop(&mut self) {
        let _ =
            nix::sys::signal::pthread_sigmask(nix::sys::signal::SigmaskHow::SIG_SETMASK, Some(&self.0), None);
    }
}

/// The terminal's foreground taken for sandgate's process group; given back on drop.
struct Foreground<'a> {
    tty: &'a std::fs::File,
    before: Option<nix::unistd::Pid>,
}

impl<'a> Foreground<'a> {
    fn take(tty: &'a std::fs::File) -> std::io::Result<Foreground<'a>> {
        let before = nix::unistd::tcgetpgrp(tty).ok();
        let ours = nix::unistd::getpgrp();
        if before != Some(ours) {
            nix::unistd::tcsetpgrp(tty, ours)?;
        }
        Ok(Foreground {
            tty,
            before: before.filter(|b| *b != ours),
        })
    }

    fn ours(tty: &std::fs::File) -> bool {
        nix::unistd::tcgetpgrp(tty).ok() == Some(nix::unistd::getpgrp())
    }
}

impl Drop for Foreground<'_> {
    fn drop(&mut self) {
        if let Some(before) = self.before {
            let _ = nix::unistd::tcsetpgrp(self.tty, before);
        }
    }
}

fn read_line(mut tty: &std::fs::File, deadline: Instant) -> std::io::Result<String> {
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
    fn answers_need_the_code_and_anything_else_denies() {
        assert_eq!(parse("o-0042\n", "0042"), Answer::Once);
        assert_eq!(parse(" R-0042\n", "0042"), Answer::ForRun);
        assert_eq!(parse("15-0042\n", "0042"), Answer::ForSeconds(900));
        for no in ["o\n", "r\n", "robert\n", "o-0043\n", "d-0042\n", "\n", "x"] {
            assert_eq!(parse(no, "0042"), Answer::Deny, "{no:?}");
        }
        assert_eq!(random_code().len(), 4);
    }
}

//! The documentation's runnable examples, run: every shell block of README.md and docs/*.md
//! marked as runnable is run against this build, so a doc cannot drift from the binary.
//!
//! The marker is an HTML comment on the line before the fence (GitHub shows neither):
//!
//! ````text
//! <!-- runnable -->            or   <!-- runnable exit=56 -->
//! ```sh
//! sandgate check-config docs/examples/mcp.yaml
//! ```
//! <!-- output -->
//! ```
//! docs/examples/mcp.yaml: ok: ...
//! ```
//! ````
//!
//! A block runs with `sh -e`, alone, in a fresh directory that holds links to the
//! repository's `docs/` and `deploy/` (so paths read as from the repository's root), with
//! `sandgate` on `PATH`, a home and state directory of its own, no other environment, and
//! the test DNS server as the proxy's resolver (`SANDGATE_DNS_SERVER`; every name it knows
//! is loopback, so nothing reaches the Internet). It must exit with the marker's status (0
//! unless `exit=N`). An `<!-- output -->` block right after it lists lines its output
//! (stdout and stderr) must hold, each somewhere, in any order; `...` in a line stands for
//! any text, and a line that is only `...` for any lines.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::disallowed_methods,
    reason = "integration tests: a failed setup step should fail loudly, and the shared harness connects to its own loopback fixtures"
)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandgate_testkit::dns::{DnsServer, Zone};

/// The longest one block may take (a sandboxed run included).
const BLOCK_TIMEOUT: Duration = Duration::from_secs(120);

/// One runnable block, where it is written and what it must do.
#[derive(Debug)]
struct Example {
    /// `docs/sandbox.md:512`: the line of the opening fence.
    place: String,
    script: String,
    exit: i32,
    /// The lines the output must hold (`...` for any text).
    expected: Vec<String>,
}

/// The fenced block opening at `lines[at]` (a line starting with ```): its body and the
/// index of the line after its closing fence.
fn fenced(lines: &[&str], at: usize) -> Option<(Vec<String>, usize)> {
    let mut body = Vec::new();
    for (i, line) in lines.iter().enumerate().skip(at + 1) {
        if line.trim_start().starts_with("```") {
            return Some((body, i + 1));
        }
        body.push((*line).to_owned());
    }
    None
}

/// The marker's expected exit status, if `line` is a runnable marker.
fn marker(line: &str) -> Option<Result<i32, String>> {
    let inner = line.trim().strip_prefix("<!--")?.strip_suffix("-->")?.trim();
    let rest = inner.strip_prefix("runnable")?;
    Some(match rest.trim() {
        "" => Ok(0),
        other => other
            .strip_prefix("exit=")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("{line:?}: expected <!-- runnable --> or <!-- runnable exit=N -->")),
    })
}

/// Every runnable example in `text` (the file `name`), or what is malformed about one.
fn examples(name: &str, text: &str) -> Result<Vec<Example>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(exit) = marker(lines[i]) else {
            i += 1;
            continue;
        };
        let exit = exit.map_err(|e| format!("{name}:{}: {e}", i + 1))?;
        let fence = i + 1;
        let opens_sh = lines
            .get(fence)
            .is_some_and(|l| l.trim_start().starts_with("```sh"));
        if !opens_sh {
            return Err(format!(
                "{name}:{}: a runnable marker must be followed by a ```sh block",
                i + 1
            ));
        }
        let (script, mut next) =
            fenced(&lines, fence).ok_or_else(|| format!("{name}:{}: the block is not closed", fence + 1))?;
        let mut expected = Vec::new();
        let mut j = next;
        while lines.get(j).is_some_and(|l| l.trim().is_empty()) {
            j += 1;
        }
        if lines.get(j).is_some_and(|l| l.trim() == "<!-- output -->") {
            let opens = lines
                .get(j + 1)
                .is_some_and(|l| l.trim_start().starts_with("```"));
            if !opens {
                return Err(format!(
                    "{name}:{}: an output marker must be followed by a block",
                    j + 1
                ));
            }
            let (body, after) =
                fenced(&lines, j + 1).ok_or_else(|| format!("{name}:{}: the block is not closed", j + 2))?;
            expected = body.into_iter().filter(|l| !l.trim().is_empty()).collect();
            next = after;
        }
        found.push(Example {
            place: format!("{name}:{}", fence + 1),
            script: script.join("\n"),
            exit,
            expected,
        });
        i = next;
    }
    Ok(found)
}

/// Whether output line `line` is what `pattern` says (`...` standing for any text).
fn matches(pattern: &str, line: &str) -> bool {
    let (pattern, line) = (pattern.trim_end(), line.trim_end());
    let pieces: Vec<&str> = pattern.split("...").collect();
    let mut rest = line;
    for (k, piece) in pieces.iter().enumerate() {
        if k == 0 {
            let Some(after) = rest.strip_prefix(piece) else {
                return false;
            };
            rest = after;
        } else if k == pieces.len() - 1 {
            return rest.ends_with(piece);
        } else {
            let Some(at) = rest.find(piece) else {
                return false;
            };
            rest = &rest[at + piece.len()..];
        }
    }
    // No `...` at all: the whole line.
    rest.is_empty()
}

/// Runs `example` in a fresh directory; `None` when it did what the doc says, else why not.
fn check(example: &Example, repo: &Path, bin: &Path, dns: &DnsServer) -> Option<String> {
    let dir = tempfile::tempdir().unwrap();
    let (work, home, state) = (
        dir.path().join("work"),
        dir.path().join("home"),
        dir.path().join("state"),
    );
    for d in [&work, &home, &state] {
        std::fs::create_dir(d).unwrap();
    }
    for shared in ["docs", "deploy"] {
        std::os::unix::fs::symlink(repo.join(shared), work.join(shared)).unwrap();
    }
    let mut child = Command::new("sh")
        .arg("-ec")
        .arg(&example.script)
        .current_dir(&work)
        .env_clear()
        .env("PATH", format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display()))
        .env("HOME", &home)
        .env("XDG_STATE_HOME", &state)
        .env("USER", "docs")
        .env("LANG", "C.UTF-8")
        .env("SANDGATE_DNS_SERVER", dns.addr().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + BLOCK_TIMEOUT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut wrong = Vec::new();
    if out.status.code() != Some(example.exit) {
        wrong.push(format!(
            "exit {:?}, the doc says {}",
            out.status.code(),
            example.exit
        ));
    }
    for want in example.expected.iter().filter(|w| w.trim() != "...") {
        if !text.lines().any(|l| matches(want, l)) {
            wrong.push(format!("no line like {want:?}"));
        }
    }
    match wrong.is_empty() {
        true => None,
        false => Some(format!(
            "{}: {}\n--- the block:\n{}\n--- its output:\n{text}",
            example.place,
            wrong.join("; "),
            example.script
        )),
    }
}

/// README.md and docs/*.md, by name relative to the repository.
fn documents(repo: &Path) -> Vec<(String, String)> {
    let mut names = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| Path::new("docs").join(p.file_name().unwrap()))
        .collect();
    docs.sort();
    names.extend(docs);
    names
        .into_iter()
        .map(|n| {
            let text = std::fs::read_to_string(repo.join(&n)).unwrap();
            (n.display().to_string(), text)
        })
        .collect()
}

#[test]
fn every_runnable_example_in_the_docs_does_what_the_doc_says() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut all = Vec::new();
    let mut malformed = Vec::new();
    for (name, text) in documents(&repo) {
        match examples(&name, &text) {
            Ok(found) => all.extend(found),
            Err(e) => malformed.push(e),
        }
    }
    assert!(malformed.is_empty(), "{}", malformed.join("\n"));
    // The markers themselves must not quietly go: README and the guides keep theirs.
    for doc in ["README.md", "docs/policy.md", "docs/sandbox.md", "docs/mcp.md"] {
        assert!(
            all.iter().any(|e| e.place.starts_with(&format!("{doc}:"))),
            "{doc} has no runnable example: {all:#?}"
        );
    }
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(common::sandgate_bin(), bin.path().join("sandgate")).unwrap();
    let rt = common::runtime();
    let dns = rt.block_on(DnsServer::start(
        Zone::new()
            .with("example.com", &["127.0.0.1"])
            .with("example.org", &["127.0.0.1"])
            .with("pypi.org", &["127.0.0.1"]),
    ));
    let failed: Vec<String> = all
        .iter()
        .filter_map(|e| check(e, &repo, bin.path(), &dns))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} runnable examples do not hold:\n\n{}",
        failed.len(),
        all.len(),
        failed.join("\n\n")
    );
}

#[test]
fn the_runner_reads_markers_and_patterns_as_documented() {
    let doc = "text\n<!-- runnable exit=56 -->\n```sh\nfalse\n```\n\n<!-- output -->\n```\na ... b\n...\n```\n<!-- runnable -->\n```sh\ntrue\n```\n";
    let found = examples("d.md", doc).unwrap();
    assert_eq!(found.len(), 2, "{found:#?}");
    assert_eq!(
        (found[0].place.as_str(), found[0].exit, found[0].script.as_str()),
        ("d.md:3", 56, "false")
    );
    assert_eq!(found[0].expected, ["a ... b", "..."]);
    assert_eq!((found[1].exit, found[1].expected.len()), (0, 0));
    assert!(examples("d.md", "<!-- runnable -->\ntext\n").is_err());
    assert!(examples("d.md", "<!-- runnable exit=x -->\n```sh\n```\n").is_err());
    assert!(matches("a ... b", "a x y b"));
    assert!(matches("audit log: ...", "audit log: /x/run-1.jsonl"));
    assert!(matches("exact", "exact  "));
    assert!(!matches("exact", "exactly"));
    assert!(!matches("a ... b", "a x y"));
    assert!(!matches("x: ok", "y x: ok"));
}

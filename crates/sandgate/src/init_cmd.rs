//! `sandgate init`: a commented starter policy that `check-config` passes and that runs. An
//! `EgressPolicy` for `sandgate proxy`, or a `SandboxPolicy` for `sandgate run`, whose read
//! paths, with `--for CMD`, are what CMD needs on this machine (found by the sandbox crate's
//! [`sandgate_sandbox::needs`]).
//!
//! Everything taken from outside (paths found on this machine, the command, the name) goes
//! into the document only as a double-quoted scalar or an escaped comment, so no file name
//! can add a line of its own. The file is created, never replaced, unless `--force`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sandgate_policy::preset;

use crate::EX_USAGE;
use crate::cli::{InitArgs, InitKind};

pub fn run(args: &InitArgs) -> ExitCode {
    match render(args).and_then(|(text, path)| write(&text, &path, args.force)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("sandgate: {message}");
            ExitCode::from(EX_USAGE)
        }
    }
}

/// The document, and where it goes.
fn render(args: &InitArgs) -> Result<(String, PathBuf), String> {
    for name in &args.preset {
        if preset::hosts(name).is_none() {
            return Err(format!(
                "--preset {name:?}: no such preset (known: {})",
                preset::NAMES.join(", ")
            ));
        }
    }
    let kind = args.kind.unwrap_or(if args.for_command.is_some() {
        InitKind::Sandbox
    } else {
        InitKind::Egress
    });
    let (text, default) = match kind {
        InitKind::Egress if args.for_command.is_some() => {
            return Err("--for describes a sandboxed command: use it with --kind sandbox".into());
        }
        InitKind::Egress => (egress(&args.name, &args.preset), "policy.yaml"),
        InitKind::Sandbox => {
            let command = match args.for_command.as_deref() {
                Some(c) => words(c)?,
                None => Vec::new(),
            };
            (sandbox(&args.name, &args.preset, &command)?, "sandbox.yaml")
        }
    };
    Ok((text, args.output.clone().unwrap_or_else(|| default.into())))
}

/// `--for`'s words, split as a shell splits a simple command line: on blanks, with '...'
/// keeping what it encloses, "..." too (where a backslash escapes `"`, `\`, `$` and a
/// backquote), and a backslash outside quotes escaping the next character. Nothing is
/// expanded. An unclosed quote or a trailing backslash is an error.
fn words(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') if chars.peek().is_some_and(|n| matches!(n, '"' | '\\' | '$' | '`')) => {
                word.get_or_insert_with(String::new).extend(chars.next());
            }
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '\\') => match chars.next() {
                Some(n) => word.get_or_insert_with(String::new).push(n),
                None => return Err(format!("--for {line:?}: a backslash at the end escapes nothing")),
            },
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, c) if c.is_whitespace() => out.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    if quote.is_some() {
        return Err(format!("--for {line:?}: a quote is not closed"));
    }
    out.extend(word);
    Ok(out)
}

fn write(text: &str, path: &Path, force: bool) -> Result<(), String> {
    if path == Path::new("-") {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
        return Ok(());
    }
    // create_new: an existing file (or a symlink, even a dangling one) is never replaced
    // without --force.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(!force)
        .create(force)
        .truncate(force)
        .open(path);
    let mut file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(format!(
                "{} exists: pass --force to replace it, or -o FILE (- for stdout)",
                path.display()
            ));
        }
        Err(e) => return Err(format!("cannot write {}: {e}", path.display())),
    };
    file.write_all(text.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    eprintln!(
        "sandgate: wrote {}; check it with: sandgate check-config {}",
        path.display(),
        path.display()
    );
    Ok(())
}

/// A YAML double-quoted scalar holding exactly `s`: JSON's escapes (which YAML reads the
/// same), plus the characters YAML 1.1 readers take as line breaks (U+0085, U+2028,
/// U+2029) and `$`, which the sandbox policy's `${NAME}` substitution would otherwise see.
pub fn quote(s: &str) -> String {
    serde_json::Value::from(s)
        .to_string()
        .replace('$', "\\u0024")
        .replace('\u{85}', "\\u0085")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// `s` for a comment line: control characters and line separators escaped, and `$` (the
/// sandbox policy substitutes `${NAME}` in comments too).
fn comment(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '$') {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| quote(i)).collect();
    format!("[{}]", quoted.join(", "))
}

fn egress(name: &str, presets: &[String]) -> String {
    format!(
        "# A starter EgressPolicy, written by `sandgate init` (docs/policy.md).\n\
         # Check it:  sandgate check-config FILE\n\
         # Run it:    sandgate proxy --policy FILE   (reloaded when the file changes)\n\
         apiVersion: sandgate.dev/v1\n\
         kind: EgressPolicy\n\
         metadata:\n  name: {}\n\
         spec:\n  network:\n\
         \x20   # Hosts the proxy lets through; everything else is refused (403) and on record.\n\
         \x20   # A bare host allows 443 (CONNECT) and 80 (plain HTTP); host:port that port only.\n\
         \x20   allowlist: []\n\
         \x20   #  - host: api.example.com\n\
         \x20   #    ports: [443]\n\
         \x20   #    reason: why the workload needs it\n\
         \x20   #    created_by: you\n\
         \x20   #    ttl_seconds: 3600          # or expires_at: 2030-01-01T00:00:00Z\n\
         \x20   # Curated host lists, 443 only (`sandgate presets` lists them).\n\
         \x20   presets: {}\n\
         \x20   # Always refused, whatever the allowlist says.\n\
         \x20   denylist: []\n\
         \x20   # To learn an allowlist from a workload: sandgate proxy --report-only, then\n\
         \x20   # sandgate policy suggest --from AUDIT.\n",
        quote(name),
        list(presets)
    )
}

/// The read paths of a sandbox with no `--for`: the usual userland.
const USERLAND: [&str; 4] = ["/usr", "/lib", "/lib64", "/bin"];

fn sandbox(name: &str, presets: &[String], command: &[String]) -> Result<String, String> {
    let networked = !presets.is_empty();
    let (mut reads, path_dirs): (Vec<PathBuf>, Vec<PathBuf>) = if command.is_empty() {
        (USERLAND.iter().map(PathBuf::from).collect(), Vec::new())
    } else {
        let needs = sandgate_sandbox::needs::of_command(command).map_err(|e| e.to_string())?;
        (needs.read_dirs, needs.path_dirs)
    };
    if networked {
        reads.extend(["/etc/ssl", "/usr/share/ca-certificates"].map(PathBuf::from));
    }
    let reads = sandgate_sandbox::needs::outermost(reads.into_iter().filter(|p| p.exists()).collect());
    let (reads, left_out): (Vec<PathBuf>, Vec<PathBuf>) = reads.into_iter().partition(|p| {
        std::fs::canonicalize(p).is_ok_and(|c| !sandgate_sandbox::paths::may_hold_host_sockets(&c))
    });
    let mut out = String::from("# A starter SandboxPolicy, written by `sandgate init` (docs/sandbox.md).\n");
    if !command.is_empty() {
        let line = comment(&command.join(" "));
        out.push_str(&format!(
            "# For: {line}\n# Run it:    sandgate run --policy FILE -- {line}\n"
        ));
    } else {
        out.push_str("# Run it:    sandgate run --policy FILE -- COMMAND\n");
    }
    out.push_str("# Check it:  sandgate check-config FILE\n");
    out.push_str(&format!(
        "apiVersion: sandgate.dev/v1\nkind: SandboxPolicy\nmetadata:\n  name: {}\n",
        quote(name)
    ));
    // The program's directory (and a launcher's real interpreter's) first, then the usual.
    let mut path: Vec<String> = path_dirs
        .iter()
        .filter(|d| d.is_absolute())
        .map(|d| d.to_string_lossy().into_owned())
        .collect();
    for usual in ["/usr/local/bin", "/usr/bin", "/bin"] {
        if !path.iter().any(|p| p == usual) {
            path.push(usual.to_owned());
        }
    }
    let path = path.join(":");
    out.push_str(&format!(
        "env:\n\
         \x20 # Only these variables reach the command (and, with a network, the proxy's).\n\
         \x20 set:\n    HOME: /tmp\n    PATH: {}\n    LANG: C.UTF-8\n\
         \x20 # Host variables passed by name; a secret passes only when listed exactly.\n\
         \x20 passthrough: []\n",
        quote(&path)
    ));
    out.push_str(
        "fs:\n  # Read-only: what the command needs on this machine (its program, interpreter,\n  # libraries and Python paths), found when this file was written.\n  read_paths:\n",
    );
    for p in &reads {
        out.push_str(&format!("    - {}\n", quote(&p.to_string_lossy())));
    }
    for p in &left_out {
        out.push_str(&format!(
            "    # left out: {} (may hold host sockets)\n",
            comment(&p.to_string_lossy())
        ));
    }
    out.push_str(
        "  # Read-write: nothing. Add the directory the command writes its results to.\n  write_paths: []\n  tmp: private            # an empty /tmp of its own\nnet:\n",
    );
    if networked {
        out.push_str(&format!(
            "  # Only through sandgate's own proxy, to what is listed; every request on record.\n\
             \x20 mode: allowlist\n\
             \x20 presets: {}\n\
             \x20 allow_domains: []      # e.g. [ api.example.com ]\n\
             \x20 # Or share an allowlist with sandgate proxy: egress_policy: policy.yaml\n\
             \x20 # To learn one: sandgate run --learn ..., then sandgate policy suggest --from LOG\n",
            list(presets)
        ));
    } else {
        out.push_str(
            "  # No network at all. For egress through sandgate's proxy: mode: allowlist, and\n\
             \x20 # allow_domains: [ api.example.com ] or presets: [ python-packages ]\n\
             \x20 mode: none\n",
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_values_cannot_leave_their_scalar() {
        for s in [
            "a\"b",
            "a\nnet: {mode: all}",
            "${HOME}",
            "x\u{85}y\u{2028}z",
            "\\",
            "#c",
        ] {
            let q = quote(s);
            assert!(
                !q.contains('\n') && !q.contains('$') && !q.contains('\u{85}'),
                "{q}"
            );
            let back: String = serde_json::from_str(&q.replace("\\u0024", "$")).unwrap();
            assert_eq!(back, s);
        }
        assert_eq!(comment("a\nb\u{2028}${X}"), "a\\u{a}b\\u{2028}\\u{24}{X}");
    }

    #[test]
    fn for_splits_like_a_simple_shell_command_line() {
        assert_eq!(
            words("python3  agent.py --x").unwrap(),
            ["python3", "agent.py", "--x"]
        );
        assert_eq!(
            words("'/opt/my tools/run' \"a b\" ''").unwrap(),
            ["/opt/my tools/run", "a b", ""]
        );
        assert_eq!(words("a'b c'd").unwrap(), ["ab cd"]);
        assert_eq!(words(r#"a\ b "c\"d\x" 'e\'"#).unwrap(), ["a b", "c\"d\\x", "e\\"]);
        assert!(words("python3 'agent.py").is_err());
        assert!(words("x \\").is_err());
    }

    #[test]
    fn the_egress_starter_parses() {
        let text = egress("st", &["python-packages".to_owned()]);
        let file = sandgate_policy::parse_policy(&text, "p.yaml", 0).unwrap();
        assert_eq!(file.name, "st");
        assert_eq!(file.allow.len(), 2);
        assert!(file.warnings.is_empty(), "{:?}", file.warnings);
    }
}

//! `sandgate pki init | issue`: a CA and certificates for node-local and central proxies
//! (rcgen), for trying the central mode out and for tests. Production brings its own PKI;
//! nothing here is needed to run one. Keys are written mode 0600 in a 0700 directory, and
//! no file is replaced without `--force`. Exits 0, 64 (usage), 73 (cannot write).

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::cli::PkiCommand;

/// Why a pki command failed, with its exit code.
#[derive(Debug, thiserror::Error)]
enum PkiError {
    #[error("{0}")]
    Usage(String),
    #[error("{}: {source}", path.display())]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Cert(#[from] rcgen::Error),
}

pub fn run(cmd: PkiCommand) -> ExitCode {
    let result = match cmd {
        PkiCommand::Init {
            dir,
            days,
            not_after,
            force,
        } => init(&dir, days, not_after.as_deref(), force),
        PkiCommand::Issue {
            dir,
            node,
            central,
            san,
            days,
            not_after,
            force,
        } => issue(&dir, node, central, &san, days, not_after.as_deref(), force),
    };
    match result {
        Ok(lines) => {
            for l in lines {
                println!("{l}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sandgate pki: {e}");
            ExitCode::from(match e {
                PkiError::Usage(_) | PkiError::Cert(_) => 64,
                PkiError::Write { .. } => 73,
            })
        }
    }
}

fn now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

fn init(dir: &Path, days: u32, not_after: Option<&str>, force: bool) -> Result<Vec<String>, PkiError> {
    let not_after = match not_after {
        Some(day) => parse_day(day)?,
        None if days == 0 => return Err(PkiError::Usage("--days must be at least 1".into())),
        None => now() + time::Duration::days(i64::from(days)),
    };
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.distinguished_name.push(DnType::CommonName, "sandgate CA");
    params.not_after = not_after;
    params.not_before = (now() - time::Duration::hours(1)).min(not_after - time::Duration::days(1));
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    make_dir(dir)?;
    let (cert_path, key_path) = (dir.join("ca.pem"), dir.join("ca.key"));
    refuse_existing(&[&cert_path, &key_path], force)?;
    write(&key_path, &key.serialize_pem(), 0o600)?;
    write(&cert_path, &cert.pem(), 0o644)?;
    Ok(vec![
        format!(
            "{}: the CA certificate (--upstream-ca on nodes, tls.client_ca on central listeners)",
            cert_path.display()
        ),
        format!("{}: the CA key (keep it private)", key_path.display()),
    ])
}

/// `--not-after YYYY-MM-DD`: the end of that day, UTC.
fn parse_day(day: &str) -> Result<time::OffsetDateTime, PkiError> {
    let date: jiff::civil::Date = day
        .parse()
        .map_err(|e| PkiError::Usage(format!("--not-after {day:?}: expected YYYY-MM-DD ({e})")))?;
    let end = date
        .at(23, 59, 59, 0)
        .to_zoned(jiff::tz::TimeZone::UTC)
        .map_err(|e| PkiError::Usage(format!("--not-after {day:?}: {e}")))?;
    time::OffsetDateTime::from_unix_timestamp(end.timestamp().as_second())
        .map_err(|e| PkiError::Usage(format!("--not-after {day:?}: {e}")))
}

/// A name a certificate can carry: a DNS name or an IP address, plain characters only (it
/// becomes a file name too).
fn check_name(flag: &str, name: &str) -> Result<(), PkiError> {
    let ok = (1..=253).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':'))
        && !name.starts_with(['.', '-']);
    if ok {
        Ok(())
    } else {
        Err(PkiError::Usage(format!(
            "{flag} {name:?}: a host name or IP address (letters, digits, . - :)"
        )))
    }
}

fn issue(
    dir: &Path,
    node: Option<String>,
    central: Option<String>,
    san: &[String],
    days: u32,
    not_after: Option<&str>,
    force: bool,
) -> Result<Vec<String>, PkiError> {
    let (role, name, usage) = match (node, central) {
        (Some(n), None) => ("node", n, ExtendedKeyUsagePurpose::ClientAuth),
        (None, Some(c)) => ("central", c, ExtendedKeyUsagePurpose::ServerAuth),
        _ => return Err(PkiError::Usage("give --node NAME or --central NAME".into())),
    };
    check_name(&format!("--{role}"), &name)?;
    for s in san {
        check_name("--san", s)?;
    }
    let not_after = match not_after {
        Some(day) => parse_day(day)?,
        None if days == 0 => return Err(PkiError::Usage("--days must be at least 1".into())),
        None => now() + time::Duration::days(i64::from(days)),
    };
    if dir.exists() {
        private_dir(dir)?;
    }
    let ca_cert = read(&dir.join("ca.pem"))?;
    let ca_key = KeyPair::from_pem(&read(&dir.join("ca.key"))?)?;
    let issuer = Issuer::from_ca_cert_pem(&ca_cert, ca_key)?;
    let names: Vec<String> = std::iter::once(name.clone()).chain(san.iter().cloned()).collect();
    let mut params = CertificateParams::new(names)?;
    params.distinguished_name.push(DnType::CommonName, name.as_str());
    params.extended_key_usages = vec![usage];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.use_authority_key_identifier_extension = true;
    params.not_after = not_after;
    params.not_before = (now() - time::Duration::hours(1)).min(not_after - time::Duration::days(1));
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    let base = format!("{role}-{name}");
    let (cert_path, key_path) = (dir.join(format!("{base}.pem")), dir.join(format!("{base}.key")));
    refuse_existing(&[&cert_path, &key_path], force)?;
    write(&key_path, &key.serialize_pem(), 0o600)?;
    write(&cert_path, &cert.pem(), 0o644)?;
    let hint = match role {
        "node" => format!(
            "--client-cert {} --client-key {}; list `name: {name}` in the central's spec.nodes",
            cert_path.display(),
            key_path.display()
        ),
        _ => format!(
            "tls.cert / tls.key of the central's role: node listener; nodes use --upstream https://{name}:PORT"
        ),
    };
    Ok(vec![
        format!("{}: {role} certificate for {name}", cert_path.display()),
        format!("{}: its key", key_path.display()),
        hint,
    ])
}

fn read(path: &Path) -> Result<String, PkiError> {
    std::fs::read_to_string(path).map_err(|e| {
        PkiError::Usage(format!(
            "{}: {e} (run `sandgate pki init --dir {}` first)",
            path.display(),
            path.parent().unwrap_or(Path::new(".")).display()
        ))
    })
}

fn make_dir(dir: &Path) -> Result<(), PkiError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| PkiError::Write {
            path: dir.to_owned(),
            source,
        })?;
    private_dir(dir)
}

/// Keys go only into a directory others cannot write: whoever can write there can swap the
/// CA under the files sandgate reads.
fn private_dir(dir: &Path) -> Result<(), PkiError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(dir).map_err(|source| PkiError::Write {
        path: dir.to_owned(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(PkiError::Usage(format!("{} is not a directory", dir.display())));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(PkiError::Usage(format!(
            "{} can be written by others (mode {mode:o}); use a directory only you can write (chmod go-w)",
            dir.display()
        )));
    }
    Ok(())
}

fn refuse_existing(paths: &[&Path], force: bool) -> Result<(), PkiError> {
    match paths.iter().find(|p| p.exists()) {
        Some(p) if !force => Err(PkiError::Usage(format!(
            "{} exists; pass --force to replace it",
            p.display()
        ))),
        _ => Ok(()),
    }
}

/// Writes `text` to a new file (mode `mode`), replacing one only after `--force` was checked.
fn write(path: &Path, text: &str, mode: u32) -> Result<(), PkiError> {
    let err = |source| PkiError::Write {
        path: path.to_owned(),
        source,
    };
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)
}

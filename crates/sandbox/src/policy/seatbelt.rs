//! `platform.seatbelt`: what the macOS backend adds to its profile beyond the policy's paths
//! and network mode, in the design's own keys:
//!
//! ```yaml
//! platform:
//!   seatbelt:
//!     trace: true                       # record what the profile denied
//!     extra_allow:
//!       mach-lookup: [ com.apple.fonts ]  # Mach services the command may look up
//!       system-socket: true             # sockets of the system domains (AF_SYSTEM, routing)
//!       dev: { allow_tty_writes: true } # open the terminal for writing
//!       file_read_extra: [ /opt/homebrew/share ]  # more paths to read
//! ```
//!
//! Parsed and checked on every platform, so `sandgate check-config` on Linux catches a bad
//! macOS section; only the seatbelt backend ([`crate::seatbelt`]) uses it, and the bwrap
//! backend ignores it (as the seatbelt backend ignores `platform.bwrap`). Pure: paths go
//! through the injected resolver, and one that does not resolve here (a macOS path checked
//! on Linux) is kept as written.

use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use super::PolicyError;
use crate::paths::Resolve;

/// The section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSeatbelt {
    #[serde(default)]
    trace: Option<bool>,
    #[serde(default)]
    extra_allow: Option<RawExtraAllow>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExtraAllow {
    #[serde(default, rename = "mach-lookup")]
    mach_lookup: Option<Vec<String>>,
    #[serde(default, rename = "system-socket")]
    system_socket: Option<bool>,
    #[serde(default)]
    dev: Option<RawDev>,
    #[serde(default)]
    file_read_extra: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDev {
    #[serde(default)]
    allow_tty_writes: Option<bool>,
}

/// A Mach service name (`com.apple.fonts`): letters, digits and `. _ - @ : +`, so it can be
/// written into a profile as a string without escaping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachService(String);

impl MachService {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `platform.seatbelt`, checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeatbeltSettings {
    /// `trace`: record the profile's denials while the command runs.
    pub trace: bool,
    /// `extra_allow.mach-lookup`.
    pub mach_lookup: Vec<MachService>,
    /// `extra_allow.system-socket`.
    pub system_socket: bool,
    /// `extra_allow.dev.allow_tty_writes`.
    pub allow_tty_writes: bool,
    /// `extra_allow.file_read_extra`: absolute, canonical where they resolve here.
    pub file_read_extra: Vec<PathBuf>,
}

const MACH_FIELD: &str = "platform.seatbelt.extra_allow.mach-lookup";
const READ_FIELD: &str = "platform.seatbelt.extra_allow.file_read_extra";
/// Longer than any service name macOS registers; a bound on what goes into a profile.
const MAX_MACH_NAME: usize = 256;

/// Checks `platform.seatbelt` (absent: nothing extra).
pub(super) fn settings(
    raw: Option<&RawSeatbelt>,
    resolve: Resolve<'_>,
) -> Result<SeatbeltSettings, PolicyError> {
    let Some(raw) = raw else {
        return Ok(SeatbeltSettings::default());
    };
    let extra = raw.extra_allow.as_ref();
    let mach_lookup = extra
        .and_then(|e| e.mach_lookup.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|name| mach_service(name))
        .collect::<Result<_, _>>()?;
    let file_read_extra = extra
        .and_then(|e| e.file_read_extra.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|path| read_extra(path, resolve))
        .collect::<Result<_, _>>()?;
    Ok(SeatbeltSettings {
        trace: raw.trace.unwrap_or(false),
        mach_lookup,
        system_socket: extra.and_then(|e| e.system_socket).unwrap_or(false),
        allow_tty_writes: extra
            .and_then(|e| e.dev.as_ref())
            .and_then(|d| d.allow_tty_writes)
            .unwrap_or(false),
        file_read_extra,
    })
}

fn mach_service(name: &str) -> Result<MachService, PolicyError> {
    let plain = !name.is_empty()
        && name.len() <= MAX_MACH_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@' | b':' | b'+'));
    match plain {
        true => Ok(MachService(name.to_owned())),
        false => Err(PolicyError(format!(
            "{MACH_FIELD}: {name:?} is not a Mach service name (letters, digits and . _ - @ : +)"
        ))),
    }
}

/// An extra read path: absolute, without `..` (what it leads to is known only where it
/// resolves), canonical where it resolves on this machine and as written where it does not.
fn read_extra(value: &str, resolve: Resolve<'_>) -> Result<PathBuf, PolicyError> {
    let written = Path::new(value);
    if !written.is_absolute() {
        return Err(PolicyError(format!(
            "{READ_FIELD}: {value:?} is not an absolute path"
        )));
    }
    if written.components().any(|c| c == Component::ParentDir) {
        return Err(PolicyError(format!(
            "{READ_FIELD}: {value:?} may not contain `..`"
        )));
    }
    Ok(resolve(written).unwrap_or_else(|_| written.components().collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SeatbeltSettings, PolicyError> {
        let raw: Option<RawSeatbelt> =
            serde_saphyr::from_str(text).map_err(|e| PolicyError(e.to_string()))?;
        let host = |p: &Path| match p.to_str() {
            Some("/tmp/fonts") => Ok(PathBuf::from("/private/tmp/fonts")),
            _ => Err(std::io::ErrorKind::NotFound.into()),
        };
        settings(raw.as_ref(), &host)
    }

    #[test]
    fn every_key_of_the_design_is_read() {
        let s = parse(
            "trace: true\nextra_allow:\n  mach-lookup: [ com.apple.fonts, com.apple.distributed_notifications@Uv3 ]\n  system-socket: true\n  dev: { allow_tty_writes: true }\n  file_read_extra: [ /tmp/fonts, /Library/Fonts/./x ]\n",
        )
        .unwrap();
        assert!(s.trace && s.system_socket && s.allow_tty_writes);
        let names: Vec<&str> = s.mach_lookup.iter().map(MachService::as_str).collect();
        assert_eq!(
            names,
            ["com.apple.fonts", "com.apple.distributed_notifications@Uv3"]
        );
        // Resolved where it resolves; as written (without `.`) where it does not.
        assert_eq!(
            s.file_read_extra,
            [
                PathBuf::from("/private/tmp/fonts"),
                PathBuf::from("/Library/Fonts/x")
            ]
        );
    }

    #[test]
    fn a_policy_with_both_platform_sections_parses_whole() {
        let text = "fs:\n  read_paths: [ /usr ]\nplatform:\n  bwrap: { ro_bind: [ /etc ], unshare: { pid: true } }\n  seccomp: { allow_unix_sockets: false }\n  seatbelt:\n    trace: true\n    extra_allow: { system-socket: true, file_read_extra: [ /Library/Fonts ] }\n";
        let p = crate::policy::parse(text, &Default::default(), &|p| Ok(p.to_path_buf()), None).unwrap();
        assert!(p.seatbelt.trace && p.seatbelt.system_socket);
        assert_eq!(p.seatbelt.file_read_extra, [PathBuf::from("/Library/Fonts")]);
        assert_eq!(p.extra_ro_binds, [PathBuf::from("/etc")]);
    }

    #[test]
    fn absent_empty_and_null_sections_add_nothing() {
        for text in [
            "null",
            "{}",
            "extra_allow: {}",
            "extra_allow: null",
            "extra_allow: { dev: {} }",
        ] {
            assert_eq!(parse(text).unwrap(), SeatbeltSettings::default(), "{text}");
        }
    }

    #[test]
    fn what_cannot_go_into_a_profile_is_refused_by_field() {
        for (text, want) in [
            ("extra_allow: { mach-lookup: [ \"a\\\"b\" ] }", MACH_FIELD),
            ("extra_allow: { mach-lookup: [ \"\" ] }", MACH_FIELD),
            (
                "extra_allow: { mach-lookup: [ \"com.apple fonts\" ] }",
                MACH_FIELD,
            ),
            ("extra_allow: { file_read_extra: [ fonts ] }", READ_FIELD),
            (
                "extra_allow: { file_read_extra: [ /Library/../Users ] }",
                READ_FIELD,
            ),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.0.starts_with(want), "{text}: {}", err.0);
        }
        let long = format!(
            "extra_allow: {{ mach-lookup: [ {} ] }}",
            "a".repeat(MAX_MACH_NAME + 1)
        );
        assert!(parse(&long).is_err());
        for unknown in [
            "network: true",
            "extra_allow: { network: true }",
            "extra_allow: { dev: { tty: true } }",
        ] {
            assert!(parse(unknown).is_err(), "{unknown}");
        }
    }
}

//! The host paths of a sandbox policy: the `fs` section (`read_paths`, `write_paths`,
//! `allow_read_all`/`allow_write_all`, `tmp`) and `platform.bwrap`'s `ro_bind`, `rw_bind`
//! and `tmpfs`. Every path is resolved to its canonical form through the injected
//! [`Resolve`] before any check ([`crate::paths`]); outside `net.mode: all` no bound path may
//! hold host Unix sockets (nor may `allow_read_all`/`allow_write_all` be set), and no bound
//! path may cover the node's private key.
//!
//! Pure apart from that one injected question; the mounts themselves are ordered and written
//! by [`crate::argv`].

use std::path::PathBuf;

use serde::Deserialize;

use super::{CentralSpec, NetMode, PolicyError, RawBwrap};
use crate::paths::{self, Alias, Resolve};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFs {
    #[serde(default)]
    pub(super) allow_read_all: bool,
    #[serde(default)]
    pub(super) allow_write_all: bool,
    #[serde(default)]
    pub(super) read_paths: Vec<String>,
    #[serde(default)]
    pub(super) write_paths: Vec<String>,
    #[serde(default)]
    pub(super) tmp: Option<String>,
    /// Where the command starts (checked in `cwd.rs`).
    #[serde(default)]
    pub(super) cwd: Option<String>,
}

/// A policy's host paths, canonical (symlinks resolved), each bound at the same place.
pub(super) struct HostPaths {
    pub(super) read: Vec<PathBuf>,
    pub(super) write: Vec<PathBuf>,
    pub(super) ro: Vec<PathBuf>,
    pub(super) rw: Vec<PathBuf>,
    /// Symlinks inside the sandbox from paths as the policy wrote them to their targets.
    pub(super) aliases: Vec<Alias>,
    pub(super) private_tmp: bool,
    pub(super) extra_tmpfs: Vec<PathBuf>,
}

/// Resolves and checks `fs` and `platform.bwrap`'s paths under the final network mode `net`;
/// `central` is the node mode's TLS files, whose key no bound path may cover.
pub(super) fn host_paths(
    fs: &RawFs,
    bwrap: &RawBwrap,
    net: NetMode,
    central: Option<&CentralSpec>,
    resolve: Resolve<'_>,
) -> Result<HostPaths, PolicyError> {
    let fields = [
        ("fs.read_paths", &fs.read_paths),
        ("fs.write_paths", &fs.write_paths),
        ("platform.bwrap.ro_bind", &bwrap.ro_bind),
        ("platform.bwrap.rw_bind", &bwrap.rw_bind),
    ];
    let mut bound = Vec::with_capacity(fields.len());
    for (field, list) in fields {
        let b = bind_list(field, list, resolve)?;
        if net != NetMode::All {
            refuse_socket_dirs(field, list, &b.canonical)?;
        }
        bound.push(b);
    }
    // Host Unix sockets (docker.sock, an SSH agent, D-Bus) would be a way out of any
    // restricted network mode. The seccomp filter denies AF_UNIX sockets; refusing the paths
    // that hold them is the first layer, and stays even when a policy allows Unix sockets.
    if net != NetMode::All && (fs.allow_read_all || fs.allow_write_all) {
        return Err(PolicyError(format!(
            "fs.allow_read_all/allow_write_all with net.mode {} would expose host Unix sockets (docker.sock, ssh-agent, D-Bus); list read_paths instead",
            net.name()
        )));
    }
    let private_tmp = match fs.tmp.as_deref() {
        None | Some("private") => true,
        Some("none") => false,
        Some(other) => return Err(PolicyError(format!("fs.tmp: {other:?}: use private or none"))),
    };
    let [read, write, ro, rw] =
        <[Bound; 4]>::try_from(bound).map_err(|_| PolicyError("internal: path fields".to_owned()))?;
    if let Some(central) = central {
        refuse_bound_key(&central.key, [&read, &write, &ro, &rw], resolve)?;
    }
    let extra_tmpfs = tmpfs_list(&bwrap.tmpfs, [&read, &write, &ro, &rw], resolve)?;
    let aliases = [&read, &write, &ro, &rw]
        .iter()
        .flat_map(|b| b.aliases.iter().cloned())
        .collect();
    Ok(HostPaths {
        read: read.canonical,
        write: write.canonical,
        ro: ro.canonical,
        rw: rw.canonical,
        aliases,
        private_tmp,
        extra_tmpfs,
    })
}

/// The host paths of one field, canonical, with their aliases.
struct Bound {
    canonical: Vec<PathBuf>,
    aliases: Vec<Alias>,
}

/// `platform.bwrap.tmpfs`: each path absolute, and canonical where it exists, so that it is
/// mounted after the bind it lies in (argv.rs orders mounts by path). A path that does not
/// exist is made on bwrap's own root; inside a bound path it is refused: there is nothing
/// there to hide, and bwrap would have to make the directory in the host's tree (or fail on
/// a read-only one).
fn tmpfs_list(
    list: &[String],
    bound: [&Bound; 4],
    resolve: Resolve<'_>,
) -> Result<Vec<PathBuf>, PolicyError> {
    let field = "platform.bwrap.tmpfs";
    let mut out = Vec::with_capacity(list.len());
    for value in list {
        let written = PathBuf::from(value);
        if !written.is_absolute() {
            return Err(PolicyError(format!("{field}: {value:?} is not an absolute path")));
        }
        match resolve(&written) {
            Ok(canonical) => out.push(canonical),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let at = paths::lexical(&written);
                if let Some(b) = bound
                    .iter()
                    .flat_map(|b| &b.canonical)
                    .find(|b| at.starts_with(b))
                {
                    return Err(PolicyError(format!(
                        "{field}: {value:?} does not exist inside the bound path {}: there is nothing to hide there; create it or leave it out",
                        b.display()
                    )));
                }
                out.push(at);
            }
            Err(e) => return Err(PolicyError(format!("{field}: {value:?}: {e}"))),
        }
    }
    Ok(out)
}

fn bind_list(field: &str, list: &[String], resolve: Resolve<'_>) -> Result<Bound, PolicyError> {
    let mut bound = Bound {
        canonical: Vec::new(),
        aliases: Vec::new(),
    };
    for value in list {
        let (canonical, alias) = paths::resolve(field, value, resolve)?;
        if let Some(why) = paths::shadows_the_sandboxs_own(&canonical) {
            return Err(PolicyError(format!(
                "{field}: {value:?} ({}) {why}",
                canonical.display()
            )));
        }
        bound.canonical.push(canonical);
        bound.aliases.extend(alias);
    }
    Ok(bound)
}

/// The node's private key (`net.proxy.tls.key`) must not be readable inside the sandbox:
/// with it, the command could be the node and attribute traffic as it likes. The run's
/// proxy reads it before the sandbox starts; no bound path may cover it.
fn refuse_bound_key(
    key: &std::path::Path,
    bound: [&Bound; 4],
    resolve: Resolve<'_>,
) -> Result<(), PolicyError> {
    let canonical =
        resolve(key).map_err(|e| PolicyError(format!("net.proxy.tls.key: {}: {e}", key.display())))?;
    let fields = [
        "fs.read_paths",
        "fs.write_paths",
        "platform.bwrap.ro_bind",
        "platform.bwrap.rw_bind",
    ];
    for (b, field) in bound.iter().zip(fields) {
        if let Some(p) = b.canonical.iter().find(|p| canonical.starts_with(p)) {
            return Err(PolicyError(format!(
                "net.proxy.tls.key: {} is inside {} ({field}): the command could read the node's key; keep it in a directory the sandbox does not bind",
                canonical.display(),
                p.display()
            )));
        }
    }
    Ok(())
}

fn refuse_socket_dirs(field: &str, written: &[String], canonical: &[PathBuf]) -> Result<(), PolicyError> {
    for (value, path) in written.iter().zip(canonical) {
        if paths::may_hold_host_sockets(path) {
            return Err(PolicyError(format!(
                "{field}: {value:?} ({}) may hold host Unix sockets (a way around a restricted network); bind something narrower",
                path.display()
            )));
        }
    }
    Ok(())
}

//! Tweaks: what a person may grant one sandbox's runs beyond its gates, for a time (a longer
//! time limit, a larger output cap, the policy's network, a workspace), within the bounds
//! its operator set (`gates.tweaks`). An agent asks with `request_tweak`; the control plane
//! files and records it as an exception with a `tweak` (no hosts); a person decides.
//!
//! Here, pure (time is an argument): whether an ask is within the sandbox's bounds
//! ([`admissible`], before anything is filed), what the active tweaks grant a run
//! ([`granted`]: each value capped by the bounds, so a control plane that publishes more
//! changes nothing beyond them), the gates they widen ([`widened`]), what a run holds of
//! them ([`Holding`]: what it was admitted with beyond the plain gates, and whether what is
//! granted now still keeps it, else which grants it relied on ended), and what the agent is
//! told ([`judge`]: `approved` only when an active tweak covers the ask).

use std::path::{Path, PathBuf};

use sandgate_policy::Exception;
use sandgate_policy::exception::Tweak;

use crate::config::{Gates, Sandbox, TweakBounds};
use crate::egress::{Refusal, Verdict};

fn refused(message: String) -> Refusal {
    Refusal {
        gate: "tweaks",
        message: format!("refused by gate `tweaks`: {message}"),
    }
}

/// Whether `t` (its workspace already canonical) may be asked for `sandbox`: the sandbox
/// takes tweaks, and each value lies within its bounds, naming the bound that says no.
pub fn admissible(sandbox: &Sandbox, t: &Tweak) -> Result<(), Refusal> {
    let Some(bounds) = &sandbox.gates.tweaks else {
        return Err(refused(format!(
            "sandbox {:?} takes no tweaks (its gates name no `tweaks`)",
            sandbox.name
        )));
    };
    t.check().map_err(|e| refused(e.to_string()))?;
    let over = |what: &str, asked: u64, bound: Option<u64>| match bound {
        Some(b) if asked <= b => Ok(()),
        Some(b) => Err(refused(format!(
            "{what} {asked} is more than sandbox {:?} may be granted (tweaks.{what}: {b})",
            sandbox.name
        ))),
        None => Err(refused(format!(
            "sandbox {:?} may be granted no {what} (no tweaks.{what})",
            sandbox.name
        ))),
    };
    if let Some(s) = t.max_seconds {
        over("max_seconds", s, bounds.max_seconds)?;
    }
    if let Some(b) = t.max_output_bytes {
        over("max_output_bytes", b, bounds.max_output_bytes.map(|b| b as u64))?;
    }
    if t.network && !bounds.network {
        return Err(refused(format!(
            "sandbox {:?} may be granted no network (tweaks.network is false)",
            sandbox.name
        )));
    }
    if let Some(w) = &t.workspace
        && !under(Path::new(w), bounds)
    {
        return Err(refused(format!(
            "{w} is not under a directory sandbox {:?} may be granted (tweaks.workspaces: {})",
            sandbox.name,
            bounds
                .workspaces
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(())
}

fn under(path: &Path, bounds: &TweakBounds) -> bool {
    bounds.workspaces.iter().any(|w| path.starts_with(w))
}

/// What the tweaks active now give a sandbox's runs, each within its bounds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Granted {
    /// The exceptions that grant something here.
    pub ids: Vec<String>,
    pub max_seconds: Option<u64>,
    pub max_output_bytes: Option<usize>,
    pub network: bool,
    pub workspaces: Vec<PathBuf>,
    /// Each of them, as it gives (its values capped by the bounds, what gives nothing left
    /// out).
    pub grants: Vec<Grant>,
}

/// One active tweak, as it gives a sandbox's runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub id: String,
    /// What it gives, each value capped by the bounds.
    pub gives: Tweak,
    /// When it ends (Unix seconds).
    pub expires_at: Option<i64>,
}

impl Granted {
    /// Whether nothing is granted.
    pub fn is_nothing(&self) -> bool {
        self.ids.is_empty()
    }
}

/// The active tweaks among `seen` for `sandbox` (its name, the task its runs carry), each
/// value capped by the sandbox's bounds; nothing when it has none. A tweak that does not
/// read as one (a row written by hand) gives nothing.
pub fn granted(sandbox: &Sandbox, seen: &[Exception], now: i64) -> Granted {
    let mut g = Granted::default();
    let Some(bounds) = &sandbox.gates.tweaks else {
        return g;
    };
    let capped = |asked: Option<u64>, bound: Option<u64>| asked.zip(bound).map(|(a, b)| a.min(b));
    for ex in seen {
        let Some(t) = &ex.tweak else { continue };
        if !ex.is_active(now)
            || ex.task_id != sandbox.run_task
            || t.sandbox != sandbox.name
            || t.check().is_err()
        {
            continue;
        }
        let mut gives = Tweak {
            sandbox: t.sandbox.clone(),
            ..Tweak::default()
        };
        let nothing = gives.clone();
        if let Some(s) = capped(t.max_seconds, bounds.max_seconds) {
            g.max_seconds = g.max_seconds.max(Some(s));
            gives.max_seconds = Some(s);
        }
        let out_bound = bounds.max_output_bytes.map(|b| b as u64);
        if let Some(b) = capped(t.max_output_bytes, out_bound) {
            g.max_output_bytes = g.max_output_bytes.max(Some(b as usize));
            gives.max_output_bytes = Some(b);
        }
        if t.network && bounds.network {
            g.network = true;
            gives.network = true;
        }
        if let Some(w) = t.workspace.as_deref().map(PathBuf::from)
            && under(&w, bounds)
        {
            g.workspaces.push(w);
            gives.workspace = t.workspace.clone();
        }
        if gives != nothing {
            g.ids.push(ex.id.clone());
            g.grants.push(Grant {
                id: ex.id.clone(),
                gives,
                expires_at: ex.expires_at,
            });
        }
    }
    g
}

/// The gates of a run with `g` granted: a longer time limit, a larger output cap, the
/// network, more workspaces; never narrower than the gates themselves.
pub fn widened(gates: &Gates, g: &Granted) -> Gates {
    let mut out = gates.clone();
    out.max_seconds = out.max_seconds.max(g.max_seconds.unwrap_or(0));
    out.max_output_bytes = out.max_output_bytes.max(g.max_output_bytes.unwrap_or(0));
    out.network |= g.network;
    out.workspaces.extend(g.workspaces.iter().cloned());
    out
}

/// What a run was admitted with beyond its sandbox's plain gates: what it holds of the
/// tweaks granted when it started. Empty for a run the plain gates admit as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holding {
    /// Its time limit, when over the gates' `max_seconds`.
    pub seconds: Option<u64>,
    /// Its output cap, when over the gates' `max_output_bytes`.
    pub output: Option<usize>,
    /// The policy's network, which the gates keep off.
    pub network: bool,
    /// Its workspace, when under none of the gates' `workspaces`.
    pub workspace: Option<PathBuf>,
}

impl Holding {
    /// What a run of `sandbox` with time limit `seconds`, output cap `output` and
    /// `workspace` (canonical) holds beyond its plain gates.
    pub fn of(sandbox: &Sandbox, seconds: u64, output: usize, workspace: Option<&Path>) -> Holding {
        let plain = &sandbox.gates;
        Holding {
            seconds: (seconds > plain.max_seconds).then_some(seconds),
            output: (output > plain.max_output_bytes).then_some(output),
            network: sandbox.net != sandgate_sandbox::policy::NetMode::None && !plain.network,
            workspace: workspace
                .filter(|w| !plain.workspaces.iter().any(|p| w.starts_with(p)))
                .map(Path::to_path_buf),
        }
    }

    /// Whether the run holds nothing beyond its plain gates.
    pub fn is_nothing(&self) -> bool {
        *self == Holding::default()
    }

    /// Whether `grant` gives something the run holds.
    pub fn relies_on(&self, grant: &Grant) -> bool {
        let t = &grant.gives;
        self.seconds
            .zip(t.max_seconds)
            .is_some_and(|(held, given)| given >= held)
            || self
                .output
                .zip(t.max_output_bytes)
                .is_some_and(|(held, given)| given >= held as u64)
            || (self.network && t.network)
            || self
                .workspace
                .as_deref()
                .zip(t.workspace.as_deref())
                .is_some_and(|(held, given)| held.starts_with(given))
    }

    /// Whether what is granted now (`g`) still gives everything the run holds.
    pub fn kept_by(&self, g: &Granted) -> bool {
        self.seconds.is_none_or(|s| g.max_seconds.is_some_and(|m| m >= s))
            && self
                .output
                .is_none_or(|o| g.max_output_bytes.is_some_and(|m| m >= o))
            && (!self.network || g.network)
            && self
                .workspace
                .as_deref()
                .is_none_or(|w| g.workspaces.iter().any(|p| w.starts_with(p)))
    }

    /// The grants of `before` (when the run started) the run relied on that `now` no longer
    /// gives as they were: revoked, expired, or changed.
    pub fn ended<'a>(&self, before: &'a Granted, now: &Granted) -> Vec<&'a Grant> {
        before
            .grants
            .iter()
            .filter(|b| self.relies_on(b) && !now.grants.contains(b))
            .collect()
    }
}

/// What `filed` (the request as last shown) and `seen` (the task's exceptions) mean for an
/// ask of `asked` in `sandbox`: approved when an active tweak for the runs' task holds at
/// least what was asked (it is then applied: the ask is within the bounds), else the
/// request's own state.
pub fn judge(sandbox: &Sandbox, asked: &Tweak, filed: &Exception, seen: &[Exception], now: i64) -> Verdict {
    let covering = std::iter::once(filed)
        .chain(seen.iter().filter(|e| e.id != filed.id))
        .find(|e| {
            e.is_active(now)
                && e.task_id == sandbox.run_task
                && e.tweak.as_ref().is_some_and(|t| asked.within(t))
        });
    match covering {
        Some(ex) => Verdict::Approved {
            exception: ex.clone(),
            reaches: vec![sandbox.name.clone()],
        },
        // Approved, but for less than asked: the runs get what was granted, not the ask.
        None if filed.is_active(now) && filed.tweak.is_some() => Verdict::NotApplied {
            exception: filed.clone(),
            why: format!(
                "approved as {}, less than the {asked} asked; the next run gets that",
                filed.tweak.as_ref().map(ToString::to_string).unwrap_or_default()
            ),
        },
        None => Verdict::Filed(filed.clone()),
    }
}

#[cfg(test)]
#[path = "tweaks_tests.rs"]
mod tests;

//! The text of the files compose writes (pure): each profile's kernelspec, Jupyter Server's
//! configuration, the launcher's settings.
//!
//! A kernelspec names nothing absolute of the bundle: Jupyter fills `{resource_dir}` (the
//! kernelspec's own directory, `kernels/python3-NAME`) and `{connection_file}` when it
//! starts the kernel, so the bundle keeps working when it moves. An external Python is
//! absolute: it lives outside the bundle. The carried one (`env/bin/python`) is named
//! through `sandgate jupyter kernel` ([`crate::kernel`]), which finds it from the bundle's
//! canonical place at each start: a path through `{resource_dir}/../..` would not resolve
//! inside the sandbox, where `kernels/` is not mounted.

use serde_json::json;

use crate::bundle::{API_VERSION, BundlePython, ENV_PYTHON, KIND, LauncherSettings};
use crate::profile::{BUNDLE_PARAM, CONNECTION_FILE_PARAM, ProfileName};

/// The bundle's root as seen from a kernelspec's `{resource_dir}`.
const BUNDLE_FROM_SPEC: &str = "{resource_dir}/../..";

/// `sandgate run --no-terminal` with the profile's policy around the kernel, for a bundle
/// at `root` (a session of its own and stdin never a terminal: the launcher may run in the
/// person's terminal, and a kernel must neither read, take nor type into it).
pub fn run_argv(root: &str, profile: &ProfileName, python: &str, connection_file: &str) -> Vec<String> {
    [
        format!("{root}/bin/sandgate"),
        "run".into(),
        "--no-terminal".into(),
        "--policy".into(),
        format!("{root}/policies/{profile}/policy.yaml"),
        "--path-param".into(),
        format!("{BUNDLE_PARAM}={root}"),
        "--param".into(),
        format!("{CONNECTION_FILE_PARAM}={connection_file}"),
        "--audit-log".into(),
        format!("{root}/audit/{profile}.jsonl"),
        "--".into(),
        python.into(),
        "-m".into(),
        "ipykernel_launcher".into(),
        "-f".into(),
        connection_file.into(),
    ]
    .into()
}

/// `kernels/python3-NAME/kernel.json`: the kernel under [`run_argv`], directly for an
/// external Python, through `sandgate jupyter kernel` for the carried one;
/// `interrupt_mode: message`, because a signal sent to `sandgate run`'s process group does
/// not reach a kernel inside the sandbox's own session.
pub fn kernelspec(profile: &ProfileName, python: &BundlePython) -> String {
    let root = BUNDLE_FROM_SPEC;
    let argv = match python {
        BundlePython::External(python) => {
            run_argv(root, profile, &python.to_string_lossy(), "{connection_file}")
        }
        BundlePython::Carried => vec![
            format!("{root}/bin/sandgate"),
            "jupyter".into(),
            "kernel".into(),
            "--bundle".into(),
            root.into(),
            "--profile".into(),
            profile.to_string(),
            "--connection-file".into(),
            "{connection_file}".into(),
        ],
    };
    let spec = json!({
        "argv": argv,
        "display_name": format!("Python 3 (sandgate: {profile})"),
        "language": "python",
        "interrupt_mode": "message",
        "metadata": {
            "sandgate": {
                "profile": profile.as_str(),
                "policy": format!("policies/{profile}/policy.yaml"),
            }
        }
    });
    let mut text = serde_json::to_string_pretty(&spec).unwrap_or_default();
    text.push('\n');
    text
}

/// `jupyter/config/jupyter_server_config.py`: `server_config.py` with the bundle's
/// kernelspec names and the default one filled in (names are `[a-z0-9_-]`, so they need no
/// escaping in a Python string).
pub fn server_config(profiles: &[ProfileName], default: &ProfileName) -> String {
    let kernels: Vec<String> = profiles
        .iter()
        .map(|p| format!("{:?}", p.kernel_name()))
        .collect();
    include_str!("server_config.py")
        .replace("@KERNELS@", &format!("{{{}}}", kernels.join(", ")))
        .replace("@DEFAULT_KERNEL@", &format!("{:?}", default.kernel_name()))
}

/// `mcp/jupyter_mcp_launcher.yaml`.
pub fn launcher(settings: &LauncherSettings) -> String {
    let python = match &settings.python {
        BundlePython::External(p) => p.to_string_lossy().into_owned(),
        BundlePython::Carried => ENV_PYTHON.to_owned(),
    };
    let python = serde_json::to_string(&python).unwrap_or_default();
    let profiles: Vec<&str> = settings.profiles.iter().map(ProfileName::as_str).collect();
    format!(
        "# How `sandgate jupyter launch` runs this bundle: Jupyter Server with jupyter/config only,\n\
         # on loopback with a random token, a kernel of each profile started, then\n\
         # jupyter-mcp-server on stdio, attached to the default profile's kernel.\n\
         # Written by `sandgate jupyter compose`; see docs/jupyter.md.\n\
         apiVersion: {API_VERSION}\n\
         kind: {KIND}\n\
         spec:\n\
         \x20 # Runs Jupyter Server, jupyter-mcp-server and, through `sandgate run`, the kernels:\n\
         \x20 # an absolute path, or env/bin/python (the bundle's own environment).\n\
         \x20 python: {python}\n\
         \x20 profiles: [ {} ]\n\
         \x20 # Jupyter Server's default kernel, and jupyter-mcp-server's own.\n\
         \x20 default_profile: {}\n",
        profiles.join(", "),
        settings.default_profile
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: &str) -> ProfileName {
        ProfileName::parse(n).unwrap()
    }

    #[test]
    fn a_kernelspec_is_relative_to_itself_and_runs_the_kernel_through_sandgate_run() {
        let text = kernelspec(&name("low"), &BundlePython::External("/v/bin/python".into()));
        let spec: serde_json::Value = serde_json::from_str(&text).unwrap();
        let argv: Vec<&str> = spec["argv"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(
            argv,
            [
                "{resource_dir}/../../bin/sandgate",
                "run",
                "--no-terminal",
                "--policy",
                "{resource_dir}/../../policies/low/policy.yaml",
                "--path-param",
                "BUNDLE={resource_dir}/../..",
                "--param",
                "CONNECTION_FILE={connection_file}",
                "--audit-log",
                "{resource_dir}/../../audit/low.jsonl",
                "--",
                "/v/bin/python",
                "-m",
                "ipykernel_launcher",
                "-f",
                "{connection_file}"
            ]
        );
        assert_eq!(spec["interrupt_mode"], "message");
        assert_eq!(spec["display_name"], "Python 3 (sandgate: low)");
        assert!(!text.contains("/tmp"), "nothing absolute of the bundle: {text}");
    }

    #[test]
    fn a_carried_python_is_found_at_start_by_sandgate_jupyter_kernel() {
        let text = kernelspec(&name("gpu_2"), &BundlePython::Carried);
        let spec: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            spec["argv"],
            json!([
                "{resource_dir}/../../bin/sandgate",
                "jupyter",
                "kernel",
                "--bundle",
                "{resource_dir}/../..",
                "--profile",
                "gpu_2",
                "--connection-file",
                "{connection_file}"
            ])
        );
        assert_eq!(spec["interrupt_mode"], "message");
        let argv = run_argv("/b", &name("gpu_2"), "/b/env/bin/python", "/r/k.json");
        assert_eq!(argv[0], "/b/bin/sandgate");
        assert!(argv.ends_with(&[
            "--".to_owned(),
            "/b/env/bin/python".to_owned(),
            "-m".to_owned(),
            "ipykernel_launcher".to_owned(),
            "-f".to_owned(),
            "/r/k.json".to_owned()
        ]));
    }

    #[test]
    fn the_server_config_names_the_bundle_kernels_only() {
        let text = server_config(&[name("low"), name("high")], &name("low"));
        assert!(
            text.contains("KERNELS = frozenset({\"python3-low\", \"python3-high\"})"),
            "{text}"
        );
        assert!(text.contains("DEFAULT_KERNEL = \"python3-low\""), "{text}");
        assert!(!text.contains("@KERNELS@") && !text.contains("@DEFAULT_KERNEL@"));
        assert!(text.contains("c.ServerApp.terminals_enabled = False"));
    }

    #[test]
    fn the_launcher_settings_round_trip() {
        let mut settings = LauncherSettings {
            python: BundlePython::External("/opt/my \"venv\"/bin/python".into()),
            profiles: vec![name("low"), name("high"), name("gpu_2")],
            default_profile: name("high"),
        };
        assert_eq!(LauncherSettings::parse(&launcher(&settings)).unwrap(), settings);
        settings.python = BundlePython::Carried;
        assert_eq!(LauncherSettings::parse(&launcher(&settings)).unwrap(), settings);
    }
}

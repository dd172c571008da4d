//! `sandgate presets`: the curated presets a policy can name (`spec.network.presets`) and
//! the exact hosts each allows, on port 443 only.

use std::process::ExitCode;

use sandgate_policy::preset;

pub fn run(json: bool) -> ExitCode {
    let all = preset::NAMES
        .iter()
        .map(|name| (*name, preset::hosts(name).unwrap_or_default()));
    if json {
        let value: serde_json::Map<String, serde_json::Value> = all
            .map(|(name, hosts)| {
                (
                    name.to_owned(),
                    serde_json::json!({ "hosts": hosts, "ports": [443] }),
                )
            })
            .collect();
        println!("{}", serde_json::Value::Object(value));
    } else {
        for (name, hosts) in all {
            println!("{name:<16} {} (443)", hosts.join(", "));
        }
        println!("use: spec.network.presets: [ NAME ] in an EgressPolicy (docs/policy.md)");
    }
    ExitCode::SUCCESS
}

//! `sandgate presets`: the curated presets a policy can name (`spec.network.presets`) and
//! the exact hosts each allows, on port 443 only, with what it allows below the name when
//! that is not everything (`read-only`, or methods and paths).

use std::process::ExitCode;

use sandgate_policy::preset;

pub fn run(json: bool) -> ExitCode {
    let all = preset::NAMES.iter().map(|name| {
        let hosts: Vec<(String, Option<String>)> = preset::entries(name)
            .unwrap_or_default()
            .iter()
            .map(|e| (e.pattern.to_string(), e.request.as_ref().map(|r| r.to_string())))
            .collect();
        (*name, hosts)
    });
    if json {
        let value: serde_json::Map<String, serde_json::Value> = all
            .map(|(name, hosts)| {
                let entries: Vec<_> = hosts
                    .iter()
                    .map(|(host, below)| serde_json::json!({ "host": host, "requests": below }))
                    .collect();
                let names: Vec<&str> = preset::hosts(name).unwrap_or_default();
                (
                    name.to_owned(),
                    serde_json::json!({ "hosts": names, "ports": [443], "entries": entries }),
                )
            })
            .collect();
        println!("{}", serde_json::Value::Object(value));
    } else {
        for (name, hosts) in all {
            let listed: Vec<String> = hosts
                .iter()
                .map(|(host, below)| match below {
                    Some(rules) => format!("{host} [{rules}]"),
                    None => host.clone(),
                })
                .collect();
            println!("{name:<16} {} (443)", listed.join(", "));
        }
        println!("use: spec.network.presets: [ NAME ] in an EgressPolicy (docs/policy.md)");
    }
    ExitCode::SUCCESS
}

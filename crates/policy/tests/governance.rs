//! The design's policy form (agent-assembly's `GovernancePolicy`, design file 001) read as
//! an EgressPolicy: its example word for word, its grammar table, its empty allowlist, and
//! no mixing of the two forms' `apiVersion` and `kind`.

#![allow(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]

use sandgate_policy::document::{API_VERSION, KIND};
use sandgate_policy::{Access, Context, DocError, Ruleset, Verdict, parse_connect_target, parse_policy};

/// The design's policy form, word for word (design file 001, "Configuration").
const DESIGN: &str = r#"apiVersion: agent-assembly.dev/v1alpha1
kind: GovernancePolicy
metadata:
  name: prod-egress
  version: "1.0.0"
spec:
  network:
    allowlist:
      - api.openai.com
      - "*.anthropic.com"
      - "*.googleapis.com"
"#;

#[test]
fn the_designs_governance_policy_is_read_as_an_egress_policy() {
    let file = parse_policy(DESIGN, "design.yaml", 0).unwrap();
    assert_eq!(file.name, "prod-egress");
    assert_eq!(file.version.as_deref(), Some("1.0.0"));
    let hosts: Vec<String> = file.allow.iter().map(|e| e.pattern.to_string()).collect();
    assert_eq!(hosts, ["api.openai.com", "*.anthropic.com", "*.googleapis.com"]);
    let notes: Vec<String> = file.warnings.iter().map(DocError::as_warning).collect();
    assert_eq!(
        notes,
        [format!(
            "design.yaml:2: warning: kind: agent-assembly.dev/v1alpha1 GovernancePolicy is read as sandgate's own form, apiVersion: {API_VERSION}, kind: {KIND} (docs/policy.md)"
        )]
    );
    // The design's grammar table, as sandgate decides it.
    let rules = Ruleset::from_parts(&[], &[], Some(&file));
    for (target, want) in [
        ("api.openai.com:443", true),
        ("API.openai.com:443", true),
        ("chat.openai.com:443", false),
        ("attackerapi.openai.com:443", false),
        ("a.b.anthropic.com:443", true),
        ("anthropic.com:443", false),
        ("evil.openai.com.attacker.net:443", false),
        ("api.openai.com:25", false),
    ] {
        let t = parse_connect_target(target).unwrap();
        let allowed = rules.decide(&t, Access::Connect, &Context::system(0)).verdict == Verdict::Allow;
        assert_eq!(allowed, want, "{target}");
    }
}

#[test]
fn an_empty_governance_allowlist_denies_and_says_so() {
    let text = "apiVersion: agent-assembly.dev/v1alpha1\nkind: GovernancePolicy\nmetadata: { name: open }\nspec:\n  network:\n    allowlist: []\n";
    let file = parse_policy(text, "g.yaml", 0).unwrap();
    assert!(file.allow.is_empty());
    assert!(
        file.warnings
            .iter()
            .any(|w| w.field == "spec.network.allowlist" && w.message.contains("denies every request")),
        "{:?}",
        file.warnings
    );
}

#[test]
fn the_two_forms_do_not_mix() {
    for (header, field) in [
        (
            "apiVersion: sandgate.dev/v1\nkind: GovernancePolicy\n",
            "apiVersion",
        ),
        (
            "apiVersion: agent-assembly.dev/v1alpha1\nkind: EgressPolicy\n",
            "apiVersion",
        ),
        (
            "apiVersion: agent-assembly.dev/v1\nkind: GovernancePolicy\n",
            "apiVersion",
        ),
        ("apiVersion: sandgate.dev/v1\nkind: Governance\n", "kind"),
    ] {
        let text = format!("{header}metadata: {{ name: x }}\n");
        let errors = parse_policy(&text, "x.yaml", 0).unwrap_err();
        assert!(errors.0.iter().any(|e| e.field == field), "{header}: {errors}");
    }
    // sandgate's own form carries no note.
    let own = "apiVersion: sandgate.dev/v1\nkind: EgressPolicy\nmetadata: { name: x }\n";
    assert!(parse_policy(own, "x.yaml", 0).unwrap().warnings.is_empty());
}

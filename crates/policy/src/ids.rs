//! Lists of task and project ids in a policy: each item an exact id, `*` (any) or a prefix
//! ending in `*` (`node-a:*`: every task a node names under itself, such as a sandboxed
//! run's `node-a:run-...`). The one matcher for `spec.nodes`, exception scopes and the
//! tasks a requester token may ask for.

/// What an id may be, in words (for error messages).
pub const ID_RULE: &str = "1 to 128 of A-Z a-z 0-9 . _ - :";

/// Whether `id` is an id: a task, project, job or subject is 1 to 128 letters, digits and
/// `. _ - :`, so it fits a header, a URL path segment and a log line unescaped. The one
/// definition for the control plane, the node attribution fields and the policy file.
pub fn valid(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'))
}

/// Whether `pattern` names `id`: equal to it, `*`, or a prefix of it followed by `*`.
pub fn matches(pattern: &str, id: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => id.starts_with(prefix),
        None => pattern == id,
    }
}

/// Whether any item of `list` names `id`.
pub fn listed(list: &[String], id: &str) -> bool {
    list.iter().any(|p| matches(p, id))
}

/// Why a pattern is not one: a `*` anywhere but at the end, or (where `any` is refused) a
/// pattern that names every id.
pub fn check(pattern: &str, any_allowed: bool) -> Result<(), &'static str> {
    match pattern.find('*') {
        Some(i) if i + 1 != pattern.len() => Err("`*` may only end a pattern (`prefix*`)"),
        Some(0) if !any_allowed => Err("`*` alone names every task; name a prefix (`node-a:*`)"),
        _ if pattern.is_empty() => Err("empty id"),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_name_exact_ids_prefixes_or_all() {
        for (pattern, id, expected) in [
            ("t-1", "t-1", true),
            ("t-1", "t-10", false),
            ("t-1", "t", false),
            ("node-a:*", "node-a:run-1-ab", true),
            ("node-a:*", "node-a:", true),
            ("node-a:*", "node-b:run-1", false),
            ("node-a:*", "node-a", false),
            ("*", "anything", true),
            ("*", "", true),
        ] {
            assert_eq!(matches(pattern, id), expected, "{pattern} ~ {id}");
        }
        assert!(listed(&["x".into(), "node-a:*".into()], "node-a:run-7"));
        assert!(!listed(&[], "t-1"));
    }

    #[test]
    fn ids_are_short_and_plain() {
        for ok in ["t-1", "node-a:run-7-0a", "p.x_y", &"x".repeat(128)] {
            assert!(valid(ok), "{ok}");
        }
        for bad in ["", "a b", "a/b", "a\nb", "é", "a*", &"x".repeat(129)] {
            assert!(!valid(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_star_only_ends_a_pattern_and_alone_only_where_allowed() {
        assert_eq!(check("node-a:*", false), Ok(()));
        assert_eq!(check("t-1", false), Ok(()));
        assert_eq!(check("*", true), Ok(()));
        assert!(check("*", false).is_err());
        assert!(check("a*b", true).is_err());
        assert!(check("**", true).is_err());
        assert!(check("", true).is_err());
    }
}

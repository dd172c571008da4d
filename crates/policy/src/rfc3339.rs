//! The serde form of a time kept as Unix seconds: written as RFC 3339 text, read from that
//! or from Unix seconds. The times of an [`Exception`](crate::Exception) (`requested_at`,
//! `decided_at`, `expires_at`) use it, so the admin API, the stores, `sandgate exceptions
//! --json` and `sandgate mcp` say times the way the audit log does.
//!
//! In memory a time stays `i64` Unix seconds: every function of this crate takes `now` as
//! an argument and compares integers. Written: UTC, whole seconds, `2026-11-27T01:02:03Z`
//! (RFC 3339 section 5.6). Read: any RFC 3339 time with an offset (a fraction is cut to the
//! second at or before it), or a JSON integer of Unix seconds, which is what rows stored and
//! clients built before the change hold. Refused: a float, a time without an offset (in
//! which zone?), anything outside years -9999 to 9999. Formatting only; no clock is read.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::ser::{self, Serializer};

/// What a refusal says is expected.
const EXPECTED: &str = "an RFC 3339 time such as 2026-11-27T01:02:03Z (or Unix seconds)";

/// At most this many characters of a refused text are quoted back.
const QUOTED: usize = 40;

/// `secs` as RFC 3339 UTC text; None outside the years -9999 to 9999.
pub fn format(secs: i64) -> Option<String> {
    jiff::Timestamp::from_second(secs).ok().map(|t| t.to_string())
}

/// Unix seconds from RFC 3339 text, or a message saying what was expected.
pub fn parse(text: &str) -> Result<i64, String> {
    match text.parse::<jiff::Timestamp>() {
        Ok(t) if t.subsec_nanosecond() < 0 => Ok(t.as_second() - 1),
        Ok(t) => Ok(t.as_second()),
        Err(e) => {
            let shown: String = text.chars().take(QUOTED).collect();
            let cut = if shown.len() < text.len() { "..." } else { "" };
            Err(format!("{shown:?}{cut} is not {EXPECTED}: {e}"))
        }
    }
}

/// Unix seconds checked to be a time [`format`] can write.
fn in_range(secs: i64) -> Result<i64, String> {
    match jiff::Timestamp::from_second(secs) {
        Ok(_) => Ok(secs),
        Err(_) => Err(format!("{secs} Unix seconds is outside the years -9999 to 9999")),
    }
}

pub fn serialize<S: Serializer>(secs: &i64, serializer: S) -> Result<S::Ok, S::Error> {
    match format(*secs) {
        Some(text) => serializer.serialize_str(&text),
        None => Err(ser::Error::custom(format!(
            "{secs} Unix seconds is outside the years -9999 to 9999"
        ))),
    }
}

pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    deserializer.deserialize_any(Seconds)
}

/// The visitor of one time: an integer or a string.
struct Seconds;

impl Visitor<'_> for Seconds {
    type Value = i64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(EXPECTED)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<i64, E> {
        in_range(v).map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<i64, E> {
        i64::try_from(v)
            .map_err(|_| format!("{v} Unix seconds is outside the years -9999 to 9999"))
            .and_then(in_range)
            .map_err(E::custom)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<i64, E> {
        parse(v).map_err(E::custom)
    }
}

/// The same for an optional time: `null` (or absent, with `#[serde(default)]`) is None.
pub mod option {
    use super::{Deserializer, Seconds, Serializer, Visitor, de, fmt};

    pub fn serialize<S: Serializer>(secs: &Option<i64>, serializer: S) -> Result<S::Ok, S::Error> {
        match secs {
            Some(s) => super::serialize(s, serializer),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<i64>, D::Error> {
        deserializer.deserialize_option(MaybeSeconds)
    }

    struct MaybeSeconds;

    impl<'de> Visitor<'de> for MaybeSeconds {
        type Value = Option<i64>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "null or {}", super::EXPECTED)
        }

        fn visit_none<E: de::Error>(self) -> Result<Option<i64>, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Option<i64>, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<i64>, D::Error> {
            deserializer.deserialize_any(Seconds).map(Some)
        }
    }
}

#[cfg(test)]
#[path = "rfc3339_tests.rs"]
mod tests;

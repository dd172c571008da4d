//! Task credentials on the HTTP/1 wire: `Proxy-Authorization: Basic` (RFC 7617, sent to a
//! proxy per RFC 9110 section 11.7.2), decoded into the login the policy crate verifies.

use base64::Engine as _;
use sandgate_policy::AuthError;

/// Longest `Proxy-Authorization` value looked at.
const MAX_HEADER: usize = 1024;

/// The task id and secret of a `Proxy-Authorization` value (`None`: the field is absent).
pub(crate) fn basic_login(header: Option<&[u8]>) -> Result<(String, String), AuthError> {
    let value = header.ok_or(AuthError::Missing)?;
    if value.len() > MAX_HEADER {
        return Err(AuthError::Malformed);
    }
    let text = std::str::from_utf8(value)
        .map_err(|_| AuthError::Malformed)?
        .trim();
    let (scheme, token) = text.split_once(' ').ok_or(AuthError::Malformed)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(AuthError::Malformed);
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .map_err(|_| AuthError::Malformed)?;
    let decoded = String::from_utf8(decoded).map_err(|_| AuthError::Malformed)?;
    let (task, secret) = decoded.split_once(':').ok_or(AuthError::Malformed)?;
    Ok((task.to_owned(), secret.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(user_pass: &str) -> Vec<u8> {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(user_pass)
        )
        .into_bytes()
    }

    #[test]
    fn basic_values_decode_and_everything_else_is_malformed() {
        assert_eq!(
            basic_login(Some(&basic("t-1:s3:cret"))),
            Ok(("t-1".to_owned(), "s3:cret".to_owned()))
        );
        assert_eq!(basic_login(None), Err(AuthError::Missing));
        for bad in [
            &b"Bearer abc"[..],
            b"Basic !!!",
            b"Basic",
            &basic("no-colon"),
            &[0xff, 0xfe],
        ] {
            assert_eq!(
                basic_login(Some(bad)),
                Err(AuthError::Malformed),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(basic_login(Some(&vec![b'a'; 2000])), Err(AuthError::Malformed));
    }
}

//! What the fabric's replies, and the failures to get one, mean as typed provider
//! errors. A leaf module: the fabric client and the token code both map their replies
//! through it, and neither depends on the other for that.

use serde::de::DeserializeOwned;

use crate::host::HttpError;
use crate::model::ProviderError;

/// Longest excerpt of a reply body quoted in an error.
const MAX_QUOTED: usize = 2048;

/// Parses a reply body, turning any JSON or shape error into `malformed-reply`.
pub fn parse_json<T: DeserializeOwned>(body: &[u8], what: &str) -> Result<T, ProviderError> {
    serde_json::from_slice(body)
        .map_err(|e| ProviderError::malformed(format!("{what}: {e} (body: {})", body_text(body))))
}

/// Maps a transport failure of the host's HTTP onto the provider's error.
pub fn http_failure(peer: &str, e: HttpError) -> ProviderError {
    match e {
        HttpError::Denied(m) => ProviderError::Denied(format!("HTTP to the {peer}: {m}")),
        HttpError::InvalidRequest(m) => {
            ProviderError::Config(format!("invalid request to the {peer}: {m}"))
        }
        HttpError::Timeout => ProviderError::Unavailable(format!("the {peer} timed out")),
        HttpError::Connect(m) => {
            ProviderError::Unavailable(format!("cannot connect to the {peer}: {m}"))
        }
        HttpError::Tls(m) => ProviderError::Unavailable(format!("TLS with the {peer} failed: {m}")),
        HttpError::TooLarge(n) => ProviderError::MalformedReply(format!(
            "the {peer}'s reply exceeds the granted {n} bytes"
        )),
        // A reply cut short or a protocol failure: the fabric was not properly reached.
        HttpError::Other(m) => {
            ProviderError::Unavailable(format!("HTTP to the {peer} failed: {m}"))
        }
    }
}

/// Error codes that mean "no free device of that model": `insufficient_resources` is
/// what FTI deployments answer; `E0409` is the code of our fabric simulator (see
/// docs/fti-fabric-api.md). More can be configured with `no_capacity_codes`.
pub const NO_CAPACITY_CODES: [&str; 2] = ["insufficient_resources", "E0409"];

/// An error reply of the fabric, in any of the shapes FTI deployments use (see
/// docs/fti-fabric-api.md): `{"status": .., "detail": {"code": .., "message": ..}}`
/// where `message` may be any JSON value; code and message at the top level; or
/// `{"error": "<code>", "error_description": ..}`. A body that is not such JSON becomes
/// the message verbatim. A code that means "no free device" is `no-capacity`.
pub fn fabric_error(status: u16, body: &[u8]) -> ProviderError {
    fabric_error_with(status, body, &[])
}

/// [`fabric_error`] with more codes that mean "no free device".
pub fn fabric_error_with(status: u16, body: &[u8], no_capacity_codes: &[String]) -> ProviderError {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let text = |v: &serde_json::Value| -> Option<String> {
        match v {
            serde_json::Value::Null => None,
            serde_json::Value::String(s) => Some(s.clone()),
            other => Some(other.to_string()),
        }
    };
    let field = |name: &str| -> Option<String> {
        let v = parsed.as_ref()?;
        let found = v
            .get("detail")
            .and_then(|d| d.get(name))
            .or_else(|| v.get(name))?;
        text(found)
    };
    let top = |name: &str| -> Option<String> { parsed.as_ref()?.get(name).and_then(text) };
    let code = field("code")
        .or_else(|| {
            // `{"error": "<code>"}`; an `error` object carries its code inside.
            let e = parsed.as_ref()?.get("error")?;
            match e {
                serde_json::Value::Object(_) => e.get("code").and_then(text),
                other => text(other),
            }
        })
        .unwrap_or_default();
    let message = field("message")
        .or_else(|| top("error_description"))
        .or_else(|| {
            let e = parsed.as_ref()?.get("error")?;
            e.is_object()
                .then(|| e.get("message").and_then(text))
                .flatten()
        })
        .or_else(|| {
            // `{"detail": "..."}`: the detail itself is the message.
            let d = parsed.as_ref()?.get("detail")?;
            d.is_string().then(|| text(d)).flatten()
        })
        .unwrap_or_else(|| body_text(body));
    let no_capacity = !code.is_empty()
        && (NO_CAPACITY_CODES
            .iter()
            .any(|c| c.eq_ignore_ascii_case(&code))
            || no_capacity_codes
                .iter()
                .any(|c| c.eq_ignore_ascii_case(&code)));
    if no_capacity {
        return ProviderError::NoCapacity(format!(
            "the fabric has no free device (HTTP {status}, code '{code}'): {message}"
        ));
    }
    ProviderError::Fabric {
        status,
        code,
        message,
    }
}

/// A reply body as text for an error message, cut to a readable length.
pub fn body_text(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.len() <= MAX_QUOTED {
        return text.to_string();
    }
    let mut end = MAX_QUOTED;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], body.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fabric(status: u16, body: &str) -> (u16, String, String) {
        match fabric_error(status, body.as_bytes()) {
            ProviderError::Fabric {
                status,
                code,
                message,
            } => (status, code, message),
            other => panic!("not a fabric error: {other:?}"),
        }
    }

    #[test]
    fn error_reply_with_string_message() {
        let b = r#"{"status":409,"detail":{"code":"E0001","message":"busy","data":{}}}"#;
        assert_eq!(fabric(409, b), (409, "E0001".into(), "busy".into()));
    }

    #[test]
    fn error_reply_with_object_message_keeps_json_text() {
        let b = r#"{"status":400,"detail":{"code":"E0002","message":{"reason":"x","n":[1,2]}}}"#;
        assert_eq!(
            fabric(400, b),
            (400, "E0002".into(), r#"{"n":[1,2],"reason":"x"}"#.into())
        );
    }

    #[test]
    fn error_reply_with_top_level_fields_or_numeric_code() {
        assert_eq!(
            fabric(500, r#"{"code":7,"message":"boom"}"#),
            (500, "7".into(), "boom".into())
        );
    }

    #[test]
    fn error_reply_that_is_not_json_is_quoted() {
        assert_eq!(
            fabric(502, "<html>bad gateway</html>\n"),
            (502, "".into(), "<html>bad gateway</html>".into())
        );
        assert_eq!(fabric(503, ""), (503, "".into(), "".into()));
        assert_eq!(fabric(500, "[1]"), (500, "".into(), "[1]".into()));
    }

    #[test]
    fn error_reply_with_an_error_code_keeps_the_code() {
        assert_eq!(
            fabric(400, r#"{"error":"invalid_machine"}"#),
            (
                400,
                "invalid_machine".into(),
                r#"{"error":"invalid_machine"}"#.into()
            )
        );
        assert_eq!(
            fabric(
                401,
                r#"{"error":"invalid_grant","error_description":"Invalid user credentials"}"#
            ),
            (
                401,
                "invalid_grant".into(),
                "Invalid user credentials".into()
            )
        );
        assert_eq!(
            fabric(500, r#"{"error":{"code":"E77","message":"disk"}}"#),
            (500, "E77".into(), "disk".into())
        );
        assert_eq!(
            fabric(404, r#"{"detail":"Not Found"}"#),
            (404, "".into(), "Not Found".into())
        );
    }

    #[test]
    fn no_free_device_codes_are_no_capacity() {
        for body in [
            r#"{"error":"insufficient_resources"}"#,
            r#"{"status":409,"detail":{"code":"E0409","message":"no free resource","data":{}}}"#,
            r#"{"code":"INSUFFICIENT_RESOURCES","message":"pool empty"}"#,
        ] {
            assert!(
                matches!(fabric_error(409, body.as_bytes()), ProviderError::NoCapacity(ref m) if m.contains("409")),
                "{body}"
            );
        }
        let custom = ["E9001".to_string()];
        assert!(matches!(
            fabric_error_with(409, br#"{"error":"E9001"}"#, &custom),
            ProviderError::NoCapacity(_)
        ));
        assert!(matches!(
            fabric_error(409, br#"{"error":"E9001"}"#),
            ProviderError::Fabric { .. }
        ));
        // The word alone in a message is not a code.
        assert!(matches!(
            fabric_error(500, b"insufficient_resources"),
            ProviderError::Fabric { .. }
        ));
    }

    #[test]
    fn long_bodies_are_cut_on_a_char_boundary() {
        let long = "é".repeat(MAX_QUOTED);
        let t = body_text(long.as_bytes());
        assert!(t.len() < long.len());
        assert!(t.ends_with(&format!("({} bytes)", long.len())));
    }
}

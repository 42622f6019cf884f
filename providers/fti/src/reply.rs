//! What the fabric's replies, and the failures to get one, mean as typed provider
//! errors. A leaf module: the fabric client and the token code both map their replies
//! through it, and neither depends on the other for that.

pub use cro_provider_sdk::json::{body_text, http_failure, parse_json};

use crate::model::ProviderError;

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
}

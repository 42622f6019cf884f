//! JSON over the host's HTTP: requests with a JSON body, replies parsed into types, and
//! every failure mapped onto a typed [`ProviderError`].

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::host::{Host, HttpError, HttpRequest, HttpResponse, Method};
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

/// Sends `method url` with an optional JSON body and `headers`, accepting JSON; any
/// transport failure is a typed error naming `peer`. The reply comes back whatever its
/// status: [`expect_json`] checks and parses it.
pub fn send<H: Host + ?Sized, B: Serialize + ?Sized>(
    host: &H,
    peer: &str,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&B>,
    timeout_ms: Option<u32>,
) -> Result<HttpResponse, ProviderError> {
    let mut all: Vec<(String, String)> = vec![("accept".into(), "application/json".into())];
    let body = match body {
        Some(b) => {
            all.push(("content-type".into(), "application/json".into()));
            serde_json::to_vec(b).map_err(|e| {
                ProviderError::Other(format!("encoding the request to the {peer}: {e}"))
            })?
        }
        None => Vec::new(),
    };
    all.extend(headers.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    host.http_send(HttpRequest {
        method,
        url: url.to_string(),
        headers: all,
        body,
        timeout_ms,
    })
    .map_err(|e| http_failure(peer, e))
}

/// A 2xx reply parsed as `T`; another status becomes [`fabric_error`].
pub fn expect_json<T: DeserializeOwned>(
    reply: &HttpResponse,
    what: &str,
) -> Result<T, ProviderError> {
    if !(200..300).contains(&reply.status) {
        return Err(fabric_error(reply));
    }
    parse_json(&reply.body, what)
}

/// A fabric's error reply as `ProviderError::Fabric`, keeping the vendor's own error
/// code and message where the body has them in one of the common shapes:
/// `{"code", "message"}`, `{"error": {"code", "message"}}` (Redfish, many REST APIs),
/// `{"errors": [{"code", "message"}, ...]}` (the first), `{"detail": {"code",
/// "message"}}` (FTI) and RFC 7807 problem details (`type`/`title`/`detail`). A code may
/// be a string or a number. Otherwise the code is empty and the body is the message.
pub fn fabric_error(reply: &HttpResponse) -> ProviderError {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(&reply.body).ok();
    let (code, message) = parsed
        .as_ref()
        .and_then(vendor_error)
        .unwrap_or_else(|| (String::new(), body_text(&reply.body)));
    ProviderError::Fabric {
        status: reply.status,
        code,
        message,
    }
}

/// (code, message) from the first error shape `body` matches.
fn vendor_error(body: &serde_json::Value) -> Option<(String, String)> {
    let text = |v: Option<&serde_json::Value>| -> Option<String> {
        match v? {
            serde_json::Value::String(s) => Some(s.trim().to_string()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    };
    let pair = |o: &serde_json::Value| -> Option<(String, String)> {
        let code = text(o.get("code"));
        let message = text(o.get("message"));
        match (code, message) {
            (None, None) => None,
            (code, message) => Some((
                code.unwrap_or_default(),
                message.unwrap_or_else(|| body_text(o.to_string().as_bytes())),
            )),
        }
    };
    let nested = ["error", "detail"]
        .iter()
        .filter_map(|k| body.get(k))
        .find(|v| v.is_object());
    if let Some(found) = nested.and_then(pair) {
        return Some(found);
    }
    if let Some(found) = body
        .get("errors")
        .and_then(|e| e.as_array()?.first())
        .and_then(pair)
    {
        return Some(found);
    }
    if let Some(found) = pair(body) {
        return Some(found);
    }
    // RFC 7807: the problem's type (or title) is its code, the detail its message.
    let title = text(body.get("title"));
    let detail = text(body.get("detail"));
    if title.is_some() || detail.is_some() {
        let code = text(body.get("type"))
            .filter(|t| t != "about:blank")
            .or(title.clone())
            .unwrap_or_default();
        return Some((code, detail.or(title).unwrap_or_default()));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestHost;

    fn reply(status: u16, body: &str) -> HttpResponse {
        HttpResponse {
            status,
            headers: Vec::new(),
            body: body.as_bytes().to_vec(),
        }
    }

    fn code_and_message(e: ProviderError) -> (u16, String, String) {
        match e {
            ProviderError::Fabric {
                status,
                code,
                message,
            } => (status, code, message),
            other => panic!("not a fabric error: {other:?}"),
        }
    }

    #[test]
    fn a_vendors_error_code_and_message_are_kept() {
        let cases = [
            (
                r#"{"code": "E42", "message": "no such GPU"}"#,
                "E42",
                "no such GPU",
            ),
            (
                r#"{"error": {"code": "Base.1.8.ResourceMissingAtURI", "message": "gone",
                    "@Message.ExtendedInfo": []}}"#,
                "Base.1.8.ResourceMissingAtURI",
                "gone",
            ),
            (
                r#"{"errors": [{"code": 1007, "message": "busy"}, {"code": 2}]}"#,
                "1007",
                "busy",
            ),
            (
                r#"{"status": 409, "detail": {"code": "E02010", "message": "in use"}}"#,
                "E02010",
                "in use",
            ),
            (
                r#"{"type": "https://fabric.example/probs/pool-empty", "title": "Pool empty",
                    "status": 503, "detail": "no A100 left"}"#,
                "https://fabric.example/probs/pool-empty",
                "no A100 left",
            ),
            (
                r#"{"type": "about:blank", "title": "Not Found", "status": 404}"#,
                "Not Found",
                "Not Found",
            ),
        ];
        for (body, code, message) in cases {
            let got = code_and_message(fabric_error(&reply(409, body)));
            assert_eq!(got, (409, code.to_string(), message.to_string()), "{body}");
            // expect_json gives the same error.
            let err = expect_json::<serde_json::Value>(&reply(409, body), "x").unwrap_err();
            assert_eq!(code_and_message(err), got);
        }
        // No known shape: no code, the body as the message.
        for body in ["<html>Bad Gateway</html>", r#"{"oops": true}"#, ""] {
            let (status, code, message) = code_and_message(fabric_error(&reply(502, body)));
            assert_eq!((status, code.as_str()), (502, ""));
            assert_eq!(message, body_text(body.as_bytes()));
        }
    }

    #[test]
    fn long_bodies_are_cut_on_a_char_boundary() {
        let long = "é".repeat(MAX_QUOTED);
        let t = body_text(long.as_bytes());
        assert!(t.len() < long.len());
        assert!(t.ends_with(&format!("({} bytes)", long.len())));
    }

    #[test]
    fn json_round_trip_and_typed_failures() {
        let host = TestHost::new();
        host.on_http(|r| {
            assert_eq!(r.body, br#"{"a":1}"#);
            assert!(
                r.headers
                    .iter()
                    .any(|(k, v)| k == "content-type" && v == "application/json")
            );
            if r.url.ends_with("/ok") {
                Ok(HttpResponse {
                    status: 200,
                    headers: Vec::new(),
                    body: br#"{"b":2}"#.to_vec(),
                })
            } else if r.url.ends_with("/down") {
                Err(HttpError::Connect("refused".into()))
            } else {
                Ok(HttpResponse {
                    status: 503,
                    headers: Vec::new(),
                    body: b"busy".to_vec(),
                })
            }
        });
        let body = serde_json::json!({"a": 1});
        let ok = send(
            &host,
            "fabric",
            Method::Post,
            "https://f/ok",
            &[],
            Some(&body),
            None,
        )
        .unwrap();
        let v: serde_json::Value = expect_json(&ok, "reply").unwrap();
        assert_eq!(v["b"], 2);
        let busy = send(
            &host,
            "fabric",
            Method::Post,
            "https://f/busy",
            &[],
            Some(&body),
            None,
        )
        .unwrap();
        assert!(matches!(
            expect_json::<serde_json::Value>(&busy, "reply"),
            Err(ProviderError::Fabric { status: 503, ref message, .. }) if message == "busy"
        ));
        assert!(matches!(
            send(&host, "fabric", Method::Post, "https://f/down", &[], Some(&body), None),
            Err(ProviderError::Unavailable(m)) if m.contains("refused")
        ));
        assert!(matches!(
            expect_json::<Vec<u8>>(&ok, "reply"),
            Err(ProviderError::MalformedReply(_))
        ));
    }
}

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

/// A 2xx reply parsed as `T`; another status becomes `ProviderError::Fabric` with the
/// body quoted as the message.
pub fn expect_json<T: DeserializeOwned>(
    reply: &HttpResponse,
    what: &str,
) -> Result<T, ProviderError> {
    if !(200..300).contains(&reply.status) {
        return Err(ProviderError::Fabric {
            status: reply.status,
            code: String::new(),
            message: body_text(&reply.body),
        });
    }
    parse_json(&reply.body, what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestHost;

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

//! What `cro provider call --trace-bodies` shows of an HTTP exchange: headers and bodies
//! with every credential taken out. A header or a JSON/form field whose name says it
//! holds one (`authorization`, `password`, `access_token`, `client_secret`, ...) loses
//! its value, and every value the command was given with `--secret` is replaced wherever
//! it appears, so a vendor can paste the trace into a bug report.

use cro_runtime::{HttpExchange, escape_line};
use serde::Serialize;
use serde_json::Value;

/// What stands where a credential was.
pub const REDACTED: &str = "<redacted>";

/// Values shorter than this are not searched for (they would match everywhere).
const MIN_SECRET_CHARS: usize = 4;

/// One exchange as the trace shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExchangeRecord {
    pub request_headers: Vec<String>,
    pub request_body: String,
    pub response_headers: Vec<String>,
    pub response_body: String,
}

impl ExchangeRecord {
    /// Bytes of text it holds.
    pub fn text_bytes(&self) -> usize {
        self.request_headers.iter().map(String::len).sum::<usize>()
            + self.response_headers.iter().map(String::len).sum::<usize>()
            + self.request_body.len()
            + self.response_body.len()
    }
}

/// Takes credentials out of exchanges.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl Redactor {
    /// A redactor that also replaces each of `secrets` (the Secret's values) wherever it
    /// appears.
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Redactor {
        let mut secrets: Vec<String> = secrets
            .into_iter()
            .filter(|s| s.chars().count() >= MIN_SECRET_CHARS)
            .collect();
        // Longest first, so a value containing another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Redactor { secrets }
    }

    pub fn exchange(&self, e: &HttpExchange) -> ExchangeRecord {
        ExchangeRecord {
            request_headers: self.headers(&e.request_headers),
            request_body: self.body(&e.request_body),
            response_headers: self.headers(&e.response_headers),
            response_body: self.body(&e.response_body),
        }
    }

    fn headers(&self, headers: &[(String, String)]) -> Vec<String> {
        headers
            .iter()
            .map(|(name, value)| {
                let value = if sensitive(name) {
                    REDACTED.to_owned()
                } else {
                    self.known(value)
                };
                escape_line(&format!("{name}: {value}"), usize::MAX)
            })
            .collect()
    }

    /// A body as text: JSON and form fields named like credentials lose their values,
    /// known secrets are replaced, and what is left is escaped onto one line.
    fn body(&self, body: &[u8]) -> String {
        let text = String::from_utf8_lossy(body);
        let redacted = match serde_json::from_str::<Value>(&text) {
            Ok(mut v) => {
                redact_json(&mut v);
                v.to_string()
            }
            Err(_) if looks_like_form(&text) => redact_form(&text),
            Err(_) => text.into_owned(),
        };
        escape_line(&self.known(&redacted), usize::MAX)
    }

    fn known(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), REDACTED);
            }
            // A form or URL carries it percent-encoded.
            let encoded = form_encode(s);
            if encoded != *s && out.contains(encoded.as_str()) {
                out = out.replace(encoded.as_str(), REDACTED);
            }
        }
        out
    }
}

/// Whether a header or field name says it holds a credential.
fn sensitive(name: &str) -> bool {
    const WORDS: [&str; 9] = [
        "authorization",
        "token",
        "secret",
        "password",
        "passwd",
        "cookie",
        "apikey",
        "api-key",
        "api_key",
    ];
    let lower = name.to_ascii_lowercase();
    // `token_type` (`Bearer`) and `token_expiry`-like fields say what, not which.
    if lower.ends_with("_type") || lower.contains("expire") {
        return false;
    }
    WORDS.iter().any(|w| lower.contains(w))
}

fn redact_json(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, val) in map.iter_mut() {
                if sensitive(k) && !val.is_object() && !val.is_array() {
                    *val = Value::String(REDACTED.into());
                } else {
                    redact_json(val);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_json),
        _ => {}
    }
}

fn looks_like_form(text: &str) -> bool {
    !text.is_empty()
        && !text.contains(char::is_whitespace)
        && text.split('&').all(|pair| pair.contains('='))
}

fn redact_form(text: &str) -> String {
    text.split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if sensitive(k) => format!("{k}={REDACTED}"),
            _ => pair.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// `application/x-www-form-urlencoded` encoding of one value.
fn form_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'*' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exchange(req_body: &str, resp_body: &str) -> HttpExchange {
        HttpExchange {
            request_headers: vec![
                ("authorization".into(), "Bearer eyJhbGciOi".into()),
                (
                    "content-type".into(),
                    "application/x-www-form-urlencoded".into(),
                ),
                ("x-note".into(), "user admin@example p4ss word!".into()),
            ],
            request_body: req_body.as_bytes().to_vec(),
            response_headers: vec![("set-cookie".into(), "sid=abc".into())],
            response_body: resp_body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn credentials_leave_headers_forms_json_and_wherever_they_were_given() {
        let r = Redactor::new([
            "admin@example".to_string(),
            "p4ss word!".into(),
            "ab".into(),
        ]);
        let e = r.exchange(&exchange(
            "grant_type=password&username=admin%40example&password=p4ss+word%21&client_secret=s3cr3t&scope=openid",
            r#"{"access_token":"eyJ.x.y","token_type":"Bearer","expires_in":300,"nested":{"refresh_token":"r1"},"note":"ab"}"#,
        ));
        assert_eq!(e.request_headers[0], "authorization: <redacted>");
        assert_eq!(e.request_headers[2], "x-note: user <redacted> <redacted>");
        assert_eq!(e.response_headers[0], "set-cookie: <redacted>");
        assert_eq!(
            e.request_body,
            "grant_type=password&username=<redacted>&password=<redacted>&client_secret=<redacted>&scope=openid"
        );
        let body: Value = serde_json::from_str(&e.response_body).unwrap();
        assert_eq!(body["access_token"], REDACTED);
        assert_eq!(body["nested"]["refresh_token"], REDACTED);
        assert_eq!(body["expires_in"], 300);
        assert_eq!(body["token_type"], "Bearer");
        // Values too short to search for are left alone.
        assert_eq!(body["note"], "ab");
    }

    #[test]
    fn bodies_are_one_escaped_line() {
        let r = Redactor::new([]);
        let e = r.exchange(&exchange("plain text\nwith \u{1b}[2J", "\u{202e}x"));
        assert_eq!(e.request_body, "plain text\\nwith \\u{1b}[2J");
        assert_eq!(e.response_body, "\\u{202e}x");
    }
}

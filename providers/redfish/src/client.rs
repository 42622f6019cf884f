//! HTTP to the Redfish service with a session: the `X-Auth-Token` is kept in the host's
//! `state` (one log-in serves many calls) and a `401` on a held token logs in again,
//! once. Error replies become typed errors: a Redfish error body's first
//! `@Message.ExtendedInfo` `MessageId` is the fabric error's code.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use cro_provider_sdk::json::{body_text, http_failure, parse_json};
use cro_provider_sdk::{Host, HttpRequest, HttpResponse, Method, ProviderError, SecretError};

use crate::config::Config;
use crate::resources::SESSIONS;

/// The `state` key of the session.
pub const SESSION_KEY: &str = "redfish/session";

const PEER: &str = "Redfish service";

/// The session the provider holds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Session {
    token: String,
    /// The session's URI (`Location`), for the record.
    location: Option<String>,
}

/// A Redfish client over the host.
pub struct Client<'a, H: Host + ?Sized> {
    host: &'a H,
    cfg: &'a Config,
}

impl<'a, H: Host + ?Sized> Client<'a, H> {
    pub fn new(host: &'a H, cfg: &'a Config) -> Self {
        Client { host, cfg }
    }

    pub fn host(&self) -> &'a H {
        self.host
    }

    /// `method path` with the session's token, logging in first when no session is
    /// held and again (once) when the service answers `401`.
    pub fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<HttpResponse, ProviderError> {
        let session = match self.held() {
            Some(s) => s,
            None => self.login()?,
        };
        let reply = self.raw(method, path, headers, body, Some(&session.token))?;
        if reply.status != 401 {
            return Ok(reply);
        }
        self.host.state_remove(SESSION_KEY);
        let session = self.login()?;
        self.raw(method, path, headers, body, Some(&session.token))
    }

    /// GET of a resource parsed as `T` (any non-2xx is a typed error).
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ProviderError> {
        let reply = self.send(Method::Get, path, &[], None)?;
        expect(&reply, path)
    }

    fn held(&self) -> Option<Session> {
        let bytes = self.host.state_get(SESSION_KEY)?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Opens a session with the granted credentials and keeps it in `state`.
    fn login(&self) -> Result<Session, ProviderError> {
        let username = self.secret("username")?;
        let password = self.secret("password")?;
        let body = serde_json::json!({"UserName": username, "Password": password});
        let reply = self.raw(Method::Post, SESSIONS, &[], Some(&body), None)?;
        if !(200..300).contains(&reply.status) {
            return Err(error_of(&reply));
        }
        let token = header(&reply, "x-auth-token")
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                ProviderError::malformed(format!(
                    "the session log-in answered {} without an X-Auth-Token header",
                    reply.status
                ))
            })?;
        let session = Session {
            token: token.to_string(),
            location: header(&reply, "location").map(str::to_string),
        };
        if let Ok(bytes) = serde_json::to_vec(&session) {
            // Kept without a TTL: the service decides when the session ends, and a 401
            // says so.
            self.host.state_set(SESSION_KEY, &bytes, None);
        }
        Ok(session)
    }

    fn secret(&self, key: &str) -> Result<String, ProviderError> {
        self.host.secret_get(key).map_err(|e| match e {
            SecretError::Denied(m) => ProviderError::Denied(format!("Secret key {key}: {m}")),
            SecretError::NotFound(m) => {
                ProviderError::Config(format!("Secret key {key} is missing: {m}"))
            }
            SecretError::Other(m) => ProviderError::Other(format!("Secret key {key}: {m}")),
        })
    }

    fn raw(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
        token: Option<&str>,
    ) -> Result<HttpResponse, ProviderError> {
        let mut all: Vec<(String, String)> = vec![
            ("accept".into(), "application/json".into()),
            ("odata-version".into(), "4.0".into()),
        ];
        let body = match body {
            Some(b) => {
                all.push(("content-type".into(), "application/json".into()));
                serde_json::to_vec(b).map_err(|e| {
                    ProviderError::Other(format!("encoding the request to the {PEER}: {e}"))
                })?
            }
            None => Vec::new(),
        };
        if let Some(t) = token {
            all.push(("x-auth-token".into(), t.to_string()));
        }
        all.extend(headers.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self.host
            .http_send(HttpRequest {
                method,
                url: self.cfg.url(path),
                headers: all,
                body,
                timeout_ms: Some(self.cfg.timeout_ms),
            })
            .map_err(|e| http_failure(PEER, e))
    }
}

/// A reply's header, by case-insensitive name.
pub fn header<'r>(reply: &'r HttpResponse, name: &str) -> Option<&'r str> {
    reply
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// A 2xx reply parsed as `T`; otherwise the reply's typed error.
pub fn expect<T: DeserializeOwned>(reply: &HttpResponse, what: &str) -> Result<T, ProviderError> {
    if !(200..300).contains(&reply.status) {
        return Err(error_of(reply));
    }
    parse_json(&reply.body, what)
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
    #[serde(rename = "@Message.ExtendedInfo", default)]
    extended: Vec<ExtendedInfo>,
}

#[derive(Deserialize)]
struct ExtendedInfo {
    #[serde(rename = "MessageId", default)]
    message_id: String,
    #[serde(rename = "Message", default)]
    message: String,
}

/// The fabric error of a non-2xx reply: code and message from the Redfish error body
/// (the first extended message, else `error.code` / `error.message`), or the body
/// verbatim with no code when it is not a Redfish error.
pub fn error_of(reply: &HttpResponse) -> ProviderError {
    let (code, message) = match serde_json::from_slice::<ErrorBody>(&reply.body) {
        Ok(ErrorBody { error }) => {
            let first = error.extended.into_iter().next();
            let code = first
                .as_ref()
                .map(|m| m.message_id.clone())
                .filter(|c| !c.is_empty())
                .unwrap_or(error.code);
            let message = first
                .map(|m| m.message)
                .filter(|m| !m.is_empty())
                .unwrap_or(error.message);
            (code, message)
        }
        Err(_) => (String::new(), body_text(&reply.body)),
    };
    ProviderError::Fabric {
        status: reply.status,
        code,
        message,
    }
}

/// Whether an error is the fabric's `ResourceInUse` (a block taken or a change of the
/// system already running).
pub fn is_in_use(e: &ProviderError) -> bool {
    matches!(e, ProviderError::Fabric { status: 409, code, .. } if code.ends_with("ResourceInUse"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cro_provider_sdk::HttpError;
    use cro_provider_sdk::testing::TestHost;
    use std::cell::Cell;
    use std::rc::Rc;

    fn reply(status: u16, headers: &[(&str, &str)], body: &str) -> HttpResponse {
        HttpResponse {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: body.as_bytes().to_vec(),
        }
    }

    fn host() -> TestHost {
        TestHost::new()
            .with_config("endpoint", "http://bmc")
            .with_secret("username", "admin")
            .with_secret("password", "pw")
    }

    #[test]
    fn logs_in_once_and_again_after_a_401() {
        let host = host();
        let logins = Rc::new(Cell::new(0));
        let l = logins.clone();
        host.on_http(move |r| {
            if r.method == Method::Post && r.url == "http://bmc/redfish/v1/SessionService/Sessions"
            {
                l.set(l.get() + 1);
                let body: Value = serde_json::from_slice(&r.body).unwrap();
                assert_eq!(
                    body,
                    serde_json::json!({"UserName": "admin", "Password": "pw"})
                );
                let token = format!("t{}", l.get());
                return Ok(reply(
                    201,
                    &[("X-Auth-Token", &token), ("Location", "/s/1")],
                    "{}",
                ));
            }
            let token = r
                .headers
                .iter()
                .find(|(k, _)| k == "x-auth-token")
                .map(|(_, v)| v.clone());
            // The first token "expires" after its first use.
            if token.as_deref() == Some("t2")
                || (token.as_deref() == Some("t1") && r.url.ends_with("/a"))
            {
                Ok(reply(200, &[], r#"{"ok": true}"#))
            } else {
                Ok(reply(
                    401,
                    &[],
                    r#"{"error": {"code": "Base.1.16.0.NoValidSession", "message": "no"}}"#,
                ))
            }
        });
        let cfg = Config::load(&host).unwrap();
        let c = Client::new(&host, &cfg);
        let v: Value = c.get("/redfish/v1/a").unwrap();
        assert_eq!(v["ok"], true);
        assert_eq!(logins.get(), 1);
        // t1 is refused on /b: one new log-in, then the request again.
        let v: Value = c.get("/redfish/v1/b").unwrap();
        assert_eq!(v["ok"], true);
        assert_eq!(logins.get(), 2);
        assert_eq!(host.state_keys(), [SESSION_KEY]);
        assert_eq!(host.requests().len(), 5);
    }

    #[test]
    fn a_second_401_is_the_fabrics_error_and_wrong_credentials_too() {
        let host = host();
        host.on_http(|r| {
            if r.method == Method::Post {
                return Ok(reply(201, &[("X-Auth-Token", "t")], "{}"));
            }
            Ok(reply(401, &[], r#"{"error": {"code": "Base.1.16.0.GeneralError", "message": "m",
                "@Message.ExtendedInfo": [{"MessageId": "Base.1.16.0.NoValidSession", "Message": "No session."}]}}"#))
        });
        let cfg = Config::load(&host).unwrap();
        let e = Client::new(&host, &cfg)
            .get::<Value>("/redfish/v1/x")
            .unwrap_err();
        assert_eq!(
            e,
            ProviderError::Fabric {
                status: 401,
                code: "Base.1.16.0.NoValidSession".into(),
                message: "No session.".into()
            }
        );
        assert_eq!(host.requests().len(), 4);
    }

    #[test]
    fn typed_failures() {
        let host = host();
        host.on_http(|r| {
            if r.method == Method::Post {
                return Ok(reply(201, &[("x-auth-token", "t")], "{}"));
            }
            if r.url.ends_with("/down") {
                return Err(HttpError::Connect("refused".into()));
            }
            if r.url.ends_with("/half") {
                return Ok(reply(200, &[], r#"{"Id": "#));
            }
            Ok(reply(503, &[], "maintenance"))
        });
        let cfg = Config::load(&host).unwrap();
        let c = Client::new(&host, &cfg);
        assert!(matches!(
            c.get::<Value>("/redfish/v1/down"),
            Err(ProviderError::Unavailable(_))
        ));
        assert!(matches!(
            c.get::<Value>("/redfish/v1/half"),
            Err(ProviderError::MalformedReply(_))
        ));
        assert_eq!(
            c.get::<Value>("/redfish/v1/busy").unwrap_err(),
            ProviderError::Fabric {
                status: 503,
                code: String::new(),
                message: "maintenance".into()
            }
        );
        let no_secret = TestHost::new().with_config("endpoint", "http://bmc");
        let cfg = Config::load(&no_secret).unwrap();
        assert!(matches!(
            Client::new(&no_secret, &cfg).get::<Value>("/redfish/v1/x"),
            Err(ProviderError::Denied(m)) if m.contains("username")
        ));
    }
}

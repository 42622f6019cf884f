//! An OAuth2 client-credentials token, cached in the host's `state` (instances live for
//! one call, so `state` is where a token survives between calls). The cached entry
//! expires a little before the token does, by the host's TTL, so a provider never sends
//! a token it knows to be stale.

use serde::{Deserialize, Serialize};

use crate::encode;
use crate::host::{Host, HttpRequest, LogLevel, Method};
use crate::json::{body_text, http_failure, parse_json};
use crate::model::ProviderError;

/// Seconds before its expiry a cached token is dropped.
const EXPIRY_MARGIN_SECS: u64 = 30;
/// A token without `expires_in` is kept this long.
const DEFAULT_LIFETIME_SECS: u64 = 300;

/// Where and as whom to ask for a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCredentials {
    /// The token endpoint (absolute URL).
    pub token_url: String,
    pub client_id: String,
    pub client_secret: String,
    /// Space-separated scopes; none asks for the client's default.
    pub scope: Option<String>,
    pub timeout_ms: Option<u32>,
}

/// A token cache under one `state` key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenCache {
    key: String,
}

#[derive(Serialize, Deserialize)]
struct Cached {
    access_token: String,
}

#[derive(Deserialize)]
struct TokenReply {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

impl TokenCache {
    /// A cache kept under `state_key` (e.g. `oauth2/token`).
    pub fn new(state_key: impl Into<String>) -> Self {
        TokenCache {
            key: state_key.into(),
        }
    }

    /// The cached token, or a new one from the token endpoint (then cached).
    pub fn token<H: Host + ?Sized>(
        &self,
        host: &H,
        creds: &ClientCredentials,
    ) -> Result<String, ProviderError> {
        if let Some(cached) = host
            .state_get(&self.key)
            .and_then(|b| serde_json::from_slice::<Cached>(&b).ok())
        {
            return Ok(cached.access_token);
        }
        self.fetch(host, creds)
    }

    /// Drops the cached token (say, after the API answered 401 with it).
    pub fn forget<H: Host + ?Sized>(&self, host: &H) {
        host.state_remove(&self.key);
    }

    /// Always asks the token endpoint, and caches what it answers.
    pub fn fetch<H: Host + ?Sized>(
        &self,
        host: &H,
        creds: &ClientCredentials,
    ) -> Result<String, ProviderError> {
        let mut form = vec![
            ("grant_type", "client_credentials"),
            ("client_id", creds.client_id.as_str()),
            ("client_secret", creds.client_secret.as_str()),
        ];
        if let Some(scope) = &creds.scope {
            form.push(("scope", scope.as_str()));
        }
        let reply = host
            .http_send(HttpRequest {
                method: Method::Post,
                url: creds.token_url.clone(),
                headers: vec![
                    (
                        "content-type".into(),
                        "application/x-www-form-urlencoded".into(),
                    ),
                    ("accept".into(), "application/json".into()),
                ],
                body: encode::form(&form).into_bytes(),
                timeout_ms: creds.timeout_ms,
            })
            .map_err(|e| http_failure("token endpoint", e))?;
        match reply.status {
            200..=299 => {}
            400 | 401 | 403 => {
                return Err(ProviderError::Config(format!(
                    "the token endpoint refused the client credentials (HTTP {}): {}",
                    reply.status,
                    body_text(&reply.body)
                )));
            }
            status => {
                return Err(ProviderError::Fabric {
                    status,
                    code: String::new(),
                    message: format!("token endpoint: {}", body_text(&reply.body)),
                });
            }
        }
        let token: TokenReply = parse_json(&reply.body, "token endpoint reply")?;
        if token.access_token.is_empty() {
            return Err(ProviderError::malformed(
                "token endpoint reply: empty access_token",
            ));
        }
        let life = token.expires_in.unwrap_or(DEFAULT_LIFETIME_SECS);
        let keep = life.saturating_sub(EXPIRY_MARGIN_SECS);
        if keep > 0 {
            let cached = Cached {
                access_token: token.access_token.clone(),
            };
            let bytes = serde_json::to_vec(&cached)
                .map_err(|e| ProviderError::Other(format!("encoding the token cache: {e}")))?;
            if !host.state_set(&self.key, &bytes, Some(keep * 1000)) {
                // Still usable for this call; the next one asks again.
                host.log(
                    LogLevel::Warn,
                    "the host refused to cache the access token; every call will fetch one",
                );
            }
        }
        Ok(token.access_token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{HttpError, HttpResponse};
    use crate::testing::TestHost;
    use std::cell::Cell;
    use std::rc::Rc;
    use std::time::Duration;

    fn creds() -> ClientCredentials {
        ClientCredentials {
            token_url: "https://idm.test/token".into(),
            client_id: "cro".into(),
            client_secret: "s3 cret".into(),
            scope: Some("fabric".into()),
            timeout_ms: None,
        }
    }

    fn issuing(host: &TestHost, expires_in: u64) -> Rc<Cell<u32>> {
        let issued = Rc::new(Cell::new(0));
        let n = issued.clone();
        host.on_http(move |r| {
            assert_eq!(r.url, "https://idm.test/token");
            assert_eq!(
                String::from_utf8_lossy(&r.body),
                "grant_type=client_credentials&client_id=cro&client_secret=s3+cret&scope=fabric"
            );
            n.set(n.get() + 1);
            Ok(HttpResponse {
                status: 200,
                headers: Vec::new(),
                body: format!(
                    r#"{{"access_token":"t{}","expires_in":{expires_in}}}"#,
                    n.get()
                )
                .into_bytes(),
            })
        });
        issued
    }

    #[test]
    fn caches_until_shortly_before_expiry() {
        let host = TestHost::new();
        let issued = issuing(&host, 300);
        let cache = TokenCache::new("oauth2/token");
        assert_eq!(cache.token(&host, &creds()).unwrap(), "t1");
        assert_eq!(cache.token(&host, &creds()).unwrap(), "t1");
        assert_eq!(issued.get(), 1);
        host.advance(Duration::from_secs(300 - EXPIRY_MARGIN_SECS));
        assert_eq!(cache.token(&host, &creds()).unwrap(), "t2");
        cache.forget(&host);
        assert_eq!(cache.token(&host, &creds()).unwrap(), "t3");
    }

    #[test]
    fn refused_credentials_and_failures_are_typed() {
        let host = TestHost::new();
        host.on_http(|_| {
            Ok(HttpResponse {
                status: 401,
                headers: Vec::new(),
                body: br#"{"error":"invalid_client"}"#.to_vec(),
            })
        });
        let cache = TokenCache::new("k");
        assert!(matches!(
            cache.token(&host, &creds()),
            Err(ProviderError::Config(m)) if m.contains("invalid_client")
        ));
        host.on_http(|_| Err(HttpError::Timeout));
        assert!(matches!(
            cache.token(&host, &creds()),
            Err(ProviderError::Unavailable(_))
        ));
        host.on_http(|_| {
            Ok(HttpResponse {
                status: 200,
                headers: Vec::new(),
                body: b"{}".to_vec(),
            })
        });
        assert!(matches!(
            cache.token(&host, &creds()),
            Err(ProviderError::MalformedReply(_))
        ));
        assert!(host.state_keys().is_empty());
    }
}

//! The identity manager's OAuth2 password grant and the token cache.
//!
//! Instances live for one call, so the token is cached in the host's `state`
//! store and renewed [`RENEW_BEFORE_SECS`] before the `exp` of its JWT payload.

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::encode;
use crate::host::{Host, HttpRequest, HttpResponse, LogLevel, Method, SecretError, unix_now};
use crate::jwt;
use crate::model::ProviderError;
use crate::reply::{body_text, fabric_error, http_failure};

/// Renew this many seconds before the token's `exp`.
pub const RENEW_BEFORE_SECS: u64 = 30;
/// 2001-09-09 in Unix seconds: anything earlier is a missing clock, not a real date.
const CLOCK_SANITY_FLOOR: u64 = 1_000_000_000;
/// Key of the cached token in the host's state store.
pub const STATE_KEY: &str = "fti/token";

#[derive(Serialize, Deserialize)]
struct Cached {
    access_token: String,
    exp: u64,
    /// The token is only valid for the identity manager it came from.
    base_url: String,
}

#[derive(Deserialize)]
struct TokenReply {
    access_token: Option<String>,
}

/// A bearer token and whether it came from the cache (a cached token the fabric
/// rejects is dropped and fetched anew once).
#[derive(Debug, Clone)]
pub struct Token {
    pub access_token: String,
    pub cached: bool,
}

/// A valid token: the cached one unless it is within 30 s of expiry.
pub fn obtain<H: Host + ?Sized>(host: &H, cfg: &Config) -> Result<Token, ProviderError> {
    let now = unix_now(host);
    if now < CLOCK_SANITY_FLOOR {
        // Without `wasi: {clocks: true}` the host's clock reads the Unix epoch: a cached
        // token would look fresh forever and only a 401 would renew it.
        host.log(
            LogLevel::Warn,
            "the wall clock reads before 2001; grant the provider wasi clocks so tokens are renewed before they expire",
        );
    }
    if let Some(raw) = host.state_get(STATE_KEY) {
        match serde_json::from_slice::<Cached>(&raw) {
            Ok(c)
                if c.base_url == cfg.base_url && now.saturating_add(RENEW_BEFORE_SECS) < c.exp =>
            {
                return Ok(Token {
                    access_token: c.access_token,
                    cached: true,
                });
            }
            Ok(_) => {}
            Err(e) => host.log(
                LogLevel::Warn,
                &format!("ignoring unreadable cached token: {e}"),
            ),
        }
    }
    fetch(host, cfg)
}

/// Drops the cached token (the fabric refused it).
pub fn forget<H: Host + ?Sized>(host: &H) {
    host.state_remove(STATE_KEY);
}

/// Requests a new token and caches it.
pub fn fetch<H: Host + ?Sized>(host: &H, cfg: &Config) -> Result<Token, ProviderError> {
    let request = password_grant(host, cfg)?;
    host.log(
        LogLevel::Debug,
        "requesting an access token from the identity manager",
    );
    let reply = host
        .http_send(request)
        .map_err(|e| http_failure("identity manager", e))?;
    let access_token = access_token_of(&reply)?;
    let exp = jwt::expiry(&access_token).map_err(|e| ProviderError::malformed(e.to_string()))?;
    cache(host, cfg, &access_token, exp);
    Ok(Token {
        access_token,
        cached: false,
    })
}

/// The OAuth2 password grant's request, from the granted Secret's credentials.
fn password_grant<H: Host + ?Sized>(host: &H, cfg: &Config) -> Result<HttpRequest, ProviderError> {
    let keys = &cfg.secret_keys;
    let username = secret(host, &keys.username)?;
    let password = secret(host, &keys.password)?;
    let client_id = secret(host, &keys.client_id)?;
    let client_secret = secret(host, &keys.client_secret)?;
    let realm = secret(host, &keys.realm)?;

    let url = format!(
        "{}id_manager/realms/{}/protocol/openid-connect/token",
        cfg.base_url,
        encode::component(realm.trim())
    );
    let body = encode::form(&[
        ("client_id", &client_id),
        ("client_secret", &client_secret),
        ("username", &username),
        ("password", &password),
        ("scope", "openid"),
        ("response_type", "id_token token"),
        ("grant_type", "password"),
    ]);
    Ok(HttpRequest {
        method: Method::Post,
        url,
        headers: vec![
            (
                "content-type".into(),
                "application/x-www-form-urlencoded".into(),
            ),
            ("accept".into(), "application/json".into()),
        ],
        body: body.into_bytes(),
        timeout_ms: cfg.timeout_ms,
    })
}

/// The access token of the identity manager's reply (trimmed, never empty).
fn access_token_of(reply: &HttpResponse) -> Result<String, ProviderError> {
    if reply.status == 401 {
        return Err(ProviderError::Config(format!(
            "credentials rejected by the identity manager (HTTP 401): {}",
            body_text(&reply.body)
        )));
    }
    if reply.status != 200 {
        return Err(fabric_error(reply.status, &reply.body));
    }
    let parsed: TokenReply = serde_json::from_slice(&reply.body)
        .map_err(|e| ProviderError::malformed(format!("token reply is not JSON: {e}")))?;
    parsed
        .access_token
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ProviderError::malformed("token reply has no access_token"))
}

/// Stores the token in the host's state until [`RENEW_BEFORE_SECS`] before its `exp`;
/// one that is not fresh even now is not cached.
fn cache<H: Host + ?Sized>(host: &H, cfg: &Config, access_token: &str, exp: u64) {
    let now = unix_now(host);
    let fresh_for = exp.saturating_sub(RENEW_BEFORE_SECS).saturating_sub(now);
    if fresh_for > 0 {
        let cached = Cached {
            access_token: access_token.to_string(),
            exp,
            base_url: cfg.base_url.clone(),
        };
        let stored = serde_json::to_vec(&cached)
            .map(|v| host.state_set(STATE_KEY, &v, Some(fresh_for.saturating_mul(1000))))
            .unwrap_or(false);
        if !stored {
            host.log(LogLevel::Warn, "the host refused to cache the access token");
        }
    } else {
        host.log(
            LogLevel::Warn,
            &format!("access token expires at {exp}, within {RENEW_BEFORE_SECS}s of now ({now}); not caching it"),
        );
    }
}

fn secret<H: Host + ?Sized>(host: &H, key: &str) -> Result<String, ProviderError> {
    host.secret_get(key).map_err(|e| match e {
        SecretError::Denied(m) => {
            ProviderError::Denied(format!("secret key '{key}' is not granted: {m}"))
        }
        SecretError::NotFound(m) => ProviderError::Config(format!(
            "credential key '{key}' is missing from the granted Secret: {m}"
        )),
        SecretError::Other(m) => ProviderError::Other(format!("reading secret key '{key}': {m}")),
    })
}

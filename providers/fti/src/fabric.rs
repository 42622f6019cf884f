//! Authenticated calls to the fabric's APIs and the mapping of what comes back (or
//! fails to) onto typed errors.

use std::cell::RefCell;

use serde::de::DeserializeOwned;

use crate::config::Config;
use crate::host::{Host, HttpRequest, HttpResponse, LogLevel, Method};
use crate::model::ProviderError;
use crate::reply::{fabric_error_with, http_failure, parse_json};
use crate::token::{self, Token};

/// A client for one provider call: it obtains the token once and reuses it.
pub struct Fabric<'a, H: Host + ?Sized> {
    host: &'a H,
    cfg: &'a Config,
    token: RefCell<Option<Token>>,
}

impl<'a, H: Host + ?Sized> Fabric<'a, H> {
    pub fn new(host: &'a H, cfg: &'a Config) -> Self {
        Fabric {
            host,
            cfg,
            token: RefCell::new(None),
        }
    }

    pub fn host(&self) -> &'a H {
        self.host
    }

    pub fn config(&self) -> &'a Config {
        self.cfg
    }

    /// Sends `method path` (relative to the endpoint) with an optional JSON body and
    /// returns a 2xx reply; anything else is an error.
    pub fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<HttpResponse, ProviderError> {
        let url = format!("{}{}", self.cfg.base_url, path);
        let body = match body {
            Some(v) => serde_json::to_vec(v)
                .map_err(|e| ProviderError::Other(format!("encoding request body: {e}")))?,
            None => Vec::new(),
        };
        let mut token = self.token()?;
        let mut reply = self.send(method, &url, &body, &token.access_token)?;
        if reply.status == 401 && token.cached {
            // Revoked or the identity manager restarted: one fresh token, one retry.
            self.host.log(
                LogLevel::Info,
                "the fabric rejected the cached token; fetching a new one",
            );
            token::forget(self.host);
            token = token::fetch(self.host, self.cfg)?;
            *self.token.borrow_mut() = Some(token.clone());
            reply = self.send(method, &url, &body, &token.access_token)?;
        }
        if (200..300).contains(&reply.status) {
            Ok(reply)
        } else {
            Err(fabric_error_with(
                reply.status,
                &reply.body,
                &self.cfg.no_capacity_codes,
            ))
        }
    }

    /// Like [`Fabric::call`] and parses the reply body as JSON of type `T`.
    pub fn call_json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
        what: &str,
    ) -> Result<T, ProviderError> {
        let reply = self.call(method, path, body)?;
        parse_json(&reply.body, what)
    }

    fn token(&self) -> Result<Token, ProviderError> {
        if let Some(t) = self.token.borrow().as_ref() {
            return Ok(t.clone());
        }
        let t = token::obtain(self.host, self.cfg)?;
        *self.token.borrow_mut() = Some(t.clone());
        Ok(t)
    }

    fn send(
        &self,
        method: Method,
        url: &str,
        body: &[u8],
        bearer: &str,
    ) -> Result<HttpResponse, ProviderError> {
        let mut headers = vec![
            ("authorization".to_string(), format!("Bearer {bearer}")),
            ("accept".to_string(), "application/json".to_string()),
        ];
        if !body.is_empty() {
            headers.push(("content-type".into(), "application/json".into()));
        }
        self.host
            .log(LogLevel::Debug, &format!("{} {url}", method.as_str()));
        self.host
            .http_send(HttpRequest {
                method,
                url: url.to_string(),
                headers,
                body: body.to_vec(),
                timeout_ms: self.cfg.timeout_ms,
            })
            .map_err(|e| http_failure("fabric", e))
    }
}

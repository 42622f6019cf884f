//! Authenticated calls to the fabric's APIs and the mapping of what comes back (or
//! fails to) onto typed errors.

use std::cell::RefCell;

use serde::de::DeserializeOwned;

use crate::config::Config;
use crate::host::{Host, HttpResponse, LogLevel, Method};
use crate::model::ProviderError;
use crate::reply::{fabric_error_with, parse_json};
use crate::token::{self, Token};
use cro_provider_sdk::json;

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
        let mut token = self.token()?;
        let mut reply = self.send(method, &url, body, &token.access_token)?;
        if reply.status == 401 && token.cached {
            // Revoked or the identity manager restarted: one fresh token, one retry.
            self.host.log(
                LogLevel::Info,
                "the fabric rejected the cached token; fetching a new one",
            );
            token::forget(self.host);
            token = token::fetch(self.host, self.cfg)?;
            *self.token.borrow_mut() = Some(token.clone());
            reply = self.send(method, &url, body, &token.access_token)?;
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
        body: Option<&serde_json::Value>,
        bearer: &str,
    ) -> Result<HttpResponse, ProviderError> {
        self.host
            .log(LogLevel::Debug, &format!("{} {url}", method.as_str()));
        let authorization = format!("Bearer {bearer}");
        json::send(
            self.host,
            "fabric",
            method,
            url,
            &[("authorization", &authorization)],
            body,
            self.cfg.timeout_ms,
        )
    }
}

//! A native test double of the host: configuration, Secret keys, Nodes and objects,
//! a `state` store with TTLs on a settable clock, HTTP answered by a closure, and a
//! record of every request and log line. Vendors unit-test their logic with it, without
//! wasm. Anything not set up fails loudly (a lookup of an unknown Node is `not-found`,
//! HTTP without a handler is `denied`), as the real host's deny-by-default does.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use crate::host::{Host, HttpError, HttpRequest, HttpResponse, LogLevel, LookupError, SecretError};

type Handler = Box<dyn Fn(&HttpRequest) -> Result<HttpResponse, HttpError>>;
/// (api version, kind, namespace, name).
type ObjectKey = (String, String, Option<String>, String);
/// A value and when it expires.
type Entry = (Vec<u8>, Option<SystemTime>);

/// The test double. Interior mutability, like the real host (`&self` everywhere).
pub struct TestHost {
    config: RefCell<BTreeMap<String, String>>,
    secrets: RefCell<BTreeMap<String, String>>,
    nodes: RefCell<BTreeMap<String, String>>,
    objects: RefCell<BTreeMap<ObjectKey, String>>,
    /// key -> (value, expiry).
    state: RefCell<BTreeMap<String, Entry>>,
    now: Cell<SystemTime>,
    http: RefCell<Option<Handler>>,
    requests: RefCell<Vec<HttpRequest>>,
    logs: RefCell<Vec<(LogLevel, String)>>,
}

impl Default for TestHost {
    fn default() -> Self {
        TestHost::new()
    }
}

impl TestHost {
    /// Nothing configured; the clock reads 2023-11-14T22:13:20Z.
    pub fn new() -> Self {
        TestHost {
            config: RefCell::default(),
            secrets: RefCell::default(),
            nodes: RefCell::default(),
            objects: RefCell::default(),
            state: RefCell::default(),
            now: Cell::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
            http: RefCell::new(None),
            requests: RefCell::default(),
            logs: RefCell::default(),
        }
    }

    pub fn with_config(self, key: &str, value: &str) -> Self {
        self.config.borrow_mut().insert(key.into(), value.into());
        self
    }

    pub fn with_secret(self, key: &str, value: &str) -> Self {
        self.secrets.borrow_mut().insert(key.into(), value.into());
        self
    }

    /// A Node, as the JSON text the API server would return.
    pub fn with_node(self, name: &str, json: &str) -> Self {
        self.nodes.borrow_mut().insert(name.into(), json.into());
        self
    }

    pub fn with_object(
        self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        json: &str,
    ) -> Self {
        self.objects.borrow_mut().insert(
            (
                api_version.into(),
                kind.into(),
                namespace.map(str::to_owned),
                name.into(),
            ),
            json.into(),
        );
        self
    }

    /// Answers every HTTP request from now on.
    pub fn on_http(
        &self,
        handler: impl Fn(&HttpRequest) -> Result<HttpResponse, HttpError> + 'static,
    ) {
        *self.http.borrow_mut() = Some(Box::new(handler));
    }

    /// Moves the clock (and so `state` TTLs) forward.
    pub fn advance(&self, by: Duration) {
        self.now.set(self.now.get() + by);
    }

    pub fn requests(&self) -> Vec<HttpRequest> {
        self.requests.borrow().clone()
    }

    pub fn logs(&self) -> Vec<(LogLevel, String)> {
        self.logs.borrow().clone()
    }

    /// Keys of the live `state` entries.
    pub fn state_keys(&self) -> Vec<String> {
        let now = self.now.get();
        self.state
            .borrow()
            .iter()
            .filter(|(_, (_, exp))| exp.is_none_or(|e| e > now))
            .map(|(k, _)| k.clone())
            .collect()
    }
}

impl Host for TestHost {
    fn http_send(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        self.requests.borrow_mut().push(request.clone());
        match self.http.borrow().as_ref() {
            Some(handler) => handler(&request),
            None => Err(HttpError::Denied(format!(
                "TestHost has no HTTP handler for {} {}",
                request.method.as_str(),
                request.url
            ))),
        }
    }

    fn secret_get(&self, key: &str) -> Result<String, SecretError> {
        self.secrets
            .borrow()
            .get(key)
            .cloned()
            .ok_or_else(|| SecretError::Denied(format!("secret key {key} is not granted")))
    }

    fn get_node(&self, name: &str) -> Result<String, LookupError> {
        self.nodes
            .borrow()
            .get(name)
            .cloned()
            .ok_or_else(|| LookupError::NotFound(format!("Node {name}")))
    }

    fn list_nodes(&self) -> Result<Vec<String>, LookupError> {
        Ok(self.nodes.borrow().values().cloned().collect())
    }

    fn get_object(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<String, LookupError> {
        let key = (
            api_version.to_owned(),
            kind.to_owned(),
            namespace.map(str::to_owned),
            name.to_owned(),
        );
        self.objects
            .borrow()
            .get(&key)
            .cloned()
            .ok_or_else(|| LookupError::NotFound(format!("{api_version} {kind} {name}")))
    }

    fn config_get(&self, key: &str) -> Option<String> {
        self.config.borrow().get(key).cloned()
    }

    fn log(&self, level: LogLevel, message: &str) {
        self.logs.borrow_mut().push((level, message.to_owned()));
    }

    fn state_get(&self, key: &str) -> Option<Vec<u8>> {
        let now = self.now.get();
        let state = self.state.borrow();
        let (value, expiry) = state.get(key)?;
        expiry.is_none_or(|e| e > now).then(|| value.clone())
    }

    fn state_set(&self, key: &str, value: &[u8], ttl_ms: Option<u64>) -> bool {
        let expiry = ttl_ms.map(|ms| self.now.get() + Duration::from_millis(ms));
        self.state
            .borrow_mut()
            .insert(key.to_owned(), (value.to_vec(), expiry));
        true
    }

    fn state_remove(&self, key: &str) {
        self.state.borrow_mut().remove(key);
    }

    fn now(&self) -> SystemTime {
        self.now.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_expires_with_the_clock_and_unknowns_fail() {
        let host = TestHost::new().with_config("endpoint", "https://f");
        assert!(host.state_set("k", b"v", Some(1000)));
        assert_eq!(host.state_get("k").as_deref(), Some(&b"v"[..]));
        host.advance(Duration::from_millis(1000));
        assert_eq!(host.state_get("k"), None);
        assert_eq!(host.config_get("endpoint").as_deref(), Some("https://f"));
        assert!(matches!(host.get_node("n"), Err(LookupError::NotFound(_))));
        assert!(matches!(host.secret_get("p"), Err(SecretError::Denied(_))));
        let r = HttpRequest {
            method: crate::host::Method::Get,
            url: "https://f/x".into(),
            headers: Vec::new(),
            body: Vec::new(),
            timeout_ms: None,
        };
        assert!(matches!(host.http_send(r), Err(HttpError::Denied(_))));
        assert_eq!(host.requests().len(), 1);
    }
}

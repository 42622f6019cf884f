//! A fake host: canned fabric replies by method and path, an in-memory state store, a
//! settable clock, and a record of every request. It isolates the vendor logic; the
//! real host and a real fabric are exercised by the `provider-it` crate.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use fti_provider::{
    Host, HttpError, HttpRequest, HttpResponse, LogLevel, LookupError, Method, SecretError,
};

pub const BASE: &str = "https://fabric.test:8443/";
pub const TOKEN_PATH: &str = "id_manager/realms/cdi/protocol/openid-connect/token";
pub const T0: u64 = 1_700_000_000;

pub type Reply = Result<HttpResponse, HttpError>;

pub fn json_reply(status: u16, body: &str) -> Reply {
    Ok(HttpResponse {
        status,
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.as_bytes().to_vec(),
    })
}

pub fn jwt(payload: &str) -> String {
    format!(
        "{}.{}.c2ln",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(payload)
    )
}

pub fn token_reply(access_token: &str) -> Reply {
    json_reply(
        200,
        &serde_json::json!({
            "access_token": access_token, "expires_in": 300, "refresh_expires_in": 1800,
            "refresh_token": "r", "token_type": "Bearer", "id_token": "i",
            "not-before-policy": 0, "session_state": "s", "scope": "openid"
        })
        .to_string(),
    )
}

/// The Authorization header of a request.
pub fn bearer(r: &HttpRequest) -> String {
    r.headers
        .iter()
        .find(|(k, _)| k == "authorization")
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

pub struct FakeHost {
    pub config: RefCell<BTreeMap<String, String>>,
    pub secrets: RefCell<BTreeMap<String, Result<String, SecretError>>>,
    pub nodes: RefCell<BTreeMap<String, String>>,
    pub node_lookup_error: RefCell<Option<LookupError>>,
    /// Object name -> the error its lookup returns.
    pub object_lookup_errors: RefCell<BTreeMap<String, LookupError>>,
    /// (api version, kind, namespace, name) -> JSON.
    pub objects: RefCell<BTreeMap<(String, String, String, String), String>>,
    pub state: RefCell<BTreeMap<String, Vec<u8>>>,
    pub state_refuses: Cell<bool>,
    pub now: Cell<SystemTime>,
    /// (method, path relative to BASE without query) -> reply.
    pub replies: RefCell<BTreeMap<(&'static str, String), Reply>>,
    pub requests: RefCell<Vec<HttpRequest>>,
    pub logs: RefCell<Vec<(LogLevel, String)>>,
    /// Seconds a freshly issued token lives.
    pub token_life: Cell<u64>,
    pub tokens_issued: Cell<u32>,
}

impl FakeHost {
    pub fn new(api: &str) -> Self {
        let config = [
            ("api_type", api),
            ("endpoint", "fabric.test:8443"),
            ("tenant_id", "tenant-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let secrets = [
            ("username", "alice"),
            ("password", "p&ss word"),
            ("client_id", "cro"),
            ("client_secret", "s3cret"),
            ("realm", "cdi"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), Ok(v.to_string())))
        .collect();
        FakeHost {
            config: RefCell::new(config),
            secrets: RefCell::new(secrets),
            nodes: RefCell::default(),
            node_lookup_error: RefCell::default(),
            object_lookup_errors: RefCell::default(),
            objects: RefCell::default(),
            state: RefCell::default(),
            state_refuses: Cell::new(false),
            now: Cell::new(SystemTime::UNIX_EPOCH + Duration::from_secs(T0)),
            replies: RefCell::default(),
            requests: RefCell::default(),
            logs: RefCell::default(),
            token_life: Cell::new(300),
            tokens_issued: Cell::new(0),
        }
    }

    pub fn set_config(&self, key: &str, value: &str) {
        self.config.borrow_mut().insert(key.into(), value.into());
    }

    pub fn unix_now(&self) -> u64 {
        self.now
            .get()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    pub fn advance(&self, secs: u64) {
        self.now.set(self.now.get() + Duration::from_secs(secs));
    }

    pub fn add_node(&self, name: &str, provider_id: Option<&str>) {
        let mut node = serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {}});
        if let Some(p) = provider_id {
            node["spec"]["providerID"] = p.into();
        }
        self.nodes
            .borrow_mut()
            .insert(name.into(), node.to_string());
    }

    /// A node linked to `machine` through the OpenShift Machine and Metal3 BareMetalHost.
    pub fn add_openshift_node(&self, name: &str, machine: &str) {
        let node = serde_json::json!({"metadata": {"name": name, "annotations": {
            "machine.openshift.io/machine": format!("openshift-machine-api/{name}-m")}}});
        self.nodes
            .borrow_mut()
            .insert(name.into(), node.to_string());
        self.add_object(
            "machine.openshift.io/v1beta1",
            "Machine",
            "openshift-machine-api",
            &format!("{name}-m"),
            serde_json::json!({"metadata": {"annotations": {
                "metal3.io/BareMetalHost": format!("openshift-machine-api/{name}-bmh")}}}),
        );
        self.add_object(
            "metal3.io/v1alpha1",
            "BareMetalHost",
            "openshift-machine-api",
            &format!("{name}-bmh"),
            serde_json::json!({"metadata": {"annotations": {"cluster-manager.cdi.io/machine": machine}}}),
        );
    }

    pub fn add_object(&self, api: &str, kind: &str, ns: &str, name: &str, v: serde_json::Value) {
        self.objects.borrow_mut().insert(
            (api.into(), kind.into(), ns.into(), name.into()),
            v.to_string(),
        );
    }

    pub fn reply(&self, method: Method, path: &str, reply: Reply) {
        self.replies
            .borrow_mut()
            .insert((method.as_str(), path.to_string()), reply);
    }

    pub fn reply_json(&self, method: Method, path: &str, status: u16, body: &serde_json::Value) {
        self.reply(method, path, json_reply(status, &body.to_string()));
    }

    /// Requests other than the token request, as (method, path with query).
    pub fn fabric_calls(&self) -> Vec<(Method, String)> {
        self.requests
            .borrow()
            .iter()
            .filter(|r| !r.url.contains("openid-connect"))
            .map(|r| {
                (
                    r.method,
                    r.url.strip_prefix(BASE).unwrap_or(&r.url).to_string(),
                )
            })
            .collect()
    }

    pub fn token_requests(&self) -> usize {
        self.requests
            .borrow()
            .iter()
            .filter(|r| r.url.contains("openid-connect"))
            .count()
    }

    /// The JSON body of the last request with this method.
    pub fn last_body(&self, method: Method) -> serde_json::Value {
        let reqs = self.requests.borrow();
        let r = reqs.iter().rev().find(|r| r.method == method).unwrap();
        serde_json::from_slice(&r.body).unwrap()
    }

    pub fn logged(&self, level: LogLevel, needle: &str) -> bool {
        self.logs
            .borrow()
            .iter()
            .any(|(l, m)| *l == level && m.contains(needle))
    }

    fn issue_token(&self) -> Reply {
        self.tokens_issued.set(self.tokens_issued.get() + 1);
        let exp = self.unix_now() + self.token_life.get();
        token_reply(&jwt(&format!(
            r#"{{"exp":{exp},"n":{}}}"#,
            self.tokens_issued.get()
        )))
    }
}

impl Host for FakeHost {
    fn http_send(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        self.requests.borrow_mut().push(request.clone());
        let path = request
            .url
            .strip_prefix(BASE)
            .unwrap_or(&request.url)
            .split('?')
            .next()
            .unwrap_or("")
            .to_string();
        let canned = self
            .replies
            .borrow()
            .get(&(request.method.as_str(), path.clone()))
            .cloned();
        match canned {
            Some(r) => r,
            None if path == TOKEN_PATH && request.method == Method::Post => self.issue_token(),
            None => json_reply(
                404,
                r#"{"status":404,"detail":{"code":"E404","message":"no such route"}}"#,
            ),
        }
    }

    fn secret_get(&self, key: &str) -> Result<String, SecretError> {
        self.secrets
            .borrow()
            .get(key)
            .cloned()
            .unwrap_or_else(|| Err(SecretError::NotFound(format!("no key {key}"))))
    }

    fn get_node(&self, name: &str) -> Result<String, LookupError> {
        if let Some(e) = self.node_lookup_error.borrow().clone() {
            return Err(e);
        }
        self.nodes
            .borrow()
            .get(name)
            .cloned()
            .ok_or_else(|| LookupError::NotFound(format!("node {name}")))
    }

    fn list_nodes(&self) -> Result<Vec<String>, LookupError> {
        if let Some(e) = self.node_lookup_error.borrow().clone() {
            return Err(e);
        }
        Ok(self.nodes.borrow().values().cloned().collect())
    }

    fn get_object(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<String, LookupError> {
        if let Some(e) = self.object_lookup_errors.borrow().get(name).cloned() {
            return Err(e);
        }
        self.objects
            .borrow()
            .get(&(
                api_version.into(),
                kind.into(),
                namespace.unwrap_or("").into(),
                name.into(),
            ))
            .cloned()
            .ok_or_else(|| LookupError::NotFound(format!("{kind} {name}")))
    }

    fn config_get(&self, key: &str) -> Option<String> {
        self.config.borrow().get(key).cloned()
    }

    fn log(&self, level: LogLevel, message: &str) {
        self.logs.borrow_mut().push((level, message.to_string()));
    }

    fn state_get(&self, key: &str) -> Option<Vec<u8>> {
        self.state.borrow().get(key).cloned()
    }

    fn state_set(&self, key: &str, value: &[u8], _ttl_ms: Option<u64>) -> bool {
        if self.state_refuses.get() {
            return false;
        }
        self.state.borrow_mut().insert(key.into(), value.to_vec());
        true
    }

    fn state_remove(&self, key: &str) {
        self.state.borrow_mut().remove(key);
    }

    fn now(&self) -> SystemTime {
        self.now.get()
    }
}

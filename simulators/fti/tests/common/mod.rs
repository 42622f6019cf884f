//! Helpers for talking to the simulator over real HTTP(S) the way the provider does.
#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fabric_sim::{Clock, FabricSim, SimConfig};
use serde_json::{Value, json};

pub const MODEL: &str = "A100 40G";
pub const M1: &str = "6f1c2a9e-0000-4000-8000-000000000001";
pub const M2: &str = "6f1c2a9e-0000-4000-8000-000000000002";

/// A clock at a fixed instant that tests move by hand.
#[derive(Clone)]
pub struct TestClock {
    secs: Arc<AtomicU64>,
}

impl TestClock {
    pub const START: u64 = 1_700_000_000;

    pub fn new() -> Self {
        Self {
            secs: Arc::new(AtomicU64::new(Self::START)),
        }
    }

    pub fn clock(&self) -> Clock {
        let secs = self.secs.clone();
        Arc::new(move || UNIX_EPOCH + Duration::from_secs(secs.load(Ordering::SeqCst)))
    }

    pub fn advance(&self, by: Duration) {
        self.secs.fetch_add(by.as_secs(), Ordering::SeqCst);
    }

    pub fn now_secs(&self) -> u64 {
        self.secs.load(Ordering::SeqCst)
    }
}

pub fn start(config: SimConfig) -> FabricSim {
    let sim = FabricSim::start(config).unwrap();
    sim.add_machine(M1, "worker-1");
    sim.add_machine(M2, "worker-2");
    sim
}

pub fn client(sim: &FabricSim) -> reqwest::Client {
    reqwest::Client::builder()
        .use_preconfigured_tls(sim.client_tls_config().unwrap())
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

pub fn token_form(sim: &FabricSim) -> Vec<(&'static str, String)> {
    let c = sim.credentials();
    vec![
        ("client_id", c.client_id),
        ("client_secret", c.client_secret),
        ("username", c.username),
        ("password", c.password),
        ("scope", "openid".into()),
        ("response_type", "id_token token".into()),
        ("grant_type", "password".into()),
    ]
}

pub async fn token_reply(sim: &FabricSim, http: &reqwest::Client) -> reqwest::Response {
    http.post(format!("{}{}", sim.endpoint(), sim.token_path()))
        .form(&token_form(sim))
        .send()
        .await
        .unwrap()
}

pub async fn token(sim: &FabricSim, http: &reqwest::Client) -> String {
    let reply = token_reply(sim, http).await;
    assert_eq!(reply.status(), 200);
    let body: Value = reply.json().await.unwrap();
    body["access_token"].as_str().unwrap().to_string()
}

pub fn fm_url(sim: &FabricSim, machine: &str) -> String {
    format!(
        "{}fabric_manager/api/v1/machines/{machine}?tenant_uuid={}",
        sim.endpoint(),
        sim.tenant_id()
    )
}

pub fn fm_update_url(sim: &FabricSim, machine: &str) -> String {
    format!(
        "{}fabric_manager/api/v1/machines/{machine}/update?tenant_uuid={}",
        sim.endpoint(),
        sim.tenant_id()
    )
}

pub fn attach_body(sim: &FabricSim, machine: &str, model: &str) -> Value {
    json!({"tenants": {"tenant_uuid": sim.tenant_id(), "machines": [{"mach_uuid": machine,
        "resources": [{"res_specs": [{"res_type": "gpu",
            "res_spec": {"condition": [{"column": "model", "operator": "eq", "value": model}]},
            "res_num": 1}]}]}]}})
}

pub fn detach_body(sim: &FabricSim, machine: &str, res_uuid: &str) -> Value {
    json!({"tenants": {"tenant_uuid": sim.tenant_id(), "machines": [{"mach_uuid": machine,
        "resources": [{"res_specs": [{"res_type": "gpu", "res_uuid": res_uuid, "res_num": 1}]}]}]}})
}

pub fn cm_url(sim: &FabricSim, machine: &str) -> String {
    format!(
        "{}cluster_manager/cluster_autoscaler/v3/tenants/{}/clusters/{}/machines/{machine}",
        sim.endpoint(),
        sim.tenant_id(),
        sim.cluster_id()
    )
}

/// An HTTP client with a token, for the FM and CM calls.
pub struct Api {
    pub sim: FabricSim,
    pub http: reqwest::Client,
    pub token: String,
}

impl Api {
    pub async fn new(sim: &FabricSim) -> Self {
        let http = client(sim);
        let token = token(sim, &http).await;
        Api {
            sim: sim.clone(),
            http,
            token,
        }
    }

    pub async fn send(
        &self,
        method: reqwest::Method,
        url: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let mut req = self.http.request(method, url).bearer_auth(&self.token);
        if let Some(body) = body {
            req = req.json(body);
        }
        let reply = req.send().await.unwrap();
        let status = reply.status().as_u16();
        let text = reply.text().await.unwrap();
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("reply is not JSON ({e}): {text:?}"));
        (status, value)
    }

    pub async fn fm_get(&self, machine: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, &fm_url(&self.sim, machine), None)
            .await
    }

    pub async fn fm_attach(&self, machine: &str, model: &str) -> (u16, Value) {
        let body = attach_body(&self.sim, machine, model);
        self.send(
            reqwest::Method::PATCH,
            &fm_update_url(&self.sim, machine),
            Some(&body),
        )
        .await
    }

    pub async fn fm_detach(&self, machine: &str, res_uuid: &str) -> (u16, Value) {
        let body = detach_body(&self.sim, machine, res_uuid);
        self.send(
            reqwest::Method::DELETE,
            &fm_update_url(&self.sim, machine),
            Some(&body),
        )
        .await
    }

    pub async fn cm_get(&self, machine: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, &cm_url(&self.sim, machine), None)
            .await
    }

    pub async fn cm_resize(&self, machine: &str, body: Value) -> (u16, Value) {
        let url = format!("{}/actions/resize", cm_url(&self.sim, machine));
        self.send(reqwest::Method::POST, &url, Some(&body)).await
    }
}

/// The resources of the first machine of an FM reply.
pub fn resources(reply: &Value) -> Vec<Value> {
    reply["data"]["machines"][0]["resources"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The resspec of `model` in a CM reply.
pub fn resspec(reply: &Value, model: &str) -> Value {
    reply["data"]["cluster"]["machine"]["resspecs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["selector"]["expression"]["conditions"][0]["value"] == model)
        .cloned()
        .unwrap()
}

/// Polls `check` until it yields a value or `within` passes.
pub async fn poll<T, F, Fut>(within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "condition not met within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs()
}

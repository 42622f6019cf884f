//! A simulator of NEC CDI Manager (CDIM), for tests, the NEC provider and vendors:
//! docs/nec-provider.md says what it serves and which sources its API comes from.
//!
//! Two services over real HTTP on 127.0.0.1, each on a port of its own as CDIM deploys
//! them: the **configuration manager** (`GET /cdim/api/v1/resources[?detail=true]`,
//! `/resources/{id}`, `/nodes[?detail=true]`, `/nodes/{id}`) and the **layout-apply
//! service** (`POST /cdim/api/v1/layout-apply` answers `202 {"applyID"}`, the job runs
//! for the apply delay, `GET /layout-apply/{applyID}` reports `IN_PROGRESS`, then
//! `COMPLETED`, `FAILED` or `CANCELED` with `rollbackStatus`; a second apply while one
//! runs is `409 E40010`). Every request is recorded and faults can be injected per
//! route: slow replies, 5xx, malformed bodies, dropped connections before or after
//! acting, and layout applies that fail or are rolled back.
//!
//! ```
//! use std::time::Duration;
//! use cdim_sim::{CdimSim, Fault, Route, SimConfig};
//!
//! let sim = CdimSim::start(SimConfig::default())?;
//! let node = sim.add_node();
//! let gpu = sim.add_gpu("NVIDIA-A100-PCIE-40GB");
//! assert!(sim.gpus_on(&node.id).is_empty());
//! sim.set_apply_delay(Duration::from_millis(200));
//! sim.inject(Fault::ApplyFails("link down".into()).on(Route::LayoutApply));
//! assert!(sim.configuration_manager_url().starts_with("http://127.0.0.1:"));
//! # let _ = gpu;
//! sim.shutdown();
//! # Ok::<(), cdim_sim::SimError>(())
//! ```

mod api;
mod faults;
mod route;
mod server;
mod shared;
mod state;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sim_kit::{Controls, Listener, Server, SimControl, bind_loopback};

pub use faults::{Fault, Injection};
pub use route::{BASE, Route, Service};
pub use shared::RecordedRequest;
pub use sim_kit::{FaultId, Scope};
pub use state::{
    ApplyStatus, CPU_TYPE, GPU_TYPE, HOST_ADAPTER_TYPE, IO_ADAPTER_TYPE, Node, Resource,
    ResourceKind,
};

use shared::{Shared, lock};

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot bind a loopback listener: {0}")]
    Bind(std::io::Error),
    #[error("cannot start the server thread: {0}")]
    Runtime(std::io::Error),
    #[error("resource {0} not found")]
    UnknownResource(String),
    #[error("node {0} not found")]
    UnknownNode(String),
    #[error("health must be OK, Warning or Critical, not {0}")]
    BadHealth(String),
    #[error("GPU {gpu} is already connected to {io}")]
    Connected { gpu: String, io: String },
}

/// How the simulator starts.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// How long a layout apply runs before it ends (zero: it has ended by the first
    /// status read).
    pub apply_delay: Duration,
    /// 0 picks a free port.
    pub configuration_manager_port: u16,
    /// 0 picks a free port.
    pub layout_apply_port: u16,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            // A real connect powers the I/O slot and re-enumerates PCIe: seconds. Tests
            // want the asynchrony without the wait.
            apply_delay: Duration::from_millis(300),
            configuration_manager_port: 0,
            layout_apply_port: 0,
        }
    }
}

/// A GPU as the simulator holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    pub id: String,
    pub model: String,
    /// The node it is connected to.
    pub node: Option<String>,
    pub health: String,
}

/// A layout apply as the simulator holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplyView {
    pub id: String,
    pub status: ApplyStatus,
    pub rollback_status: Option<String>,
    /// (operation, source, destination) of each procedure.
    pub procedures: Vec<(String, String, String)>,
}

struct Inner {
    shared: Arc<Shared>,
    cm_addr: SocketAddr,
    la_addr: SocketAddr,
    // Dropped with the last handle, which stops the servers as well.
    servers: [Server; 2],
}

/// Handle to a running simulator. Cheap to clone; the servers stop on
/// [`CdimSim::shutdown`] or when the last clone is dropped.
#[derive(Clone)]
pub struct CdimSim {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for CdimSim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CdimSim")
            .field("configuration_manager", &self.inner.cm_addr)
            .field("layout_apply", &self.inner.la_addr)
            .finish_non_exhaustive()
    }
}

impl CdimSim {
    /// Binds two loopback ports and serves each service on a thread of its own (no
    /// async runtime needed).
    pub fn start(config: SimConfig) -> Result<CdimSim, SimError> {
        let shared = Arc::new(Shared {
            state: Mutex::default(),
            apply_delay: Mutex::new(config.apply_delay),
            controls: Controls::default(),
        });
        let serve = |port: u16, service: Service| -> Result<(Server, SocketAddr), SimError> {
            let listener = bind_loopback(port).map_err(SimError::Bind)?;
            let addr = listener.local_addr().map_err(SimError::Bind)?;
            let server = Server::start(
                format!("cdim-sim-{}", addr.port()),
                Arc::new(server::Cdim {
                    shared: shared.clone(),
                    service,
                }),
                vec![Listener {
                    socket: listener,
                    tls: None,
                }],
            )
            .map_err(SimError::Runtime)?;
            Ok((server, addr))
        };
        let (cm, cm_addr) = serve(
            config.configuration_manager_port,
            Service::ConfigurationManager,
        )?;
        let (la, la_addr) = serve(config.layout_apply_port, Service::LayoutApply)?;
        Ok(CdimSim {
            inner: Arc::new(Inner {
                shared,
                cm_addr,
                la_addr,
                servers: [cm, la],
            }),
        })
    }

    fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// Stops both servers and waits for their threads.
    pub fn shutdown(&self) {
        for s in &self.inner.servers {
            s.shutdown();
        }
    }

    /// The address both services listen on (`NEC_CDIM_IP`).
    pub fn ip(&self) -> String {
        self.inner.cm_addr.ip().to_string()
    }

    /// `CONFIGURATION_MANAGER_PORT`.
    pub fn configuration_manager_port(&self) -> u16 {
        self.inner.cm_addr.port()
    }

    /// `LAYOUT_APPLY_PORT`.
    pub fn layout_apply_port(&self) -> u16 {
        self.inner.la_addr.port()
    }

    /// `http://127.0.0.1:PORT` of the configuration manager (its API is under
    /// [`BASE`]).
    pub fn configuration_manager_url(&self) -> String {
        format!("http://{}", self.inner.cm_addr)
    }

    /// `http://127.0.0.1:PORT` of the layout-apply service.
    pub fn layout_apply_url(&self) -> String {
        format!("http://{}", self.inner.la_addr)
    }

    // ---- inventory ----

    /// A node (a CPU, its host adapter and the I/O adapter paired with it) with a new
    /// uuid for its id.
    pub fn add_node(&self) -> Node {
        lock(&self.shared().state).add_node(None)
    }

    /// A node with this id.
    pub fn add_node_with_id(&self, id: &str) -> Node {
        lock(&self.shared().state).add_node(Some(id))
    }

    /// A free GPU of `model`; returns its device id.
    pub fn add_gpu(&self, model: &str) -> String {
        lock(&self.shared().state).add_gpu(model)
    }

    fn advanced(&self) -> std::sync::MutexGuard<'_, state::State> {
        let mut state = lock(&self.shared().state);
        state.advance(Instant::now());
        state
    }

    /// A GPU as it is now (applies due are finished first).
    pub fn gpu(&self, id: &str) -> Option<Gpu> {
        let state = self.advanced();
        let r = state.resources.get(id)?;
        (r.kind == ResourceKind::Gpu).then(|| Gpu {
            id: r.id.clone(),
            model: r.model.clone(),
            node: state.node_of(r),
            health: r.health.clone(),
        })
    }

    /// The GPUs connected to `node` now.
    pub fn gpus_on(&self, node: &str) -> Vec<Gpu> {
        let state = self.advanced();
        state
            .gpus_of(node)
            .into_iter()
            .map(|r| Gpu {
                id: r.id.clone(),
                model: r.model.clone(),
                node: Some(node.to_owned()),
                health: r.health.clone(),
            })
            .collect()
    }

    /// Every GPU of the pool, connected or not.
    pub fn gpus(&self) -> Vec<Gpu> {
        let state = self.advanced();
        state
            .resources
            .values()
            .filter(|r| r.kind == ResourceKind::Gpu)
            .map(|r| Gpu {
                id: r.id.clone(),
                model: r.model.clone(),
                node: state.node_of(r),
                health: r.health.clone(),
            })
            .collect()
    }

    /// The nodes.
    pub fn nodes(&self) -> Vec<Node> {
        lock(&self.shared().state).nodes.values().cloned().collect()
    }

    /// Connects a free GPU to `node` at once, as an administrator outside the operator
    /// would (a device nobody requested).
    pub fn connect_directly(&self, node: &str, gpu: &str) -> Result<(), SimError> {
        let mut state = self.advanced();
        let io = state
            .nodes
            .get(node)
            .map(|n| n.io_adapter.clone())
            .ok_or_else(|| SimError::UnknownNode(node.into()))?;
        let g = state
            .resources
            .get_mut(gpu)
            .filter(|r| r.kind == ResourceKind::Gpu)
            .ok_or_else(|| SimError::UnknownResource(gpu.into()))?;
        if let Some(io) = &g.peer {
            return Err(SimError::Connected {
                gpu: gpu.into(),
                io: io.clone(),
            });
        }
        g.peer = Some(io);
        Ok(())
    }

    /// Sets a resource's `status.health`.
    pub fn set_health(&self, id: &str, health: &str) -> Result<(), SimError> {
        if !matches!(health, "OK" | "Warning" | "Critical") {
            return Err(SimError::BadHealth(health.into()));
        }
        let mut state = lock(&self.shared().state);
        let r = state
            .resources
            .get_mut(id)
            .ok_or_else(|| SimError::UnknownResource(id.into()))?;
        r.health = health.into();
        Ok(())
    }

    /// Sets a resource's `status.state` (`Enabled`, `Disabled`, ...).
    pub fn set_state(&self, id: &str, state_: &str) -> Result<(), SimError> {
        let mut state = lock(&self.shared().state);
        let r = state
            .resources
            .get_mut(id)
            .ok_or_else(|| SimError::UnknownResource(id.into()))?;
        r.state = state_.into();
        Ok(())
    }

    /// Marks a resource detected or not (a device the hardware control no longer sees).
    pub fn set_detected(&self, id: &str, detected: bool) -> Result<(), SimError> {
        let mut state = lock(&self.shared().state);
        let r = state
            .resources
            .get_mut(id)
            .ok_or_else(|| SimError::UnknownResource(id.into()))?;
        r.detected = detected;
        Ok(())
    }

    /// How long later layout applies run.
    pub fn set_apply_delay(&self, delay: Duration) {
        *lock(&self.shared().apply_delay) = delay;
    }

    /// Every layout apply, in the order posted.
    pub fn applies(&self) -> Vec<ApplyView> {
        let state = self.advanced();
        state
            .apply_order
            .iter()
            .filter_map(|id| state.applies.get(id))
            .map(|a| ApplyView {
                id: a.id.clone(),
                status: a.status,
                rollback_status: a.rollback_status.map(str::to_owned),
                procedures: a
                    .procedures
                    .iter()
                    .map(|p| {
                        (
                            p.operation.as_str().to_owned(),
                            p.source.clone(),
                            p.destination.clone(),
                        )
                    })
                    .collect(),
            })
            .collect()
    }

    // ---- faults and records ----

    /// Injects a fault; a bare [`Fault`] applies once, to any route.
    pub fn inject(&self, injection: impl Into<Injection>) -> FaultId {
        self.shared().controls.inject(injection)
    }

    /// Removes one injection; false if it was used up or removed already.
    pub fn remove_fault(&self, id: FaultId) -> bool {
        self.shared().controls.remove_fault(id)
    }

    pub fn clear_faults(&self) {
        self.shared().controls.clear_faults();
    }

    /// Injections not used up yet.
    pub fn active_faults(&self) -> usize {
        self.shared().controls.active_faults()
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared().controls.requests()
    }

    pub fn requests_to(&self, route: Route) -> Vec<RecordedRequest> {
        self.shared().controls.requests_to(route)
    }

    pub fn clear_requests(&self) {
        self.shared().controls.clear_requests();
    }
}

impl SimControl for CdimSim {
    type Fault = Fault;
    type Route = Route;

    /// The configuration manager's API base (the layout-apply service is on
    /// [`CdimSim::layout_apply_url`]).
    fn endpoint(&self) -> String {
        format!("{}{BASE}/", self.configuration_manager_url())
    }

    fn controls(&self) -> &Controls<Fault, Route> {
        &self.shared().controls
    }

    fn shutdown(&self) {
        CdimSim::shutdown(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const MODEL: &str = "NVIDIA-A100-PCIE-40GB";

    struct Got {
        status: u16,
        body: Value,
    }

    fn client() -> reqwest::Client {
        // reqwest is built without a default TLS provider in this workspace.
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::new()
    }

    async fn send(method: reqwest::Method, url: String, body: Option<Value>) -> Got {
        let client = client();
        let mut req = client.request(method, url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("the simulator answers");
        let status = resp.status().as_u16();
        let text = resp.text().await.expect("a body");
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Got { status, body }
    }

    async fn cm(sim: &CdimSim, path: &str) -> Got {
        send(
            reqwest::Method::GET,
            format!("{}{BASE}{path}", sim.configuration_manager_url()),
            None,
        )
        .await
    }

    async fn apply(sim: &CdimSim, body: Value) -> Got {
        send(
            reqwest::Method::POST,
            format!("{}{BASE}/layout-apply", sim.layout_apply_url()),
            Some(body),
        )
        .await
    }

    async fn status(sim: &CdimSim, id: &str) -> Got {
        send(
            reqwest::Method::GET,
            format!("{}{BASE}/layout-apply/{id}", sim.layout_apply_url()),
            None,
        )
        .await
    }

    fn connect(io: &str, gpu: &str) -> Value {
        json!({"procedures": [{"operationID": 1, "operation": "connect",
            "sourceDeviceID": io, "destinationDeviceID": gpu, "dependencies": []}]})
    }

    /// Polls the apply until it is no longer IN_PROGRESS, within a deadline.
    async fn settled(sim: &CdimSim, id: &str) -> Value {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let got = status(sim, id).await;
            assert_eq!(got.status, 200, "{}", got.body);
            if got.body["status"] != "IN_PROGRESS" {
                return got.body;
            }
            assert!(Instant::now() < end, "apply {id} still running");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The walk the Go client makes: node → eesv host adapter → its eeio I/O adapter;
    /// a connect from there links the GPU to the I/O adapter and puts it on the node.
    #[tokio::test]
    async fn the_go_clients_walk_and_an_asynchronous_connect() {
        let sim = CdimSim::start(SimConfig::default()).unwrap();
        let node = sim.add_node_with_id("node-a");
        let gpu = sim.add_gpu(MODEL);

        let nodes = cm(&sim, "/nodes?detail=true").await;
        assert_eq!(nodes.status, 200);
        assert_eq!(nodes.body["count"], 1);
        let resources = nodes.body["nodes"][0]["resources"].as_array().unwrap();
        let host = resources
            .iter()
            .find(|r| r["device"]["type"] == HOST_ADAPTER_TYPE)
            .expect("a host adapter");
        assert_eq!(
            host["device"]["attribute"]["deviceSpecificInformation"]["status"],
            "eesv"
        );
        assert_eq!(host["detected"], true);
        let host_id = host["device"]["deviceID"].as_str().unwrap();
        let host_res = cm(&sim, &format!("/resources/{host_id}")).await;
        let link = &host_res.body["device"]["links"][0];
        assert_eq!(link["type"], IO_ADAPTER_TYPE);
        assert_eq!(link["deviceID"], node.io_adapter.as_str());
        let io = cm(&sim, &format!("/resources/{}", node.io_adapter)).await;
        assert_eq!(
            io.body["device"]["attribute"]["deviceSpecificInformation"]["status"],
            "eeio"
        );
        assert_eq!(io.body["nodeIDs"], json!(["node-a"]));

        let all = cm(&sim, "/resources?detail=true").await;
        let g = all.body["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["device"]["deviceID"] == gpu.as_str())
            .unwrap();
        assert_eq!(g["device"]["model"], MODEL);
        assert_eq!(
            g["device"]["status"],
            json!({"state": "Enabled", "health": "OK"})
        );
        assert_eq!(g["device"]["links"], json!([]));
        assert_eq!(g["nodeIDs"], json!([]));

        let posted = apply(&sim, connect(&node.io_adapter, &gpu)).await;
        assert_eq!(posted.status, 202, "{}", posted.body);
        let id = posted.body["applyID"].as_str().unwrap().to_string();
        assert_eq!(id.len(), 10);
        assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
        // Not connected while it runs; a second apply meanwhile is refused.
        assert!(sim.gpus_on("node-a").is_empty());
        let second = apply(&sim, connect(&node.io_adapter, &gpu)).await;
        assert_eq!(second.status, 409);
        assert_eq!(second.body["code"], "E40010");
        let end = settled(&sim, &id).await;
        assert_eq!(end["status"], "COMPLETED");
        assert_eq!(end["applyResult"][0]["status"], "COMPLETED");
        assert!(end["endedAt"].is_string());
        let g = cm(&sim, &format!("/resources/{gpu}")).await;
        assert_eq!(
            g.body["device"]["links"],
            json!([{"type": IO_ADAPTER_TYPE, "deviceID": node.io_adapter}])
        );
        assert_eq!(g.body["nodeIDs"], json!(["node-a"]));
        let nodes = cm(&sim, "/nodes?detail=true").await;
        assert!(
            nodes.body["nodes"][0]["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["device"]["deviceID"] == gpu.as_str()
                    && r["device"]["type"] == GPU_TYPE
                    && r.get("nodeIDs").is_none())
        );

        // Disconnect takes it back.
        let body = json!({"procedures": [{"operationID": 1, "operation": "disconnect",
            "sourceDeviceID": node.io_adapter, "destinationDeviceID": gpu, "dependencies": []}]});
        let posted = apply(&sim, body).await;
        assert_eq!(posted.status, 202);
        let id = posted.body["applyID"].as_str().unwrap().to_string();
        assert_eq!(settled(&sim, &id).await["status"], "COMPLETED");
        assert_eq!(sim.gpu(&gpu).unwrap().node, None);
        sim.shutdown();
    }

    #[tokio::test]
    async fn unknown_inputs_fail_loudly() {
        let sim = CdimSim::start(SimConfig::default()).unwrap();
        let node = sim.add_node();
        let gpu = sim.add_gpu(MODEL);
        for (path, code) in [
            ("/resources?detail=yes", 400),
            ("/resources?details=true", 400),
            ("/resources/nope", 404),
            ("/nodes/nope", 404),
            ("/layout-apply", 404),
            ("/devices", 404),
        ] {
            assert_eq!(cm(&sim, path).await.status, code, "{path}");
        }
        // The layout-apply port serves no configuration-manager path.
        let wrong = send(
            reqwest::Method::GET,
            format!("{}{BASE}/resources", sim.layout_apply_url()),
            None,
        )
        .await;
        assert_eq!(wrong.status, 404);
        for body in [
            json!({"procedures": [{"operationID": 1, "operation": "boot",
                "sourceDeviceID": node.io_adapter, "destinationDeviceID": gpu, "dependencies": []}]}),
            json!({"procedures": [{"operationID": 1, "operation": "connect",
                "targetCPUID": node.cpu, "targetDeviceID": gpu, "dependencies": []}]}),
            connect(&node.host_adapter, &gpu),
            connect(&node.io_adapter, "NOPE"),
            json!({"procedure": []}),
        ] {
            let got = apply(&sim, body.clone()).await;
            assert_eq!(got.status, 400, "{body}: {}", got.body);
            assert_eq!(got.body["code"], "E40001");
        }
        assert_eq!(status(&sim, "0123456789").await.status, 404);
        assert!(sim.applies().is_empty());
        sim.shutdown();
    }

    #[tokio::test]
    async fn faults_slow_5xx_lost_replies_and_failed_or_rolled_back_applies() {
        let sim = CdimSim::start(SimConfig {
            apply_delay: Duration::from_millis(100),
            ..SimConfig::default()
        })
        .unwrap();
        let node = sim.add_node();
        let gpu = sim.add_gpu(MODEL);

        sim.inject(Fault::error(503, "E00503", "busy").on(Route::Resources));
        assert_eq!(cm(&sim, "/resources").await.status, 503);
        assert_eq!(cm(&sim, "/resources").await.status, 200);

        sim.inject(Fault::Latency(Duration::from_millis(300)).on(Route::Nodes));
        let t = Instant::now();
        assert_eq!(cm(&sim, "/nodes").await.status, 200);
        assert!(t.elapsed() >= Duration::from_millis(300));

        // A dropped reply after acting: the apply runs all the same.
        sim.inject(Fault::DropAfterProcessing.on(Route::LayoutApply));
        let lost = client()
            .post(format!("{}{BASE}/layout-apply", sim.layout_apply_url()))
            .json(&connect(&node.io_adapter, &gpu))
            .send()
            .await;
        assert!(lost.is_err(), "{lost:?}");
        let applies = sim.applies();
        assert_eq!(applies.len(), 1);
        let id = applies[0].id.clone();
        assert_eq!(settled(&sim, &id).await["status"], "COMPLETED");
        assert_eq!(sim.gpus_on(&node.id).len(), 1);

        // A failed apply changes nothing.
        let other = sim.add_gpu(MODEL);
        sim.inject(
            Fault::ApplyFails("the I/O slot did not power on".into()).on(Route::LayoutApply),
        );
        let posted = apply(&sim, connect(&node.io_adapter, &other)).await;
        assert_eq!(posted.status, 202);
        let failed = settled(&sim, posted.body["applyID"].as_str().unwrap()).await;
        assert_eq!(failed["status"], "FAILED");
        assert_eq!(failed["applyResult"][0]["status"], "FAILED");
        assert_eq!(sim.gpu(&other).unwrap().node, None);

        // A rolled-back one: CANCELED, rollbackStatus COMPLETED, nothing connected.
        sim.inject(Fault::ApplyRollsBack.on(Route::LayoutApply));
        let posted = apply(&sim, connect(&node.io_adapter, &other)).await;
        let rolled = settled(&sim, posted.body["applyID"].as_str().unwrap()).await;
        assert_eq!(rolled["status"], "CANCELED");
        assert_eq!(rolled["rollbackStatus"], "COMPLETED");
        assert_eq!(sim.gpu(&other).unwrap().node, None);

        // A malformed body: the status stays, the JSON does not parse.
        sim.inject(Fault::MalformedJson.on(Route::Resource));
        let got = cm(&sim, &format!("/resources/{gpu}")).await;
        assert_eq!(got.status, 200);
        assert!(got.body.is_string(), "{}", got.body);
        assert_eq!(sim.active_faults(), 0);
        assert!(sim.requests_to(Route::LayoutApply).len() >= 3);
        sim.shutdown();
    }

    #[test]
    fn health_and_direct_connects_are_checked() {
        let sim = CdimSim::start(SimConfig::default()).unwrap();
        let node = sim.add_node();
        let gpu = sim.add_gpu(MODEL);
        assert!(matches!(
            sim.set_health(&gpu, "Degraded"),
            Err(SimError::BadHealth(_))
        ));
        sim.set_health(&gpu, "Warning").unwrap();
        assert_eq!(sim.gpu(&gpu).unwrap().health, "Warning");
        sim.connect_directly(&node.id, &gpu).unwrap();
        assert!(matches!(
            sim.connect_directly(&node.id, &gpu),
            Err(SimError::Connected { .. })
        ));
        assert!(matches!(
            sim.connect_directly("nope", &gpu),
            Err(SimError::UnknownNode(_))
        ));
        assert_eq!(sim.gpus_on(&node.id)[0].id, gpu);
        sim.shutdown();
    }
}

//! cro's own simulators speaking `cro-fabric-sim/1`: any [`Fabric`] driver served over
//! HTTP on a loopback port of its own (`cro provider sim --fabric fti`). A vendor reads
//! it as a working example of the protocol, and the suite's tests run the full suite
//! through it ([`super::RemoteFabric`] on one end, the driver on the other) to hold the
//! protocol to the same checks as the built-in path.
//!
//! `reset` starts a fresh simulator (new ports, new credentials): a client reads the
//! hello after it.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use cro_runtime::cluster::{ClusterReader, StaticCluster};
use serde_json::Value;
use tokio::sync::oneshot;

use super::PROTOCOL;
use super::wire::{
    AddDevices, AddMachine, DevicesAdded, FailJob, FaultKindWire, FaultOp, FreeCount, FreeQuery,
    Health, Held, HeldDevice, Hello, InjectFault, MachineAdded, Received, ReceivedRequest, Refusal,
    SecretData, SetHealth, SetSlow,
};
use crate::SuiteError;
use crate::fabric::{Fabric, FabricKind, FaultKind, Op};
use crate::fti::{FtiApi, FtiFabric};
use crate::nec::NecFabric;
use crate::redfish::RedfishFabric;

/// Starts a fresh fabric (each `reset` calls it).
pub type FabricFactory = Box<dyn Fn() -> Result<Box<dyn Fabric>, SuiteError> + Send + Sync>;

/// The factory of one of cro's simulated fabrics.
pub fn factory(kind: FabricKind, api: FtiApi) -> FabricFactory {
    Box::new(move || -> Result<Box<dyn Fabric>, SuiteError> {
        Ok(match kind {
            FabricKind::Fti => Box::new(FtiFabric::start(api)?),
            FabricKind::Redfish => Box::new(RedfishFabric::start()?),
            FabricKind::Nec => Box::new(NecFabric::start()?),
            FabricKind::Remote => {
                return Err(SuiteError::Simulator(
                    "a remote fabric is served by its own simulator".into(),
                ));
            }
        })
    })
}

struct Shared {
    factory: FabricFactory,
    fabric: RwLock<Arc<dyn Fabric>>,
}

impl Shared {
    fn fabric(&self) -> Arc<dyn Fabric> {
        self.fabric
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// A control server; it stops when dropped.
pub struct ControlServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ControlServer {
    /// Serves the fabrics `factory` starts on 127.0.0.1:`port` (0: any free port).
    pub fn start(factory: FabricFactory, port: u16) -> Result<ControlServer, SuiteError> {
        let fail = |e: std::io::Error| SuiteError::Simulator(format!("the control server: {e}"));
        let fabric: Arc<dyn Fabric> = Arc::from(factory()?);
        let shared = Arc::new(Shared {
            factory,
            fabric: RwLock::new(fabric),
        });
        let socket =
            std::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).map_err(fail)?;
        socket.set_nonblocking(true).map_err(fail)?;
        let addr = socket.local_addr().map_err(fail)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(fail)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("fabric-sim-control-server".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(socket) else {
                        return;
                    };
                    let _ = axum::serve(listener, router(shared))
                        .with_graceful_shutdown(async {
                            let _ = stopped.await;
                        })
                        .await;
                })
            })
            .map_err(fail)?;
        Ok(ControlServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The base URL of the protocol.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn router(shared: Arc<Shared>) -> axum::Router {
    axum::Router::new()
        .route("/", get(hello))
        .route("/reset", post(reset))
        .route("/machines", post(add_machine))
        .route("/machines/{machine}/devices", get(held))
        .route("/devices", post(add_devices))
        .route("/faults", post(inject).delete(clear_faults))
        .route("/slow", put(set_slow))
        .route("/health", put(set_health))
        .route("/jobs/fail-next", post(fail_next_job))
        .route("/requests", get(received))
        .route("/free", get(free))
        .with_state(shared)
}

type St = State<Arc<Shared>>;

fn refusal(status: StatusCode, error: String) -> Response {
    (status, Json(Refusal { error })).into_response()
}

async fn hello(State(s): St) -> Response {
    let fabric = s.fabric();
    let grants = fabric.grants();
    let secret = match secret_of(&grants, fabric.cluster()).await {
        Ok(secret) => secret,
        Err(e) => return refusal(StatusCode::INTERNAL_SERVER_ERROR, e),
    };
    Json(Hello {
        protocol: PROTOCOL.into(),
        fabric: fabric.kind().as_str().into(),
        config: fabric.config(),
        grants,
        secret,
        jobs: fabric.fails_jobs(),
    })
    .into_response()
}

/// The Secret the grants name, read from the driver's cluster.
async fn secret_of(grants: &Value, cluster: &StaticCluster) -> Result<Option<SecretData>, String> {
    let secret = &grants["secret"];
    let (Some(namespace), Some(name)) = (secret["namespace"].as_str(), secret["name"].as_str())
    else {
        return Ok(None);
    };
    let data = cluster
        .get_secret(namespace, name)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Some(SecretData {
        namespace: namespace.into(),
        name: name.into(),
        data: data
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
            .collect(),
    }))
}

async fn reset(State(s): St) -> Response {
    // Starting a simulator and stopping the old one block (each waits for its server
    // thread): off this runtime's only thread.
    let swap = tokio::task::spawn_blocking(move || {
        let fabric: Arc<dyn Fabric> = Arc::from((s.factory)()?);
        let old = std::mem::replace(
            &mut *s.fabric.write().unwrap_or_else(|p| p.into_inner()),
            fabric,
        );
        drop(old);
        Ok::<(), SuiteError>(())
    });
    match swap.await {
        Ok(Ok(())) => StatusCode::NO_CONTENT.into_response(),
        Ok(Err(e)) => refusal(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => refusal(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn add_machine(State(s): St, Json(body): Json<AddMachine>) -> Response {
    let fabric = s.fabric();
    let kinds = lookup_kinds(&fabric.grants());
    let before = objects(fabric.cluster(), &kinds).await;
    let machine = fabric.add_node(&body.node);
    let objects = objects(fabric.cluster(), &kinds)
        .await
        .into_iter()
        .filter(|o| !before.contains(o))
        .collect();
    Json(MachineAdded { machine, objects }).into_response()
}

/// The (apiVersion, kind) pairs the grants let a provider look up.
fn lookup_kinds(grants: &Value) -> Vec<(String, String)> {
    grants["lookup"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| {
            Some((
                l["api_version"].as_str()?.into(),
                l["kind"].as_str()?.into(),
            ))
        })
        .collect()
}

async fn objects(cluster: &StaticCluster, kinds: &[(String, String)]) -> Vec<Value> {
    let mut all = Vec::new();
    for (api, kind) in kinds {
        all.extend(cluster.list_objects(api, kind).await.unwrap_or_default());
    }
    all
}

async fn add_devices(State(s): St, Json(body): Json<AddDevices>) -> Response {
    let model = s
        .fabric()
        .add_free_devices(body.device_type, body.model.as_deref(), body.count);
    Json(DevicesAdded { model }).into_response()
}

async fn inject(State(s): St, Json(body): Json<InjectFault>) -> Response {
    let fault = match (body.kind, body.delay_ms) {
        (FaultKindWire::ServerError, _) => FaultKind::ServerError,
        (FaultKindWire::MalformedBody, _) => FaultKind::MalformedBody,
        (FaultKindWire::LostRequest, _) => FaultKind::LostRequest,
        (FaultKindWire::LostReply, _) => FaultKind::LostReply,
        (FaultKindWire::Slow, Some(ms)) => FaultKind::Slow(Duration::from_millis(ms)),
        (FaultKindWire::Slow, None) => {
            return refusal(
                StatusCode::BAD_REQUEST,
                "a slow fault needs delay_ms".into(),
            );
        }
    };
    let op = match body.op {
        FaultOp::Attach => Op::Attach,
        FaultOp::Detach => Op::Detach,
        FaultOp::Any => Op::First,
    };
    s.fabric().inject(fault, op);
    StatusCode::NO_CONTENT.into_response()
}

async fn clear_faults(State(s): St) -> Response {
    s.fabric().clear_faults();
    StatusCode::NO_CONTENT.into_response()
}

async fn held(State(s): St, Path(machine): Path<String>) -> Response {
    let devices = s
        .fabric()
        .attached(&machine)
        .into_iter()
        .map(|d| HeldDevice {
            ids: d.ids,
            ready: d.ready,
        })
        .collect();
    Json(Held { devices }).into_response()
}

async fn free(State(s): St, Query(q): Query<FreeQuery>) -> Response {
    match s.fabric().free(q.device_type, &q.model) {
        Ok(count) => Json(FreeCount { count }).into_response(),
        Err(e) => refusal(StatusCode::NOT_IMPLEMENTED, e),
    }
}

async fn set_slow(State(s): St, Json(body): Json<SetSlow>) -> Response {
    match s
        .fabric()
        .set_slow(body.delay_ms.map(Duration::from_millis))
    {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refusal(StatusCode::NOT_IMPLEMENTED, e),
    }
}

async fn set_health(State(s): St, Json(body): Json<SetHealth>) -> Response {
    match s
        .fabric()
        .set_warning(&body.device, body.health == Health::Warning)
    {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refusal(StatusCode::NOT_FOUND, e),
    }
}

async fn fail_next_job(State(s): St, Json(body): Json<FailJob>) -> Response {
    let fabric = s.fabric();
    if !fabric.fails_jobs() {
        return refusal(
            StatusCode::NOT_IMPLEMENTED,
            format!("the {} simulator cannot fail a job", fabric.kind().as_str()),
        );
    }
    match fabric.fail_next_job(body.rollback) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refusal(StatusCode::NOT_IMPLEMENTED, e),
    }
}

async fn received(State(s): St) -> Response {
    let requests = s
        .fabric()
        .received()
        .into_iter()
        .map(|c| ReceivedRequest {
            seq: c.seq,
            method: c.method,
            path: c.path,
            changes: c.changes,
        })
        .collect();
    Json(Received { requests }).into_response()
}

//! The stand-in service of the real-node test tier: the node software on a real node
//! runs as pods of the `node-standin` image, whose binaries forward every command the
//! operator execs there (and each pod's start) to this HTTP service in the test
//! process. It answers with the node simulation ([`SimNodes`]), so the answers, the
//! quirks and the "unknown command" rule are the in-process simulation's, while the
//! path is the real one: API server, kubelet, container runtime, a process in the pod.
//!
//! The same service answers an operator in another process of the test: its command
//! runner, [`StandinRunner`](crate::StandinRunner), forwards each command here, so
//! every operator process of a test shares the one node simulation.
//!
//! Endpoints (JSON):
//! - `POST /v1/exec` `{namespace, pod, node, kind: "driver"|"agent", argv}` →
//!   `{stdout, stderr, code, signal}`; from a runner (`"runner": true`, no `kind`,
//!   optionally `container`) the pod is not taken as running (the simulation's own
//!   pods are the ones there are), and a command the simulation refuses is answered
//!   `{"error": message, ...}` instead of exit code [`REFUSED`], so the runner fails it
//!   as the in-process runner does;
//! - `POST /v1/started` `{namespace, pod, node, uid, role, gpus?}`: a pod's container
//!   started (see [`Role`] for what each role does);
//! - `GET /v1/nodes/{node}/gpus` → `[{uuid, minor, bus}]`: what the node's driver lists
//!   (the stand-in device plugin polls it).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use cro_operator::nodeops::{NodeOpsError, PodRef};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::SimTimings;
use crate::node::PodKind;
use crate::runner::{ExecPath, ExecPod, SimNodes};

/// Exit code of a command the simulation refused before running it (its pod is unknown
/// or gone, its node unreachable): as a shell reports a command it cannot execute. On
/// a real node such an exec would not have reached a process at all, so a test seeing
/// it has a bookkeeping bug.
pub const REFUSED: i32 = 126;
/// What a workload pod's GPUs show in `nvidia-smi --query-compute-apps`.
pub const WORKLOAD_PROCESS: &str = "gpu-workload";

/// A fault for the next exec whose argv starts with a given prefix
/// ([`Standin::inject`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecFault {
    /// The command takes effect at once and answers after this long (it "runs long").
    Delay(Duration),
    /// The command neither takes effect nor answers until [`Standin::clear_faults`]
    /// (then it runs and answers normally) or the service is dropped (then the forwarded
    /// command fails with 125).
    Hang,
    /// The command takes effect, prints what it printed, and is killed by this signal
    /// (the kubelet reports 128 + signal).
    Signal(i32),
    /// The command answers exactly this and has no effect (the simulation never sees
    /// it: it is in [`Standin::exec_received`], not in [`Standin::exec_answered`]).
    Reply {
        stdout: String,
        stderr: String,
        code: i32,
    },
}

impl ExecFault {
    pub fn reply(stdout: &str, stderr: &str, code: i32) -> Self {
        ExecFault::Reply {
            stdout: stdout.to_owned(),
            stderr: stderr.to_owned(),
            code,
        }
    }
}

/// A fault waiting for its exec.
#[derive(Debug, Clone)]
struct Queued {
    /// A prefix of the argv, element by element (`["nvidia-smi", "drain"]`).
    matches: Vec<String>,
    fault: ExecFault,
}

/// What a pod announced it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// The GPU operator's driver: its nvidia-persistenced starts once the driver is
    /// built ([`SimTimings::driver_ready_after`] after the start), as the simulated
    /// driver pod's does when it turns Ready.
    Driver,
    Agent,
    /// The DRA kubelet plugin: the real-node side publishes the node's ResourceSlice a
    /// while after it started ([`crate::RealNodeSide`]).
    DraPlugin,
    DevicePlugin,
    Dcgm,
    /// A pod using GPUs: each of its `gpus` runs a compute process
    /// ([`WORKLOAD_PROCESS`]) until the pod is reported gone ([`Standin::workload_gone`]).
    Workload,
}

impl Role {
    /// The name pods announce it by (`--announce ROLE`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Driver => "driver",
            Role::Agent => "agent",
            Role::DraPlugin => "dra-plugin",
            Role::DevicePlugin => "device-plugin",
            Role::Dcgm => "dcgm",
            Role::Workload => "workload",
        }
    }
}

/// A pod's container start, as announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub namespace: String,
    pub pod: String,
    pub node: String,
    /// The pod's uid; empty if the pod did not pass `POD_UID`.
    pub uid: String,
    pub role: Role,
    pub gpus: Vec<String>,
    /// When the announcement arrived.
    pub at: Instant,
    /// The pod was reported gone since.
    pub gone: bool,
}

/// A command to run, as a stand-in pod's binary or a [`crate::StandinRunner`] sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ExecRequest {
    pub namespace: String,
    pub pod: String,
    pub node: String,
    /// "driver" or "agent": which pod image the command runs in (pods only).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    pub argv: Vec<String>,
    /// The container the operator named, if any (runners only; the simulation runs a
    /// command the same in any container of a pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Sent by a runner, not by a process in a pod.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub runner: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ExecReply {
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
    pub code: i32,
    #[serde(default)]
    pub signal: Option<i32>,
    /// Runners only: the simulation refused the command with this message (what the
    /// in-process runner's [`NodeOpsError::Exec`] says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct StartedRequest {
    namespace: String,
    pod: String,
    node: String,
    #[serde(default)]
    uid: String,
    role: Role,
    #[serde(default)]
    gpus: Vec<String>,
}

#[derive(Debug, Serialize)]
struct GpuInfo {
    uuid: String,
    minor: u32,
    bus: String,
}

/// What held requests wait for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Wake {
    /// Bumped by [`Standin::clear_faults`]: hung execs go on.
    released: u64,
    /// The service is being dropped: held requests end.
    shutdown: bool,
}

#[derive(Default)]
struct Book {
    faults: Vec<Queued>,
    received: Vec<(String, Vec<String>)>,
    answered: Vec<(String, Vec<String>)>,
    started: BTreeMap<(String, String), Started>,
    /// Pods known to be deleted: an exec that still arrives from one is not taken as
    /// the pod's start.
    gone: BTreeSet<(String, String)>,
    driver_ready_after: Duration,
}

/// The service's state, shared by its handlers and the real-node side.
pub(crate) struct Shared {
    nodes: SimNodes,
    book: Mutex<Book>,
    wake: watch::Sender<Wake>,
}

/// The running stand-in service; it stops when dropped.
pub struct Standin {
    shared: Arc<Shared>,
    url: String,
    server: JoinHandle<()>,
}

impl Standin {
    /// Serves on `127.0.0.1` on a free port. Must be called inside a tokio runtime.
    pub fn start(nodes: SimNodes) -> io::Result<Standin> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(io::Error::other(
                "the stand-in service must be started inside a tokio runtime",
            ));
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let shared = Arc::new(Shared {
            nodes,
            book: Mutex::new(Book {
                driver_ready_after: SimTimings::default().driver_ready_after,
                ..Book::default()
            }),
            wake: watch::Sender::new(Wake::default()),
        });
        let app = Router::new()
            .route("/v1/exec", post(exec))
            .route("/v1/started", post(started))
            .route("/v1/nodes/{node}/gpus", get(gpus))
            .fallback(not_found)
            .with_state(shared.clone());
        let mut stop = shared.wake.subscribe();
        let server = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stop.wait_for(|w| w.shutdown).await;
            };
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
            {
                tracing::warn!(error = %e, "the stand-in service stopped");
            }
        });
        Ok(Standin {
            shared,
            url: format!("http://127.0.0.1:{port}"),
            server,
        })
    }

    /// `http://127.0.0.1:PORT`: the pods' `CRO_STANDIN_URL` (they use the host's
    /// network).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The simulated nodes answering.
    pub fn nodes(&self) -> SimNodes {
        self.shared.nodes.clone()
    }

    /// Takes the delays of `timings` (the driver's build time).
    pub fn set_timings(&self, timings: &SimTimings) {
        self.shared.book().driver_ready_after = timings.driver_ready_after;
    }

    /// Queues `fault` for the next exec whose argv starts with `matches` (element by
    /// element); faults apply in the order queued, each once.
    pub fn inject(&self, matches: &[&str], fault: ExecFault) {
        self.shared.book().faults.push(Queued {
            matches: matches.iter().map(|m| m.to_string()).collect(),
            fault,
        });
    }

    /// Drops the queued faults and lets hung execs go on (they run and answer now).
    pub fn clear_faults(&self) {
        self.shared.book().faults.clear();
        self.shared.wake.send_modify(|w| w.released += 1);
    }

    /// Every exec the simulation answered through this service, in order, with its
    /// node: one entry per command in [`SimNodes::commands_via`]`(`[`ExecPath::StandIn`]`)`
    /// and `(`[`ExecPath::Forwarded`]`)` (recorded when it ran, so also one whose reply a
    /// fault delays or a hook holds). An [`ExecFault::Reply`] is not the simulation's
    /// answer and is not here. Faults apply to runners' commands as to pods'.
    pub fn exec_answered(&self) -> Vec<(String, Vec<String>)> {
        self.shared.book().answered.clone()
    }

    /// Every exec that reached this service, in order, with its node, whatever became
    /// of it (a test waits here for a command to reach its pod).
    pub fn exec_received(&self) -> Vec<(String, Vec<String>)> {
        self.shared.book().received.clone()
    }

    /// The pods that announced their start, one record per (namespace, pod), the last.
    pub fn started(&self) -> Vec<Started> {
        self.shared.started()
    }

    /// The workload pod is gone: its GPUs' compute processes end. The real-node side
    /// calls this for every announced pod it sees deleted.
    pub fn workload_gone(&self, namespace: &str, pod: &str) {
        self.shared.pod_gone(namespace, pod, None);
    }

    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }
}

impl Drop for Standin {
    fn drop(&mut self) {
        self.shared.wake.send_modify(|w| w.shutdown = true);
        self.server.abort();
    }
}

impl Shared {
    fn book(&self) -> MutexGuard<'_, Book> {
        self.book
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn started(&self) -> Vec<Started> {
        self.book().started.values().cloned().collect()
    }

    /// The pod `namespace/pod` is deleted (if `uid` is given: only that incarnation of
    /// it): commands can no longer run in it, and a workload's GPUs are free again.
    pub(crate) fn pod_gone(&self, namespace: &str, pod: &str, uid: Option<&str>) {
        let key = (namespace.to_owned(), pod.to_owned());
        let freed = {
            let mut book = self.book();
            let Book { started, gone, .. } = &mut *book;
            gone.insert(key.clone());
            match started.get_mut(&key) {
                Some(s) if !s.gone && uid.is_none_or(|u| u == s.uid) => {
                    s.gone = true;
                    (s.role == Role::Workload).then(|| s.gpus.clone())
                }
                _ => None,
            }
        };
        self.nodes.lock().pods.remove(&key);
        if let Some(gpus) = freed {
            self.release_gpus(&gpus);
        }
    }

    /// Ends the compute processes on `gpus`, but for those another live workload uses.
    fn release_gpus(&self, gpus: &[String]) {
        let still_used: BTreeSet<String> = self
            .book()
            .started
            .values()
            .filter(|s| s.role == Role::Workload && !s.gone)
            .flat_map(|s| s.gpus.iter().cloned())
            .collect();
        for gpu in gpus.iter().filter(|g| !still_used.contains(*g)) {
            self.nodes.set_busy(gpu, &[]);
        }
    }

    /// Makes the pod of an exec known to the simulation: its container runs, or the
    /// exec would not have reached it. A pod known to be deleted stays unknown.
    fn register(&self, req: &ExecRequest, kind: PodKind) {
        let key = (req.namespace.clone(), req.pod.clone());
        if self.book().gone.contains(&key) {
            return;
        }
        self.nodes
            .lock()
            .pods
            .entry(key)
            .and_modify(|p| p.ready = true)
            .or_insert_with(|| ExecPod {
                kind,
                node: req.node.clone(),
                ready: true,
            });
    }

    fn take_fault(&self, argv: &[String]) -> Option<ExecFault> {
        let mut book = self.book();
        let i = book
            .faults
            .iter()
            .position(|q| argv.starts_with(&q.matches))?;
        Some(book.faults.remove(i).fault)
    }

    /// Runs the command as the in-process runner would. None: the test's hook holds
    /// it, and the service stopped meanwhile.
    async fn run(&self, req: &ExecRequest, wake: &mut watch::Receiver<Wake>) -> Option<ExecReply> {
        let pod = PodRef {
            namespace: req.namespace.clone(),
            name: req.pod.clone(),
            node: req.node.clone(),
            container: req.container.clone(),
        };
        let path = if req.runner {
            ExecPath::Forwarded
        } else {
            ExecPath::StandIn
        };
        let answered = self.nodes.answer(&pod, &req.argv, path);
        self.book()
            .answered
            .push((req.node.clone(), req.argv.clone()));
        if answered.hold {
            // The hook's "never returns": the process in the pod waits until the test
            // is over.
            let _ = wake.wait_for(|w| w.shutdown).await;
            return None;
        }
        Some(match answered.result {
            Ok(out) => ExecReply {
                stdout: out.stdout,
                stderr: out.stderr,
                code: out.exit_code,
                signal: None,
                error: None,
            },
            // A runner fails the command with the simulation's own error.
            Err(e) if req.runner => ExecReply {
                stdout: String::new(),
                stderr: String::new(),
                code: REFUSED,
                signal: None,
                error: Some(match e {
                    NodeOpsError::Exec { message, .. } => message,
                    other => other.to_string(),
                }),
            },
            Err(e) => ExecReply {
                stdout: String::new(),
                stderr: format!("node-standin: {e}\n"),
                code: REFUSED,
                signal: None,
                error: None,
            },
        })
    }

    /// Announced start of a pod.
    fn announce(self: &Arc<Self>, req: StartedRequest) {
        let key = (req.namespace.clone(), req.pod.clone());
        let record = Started {
            namespace: req.namespace,
            pod: req.pod,
            node: req.node,
            uid: req.uid,
            role: req.role,
            gpus: if req.role == Role::Workload {
                req.gpus
            } else {
                Vec::new()
            },
            at: Instant::now(),
            gone: false,
        };
        let (replaced, delay) = {
            let mut book = self.book();
            book.gone.remove(&key);
            let replaced = book.started.insert(key, record.clone());
            (replaced, book.driver_ready_after)
        };
        // A re-created pod of the same name: the old one's GPUs are free (unless the
        // new one has them too).
        if let Some(old) = replaced
            && old.role == Role::Workload
            && !old.gone
        {
            self.release_gpus(&old.gpus);
        }
        match record.role {
            Role::Workload => {
                for gpu in &record.gpus {
                    self.nodes.set_busy(gpu, &[WORKLOAD_PROCESS]);
                }
            }
            Role::Driver => {
                let shared = self.clone();
                let mut wake = self.wake.subscribe();
                tokio::spawn(async move {
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        _ = wake.wait_for(|w| w.shutdown) => return,
                    }
                    shared.driver_built(&record);
                });
            }
            Role::Agent | Role::DraPlugin | Role::DevicePlugin | Role::Dcgm => {}
        }
    }

    /// The driver pod `started` has built its driver: nvidia-persistenced runs, unless
    /// the pod is gone (or was replaced) meanwhile.
    fn driver_built(&self, started: &Started) {
        let current = {
            let book = self.book();
            book.started
                .get(&(started.namespace.clone(), started.pod.clone()))
                .is_some_and(|s| !s.gone && s.uid == started.uid && s.at == started.at)
        };
        if !current {
            return;
        }
        if let Some(node) = self.nodes.lock().nodes.get_mut(&started.node) {
            node.start_persistenced();
        }
    }
}

fn text(status: StatusCode, message: String) -> Response {
    (status, message).into_response()
}

async fn exec(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let req: ExecRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("bad exec request: {e}")),
    };
    // A pod's command proves the pod runs; a runner's proves nothing (its pod may be
    // gone or not ready, and the simulation answers so).
    let kind = match (req.runner, req.kind.as_str()) {
        (true, _) => None,
        (false, "driver") => Some(PodKind::Driver),
        (false, "agent") => Some(PodKind::Agent),
        (false, other) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("bad exec request: kind {other:?} is neither \"driver\" nor \"agent\""),
            );
        }
    };
    if req.argv.is_empty() {
        return text(
            StatusCode::BAD_REQUEST,
            "bad exec request: empty argv".into(),
        );
    }
    shared
        .book()
        .received
        .push((req.node.clone(), req.argv.clone()));
    if let Some(kind) = kind {
        shared.register(&req, kind);
    }
    // Subscribed before the fault is taken, so a release right after is not missed.
    let mut wake = shared.wake.subscribe();
    let released = wake.borrow_and_update().released;
    let reply = match shared.take_fault(&req.argv) {
        None => shared.run(&req, &mut wake).await,
        Some(ExecFault::Reply {
            stdout,
            stderr,
            code,
        }) => Some(ExecReply {
            stdout,
            stderr,
            code,
            signal: None,
            error: None,
        }),
        Some(ExecFault::Signal(signal)) => shared.run(&req, &mut wake).await.map(|r| ExecReply {
            code: 128 + signal,
            signal: Some(signal),
            ..r
        }),
        Some(ExecFault::Delay(delay)) => match shared.run(&req, &mut wake).await {
            Some(reply) => tokio::select! {
                () = tokio::time::sleep(delay) => Some(reply),
                _ = wake.wait_for(|w| w.shutdown) => None,
            },
            None => None,
        },
        Some(ExecFault::Hang) => {
            let released = wake
                .wait_for(|w| w.shutdown || w.released != released)
                .await
                .is_ok_and(|w| !w.shutdown);
            if released {
                shared.run(&req, &mut wake).await
            } else {
                None
            }
        }
    };
    let Some(reply) = reply else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the stand-in service stopped before the command finished".into(),
        );
    };
    axum::Json(reply).into_response()
}

async fn started(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    match serde_json::from_slice::<StartedRequest>(&body) {
        Ok(req) => {
            shared.announce(req);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => text(StatusCode::BAD_REQUEST, format!("bad announcement: {e}")),
    }
}

/// The GPUs `node`'s driver lists; none for a node the simulation does not know (yet):
/// the device plugin may poll before the test adds the node.
async fn gpus(State(shared): State<Arc<Shared>>, Path(node): Path<String>) -> Response {
    let gpus: Vec<GpuInfo> = shared
        .nodes
        .listed_gpus(&node)
        .into_iter()
        .map(|g| GpuInfo {
            bus: g.bus_smi(),
            uuid: g.uuid,
            minor: g.minor,
        })
        .collect();
    axum::Json(gpus).into_response()
}

async fn not_found(method: Method, uri: Uri) -> Response {
    text(
        StatusCode::NOT_FOUND,
        format!("the stand-in service has no {method} {uri}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{DriverKind, NodeOptions};
    use fabric_sim::{FabricSim, SimConfig};
    use serde_json::{Value, json};

    const NODE: &str = "127.0.0.1";

    struct Fixture {
        fabric: FabricSim,
        standin: Standin,
    }

    fn fixture(driver: DriverKind) -> Fixture {
        let fabric = FabricSim::start(SimConfig::default()).unwrap();
        fabric.add_machine("m1", "m1");
        let nodes = SimNodes::new(fabric.clone());
        nodes.insert_node(NODE, "m1", driver, NodeOptions::default(), None);
        let standin = Standin::start(nodes).unwrap();
        Fixture { fabric, standin }
    }

    /// One HTTP/1.1 request, as the stand-in binary sends it: status and body.
    async fn request(url: &str, method: &str, path: &str, body: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = url.strip_prefix("http://").unwrap();
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).await.unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, body.to_owned())
    }

    impl Fixture {
        async fn post(&self, path: &str, body: Value) -> (u16, String) {
            request(self.standin.url(), "POST", path, &body.to_string()).await
        }

        async fn exec(&self, kind: &str, argv: &[&str]) -> Value {
            let (status, body) = self
                .post(
                    "/v1/exec",
                    json!({"namespace": "gpu-operator", "pod": "drv-abcde", "node": NODE,
                        "kind": kind, "argv": argv}),
                )
                .await;
            assert_eq!(status, 200, "{body}");
            serde_json::from_str(&body).unwrap()
        }

        async fn get(&self, path: &str) -> (u16, String) {
            request(self.standin.url(), "GET", path, "").await
        }
    }

    #[tokio::test]
    async fn exec_is_answered_by_the_simulation_and_recorded() {
        let f = fixture(DriverKind::GpuOperator);
        let gpu = f.fabric.attach_directly("m1", "gpu", "A100").unwrap();
        let out = f
            .exec(
                "driver",
                &[
                    "nvidia-smi",
                    "--query-gpu=gpu_uuid,pci.bus_id",
                    "--format=csv,noheader,nounits",
                ],
            )
            .await;
        assert_eq!(
            out,
            json!({"stdout": format!("{}, 00000000:3B:00.0\n", gpu.serial),
                "stderr": "", "code": 0, "signal": null})
        );
        let out = f.exec("driver", &["nvidia-smi", "--bogus"]).await;
        assert_eq!(out["code"], 127);
        let nodes = f.standin.nodes();
        assert_eq!(nodes.unknown_commands().len(), 1);
        assert_eq!(nodes.commands_via(ExecPath::StandIn).len(), 2);
        assert!(nodes.commands_via(ExecPath::InProcess).is_empty());
        assert_eq!(f.standin.exec_answered().len(), 2);
        assert_eq!(
            f.standin.exec_answered()[1].1,
            vec!["nvidia-smi", "--bogus"]
        );
        // The pod is known to the simulation now, as the kind it said.
        let pods = nodes.lock().pods.clone();
        let pod = &pods[&("gpu-operator".to_owned(), "drv-abcde".to_owned())];
        assert!(pod.ready && pod.kind == PodKind::Driver && pod.node == NODE);
    }

    #[tokio::test]
    async fn a_deleted_pod_is_not_found() {
        let f = fixture(DriverKind::Host);
        f.standin
            .shared()
            .pod_gone("gpu-operator", "drv-abcde", None);
        let out = f
            .exec("agent", &["chroot", "/host-root", "modinfo", "nvidia"])
            .await;
        assert_eq!(out["code"], REFUSED);
        assert!(
            out["stderr"].as_str().unwrap().contains("not found"),
            "{out}"
        );
    }

    #[tokio::test]
    async fn faults_apply_once_to_the_first_match() {
        let f = fixture(DriverKind::GpuOperator);
        f.fabric.attach_directly("m1", "gpu", "A100").unwrap();
        f.standin
            .inject(&["nvidia-smi", "drain"], ExecFault::reply("odd\n", "e", 3));
        f.standin.inject(&["nvidia-smi"], ExecFault::Signal(9));
        let out = f
            .exec("driver", &["nvidia-smi", "drain", "-p", "x", "-q"])
            .await;
        assert_eq!(
            out,
            json!({"stdout": "odd\n", "stderr": "e", "code": 3, "signal": null})
        );
        let out = f.exec("driver", &["nvidia-smi"]).await;
        assert_eq!(
            (out["code"].clone(), out["signal"].clone()),
            (json!(137), json!(9))
        );
        assert!(out["stdout"].as_str().unwrap().contains("1 GPUs"));
        let out = f.exec("driver", &["nvidia-smi"]).await;
        assert_eq!(out["code"], 0);
        // The reply had no effect and was not interpreted; the others were.
        assert_eq!(f.standin.nodes().commands().len(), 2);
        assert_eq!(f.standin.exec_answered().len(), 2);
        assert_eq!(f.standin.exec_received().len(), 3);

        f.standin.inject(
            &["nvidia-smi"],
            ExecFault::Delay(Duration::from_millis(300)),
        );
        let t = Instant::now();
        assert_eq!(f.exec("driver", &["nvidia-smi"]).await["code"], 0);
        assert!(t.elapsed() >= Duration::from_millis(300));
    }

    #[tokio::test]
    async fn a_hung_exec_goes_on_when_released() {
        let f = Arc::new(fixture(DriverKind::GpuOperator));
        f.standin.inject(&["nvidia-smi"], ExecFault::Hang);
        let hung = {
            let f = f.clone();
            tokio::spawn(async move { f.exec("driver", &["nvidia-smi"]).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!hung.is_finished());
        assert_eq!(f.standin.exec_received().len(), 1);
        // Nothing ran while it hung.
        assert!(f.standin.nodes().commands().is_empty());
        f.standin.clear_faults();
        let out = tokio::time::timeout(Duration::from_secs(5), hung)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(out["code"], 6, "no GPU: {out}");
        assert_eq!(f.standin.nodes().commands().len(), 1);
    }

    #[tokio::test]
    async fn gpus_of_a_node() {
        let f = fixture(DriverKind::GpuOperator);
        let a = f.fabric.attach_directly("m1", "gpu", "A100").unwrap();
        let b = f.fabric.attach_directly("m1", "gpu", "A100").unwrap();
        let (status, body) = f.get(&format!("/v1/nodes/{NODE}/gpus")).await;
        assert_eq!(status, 200);
        assert_eq!(
            serde_json::from_str::<Value>(&body).unwrap(),
            json!([{"uuid": a.serial, "minor": 0, "bus": "00000000:3B:00.0"},
                {"uuid": b.serial, "minor": 1, "bus": "00000000:3C:00.0"}])
        );
        assert_eq!(f.get("/v1/nodes/elsewhere/gpus").await, (200, "[]".into()));
    }

    #[tokio::test]
    async fn starts_of_driver_and_workload() {
        let f = fixture(DriverKind::GpuOperator);
        f.standin.set_timings(&SimTimings {
            driver_ready_after: Duration::from_millis(200),
            ..SimTimings::default()
        });
        let gpu = f.fabric.attach_directly("m1", "gpu", "A100").unwrap();
        let (status, _) = f
            .post(
                "/v1/started",
                json!({"namespace": "gpu-operator", "pod": "drv-x", "node": NODE,
                    "uid": "u1", "role": "driver"}),
            )
            .await;
        assert_eq!(status, 204);
        let nodes = f.standin.nodes();
        assert_eq!(nodes.with_node(NODE, |n| n.persistenced_pid()), Some(None));
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            nodes
                .with_node(NODE, |n| n.persistenced_pid())
                .flatten()
                .is_some()
        );

        let busy = || async {
            f.exec(
                "driver",
                &[
                    "nvidia-smi",
                    "--query-compute-apps=gpu_uuid,process_name",
                    "--format=csv,noheader,nounits",
                ],
            )
            .await["stdout"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        f.post(
            "/v1/started",
            json!({"namespace": "default", "pod": "job", "node": NODE, "uid": "w1",
                "role": "workload", "gpus": [gpu.serial]}),
        )
        .await;
        assert_eq!(
            busy().await,
            format!("{}, {WORKLOAD_PROCESS}\n", gpu.serial)
        );
        f.standin.workload_gone("default", "job");
        assert_eq!(busy().await, "");
        let started = f.standin.started();
        assert_eq!(started.len(), 2);
        assert!(started.iter().any(|s| s.role == Role::Workload && s.gone));
    }

    /// The `node-standin` binary against the service, when `NODE_STANDIN_BIN` names
    /// it (a build of tests/node-standin); skipped otherwise.
    #[tokio::test]
    async fn forwarded_by_the_real_binary() {
        use std::os::unix::process::ExitStatusExt;
        let Ok(bin) = std::env::var("NODE_STANDIN_BIN") else {
            eprintln!("NODE_STANDIN_BIN not set: skipped");
            return;
        };
        let f = fixture(DriverKind::GpuOperator);
        let gpu = f.fabric.attach_directly("m1", "gpu", "A100").unwrap();
        let dir = std::env::temp_dir().join(format!("standin-bin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let smi = dir.join("nvidia-smi");
        let _ = std::fs::remove_file(&smi);
        std::os::unix::fs::symlink(&bin, &smi).unwrap();
        let pod_env = |c: &mut tokio::process::Command| {
            c.env("POD_NAMESPACE", "gpu-operator")
                .env("POD_NAME", "drv-abcde")
                .env("POD_UID", "u-1")
                .env("NODE_NAME", NODE)
                .env("CRO_STANDIN_KIND", "driver")
                .env("CRO_STANDIN_URL", f.standin.url());
        };
        let mut c = tokio::process::Command::new(&smi);
        pod_env(&mut c);
        let out = c.output().await.unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("1 GPUs"));

        f.standin.inject(&["nvidia-smi"], ExecFault::Signal(9));
        let mut c = tokio::process::Command::new(&smi);
        pod_env(&mut c);
        let out = c.output().await.unwrap();
        assert_eq!(out.status.signal(), Some(9), "{out:?}");
        assert_eq!(f.standin.exec_answered().len(), 2);

        let mut c = tokio::process::Command::new(&bin);
        pod_env(&mut c);
        c.args([
            "pause",
            "--announce",
            "workload",
            "--print-env",
            "NVIDIA_VISIBLE_DEVICES",
        ])
        .env("NVIDIA_VISIBLE_DEVICES", &gpu.serial)
        .stdout(std::process::Stdio::piped());
        let pause = c.spawn().unwrap();
        let pid = pause.id().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while f.standin.started().is_empty() {
            assert!(Instant::now() < deadline, "no announcement");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let started = f.standin.started();
        assert_eq!(
            (
                started[0].role,
                started[0].uid.as_str(),
                started[0].gpus.clone()
            ),
            (Role::Workload, "u-1", vec![gpu.serial.clone()])
        );
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        let out = tokio::time::timeout(Duration::from_secs(10), pause.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(out.status.code(), Some(0));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("NVIDIA_VISIBLE_DEVICES={}\n", gpu.serial)
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn bad_input_is_refused_not_panicked_on() {
        let f = fixture(DriverKind::GpuOperator);
        let (status, body) = f.post("/v1/exec", json!({"argv": ["x"]})).await;
        assert_eq!(status, 400);
        assert!(body.contains("missing field"), "{body}");
        let (status, _) = f
            .post(
                "/v1/exec",
                json!({"namespace": "n", "pod": "p", "node": NODE, "kind": "gpu", "argv": ["x"]}),
            )
            .await;
        assert_eq!(status, 400);
        let (status, _) = f
            .post(
                "/v1/exec",
                json!({"namespace": "n", "pod": "p", "node": NODE, "kind": "driver", "argv": []}),
            )
            .await;
        assert_eq!(status, 400);
        let (status, body) = f
            .post(
                "/v1/started",
                json!({"namespace": "n", "pod": "p", "node": NODE, "role": "kubelet"}),
            )
            .await;
        assert_eq!(status, 400, "{body}");
        let (status, body) = request(f.standin.url(), "POST", "/v1/started", "{not json").await;
        assert_eq!(status, 400, "{body}");
        let (status, body) = f.get("/v2/anything").await;
        assert_eq!(status, 404);
        assert!(body.contains("/v2/anything"));
    }
}

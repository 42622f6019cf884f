//! The suite's side of `cro-fabric-sim/1`: a [`Fabric`] whose every step is a call to a
//! simulator somewhere else (a vendor's, in any language, or `cro provider sim`).
//!
//! The [`Fabric`] trait is synchronous and the suite calls it from its async checks, so
//! the HTTP client runs on a thread of its own with its own runtime: a call blocks the
//! check only, and works whatever runtime the suite runs on. A simulator that fails a
//! call (a refused connection, a status the protocol does not allow, a body it cannot
//! read) marks the fabric broken: the suite stops at the end of that check and says
//! why, since a check whose oracle could not be read cannot pass or fail.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::Duration;

use cro_runtime::DeviceType;
use cro_runtime::cluster::StaticCluster;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use url::Url;

use super::PROTOCOL;
use super::wire::{
    AddDevices, AddMachine, DevicesAdded, FailJob, FaultKindWire, FaultOp, FreeCount, Health, Held,
    Hello, InjectFault, MachineAdded, Received, Refusal, SetHealth, SetSlow,
};
use crate::SuiteError;
use crate::fabric::{Fabric, FabricCall, FabricDevice, FabricKind, FaultKind, Op};

/// How long one control call may take: a simulator is local and answers at once.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a simulator that does not answer yet is waited for.
const STARTING: Duration = Duration::from_secs(10);
/// The longest control reply read (a machine's devices, a hello with a CA).
const MAX_REPLY: usize = 4 << 20;

/// A simulator reached over the control protocol.
pub struct RemoteFabric {
    base: Url,
    hello: Hello,
    cluster: StaticCluster,
    client: Client,
    /// The first call that failed: the suite stops with it.
    broken: Mutex<Option<String>>,
}

impl RemoteFabric {
    /// Connects to the simulator at `base`, resets it and reads what it is.
    pub fn connect(base: &str) -> Result<RemoteFabric, SuiteError> {
        let base = base_url(base)?;
        let client = Client::start()?;
        let fail = |e: String| SuiteError::Simulator(format!("{base}: {e}"));
        let reset = base.join("reset").map_err(|e| fail(e.to_string()))?;
        // A simulator started just before the suite may not listen yet: its connection
        // is asked again until STARTING has passed.
        let started = std::time::Instant::now();
        loop {
            match client.call(reqwest::Method::POST, reset.clone(), None) {
                Ok(reply) => {
                    expect_empty(reply).map_err(|e| fail(format!("reset: {e}")))?;
                    break;
                }
                Err(_) if started.elapsed() < STARTING => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(fail(format!("reset: {e}"))),
            }
        }
        let hello: Hello = client
            .call(reqwest::Method::GET, base.clone(), None)
            .and_then(expect_json)
            .map_err(fail)?;
        if hello.protocol != PROTOCOL {
            return Err(fail(format!(
                "it speaks protocol {:?}; this suite speaks {PROTOCOL}",
                hello.protocol
            )));
        }
        let cluster = match &hello.secret {
            Some(s) => StaticCluster::new().with_secret(&s.namespace, &s.name, s.data.clone()),
            None => StaticCluster::new(),
        };
        Ok(RemoteFabric {
            base,
            hello,
            cluster,
            client,
            broken: Mutex::new(None),
        })
    }

    /// The fabric's name as the simulator gives it, and where it is.
    pub fn name(&self) -> String {
        format!("{} (simulator at {})", self.hello.fabric, self.base)
    }

    fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, String> {
        self.send(method, path, body).and_then(expect_json)
    }

    fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<Reply, String> {
        let url = self.base.join(path).map_err(|e| format!("{path}: {e}"))?;
        let body = body
            .map(serde_json::to_value)
            .transpose()
            .map_err(|e| e.to_string())?;
        self.client
            .call(method.clone(), url, body)
            .map_err(|e| format!("{method} {path}: {e}"))
    }

    /// Records the first failure and gives the caller's empty value.
    fn broke<T: Default>(&self, what: &str, e: String) -> T {
        let mut broken = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        if broken.is_none() {
            *broken = Some(format!("{what}: {e}"));
        }
        T::default()
    }

    /// A call the simulator may refuse (`Refusal`): Ok, or why not.
    fn refusable(
        &self,
        path: &str,
        body: &impl Serialize,
        method: reqwest::Method,
    ) -> Result<(), String> {
        match self.send(method, path, Some(body)) {
            Ok(r) if r.status.is_success() => Ok(()),
            Ok(r) if matches!(r.status.as_u16(), 404 | 422 | 501) => {
                Err(serde_json::from_slice::<Refusal>(&r.body)
                    .map(|r| r.error)
                    .unwrap_or_else(|_| format!("refused ({})", r.status)))
            }
            Ok(r) => Err(self.broke(path, unexpected(&r))),
            Err(e) => Err(self.broke(path, e)),
        }
    }
}

impl Fabric for RemoteFabric {
    fn kind(&self) -> FabricKind {
        FabricKind::Remote
    }

    fn config(&self) -> BTreeMap<String, String> {
        self.hello.config.clone()
    }

    fn grants(&self) -> Value {
        self.hello.grants.clone()
    }

    fn cluster(&self) -> &StaticCluster {
        &self.cluster
    }

    fn add_node(&self, node: &str) -> String {
        let body = AddMachine { node: node.into() };
        match self.call::<MachineAdded>(reqwest::Method::POST, "machines", Some(&body)) {
            Ok(added) => {
                for object in added.objects {
                    if let Err(e) = self.cluster.insert_object(object) {
                        return self.broke("machines", format!("an object it returned: {e}"));
                    }
                }
                added.machine
            }
            Err(e) => self.broke("machines", e),
        }
    }

    fn add_free_devices(&self, device_type: DeviceType, model: Option<&str>, n: usize) -> String {
        let body = AddDevices {
            device_type,
            model: model.map(str::to_string),
            count: n,
        };
        match self.call::<DevicesAdded>(reqwest::Method::POST, "devices", Some(&body)) {
            Ok(added) => added.model,
            Err(e) => self.broke("devices", e),
        }
    }

    fn inject(&self, fault: FaultKind, op: Op) {
        let (kind, delay_ms) = match fault {
            FaultKind::ServerError => (FaultKindWire::ServerError, None),
            FaultKind::MalformedBody => (FaultKindWire::MalformedBody, None),
            FaultKind::LostRequest => (FaultKindWire::LostRequest, None),
            FaultKind::LostReply => (FaultKindWire::LostReply, None),
            FaultKind::Slow(d) => (FaultKindWire::Slow, Some(d.as_millis() as u64)),
        };
        let op = match op {
            Op::Attach => FaultOp::Attach,
            Op::Detach => FaultOp::Detach,
            Op::First => FaultOp::Any,
        };
        let body = InjectFault { op, kind, delay_ms };
        if let Err(e) = self
            .send(reqwest::Method::POST, "faults", Some(&body))
            .and_then(expect_empty)
        {
            self.broke::<()>("faults", e);
        }
    }

    fn clear_faults(&self) {
        if let Err(e) = self
            .send(reqwest::Method::DELETE, "faults", None::<&()>)
            .and_then(expect_empty)
        {
            self.broke::<()>("faults", e);
        }
    }

    fn attached(&self, machine: &str) -> Vec<FabricDevice> {
        let path = format!("machines/{}/devices", url_segment(machine));
        match self.call::<Held>(reqwest::Method::GET, &path, None::<&()>) {
            Ok(held) => held
                .devices
                .into_iter()
                .map(|d| FabricDevice {
                    ids: d.ids,
                    ready: d.ready,
                })
                .collect(),
            Err(e) => self.broke(&path, e),
        }
    }

    fn set_slow(&self, delay: Option<Duration>) -> Result<(), String> {
        let body = SetSlow {
            delay_ms: delay.map(|d| d.as_millis() as u64),
        };
        self.refusable("slow", &body, reqwest::Method::PUT)
    }

    fn set_warning(&self, device_id: &str, warning: bool) -> Result<(), String> {
        let body = SetHealth {
            device: device_id.into(),
            health: if warning { Health::Warning } else { Health::Ok },
        };
        self.refusable("health", &body, reqwest::Method::PUT)
    }

    fn free(&self, device_type: DeviceType, model: &str) -> Result<u32, String> {
        let type_name = match device_type {
            DeviceType::Gpu => "gpu",
            DeviceType::CxlMemory => "cxlmemory",
        };
        let path = format!("free?type={type_name}&model={}", url_segment(model));
        match self.send(reqwest::Method::GET, &path, None::<&()>) {
            Ok(r) if r.status.is_success() => serde_json::from_slice::<FreeCount>(&r.body)
                .map(|f| f.count)
                .map_err(|e| self.broke("free", format!("the reply is no count: {e}"))),
            // A simulator of the protocol before `free` answers 404: it cannot say.
            Ok(r) if matches!(r.status.as_u16(), 404 | 501) => {
                Err(serde_json::from_slice::<Refusal>(&r.body)
                    .map(|r| r.error)
                    .unwrap_or_else(|_| {
                        format!("the simulator cannot count free devices ({})", r.status)
                    }))
            }
            Ok(r) => Err(self.broke("free", unexpected(&r))),
            Err(e) => Err(self.broke("free", e)),
        }
    }

    fn fails_jobs(&self) -> bool {
        self.hello.jobs
    }

    fn fail_next_job(&self, rollback: bool) -> Result<(), String> {
        self.refusable(
            "jobs/fail-next",
            &FailJob { rollback },
            reqwest::Method::POST,
        )
    }

    fn received(&self) -> Vec<FabricCall> {
        match self.call::<Received>(reqwest::Method::GET, "requests", None::<&()>) {
            Ok(r) => r
                .requests
                .into_iter()
                .map(|c| FabricCall {
                    seq: c.seq,
                    method: c.method,
                    path: c.path,
                    changes: c.changes,
                })
                .collect(),
            Err(e) => self.broke("requests", e),
        }
    }

    fn broken(&self) -> Option<String> {
        self.broken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// `base` as a URL whose relative joins stay under it (a trailing slash).
fn base_url(base: &str) -> Result<Url, SuiteError> {
    let mut url = Url::parse(base)
        .map_err(|e| SuiteError::Simulator(format!("--fabric-sim {base:?}: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(SuiteError::Simulator(format!(
            "--fabric-sim {base:?}: an http or https URL"
        )));
    }
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    Ok(url)
}

/// One path segment, percent-encoded.
fn url_segment(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

struct Reply {
    status: reqwest::StatusCode,
    body: Vec<u8>,
}

fn unexpected(r: &Reply) -> String {
    let body = String::from_utf8_lossy(&r.body[..r.body.len().min(300)]).into_owned();
    format!("status {} ({})", r.status, body.escape_debug())
}

fn expect_json<T: DeserializeOwned>(r: Reply) -> Result<T, String> {
    if !r.status.is_success() {
        return Err(unexpected(&r));
    }
    serde_json::from_slice(&r.body).map_err(|e| format!("its reply does not read: {e}"))
}

fn expect_empty(r: Reply) -> Result<(), String> {
    if r.status.is_success() {
        Ok(())
    } else {
        Err(unexpected(&r))
    }
}

type Job = (
    reqwest::Method,
    Url,
    Option<Value>,
    mpsc::Sender<Result<Reply, String>>,
);

/// An HTTP client on a thread of its own.
struct Client {
    jobs: mpsc::Sender<Job>,
}

impl Client {
    fn start() -> Result<Client, SuiteError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| SuiteError::Simulator(format!("the control client: {e}")))?;
        // A simulator is reached directly, never through a proxy the environment names.
        let http = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .no_proxy()
            .build()
            .map_err(|e| SuiteError::Simulator(format!("the control client: {e}")))?;
        std::thread::Builder::new()
            .name("fabric-sim-control".into())
            .spawn(move || {
                // Ends when the fabric (the only sender) is dropped.
                while let Ok((method, url, body, reply)) = rx.recv() {
                    let r = runtime.block_on(request(&http, method, url, body));
                    let _ = reply.send(r);
                }
            })
            .map_err(|e| SuiteError::Simulator(format!("the control client: {e}")))?;
        Ok(Client { jobs: tx })
    }

    fn call(
        &self,
        method: reqwest::Method,
        url: Url,
        body: Option<Value>,
    ) -> Result<Reply, String> {
        let (tx, rx) = mpsc::channel();
        self.jobs
            .send((method, url, body, tx))
            .map_err(|_| "the control client stopped".to_string())?;
        rx.recv_timeout(CALL_TIMEOUT + Duration::from_secs(5))
            .map_err(|_| "no reply in time".to_string())?
    }
}

async fn request(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: Url,
    body: Option<Value>,
) -> Result<Reply, String> {
    let mut req = http
        .request(method, url)
        .header("accept", "application/json");
    if let Some(body) = body {
        req = req.json(&body);
    }
    let mut reply = req.send().await.map_err(|e| with_causes(&e))?;
    let status = reply.status();
    let mut body = Vec::new();
    while let Some(chunk) = reply.chunk().await.map_err(|e| with_causes(&e))? {
        if body.len() + chunk.len() > MAX_REPLY {
            return Err(format!("a reply longer than {MAX_REPLY} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Reply { status, body })
}

/// An error with its causes (reqwest's own text names only the URL).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_keeps_its_path() {
        let b = base_url("http://127.0.0.1:9400/sim").unwrap();
        assert_eq!(
            b.join("faults").unwrap().as_str(),
            "http://127.0.0.1:9400/sim/faults"
        );
        let b = base_url("http://127.0.0.1:9400").unwrap();
        assert_eq!(
            b.join("reset").unwrap().as_str(),
            "http://127.0.0.1:9400/reset"
        );
        assert!(base_url("ftp://x/").is_err());
        assert!(base_url("not a url").is_err());
        assert_eq!(url_segment("m 1/2"), "m%201%2F2");
    }
}

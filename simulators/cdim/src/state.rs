//! The CDIM's state and its rules, free of HTTP: nodes (a CPU, the host-side fabric
//! adapter and the I/O-side fabric adapter it is paired with), GPUs in the pool, and
//! layout-apply jobs that connect or disconnect a GPU after a delay, or fail, or are
//! rolled back.
//!
//! The topology is the one the Go operator's NEC client walks
//! (`internal/cdi/nec/client.go`): a node's detected `sourceFabricAdapter` whose
//! `attribute.deviceSpecificInformation.status` is `eesv` links to a
//! `destinationFabricAdapter` (`eeio`); a GPU is connected to a node by a `connect`
//! procedure from that I/O adapter (source) to the GPU (destination), after which the
//! GPU links to the I/O adapter and belongs to the node.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

/// Device types as the configuration manager reports them.
pub const CPU_TYPE: &str = "CPU";
pub const GPU_TYPE: &str = "GPU";
pub const HOST_ADAPTER_TYPE: &str = "sourceFabricAdapter";
pub const IO_ADAPTER_TYPE: &str = "destinationFabricAdapter";

/// What a resource is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResourceKind {
    Cpu,
    /// The host-side fabric adapter of a node (ExpEther `eesv`).
    HostAdapter,
    /// The I/O-side fabric adapter paired with a node's host adapter (`eeio`).
    IoAdapter,
    Gpu,
}

impl ResourceKind {
    pub fn device_type(self) -> &'static str {
        match self {
            ResourceKind::Cpu => CPU_TYPE,
            ResourceKind::HostAdapter => HOST_ADAPTER_TYPE,
            ResourceKind::IoAdapter => IO_ADAPTER_TYPE,
            ResourceKind::Gpu => GPU_TYPE,
        }
    }
}

/// One resource of the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resource {
    pub id: String,
    pub kind: ResourceKind,
    pub model: String,
    /// `status.state`: `Enabled` unless a test says otherwise.
    pub state: String,
    /// `status.health`: `OK`, `Warning` or `Critical`.
    pub health: String,
    pub detected: bool,
    /// The node a CPU or an adapter belongs to.
    pub node: Option<String>,
    /// A GPU: the I/O adapter it is connected to. A host adapter: its I/O adapter. An
    /// I/O adapter: its host adapter.
    pub peer: Option<String>,
}

/// One node: a CPU with its adapters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub id: String,
    pub cpu: String,
    pub host_adapter: String,
    pub io_adapter: String,
}

/// A procedure's operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Connect,
    Disconnect,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Connect => "connect",
            Operation::Disconnect => "disconnect",
        }
    }
}

/// One procedure of a layout apply, as posted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Procedure {
    pub operation_id: u64,
    pub operation: Operation,
    /// The I/O adapter.
    pub source: String,
    /// The GPU.
    pub destination: String,
    pub dependencies: Vec<u64>,
}

/// `status` of a layout apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyStatus {
    InProgress,
    Completed,
    Failed,
    Canceled,
}

impl ApplyStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ApplyStatus::InProgress => "IN_PROGRESS",
            ApplyStatus::Completed => "COMPLETED",
            ApplyStatus::Failed => "FAILED",
            ApplyStatus::Canceled => "CANCELED",
        }
    }
}

/// How a layout apply is to end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Carry out the procedures (each is checked when it runs).
    Apply,
    /// End `FAILED` with this message, changing nothing.
    Fail(String),
    /// Carry out the procedures halfway through, then undo them: `CANCELED` with
    /// `rollbackStatus` `COMPLETED`.
    RollBack,
}

/// The outcome of one procedure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcedureResult {
    pub operation_id: u64,
    /// `COMPLETED`, `FAILED` or `SKIPPED`.
    pub status: &'static str,
    pub message: Option<String>,
}

/// One layout apply.
#[derive(Clone, Debug)]
pub struct Apply {
    pub id: String,
    pub procedures: Vec<Procedure>,
    pub status: ApplyStatus,
    pub rollback_status: Option<&'static str>,
    pub started_at: SystemTime,
    pub ended_at: Option<SystemTime>,
    pub results: Vec<ProcedureResult>,
    pub fate: Fate,
    /// When it ends.
    pub due: Instant,
    /// When a rolled-back apply has carried out its procedures (halfway).
    pub midway: Instant,
    /// The procedures a rolled-back apply carried out, to undo.
    pub done_midway: Vec<Procedure>,
}

/// Why a layout apply is refused at once.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// E40010: another apply is in progress.
    #[error("Already running. Cannot start multiple instances.")]
    AlreadyRunning,
    /// E40001: the request names what does not exist or cannot be connected.
    #[error("{0}")]
    Invalid(String),
}

#[derive(Default)]
pub struct State {
    pub resources: BTreeMap<String, Resource>,
    pub nodes: BTreeMap<String, Node>,
    pub applies: BTreeMap<String, Apply>,
    /// Apply ids in the order they were posted.
    pub apply_order: Vec<String>,
}

fn new_id() -> String {
    uuid::Uuid::new_v4().to_string().to_uppercase()
}

impl State {
    fn insert(&mut self, kind: ResourceKind, model: &str, node: Option<&str>) -> String {
        let id = new_id();
        self.resources.insert(
            id.clone(),
            Resource {
                id: id.clone(),
                kind,
                model: model.into(),
                state: "Enabled".into(),
                health: "OK".into(),
                detected: true,
                node: node.map(str::to_owned),
                peer: None,
            },
        );
        id
    }

    /// A node with its CPU and adapters; `id` when given, else a new uuid.
    pub fn add_node(&mut self, id: Option<&str>) -> Node {
        let id = id.map_or_else(new_id, str::to_owned);
        let cpu = self.insert(ResourceKind::Cpu, "Xeon", Some(&id));
        let host = self.insert(ResourceKind::HostAdapter, "ExpEther 40G host", Some(&id));
        let io = self.insert(ResourceKind::IoAdapter, "ExpEther 40G I/O", Some(&id));
        if let Some(r) = self.resources.get_mut(&host) {
            r.peer = Some(io.clone());
        }
        if let Some(r) = self.resources.get_mut(&io) {
            r.peer = Some(host.clone());
        }
        let node = Node {
            id: id.clone(),
            cpu,
            host_adapter: host,
            io_adapter: io,
        };
        self.nodes.insert(id, node.clone());
        node
    }

    /// A free GPU of `model` in the pool.
    pub fn add_gpu(&mut self, model: &str) -> String {
        self.insert(ResourceKind::Gpu, model, None)
    }

    /// The node a resource belongs to: its own, or for a GPU the node of the I/O
    /// adapter it is connected to.
    pub fn node_of(&self, r: &Resource) -> Option<String> {
        match r.kind {
            ResourceKind::Gpu => {
                let io = self.resources.get(r.peer.as_deref()?)?;
                io.node.clone()
            }
            _ => r.node.clone(),
        }
    }

    /// The GPUs connected to a node's I/O adapter.
    pub fn gpus_of(&self, node: &str) -> Vec<&Resource> {
        let Some(n) = self.nodes.get(node) else {
            return Vec::new();
        };
        self.resources
            .values()
            .filter(|r| r.kind == ResourceKind::Gpu && r.peer.as_deref() == Some(&n.io_adapter))
            .collect()
    }

    /// The resources linked to `r` (its `device.links`).
    pub fn links_of(&self, r: &Resource) -> Vec<(&'static str, String)> {
        let kind_of = |id: &str| {
            self.resources
                .get(id)
                .map_or(GPU_TYPE, |x| x.kind.device_type())
        };
        let gpus_on = |io: &str| -> Vec<(&'static str, String)> {
            self.resources
                .values()
                .filter(|g| g.kind == ResourceKind::Gpu && g.peer.as_deref() == Some(io))
                .map(|g| (GPU_TYPE, g.id.clone()))
                .collect()
        };
        match r.kind {
            ResourceKind::Gpu | ResourceKind::HostAdapter => {
                r.peer.iter().map(|p| (kind_of(p), p.clone())).collect()
            }
            ResourceKind::IoAdapter => {
                let mut links: Vec<_> = r.peer.iter().map(|p| (kind_of(p), p.clone())).collect();
                links.extend(gpus_on(&r.id));
                links
            }
            ResourceKind::Cpu => {
                let Some(node) = r.node.as_ref().and_then(|n| self.nodes.get(n)) else {
                    return Vec::new();
                };
                let mut links = vec![(HOST_ADAPTER_TYPE, node.host_adapter.clone())];
                links.extend(gpus_on(&node.io_adapter));
                links
            }
        }
    }

    /// Whether a layout apply is running (a second one is refused).
    pub fn running(&self) -> Option<&Apply> {
        self.applies
            .values()
            .find(|a| a.status == ApplyStatus::InProgress)
    }

    /// Starts a layout apply of `procedures` that ends after `delay` as `fate` says.
    pub fn post_apply(
        &mut self,
        procedures: Vec<Procedure>,
        now: Instant,
        delay: Duration,
        fate: Fate,
    ) -> Result<String, ApplyError> {
        if self.running().is_some() {
            return Err(ApplyError::AlreadyRunning);
        }
        for p in &procedures {
            self.check_names(p)?;
        }
        let id = loop {
            // A 10-character id of 0123456789abcdef, as CDIM's.
            let candidate: String = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
            if !self.applies.contains_key(&candidate) {
                break candidate;
            }
        };
        self.applies.insert(
            id.clone(),
            Apply {
                id: id.clone(),
                procedures,
                status: ApplyStatus::InProgress,
                rollback_status: None,
                started_at: SystemTime::now(),
                ended_at: None,
                results: Vec::new(),
                fate,
                due: now + delay,
                midway: now + delay / 2,
                done_midway: Vec::new(),
            },
        );
        self.apply_order.push(id.clone());
        Ok(id)
    }

    /// A procedure names an existing I/O adapter as source and an existing GPU as
    /// destination.
    fn check_names(&self, p: &Procedure) -> Result<(), ApplyError> {
        match self.resources.get(&p.source) {
            Some(r) if r.kind == ResourceKind::IoAdapter => {}
            Some(r) => {
                return Err(ApplyError::Invalid(format!(
                    "procedure {}: sourceDeviceID {} is a {}, not a {IO_ADAPTER_TYPE}",
                    p.operation_id,
                    p.source,
                    r.kind.device_type()
                )));
            }
            None => {
                return Err(ApplyError::Invalid(format!(
                    "procedure {}: sourceDeviceID {} does not exist",
                    p.operation_id, p.source
                )));
            }
        }
        match self.resources.get(&p.destination) {
            Some(r) if r.kind == ResourceKind::Gpu => Ok(()),
            Some(r) => Err(ApplyError::Invalid(format!(
                "procedure {}: destinationDeviceID {} is a {}, which this simulator does not connect",
                p.operation_id,
                p.destination,
                r.kind.device_type()
            ))),
            None => Err(ApplyError::Invalid(format!(
                "procedure {}: destinationDeviceID {} does not exist",
                p.operation_id, p.destination
            ))),
        }
    }

    /// Carries out one procedure, or says why it cannot run.
    fn execute(&mut self, p: &Procedure) -> Result<(), String> {
        let gpu = self
            .resources
            .get(&p.destination)
            .ok_or_else(|| format!("device {} does not exist", p.destination))?;
        match p.operation {
            Operation::Connect => {
                if let Some(io) = &gpu.peer {
                    return Err(format!(
                        "device {} is already connected to {io}",
                        p.destination
                    ));
                }
            }
            Operation::Disconnect => {
                if gpu.peer.as_deref() != Some(p.source.as_str()) {
                    return Err(format!(
                        "device {} is not connected to {}",
                        p.destination, p.source
                    ));
                }
            }
        }
        if let Some(g) = self.resources.get_mut(&p.destination) {
            g.peer = match p.operation {
                Operation::Connect => Some(p.source.clone()),
                Operation::Disconnect => None,
            };
        }
        Ok(())
    }

    /// The inverse of a procedure carried out.
    fn undo(&mut self, p: &Procedure) {
        if let Some(g) = self.resources.get_mut(&p.destination) {
            g.peer = match p.operation {
                Operation::Connect => None,
                Operation::Disconnect => Some(p.source.clone()),
            };
        }
    }

    /// Carries out the procedures in order, stopping at the first that cannot run.
    fn run_procedures(
        &mut self,
        procedures: &[Procedure],
    ) -> (Vec<ProcedureResult>, Vec<Procedure>) {
        let mut results = Vec::new();
        let mut done = Vec::new();
        let mut failed = false;
        for p in procedures {
            if failed {
                results.push(ProcedureResult {
                    operation_id: p.operation_id,
                    status: "SKIPPED",
                    message: None,
                });
                continue;
            }
            match self.execute(p) {
                Ok(()) => {
                    done.push(p.clone());
                    results.push(ProcedureResult {
                        operation_id: p.operation_id,
                        status: "COMPLETED",
                        message: None,
                    });
                }
                Err(m) => {
                    failed = true;
                    results.push(ProcedureResult {
                        operation_id: p.operation_id,
                        status: "FAILED",
                        message: Some(m),
                    });
                }
            }
        }
        (results, done)
    }

    /// Moves the running applies on to `now`.
    pub fn advance(&mut self, now: Instant) {
        let ids: Vec<String> = self
            .applies
            .values()
            .filter(|a| a.status == ApplyStatus::InProgress)
            .map(|a| a.id.clone())
            .collect();
        for id in ids {
            self.advance_one(&id, now);
        }
    }

    fn advance_one(&mut self, id: &str, now: Instant) {
        let Some(apply) = self.applies.get(id).cloned() else {
            return;
        };
        if apply.fate == Fate::RollBack && now >= apply.midway && apply.results.is_empty() {
            let (results, done) = self.run_procedures(&apply.procedures);
            if let Some(a) = self.applies.get_mut(id) {
                a.results = results;
                a.done_midway = done;
            }
        }
        if now < apply.due {
            return;
        }
        let (status, rollback, results) = match &apply.fate {
            Fate::Apply => {
                let (results, _) = self.run_procedures(&apply.procedures);
                let failed = results.iter().any(|r| r.status == "FAILED");
                let status = if failed {
                    ApplyStatus::Failed
                } else {
                    ApplyStatus::Completed
                };
                (status, None, results)
            }
            Fate::Fail(message) => {
                let results = apply
                    .procedures
                    .iter()
                    .enumerate()
                    .map(|(i, p)| ProcedureResult {
                        operation_id: p.operation_id,
                        status: if i == 0 { "FAILED" } else { "SKIPPED" },
                        message: (i == 0).then(|| message.clone()),
                    })
                    .collect();
                (ApplyStatus::Failed, None, results)
            }
            Fate::RollBack => {
                let done = self
                    .applies
                    .get(id)
                    .map(|a| a.done_midway.clone())
                    .unwrap_or_default();
                for p in done.iter().rev() {
                    self.undo(p);
                }
                let results = self
                    .applies
                    .get(id)
                    .map(|a| a.results.clone())
                    .unwrap_or_default();
                (ApplyStatus::Canceled, Some("COMPLETED"), results)
            }
        };
        if let Some(a) = self.applies.get_mut(id) {
            a.status = status;
            a.rollback_status = rollback;
            a.results = results;
            a.ended_at = Some(SystemTime::now());
            a.done_midway.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect(io: &str, gpu: &str) -> Vec<Procedure> {
        vec![Procedure {
            operation_id: 1,
            operation: Operation::Connect,
            source: io.into(),
            destination: gpu.into(),
            dependencies: Vec::new(),
        }]
    }

    #[test]
    fn a_connect_takes_effect_when_the_apply_ends_and_one_runs_at_a_time() {
        let mut s = State::default();
        let n = s.add_node(Some("node-a"));
        let g = s.add_gpu("A100");
        let now = Instant::now();
        let d = Duration::from_secs(2);
        let id = s
            .post_apply(connect(&n.io_adapter, &g), now, d, Fate::Apply)
            .unwrap();
        assert_eq!(id.len(), 10);
        assert_eq!(
            s.post_apply(connect(&n.io_adapter, &g), now, d, Fate::Apply),
            Err(ApplyError::AlreadyRunning)
        );
        s.advance(now + Duration::from_secs(1));
        assert_eq!(s.applies[&id].status, ApplyStatus::InProgress);
        assert!(s.gpus_of("node-a").is_empty());
        s.advance(now + d);
        assert_eq!(s.applies[&id].status, ApplyStatus::Completed);
        assert_eq!(s.gpus_of("node-a").len(), 1);
        assert_eq!(s.node_of(&s.resources[&g]).as_deref(), Some("node-a"));
        // Connecting it again fails when it runs: it is connected already.
        let again = s
            .post_apply(
                connect(&n.io_adapter, &g),
                now + d,
                Duration::ZERO,
                Fate::Apply,
            )
            .unwrap();
        s.advance(now + d);
        assert_eq!(s.applies[&again].status, ApplyStatus::Failed);
        assert_eq!(s.applies[&again].results[0].status, "FAILED");
    }

    #[test]
    fn failed_and_rolled_back_applies_leave_nothing_connected() {
        let mut s = State::default();
        let n = s.add_node(None);
        let g = s.add_gpu("A100");
        let now = Instant::now();
        let d = Duration::from_secs(4);
        let failed = s
            .post_apply(
                connect(&n.io_adapter, &g),
                now,
                d,
                Fate::Fail("link down".into()),
            )
            .unwrap();
        s.advance(now + d);
        assert_eq!(s.applies[&failed].status, ApplyStatus::Failed);
        assert!(s.resources[&g].peer.is_none());

        let later = now + d;
        let rolled = s
            .post_apply(connect(&n.io_adapter, &g), later, d, Fate::RollBack)
            .unwrap();
        // Halfway the GPU is connected, the apply still in progress...
        s.advance(later + d / 2);
        assert_eq!(s.resources[&g].peer.as_deref(), Some(n.io_adapter.as_str()));
        assert_eq!(s.applies[&rolled].status, ApplyStatus::InProgress);
        // ... and at the end it is taken back.
        s.advance(later + d);
        assert_eq!(s.applies[&rolled].status, ApplyStatus::Canceled);
        assert_eq!(s.applies[&rolled].rollback_status, Some("COMPLETED"));
        assert!(s.resources[&g].peer.is_none());
    }

    #[test]
    fn unknown_or_wrong_devices_are_refused_at_once() {
        let mut s = State::default();
        let n = s.add_node(None);
        let g = s.add_gpu("A100");
        let now = Instant::now();
        for (io, gpu) in [
            ("nope", g.as_str()),
            (n.host_adapter.as_str(), g.as_str()),
            (n.io_adapter.as_str(), "nope"),
            (n.io_adapter.as_str(), n.cpu.as_str()),
        ] {
            assert!(matches!(
                s.post_apply(connect(io, gpu), now, Duration::ZERO, Fate::Apply),
                Err(ApplyError::Invalid(_))
            ));
        }
        assert!(s.applies.is_empty());
    }
}

//! The operator's [`CommandRunner`] on simulated nodes: a command reaches a node only
//! through a pod the simulation runs there (a Ready driver pod or node agent), and is
//! interpreted against that node's state, which follows the fabric simulator.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use cro_operator::nodeops::{CommandRunner, ExecOutput, NodeOpsError, PodRef};
use fabric_sim::{DeviceStatus, FabricSim, Route};
use futures::future::BoxFuture;

use crate::node::{Gpu, NodeState, PodKind};

/// Called after each command took effect with its first 60 characters; when it returns
/// true the command never returns (a test kills the operator there).
pub type Hook = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// A pod of the simulation that commands can be run in.
#[derive(Debug, Clone)]
pub(crate) struct ExecPod {
    pub kind: PodKind,
    pub node: String,
    pub ready: bool,
}

#[derive(Default)]
pub(crate) struct World {
    pub nodes: BTreeMap<String, NodeState>,
    /// (namespace, name) → pod.
    pub pods: BTreeMap<(String, String), ExecPod>,
    /// Per GPU: the fabric's request count when it was last seen with drain marks.
    pub marked_at: BTreeMap<String, u64>,
    pub commands: Vec<(String, Vec<String>)>,
    pub unknown: Vec<String>,
    pub hook: Option<Hook>,
    /// Nodes served by a fabric other than the default one (a second node pool on its
    /// own fabric): node → that fabric.
    pub fabric_of: BTreeMap<String, FabricSim>,
    /// Nodes whose kubelet cannot be reached: every exec there fails as the API
    /// server's does when it cannot dial the kubelet.
    pub unreachable: BTreeSet<String>,
}

/// The simulated nodes, shared by the runner and the cluster-side simulation.
#[derive(Clone)]
pub struct SimNodes {
    /// The fabric of every node not given one of its own.
    pub(crate) fabric: FabricSim,
    pub(crate) world: Arc<Mutex<World>>,
}

impl SimNodes {
    pub(crate) fn new(fabric: FabricSim) -> Self {
        Self {
            fabric,
            world: Arc::default(),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, World> {
        self.world
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The fabric whose machine backs `node`.
    fn fabric_for(&self, world: &World, node: &str) -> FabricSim {
        world.fabric_of.get(node).unwrap_or(&self.fabric).clone()
    }

    /// Brings `node`'s GPUs up to date with the fabric (attached GPUs; ones that left
    /// the machine since they were drained forget that).
    pub(crate) fn refresh(&self, world: &mut World, node: &str) {
        let Some(state) = world.nodes.get(node) else {
            return;
        };
        let machine = state.machine.clone();
        let fabric = self.fabric_for(world, node);
        let attached: Vec<String> = fabric
            .machine_devices(&machine)
            .into_iter()
            .filter(|d| d.res_type == "gpu" && d.status == DeviceStatus::AddComplete)
            .map(|d| d.serial)
            .collect();
        let last = fabric.last_seq();
        let mut gone = BTreeSet::new();
        for gpu in state.drain_marks() {
            let seq = *world.marked_at.entry(gpu.clone()).or_insert(last);
            if Self::detached_since(&fabric, &gpu, seq) {
                gone.insert(gpu.clone());
                world.marked_at.remove(&gpu);
            }
        }
        if let Some(state) = world.nodes.get_mut(node) {
            state.refresh(&attached, &gone);
        }
    }

    /// Whether `fabric` was asked to detach `gpu` after request `seq`.
    fn detached_since(fabric: &FabricSim, gpu: &str, seq: u64) -> bool {
        let Some(device) = fabric.device(gpu) else {
            return true;
        };
        if device.machine.is_none() {
            return true;
        }
        fabric.any_request_since(seq, &[Route::FmDetach, Route::CmResize], |r| {
            let body = String::from_utf8_lossy(&r.body);
            body.contains(&device.res_uuid) || body.contains(gpu)
        })
    }

    pub fn set_busy(&self, gpu: &str, processes: &[&str]) {
        let mut w = self.lock();
        for node in w.nodes.values_mut() {
            node.set_busy(gpu, processes);
        }
    }

    /// Makes a process hold the GPU's `/dev/nvidia<minor>` (None: nobody).
    pub fn set_holder(&self, gpu: &str, holder: Option<&str>) {
        let mut w = self.lock();
        for node in w.nodes.values_mut() {
            node.set_holder(gpu, holder);
        }
    }

    /// GPUs the driver on `node` lists now.
    pub fn listed(&self, node: &str) -> Vec<String> {
        self.listed_gpus(node).into_iter().map(|g| g.uuid).collect()
    }

    /// Whether the fabric has a GPU on `node`'s machine (attached, driver or not).
    pub(crate) fn has_gpu(&self, node: &str) -> bool {
        let (machine, fabric) = {
            let w = self.lock();
            let Some(machine) = w.nodes.get(node).map(|n| n.machine.clone()) else {
                return false;
            };
            (machine, self.fabric_for(&w, node))
        };
        fabric
            .machine_devices(&machine)
            .iter()
            .any(|d| d.res_type == "gpu" && d.status == DeviceStatus::AddComplete)
    }

    pub(crate) fn listed_gpus(&self, node: &str) -> Vec<Gpu> {
        let mut w = self.lock();
        self.refresh(&mut w, node);
        w.nodes.get(node).map(NodeState::listed).unwrap_or_default()
    }

    /// Runs `f` on a node's state (for tests that set quirks or read modules).
    pub fn with_node<T>(&self, node: &str, f: impl FnOnce(&mut NodeState) -> T) -> Option<T> {
        let mut w = self.lock();
        self.refresh(&mut w, node);
        w.nodes.get_mut(node).map(f)
    }

    /// Makes `node`'s kubelet unreachable (or reachable again): commands there fail.
    pub fn set_unreachable(&self, node: &str, unreachable: bool) {
        let mut w = self.lock();
        if unreachable {
            w.unreachable.insert(node.to_owned());
        } else {
            w.unreachable.remove(node);
        }
    }

    pub fn set_hook(&self, hook: Option<Hook>) {
        self.lock().hook = hook;
    }

    /// Every command run so far, with its node.
    pub fn commands(&self) -> Vec<(String, Vec<String>)> {
        self.lock().commands.clone()
    }

    /// Commands no simulated node understood (each a test failure).
    pub fn unknown_commands(&self) -> Vec<String> {
        self.lock().unknown.clone()
    }

    fn exec(&self, pod: &PodRef, command: &[String]) -> Result<ExecOutput, NodeOpsError> {
        let mut w = self.lock();
        w.commands.push((pod.node.clone(), command.to_vec()));
        let key = (pod.namespace.clone(), pod.name.clone());
        let exec_err = |message: String| NodeOpsError::Exec {
            pod: pod.to_string(),
            message,
        };
        if w.unreachable.contains(&pod.node) {
            return Err(exec_err(format!(
                "error dialing backend: dial tcp {}:10250: i/o timeout",
                pod.node
            )));
        }
        let Some(target) = w.pods.get(&key).cloned() else {
            return Err(exec_err(format!("pods \"{}\" not found", pod.name)));
        };
        if target.node != pod.node {
            w.unknown.push(format!(
                "pod {pod} runs on {}, not on {}",
                target.node, pod.node
            ));
            return Err(exec_err("the pod is on another node".into()));
        }
        if !target.ready {
            return Err(exec_err(format!(
                "container not ready in pod {}: the driver is still starting",
                pod.name
            )));
        }
        self.refresh(&mut w, &target.node);
        let Some(node) = w.nodes.get_mut(&target.node) else {
            return Err(exec_err(format!("node {} is gone", target.node)));
        };
        let out = node.exec(target.kind, command);
        let marks = node.drain_marks();
        let last = self.fabric_for(&w, &target.node).last_seq();
        for gpu in marks {
            w.marked_at.entry(gpu).or_insert(last);
        }
        if out.unknown {
            w.unknown.push(out.stderr.clone());
        }
        Ok(ExecOutput {
            stdout: out.stdout,
            stderr: out.stderr,
            exit_code: out.code,
        })
    }
}

impl CommandRunner for SimNodes {
    fn run<'a>(
        &'a self,
        pod: &'a PodRef,
        command: &'a [String],
    ) -> BoxFuture<'a, Result<ExecOutput, NodeOpsError>> {
        Box::pin(async move {
            let answer = self.exec(pod, command);
            let hook = self.lock().hook.clone();
            if let Some(hook) = hook
                && hook(&command.join(" ").chars().take(60).collect::<String>())
            {
                std::future::pending::<()>().await;
            }
            answer
        })
    }
}

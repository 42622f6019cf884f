//! The operator's [`CommandRunner`] on simulated nodes: a command reaches a node only
//! through a pod the simulation runs there (a Ready driver pod or node agent), and is
//! interpreted against that node's state, which follows its simulated fabric.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use cro_operator::nodeops::{CommandRunner, ExecOutput, NodeOpsError, PodRef};
use fabric_sim::FabricSim;
use futures::future::BoxFuture;

use crate::fabric::NodeFabric;
use crate::node::{DriverKind, Gpu, NodeOptions, NodeState, PodKind};

/// Called after each command took effect with its first 60 characters; when it returns
/// true the command never returns (a test kills the operator there).
pub type Hook = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// How a command reached the simulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecPath {
    /// Through [`SimNodes`] as the operator's [`CommandRunner`], in the test process.
    InProcess,
    /// Through a real `pods/exec` into a stand-in pod, forwarded to the stand-in
    /// service ([`crate::Standin`]).
    StandIn,
    /// Through [`crate::StandinRunner`], the command runner of an operator in another
    /// process, forwarded to the stand-in service without a pod.
    Forwarded,
}

/// What [`SimNodes::answer`] made of a command.
pub(crate) struct Answered {
    pub result: Result<ExecOutput, NodeOpsError>,
    /// The test's hook asked for the command never to return.
    pub hold: bool,
}

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
    /// Per GPU: the fabric's mark ([`NodeFabric::mark`]) when it was last seen with
    /// drain marks.
    pub marked_at: BTreeMap<String, u64>,
    /// Every command interpreted, with its node and the path it came by.
    pub commands: Vec<(String, Vec<String>, ExecPath)>,
    pub unknown: Vec<String>,
    pub hook: Option<Hook>,
    /// Nodes served by a fabric other than the default one (a second node pool on its
    /// own fabric): node → that fabric.
    pub fabric_of: BTreeMap<String, Arc<dyn NodeFabric>>,
    /// Nodes whose kubelet cannot be reached: every exec there fails as the API
    /// server's does when it cannot dial the kubelet.
    pub unreachable: BTreeSet<String>,
}

/// The simulated nodes, shared by the runner and the cluster-side simulation.
#[derive(Clone)]
pub struct SimNodes {
    /// The fabric of every node not given one of its own.
    pub(crate) fabric: Arc<dyn NodeFabric>,
    pub(crate) world: Arc<Mutex<World>>,
}

impl SimNodes {
    /// Nodes whose GPUs follow the FTI fabric simulator `fabric` (unless a node is given
    /// a fabric of its own).
    pub fn new(fabric: FabricSim) -> Self {
        Self::on(Arc::new(fabric))
    }

    /// Nodes whose GPUs follow `fabric` (FTI's, CDIM's: [`crate::CdimNodes`]).
    pub fn on(fabric: Arc<dyn NodeFabric>) -> Self {
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

    /// Simulates `node` on `machine` of `fabric`, or of the default fabric if None (the
    /// Node object is the caller's).
    pub(crate) fn insert_node(
        &self,
        node: &str,
        machine: &str,
        driver: DriverKind,
        options: NodeOptions,
        fabric: Option<Arc<dyn NodeFabric>>,
    ) {
        let mut w = self.lock();
        match fabric {
            Some(fabric) => w.fabric_of.insert(node.to_owned(), fabric),
            None => w.fabric_of.remove(node),
        };
        w.nodes
            .insert(node.to_owned(), NodeState::new(machine, driver, options));
    }

    /// The fabric whose machine backs `node`.
    fn fabric_for(&self, world: &World, node: &str) -> Arc<dyn NodeFabric> {
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
        let attached = fabric.gpus_on(&machine);
        let last = fabric.mark();
        let mut gone = BTreeSet::new();
        for gpu in state.drain_marks() {
            let seq = *world.marked_at.entry(gpu.clone()).or_insert(last);
            if fabric.detached_since(&gpu, seq) {
                gone.insert(gpu.clone());
                world.marked_at.remove(&gpu);
            }
        }
        if let Some(state) = world.nodes.get_mut(node) {
            state.refresh(&attached, &gone);
        }
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
        !fabric.gpus_on(&machine).is_empty()
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

    /// Every command run so far, with its node, whichever path it came by.
    pub fn commands(&self) -> Vec<(String, Vec<String>)> {
        self.lock()
            .commands
            .iter()
            .map(|(node, argv, _)| (node.clone(), argv.clone()))
            .collect()
    }

    /// The commands that came by `path`, with their node: on a real node every command
    /// the operator sends must come [`ExecPath::StandIn`] and none in-process.
    pub fn commands_via(&self, path: ExecPath) -> Vec<(String, Vec<String>)> {
        self.lock()
            .commands
            .iter()
            .filter(|(_, _, p)| *p == path)
            .map(|(node, argv, _)| (node.clone(), argv.clone()))
            .collect()
    }

    /// Commands no simulated node understood (each a test failure).
    pub fn unknown_commands(&self) -> Vec<String> {
        self.lock().unknown.clone()
    }

    /// Runs `command` in `pod` and asks the test's hook about it: the one way a command
    /// is answered, in-process or through a stand-in pod.
    pub(crate) fn answer(&self, pod: &PodRef, command: &[String], path: ExecPath) -> Answered {
        let result = self.exec(pod, command, path);
        let hook = self.lock().hook.clone();
        let hold =
            hook.is_some_and(|hook| hook(&command.join(" ").chars().take(60).collect::<String>()));
        Answered { result, hold }
    }

    fn exec(
        &self,
        pod: &PodRef,
        command: &[String],
        path: ExecPath,
    ) -> Result<ExecOutput, NodeOpsError> {
        let mut w = self.lock();
        w.commands.push((pod.node.clone(), command.to_vec(), path));
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
        let last = self.fabric_for(&w, &target.node).mark();
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
            let answered = self.answer(pod, command, ExecPath::InProcess);
            if answered.hold {
                std::future::pending::<()>().await;
            }
            answered.result
        })
    }
}

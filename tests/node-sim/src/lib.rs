//! Simulated GPU nodes for cro's end-to-end tests, the demo and benchmarks.
//!
//! A node is backed by a machine of a simulated fabric ([`NodeFabric`]: the FTI fabric
//! simulator, or NEC CDIM through [`CdimNodes`]): the GPUs the fabric has attached to
//! that machine are the GPUs the node's driver sees. Around the nodes the
//! simulation plays what a real GPU cluster runs and the test API server lacks:
//!
//! - the GPU operator: a `ClusterPolicy`; with its driver enabled, the driver
//!   DaemonSet's pod appears on a node only once the node has a GPU, starts not Ready
//!   and becomes Ready after a delay (then nvidia-persistenced runs in it);
//! - with the driver on the host (the ClusterPolicy's driver disabled): cro's node agent
//!   DaemonSet and its pods, a host with `modinfo`, loadable kernel modules and a
//!   persistence daemon with its pid file and 15-character process name;
//! - device-plugin mode: the device plugin and DCGM DaemonSets, whose pods restart when
//!   their template is patched; DRA mode: the kubelet plugin (either chart naming),
//!   which publishes the node's ResourceSlice some time after it (re)starts and not
//!   otherwise;
//! - the operator's command runner ([`SimNodes`]), which interprets each command against
//!   the node's state; a command it does not know fails loudly and is recorded.
//!
//! Delays are short so tests stay fast, but never zero: the order of events is the
//! real one. See docs/node-operations.md for the behaviour simulated.
//!
//! The real-node tier keeps the interpreter and replaces the rest: on a one-node
//! cluster with a kubelet, [`RealNodeSide`] deploys the same DaemonSets as real pods of
//! the `node-standin` image, whose commands reach the [`Standin`] service and are
//! answered by the same [`SimNodes`].
//!
//! Operators in other processes share the simulation the same way: their command
//! runner, [`StandinRunner`], forwards each command to the test's [`Standin`]. The
//! [`replica`] module runs such an operator replica as a process (and lets its parent
//! kill, stop and continue it).

mod cluster;
mod fabric;
pub mod node;
mod real;
mod remote;
pub mod replica;
mod runner;
mod standin;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fabric_sim::FabricSim;
use tokio::task::JoinHandle;

/// The CDIM simulator the [`CdimNodes`] fabric runs over, for crates that use node-sim.
pub use cdim_sim;

pub use cluster::{
    AGENT_DS, DCGM_DS, DEVICE_PLUGIN_DS, DRA_NS, DRA_SLICE_DRIVER, DRIVER_DS, GPU_OPERATOR_NS,
    slice_api, slice_name,
};
pub use fabric::{CdimNodes, NodeFabric, UuidError};
pub use node::{DriverKind, NodeOptions, NodeState, Quirks};
pub use real::{GPU_PRESENT_LABEL, RealError, RealNodeSide};
pub use remote::{StandinRunner, StandinRunnerError};
pub use runner::{ExecPath, Hook, SimNodes};
pub use standin::{ExecFault, REFUSED, Role, Standin, Started, WORKLOAD_PROCESS};

/// Which chart generation of the NVIDIA DRA driver runs the kubelet plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraNaming {
    /// v0.2.0-era charts: pods `nvidia-dra-driver-gpu-kubelet-plugin-*`.
    V020,
    /// Later charts: pods `dra-driver-nvidia-gpu-kubelet-plugin-*`.
    Current,
}

/// How GPUs are exposed to pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposure {
    DevicePlugin,
    Dra(DraNaming),
}

#[derive(Debug, Clone)]
pub struct SimTimings {
    /// From the driver pod's start to Ready (building the driver takes minutes for real).
    pub driver_ready_after: Duration,
    /// From any other pod's start to Ready.
    pub pod_ready_after: Duration,
    /// From the DRA kubelet plugin's Ready to its ResourceSlice.
    pub slice_after_ready: Duration,
}

impl Default for SimTimings {
    fn default() -> Self {
        Self {
            driver_ready_after: Duration::from_millis(1500),
            pod_ready_after: Duration::from_millis(300),
            slice_after_ready: Duration::from_millis(1200),
        }
    }
}

/// The cluster's GPU setup.
#[derive(Debug, Clone)]
pub struct NodeSetup {
    pub driver: DriverKind,
    pub exposure: Exposure,
    pub timings: SimTimings,
    /// Host driver: whether cro's node agent DaemonSet is deployed.
    pub agent_daemonset: bool,
    /// Whether a ClusterPolicy exists (without one, the operator asks for the GPU operator).
    pub cluster_policy: bool,
}

impl NodeSetup {
    pub fn new(driver: DriverKind, exposure: Exposure) -> Self {
        Self {
            driver,
            exposure,
            timings: SimTimings::default(),
            agent_daemonset: true,
            cluster_policy: true,
        }
    }

    /// The GPU operator's container driver with the device plugin: the common setup.
    pub fn gpu_operator() -> Self {
        Self::new(DriverKind::GpuOperator, Exposure::DevicePlugin)
    }

    /// The DaemonSet of the DRA kubelet plugin in this setup, if DRA.
    pub fn dra_plugin_daemonset(&self) -> Option<&'static str> {
        match self.exposure {
            Exposure::Dra(DraNaming::V020) => Some("nvidia-dra-driver-gpu-kubelet-plugin"),
            Exposure::Dra(DraNaming::Current) => Some("dra-driver-nvidia-gpu-kubelet-plugin"),
            Exposure::DevicePlugin => None,
        }
    }

    /// The ClusterPolicy's `spec.driver.enabled`, if there is a ClusterPolicy.
    pub(crate) fn cluster_policy_driver(&self) -> Option<bool> {
        self.cluster_policy
            .then_some(self.driver == DriverKind::GpuOperator)
    }
}

/// The running simulation.
pub struct NodeSim {
    nodes: SimNodes,
    setup: NodeSetup,
    pods: Arc<Mutex<cluster::Pods>>,
    task: JoinHandle<()>,
}

impl NodeSim {
    /// Installs the setup's ClusterPolicy, namespaces and DaemonSets and starts
    /// simulating. `operator_ns` is where cro runs (its node agent lives there).
    pub async fn start(
        client: kube::Client,
        fabric: FabricSim,
        setup: NodeSetup,
        operator_ns: &str,
    ) -> Result<NodeSim, kube::Error> {
        Self::start_on(client, Arc::new(fabric), setup, operator_ns).await
    }

    /// [`NodeSim::start`] with nodes on any fabric (CDIM's: [`CdimNodes`]).
    pub async fn start_on(
        client: kube::Client,
        fabric: Arc<dyn NodeFabric>,
        setup: NodeSetup,
        operator_ns: &str,
    ) -> Result<NodeSim, kube::Error> {
        cluster::install(&client, &setup, operator_ns).await?;
        let nodes = SimNodes::on(fabric);
        let pods: Arc<Mutex<cluster::Pods>> = Arc::default();
        let task = {
            let (nodes, pods, setup, ns) = (
                nodes.clone(),
                pods.clone(),
                setup.clone(),
                operator_ns.to_owned(),
            );
            tokio::spawn(async move {
                let mut state = cluster::Pods::default();
                loop {
                    if let Err(e) = cluster::round(&client, &nodes, &mut state, &setup, &ns).await {
                        tracing::debug!(error = %e, "node simulation round failed; retrying");
                    }
                    {
                        let mut shared = pods.lock().unwrap_or_else(|e| e.into_inner());
                        shared.restarts = state.restarts.clone();
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        Ok(NodeSim {
            nodes,
            setup,
            pods,
            task,
        })
    }

    /// Simulates `node` on the fabric machine `machine` (the Node object is the
    /// caller's).
    pub fn add_node(&self, node: &str, machine: &str) {
        self.add_node_with(node, machine, NodeOptions::default());
    }

    pub fn add_node_with(&self, node: &str, machine: &str, options: NodeOptions) {
        self.nodes
            .insert_node(node, machine, self.setup.driver, options, None);
    }

    /// Simulates `node` on the machine `machine` of `fabric`, a fabric other than the
    /// one the simulation started with (a node pool served by its own fabric): the
    /// node's GPUs follow that fabric.
    pub fn add_node_on(&self, node: &str, machine: &str, options: NodeOptions, fabric: FabricSim) {
        self.nodes.insert_node(
            node,
            machine,
            self.setup.driver,
            options,
            Some(Arc::new(fabric)),
        );
    }

    /// The operator's command runner on these nodes.
    pub fn runner(&self) -> SimNodes {
        self.nodes.clone()
    }

    pub fn setup(&self) -> &NodeSetup {
        &self.setup
    }

    /// How often the pod of DaemonSet `daemonset` on `node` was restarted.
    pub fn restarts(&self, daemonset: &str, node: &str) -> usize {
        let pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        pods.restarts
            .get(&(daemonset.to_owned(), node.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// The DaemonSet of the DRA kubelet plugin in this setup, if DRA.
    pub fn dra_plugin_daemonset(&self) -> Option<&'static str> {
        self.setup.dra_plugin_daemonset()
    }
}

impl Drop for NodeSim {
    fn drop(&mut self) {
        self.task.abort();
    }
}

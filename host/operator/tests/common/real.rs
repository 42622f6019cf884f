//! The end-to-end environment on a real node (docs/real-node.md): a kubelet and
//! containerd run the GPU node software as real pods of the stand-in image; each command
//! the operator sends reaches them through the API server's `pods/exec`, and the
//! stand-in binaries in those pods forward it to the stand-in service here, which
//! answers from the node state that follows the fabric simulator. The kubelet itself
//! writes the node's `nvidia.com/gpu` capacity, from a real device plugin.

use std::sync::Arc;
use std::time::Duration;

use cro_operator::nodeops::{CommandRunner, KubeExecRunner, PodRef};
use fabric_sim::FabricSim;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::ResourceExt;
use kube_harness::real_node::{NODE_NAME, RealNode, STANDIN_IMAGE};
use node_sim::{NodeOptions, NodeSetup, RealNodeSide, SimNodes, Standin};

use super::{GPU_NS, OPERATOR_NS};

/// How long one node command may run before the operator gives up on it (the real
/// runner's default is 120 s; the exec-timeout test wants to see it end sooner).
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(20);

/// The real node and what runs on it. Field order is drop order: the cluster-side loop,
/// then the stand-in service, then the node (its teardown stops every pod).
pub struct RealWorld {
    pub side: RealNodeSide,
    pub standin: Standin,
    pub node: RealNode,
}

/// The real node before its GPU software is installed.
pub struct StartedNode {
    pub node: RealNode,
}

impl RealWorld {
    /// Starts the real node (waits for the machine-wide lock: one real node at a time).
    pub async fn start(_setup: &NodeSetup) -> StartedNode {
        let node = RealNode::start().await.expect("the real node");
        StartedNode { node }
    }

    /// Backs `node` with the fabric machine `machine`.
    pub fn add_node(&self, node: &str, machine: &str, options: NodeOptions) {
        self.side.add_node_with(node, machine, options);
    }
}

impl StartedNode {
    /// The node's API server.
    pub fn harness_arc(&self) -> Arc<kube_harness::Harness> {
        self.node.harness_arc()
    }

    /// Installs the setup's GPU software as real DaemonSets of the stand-in image and
    /// returns the world, the node state and the operator's runner (the real exec).
    pub async fn install(
        self,
        client: &Client,
        sim: &FabricSim,
        setup: NodeSetup,
    ) -> (RealWorld, SimNodes, Arc<dyn CommandRunner>) {
        let nodes = SimNodes::new(sim.clone());
        let standin = Standin::start(nodes.clone()).expect("the stand-in service");
        let side = RealNodeSide::start(
            client.clone(),
            nodes.clone(),
            &standin,
            setup,
            OPERATOR_NS,
            STANDIN_IMAGE,
        )
        .await
        .expect("the GPU node software as real pods");
        let runner: Arc<dyn CommandRunner> =
            Arc::new(KubeExecRunner::new(client.clone()).with_timeout(EXEC_TIMEOUT));
        (
            RealWorld {
                side,
                standin,
                node: self.node,
            },
            nodes,
            runner,
        )
    }
}

/// The GPU operator's driver pod `pod` on the real node, as the operator's runner
/// addresses it (its first container).
pub fn driver_pod_ref(pod: &Pod) -> PodRef {
    PodRef {
        namespace: GPU_NS.into(),
        name: pod.name_any(),
        node: NODE_NAME.into(),
        container: pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .map(|c| c.name.clone()),
    }
}

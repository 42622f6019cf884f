//! An environment for end-to-end tests: a real API server (kube-harness), the fabric
//! simulator, the real FTI component in the host runtime, the operator, and simulated
//! GPU nodes ([`node_sim`]) driven by the fabric simulator's state: a GPU operator (or
//! host drivers with cro's node agent), device or DRA plugins, and the commands the
//! operator runs on a node. [`Env::start_nec`] and [`Env::start_real_nec`] run the NEC
//! component from the Go `CDI_PROVIDER_TYPE=NEC` environment over the CDIM simulator
//! instead, the nodes following CDIM.

#![allow(dead_code)]

pub mod cdi;
pub mod fti;
pub mod nodes;
pub mod real;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cro_api::{
    ComposabilityRequest, ComposabilityRequestSpec, ComposableResource, LABEL_MANAGED_BY,
    ResourceType, ScalarResourceDetails,
};
use cro_operator::config::{OperatorConfig, ProviderSource, Timings};
use cro_operator::{DeviceProvider, Operator, OperatorError, compat};
use cro_operator::{NodeCache, RememberingCluster};
use cro_runtime::{Runtime, RuntimeOptions};
use fabric_sim::{FabricSim, SimConfig};
use k8s_openapi::api::core::v1::{Namespace, Node, Secret};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, ObjectMeta, Patch,
    PatchParams, PostParams,
};
use kube::{Client, ResourceExt};
use kube_harness::Harness;
use serde_json::json;
use tokio::task::JoinHandle;

use cro_operator::nodeops::{CommandRunner, KubeExecRunner};
use node_sim::cdim_sim::{self, CdimSim};
use node_sim::{CdimNodes, NodeFabric, RealNodeSide, Standin};
use nodes::{NodeOptions, NodeSetup, NodeSim, SimNodes};
use real::RealWorld;

pub const MODEL: &str = "NVIDIA-A100-PCIE-40GB";
pub const OPERATOR_NS: &str = "composable-resource-operator-system";
pub const GPU_NS: &str = "gpu-operator";
/// How long anything in these tests may take to converge on a loaded 2-core machine.
pub const CONVERGE: Duration = Duration::from_secs(90);

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "cro_operator=info,kube=warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Polls `check` until it returns Some, or panics after `timeout` with `what`.
/// xorshift64*: a seeded sequence without a dependency, so a failing run is replayed
/// from the seed it printed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }

    /// A duration between `min` and `max`, in whole milliseconds.
    pub fn between(&mut self, min: Duration, max: Duration) -> Duration {
        let span = max.saturating_sub(min).as_millis() as u64;
        min + Duration::from_millis(self.below(span.max(1)))
    }
}

pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The timings every in-process operator of the tests runs with; replica processes get
/// the same (node_sim::replica::ReplicaTimings::fast).
pub fn fast_timings() -> Timings {
    let mut timings = Timings::default();
    node_sim::replica::ReplicaTimings::fast().apply(&mut timings);
    timings
}

/// The operator task and the sender that stops it.
type Running = (
    JoinHandle<Result<(), OperatorError>>,
    tokio::sync::oneshot::Sender<()>,
);

/// Where the nodes' GPU software runs: simulated in this process against an API server
/// without kubelets, or as real pods on a real node ([`real`]).
pub enum NodeWorld {
    Sim(NodeSim),
    Real(Box<RealWorld>),
}

impl NodeWorld {
    /// How often the pod of DaemonSet `daemonset` on `node` was restarted.
    pub fn restarts(&self, daemonset: &str, node: &str) -> usize {
        match self {
            NodeWorld::Sim(sim) => sim.restarts(daemonset, node),
            NodeWorld::Real(real) => real.side.restarts(daemonset, node),
        }
    }

    /// The real node's world, if this is one (panics otherwise: a test's mistake).
    pub fn real(&self) -> &RealWorld {
        match self {
            NodeWorld::Real(real) => real,
            NodeWorld::Sim(_) => panic!("this test runs on simulated nodes"),
        }
    }

    /// The real node's world, to restart its kubelet.
    pub fn real_mut(&mut self) -> &mut RealWorld {
        match self {
            NodeWorld::Real(real) => real,
            NodeWorld::Sim(_) => panic!("this test runs on simulated nodes"),
        }
    }
}

pub struct Env {
    // Field order is drop order: the node world (its pods, then the node) before the API
    // server the harness holds.
    /// The nodes' cluster side: simulated (GPU operator, plugins, node agent as API
    /// objects) or real pods on a real node.
    pub node_sim: NodeWorld,
    pub harness: Arc<Harness>,
    pub client: Client,
    pub sim: FabricSim,
    /// The nodes' state (GPUs, processes, drain marks), following the fabric simulator.
    pub nodes: SimNodes,
    /// What the operator runs node commands through: the simulated nodes, or the real
    /// `pods/exec` of the API server on a real node.
    pub runner: Arc<dyn CommandRunner>,
    pub provider: Arc<dyn DeviceProvider>,
    /// Where [`Env::provider`]'s cluster view looks Nodes up first: the operator
    /// [`Env::start_operator`] starts lends its Node cache there.
    pub node_cache: NodeCache,
    pub config: OperatorConfig,
    operator: Option<Running>,
    pub api: FabricApi,
    /// The metrics of the operator started last.
    pub metrics: Option<Arc<cro_operator::Metrics>>,
    /// NEC CDIM ([`Env::start_nec`], [`Env::start_real_nec`]): the CDIM simulator as
    /// the nodes see it. Then the nodes are CDIM nodes and [`Env::sim`] serves nothing.
    pub nec: Option<Arc<CdimNodes>>,
    _ca_file: tempfile::NamedTempFile,
}

impl Env {
    pub async fn start() -> Env {
        Self::start_with(Harness::builder(), FabricApi::Fm).await
    }

    /// The common setup: the GPU operator's container driver and the device plugin.
    pub async fn start_with(builder: kube_harness::HarnessBuilder, api: FabricApi) -> Env {
        Self::start_setup(builder, api, NodeSetup::gpu_operator()).await
    }

    /// Nodes set up as `setup` says; the operator is configured for its exposure mode.
    pub async fn start_setup(
        builder: kube_harness::HarnessBuilder,
        api: FabricApi,
        setup: NodeSetup,
    ) -> Env {
        init_tracing();
        let builder = match api {
            FabricApi::Fm => builder,
            FabricApi::Cm => builder
                .crd(openshift_crd(
                    "machine.openshift.io",
                    "v1beta1",
                    "Machine",
                    "machines",
                    "Namespaced",
                ))
                .crd(openshift_crd(
                    "metal3.io",
                    "v1alpha1",
                    "BareMetalHost",
                    "baremetalhosts",
                    "Namespaced",
                )),
        };
        let harness = Arc::new(builder.start().await.expect("API server"));
        let client = harness.client().unwrap();
        let parts = Parts::prepare(&client, api, &setup).await;
        let node_sim = NodeSim::start(client.clone(), parts.sim.clone(), setup, OPERATOR_NS)
            .await
            .expect("node simulation");
        let nodes = node_sim.runner();
        parts.into_env(
            harness,
            client,
            nodes.clone(),
            Arc::new(nodes),
            NodeWorld::Sim(node_sim),
        )
    }

    /// The same environment on a real node (kubelet + containerd, see [`real`]): the
    /// setup's GPU software runs as real pods, and the operator's node commands go
    /// through the API server's real `pods/exec`.
    pub async fn start_real(setup: NodeSetup) -> Env {
        init_tracing();
        let world = RealWorld::start(&setup).await;
        let harness = world.node.harness_arc();
        let client = harness.client().unwrap();
        let parts = Parts::prepare(&client, FabricApi::Fm, &setup).await;
        let (world, nodes, runner) = world.install(&client, &parts.sim, setup).await;
        parts.into_env(
            harness,
            client,
            nodes,
            runner,
            NodeWorld::Real(Box::new(world)),
        )
    }

    /// `CDI_PROVIDER_TYPE=NEC`: the CDIM simulator, the NEC component loaded from the Go
    /// operator's environment as `cro run` loads it (with `NEC_PROVISIONAL_GPU_UUID` =
    /// `provisional_gpu_uuid` when given), and simulated nodes whose GPUs follow CDIM
    /// ([`CdimNodes`]). Nodes are CDIM nodes named by their `spec.providerID`.
    pub async fn start_nec(setup: NodeSetup, provisional_gpu_uuid: Option<&str>) -> Env {
        init_tracing();
        let harness = Arc::new(Harness::builder().start().await.expect("API server"));
        let client = harness.client().unwrap();
        let parts = Parts::prepare_nec(&client, &setup, provisional_gpu_uuid).await;
        let fabric: Arc<dyn NodeFabric> = parts.nec.clone().expect("the CDIM fabric");
        let node_sim = NodeSim::start_on(client.clone(), fabric, setup, OPERATOR_NS)
            .await
            .expect("node simulation");
        let nodes = node_sim.runner();
        parts.into_env(
            harness,
            client,
            nodes.clone(),
            Arc::new(nodes),
            NodeWorld::Sim(node_sim),
        )
    }

    /// [`Env::start_nec`] on the real node ([`Env::start_real`]): its GPUs follow CDIM.
    pub async fn start_real_nec(setup: NodeSetup, provisional_gpu_uuid: Option<&str>) -> Env {
        init_tracing();
        let started = RealWorld::start(&setup).await;
        let harness = started.harness_arc();
        let client = harness.client().unwrap();
        let parts = Parts::prepare_nec(&client, &setup, provisional_gpu_uuid).await;
        let fabric: Arc<dyn NodeFabric> = parts.nec.clone().expect("the CDIM fabric");
        // As `StartedNode::install` does, with the nodes on CDIM.
        let nodes = SimNodes::on(fabric);
        let standin = Standin::start(nodes.clone()).expect("the stand-in service");
        let side = RealNodeSide::start(
            client.clone(),
            nodes.clone(),
            &standin,
            setup,
            OPERATOR_NS,
            kube_harness::real_node::STANDIN_IMAGE,
        )
        .await
        .expect("the GPU node software as real pods");
        let runner: Arc<dyn CommandRunner> =
            Arc::new(KubeExecRunner::new(client.clone()).with_timeout(real::EXEC_TIMEOUT));
        let world = RealWorld {
            side,
            standin,
            node: started.node,
        };
        parts.into_env(
            harness,
            client,
            nodes,
            runner,
            NodeWorld::Real(Box::new(world)),
        )
    }

    /// The CDIM simulator as the nodes see it (panics outside an NEC environment).
    pub fn nec(&self) -> &CdimNodes {
        self.nec
            .as_deref()
            .expect("this test runs with CDI_PROVIDER_TYPE=NEC (Env::start_nec)")
    }
}

/// What every environment has before its nodes: the fabric simulator, the namespaces,
/// the credentials Secret, the FTI component loaded as `cro run` loads it.
struct Parts {
    sim: FabricSim,
    provider: Arc<dyn DeviceProvider>,
    node_cache: NodeCache,
    config: OperatorConfig,
    api: FabricApi,
    ca_file: tempfile::NamedTempFile,
    nec: Option<Arc<CdimNodes>>,
}

impl Parts {
    async fn prepare(client: &Client, api: FabricApi, setup: &NodeSetup) -> Parts {
        let client = client.clone();
        let sim = FabricSim::start(SimConfig::default()).unwrap();

        for ns in [OPERATOR_NS, GPU_NS] {
            let api: Api<Namespace> = Api::all(client.clone());
            let obj = Namespace {
                metadata: ObjectMeta {
                    name: Some(ns.into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            api.create(&PostParams::default(), &obj).await.unwrap();
        }
        let creds = sim.credentials();
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(compat::CREDENTIALS_SECRET.into()),
                namespace: Some(OPERATOR_NS.into()),
                ..Default::default()
            },
            string_data: Some(BTreeMap::from([
                ("username".to_string(), creds.username.clone()),
                ("password".to_string(), creds.password.clone()),
                ("client_id".to_string(), creds.client_id.clone()),
                ("client_secret".to_string(), creds.client_secret.clone()),
                ("realm".to_string(), sim.realm().to_string()),
            ])),
            ..Default::default()
        };
        Api::<Secret>::namespaced(client.clone(), OPERATOR_NS)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();

        // The provider spec comes from the Go operator's environment, as in a migrated
        // deployment.
        let ca_file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(ca_file.path(), sim.ca_pem()).unwrap();
        let component = cro_test_support::component("fti-provider");
        let mut env: BTreeMap<&str, String> = BTreeMap::from([
            ("CDI_PROVIDER_TYPE", "FTI_CDI".to_string()),
            ("FTI_CDI_API_TYPE", api.as_str().to_string()),
            ("FTI_CDI_ENDPOINT", sim.endpoint()),
            ("FTI_CDI_TENANT_ID", sim.tenant_id().to_string()),
            ("CRO_FTI_CA_FILE", ca_file.path().display().to_string()),
            ("CRO_FTI_COMPONENT", component.display().to_string()),
        ]);
        if api == FabricApi::Cm {
            env.insert("FTI_CDI_CLUSTER_ID", sim.cluster_id().to_string());
            let ns = Namespace {
                metadata: ObjectMeta {
                    name: Some(MACHINE_NS.into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &ns)
                .await
                .unwrap();
        }
        let spec = compat::fti_spec_from_env(|k| env.get(k).cloned())
            .unwrap()
            .unwrap();
        let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
        // As `cro run` loads it: Nodes deleted later are still found through the
        // machines resources recorded.
        // Its Node lookups answered from the operator's Node cache, as `cro run` does.
        let node_cache = NodeCache::default();
        let cluster = RememberingCluster::of_api_server(client.clone(), node_cache.clone());
        let provider = runtime.load(&spec, Arc::new(cluster)).await.unwrap();

        let mut config = OperatorConfig::new(ProviderSource::GoEnvironment);
        config.credentials = spec.grants.secret.clone();
        config.timings = fast_timings();
        config.namespace = OPERATOR_NS.to_owned();
        if let nodes::Exposure::Dra(_) = setup.exposure {
            config.mode = cro_operator::nodeops::ExposureMode::Dra;
        }
        Parts {
            sim,
            provider: Arc::new(provider),
            node_cache,
            config,
            api,
            ca_file,
            nec: None,
        }
    }

    /// The NEC parts: the CDIM simulator (its real apply delay), the namespaces, and the
    /// NEC component loaded from the Go operator's `CDI_PROVIDER_TYPE=NEC` environment
    /// through `compat::spec_from_env`, as `cro run` loads it. No Secret: CDIM takes no
    /// credentials. The FTI simulator of [`Env::sim`] runs with no machine.
    async fn prepare_nec(
        client: &Client,
        setup: &NodeSetup,
        provisional_gpu_uuid: Option<&str>,
    ) -> Parts {
        let cdim = CdimSim::start(cdim_sim::SimConfig::default()).expect("the CDIM simulator");
        for ns in [OPERATOR_NS, GPU_NS] {
            let obj = Namespace {
                metadata: ObjectMeta {
                    name: Some(ns.into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &obj)
                .await
                .unwrap();
        }
        let component = cro_test_support::component("nec-provider");
        let mut env: BTreeMap<&str, String> = BTreeMap::from([
            ("CDI_PROVIDER_TYPE", "NEC".to_string()),
            ("NEC_CDIM_IP", cdim.ip()),
            (
                "CONFIGURATION_MANAGER_PORT",
                cdim.configuration_manager_port().to_string(),
            ),
            ("LAYOUT_APPLY_PORT", cdim.layout_apply_port().to_string()),
            ("CRO_NEC_COMPONENT", component.display().to_string()),
        ]);
        if let Some(uuid) = provisional_gpu_uuid {
            env.insert("NEC_PROVISIONAL_GPU_UUID", uuid.to_string());
        }
        let spec = compat::spec_from_env(|k| env.get(k).cloned())
            .unwrap()
            .expect("CDI_PROVIDER_TYPE is set");
        assert_eq!(
            spec.name, "nec",
            "CDI_PROVIDER_TYPE=NEC runs the NEC component"
        );
        let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
        // Its Node lookups answered from the operator's Node cache, as `cro run` does.
        let node_cache = NodeCache::default();
        let cluster = RememberingCluster::of_api_server(client.clone(), node_cache.clone());
        let provider = runtime.load(&spec, Arc::new(cluster)).await.unwrap();

        let mut config = OperatorConfig::new(ProviderSource::GoEnvironment);
        config.credentials = spec.grants.secret.clone();
        config.timings = fast_timings();
        config.namespace = OPERATOR_NS.to_owned();
        if let nodes::Exposure::Dra(_) = setup.exposure {
            config.mode = cro_operator::nodeops::ExposureMode::Dra;
        }
        Parts {
            sim: FabricSim::start(SimConfig::default()).unwrap(),
            provider: Arc::new(provider),
            node_cache,
            config,
            api: FabricApi::Fm,
            ca_file: tempfile::NamedTempFile::new().unwrap(),
            nec: Some(CdimNodes::new(cdim)),
        }
    }

    fn into_env(
        self,
        harness: Arc<Harness>,
        client: Client,
        nodes: SimNodes,
        runner: Arc<dyn CommandRunner>,
        node_sim: NodeWorld,
    ) -> Env {
        Env {
            node_sim,
            harness,
            client,
            sim: self.sim,
            nodes,
            runner,
            provider: self.provider,
            node_cache: self.node_cache,
            config: self.config,
            operator: None,
            api: self.api,
            metrics: None,
            nec: self.nec,
            _ca_file: self.ca_file,
        }
    }
}

impl Env {
    /// A worker node backed by a simulator machine, simulated as the setup says (its
    /// driver pod, if any, comes once it has a GPU). `cpu` is its capacity and
    /// allocatable CPU.
    pub async fn add_node(&self, name: &str, cpu: &str) -> String {
        self.add_node_with(name, cpu, cpu, NodeOptions::default())
            .await
    }

    /// A worker node whose capacity and allocatable CPU differ, with node options.
    pub async fn add_node_with(
        &self,
        name: &str,
        capacity_cpu: &str,
        allocatable_cpu: &str,
        options: NodeOptions,
    ) -> String {
        self.add_node_on(name, capacity_cpu, allocatable_cpu, options, None)
            .await
    }

    /// A worker node backed by a machine of `fabric`, a fabric simulator other than
    /// [`Env::sim`] (a node pool served by its own fabric and provider); the simulated
    /// node's GPUs follow that fabric.
    pub async fn add_node_on_fabric(&self, name: &str, cpu: &str, fabric: &FabricSim) -> String {
        self.add_node_on(name, cpu, cpu, NodeOptions::default(), Some(fabric))
            .await
    }

    async fn add_node_on(
        &self,
        name: &str,
        capacity_cpu: &str,
        allocatable_cpu: &str,
        options: NodeOptions,
        fabric: Option<&FabricSim>,
    ) -> String {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let (machine, node) = match &self.nec {
            // NEC: a CDIM node, named by the Node's providerID verbatim (as Go did).
            Some(nec) => {
                assert!(fabric.is_none(), "an NEC environment has one fabric: CDIM");
                let machine = nec.sim().add_node().id;
                let node: Node = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
                    "spec": {"providerID": machine},
                }))
                .unwrap();
                (machine, node)
            }
            None => {
                let machine = uuid::Uuid::new_v4().to_string();
                fabric.unwrap_or(&self.sim).add_machine(&machine, name);
                let node = self.fti_node(name, &machine).await;
                (machine, node)
            }
        };
        nodes.create(&PostParams::default(), &node).await.unwrap();
        let quantities = |cpu: &str| -> BTreeMap<String, Quantity> {
            [
                ("cpu", cpu),
                ("memory", "64Gi"),
                ("ephemeral-storage", "100Gi"),
                ("pods", "110"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect()
        };
        nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"status": {"allocatable": quantities(allocatable_cpu),
                    "capacity": quantities(capacity_cpu)}}),
                ),
            )
            .await
            .unwrap();
        match (&self.node_sim, fabric) {
            (NodeWorld::Sim(sim), Some(fabric)) => {
                sim.add_node_on(name, &machine, options, fabric.clone())
            }
            (NodeWorld::Sim(sim), None) => sim.add_node_with(name, &machine, options),
            (NodeWorld::Real(_), _) => panic!("the real node is added with add_real_node"),
        }
        machine
    }

    /// The Node of an FTI machine: its providerID names the machine (FM), or OpenShift's
    /// Machine and BareMetalHost do (CM).
    async fn fti_node(&self, name: &str, machine: &str) -> Node {
        match self.api {
            FabricApi::Fm => serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
                "spec": {"providerID": format!("fsas-cdi://{machine}")},
            })),
            // OpenShift: Node → Machine → BareMetalHost → fabric machine uuid.
            FabricApi::Cm => {
                self.openshift_machine(name, machine).await;
                serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"},
                        "annotations": {"machine.openshift.io/machine": format!("{MACHINE_NS}/{name}-machine")}},
                }))
            }
        }
        .unwrap()
    }

    /// Backs the real node with a new machine of the fabric simulator: its provider id
    /// names the machine, and its GPUs follow the fabric. Returns the machine's uuid.
    /// In an NEC environment the machine is a new CDIM node, and the providerID its id.
    pub async fn add_real_node(&self, options: NodeOptions) -> String {
        let world = self.node_sim.real();
        let node = kube_harness::real_node::NODE_NAME;
        let (machine, provider_id) = match &self.nec {
            Some(nec) => {
                let machine = nec.sim().add_node().id;
                (machine.clone(), machine)
            }
            None => {
                let machine = uuid::Uuid::new_v4().to_string();
                self.sim.add_machine(&machine, node);
                (machine.clone(), format!("fsas-cdi://{machine}"))
            }
        };
        Api::<Node>::all(self.client.clone())
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"providerID": provider_id}})),
            )
            .await
            .unwrap();
        world.add_node(node, &machine, options);
        machine
    }

    async fn openshift_machine(&self, node: &str, machine_uuid: &str) {
        let dynamic = |group: &str, version: &str, kind: &str, plural: &str| {
            let gvk = GroupVersionKind::gvk(group, version, kind);
            Api::<DynamicObject>::namespaced_with(
                self.client.clone(),
                MACHINE_NS,
                &ApiResource::from_gvk_with_plural(&gvk, plural),
            )
        };
        let machines = dynamic("machine.openshift.io", "v1beta1", "Machine", "machines");
        let hosts = dynamic("metal3.io", "v1alpha1", "BareMetalHost", "baremetalhosts");
        let machine: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "machine.openshift.io/v1beta1", "kind": "Machine",
            "metadata": {"name": format!("{node}-machine"), "namespace": MACHINE_NS,
                "annotations": {"metal3.io/BareMetalHost": format!("{MACHINE_NS}/{node}-bmh")}},
        }))
        .unwrap();
        machines
            .create(&PostParams::default(), &machine)
            .await
            .unwrap();
        let host: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
            "metadata": {"name": format!("{node}-bmh"), "namespace": MACHINE_NS,
                "annotations": {"cluster-manager.cdi.io/machine": machine_uuid}},
        }))
        .unwrap();
        hosts.create(&PostParams::default(), &host).await.unwrap();
    }

    pub async fn delete_node(&self, name: &str) {
        Api::<Node>::all(self.client.clone())
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    /// Starts the operator; returns the bound probe and webhook addresses (if configured).
    pub async fn start_operator(
        &mut self,
    ) -> (Option<std::net::SocketAddr>, Option<std::net::SocketAddr>) {
        assert!(self.operator.is_none(), "operator already running");
        let mut operator = Operator::new(
            self.client.clone(),
            self.provider.clone(),
            self.runner.clone(),
            self.config.clone(),
        )
        .serving_node_lookups(self.node_cache.clone());
        let addrs = operator.bind().await.expect("listeners");
        self.metrics = Some(operator.metrics());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(operator.run_until(async {
            let _ = rx.await;
        }));
        self.operator = Some((task, tx));
        addrs
    }

    /// Starts an operator the test built (e.g. one running `CdiProvider` objects).
    pub async fn start_built_operator(
        &mut self,
        mut operator: Operator,
    ) -> (Option<std::net::SocketAddr>, Option<std::net::SocketAddr>) {
        assert!(self.operator.is_none(), "operator already running");
        let addrs = operator.bind().await.expect("listeners");
        self.metrics = Some(operator.metrics());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(operator.run_until(async {
            let _ = rx.await;
        }));
        self.operator = Some((task, tx));
        addrs
    }

    /// Stops the operator gracefully and returns how it ended.
    pub async fn stop_operator(&mut self) -> Result<(), OperatorError> {
        let (task, tx) = self.operator.take().expect("operator running");
        let _ = tx.send(());
        task.await.expect("operator task")
    }

    /// Waits until the operator ends by itself and returns how.
    pub async fn operator_exit(&mut self, timeout: Duration) -> Result<(), OperatorError> {
        let (task, tx) = self.operator.take().expect("operator running");
        let ended = tokio::time::timeout(timeout, task)
            .await
            .expect("the operator did not stop")
            .expect("operator task");
        drop(tx);
        ended
    }

    /// Kills the operator: its task is aborted wherever it is.
    pub async fn kill_operator(&mut self) {
        if let Some((task, _tx)) = self.operator.take() {
            task.abort();
            let _ = task.await;
        }
    }

    pub fn requests(&self) -> Api<ComposabilityRequest> {
        Api::all(self.client.clone())
    }

    pub fn resources(&self) -> Api<ComposableResource> {
        Api::all(self.client.clone())
    }

    pub async fn create_request(&self, name: &str, details: ScalarResourceDetails) {
        let req = ComposabilityRequest::new(name, ComposabilityRequestSpec { resource: details });
        self.requests()
            .create(&PostParams::default(), &req)
            .await
            .unwrap();
    }

    pub async fn set_request(&self, name: &str, details: &ScalarResourceDetails) {
        self.requests()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"resource": details}})),
            )
            .await
            .unwrap();
    }

    pub async fn resources_of(&self, request: &str) -> Vec<ComposableResource> {
        self.resources()
            .list(&ListParams::default().labels(&format!("{LABEL_MANAGED_BY}={request}")))
            .await
            .unwrap()
            .items
    }

    pub async fn request(&self, name: &str) -> Option<ComposabilityRequest> {
        self.requests().get_opt(name).await.unwrap()
    }

    /// Gpu serials the simulator has attached to `machine` now. NEC: the UUIDs the
    /// node shows for the GPUs CDIM has connected to the CDIM node `machine`.
    pub fn gpus_on(&self, machine: &str) -> Vec<String> {
        let mut v: Vec<String> = match &self.nec {
            Some(nec) => nec.gpus_on(machine),
            None => self
                .sim
                .machine_devices(machine)
                .into_iter()
                .map(|d| d.serial)
                .collect(),
        };
        v.sort();
        v
    }

    /// Waits until the request is Running with `size` Online devices.
    pub async fn wait_running(&self, name: &str, size: usize) -> ComposabilityRequest {
        eventually(
            &format!("{name} Running with {size} devices"),
            CONVERGE,
            || async {
                let r = self.request(name).await?;
                let s = r.status.as_ref()?;
                (s.state == cro_api::RequestState::Running
                    && s.scalar_resource.as_ref() == Some(&r.spec.resource)
                    && s.resources.len() == size
                    && self.resources_of(name).await.len() == size)
                    .then_some(r)
            },
        )
        .await
    }

    /// Asserts the fabric simulator has no device attached to any machine (NEC: CDIM has
    /// no GPU connected to any node): nothing a test did was left behind.
    pub async fn assert_nothing_attached(&self) {
        if let Some(nec) = &self.nec {
            eventually("no GPU connected on CDIM", CONVERGE, || async {
                let left: Vec<String> = nec
                    .sim()
                    .gpus()
                    .into_iter()
                    .filter(|g| g.node.is_some())
                    .map(|g| g.id)
                    .collect();
                left.is_empty().then_some(())
            })
            .await;
            return;
        }
        eventually("no device attached on the fabric", CONVERGE, || async {
            let left: Vec<String> = self
                .sim
                .machines()
                .iter()
                .flat_map(|m| self.sim.machine_devices(&m.uuid))
                .map(|d| d.serial)
                .collect();
            left.is_empty().then_some(())
        })
        .await;
    }

    /// Deletes a request and waits until it and its resources are gone.
    pub async fn delete_request(&self, name: &str) {
        self.requests()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
        eventually(&format!("{name} deleted"), CONVERGE, || async {
            (self.request(name).await.is_none() && self.resources_of(name).await.is_empty())
                .then_some(())
        })
        .await;
    }

    /// Asserts the runner saw only commands it knows.
    pub fn assert_known_commands(&self) {
        assert_eq!(self.nodes.unknown_commands(), Vec::<String>::new());
    }
}

/// Which FTI API the provider uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FabricApi {
    Fm,
    Cm,
}

impl FabricApi {
    fn as_str(self) -> &'static str {
        match self {
            FabricApi::Fm => "FM",
            FabricApi::Cm => "CM",
        }
    }
}

pub const MACHINE_NS: &str = "openshift-machine-api";

/// A CRD that accepts any object of the kind (stands in for OpenShift's and Metal3's).
fn openshift_crd(
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    scope: &str,
) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {"group": group, "scope": scope,
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase()},
            "versions": [{"name": version, "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .unwrap()
}

pub fn gpu(size: i64) -> ScalarResourceDetails {
    ScalarResourceDetails {
        resource_type: ResourceType::Gpu,
        model: MODEL.into(),
        size,
        force_detach: false,
        allocation_policy: Default::default(),
        target_node: None,
        other_spec: None,
    }
}

pub fn names(list: &[ComposableResource]) -> Vec<String> {
    let mut v: Vec<String> = list.iter().map(|r| r.name_any()).collect();
    v.sort();
    v
}

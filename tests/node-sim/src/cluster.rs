//! The Kubernetes side of the simulated nodes, playing the GPU operator, the DaemonSet
//! controller and the kubelets the test API server lacks: it creates and readies the
//! pods a real GPU cluster has, restarts them when asked, and publishes what a DRA
//! kubelet plugin would.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, ObjectMeta, Patch,
    PatchParams, PostParams,
};
use serde_json::{Value, json};

use crate::node::{DriverKind, PodKind};
use crate::runner::{ExecPod, SimNodes};
use crate::{DraNaming, Exposure, NodeSetup};

pub const GPU_OPERATOR_NS: &str = "gpu-operator";
pub const DRA_NS: &str = "nvidia-dra-driver-gpu";
/// The driver name the NVIDIA DRA kubelet plugin publishes its slices under.
pub const DRA_SLICE_DRIVER: &str = "gpu.nvidia.com";
pub const DRIVER_DS: &str = "nvidia-driver-daemonset";
pub const DEVICE_PLUGIN_DS: &str = "nvidia-device-plugin-daemonset";
pub const DCGM_DS: &str = "nvidia-dcgm";
pub const AGENT_DS: &str = "cro-node-agent";
const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";
const FIELD_MANAGER: &str = "node-sim";

/// Pods of one kind of the simulation on one node.
#[derive(Debug, Clone)]
struct SimPod {
    namespace: String,
    name: String,
    /// When it started; Ready once `ready_after` has passed since.
    started: Instant,
    ready_after: Duration,
    ready: bool,
    /// The DaemonSet template restart annotation it was created for.
    template: String,
    /// DRA plugin: whether it has published its slice since it started.
    published: bool,
}

/// The simulation's own bookkeeping of the pods it runs.
#[derive(Default)]
pub(crate) struct Pods {
    /// (daemonset, node) → its pod there.
    pods: BTreeMap<(String, String), SimPod>,
    /// (daemonset, node) → how often its pod there was restarted.
    pub restarts: BTreeMap<(String, String), usize>,
    /// DaemonSet → the status last written (with the DaemonSet's uid, as a re-created
    /// one starts without), so an unchanged one is not written again.
    statuses: BTreeMap<String, (Option<String>, Value)>,
    /// Node → the `nvidia.com/gpu` count its kubelet last wrote into the Node's status.
    gpus_reported: BTreeMap<String, usize>,
}

fn random_suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..5].to_owned()
}

fn pod_object(ds: &str, name: &str, ns: &str, node: &str, labels: Value, container: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels,
            "ownerReferences": []},
        "spec": {"nodeName": node, "containers": [{"name": container, "image": format!("sim/{ds}:1")}]},
    }))
    .unwrap_or_default()
}

fn daemonset_object(name: &str, ns: &str, labels: &Value) -> DaemonSet {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels},
                "spec": {"containers": [{"name": "main", "image": format!("sim/{name}:1")}]}},
        },
    }))
    .unwrap_or_default()
}

/// What the simulation runs, per DaemonSet.
#[derive(Debug, Clone)]
pub(crate) struct DsSpec {
    pub name: String,
    pub namespace: String,
    pub labels: Value,
    pub container: String,
    pub pod_prefix: String,
    pub kind: Option<PodKind>,
    /// Runs only on nodes that have a GPU (the driver: the GPU operator's node labels).
    pub needs_gpu: bool,
    pub ready_after: Duration,
    /// Publishes a ResourceSlice `slice_after` after it starts.
    pub dra: bool,
}

pub(crate) fn daemonsets(setup: &NodeSetup, operator_ns: &str) -> Vec<DsSpec> {
    let t = &setup.timings;
    let mut v = Vec::new();
    let ds = |name: &str, ns: &str, labels: Value, kind, needs_gpu, ready_after, dra| DsSpec {
        name: name.into(),
        namespace: ns.into(),
        labels,
        container: format!("{name}-ctr"),
        pod_prefix: name.into(),
        kind,
        needs_gpu,
        ready_after,
        dra,
    };
    match setup.driver {
        DriverKind::GpuOperator => v.push(ds(
            DRIVER_DS,
            GPU_OPERATOR_NS,
            json!({"app.kubernetes.io/component": "nvidia-driver", "app": DRIVER_DS}),
            Some(PodKind::Driver),
            true,
            t.driver_ready_after,
            false,
        )),
        DriverKind::Host => {
            if setup.agent_daemonset {
                v.push(ds(
                    AGENT_DS,
                    operator_ns,
                    json!({"app": AGENT_DS}),
                    Some(PodKind::Agent),
                    false,
                    t.pod_ready_after,
                    false,
                ));
            }
        }
    }
    match setup.exposure {
        Exposure::DevicePlugin => {
            for name in [DEVICE_PLUGIN_DS, DCGM_DS] {
                v.push(ds(
                    name,
                    GPU_OPERATOR_NS,
                    json!({"app": name}),
                    None,
                    false,
                    t.pod_ready_after,
                    false,
                ));
            }
        }
        Exposure::Dra(naming) => {
            let (prefix, label) = match naming {
                DraNaming::V020 => (
                    "nvidia-dra-driver-gpu-kubelet-plugin",
                    "nvidia-dra-driver-gpu",
                ),
                DraNaming::Current => (
                    "dra-driver-nvidia-gpu-kubelet-plugin",
                    "dra-driver-nvidia-gpu",
                ),
            };
            v.push(ds(
                prefix,
                DRA_NS,
                json!({"app.kubernetes.io/name": label}),
                None,
                false,
                t.pod_ready_after,
                true,
            ));
        }
    }
    v
}

/// Creates what a GPU cluster has before any node: namespaces, the ClusterPolicy and
/// the DaemonSets.
pub(crate) async fn install(
    client: &kube::Client,
    setup: &NodeSetup,
    operator_ns: &str,
) -> Result<(), kube::Error> {
    install_base(client, setup, operator_ns).await?;
    for spec in daemonsets(setup, operator_ns) {
        let api: Api<DaemonSet> = Api::namespaced(client.clone(), &spec.namespace);
        api.create(
            &PostParams::default(),
            &daemonset_object(&spec.name, &spec.namespace, &spec.labels),
        )
        .await?;
    }
    Ok(())
}

/// The namespaces and the setup's ClusterPolicy (with its CRD), each created unless it
/// exists: what [`install`] creates besides the DaemonSets.
pub(crate) async fn install_base(
    client: &kube::Client,
    setup: &NodeSetup,
    operator_ns: &str,
) -> Result<(), kube::Error> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in [GPU_OPERATOR_NS, DRA_NS, operator_ns] {
        if namespaces.get_opt(ns).await?.is_none() {
            let obj = Namespace {
                metadata: ObjectMeta {
                    name: Some(ns.into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            match namespaces.create(&PostParams::default(), &obj).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
    }
    if let Some(enabled) = setup.cluster_policy_driver() {
        install_cluster_policy(client, enabled).await?;
    }
    Ok(())
}

async fn install_cluster_policy(
    client: &kube::Client,
    driver_enabled: bool,
) -> Result<(), kube::Error> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "clusterpolicies.nvidia.com"},
        "spec": {"group": "nvidia.com", "scope": "Cluster",
            "names": {"kind": "ClusterPolicy", "plural": "clusterpolicies", "singular": "clusterpolicy", "listKind": "ClusterPolicyList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .unwrap_or_default();
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e),
    }
    let api = cluster_policy_api(client);
    let gvk = GroupVersionKind::gvk("nvidia.com", "v1", "ClusterPolicy");
    let mut policy = DynamicObject::new(
        CLUSTER_POLICY,
        &ApiResource::from_gvk_with_plural(&gvk, "clusterpolicies"),
    );
    policy.data = json!({"spec": {"driver": {"enabled": driver_enabled}}});
    // The CRD takes a moment to be served.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match api.create(&PostParams::default(), &policy).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => return Ok(()),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The name of the ClusterPolicy the simulation installs.
pub(crate) const CLUSTER_POLICY: &str = "cluster-policy";

pub(crate) fn cluster_policy_api(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("nvidia.com", "v1", "ClusterPolicy");
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "clusterpolicies"),
    )
}

/// The kubelet's part of a Ready device plugin: the node's `nvidia.com/gpu` capacity and
/// allocatable in the Node's status, written when the count changes, as a kubelet posts
/// its Node status. Real Nodes are written this way all the time (and more: conditions,
/// images), so an operator that wakes every device on a node for each Node write is
/// seen doing so here. The plugin counts the GPUs it listed when it started (a GPU
/// that came later shows after its restart).
async fn report_gpus(
    node_objects: &Api<k8s_openapi::api::core::v1::Node>,
    reported: &mut Option<usize>,
    nodes: &SimNodes,
    node: &str,
) -> Result<(), kube::Error> {
    let count = nodes.listed_gpus(node).len();
    if *reported == Some(count) {
        return Ok(());
    }
    let gpus = count.to_string();
    let patch = json!({"status": {
        "capacity": {"nvidia.com/gpu": gpus},
        "allocatable": {"nvidia.com/gpu": gpus},
    }});
    match node_objects
        .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {}
        // Deleted since this round listed it: the next round forgets its pods.
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e),
    }
    *reported = Some(count);
    Ok(())
}

/// One round of the simulation over every node.
pub(crate) async fn round(
    client: &kube::Client,
    nodes: &SimNodes,
    pods: &mut Pods,
    setup: &NodeSetup,
    operator_ns: &str,
) -> Result<(), kube::Error> {
    let names: Vec<String> = nodes.lock().nodes.keys().cloned().collect();
    let node_objects: Api<Node> = Api::all(client.clone());
    // One list of Nodes and one of each namespace's pods per round, not a read per node
    // and pod: with fifty nodes, reads one by one made a round take seconds, so a pod
    // became Ready seconds later than its delay says.
    let live_nodes: BTreeSet<String> = node_objects
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    let round = Round {
        client,
        nodes,
        setup,
        node_objects,
        live_nodes,
    };
    for spec in daemonsets(setup, operator_ns) {
        round.daemonset(&spec, &names, pods).await?;
    }
    Ok(())
}

/// What one round reads once and every DaemonSet's pass uses.
struct Round<'a> {
    client: &'a kube::Client,
    nodes: &'a SimNodes,
    setup: &'a NodeSetup,
    node_objects: Api<Node>,
    live_nodes: BTreeSet<String>,
}

/// One DaemonSet in a round: its API, its live pods and its template's restart stamp.
struct DsPass<'a> {
    spec: &'a DsSpec,
    pod_api: Api<Pod>,
    live_pods: BTreeMap<String, Pod>,
    template: String,
}

/// The numbers of a DaemonSet's status.
#[derive(Default)]
struct DsCounts {
    desired: usize,
    ready: usize,
    updated: usize,
}

/// How many nodes' kubelets act at once in a round. Real kubelets act each on its own
/// node, all at the same time; playing them one after another made a round that
/// (re)starts fifty pods take over a second, so a pod became Ready that much later than
/// its delay says. The bound keeps the simulation's burst of writes like a few dozen
/// kubelets', not unbounded.
const KUBELETS_AT_ONCE: usize = 32;

/// What the simulation keeps of one DaemonSet on one node, taken out of [`Pods`] while
/// that node's kubelet acts (each node's part is its own: nodes act concurrently).
#[derive(Default)]
struct NodePart {
    /// The DaemonSet's pod on the node.
    pod: Option<SimPod>,
    /// The `nvidia.com/gpu` count the node's kubelet last wrote.
    gpus_reported: Option<usize>,
    /// The pod was replaced in this round.
    restarted: bool,
    /// What the node adds to the DaemonSet's status.
    desired: bool,
    updated: bool,
    ready: bool,
}

impl Round<'_> {
    /// Plays one DaemonSet on every node (the nodes concurrently, as their kubelets
    /// would), then writes its status if it changed.
    async fn daemonset(
        &self,
        spec: &DsSpec,
        names: &[String],
        pods: &mut Pods,
    ) -> Result<(), kube::Error> {
        let ds_api: Api<DaemonSet> = Api::namespaced(self.client.clone(), &spec.namespace);
        let pod_api: Api<Pod> = Api::namespaced(self.client.clone(), &spec.namespace);
        let Some(ds) = ds_api.get_opt(&spec.name).await? else {
            return Ok(());
        };
        let live_pods: BTreeMap<String, Pod> = pod_api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|p| Some((p.metadata.name.clone()?, p)))
            .collect();
        let template = ds
            .spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(RESTARTED_AT))
            .cloned()
            .unwrap_or_default();
        let pass = DsPass {
            spec,
            pod_api,
            live_pods,
            template,
        };
        let parts: Vec<(String, NodePart)> = names
            .iter()
            .map(|node| {
                let key = (spec.name.clone(), node.clone());
                let part = NodePart {
                    pod: pods.pods.remove(&key),
                    gpus_reported: pods.gpus_reported.remove(node),
                    ..NodePart::default()
                };
                (node.clone(), part)
            })
            .collect();
        let done: Vec<(String, NodePart, Result<(), kube::Error>)> = futures::stream::iter(parts)
            .map(|(node, mut part)| {
                let pass = &pass;
                async move {
                    let r = self.node(pass, &node, &mut part).await;
                    (node, part, r)
                }
            })
            .buffer_unordered(KUBELETS_AT_ONCE)
            .collect()
            .await;
        // Every node's part goes back, whatever failed: a failure is retried next round.
        let mut counts = DsCounts::default();
        let mut failed = None;
        for (node, part, r) in done {
            let key = (spec.name.clone(), node.clone());
            counts.desired += usize::from(part.desired);
            counts.updated += usize::from(part.updated);
            counts.ready += usize::from(part.ready);
            if part.restarted {
                *pods.restarts.entry(key.clone()).or_default() += 1;
            }
            if let Some(pod) = part.pod {
                pods.pods.insert(key, pod);
            }
            if let Some(n) = part.gpus_reported {
                pods.gpus_reported.insert(node, n);
            }
            if let Err(e) = r {
                failed = Some(e);
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        write_ds_status(&ds_api, &ds, spec, &counts, pods).await
    }

    /// The DaemonSet's pod on one node: gone with its node, replaced when deleted or
    /// stale, created when missing, readied when its time has come.
    async fn node(
        &self,
        pass: &DsPass<'_>,
        node: &str,
        part: &mut NodePart,
    ) -> Result<(), kube::Error> {
        let spec = pass.spec;
        if !self.live_nodes.contains(node) {
            // The node is gone: so are its pods.
            if let Some(p) = part.pod.take() {
                forget(self.nodes, &p);
            }
            return Ok(());
        }
        // Node feature discovery labels a node once a NVIDIA PCI device is on it.
        let has_gpu = self.nodes.has_gpu(node);
        if spec.needs_gpu && !has_gpu && part.pod.is_none() {
            return Ok(());
        }
        part.desired = true;
        self.replace_stale(pass, part).await;
        if part.pod.is_none() {
            part.pod = Some(self.create_pod(pass, node).await?);
        }
        let Some(pod) = part.pod.as_mut() else {
            return Ok(());
        };
        part.updated = true;
        self.advance_pod(pass, pod, &mut part.gpus_reported, node)
            .await?;
        part.ready = pod.ready;
        Ok(())
    }

    /// A pod the operator deleted (or whose template changed) is replaced, as the
    /// kubelet and the DaemonSet controller would: this deletes it.
    async fn replace_stale(&self, pass: &DsPass<'_>, part: &mut NodePart) {
        let Some(existing) = part.pod.clone() else {
            return;
        };
        let deleted = pass
            .live_pods
            .get(&existing.name)
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some());
        if deleted || existing.template != pass.template {
            let _ = pass
                .pod_api
                .delete(&existing.name, &DeleteParams::default().grace_period(0))
                .await;
            part.pod = None;
            forget(self.nodes, &existing);
            part.restarted = true;
        }
    }

    /// Creates the DaemonSet's pod on `node`, Running but not Ready, and the pod a
    /// command can be exec'd in.
    async fn create_pod(&self, pass: &DsPass<'_>, node: &str) -> Result<SimPod, kube::Error> {
        let spec = pass.spec;
        let name = format!("{}-{}", spec.pod_prefix, random_suffix());
        let pod = pod_object(
            &spec.name,
            &name,
            &spec.namespace,
            node,
            spec.labels.clone(),
            &spec.container,
        );
        pass.pod_api.create(&PostParams::default(), &pod).await?;
        // Running but not Ready: the container starts, its probe has not passed.
        set_pod_status(&pass.pod_api, &name, false).await?;
        if let Some(kind) = spec.kind {
            self.nodes.lock().pods.insert(
                (spec.namespace.clone(), name.clone()),
                ExecPod {
                    kind,
                    node: node.to_string(),
                    ready: false,
                },
            );
        }
        Ok(SimPod {
            namespace: spec.namespace.clone(),
            name,
            started: Instant::now(),
            ready_after: spec.ready_after,
            ready: false,
            template: pass.template.clone(),
            published: false,
        })
    }

    /// Readies a pod whose delay has passed (the device plugin then reports the node's
    /// GPUs) and, for a DRA plugin, publishes its slice a while after.
    async fn advance_pod(
        &self,
        pass: &DsPass<'_>,
        pod: &mut SimPod,
        gpus_reported: &mut Option<usize>,
        node: &str,
    ) -> Result<(), kube::Error> {
        let spec = pass.spec;
        let became_ready = !pod.ready && pod.started.elapsed() >= pod.ready_after;
        if became_ready {
            self.start_containers(spec, pod, node);
            set_pod_status(&pass.pod_api, &pod.name, true).await?;
            pod.ready = true;
        }
        if became_ready && spec.name == DEVICE_PLUGIN_DS {
            report_gpus(&self.node_objects, gpus_reported, self.nodes, node).await?;
        }
        if spec.dra
            && pod.ready
            && !pod.published
            && pod.started.elapsed() >= pod.ready_after + self.setup.timings.slice_after_ready
        {
            // The plugin lists the node's GPUs once, when it starts: a GPU that
            // comes or goes later is seen only after a restart.
            let gpus = self.nodes.listed_gpus(node);
            publish_slice(self.client, node, &gpus).await?;
            pod.published = true;
        }
        Ok(())
    }

    /// The container is up (exec works, the driver's persistence daemon runs) before
    /// the kubelet reports Ready, as on a real node: the operator execs into the pod as
    /// soon as its watch shows Ready, which can be before that write returns.
    fn start_containers(&self, spec: &DsSpec, pod: &SimPod, node: &str) {
        let mut w = self.nodes.lock();
        if let Some(p) = w.pods.get_mut(&(pod.namespace.clone(), pod.name.clone())) {
            p.ready = true;
        }
        if spec.kind == Some(PodKind::Driver)
            && let Some(n) = w.nodes.get_mut(node)
        {
            n.start_persistenced();
        }
    }
}

/// Writes a DaemonSet's status unless the same was written to the same DaemonSet.
async fn write_ds_status(
    ds_api: &Api<DaemonSet>,
    ds: &DaemonSet,
    spec: &DsSpec,
    counts: &DsCounts,
    pods: &mut Pods,
) -> Result<(), kube::Error> {
    let DsCounts {
        desired,
        ready,
        updated,
    } = counts;
    let status = json!({"status": {
        "desiredNumberScheduled": desired, "currentNumberScheduled": desired,
        "numberReady": ready, "updatedNumberScheduled": updated,
        "numberAvailable": ready, "numberMisscheduled": 0,
    }});
    let written = (ds.metadata.uid.clone(), status);
    if pods.statuses.get(&spec.name) != Some(&written) {
        ds_api
            .patch_status(
                &spec.name,
                &PatchParams::default(),
                &Patch::Merge(&written.1),
            )
            .await?;
        pods.statuses.insert(spec.name.clone(), written);
    }
    Ok(())
}

fn forget(nodes: &SimNodes, pod: &SimPod) {
    nodes
        .lock()
        .pods
        .remove(&(pod.namespace.clone(), pod.name.clone()));
}

async fn set_pod_status(api: &Api<Pod>, name: &str, ready: bool) -> Result<(), kube::Error> {
    let status = if ready { "True" } else { "False" };
    let patch = json!({"status": {"phase": "Running",
        "conditions": [{"type": "Ready", "status": status}, {"type": "ContainersReady", "status": status}]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

pub fn slice_api(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceSlice");
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "resourceslices"),
    )
}

pub fn slice_name(node: &str) -> String {
    format!("{node}-{DRA_SLICE_DRIVER}")
}

/// Publishes `node`'s ResourceSlice listing `gpus`, as the NVIDIA DRA kubelet plugin
/// does when it starts.
pub(crate) async fn publish_slice(
    client: &kube::Client,
    node: &str,
    gpus: &[crate::node::Gpu],
) -> Result<(), kube::Error> {
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceSlice");
    let mut obj = DynamicObject::new(
        &slice_name(node),
        &ApiResource::from_gvk_with_plural(&gvk, "resourceslices"),
    );
    let devices: Vec<Value> = gpus
        .iter()
        .map(|g| {
            json!({"name": format!("gpu-{}", g.minor), "attributes": {
            "uuid": {"string": g.uuid}, "type": {"string": "gpu"},
            "pciBusID": {"string": g.bus_smi()}}})
        })
        .collect();
    obj.data = json!({"spec": {
        "driver": DRA_SLICE_DRIVER,
        "nodeName": node,
        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        "devices": devices,
    }});
    slice_api(client)
        .patch(
            &slice_name(node),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(obj),
        )
        .await
        .map(|_| ())
}

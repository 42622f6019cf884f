//! The cluster side of the simulated nodes on a REAL node (a kubelet and a container
//! runtime): where [`crate::NodeSim`] fakes pods as API objects, this deploys the same
//! DaemonSets as real ones whose pods run the `node-standin` image, and plays only what
//! such a cluster still lacks: node feature discovery's GPU label and the DRA kubelet
//! plugin's ResourceSlice. Commands the operator execs in those pods reach the
//! [`Standin`] service, which answers them with the same [`SimNodes`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fabric_sim::FabricSim;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::cluster::{self, CLUSTER_POLICY, DCGM_DS, DsSpec};
use crate::node::PodKind;
use crate::standin::{Role, Shared, Standin, Started};
use crate::{NodeOptions, NodeSetup, SimNodes};

/// The label node feature discovery puts on a node with an NVIDIA PCI device; the GPU
/// operator's driver DaemonSet selects it.
pub const GPU_PRESENT_LABEL: &str = "nvidia.com/gpu.present";
/// Where the stand-in image has its multi-call binary and the device plugin.
const STANDIN_BIN: &str = "/node-standin";
const DEVICE_PLUGIN_BIN: &str = "/cro-standin-device-plugin";
/// The kubelet's device plugin directory (its registration socket and the plugins').
const DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
const FIELD_MANAGER: &str = "node-sim-real";
const ROUND_EVERY: Duration = Duration::from_millis(200);
/// How long [`RealNodeSide::stop`] waits for the pods to go (each has 2 s of grace).
const STOP_WITHIN: Duration = Duration::from_secs(90);

#[derive(Debug, thiserror::Error)]
pub enum RealError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("still present {waited:?} after their deletion: {what}")]
    StillThere { what: String, waited: Duration },
}

/// What the loop saw, for the tests and for [`RealNodeSide::stop`].
#[derive(Default)]
struct Seen {
    /// (daemonset, node) → uids of its pods seen there.
    uids: BTreeMap<(String, String), BTreeSet<String>>,
    /// Nodes whose ResourceSlice was published.
    slices: BTreeSet<String>,
    /// Nodes labelled with [`GPU_PRESENT_LABEL`].
    labelled: BTreeSet<String>,
}

/// The loop's own memory.
#[derive(Default)]
struct Rounds {
    /// DRA plugin pod uid → when it was first seen Ready.
    ready_since: BTreeMap<String, Instant>,
    /// DRA plugin pod uids whose slice was published.
    published: BTreeSet<String>,
}

/// What the loop works with.
struct Side {
    client: kube::Client,
    nodes: SimNodes,
    standin: Arc<Shared>,
    setup: NodeSetup,
    specs: Vec<DsSpec>,
    seen: Arc<Mutex<Seen>>,
}

/// The simulated nodes' cluster side on a real node; the loop stops when dropped.
pub struct RealNodeSide {
    side: Arc<Side>,
    task: JoinHandle<()>,
}

fn lock(seen: &Mutex<Seen>) -> MutexGuard<'_, Seen> {
    seen.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl RealNodeSide {
    /// Installs the setup's namespaces and ClusterPolicy (as [`crate::NodeSim`] does)
    /// and its DaemonSets as real ones running `image`, and starts the loop. Pods reach
    /// `standin` at its URL over the host's network.
    pub async fn start(
        client: kube::Client,
        nodes: SimNodes,
        standin: &Standin,
        setup: NodeSetup,
        operator_ns: &str,
        image: &str,
    ) -> Result<RealNodeSide, kube::Error> {
        cluster::install_base(&client, &setup, operator_ns).await?;
        standin.set_timings(&setup.timings);
        let specs = cluster::daemonsets(&setup, operator_ns);
        for spec in &specs {
            let api: Api<DaemonSet> = Api::namespaced(client.clone(), &spec.namespace);
            // Applied, not created: a DaemonSet left by an earlier run is taken over.
            api.patch(
                &spec.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(daemonset_manifest(spec, image, standin.url())),
            )
            .await?;
        }
        let side = Arc::new(Side {
            client,
            nodes,
            standin: standin.shared(),
            setup,
            specs,
            seen: Arc::default(),
        });
        let task = {
            let side = side.clone();
            tokio::spawn(async move {
                let mut rounds = Rounds::default();
                loop {
                    if let Err(e) = side.round(&mut rounds).await {
                        tracing::debug!(error = %e, "real-node round failed; retrying");
                    }
                    tokio::time::sleep(ROUND_EVERY).await;
                }
            })
        };
        Ok(RealNodeSide { side, task })
    }

    /// Simulates `node` (the real Node's name) on the fabric machine `machine`.
    pub fn add_node(&self, node: &str, machine: &str) {
        self.add_node_with(node, machine, NodeOptions::default());
    }

    pub fn add_node_with(&self, node: &str, machine: &str, options: NodeOptions) {
        self.side
            .nodes
            .insert_node(node, machine, self.side.setup.driver, options, None);
    }

    /// Simulates `node` on `machine` of `fabric`, a fabric other than the nodes'.
    pub fn add_node_on(&self, node: &str, machine: &str, options: NodeOptions, fabric: FabricSim) {
        self.side.nodes.insert_node(
            node,
            machine,
            self.side.setup.driver,
            options,
            Some(Arc::new(fabric)),
        );
    }

    /// The simulated nodes (the operator itself runs commands through `pods/exec`).
    pub fn runner(&self) -> SimNodes {
        self.side.nodes.clone()
    }

    pub fn setup(&self) -> &NodeSetup {
        &self.side.setup
    }

    /// How often the pod of DaemonSet `daemonset` on `node` was replaced: the pod uids
    /// seen there, less the first.
    pub fn restarts(&self, daemonset: &str, node: &str) -> usize {
        lock(&self.side.seen)
            .uids
            .get(&(daemonset.to_owned(), node.to_owned()))
            .map_or(0, |uids| uids.len().saturating_sub(1))
    }

    /// The DaemonSet of the DRA kubelet plugin in this setup, if DRA.
    pub fn dra_plugin_daemonset(&self) -> Option<&'static str> {
        self.side.setup.dra_plugin_daemonset()
    }

    /// Stops the loop, deletes the DaemonSets and the ClusterPolicy (foreground), the
    /// ResourceSlices published and the GPU label, and waits until the DaemonSets and
    /// their pods are gone.
    pub async fn stop(self) -> Result<(), RealError> {
        self.task.abort();
        let side = &self.side;
        let foreground = DeleteParams::foreground();
        for spec in &side.specs {
            let api: Api<DaemonSet> = Api::namespaced(side.client.clone(), &spec.namespace);
            absent_ok(api.delete(&spec.name, &foreground).await)?;
        }
        if side.setup.cluster_policy_driver().is_some() {
            let api = cluster::cluster_policy_api(&side.client);
            absent_ok(api.delete(CLUSTER_POLICY, &foreground).await)?;
        }
        let (slices, labelled) = {
            let seen = lock(&side.seen);
            (seen.slices.clone(), seen.labelled.clone())
        };
        let slice_api = cluster::slice_api(&side.client);
        for node in slices {
            absent_ok(
                slice_api
                    .delete(&cluster::slice_name(&node), &DeleteParams::default())
                    .await,
            )?;
        }
        let node_api: Api<Node> = Api::all(side.client.clone());
        for node in labelled {
            absent_ok(label_gpu_present(&node_api, &node, false).await)?;
        }
        let deadline = Instant::now() + STOP_WITHIN;
        loop {
            let left = side.left_over().await?;
            if left.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(RealError::StillThere {
                    what: left.join(", "),
                    waited: STOP_WITHIN,
                });
            }
            tokio::time::sleep(ROUND_EVERY).await;
        }
    }
}

impl Drop for RealNodeSide {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A deletion's or patch's result, with "it is not there" counted as done.
fn absent_ok<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

async fn label_gpu_present(
    api: &Api<Node>,
    node: &str,
    present: bool,
) -> Result<Node, kube::Error> {
    let value = if present { json!("true") } else { Value::Null };
    let patch = json!({"metadata": {"labels": {GPU_PRESENT_LABEL: value}}});
    api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

/// The pod is being deleted or its containers have ended: nothing runs in it.
fn ended(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        || pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|phase| phase == "Succeeded" || phase == "Failed")
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn owned_by_daemonset(pod: &Pod, daemonset: &str) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet" && o.name == daemonset)
}

fn pod_node(pod: &Pod) -> Option<String> {
    pod.spec.as_ref().and_then(|s| s.node_name.clone())
}

impl Side {
    /// One look at the cluster: the GPU label, the pods seen, the pods gone, the DRA
    /// plugins' slices.
    async fn round(&self, rounds: &mut Rounds) -> Result<(), kube::Error> {
        // Taken before the pods are listed: every pod they name existed before the
        // list, so one missing from it is gone (not too new to be in it).
        let exec_pods: Vec<(String, String)> = self.nodes.lock().pods.keys().cloned().collect();
        let started = self.standin.started();
        self.play_feature_discovery().await?;
        let pods = Api::<Pod>::all(self.client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        let live: BTreeMap<(String, String), &Pod> = pods
            .iter()
            .filter_map(|p| Some(((p.metadata.namespace.clone()?, p.metadata.name.clone()?), p)))
            .collect();
        self.count(&pods);
        for (namespace, name) in exec_pods {
            let gone = live
                .get(&(namespace.clone(), name.clone()))
                .is_none_or(|p| ended(p));
            if gone {
                self.standin.pod_gone(&namespace, &name, None);
            }
        }
        for s in started.iter().filter(|s| !s.gone) {
            let pod = live
                .get(&(s.namespace.clone(), s.pod.clone()))
                .copied()
                .filter(|p| {
                    !ended(p) && (s.uid.is_empty() || p.metadata.uid.as_deref() == Some(&s.uid))
                });
            match pod {
                None => self.standin.pod_gone(&s.namespace, &s.pod, Some(&s.uid)),
                Some(pod) if s.role == Role::DraPlugin => self.dra_plugin(pod, s, rounds).await?,
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Node feature discovery (and GPU feature discovery when the last GPU leaves):
    /// a simulated node is labelled while the fabric has a GPU on its machine.
    async fn play_feature_discovery(&self) -> Result<(), kube::Error> {
        let simulated: BTreeSet<String> = self.nodes.lock().nodes.keys().cloned().collect();
        let api: Api<Node> = Api::all(self.client.clone());
        for node in api.list(&ListParams::default()).await?.items {
            let Some(name) = node.metadata.name.as_deref() else {
                continue;
            };
            if !simulated.contains(name) {
                continue;
            }
            let has_gpu = self.nodes.has_gpu(name);
            let labelled = node
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(GPU_PRESENT_LABEL))
                .is_some_and(|v| v == "true");
            if has_gpu != labelled {
                absent_ok(label_gpu_present(&api, name, has_gpu).await)?;
            }
            let mut seen = lock(&self.seen);
            if has_gpu {
                seen.labelled.insert(name.to_owned());
            } else {
                seen.labelled.remove(name);
            }
        }
        Ok(())
    }

    /// Records the uid of every pod of the setup's DaemonSets, per node.
    fn count(&self, pods: &[Pod]) {
        let mut seen = lock(&self.seen);
        for spec in &self.specs {
            for pod in pods.iter().filter(|p| {
                p.metadata.namespace.as_deref() == Some(spec.namespace.as_str())
                    && owned_by_daemonset(p, &spec.name)
            }) {
                let (Some(node), Some(uid)) = (pod_node(pod), pod.metadata.uid.clone()) else {
                    continue;
                };
                seen.uids
                    .entry((spec.name.clone(), node))
                    .or_default()
                    .insert(uid);
            }
        }
    }

    /// A DRA kubelet plugin that announced its start publishes its node's slice
    /// `slice_after_ready` after it became Ready, listing the GPUs of that moment, as
    /// the simulated one does after each (re)start.
    async fn dra_plugin(
        &self,
        pod: &Pod,
        started: &Started,
        rounds: &mut Rounds,
    ) -> Result<(), kube::Error> {
        let Some(uid) = pod.metadata.uid.clone() else {
            return Ok(());
        };
        if rounds.published.contains(&uid) || !ready(pod) {
            return Ok(());
        }
        let since = *rounds
            .ready_since
            .entry(uid.clone())
            .or_insert_with(Instant::now);
        if since.elapsed() < self.setup.timings.slice_after_ready {
            return Ok(());
        }
        let node = pod_node(pod).unwrap_or_else(|| started.node.clone());
        let gpus = self.nodes.listed_gpus(&node);
        cluster::publish_slice(&self.client, &node, &gpus).await?;
        rounds.published.insert(uid);
        lock(&self.seen).slices.insert(node);
        Ok(())
    }

    /// The DaemonSets and pods of the setup still in the cluster.
    async fn left_over(&self) -> Result<Vec<String>, kube::Error> {
        let mut left = Vec::new();
        for spec in &self.specs {
            let sets: Api<DaemonSet> = Api::namespaced(self.client.clone(), &spec.namespace);
            if sets.get_opt(&spec.name).await?.is_some() {
                left.push(format!("daemonset {}/{}", spec.namespace, spec.name));
            }
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &spec.namespace);
            for pod in pods.list(&ListParams::default()).await?.items {
                if owned_by_daemonset(&pod, &spec.name) {
                    left.push(format!(
                        "pod {}/{}",
                        spec.namespace,
                        pod.metadata.name.unwrap_or_default()
                    ));
                }
            }
        }
        Ok(left)
    }
}

fn role(spec: &DsSpec) -> Role {
    match spec.kind {
        Some(PodKind::Driver) => Role::Driver,
        Some(PodKind::Agent) => Role::Agent,
        None if spec.dra => Role::DraPlugin,
        None if spec.name == DCGM_DS => Role::Dcgm,
        None => Role::DevicePlugin,
    }
}

fn field_env(name: &str, path: &str) -> Value {
    json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}})
}

/// The real DaemonSet for `spec`: same name, namespace, labels and container name as
/// the simulated one, its pods running the stand-in image on the host's network.
pub(crate) fn daemonset_manifest(spec: &DsSpec, image: &str, standin_url: &str) -> Value {
    let role = role(spec);
    let mut env = vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("POD_UID", "metadata.uid"),
        field_env("NODE_NAME", "spec.nodeName"),
        json!({"name": "CRO_STANDIN_URL", "value": standin_url}),
    ];
    // Which interpreter answers the pod's commands: the driver container's or the
    // node agent's (none: nothing is exec'd there).
    match spec.kind {
        Some(PodKind::Driver) => env.push(json!({"name": "CRO_STANDIN_KIND", "value": "driver"})),
        Some(PodKind::Agent) => env.push(json!({"name": "CRO_STANDIN_KIND", "value": "agent"})),
        None => {}
    }
    let mut main = json!({
        "name": spec.container,
        "image": image,
        "imagePullPolicy": "Never",
        "command": [STANDIN_BIN, "pause", "--announce", role.as_str(),
            "--ready-after-ms", spec.ready_after.as_millis().to_string()],
        "env": env,
        "readinessProbe": {"exec": {"command": [STANDIN_BIN, "ready"]}, "periodSeconds": 1},
    });
    let mut containers = Vec::new();
    let mut volumes = Vec::new();
    if role == Role::Agent {
        // The agent chroots into the host's root; the stand-in forwards `chroot`, so an
        // empty directory keeps the real host untouched.
        main["volumeMounts"] = json!([{"name": "host-root", "mountPath": "/host-root"}]);
        volumes.push(json!({"name": "host-root", "emptyDir": {}}));
    }
    containers.push(main);
    if role == Role::DevicePlugin {
        // The real kubelet needs a real device plugin to give the node its
        // `nvidia.com/gpu` capacity: the stand-in one, beside the container that plays
        // the plugin's start (announcement and readiness delay).
        containers.push(json!({
            "name": "device-plugin",
            "image": image,
            "imagePullPolicy": "Never",
            "command": [DEVICE_PLUGIN_BIN],
            "env": env,
            "securityContext": {"privileged": true},
            "volumeMounts": [{"name": "device-plugins", "mountPath": DEVICE_PLUGIN_DIR}],
        }));
        volumes.push(json!({"name": "device-plugins", "hostPath": {"path": DEVICE_PLUGIN_DIR}}));
    }
    let mut pod_spec = json!({
        "hostNetwork": true,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "terminationGracePeriodSeconds": 2,
        "tolerations": [{"operator": "Exists"}],
        "containers": containers,
    });
    if !volumes.is_empty() {
        pod_spec["volumes"] = json!(volumes);
    }
    if spec.needs_gpu {
        // The GPU operator's driver comes only once the node has a GPU.
        pod_spec["nodeSelector"] = json!({GPU_PRESENT_LABEL: "true"});
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": spec.labels},
        "spec": {
            "selector": {"matchLabels": spec.labels},
            "template": {"metadata": {"labels": spec.labels}, "spec": pod_spec},
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{AGENT_DS, DEVICE_PLUGIN_DS, DRIVER_DS, daemonsets};
    use crate::{DraNaming, DriverKind, Exposure};

    const URL: &str = "http://127.0.0.1:4000";
    const IMAGE: &str = "cro.local/node-standin:dev";

    fn manifests(setup: &NodeSetup) -> BTreeMap<String, Value> {
        daemonsets(setup, "cro-system")
            .iter()
            .map(|s| (s.name.clone(), daemonset_manifest(s, IMAGE, URL)))
            .collect()
    }

    fn env_names(container: &Value) -> Vec<String> {
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn the_driver_daemonset() {
        let m = manifests(&NodeSetup::gpu_operator());
        let ds = &m[DRIVER_DS];
        // A valid DaemonSet.
        serde_json::from_value::<DaemonSet>(ds.clone()).unwrap();
        assert_eq!(ds["metadata"]["namespace"], "gpu-operator");
        let pod = &ds["spec"]["template"]["spec"];
        assert_eq!(pod["hostNetwork"], true);
        assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
        assert_eq!(pod["terminationGracePeriodSeconds"], 2);
        assert_eq!(
            pod["nodeSelector"],
            json!({"nvidia.com/gpu.present": "true"})
        );
        assert_eq!(
            ds["spec"]["template"]["metadata"]["labels"],
            json!({"app.kubernetes.io/component": "nvidia-driver", "app": DRIVER_DS})
        );
        let c = &pod["containers"][0];
        assert_eq!(c["name"], format!("{DRIVER_DS}-ctr"));
        assert_eq!(
            (c["image"].as_str(), c["imagePullPolicy"].as_str()),
            (Some(IMAGE), Some("Never"))
        );
        assert_eq!(
            c["command"],
            json!([
                "/node-standin",
                "pause",
                "--announce",
                "driver",
                "--ready-after-ms",
                "1500"
            ])
        );
        assert_eq!(
            c["readinessProbe"],
            json!({"exec": {"command": ["/node-standin", "ready"]}, "periodSeconds": 1})
        );
        assert_eq!(
            env_names(c),
            [
                "POD_NAME",
                "POD_NAMESPACE",
                "POD_UID",
                "NODE_NAME",
                "CRO_STANDIN_URL",
                "CRO_STANDIN_KIND"
            ]
        );
        assert_eq!(c["env"][5]["value"], "driver");
        // The device plugin's pods run everywhere, with the stand-in plugin beside.
        let dp = &m[DEVICE_PLUGIN_DS]["spec"]["template"]["spec"];
        assert!(dp.get("nodeSelector").is_none());
        assert_eq!(dp["containers"][0]["command"][3], "device-plugin");
        assert!(!env_names(&dp["containers"][0]).contains(&"CRO_STANDIN_KIND".to_owned()));
        assert_eq!(
            dp["containers"][1]["command"],
            json!(["/cro-standin-device-plugin"])
        );
        assert_eq!(dp["containers"][1]["securityContext"]["privileged"], true);
        assert_eq!(
            dp["volumes"],
            json!([{"name": "device-plugins", "hostPath": {"path": "/var/lib/kubelet/device-plugins"}}])
        );
        assert_eq!(
            m[DCGM_DS]["spec"]["template"]["spec"]["containers"][0]["command"][3],
            "dcgm"
        );
    }

    #[test]
    fn the_agent_and_dra_daemonsets() {
        let setup = NodeSetup::new(DriverKind::Host, Exposure::Dra(DraNaming::Current));
        let m = manifests(&setup);
        let agent = &m[AGENT_DS];
        serde_json::from_value::<DaemonSet>(agent.clone()).unwrap();
        assert_eq!(agent["metadata"]["namespace"], "cro-system");
        let pod = &agent["spec"]["template"]["spec"];
        assert_eq!(
            pod["volumes"],
            json!([{"name": "host-root", "emptyDir": {}}])
        );
        assert_eq!(
            pod["containers"][0]["volumeMounts"],
            json!([{"name": "host-root", "mountPath": "/host-root"}])
        );
        assert_eq!(pod["containers"][0]["env"][5]["value"], "agent");
        assert_eq!(pod["containers"][0]["command"][5], "300");
        let dra = &m["dra-driver-nvidia-gpu-kubelet-plugin"];
        assert_eq!(dra["metadata"]["namespace"], "nvidia-dra-driver-gpu");
        assert_eq!(
            dra["spec"]["template"]["spec"]["containers"][0]["command"][3],
            "dra-plugin"
        );
    }
}

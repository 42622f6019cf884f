//! The node setups on a real node (docs/real-node.md): a kubelet and containerd run the
//! GPU operator's driver, the device plugin (a real one: the kubelet writes the node's
//! `nvidia.com/gpu` capacity), DCGM, the DRA kubelet plugin and cro's node agent as real
//! pods of the stand-in image, and every node command of the operator goes through the
//! API server's real `pods/exec` (`KubeExecRunner`). One real node runs at a time on a
//! machine: each test waits for the previous one's teardown.

use std::time::Duration;

use cro_api::ComposabilityRequest;
use cro_operator::nodeops::{CommandRunner, KubeExecRunner, NodeOpsError, PodRef};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use kube_harness::real_node::{NODE_NAME, STANDIN_IMAGE};
use node_sim::ExecFault;
use serde_json::json;

mod install;
mod storms;

use crate::common::nodes::{DraNaming, DriverKind, Exposure, NodeOptions, NodeSetup};
use crate::common::{CONVERGE, Env, GPU_NS, MODEL, eventually};

const GO_README_REQUEST: &str = include_str!("../../../api/tests/fixtures/go-readme-request.yaml");
pub(super) const WORKLOAD_NS: &str = "default";

/// The Go operator's README request, aimed at the real node.
fn go_readme_request() -> ComposabilityRequest {
    let mut request: ComposabilityRequest =
        serde_yaml::from_str(GO_README_REQUEST).expect("the Go README request");
    request.spec.resource.target_node = Some(NODE_NAME.into());
    request
}

async fn apply_go_readme_request(env: &Env) -> String {
    let request = go_readme_request();
    let name = request.name_any();
    env.requests()
        .create(&PostParams::default(), &request)
        .await
        .unwrap();
    name
}

/// The node's `nvidia.com/gpu` capacity, as the kubelet wrote it.
async fn gpu_capacity(env: &Env) -> Option<String> {
    gpu_resource(env, |s| s.capacity.as_ref()).await
}

/// A pod that asks the kubelet for one `nvidia.com/gpu` and prints the device it got.
async fn start_gpu_workload(env: &Env, name: &str) -> Pod {
    let url = env.node_sim.real().standin.url();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": WORKLOAD_NS, "labels": {"cro.test/gpu-workload": "true"}},
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "cuda", "image": STANDIN_IMAGE, "imagePullPolicy": "Never",
                "command": ["/node-standin", "pause", "--announce", "workload",
                    "--print-env", "NVIDIA_VISIBLE_DEVICES"],
                "env": [
                    {"name": "CRO_STANDIN_URL", "value": url},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                ],
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
            }],
        },
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), WORKLOAD_NS);
    env.node_sim
        .real()
        .node
        .wait_default_service_account(WORKLOAD_NS)
        .await
        .unwrap();
    // The GPU must be allocatable, not only counted: while the operator restarts the
    // device plugin, the kubelet keeps the capacity but marks the device unhealthy.
    eventually("the kubelet can allocate a GPU", CONVERGE, || async {
        let allocatable = gpu_resource(env, |s| s.allocatable.as_ref()).await?;
        (allocatable != "0").then_some(())
    })
    .await;
    pods.create(&PostParams::default(), &pod).await.unwrap();
    eventually(&format!("workload {name} Running"), CONVERGE, || async {
        let Some(p) = pods.get_opt(name).await.ok()? else {
            // Deleted below after a rejection: made again once the old one is gone.
            let _ = pods.create(&PostParams::default(), &pod).await;
            return None;
        };
        match p.status.as_ref()?.phase.as_deref() {
            Some("Running") => Some(p),
            // Admitted in the moment a restarting plugin had no healthy device, the
            // kubelet rejects a bare Pod for good (UnexpectedAdmissionError): make it
            // again, as the Job or Deployment that would own it does.
            Some("Failed") => {
                let why = p.status.as_ref().and_then(|s| s.reason.clone());
                eprintln!("workload {name} rejected ({why:?}): made again");
                let _ = pods
                    .delete(name, &DeleteParams::default().grace_period(0))
                    .await;
                None
            }
            _ => None,
        }
    })
    .await
}

/// The node's `nvidia.com/gpu` from one field of its status (capacity, allocatable).
async fn gpu_resource(
    env: &Env,
    field: impl Fn(
        &k8s_openapi::api::core::v1::NodeStatus,
    ) -> Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
) -> Option<String> {
    let node = Api::<Node>::all(env.client.clone())
        .get(NODE_NAME)
        .await
        .ok()?;
    field(node.status.as_ref()?)?
        .get("nvidia.com/gpu")
        .map(|q| q.0.clone())
}

/// The GPU the workload's container was given, read from its own output.
async fn workload_gpu(env: &Env, name: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), WORKLOAD_NS);
    eventually("the workload's device in its log", CONVERGE, || async {
        let log = pods.logs(name, &LogParams::default()).await.ok()?;
        log.lines()
            .find_map(|l| l.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    })
    .await
}

pub(super) async fn delete_pod_and_wait(env: &Env, namespace: &str, name: &str) {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), namespace);
    let _ = pods.delete(name, &DeleteParams::default()).await;
    eventually(&format!("pod {name} gone"), CONVERGE, || async {
        pods.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
}

/// Every command the operator sent reached a real pod through the API server's exec and
/// was answered there; none was answered in-process. Returns how many.
fn assert_all_commands_through_exec(env: &Env) -> usize {
    let through_exec = env.node_sim.real().standin.exec_answered();
    let all = env.nodes.commands();
    assert!(!through_exec.is_empty(), "no node command reached a pod");
    assert_eq!(
        all.len(),
        through_exec.len(),
        "commands answered in-process on a real node: {all:?} vs {through_exec:?}"
    );
    env.assert_known_commands();
    through_exec.len()
}

/// Distinct programs (with their first argument) the operator ran, for the test's output.
fn command_kinds(env: &Env) -> Vec<String> {
    let mut kinds: Vec<String> = env
        .node_sim
        .real()
        .standin
        .exec_answered()
        .iter()
        .map(|(_, argv)| argv.iter().take(2).cloned().collect::<Vec<_>>().join(" "))
        .map(|s| s.chars().take(40).collect())
        .collect();
    kinds.sort();
    kinds.dedup();
    kinds
}

/// The Go README request attaches, grows, shrinks and is deleted on a real node whose
/// GPU operator driver and device plugin are real pods; a workload Pod asking the
/// kubelet for `nvidia.com/gpu` runs on an attached GPU, and deleting the request waits
/// for that Pod before the GPU leaves the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_gpu_operator_device_plugin_go_readme_flow() {
    let mut env = Env::start_real(NodeSetup::gpu_operator()).await;
    let machine = env.add_real_node(NodeOptions::default()).await;
    env.sim.add_free_devices("gpu", MODEL, 3);
    env.start_operator().await;

    let name = apply_go_readme_request(&env).await;
    env.wait_running(&name, 2).await;
    assert_eq!(env.gpus_on(&machine).len(), 2);
    // The kubelet's own capacity, from the device plugin's registration.
    eventually("the kubelet reports 2 GPUs", CONVERGE, || async {
        (gpu_capacity(&env).await.as_deref() == Some("2")).then_some(())
    })
    .await;

    let mut spec = go_readme_request().spec.resource;
    spec.size = 3;
    env.set_request(&name, &spec).await;
    env.wait_running(&name, 3).await;
    spec.size = 1;
    env.set_request(&name, &spec).await;
    env.wait_running(&name, 1).await;
    eventually("the kubelet reports 1 GPU", CONVERGE, || async {
        (gpu_capacity(&env).await.as_deref() == Some("1")).then_some(())
    })
    .await;

    start_gpu_workload(&env, "cuda-job").await;
    let gpu = workload_gpu(&env, "cuda-job").await;
    assert_eq!(
        vec![gpu.clone()],
        env.gpus_on(&machine),
        "the workload got the attached GPU"
    );

    // Deleting the request must wait for the workload: the GPU stays attached and its
    // resource says why.
    env.requests()
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    let blocked = eventually("the detach waits for the workload", CONVERGE, || async {
        let r = env.resources_of(&name).await.into_iter().next()?;
        let error = r.status.as_ref()?.error.clone();
        error.contains("busy").then_some(error)
    })
    .await;
    assert!(blocked.contains(&gpu), "{blocked}");
    assert_eq!(env.gpus_on(&machine), vec![gpu.clone()]);
    delete_pod_and_wait(&env, WORKLOAD_NS, "cuda-job").await;
    eventually("the request is gone", CONVERGE, || async {
        (env.request(&name).await.is_none() && env.resources_of(&name).await.is_empty())
            .then_some(())
    })
    .await;
    env.assert_nothing_attached().await;
    let count = assert_all_commands_through_exec(&env);
    eprintln!(
        "real node (GPU operator, device plugin): {count} node commands, all through pods/exec: {:?}",
        command_kinds(&env)
    );
    env.stop_operator().await.unwrap();
}

/// A driver on the host: the node agent is a real pod, every command runs through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_host_driver_through_the_node_agent() {
    let mut env = Env::start_real(NodeSetup::new(DriverKind::Host, Exposure::DevicePlugin)).await;
    let machine = env.add_real_node(NodeOptions::default()).await;
    env.sim.add_free_devices("gpu", MODEL, 2);
    env.start_operator().await;
    let name = apply_go_readme_request(&env).await;
    env.wait_running(&name, 2).await;
    assert_eq!(env.gpus_on(&machine).len(), 2);
    env.delete_request(&name).await;
    env.assert_nothing_attached().await;
    let count = assert_all_commands_through_exec(&env);
    let kinds = command_kinds(&env);
    assert!(
        kinds.iter().all(|k| k.starts_with("chroot")),
        "host-driver commands go through the agent's chroot: {kinds:?}"
    );
    eprintln!("real node (host driver, node agent): {count} node commands: {kinds:?}");
    env.stop_operator().await.unwrap();
}

/// DRA, the current chart's naming: the kubelet plugin stand-in is a real pod; the
/// operator restarts it after an attach and waits for the node's ResourceSlice to list
/// the GPU, and taints a leaving GPU with a DeviceTaintRule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_gpu_operator_with_dra() {
    dra_flow(DraNaming::Current).await;
}

/// DRA with the v0.2.0 chart's naming of the kubelet plugin's pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_gpu_operator_with_dra_v020_naming() {
    dra_flow(DraNaming::V020).await;
}

async fn dra_flow(naming: DraNaming) {
    let setup = NodeSetup::new(DriverKind::GpuOperator, Exposure::Dra(naming));
    let plugin = setup
        .dra_plugin_daemonset()
        .expect("a DRA setup has a kubelet plugin");
    let mut env = Env::start_real(setup).await;
    let machine = env.add_real_node(NodeOptions::default()).await;
    env.sim.add_free_devices("gpu", MODEL, 2);
    // The plugin's first slice (no GPU yet): from here on only a restart publishes the
    // attached GPUs, which the operator must cause.
    eventually("the kubelet plugin's first slice", CONVERGE, || async {
        node_sim::slice_api(&env.client)
            .get_opt(&node_sim::slice_name(NODE_NAME))
            .await
            .ok()
            .flatten()
            .map(|_| ())
    })
    .await;
    env.start_operator().await;
    let name = apply_go_readme_request(&env).await;
    env.wait_running(&name, 2).await;
    assert_eq!(env.gpus_on(&machine).len(), 2);
    assert!(
        env.node_sim.restarts(plugin, NODE_NAME) >= 1,
        "the operator restarted the kubelet plugin after attaching"
    );
    env.delete_request(&name).await;
    env.assert_nothing_attached().await;
    let count = assert_all_commands_through_exec(&env);
    eprintln!(
        "real node (GPU operator, DRA, {plugin}): {count} node commands: {:?}",
        command_kinds(&env)
    );
    env.stop_operator().await.unwrap();
}

/// The driver pod the operator execs into on the real node.
async fn driver_pod(env: &Env) -> PodRef {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), GPU_NS);
    let pod = eventually("a Ready driver pod", CONVERGE, || async {
        pods.list(
            &ListParams::default()
                .labels("app.kubernetes.io/component=nvidia-driver")
                .fields(&format!("spec.nodeName={NODE_NAME}")),
        )
        .await
        .ok()?
        .items
        .into_iter()
        .find(cro_operator::nodeops::running_and_ready)
    })
    .await;
    crate::common::real::driver_pod_ref(&pod)
}

fn standin(env: &Env) -> &node_sim::Standin {
    &env.node_sim.real().standin
}

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

/// What only a real kubelet does to an exec, each case with its typed outcome
/// (docs/node-operations.md, "When exec fails"), then the operator living through a
/// killed command: its resource shows the error and the retry attaches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_exec_failures_are_typed_and_retried() {
    let mut env = Env::start_real(NodeSetup::gpu_operator()).await;
    env.add_real_node(NodeOptions::default()).await;
    env.sim.add_free_devices("gpu", MODEL, 2);
    // A GPU on the node brings the driver pod; the operator is stopped while the runner
    // is tested alone.
    env.start_operator().await;
    let mut spec = go_readme_request().spec.resource;
    spec.size = 1;
    env.create_request("exec", spec.clone()).await;
    env.wait_running("exec", 1).await;
    env.stop_operator().await.unwrap();
    let pod = driver_pod(&env).await;
    let runner = KubeExecRunner::new(env.client.clone()).with_timeout(Duration::from_secs(3));
    let smi = argv(&[
        "nvidia-smi",
        "--query-gpu=gpu_uuid",
        "--format=csv,noheader,nounits",
    ]);

    // A plain answer first: the path works.
    let out = runner.run(&pod, &smi).await.unwrap();
    assert_eq!(out.exit_code, 0, "{out:?}");
    assert!(
        out.stdout.starts_with("GPU-") || !out.stdout.is_empty(),
        "{out:?}"
    );

    // Non-zero exit with output: an answer, for the caller to judge.
    standin(&env).inject(
        &["nvidia-smi"],
        ExecFault::reply("partial\n", "fatal: lost\n", 3),
    );
    let out = runner.run(&pod, &smi).await.unwrap();
    assert_eq!(
        (out.exit_code, out.stdout.as_str(), out.stderr.as_str()),
        (3, "partial\n", "fatal: lost\n")
    );

    // Output on stderr only, exit 0.
    standin(&env).inject(
        &["nvidia-smi"],
        ExecFault::reply("", "WARNING: infoROM corrupted\n", 0),
    );
    let out = runner.run(&pod, &smi).await.unwrap();
    assert_eq!((out.exit_code, out.stdout.as_str()), (0, ""));
    assert!(out.stderr.contains("infoROM"), "{out:?}");

    // A command killed by a signal.
    standin(&env).inject(&["nvidia-smi"], ExecFault::Signal(9));
    let err = runner.run(&pod, &smi).await.unwrap_err();
    assert!(
        matches!(err, NodeOpsError::Killed { signal: 9, .. }),
        "{err:?}"
    );

    // No answer within the runner's limit.
    standin(&env).inject(&["nvidia-smi"], ExecFault::Hang);
    let err = runner.run(&pod, &smi).await.unwrap_err();
    assert!(matches!(err, NodeOpsError::ExecTimeout { .. }), "{err:?}");
    standin(&env).clear_faults();

    // The kubelet restarting mid-command: the stream ends without an exit status.
    standin(&env).inject(&["nvidia-smi"], ExecFault::Hang);
    let long = held_exec(&env, &pod, &smi).await;
    env.node_sim
        .real_mut()
        .node
        .restart_kubelet()
        .await
        .unwrap();
    let err = long.await.unwrap().unwrap_err();
    assert!(matches!(err, NodeOpsError::Interrupted { .. }), "{err:?}");
    standin(&env).clear_faults();
    // The restarted kubelet takes its pods back before it serves exec into them again.
    eventually(
        "exec works after the kubelet's restart",
        CONVERGE,
        || async {
            runner
                .run(&pod, &smi)
                .await
                .ok()
                .filter(|o| o.exit_code == 0)
        },
    )
    .await;

    // The pod deleted mid-exec.
    standin(&env).inject(&["nvidia-smi"], ExecFault::Hang);
    let long = held_exec(&env, &pod, &smi).await;
    Api::<Pod>::namespaced(env.client.clone(), GPU_NS)
        .delete(&pod.name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let err = long.await.unwrap().unwrap_err();
    assert!(
        matches!(
            err,
            NodeOpsError::Interrupted { .. }
                | NodeOpsError::PodDeleted { .. }
                | NodeOpsError::PodNotFound { .. }
        ),
        "{err:?}"
    );
    standin(&env).clear_faults();

    // A container that is not running: exec is refused before anything runs.
    let not_running = driver_pod_not_running(&env).await;
    let err = runner.run(&not_running, &smi).await.unwrap_err();
    assert!(
        matches!(err, NodeOpsError::ContainerNotRunning { .. }),
        "{err:?}"
    );

    // Through the operator: a killed query shows in the resource and the retry attaches.
    delete_pod_and_wait(&env, GPU_NS, "never-starts").await;
    standin(&env).inject(&["nvidia-smi"], ExecFault::Signal(9));
    env.start_operator().await;
    spec.size = 2;
    env.set_request("exec", &spec).await;
    env.wait_running("exec", 2).await;
    env.delete_request("exec").await;
    env.assert_nothing_attached().await;
    assert_all_commands_through_exec(&env);
    env.stop_operator().await.unwrap();
}

/// Starts `command` in `pod` (whose answer the stand-in holds) and returns once the pod
/// has it, so the test can break the exec while it runs.
async fn held_exec(
    env: &Env,
    pod: &PodRef,
    command: &[String],
) -> tokio::task::JoinHandle<Result<cro_operator::nodeops::ExecOutput, NodeOpsError>> {
    let seen = standin(env).exec_received().len();
    let exec = {
        let runner = KubeExecRunner::new(env.client.clone()).with_timeout(CONVERGE);
        let (pod, command) = (pod.clone(), command.to_vec());
        tokio::spawn(async move { runner.run(&pod, &command).await })
    };
    wait_exec_started(env, seen, &command[0], &exec).await;
    exec
}

/// Waits until the stand-in service has received (after the first `seen` execs) an exec
/// of `program`, which it holds.
async fn wait_exec_started<T>(
    env: &Env,
    seen: usize,
    program: &str,
    exec: &tokio::task::JoinHandle<T>,
) {
    eventually("the exec reached the pod", CONVERGE, || async {
        // An exec that ended before reaching the pod: the caller's assertion says how.
        if exec.is_finished() {
            return Some(());
        }
        let now = standin(env).exec_received();
        now.iter()
            .skip(seen)
            .any(|(_, argv)| argv.first().map(String::as_str) == Some(program))
            .then_some(())
    })
    .await;
}

/// A pod of the driver's shape whose container never starts (its image does not exist
/// and cannot be pulled).
async fn driver_pod_not_running(env: &Env) -> PodRef {
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), GPU_NS);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "never-starts", "namespace": GPU_NS},
        "spec": {"hostNetwork": true, "containers": [{"name": "ctr",
            "image": "cro.local/absent:none", "imagePullPolicy": "Never"}]},
    }))
    .unwrap();
    env.node_sim
        .real()
        .node
        .wait_default_service_account(GPU_NS)
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    eventually("the pod is on the node, not running", CONVERGE, || async {
        let p = pods.get("never-starts").await.ok()?;
        let waiting = p
            .status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .first()?
            .state
            .as_ref()?
            .waiting
            .is_some();
        waiting.then_some(())
    })
    .await;
    PodRef {
        namespace: GPU_NS.into(),
        name: "never-starts".into(),
        node: NODE_NAME.into(),
        container: Some("ctr".into()),
    }
}

/// The UUID the administrator copied from `nvidia-smi` into `NEC_PROVISIONAL_GPU_UUID`.
const NEC_GPU_UUID: &str = "GPU-6f2b9a4e-0c1d-4e5f-8a7b-3c2d1e0f9a8b";

/// `CDI_PROVIDER_TYPE=NEC` on the real node: the NEC component loaded from the Go
/// operator's environment, CDIM simulated, the node's providerID its CDIM node id. With
/// `NEC_PROVISIONAL_GPU_UUID` every GPU reports that one UUID and the operator holds a
/// device id once, so the README request runs with ONE GPU, the one whose UUID that is
/// (docs/nec-provider.md, "On a node"): connected by a CDIM layout apply, Online once the
/// driver pod's nvidia-smi lists it, counted by the kubelet through the real device
/// plugin, given to a workload Pod; deleting the request waits for that Pod, then drains
/// the GPU and disconnects it. Every node command goes through the real `pods/exec`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_nec_go_readme_flow_with_the_provisional_uuid() {
    let mut env = Env::start_real_nec(NodeSetup::gpu_operator(), Some(NEC_GPU_UUID)).await;
    let machine = env.add_real_node(NodeOptions::default()).await;
    let gpu = env.nec().sim().add_gpu(MODEL);
    env.nec().set_gpu_uuid(&gpu, NEC_GPU_UUID).unwrap();
    env.start_operator().await;

    let mut request = go_readme_request();
    request.spec.resource.size = 1;
    let name = request.name_any();
    env.requests()
        .create(&PostParams::default(), &request)
        .await
        .unwrap();
    env.wait_running(&name, 1).await;
    let connected: Vec<String> = env
        .nec()
        .sim()
        .gpus_on(&machine)
        .into_iter()
        .map(|g| g.id)
        .collect();
    assert_eq!(connected, vec![gpu.clone()]);
    let status = env.resources_of(&name).await.remove(0).status.unwrap();
    assert_eq!(
        (status.device_id.as_str(), status.cdi_device_id.as_str()),
        (NEC_GPU_UUID, gpu.as_str())
    );
    eventually("the kubelet reports 1 GPU", CONVERGE, || async {
        (gpu_capacity(&env).await.as_deref() == Some("1")).then_some(())
    })
    .await;

    start_gpu_workload(&env, "cuda-nec").await;
    assert_eq!(workload_gpu(&env, "cuda-nec").await, NEC_GPU_UUID);
    env.requests()
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    let blocked = eventually("the detach waits for the workload", CONVERGE, || async {
        let r = env.resources_of(&name).await.into_iter().next()?;
        let error = r.status.as_ref()?.error.clone();
        error.contains("busy").then_some(error)
    })
    .await;
    assert!(blocked.contains(NEC_GPU_UUID), "{blocked}");
    assert_eq!(
        env.nec().sim().gpus_on(&machine).len(),
        1,
        "still connected"
    );
    delete_pod_and_wait(&env, WORKLOAD_NS, "cuda-nec").await;
    eventually("the request is gone", CONVERGE, || async {
        (env.request(&name).await.is_none() && env.resources_of(&name).await.is_empty())
            .then_some(())
    })
    .await;
    env.assert_nothing_attached().await;
    assert!(env.nec().sim().applies().iter().any(|a| {
        a.procedures
            .iter()
            .any(|(op, _, g)| op == "disconnect" && *g == gpu)
    }));
    eventually("the kubelet reports 0 GPUs", CONVERGE, || async {
        (gpu_capacity(&env).await.as_deref() == Some("0")).then_some(())
    })
    .await;
    let count = assert_all_commands_through_exec(&env);
    eprintln!(
        "real node (NEC CDIM, provisional UUID): {count} node commands, all through pods/exec: {:?}",
        command_kinds(&env)
    );
    env.stop_operator().await.unwrap();
}

/// A Pod asks for a fabric GPU through a ResourceClaim while no node has one (docs/dra.md):
/// the real kube-scheduler allocates a device of cro's published pool to the real node
/// and waits in PreBind; cro attaches a GPU there and sets `FabricDeviceReady`; the
/// scheduler binds the Pod. Deleting the Pod deletes its claim and the GPU goes back to
/// the pool. With two Pods and one GPU, the second waits unschedulable, holding nothing,
/// until the first goes. (Starting the container needs cro's kubelet plugin for the driver, which
/// prepares the claim: not there yet, so the Pod stays bound but not Running.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_a_pods_claim_composes_a_gpu_through_the_scheduler() {
    use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
    let mut env = Env::start_real(NodeSetup::gpu_operator()).await;
    let machine = env.add_real_node(NodeOptions::default()).await;
    env.sim.add_free_devices("gpu", MODEL, 1);
    env.config.pool_devices = vec![cro_runtime::PoolKind {
        device_type: cro_runtime::DeviceType::Gpu,
        model: MODEL.into(),
    }];
    // The chart's DeviceClass for GPUs.
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "gpu.cro.hpsys.ibm.ie.com"},
        "spec": {"selectors": [{"cel": {"expression":
            "device.driver == \"cro.hpsys.ibm.ie.com\" && device.attributes[\"cro.hpsys.ibm.ie.com\"].type == \"gpu\""}}]},
    }))
    .unwrap();
    Api::<DeviceClass>::all(env.client.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    env.start_operator().await;
    // cro's kubelet plugin, as `cro kubelet-plugin` runs it on the node: it registers with
    // the real kubelet and writes CDI specs where the node's containerd reads them.
    let node = &env.node_sim.real().node;
    let (stop_plugin, plugin_stop) = tokio::sync::oneshot::channel::<()>();
    let plugin = tokio::spawn(cro_kubelet_plugin::run(
        env.client.clone(),
        cro_kubelet_plugin::Config {
            node_name: NODE_NAME.into(),
            kubelet_dir: node.kubelet_root().to_path_buf(),
            cdi_dir: node.cdi_dir().to_path_buf(),
        },
        async move {
            let _ = plugin_stop.await;
        },
    ));
    let cdi_dir = node.cdi_dir().to_path_buf();
    let registration = node
        .kubelet_root()
        .join("plugins_registry/cro.hpsys.ibm.ie.com-reg.sock");
    eventually("the pool's slice", CONVERGE, || async {
        let slices = Api::<k8s_openapi::api::resource::v1::ResourceSlice>::all(env.client.clone())
            .list(&ListParams::default().labels("app.kubernetes.io/managed-by=cro"))
            .await
            .ok()?;
        slices
            .items
            .iter()
            .any(|s| s.spec.devices.as_ref().is_some_and(|d| d.len() == 1))
            .then_some(())
    })
    .await;
    assert!(env.gpus_on(&machine).is_empty(), "no GPU on any node yet");

    create_gpu_claim_template(&env).await;
    let pod = gpu_claim_pod("trainer");
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), WORKLOAD_NS);
    let claims: Api<ResourceClaim> = Api::namespaced(env.client.clone(), WORKLOAD_NS);
    let resources: Api<cro_api::ComposableResource> = Api::all(env.client.clone());
    let created = std::time::Instant::now();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    // When each step was first seen (polled every 100 ms, until a deadline).
    let mut seen: Vec<(&str, Duration)> = Vec::new();
    let deadline = std::time::Instant::now() + CONVERGE;
    loop {
        let claim = claims
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .pop();
        let status = claim.as_ref().and_then(|c| c.status.clone());
        let r = resources
            .list(&ListParams::default().labels(cro_api::LABEL_CLAIM_UID))
            .await
            .unwrap()
            .items
            .pop();
        let trainer = pods.get("trainer").await.ok();
        let bound = trainer
            .as_ref()
            .and_then(|p| p.spec.as_ref())
            .is_some_and(|s| s.node_name.as_deref() == Some(NODE_NAME));
        let running = trainer
            .as_ref()
            .and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.phase.as_deref() == Some("Running"));
        for (step, now) in [
            (
                "allocated",
                status.as_ref().is_some_and(|s| s.allocation.is_some()),
            ),
            ("resource created", r.is_some()),
            (
                "attached",
                r.as_ref().is_some_and(|r| r.device_id().is_some()),
            ),
            (
                "Online on the node",
                r.as_ref()
                    .is_some_and(|r| r.state() == cro_api::ResourceState::Online),
            ),
            (
                "FabricDeviceReady",
                status
                    .as_ref()
                    .is_some_and(|s| s.devices.as_ref().is_some_and(|d| !d.is_empty())),
            ),
            ("bound", bound),
            ("Running (claim prepared)", running),
        ] {
            if now && !seen.iter().any(|(s, _)| *s == step) {
                seen.push((step, created.elapsed()));
            }
        }
        if running {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the Pod was not Running within {CONVERGE:?}; steps seen: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let running = created.elapsed();
    let gpus = env.gpus_on(&machine);
    assert_eq!(gpus.len(), 1, "one GPU attached for the claim");
    let claim = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .next()
        .expect("the Pod's claim");
    let status = claim.status.clone().unwrap();
    let device = status
        .devices
        .unwrap_or_default()
        .into_iter()
        .find(|d| d.driver == cro_api::DRA_DRIVER)
        .expect("cro's device status");
    let ready = device
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == cro_api::CONDITION_FABRIC_DEVICE_READY)
        .expect("FabricDeviceReady");
    assert_eq!(ready.status, "True");
    assert_eq!(device.data.unwrap().0["deviceId"], gpus[0].as_str());
    // The container sees the attached GPU's UUID, handed over by the kubelet plugin
    // through a CDI spec that containerd applied.
    assert_eq!(printed_gpu(&pods, "trainer").await, gpus[0]);
    let spec_file = cdi_dir.join(format!(
        "cro.hpsys.ibm.ie.com-{}.json",
        claim.uid().unwrap()
    ));
    assert!(
        spec_file.is_file(),
        "the claim's CDI spec while the Pod runs"
    );
    eprintln!(
        "real node: Pod created → Running with an attached GPU in {running:?}; steps first seen: {seen:?}"
    );

    delete_pod_and_wait(&env, WORKLOAD_NS, "trainer").await;
    eventually("the Pod's claim gone", CONVERGE, || async {
        claims
            .get_opt(&claim.name_any())
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    env.assert_nothing_attached().await;
    assert!(!spec_file.exists(), "the kubelet unprepared the claim");

    // Two Pods, one GPU in the pool: the scheduler allocates the one device to one Pod
    // and leaves the other Pending (its claim unallocated, no device held); once the
    // first Pod goes, the second gets the device.
    let mut pod_two = pod.clone();
    pods.create(&PostParams::default(), &named(&pod, "first"))
        .await
        .unwrap();
    pod_two.metadata.name = Some("second".into());
    eventually("one Pod bound", CONVERGE, || async {
        bound_pods(&pods)
            .await
            .contains(&"first".to_string())
            .then_some(())
    })
    .await;
    pods.create(&PostParams::default(), &pod_two).await.unwrap();
    let waiting = eventually("the second Pod unschedulable", CONVERGE, || async {
        let p = pods.get("second").await.ok()?;
        let c = p
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodScheduled")?;
        (c.status == "False").then(|| c.message.unwrap_or_default())
    })
    .await;
    eprintln!("real node: the Pod beyond the pool waits: {waiting}");
    assert_eq!(
        env.gpus_on(&machine).len(),
        1,
        "only the bound Pod's device"
    );
    assert!(!bound_pods(&pods).await.contains(&"second".to_string()));
    delete_pod_and_wait(&env, WORKLOAD_NS, "first").await;
    wait_pod_running(
        &pods,
        "second",
        "the second Pod Running once the device is free",
    )
    .await;
    assert_eq!(env.gpus_on(&machine).len(), 1);
    delete_pod_and_wait(&env, WORKLOAD_NS, "second").await;
    all_claims_gone_and_nothing_attached(&env, &claims).await;

    // The fabric answers every attach that it has nothing free (another tenant took the
    // device between the pool's read and the attach): the claim gets
    // FabricDeviceReschedule and an Event, the scheduler takes the allocation back and
    // places the Pod again, nothing stays attached, and the Pod runs once the fabric
    // has a device for it.
    let no_capacity = env.sim.inject(
        fabric_sim::Fault::NoFreeDevice
            .on(fabric_sim::Route::FmAttach)
            .always(),
    );
    pods.create(&PostParams::default(), &gpu_claim_pod("unlucky"))
        .await
        .unwrap();
    let claim_name = eventually("the Pod's claim", CONVERGE, || async {
        claims
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .next()
            .map(|c| c.name_any())
    })
    .await;
    eventually("FabricDeviceReschedule on the claim", CONVERGE, || async {
        let c = claims.get(&claim_name).await.ok()?;
        c.status?
            .devices?
            .into_iter()
            .flat_map(|d| d.conditions.unwrap_or_default())
            .any(|c| {
                c.type_ == cro_api::CONDITION_FABRIC_DEVICE_RESCHEDULE
                    && c.status == "True"
                    && c.reason == "NoCapacity"
            })
            .then_some(())
    })
    .await;
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(env.client.clone(), WORKLOAD_NS);
    eventually("a NoCapacity Event on the claim", CONVERGE, || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .iter()
            .any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(claim_name.as_str())
                    && e.reason.as_deref() == Some("NoCapacity")
            })
            .then_some(())
    })
    .await;
    let unlucky = pods.get("unlucky").await.unwrap();
    assert_ne!(
        unlucky.status.and_then(|s| s.phase).as_deref(),
        Some("Running"),
        "no device, no start"
    );
    assert!(
        env.gpus_on(&machine).is_empty(),
        "nothing attached to the node"
    );
    env.sim.remove_fault(no_capacity);
    wait_pod_running(
        &pods,
        "unlucky",
        "the Pod Running once the fabric has a device",
    )
    .await;
    assert_eq!(
        printed_gpu(&pods, "unlucky").await,
        env.gpus_on(&machine)[0]
    );
    delete_pod_and_wait(&env, WORKLOAD_NS, "unlucky").await;
    all_claims_gone_and_nothing_attached(&env, &claims).await;
    env.stop_operator().await.unwrap();
    assert!(registration.exists(), "the plugin registered");
    let _ = stop_plugin.send(());
    plugin.await.unwrap().unwrap();
    assert!(
        !registration.exists(),
        "the plugin unregistered on its way out"
    );
}

/// The claim template a GPU Pod uses: one GPU of [`MODEL`] through the chart's DeviceClass.
pub(super) async fn create_gpu_claim_template(env: &Env) {
    use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
    let template: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": WORKLOAD_NS},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.cro.hpsys.ibm.ie.com",
            "selectors": [{"cel": {"expression":
                format!("device.attributes[\"cro.hpsys.ibm.ie.com\"].model == \"{MODEL}\"")}}],
        }}]}}},
    }))
    .unwrap();
    Api::<ResourceClaimTemplate>::namespaced(env.client.clone(), WORKLOAD_NS)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    env.node_sim
        .real()
        .node
        .wait_default_service_account(WORKLOAD_NS)
        .await
        .unwrap();
}

/// A workload Pod with a claim from [`create_gpu_claim_template`]'s template; its
/// container prints the GPUs it was handed (`NVIDIA_VISIBLE_DEVICES`) and waits.
pub(super) fn gpu_claim_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": WORKLOAD_NS},
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [{
                "name": "train", "image": STANDIN_IMAGE, "imagePullPolicy": "Never",
                "command": ["/node-standin", "pause", "--announce", "workload",
                    "--print-env", "NVIDIA_VISIBLE_DEVICES"],
                "resources": {"claims": [{"name": "gpu"}]},
            }],
        },
    }))
    .unwrap()
}

/// What a [`gpu_claim_pod`]'s container printed as its GPUs, once it printed it.
pub(super) async fn printed_gpu(pods: &Api<Pod>, name: &str) -> String {
    eventually("the GPU's UUID in the container", CONVERGE, || async {
        let logs = pods.logs(name, &LogParams::default()).await.ok()?;
        logs.lines()
            .find_map(|l| l.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
            .map(str::to_owned)
    })
    .await
}

async fn wait_pod_running(pods: &Api<Pod>, name: &str, what: &str) {
    eventually(what, CONVERGE, || async {
        let p = pods.get(name).await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
}

/// Every claim of the workload namespace gone, and no device left on any machine.
async fn all_claims_gone_and_nothing_attached(
    env: &Env,
    claims: &Api<k8s_openapi::api::resource::v1::ResourceClaim>,
) {
    eventually("every claim gone", CONVERGE, || async {
        claims
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    env.assert_nothing_attached().await;
}

fn named(pod: &Pod, name: &str) -> Pod {
    let mut p = pod.clone();
    p.metadata.name = Some(name.into());
    p
}

/// The Pods bound to the real node.
async fn bound_pods(pods: &Api<Pod>) -> Vec<String> {
    pods.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE_NAME))
        .map(|p| p.name_any())
        .collect()
}

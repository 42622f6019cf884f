//! The four node setups of real GPU clusters, on simulated nodes (docs/node-operations.md):
//! the GPU operator's container driver (including a node's first GPU, before its driver
//! pod exists), a driver on the host reached through cro's node agent, device-plugin
//! mode with nvidia-smi's quirks, and DRA with both chart namings of the kubelet plugin.

mod common;
mod real_node;

use common::nodes::{DraNaming, DriverKind, Exposure, NodeOptions, NodeSetup, Quirks};
use common::{CONVERGE, Env, FabricApi, MODEL, eventually, gpu};
use cro_api::{ANNOTATION_DELETE_DEVICE, ResourceState};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use serde_json::json;

async fn driver_pods(env: &Env, node: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(env.client.clone(), common::GPU_NS)
        .list(
            &ListParams::default()
                .labels("app.kubernetes.io/component=nvidia-driver")
                .fields(&format!("spec.nodeName={node}")),
        )
        .await
        .unwrap()
        .items
}

/// The error of the (first) ComposableResource of `request`.
async fn error_of(env: &Env, request: &str) -> String {
    env.resources_of(request)
        .await
        .first()
        .and_then(|r| r.status.as_ref())
        .map(|s| s.error.clone())
        .unwrap_or_default()
}

/// Waits until the DRA kubelet plugin on `node` has published its first slice (before
/// any GPU: an empty one).
async fn wait_first_slice(env: &Env, node: &str) {
    eventually("the kubelet plugin's first slice", CONVERGE, || async {
        node_sim::slice_api(&env.client)
            .get_opt(&node_sim::slice_name(node))
            .await
            .ok()
            .flatten()
            .map(|_| ())
    })
    .await;
}

/// Device-plugin mode with the GPU operator's driver: a node without a GPU has no
/// driver pod until its first GPU is attached; the operator attaches first and waits for
/// the pod afterwards. Detaching stops the driver container's nvidia-persistenced
/// through its pid file and lives with an nvidia-smi whose drain query and reset do not
/// work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_operator_driver_first_gpu_and_device_plugin_drain_quirks() {
    let mut env = Env::start().await;
    let m1 = env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 3);
    env.start_operator().await;

    let mut spec = gpu(2);
    spec.target_node = Some("worker-1".into());
    env.create_request("first", spec.clone()).await;
    env.wait_running("first", 2).await;
    assert_eq!(env.gpus_on(&m1).len(), 2);
    let pods = driver_pods(&env, "worker-1").await;
    assert_eq!(
        pods.len(),
        1,
        "one driver pod, scheduled once the node had a GPU"
    );
    // The fabric attached the first GPU before the driver pod existed.
    let first_attach = env.sim.requests_to(fabric_sim::Route::FmAttach)[0].at;
    let first_attach = first_attach
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let created = pods[0]
        .metadata
        .creation_timestamp
        .as_ref()
        .unwrap()
        .0
        .as_second();
    assert!(
        created >= first_attach,
        "driver pod at {created}, attach at {first_attach}"
    );
    // The device plugin and DCGM were restarted to pick the GPUs up.
    eventually("device plugin and DCGM restarted", CONVERGE, || async {
        (env.node_sim
            .restarts(node_sim::DEVICE_PLUGIN_DS, "worker-1")
            >= 1
            && env.node_sim.restarts(node_sim::DCGM_DS, "worker-1") >= 1)
            .then_some(())
    })
    .await;
    let persistenced = env
        .nodes
        .with_node("worker-1", |n| n.persistenced_pid())
        .unwrap();
    assert!(
        persistenced.is_some(),
        "the driver pod runs nvidia-persistenced"
    );

    // This nvidia-smi answers the drain query in words of its own and cannot reset.
    env.nodes.with_node("worker-1", |n| {
        n.quirks = Quirks {
            drain_query_reply: Some("Drain state: N/A\n".into()),
            reset_fails: true,
        }
    });
    spec.size = 0;
    env.set_request("first", &spec).await;
    env.wait_running("first", 0).await;
    eventually("the GPUs back in the pool", CONVERGE, || async {
        (env.sim.free_devices("gpu", MODEL) == 3).then_some(())
    })
    .await;
    assert_eq!(
        env.nodes
            .with_node("worker-1", |n| n.persistenced_pid())
            .unwrap(),
        None,
        "nvidia-persistenced stopped through its pid file"
    );
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}

/// A node's first GPU waits for the driver pod the GPU operator starts only then: the
/// pod turning Ready wakes the attach through the operator's watch of driver pods, not
/// its poll (set here far beyond the test's deadline, so only the watch can finish it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_pod_ready_wakes_the_waiting_attach_without_the_poll() {
    let mut env = Env::start().await;
    env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 2);
    env.config.timings.poll_interval = std::time::Duration::from_secs(600);
    env.start_operator().await;

    let mut spec = gpu(1);
    spec.target_node = Some("worker-1".into());
    env.create_request("first", spec).await;
    env.wait_running("first", 1).await;
    let pods = driver_pods(&env, "worker-1").await;
    assert_eq!(pods.len(), 1, "the driver pod came with the first GPU");
    env.stop_operator().await.unwrap();
}

/// A pod the API server shows Ready already runs commands: the operator execs into a
/// driver pod the moment its watch shows it Ready (that is what wakes a waiting attach),
/// which can be before the kubelet's status write has even returned. The simulation
/// once marked its container runnable only after that write, and an attach woken in
/// between failed with "container not ready" (seen once in CI). Four nodes get their
/// first GPU together, so their driver pods turn Ready in one round of the simulation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_pod_shown_ready_runs_commands_at_once() {
    use cro_operator::nodeops::{CommandRunner, PodRef};
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};

    let env = Env::start().await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), common::GPU_NS);
    let config = watcher::Config::default().labels("app.kubernetes.io/component=nvidia-driver");
    let mut stream = std::pin::pin!(watcher(pods, config).applied_objects());
    let mut machines = Vec::new();
    for i in 0..4 {
        machines.push(env.add_node(&format!("worker-{i}"), "16").await);
    }
    for machine in &machines {
        env.sim.attach_directly(machine, "gpu", MODEL).unwrap();
    }

    let mut checked = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + CONVERGE;
    while checked.len() < machines.len() {
        let pod = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("every node's driver pod Ready in time")
            .expect("the pod watch ended")
            .expect("the pod watch failed");
        // Ready as the operator's driver lookup reads it.
        let ready = cro_operator::nodeops::running_and_ready(&pod);
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
        if !ready || checked.contains(&node) {
            continue;
        }
        // No await between seeing Ready and the command but the command itself.
        let target = PodRef {
            namespace: common::GPU_NS.into(),
            name: pod.name_any(),
            node: node.clone(),
            container: None,
        };
        let out = env
            .nodes
            .run(&target, &["nvidia-smi".to_string()])
            .await
            .unwrap_or_else(|e| panic!("{} shown Ready but refused a command: {e}", target.name));
        assert_eq!(out.exit_code, 0, "{out:?}");
        checked.insert(node);
    }
    env.assert_known_commands();
}

/// The driver on the host (ClusterPolicy with the driver disabled): commands run in the
/// node agent under `chroot /host-root`; the driver counts as installed when `modinfo`
/// finds it, also on a node without a GPU; after the last GPU only nvidia_drm and
/// nvidia_uvm are unloaded, so the next attach works; a missing node agent DaemonSet is
/// named in the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_driver_through_the_node_agent() {
    let setup = NodeSetup::new(DriverKind::Host, Exposure::DevicePlugin);
    let mut env = Env::start_setup(kube_harness::Harness::builder(), FabricApi::Fm, setup).await;
    let m1 = env.add_node("worker-1", "16").await;
    let m2 = env
        .add_node_with(
            "worker-2",
            "16",
            "16",
            NodeOptions {
                host_driver_installed: false,
                ..NodeOptions::default()
            },
        )
        .await;
    env.sim.add_free_devices("gpu", MODEL, 2);
    env.start_operator().await;

    let mut spec = gpu(1);
    spec.target_node = Some("worker-1".into());
    env.create_request("host", spec.clone()).await;
    env.wait_running("host", 1).await;
    assert_eq!(env.gpus_on(&m1).len(), 1);
    assert!(
        env.nodes
            .commands()
            .iter()
            .any(|(node, c)| node == "worker-1"
                && c == &["chroot", "/host-root", "modinfo", "nvidia"])
    );

    // The node's last GPU goes: only nvidia_drm and nvidia_uvm are unloaded.
    spec.size = 0;
    env.set_request("host", &spec).await;
    env.wait_running("host", 0).await;
    let (modules, unloaded) = env
        .nodes
        .with_node("worker-1", |n| (n.modules(), n.unloaded.clone()))
        .unwrap();
    assert_eq!(unloaded, vec!["nvidia_drm", "nvidia_uvm"]);
    assert!(
        modules.contains(&"nvidia".to_string()) && modules.contains(&"nvidia_modeset".to_string()),
        "{modules:?}"
    );
    // And the next attach works.
    spec.size = 1;
    env.set_request("host", &spec).await;
    env.wait_running("host", 1).await;

    // A node without the driver: a clear error, and no device attached for nothing.
    let mut bare = gpu(1);
    bare.target_node = Some("worker-2".into());
    env.create_request("bare", bare).await;
    let error = eventually("the missing driver reported", CONVERGE, || async {
        let e = error_of(&env, "bare").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert!(
        error.contains("no nvidia driver found on node worker-2"),
        "{error}"
    );
    assert!(env.gpus_on(&m2).is_empty());

    // Without the node agent DaemonSet the error says to deploy it. Its pods go with it,
    // as the garbage collector removes them (this API server runs without one).
    Api::<DaemonSet>::namespaced(env.client.clone(), common::OPERATOR_NS)
        .delete(node_sim::AGENT_DS, &DeleteParams::default())
        .await
        .unwrap();
    Api::<Pod>::namespaced(env.client.clone(), common::OPERATOR_NS)
        .delete_collection(
            &DeleteParams::default().grace_period(0),
            &ListParams::default().labels(&format!("app={}", node_sim::AGENT_DS)),
        )
        .await
        .unwrap();
    let error = eventually("the missing node agent reported", CONVERGE, || async {
        let e = error_of(&env, "bare").await;
        e.contains("DaemonSet").then_some(e)
    })
    .await;
    assert!(
        error.contains(&format!("{}/cro-node-agent", common::OPERATOR_NS))
            && error.contains("must be deployed"),
        "{error}"
    );
    assert!(env.gpus_on(&m2).is_empty());
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}

fn dra_harness() -> kube_harness::HarnessBuilder {
    kube_harness::Harness::builder()
        .apiserver_arg("--feature-gates=DRADeviceTaintRules=true")
        .apiserver_arg("--runtime-config=resource.k8s.io/v1beta2=true")
}

async fn plugin_pods(env: &Env) -> Vec<Pod> {
    Api::<Pod>::namespaced(env.client.clone(), node_sim::DRA_NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

/// DRA mode, later chart naming: Online once the kubelet plugin (restarted, never while
/// younger than 10 s) publishes the GPU in its slice; only this GPU's work blocks its
/// detach, and a DeviceTaintRule covers the GPU while it is drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_mode_attaches_through_slices_and_taints_while_detaching() {
    let setup = NodeSetup::new(DriverKind::GpuOperator, Exposure::Dra(DraNaming::Current));
    let mut env = Env::start_setup(dra_harness(), FabricApi::Fm, setup).await;
    let m1 = env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 2);
    env.start_operator().await;
    wait_first_slice(&env, "worker-1").await;

    let mut spec = gpu(2);
    spec.target_node = Some("worker-1".into());
    env.create_request("dra", spec.clone()).await;
    env.wait_running("dra", 2).await;
    assert_eq!(env.gpus_on(&m1).len(), 2);
    // The new GPUs were initialised with nvidia-smi and the plugin pod was restarted.
    assert!(
        env.nodes
            .commands()
            .iter()
            .any(|(node, c)| node == "worker-1" && c == &["nvidia-smi"])
    );
    let plugin = "dra-driver-nvidia-gpu-kubelet-plugin";
    assert!(env.node_sim.restarts(plugin, "worker-1") >= 1);
    assert!(
        plugin_pods(&env)
            .await
            .iter()
            .all(|p| p.name_any().starts_with(plugin))
    );

    // Keep A (busy: in DRA only the detached GPU's own work matters), drop B, whose
    // device file a process still holds.
    let resources = env.resources_of("dra").await;
    let (a, b) = (&resources[0], &resources[1]);
    let gpu_a = a.device_id().unwrap().to_owned();
    let gpu_b = b.device_id().unwrap().to_owned();
    env.nodes.set_busy(&gpu_a, &["python3"]);
    env.nodes.set_holder(&gpu_b, Some("4242 nv-hostengine"));
    env.resources()
        .patch(
            &b.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION_DELETE_DEVICE: "true"}}})),
        )
        .await
        .unwrap();
    spec.size = 1;
    env.set_request("dra", &spec).await;

    let error = eventually("B blocked by the holder", CONVERGE, || async {
        let r = env.resources().get(&b.name_any()).await.ok()?;
        let e = r.status.clone()?.error;
        (r.state() == ResourceState::Detaching && e.contains("4242")).then_some(e)
    })
    .await;
    assert!(error.contains("nv-hostengine"), "{error}");
    assert!(
        !error.contains("nvidia-persiste"),
        "persistenced was stopped: {error}"
    );
    // The GPU is tainted meanwhile.
    let rules: Api<DynamicObject> = Api::all_with(
        env.client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("resource.k8s.io", "v1beta2", "DeviceTaintRule"),
            "devicetaintrules",
        ),
    );
    let rule_name = format!("{}-taint", b.name_any());
    let rule = rules.get(&rule_name).await.unwrap();
    assert_eq!(rule.data["spec"]["taint"]["key"], "k8s.io/device-uuid");
    assert_eq!(rule.data["spec"]["taint"]["value"], gpu_b.as_str());
    assert_eq!(rule.data["spec"]["taint"]["effect"], "NoSchedule");
    assert_eq!(
        rule.data["spec"]["deviceSelector"]["driver"],
        node_sim::DRA_SLICE_DRIVER
    );
    assert_eq!(rule.data["spec"]["deviceSelector"]["pool"], "worker-1");

    // The holder exits: B is detached, its taint removed; A stays although busy.
    env.nodes.set_holder(&gpu_b, None);
    env.wait_running("dra", 1).await;
    assert_eq!(env.gpus_on(&m1), vec![gpu_a.clone()]);
    assert!(rules.get_opt(&rule_name).await.unwrap().is_none());
    assert_eq!(
        common::names(&env.resources_of("dra").await),
        vec![a.name_any()]
    );
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}

/// The Ready condition of the (first) ComposableResource of `request` while it is
/// Attaching with no error: (reason, message).
async fn attaching_wait(env: &Env, request: &str) -> Option<(String, String)> {
    let res = env.resources_of(request).await.into_iter().next()?;
    let status = res.status.as_ref()?;
    if res.state() != ResourceState::Attaching || !status.error.is_empty() {
        return None;
    }
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
    (ready.status == "False").then(|| (ready.reason.clone(), ready.message.clone()))
}

/// A GPU the fabric attached waits on its node, and its resource says for what, in the
/// Ready condition and without an error (beside the Go operator it sat in `Attaching`
/// with an empty error): first the driver pod the GPU operator starts once the node has
/// a GPU, then (DRA) the kubelet plugin publishing the GPU in a ResourceSlice. Both
/// are slowed down here so the test sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attach_waiting_on_its_node_says_what_it_waits_for() {
    let mut setup = NodeSetup::new(DriverKind::GpuOperator, Exposure::Dra(DraNaming::Current));
    setup.timings.driver_ready_after = std::time::Duration::from_secs(4);
    setup.timings.slice_after_ready = std::time::Duration::from_secs(4);
    let mut env = Env::start_setup(dra_harness(), FabricApi::Fm, setup).await;
    env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 1);
    env.start_operator().await;
    wait_first_slice(&env, "worker-1").await;

    let mut spec = gpu(1);
    spec.target_node = Some("worker-1".into());
    env.create_request("waits", spec).await;
    let (reason, message) = eventually("the wait for the driver pod", CONVERGE, || async {
        attaching_wait(&env, "waits")
            .await
            .filter(|(_, m)| m.contains("not Ready"))
    })
    .await;
    let pod = driver_pods(&env, "worker-1").await[0].name_any();
    assert_eq!(reason, "WaitingForDriver");
    assert_eq!(
        message,
        format!("waiting for the NVIDIA driver pod on node worker-1 (pod {pod} not Ready)")
    );

    let (reason, message) = eventually("the wait for the ResourceSlice", CONVERGE, || async {
        attaching_wait(&env, "waits")
            .await
            .filter(|(r, _)| r == "WaitingForDevice")
    })
    .await;
    let gpu = env.resources_of("waits").await[0]
        .device_id()
        .unwrap()
        .to_owned();
    assert_eq!(reason, "WaitingForDevice");
    assert!(
        message.starts_with(&format!(
            "waiting for GPU {gpu} in node worker-1's ResourceSlice"
        )),
        "{message}"
    );
    // Nothing failed: the request shows no error either.
    let req = env.request("waits").await.unwrap();
    assert_eq!(req.status.unwrap().error, "");

    env.wait_running("waits", 1).await;
    // Written right after the state: the wait is gone once Online.
    eventually("Ready=True, Online", CONVERGE, || async {
        let res = env.resources_of("waits").await.into_iter().next()?;
        let status = res.status?;
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
        (ready.status == "True" && ready.reason == "Online" && status.error.is_empty())
            .then_some(())
    })
    .await;
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}

/// DRA mode with the v0.2.0-era chart (kubelet plugin pods
/// `nvidia-dra-driver-gpu-kubelet-plugin-*`), over the Cluster Manager API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_mode_with_the_older_plugin_naming_over_the_cluster_manager() {
    let setup = NodeSetup::new(DriverKind::GpuOperator, Exposure::Dra(DraNaming::V020));
    let mut env = Env::start_setup(dra_harness(), FabricApi::Cm, setup).await;
    let m1 = env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 1);
    env.start_operator().await;
    wait_first_slice(&env, "worker-1").await;

    env.create_request("old", gpu(1)).await;
    env.wait_running("old", 1).await;
    assert_eq!(env.gpus_on(&m1).len(), 1);
    let plugin = "nvidia-dra-driver-gpu-kubelet-plugin";
    assert!(env.node_sim.restarts(plugin, "worker-1") >= 1);

    env.set_request("old", &gpu(0)).await;
    env.wait_running("old", 0).await;
    eventually("the GPU back in the pool", CONVERGE, || async {
        (env.sim.free_devices("gpu", MODEL) == 1).then_some(())
    })
    .await;
    // The slice no longer lists it.
    let slice = node_sim::slice_api(&env.client)
        .get(&node_sim::slice_name("worker-1"))
        .await
        .unwrap();
    let devices = &slice.data["spec"]["devices"];
    assert!(devices.as_array().is_none_or(|d| d.is_empty()), "{devices}");
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}

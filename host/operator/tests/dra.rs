//! DRA mode (SPEC §4, NODE_OPS): Online once a ResourceSlice lists the GPU, the kubelet
//! plugin restarted after attach, only this GPU's work blocks its detach, and a
//! DeviceTaintRule covers the GPU while it is drained.

mod common;

use common::dra::{DRIVER, PLUGIN_NS, add_plugin_pod, plugin_pod_name, publish_slices};
use common::{CONVERGE, Env, MODEL, eventually, gpu};
use cro_api::{ANNOTATION_DELETE_DEVICE, ResourceState};
use cro_operator::nodeops::ExposureMode;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_mode_attaches_through_slices_and_taints_while_detaching() {
    let builder = kube_harness::Harness::builder()
        .apiserver_arg("--feature-gates=DRADeviceTaintRules=true")
        .apiserver_arg("--runtime-config=resource.k8s.io/v1beta2=true");
    let mut env = Env::start_with(builder, common::FabricApi::Fm).await;
    let m1 = env.add_node("worker-1", "16").await;
    add_plugin_pod(&env, "worker-1").await;
    env.sim.add_free_devices("gpu", MODEL, 2);
    env.config.mode = ExposureMode::Dra;
    let publisher = publish_slices(
        env.client.clone(),
        env.nodes.clone(),
        vec!["worker-1".into()],
    );
    env.start_operator().await;

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
    // Without a kubelet the deleted pod stays, terminating.
    let plugin_pods: Api<Pod> = Api::namespaced(env.client.clone(), PLUGIN_NS);
    let plugin = plugin_pods
        .get_opt(&plugin_pod_name("worker-1"))
        .await
        .unwrap();
    assert!(plugin.is_none_or(|p| p.metadata.deletion_timestamp.is_some()));

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
    assert_eq!(rule.data["spec"]["deviceSelector"]["driver"], DRIVER);
    assert_eq!(rule.data["spec"]["deviceSelector"]["pool"], "worker-1");

    // The holder exits: B is detached, its taint removed; A stays although busy.
    env.nodes.set_holder(&gpu_b, None);
    env.wait_running("dra", 1).await;
    assert_eq!(env.gpus_on(&m1), vec![gpu_a.clone()]);
    assert!(rules.get_opt(&rule_name).await.unwrap().is_none());
    assert_eq!(names_of(&env).await, vec![a.name_any()]);
    publisher.abort();
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}

async fn names_of(env: &Env) -> Vec<String> {
    common::names(&env.resources_of("dra").await)
}

//! A stand-in for the NVIDIA DRA kubelet plugin: publishes one ResourceSlice per node
//! listing the GPUs nvidia-smi lists there, and its plugin pods (which the operator
//! deletes to make the plugin rescan).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams, PostParams,
};
use serde_json::json;
use tokio::task::JoinHandle;

use super::Env;
use super::nodes::SimNodes;

pub const DRIVER: &str = "dra-driver-nvidia-gpu";
pub const PLUGIN_NS: &str = "nvidia-dra-driver-gpu";

pub fn slice_api(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceSlice");
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "resourceslices"),
    )
}

fn slice(node: &str, gpus: &[String]) -> DynamicObject {
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", "ResourceSlice");
    let mut obj = DynamicObject::new(
        &format!("{node}-gpus"),
        &ApiResource::from_gvk_with_plural(&gvk, "resourceslices"),
    );
    let devices: Vec<_> = gpus
        .iter()
        .enumerate()
        .map(|(i, uuid)| json!({"name": format!("gpu-{i}"), "attributes": {"uuid": {"string": uuid}}}))
        .collect();
    obj.data = json!({"spec": {
        "driver": DRIVER,
        "nodeName": node,
        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        "devices": devices,
    }});
    obj
}

/// Keeps the slices of `nodes` equal to what nvidia-smi lists, every 100 ms.
pub fn publish_slices(
    client: kube::Client,
    runner: SimNodes,
    nodes: Vec<String>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let api = slice_api(&client);
        let mut published: BTreeMap<String, Vec<String>> = BTreeMap::new();
        loop {
            for node in &nodes {
                let gpus = runner.listed(node);
                if published.get(node) == Some(&gpus) {
                    continue;
                }
                let params = PatchParams::apply("test-dra-plugin").force();
                match api
                    .patch(
                        &format!("{node}-gpus"),
                        &params,
                        &Patch::Apply(slice(node, &gpus)),
                    )
                    .await
                {
                    Ok(_) => {
                        published.insert(node.clone(), gpus);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, node, "cannot publish the test ResourceSlice")
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

pub fn plugin_pod_name(node: &str) -> String {
    format!("dra-driver-nvidia-gpu-kubelet-plugin-{node}")
}

/// The DRA kubelet plugin pod of `node` (no kubelet: it just exists until deleted).
pub async fn add_plugin_pod(env: &Env, node: &str) {
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    if namespaces.get_opt(PLUGIN_NS).await.unwrap().is_none() {
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(PLUGIN_NS.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    }
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": plugin_pod_name(node), "labels": {"app.kubernetes.io/name": DRIVER}},
        "spec": {"nodeName": node, "containers": [{"name": "plugin", "image": "nvcr.io/nvidia/k8s-dra-driver-gpu:v25"}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(env.client.clone(), PLUGIN_NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

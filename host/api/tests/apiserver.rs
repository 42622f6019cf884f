//! The generated CRDs on a real kube-apiserver (started by kube-harness): Go manifests are
//! accepted unchanged, the schema refuses what the Go operator's refused, defaults are
//! filled in, status goes only through the status subresource, and `kubectl get` shows
//! useful columns.

use cro_api::{
    ComposabilityRequest, ComposableResource, ComposableResourceStatus, RequestState,
    ResourceState, ResourceType,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

const GO_README_REQUEST: &str = include_str!("fixtures/go-readme-request.yaml");

async fn client() -> kube::Client {
    kube_harness::shared().await.unwrap().client().unwrap()
}

fn request_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        cro_api::GROUP,
        cro_api::VERSION,
        "ComposabilityRequest",
    ))
}

/// The Go README example as raw JSON, renamed so tests do not collide.
fn go_request(name: &str) -> Value {
    let mut v: Value = serde_yaml::from_str(GO_README_REQUEST).unwrap();
    v["metadata"]["name"] = json!(name);
    v
}

/// Sends `manifest` exactly as written (no typed round trip).
async fn create_raw(client: &kube::Client, manifest: &Value) -> Result<DynamicObject, kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &request_resource());
    let obj: DynamicObject = serde_json::from_value(manifest.clone()).unwrap();
    api.create(&PostParams::default(), &obj).await
}

#[tokio::test]
async fn the_go_readme_request_is_accepted_unchanged() {
    let client = client().await;
    let manifest: Value = serde_yaml::from_str(GO_README_REQUEST).unwrap();
    let created = create_raw(&client, &manifest).await.unwrap();
    assert_eq!(
        created.data["spec"], manifest["spec"],
        "the API server changed or pruned the spec"
    );

    let typed: Api<ComposabilityRequest> = Api::all(client);
    let req = typed.get("gpu-request").await.unwrap();
    let r = &req.spec.resource;
    assert_eq!(
        (r.resource_type, r.model.as_str(), r.size),
        (ResourceType::Gpu, "NVIDIA-A100-PCIE-40GB", 2)
    );
    assert_eq!(r.target_node(), Some("worker-2"));
    assert_eq!(
        r.other_spec.as_ref().map(|o| (
            o.milli_cpu,
            o.memory,
            o.ephemeral_storage,
            o.allowed_pod_number
        )),
        Some((2, 40, 2, 5))
    );
    assert_eq!(req.state(), RequestState::Empty);
    typed
        .delete("gpu-request", &Default::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn the_schema_refuses_invalid_requests() {
    let client = client().await;
    let cases: [(&str, &str, Value, &str); 6] = [
        (
            "bad-type",
            "/spec/resource/type",
            json!("fpga"),
            "spec.resource.type: Unsupported value: \"fpga\"",
        ),
        (
            "negative-size",
            "/spec/resource/size",
            json!(-1),
            "spec.resource.size: Invalid value: -1",
        ),
        (
            "empty-model",
            "/spec/resource/model",
            json!(""),
            "spec.resource.model: Invalid value: \"\"",
        ),
        (
            "bad-policy",
            "/spec/resource/allocation_policy",
            json!("anynode"),
            "spec.resource.allocation_policy: Unsupported value: \"anynode\"",
        ),
        (
            "negative-memory",
            "/spec/resource/other_spec/memory",
            json!(-5),
            "spec.resource.other_spec.memory: Invalid value: -5",
        ),
        (
            "string-size",
            "/spec/resource/size",
            json!("two"),
            "spec.resource.size: Invalid value: \"string\"",
        ),
    ];
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &request_resource());
    for (name, pointer, value, expected) in cases {
        let mut manifest = go_request(name);
        *manifest.pointer_mut(pointer).unwrap() = value;
        match create_raw(&client, &manifest).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{name}: {status:?}");
                assert!(
                    status.message.contains(expected),
                    "{name}: {:?} lacks {expected:?}",
                    status.message
                );
            }
            other => panic!("{name}: expected a 422 refusal, got {other:?}"),
        }
        assert!(
            api.get_opt(name).await.unwrap().is_none(),
            "{name} was stored"
        );
    }

    // Required fields of the Go schema are required here too.
    let mut manifest = go_request("no-size");
    manifest["spec"]["resource"]
        .as_object_mut()
        .unwrap()
        .remove("size");
    let err = create_raw(&client, &manifest).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.message.contains("spec.resource.size: Required value")),
        "{err:?}"
    );
}

#[tokio::test]
async fn allocation_policy_defaults_to_samenode() {
    let client = client().await;
    let mut manifest = go_request("defaulted-policy");
    let resource = manifest["spec"]["resource"].as_object_mut().unwrap();
    for optional in [
        "allocation_policy",
        "force_detach",
        "target_node",
        "other_spec",
    ] {
        resource.remove(optional);
    }
    let created = create_raw(&client, &manifest).await.unwrap();
    assert_eq!(
        created.data["spec"]["resource"]["allocation_policy"],
        "samenode"
    );
    // Only the policy has a default; the other optional fields stay absent.
    assert_eq!(
        created.data["spec"]["resource"].as_object().unwrap().len(),
        4
    );

    let api: Api<DynamicObject> = Api::all_with(client, &request_resource());
    let stored = api.get("defaulted-policy").await.unwrap();
    assert_eq!(
        stored.data["spec"]["resource"]["allocation_policy"],
        "samenode"
    );
    api.delete("defaulted-policy", &Default::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn request_status_is_written_only_through_the_status_subresource() {
    let client = client().await;
    let api: Api<ComposabilityRequest> = Api::all(client.clone());
    let mut req: ComposabilityRequest = serde_json::from_value(go_request("status-only")).unwrap();
    req.status = Some(cro_api::ComposabilityRequestStatus {
        state: RequestState::Running,
        ..Default::default()
    });
    let created = api.create(&PostParams::default(), &req).await.unwrap();
    assert_eq!(created.status, None, "create must ignore status");

    // A status patch works, and an unknown state is stored and read back verbatim.
    let patch = json!({"status": {"state": "Exploding", "error": "boom", "resources": {
        "gpu-1": {"state": "Online", "device_id": "GPU-1", "cdi_device_id": "c-1", "node_name": "worker-2"}
    }}});
    let patched = api
        .patch_status(
            "status-only",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
    let status = patched.status.clone().unwrap();
    assert_eq!(status.state, RequestState::Unknown("Exploding".into()));
    assert_eq!(status.resources["gpu-1"].state, ResourceState::Online);
    assert_eq!(status.resources["gpu-1"].device_id, "GPU-1");

    // A normal update changes the spec but ignores the status it carries.
    let mut update = patched.clone();
    update.spec.resource.size = 3;
    update.status.as_mut().unwrap().state = RequestState::Deleting;
    let updated = api
        .replace("status-only", &PostParams::default(), &update)
        .await
        .unwrap();
    assert_eq!(updated.spec.resource.size, 3);
    assert_eq!(updated.status, patched.status);

    // replace_status works too, and the spec it carries is ignored.
    let mut with_status = updated.clone();
    with_status.spec.resource.size = 9;
    with_status.status.as_mut().unwrap().state = RequestState::Running;
    with_status.status.as_mut().unwrap().scalar_resource = Some(updated.spec.resource.clone());
    let replaced = api
        .replace_status("status-only", &PostParams::default(), &with_status)
        .await
        .unwrap();
    assert_eq!(replaced.state(), RequestState::Running);
    assert_eq!(replaced.spec.resource.size, 3);
    assert_eq!(replaced.status.unwrap().scalar_resource.unwrap().size, 3);
    api.delete("status-only", &Default::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn resource_status_is_written_only_through_the_status_subresource() {
    let client = client().await;
    let api: Api<ComposableResource> = Api::all(client);
    let request: ComposabilityRequest = serde_json::from_value(go_request("owner")).unwrap();
    let mut res = ComposableResource::for_request("owner", &request.spec.resource, "worker-2");
    let name = res.name_any();
    res.status = Some(ComposableResourceStatus {
        state: ResourceState::Online,
        ..Default::default()
    });
    let created = api.create(&PostParams::default(), &res).await.unwrap();
    assert_eq!(created.status, None);
    assert_eq!(created.managed_by(), Some("owner"));
    assert_eq!(created.spec, res.spec);

    let status = ComposableResourceStatus {
        state: ResourceState::Attaching,
        error: String::new(),
        device_id: "GPU-abc".into(),
        cdi_device_id: "fab-1".into(),
        conditions: vec![ready_condition("False", "Attaching", 1)],
    };
    let patched = api
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap();
    assert_eq!(patched.status.as_ref(), Some(&status));
    assert_eq!(
        (patched.device_id(), patched.cdi_device_id()),
        (Some("GPU-abc"), Some("fab-1"))
    );

    // A merge patch replaces the whole conditions list, and the server keeps every field.
    let online = ComposableResourceStatus {
        state: ResourceState::Online,
        conditions: vec![ready_condition("True", "Online", 1)],
        ..status.clone()
    };
    let patched = api
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": online})),
        )
        .await
        .unwrap();
    assert_eq!(patched.status.as_ref(), Some(&online));
    let raw: Api<DynamicObject> = Api::all_with(
        api.clone().into_client(),
        &ApiResource::erase::<ComposableResource>(&()),
    );
    let stored = raw.get(&name).await.unwrap();
    assert_eq!(
        stored.data["status"]["conditions"],
        json!([{"type": "Ready", "status": "True", "reason": "Online", "message": "ready",
                "lastTransitionTime": "2026-01-02T03:04:05Z", "observedGeneration": 1}])
    );

    // Because every status field is serialized, a merge patch clears ids.
    let cleared = ComposableResourceStatus {
        state: ResourceState::Deleting,
        ..Default::default()
    };
    let patched = api
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": cleared})),
        )
        .await
        .unwrap();
    assert_eq!(patched.device_id(), None);
    assert_eq!(patched.state(), ResourceState::Deleting);

    let mut update = patched.clone();
    update.status = Some(status);
    let updated = api
        .replace(&name, &PostParams::default(), &update)
        .await
        .unwrap();
    assert_eq!(updated.status, patched.status);
    api.delete(&name, &Default::default()).await.unwrap();
}

fn ready_condition(status: &str, reason: &str, generation: i64) -> Condition {
    Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: reason.into(),
        message: if status == "True" { "ready" } else { "not yet" }.into(),
        last_transition_time: Time("2026-01-02T03:04:05Z".parse().unwrap()),
        observed_generation: Some(generation),
    }
}

/// What `kubectl get` shows: the server-side table of the object.
async fn table(client: &kube::Client, plural: &str, name: &str) -> Value {
    let uri = format!("/apis/{}/{plural}/{name}", cro_api::API_VERSION);
    let request = http::Request::get(uri)
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .unwrap();
    client.request(request).await.unwrap()
}

fn column_names(table: &Value) -> Vec<String> {
    table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn kubectl_get_shows_state_type_model_size_node_and_age() {
    let client = client().await;
    let requests: Api<ComposabilityRequest> = Api::all(client.clone());
    let req: ComposabilityRequest = serde_json::from_value(go_request("columns")).unwrap();
    requests.create(&PostParams::default(), &req).await.unwrap();
    requests
        .patch_status(
            "columns",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"state": "Running"}})),
        )
        .await
        .unwrap();
    let t = table(
        &client,
        ComposabilityRequest::plural(&()).as_ref(),
        "columns",
    )
    .await;
    assert_eq!(
        column_names(&t),
        [
            "Name",
            "State",
            "Type",
            "Model",
            "Size",
            "Policy",
            "Target Node",
            "Error",
            "Age"
        ]
    );
    let cells = t["rows"][0]["cells"].as_array().unwrap();
    assert_eq!(
        cells[0..7],
        [
            json!("columns"),
            json!("Running"),
            json!("gpu"),
            json!("NVIDIA-A100-PCIE-40GB"),
            json!(2),
            json!("samenode"),
            json!("worker-2")
        ]
    );

    let resources: Api<ComposableResource> = Api::all(client.clone());
    let res = ComposableResource::for_request("columns", &req.spec.resource, "worker-2");
    let name = res.name_any();
    resources
        .create(&PostParams::default(), &res)
        .await
        .unwrap();
    resources
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({"status": {"state": "Online", "device_id": "GPU-7", "cdi_device_id": "f-7"}})))
        .await
        .unwrap();
    let t = table(&client, ComposableResource::plural(&()).as_ref(), &name).await;
    assert_eq!(
        column_names(&t),
        [
            "Name",
            "State",
            "Type",
            "Model",
            "Node",
            "Device ID",
            "CDI Device ID",
            "Error",
            "Age"
        ]
    );
    let cells = t["rows"][0]["cells"].as_array().unwrap();
    assert_eq!(
        cells[0..7],
        [
            json!(name),
            json!("Online"),
            json!("gpu"),
            json!("NVIDIA-A100-PCIE-40GB"),
            json!("worker-2"),
            json!("GPU-7"),
            json!("f-7")
        ]
    );
    // Priority-1 columns are the ones `kubectl get -o wide` adds.
    let wide_only: Vec<_> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["priority"] == 1)
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(wide_only, ["CDI Device ID", "Error"]);

    resources.delete(&name, &Default::default()).await.unwrap();
    requests
        .delete("columns", &Default::default())
        .await
        .unwrap();
}

fn provider_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        cro_api::GROUP,
        cro_api::VERSION,
        "CdiProvider",
    ))
}

/// A complete, valid `CdiProvider` pulling its component from a registry by digest.
fn provider_manifest(name: &str) -> Value {
    json!({
        "apiVersion": cro_api::API_VERSION,
        "kind": "CdiProvider",
        "metadata": {"name": name},
        "spec": {
            "source": {"oci": {
                "reference": format!("registry.example:5000/cro/fti-provider:1.0@sha256:{}", "a".repeat(64)),
                "pullSecret": {"name": "pull", "namespace": "cro-system"}
            }},
            "config": {"api_type": "FM", "endpoint": "https://fm.example:8443/"},
            "grants": {
                "http": [{"url": "https://fm.example:8443"}],
                "secret": {"namespace": "cro-system", "name": "credentials", "keys": ["username", "password"]},
                "lookup": [{"api_version": "v1", "kind": "Node"}],
                "wasi": {"clocks": true}
            },
            "limits": {"call_timeout_ms": 30000, "max_concurrent_calls": 8},
            "nodeSelector": {"matchLabels": {"fabric": "fti-a"}},
            "default": true
        }
    })
}

async fn create_provider(
    client: &kube::Client,
    manifest: &Value,
) -> Result<DynamicObject, kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &provider_resource());
    let obj: DynamicObject = serde_json::from_value(manifest.clone()).unwrap();
    api.create(&PostParams::default(), &obj).await
}

#[tokio::test]
async fn a_valid_cdi_provider_is_stored_unchanged_and_reads_back_typed() {
    let client = client().await;
    let manifest = provider_manifest("valid-provider");
    let created = create_provider(&client, &manifest).await.unwrap();
    assert_eq!(
        created.data["spec"], manifest["spec"],
        "the API server changed or pruned the spec"
    );
    let typed: Api<cro_api::CdiProvider> = Api::all(client.clone());
    let p = typed.get("valid-provider").await.unwrap();
    assert!(p.spec.default);
    assert!(matches!(
        p.spec.source.kind(),
        Some(cro_api::SourceKind::Oci(o)) if o.pull_secret.as_ref().map(|s| s.name.as_str()) == Some("pull")
    ));
    assert_eq!(p.spec.limits.max_concurrent_calls, Some(8));

    // The other two sources are accepted too.
    for (name, source) in [
        (
            "https-provider",
            json!({"https": {"url": "https://dl.example/fti.wasm", "sha256": "0".repeat(64)}}),
        ),
        (
            "configmap-provider",
            json!({"configMap": {"name": "fti", "namespace": "cro-system", "key": "fti.wasm"}}),
        ),
    ] {
        let mut m = provider_manifest(name);
        m["spec"]["source"] = source;
        create_provider(&client, &m)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        typed.delete(name, &Default::default()).await.unwrap();
    }

    // kubectl get shows readiness, default, contract and version.
    let table = table(&client, "cdiproviders", "valid-provider").await;
    let columns = column_names(&table);
    for wanted in ["Name", "Ready", "Default", "Contract", "Version", "Age"] {
        assert!(
            columns.iter().any(|c| c == wanted),
            "{wanted} in {columns:?}"
        );
    }
    typed
        .delete("valid-provider", &Default::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn the_schema_refuses_invalid_cdi_providers() {
    let client = client().await;
    let digest = "b".repeat(64);
    let cases: Vec<(&str, Value, String)> = vec![
        (
            "no-source",
            json!({}),
            cro_api::CDI_PROVIDER_SOURCE_EXACTLY_ONE.to_owned(),
        ),
        (
            "two-sources",
            json!({
                "https": {"url": "https://dl.example/fti.wasm", "sha256": digest},
                "configMap": {"name": "fti", "namespace": "cro-system", "key": "fti.wasm"}
            }),
            cro_api::CDI_PROVIDER_SOURCE_EXACTLY_ONE.to_owned(),
        ),
        (
            "short-sha",
            json!({"https": {"url": "https://dl.example/fti.wasm", "sha256": "abc"}}),
            "spec.source.https.sha256: Invalid value: \"abc\"".to_owned(),
        ),
        (
            "upper-sha",
            json!({"https": {"url": "https://dl.example/fti.wasm", "sha256": "A".repeat(64)}}),
            "spec.source.https.sha256: Invalid value".to_owned(),
        ),
        (
            "plain-http",
            json!({"https": {"url": "http://dl.example/fti.wasm", "sha256": digest}}),
            "spec.source.https.url: Invalid value: \"http://dl.example/fti.wasm\"".to_owned(),
        ),
        (
            "oci-by-tag",
            json!({"oci": {"reference": "registry.example/cro/fti:1.0"}}),
            "spec.source.oci.reference: Invalid value: \"registry.example/cro/fti:1.0\"".to_owned(),
        ),
        (
            "oci-short-digest",
            json!({"oci": {"reference": "registry.example/cro/fti@sha256:1234"}}),
            "spec.source.oci.reference: Invalid value".to_owned(),
        ),
        (
            "pull-secret-no-namespace",
            json!({"oci": {"reference": format!("registry.example/cro/fti@sha256:{digest}"),
                   "pullSecret": {"name": "pull"}}}),
            "spec.source.oci.pullSecret.namespace: Required value".to_owned(),
        ),
        (
            "configmap-no-key",
            json!({"configMap": {"name": "fti", "namespace": "cro-system"}}),
            "spec.source.configMap.key: Required value".to_owned(),
        ),
    ];
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &provider_resource());
    for (name, source, expected) in cases {
        let mut manifest = provider_manifest(name);
        manifest["spec"]["source"] = source;
        match create_provider(&client, &manifest).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{name}: {status:?}");
                assert!(
                    status.message.contains(&expected),
                    "{name}: {:?} lacks {expected:?}",
                    status.message
                );
            }
            other => panic!("{name}: expected a 422 refusal, got {other:?}"),
        }
        assert!(
            api.get_opt(name).await.unwrap().is_none(),
            "{name} was stored"
        );
    }

    // Grants and limits are checked like a spec file's fields.
    let mut manifest = provider_manifest("bad-grant");
    manifest["spec"]["grants"]["secret"]["keys"] = json!([]);
    manifest["spec"]["limits"]["max_concurrent_calls"] = json!(0);
    let err = create_provider(&client, &manifest).await.unwrap_err();
    let kube::Error::Api(status) = &err else {
        panic!("{err:?}")
    };
    for expected in [
        "spec.grants.secret.keys: Invalid value",
        "spec.limits.max_concurrent_calls: Invalid value: 0",
    ] {
        assert!(
            status.message.contains(expected),
            "{:?} lacks {expected:?}",
            status.message
        );
    }
    let mut manifest = provider_manifest("unknown-grant");
    manifest["spec"]["grants"]["files"] = json!(["/etc"]);
    let err = create_provider(&client, &manifest).await;
    // Unknown fields are pruned by a structural schema, never granted: the stored object
    // has no `files`.
    if let Ok(created) = err {
        assert!(created.data["spec"]["grants"].get("files").is_none());
        api.delete("unknown-grant", &Default::default())
            .await
            .unwrap();
    }
}

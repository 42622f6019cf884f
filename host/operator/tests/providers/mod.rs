//! Several providers as `CdiProvider` objects on the real API server: routing two node
//! pools to two providers, routing errors, hot reload under load, the deletion
//! finalizer and the Secret namespace rule (crate::registry, docs/providers.md).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cro_api::{
    CONDITION_DEGRADED, CONDITION_READY, CdiProvider, CdiProviderSpec, ComponentSource,
    ConfigMapSource,
};
use cro_operator::Operator;
use cro_operator::config::ProviderSource;
use cro_operator::source::FetchOptions;
use fabric_sim::{FabricSim, Route};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::common::cdi::{another_fabric, fti_spec_for, label_node, pool, put_component};
use crate::common::{CONVERGE, Env, OPERATOR_NS, eventually, gpu};

// Several replicas sharing the providers (process/shards.rs): a test of its own module.
mod replicas;

/// The FTI provider's spec for `env`'s fabric, as the Go environment defines it, with
/// the CA given inline (a CdiProvider has no files).
fn fti_spec(env: &Env) -> (CdiProviderSpec, tempfile::NamedTempFile) {
    fti_spec_for(&env.sim)
}

fn source(name: &str, key: &str) -> ComponentSource {
    ComponentSource {
        config_map: Some(ConfigMapSource {
            name: name.into(),
            namespace: OPERATOR_NS.into(),
            key: key.into(),
        }),
        ..ComponentSource::default()
    }
}

fn providers(env: &Env) -> Api<CdiProvider> {
    Api::all(env.client.clone())
}

async fn create_provider(env: &Env, name: &str, spec: CdiProviderSpec) {
    providers(env)
        .create(&PostParams::default(), &CdiProvider::new(name, spec))
        .await
        .unwrap();
}

fn condition(p: &CdiProvider, type_: &str) -> Option<(String, String)> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// Waits until `name` serves the component with `digest` (any when None), not degraded.
async fn wait_loaded(env: &Env, name: &str, digest: Option<&str>) -> CdiProvider {
    eventually(&format!("CdiProvider {name} loaded"), CONVERGE, || async {
        let p = providers(env).get(name).await.ok()?;
        let s = p.status.as_ref()?;
        (condition(&p, CONDITION_READY)? == ("True".into(), "Loaded".into())
            && condition(&p, CONDITION_DEGRADED)?.0 == "False"
            && s.observed_generation == p.metadata.generation
            && digest.is_none_or(|d| s.loaded_digest.as_deref() == Some(d)))
        .then_some(p)
    })
    .await
}

async fn start_objects_operator(env: &mut Env) {
    let mut config = env.config.clone();
    config.provider = ProviderSource::Objects;
    config.credentials = None;
    let operator = Operator::for_objects(
        env.client.clone(),
        Arc::new(env.nodes.clone()),
        config,
        FetchOptions::default(),
    );
    env.start_built_operator(operator).await;
}

fn fti_bytes() -> Vec<u8> {
    std::fs::read(cro_test_support::component("fti-provider")).unwrap()
}

async fn events_about(env: &Env, ns: Option<&str>, name: &str) -> Vec<(String, String)> {
    let api: Api<k8s_openapi::api::events::v1::Event> = match ns {
        Some(ns) => Api::namespaced(env.client.clone(), ns),
        None => Api::all(env.client.clone()),
    };
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// CdiProviders of the FTI component (from a ConfigMap): `fabric-a` serving node pool
/// `a` on `env`'s fabric, `fabric-b` serving pool `b` on `sim_b`. Returns fabric a's spec
/// (for more providers on that fabric) and the CA files, to keep while the test runs.
async fn providers_for_pools_a_and_b(
    env: &Env,
    sim_b: &FabricSim,
) -> (CdiProviderSpec, [tempfile::NamedTempFile; 2]) {
    put_component(env, "fti", "fti.wasm", fti_bytes()).await;
    let (base, ca) = fti_spec(env);
    let (spec_b, ca_b) = fti_spec_for(sim_b);
    for (name, p, spec) in [("fabric-a", "a", &base), ("fabric-b", "b", &spec_b)] {
        let mut spec = spec.clone();
        spec.node_selector = pool(p);
        create_provider(env, name, spec).await;
    }
    (base, [ca, ca_b])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_providers_serve_two_node_pools_and_routing_errors_are_reported() {
    let mut env = Env::start().await;
    // Two fabrics: pool a (and c) on the environment's, pool b on a second fabric
    // with its own tenant, CA and machines (the same log-in, so one Secret serves both).
    let sim_b = another_fabric(&env);
    let machine_a = env.add_node("pool-a-1", "16").await;
    let machine_b = env.add_node_on_fabric("pool-b-1", "16", &sim_b).await;
    let machine_c = env.add_node("pool-c-1", "16").await;
    label_node(&env, "pool-a-1", "a").await;
    label_node(&env, "pool-b-1", "b").await;
    label_node(&env, "pool-c-1", "c").await;
    env.sim.add_free_devices("gpu", crate::common::MODEL, 4);
    sim_b.add_free_devices("gpu", crate::common::MODEL, 2);
    let (base, _cas) = providers_for_pools_a_and_b(&env, &sim_b).await;
    start_objects_operator(&mut env).await;
    let a = wait_loaded(&env, "fabric-a", None).await;
    wait_loaded(&env, "fabric-b", None).await;
    let status = a.status.unwrap();
    assert!(status.loaded_digest.unwrap().starts_with("sha256:"));
    assert_eq!(status.contract_version.as_deref(), Some("0.3.0"));
    assert!(!status.describe.unwrap().vendor.is_empty());

    for (req, node) in [("on-a", "pool-a-1"), ("on-b", "pool-b-1")] {
        let mut d = gpu(1);
        d.target_node = Some(node.into());
        env.create_request(req, d).await;
    }
    env.wait_running("on-a", 1).await;
    env.wait_running("on-b", 1).await;
    // Each fabric attached a device to its own pool's machine and to nothing else: the
    // second fabric does not know pool a's machine, the first not pool b's.
    let attached = |sim: &FabricSim| -> Vec<(String, usize)> {
        sim.machines()
            .iter()
            .map(|m| (m.uuid.clone(), sim.machine_devices(&m.uuid).len()))
            .filter(|(_, n)| *n > 0)
            .collect()
    };
    assert_eq!(attached(&env.sim), vec![(machine_a.clone(), 1)]);
    assert_eq!(attached(&sim_b), vec![(machine_b.clone(), 1)]);
    assert!(sim_b.machines().iter().all(|m| m.uuid == machine_b));
    // Each provider's device listing (the upstream sync's, every 500 ms here) asks its
    // fabric about the nodes routed to it alone: fabric a never about pool b's machine
    // (which it does not know) nor pool c's (which no provider serves), fabric b never
    // about pool a's or pool c's (crate::provider::node_scope).
    let machines_read = |sim: &FabricSim| -> BTreeMap<String, usize> {
        let mut read = BTreeMap::new();
        for r in sim.requests_to(Route::FmGetMachine) {
            let machine = r.path.rsplit('/').next().unwrap_or_default().to_owned();
            *read.entry(machine).or_default() += 1;
        }
        read
    };
    eventually("both fabrics listed twice", CONVERGE, || async {
        let a = machines_read(&env.sim)
            .get(&machine_a)
            .copied()
            .unwrap_or(0);
        let b = machines_read(&sim_b).get(&machine_b).copied().unwrap_or(0);
        (a >= 2 && b >= 2).then_some(())
    })
    .await;
    let asked = |sim: &FabricSim| machines_read(sim).into_keys().collect::<Vec<_>>();
    assert_eq!(
        asked(&env.sim),
        vec![machine_a.clone()],
        "pool c: {machine_c}"
    );
    assert_eq!(asked(&sim_b), vec![machine_b.clone()]);
    // The simulated nodes see their own fabric's device through the driver.
    assert_eq!(env.nodes.listed("pool-a-1").len(), 1);
    assert_eq!(env.nodes.listed("pool-b-1").len(), 1);
    // Each provider served its own pool's calls: both counted calls.
    for name in ["fabric-a", "fabric-b"] {
        eventually(&format!("{name} counts its calls"), CONVERGE, || async {
            let p = providers(&env).get(name).await.ok()?;
            (p.status?.calls?.total > 0).then_some(())
        })
        .await;
    }

    // Metrics carry the provider's name.
    let text = env.metrics.as_ref().unwrap().encode();
    for name in ["fabric-a", "fabric-b"] {
        assert!(
            text.contains(&format!(
                "cro_provider_routed_calls_total{{provider=\"{name}\",outcome=\"ok\"}}"
            )),
            "{text}"
        );
    }

    // A node no selector matches, and no default provider: a clear error and an Event.
    let mut d = gpu(1);
    d.target_node = Some("pool-c-1".into());
    env.create_request("on-c", d).await;
    let resource = eventually(
        "the pool-c resource reports no provider",
        CONVERGE,
        || async {
            let r = env.resources_of("on-c").await.into_iter().next()?;
            r.status
                .as_ref()?
                .error
                .contains("no CdiProvider serves node pool-c-1")
                .then_some(r)
        },
    )
    .await;
    eventually("an Event names the routing error", CONVERGE, || async {
        events_about(&env, None, &resource.name_any())
            .await
            .iter()
            .any(|(_, note)| note.contains("no CdiProvider serves node pool-c-1"))
            .then_some(())
    })
    .await;

    // Two providers selecting one node: the error names both.
    let mut spec = base.clone();
    spec.node_selector = pool("c");
    create_provider(&env, "fabric-c1", spec.clone()).await;
    create_provider(&env, "fabric-c2", spec).await;
    eventually(
        "the pool-c resource reports two providers",
        CONVERGE,
        || async {
            let r = env.resources_of("on-c").await.into_iter().next()?;
            let e = r.status?.error;
            (e.contains("more than one CdiProvider serves node pool-c-1")
                && e.contains("fabric-c1, fabric-c2"))
            .then_some(())
        },
    )
    .await;
    // Removing one makes the other serve the node: the request converges.
    providers(&env)
        .delete("fabric-c2", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_running("on-c", 1).await;

    // Least privilege: a Secret granted from a namespace the operator was not allowed.
    let mut spec = base.clone();
    spec.node_selector = pool("z");
    if let Some(secret) = spec.grants.secret.as_mut() {
        secret.namespace = "default".into();
    }
    create_provider(&env, "fabric-elsewhere", spec).await;
    eventually(
        "a Secret from another namespace is refused",
        CONVERGE,
        || async {
            let p = providers(&env).get("fabric-elsewhere").await.ok()?;
            let error = p.status.as_ref()?.last_error.clone()?;
            (condition(&p, CONDITION_READY)? == ("False".into(), "SecretNotAllowed".into())
                && error.contains("grants.secret default/")
                && error.contains(OPERATOR_NS))
            .then_some(())
        },
    )
    .await;

    // Deletion waits while the provider serves an attached device, and says which.
    let held = env.resources_of("on-a").await[0].name_any();
    providers(&env)
        .delete("fabric-a", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "fabric-a's deletion names the device blocking it",
        CONVERGE,
        || async {
            let p = providers(&env).get("fabric-a").await.ok()?;
            (p.metadata.deletion_timestamp.is_some()
                && condition(&p, CONDITION_DEGRADED)? == ("True".into(), "DeletionBlocked".into())
                && p.status?.last_error?.contains(&held))
            .then_some(())
        },
    )
    .await;
    assert!(
        events_about(&env, None, "fabric-a")
            .await
            .iter()
            .any(|(reason, note)| reason == "DeletionBlocked" && note.contains(&held))
    );
    // It still serves the detach; then it goes.
    env.delete_request("on-a").await;
    eventually(
        "fabric-a deleted once nothing is attached",
        CONVERGE,
        || async {
            providers(&env)
                .get_opt("fabric-a")
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;

    for req in ["on-b", "on-c"] {
        env.delete_request(req).await;
    }
    env.assert_nothing_attached().await;
    eventually(
        "nothing attached on the second fabric",
        CONVERGE,
        || async { attached(&sim_b).is_empty().then_some(()) },
    )
    .await;
    env.stop_operator().await.unwrap();
}

/// With several providers, a device's calls go to the provider its resource is labelled
/// with: a node moved to another provider's pool still has its device released on the
/// fabric that attached it, a Node deleted with a device attached still has that device
/// released (docs/behaviour.md §4, "Target node gone"), and a device left on a deleted
/// Node's machine is still found and released by the upstream sync. Routing by the
/// Node's labels alone sent the first detach to the other fabric and had nothing to read
/// once the Node was gone (the detach waited forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_is_released_by_the_provider_that_attached_it_after_its_node_moved_or_went() {
    let mut env = Env::start().await;
    env.config.timings.orphan_grace = Duration::from_secs(2);
    let sim_b = another_fabric(&env);
    let machine_a = env.add_node("pool-a-1", "16").await;
    let machine_moved = env.add_node("pool-a-2", "16").await;
    let machine_b = env.add_node_on_fabric("pool-b-1", "16", &sim_b).await;
    label_node(&env, "pool-a-1", "a").await;
    label_node(&env, "pool-a-2", "a").await;
    label_node(&env, "pool-b-1", "b").await;
    env.sim.add_free_devices("gpu", crate::common::MODEL, 3);
    sim_b.add_free_devices("gpu", crate::common::MODEL, 2);
    let (_, _cas) = providers_for_pools_a_and_b(&env, &sim_b).await;
    start_objects_operator(&mut env).await;
    wait_loaded(&env, "fabric-a", None).await;
    wait_loaded(&env, "fabric-b", None).await;
    for (req, node) in [
        ("on-a", "pool-a-1"),
        ("moved", "pool-a-2"),
        ("on-b", "pool-b-1"),
    ] {
        let mut d = gpu(1);
        d.target_node = Some(node.into());
        env.create_request(req, d).await;
    }
    for req in ["on-a", "moved", "on-b"] {
        env.wait_running(req, 1).await;
    }
    let on_a = env.resources_of("on-a").await[0].name_any();
    assert_eq!(env.gpus_on(&machine_a).len(), 1);
    let detaches_b = sim_b.requests_to(Route::FmDetach).len();

    // pool-a-2 moves to pool b with fabric a's device attached. Fabric b's listing asks
    // about its machine once the operator routes it there; the device's detach still
    // goes to fabric a.
    label_node(&env, "pool-a-2", "b").await;
    eventually("pool-a-2 routed to fabric b", CONVERGE, || async {
        sim_b
            .requests_to(Route::FmGetMachine)
            .iter()
            .any(|r| r.path.ends_with(&machine_moved))
            .then_some(())
    })
    .await;
    env.delete_request("moved").await;
    eventually(
        "the moved node's device released on fabric a",
        CONVERGE,
        || async {
            (env.gpus_on(&machine_moved).is_empty() && env.request("moved").await.is_none())
                .then_some(())
        },
    )
    .await;
    // Another controller's finalizer keeps the resource, and with it the machine it
    // recorded, after its own device is released.
    let hold =
        json!([{"op": "add", "path": "/metadata/finalizers/-", "value": "test.example/hold"}]);
    env.resources()
        .patch(
            &on_a,
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(hold).unwrap()),
        )
        .await
        .unwrap();

    env.delete_node("pool-a-1").await;
    eventually(
        "pool-a-1's device released on fabric a",
        CONVERGE,
        || async { env.gpus_on(&machine_a).is_empty().then_some(()) },
    )
    .await;
    // A device attached behind the operator's back to the deleted Node's machine: fabric
    // a's listing still shows the machine, and the device is released after the grace.
    env.sim
        .attach_directly(&machine_a, "gpu", crate::common::MODEL)
        .unwrap();
    eventually("the stray device released", CONVERGE, || async {
        env.gpus_on(&machine_a).is_empty().then_some(())
    })
    .await;
    // The resource kept by the other finalizer only: that one goes, and so does it.
    let kept = eventually("only the other finalizer left", CONVERGE, || async {
        let r = env.resources().get_opt(&on_a).await.ok()??;
        (r.finalizers() == ["test.example/hold"]).then_some(r)
    })
    .await;
    let unhold =
        json!({"metadata": {"finalizers": null, "resourceVersion": kept.resource_version()}});
    env.resources()
        .patch(&on_a, &PatchParams::default(), &Patch::Merge(&unhold))
        .await
        .unwrap();
    eventually("its request and resource gone", CONVERGE, || async {
        (env.request("on-a").await.is_none()
            && env.resources().get_opt(&on_a).await.ok()?.is_none())
        .then_some(())
    })
    .await;
    // Fabric b was not asked to detach anything, and keeps pool b's device.
    assert_eq!(sim_b.requests_to(Route::FmDetach).len(), detaches_b);
    assert_eq!(sim_b.machine_devices(&machine_b).len(), 1);
    env.wait_running("on-b", 1).await;
    env.stop_operator().await.unwrap();
}

/// `bytes` with a custom section appended: the same component, another digest.
fn rebuilt(bytes: &[u8], note: &str) -> Vec<u8> {
    let mut payload = vec![u8::try_from(note.len()).unwrap()];
    payload.extend_from_slice(note.as_bytes());
    let mut out = bytes.to_vec();
    out.push(0); // custom section
    out.push(u8::try_from(payload.len()).unwrap());
    out.extend(payload);
    out
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", cro_operator::source::sha256_hex(bytes))
}

async fn set_source(env: &Env, name: &str, key: &str) {
    providers(env)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"source": {"configMap": {"key": key}}}})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_reload_under_load_swaps_without_failing_calls_and_survives_a_broken_component() {
    let mut env = Env::start().await;
    env.add_node("worker-1", "16").await;
    env.add_node("worker-2", "16").await;
    env.sim.add_free_devices("gpu", crate::common::MODEL, 4);
    let v1 = fti_bytes();
    let v2 = rebuilt(&v1, "cro-test-v2");
    assert_ne!(digest(&v1), digest(&v2));
    let maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), OPERATOR_NS);
    maps.create(
        &PostParams::default(),
        &ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("fti".into()),
                ..Default::default()
            },
            binary_data: Some(BTreeMap::from([
                ("v1.wasm".to_string(), ByteString(v1.clone())),
                ("v2.wasm".to_string(), ByteString(v2.clone())),
                (
                    "broken.wasm".to_string(),
                    ByteString(b"\0asm not a component".to_vec()),
                ),
            ])),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let (mut spec, _ca) = fti_spec(&env);
    spec.source = source("fti", "v1.wasm");
    spec.default = true;
    create_provider(&env, "fabric", spec).await;
    start_objects_operator(&mut env).await;
    wait_loaded(&env, "fabric", Some(&digest(&v1))).await;

    // Load: two requests attach and detach in turns on both nodes until told to stop.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let env = Arc::new(env);
    let mut load = tokio::task::JoinSet::new();
    for node in ["worker-1", "worker-2"] {
        let (env, stop) = (env.clone(), stop_rx.clone());
        load.spawn(async move {
            let mut rounds = 0u32;
            while !*stop.borrow() {
                let name = format!("{node}-r{rounds}");
                let mut d = gpu(1);
                d.target_node = Some(node.into());
                env.create_request(&name, d).await;
                env.wait_running(&name, 1).await;
                env.delete_request(&name).await;
                rounds += 1;
            }
            rounds
        });
    }
    let settle = || async {
        // At least one more attach and detach on each node after each change.
        let p = providers(&env).get("fabric").await.unwrap();
        let before = p.status.and_then(|s| s.calls).map_or(0, |c| c.total);
        eventually("calls go on after the change", CONVERGE, || async {
            let p = providers(&env).get("fabric").await.ok()?;
            (p.status?.calls?.total >= before + 8).then_some(())
        })
        .await;
    };
    settle().await;

    // A new digest: swapped in while calls run.
    set_source(&env, "fabric", "v2.wasm").await;
    wait_loaded(&env, "fabric", Some(&digest(&v2))).await;
    settle().await;

    // A broken component: refused, Degraded, v2 keeps serving.
    set_source(&env, "fabric", "broken.wasm").await;
    let p = eventually("the broken component is refused", CONVERGE, || async {
        let p = providers(&env).get("fabric").await.ok()?;
        (p.status.as_ref()?.observed_generation == p.metadata.generation
            && condition(&p, CONDITION_DEGRADED)? == ("True".into(), "LoadFailed".into()))
            .then_some(p)
    })
    .await;
    let status = p.status.clone().unwrap();
    assert_eq!(condition(&p, CONDITION_READY).unwrap().0, "True");
    assert_eq!(status.loaded_digest.as_deref(), Some(digest(&v2).as_str()));
    assert!(status.last_error.unwrap().starts_with("load:"));
    settle().await;

    let _ = stop_tx.send(true);
    let mut rounds = 0;
    while let Some(r) = load.join_next().await {
        rounds += r.unwrap();
    }
    assert!(rounds >= 4, "only {rounds} attach/detach rounds ran");
    // No call failed, across both swaps and the refusal; nothing was left attached.
    eventually("final call counts", CONVERGE, || async {
        let p = providers(&env).get("fabric").await.ok()?;
        let calls = p.status?.calls?;
        assert_eq!(calls.failed, 0, "calls failed during the swaps");
        (calls.total > 0).then_some(())
    })
    .await;
    env.assert_nothing_attached().await;
    assert!(
        events_about(&env, None, "fabric")
            .await
            .iter()
            .any(|(reason, _)| reason == "LoadFailed")
    );
    let mut env = Arc::into_inner(env).expect("load tasks ended");
    env.stop_operator().await.unwrap();
}

// ---- CDI_PROVIDER_TYPE=NEC: the Go operator's README request on CDIM ----
//
// CDIM reports no GPU UUID; the operator finds a GPU on its node by the device id the
// provider reports (nvidia-smi's UUID, device-plugin mode) and holds a device id once
// in the cluster. So (docs/nec-provider.md, "On a node"):
// - with `NEC_PROVISIONAL_GPU_UUID` set to the UUID nvidia-smi shows for the node's GPU
//   (what the Go README's operator setup asks of an administrator), ONE GPU at a time
//   runs end to end: attach, Online once nvidia-smi lists it, drained by that UUID,
//   disconnected, back in the pool;
// - a second GPU cannot be held (every GPU reports that one UUID), and without the
//   variable the CDIM device id is never a UUID nvidia-smi lists: GPUs connect on CDIM
//   and reach the node, and the resources wait for them, until deleted.

/// The Go operator's README request (`gpu-request`, two A100s, samenode, on
/// `worker-2`), with `size` GPUs.
fn nec_readme_request(size: i64) -> cro_api::ComposabilityRequest {
    let mut request: cro_api::ComposabilityRequest = serde_yaml::from_str(include_str!(
        "../../../api/tests/fixtures/go-readme-request.yaml"
    ))
    .expect("the Go README request");
    assert_eq!(
        request.spec.resource.target_node.as_deref(),
        Some("worker-2")
    );
    request.spec.resource.size = size;
    request
}

/// The UUID the administrator copied from `nvidia-smi` into `NEC_PROVISIONAL_GPU_UUID`.
const NEC_GPU_UUID: &str = "GPU-6f2b9a4e-0c1d-4e5f-8a7b-3c2d1e0f9a8b";

/// The node's `nvidia.com/gpu` capacity.
async fn node_gpu_capacity(env: &Env, node: &str) -> Option<String> {
    Api::<Node>::all(env.client.clone())
        .get(node)
        .await
        .ok()?
        .status?
        .capacity?
        .get("nvidia.com/gpu")
        .map(|q| q.0.clone())
}

/// `CDI_PROVIDER_TYPE=NEC` with `NEC_PROVISIONAL_GPU_UUID`, on simulated nodes: the
/// README request for one GPU attaches through a CDIM layout apply, goes Online once
/// the node's nvidia-smi lists the provisional UUID (the GPU's own), shows in the
/// device plugin's capacity, and on deletion is drained on the node by that UUID,
/// disconnected and back in the pool. Two GPUs cannot be held this way (see above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nec_go_environment_runs_the_go_readme_request_for_one_gpu() {
    let mut env = Env::start_nec(
        crate::common::nodes::NodeSetup::gpu_operator(),
        Some(NEC_GPU_UUID),
    )
    .await;
    let machine = env.add_node("worker-2", "16").await;
    let gpu = env.nec().sim().add_gpu(crate::common::MODEL);
    env.nec().set_gpu_uuid(&gpu, NEC_GPU_UUID).unwrap();
    env.start_operator().await;

    let request = nec_readme_request(1);
    let name = request.name_any();
    env.requests()
        .create(&PostParams::default(), &request)
        .await
        .unwrap();
    env.wait_running(&name, 1).await;
    // CDIM connected the GPU to worker-2's CDIM node with a layout apply.
    let connected = env.nec().sim().gpus_on(&machine);
    assert_eq!(connected.len(), 1);
    assert_eq!(connected[0].id, gpu);
    let applies = env.nec().sim().applies();
    assert!(
        applies.iter().any(|a| a
            .procedures
            .iter()
            .any(|(op, _, g)| op == "connect" && *g == gpu)),
        "{applies:?}"
    );
    // The resource holds the provisional UUID as its device and the CDIM id as its
    // fabric device; the node's driver lists that UUID.
    let resource = env.resources_of(&name).await.remove(0);
    let status = resource.status.clone().unwrap();
    assert_eq!(
        (status.device_id.as_str(), status.cdi_device_id.as_str()),
        (NEC_GPU_UUID, gpu.as_str())
    );
    assert_eq!(env.nodes.listed("worker-2"), vec![NEC_GPU_UUID.to_string()]);
    eventually("the device plugin reports 1 GPU", CONVERGE, || async {
        (node_gpu_capacity(&env, "worker-2").await.as_deref() == Some("1")).then_some(())
    })
    .await;

    env.delete_request(&name).await;
    env.assert_nothing_attached().await;
    // Drained on the node (put in maintenance, then removed) before CDIM disconnected
    // it.
    let commands: Vec<String> = env
        .nodes
        .commands()
        .into_iter()
        .filter(|(node, _)| node == "worker-2")
        .map(|(_, argv)| argv.join(" "))
        .collect();
    // Once: the drained GPU stays removed from the driver until CDIM's disconnect has
    // taken it off the node.
    for step in [
        "nvidia-smi drain -p 0000:3B:00.0 -m 1",
        "nvidia-smi drain -p 0000:3B:00.0 -r",
    ] {
        assert_eq!(
            commands.iter().filter(|c| c.as_str() == step).count(),
            1,
            "{step:?} on worker-2: {commands:#?}"
        );
    }
    assert!(env.nec().sim().applies().iter().any(|a| {
        a.procedures
            .iter()
            .any(|(op, _, g)| op == "disconnect" && *g == gpu)
    }));
    assert!(env.nodes.listed("worker-2").is_empty());
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}

/// `CDI_PROVIDER_TYPE=NEC` without `NEC_PROVISIONAL_GPU_UUID` (cro's option: each GPU's
/// CDIM device id is its device id), the README request as written (two GPUs): CDIM
/// connects two distinct GPUs to worker-2 and the node's driver lists both, but the
/// operator waits for GPUs named by CDIM ids, which nvidia-smi never lists; deleting the
/// request disconnects both and returns them to the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nec_go_environment_without_provisional_uuid_connects_but_never_sees_the_gpus() {
    let mut env = Env::start_nec(crate::common::nodes::NodeSetup::gpu_operator(), None).await;
    let machine = env.add_node("worker-2", "16").await;
    for _ in 0..3 {
        env.nec().sim().add_gpu(crate::common::MODEL);
    }
    env.start_operator().await;
    let request = nec_readme_request(2);
    let name = request.name_any();
    env.requests()
        .create(&PostParams::default(), &request)
        .await
        .unwrap();
    let ids = eventually(
        "both GPUs connected, their resources waiting for the node to list them",
        CONVERGE,
        || async {
            let resources = env.resources_of(&name).await;
            let mut waiting = Vec::new();
            for r in &resources {
                let s = r.status.as_ref()?;
                let wait = s
                    .conditions
                    .iter()
                    .find(|c| c.reason == "WaitingForDevice")?;
                (!s.device_id.is_empty()
                    && s.device_id == s.cdi_device_id
                    && wait.message.contains(&s.device_id))
                .then_some(())?;
                waiting.push(s.device_id.clone());
            }
            waiting.sort();
            (waiting.len() == 2).then_some(waiting)
        },
    )
    .await;
    let mut connected: Vec<String> = env
        .nec()
        .sim()
        .gpus_on(&machine)
        .into_iter()
        .map(|g| g.id)
        .collect();
    connected.sort();
    assert_eq!(connected, ids, "two distinct CDIM GPUs on worker-2");
    // The node has both: under their own UUIDs, none of them a CDIM id.
    let listed = env.nodes.listed("worker-2");
    assert_eq!(listed.len(), 2);
    assert!(
        listed
            .iter()
            .all(|u| u.starts_with("GPU-") && !ids.contains(u))
    );
    let request = env.request(&name).await.unwrap();
    assert_ne!(
        request.status.map(|s| s.state),
        Some(cro_api::RequestState::Running)
    );

    env.delete_request(&name).await;
    env.assert_nothing_attached().await;
    assert_eq!(
        env.nec()
            .sim()
            .gpus()
            .iter()
            .filter(|g| g.node.is_none())
            .count(),
        3,
        "every GPU back in the pool"
    );
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}

/// The pool of `provider`'s slices: `(pool name, generation, node names, device names)`
/// per slice, sorted.
async fn published(env: &Env, provider: &str) -> Vec<(String, i64, Vec<String>, Vec<String>)> {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    let slices: Api<ResourceSlice> = Api::all(env.client.clone());
    let mut out: Vec<_> = slices
        .list(
            &ListParams::default().labels(&format!("{}={provider}", cro_api::LABEL_POOL_PROVIDER)),
        )
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| {
            let nodes = s
                .spec
                .node_selector
                .iter()
                .flat_map(|n| n.node_selector_terms.iter())
                .flat_map(|t| t.match_fields.iter().flatten())
                .flat_map(|f| f.values.iter().flatten().cloned())
                .collect();
            let devices = s
                .spec
                .devices
                .iter()
                .flatten()
                .map(|d| d.name.clone())
                .collect();
            (s.spec.pool.name, s.spec.pool.generation, nodes, devices)
        })
        .collect();
    out.sort();
    out
}

/// Two fabrics behind provider `fabric-a` (node pool-a-1 on fabric 1 with 3 free GPUs,
/// pool-a-2 on fabric 2 with 1), provider `fabric-old` (a 0.1.0 component) on
/// pool-b-1, and the operator publishing the GPU model's pool every 500 ms (the
/// environment's fast timings).
async fn pool_env() -> (Env, tempfile::NamedTempFile) {
    let mut env = Env::start().await;
    env.config.pool_devices = vec![cro_runtime::PoolKind {
        device_type: cro_runtime::DeviceType::Gpu,
        model: crate::common::MODEL.into(),
    }];
    env.add_node("pool-a-1", "16").await;
    let on_two = env.add_node("pool-a-2", "16").await;
    env.add_node("pool-b-1", "16").await;
    label_node(&env, "pool-a-1", "a").await;
    label_node(&env, "pool-a-2", "a").await;
    label_node(&env, "pool-b-1", "b").await;
    env.sim.set_machine_fabric(&on_two, 2).unwrap();
    env.sim.add_free_devices("gpu", crate::common::MODEL, 3);
    env.sim
        .add_free_devices_on(2, "gpu", crate::common::MODEL, 1);
    put_component(&env, "fti", "fti.wasm", fti_bytes()).await;
    // A 0.1.0 component that does not build the FTI crate again (building the 0.1.0
    // FTI build alone rewrites the FTI component other tests of this process load).
    let old = std::fs::read(cro_test_support::component("cro-testkit")).unwrap();
    put_component(&env, "fti-old", "fti.wasm", old).await;
    let (base, ca) = fti_spec(&env);
    let mut a = base.clone();
    a.node_selector = pool("a");
    create_provider(&env, "fabric-a", a).await;
    let b = CdiProviderSpec {
        source: source("fti-old", "fti.wasm"),
        config: BTreeMap::new(),
        grants: Default::default(),
        limits: Default::default(),
        node_selector: pool("b"),
        default: false,
    };
    create_provider(&env, "fabric-old", b).await;
    start_objects_operator(&mut env).await;
    (env, ca)
}

/// The name of the (first) ResourceSlice of cro's pool `pool`.
async fn slice_of(env: &Env, pool: &str) -> String {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    Api::<ResourceSlice>::all(env.client.clone())
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=cro"))
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|s| s.spec.pool.name == pool)
        .map(|s| s.name_any())
        .unwrap_or_else(|| panic!("no slice of pool {pool}"))
}

/// `pool_env`'s first publication: fabric 1's three devices, fabric 2's one.
async fn pools_published(env: &Env) -> Vec<(String, i64, Vec<String>, Vec<String>)> {
    eventually("fabric-a's pools published", CONVERGE, || async {
        let p = published(env, "fabric-a").await;
        (p.len() == 2 && p[0].3.len() == 3 && p[1].3.len() == 1).then_some(p)
    })
    .await
}

/// The free pool as ResourceSlices (docs/dra.md): one pool per fabric, bound to the
/// nodes on that fabric, its devices carrying the binding conditions; it follows the
/// fabric when devices go behind cro's back (within the pool period plus a read), an
/// unchanged pool is not rewritten, and a provider of a contract without a pool (a
/// 0.1.0 component; 0.2.0 takes the same path) publishes nothing and says why in its
/// status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_free_pool_is_published_per_fabric_and_follows_the_fabric() {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    let (env, _ca) = pool_env().await;

    let name = |p: &str| p.to_string();
    let first = pools_published(&env).await;
    assert_eq!(first[0].0, "fabric-a/1");
    assert_eq!(first[0].2, [name("pool-a-1")]);
    assert_eq!(first[1].0, "fabric-a/2");
    assert_eq!(first[1].2, [name("pool-a-2")]);
    let slices: Api<ResourceSlice> = Api::all(env.client.clone());
    let (name_one, name_two) = (
        slice_of(&env, "fabric-a/1").await,
        slice_of(&env, "fabric-a/2").await,
    );
    let one = slices.get(&name_one).await.unwrap();
    let device = &one.spec.devices.as_ref().unwrap()[0];
    assert_eq!(one.spec.driver, cro_api::DRA_DRIVER);
    assert_eq!(device.binds_to_node, Some(true), "{device:?}");
    assert_eq!(
        device.binding_conditions.as_deref(),
        Some(&[cro_api::CONDITION_FABRIC_DEVICE_READY.to_string()][..])
    );
    let attrs = device.attributes.as_ref().unwrap();
    assert_eq!(attrs["model"].string.as_deref(), Some(crate::common::MODEL));

    // The old contract: no slices, and the status says why.
    let why = eventually("fabric-old's pool status", CONVERGE, || async {
        let p = providers(&env).get("fabric-old").await.ok()?;
        p.status?.pool?.message
    })
    .await;
    assert!(
        why.contains("not supported") && why.contains("0.1.0"),
        "{why}"
    );
    assert!(published(&env, "fabric-old").await.is_empty());
    let status = providers(&env)
        .get("fabric-a")
        .await
        .unwrap()
        .status
        .unwrap();
    let pool_status = status.pool.unwrap();
    assert_eq!((pool_status.devices, pool_status.pools), (4, 2));

    // Another tenant takes two devices of fabric 1 behind cro's back: the next read
    // withdraws them; fabric 2's unchanged slice is not written again.
    let untouched = slices.get(&name_two).await.unwrap().resource_version();
    assert_eq!(
        env.sim.take_free_devices(1, "gpu", crate::common::MODEL, 2),
        2
    );
    // The documented bound is one period (500 ms here) and one read; the deadline leaves a
    // wide margin for a loaded 2-core box, and still fails a publisher that lags by
    // periods of its own (the test's CONVERGE is 90 s).
    let bound = std::time::Duration::from_secs(20);
    let after = eventually(
        "fabric 1's slice shrinks within the bound",
        bound,
        || async {
            let p = published(&env, "fabric-a").await;
            (p.len() == 2 && p[0].3.len() == 1).then_some(p)
        },
    )
    .await;
    assert!(
        after[0].1 > first[0].1,
        "a changed pool gets a new generation"
    );
    assert_eq!(
        slices.get(&name_two).await.unwrap().resource_version(),
        untouched,
        "an unchanged pool is not rewritten"
    );
}

/// The fabric machine of `node` in the environment's simulator.
fn machine_of(env: &Env, node: &str) -> String {
    env.sim
        .machines()
        .into_iter()
        .find(|m| m.name == node)
        .map(|m| m.uuid)
        .unwrap_or_else(|| panic!("no machine for node {node}"))
}

/// A claim for one GPU of cro's driver, as a Pod's template would make it.
async fn gpu_claim(env: &Env, name: &str) -> k8s_openapi::api::resource::v1::ResourceClaim {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    let claims: Api<ResourceClaim> = Api::namespaced(env.client.clone(), "default");
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.cro.hpsys.ibm.ie.com"
        }}]}},
    }))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap()
}

/// What the scheduler writes when it allocates `device` of `pool` on `node` (this API
/// server runs no scheduler: the test plays it, field for field).
async fn allocate(env: &Env, claim: &str, pool: &str, device: &str, node: &str) {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    let claims: Api<ResourceClaim> = Api::namespaced(env.client.clone(), "default");
    let status = json!({"status": {"allocation": {
        "devices": {"results": [{
            "request": "gpu", "driver": cro_api::DRA_DRIVER, "pool": pool, "device": device,
            "bindingConditions": [cro_api::CONDITION_FABRIC_DEVICE_READY],
            "bindingFailureConditions": [
                cro_api::CONDITION_FABRIC_DEVICE_RESCHEDULE,
                cro_api::CONDITION_FABRIC_DEVICE_FAILED
            ],
        }]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}
        ]}]},
        "allocationTimestamp": k8s_openapi::jiff::Timestamp::now().to_string(),
    }}});
    claims
        .patch_status(claim, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// The claim's condition of cro's device that is True: (type, reason, data).
async fn claim_condition(
    env: &Env,
    claim: &str,
) -> Option<(String, String, Option<serde_json::Value>)> {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    let claims: Api<ResourceClaim> = Api::namespaced(env.client.clone(), "default");
    let c = claims.get(claim).await.ok()?;
    let d = c
        .status?
        .devices?
        .into_iter()
        .find(|d| d.driver == cro_api::DRA_DRIVER)?;
    let cond = d.conditions?.into_iter().find(|c| c.status == "True")?;
    Some((cond.type_, cond.reason, d.data.map(|r| r.0)))
}

/// The binding controller (docs/dra.md): a claim allocated a device of the published
/// pool on a node gets a ComposableResource there, and once the device is Online the
/// claim's `FabricDeviceReady` is True with the device's id; deleting the claim detaches
/// the device back to the pool. A claim on a fabric with nothing free gets
/// `FabricDeviceReschedule` and an Event, and nothing stays attached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocated_claim_gets_its_device_attached_and_ready() {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    let (env, _ca) = pool_env().await;
    let first = pools_published(&env).await;
    let (pool_one, device) = (first[0].0.clone(), first[0].3[0].clone());

    let claim = gpu_claim(&env, "train").await;
    allocate(&env, "train", &pool_one, &device, "pool-a-1").await;
    let (kind, reason, data) = eventually("FabricDeviceReady", CONVERGE, || async {
        claim_condition(&env, "train").await
    })
    .await;
    assert_eq!(
        (kind.as_str(), reason.as_str()),
        ("FabricDeviceReady", "Attached")
    );
    let data = data.expect("the device's ids");
    let machine = machine_of(&env, "pool-a-1");
    let on_node = env.sim.machine_devices(&machine);
    assert_eq!(on_node.len(), 1);
    assert_eq!(data["deviceId"], on_node[0].serial.as_str());
    assert_eq!(data["node"], "pool-a-1");
    let resource = format!("dra-{}-0", claim.uid().unwrap());
    let resources: Api<cro_api::ComposableResource> = Api::all(env.client.clone());
    let r = resources.get(&resource).await.unwrap();
    assert_eq!(r.spec.model, crate::common::MODEL);
    // The pool keeps the held device's name and offers the two still free.
    let p = eventually("the held device stays published", CONVERGE, || async {
        let p = published(&env, "fabric-a").await;
        (p[0].3.len() == 3 && p[0].3.contains(&device)).then_some(p)
    })
    .await;
    assert_eq!(p[0].3.len(), 3);

    // The claim goes (its Pod ended): the device goes back to the pool.
    let claims: Api<ResourceClaim> = Api::namespaced(env.client.clone(), "default");
    claims
        .delete("train", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the device detached", CONVERGE, || async {
        (env.sim.machine_devices(&machine).is_empty()
            && resources.get_opt(&resource).await.ok()?.is_none())
        .then_some(())
    })
    .await;

    // Fabric 2 answers every attach that it has nothing free (as when another tenant
    // took the device between the slice's last read and the attach): no capacity, and
    // the Pod is placed again. A fault, not a device really taken: taking it would let
    // the next pool read withdraw it first, and the claim would fail as NotPublished
    // instead; and on every attach, or the resource's retry would get the device.
    let pool_two = first[1].0.clone();
    let lone = first[1].3[0].clone();
    env.sim.inject(
        fabric_sim::Fault::NoFreeDevice
            .on(fabric_sim::Route::FmAttach)
            .always(),
    );
    gpu_claim(&env, "late").await;
    allocate(&env, "late", &pool_two, &lone, "pool-a-2").await;
    let (kind, reason, _) = eventually("FabricDeviceReschedule", CONVERGE, || async {
        claim_condition(&env, "late").await
    })
    .await;
    assert_eq!(
        (kind.as_str(), reason.as_str()),
        ("FabricDeviceReschedule", "NoCapacity")
    );
    let events = events_about(&env, Some("default"), "late").await;
    assert!(
        events
            .iter()
            .any(|(r, note)| r == "NoCapacity" && note.contains("placed again")),
        "{events:?}"
    );
    let two = machine_of(&env, "pool-a-2");
    eventually("nothing left of the failed attach", CONVERGE, || async {
        let left = resources
            .list(&ListParams::default().labels(cro_api::LABEL_CLAIM_UID))
            .await
            .ok()?
            .items;
        (left.is_empty() && env.sim.machine_devices(&two).is_empty()).then_some(())
    })
    .await;
}

/// What cannot be bound ends in a failure condition, and nothing stays attached to
/// nobody: a device cro never published (`NotPublished`), a node the device's fabric does
/// not reach (`NodeUnreachable`), a claim deleted while its device is being attached
/// (released), and a slice edited by hand (cro's version is back within the period).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_allocations_fail_cleanly_and_hand_edits_are_undone() {
    use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
    let (env, _ca) = pool_env().await;
    let first = pools_published(&env).await;
    let (pool_one, device) = (first[0].0.clone(), first[0].3[0].clone());

    gpu_claim(&env, "ghost").await;
    allocate(&env, "ghost", &pool_one, "gpu-nothing-0", "pool-a-1").await;
    gpu_claim(&env, "far").await;
    allocate(&env, "far", &pool_one, &device, "pool-a-2").await;
    for (claim, kind, reason) in [
        ("ghost", "FabricDeviceReschedule", "NotPublished"),
        ("far", "FabricDeviceFailed", "NodeUnreachable"),
    ] {
        let (k, r, _) = eventually(&format!("{claim}'s failure"), CONVERGE, || async {
            claim_condition(&env, claim).await
        })
        .await;
        assert_eq!((k.as_str(), r.as_str()), (kind, reason), "{claim}");
        let events = events_about(&env, Some("default"), claim).await;
        assert!(
            events.iter().any(|(e, _)| e == reason),
            "{claim}: {events:?}"
        );
    }

    // Deleted right after the scheduler allocated it: whatever was attached is released.
    gpu_claim(&env, "brief").await;
    allocate(&env, "brief", &pool_one, &device, "pool-a-1").await;
    let claims: Api<ResourceClaim> = Api::namespaced(env.client.clone(), "default");
    claims
        .delete("brief", &DeleteParams::default())
        .await
        .unwrap();

    // A slice edited by hand: the next round writes cro's version back.
    let slices: Api<ResourceSlice> = Api::all(env.client.clone());
    let name_one = slice_of(&env, "fabric-a/1").await;
    let mut edited = slices.get(&name_one).await.unwrap();
    let forged = &mut edited.spec.devices.as_mut().unwrap()[0];
    forged
        .attributes
        .as_mut()
        .unwrap()
        .get_mut("model")
        .unwrap()
        .string = Some("forged".into());
    slices
        .replace(&name_one, &PostParams::default(), &edited)
        .await
        .unwrap();
    eventually("the hand edit undone", CONVERGE, || async {
        let s = slices.get(&name_one).await.ok()?;
        let devices = s.spec.devices?;
        devices
            .iter()
            .all(|d| {
                d.attributes
                    .as_ref()
                    .and_then(|a| a["model"].string.as_deref())
                    == Some(crate::common::MODEL)
            })
            .then_some(())
    })
    .await;

    let resources: Api<cro_api::ComposableResource> = Api::all(env.client.clone());
    let (one, two) = (machine_of(&env, "pool-a-1"), machine_of(&env, "pool-a-2"));
    eventually("nothing attached for any of them", CONVERGE, || async {
        let left = resources
            .list(&ListParams::default().labels(cro_api::LABEL_CLAIM_UID))
            .await
            .ok()?
            .items;
        (left.is_empty()
            && env.sim.machine_devices(&one).is_empty()
            && env.sim.machine_devices(&two).is_empty())
        .then_some(())
    })
    .await;
}

/// Crash-safe: the operator stops after attaching a claim's device but (as far as the
/// claim shows) before its condition; the next operator finds the resource it made (its
/// name comes from the claim), sets the condition with the same device, and attaches no
/// second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_between_attach_and_condition_attaches_no_second_device() {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    let (mut env, _ca) = pool_env().await;
    let first = pools_published(&env).await;
    let claim = gpu_claim(&env, "steady").await;
    allocate(&env, "steady", &first[0].0, &first[0].3[0], "pool-a-1").await;
    let resource = format!("dra-{}-0", claim.uid().unwrap());
    let resources: Api<cro_api::ComposableResource> = Api::all(env.client.clone());
    let device = eventually("the device attached", CONVERGE, || async {
        resources
            .get(&resource)
            .await
            .ok()?
            .device_id()
            .map(str::to_owned)
    })
    .await;
    env.stop_operator().await.unwrap();
    // The crash came before the condition was written: none on the claim.
    let claims: Api<ResourceClaim> = Api::namespaced(env.client.clone(), "default");
    claims
        .patch_status(
            "steady",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"devices": null}})),
        )
        .await
        .unwrap();
    assert!(claim_condition(&env, "steady").await.is_none());

    start_objects_operator(&mut env).await;
    let (kind, _, data) = eventually("FabricDeviceReady after the restart", CONVERGE, || async {
        claim_condition(&env, "steady").await
    })
    .await;
    assert_eq!(kind, "FabricDeviceReady");
    assert_eq!(data.unwrap()["deviceId"], device.as_str());
    let machine = machine_of(&env, "pool-a-1");
    assert_eq!(
        env.sim.machine_devices(&machine).len(),
        1,
        "no second device"
    );
    assert_eq!(env.sim.requests_to(fabric_sim::Route::FmAttach).len(), 1);
}

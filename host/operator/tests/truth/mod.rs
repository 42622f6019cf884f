//! Issue 15, "an operator that tells the truth, refuses destructive mistakes, and can
//! always be unstuck": one test per row of the issue's table (the admission rows are in
//! webhook.rs), each on the real API server, each ending with nothing attached on the
//! fabric simulator.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::{self, CONVERGE, Env, MODEL, eventually, gpu};
use cro_api::{
    ANNOTATION_NODE_MACHINE, ANNOTATION_SKIP_NODE_STEPS, ComposabilityRequest, ComposableResource,
    RequestState, ResourceState,
};
use cro_operator::config::{OperatorConfig, ProviderSource};
use fabric_sim::{Fault, Route};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

fn ready_of(conditions: Option<&[Condition]>) -> Option<Condition> {
    conditions?.iter().find(|c| c.type_ == "Ready").cloned()
}

fn request_ready(r: &ComposabilityRequest) -> Option<Condition> {
    ready_of(r.status.as_ref().map(|s| &s.conditions[..]))
}

fn resource_ready(r: &ComposableResource) -> Option<Condition> {
    ready_of(r.status.as_ref().map(|s| &s.conditions[..]))
}

fn request_error(r: &ComposabilityRequest) -> String {
    r.status
        .as_ref()
        .map(|s| s.error.clone())
        .unwrap_or_default()
}

fn resource_error(r: &ComposableResource) -> String {
    r.status
        .as_ref()
        .map(|s| s.error.clone())
        .unwrap_or_default()
}

fn on_node(size: i64, node: &str) -> cro_api::ScalarResourceDetails {
    let mut d = gpu(size);
    d.target_node = Some(node.into());
    d
}

/// Commands the operator ran (or tried) on `node`.
fn commands_on(env: &Env, node: &str) -> usize {
    env.nodes
        .commands()
        .iter()
        .filter(|(n, _)| n == node)
        .count()
}

/// Row "a GPU attach whose node commands fail": the request used to show `Updating`
/// with an empty error. Now its error and Ready condition name the failing resource
/// and why, and clear once the node answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_command_failures_are_summed_up_on_the_request() {
    let mut env = Env::start().await;
    env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 1);
    env.nodes.set_unreachable("worker-1", true);
    env.start_operator().await;
    env.create_request("stuck", on_node(1, "worker-1")).await;

    let req = eventually("the node's failure on the request", CONVERGE, || async {
        let r = env.request("stuck").await?;
        request_error(&r)
            .contains("error dialing backend")
            .then_some(r)
    })
    .await;
    let name = env.resources_of("stuck").await[0].name_any();
    let error = request_error(&req);
    assert!(
        error.contains(&name) && error.contains("worker-1") && error.contains("Attaching"),
        "{error}"
    );
    assert_eq!(req.state(), RequestState::Updating);
    let ready = eventually("Ready=False with the summary", CONVERGE, || async {
        let c = request_ready(&env.request("stuck").await?)?;
        c.message.contains("error dialing backend").then_some(c)
    })
    .await;
    assert_eq!(ready.status, "False");
    assert!(ready.message.contains(&name), "{ready:?}");

    // The node answers again: the request runs and its error clears.
    env.nodes.set_unreachable("worker-1", false);
    let req = env.wait_running("stuck", 1).await;
    eventually("the error cleared", CONVERGE, || async {
        let r = env.request("stuck").await?;
        let c = request_ready(&r)?;
        (request_error(&r).is_empty() && c.status == "True").then_some(())
    })
    .await;
    assert_eq!(req.state(), RequestState::Running);
    env.delete_request("stuck").await;
    env.assert_nothing_attached().await;
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}

/// Row "the fabric lost a device that was Online": the error said "not found" but the
/// resource and the request stayed Ready. Now the resource is not Ready (its state stays
/// Online, as the Go operator's did), and neither is the request, which names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_the_fabric_lost_is_not_ready_nor_is_its_request() {
    let mut env = Env::start().await;
    let m1 = env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 1);
    env.start_operator().await;
    env.create_request("lost", on_node(1, "worker-1")).await;
    env.wait_running("lost", 1).await;
    let name = env.resources_of("lost").await[0].name_any();
    eventually("the request Ready", CONVERGE, || async {
        (request_ready(&env.request("lost").await?)?.status == "True").then_some(())
    })
    .await;
    let device = env.gpus_on(&m1)[0].clone();

    // Someone takes the device away behind the operator's back.
    env.sim.detach_directly(&device).unwrap();
    let ready = eventually("the resource not Ready", CONVERGE, || async {
        let c = resource_ready(&env.resources().get(&name).await.ok()?)?;
        (c.status == "False").then_some(c)
    })
    .await;
    assert_eq!(ready.reason, "DeviceMissing");
    assert!(ready.message.contains(&device), "{ready:?}");
    let r = env.resources().get(&name).await.unwrap();
    assert_eq!(r.state(), ResourceState::Online);
    assert!(resource_error(&r).contains("not found"), "{r:?}");

    let (req, ready) = eventually("the request not Ready", CONVERGE, || async {
        let r = env.request("lost").await?;
        let c = request_ready(&r)?;
        (c.status == "False").then_some((r, c))
    })
    .await;
    assert_eq!(ready.reason, "DevicesNotReady");
    assert_eq!(req.state(), RequestState::Running);
    let error = request_error(&req);
    assert!(
        error.contains(&name) && error.contains("not found"),
        "{error}"
    );

    env.delete_request("lost").await;
    env.assert_nothing_attached().await;
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}

/// Row "wrong Secret password": the message did not name the Secret. Now the error on
/// the resource and the request names the Secret and its keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_names_the_secret_and_its_keys() {
    let mut env = Env::start().await;
    env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 1);
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), common::OPERATOR_NS);
    let set_password = |password: String| {
        let secrets = secrets.clone();
        async move {
            secrets
                .patch(
                    cro_operator::compat::CREDENTIALS_SECRET,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"stringData": {"password": password}})),
                )
                .await
                .unwrap();
        }
    };
    set_password("not-the-password".into()).await;
    env.start_operator().await;
    env.create_request("creds", on_node(1, "worker-1")).await;

    let secret = format!(
        "Secret {}/{}",
        common::OPERATOR_NS,
        cro_operator::compat::CREDENTIALS_SECRET
    );
    let error = eventually(
        "the credential failure on the request",
        CONVERGE,
        || async {
            let e = request_error(&env.request("creds").await?);
            e.contains(&secret).then_some(e)
        },
    )
    .await;
    assert!(
        error.contains("password") && error.contains("401"),
        "{error}"
    );
    let r = &env.resources_of("creds").await[0];
    assert!(resource_error(r).contains(&secret), "{r:?}");
    assert!(env.gpus_on(&env.sim.machines()[0].uuid).is_empty());

    // The right password: the retry attaches.
    set_password(env.sim.credentials().password.clone()).await;
    env.wait_running("creds", 1).await;
    env.delete_request("creds").await;
    env.assert_nothing_attached().await;
    env.stop_operator().await.unwrap();
}

/// Row "deleting a request whose node cannot run commands": Cleaning/Detaching forever,
/// force_detach on the request did not reach its resources and an exec was still
/// attempted. Now force_detach reaches them and detaches without any command on the
/// node; and the skip-node-steps annotation detaches one resource on the fabric only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_detach_and_the_skip_annotation_unstick_a_detach() {
    let mut env = Env::start().await;
    let m1 = env.add_node("worker-1", "16").await;
    let m2 = env.add_node("worker-2", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 2);
    env.start_operator().await;
    env.create_request("forced", on_node(1, "worker-1")).await;
    env.create_request("skipped", on_node(1, "worker-2")).await;
    env.wait_running("forced", 1).await;
    env.wait_running("skipped", 1).await;
    env.nodes.set_unreachable("worker-1", true);
    env.nodes.set_unreachable("worker-2", true);

    // Deleting: the detach is stuck on the node, and the request says why.
    for name in ["forced", "skipped"] {
        env.requests()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    for name in ["forced", "skipped"] {
        let req = eventually("the stuck cleanup explained", CONVERGE, || async {
            let r = env.request(name).await?;
            request_error(&r)
                .contains("error dialing backend")
                .then_some(r)
        })
        .await;
        assert_eq!(req.state(), RequestState::Cleaning);
        let r = &env.resources_of(name).await[0];
        assert_eq!(r.state(), ResourceState::Detaching);
    }

    // force_detach on the request reaches its resource; no command runs after that.
    env.requests()
        .patch(
            "forced",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resource": {"force_detach": true}}})),
        )
        .await
        .unwrap();
    // (The forced detach may finish before this poll sees the resource forced.)
    eventually("force_detach on the resource", CONVERGE, || async {
        let left = env.resources_of("forced").await;
        left.first()
            .is_none_or(|r| r.spec.force_detach)
            .then_some(())
    })
    .await;
    let before = commands_on(&env, "worker-1");
    eventually("the forced request gone", CONVERGE, || async {
        (env.request("forced").await.is_none() && env.resources_of("forced").await.is_empty())
            .then_some(())
    })
    .await;
    // One reconciliation may have read the resource before force_detach reached it.
    assert!(
        commands_on(&env, "worker-1") <= before + 1,
        "commands ran on worker-1 after force_detach: {:?}",
        env.nodes.commands()
    );
    assert!(env.gpus_on(&m1).is_empty());

    // The annotation: the fabric detach alone, nothing on the node.
    let name = env.resources_of("skipped").await[0].name_any();
    env.resources()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {ANNOTATION_SKIP_NODE_STEPS: "true"}}}),
            ),
        )
        .await
        .unwrap();
    let before = commands_on(&env, "worker-2");
    eventually("the skipped request gone", CONVERGE, || async {
        (env.request("skipped").await.is_none() && env.resources_of("skipped").await.is_empty())
            .then_some(())
    })
    .await;
    assert!(commands_on(&env, "worker-2") <= before + 1);
    assert!(env.gpus_on(&m2).is_empty());
    env.assert_nothing_attached().await;
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}

/// Row "deleting the Node to get unstuck": the finalizers were dropped and both GPUs
/// stayed attached on the fabric, with `cro_orphan_devices` 0. Now the resources
/// recorded their node's machine at attach, so the deletion detaches both on the
/// fabric; and the upstream sync still sees that machine, so a device there that no
/// resource holds is counted as an orphan and released too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_node_releases_its_devices_on_the_fabric() {
    let mut env = Env::start().await;
    let m1 = env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 2);
    env.config.timings.orphan_grace = Duration::from_secs(3);
    env.start_operator().await;
    env.create_request("pair", on_node(2, "worker-1")).await;
    env.wait_running("pair", 2).await;
    for r in env.resources_of("pair").await {
        let recorded = r.annotations().get(ANNOTATION_NODE_MACHINE).cloned();
        // What the Node said, and the fabric machine the provider reported at attach.
        assert_eq!(
            recorded.as_deref(),
            Some(format!(r#"{{"providerID":"fsas-cdi://{m1}","fabricMachine":"{m1}"}}"#).as_str())
        );
    }
    // The node cannot run commands, the fabric refuses detaches for now: stuck.
    env.nodes.set_unreachable("worker-1", true);
    let refusal = env.sim.inject(
        Fault::error(503, "E5030", "fabric manager is under maintenance")
            .on(Route::FmDetach)
            .always(),
    );
    env.requests()
        .delete("pair", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the cleanup stuck on the node", CONVERGE, || async {
        request_error(&env.request("pair").await?)
            .contains("error dialing backend")
            .then_some(())
    })
    .await;

    // The administrator deletes the Node; then someone attaches a device to its
    // machine outside the operator.
    env.delete_node("worker-1").await;
    let stray = env.sim.attach_directly(&m1, "gpu", MODEL).unwrap().serial;
    // The sync still lists the machine through the resources' record: the stray device
    // is tracked as an orphan, then gets a release resource carrying the record.
    let metrics = env.metrics.clone().unwrap();
    eventually(
        "the stray device counted as an orphan",
        CONVERGE,
        || async {
            metrics
                .encode()
                .lines()
                .any(|l| l == "cro_orphan_devices 1")
                .then_some(())
        },
    )
    .await;
    let release = eventually("a release resource for the stray", CONVERGE, || async {
        env.resources()
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|r| r.ready_to_detach().is_some_and(|o| o.device_id == stray))
    })
    .await;
    assert!(
        release.annotations().contains_key(ANNOTATION_NODE_MACHINE),
        "{release:?}"
    );

    // The fabric takes detaches again: every device on the machine is released, and
    // nothing is left holding a finalizer.
    env.sim.remove_fault(refusal);
    eventually("the request gone", CONVERGE, || async {
        env.request("pair").await.is_none().then_some(())
    })
    .await;
    eventually("every resource gone", CONVERGE, || async {
        env.resources()
            .list(&Default::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    env.assert_nothing_attached().await;
    eventually("no orphan left", CONVERGE, || async {
        metrics
            .encode()
            .lines()
            .any(|l| l == "cro_orphan_devices 0")
            .then_some(())
    })
    .await;
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}

fn spec_file(dir: &tempfile::TempDir, yaml: &str) -> OperatorConfig {
    let path = dir.path().join("provider.yaml");
    std::fs::write(&path, yaml).unwrap();
    OperatorConfig::new(ProviderSource::SpecFile(path))
}

/// Rows "a typo inside the provider's config:", "an HTTP grant that does not cover the
/// configured endpoint" and "the component missing in Go-environment mode": refused
/// before the operator takes a request, naming the setting.
#[test]
fn provider_mistakes_are_refused_at_start_naming_the_setting() {
    let component = cro_test_support::component("fti-provider");
    let dir = tempfile::tempdir().unwrap();
    let shipped = dir.path().join("fti_provider.wasm");
    std::fs::copy(&component, &shipped).unwrap();
    let spec = |config: &str, grant: &str| {
        format!(
            "name: fti\ncomponent: {}\nconfig: {{{config}}}\ngrants:\n  http: [{{url: \"{grant}\"}}]\n",
            shipped.display()
        )
    };
    let check = |yaml: String| {
        cro_operator::provider_spec(&spec_file(&dir, &yaml), |_| None)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };

    // The FTI component declares its keys (describe()): once loaded, a typo is named
    // with the keys it accepts, before any request.
    let good = "api_type: FM, endpoint: \"fm.example:8443/\", tenant_id: t";
    check(spec(good, "https://fm.example:8443")).unwrap();
    let loaded = |yaml: String| {
        let spec = cro_operator::provider_spec(&spec_file(&dir, &yaml), |_| None)
            .map_err(|e| e.to_string())?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let runtime = cro_runtime::Runtime::new(Default::default()).unwrap();
            let provider = runtime
                .load(
                    &spec,
                    std::sync::Arc::new(cro_runtime::cluster::StaticCluster::new()),
                )
                .await
                .unwrap();
            cro_operator::check_loaded(&provider).map_err(|e| e.to_string())
        })
    };
    loaded(spec(good, "https://fm.example:8443")).unwrap();
    let e = loaded(spec(
        "api_type: FM, endpoint: \"fm.example:8443/\", tenant_idd: t",
        "https://fm.example:8443",
    ))
    .unwrap_err();
    assert!(
        e.contains("\"tenant_idd\"") && e.contains("tenant_id"),
        "{e}"
    );

    // A grant that does not cover the endpoint.
    let e = check(spec(good, "https://fm.example:9443")).unwrap_err();
    assert!(
        e.contains("endpoint = \"fm.example:8443/\"") && e.contains("grants.http"),
        "{e}"
    );

    // The Go environment without the component where it is looked for.
    let go_env = |component: Option<&str>| {
        let mut vars = BTreeMap::from([
            ("CDI_PROVIDER_TYPE", "FTI_CDI".to_string()),
            ("FTI_CDI_ENDPOINT", "fm.example:8443/".to_string()),
            ("FTI_CDI_TENANT_ID", "t".to_string()),
        ]);
        if let Some(c) = component {
            vars.insert("CRO_FTI_COMPONENT", c.to_owned());
        }
        cro_operator::provider_spec(&OperatorConfig::new(ProviderSource::GoEnvironment), |k| {
            vars.get(k).cloned()
        })
        .map(|_| ())
        .map_err(|e| e.to_string())
    };
    let e = go_env(None).unwrap_err();
    if !std::path::Path::new(cro_operator::compat::DEFAULT_FTI_COMPONENT).exists() {
        assert!(e.contains("set CRO_FTI_COMPONENT"), "{e}");
    }
    let e = go_env(Some("/nonexistent/fti.wasm")).unwrap_err();
    assert!(
        e.contains("CRO_FTI_COMPONENT") && e.contains("/nonexistent/fti.wasm"),
        "{e}"
    );
    go_env(Some(component.to_str().unwrap())).unwrap();
}

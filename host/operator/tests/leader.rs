//! Leader election with a Lease on the real API server.

mod common;

use std::time::{Duration, Instant};

use common::{CONVERGE, Env, MODEL, eventually, gpu};
use cro_operator::config::LeaderElectionConfig;
use cro_operator::leader::{self, LeaderElector};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

fn config(identity: &str, lease: Duration) -> LeaderElectionConfig {
    let mut c = LeaderElectionConfig::new("default", identity);
    c.lease_name = "cro-test-leader".into();
    c.lease_duration = lease;
    c.renew_period = Duration::from_millis(200);
    c
}

async fn holder(client: &kube::Client) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), "default")
        .get("cro-test-leader")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_takeover_after_expiry_release_and_loss() {
    common::init_tracing();
    let harness = kube_harness::Harness::start().await.unwrap();
    let client = harness.client().unwrap();
    let lease = Duration::from_secs(2);

    let mut a = LeaderElector::new(client.clone(), config("a", lease));
    let mut b = LeaderElector::new(client.clone(), config("b", lease));
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(!b.try_acquire_or_renew().await.unwrap());
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(!b.try_acquire_or_renew().await.unwrap());
    assert_eq!(holder(&client).await.as_deref(), Some("a"));

    // a stops renewing: b takes over once it has seen the record unchanged for the
    // lease duration.
    let started = Instant::now();
    let b_leads = leader::acquire(client.clone(), config("b", lease), |_| {})
        .await
        .unwrap();
    assert!(
        started.elapsed() >= lease,
        "took over after {:?}",
        started.elapsed()
    );
    assert_eq!(holder(&client).await.as_deref(), Some("b"));
    let spec = Api::<Lease>::namespaced(client.clone(), "default")
        .get("cro-test-leader")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(spec.lease_transitions, Some(1));
    // While b renews, a cannot take it even after the lease duration.
    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    assert!(!a.try_acquire_or_renew().await.unwrap());

    // Released: a takes over at once.
    b_leads.release().await;
    assert_eq!(holder(&client).await, None);
    assert!(a.try_acquire_or_renew().await.unwrap());

    // Another instance overwrites the Lease: the holder notices it lost.
    let mut c_leads = leader::acquire(client.clone(), config("c", lease), |_| {})
        .await
        .unwrap();
    assert!(!c_leads.is_lost());
    Api::<Lease>::namespaced(client.clone(), "default")
        .patch(
            "cro-test-leader",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "intruder",
                "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                    k8s_openapi::jiff::Timestamp::now())}})),
        )
        .await
        .unwrap();
    tokio::time::timeout(CONVERGE, c_leads.lost())
        .await
        .unwrap();
    assert!(c_leads.is_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_operator_reconciles_nothing_until_it_leads() {
    let mut env = Env::start().await;
    let m1 = env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 1);
    let other = leader::acquire(
        env.client.clone(),
        config("other", Duration::from_secs(30)),
        |_| {},
    )
    .await
    .unwrap();
    env.config.leader_election = Some(config("operator", Duration::from_secs(30)));
    env.start_operator().await;

    env.create_request("waiting", gpu(1)).await;
    // The standby leaves it alone while the other instance leads.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(env.request("waiting").await.unwrap().status, None);
    assert!(env.gpus_on(&m1).is_empty());

    other.release().await;
    env.wait_running("waiting", 1).await;
    assert_eq!(holder(&env.client).await.as_deref(), Some("operator"));
    eventually("one GPU attached", CONVERGE, || async {
        (env.gpus_on(&m1).len() == 1).then_some(())
    })
    .await;
    env.stop_operator().await.unwrap();
    // A graceful stop releases the Lease.
    assert_eq!(holder(&env.client).await, None);

    // Leading again, then another instance takes the Lease: the operator stops with an
    // error (so that its process restarts as a standby).
    env.start_operator().await;
    eventually("the operator leads again", CONVERGE, || async {
        (holder(&env.client).await.as_deref() == Some("operator")).then_some(())
    })
    .await;
    Api::<Lease>::namespaced(env.client.clone(), "default")
        .patch(
            "cro-test-leader",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "intruder",
                "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                    k8s_openapi::jiff::Timestamp::now())}})),
        )
        .await
        .unwrap();
    let ended = env.operator_exit(CONVERGE).await;
    assert!(
        matches!(ended, Err(cro_operator::OperatorError::Leadership(_))),
        "{ended:?}"
    );
}

/// The objects of the chart's templates `files` (defaults, the Go operator's namespace).
fn chart_objects(files: &[&str]) -> Vec<kube_harness::manifests::Manifest> {
    use kube_harness::tools::{self, DEPLOY_DIR, Tool};
    let helm = tools::locate(Tool::Helm).expect("helm");
    let chart = std::path::Path::new(DEPLOY_DIR).join("helm/cro");
    let mut args = vec![
        "template",
        "cro",
        chart.to_str().unwrap(),
        "--namespace",
        common::OPERATOR_NS,
        // A GPU cluster: the GPU operator's API is served, so the chart grants what the
        // operator needs in its namespace (restarting the device plugin).
        "--api-versions",
        "nvidia.com/v1",
    ];
    for f in files {
        args.extend(["--show-only", f]);
    }
    let out = tools::run(&helm, &args, std::path::Path::new(DEPLOY_DIR))
        .unwrap_or_else(|e| panic!("{e}"));
    kube_harness::manifests::parse(&out).unwrap()
}

/// The operator under the chart's ServiceAccount and roles (a token the API server issues
/// for that account, not an administrator): the leader Lease, the provider's Secret, the
/// request's whole life (attach, GPU operator daemonset restart, scale down, delete) and
/// Events all pass. A rule the code needs but the chart lacks makes a step fail with 403
/// and the request never converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_flow_runs_under_the_charts_rbac() {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use cro_operator::{Operator, compat};
    use cro_runtime::cluster::KubeCluster;
    use cro_runtime::{Runtime, RuntimeOptions};
    use k8s_openapi::api::apps::v1::DaemonSet;
    use kube::api::PostParams;

    let env = Env::start().await;
    let rbac = chart_objects(&["templates/serviceaccount.yaml", "templates/rbac.yaml"]);
    assert!(rbac.iter().any(|m| m.kind == "ClusterRole"));
    kube_harness::manifests::apply(&env.client, &rbac, false)
        .await
        .unwrap();
    let sa_config = env
        .harness
        .service_account_config(
            common::OPERATOR_NS,
            "cro-controller",
            Duration::from_secs(3600),
        )
        .await
        .unwrap();
    let sa = kube::Client::try_from(sa_config).unwrap();
    // The token really is the service account's, with nothing beyond its roles.
    let denied = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(sa.clone(), "default")
        .list(&Default::default())
        .await;
    assert!(
        matches!(denied, Err(kube::Error::Api(ref e)) if e.code == 403),
        "{denied:?}"
    );

    // The simulated GPU operator runs the device plugin daemonset (rolled out, so a GPU
    // change restarts it): the restart is a patch under the chart's namespaced Role.
    let daemonsets: Api<DaemonSet> = Api::namespaced(env.client.clone(), common::GPU_NS);

    // The provider reads its Secret and looks Nodes up with the same account.
    let ca = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca.path(), env.sim.ca_pem()).unwrap();
    let vars: BTreeMap<&str, String> = BTreeMap::from([
        ("CDI_PROVIDER_TYPE", "FTI_CDI".to_string()),
        ("FTI_CDI_API_TYPE", "FM".to_string()),
        ("FTI_CDI_ENDPOINT", env.sim.endpoint()),
        ("FTI_CDI_TENANT_ID", env.sim.tenant_id().to_string()),
        ("CRO_FTI_CA_FILE", ca.path().display().to_string()),
        (
            "CRO_FTI_COMPONENT",
            cro_test_support::component("fti-provider")
                .display()
                .to_string(),
        ),
    ]);
    let spec = compat::fti_spec_from_env(|k| vars.get(k).cloned())
        .unwrap()
        .unwrap();
    let provider = Runtime::new(RuntimeOptions::default())
        .unwrap()
        .load(&spec, Arc::new(KubeCluster::new(sa.clone())))
        .await
        .unwrap();

    let m1 = env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 2);
    let pool = env.sim.free_devices("gpu", MODEL);
    let mut config = env.config.clone();
    // /metrics as the chart serves it: HTTPS, for tokens allowed get /metrics only.
    config.metrics_addr = Some("127.0.0.1:0".parse().unwrap());
    config.metrics_secure = true;
    // The chart's Lease lives in the release namespace (POD_NAMESPACE).
    let mut le = cro_operator::config::LeaderElectionConfig::new(common::OPERATOR_NS, "cro-0");
    le.renew_period = Duration::from_millis(500);
    config.leader_election = Some(le);
    let mut operator = Operator::new(
        sa.clone(),
        Arc::new(provider),
        Arc::new(env.nodes.clone()),
        config,
    );
    let (metrics_addr, _) = operator.bind().await.unwrap();
    let metrics_url = format!("https://{}/metrics", metrics_addr.unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(operator.run_until(async {
        let _ = stopped.await;
    }));

    env.create_request("under-rbac", gpu(2)).await;
    env.wait_running("under-rbac", 2).await;
    assert_eq!(env.gpus_on(&m1).len(), 2);
    eventually(
        "the device plugin daemonset restarted",
        CONVERGE,
        || async {
            let ds = daemonsets
                .get("nvidia-device-plugin-daemonset")
                .await
                .ok()?;
            let ds = serde_json::to_value(ds).ok()?;
            ds["spec"]["template"]["metadata"]["annotations"]
                .get("kubectl.kubernetes.io/restartedAt")
                .map(|_| ())
        },
    )
    .await;
    let mut smaller = gpu(1);
    smaller.size = 1;
    env.set_request("under-rbac", &smaller).await;
    env.wait_running("under-rbac", 1).await;
    env.requests()
        .delete("under-rbac", &Default::default())
        .await
        .unwrap();
    eventually("the request is gone", CONVERGE, || async {
        env.request("under-rbac").await.is_none().then_some(())
    })
    .await;
    eventually("every GPU back in the pool", CONVERGE, || async {
        (env.sim.free_devices("gpu", MODEL) == pool && env.gpus_on(&m1).is_empty()).then_some(())
    })
    .await;
    // A scraper bound to the chart's metrics-reader role reads /metrics; the operator's
    // own account (not bound to it) and a request without a token do not. The operator
    // asks the API server (TokenReview, SubjectAccessReview) under the chart's roles.
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(env.client.clone(), common::OPERATOR_NS);
    let scraper: k8s_openapi::api::core::v1::ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "prometheus"}})).unwrap();
    accounts
        .create(&PostParams::default(), &scraper)
        .await
        .unwrap();
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "prometheus-reads-cro"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cro-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": common::OPERATOR_NS}],
    }))
    .unwrap();
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(env.client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let prometheus = env
        .harness
        .service_account_token(common::OPERATOR_NS, "prometheus", Duration::from_secs(600))
        .await
        .unwrap();
    let operator_token = env
        .harness
        .service_account_token(
            common::OPERATOR_NS,
            "cro-controller",
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let scrape = |token: Option<String>| {
        let (http, url) = (http.clone(), metrics_url.clone());
        async move {
            let mut r = http.get(url);
            if let Some(t) = token {
                r = r.bearer_auth(t);
            }
            let r = r.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    assert_eq!(scrape(None).await.0, 401);
    assert_eq!(scrape(Some("not-a-token".into())).await.0, 401);
    assert_eq!(scrape(Some(operator_token)).await.0, 403);
    // RBAC bindings reach the authorizer's cache asynchronously.
    let body = eventually("the scraper reads /metrics", CONVERGE, || async {
        let (code, body) = scrape(Some(prometheus.clone())).await;
        (code == 200).then_some(body)
    })
    .await;
    assert!(body.contains("cro_reconciles_total"), "{body}");
    let health = http
        .get(metrics_url.replace("/metrics", "/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 200, "probes need no token");

    // Events were written under the account too.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(env.client.clone());
    assert!(
        !events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "no Event was recorded"
    );
    let _ = stop.send(());
    tokio::time::timeout(CONVERGE, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        Api::<Lease>::namespaced(env.client.clone(), common::OPERATOR_NS)
            .get(cro_operator::config::DEFAULT_LEASE_NAME)
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity,
        None,
        "the Lease was released on stop"
    );
}

/// A Go-operator deployment mid-flight, adopted: the Go operator holds its Lease
/// (`c5744f42.hpsys.ibm.ie.com`) while cro starts, so cro does nothing; then the Go
/// replica goes away and cro takes over the objects it wrote: an Online device, one
/// Attaching with its ids already stored, one Detaching on a resource being deleted.
/// No device is attached a second time (no free device is taken), the detach
/// completes, and the pool holds what it held plus the one device that was detached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_operator_deployment_is_adopted_mid_flight() {
    use cro_api::FINALIZER;
    use fabric_sim::Route;
    use kube::api::{DeleteParams, PostParams};

    let mut env = Env::start().await;
    let m1 = env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 3);
    let pool_before = env.sim.free_devices("gpu", MODEL);
    // What the Go operator attached before the switch.
    let d_online = env.sim.attach_directly(&m1, "gpu", MODEL).unwrap();
    let d_attaching = env.sim.attach_directly(&m1, "gpu", MODEL).unwrap();
    let d_detaching = env.sim.attach_directly(&m1, "gpu", MODEL).unwrap();
    env.sim.clear_requests();

    // A Go replica leads with the Go operator's Lease.
    let mut go = LeaderElectionConfig::new(common::OPERATOR_NS, "go-operator-7d9f-abc");
    assert_eq!(go.lease_name, "c5744f42.hpsys.ibm.ie.com");
    go.renew_period = Duration::from_millis(500);
    let go_leads = leader::acquire(env.client.clone(), go, |_| {})
        .await
        .unwrap();

    // The objects as the Go operator wrote them.
    let requests = env.requests();
    let resources = env.resources();
    let mut spec = gpu(2);
    spec.target_node = Some("worker-1".into());
    let req: cro_api::ComposabilityRequest = serde_json::from_value(json!({
        "apiVersion": "cro.hpsys.ibm.ie.com/v1alpha1", "kind": "ComposabilityRequest",
        "metadata": {"name": "go-req", "finalizers": [FINALIZER]},
        "spec": {"resource": spec},
    }))
    .unwrap();
    requests.create(&PostParams::default(), &req).await.unwrap();
    let entry = |state: &str, d: &fabric_sim::SimDevice| json!({"state": state, "device_id": d.serial, "cdi_device_id": d.res_uuid, "node_name": "worker-1"});
    requests
        .patch_status(
            "go-req",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"state": "Updating", "scalarResource": spec,
                "resources": {"gpu-go-online": entry("Online", &d_online),
                              "gpu-go-attaching": entry("Attaching", &d_attaching),
                              "gpu-go-detaching": entry("Detaching", &d_detaching)}}}),
            ),
        )
        .await
        .unwrap();
    for (name, state, d) in [
        ("gpu-go-online", "Online", &d_online),
        ("gpu-go-attaching", "Attaching", &d_attaching),
        ("gpu-go-detaching", "Detaching", &d_detaching),
    ] {
        let res: cro_api::ComposableResource = serde_json::from_value(json!({
            "apiVersion": "cro.hpsys.ibm.ie.com/v1alpha1", "kind": "ComposableResource",
            "metadata": {"name": name, "finalizers": [FINALIZER],
                "labels": {"app.kubernetes.io/managed-by": "go-req"}},
            "spec": {"type": "gpu", "model": MODEL, "target_node": "worker-1"},
        }))
        .unwrap();
        resources
            .create(&PostParams::default(), &res)
            .await
            .unwrap();
        resources
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"state": state, "device_id": d.serial,
                    "cdi_device_id": d.res_uuid, "error": ""}})),
            )
            .await
            .unwrap();
    }
    // The Go operator was scaling down: the third device's resource is being deleted.
    resources
        .delete("gpu-go-detaching", &DeleteParams::default())
        .await
        .unwrap();

    let mut le = LeaderElectionConfig::new(common::OPERATOR_NS, "cro-0");
    le.renew_period = Duration::from_millis(500);
    env.config.leader_election = Some(le);
    env.start_operator().await;
    // While the Go replica leads, cro leaves everything alone.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(env.sim.requests_to(Route::FmAttach).is_empty());
    assert!(env.sim.requests_to(Route::FmDetach).is_empty());
    assert_eq!(
        resources
            .get("gpu-go-attaching")
            .await
            .unwrap()
            .status
            .unwrap()
            .state,
        cro_api::ResourceState::Attaching
    );

    // The Go replica is gone (its pod terminated and released the Lease).
    go_leads.release().await;
    env.wait_running("go-req", 2).await;
    eventually("the Detaching resource is gone", CONVERGE, || async {
        resources
            .get_opt("gpu-go-detaching")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let mut on_node = env.gpus_on(&m1);
    on_node.sort();
    let mut expected = vec![d_online.serial.clone(), d_attaching.serial.clone()];
    expected.sort();
    assert_eq!(
        on_node, expected,
        "the two devices in use stay where they were"
    );
    for (name, d) in [
        ("gpu-go-online", &d_online),
        ("gpu-go-attaching", &d_attaching),
    ] {
        let status = resources.get(name).await.unwrap().status.unwrap();
        assert_eq!(status.state, cro_api::ResourceState::Online, "{name}");
        assert_eq!(status.device_id, d.serial, "{name} keeps its device");
    }
    assert!(
        env.sim.requests_to(Route::FmAttach).is_empty(),
        "no device was attached a second time"
    );
    assert_eq!(env.sim.requests_to(Route::FmDetach).len(), 1);
    assert_eq!(
        env.sim.free_devices("gpu", MODEL),
        pool_before + 1,
        "no free device taken, the detached one returned, nothing leaked"
    );
    assert_eq!(env.resources_of("go-req").await.len(), 2);
    env.stop_operator().await.unwrap();
}

/// Issue 15 row "the namespace of the Lease missing": the failure used to be logged as
/// a raw `Debug` dump every 5 s. Now it reads as words naming the namespace and the
/// setting, and repeats of the same failure are spaced out and not logged again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_lease_namespace_is_said_in_words_and_not_repeated() {
    common::init_tracing();
    let harness = kube_harness::Harness::start().await.unwrap();
    let client = harness.client().unwrap();
    let mut c = config("a", Duration::from_secs(2));
    c.namespace = "no-such-namespace".into();
    let mut elector = LeaderElector::new(client.clone(), c);
    let e = elector.try_acquire_or_renew().await.unwrap_err();
    let text = elector.describe_error(&e);
    assert!(
        text.contains("namespace no-such-namespace does not exist")
            && text.contains("--leader-election-namespace (POD_NAMESPACE)"),
        "{text}"
    );
    assert!(
        !text.contains("Status {") && !text.contains("ErrorResponse"),
        "{text}"
    );
    // The waiting replica says it once and backs off while nothing changes.
    let mut waiting = leader::Waiting::default();
    let base = Duration::from_millis(200);
    let delays: Vec<(Duration, bool)> = (0..4).map(|_| waiting.failed(&text, base)).collect();
    assert_eq!(
        delays,
        vec![
            (base, true),
            (base * 2, false),
            (base * 4, false),
            (base * 8, false)
        ]
    );
}

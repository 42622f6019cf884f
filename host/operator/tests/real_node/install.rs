//! cro installed the way a cluster operator installs it (docs/deploying.md, "Try it on
//! one machine"): the image imported into the node's containerd, `helm install` of
//! deploy/helm/cro with the documented values for a node whose pods use the host's
//! network, the operator running in a real pod; then the webhook called by the API
//! server, `/metrics` scraped with tokens, the Go README request converging on the
//! node's GPUs through the real node software, `helm upgrade`, and `helm uninstall` with
//! a live request: refused with the request named, then detached before anything goes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cro_api::ComposabilityRequest;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use kube_harness::tools::{self, DEPLOY_DIR, Tool};
use serde_json::json;

use super::{
    WORKLOAD_NS, apply_go_readme_request, assert_all_commands_through_exec,
    create_gpu_claim_template, delete_pod_and_wait, go_readme_request, gpu_claim_pod, printed_gpu,
};
use crate::common::nodes::{NodeOptions, NodeSetup};
use crate::common::{CONVERGE, Env, MODEL, OPERATOR_NS, eventually};

pub(super) const RELEASE: &str = "cro";
pub(super) const DEPLOYMENT: &str = "cro-controller";
pub(super) const LEASE: &str = "c5744f42.hpsys.ibm.ie.com";
/// Where scripts/test.sh leaves the image archive (deploy/image/build.sh --oci-archive);
/// CRO_IMAGE_ARCHIVE names another.
const DEFAULT_ARCHIVE: &str = "target/image/cro.oci.tar";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The image archive to import, which must exist: building it takes cargo, which a test
/// run already holds.
fn image_archive() -> PathBuf {
    let path = std::env::var_os("CRO_IMAGE_ARCHIVE")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(DEFAULT_ARCHIVE));
    assert!(
        path.is_file(),
        "no image archive at {}: build it first with `deploy/image/build.sh --oci-archive {}` \
         (scripts/test.sh does), or point CRO_IMAGE_ARCHIVE at one",
        path.display(),
        DEFAULT_ARCHIVE
    );
    path
}

/// A loopback port nothing listens on now (the operator's pod binds it on the host).
pub(super) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

pub(super) struct Ports {
    pub(super) metrics: u16,
    pub(super) probes: u16,
    pub(super) webhook: u16,
}

/// helm against the real node's API server.
pub(super) struct Helm {
    program: PathBuf,
    kubeconfig: PathBuf,
}

impl Helm {
    pub(super) fn new(env: &Env) -> Helm {
        Helm {
            program: tools::locate(Tool::Helm).expect("helm"),
            kubeconfig: env
                .harness
                .kubeconfig_path()
                .expect("the real node's kubeconfig")
                .to_path_buf(),
        }
    }

    pub(super) fn run(&self, args: &[&str]) -> Result<String, tools::ToolError> {
        let mut all: Vec<&str> = args.to_vec();
        let kubeconfig = self.kubeconfig.to_str().unwrap();
        all.extend(["--kubeconfig", kubeconfig, "--namespace", OPERATOR_NS]);
        tools::run(&self.program, &all, Path::new(DEPLOY_DIR))
    }
}

/// The values docs/deploying.md gives for a one-node cluster whose pods use the host's
/// network, with this fabric and these ports.
pub(super) fn install_values(env: &Env, ports: &Ports) -> String {
    let api_port = env
        .harness
        .server_url()
        .rsplit(':')
        .next()
        .expect("the API server's port")
        .trim_end_matches('/')
        .to_owned();
    let values = json!({
        "replicaCount": 1,
        "image": {"pullPolicy": "Never"},
        "hostNetwork": true,
        "metrics": {"port": ports.metrics, "bindAddress": "127.0.0.1"},
        "probes": {"port": ports.probes, "bindAddress": "127.0.0.1"},
        "webhook": {
            "port": ports.webhook,
            "bindAddress": "127.0.0.1",
            "url": format!("https://127.0.0.1:{}", ports.webhook),
            "extraNames": ["127.0.0.1"],
        },
        // In a hostNetwork pod the Service address of the API server is not routed here.
        "extraEnv": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": api_port},
        ],
        "gpuOperator": {"rbac": true},
        // The fabric's free GPUs as ResourceSlices, and the kubelet plugin on the node.
        "pool": {"devices": [{"type": "gpu", "model": MODEL}], "period": "2s"},
        "kubeletPlugin": {
            "kubeletDir": env.node_sim.real().node.kubelet_root(),
            "cdiDir": env.node_sim.real().node.cdi_dir(),
        },
        "provider": {"fti": {
            "endpoint": env.sim.endpoint(),
            "tenantId": env.sim.tenant_id().to_string(),
            "caPem": env.sim.ca_pem(),
        }},
    });
    serde_json::to_string(&values).unwrap()
}

/// The operator's pods, Ready or not.
pub(super) async fn operator_pods(env: &Env) -> Vec<Pod> {
    Api::<Pod>::namespaced(env.client.clone(), OPERATOR_NS)
        .list(&ListParams::default().labels("control-plane=controller-manager"))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

pub(super) fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits for exactly one Ready operator pod other than `not`; returns its name.
pub(super) async fn one_ready_pod(env: &Env, not: Option<&str>) -> String {
    eventually("one Ready operator pod", CONVERGE, || async {
        let pods = operator_pods(env).await;
        let ready: Vec<String> = pods
            .iter()
            .filter(|p| is_ready(p) && Some(p.name_any().as_str()) != not)
            .map(ResourceExt::name_any)
            .collect();
        (ready.len() == 1 && pods.len() == 1).then(|| ready[0].clone())
    })
    .await
}

/// The webhook is called by the API server: a request naming a Node that does not
/// exist is refused with the webhook's own words.
async fn assert_webhook_answers(env: &Env) {
    let mut typo = go_readme_request();
    typo.metadata.name = Some("typo-in-node".into());
    typo.spec.resource.target_node = Some("wroker-1".into());
    let refusal = eventually("the webhook refuses a typo", CONVERGE, || async {
        match env.requests().create(&PostParams::default(), &typo).await {
            Err(e) if e.to_string().contains("is not a Node") => Some(e.to_string()),
            Ok(_) => panic!("a request for a Node that does not exist was admitted"),
            Err(_) => None,
        }
    })
    .await;
    assert!(
        refusal.contains("target_node wroker-1 is not a Node"),
        "{refusal}"
    );
}

/// `/metrics` over HTTPS: 401 without a token, 403 for an account not bound to the
/// chart's metrics-reader ClusterRole, 200 with the operator's metrics for one that is.
async fn assert_metrics_by_token(env: &Env, port: u16) {
    let sas: Api<ServiceAccount> = Api::namespaced(env.client.clone(), OPERATOR_NS);
    for name in ["scraper", "stranger"] {
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        sas.create(&PostParams::default(), &sa).await.unwrap();
    }
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "scraper-reads-cro-metrics"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
            "name": "cro-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": OPERATOR_NS}],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(env.client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let token = |name: &'static str| async move {
        env.harness
            .service_account_token(OPERATOR_NS, name, Duration::from_secs(600))
            .await
            .unwrap()
    };
    let (scraper, stranger) = (token("scraper").await, token("stranger").await);
    // The operator's certificate is its own (self-signed): a scraper pins it or, as
    // here, checks only the token path.
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let url = format!("https://127.0.0.1:{port}/metrics");
    let get = |token: Option<String>| {
        let mut request = http.get(&url);
        if let Some(t) = token {
            request = request.bearer_auth(t);
        }
        async move {
            let response = request.send().await.ok()?;
            let status = response.status().as_u16();
            Some((status, response.text().await.unwrap_or_default()))
        }
    };
    let (status, _) = eventually("/metrics answers", CONVERGE, || get(None)).await;
    assert_eq!(status, 401);
    let (status, _) = get(Some(stranger)).await.unwrap();
    assert_eq!(status, 403);
    let body = eventually("the bound scraper reads /metrics", CONVERGE, || async {
        let (status, body) = get(Some(scraper.clone())).await?;
        (status == 200).then_some(body)
    })
    .await;
    assert!(body.contains("cro_"), "no cro metric in\n{body}");
}

pub(super) fn lease_holder(lease: Option<Lease>) -> Option<String> {
    lease
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

/// What an uninstall leaves (docs/deploying.md, "Uninstalling"): the administrator's
/// Secret, the Namespace and the CRDs, so every request there was.
async fn assert_what_stays(env: &Env) {
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), OPERATOR_NS);
    let secret = secrets
        .get_opt(cro_operator::compat::CREDENTIALS_SECRET)
        .await;
    assert!(
        secret.unwrap().is_some(),
        "the administrator's Secret stays"
    );
    let namespace = Api::<Namespace>::all(env.client.clone())
        .get_opt(OPERATOR_NS)
        .await;
    assert!(namespace.unwrap().is_some(), "the Namespace stays");
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    for crd in [
        "composabilityrequests.cro.hpsys.ibm.ie.com",
        "composableresources.cro.hpsys.ibm.ie.com",
    ] {
        assert!(crds.get_opt(crd).await.unwrap().is_some(), "{crd} stays");
    }
}

/// The real node with the GPU operator's software, one machine with free GPUs, the
/// credentials Secret, and the cro image in the node's containerd.
pub(super) async fn node_with_image() -> (Env, String) {
    let env = Env::start_real(NodeSetup::gpu_operator()).await;
    let machine = env.add_real_node(NodeOptions::default()).await;
    env.sim.add_free_devices("gpu", MODEL, 3);
    let archive = image_archive();
    let t0 = Instant::now();
    env.node_sim
        .real()
        .node
        .ctr(&["images", "import", archive.to_str().unwrap()])
        .expect("the image imports");
    let images = env
        .node_sim
        .real()
        .node
        .ctr(&["images", "ls", "-q"])
        .unwrap();
    let expected = format!("localhost/cro:{}", env!("CARGO_PKG_VERSION"));
    assert!(
        images.lines().any(|l| l.trim() == expected),
        "the archive created no {expected}: {images}"
    );
    eprintln!("image imported in {:?}", t0.elapsed());
    (env, machine)
}

/// helm install, upgrade and uninstall on the real node, with a live request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_upgrade_and_uninstall_with_a_live_request() {
    let (env, machine) = node_with_image().await;
    let ports = Ports {
        metrics: free_port(),
        probes: free_port(),
        webhook: free_port(),
    };
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    std::fs::write(&values, install_values(&env, &ports)).unwrap();
    let values = values.to_str().unwrap().to_owned();
    let helm = Helm::new(&env);
    let chart = Path::new(DEPLOY_DIR).join("helm/cro");
    let chart = chart.to_str().unwrap();

    // Install: only the documented values; no cert-manager, no GPU operator's API.
    let t0 = Instant::now();
    helm.run(&["install", RELEASE, chart, "--values", &values])
        .unwrap_or_else(|e| panic!("{e}"));
    let first = one_ready_pod(&env, None).await;
    let install_to_ready = t0.elapsed();
    eventually("the operator leads", CONVERGE, || async {
        let lease = Api::<Lease>::namespaced(env.client.clone(), OPERATOR_NS)
            .get_opt(LEASE)
            .await
            .ok()?;
        lease_holder(lease).filter(|h| h == &first)
    })
    .await;
    assert_webhook_answers(&env).await;
    assert_metrics_by_token(&env, ports.metrics).await;

    // The Go README request, through the operator in its pod and the node's real pods.
    let t1 = Instant::now();
    let name = apply_go_readme_request(&env).await;
    env.wait_running(&name, 2).await;
    let to_running = t1.elapsed();
    let gpus = env.gpus_on(&machine);
    assert_eq!(gpus.len(), 2);
    let commands = assert_all_commands_through_exec(&env);

    // A Pod's claim through what the chart installed for the pool: the operator publishes
    // the free GPU, the scheduler allocates it, the operator attaches it, and the chart's
    // kubelet plugin DaemonSet hands it to the container.
    let t_claim = Instant::now();
    create_gpu_claim_template(&env).await;
    let workload: Api<Pod> = Api::namespaced(env.client.clone(), WORKLOAD_NS);
    workload
        .create(&PostParams::default(), &gpu_claim_pod("claimer"))
        .await
        .unwrap();
    let handed = printed_gpu(&workload, "claimer").await;
    let claim_to_running = t_claim.elapsed();
    let with_claim = env.gpus_on(&machine);
    assert_eq!(
        with_claim.len(),
        3,
        "the request's two GPUs and the claim's"
    );
    assert!(
        with_claim.contains(&handed) && !gpus.contains(&handed),
        "the container got the GPU attached for its claim: {handed} of {with_claim:?}"
    );
    delete_pod_and_wait(&env, WORKLOAD_NS, "claimer").await;
    eventually("the claim's GPU back in the pool", CONVERGE, || async {
        (env.gpus_on(&machine).len() == 2).then_some(())
    })
    .await;

    // Uninstall while the request holds GPUs: refused, the request named, nothing gone.
    let refused = helm
        .run(&["uninstall", RELEASE, "--wait", "--timeout", "3m"])
        .expect_err("an uninstall with a live request is refused");
    let text = refused.to_string();
    assert!(
        text.contains("refusing to uninstall") && text.contains(&name),
        "the refusal names the request: {text}"
    );
    // helm records the release as `uninstalling` once a pre-delete hook ran, but deletes
    // nothing: every object is there, and upgrade and uninstall work on it.
    let status = helm.run(&["status", RELEASE]).unwrap();
    assert!(status.contains("STATUS: uninstalling"), "{status}");
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), OPERATOR_NS);
    assert!(deployments.get_opt(DEPLOYMENT).await.unwrap().is_some());
    assert_eq!(env.gpus_on(&machine), gpus, "the refusal detached nothing");
    assert_eq!(
        one_ready_pod(&env, None).await,
        first,
        "the operator still runs"
    );

    // helm keeps a release whose pre-delete hook failed as `uninstalling`; a rollback
    // makes it `deployed` again, so its values can change (docs/deploying.md).
    helm.run(&["rollback", RELEASE, "1", "--wait"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        one_ready_pod(&env, None).await,
        first,
        "a rollback to the same values restarts nothing"
    );

    // Upgrade: the new pod replaces the old one (one at a time: host ports); the
    // request keeps its GPUs.
    let t2 = Instant::now();
    helm.run(&[
        "upgrade",
        RELEASE,
        chart,
        "--reuse-values",
        "--set",
        "uninstall.liveRequests=detach",
        "--set",
        "logFormat=text",
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    let second = one_ready_pod(&env, Some(&first)).await;
    let upgrade_to_ready = t2.elapsed();
    assert_ne!(second, first);
    env.wait_running(&name, 2).await;
    assert_eq!(env.gpus_on(&machine), gpus, "an upgrade keeps the GPUs");

    // Uninstall with detach: the request and its devices go first, then everything of
    // the release; what holds users' data and the administrator's stays.
    let t3 = Instant::now();
    helm.run(&["uninstall", RELEASE, "--wait", "--timeout", "5m"])
        .unwrap_or_else(|e| panic!("{e}"));
    let uninstall = t3.elapsed();
    env.assert_nothing_attached().await;
    assert!(env.request(&name).await.is_none());
    assert!(
        Api::<ComposabilityRequest>::all(env.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let lease = Api::<Lease>::namespaced(env.client.clone(), OPERATOR_NS)
        .get_opt(LEASE)
        .await
        .unwrap();
    assert_eq!(lease_holder(lease), None, "the Lease is released");
    assert!(operator_pods(&env).await.is_empty());
    assert!(deployments.get_opt(DEPLOYMENT).await.unwrap().is_none());
    let job_gone =
        Api::<k8s_openapi::api::batch::v1::Job>::namespaced(env.client.clone(), OPERATOR_NS)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty();
    assert!(job_gone, "the hook's Job is deleted once it succeeded");
    assert_what_stays(&env).await;
    let slices = Api::<k8s_openapi::api::resource::v1::ResourceSlice>::all(env.client.clone())
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=cro"))
        .await
        .unwrap();
    assert!(
        slices.items.is_empty(),
        "no pool offered once cro is gone: {:?}",
        slices
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect::<Vec<_>>()
    );
    eventually("the kubelet plugin gone", CONVERGE, || async {
        let pods = Api::<Pod>::namespaced(env.client.clone(), OPERATOR_NS)
            .list(&ListParams::default().labels("app=cro-kubelet-plugin"))
            .await
            .ok()?;
        pods.items.is_empty().then_some(())
    })
    .await;
    eprintln!(
        "helm on the real node: install → Ready {install_to_ready:?}; Go README request \
         Running in {to_running:?} ({commands} node commands through pods/exec); a claim's \
         Pod Running with its GPU in {claim_to_running:?}; upgrade → \
         Ready {upgrade_to_ready:?}; uninstall with detach {uninstall:?}"
    );
}

/// `to` as a path relative to the directory `from` (kustomize refuses absolute roots).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from = from.canonicalize().unwrap();
    let to = to.canonicalize().unwrap();
    let common = from
        .components()
        .zip(to.components())
        .take_while(|(a, b)| a == b)
        .count();
    let mut path = PathBuf::new();
    for _ in from.components().skip(common) {
        path.push("..");
    }
    for c in to.components().skip(common) {
        path.push(c);
    }
    path
}

/// Ports the one-node overlay listens on (the chart's defaults, on loopback).
const ONE_NODE_PORTS: [u16; 3] = [8443, 8081, 9443];

/// `cro before-uninstall ARGS` from the image, the way a kustomize user runs the step
/// with no chart to run it: the image's binary with the admin's kubeconfig, on the
/// host's network. Returns (success, stdout + stderr).
fn before_uninstall_from_the_image(env: &Env, dir: &Path, args: &[&str]) -> (bool, String) {
    let kubeconfig = dir.join("kubeconfig");
    std::fs::copy(env.harness.kubeconfig_path().unwrap(), &kubeconfig).unwrap();
    // The image runs as its user, 65532 (ctr takes it from the image's config).
    std::os::unix::fs::chown(&kubeconfig, Some(65532), Some(65532)).unwrap();
    let node = &env.node_sim.real().node;
    let image = format!("localhost/cro:{}", env!("CARGO_PKG_VERSION"));
    let mount = format!(
        "type=bind,src={},dst=/etc/cro/kubeconfig,options=rbind:ro",
        kubeconfig.display()
    );
    let id = format!("cro-before-uninstall-{}", uuid::Uuid::new_v4().simple());
    let mut argv = vec![
        "run",
        "--rm",
        "--net-host",
        "--env",
        "KUBECONFIG=/etc/cro/kubeconfig",
        "--mount",
        &mount,
        &image,
        &id,
        "/cro",
        "before-uninstall",
    ];
    argv.extend_from_slice(args);
    let out = std::process::Command::new("ctr")
        .arg("--address")
        .arg(node.containerd_address())
        .args(["-n", "k8s.io"])
        .args(&argv)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("ctr runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// kustomize: the prerequisites and a site overlay of deploy/kustomize/one-node applied
/// with kubectl; the Go README request converges; removal refused by `cro
/// before-uninstall` while the request lives, then done with `--detach`, and `kubectl
/// delete -k` leaves the CRDs, the Namespace and the administrator's Secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kustomize_install_and_removal_with_a_live_request() {
    let (env, machine) = node_with_image().await;
    for port in ONE_NODE_PORTS {
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "port {port} on loopback is taken: the one-node overlay listens there"
        );
    }
    let node = &env.node_sim.real().node;
    let kustomize = Path::new(DEPLOY_DIR).join("kustomize");
    let t0 = Instant::now();
    node.kubectl(&["apply", "-k", "prerequisites"], &kustomize)
        .unwrap_or_else(|e| panic!("{e}"));

    // A site overlay on top of the shipped one: the fabric and the API server's port.
    let site = tempfile::tempdir().unwrap();
    std::fs::write(site.path().join("ca.crt"), env.sim.ca_pem()).unwrap();
    let api_port = env
        .harness
        .server_url()
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_owned();
    std::fs::write(
        site.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources: [{}]\n\
             components: [{}]\n\
             configMapGenerator:\n\
             - name: cro-fabric-ca\n  namespace: {OPERATOR_NS}\n  files: [ca.crt]\n\
             patches: [{{path: site.yaml}}]\n",
            relative(site.path(), &kustomize.join("one-node")).display(),
            // The GPU operator runs here: its Role lets the operator restart the
            // device plugin after a GPU change.
            relative(site.path(), &kustomize.join("gpu-operator")).display(),
        ),
    )
    .unwrap();
    let site_patch = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": DEPLOYMENT, "namespace": OPERATOR_NS},
        "spec": {"template": {"spec": {
            "containers": [{
                "name": "manager",
                "imagePullPolicy": "Never",
                "env": [
                    {"name": "KUBERNETES_SERVICE_PORT", "value": api_port},
                    {"name": "FTI_CDI_ENDPOINT", "value": env.sim.endpoint()},
                    {"name": "FTI_CDI_TENANT_ID", "value": env.sim.tenant_id().to_string()},
                    {"name": "CRO_FTI_CA_FILE", "value": "/etc/cro/fabric-ca/ca.crt"},
                ],
                "volumeMounts": [{"name": "fabric-ca", "mountPath": "/etc/cro/fabric-ca", "readOnly": true}],
            }],
            "volumes": [{"name": "fabric-ca", "configMap": {"name": "cro-fabric-ca"}}],
        }}},
    });
    std::fs::write(
        site.path().join("site.yaml"),
        serde_json::to_string(&site_patch).unwrap(),
    )
    .unwrap();
    node.kubectl(&["apply", "-k", "."], site.path())
        .unwrap_or_else(|e| panic!("{e}"));
    let pod = one_ready_pod(&env, None).await;
    let apply_to_ready = t0.elapsed();
    assert_webhook_answers(&env).await;

    let name = apply_go_readme_request(&env).await;
    env.wait_running(&name, 2).await;
    let gpus = env.gpus_on(&machine);
    assert_eq!(gpus.len(), 2);

    let args = [
        "--namespace",
        OPERATOR_NS,
        "--deployment",
        DEPLOYMENT,
        "--timeout",
        "3m",
    ];
    let (ok, text) = before_uninstall_from_the_image(&env, site.path(), &args);
    assert!(!ok, "a live request must make the step refuse: {text}");
    assert!(
        text.contains("refusing to uninstall") && text.contains(&name),
        "{text}"
    );
    assert_eq!(env.gpus_on(&machine), gpus, "the refusal detached nothing");
    assert_eq!(
        one_ready_pod(&env, None).await,
        pod,
        "the operator still runs"
    );

    let mut detach = args.to_vec();
    detach.push("--detach");
    let t1 = Instant::now();
    let (ok, text) = before_uninstall_from_the_image(&env, site.path(), &detach);
    let detach_time = t1.elapsed();
    assert!(ok, "{text}");
    env.assert_nothing_attached().await;
    assert!(env.request(&name).await.is_none());
    assert!(operator_pods(&env).await.is_empty(), "{text}");
    let lease = Api::<Lease>::namespaced(env.client.clone(), OPERATOR_NS)
        .get_opt(LEASE)
        .await
        .unwrap();
    assert_eq!(lease_holder(lease), None, "the Lease is released: {text}");

    node.kubectl(&["delete", "-k", ".", "--wait=true"], site.path())
        .unwrap_or_else(|e| panic!("{e}"));
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), OPERATOR_NS);
    assert!(deployments.get_opt(DEPLOYMENT).await.unwrap().is_none());
    assert_what_stays(&env).await;
    eprintln!(
        "kustomize on the real node: apply → Ready {apply_to_ready:?}; before-uninstall \
         --detach {detach_time:?}\n{text}"
    );
}

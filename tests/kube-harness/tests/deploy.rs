//! The Helm chart (deploy/helm/cro) and the kustomize tree generated from it: `helm lint`,
//! `helm template` with the default values and other value sets, what each rendering
//! holds, and every rendered object accepted by a real API server (server-side apply,
//! dry run). helm and kustomize come from deploy/tools/ensure-tools.sh.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use kube_harness::manifests::{self, Manifest, stand_in_crd};
use kube_harness::tools::{self, DEPLOY_DIR, Tool};
use kube_harness::{Harness, HarnessBuilder};
use serde_json::Value;

const NS: &str = "composable-resource-operator-system";

fn chart() -> PathBuf {
    Path::new(DEPLOY_DIR).join("helm/cro")
}

fn helm(args: &[&str]) -> Result<String, tools::ToolError> {
    let helm = tools::locate(Tool::Helm).expect("helm");
    tools::run(&helm, args, Path::new(DEPLOY_DIR))
}

/// The API versions `cert-manager-gpu-operator` renders for (what `helm install` would
/// find on a cluster with cert-manager and the GPU operator).
const CERT_MANAGER_AND_GPU_OPERATOR: &[&str] = &["cert-manager.io/v1", "nvidia.com/v1"];

/// The value sets every test renders, by name: the defaults and the other shapes a
/// cluster operator picks, with the API versions the cluster serves beyond the built-in.
type ValueSet = (&'static str, &'static str, String, &'static [&'static str]);

fn value_sets() -> Vec<ValueSet> {
    vec![
        ("defaults", NS, String::new(), &[]),
        (
            "nec",
            NS,
            r#"
provider:
  mode: nec
  nec: {cdimIp: 10.1.2.3, layoutApplyPort: 8080, configurationManagerPort: 8081,
        provisionalGpuUuid: GPU-00000000-0000-0000-0000-000000000001}
"#
            .to_owned(),
            &[],
        ),
        (
            "fti-cm-complete",
            NS,
            r#"
provider:
  fti:
    apiType: CM
    endpoint: "fabric.example:8443/"
    tenantId: "tenant-1"
    clusterId: "cluster-1"
    caPem: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    credentials: {create: true, username: u, password: p, clientId: c, clientSecret: s, realm: r}
metrics:
  serviceMonitor: {enabled: true, labels: {release: prometheus}}
webhook: {certificates: selfManaged}
gpuOperator: {rbac: true}
"#
            .to_owned(),
            &[],
        ),
        (
            "dra-host-driver-own-tls",
            NS,
            r#"
deviceResourceType: DRA
nodeAgent: {enabled: true}
webhook: {certificates: secret, secretName: cro-webhook-tls, caBundle: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"}
"#
            .to_owned(),
            &[],
        ),
        (
            "provider-spec-minimal",
            "cro-elsewhere",
            r#"
replicaCount: 1
leaderElection: {enabled: false}
provider:
  mode: spec
  spec: |
    name: fti
    component: /opt/cro/providers/fti_provider.wasm
webhook: {enabled: false}
metrics: {secure: false}
networkPolicy: {enabled: false}
componentCache: {enabled: false}
"#
            .to_owned(),
            &[],
        ),
        (
            "provider-objects",
            NS,
            r#"
provider:
  mode: objects
  objects: {secretNamespaces: [composable-resource-operator-system, fabric-secrets]}
"#
            .to_owned(),
            &[],
        ),
        (
            "cert-manager-gpu-operator",
            NS,
            "webhook: {certificates: certManager}\n".to_owned(),
            CERT_MANAGER_AND_GPU_OPERATOR,
        ),
        (
            "pool-with-kubelet-plugin",
            NS,
            r#"
hostNetwork: true
pool:
  devices: [{type: gpu, model: "A100 40G"}, {type: cxlmemory, model: "CXL 128G"}]
kubeletPlugin: {cdiDir: /etc/cdi, tolerations: [{operator: Exists}]}
"#
            .to_owned(),
            &[],
        ),
        (
            "host-network",
            NS,
            r#"
replicaCount: 1
hostNetwork: true
metrics: {bindAddress: 127.0.0.1}
probes: {bindAddress: 127.0.0.1}
webhook: {bindAddress: 127.0.0.1, url: "https://127.0.0.1:9443/"}
extraEnv: [{name: RUST_LOG, value: debug}]
"#
            .to_owned(),
            &[],
        ),
    ]
}

fn values_file(dir: &Path, name: &str, yaml: &str) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    path
}

/// `helm template` with the values file, as for a cluster serving `api_versions`.
fn try_render(
    namespace: &str,
    values: &Path,
    api_versions: &[&str],
) -> Result<Vec<Manifest>, tools::ToolError> {
    let chart = chart();
    let mut args = vec![
        "template",
        "cro",
        chart.to_str().unwrap(),
        "--namespace",
        namespace,
        "--values",
        values.to_str().unwrap(),
    ];
    for v in api_versions {
        args.extend(["--api-versions", v]);
    }
    helm(&args).map(|out| manifests::parse(&out).unwrap())
}

fn render(namespace: &str, values: &Path, api_versions: &[&str]) -> Vec<Manifest> {
    try_render(namespace, values, api_versions).unwrap_or_else(|e| panic!("{e}"))
}

/// The rendering of the defaults with `yaml` on top, for the release namespace.
fn render_yaml(yaml: &str, api_versions: &[&str]) -> Vec<Manifest> {
    let dir = tempfile::tempdir().unwrap();
    render(NS, &values_file(dir.path(), "values", yaml), api_versions)
}

fn manager(objs: &[Manifest]) -> &Value {
    &find(objs, "Deployment", "cro-controller")["spec"]["template"]["spec"]["containers"][0]
}

fn args_of(container: &Value) -> Vec<&str> {
    container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect()
}

/// Objects outside the release namespace that are not cluster-scoped.
fn elsewhere(objs: &[Manifest]) -> Vec<String> {
    objs.iter()
        .filter(|m| m.namespace.as_deref().is_some_and(|ns| ns != NS))
        .map(Manifest::describe)
        .collect()
}

fn find<'a>(objs: &'a [Manifest], kind: &str, name: &str) -> &'a Value {
    &objs
        .iter()
        .find(|m| m.kind == kind && m.name == name)
        .unwrap_or_else(|| {
            let have: Vec<_> = objs.iter().map(Manifest::describe).collect();
            panic!("no {kind} {name} in {have:?}")
        })
        .object
}

fn kinds(objs: &[Manifest]) -> BTreeSet<String> {
    objs.iter().map(|m| m.kind.clone()).collect()
}

fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str())
}

#[test]
fn chart_lints_and_renders_what_a_cluster_needs() {
    let dir = tempfile::tempdir().unwrap();
    let chart = chart();
    for (name, namespace, yaml, api_versions) in value_sets() {
        let values = values_file(dir.path(), name, &yaml);
        // `helm lint` has no --api-versions: sets needing an API beyond the built-in
        // ones are only rendered.
        if api_versions.is_empty() {
            helm(&[
                "lint",
                "--strict",
                chart.to_str().unwrap(),
                "--namespace",
                namespace,
                "--values",
                values.to_str().unwrap(),
            ])
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let objs = render(namespace, &values, api_versions);
        for m in &objs {
            if !matches!(
                m.kind.as_str(),
                "ClusterRole"
                    | "ClusterRoleBinding"
                    | "ValidatingWebhookConfiguration"
                    | "DeviceClass"
            ) {
                assert!(
                    m.namespace.is_some(),
                    "{name}: {} has no namespace",
                    m.describe()
                );
            }
        }
        let deploy = find(&objs, "Deployment", "cro-controller");
        let pod = &deploy["spec"]["template"]["spec"];
        let manager = &pod["containers"][0];
        let args: Vec<&str> = manager["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(args[0], "run", "{name}");
        assert_eq!(pod["serviceAccountName"], "cro-controller");
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(manager["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(
            manager["securityContext"]["allowPrivilegeEscalation"],
            false
        );
        assert_eq!(manager["securityContext"]["capabilities"]["drop"][0], "ALL");
        assert_eq!(manager["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(manager["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert!(manager["resources"]["limits"]["memory"].is_string());
        assert!(env_value(manager, "DEVICE_RESOURCE_TYPE").is_some());
        assert!(
            manager["env"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["name"] == "POD_NAMESPACE"),
            "{name}: POD_NAMESPACE names the Lease's namespace"
        );
        assert!(kinds(&objs).contains("ServiceAccount"));
        find(&objs, "ClusterRole", "cro-manager");
        find(&objs, "ClusterRoleBinding", "cro-manager");
        find(&objs, "Role", "cro-manager");
        find(&objs, "Service", "cro-metrics");

        match name {
            "defaults"
            | "fti-cm-complete"
            | "dra-host-driver-own-tls"
            | "cert-manager-gpu-operator" => {
                assert_eq!(deploy["spec"]["replicas"], 2, "{name}");
                assert!(args.contains(&"--leader-elect=true"), "{name}: {args:?}");
                find(&objs, "PodDisruptionBudget", "cro-controller");
                find(&objs, "Service", "cro-webhook");
                find(&objs, "NetworkPolicy", "cro-allow-webhook");
                find(&objs, "NetworkPolicy", "cro-allow-metrics");
                let vwc = find(
                    &objs,
                    "ValidatingWebhookConfiguration",
                    "cro-validating-webhook",
                );
                let hook = &vwc["webhooks"][0];
                assert_eq!(hook["failurePolicy"], "Fail");
                assert_eq!(
                    hook["clientConfig"]["service"]["path"],
                    "/validate-cro-hpsys-ibm-ie-com-v1alpha1-composabilityrequest"
                );
                assert_eq!(env_value(manager, "CDI_PROVIDER_TYPE"), Some("FTI_CDI"));
            }
            _ => {}
        }
        match name {
            "defaults" => {
                // Metrics over HTTPS behind TokenReview + SubjectAccessReview, probes apart.
                assert!(args.contains(&"--metrics-secure=true"), "{args:?}");
                assert!(args.contains(&"--health-probe-bind-address=0.0.0.0:8081"));
                assert_eq!(manager["livenessProbe"]["httpGet"]["port"], "probes");
                let rules = find(&objs, "ClusterRole", "cro-manager")["rules"].to_string();
                assert!(rules.contains("tokenreviews") && rules.contains("subjectaccessreviews"));
                // The operator makes its own webhook certificate: nothing of cert-manager.
                assert!(args.contains(&"--webhook-self-managed"), "{args:?}");
                assert!(!objs.iter().any(|m| m.api_version.contains("cert-manager")));
                assert!(!kinds(&objs).contains("DaemonSet"));
                assert!(!kinds(&objs).contains("ServiceMonitor"));
                // Without nvidia.com/v1 served, no Role in the GPU operator's namespace.
                assert_eq!(elsewhere(&objs), Vec::<String>::new());
            }
            "cert-manager-gpu-operator" => {
                // cert-manager issues the webhook's certificate and injects its CA.
                find(&objs, "Certificate", "cro-webhook");
                find(&objs, "Issuer", "cro-selfsigned");
                let vwc = find(
                    &objs,
                    "ValidatingWebhookConfiguration",
                    "cro-validating-webhook",
                );
                assert_eq!(
                    vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
                    format!("{NS}/cro-webhook")
                );
                assert!(!args.contains(&"--webhook-self-managed"), "{args:?}");
                // DEVICE_PLUGIN on a cluster serving the ClusterPolicy API: a Role there.
                let role = objs
                    .iter()
                    .find(|m| m.kind == "Role" && m.name == "cro-gpu-operator")
                    .unwrap();
                assert_eq!(role.namespace.as_deref(), Some("gpu-operator"));
            }
            "host-network" => {
                assert_eq!(pod["hostNetwork"], true);
                assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
                assert_eq!(env_value(manager, "RUST_LOG"), Some("debug"));
            }
            "fti-cm-complete" => {
                let monitor = find(&objs, "ServiceMonitor", "cro-metrics");
                assert_eq!(monitor["spec"]["endpoints"][0]["scheme"], "https");
                assert!(monitor["spec"]["endpoints"][0]["bearerTokenFile"].is_string());
                let secret = find(&objs, "Secret", "credentials");
                let keys: BTreeSet<&str> = secret["stringData"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .map(String::as_str)
                    .collect();
                assert_eq!(
                    keys,
                    BTreeSet::from([
                        "username",
                        "password",
                        "client_id",
                        "client_secret",
                        "realm"
                    ])
                );
                assert_eq!(env_value(manager, "FTI_CDI_CLUSTER_ID"), Some("cluster-1"));
                assert_eq!(
                    env_value(manager, "CRO_FTI_CA_FILE"),
                    Some("/etc/cro/fabric-ca/ca.crt")
                );
                let rules = find(&objs, "ClusterRole", "cro-manager")["rules"].to_string();
                assert!(rules.contains("baremetalhosts") && rules.contains("machines"));
                // gpuOperator.rbac: true renders the Role without asking the cluster.
                assert_eq!(
                    elsewhere(&objs),
                    [
                        "Role gpu-operator/cro-gpu-operator",
                        "RoleBinding gpu-operator/cro-gpu-operator"
                    ]
                );
                // The operator manages the webhook's certificates itself.
                assert!(args.contains(&"--webhook-self-managed"), "{args:?}");
                assert!(rules.contains("validatingwebhookconfigurations"));
                assert!(!kinds(&objs).contains("Certificate"));
                assert!(!manager["volumeMounts"].to_string().contains("webhook-tls"));
            }
            "dra-host-driver-own-tls" => {
                let agent = find(&objs, "DaemonSet", "cro-node-agent");
                let tpl = &agent["spec"]["template"];
                assert_eq!(
                    tpl["metadata"]["labels"]["app.kubernetes.io/name"],
                    "cro-node-agent"
                );
                assert_eq!(
                    tpl["spec"]["containers"][0]["securityContext"]["privileged"],
                    true
                );
                assert_eq!(
                    tpl["spec"]["containers"][0]["volumeMounts"][0]["mountPath"],
                    "/host-root"
                );
                let rules = find(&objs, "ClusterRole", "cro-manager")["rules"].to_string();
                assert!(rules.contains("resourceslices") && rules.contains("devicetaintrules"));
                assert!(!objs.iter().any(|m| m.name == "cro-gpu-operator"));
                assert!(!kinds(&objs).contains("Certificate"));
                let vwc = find(
                    &objs,
                    "ValidatingWebhookConfiguration",
                    "cro-validating-webhook",
                );
                assert!(vwc["webhooks"][0]["clientConfig"]["caBundle"].is_string());
            }
            "provider-spec-minimal" => {
                assert_eq!(deploy["spec"]["replicas"], 1);
                assert!(args.contains(&"--leader-elect=false"));
                assert!(args.contains(&"--provider-spec=/etc/cro/provider/provider.yaml"));
                find(&objs, "ConfigMap", "cro-provider");
                for absent in [
                    "ValidatingWebhookConfiguration",
                    "NetworkPolicy",
                    "PodDisruptionBudget",
                ] {
                    assert!(!kinds(&objs).contains(absent), "{absent}");
                }
                assert_eq!(env_value(manager, "CDI_PROVIDER_TYPE"), None);
                assert!(args.contains(&"--metrics-secure=false"));
                let rules = find(&objs, "ClusterRole", "cro-manager")["rules"].to_string();
                assert!(!rules.contains("tokenreviews"));
            }
            "provider-objects" => {
                assert!(args.contains(&"--provider-objects=true"));
                assert!(args.contains(
                    &"--provider-secret-namespaces=composable-resource-operator-system,fabric-secrets"
                ));
                assert!(!args.iter().any(|a| a.starts_with("--provider-spec")));
                assert_eq!(env_value(manager, "CDI_PROVIDER_TYPE"), None);
                let vwc = find(
                    &objs,
                    "ValidatingWebhookConfiguration",
                    "cro-validating-webhook",
                );
                assert_eq!(
                    vwc["webhooks"][1]["clientConfig"]["service"]["path"],
                    "/validate-cro-hpsys-ibm-ie-com-v1alpha1-cdiprovider"
                );
                let role = find(&objs, "Role", "cro-manager")["rules"].to_string();
                assert!(role.contains("configmaps"));
            }
            "nec" => {
                assert_eq!(env_value(manager, "CDI_PROVIDER_TYPE"), Some("NEC"));
                assert_eq!(
                    env_value(manager, "NEC_PROVISIONAL_GPU_UUID"),
                    Some("GPU-00000000-0000-0000-0000-000000000001")
                );
                // The NEC services take no credentials: no Secret rule, no Secret.
                let role = find(&objs, "Role", "cro-manager")["rules"].to_string();
                assert!(!role.contains("\"credentials\""), "{role}");
            }
            "pool-with-kubelet-plugin" => {
                assert_eq!(
                    env_value(manager, "CRO_POOL_DEVICES"),
                    Some("gpu=A100 40G;cxlmemory=CXL 128G")
                );
                find(&objs, "DeviceClass", "gpu.cro.hpsys.ibm.ie.com");
                find(&objs, "DeviceClass", "cxlmemory.cro.hpsys.ibm.ie.com");
                let plugin =
                    &find(&objs, "DaemonSet", "cro-kubelet-plugin")["spec"]["template"]["spec"];
                assert_eq!(plugin["hostNetwork"], true, "as the operator's pods");
                assert_eq!(plugin["tolerations"][0]["operator"], "Exists");
                assert_eq!(
                    env_value(&plugin["containers"][0], "CRO_CDI_DIR"),
                    Some("/etc/cdi")
                );
            }
            other => panic!("unchecked value set {other}"),
        }
    }
}

#[test]
fn chart_refuses_values_that_cannot_work() {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    for (set, namespace, why) in [
        (
            "nodeAgent.enabled=true",
            "elsewhere",
            "composable-resource-operator-system",
        ),
        ("provider.mode=sunfish", NS, "provider.mode"),
        ("deviceResourceType=GPU", NS, "deviceResourceType"),
        (
            "webhook.certificates=secret",
            NS,
            "required with webhook.certificates=secret",
        ),
        ("provider.mode=spec", NS, "provider.spec"),
        (
            "webhook.certificates=certManager",
            NS,
            "pass --api-versions cert-manager.io/v1",
        ),
        ("gpuOperator.rbac=maybe", NS, "gpuOperator.rbac must be"),
        (
            "webhook.url=http://127.0.0.1:9443",
            NS,
            "must start with https://",
        ),
    ] {
        let err = helm(&[
            "template",
            "cro",
            chart,
            "--namespace",
            namespace,
            "--set",
            set,
        ])
        .expect_err(set)
        .to_string();
        assert!(err.contains(why), "{set}: {err}");
    }
}

/// cert-manager is opt-in: without its API the chart refuses at template time, saying
/// what to do; with it the Issuer and Certificate are rendered.
#[test]
fn cert_manager_mode_needs_the_cert_manager_api() {
    let dir = tempfile::tempdir().unwrap();
    let values = values_file(dir.path(), "cm", "webhook: {certificates: certManager}\n");
    let err = try_render(NS, &values, &[]).unwrap_err().to_string();
    for said in [
        "webhook.certificates=certManager needs cert-manager",
        "cert-manager.io/v1",
        "webhook.certificates=selfManaged",
        "--api-versions cert-manager.io/v1",
    ] {
        assert!(err.contains(said), "{said}: {err}");
    }
    let objs = render(NS, &values, &["cert-manager.io/v1"]);
    find(&objs, "Certificate", "cro-webhook");
    find(&objs, "Issuer", "cro-selfsigned");
    // The default needs nothing of it.
    let objs = render_yaml("", &[]);
    assert!(!objs.iter().any(|m| m.api_version.contains("cert-manager")));
    assert!(args_of(manager(&objs)).contains(&"--webhook-self-managed"));
}

/// gpuOperator.rbac: auto follows the ClusterPolicy API (nvidia.com/v1), true and false
/// decide alone, and DRA never needs the Role.
#[test]
fn gpu_operator_role_only_where_the_gpu_operator_is() {
    let role = |yaml: &str, api: &[&str]| {
        render_yaml(yaml, api)
            .iter()
            .any(|m| m.kind == "Role" && m.namespace.as_deref() == Some("gpu-operator"))
    };
    assert!(!role("", &[]), "auto, no ClusterPolicy API");
    assert!(
        role("", &["nvidia.com/v1"]),
        "auto, ClusterPolicy API served"
    );
    assert!(role("gpuOperator: {rbac: true}", &[]));
    assert!(!role("gpuOperator: {rbac: false}", &["nvidia.com/v1"]));
    assert!(!role(
        "deviceResourceType: DRA\ngpuOperator: {rbac: true}",
        &["nvidia.com/v1"]
    ));
    // Elsewhere than the default namespace when asked.
    let objs = render_yaml(
        "gpuOperatorNamespace: nvidia\ngpuOperator: {rbac: true}",
        &[],
    );
    assert_eq!(
        elsewhere(&objs),
        [
            "Role nvidia/cro-gpu-operator",
            "RoleBinding nvidia/cro-gpu-operator"
        ]
    );
}

/// The fabric's pool: DeviceClasses, the binder's right to write its drivers' device
/// status, and the kubelet plugin DaemonSet, all only when `pool.devices` is set.
#[test]
fn pool_objects_and_the_kubelet_plugin_only_with_a_pool() {
    let defaults = render_yaml("", &[]);
    assert!(
        !defaults
            .iter()
            .any(|m| m.name.contains("kubelet-plugin") || m.kind == "DeviceClass"),
        "nothing of the pool without pool.devices"
    );
    let yaml = "pool: {devices: [{type: gpu, model: A100}]}
kubeletPlugin: {kubeletDir: /data/kubelet}
";
    let objs = render_yaml(yaml, &[]);
    assert!(kinds(&objs).contains("DeviceClass"));
    let ds = find(&objs, "DaemonSet", "cro-kubelet-plugin");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "cro-kubelet-plugin");
    let c = &pod["containers"][0];
    assert_eq!(args_of(c), ["kubelet-plugin"]);
    assert_eq!(env_value(c, "CRO_KUBELET_DIR"), Some("/data/kubelet"));
    assert_eq!(env_value(c, "CRO_CDI_DIR"), Some("/var/run/cdi"));
    let node_name = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "NODE_NAME")
        .unwrap();
    assert_eq!(
        node_name["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    let mounts: Vec<&str> = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    assert_eq!(
        mounts,
        [
            "/data/kubelet/plugins_registry",
            "/data/kubelet/plugins/cro.hpsys.ibm.ie.com",
            "/var/run/cdi"
        ]
    );
    // The plugin reads claims and nothing else.
    let role = find(&objs, "ClusterRole", "cro-kubelet-plugin");
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]}])
    );
    // The operator may write device status for its own driver only.
    let driver_rule = objs
        .iter()
        .filter(|m| m.kind == "ClusterRole")
        .flat_map(|m| m.object["rules"].as_array().cloned().unwrap_or_default())
        .find(|r| r["resources"] == serde_json::json!(["resourceclaims/driver"]))
        .expect("a rule on resourceclaims/driver");
    assert_eq!(
        driver_rule["resourceNames"],
        serde_json::json!(["cro.hpsys.ibm.ie.com"])
    );
    assert!(
        driver_rule["verbs"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("arbitrary-node:patch"))
    );
    let off = render_yaml(
        "pool: {devices: [{type: gpu, model: A100}]}\nkubeletPlugin: {enabled: false}\n",
        &[],
    );
    assert!(
        !off.iter()
            .any(|m| m.kind == "DaemonSet" && m.name == "cro-kubelet-plugin")
    );
    assert!(kinds(&off).contains("DeviceClass"));
}

/// Pods on the node's network: hostNetwork, its DNS policy, the listeners' addresses and
/// an update strategy that does not wait for host ports the old pod holds.
#[test]
fn host_network_values_reach_the_pod() {
    let deployment = |yaml: &str| {
        let objs = render_yaml(yaml, &[]);
        find(&objs, "Deployment", "cro-controller").clone()
    };
    let d = deployment("");
    let pod = &d["spec"]["template"]["spec"];
    assert!(pod.get("hostNetwork").is_none() && pod.get("dnsPolicy").is_none());
    assert!(d["spec"].get("strategy").is_none(), "Kubernetes' default");
    let args = args_of(&pod["containers"][0]);
    for a in [
        "--metrics-addr=0.0.0.0:8443",
        "--health-probe-bind-address=0.0.0.0:8081",
        "--webhook-addr=0.0.0.0:9443",
    ] {
        assert!(args.contains(&a), "{a}: {args:?}");
    }

    let d = deployment(
        r#"
hostNetwork: true
metrics: {bindAddress: 127.0.0.1}
probes: {bindAddress: "::1"}
webhook: {bindAddress: 127.0.0.1}
"#,
    );
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    assert_eq!(d["spec"]["strategy"]["type"], "RollingUpdate");
    assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], 0);
    assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"], 1);
    let args = args_of(&pod["containers"][0]);
    for a in [
        "--metrics-addr=127.0.0.1:8443",
        "--health-probe-bind-address=[::1]:8081",
        "--webhook-addr=127.0.0.1:9443",
    ] {
        assert!(args.contains(&a), "{a}: {args:?}");
    }

    // Both may be given explicitly.
    let d = deployment("hostNetwork: true\ndnsPolicy: Default\nstrategy: {type: Recreate}");
    assert_eq!(d["spec"]["template"]["spec"]["dnsPolicy"], "Default");
    assert_eq!(
        d["spec"]["strategy"],
        serde_json::json!({"type": "Recreate"})
    );

    // extraEnv comes after the chart's own variables.
    let objs = render_yaml("extraEnv: [{name: RUST_LOG, value: debug}]", &[]);
    let env = manager(&objs)["env"].as_array().unwrap();
    assert_eq!(env.last().unwrap()["name"], "RUST_LOG");
}

/// `helm uninstall` runs `cro before-uninstall` first, where the operator runs and with
/// the rights it needs: listing requests always, deleting them only with `detach`.
#[test]
fn uninstall_hook_refuses_or_detaches_where_the_operator_runs() {
    let hook = |yaml: &str| {
        let objs = render_yaml(yaml, &[]);
        let job = find(&objs, "Job", "cro-before-uninstall").clone();
        let role = find(&objs, "ClusterRole", "cro-before-uninstall").clone();
        (job, role)
    };
    let verbs = |role: &Value| -> Vec<String> {
        role["rules"][0]["verbs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    };
    let (job, role) = hook("");
    assert_eq!(job["metadata"]["annotations"]["helm.sh/hook"], "pre-delete");
    assert_eq!(
        job["metadata"]["annotations"]["helm.sh/hook-output-log-policy"], "hook-failed",
        "helm must print the refusal"
    );
    assert_eq!(job["spec"]["backoffLimit"], 0);
    let pod = &job["spec"]["template"]["spec"];
    let args = args_of(&pod["containers"][0]);
    assert_eq!(
        args,
        [
            "before-uninstall",
            "--namespace=composable-resource-operator-system",
            "--deployment=cro-controller",
            "--lease=c5744f42.hpsys.ibm.ie.com",
            "--timeout=240s",
        ]
    );
    assert_eq!(verbs(&role), ["get", "list"], "refuse never deletes");
    // The hook's pod is not one of the operator's: scaling to zero must not wait on it.
    assert!(
        job["spec"]["template"]["metadata"]["labels"]
            .get("control-plane")
            .is_none()
    );

    let (job, role) = hook(
        r#"
uninstall: {liveRequests: detach, timeoutSeconds: 100}
hostNetwork: true
extraEnv: [{name: KUBERNETES_SERVICE_HOST, value: 127.0.0.1}]
nodeSelector: {pool: ops}
"#,
    );
    let pod = &job["spec"]["template"]["spec"];
    let args = args_of(&pod["containers"][0]);
    assert!(
        args.contains(&"--detach") && args.contains(&"--timeout=100s"),
        "{args:?}"
    );
    assert_eq!(job["spec"]["activeDeadlineSeconds"], 160);
    assert_eq!(verbs(&role), ["get", "list", "delete"]);
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["nodeSelector"]["pool"], "ops");
    assert_eq!(
        env_value(&pod["containers"][0], "KUBERNETES_SERVICE_HOST"),
        Some("127.0.0.1")
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = values_file(dir.path(), "bad", "uninstall: {liveRequests: later}");
    let err = try_render(NS, &bad, &[]).unwrap_err().to_string();
    assert!(
        err.contains("uninstall.liveRequests must be refuse or detach"),
        "{err}"
    );
}

/// provider.mode=nec: the Go operator's NEC variables, which `cro run` turns into the
/// shipped NEC component (the image has it at its default path); no credentials Secret.
#[test]
fn nec_mode_sets_the_go_operators_nec_variables() {
    let objs = render_yaml(
        "provider: {mode: nec, nec: {cdimIp: 10.1.2.3, layoutApplyPort: 8080, configurationManagerPort: 8081}}",
        &[],
    );
    let m = manager(&objs);
    for (k, v) in [
        ("CDI_PROVIDER_TYPE", "NEC"),
        ("NEC_CDIM_IP", "10.1.2.3"),
        ("LAYOUT_APPLY_PORT", "8080"),
        ("CONFIGURATION_MANAGER_PORT", "8081"),
    ] {
        assert_eq!(env_value(m, k), Some(v), "{k}");
    }
    for absent in [
        "NEC_PROVISIONAL_GPU_UUID",
        "FTI_CDI_ENDPOINT",
        "CRO_CREDENTIALS_NAMESPACE",
    ] {
        assert_eq!(env_value(m, absent), None, "{absent}");
    }
    assert!(
        !objs.iter().any(|o| o.kind == "Secret"),
        "CDIM takes no credentials"
    );
    let objs = render_yaml(
        "provider: {mode: nec, nec: {provisionalGpuUuid: GPU-1}}",
        &[],
    );
    assert_eq!(
        env_value(manager(&objs), "NEC_PROVISIONAL_GPU_UUID"),
        Some("GPU-1")
    );
}

/// webhook.url: the API server calls the URL (plus each webhook's path), not the Service.
#[test]
fn webhook_url_replaces_the_service() {
    let objs = render_yaml(
        "provider: {mode: objects}\nwebhook: {url: \"https://127.0.0.1:9443/\"}",
        &[],
    );
    let vwc = find(
        &objs,
        "ValidatingWebhookConfiguration",
        "cro-validating-webhook",
    );
    let hooks = vwc["webhooks"].as_array().unwrap();
    assert_eq!(hooks.len(), 2);
    for (hook, kind) in hooks.iter().zip(["composabilityrequest", "cdiprovider"]) {
        let client = &hook["clientConfig"];
        assert_eq!(
            client["url"],
            format!("https://127.0.0.1:9443/validate-cro-hpsys-ibm-ie-com-v1alpha1-{kind}")
        );
        assert!(client.get("service").is_none(), "{client}");
    }
    // Without it, the Service.
    let objs = render_yaml("", &[]);
    let vwc = find(
        &objs,
        "ValidatingWebhookConfiguration",
        "cro-validating-webhook",
    );
    assert_eq!(
        vwc["webhooks"][0]["clientConfig"]["service"]["name"],
        "cro-webhook"
    );
    assert!(vwc["webhooks"][0]["clientConfig"].get("url").is_none());
}

/// webhook.extraNames (issue 23): the URL's host joins the self-managed certificate's
/// names through --webhook-extra-names; without it no flag; with certificates the
/// operator does not make, the chart refuses instead of ignoring the names.
#[test]
fn webhook_extra_names_reach_the_self_managed_certificate() {
    let objs = render_yaml(
        "webhook: {url: \"https://127.0.0.1:9443\", extraNames: [127.0.0.1, node-1.example]}",
        &[],
    );
    let args = args_of(manager(&objs));
    assert!(args.contains(&"--webhook-self-managed"), "{args:?}");
    assert!(
        args.contains(&"--webhook-extra-names=127.0.0.1,node-1.example"),
        "{args:?}"
    );
    let objs = render_yaml("", &[]);
    let args = args_of(manager(&objs));
    assert!(
        !args.iter().any(|a| a.starts_with("--webhook-extra-names")),
        "{args:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let values = values_file(
        dir.path(),
        "secret",
        "webhook: {certificates: secret, secretName: tls, caBundle: x, extraNames: [127.0.0.1]}\n",
    );
    let err = try_render(NS, &values, &[]).unwrap_err().to_string();
    assert!(
        err.contains("webhook.extraNames") && err.contains("selfManaged"),
        "{err}"
    );
}

/// The component cache lives in an emptyDir (the root file system is read-only), where
/// CRO_COMPONENT_CACHE_DIR points; turned off, the operator is told so.
#[test]
fn component_cache_is_an_empty_dir() {
    let objs = render_yaml("", &[]);
    let c = manager(&objs);
    let pod = &find(&objs, "Deployment", "cro-controller")["spec"]["template"]["spec"];
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "component-cache")
        .expect("cache mount");
    let dir = env_value(c, "CRO_COMPONENT_CACHE_DIR").unwrap();
    assert!(
        dir.starts_with(&format!("{}/", mount["mountPath"].as_str().unwrap())),
        "{dir} is not under {mount}"
    );
    assert_eq!(mount.get("readOnly"), None);
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "component-cache")
        .unwrap();
    assert_eq!(volume["emptyDir"]["sizeLimit"], "512Mi");
    assert_eq!(
        env_value(c, "CRO_COMPONENT_CACHE_MAX_BYTES"),
        Some("268435456")
    );

    let objs = render_yaml("componentCache: {enabled: false}", &[]);
    let c = manager(&objs);
    assert_eq!(env_value(c, "CRO_COMPONENT_CACHE"), Some("off"));
    assert_eq!(env_value(c, "CRO_COMPONENT_CACHE_DIR"), None);
    assert!(
        !objs
            .iter()
            .any(|m| m.object.to_string().contains("component-cache"))
    );
}

/// Ready at the first probe after /readyz answers: no initial delay, a 1 s period.
#[test]
fn readiness_probe_answers_within_two_seconds() {
    let objs = render_yaml("", &[]);
    let probe = &manager(&objs)["readinessProbe"];
    assert_eq!(probe.get("initialDelaySeconds"), None, "{probe}");
    let period = probe["periodSeconds"].as_u64().unwrap();
    assert!((1..=2).contains(&period), "{probe}");
}

#[test]
fn chart_crds_are_the_generated_ones() {
    let repo = Path::new(DEPLOY_DIR).join("../crds");
    let mut names: Vec<_> = std::fs::read_dir(&repo)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names.len(), 3);
    for name in names {
        let ours = std::fs::read_to_string(repo.join(&name)).unwrap();
        let chart = std::fs::read_to_string(chart().join("crds").join(&name))
            .unwrap_or_else(|e| panic!("deploy/helm/cro/crds/{name:?}: {e}"));
        assert_eq!(
            chart, ours,
            "deploy/helm/cro/crds/{name:?} differs from crds/: copy it over"
        );
    }
}

async fn harness() -> Harness {
    HarnessBuilder::default()
        .without_default_crds()
        .crd(stand_in_crd(
            "cert-manager.io",
            "v1",
            "Certificate",
            "certificates",
            true,
        ))
        .crd(stand_in_crd(
            "cert-manager.io",
            "v1",
            "Issuer",
            "issuers",
            true,
        ))
        .crd(stand_in_crd(
            "monitoring.coreos.com",
            "v1",
            "ServiceMonitor",
            "servicemonitors",
            true,
        ))
        .start()
        .await
        .unwrap()
}

async fn create_namespace(client: &kube::Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("namespace {name}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rendered_object_is_accepted_by_the_api_server() {
    let harness = harness().await;
    let client = harness.client().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The chart's CRDs are installed by helm from crds/, before the templates.
    let chart = chart();
    let with_crds = helm(&[
        "template",
        "cro",
        chart.to_str().unwrap(),
        "--namespace",
        NS,
        "--include-crds",
    ])
    .unwrap();
    let crds: Vec<_> = manifests::parse(&with_crds)
        .unwrap()
        .into_iter()
        .filter(|m| m.kind == "CustomResourceDefinition")
        .collect();
    assert_eq!(crds.len(), 3); // ComposabilityRequest, ComposableResource, CdiProvider
    manifests::apply(&client, &crds, false).await.unwrap();
    create_namespace(&client, "gpu-operator").await;
    for (name, namespace, yaml, api_versions) in value_sets() {
        create_namespace(&client, namespace).await;
        let objs = render(
            namespace,
            &values_file(dir.path(), name, &yaml),
            api_versions,
        );
        let applied = manifests::apply(&client, &objs, true)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(applied.len(), objs.len(), "{name}");
    }
}

/// The defaults on a cluster with nothing but Kubernetes (no cert-manager, no GPU
/// operator and no `gpu-operator` namespace, no Prometheus Operator): the chart's CRDs
/// and every object are accepted (issue 23).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_chart_installs_on_a_fresh_cluster() {
    let harness = HarnessBuilder::default()
        .without_default_crds()
        .start()
        .await
        .unwrap();
    let client = harness.client().unwrap();
    let chart = chart();
    let out = helm(&[
        "template",
        "cro",
        chart.to_str().unwrap(),
        "--namespace",
        NS,
        "--include-crds",
    ])
    .unwrap();
    let objs = manifests::parse(&out).unwrap();
    assert_eq!(elsewhere(&objs), Vec::<String>::new());
    create_namespace(&client, NS).await;
    let applied = manifests::apply(&client, &objs, true)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(applied.len(), objs.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kustomize_tree_is_the_charts_rendering_and_is_accepted() {
    let kustomize_dir = Path::new(DEPLOY_DIR).join("kustomize");
    let fresh = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("bash")
        .arg(kustomize_dir.join("generate.sh"))
        .arg(fresh.path())
        .status()
        .unwrap();
    assert!(status.success());
    for file in [
        "operator/cro.yaml",
        "prerequisites/crds.yaml",
        "gpu-operator/rbac.yaml",
    ] {
        let committed = std::fs::read_to_string(kustomize_dir.join(file)).unwrap();
        assert!(
            std::fs::read_to_string(fresh.path().join(file)).unwrap() == committed,
            "deploy/kustomize/{file} is not the chart's rendering: run deploy/kustomize/generate.sh"
        );
    }

    let kustomize = tools::locate(Tool::Kustomize).unwrap();
    let build = |dir: &Path| {
        let built = tools::run(&kustomize, &["build", dir.to_str().unwrap()], dir)
            .unwrap_or_else(|e| panic!("{e}"));
        manifests::parse(&built).unwrap()
    };
    let prerequisites = build(&kustomize_dir.join("prerequisites"));
    let operator = build(&kustomize_dir);
    let ids = |m: &[Manifest]| -> BTreeSet<String> { m.iter().map(Manifest::describe).collect() };
    // kustomize must hand the chart's objects over unchanged in identity (no object moved
    // to another namespace or renamed).
    let committed = std::fs::read_to_string(kustomize_dir.join("operator/cro.yaml")).unwrap();
    assert_eq!(ids(&operator), ids(&manifests::parse(&committed).unwrap()));
    // What `kubectl delete -k deploy/kustomize` deletes holds nothing of users' work: no
    // CRD (its deletion deletes every request), no Namespace (it holds the
    // administrator's credentials Secret), no Secret, and no helm hook.
    for obj in &operator {
        let kind = obj.kind.as_str();
        assert!(
            !matches!(
                kind,
                "CustomResourceDefinition" | "Namespace" | "Secret" | "Job"
            ),
            "the operator's tree deletes {} with it",
            obj.describe()
        );
    }
    let mut expected: BTreeSet<String> = chart_crd_names()
        .into_iter()
        .map(|n| format!("CustomResourceDefinition {n}"))
        .collect();
    expected.insert(format!("Namespace {NS}"));
    assert_eq!(ids(&prerequisites), expected);

    // The GPU operator's Role, for overlays of clusters that have it: only objects in its
    // namespace, bound to the operator's ServiceAccount.
    let gpu_operator = manifests::parse(
        &std::fs::read_to_string(kustomize_dir.join("gpu-operator/rbac.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        ids(&gpu_operator),
        BTreeSet::from([
            "Role gpu-operator/cro-gpu-operator".to_owned(),
            "RoleBinding gpu-operator/cro-gpu-operator".to_owned(),
        ])
    );

    // Like the chart's defaults, the tree needs nothing but Kubernetes: no cert-manager,
    // no Prometheus Operator, no GPU operator's namespace.
    let harness = HarnessBuilder::default()
        .without_default_crds()
        .start()
        .await
        .unwrap();
    let client = harness.client().unwrap();
    for objs in [&prerequisites, &operator] {
        let applied = manifests::apply(&client, objs, true)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(applied.len(), objs.len());
    }
}

/// deploy/kustomize/one-node is the chart's one-node values (docs/deploying.md) as an
/// overlay: the same pod settings, listener arguments and webhook URL.
#[test]
fn one_node_overlay_is_the_charts_one_node_rendering() {
    let dir = Path::new(DEPLOY_DIR).join("kustomize/one-node");
    let kustomize = tools::locate(Tool::Kustomize).unwrap();
    let built = tools::run(&kustomize, &["build", dir.to_str().unwrap()], &dir)
        .unwrap_or_else(|e| panic!("{e}"));
    let overlay = manifests::parse(&built).unwrap();
    let chart = render_yaml(
        r#"
replicaCount: 1
hostNetwork: true
metrics: {bindAddress: 127.0.0.1}
probes: {bindAddress: 127.0.0.1}
webhook: {bindAddress: 127.0.0.1, url: "https://127.0.0.1:9443", extraNames: [127.0.0.1]}
gpuOperator: {rbac: false}
"#,
        &[],
    );
    let deployment = |objs: &[Manifest]| find(objs, "Deployment", "cro-controller").clone();
    let (o, c) = (deployment(&overlay), deployment(&chart));
    assert_eq!(o["spec"]["replicas"], c["spec"]["replicas"]);
    assert_eq!(o["spec"]["strategy"], c["spec"]["strategy"]);
    let (op, cp) = (
        &o["spec"]["template"]["spec"],
        &c["spec"]["template"]["spec"],
    );
    assert_eq!(op["hostNetwork"], cp["hostNetwork"]);
    assert_eq!(op["dnsPolicy"], cp["dnsPolicy"]);
    assert_eq!(
        args_of(&op["containers"][0]),
        args_of(&cp["containers"][0]),
        "the overlay's arguments drifted from the chart's"
    );
    assert_eq!(
        env_value(&op["containers"][0], "KUBERNETES_SERVICE_HOST"),
        Some("127.0.0.1")
    );
    let webhook = |objs: &[Manifest]| {
        find(
            objs,
            "ValidatingWebhookConfiguration",
            "cro-validating-webhook",
        )["webhooks"][0]["clientConfig"]
            .clone()
    };
    assert_eq!(webhook(&overlay)["url"], webhook(&chart)["url"]);
    assert!(webhook(&overlay).get("service").is_none());
}

/// The CRDs' names, from the chart's crds/ folder.
fn chart_crd_names() -> Vec<String> {
    let dir = chart().join("crds");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for m in manifests::parse(&text).unwrap() {
            names.push(m.name);
        }
    }
    names
}

//! The validating webhook (docs/behaviour.md §6) registered with the real API server, and the probe
//! endpoints.

mod common;

use std::time::Duration;

use common::{CONVERGE, Env, MODEL, eventually, gpu};
use cro_api::{
    AllocationPolicy, ComposabilityRequest, ComposabilityRequestSpec, ScalarResourceDetails,
};
use cro_operator::VALIDATE_PATH;
use cro_operator::config::{WebhookCerts, WebhookConfig};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};

struct Tls {
    ca_pem: String,
    cert_file: tempfile::NamedTempFile,
    key_file: tempfile::NamedTempFile,
}

fn webhook_tls() -> Tls {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "webhook test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let cert_file = tempfile::NamedTempFile::new().unwrap();
    let key_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(cert_file.path(), cert.pem()).unwrap();
    std::fs::write(key_file.path(), key.serialize_pem()).unwrap();
    Tls {
        ca_pem: ca_cert.pem(),
        cert_file,
        key_file,
    }
}

fn request(name: &str, details: ScalarResourceDetails) -> ComposabilityRequest {
    ComposabilityRequest::new(name, ComposabilityRequestSpec { resource: details })
}

async fn create(env: &Env, name: &str, details: ScalarResourceDetails) -> Result<(), String> {
    env.requests()
        .create(&PostParams::default(), &request(name, details))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())?;
    // The webhook judges against its watch-fed cache, as a controller-runtime webhook
    // does. Once the controllers (another watch) have written a status, that watch has
    // delivered the creation too, so the next review sees this request. A request they
    // deleted instead (its target node does not exist: one admitted before the API
    // server used a webhook configuration just made) was seen as well, and is no more.
    eventually(
        &format!("{name} seen by the operator"),
        CONVERGE,
        || async {
            match env.requests().get_opt(name).await {
                Ok(Some(r)) => r.status.map(|_| ()),
                Ok(None) => Some(()),
                Err(_) => None,
            }
        },
    )
    .await;
    Ok(())
}

fn differentnode(model: &str) -> ScalarResourceDetails {
    let mut d = gpu(1);
    d.model = model.into();
    d.allocation_policy = AllocationPolicy::DifferentNode;
    d
}

fn on_node(model: &str, node: &str) -> ScalarResourceDetails {
    let mut d = gpu(1);
    d.model = model.into();
    d.target_node = Some(node.into());
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_refuses_the_spec_cases_and_admits_the_rest() {
    let mut env = Env::start().await;
    env.add_node("worker-1", "16").await;
    env.add_node("worker-2", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 1);
    let tls = webhook_tls();
    env.config.webhook = Some(WebhookConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        certs: WebhookCerts::Files {
            cert_file: tls.cert_file.path().into(),
            key_file: tls.key_file.path().into(),
        },
    });
    env.config.metrics_addr = Some("127.0.0.1:0".parse().unwrap());
    let (probes, webhook) = env.start_operator().await;
    let (probes, webhook) = (probes.unwrap(), webhook.unwrap());

    // A samenode request without target placed on worker-1 before the webhook exists.
    env.create_request("placed", gpu(1)).await;
    env.wait_running("placed", 1).await;

    let config = ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some("cro-validating-webhook".into()),
            ..Default::default()
        },
        webhooks: Some(vec![ValidatingWebhook {
            name: "vcomposabilityrequest.kb.io".into(),
            admission_review_versions: vec!["v1".into()],
            side_effects: "None".into(),
            failure_policy: Some("Fail".into()),
            timeout_seconds: Some(10),
            client_config: WebhookClientConfig {
                url: Some(format!(
                    "https://127.0.0.1:{}{VALIDATE_PATH}",
                    webhook.port()
                )),
                ca_bundle: Some(ByteString(tls.ca_pem.clone().into_bytes())),
                service: None,
            },
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![cro_api::GROUP.into()]),
                api_versions: Some(vec![cro_api::VERSION.into()]),
                operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
                resources: Some(vec!["composabilityrequests".into()]),
                scope: Some("Cluster".into()),
            }]),
            ..Default::default()
        }]),
    };
    Api::<ValidatingWebhookConfiguration>::all(env.client.clone())
        .create(&PostParams::default(), &config)
        .await
        .unwrap();

    // The API server picks the configuration up asynchronously: the first refusal says
    // it is active.
    let mut bad = differentnode("H100");
    bad.target_node = Some("worker-1".into());
    let refusal = eventually("the webhook to refuse", CONVERGE, || async {
        create(&env, "different-with-target", bad.clone())
            .await
            .err()
    })
    .await;
    assert!(
        refusal.contains("differentnode cannot be used with target_node worker-1"),
        "{refusal}"
    );

    // differentnode: one per type and model.
    create(&env, "d-a100", differentnode("A100-D"))
        .await
        .unwrap();
    let e = create(&env, "d-a100-again", differentnode("A100-D"))
        .await
        .unwrap_err();
    assert!(e.contains("d-a100") && e.contains("differentnode"), "{e}");
    create(&env, "d-h100", differentnode("H100-D"))
        .await
        .unwrap();

    // samenode: one per type, model and node; the node of a request without target is
    // that of its first resource.
    create(&env, "s-n1", on_node("L4", "worker-1"))
        .await
        .unwrap();
    let e = create(&env, "s-n1-again", on_node("L4", "worker-1"))
        .await
        .unwrap_err();
    assert!(e.contains("s-n1") && e.contains("worker-1"), "{e}");
    create(&env, "s-n2", on_node("L4", "worker-2"))
        .await
        .unwrap();
    let e = create(&env, "same-as-placed", on_node(MODEL, "worker-1"))
        .await
        .unwrap_err();
    assert!(e.contains("placed") && e.contains("worker-1"), "{e}");
    create(&env, "placed-elsewhere", on_node(MODEL, "worker-2"))
        .await
        .unwrap();

    // Updates are judged too; metadata-only updates are not.
    let e = env
        .requests()
        .patch(
            "s-n2",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"resource": {"target_node": "worker-1"}}})),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("s-n1"), "{e}");
    env.requests()
        .patch(
            "s-n2",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"team": "ml"}}})),
        )
        .await
        .unwrap();

    // Probes and metrics.
    let http = reqwest::Client::new();
    let base = format!("http://{probes}");
    let get = |path: &str| {
        let http = http.clone();
        let url = format!("{base}{path}");
        async move {
            let r = http
                .get(url)
                .timeout(Duration::from_secs(10))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    assert_eq!(get("/healthz").await.0, 200);
    assert_eq!(get("/readyz").await.0, 200);
    let (code, metrics) = get("/metrics").await;
    assert_eq!(code, 200);
    for line in [
        "cro_admission_denials_total{reason=\"differentnode_with_target\"}",
        "cro_admission_denials_total{reason=\"duplicate_differentnode\"} 1",
        "cro_provider_calls_total{operation=\"add_resource\",outcome=\"ok\"}",
        "cro_reconciles_total{controller=\"composabilityrequest\",outcome=\"ok\"}",
        // The FTI component asked only for what it was granted.
        "cro_provider_capability_denials_total{capability=\"http\"} 0",
        "cro_provider_capability_denials_total{capability=\"secret\"} 0",
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    // The API server may call the webhook again when it retries a patch on a conflict.
    let samenode_denials: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("cro_admission_denials_total{reason=\"duplicate_samenode\"} "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap();
    assert!(samenode_denials >= 3, "{samenode_denials}");
    env.stop_operator().await.unwrap();
}

/// The webhook configuration the chart installs, pointed at a local URL.
fn chart_like_configuration(
    name: &str,
    port: u16,
    ca_pem: Option<&str>,
) -> ValidatingWebhookConfiguration {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "vcomposabilityrequest.kb.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 10,
            "clientConfig": {
                "url": format!("https://127.0.0.1:{port}{VALIDATE_PATH}"),
                "caBundle": ca_pem.map(|p| base64_encode(p.as_bytes())),
            },
            "matchConditions": [{"name": "spec-changes-only",
                "expression": "request.operation == 'CREATE' || object.spec != oldObject.spec"}],
            "rules": [{"apiGroups": [cro_api::GROUP], "apiVersions": [cro_api::VERSION],
                "operations": ["CREATE", "UPDATE"], "resources": ["composabilityrequests"],
                "scope": "Cluster"}],
        }],
    }))
    .unwrap()
}

fn base64_encode(bytes: &[u8]) -> String {
    // k8s_openapi's ByteString serialises as base64.
    serde_json::to_value(ByteString(bytes.to_vec()))
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned()
}

/// The self-managed webhook: the operator makes its CA and certificate, stores them in a
/// Secret, injects the CA into the configuration, and renews the serving certificate and
/// then the CA (two-step) while the API server keeps calling it; every call in between is
/// answered by the webhook. Then, with the webhook gone and `failurePolicy: Fail`, the
/// operator's own kinds of writes (finalizers, status) still pass; spec changes do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_managed_certificates_rotate_while_the_webhook_answers() {
    use cro_operator::config::{CertPolicy, SelfManagedCerts};
    use k8s_openapi::api::core::v1::Secret;

    let mut env = Env::start().await;
    let policy = CertPolicy {
        ca_validity: Duration::from_secs(24),
        serving_validity: Duration::from_secs(6),
        check_period: Duration::from_millis(500),
    };
    env.config.webhook = Some(WebhookConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        certs: WebhookCerts::SelfManaged(SelfManagedCerts {
            namespace: common::OPERATOR_NS.into(),
            secret_name: "cro-webhook-tls".into(),
            webhook_configuration: "cro-self-managed".into(),
            dns_names: vec!["127.0.0.1".into()],
            policy,
        }),
    });
    let (_, webhook) = env.start_operator().await;
    let port = webhook.unwrap().port();
    // Installed after the operator, without a CA: the operator injects it.
    Api::<ValidatingWebhookConfiguration>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &chart_like_configuration("cro-self-managed", port, None),
        )
        .await
        .unwrap();

    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), common::OPERATOR_NS);
    let note = |s: &Secret, k: &str| {
        s.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(&format!("cro.hpsys.ibm.ie.com/{k}")).cloned())
            .unwrap_or_default()
    };
    let mut bad = differentnode("ROTATE");
    bad.target_node = Some("worker-1".into());
    let refused_by_webhook = |e: &str| e.contains("differentnode cannot be used with target_node");
    eventually(
        "the webhook to answer with the injected CA",
        CONVERGE,
        || async {
            create(&env, "rotating", bad.clone())
                .await
                .err()
                .filter(|e| refused_by_webhook(e))
        },
    )
    .await;

    let first = secrets.get("cro-webhook-tls").await.unwrap();
    let (first_ca, mut serving_seen, mut cas_seen) = (
        note(&first, "ca-name"),
        std::collections::BTreeSet::new(),
        std::collections::BTreeSet::new(),
    );
    let deadline = std::time::Instant::now() + CONVERGE;
    let mut calls = 0;
    // Until two serving certificates after the first and a promoted CA were in use.
    while serving_seen.len() < 3 || cas_seen.len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "no rotation: serving {serving_seen:?}, CAs {cas_seen:?}"
        );
        let e = env
            .requests()
            .create(&PostParams::default(), &request("rotating", bad.clone()))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            refused_by_webhook(&e),
            "call {calls} not answered by the webhook: {e}"
        );
        calls += 1;
        let s = secrets.get("cro-webhook-tls").await.unwrap();
        serving_seen.insert(note(&s, "tls-issued"));
        cas_seen.insert(note(&s, "ca-name"));
    }
    assert!(cas_seen.contains(&first_ca));
    // The configuration trusts the current CA (and the one before while it is valid).
    let vwc = Api::<ValidatingWebhookConfiguration>::all(env.client.clone())
        .get("cro-self-managed")
        .await
        .unwrap();
    let bundle = String::from_utf8(
        vwc.webhooks.unwrap()[0]
            .client_config
            .ca_bundle
            .clone()
            .unwrap()
            .0,
    )
    .unwrap();
    let now = secrets.get("cro-webhook-tls").await.unwrap();
    let ca = String::from_utf8(now.data.unwrap()["ca.crt"].0.clone()).unwrap();
    assert!(bundle.contains(&ca));

    // The webhook goes away (all replicas down): failurePolicy Fail refuses spec changes,
    // but finalizer and status writes never reach it.
    env.create_request("kept", gpu(1)).await;
    env.stop_operator().await.unwrap();
    let requests = env.requests();
    requests
        .patch(
            "kept",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": ["test.example/hold"]}})),
        )
        .await
        .expect("a finalizer patch is not judged");
    requests
        .patch_status(
            "kept",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"state": "Updating"}})),
        )
        .await
        .expect("a status patch is not judged");
    let e = requests
        .patch(
            "kept",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"resource": {"size": 2}}})),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("failed calling webhook"), "{e}");
    requests
        .patch(
            "kept",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("removing finalizers is not judged");
}

/// Issue rows "a typo in target_node" (the operator used to delete the request; the
/// only trace was an Event) and "type changed on a live request" (accepted; the GPUs
/// started detaching): both are refused at admission now, and nothing is left on the
/// fabric. A target node that disappears later keeps the Go behaviour (the request is
/// deleted), and its devices are released on the fabric too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typos_in_target_node_and_kind_changes_are_refused_at_admission() {
    let mut env = Env::start().await;
    let m1 = env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 2);
    let tls = webhook_tls();
    env.config.webhook = Some(WebhookConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        certs: WebhookCerts::Files {
            cert_file: tls.cert_file.path().into(),
            key_file: tls.key_file.path().into(),
        },
    });
    let (_, webhook) = env.start_operator().await;
    Api::<ValidatingWebhookConfiguration>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &chart_like_configuration("cro-truth", webhook.unwrap().port(), Some(&tls.ca_pem)),
        )
        .await
        .unwrap();

    // A typo in target_node: refused, naming the node; nothing was created. The API
    // server takes a moment to apply a new webhook configuration: a typo created before
    // it does is taken back (the operator deletes it too, without a status) and asked
    // again, and a failed call to the webhook (its server not reached yet) is retried.
    let typo = on_node(MODEL, "wroker-1");
    let refusal = eventually("the webhook to refuse the typo", CONVERGE, || async {
        let created = env
            .requests()
            .create(&PostParams::default(), &request("typo", typo.clone()))
            .await;
        match created {
            Err(e) if e.to_string().contains("denied the request") => Some(e.to_string()),
            Err(_) => None,
            Ok(_) => {
                let _ = env
                    .requests()
                    .delete("typo", &kube::api::DeleteParams::default())
                    .await;
                None
            }
        }
    })
    .await;
    assert!(
        refusal.contains("target_node wroker-1 is not a Node"),
        "{refusal}"
    );
    eventually("no typo left", CONVERGE, || async {
        env.request("typo").await.is_none().then_some(())
    })
    .await;

    // A request on a real node runs; retargeting it to a typo is refused too.
    create(&env, "live", on_node(MODEL, "worker-1"))
        .await
        .unwrap();
    env.wait_running("live", 1).await;
    let attached = env.gpus_on(&m1);
    assert_eq!(attached.len(), 1);
    let patch = |v: serde_json::Value| {
        let requests = env.requests();
        async move {
            requests
                .patch("live", &PatchParams::default(), &Patch::Merge(v))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    };
    let e = patch(serde_json::json!({"spec": {"resource": {"target_node": "wroker-1"}}}))
        .await
        .unwrap_err();
    assert!(e.contains("target_node wroker-1 is not a Node"), "{e}");

    // type and model of a live request are immutable (the CRD's transition rules).
    let e = patch(serde_json::json!({"spec": {"resource": {"type": "cxlmemory"}}}))
        .await
        .unwrap_err();
    assert!(e.contains(cro_api::TYPE_IMMUTABLE), "{e}");
    let e = patch(serde_json::json!({"spec": {"resource": {"model": "H100"}}}))
        .await
        .unwrap_err();
    assert!(e.contains(cro_api::MODEL_IMMUTABLE), "{e}");
    // Other changes still pass, and the device never moved.
    patch(serde_json::json!({"spec": {"resource": {"size": 2}}}))
        .await
        .unwrap();
    env.wait_running("live", 2).await;
    let req = env.request("live").await.unwrap();
    assert_eq!(req.spec.resource.resource_type, cro_api::ResourceType::Gpu);
    assert!(env.gpus_on(&m1).contains(&attached[0]));

    // The target node disappearing later keeps the Go behaviour: the request is deleted.
    // Its devices are released on the fabric with the machine recorded at attach.
    env.delete_node("worker-1").await;
    eventually("the request deleted", CONVERGE, || async {
        env.request("live").await.is_none().then_some(())
    })
    .await;
    eventually("no device left on the fabric", CONVERGE, || async {
        env.gpus_on(&m1).is_empty().then_some(())
    })
    .await;
    assert!(env.resources_of("live").await.is_empty());
    env.stop_operator().await.unwrap();
}

/// Providers from `CdiProvider` objects: the webhook refuses a provider whose selector
/// overlaps another's and a second default, and a request whose target node no
/// provider serves (crate::registry::admit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_providers_a_second_default_and_unserved_nodes_are_refused() {
    use cro_api::CdiProvider;
    use cro_operator::VALIDATE_PROVIDER_PATH;

    let mut env = Env::start().await;
    env.add_node("worker-1", "16").await;
    let tls = webhook_tls();
    let mut config = env.config.clone();
    config.provider = cro_operator::config::ProviderSource::Objects;
    config.webhook = Some(WebhookConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        certs: WebhookCerts::Files {
            cert_file: tls.cert_file.path().into(),
            key_file: tls.key_file.path().into(),
        },
    });
    let operator = cro_operator::Operator::for_objects(
        env.client.clone(),
        std::sync::Arc::new(env.nodes.clone()),
        config,
        Default::default(),
    );
    let (_, webhook) = env.start_built_operator(operator).await;
    let port = webhook.unwrap().port();
    let mut configuration = chart_like_configuration("cro-providers", port, Some(&tls.ca_pem));
    let mut provider_hook = configuration.webhooks.as_ref().unwrap()[0].clone();
    provider_hook.name = "vcdiprovider.cro.hpsys.ibm.ie.com".into();
    provider_hook.match_conditions = None;
    provider_hook.client_config.url =
        Some(format!("https://127.0.0.1:{port}{VALIDATE_PROVIDER_PATH}"));
    provider_hook.rules.as_mut().unwrap()[0].resources = Some(vec!["cdiproviders".into()]);
    configuration.webhooks.as_mut().unwrap().push(provider_hook);
    Api::<ValidatingWebhookConfiguration>::all(env.client.clone())
        .create(&PostParams::default(), &configuration)
        .await
        .unwrap();

    let providers: Api<CdiProvider> = Api::all(env.client.clone());
    let provider = |name: &str, selector: serde_json::Value, default: bool| -> CdiProvider {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "cro.hpsys.ibm.ie.com/v1alpha1", "kind": "CdiProvider",
            "metadata": {"name": name},
            "spec": {"source": {"configMap": {"name": "absent", "namespace": "default", "key": "k"}},
                "nodeSelector": selector, "default": default},
        }))
        .unwrap()
    };
    let create_provider = |p: CdiProvider| {
        let providers = providers.clone();
        async move {
            providers
                .create(&PostParams::default(), &p)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    };

    // No provider yet: a request targeting worker-1 is refused, naming the node.
    let refusal = eventually(
        "the webhook to refuse an unserved node",
        CONVERGE,
        || async {
            create(&env, "unserved", on_node(MODEL, "worker-1"))
                .await
                .err()
        },
    )
    .await;
    assert!(
        refusal.contains("no CdiProvider serves node worker-1"),
        "{refusal}"
    );

    let pool_a = serde_json::json!({"matchLabels": {"pool": "a"}});
    let pool_a_rack = serde_json::json!({"matchLabels": {"pool": "a", "rack": "1"}});
    let pool_b = serde_json::json!({"matchLabels": {"pool": "b"}});
    eventually("the first provider admitted", CONVERGE, || async {
        create_provider(provider("a", pool_a.clone(), false))
            .await
            .ok()
    })
    .await;
    let overlap = create_provider(provider("a-rack", pool_a_rack, false))
        .await
        .unwrap_err();
    assert!(
        overlap.contains("nodeSelector overlaps CdiProvider a's"),
        "{overlap}"
    );
    create_provider(provider("b", pool_b, true)).await.unwrap();
    let second = create_provider(provider("b2", serde_json::Value::Null, true))
        .await
        .unwrap_err();
    assert!(
        second.contains("CdiProvider b is already the default provider"),
        "{second}"
    );
    // With a default provider, worker-1 is served: the request is admitted.
    eventually(
        "the request admitted once a default serves",
        CONVERGE,
        || async {
            create(&env, "served", on_node(MODEL, "worker-1"))
                .await
                .ok()
        },
    )
    .await;
    env.stop_operator().await.unwrap();
}

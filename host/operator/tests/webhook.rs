//! The validating webhook (SPEC §6) registered with the real API server, and the probe
//! endpoints.

mod common;

use std::time::Duration;

use common::{CONVERGE, Env, MODEL, eventually, gpu};
use cro_api::{
    AllocationPolicy, ComposabilityRequest, ComposabilityRequestSpec, ScalarResourceDetails,
};
use cro_operator::config::WebhookConfig;
use cro_operator::webhook::VALIDATE_PATH;
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
        .map_err(|e| e.to_string())
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
        cert_file: tls.cert_file.path().into(),
        key_file: tls.key_file.path().into(),
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

//! Component sources against real parts: a real OCI registry on loopback
//! (go-containerregistry's `crane registry serve`, built by deploy/tools/ensure-tools.sh),
//! the FTI component pushed as a wasm OCI artifact, and ConfigMaps and pull Secrets on
//! the real API server; https sources against a TLS server on loopback (`https`).

mod https;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use cro_api::{ComponentSource, ConfigMapSource, OciSource, SecretReference};
use cro_operator::source::{
    self, FetchOptions, SourceError, WASM_CONFIG_MEDIA_TYPE, WASM_LAYER_MEDIA_TYPE, sha256_hex,
};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

/// `crane registry serve` on a loopback port, stopped when dropped.
struct Registry {
    child: tokio::process::Child,
    host: String,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

fn crane() -> PathBuf {
    let script = cro_test_support::workspace_root().join("deploy/tools/ensure-tools.sh");
    let out = std::process::Command::new(script)
        .arg("crane")
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "ensure-tools.sh crane failed");
    let text = String::from_utf8(out.stdout).unwrap();
    PathBuf::from(text.trim().strip_prefix("crane=").unwrap())
}

impl Registry {
    async fn start() -> Registry {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let host = format!("127.0.0.1:{port}");
        let child = tokio::process::Command::new(crane())
            .args(["registry", "serve", "--address", &host])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(&host).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "registry on {host} did not start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Registry { child, host }
    }

    /// Pushes `bytes` as a one-layer artifact of `media_type` under `repo:tag` with the
    /// registry's plain HTTP API (the distribution spec's upload and manifest PUTs), and
    /// returns the manifest's digest. Written by hand rather than with oci-client's push,
    /// whose monolithic upload this registry answers without a `Location`.
    async fn push(&self, repo: &str, tag: &str, bytes: Vec<u8>, media_type: &str) -> String {
        let http = reqwest::Client::new();
        let base = format!("http://{}/v2/{repo}", self.host);
        let config = b"{}".to_vec();
        for blob in [&config, &bytes] {
            let started = http
                .post(format!("{base}/blobs/uploads/"))
                .send()
                .await
                .unwrap();
            assert_eq!(started.status().as_u16(), 202, "start upload");
            let location = started.headers()["location"].to_str().unwrap().to_owned();
            let url = if location.starts_with('/') {
                format!("http://{}{location}", self.host)
            } else {
                location
            };
            let sep = if url.contains('?') { '&' } else { '?' };
            let put = http
                .put(format!("{url}{sep}digest=sha256:{}", sha256_hex(blob)))
                .header("content-type", "application/octet-stream")
                .body(blob.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(put.status().as_u16(), 201, "finish upload");
        }
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": WASM_CONFIG_MEDIA_TYPE,
                       "digest": format!("sha256:{}", sha256_hex(&config)), "size": config.len()},
            "layers": [{"mediaType": media_type,
                        "digest": format!("sha256:{}", sha256_hex(&bytes)), "size": bytes.len()}]
        }))
        .unwrap();
        let put = http
            .put(format!("{base}/manifests/{tag}"))
            .header("content-type", "application/vnd.oci.image.manifest.v1+json")
            .body(manifest.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(put.status().as_u16(), 201, "push manifest");
        format!("sha256:{}", sha256_hex(&manifest))
    }

    fn options(&self) -> FetchOptions {
        FetchOptions {
            plain_http_registries: vec![self.host.clone()],
            ..FetchOptions::default()
        }
    }
}

fn fti_component() -> Vec<u8> {
    std::fs::read(cro_test_support::component("fti-provider")).unwrap()
}

async fn kube() -> kube::Client {
    kube_harness::shared().await.unwrap().client().unwrap()
}

fn oci(reference: String, pull_secret: Option<SecretReference>) -> ComponentSource {
    ComponentSource {
        oci: Some(OciSource {
            reference,
            pull_secret,
        }),
        ..ComponentSource::default()
    }
}

#[tokio::test]
async fn a_component_is_pulled_from_a_registry_by_digest_and_only_by_its_digest() {
    let registry = Registry::start().await;
    let kube = kube().await;
    let wasm = fti_component();
    let digest = registry
        .push("cro/fti", "1.0", wasm.clone(), WASM_LAYER_MEDIA_TYPE)
        .await;

    let reference = format!("{}/cro/fti:1.0@{digest}", registry.host);
    let fetched = source::fetch(&kube, &oci(reference, None), &registry.options())
        .await
        .unwrap();
    assert!(
        fetched.bytes == wasm,
        "the pulled bytes differ from the pushed component"
    );
    assert_eq!(fetched.digest, format!("sha256:{}", sha256_hex(&wasm)));

    // A digest the registry does not have (a tag moved, a typo): refused, naming it.
    let wrong = format!("sha256:{}", sha256_hex(b"some other component"));
    let reference = format!("{}/cro/fti:1.0@{wrong}", registry.host);
    let err = source::fetch(&kube, &oci(reference, None), &registry.options())
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, SourceError::Registry { .. }), "{err:?}");
    assert!(msg.contains(&wrong), "{msg}");
    // The registry's own words (distribution's MANIFEST_UNKNOWN), with the reference.
    assert!(msg.contains("Unknown manifest"), "{msg}");

    // Over the size limit: refused from the manifest's size, before the layer is read.
    let reference = format!("{}/cro/fti@{digest}", registry.host);
    let small = FetchOptions {
        max_component_bytes: wasm.len() as u64 - 1,
        ..registry.options()
    };
    let err = source::fetch(&kube, &oci(reference, None), &small)
        .await
        .unwrap_err();
    assert!(
        matches!(err, SourceError::TooLarge { declared: true, size, .. } if size == wasm.len() as u64),
        "{err:?}"
    );
    assert!(err.to_string().contains("over the limit"), "{err}");
}

#[tokio::test]
async fn an_artifact_without_a_wasm_layer_is_refused_by_media_type() {
    let registry = Registry::start().await;
    let kube = kube().await;
    let digest = registry
        .push(
            "cro/tarball",
            "1",
            b"not wasm".to_vec(),
            "application/vnd.oci.image.layer.v1.tar",
        )
        .await;
    let reference = format!("{}/cro/tarball@{digest}", registry.host);
    let err = source::fetch(&kube, &oci(reference, None), &registry.options())
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("application/wasm") && msg.contains("application/vnd.oci.image.layer.v1.tar"),
        "{msg}"
    );
}

#[tokio::test]
async fn pull_secrets_are_read_from_the_cluster_and_refused_clearly() {
    // crane's registry has no authentication, so credentials are checked as far as the
    // cluster goes here; their parsing is unit-tested (source::pull_secret).
    let registry = Registry::start().await;
    let kube = kube().await;
    let digest = registry
        .push("cro/fti", "auth", fti_component(), WASM_LAYER_MEDIA_TYPE)
        .await;
    let reference = format!("{}/cro/fti@{digest}", registry.host);
    let secrets: Api<Secret> = Api::namespaced(kube.clone(), "default");
    let secret_ref = |name: &str| {
        Some(SecretReference {
            name: name.into(),
            namespace: "default".into(),
        })
    };

    let err = source::fetch(
        &kube,
        &oci(reference.clone(), secret_ref("absent-pull")),
        &registry.options(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.to_string(), "pull Secret default/absent-pull not found");

    let make = |name: &str, type_: &str, json: String| Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        type_: Some(type_.into()),
        data: Some(BTreeMap::from([(
            ".dockerconfigjson".to_owned(),
            ByteString(json.into_bytes()),
        )])),
        ..Default::default()
    };
    let good = format!(
        r#"{{"auths":{{"{}":{{"username":"robot","password":"pw"}}}}}}"#,
        registry.host
    );
    for s in [
        make("opaque-pull", "Opaque", good.clone()),
        make(
            "other-registry-pull",
            "kubernetes.io/dockerconfigjson",
            r#"{"auths":{"elsewhere.example":{"username":"u","password":"p"}}}"#.into(),
        ),
        make("good-pull", "kubernetes.io/dockerconfigjson", good),
    ] {
        let _ = secrets
            .delete(
                s.metadata.name.as_deref().unwrap(),
                &DeleteParams::default(),
            )
            .await;
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }

    let err = source::fetch(
        &kube,
        &oci(reference.clone(), secret_ref("opaque-pull")),
        &registry.options(),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("type is Opaque, expected kubernetes.io/dockerconfigjson"),
        "{err}"
    );
    let err = source::fetch(
        &kube,
        &oci(reference.clone(), secret_ref("other-registry-pull")),
        &registry.options(),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("no credentials for registry {}", registry.host)),
        "{err}"
    );
    // Credentials that match the registry are sent; this registry ignores them.
    let fetched = source::fetch(
        &kube,
        &oci(reference, secret_ref("good-pull")),
        &registry.options(),
    )
    .await
    .unwrap();
    assert_eq!(fetched.bytes.len(), fti_component().len());
}

#[tokio::test]
async fn a_component_is_read_from_a_configmaps_binary_data() {
    let kube = kube().await;
    let wasm = fti_component();
    let maps: Api<ConfigMap> = Api::namespaced(kube.clone(), "default");
    let _ = maps.delete("fti-component", &DeleteParams::default()).await;
    maps.create(
        &PostParams::default(),
        &ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("fti-component".into()),
                ..Default::default()
            },
            binary_data: Some(BTreeMap::from([(
                "fti.wasm".into(),
                ByteString(wasm.clone()),
            )])),
            data: Some(BTreeMap::from([("note".into(), "text".into())])),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let source_of = |name: &str, key: &str| ComponentSource {
        config_map: Some(ConfigMapSource {
            name: name.into(),
            namespace: "default".into(),
            key: key.into(),
        }),
        ..ComponentSource::default()
    };
    let fetched = source::fetch(
        &kube,
        &source_of("fti-component", "fti.wasm"),
        &FetchOptions::default(),
    )
    .await
    .unwrap();
    assert!(fetched.bytes == wasm);
    assert_eq!(fetched.digest, format!("sha256:{}", sha256_hex(&wasm)));

    let err = source::fetch(
        &kube,
        &source_of("fti-component", "note"),
        &FetchOptions::default(),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("no binaryData key \"note\""),
        "{err}"
    );
    let err = source::fetch(
        &kube,
        &source_of("absent", "fti.wasm"),
        &FetchOptions::default(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.to_string(), "ConfigMap default/absent not found");
    let small = FetchOptions {
        max_component_bytes: 1024,
        ..FetchOptions::default()
    };
    let err = source::fetch(&kube, &source_of("fti-component", "fti.wasm"), &small)
        .await
        .unwrap_err();
    assert!(matches!(err, SourceError::TooLarge { .. }), "{err:?}");
}

/// A `CdiProvider`'s grants and limits are a provider spec file's, field for field: the
/// runtime's own parser accepts them (defaults filled in) and applies its validation.
#[test]
fn cdi_provider_grants_and_limits_parse_as_a_provider_spec_file() {
    let spec: cro_api::CdiProviderSpec = serde_json::from_value(serde_json::json!({
        "source": {"configMap": {"name": "c", "namespace": "n", "key": "k"}},
        "config": {"api_type": "FM"},
        "grants": {
            "http": [{"url": "https://fm.example:8443"}],
            "secret": {"namespace": "cro-system", "name": "creds", "keys": ["username"]},
            "lookup": [{"api_version": "v1", "kind": "Node"}],
            "wasi": {"clocks": true}
        },
        "limits": {"call_timeout_ms": 1000, "max_concurrent_calls": 4}
    }))
    .unwrap();
    let as_file = |spec: &cro_api::CdiProviderSpec| {
        serde_json::json!({
            "name": "fti",
            "component": "/c.wasm",
            "config": spec.config,
            "grants": spec.grants,
            "limits": spec.limits,
        })
        .to_string()
    };
    let parsed =
        cro_runtime::ProviderSpec::from_json(&as_file(&spec), std::path::Path::new("/")).unwrap();
    assert_eq!(parsed.limits.call_timeout_ms, 1000);
    assert_eq!(parsed.limits.max_concurrent_calls, 4);
    assert_eq!(
        parsed.limits.memory_bytes,
        cro_runtime::Limits::default().memory_bytes
    );
    assert_eq!(parsed.grants.secret.as_ref().unwrap().keys, ["username"]);
    assert!(parsed.grants.allows_lookup("v1", "Node"));

    // The runtime's checks apply beyond what the CRD schema says.
    let mut bad = spec.clone();
    bad.grants.http[0].url = "https://fm.example:8443/some/path".into();
    assert!(
        cro_runtime::ProviderSpec::from_json(&as_file(&bad), std::path::Path::new("/")).is_err()
    );
}

//! `KubeCluster` against a real API server (kube-harness): Secrets, Nodes, an object of a
//! custom kind found by discovery, and a provider's lookups through it.

mod common;

use std::sync::Arc;

use common::*;
use cro_runtime::AddRequest;
use cro_runtime::cluster::{ClusterError, ClusterReader, KubeCluster};
use cro_runtime::grants::{LookupGrant, SecretGrant};
use cro_runtime::{AddOutcome, CallError, ProviderError};
use k8s_openapi::api::core::v1::{Namespace, Node, Secret};
use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::ApiResource;
use serde_json::json;

fn bare_metal_host_crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "baremetalhosts.metal3.io"},
        "spec": {
            "group": "metal3.io",
            "names": {"kind": "BareMetalHost", "listKind": "BareMetalHostList",
                      "plural": "baremetalhosts", "singular": "baremetalhost"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1alpha1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))
    .unwrap()
}

async fn create<K>(api: &Api<K>, value: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_cluster_reads_a_real_api_server() {
    kube_harness::install_crypto_provider();
    let harness = kube_harness::Harness::builder()
        .crd(bare_metal_host_crd())
        .start()
        .await
        .unwrap();
    let client = harness.client().unwrap();

    create(
        &Api::<Namespace>::all(client.clone()),
        json!({"metadata": {"name": "cro-system"}}),
    )
    .await;
    create(
        &Api::<Namespace>::all(client.clone()),
        json!({"metadata": {"name": "openshift-machine-api"}}),
    )
    .await;
    for name in ["worker-0", "worker-1"] {
        create(
            &Api::<Node>::all(client.clone()),
            json!({"metadata": {"name": name, "annotations": {"machine.openshift.io/machine": "openshift-machine-api/m"}}}),
        )
        .await;
    }
    create(
        &Api::<Secret>::namespaced(client.clone(), "cro-system"),
        json!({"metadata": {"name": "credentials"}, "stringData": {"username": "admin", "password": "hunter2"}}),
    )
    .await;
    let bmh = ApiResource {
        group: "metal3.io".into(),
        version: "v1alpha1".into(),
        api_version: "metal3.io/v1alpha1".into(),
        kind: "BareMetalHost".into(),
        plural: "baremetalhosts".into(),
    };
    let bmh_api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "openshift-machine-api", &bmh);
    create(
        &bmh_api,
        json!({"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
               "metadata": {"name": "bmh-0", "namespace": "openshift-machine-api"},
               "spec": {"bootMACAddress": "00:11:22:33:44:55"}}),
    )
    .await;

    let cluster = KubeCluster::new(client.clone());
    let secret = cluster
        .get_secret("cro-system", "credentials")
        .await
        .unwrap();
    assert_eq!(secret["username"], b"admin");
    assert!(matches!(
        cluster.get_secret("cro-system", "nope").await,
        Err(ClusterError::NotFound(_))
    ));

    let node = cluster
        .get_object("v1", "Node", None, "worker-1")
        .await
        .unwrap();
    assert_eq!(node["metadata"]["name"], "worker-1");
    assert_eq!(node["kind"], "Node");
    let nodes = cluster.list_objects("v1", "Node").await.unwrap();
    assert_eq!(nodes.len(), 2);
    assert!(
        nodes
            .iter()
            .all(|n| n["apiVersion"] == "v1" && n["kind"] == "Node")
    );
    assert!(matches!(
        cluster.get_object("v1", "Node", None, "worker-9").await,
        Err(ClusterError::NotFound(_))
    ));

    let host = cluster
        .get_object(
            "metal3.io/v1alpha1",
            "BareMetalHost",
            Some("openshift-machine-api"),
            "bmh-0",
        )
        .await
        .unwrap();
    assert_eq!(host["spec"]["bootMACAddress"], "00:11:22:33:44:55");
    assert!(matches!(
        cluster.get_object("metal3.io/v1alpha1", "BareMetalHost", None, "bmh-0").await,
        Err(ClusterError::Invalid(m)) if m.contains("namespaced")
    ));
    assert!(matches!(
        cluster
            .get_object("example.com/v1", "Nothing", None, "x")
            .await,
        Err(ClusterError::Api(_) | ClusterError::NotFound(_))
    ));

    // A provider reading through it: granted and denied.
    let mut lookup = spec("lookup", &[("what", "nodes")]);
    lookup.grants.lookup = vec![LookupGrant::new("v1", "Node")];
    let provider = runtime()
        .load(&lookup, Arc::new(cluster.clone()))
        .await
        .unwrap();
    let Ok(AddOutcome::Attached(d)) = provider.add(&AddRequest::new(gpu("a"))).await else {
        panic!()
    };
    let nodes: Vec<serde_json::Value> = serde_json::from_str(&d.device_id).unwrap();
    assert_eq!(nodes.len(), 2);

    let mut secret = spec("secret", &[("key", "password")]);
    secret.grants.secret = Some(SecretGrant {
        namespace: "cro-system".into(),
        name: "credentials".into(),
        keys: vec!["password".into()],
    });
    let provider = runtime()
        .load(&secret, Arc::new(cluster.clone()))
        .await
        .unwrap();
    let Ok(AddOutcome::Attached(d)) = provider.add(&AddRequest::new(gpu("a"))).await else {
        panic!()
    };
    assert_eq!(d.device_id, "hunter2");
    secret.config.insert("key".into(), "username".into());
    let provider = runtime().load(&secret, Arc::new(cluster)).await.unwrap();
    assert!(matches!(
        provider.add(&AddRequest::new(gpu("a"))).await,
        Err(CallError::Provider(ProviderError::Denied(_)))
    ));
}

//! The providers as `CdiProvider` objects make them: the FTI component's spec for a
//! fabric simulator, the component in a ConfigMap, node pools by label. Shared by the
//! providers tests and the replicas benchmark.

use std::collections::BTreeMap;

use cro_api::CdiProviderSpec;
use fabric_sim::{FabricSim, SimConfig};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{Env, OPERATOR_NS};

/// The FTI provider's spec for the fabric simulator `sim`.
pub fn fti_spec_for(sim: &FabricSim) -> (CdiProviderSpec, tempfile::NamedTempFile) {
    let ca = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca.path(), sim.ca_pem()).unwrap();
    let vars: BTreeMap<&str, String> = BTreeMap::from([
        ("CDI_PROVIDER_TYPE", "FTI_CDI".to_string()),
        ("FTI_CDI_API_TYPE", "FM".to_string()),
        ("FTI_CDI_ENDPOINT", sim.endpoint()),
        ("FTI_CDI_TENANT_ID", sim.tenant_id().to_string()),
        ("CRO_FTI_CA_FILE", ca.path().display().to_string()),
        (
            "CRO_FTI_COMPONENT",
            cro_test_support::component("fti-provider")
                .display()
                .to_string(),
        ),
    ]);
    let spec = cro_operator::compat::fti_spec_from_env(|k| vars.get(k).cloned())
        .unwrap()
        .unwrap();
    let cdi: CdiProviderSpec = serde_json::from_value(json!({
        "source": {"configMap": {"name": "fti", "namespace": OPERATOR_NS, "key": "fti.wasm"}},
        "config": spec.config,
        "grants": spec.grants,
        "limits": spec.limits,
    }))
    .unwrap();
    (cdi, ca)
}

/// The component `bytes` in the ConfigMap `name` (key `key`) of the operator's namespace,
/// replacing what it held.
pub async fn put_component(env: &Env, name: &str, key: &str, bytes: Vec<u8>) {
    let maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), OPERATOR_NS);
    let map = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        binary_data: Some(BTreeMap::from([(key.into(), ByteString(bytes))])),
        ..Default::default()
    };
    if maps.get_opt(name).await.unwrap().is_some() {
        maps.replace(name, &PostParams::default(), &map)
            .await
            .unwrap();
    } else {
        maps.create(&PostParams::default(), &map).await.unwrap();
    }
}

/// A node selector for the pool `value` (nodes labelled `pool=<value>`).
pub fn pool(value: &str) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(BTreeMap::from([("pool".to_string(), value.to_string())])),
        match_expressions: None,
    })
}

/// Puts `node` in the pool `pool`.
pub async fn label_node(env: &Env, node: &str, pool: &str) {
    Api::<Node>::all(env.client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"pool": pool}}})),
        )
        .await
        .unwrap();
}

/// Another fabric beside `env`'s: its own tenant, CA and machines, the same log-in (so
/// one credentials Secret serves both).
pub fn another_fabric(env: &Env) -> FabricSim {
    FabricSim::start(SimConfig {
        credentials: env.sim.credentials(),
        realm: env.sim.realm().to_string(),
        ..SimConfig::default()
    })
    .expect("a fabric simulator starts")
}

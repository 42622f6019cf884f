//! The FTI component loaded from the Go operator's environment with extra settings.

use std::collections::BTreeMap;
use std::sync::Arc;

use cro_operator::{DeviceProvider, NodeCache, RememberingCluster};
use cro_runtime::{Runtime, RuntimeOptions};

use super::{Env, FabricApi};

/// The FTI component loaded again from the Go environment, with `CRO_FTI_CALL_TIMEOUT`,
/// on the cluster view `cro run` gives it.
pub async fn with_call_timeout(env: &Env, timeout: &str) -> Arc<dyn DeviceProvider> {
    let ca = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca.path(), env.sim.ca_pem()).unwrap();
    let component = cro_test_support::component("fti-provider");
    let mut vars: BTreeMap<&str, String> = BTreeMap::from([
        ("CDI_PROVIDER_TYPE", "FTI_CDI".to_string()),
        ("FTI_CDI_ENDPOINT", env.sim.endpoint()),
        ("FTI_CDI_TENANT_ID", env.sim.tenant_id().to_string()),
        ("CRO_FTI_CA_FILE", ca.path().display().to_string()),
        ("CRO_FTI_COMPONENT", component.display().to_string()),
        ("CRO_FTI_CALL_TIMEOUT", timeout.to_string()),
    ]);
    match env.api {
        FabricApi::Fm => vars.insert("FTI_CDI_API_TYPE", "FM".into()),
        FabricApi::Cm => {
            vars.insert("FTI_CDI_CLUSTER_ID", env.sim.cluster_id().to_string());
            vars.insert("FTI_CDI_API_TYPE", "CM".into())
        }
    };
    let spec = cro_operator::compat::fti_spec_from_env(|k| vars.get(k).cloned())
        .unwrap()
        .unwrap();
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
    // The cluster view `cro run` gives it (its Node cache not lent: lookups are GETs).
    let cluster = RememberingCluster::of_api_server(env.client.clone(), NodeCache::default());
    Arc::new(runtime.load(&spec, Arc::new(cluster)).await.unwrap())
}

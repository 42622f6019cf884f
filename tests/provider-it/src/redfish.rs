//! A fixture for the Redfish provider component (built from `providers/redfish`) in the
//! cro runtime against the Redfish simulator (`simulators/redfish`), over plain HTTP on
//! loopback.

use std::sync::{Arc, OnceLock};

use cro_runtime::cluster::StaticCluster;
use cro_runtime::{
    AddRequest, Claim, ComposableResource, DeviceType, Provider, ProviderSpec, Runtime,
};
use redfish_sim::{RedfishSim, SimConfig};
use serde_json::{Value, json};

use crate::{SECRET_NAME, SECRET_NAMESPACE};

/// The models the fixtures seed (the ones the provider's `describe()` names).
pub const GPU_MODEL: &str = "NVIDIA A100 80GB";
pub const CXL_MODEL: &str = "CXL 256GiB";
pub const PACKAGE: &str = "cro-provider-redfish";

/// The component, built once per process.
pub fn component_bytes() -> Arc<Vec<u8>> {
    static BYTES: OnceLock<Arc<Vec<u8>>> = OnceLock::new();
    BYTES
        .get_or_init(|| {
            let path = cro_test_support::component(PACKAGE);
            match std::fs::read(&path) {
                Ok(b) => Arc::new(b),
                Err(e) => panic!("cannot read {}: {e}", path.display()),
            }
        })
        .clone()
}

pub struct RedfishBuilder {
    sim_config: SimConfig,
    config: Vec<(String, String)>,
    http_grants: Option<Value>,
    secret_keys: Vec<&'static str>,
}

impl RedfishBuilder {
    pub fn with_sim_config(mut self, f: impl FnOnce(SimConfig) -> SimConfig) -> Self {
        self.sim_config = f(self.sim_config);
        self
    }

    pub fn with_config(mut self, key: &str, value: &str) -> Self {
        self.config.push((key.into(), value.into()));
        self
    }

    pub fn with_http_grants(mut self, grants: Value) -> Self {
        self.http_grants = Some(grants);
        self
    }

    pub fn with_secret_keys(mut self, keys: Vec<&'static str>) -> Self {
        self.secret_keys = keys;
        self
    }

    pub async fn start(self) -> RedfishFixture {
        let sim = match RedfishSim::start(self.sim_config) {
            Ok(s) => s,
            Err(e) => panic!("cannot start the Redfish simulator: {e}"),
        };
        let mut config = json!({"endpoint": sim.endpoint()});
        for (k, v) in self.config {
            config[k] = v.into();
        }
        let http = self
            .http_grants
            .unwrap_or_else(|| json!([{"url": format!("http://{}", sim.addr())}]));
        let spec = json!({
            "name": "redfish",
            "component": cro_test_support::component(PACKAGE),
            "config": config,
            "grants": {
                "http": http,
                "secret": {"namespace": SECRET_NAMESPACE, "name": SECRET_NAME,
                    "keys": self.secret_keys},
                "lookup": [{"api_version": "v1", "kind": "Node"}],
                "wasi": {"clocks": true},
            },
            "limits": {"call_timeout_ms": 20000},
        });
        let spec = match ProviderSpec::from_json(&spec.to_string(), std::path::Path::new("/")) {
            Ok(s) => s,
            Err(e) => panic!("provider spec refused: {e}"),
        };
        let (username, password) = sim.credentials();
        let cluster = StaticCluster::new().with_secret(
            SECRET_NAMESPACE,
            SECRET_NAME,
            [("username", username), ("password", password)],
        );
        let runtime = crate::shared_runtime();
        let provider = load(&runtime, &spec, &cluster).await;
        RedfishFixture {
            sim,
            cluster,
            provider,
            runtime,
            spec,
        }
    }
}

async fn load(runtime: &Runtime, spec: &ProviderSpec, cluster: &StaticCluster) -> Provider {
    match runtime
        .load_bytes(spec, component_bytes().to_vec(), Arc::new(cluster.clone()))
        .await
    {
        Ok(p) => p,
        Err(e) => panic!("cannot load the Redfish component: {e}"),
    }
}

/// A simulator, a cluster and the Redfish provider loaded against them.
pub struct RedfishFixture {
    pub sim: RedfishSim,
    pub cluster: StaticCluster,
    pub provider: Provider,
    pub runtime: Runtime,
    pub spec: ProviderSpec,
}

impl RedfishFixture {
    pub fn builder() -> RedfishBuilder {
        RedfishBuilder {
            sim_config: SimConfig::default(),
            config: Vec::new(),
            http_grants: None,
            secret_keys: vec!["username", "password"],
        }
    }

    pub async fn start() -> RedfishFixture {
        Self::builder().start().await
    }

    /// The same component loaded again (same spec and cluster): a provider whose
    /// `state` is empty, as after an operator restart.
    pub async fn reload(&self) -> Provider {
        load(&self.runtime, &self.spec, &self.cluster).await
    }

    /// A system `<node>-sys` and a Node whose providerID names it; returns the system id.
    pub fn add_node(&self, node: &str) -> String {
        let system = format!("{node}-sys");
        self.sim.add_system(&system);
        self.insert(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node},
            "spec": {"providerID": format!("redfish://{system}")},
        }));
        system
    }

    /// A Node that is no Redfish system.
    pub fn add_plain_node(&self, node: &str) {
        self.insert(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node},
            "spec": {"providerID": format!("kind://docker/{node}")},
        }));
    }

    fn insert(&self, object: Value) {
        if let Err(e) = self.cluster.insert_object(object) {
            panic!("cannot add object: {e}");
        }
    }

    pub fn resource(&self, name: &str, t: DeviceType, node: &str) -> ComposableResource {
        ComposableResource {
            name: name.into(),
            device_type: t,
            model: match t {
                DeviceType::Gpu => GPU_MODEL.into(),
                DeviceType::CxlMemory => CXL_MODEL.into(),
            },
            target_node: node.into(),
            device_id: None,
            fabric_device_id: None,
            machine_id: None,
            force_detach: false,
        }
    }

    pub fn gpu(&self, name: &str, node: &str) -> ComposableResource {
        self.resource(name, DeviceType::Gpu, node)
    }

    /// An attach of `resource` under `attempt_key` knowing `claims`.
    pub fn request(
        &self,
        resource: &ComposableResource,
        attempt_key: &str,
        claims: &[Claim],
    ) -> AddRequest {
        AddRequest {
            resource: resource.clone(),
            attempt_key: attempt_key.into(),
            size_bytes: None,
            claims: claims.to_vec(),
        }
    }
}

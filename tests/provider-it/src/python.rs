//! The Python example provider (`providers/python-example`, contract 0.2.0, built by
//! componentize-py through `scripts/setup.sh`) in the cro runtime against the fabric
//! simulator's Fabric Manager API.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, OnceLock};

use cro_runtime::cluster::StaticCluster;
use cro_runtime::{DeviceType, Provider, ProviderSpec, Runtime, RuntimeOptions};
use fabric_sim::{FabricSim, SimConfig};
use serde_json::json;

use crate::{MODEL, SECRET_NAME, SECRET_NAMESPACE};

/// Built by `scripts/setup.sh`'s `build_python_example` (a no-op when up to date).
pub fn python_component() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let root = cro_test_support::workspace_root();
        let out = match Command::new("bash")
            .arg("-c")
            .arg("source scripts/setup.sh && build_python_example")
            .current_dir(&root)
            .output()
        {
            Ok(out) => out,
            Err(e) => panic!("cannot run bash: {e}"),
        };
        if !out.status.success() {
            panic!(
                "building the Python example provider failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        root.join("target/wasm/python/python_example.wasm")
    })
    .clone()
}

/// The runtime's options for a CPython component: it has more core instances, memories
/// and tables than a Rust component (CPython and its libc are separate modules), so the
/// default pool slots would refuse it.
pub fn python_options() -> RuntimeOptions {
    RuntimeOptions {
        max_instances: 4,
        max_core_instances_per_component: 32,
        max_memories_per_component: 8,
        max_tables_per_component: 8,
        ..RuntimeOptions::default()
    }
}

/// One runtime per process for the Python component (it is compiled once).
pub fn python_runtime() -> Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME
        .get_or_init(|| match Runtime::new(python_options()) {
            Ok(r) => r,
            Err(e) => panic!("cannot start the runtime: {e}"),
        })
        .clone()
}

/// A simulator, a cluster and the Python provider loaded against them.
pub struct PyFixture {
    pub sim: FabricSim,
    pub provider: Provider,
    pub cluster: StaticCluster,
}

/// A simulator and the Python provider loaded against it (FM API), with `config`
/// overriding provider config keys.
pub async fn start(config: &[(&str, &str)]) -> PyFixture {
    start_in(&python_runtime(), config).await
}

/// Like [`start`] in the given runtime.
pub async fn start_in(runtime: &Runtime, config: &[(&str, &str)]) -> PyFixture {
    let sim = match FabricSim::start(SimConfig::default()) {
        Ok(s) => s,
        Err(e) => panic!("cannot start the simulator: {e}"),
    };
    let mut cfg = json!({
        "api_type": "FM",
        "endpoint": sim.endpoint(),
        "tenant_id": sim.tenant_id(),
    });
    for (k, v) in config {
        cfg[*k] = (*v).into();
    }
    let spec = json!({
        "name": "python-fti",
        "component": python_component(),
        "config": cfg,
        "grants": {
            "http": [{"url": format!("https://{}", sim.https_addr()), "ca_pem": sim.ca_pem()}],
            "secret": {"namespace": SECRET_NAMESPACE, "name": SECRET_NAME,
                "keys": ["username", "password", "client_id", "client_secret", "realm"]},
            "lookup": [{"api_version": "v1", "kind": "Node"}],
            "wasi": {"clocks": true},
        },
        "limits": {"call_timeout_ms": 20000, "memory_bytes": 128 << 20},
    });
    let spec = match ProviderSpec::from_json(&spec.to_string(), std::path::Path::new("/")) {
        Ok(s) => s,
        Err(e) => panic!("provider spec refused: {e}"),
    };
    let cluster =
        StaticCluster::new().with_secret(SECRET_NAMESPACE, SECRET_NAME, sim.secret_data());
    let provider = runtime
        .load(&spec, Arc::new(cluster.clone()))
        .await
        .unwrap_or_else(|e| panic!("cannot load the Python component: {e}"));
    PyFixture {
        sim,
        provider,
        cluster,
    }
}

impl PyFixture {
    /// A fabric machine and its Node (`spec.providerID` is `fsas-cdi://<machine>`).
    pub fn add_node(&self, node: &str, machine: &str) {
        self.sim.add_machine(machine, node);
        if let Err(e) = self.cluster.insert_object(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node},
            "spec": {"providerID": format!("fsas-cdi://{machine}")},
        })) {
            panic!("cannot add the node: {e}");
        }
    }

    pub fn gpu(&self, name: &str, node: &str) -> cro_runtime::ComposableResource {
        cro_runtime::ComposableResource {
            name: name.into(),
            device_type: DeviceType::Gpu,
            model: MODEL.into(),
            target_node: node.into(),
            device_id: None,
            fabric_device_id: None,
            machine_id: None,
            force_detach: false,
        }
    }
}

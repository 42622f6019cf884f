//! The Python example provider (providers/python-example, built by componentize-py)
//! in the real runtime against the fabric simulator's Fabric Manager API.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, OnceLock};

use cro_runtime::cluster::StaticCluster;
use cro_runtime::{DeviceType, Provider, ProviderError, ProviderSpec, Runtime, RuntimeOptions};
use fabric_sim::{FabricSim, Route, SimConfig};
use provider_it::{MODEL, SECRET_NAME, SECRET_NAMESPACE};
use serde_json::json;

use crate::*;

/// Built by `scripts/setup.sh`'s `build_python_example` (a no-op when up to date).
pub fn python_component() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let root = cro_test_support::workspace_root();
        let out = Command::new("bash")
            .arg("-c")
            .arg("source scripts/setup.sh && build_python_example")
            .current_dir(&root)
            .output()
            .expect("run bash");
        assert!(
            out.status.success(),
            "building the Python example provider failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
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

fn python_runtime() -> Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME
        .get_or_init(|| Runtime::new(python_options()).unwrap())
        .clone()
}

pub struct PyFixture {
    pub sim: FabricSim,
    pub provider: Provider,
    pub cluster: StaticCluster,
}

pub async fn start(config: &[(&str, &str)]) -> PyFixture {
    let sim = FabricSim::start(SimConfig::default()).unwrap();
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
    let spec = ProviderSpec::from_json(&spec.to_string(), std::path::Path::new("/")).unwrap();
    let creds = sim.credentials();
    let cluster = StaticCluster::new().with_secret(
        SECRET_NAMESPACE,
        SECRET_NAME,
        [
            ("username", creds.username),
            ("password", creds.password),
            ("client_id", creds.client_id),
            ("client_secret", creds.client_secret),
            ("realm", sim.realm().to_string()),
        ],
    );
    let provider = python_runtime()
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
    pub fn add_node(&self, node: &str, machine: &str) {
        self.sim.add_machine(machine, node);
        self.cluster
            .insert_object(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node},
                "spec": {"providerID": format!("fsas-cdi://{machine}")},
            }))
            .unwrap();
    }

    pub fn gpu(&self, name: &str, node: &str) -> cro_runtime::ComposableResource {
        cro_runtime::ComposableResource {
            name: name.into(),
            device_type: DeviceType::Gpu,
            model: MODEL.into(),
            target_node: node.into(),
            device_id: None,
            fabric_device_id: None,
            force_detach: false,
        }
    }
}

const MACHINE: &str = "0b1c2d3e-0000-4000-8000-00000000py01";

#[tokio::test]
async fn python_provider_attaches_checks_lists_and_detaches() {
    let fx = start(&[]).await;
    fx.sim.add_free_devices("gpu", MODEL, 2);
    fx.add_node("worker-0", MACHINE);
    let mut gpu = fx.gpu("gpu-py", "worker-0");

    let (serial, uuid) = attached(fx.provider.add_resource(&gpu).await);
    let on_machine = fx.sim.machine_devices(MACHINE);
    assert_eq!(on_machine.len(), 1);
    assert_eq!((&on_machine[0].serial, &on_machine[0].res_uuid), (&serial, &uuid));
    assert_eq!(fx.sim.free_devices("gpu", MODEL), 1);
    gpu.device_id = Some(serial.clone());
    gpu.fabric_device_id = Some(uuid.clone());

    fx.provider.check_resource(&gpu).await.unwrap();
    fx.sim.set_op_status(&serial, "1").unwrap();
    assert!(matches!(
        provider_error(fx.provider.check_resource(&gpu).await),
        ProviderError::Warning(m) if m.contains(&serial)
    ));
    fx.sim.set_op_status(&serial, "0").unwrap();

    let listed = fx.provider.get_resources().await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].node, "worker-0");
    assert_eq!(listed[0].machine_id, MACHINE);
    assert_eq!(listed[0].model, MODEL);
    assert_eq!(listed[0].device_id, serial);

    // The token came once and was reused from the host's state store.
    assert_eq!(fx.sim.token_requests().len(), 1);

    assert_eq!(
        fx.provider.remove_resource(&gpu).await.unwrap(),
        cro_runtime::RemoveOutcome::Removed
    );
    assert!(fx.sim.machine_devices(MACHINE).is_empty());
    assert_eq!(fx.sim.free_devices("gpu", MODEL), 2);
    assert_eq!(fx.sim.requests_to(Route::FmDetach).len(), 1);
    // A second detach finds the device gone: done, without another DELETE.
    assert_eq!(
        fx.provider.remove_resource(&gpu).await.unwrap(),
        cro_runtime::RemoveOutcome::Removed
    );
    assert_eq!(fx.sim.requests_to(Route::FmDetach).len(), 1);
    assert!(matches!(
        provider_error(fx.provider.check_resource(&gpu).await),
        ProviderError::NotFound(_)
    ));
}

#[tokio::test]
async fn python_provider_reports_typed_errors() {
    let fx = start(&[]).await;
    fx.add_node("worker-0", MACHINE);
    // An empty pool: the simulator's no-capacity code becomes the typed error.
    assert!(matches!(
        provider_error(fx.provider.add_resource(&fx.gpu("gpu-none", "worker-0")).await),
        ProviderError::NoCapacity(_)
    ));
    // A node that is not on the fabric.
    fx.cluster
        .insert_object(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "plain"}, "spec": {"providerID": "kind://docker/plain"}}))
        .unwrap();
    assert!(matches!(
        provider_error(fx.provider.add_resource(&fx.gpu("gpu-p", "plain")).await),
        ProviderError::NotFound(m) if m.contains("plain")
    ));

    // The Cluster Manager API is not implemented by this example: a typed config error.
    let cm = start(&[("api_type", "CM")]).await;
    assert!(matches!(
        provider_error(cm.provider.add_resource(&cm.gpu("gpu-cm", "worker-0")).await),
        ProviderError::Config(m) if m.contains("Fabric Manager")
    ));
}

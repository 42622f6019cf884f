//! The FTI fabric driver: `tests/fabric-sim` over HTTPS, Fabric Manager API, Nodes with
//! `spec.providerID: fsas-cdi://<machine>`, the credentials in the Secret the Go
//! operator used.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cro_runtime::DeviceType;
use cro_runtime::cluster::StaticCluster;
use fabric_sim::{FabricSim, Fault, Route, SimConfig};
use serde_json::{Value, json};

use crate::SuiteError;
use crate::fabric::{Fabric, FabricDevice, FabricKind, FaultKind, Op};

pub const SECRET_NAMESPACE: &str = "composable-resource-operator-system";
pub const SECRET_NAME: &str = "credentials";
/// The model the driver seeds when the provider names none.
pub const DEFAULT_MODEL: &str = "A100 40G";

pub struct FtiFabric {
    sim: FabricSim,
    cluster: StaticCluster,
    machines: AtomicU64,
}

impl FtiFabric {
    pub fn start() -> Result<FtiFabric, SuiteError> {
        let sim = FabricSim::start(SimConfig::default())
            .map_err(|e| SuiteError::Simulator(e.to_string()))?;
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
        Ok(FtiFabric {
            sim,
            cluster,
            machines: AtomicU64::new(1),
        })
    }

    pub fn sim(&self) -> &FabricSim {
        &self.sim
    }
}

fn route(op: Op) -> Option<Route> {
    match op {
        Op::Attach => Some(Route::FmAttach),
        Op::Detach => Some(Route::FmDetach),
        Op::First => None,
    }
}

impl Fabric for FtiFabric {
    fn kind(&self) -> FabricKind {
        FabricKind::Fti
    }

    fn config(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("api_type".to_string(), "FM".to_string()),
            ("endpoint".to_string(), self.sim.endpoint()),
            ("tenant_id".to_string(), self.sim.tenant_id().to_string()),
        ])
    }

    fn grants(&self) -> Value {
        json!({
            "http": [{"url": format!("https://{}", self.sim.https_addr()), "ca_pem": self.sim.ca_pem()}],
            "secret": {"namespace": SECRET_NAMESPACE, "name": SECRET_NAME,
                "keys": ["username", "password", "client_id", "client_secret", "realm"]},
            "lookup": [{"api_version": "v1", "kind": "Node"}],
            "wasi": {"clocks": true},
        })
    }

    fn cluster(&self) -> &StaticCluster {
        &self.cluster
    }

    fn add_node(&self, node: &str) -> String {
        let n = self.machines.fetch_add(1, Ordering::SeqCst);
        let machine = format!("0c0f0e0d-0000-4000-8000-{n:012x}");
        self.sim.add_machine(&machine, node);
        // The node object is ours and well-formed: inserting it cannot fail.
        let _ = self.cluster.insert_object(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node},
            "spec": {"providerID": format!("fsas-cdi://{machine}")},
        }));
        machine
    }

    fn add_free_devices(&self, device_type: DeviceType, model: Option<&str>, n: usize) -> String {
        let model = model.unwrap_or(DEFAULT_MODEL);
        let res_type = match device_type {
            DeviceType::Gpu => "gpu",
            DeviceType::CxlMemory => "cxlmemory",
        };
        self.sim.add_free_devices(res_type, model, n);
        model.to_string()
    }

    fn inject(&self, fault: FaultKind, op: Op) {
        let fault = match fault {
            FaultKind::ServerError => Fault::error(503, "E50300", "the fabric is busy"),
            FaultKind::MalformedBody => Fault::MalformedJson,
            FaultKind::LostRequest => Fault::Drop,
            FaultKind::LostReply => Fault::DropAfterProcessing,
            FaultKind::Slow(d) => Fault::Latency(d),
        };
        let injection = match route(op) {
            Some(r) => fault.on(r),
            None => fault.times(1),
        };
        self.sim.inject(injection);
    }

    fn clear_faults(&self) {
        self.sim.clear_faults();
    }

    fn attached(&self, machine: &str) -> Vec<FabricDevice> {
        self.sim
            .machine_devices(machine)
            .into_iter()
            .map(|d| FabricDevice {
                ids: vec![d.serial, d.res_uuid],
                ready: true,
            })
            .collect()
    }

    fn set_slow(&self, _delay: Option<Duration>) -> Result<(), String> {
        Err("the FTI Fabric Manager API attaches and detaches synchronously".into())
    }

    fn set_warning(&self, device_id: &str, warning: bool) -> Result<(), String> {
        self.sim
            .set_op_status(device_id, if warning { "1" } else { "0" })
            .map_err(|e| e.to_string())
    }
}

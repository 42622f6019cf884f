//! The Redfish fabric driver: `simulators/redfish` over HTTP, with the Redfish provider's
//! conventions (`docs/redfish-api.md`): config `endpoint`, Secret keys `username` and
//! `password`, Nodes with `spec.providerID: redfish://<system-id>`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cro_runtime::DeviceType;
use cro_runtime::cluster::StaticCluster;
use redfish_sim::{BlockKind, CompositionState, Fault, RedfishSim, Route, SimConfig};
use serde_json::{Value, json};

use crate::SuiteError;
use crate::fabric::{Fabric, FabricCall, FabricDevice, FabricKind, FaultKind, Op};

pub const SECRET_NAMESPACE: &str = "cro-system";
pub const SECRET_NAME: &str = "redfish-credentials";
pub const DEFAULT_GPU_MODEL: &str = "NVIDIA A100 80GB";
pub const DEFAULT_CXL_MODEL: &str = "CXL 256GiB";

pub struct RedfishFabric {
    sim: RedfishSim,
    cluster: StaticCluster,
    systems: AtomicU64,
}

impl RedfishFabric {
    pub fn start() -> Result<RedfishFabric, SuiteError> {
        let sim = RedfishSim::start(SimConfig::default())
            .map_err(|e| SuiteError::Simulator(e.to_string()))?;
        let (username, password) = sim.credentials();
        let cluster = StaticCluster::new().with_secret(
            SECRET_NAMESPACE,
            SECRET_NAME,
            [("username", username), ("password", password)],
        );
        Ok(RedfishFabric {
            sim,
            cluster,
            systems: AtomicU64::new(1),
        })
    }

    pub fn sim(&self) -> &RedfishSim {
        &self.sim
    }
}

impl Fabric for RedfishFabric {
    fn received(&self) -> Vec<FabricCall> {
        FabricCall::recorded(self.sim.requests(), |r| r == Some(&Route::SystemPatch))
    }

    fn broken(&self) -> Option<String> {
        // In-process: every step is a call on the simulator's handle.
        None
    }

    fn kind(&self) -> FabricKind {
        FabricKind::Redfish
    }

    fn config(&self) -> BTreeMap<String, String> {
        BTreeMap::from([("endpoint".to_string(), self.sim.endpoint())])
    }

    fn grants(&self) -> Value {
        json!({
            "http": [{"url": format!("http://{}", self.sim.addr())}],
            "secret": {"namespace": SECRET_NAMESPACE, "name": SECRET_NAME,
                "keys": ["username", "password"]},
            "lookup": [{"api_version": "v1", "kind": "Node"}],
            "wasi": {"clocks": true},
        })
    }

    fn cluster(&self) -> &StaticCluster {
        &self.cluster
    }

    fn add_node(&self, node: &str) -> String {
        let n = self.systems.fetch_add(1, Ordering::SeqCst);
        let system = format!("System-{n}");
        self.sim.add_system(&system);
        // The node object is ours and well-formed: inserting it cannot fail.
        let _ = self.cluster.insert_object(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node},
            "spec": {"providerID": format!("redfish://{system}")},
        }));
        system
    }

    fn add_free_devices(&self, device_type: DeviceType, model: Option<&str>, n: usize) -> String {
        let model = match (model, device_type) {
            (Some(m), _) => m,
            (None, DeviceType::Gpu) => DEFAULT_GPU_MODEL,
            (None, DeviceType::CxlMemory) => DEFAULT_CXL_MODEL,
        };
        for _ in 0..n {
            match device_type {
                DeviceType::Gpu => self.sim.add_gpu_block(model),
                DeviceType::CxlMemory => self.sim.add_cxl_block(model),
            };
        }
        model.to_string()
    }

    fn inject(&self, fault: FaultKind, op: Op) {
        let fault = match fault {
            FaultKind::ServerError => Fault::error(
                503,
                "Base.1.8.ServiceTemporarilyUnavailable",
                "the service is busy",
            ),
            FaultKind::MalformedBody => Fault::MalformedJson,
            FaultKind::LostRequest => Fault::Drop,
            FaultKind::LostReply => Fault::DropAfterProcessing,
            FaultKind::Slow(d) => Fault::Latency(d),
        };
        let injection = match op {
            Op::Attach | Op::Detach => fault.on(Route::SystemPatch),
            Op::First => fault.times(1),
        };
        self.sim.inject(injection);
    }

    fn clear_faults(&self) {
        self.sim.clear_faults();
    }

    fn attached(&self, machine: &str) -> Vec<FabricDevice> {
        let Some(system) = self.sim.system(machine) else {
            return Vec::new();
        };
        system
            .blocks
            .iter()
            .filter_map(|id| self.sim.block(id))
            .filter(|b| b.kind != redfish_sim::BlockKind::Compute)
            .map(|b| FabricDevice {
                ready: b.state == CompositionState::Composed,
                ids: vec![b.id, b.serial, b.uuid],
            })
            .collect()
    }

    fn set_slow(&self, delay: Option<Duration>) -> Result<(), String> {
        self.sim.set_compose_delay(delay.unwrap_or(Duration::ZERO));
        Ok(())
    }

    fn free(&self, device_type: DeviceType, model: &str) -> Result<u32, String> {
        let kind = match device_type {
            DeviceType::Gpu => BlockKind::Gpu,
            DeviceType::CxlMemory => BlockKind::CxlMemory,
        };
        let n = self
            .sim
            .blocks()
            .iter()
            .filter(|b| b.kind == kind && b.model == model && b.state == CompositionState::Unused)
            .count();
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    fn set_warning(&self, device_id: &str, warning: bool) -> Result<(), String> {
        let health = if warning { "Warning" } else { "OK" };
        // The provider may report the block's id, serial or uuid.
        let systems = self.systems.load(Ordering::SeqCst);
        let block = (1..systems)
            .filter_map(|n| self.sim.system(&format!("System-{n}")))
            .flat_map(|s| s.blocks)
            .filter_map(|id| self.sim.block(&id))
            .find(|b| b.id == device_id || b.serial == device_id || b.uuid == device_id)
            .map(|b| b.id)
            .ok_or_else(|| format!("no resource block {device_id} is composed"))?;
        self.sim
            .set_health(&block, health)
            .map_err(|e| e.to_string())
    }
}

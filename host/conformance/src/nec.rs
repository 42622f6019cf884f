//! The NEC CDIM fabric driver: `simulators/cdim` over HTTP, with the NEC provider's
//! conventions (docs/nec-provider.md): config `configuration_manager_endpoint` and
//! `layout_apply_endpoint`, no Secret, Nodes whose `spec.providerID` is their CDIM node
//! id verbatim (as the Go operator's NEC client reads them). Attaches and detaches are
//! asynchronous layout applies, which this fabric can also make fail or roll back.

use std::collections::BTreeMap;
use std::time::Duration;

use cdim_sim::{CdimSim, Fault, Route, SimConfig};
use cro_runtime::DeviceType;
use cro_runtime::cluster::StaticCluster;
use serde_json::{Value, json};

use crate::SuiteError;
use crate::fabric::{Fabric, FabricCall, FabricDevice, FabricKind, FaultKind, Op};

/// The model the driver seeds when the provider names none.
pub const DEFAULT_MODEL: &str = "NVIDIA-A100-PCIE-40GB";
/// How long a layout apply takes unless made slow: asynchronous, as CDIM's are.
const APPLY_DELAY: Duration = Duration::from_millis(100);

pub struct NecFabric {
    sim: CdimSim,
    cluster: StaticCluster,
}

impl NecFabric {
    pub fn start() -> Result<NecFabric, SuiteError> {
        let sim = CdimSim::start(SimConfig {
            apply_delay: APPLY_DELAY,
            ..SimConfig::default()
        })
        .map_err(|e| SuiteError::Simulator(e.to_string()))?;
        Ok(NecFabric {
            sim,
            cluster: StaticCluster::new(),
        })
    }

    pub fn sim(&self) -> &CdimSim {
        &self.sim
    }

    /// The GPU a provider's id names: its CDIM device id, or (a provider reporting the
    /// Go operator's provisional UUID for every GPU) the only GPU connected.
    fn gpu_named(&self, device_id: &str) -> Result<String, String> {
        if self.sim.gpu(device_id).is_some() {
            return Ok(device_id.to_string());
        }
        let connected: Vec<String> = self
            .sim
            .gpus()
            .into_iter()
            .filter(|g| g.node.is_some())
            .map(|g| g.id)
            .collect();
        match connected.as_slice() {
            [only] => Ok(only.clone()),
            _ => Err(format!(
                "no GPU {device_id}, and {} GPUs are connected",
                connected.len()
            )),
        }
    }
}

impl Fabric for NecFabric {
    fn received(&self) -> Vec<FabricCall> {
        FabricCall::recorded(self.sim.requests(), |r| r == Some(&Route::LayoutApply))
    }

    fn broken(&self) -> Option<String> {
        // In-process: every step is a call on the simulator's handle.
        None
    }

    fn kind(&self) -> FabricKind {
        FabricKind::Nec
    }

    fn config(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (
                "configuration_manager_endpoint".to_string(),
                self.sim.configuration_manager_url(),
            ),
            (
                "layout_apply_endpoint".to_string(),
                self.sim.layout_apply_url(),
            ),
        ])
    }

    fn grants(&self) -> Value {
        json!({
            "http": [
                {"url": self.sim.configuration_manager_url()},
                {"url": self.sim.layout_apply_url()},
            ],
            "lookup": [{"api_version": "v1", "kind": "Node"}],
        })
    }

    fn cluster(&self) -> &StaticCluster {
        &self.cluster
    }

    fn add_node(&self, node: &str) -> String {
        let n = self.sim.add_node();
        // The node object is ours and well-formed: inserting it cannot fail.
        let _ = self.cluster.insert_object(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node},
            "spec": {"providerID": n.id},
        }));
        n.id
    }

    fn add_free_devices(&self, _device_type: DeviceType, model: Option<&str>, n: usize) -> String {
        // CDIM's pool as the Go client uses it holds GPUs; the provider declares no
        // other kind, so the suite asks for GPUs.
        let model = model.unwrap_or(DEFAULT_MODEL);
        for _ in 0..n {
            self.sim.add_gpu(model);
        }
        model.to_string()
    }

    fn inject(&self, fault: FaultKind, op: Op) {
        let fault = match fault {
            FaultKind::ServerError => Fault::error(503, "E50003", "the service is busy"),
            FaultKind::MalformedBody => Fault::MalformedJson,
            FaultKind::LostRequest => Fault::Drop,
            FaultKind::LostReply => Fault::DropAfterProcessing,
            FaultKind::Slow(d) => Fault::Latency(d),
        };
        self.sim.inject(match op {
            Op::Attach | Op::Detach => fault.on(Route::LayoutApply),
            Op::First => fault.times(1),
        });
    }

    fn clear_faults(&self) {
        self.sim.clear_faults();
    }

    fn attached(&self, machine: &str) -> Vec<FabricDevice> {
        // A GPU shows on a node once its layout apply has completed.
        self.sim
            .gpus_on(machine)
            .into_iter()
            .map(|g| FabricDevice {
                ids: vec![g.id],
                ready: true,
            })
            .collect()
    }

    fn set_slow(&self, delay: Option<Duration>) -> Result<(), String> {
        self.sim.set_apply_delay(delay.unwrap_or(APPLY_DELAY));
        Ok(())
    }

    fn free(&self, device_type: DeviceType, model: &str) -> Result<u32, String> {
        if device_type != DeviceType::Gpu {
            return Ok(0);
        }
        let n = self
            .sim
            .gpus()
            .iter()
            .filter(|g| g.node.is_none() && g.model == model && g.health == "OK")
            .count();
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    fn set_warning(&self, device_id: &str, warning: bool) -> Result<(), String> {
        let gpu = self.gpu_named(device_id)?;
        self.sim
            .set_health(&gpu, if warning { "Warning" } else { "OK" })
            .map_err(|e| e.to_string())
    }

    fn fails_jobs(&self) -> bool {
        true
    }

    fn fail_next_job(&self, rollback: bool) -> Result<(), String> {
        let fault = if rollback {
            Fault::ApplyRollsBack
        } else {
            Fault::ApplyFails("the I/O slot did not power on".into())
        };
        self.sim.inject(fault.on(Route::LayoutApply));
        Ok(())
    }
}

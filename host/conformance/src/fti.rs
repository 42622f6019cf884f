//! The FTI fabric driver: `simulators/fti` over HTTPS with the credentials in the
//! Secret the Go operator used. Two APIs (docs/fti-fabric-api.md):
//! - the Fabric Manager ([`FtiApi::Fm`]): synchronous attach and detach; Nodes with
//!   `spec.providerID: fsas-cdi://<machine>`;
//! - the Cluster Manager ([`FtiApi::Cm`], for a provider that declares the config key
//!   `cluster_id`): asynchronous resizes; Nodes linked to their machine through an
//!   OpenShift Machine and a Metal3 BareMetalHost, as the FTI provider reads them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cro_runtime::DeviceType;
use cro_runtime::cluster::StaticCluster;
use fabric_sim::{DeviceStatus, FabricSim, Fault, Route, SimConfig};
use serde_json::{Value, json};

use crate::SuiteError;
use crate::fabric::{Fabric, FabricCall, FabricDevice, FabricKind, FaultKind, Op};

pub const SECRET_NAMESPACE: &str = "composable-resource-operator-system";
pub const SECRET_NAME: &str = "credentials";
/// The model the driver seeds when the provider names none.
pub const DEFAULT_MODEL: &str = "A100 40G";

/// Which FTI API the provider is configured for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FtiApi {
    Fm,
    Cm,
}

impl FtiApi {
    /// `fm` or `cm` (any case), as `--fti-api` and FTI's own `api_type` spell them.
    pub fn parse(s: &str) -> Option<FtiApi> {
        match s.to_ascii_lowercase().as_str() {
            "fm" => Some(FtiApi::Fm),
            "cm" => Some(FtiApi::Cm),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FtiApi::Fm => "fm",
            FtiApi::Cm => "cm",
        }
    }
}

/// Where OpenShift keeps Machines and BareMetalHosts.
const MACHINE_API_NAMESPACE: &str = "openshift-machine-api";
/// How long a Cluster Manager resize takes unless made slow.
const CM_DELAY: Duration = Duration::from_millis(100);

pub struct FtiFabric {
    api: FtiApi,
    sim: FabricSim,
    cluster: StaticCluster,
    machines: AtomicU64,
}

impl FtiFabric {
    pub fn start(api: FtiApi) -> Result<FtiFabric, SuiteError> {
        let sim = FabricSim::start(SimConfig::default().with_cm_delay(CM_DELAY))
            .map_err(|e| SuiteError::Simulator(e.to_string()))?;
        let cluster =
            StaticCluster::new().with_secret(SECRET_NAMESPACE, SECRET_NAME, sim.secret_data());
        Ok(FtiFabric {
            api,
            sim,
            cluster,
            machines: AtomicU64::new(1),
        })
    }

    pub fn sim(&self) -> &FabricSim {
        &self.sim
    }
}

fn route(api: FtiApi, op: Op) -> Option<Route> {
    match (api, op) {
        (FtiApi::Fm, Op::Attach) => Some(Route::FmAttach),
        (FtiApi::Fm, Op::Detach) => Some(Route::FmDetach),
        (FtiApi::Cm, Op::Attach | Op::Detach) => Some(Route::CmResize),
        (_, Op::First) => None,
    }
}

impl Fabric for FtiFabric {
    fn received(&self) -> Vec<FabricCall> {
        FabricCall::recorded(self.sim.requests(), |r| {
            matches!(r, Some(Route::FmAttach | Route::FmDetach | Route::CmResize))
        })
    }

    fn broken(&self) -> Option<String> {
        // In-process: every step is a call on the simulator's handle.
        None
    }

    fn kind(&self) -> FabricKind {
        FabricKind::Fti
    }

    fn config(&self) -> BTreeMap<String, String> {
        let mut config = BTreeMap::from([
            ("endpoint".to_string(), self.sim.endpoint()),
            ("tenant_id".to_string(), self.sim.tenant_id().to_string()),
        ]);
        match self.api {
            FtiApi::Fm => {
                config.insert("api_type".into(), "FM".into());
            }
            FtiApi::Cm => {
                config.insert("api_type".into(), "CM".into());
                config.insert("cluster_id".into(), self.sim.cluster_id().to_string());
            }
        }
        config
    }

    fn grants(&self) -> Value {
        json!({
            "http": [{"url": format!("https://{}", self.sim.https_addr()), "ca_pem": self.sim.ca_pem()}],
            "secret": {"namespace": SECRET_NAMESPACE, "name": SECRET_NAME,
                "keys": ["username", "password", "client_id", "client_secret", "realm"]},
            "lookup": match self.api {
                FtiApi::Fm => json!([{"api_version": "v1", "kind": "Node"}]),
                FtiApi::Cm => json!([
                    {"api_version": "v1", "kind": "Node"},
                    {"api_version": "machine.openshift.io/v1beta1", "kind": "Machine"},
                    {"api_version": "metal3.io/v1alpha1", "kind": "BareMetalHost"},
                ]),
            },
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
        // The objects are ours and well-formed: inserting them cannot fail.
        match self.api {
            FtiApi::Fm => {
                let _ = self.cluster.insert_object(json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": node},
                    "spec": {"providerID": format!("fsas-cdi://{machine}")},
                }));
            }
            FtiApi::Cm => {
                let (m, bmh) = (format!("{node}-machine"), format!("{node}-bmh"));
                let ns = MACHINE_API_NAMESPACE;
                for object in [
                    json!({"apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": node, "annotations": {
                            "machine.openshift.io/machine": format!("{ns}/{m}")}}}),
                    json!({"apiVersion": "machine.openshift.io/v1beta1", "kind": "Machine",
                        "metadata": {"name": m, "namespace": ns, "annotations": {
                            "metal3.io/BareMetalHost": format!("{ns}/{bmh}")}}}),
                    json!({"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
                        "metadata": {"name": bmh, "namespace": ns, "annotations": {
                            "cluster-manager.cdi.io/machine": machine}}}),
                ] {
                    let _ = self.cluster.insert_object(object);
                }
            }
        }
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
        let injection = match route(self.api, op) {
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
                ready: d.status == DeviceStatus::AddComplete,
                ids: vec![d.serial, d.res_uuid],
            })
            .collect()
    }

    fn set_slow(&self, delay: Option<Duration>) -> Result<(), String> {
        match self.api {
            FtiApi::Fm => {
                Err("the FTI Fabric Manager API attaches and detaches synchronously".into())
            }
            FtiApi::Cm => {
                self.sim.set_cm_delay(delay.unwrap_or(CM_DELAY));
                Ok(())
            }
        }
    }

    fn free(&self, device_type: DeviceType, model: &str) -> Result<u32, String> {
        let res_type = match device_type {
            DeviceType::Gpu => "gpu",
            DeviceType::CxlMemory => "cxlmemory",
        };
        Ok(u32::try_from(self.sim.free_devices(res_type, model)).unwrap_or(u32::MAX))
    }

    fn set_warning(&self, device_id: &str, warning: bool) -> Result<(), String> {
        self.sim
            .set_op_status(device_id, if warning { "1" } else { "0" })
            .map_err(|e| e.to_string())
    }
}

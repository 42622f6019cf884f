//! The fabrics the suite can run a provider against: one trait, one simulator driver
//! each ([`crate::fti`], [`crate::redfish`]), and the choice of fabric from what a
//! provider declares.

use std::collections::BTreeMap;
use std::time::Duration;

use cro_runtime::cluster::StaticCluster;
use cro_runtime::{AttachedDevice, DeviceType, ProviderInfo};
use serde_json::Value;

/// The simulated fabrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FabricKind {
    /// The Fujitsu FTI fabric (`simulators/fti`), the reference fabric; Fabric
    /// Manager API.
    Fti,
    /// A DMTF Redfish composition service (`simulators/redfish`).
    Redfish,
    /// NEC CDI Manager (`simulators/cdim`): asynchronous layout applies.
    Nec,
    /// Any fabric, simulated elsewhere and reached over the control protocol
    /// (`--fabric-sim`, [`crate::control`]).
    Remote,
}

impl FabricKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FabricKind::Fti => "fti",
            FabricKind::Redfish => "redfish",
            FabricKind::Nec => "nec",
            FabricKind::Remote => "remote",
        }
    }

    pub fn parse(s: &str) -> Option<FabricKind> {
        match s.to_ascii_lowercase().as_str() {
            "fti" => Some(FabricKind::Fti),
            "redfish" => Some(FabricKind::Redfish),
            "nec" | "cdim" => Some(FabricKind::Nec),
            _ => None,
        }
    }

    /// The fabric a provider talks to, from what it declares: its HTTP patterns
    /// (Redfish's `/redfish/v1`, FTI's `fabric_manager`/`cluster_manager` paths), its
    /// configuration keys (FTI's `tenant_id`/`api_type`), then its name and vendor.
    pub fn from_info(info: &ProviderInfo) -> Option<FabricKind> {
        let http = info.capabilities.http.join(" ").to_ascii_lowercase();
        if http.contains("/redfish") {
            return Some(FabricKind::Redfish);
        }
        if http.contains("/cdim/api") {
            return Some(FabricKind::Nec);
        }
        if http.contains("fabric_manager") || http.contains("cluster_manager") {
            return Some(FabricKind::Fti);
        }
        let keys: Vec<&str> = info.config.iter().map(|k| k.name.as_str()).collect();
        if keys.contains(&"tenant_id") || keys.contains(&"api_type") {
            return Some(FabricKind::Fti);
        }
        let who = format!("{} {}", info.name, info.vendor).to_ascii_lowercase();
        if who.contains("redfish") || who.contains("dmtf") {
            return Some(FabricKind::Redfish);
        }
        if who.contains("fti") || who.contains("fujitsu") {
            return Some(FabricKind::Fti);
        }
        None
    }
}

/// The fabric operation a fault is injected on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// The request that attaches (FTI: the machine update PATCH; Redfish: the system
    /// PATCH).
    Attach,
    /// The request that detaches.
    Detach,
    /// The first request of the next call, whatever it is (a read for `check`).
    First,
}

/// What goes wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// A 5xx error reply (the state is untouched).
    ServerError,
    /// The reply's JSON body is cut in half.
    MalformedBody,
    /// The connection closes without a reply, before the fabric acts.
    LostRequest,
    /// The fabric acts, then the connection closes without a reply.
    LostReply,
    /// The reply comes this late.
    Slow(Duration),
}

impl FaultKind {
    pub fn describe(self) -> String {
        match self {
            FaultKind::ServerError => "a 503 reply".into(),
            FaultKind::MalformedBody => "a malformed JSON body".into(),
            FaultKind::LostRequest => "a dropped connection".into(),
            FaultKind::LostReply => "a lost reply (the fabric acted)".into(),
            FaultKind::Slow(d) => format!("a reply {} ms late", d.as_millis()),
        }
    }
}

/// A device the fabric holds on a machine, by every id a provider may report for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricDevice {
    pub ids: Vec<String>,
    /// Attached and usable (not still being composed).
    pub ready: bool,
}

impl FabricDevice {
    /// Whether the provider's report names this device.
    pub fn is(&self, d: &AttachedDevice) -> bool {
        self.ids
            .iter()
            .any(|id| *id == d.device_id || *id == d.fabric_device_id)
    }

    pub fn named(&self, device_id: &str) -> bool {
        self.ids.iter().any(|id| id == device_id)
    }
}

/// One request the fabric received (on its own API, not the control protocol).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricCall {
    /// Arrival order.
    pub seq: u64,
    pub method: String,
    pub path: String,
    /// Whether it asks the fabric to attach or detach (to change what it holds).
    pub changes: bool,
}

impl FabricCall {
    /// The calls an in-process simulator recorded; `changes`: whether a request's
    /// route attaches or detaches.
    pub(crate) fn recorded<R>(
        requests: Vec<sim_kit::RecordedRequest<R>>,
        changes: impl Fn(Option<&R>) -> bool,
    ) -> Vec<FabricCall> {
        requests
            .into_iter()
            .map(|r| FabricCall {
                seq: r.seq,
                changes: changes(r.route.as_ref()),
                method: r.method,
                path: r.path,
            })
            .collect()
    }
}

/// One simulated fabric, started for one suite run.
pub trait Fabric: Send + Sync {
    fn kind(&self) -> FabricKind;
    /// The provider configuration that points at this fabric.
    fn config(&self) -> BTreeMap<String, String>;
    /// The grants (`grants:` of a provider spec, as JSON) a provider of this fabric needs.
    fn grants(&self) -> Value;
    /// The cluster the provider sees: its Secret, and the Nodes [`Fabric::add_node`] adds.
    fn cluster(&self) -> &StaticCluster;
    /// A machine of the fabric and the Node of it; returns the machine id.
    fn add_node(&self, node: &str) -> String;
    /// `n` free devices of a type; returns their model (`model` when given).
    fn add_free_devices(&self, device_type: DeviceType, model: Option<&str>, n: usize) -> String;
    /// The fault on the next matching request.
    fn inject(&self, fault: FaultKind, op: Op);
    fn clear_faults(&self);
    /// What the fabric has attached to the machine.
    fn attached(&self, machine: &str) -> Vec<FabricDevice>;
    /// Makes later attaches and detaches take `delay` (asynchronous), or says why this
    /// fabric cannot.
    fn set_slow(&self, delay: Option<Duration>) -> Result<(), String>;
    /// Puts the device's health to warning (`true`) or back to OK.
    fn set_warning(&self, device_id: &str, warning: bool) -> Result<(), String>;
    /// How many devices of the type and model are free (an attach could take them
    /// now), or why this fabric cannot say: the oracle of the pool checks.
    fn free(&self, device_type: DeviceType, model: &str) -> Result<u32, String>;
    /// Whether [`Fabric::fail_next_job`] works here: attaches are jobs it can fail.
    fn fails_jobs(&self) -> bool {
        false
    }
    /// Makes the next attach job the fabric accepts end in failure, or (`rollback`) be
    /// rolled back after acting; or says why this fabric cannot. The suite runs its
    /// job checks only against fabrics that can.
    fn fail_next_job(&self, rollback: bool) -> Result<(), String> {
        let _ = rollback;
        Err(format!(
            "the {} driver cannot make an attach job fail",
            self.kind().as_str()
        ))
    }
    /// Every request the fabric received since it started, in order.
    fn received(&self) -> Vec<FabricCall>;
    /// Why the fabric can no longer be driven (a control call to a simulator elsewhere
    /// failed), if it cannot: the suite stops rather than judge by an oracle it could
    /// not read.
    fn broken(&self) -> Option<String>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use cro_runtime::domain::{ConfigKey, WantedCapabilities};

    fn info(name: &str, vendor: &str, http: &[&str], config: &[&str]) -> ProviderInfo {
        ProviderInfo {
            name: name.into(),
            vendor: vendor.into(),
            version: "1".into(),
            devices: Vec::new(),
            capabilities: WantedCapabilities {
                http: http.iter().map(|h| h.to_string()).collect(),
                ..WantedCapabilities::default()
            },
            config: config
                .iter()
                .map(|k| ConfigKey {
                    name: k.to_string(),
                    required: true,
                    description: String::new(),
                })
                .collect(),
        }
    }

    #[test]
    fn the_fabric_comes_from_what_a_provider_declares() {
        let redfish = info("x", "y", &["${endpoint}/redfish/v1/*"], &["endpoint"]);
        assert_eq!(FabricKind::from_info(&redfish), Some(FabricKind::Redfish));
        let fm = info("x", "y", &["https://f:1/fabric_manager/api"], &[]);
        assert_eq!(FabricKind::from_info(&fm), Some(FabricKind::Fti));
        let keys = info("acme", "Acme", &["${endpoint}"], &["endpoint", "tenant_id"]);
        assert_eq!(FabricKind::from_info(&keys), Some(FabricKind::Fti));
        let named = info("redfish", "DMTF Redfish", &["${endpoint}"], &["endpoint"]);
        assert_eq!(FabricKind::from_info(&named), Some(FabricKind::Redfish));
        let unknown = info("acme", "Acme", &["${endpoint}"], &["endpoint"]);
        assert_eq!(FabricKind::from_info(&unknown), None);
        assert_eq!(FabricKind::parse("Redfish"), Some(FabricKind::Redfish));
        assert_eq!(FabricKind::parse("sunfish"), None);
        let nec = info(
            "x",
            "y",
            &["${configuration_manager_endpoint}/cdim/api/v1/*"],
            &["configuration_manager_endpoint"],
        );
        assert_eq!(FabricKind::from_info(&nec), Some(FabricKind::Nec));
        assert_eq!(FabricKind::parse("NEC"), Some(FabricKind::Nec));
    }
}

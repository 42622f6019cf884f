//! The messages of `cro-fabric-sim/1`. Every path is relative to the base URL a
//! simulator is given as (`--fabric-sim http://127.0.0.1:9400/sim/`); every body is JSON.
//!
//! | call | body | reply |
//! |---|---|---|
//! | `GET` (the base) | | [`Hello`] |
//! | `POST reset` | | 204: no machines, devices or faults |
//! | `POST machines` | [`AddMachine`] | [`MachineAdded`] |
//! | `POST devices` | [`AddDevices`] | [`DevicesAdded`] |
//! | `POST faults` | [`InjectFault`] | 204 |
//! | `DELETE faults` | | 204 |
//! | `GET machines/{machine}/devices` | | [`Held`] (the oracle) |
//! | `PUT slow` | [`SetSlow`] | 204, or 501 [`Refusal`] |
//! | `PUT health` | [`SetHealth`] | 204, or 404 / 501 [`Refusal`] |
//! | `POST jobs/fail-next` | [`FailJob`] | 204, or 501 [`Refusal`] |
//! | `GET requests` | | [`Received`] (the oracle of calls) |
//! | `GET free?type={type}&model={model}` | | [`FreeCount`] (the pool's oracle), or 501 [`Refusal`] |
//!
//! Any other status is an error of the simulator; the suite stops and names it.

use std::collections::BTreeMap;

use cro_runtime::DeviceType;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a simulator is and how a provider reaches it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// [`super::PROTOCOL`]; a client refuses another.
    pub protocol: String,
    /// The fabric's name, for the report (`acme-rest`, `fti`).
    pub fabric: String,
    /// The provider configuration that points at this fabric (`endpoint` and the rest).
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// The grants a provider of this fabric needs, as a provider spec's `grants:`.
    #[serde(default)]
    pub grants: Value,
    /// The Secret the provider reads its credentials from, if any.
    #[serde(default)]
    pub secret: Option<SecretData>,
    /// Whether `jobs/fail-next` works: attaches are jobs the fabric can fail.
    #[serde(default)]
    pub jobs: bool,
}

/// A Secret's namespace, name and (text) data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretData {
    pub namespace: String,
    pub name: String,
    pub data: BTreeMap<String, String>,
}

/// A machine of the fabric for Kubernetes node `node`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddMachine {
    pub node: String,
}

/// The machine's id, and the Kubernetes objects that map the node to it (the Node, with
/// whatever labels or `spec.providerID` the provider reads; more when it reads more).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineAdded {
    pub machine: String,
    pub objects: Vec<Value>,
}

/// `count` free devices of a type; the simulator picks the model when none is given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddDevices {
    #[serde(rename = "type")]
    pub device_type: DeviceType,
    #[serde(default)]
    pub model: Option<String>,
    pub count: usize,
}

/// How many devices of the asked type and model are free: an attach could take them
/// now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeCount {
    pub count: u32,
}

/// The query of `GET free`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeQuery {
    #[serde(rename = "type")]
    pub device_type: DeviceType,
    pub model: String,
}

/// The model of the devices added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevicesAdded {
    pub model: String,
}

/// Which request the fault hits: the next one of the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultOp {
    /// The request that attaches a device.
    Attach,
    /// The request that detaches one.
    Detach,
    /// The next request, whatever it is.
    Any,
}

/// What goes wrong with that request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKindWire {
    /// A 503 reply with an error body; the fabric does nothing.
    ServerError,
    /// A 200 reply whose JSON body is cut in half; the fabric does nothing.
    MalformedBody,
    /// The connection closes before the fabric acts.
    LostRequest,
    /// The fabric acts, then the connection closes without a reply.
    LostReply,
    /// The reply comes `delay_ms` late.
    Slow,
}

/// A fault on the next request of `op`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InjectFault {
    pub op: FaultOp,
    pub kind: FaultKindWire,
    /// For `slow`: how late.
    #[serde(default)]
    pub delay_ms: Option<u64>,
}

/// What the fabric has attached to a machine: the truth the suite checks a provider's
/// word against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    pub devices: Vec<HeldDevice>,
}

/// One attached device, by every id a provider may report for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldDevice {
    pub ids: Vec<String>,
    /// Attached and usable (not still being composed).
    pub ready: bool,
}

/// Later attaches and detaches take `delay_ms` (the fabric answers "in progress" until
/// then); `null` makes them immediate again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetSlow {
    pub delay_ms: Option<u64>,
}

/// A device's health as the fabric reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    Ok,
    Warning,
}

/// Sets the health of the attached device with id `device` (any of its ids).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetHealth {
    pub device: String,
    pub health: Health,
}

/// The next attach job fails (`rollback`: is rolled back after acting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailJob {
    pub rollback: bool,
}

/// Every request the fabric API received since the reset, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Received {
    pub requests: Vec<ReceivedRequest>,
}

/// One request to the fabric API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceivedRequest {
    /// Arrival order, increasing.
    pub seq: u64,
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// Whether it asks the fabric to attach or detach.
    pub changes: bool,
}

/// Why a simulator cannot do what it was asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn messages_read_as_the_protocol_document_writes_them() {
        let f: InjectFault =
            serde_json::from_value(json!({"op": "attach", "kind": "lost-reply"})).unwrap();
        assert_eq!(
            (f.op, f.kind, f.delay_ms),
            (FaultOp::Attach, FaultKindWire::LostReply, None)
        );
        let d: AddDevices =
            serde_json::from_value(json!({"type": "cxlmemory", "count": 2})).unwrap();
        assert_eq!(d.device_type, DeviceType::CxlMemory);
        let h: SetHealth =
            serde_json::from_value(json!({"device": "g1", "health": "warning"})).unwrap();
        assert_eq!(h.health, Health::Warning);
        // Unknown values fail loudly rather than mean something else.
        assert!(
            serde_json::from_value::<InjectFault>(json!({"op": "attach", "kind": "boom"})).is_err()
        );
        assert!(
            serde_json::from_value::<SetHealth>(json!({"device": "g", "health": "meh"})).is_err()
        );
    }
}

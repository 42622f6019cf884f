//! Host-side types of the provider operations. They mirror the WIT records but belong to
//! the host, so the operator does not depend on one contract version's bindings.

use serde::{Deserialize, Serialize};

/// The kind of composable device (`spec.resource.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceType {
    Gpu,
    #[serde(rename = "cxlmemory")]
    CxlMemory,
}

/// One device as the operator sees it: a ComposableResource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComposableResource {
    /// The ComposableResource's name, stable for the device's life.
    pub name: String,
    pub device_type: DeviceType,
    /// The vendor's model name, e.g. `NVIDIA-A100-PCIE-40GB`.
    pub model: String,
    /// The node the device is (to be) attached to.
    pub target_node: String,
    /// The device's serial / GPU UUID once attached.
    pub device_id: Option<String>,
    /// The fabric's own id of the device.
    pub fabric_device_id: Option<String>,
    /// The fabric-side machine the device was attached to, when recorded (lets a
    /// provider detach without looking the Node up; 0.2.0 and later).
    #[serde(default)]
    pub machine_id: Option<String>,
    pub force_detach: bool,
}

/// A device some ComposableResource already holds: what the cluster knows, so a
/// provider can tell its own device from another's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// The ComposableResource's name.
    pub resource: String,
    pub device_id: Option<String>,
    pub fabric_device_id: Option<String>,
}

/// Everything an attach needs. Contract 0.1.0 providers see `resource` only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddRequest {
    pub resource: ComposableResource,
    /// The same for every retry of one attach of this resource, different for a new
    /// attach (the operator keeps it in an annotation).
    pub attempt_key: String,
    /// Bytes of memory wanted, for a CXL memory request.
    pub size_bytes: Option<u64>,
    /// Devices already held by ComposableResources.
    pub claims: Vec<Claim>,
}

impl AddRequest {
    /// An attach of `resource` knowing no claims, with the resource's name as the
    /// attempt key (one attempt per resource).
    pub fn new(resource: ComposableResource) -> AddRequest {
        AddRequest {
            attempt_key: resource.name.clone(),
            resource,
            size_bytes: None,
            claims: Vec::new(),
        }
    }
}

/// The ids of an attached device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachedDevice {
    pub device_id: String,
    pub fabric_device_id: String,
    /// The fabric-side machine the device is attached to, when the provider says
    /// (0.2.0 and later).
    #[serde(default)]
    pub machine_id: Option<String>,
}

/// Outcome of an attach that did not fail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AddOutcome {
    Attached(AttachedDevice),
    /// Accepted but not finished; call again later. Says what is awaited.
    InProgress(String),
}

/// Outcome of a detach that did not fail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RemoveOutcome {
    Removed,
    InProgress(String),
}

/// A device the fabric reports attached to one of the cluster's machines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub node: String,
    pub machine_id: String,
    pub device_type: DeviceType,
    pub model: String,
    pub device_id: String,
    pub fabric_device_id: String,
}

/// An error reply of the vendor's API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricError {
    pub status: u16,
    /// The vendor's error code; empty when the reply had none.
    pub code: String,
    pub message: String,
}

/// Why a provider operation failed, as the provider reported it (mirrors the WIT
/// `provider-error`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ProviderError {
    #[error("fabric error (HTTP {}{}): {}", .0.status, if .0.code.is_empty() { String::new() } else { format!(", {}", .0.code) }, .0.message)]
    Fabric(FabricError),
    #[error("malformed fabric reply: {0}")]
    MalformedReply(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("device warning: {0}")]
    Warning(String),
    #[error("device critical: {0}")]
    Critical(String),
    #[error("capability denied: {0}")]
    Denied(String),
    #[error("provider configuration: {0}")]
    Config(String),
    #[error("fabric unavailable: {0}")]
    Unavailable(String),
    #[error("no capacity: {0}")]
    NoCapacity(String),
    #[error("{0}")]
    Other(String),
}

/// Devices of one kind a provider handles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceKind {
    pub device_type: DeviceType,
    /// Model names; empty means any.
    pub models: Vec<String>,
}

/// A kind of cluster object a provider reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LookupKind {
    pub api_version: String,
    pub kind: String,
    /// Needed only when this configuration key is set; `None`: always.
    #[serde(default)]
    pub when_config: Option<String>,
}

/// The capabilities a provider says it needs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WantedCapabilities {
    /// Origins (`https://host:port`) or `${key}`: the origin of configuration key `key`.
    pub http: Vec<String>,
    pub secret_keys: Vec<String>,
    pub lookup: Vec<LookupKind>,
    pub clocks: bool,
}

/// One configuration key a provider accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigKey {
    pub name: String,
    pub required: bool,
    pub description: String,
}

/// What a provider says it is and needs (`describe`, 0.2.0 and later).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderInfo {
    pub name: String,
    pub vendor: String,
    pub version: String,
    pub devices: Vec<DeviceKind>,
    pub capabilities: WantedCapabilities,
    pub config: Vec<ConfigKey>,
}

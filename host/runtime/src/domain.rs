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
    pub force_detach: bool,
}

/// The ids of an attached device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachedDevice {
    pub device_id: String,
    pub fabric_device_id: String,
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

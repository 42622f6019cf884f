//! Domain types of the provider contract, mirroring the WIT `types` interface so the
//! vendor logic compiles and tests natively; the component wrapper converts them 1:1.

use std::fmt;

/// The kind of composable device (`spec.resource.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceType {
    Gpu,
    Cxlmemory,
}

impl DeviceType {
    /// The fabric's `res_type` / spec `type` string for this kind.
    pub fn as_fabric_str(self) -> &'static str {
        match self {
            DeviceType::Gpu => "gpu",
            DeviceType::Cxlmemory => "cxlmemory",
        }
    }

    /// Parses the fabric's type string; `None` for kinds the operator does not manage.
    pub fn from_fabric_str(s: &str) -> Option<Self> {
        if s.eq_ignore_ascii_case("gpu") {
            Some(DeviceType::Gpu)
        } else if s.eq_ignore_ascii_case("cxlmemory") {
            Some(DeviceType::Cxlmemory)
        } else {
            None
        }
    }
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_fabric_str())
    }
}

/// One device as the operator sees it: a ComposableResource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComposableResource {
    pub name: String,
    pub device_type: DeviceType,
    pub model: String,
    pub target_node: String,
    pub device_id: Option<String>,
    pub fabric_device_id: Option<String>,
    pub force_detach: bool,
}

/// A device the fabric reports as attached to one of the cluster's machines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub node: String,
    pub machine_id: String,
    pub device_type: DeviceType,
    pub model: String,
    pub device_id: String,
    pub fabric_device_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachedDevice {
    pub device_id: String,
    pub fabric_device_id: String,
}

/// Outcome of an attach that did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddOutcome {
    Attached(AttachedDevice),
    /// Accepted but not finished; says what is awaited.
    InProgress(String),
}

/// Outcome of a detach that did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoveOutcome {
    Removed,
    InProgress(String),
}

/// Why an operation failed; one variant per WIT `provider-error` case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error("fabric error: HTTP {status}, code '{code}': {message}")]
    Fabric {
        status: u16,
        code: String,
        message: String,
    },
    #[error("malformed fabric reply: {0}")]
    MalformedReply(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("warning: {0}")]
    Warning(String),
    #[error("critical: {0}")]
    Critical(String),
    #[error("denied: {0}")]
    Denied(String),
    #[error("configuration error: {0}")]
    Config(String),
    #[error("fabric unavailable: {0}")]
    Unavailable(String),
    #[error("no capacity: {0}")]
    NoCapacity(String),
    #[error("{0}")]
    Other(String),
}

impl ProviderError {
    pub(crate) fn malformed(what: impl Into<String>) -> Self {
        ProviderError::MalformedReply(what.into())
    }
}

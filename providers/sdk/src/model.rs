//! The provider contract in the host's own terms (the records of the WIT `types`
//! interface of version 0.2.0 and the `pool` interface of 0.3.0): vendor logic is
//! written and tested natively over these, and the component glue (`crate::guest`)
//! converts them 1:1.

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
    /// The fabric-side machine the device was attached to, when the host recorded it.
    pub machine_id: Option<String>,
    pub force_detach: bool,
}

/// A device some ComposableResource already holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The ComposableResource's name.
    pub resource: String,
    pub device_id: Option<String>,
    pub fabric_device_id: Option<String>,
}

/// Everything an attach needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddRequest {
    pub resource: ComposableResource,
    /// The same for every retry of one attach, different for a new attach.
    pub attempt_key: String,
    /// Bytes of memory wanted, for a CXL memory request.
    pub size_bytes: Option<u64>,
    /// Devices already held by ComposableResources.
    pub claims: Vec<Claim>,
}

impl AddRequest {
    /// An attach knowing no claims, with the resource's name as the attempt key (what
    /// a contract 0.1.0 host gives).
    pub fn new(resource: ComposableResource) -> Self {
        AddRequest {
            attempt_key: resource.name.clone(),
            resource,
            size_bytes: None,
            claims: Vec::new(),
        }
    }

    /// Whether a ComposableResource other than this request's holds `device_id`.
    pub fn claimed_by_another(&self, device_id: &str) -> bool {
        self.claims.iter().any(|c| {
            c.resource != self.resource.name
                && (c.device_id.as_deref() == Some(device_id)
                    || c.fabric_device_id.as_deref() == Some(device_id))
        })
    }
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
    /// The fabric-side machine the device is attached to.
    pub machine_id: Option<String>,
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
    /// A reply that could not be understood.
    pub fn malformed(what: impl Into<String>) -> Self {
        ProviderError::MalformedReply(what.into())
    }
}

/// Devices of one kind a provider handles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceKind {
    pub device_type: DeviceType,
    /// Model names; empty means any.
    pub models: Vec<String>,
}

/// A kind of cluster object the provider reads through `lookup`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupKind {
    /// `v1` or `group/version`.
    pub api_version: String,
    pub kind: String,
    /// Needed only when this configuration key is set; `None`: always.
    pub when_config: Option<String>,
}

impl LookupKind {
    /// A kind always read.
    pub fn new(api_version: &str, kind: &str) -> Self {
        LookupKind {
            api_version: api_version.into(),
            kind: kind.into(),
            when_config: None,
        }
    }

    /// A kind read only when configuration key `key` is set.
    pub fn when_config(self, key: &str) -> Self {
        LookupKind {
            when_config: Some(key.into()),
            ..self
        }
    }
}

/// The capabilities a provider wants; the host compares them with its grants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Origins (`https://host:port`) or `${key}`: the origin of the URL in
    /// configuration key `key`.
    pub http: Vec<String>,
    pub secret_keys: Vec<String>,
    pub lookup: Vec<LookupKind>,
    /// Whether the provider needs the real wall clock.
    pub clocks: bool,
}

/// One configuration key the provider accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigKey {
    pub name: String,
    pub required: bool,
    pub description: String,
}

impl ConfigKey {
    pub fn required(name: &str, description: &str) -> Self {
        ConfigKey {
            name: name.into(),
            required: true,
            description: description.into(),
        }
    }

    pub fn optional(name: &str, description: &str) -> Self {
        ConfigKey {
            name: name.into(),
            required: false,
            description: description.into(),
        }
    }
}

/// What a provider is and needs (`describe`). Built without using the host: the host
/// asks with nothing granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderInfo {
    pub name: String,
    pub vendor: String,
    pub version: String,
    pub devices: Vec<DeviceKind>,
    pub capabilities: Capabilities,
    pub config: Vec<ConfigKey>,
}

/// Devices of one type and model (the unit of a pool).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKind {
    pub device_type: DeviceType,
    pub model: String,
}

/// What the host asks about the fabric's free devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolQuery {
    /// The kinds to count (a fabric that lists its free devices may report more; the
    /// host ignores kinds it did not ask for).
    pub kinds: Vec<PoolKind>,
    /// The Kubernetes nodes the provider serves: say which of them each pool reaches.
    pub nodes: Vec<String>,
}

/// Free devices of one kind in one pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreeDevices {
    pub kind: PoolKind,
    pub count: u32,
    /// CXL memory: each free device's size in bytes, when the fabric says (at most
    /// `count`); empty for GPUs.
    pub sizes: Vec<u64>,
}

/// Free devices that can each be attached to any node of `nodes` (FTI: one fabric).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricPool {
    /// The fabric's own name for the pool: an identifier, stable across calls.
    pub id: String,
    /// The query's nodes this pool reaches.
    pub nodes: Vec<String>,
    pub free: Vec<FreeDevices>,
}

/// What a pool read found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolOutcome {
    Pools(Vec<FabricPool>),
    /// The fabric has no way to tell its free devices; says why.
    NotSupported(String),
}

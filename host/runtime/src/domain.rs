//! Host-side types of the provider operations. They mirror the WIT records but belong to
//! the host, so the operator does not depend on one contract version's bindings.

use serde::{Deserialize, Serialize};

/// The kind of composable device (`spec.resource.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
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

/// Devices of one type and model (a pool's unit; 0.3.0 and later).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PoolKind {
    pub device_type: DeviceType,
    pub model: String,
}

/// What the host asks a provider about its free devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolQuery {
    /// The kinds to count.
    pub kinds: Vec<PoolKind>,
    /// The nodes the provider serves.
    pub nodes: Vec<String>,
}

/// Free devices of one kind in one pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeDevices {
    pub kind: PoolKind,
    pub count: u32,
    /// CXL memory: each free device's size in bytes, when the fabric says.
    pub sizes: Vec<u64>,
}

/// Free devices that can each be attached to any of `nodes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricPool {
    /// The fabric's own name for the pool, stable across calls.
    pub id: String,
    pub nodes: Vec<String>,
    pub free: Vec<FreeDevices>,
}

/// What a pool read found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PoolOutcome {
    Pools(Vec<FabricPool>),
    /// The fabric cannot tell its free devices (or the provider's contract has no pool);
    /// says why.
    NotSupported(String),
}

impl PoolOutcome {
    /// Only what `query` asked about: the query's nodes, and its kinds, each counted
    /// once (the first count a provider gave). The contract lets a fabric report more
    /// (it may list every free device it has), but nodes it was not asked about are
    /// another provider's, and a kind listed twice would publish one device name twice.
    pub fn limited_to(self, query: &PoolQuery) -> PoolOutcome {
        match self {
            PoolOutcome::NotSupported(why) => PoolOutcome::NotSupported(why),
            PoolOutcome::Pools(pools) => PoolOutcome::Pools(
                pools
                    .into_iter()
                    .map(|mut p| {
                        p.nodes.retain(|n| query.nodes.contains(n));
                        p.nodes.dedup();
                        let mut seen = Vec::new();
                        p.free.retain(|f| {
                            let keep = query.kinds.contains(&f.kind) && !seen.contains(&f.kind);
                            seen.push(f.kind.clone());
                            keep
                        });
                        p
                    })
                    .collect(),
            ),
        }
    }
}

impl FabricPool {
    /// The pool's id and nodes are identifiers, and no kind lists more sizes than
    /// devices: a reply that breaks either is malformed.
    pub fn check(&self) -> Result<(), ProviderError> {
        check_id(IdField::PoolId, &self.id)?;
        for node in &self.nodes {
            check_id(IdField::Node, node)?;
        }
        match self.free.iter().find(|f| f.sizes.len() > f.count as usize) {
            Some(f) => Err(ProviderError::MalformedReply(format!(
                "pool {}: {} sizes for {} free {} devices",
                self.id,
                f.sizes.len(),
                f.count,
                f.kind.model
            ))),
            None => Ok(()),
        }
    }
}

/// Which identifier of a provider's reply an [`InvalidId`] is about (the WIT field names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdField {
    DeviceId,
    FabricDeviceId,
    MachineId,
    /// The node a listed device is attached to, or a pool reaches.
    Node,
    /// A pool's id.
    PoolId,
}

impl IdField {
    pub fn as_str(self) -> &'static str {
        match self {
            IdField::DeviceId => "device-id",
            IdField::FabricDeviceId => "fabric-device-id",
            IdField::MachineId => "machine-id",
            IdField::Node => "node",
            IdField::PoolId => "pool id",
        }
    }
}

impl std::fmt::Display for IdField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Characters of an id quoted in an [`InvalidId`]'s message.
const QUOTED_ID_CHARS: usize = 128;

/// An id a provider returned that is no identifier: it holds a character that can break
/// a log line apart, repaint a terminal, or make the text read otherwise than it is
/// ([`forbidden_in_id`]). Ids are stored in `status`, compared, sent back to the
/// provider and written into the operator's log lines, so they cannot be escaped like
/// prose (that would change them): they are refused at the runtime boundary instead.
/// The message shows the id escaped (`{:?}`) and at most 128 characters of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the provider's {field} {} is not an identifier: it holds {offending:?} (U+{:04X})",
    quote_id(id),
    u32::from(*offending)
)]
pub struct InvalidId {
    pub field: IdField,
    pub id: String,
    /// The first character refused.
    pub offending: char,
}

/// A refused id reaches the operator as what it is, a malformed reply, whose handling
/// (the error in `status`, an Event, a retry) exists already.
impl From<InvalidId> for ProviderError {
    fn from(e: InvalidId) -> ProviderError {
        ProviderError::MalformedReply(e.to_string())
    }
}

/// `id` for a message: escaped by `Debug` (control, bidi and format characters become
/// `\n`, `\u{1b}`, `\u{202e}`, ...) and clipped.
fn quote_id(id: &str) -> String {
    let mut chars = id.chars();
    let kept: String = chars.by_ref().take(QUOTED_ID_CHARS).collect();
    let rest = chars.count();
    if rest == 0 {
        format!("{kept:?}")
    } else {
        format!("{kept:?}… [{rest} more characters]")
    }
}

/// Characters no id may hold: every character the host escapes in a log line
/// (`base::needs_escape`: control characters — a `\n` starts a forged log line, an ESC
/// sequence repaints a terminal —, the line and paragraph separators, the bidi controls
/// — U+202E makes `gpu-1\u{202E}0-upg` display as another id — and the zero-width and
/// other invisible format characters, with which two ids that print the same differ):
/// one list, so an id the host accepts is never escaped in its log. An id is refused
/// rather than escaped, since escaping would change it.
pub fn forbidden_in_id(c: char) -> bool {
    crate::base::needs_escape(c)
}

/// `id` as the provider's `field`, if it is an identifier ([`forbidden_in_id`]).
pub fn check_id(field: IdField, id: &str) -> Result<(), InvalidId> {
    match id.chars().find(|c| forbidden_in_id(*c)) {
        None => Ok(()),
        Some(offending) => Err(InvalidId {
            field,
            id: id.to_string(),
            offending,
        }),
    }
}

impl AttachedDevice {
    /// Every id of an attached device is an identifier.
    pub fn check_ids(&self) -> Result<(), InvalidId> {
        check_id(IdField::DeviceId, &self.device_id)?;
        check_id(IdField::FabricDeviceId, &self.fabric_device_id)?;
        match &self.machine_id {
            Some(m) => check_id(IdField::MachineId, m),
            None => Ok(()),
        }
    }
}

impl AddOutcome {
    /// The ids of an attached device are identifiers (an in-progress note is prose,
    /// escaped elsewhere).
    pub fn check_ids(&self) -> Result<(), InvalidId> {
        match self {
            AddOutcome::Attached(d) => d.check_ids(),
            AddOutcome::InProgress(_) => Ok(()),
        }
    }
}

impl DeviceInfo {
    /// Every id of a listed device, and the node it is on, is an identifier.
    pub fn check_ids(&self) -> Result<(), InvalidId> {
        check_id(IdField::Node, &self.node)?;
        check_id(IdField::MachineId, &self.machine_id)?;
        check_id(IdField::DeviceId, &self.device_id)?;
        check_id(IdField::FabricDeviceId, &self.fabric_device_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(id: &str, node: &str, count: u32, sizes: &[u64]) -> FabricPool {
        FabricPool {
            id: id.into(),
            nodes: vec![node.into()],
            free: vec![FreeDevices {
                kind: PoolKind {
                    device_type: DeviceType::CxlMemory,
                    model: "CXL 256GiB".into(),
                },
                count,
                sizes: sizes.to_vec(),
            }],
        }
    }

    #[test]
    fn a_pool_is_limited_to_the_nodes_and_kinds_asked_for() {
        let asked = PoolKind {
            device_type: DeviceType::CxlMemory,
            model: "CXL 256GiB".into(),
        };
        let mut p = pool("1", "w0", 2, &[]);
        p.nodes.push("someone-elses".into());
        p.free.push(FreeDevices {
            kind: asked.clone(),
            count: 9,
            sizes: Vec::new(),
        });
        p.free.push(FreeDevices {
            kind: PoolKind {
                device_type: DeviceType::Gpu,
                model: "not asked".into(),
            },
            count: 5,
            sizes: Vec::new(),
        });
        let query = PoolQuery {
            kinds: vec![asked],
            nodes: vec!["w0".into()],
        };
        let PoolOutcome::Pools(limited) = PoolOutcome::Pools(vec![p]).limited_to(&query) else {
            panic!("pools stay pools");
        };
        assert_eq!(limited[0].nodes, ["w0"]);
        assert_eq!(limited[0].free.len(), 1, "{:?}", limited[0].free);
        assert_eq!(limited[0].free[0].count, 2, "the first count of the kind");
    }

    #[test]
    fn a_pool_names_identifiers_and_no_more_sizes_than_devices() {
        assert_eq!(pool("1", "w0", 2, &[1 << 30, 1 << 30]).check(), Ok(()));
        assert_eq!(pool("1", "w0", 0, &[]).check(), Ok(()));
        let forged = pool("1\nERROR forged", "w0", 1, &[]).check().unwrap_err();
        assert!(
            matches!(&forged, ProviderError::MalformedReply(m) if m.contains("pool id")),
            "{forged}"
        );
        let node = pool("1", "w0\u{1b}[2J", 1, &[]).check().unwrap_err();
        assert!(matches!(node, ProviderError::MalformedReply(_)), "{node}");
        let sizes = pool("1", "w0", 1, &[1, 2]).check().unwrap_err();
        assert!(
            matches!(&sizes, ProviderError::MalformedReply(m) if m.contains("2 sizes for 1 free")),
            "{sizes}"
        );
    }

    fn attached(device_id: &str, fabric_device_id: &str, machine_id: Option<&str>) -> AddOutcome {
        AddOutcome::Attached(AttachedDevice {
            device_id: device_id.into(),
            fabric_device_id: fabric_device_id.into(),
            machine_id: machine_id.map(Into::into),
        })
    }

    fn listed(node: &str, machine_id: &str, device_id: &str) -> DeviceInfo {
        DeviceInfo {
            node: node.into(),
            machine_id: machine_id.into(),
            device_type: DeviceType::Gpu,
            model: "NVIDIA-A100-PCIE-40GB".into(),
            device_id: device_id.into(),
            fabric_device_id: "fab-0".into(),
        }
    }

    #[test]
    fn ordinary_ids_pass() {
        for id in [
            "GPU-8d2c7a1e-4b1f-4f5e-9f3a-0c1d2e3f4a5b",
            "0000:3b:00.0",
            "machine/rack-2 slot 7",
            "ＧＰＵ-〇一",
            "gpu_é",
            "",
        ] {
            assert_eq!(check_id(IdField::DeviceId, id), Ok(()), "{id:?}");
        }
        assert_eq!(attached("GPU-1", "fab-1", Some("m-1")).check_ids(), Ok(()));
        assert_eq!(AddOutcome::InProgress("wait\n".into()).check_ids(), Ok(()));
        assert_eq!(listed("worker-0", "m-1", "GPU-1").check_ids(), Ok(()));
    }

    #[test]
    fn a_newline_and_an_escape_sequence_are_refused() {
        let id = "GPU-1\n2026-12-01T00:00:00Z INFO forged line \u{1b}[2J\u{1b}[31m";
        let err = attached(id, "fab-1", None).check_ids().unwrap_err();
        assert_eq!(err.field, IdField::DeviceId);
        assert_eq!(err.offending, '\n');
        let shown = err.to_string();
        assert!(!shown.contains(['\n', '\u{1b}']), "{shown:?}");
        assert!(
            shown.contains(r#""GPU-1\n2026-12-01T00:00:00Z INFO forged line \u{1b}[2J\u{1b}[31m""#),
            "{shown}"
        );
        assert!(
            shown.contains("device-id") && shown.contains("U+000A"),
            "{shown}"
        );
        // Every id of both replies, each named.
        let err = attached("GPU-1", "fab\r1", None).check_ids().unwrap_err();
        assert_eq!(err.field, IdField::FabricDeviceId);
        let err = attached("GPU-1", "fab-1", Some("m\u{7f}"))
            .check_ids()
            .unwrap_err();
        assert_eq!(err.field, IdField::MachineId);
        let err = listed("worker-0\n", "m-1", "GPU-1")
            .check_ids()
            .unwrap_err();
        assert_eq!(err.field, IdField::Node);
        let err = listed("worker-0", "m\u{1b}1", "GPU-1")
            .check_ids()
            .unwrap_err();
        assert_eq!(err.field, IdField::MachineId);
        let err = listed("worker-0", "m-1", "GPU\u{0}1")
            .check_ids()
            .unwrap_err();
        assert_eq!(err.field, IdField::DeviceId);
    }

    #[test]
    fn a_bidi_override_is_refused() {
        // Shown as "GPU-1evil": what is read is not what is stored.
        let err = check_id(IdField::DeviceId, "GPU-1\u{202E}live").unwrap_err();
        assert_eq!(err.offending, '\u{202E}');
        assert!(err.to_string().contains(r"GPU-1\u{202e}live"), "{err}");
        assert!(!err.to_string().contains('\u{202E}'), "{err}");
        for c in [
            '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{2066}', '\u{2067}', '\u{2068}',
            '\u{2069}', '\u{200E}', '\u{200F}', '\u{061C}',
        ] {
            let id = format!("fab{c}1");
            let err = check_id(IdField::FabricDeviceId, &id).unwrap_err();
            assert_eq!(err.offending, c);
            assert!(
                !err.to_string().contains(c),
                "U+{:04X}: {err}",
                u32::from(c)
            );
        }
    }

    #[test]
    fn a_zero_width_character_is_refused() {
        // Prints exactly like "GPU-1" and is another id.
        let err = check_id(IdField::MachineId, "GPU\u{200B}-1").unwrap_err();
        assert_eq!((err.field, err.offending), (IdField::MachineId, '\u{200B}'));
        assert!(err.to_string().contains(r"GPU\u{200b}-1"), "{err}");
        for c in [
            '\u{200C}',
            '\u{200D}',
            '\u{2060}',
            '\u{FEFF}',
            '\u{00AD}',
            '\u{E0041}',
            '\u{2028}',
        ] {
            let id = format!("m{c}1");
            let err = check_id(IdField::MachineId, &id).unwrap_err();
            assert!(
                !err.to_string().contains(c),
                "U+{:04X}: {err}",
                u32::from(c)
            );
        }
    }

    #[test]
    fn a_refused_id_is_a_malformed_reply_quoting_a_bounded_id() {
        let long = format!("{}\n", "x".repeat(100_000));
        let err = check_id(IdField::DeviceId, &long).unwrap_err();
        let ProviderError::MalformedReply(m) = ProviderError::from(err) else {
            panic!("not a malformed reply")
        };
        assert!(m.len() < 400, "{} bytes", m.len());
        assert!(m.contains("[99873 more characters]"), "{m}");
        assert!(!m.contains('\n'));
    }
}

//! The Redfish resources the provider reads, as far as it reads them
//! (docs/redfish-api.md): links, collections, resource blocks with their device, computer
//! systems and tasks. Unknown properties are ignored; a missing property the provider
//! needs is a `malformed-reply`.

use serde::Deserialize;

use cro_provider_sdk::{DeviceType, ProviderError};

/// Where every service path starts.
pub const SERVICE_ROOT: &str = "/redfish/v1";
pub const SESSIONS: &str = "/redfish/v1/SessionService/Sessions";
pub const BLOCKS: &str = "/redfish/v1/CompositionService/ResourceBlocks";
pub const SYSTEMS: &str = "/redfish/v1/Systems";

/// `{"@odata.id": "/redfish/v1/..."}`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Link {
    #[serde(rename = "@odata.id")]
    pub id: String,
}

impl Link {
    pub fn to(path: String) -> Link {
        Link { id: path }
    }

    /// The linked path, refused unless it is a service path: the provider only ever
    /// talks to its configured endpoint (its grant), whatever a reply links to.
    pub fn path(&self) -> Result<&str, ProviderError> {
        service_path(&self.id)
    }

    /// The last segment of the path (a resource's `Id` by Redfish convention).
    pub fn last_segment(&self) -> &str {
        self.id
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or_default()
    }
}

/// `path` when it is a plain path under `/redfish/v1/`.
pub fn service_path(path: &str) -> Result<&str, ProviderError> {
    let ok = path.starts_with("/redfish/v1/")
        && !path.contains("..")
        && !path.contains(['?', '#', '\\', ' '])
        && !path.contains("//");
    if ok {
        Ok(path)
    } else {
        Err(ProviderError::malformed(format!(
            "the service linked to '{path}', which is not a path under {SERVICE_ROOT}/"
        )))
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct Collection {
    #[serde(rename = "Members", default)]
    pub members: Vec<Link>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Status {
    #[serde(rename = "Health")]
    pub health: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CompositionStatus {
    #[serde(rename = "CompositionState")]
    pub state: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct BlockLinks {
    #[serde(rename = "ComputerSystems", default)]
    pub systems: Vec<Link>,
}

/// A resource block: one device (or a system's compute) that can be composed.
#[derive(Debug, Clone, Deserialize)]
pub struct Block {
    #[serde(rename = "Id")]
    pub id: String,
    #[serde(rename = "ResourceBlockType", default)]
    pub types: Vec<String>,
    #[serde(rename = "Status", default)]
    pub status: Status,
    #[serde(rename = "CompositionStatus")]
    pub composition: CompositionStatus,
    #[serde(rename = "Links", default)]
    pub links: BlockLinks,
    #[serde(rename = "Processors", default)]
    pub processors: Vec<Link>,
    #[serde(rename = "Memory", default)]
    pub memory: Vec<Link>,
}

/// Where a block stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Composition {
    Unused,
    Composing,
    Composed,
    /// Any other state (`Failed`, `Unavailable`...): not usable, not ours to touch.
    Other,
}

impl Block {
    /// The contract's device type of the block; `None` for compute and other blocks.
    pub fn device_type(&self) -> Option<DeviceType> {
        if self.types.iter().any(|t| t == "Compute") {
            None
        } else if self.types.iter().any(|t| t == "Processor") {
            Some(DeviceType::Gpu)
        } else if self.types.iter().any(|t| t == "Memory") {
            Some(DeviceType::Cxlmemory)
        } else {
            None
        }
    }

    pub fn composition(&self) -> Composition {
        match self.composition.state.as_str() {
            "Unused" => Composition::Unused,
            "Composing" => Composition::Composing,
            "Composed" => Composition::Composed,
            _ => Composition::Other,
        }
    }

    /// Whether the block is (being) composed into system `system`.
    pub fn linked_to(&self, system: &str) -> bool {
        self.links
            .systems
            .iter()
            .any(|l| l.last_segment() == system)
    }

    /// The link to the block's device (its processor or memory).
    pub fn device_link(&self) -> Result<&Link, ProviderError> {
        let link = match self.device_type() {
            Some(DeviceType::Gpu) => self.processors.first(),
            Some(DeviceType::Cxlmemory) => self.memory.first(),
            None => None,
        };
        link.ok_or_else(|| {
            ProviderError::malformed(format!("resource block {} links no device", self.id))
        })
    }
}

/// A block's device: a `Processor` (GPU) or a `Memory` (CXL memory).
#[derive(Debug, Clone, Deserialize)]
pub struct Device {
    #[serde(rename = "Model")]
    pub model: Option<String>,
    #[serde(rename = "SerialNumber")]
    pub serial_number: Option<String>,
    #[serde(rename = "UUID")]
    pub uuid: Option<String>,
    #[serde(rename = "CapacityMiB")]
    pub capacity_mib: Option<u64>,
}

impl Device {
    /// The device id the operator records (`status.device_id`): the serial number (a
    /// GPU's is its `GPU-<uuid>`, what the node's driver reports), else the UUID.
    pub fn device_id(&self, block: &str) -> Result<String, ProviderError> {
        [&self.serial_number, &self.uuid]
            .into_iter()
            .flatten()
            .map(|s| s.trim())
            .find(|s| !s.is_empty())
            .map(str::to_string)
            .ok_or_else(|| {
                ProviderError::malformed(format!(
                    "the device of resource block {block} has neither SerialNumber nor UUID"
                ))
            })
    }

    pub fn model(&self) -> &str {
        self.model.as_deref().map(str::trim).unwrap_or_default()
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct SystemLinks {
    #[serde(rename = "ResourceBlocks", default)]
    pub blocks: Vec<Link>,
}

/// A computer system: a cluster node with the blocks composed into it.
#[derive(Debug, Clone, Deserialize)]
pub struct System {
    #[serde(rename = "@odata.etag")]
    pub etag: Option<String>,
    #[serde(rename = "Links", default)]
    pub links: SystemLinks,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TaskMessage {
    #[serde(rename = "MessageId", default)]
    pub message_id: String,
    #[serde(rename = "Message", default)]
    pub message: String,
}

/// A task (a slow composition).
#[derive(Debug, Clone, Deserialize)]
pub struct Task {
    #[serde(rename = "TaskState")]
    pub state: String,
    #[serde(rename = "Messages", default)]
    pub messages: Vec<TaskMessage>,
}

/// Where a task stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskOutcome {
    Running,
    Completed,
    /// Failed: (message id, message).
    Failed(String, String),
}

impl Task {
    pub fn outcome(&self) -> TaskOutcome {
        match self.state.as_str() {
            "Completed" => TaskOutcome::Completed,
            "Exception" | "Killed" | "Cancelled" | "Interrupted" => {
                let (id, msg) = self
                    .messages
                    .first()
                    .map(|m| (m.message_id.clone(), m.message.clone()))
                    .unwrap_or_else(|| (String::new(), format!("task ended {}", self.state)));
                TaskOutcome::Failed(id, msg)
            }
            // New, Starting, Running, Pending, Stopping, Suspended...: not finished.
            _ => TaskOutcome::Running,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_service_paths_are_followed() {
        assert!(service_path("/redfish/v1/Systems/a").is_ok());
        for bad in [
            "http://evil/redfish/v1/x",
            "/redfish/v1/../../etc",
            "/other/x",
            "/redfish/v1/a?b",
            "//evil/redfish/v1/",
        ] {
            assert!(
                matches!(service_path(bad), Err(ProviderError::MalformedReply(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn blocks_types_and_states() {
        let b: Block = serde_json::from_value(serde_json::json!({
            "@odata.id": "/redfish/v1/CompositionService/ResourceBlocks/GPU-1",
            "Id": "GPU-1", "ResourceBlockType": ["Processor"],
            "CompositionStatus": {"CompositionState": "Composing"},
            "Links": {"ComputerSystems": [{"@odata.id": "/redfish/v1/Systems/w0"}]},
            "Processors": [{"@odata.id": "/redfish/v1/CompositionService/ResourceBlocks/GPU-1/Processors/GPU0"}]
        }))
        .unwrap();
        assert_eq!(b.device_type(), Some(DeviceType::Gpu));
        assert_eq!(b.composition(), Composition::Composing);
        assert!(b.linked_to("w0") && !b.linked_to("w1"));
        assert!(b.device_link().is_ok());
        let t: Task = serde_json::from_value(serde_json::json!({"TaskState": "Exception",
            "Messages": [{"MessageId": "TaskEvent.1.0.3.TaskAborted", "Message": "boom"}]}))
        .unwrap();
        assert_eq!(
            t.outcome(),
            TaskOutcome::Failed("TaskEvent.1.0.3.TaskAborted".into(), "boom".into())
        );
    }
}

//! `ComposableResource`: one device, created and owned by the operator.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::{CustomResource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::request::ScalarResourceDetails;
use crate::resource_type::ResourceType;
use crate::schema::{conditions_list, drop_default, is_false};
use crate::state::ResourceState;
use crate::well_known::{
    ANNOTATION_DELETE_DEVICE, ANNOTATION_DELETE_DEVICE_TRUE, ANNOTATION_LAST_USED_TIME,
    LABEL_MANAGED_BY, LABEL_READY_TO_DETACH_CDI_DEVICE_ID, LABEL_READY_TO_DETACH_DEVICE_ID,
};

/// Desired state of a ComposableResource: which device goes to which node.
// Each printcolumn(...) repeats the same keys, which clippy mistakes for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "cro.hpsys.ibm.ie.com",
    version = "v1alpha1",
    kind = "ComposableResource",
    status = "ComposableResourceStatus",
    derive = "PartialEq",
    doc = "One composable device attached (or being attached or detached) to one node. Managed by the operator.",
    category = "cro",
    shortname = "cres",
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.type"),
    printcolumn(name = "Model", type_ = "string", json_path = ".spec.model"),
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.target_node"),
    printcolumn(name = "Device ID", type_ = "string", json_path = ".status.device_id"),
    printcolumn(
        name = "CDI Device ID",
        type_ = "string",
        json_path = ".status.cdi_device_id",
        priority = 1
    ),
    printcolumn(
        name = "Error",
        type_ = "string",
        json_path = ".status.error",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct ComposableResourceSpec {
    /// Kind of device: gpu or cxlmemory.
    #[serde(rename = "type")]
    pub resource_type: ResourceType,
    /// Device model as the fabric names it.
    pub model: String,
    /// Node the device is attached to.
    pub target_node: String,
    /// Detach even if the device still has running work.
    #[serde(default, skip_serializing_if = "is_false")]
    pub force_detach: bool,
}

/// Observed state of a ComposableResource, written by the operator.
// Every field is written even when empty, so that a merge patch of the status clears ids and
// errors instead of leaving them behind.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ComposableResourceStatus {
    /// Lifecycle state.
    #[serde(default)]
    #[schemars(transform = drop_default)]
    pub state: ResourceState,
    /// Last error or health warning, empty when healthy.
    #[serde(default)]
    #[schemars(transform = drop_default)]
    pub error: String,
    /// The device's serial or GPU UUID.
    #[serde(default)]
    #[schemars(transform = drop_default)]
    pub device_id: String,
    /// The fabric's id of the device.
    #[serde(default)]
    #[schemars(transform = drop_default)]
    pub cdi_device_id: String,
    /// Standard conditions. `Ready` is True while Online; when False, its reason names the
    /// step under way (or Error) and its message says why.
    // Omitted when empty, as the Go operator's objects have none; once written it is never
    // empty again, and a merge patch replaces the whole list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = conditions_list)]
    pub conditions: Vec<Condition>,
}

/// The device a ready-to-detach ComposableResource was created to release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadyToDetach {
    /// Value of `cohdi.io/ready-to-detach-device-id`.
    pub device_id: String,
    /// Value of `cohdi.io/ready-to-detach-cdi-device-id`, empty when the label is missing.
    pub cdi_device_id: String,
}

impl ComposableResource {
    /// A new resource (fresh `<type>-<uuid>` name) for one device of `request_name` on `node`.
    pub fn for_request(request_name: &str, details: &ScalarResourceDetails, node: &str) -> Self {
        let mut resource = Self::new(
            &details.resource_type.new_resource_name(),
            ComposableResourceSpec {
                resource_type: details.resource_type,
                model: details.model.clone(),
                target_node: node.to_owned(),
                force_detach: details.force_detach,
            },
        );
        resource.metadata.labels = Some(BTreeMap::from([(
            LABEL_MANAGED_BY.to_owned(),
            request_name.to_owned(),
        )]));
        resource
    }

    /// A new resource whose only purpose is to detach a device nobody claims (docs/behaviour.md §5).
    pub fn for_orphan_device(spec: ComposableResourceSpec, device: &ReadyToDetach) -> Self {
        let mut labels = BTreeMap::from([(
            LABEL_READY_TO_DETACH_DEVICE_ID.to_owned(),
            device.device_id.clone(),
        )]);
        if !device.cdi_device_id.is_empty() {
            labels.insert(
                LABEL_READY_TO_DETACH_CDI_DEVICE_ID.to_owned(),
                device.cdi_device_id.clone(),
            );
        }
        Self {
            metadata: ObjectMeta {
                name: Some(spec.resource_type.new_resource_name()),
                labels: Some(labels),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        }
    }

    /// `status.state`, or the initial state when there is no status yet.
    pub fn state(&self) -> ResourceState {
        self.status
            .as_ref()
            .map(|s| s.state.clone())
            .unwrap_or_default()
    }

    /// `status.device_id` when the resource holds a device.
    pub fn device_id(&self) -> Option<&str> {
        self.status
            .as_ref()
            .map(|s| s.device_id.as_str())
            .filter(|id| !id.is_empty())
    }

    /// `status.cdi_device_id` when the resource holds a device.
    pub fn cdi_device_id(&self) -> Option<&str> {
        self.status
            .as_ref()
            .map(|s| s.cdi_device_id.as_str())
            .filter(|id| !id.is_empty())
    }

    /// The ComposabilityRequest this resource belongs to (`app.kubernetes.io/managed-by`).
    pub fn managed_by(&self) -> Option<&str> {
        self.labels()
            .get(LABEL_MANAGED_BY)
            .map(String::as_str)
            .filter(|n| !n.is_empty())
    }

    /// The orphaned device to detach, when this resource was created for that.
    pub fn ready_to_detach(&self) -> Option<ReadyToDetach> {
        let labels = self.labels();
        let device_id = labels
            .get(LABEL_READY_TO_DETACH_DEVICE_ID)
            .filter(|id| !id.is_empty())?;
        Some(ReadyToDetach {
            device_id: device_id.clone(),
            cdi_device_id: labels
                .get(LABEL_READY_TO_DETACH_CDI_DEVICE_ID)
                .cloned()
                .unwrap_or_default(),
        })
    }

    /// `cohdi.io/last-used-time`; `None` when absent or not RFC 3339 (an annotation anybody
    /// may write must not stop the operator).
    pub fn last_used_time(&self) -> Option<Timestamp> {
        self.annotations()
            .get(ANNOTATION_LAST_USED_TIME)?
            .parse()
            .ok()
    }

    /// The time the surplus ordering sorts by: last use, else creation (docs/behaviour.md §3).
    pub fn last_used_or_created(&self) -> Option<Timestamp> {
        self.last_used_time()
            .or_else(|| self.metadata.creation_timestamp.as_ref().map(|t| t.0))
    }

    /// Whether `cohdi.io/delete-device=true` asks that this device be dropped first.
    pub fn is_marked_for_deletion(&self) -> bool {
        self.annotations()
            .get(ANNOTATION_DELETE_DEVICE)
            .map(String::as_str)
            == Some(ANNOTATION_DELETE_DEVICE_TRUE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::AllocationPolicy;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn details() -> ScalarResourceDetails {
        ScalarResourceDetails {
            resource_type: ResourceType::Gpu,
            model: "A100".into(),
            size: 3,
            force_detach: true,
            allocation_policy: AllocationPolicy::SameNode,
            target_node: None,
            other_spec: None,
        }
    }

    #[test]
    fn for_request_links_the_resource_to_its_request() {
        let r = ComposableResource::for_request("my-req", &details(), "node-a");
        assert!(r.name_any().starts_with("gpu-"));
        assert_eq!(r.managed_by(), Some("my-req"));
        assert_eq!(r.ready_to_detach(), None);
        assert_eq!(
            r.spec,
            ComposableResourceSpec {
                resource_type: ResourceType::Gpu,
                model: "A100".into(),
                target_node: "node-a".into(),
                force_detach: true,
            }
        );
        assert_eq!(r.state(), ResourceState::Empty);
        assert_eq!((r.device_id(), r.cdi_device_id()), (None, None));
    }

    #[test]
    fn orphan_resources_carry_the_ready_to_detach_labels() {
        let device = ReadyToDetach {
            device_id: "GPU-9".into(),
            cdi_device_id: "cdi-9".into(),
        };
        let spec = ComposableResource::for_request("x", &details(), "node-b").spec;
        let r = ComposableResource::for_orphan_device(spec, &device);
        assert_eq!(r.managed_by(), None);
        assert_eq!(r.ready_to_detach(), Some(device));
        assert_eq!(r.labels()[LABEL_READY_TO_DETACH_CDI_DEVICE_ID], "cdi-9");
    }

    #[test]
    fn json_field_names_are_the_go_operators() {
        let mut r = ComposableResource::for_request("req", &details(), "n1");
        r.status = Some(ComposableResourceStatus {
            state: ResourceState::Online,
            error: String::new(),
            device_id: "GPU-1".into(),
            cdi_device_id: "c-1".into(),
            conditions: Vec::new(),
        });
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["apiVersion"], crate::API_VERSION);
        assert_eq!(v["kind"], "ComposableResource");
        assert_eq!(
            v["spec"],
            json!({"type": "gpu", "model": "A100", "target_node": "n1", "force_detach": true})
        );
        assert_eq!(
            v["status"],
            json!({"state": "Online", "error": "", "device_id": "GPU-1", "cdi_device_id": "c-1"})
        );
        assert_eq!(r.device_id(), Some("GPU-1"));
        assert_eq!(r.cdi_device_id(), Some("c-1"));
        assert_eq!(serde_json::from_value::<ComposableResource>(v).unwrap(), r);
    }

    #[test]
    fn annotations_are_read_leniently() {
        let mut r = ComposableResource::for_request("req", &details(), "n1");
        let created: Timestamp = "2025-01-01T00:00:00Z".parse().unwrap();
        r.metadata.creation_timestamp = Some(Time(created));
        assert_eq!(r.last_used_or_created(), Some(created));
        assert!(!r.is_marked_for_deletion());

        let used: Timestamp = "2025-02-03T04:05:06+01:00".parse().unwrap();
        r.annotations_mut().insert(
            ANNOTATION_LAST_USED_TIME.into(),
            "2025-02-03T04:05:06+01:00".into(),
        );
        r.annotations_mut()
            .insert(ANNOTATION_DELETE_DEVICE.into(), "true".into());
        assert_eq!(r.last_used_time(), Some(used));
        assert_eq!(r.last_used_or_created(), Some(used));
        assert!(r.is_marked_for_deletion());

        r.annotations_mut()
            .insert(ANNOTATION_LAST_USED_TIME.into(), "yesterday".into());
        r.annotations_mut()
            .insert(ANNOTATION_DELETE_DEVICE.into(), "yes".into());
        assert_eq!(r.last_used_time(), None);
        assert_eq!(r.last_used_or_created(), Some(created));
        assert!(!r.is_marked_for_deletion());
    }

    #[test]
    fn a_go_written_resource_without_status_fields_deserializes() {
        let r: ComposableResource = serde_json::from_value(json!({
            "apiVersion": "cro.hpsys.ibm.ie.com/v1alpha1",
            "kind": "ComposableResource",
            "metadata": {"name": "gpu-1"},
            "spec": {"type": "gpu", "model": "m", "target_node": "n"},
            "status": {"state": "Attaching"}
        }))
        .unwrap();
        assert_eq!(r.state(), ResourceState::Attaching);
        assert!(!r.spec.force_detach);
        assert_eq!(r.device_id(), None);
    }
}

//! `ComposabilityRequest`: the user-facing kind ("node X, or any node, needs N devices").

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::resource_type::ResourceType;
use crate::schema::{conditions_list, drop_default, immutable_type_and_model, is_false, is_zero};
use crate::state::{RequestState, ResourceState};

/// Desired state of a ComposabilityRequest: the devices requested.
// Each printcolumn(...) repeats the same keys, which clippy mistakes for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "cro.hpsys.ibm.ie.com",
    version = "v1alpha1",
    kind = "ComposabilityRequest",
    status = "ComposabilityRequestStatus",
    derive = "PartialEq",
    doc = "A request for composable devices (GPUs or CXL memory) of one model, attached to one or more nodes.",
    category = "cro",
    shortname = "creq",
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.resource.type"),
    printcolumn(name = "Model", type_ = "string", json_path = ".spec.resource.model"),
    printcolumn(name = "Size", type_ = "integer", json_path = ".spec.resource.size"),
    printcolumn(
        name = "Policy",
        type_ = "string",
        json_path = ".spec.resource.allocation_policy",
        priority = 1
    ),
    printcolumn(
        name = "Target Node",
        type_ = "string",
        json_path = ".spec.resource.target_node",
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
pub struct ComposabilityRequestSpec {
    /// The devices requested. `type` and `model` cannot change once the request exists:
    /// a change would detach every device and attach others in their place (delete the
    /// request and create a new one instead).
    #[schemars(transform = immutable_type_and_model)]
    pub resource: ScalarResourceDetails,
}

/// What a request asks for (spec.resource), also recorded as status.scalarResource.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ScalarResourceDetails {
    /// Kind of device: gpu or cxlmemory.
    #[serde(rename = "type")]
    pub resource_type: ResourceType,
    /// Device model as the fabric names it, e.g. NVIDIA-A100-PCIE-40GB.
    #[schemars(length(min = 1))]
    pub model: String,
    /// How many devices.
    #[schemars(range(min = 0))]
    pub size: i64,
    /// Detach even if a device still has running work.
    #[serde(default, skip_serializing_if = "is_false")]
    pub force_detach: bool,
    /// samenode puts every device on one node, differentnode at most one per node.
    #[serde(default)]
    pub allocation_policy: AllocationPolicy,
    /// Node that must receive the devices; any suitable node when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_node: Option<String>,
    /// Minimum free capacity a node needs to receive devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_spec: Option<NodeSpec>,
}

impl ScalarResourceDetails {
    /// The target node, treating an empty string (as the Go operator may write) as unset.
    pub fn target_node(&self) -> Option<&str> {
        self.target_node.as_deref().filter(|n| !n.is_empty())
    }
}

/// `spec.resource.allocation_policy`.
// No doc comments on the variants: see ResourceType for why.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AllocationPolicy {
    #[default]
    SameNode,
    DifferentNode,
}

impl AllocationPolicy {
    /// The string used in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            AllocationPolicy::SameNode => "samenode",
            AllocationPolicy::DifferentNode => "differentnode",
        }
    }
}

impl fmt::Display for AllocationPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `spec.resource.other_spec`: minimum free node capacity, in the Go operator's units.
/// A field that is absent or zero places no constraint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NodeSpec {
    /// CPU in millicores.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0))]
    pub milli_cpu: i64,
    /// Memory.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0))]
    pub memory: i64,
    /// Ephemeral storage.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0))]
    pub ephemeral_storage: i64,
    /// Number of pods the node must still be able to admit.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0))]
    pub allowed_pod_number: i64,
}

/// Observed state of a ComposabilityRequest, written by the operator.
// Every field is written even when empty, so that a merge patch of the status clears an old
// error or state instead of leaving it behind.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ComposabilityRequestStatus {
    /// Lifecycle state.
    #[serde(default)]
    #[schemars(transform = drop_default)]
    pub state: RequestState,
    /// Last error, empty when none.
    #[serde(default)]
    #[schemars(transform = drop_default)]
    pub error: String,
    /// Each ComposableResource of this request, by name.
    #[serde(default)]
    #[schemars(transform = drop_default)]
    pub resources: BTreeMap<String, ScalarResourceStatus>,
    /// The spec the operator last acted on.
    #[serde(
        default,
        rename = "scalarResource",
        skip_serializing_if = "Option::is_none"
    )]
    pub scalar_resource: Option<ScalarResourceDetails>,
    /// Standard conditions. `Ready` is True while Running; when False, its reason names the
    /// step under way (or Error) and its message says why.
    // Omitted when empty, as the Go operator's objects have none; once written it is never
    // empty again, and a merge patch replaces the whole list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = conditions_list)]
    pub conditions: Vec<Condition>,
}

/// A ComposableResource of the request, as mirrored from its status.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ScalarResourceStatus {
    /// State of the ComposableResource.
    #[serde(default)]
    #[schemars(transform = drop_default)]
    pub state: ResourceState,
    /// The device's serial or GPU UUID.
    #[serde(default)]
    #[schemars(transform = drop_default)]
    pub device_id: String,
    /// The fabric's id of the device.
    #[serde(default)]
    #[schemars(transform = drop_default)]
    pub cdi_device_id: String,
    /// Node the device is attached to.
    #[serde(default)]
    #[schemars(transform = drop_default)]
    pub node_name: String,
    /// Last error of the ComposableResource, empty when none.
    #[serde(default)]
    #[schemars(transform = drop_default)]
    pub error: String,
}

impl ComposabilityRequest {
    /// `status.state`, or the initial state when there is no status yet.
    pub fn state(&self) -> RequestState {
        self.status
            .as_ref()
            .map(|s| s.state.clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn go_readme_request() -> ComposabilityRequest {
        let yaml = include_str!("../tests/fixtures/go-readme-request.yaml");
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn go_readme_example_deserializes_with_every_field() {
        let req = go_readme_request();
        assert_eq!(kube::ResourceExt::name_any(&req), "gpu-request");
        let r = &req.spec.resource;
        assert_eq!(r.resource_type, ResourceType::Gpu);
        assert_eq!(r.model, "NVIDIA-A100-PCIE-40GB");
        assert_eq!(r.size, 2);
        assert!(!r.force_detach);
        assert_eq!(r.allocation_policy, AllocationPolicy::SameNode);
        assert_eq!(r.target_node(), Some("worker-2"));
        assert_eq!(
            r.other_spec,
            Some(NodeSpec {
                milli_cpu: 2,
                memory: 40,
                ephemeral_storage: 2,
                allowed_pod_number: 5
            })
        );
        assert_eq!(req.state(), RequestState::Empty);
    }

    #[test]
    fn json_field_names_are_the_go_operators() {
        let mut req = go_readme_request();
        req.spec.resource.force_detach = true;
        req.spec.resource.allocation_policy = AllocationPolicy::DifferentNode;
        req.status = Some(ComposabilityRequestStatus {
            state: RequestState::Running,
            error: String::new(),
            resources: [(
                "gpu-1".to_owned(),
                ScalarResourceStatus {
                    state: ResourceState::Online,
                    device_id: "GPU-1".into(),
                    cdi_device_id: "c-1".into(),
                    node_name: "worker-2".into(),
                    error: String::new(),
                },
            )]
            .into(),
            scalar_resource: Some(req.spec.resource.clone()),
            conditions: Vec::new(),
        });
        let v = serde_json::to_value(&req).unwrap();
        assert_eq!(
            v["spec"]["resource"],
            json!({
                "type": "gpu", "model": "NVIDIA-A100-PCIE-40GB", "size": 2,
                "force_detach": true, "allocation_policy": "differentnode",
                "target_node": "worker-2",
                "other_spec": {"milli_cpu": 2, "memory": 40, "ephemeral_storage": 2, "allowed_pod_number": 5}
            })
        );
        assert_eq!(v["status"]["state"], "Running");
        assert_eq!(v["status"]["error"], "");
        assert_eq!(
            v["status"]["resources"]["gpu-1"],
            json!({"state": "Online", "device_id": "GPU-1", "cdi_device_id": "c-1", "node_name": "worker-2", "error": ""})
        );
        assert_eq!(v["status"]["scalarResource"]["type"], "gpu");
        let back: ComposabilityRequest = serde_json::from_value(v).unwrap();
        assert_eq!(back, req);
    }

    #[test]
    fn optional_fields_may_be_absent_and_omitempty_fields_are_omitted() {
        let spec: ComposabilityRequestSpec = serde_json::from_value(json!({
            "resource": {"type": "cxlmemory", "model": "m", "size": 0}
        }))
        .unwrap();
        let r = &spec.resource;
        assert_eq!(r.allocation_policy, AllocationPolicy::SameNode);
        assert_eq!(
            (r.force_detach, r.target_node(), r.other_spec.as_ref()),
            (false, None, None)
        );
        assert_eq!(
            serde_json::to_value(&spec).unwrap(),
            json!({"resource": {"type": "cxlmemory", "model": "m", "size": 0, "allocation_policy": "samenode"}})
        );
        let empty_node: ScalarResourceDetails = serde_json::from_value(json!({
            "type": "gpu", "model": "m", "size": 1, "target_node": ""
        }))
        .unwrap();
        assert_eq!(empty_node.target_node(), None);
    }

    #[test]
    fn a_partial_status_from_the_go_operator_deserializes() {
        let status: ComposabilityRequestStatus = serde_json::from_value(
            json!({"state": "NodeAllocating", "resources": {"gpu-a": {"state": "Attaching"}}}),
        )
        .unwrap();
        assert_eq!(status.state, RequestState::NodeAllocating);
        assert_eq!(status.resources["gpu-a"].state, ResourceState::Attaching);
        assert_eq!(status.resources["gpu-a"].device_id, "");
        assert_eq!(status.scalar_resource, None);
    }

    #[test]
    fn bad_values_do_not_deserialize() {
        for bad in [
            json!({"type": "fpga", "model": "m", "size": 1}),
            json!({"type": "gpu", "model": "m", "size": 1, "allocation_policy": "anynode"}),
            json!({"type": "gpu", "model": "m"}),
        ] {
            assert!(
                serde_json::from_value::<ScalarResourceDetails>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }
}

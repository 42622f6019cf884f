//! The Kubernetes objects seen through the small views of [`crate::allocation`] and
//! [`crate::admission`].

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use cro_api::{
    AllocationPolicy, ComposabilityRequest, ComposableResource, CroObjectExt, ResourceState,
    ScalarResourceDetails,
};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use crate::admission::RequestSummary;
use crate::allocation::{Capacity, DeviceState, NodeView, Policy, RequestView, ResourceView};
use crate::quantity;

pub fn node_view(node: &Node) -> NodeView {
    let alloc = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let get = |key: &str, milli: bool| -> i64 {
        alloc
            .and_then(|a| a.get(key))
            .and_then(|q| {
                let r = if milli {
                    quantity::parse_milli(&q.0)
                } else {
                    quantity::parse(&q.0)
                };
                // A node whose capacity cannot be read fits nothing that asks for some.
                r.map_err(|e| tracing::warn!(node = %node.name_any(), key, error = %e, "unreadable allocatable"))
                    .ok()
            })
            .unwrap_or(0)
    };
    NodeView {
        name: node.name_any(),
        allocatable: Capacity {
            milli_cpu: get("cpu", true),
            memory: get("memory", false),
            ephemeral_storage: get("ephemeral-storage", false),
            pods: get("pods", false),
        },
    }
}

/// Nodes in name order, so that "the first node that fits" is stable.
pub fn node_views(nodes: &[Node]) -> Vec<NodeView> {
    let mut views: Vec<NodeView> = nodes.iter().map(node_view).collect();
    views.sort_by(|a, b| a.name.cmp(&b.name));
    views
}

pub fn request_view(spec: &ScalarResourceDetails) -> RequestView {
    RequestView {
        device_type: spec.resource_type.as_str().to_owned(),
        model: spec.model.clone(),
        size: usize::try_from(spec.size.max(0)).unwrap_or(usize::MAX),
        force_detach: spec.force_detach,
        policy: match spec.allocation_policy {
            AllocationPolicy::SameNode => Policy::SameNode,
            AllocationPolicy::DifferentNode => Policy::DifferentNode,
        },
        target_node: spec.target_node().map(str::to_owned),
        other_spec: spec.other_spec.as_ref().map(|o| Capacity {
            milli_cpu: o.milli_cpu,
            memory: o.memory,
            ephemeral_storage: o.ephemeral_storage,
            pods: o.allowed_pod_number,
        }),
    }
}

fn device_state(s: &ResourceState) -> DeviceState {
    match s {
        ResourceState::Empty => DeviceState::None,
        ResourceState::Attaching => DeviceState::Attaching,
        ResourceState::Online => DeviceState::Online,
        ResourceState::Detaching => DeviceState::Detaching,
        ResourceState::Deleting => DeviceState::Deleting,
        ResourceState::Unknown(_) => DeviceState::Other,
    }
}

fn to_chrono(t: Option<k8s_openapi::jiff::Timestamp>) -> DateTime<Utc> {
    t.and_then(|t| DateTime::from_timestamp(t.as_second(), t.subsec_nanosecond().max(0) as u32))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

pub fn resource_view(r: &ComposableResource) -> ResourceView {
    ResourceView {
        name: r.name_any(),
        device_type: r.spec.resource_type.as_str().to_owned(),
        model: r.spec.model.clone(),
        target_node: r.spec.target_node.clone(),
        force_detach: r.spec.force_detach,
        state: device_state(&r.state()),
        has_device: r.device_id().is_some(),
        delete_requested: r.is_marked_for_deletion(),
        last_used: to_chrono(r.last_used_or_created()),
        being_deleted: r.is_being_deleted(),
    }
}

/// The nodes other samenode requests are on: their target, else their devices' nodes.
pub fn samenode_nodes_of_others(me: &str, requests: &[ComposabilityRequest]) -> BTreeSet<String> {
    let mut nodes = BTreeSet::new();
    for r in requests.iter().filter(|r| r.name_any() != me) {
        if r.spec.resource.allocation_policy != AllocationPolicy::SameNode {
            continue;
        }
        if let Some(t) = r.spec.resource.target_node() {
            nodes.insert(t.to_owned());
        }
        if let Some(status) = &r.status {
            nodes.extend(
                status
                    .resources
                    .values()
                    .map(|s| s.node_name.clone())
                    .filter(|n| !n.is_empty()),
            );
        }
    }
    nodes
}

pub fn request_summary(r: &ComposabilityRequest) -> RequestSummary {
    let spec = &r.spec.resource;
    RequestSummary {
        name: r.name_any(),
        device_type: spec.resource_type.as_str().to_owned(),
        model: spec.model.clone(),
        differentnode: spec.allocation_policy == AllocationPolicy::DifferentNode,
        target_node: spec.target_node().map(str::to_owned),
        // The map is ordered by name, so "first" is stable across calls.
        first_resource_node: r.status.as_ref().and_then(|s| {
            s.resources
                .values()
                .map(|x| x.node_name.clone())
                .find(|n| !n.is_empty())
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    #[test]
    fn node_capacity_from_allocatable() {
        let node = Node {
            metadata: kube::api::ObjectMeta {
                name: Some("n1".into()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                allocatable: Some(
                    [
                        ("cpu", "3500m"),
                        ("memory", "16Gi"),
                        ("ephemeral-storage", "100G"),
                        ("pods", "110"),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            node_view(&node).allocatable,
            Capacity {
                milli_cpu: 3500,
                memory: 16 << 30,
                ephemeral_storage: 100_000_000_000,
                pods: 110
            }
        );
        assert_eq!(node_view(&Node::default()).allocatable, Capacity::default());
    }
}

//! The Kubernetes objects seen through the small views of [`crate::decide::allocation`] and
//! [`crate::decide::admission`].

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use cro_api::{
    AllocationPolicy, ComposabilityRequest, ComposableResource, CroObjectExt, ResourceState,
    ScalarResourceDetails,
};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use crate::decide::admission::RequestSummary;
use crate::decide::allocation::{
    Capacity, DeviceState, NodeView, Policy, RequestView, ResourceView,
};
use crate::decide::quantity;

/// A node's capacity as the Go operator read it: `status.capacity`, each quantity as a
/// whole number (CPU in cores, memory and storage in bytes). A quantity that is not a
/// whole number (`3500m` CPU) or cannot be read counts as 0, so the node fits nothing
/// that asks for some (the Go operator failed the whole allocation instead).
pub(crate) fn node_view(node: &Node) -> NodeView {
    let capacity = node.status.as_ref().and_then(|s| s.capacity.as_ref());
    let get = |key: &str| -> i64 {
        capacity
            .and_then(|c| c.get(key))
            .and_then(|q| {
                quantity::parse_whole(&q.0)
                    .map_err(|e| tracing::warn!(node = %node.name_any(), key, error = %e, "unreadable capacity"))
                    .ok()
            })
            .unwrap_or(0)
    };
    NodeView {
        name: node.name_any(),
        capacity: Capacity {
            milli_cpu: get("cpu"),
            memory: get("memory"),
            ephemeral_storage: get("ephemeral-storage"),
            pods: get("pods"),
        },
    }
}

/// Nodes in name order, so that "the first node that fits" is stable.
pub(crate) fn node_views(nodes: &[Node]) -> Vec<NodeView> {
    let mut views: Vec<NodeView> = nodes.iter().map(node_view).collect();
    views.sort_by(|a, b| a.name.cmp(&b.name));
    views
}

pub(crate) fn request_view(spec: &ScalarResourceDetails) -> RequestView {
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

pub(crate) fn resource_view(r: &ComposableResource) -> ResourceView {
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
pub(crate) fn samenode_nodes_of_others(
    me: &str,
    requests: &[ComposabilityRequest],
) -> BTreeSet<String> {
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

pub(crate) fn request_summary(r: &ComposabilityRequest) -> RequestSummary {
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

    fn node_with(capacity: &[(&str, &str)], allocatable: &[(&str, &str)]) -> Node {
        let q = |list: &[(&str, &str)]| {
            Some(
                list.iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect(),
            )
        };
        Node {
            metadata: kube::api::ObjectMeta {
                name: Some("n1".into()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                capacity: q(capacity),
                allocatable: q(allocatable),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn node_capacity_as_the_go_operator_read_it() {
        let node = node_with(
            &[
                ("cpu", "4"),
                ("memory", "16Gi"),
                ("ephemeral-storage", "100G"),
                ("pods", "110"),
            ],
            &[
                ("cpu", "3500m"),
                ("memory", "15Gi"),
                ("ephemeral-storage", "90G"),
                ("pods", "100"),
            ],
        );
        // status.capacity, not allocatable; CPU in whole cores (Go's AsInt64).
        assert_eq!(
            node_view(&node).capacity,
            Capacity {
                milli_cpu: 4,
                memory: 16 << 30,
                ephemeral_storage: 100_000_000_000,
                pods: 110
            }
        );
        assert_eq!(node_view(&Node::default()).capacity, Capacity::default());
        // A fractional CPU capacity is no whole number: it fits nothing asking for CPU.
        let odd = node_with(&[("cpu", "3500m"), ("memory", "1Gi")], &[]);
        assert_eq!(node_view(&odd).capacity.milli_cpu, 0);
        assert_eq!(node_view(&odd).capacity.memory, 1 << 30);
    }
}

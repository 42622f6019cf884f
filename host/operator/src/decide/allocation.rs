//! Which devices a ComposabilityRequest keeps, which it drops and where new ones go
//! (NodeAllocating). Pure: the request controller builds the views from the
//! API objects and applies the [`Plan`].

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};

/// The message the Go operator used; users and alerts may match on it.
pub const INSUFFICIENT_NODES: &str = "insufficient number of available nodes";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    SameNode,
    DifferentNode,
}

/// Minimum capacity a node must have (`spec.resource.other_spec`), compared as the Go
/// operator compared it (docs/differences-from-go.md keeps this quirk on purpose): the
/// node's `status.capacity` (not allocatable), with its CPU as whole cores against the
/// request's `milli_cpu` number; memory and ephemeral storage in bytes, pods as a count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Capacity {
    pub(crate) milli_cpu: i64,
    pub(crate) memory: i64,
    pub(crate) ephemeral_storage: i64,
    pub(crate) pods: i64,
}

impl Capacity {
    /// True when `self` (a node's capacity) covers `need` in every dimension.
    pub(crate) fn covers(&self, need: &Capacity) -> bool {
        self.milli_cpu >= need.milli_cpu
            && self.memory >= need.memory
            && self.ephemeral_storage >= need.ephemeral_storage
            && self.pods >= need.pods
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeView {
    pub(crate) name: String,
    pub(crate) capacity: Capacity,
}

/// What the request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestView {
    pub(crate) device_type: String,
    pub(crate) model: String,
    pub(crate) size: usize,
    pub(crate) force_detach: bool,
    pub(crate) policy: Policy,
    pub(crate) target_node: Option<String>,
    pub(crate) other_spec: Option<Capacity>,
}

/// Device states the plan cares about; anything else the API holds is `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceState {
    None,
    Attaching,
    Online,
    Detaching,
    Deleting,
    Other,
}

/// One existing ComposableResource of the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResourceView {
    pub(crate) name: String,
    pub(crate) device_type: String,
    pub(crate) model: String,
    pub(crate) target_node: String,
    pub(crate) force_detach: bool,
    pub(crate) state: DeviceState,
    pub(crate) has_device: bool,
    /// `cohdi.io/delete-device=true`.
    pub(crate) delete_requested: bool,
    /// `cohdi.io/last-used-time` when present and valid, else the creation time.
    pub(crate) last_used: DateTime<Utc>,
    /// The object has a deletion timestamp.
    pub(crate) being_deleted: bool,
}

/// The outcome of NodeAllocating.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Plan {
    /// Resources that stay, by name.
    pub(crate) keep: Vec<String>,
    /// Resources to delete (detach), in the order they should go.
    pub(crate) drop: Vec<String>,
    /// One entry per new device: the node it goes to.
    pub(crate) create: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AllocationError {
    #[error("target node {0} not found")]
    TargetNodeNotFound(String),
    #[error("target node {node} does not have the capacity other_spec asks for")]
    TargetNodeTooSmall { node: String },
    #[error("{INSUFFICIENT_NODES}: need {needed} more, found {found}")]
    InsufficientNodes { needed: usize, found: usize },
    #[error("allocation_policy differentnode cannot be combined with target_node")]
    DifferentNodeWithTarget,
}

/// Decides the request's devices. `other_samenode_nodes` are the nodes other samenode
/// requests already use, which a samenode request without a target avoids.
pub(crate) fn plan(
    request: &RequestView,
    existing: &[ResourceView],
    nodes: &[NodeView],
    other_samenode_nodes: &BTreeSet<String>,
) -> Result<Plan, AllocationError> {
    if request.policy == Policy::DifferentNode && request.target_node.is_some() {
        return Err(AllocationError::DifferentNodeWithTarget);
    }
    let nodes_by_name: BTreeMap<&str, &NodeView> =
        nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let node_fits = |name: &str| match (&request.other_spec, nodes_by_name.get(name)) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(need), Some(node)) => node.capacity.covers(need),
    };

    let (candidates, mut mismatched) = sort_existing(request, existing, &node_fits);
    let samenode_home = match request.policy {
        Policy::DifferentNode => None,
        Policy::SameNode => request
            .target_node
            .clone()
            .or_else(|| busiest_node(&candidates)),
    };
    let kept = choose_kept(request, candidates, samenode_home.as_deref());

    let needed = request.size - kept.keep.len();
    let create = if needed == 0 {
        Vec::new()
    } else {
        match request.policy {
            Policy::SameNode => {
                let node = samenode_node(
                    request,
                    &samenode_home,
                    nodes,
                    &node_fits,
                    other_samenode_nodes,
                )?;
                vec![node; needed]
            }
            Policy::DifferentNode => free_nodes(nodes, &kept.used_nodes, &node_fits, needed)?,
        }
    };

    let Kept {
        keep, mut surplus, ..
    } = kept;
    mismatched.append(&mut surplus);
    mismatched.sort_by(|a, b| drop_order(a, b));
    Ok(Plan {
        keep: keep.iter().map(|r| r.name.clone()).collect(),
        drop: mismatched.iter().map(|r| r.name.clone()).collect(),
        create,
    })
}

/// The existing resources that still count, split into those that match the request
/// (most worth keeping first) and those that do not.
fn sort_existing<'a>(
    request: &RequestView,
    existing: &'a [ResourceView],
    node_fits: &dyn Fn(&str) -> bool,
) -> (Vec<&'a ResourceView>, Vec<&'a ResourceView>) {
    // Resources already on their way out are neither kept nor dropped again.
    let live = existing.iter().filter(|r| {
        !r.being_deleted && !matches!(r.state, DeviceState::Detaching | DeviceState::Deleting)
    });
    let (mut candidates, mismatched): (Vec<&ResourceView>, Vec<&ResourceView>) =
        live.partition(|r| {
            // force_detach is not compared (the Go operator did): the request controller
            // copies it onto the resources instead, so that turning it on to unstick a
            // detach does not replace every device (docs/differences-from-go.md).
            r.device_type == request.device_type
                && r.model == request.model
                && request
                    .target_node
                    .as_ref()
                    .is_none_or(|t| *t == r.target_node)
                // Also false for a node that no longer exists: keeping a device there
                // would pin a samenode request to a node that is gone.
                && node_fits(&r.target_node)
        });
    // Most worth keeping first: the reverse of the order in which surplus is dropped.
    candidates.sort_by(|a, b| drop_order(b, a));
    (candidates, mismatched)
}

/// Which matching resources a plan keeps, and the nodes they are on.
struct Kept<'a> {
    keep: Vec<&'a ResourceView>,
    surplus: Vec<&'a ResourceView>,
    used_nodes: BTreeSet<&'a str>,
}

/// Keeps candidates (best first) up to the request's size where the policy allows them:
/// on the samenode home, or one per node.
fn choose_kept<'a>(
    request: &RequestView,
    candidates: Vec<&'a ResourceView>,
    samenode_home: Option<&str>,
) -> Kept<'a> {
    let mut kept = Kept {
        keep: Vec::new(),
        surplus: Vec::new(),
        used_nodes: BTreeSet::new(),
    };
    for r in candidates {
        let placed_ok = match request.policy {
            Policy::SameNode => samenode_home == Some(r.target_node.as_str()),
            Policy::DifferentNode => !kept.used_nodes.contains(r.target_node.as_str()),
        };
        if kept.keep.len() < request.size && placed_ok {
            kept.used_nodes.insert(r.target_node.as_str());
            kept.keep.push(r);
        } else {
            kept.surplus.push(r);
        }
    }
    kept
}

/// `needed` fitting nodes none of the kept resources is on (differentnode), in the
/// nodes' order.
fn free_nodes(
    nodes: &[NodeView],
    used_nodes: &BTreeSet<&str>,
    node_fits: &dyn Fn(&str) -> bool,
    needed: usize,
) -> Result<Vec<String>, AllocationError> {
    let free: Vec<String> = nodes
        .iter()
        .map(|n| n.name.as_str())
        .filter(|n| !used_nodes.contains(n) && node_fits(n))
        .take(needed)
        .map(str::to_owned)
        .collect();
    if free.len() < needed {
        return Err(AllocationError::InsufficientNodes {
            needed,
            found: free.len(),
        });
    }
    Ok(free)
}

fn samenode_node(
    request: &RequestView,
    home: &Option<String>,
    nodes: &[NodeView],
    node_fits: &dyn Fn(&str) -> bool,
    other_samenode_nodes: &BTreeSet<String>,
) -> Result<String, AllocationError> {
    if let Some(target) = &request.target_node {
        if !nodes.iter().any(|n| n.name == *target) {
            return Err(AllocationError::TargetNodeNotFound(target.clone()));
        }
        if !node_fits(target) {
            return Err(AllocationError::TargetNodeTooSmall {
                node: target.clone(),
            });
        }
        return Ok(target.clone());
    }
    if let Some(home) = home {
        return Ok(home.clone());
    }
    nodes
        .iter()
        .find(|n| node_fits(&n.name) && !other_samenode_nodes.contains(&n.name))
        .map(|n| n.name.clone())
        .ok_or(AllocationError::InsufficientNodes {
            needed: 1,
            found: 0,
        })
}

/// The node holding most of the candidates; on a tie, the one holding the candidate most
/// worth keeping (candidates arrive in that order). Keeping the largest group detaches
/// the fewest devices.
fn busiest_node(candidates: &[&ResourceView]) -> Option<String> {
    let mut counts: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (rank, r) in candidates.iter().enumerate() {
        let entry = counts.entry(r.target_node.as_str()).or_insert((0, rank));
        entry.0 += 1;
    }
    counts
        .into_iter()
        .max_by(|(_, (ca, ra)), (_, (cb, rb))| ca.cmp(cb).then(rb.cmp(ra)))
        .map(|(node, _)| node.to_owned())
}

/// Shrink priority (as the Go operator's): lower class goes first; oldest first within a class.
fn drop_class(r: &ResourceView) -> u8 {
    if !r.has_device {
        0
    } else if r.state == DeviceState::Online && r.delete_requested {
        1
    } else if r.state == DeviceState::Attaching {
        2
    } else if r.state == DeviceState::Online {
        3
    } else {
        4
    }
}

fn drop_order(a: &ResourceView, b: &ResourceView) -> std::cmp::Ordering {
    drop_class(a)
        .cmp(&drop_class(b))
        .then(a.last_used.cmp(&b.last_used))
        .then(a.name.cmp(&b.name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn node(name: &str, cpu: i64) -> NodeView {
        NodeView {
            name: name.into(),
            capacity: Capacity {
                milli_cpu: cpu,
                memory: 64 << 30,
                ephemeral_storage: 100 << 30,
                pods: 110,
            },
        }
    }

    fn request(size: usize, policy: Policy) -> RequestView {
        RequestView {
            device_type: "gpu".into(),
            model: "A100".into(),
            size,
            force_detach: false,
            policy,
            target_node: None,
            other_spec: None,
        }
    }

    fn res(name: &str, node: &str, state: DeviceState, age_min: i64) -> ResourceView {
        ResourceView {
            name: name.into(),
            device_type: "gpu".into(),
            model: "A100".into(),
            target_node: node.into(),
            force_detach: false,
            state,
            has_device: state != DeviceState::None,
            delete_requested: false,
            last_used: Utc.timestamp_opt(1_700_000_000 - age_min * 60, 0).unwrap(),
            being_deleted: false,
        }
    }

    fn nodes3() -> Vec<NodeView> {
        vec![node("n1", 4000), node("n2", 16000), node("n3", 16000)]
    }

    #[test]
    fn samenode_new_request_goes_to_first_fitting_node() {
        let p = plan(
            &request(2, Policy::SameNode),
            &[],
            &nodes3(),
            &BTreeSet::new(),
        )
        .unwrap();
        assert_eq!(p.create, vec!["n1", "n1"]);
        assert!(p.keep.is_empty() && p.drop.is_empty());
    }

    #[test]
    fn samenode_avoids_nodes_of_other_samenode_requests() {
        let taken: BTreeSet<String> = ["n1".to_string()].into();
        let p = plan(&request(1, Policy::SameNode), &[], &nodes3(), &taken).unwrap();
        assert_eq!(p.create, vec!["n2"]);
    }

    #[test]
    fn samenode_grows_on_the_node_it_already_uses() {
        let existing = [res("a", "n2", DeviceState::Online, 5)];
        let p = plan(
            &request(3, Policy::SameNode),
            &existing,
            &nodes3(),
            &BTreeSet::new(),
        )
        .unwrap();
        assert_eq!(p.keep, vec!["a"]);
        assert_eq!(p.create, vec!["n2", "n2"]);
    }

    #[test]
    fn other_spec_skips_small_nodes() {
        let mut r = request(1, Policy::SameNode);
        r.other_spec = Some(Capacity {
            milli_cpu: 8000,
            ..Capacity::default()
        });
        let p = plan(&r, &[], &nodes3(), &BTreeSet::new()).unwrap();
        assert_eq!(p.create, vec!["n2"]);
    }

    #[test]
    fn target_node_must_exist_and_fit() {
        let mut r = request(1, Policy::SameNode);
        r.target_node = Some("gone".into());
        assert_eq!(
            plan(&r, &[], &nodes3(), &BTreeSet::new()),
            Err(AllocationError::TargetNodeNotFound("gone".into()))
        );
        r.target_node = Some("n1".into());
        r.other_spec = Some(Capacity {
            milli_cpu: 8000,
            ..Capacity::default()
        });
        assert_eq!(
            plan(&r, &[], &nodes3(), &BTreeSet::new()),
            Err(AllocationError::TargetNodeTooSmall { node: "n1".into() })
        );
    }

    #[test]
    fn differentnode_spreads_and_reports_too_few_nodes() {
        let p = plan(
            &request(3, Policy::DifferentNode),
            &[],
            &nodes3(),
            &BTreeSet::new(),
        )
        .unwrap();
        assert_eq!(p.create, vec!["n1", "n2", "n3"]);
        let err = plan(
            &request(4, Policy::DifferentNode),
            &[],
            &nodes3(),
            &BTreeSet::new(),
        )
        .unwrap_err();
        assert_eq!(
            err,
            AllocationError::InsufficientNodes {
                needed: 4,
                found: 3
            }
        );
        assert!(err.to_string().starts_with(INSUFFICIENT_NODES));
    }

    #[test]
    fn differentnode_keeps_one_per_node_and_adds_on_unused_nodes() {
        let existing = [
            res("a", "n1", DeviceState::Online, 10),
            res("b", "n1", DeviceState::Online, 5),
        ];
        let p = plan(
            &request(2, Policy::DifferentNode),
            &existing,
            &nodes3(),
            &BTreeSet::new(),
        )
        .unwrap();
        // b was used more recently, so it is the one kept on n1.
        assert_eq!(p.keep, vec!["b"]);
        assert_eq!(p.drop, vec!["a"]);
        assert_eq!(p.create, vec!["n2"]);
    }

    #[test]
    fn differentnode_with_target_is_refused() {
        let mut r = request(1, Policy::DifferentNode);
        r.target_node = Some("n1".into());
        assert_eq!(
            plan(&r, &[], &nodes3(), &BTreeSet::new()),
            Err(AllocationError::DifferentNodeWithTarget)
        );
    }

    #[test]
    fn shrink_drops_in_priority_order_oldest_first() {
        let mut marked = res("marked", "n1", DeviceState::Online, 1);
        marked.delete_requested = true;
        let existing = [
            res("online-old", "n1", DeviceState::Online, 50),
            res("online-new", "n1", DeviceState::Online, 2),
            res("attaching", "n1", DeviceState::Attaching, 3),
            marked,
            res("nodevice", "n1", DeviceState::None, 0),
        ];
        let p = plan(
            &request(1, Policy::SameNode),
            &existing,
            &nodes3(),
            &BTreeSet::new(),
        )
        .unwrap();
        assert_eq!(p.keep, vec!["online-new"]);
        assert_eq!(
            p.drop,
            vec!["nodevice", "marked", "attaching", "online-old"]
        );
        assert!(p.create.is_empty());

        let p = plan(
            &request(3, Policy::SameNode),
            &existing,
            &nodes3(),
            &BTreeSet::new(),
        )
        .unwrap();
        assert_eq!(p.drop, vec!["nodevice", "marked"]);
    }

    #[test]
    fn mismatched_resources_are_dropped_and_replaced() {
        let mut other_model = res("old-model", "n2", DeviceState::Online, 1);
        other_model.model = "H100".into();
        let mut forced = res("forced", "n2", DeviceState::Online, 1);
        forced.force_detach = true;
        let existing = [other_model, forced, res("ok", "n2", DeviceState::Online, 1)];
        let p = plan(
            &request(3, Policy::SameNode),
            &existing,
            &nodes3(),
            &BTreeSet::new(),
        )
        .unwrap();
        // A different force_detach alone is no reason to replace a device.
        let mut keep = p.keep.clone();
        keep.sort();
        assert_eq!(keep, vec!["forced", "ok"]);
        assert_eq!(p.drop, vec!["old-model"]);
        assert_eq!(p.create, vec!["n2"]);
    }

    #[test]
    fn resources_leaving_already_are_ignored() {
        let mut deleting = res("d", "n1", DeviceState::Online, 1);
        deleting.being_deleted = true;
        let existing = [deleting, res("x", "n1", DeviceState::Detaching, 1)];
        let p = plan(
            &request(1, Policy::SameNode),
            &existing,
            &nodes3(),
            &BTreeSet::new(),
        )
        .unwrap();
        assert!(p.keep.is_empty() && p.drop.is_empty());
        assert_eq!(p.create, vec!["n1"]);
    }

    #[test]
    fn samenode_keeps_the_largest_group() {
        let existing = [
            res("lone", "n3", DeviceState::Online, 0),
            res("p1", "n2", DeviceState::Online, 9),
            res("p2", "n2", DeviceState::Online, 8),
        ];
        let p = plan(
            &request(2, Policy::SameNode),
            &existing,
            &nodes3(),
            &BTreeSet::new(),
        )
        .unwrap();
        assert_eq!(p.keep.len(), 2);
        assert!(p.keep.contains(&"p1".to_string()) && p.keep.contains(&"p2".to_string()));
        assert_eq!(p.drop, vec!["lone"]);
    }

    #[test]
    fn target_node_change_moves_devices() {
        let existing = [res("a", "n1", DeviceState::Online, 1)];
        let mut r = request(1, Policy::SameNode);
        r.target_node = Some("n3".into());
        let p = plan(&r, &existing, &nodes3(), &BTreeSet::new()).unwrap();
        assert_eq!(p.drop, vec!["a"]);
        assert_eq!(p.create, vec!["n3"]);
    }

    #[test]
    fn devices_on_a_vanished_node_are_replaced() {
        let existing = [
            res("a", "gone", DeviceState::Online, 1),
            res("b", "gone", DeviceState::Online, 2),
        ];
        let p = plan(
            &request(2, Policy::SameNode),
            &existing,
            &nodes3(),
            &BTreeSet::new(),
        )
        .unwrap();
        assert!(p.keep.is_empty());
        assert_eq!(p.drop.len(), 2);
        assert_eq!(p.create, vec!["n1", "n1"]);
    }

    #[test]
    fn size_zero_drops_everything() {
        let existing = [
            res("a", "n1", DeviceState::Online, 1),
            res("b", "n1", DeviceState::Attaching, 1),
        ];
        let p = plan(
            &request(0, Policy::SameNode),
            &existing,
            &nodes3(),
            &BTreeSet::new(),
        )
        .unwrap();
        assert!(p.keep.is_empty() && p.create.is_empty());
        assert_eq!(p.drop, vec!["b", "a"]);
    }
}

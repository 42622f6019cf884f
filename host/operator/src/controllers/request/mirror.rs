//! `status.resources` of a request: each ComposableResource's state, ids, node and error.

use std::collections::BTreeMap;

use cro_api::{ComposabilityRequestStatus, ComposableResource, ScalarResourceStatus};
use kube::ResourceExt;

pub(crate) type Entries = BTreeMap<String, ScalarResourceStatus>;

pub(crate) fn entry_of(r: &ComposableResource) -> ScalarResourceStatus {
    let status = r.status.clone().unwrap_or_default();
    ScalarResourceStatus {
        state: status.state,
        device_id: status.device_id,
        cdi_device_id: status.cdi_device_id,
        node_name: r.spec.target_node.clone(),
        error: status.error,
    }
}

/// `wanted` with every entry that has an object refreshed from it.
pub(crate) fn mirrored(wanted: &Entries, objects: &[ComposableResource]) -> Entries {
    wanted
        .iter()
        .map(|(name, entry)| {
            let fresh = objects
                .iter()
                .find(|o| o.name_any() == *name)
                .map(entry_of)
                .unwrap_or_else(|| entry.clone());
            (name.clone(), fresh)
        })
        .collect()
}

/// Whether `new` differs from `old` only by progress of its devices a user can wait for:
/// the same request state, error, conditions and devices, none of them gaining or losing
/// an error.
/// Such a change may be written late, together with the next (`Context::progress_wait`); anything else
/// is written at once. A device's first state may be late too: a resource whose entry
/// still says Empty and whose object is gone is then made again on its node, or the
/// request is planned again when the node is gone (`converge::create_missing`).
pub(crate) fn only_progress(
    old: &ComposabilityRequestStatus,
    new: &ComposabilityRequestStatus,
) -> bool {
    old.state == new.state
        && old.error == new.error
        && old.conditions == new.conditions
        && old.resources.len() == new.resources.len()
        && old.resources.iter().all(|(name, was)| {
            new.resources
                .get(name)
                .is_some_and(|now| was.error.is_empty() == now.error.is_empty())
        })
}

/// Longest part of one resource's error in a request's summary.
const MAX_ONE_ERROR: usize = 400;
/// How many failing resources a summary lists by name.
const MAX_LISTED: usize = 5;

/// `status.error` of a request: which of its resources fail and why, in name order
/// ("" when none does), e.g. `1 of 2 devices failing: gpu-1 (worker-1, Attaching): …`.
pub(crate) fn summary(entries: &Entries) -> String {
    let failing: Vec<(&String, &ScalarResourceStatus)> = entries
        .iter()
        .filter(|(_, e)| !e.error.is_empty())
        .collect();
    if failing.is_empty() {
        return String::new();
    }
    let mut parts: Vec<String> = failing
        .iter()
        .take(MAX_LISTED)
        .map(|(name, e)| {
            let state = if e.state.as_str().is_empty() {
                "new"
            } else {
                e.state.as_str()
            };
            format!(
                "{name} ({}, {state}): {}",
                if e.node_name.is_empty() {
                    "no node"
                } else {
                    &e.node_name
                },
                crate::text::clip(&e.error, MAX_ONE_ERROR)
            )
        })
        .collect();
    if failing.len() > MAX_LISTED {
        parts.push(format!("and {} more", failing.len() - MAX_LISTED));
    }
    format!(
        "{} of {} devices failing: {}",
        failing.len(),
        entries.len(),
        parts.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use cro_api::ResourceState;

    fn entry(state: ResourceState, node: &str, error: &str) -> ScalarResourceStatus {
        ScalarResourceStatus {
            state,
            node_name: node.into(),
            error: error.into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_summary_names_each_failing_resource_with_its_node_state_and_error() {
        let mut entries = Entries::new();
        entries.insert("gpu-a".into(), entry(ResourceState::Online, "w1", ""));
        assert_eq!(summary(&entries), "");
        entries.insert(
            "gpu-b".into(),
            entry(ResourceState::Attaching, "w1", "exec failed"),
        );
        entries.insert(
            "gpu-c".into(),
            entry(ResourceState::Online, "w2", "not found: GPU-9"),
        );
        assert_eq!(
            summary(&entries),
            "2 of 3 devices failing: gpu-b (w1, Attaching): exec failed; gpu-c (w2, Online): not found: GPU-9"
        );
    }

    fn status(
        state: cro_api::RequestState,
        entries: &[(&str, ScalarResourceStatus)],
    ) -> ComposabilityRequestStatus {
        ComposabilityRequestStatus {
            state,
            resources: entries
                .iter()
                .map(|(n, e)| (n.to_string(), e.clone()))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn device_progress_may_wait_but_not_a_state_or_an_error() {
        use cro_api::RequestState::{Running, Updating};
        let attaching = entry(ResourceState::Attaching, "w1", "");
        let online = entry(ResourceState::Online, "w1", "");
        let new = entry(ResourceState::Empty, "w1", "");
        let failing = entry(ResourceState::Attaching, "w1", "exec failed");
        let old = status(
            Updating,
            &[("a", attaching.clone()), ("b", attaching.clone())],
        );
        let progress = status(Updating, &[("a", online.clone()), ("b", attaching.clone())]);
        assert!(only_progress(&old, &progress));
        // The request's state changes: at once.
        let running = status(Running, &[("a", online.clone()), ("b", online.clone())]);
        assert!(!only_progress(&old, &running));
        // A device gains an error (the request's error changes with it): at once.
        let mut broken = status(
            Updating,
            &[("a", failing.clone()), ("b", attaching.clone())],
        );
        assert!(!only_progress(&old, &broken));
        broken.error = old.error.clone();
        assert!(!only_progress(&old, &broken), "an entry's own error too");
        // A device seen for the first time: progress too.
        let unseen = status(Updating, &[("a", new.clone()), ("b", attaching.clone())]);
        assert!(only_progress(&unseen, &old));
        // A device added or dropped: at once.
        let more = status(Updating, &[("a", attaching.clone())]);
        assert!(!only_progress(&old, &more));
        assert!(!only_progress(&more, &old));
    }

    #[test]
    fn long_summaries_are_bounded() {
        let mut entries = Entries::new();
        for i in 0..8 {
            entries.insert(
                format!("gpu-{i}"),
                entry(ResourceState::Attaching, "w", &"x".repeat(5000)),
            );
        }
        let s = summary(&entries);
        assert!(s.ends_with("and 3 more"), "{s}");
        assert!(s.len() < 5 * (MAX_ONE_ERROR + 40) + 60, "{}", s.len());
    }
}

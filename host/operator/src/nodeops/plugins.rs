//! Making the cluster notice a GPU that came or went: restarting the device plugin and
//! DCGM daemonsets, or the DRA kubelet plugin pod of one node.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};

use super::NodeOpsError;

pub(crate) const DEFAULT_GPU_OPERATOR_NAMESPACE: &str = "gpu-operator";
pub(crate) const DEVICE_PLUGIN_DAEMONSETS: [&str; 2] =
    ["nvidia-device-plugin-daemonset", "nvidia-dcgm"];
pub(crate) const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";
/// Names of the DRA kubelet plugin's pods: the charts of the v0.2.0 era, and later ones.
pub(crate) const DRA_PLUGIN_POD_PREFIXES: [&str; 2] = [
    "nvidia-dra-driver-gpu-kubelet-plugin",
    "dra-driver-nvidia-gpu-kubelet-plugin",
];
/// A DRA kubelet plugin pod younger than this is still starting after the previous
/// restart; deleting it again would only restart it over and over.
const MIN_PLUGIN_POD_AGE_SECS: i64 = 10;
/// A daemonset restarted more recently than this is left alone: a restart is in flight.
const MIN_RESTART_INTERVAL_SECS: i64 = 10;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RestartDecision {
    Restart,
    Skip(&'static str),
}

/// Whether a daemonset may be restarted now (docs/node-operations.md: skipped with 0
/// desired pods, when not fully ready, or restarted less than 10 s ago).
pub(crate) fn restart_decision(ds: &DaemonSet, now: DateTime<Utc>) -> RestartDecision {
    let Some(status) = &ds.status else {
        return RestartDecision::Skip("no status yet");
    };
    if status.desired_number_scheduled == 0 {
        return RestartDecision::Skip("no desired pods");
    }
    if status.number_ready < status.desired_number_scheduled
        || status.updated_number_scheduled.unwrap_or(0) < status.desired_number_scheduled
    {
        return RestartDecision::Skip("not fully ready");
    }
    let last = ds
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(RESTARTED_AT))
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok());
    if let Some(last) = last
        && now
            .signed_duration_since(last.with_timezone(&Utc))
            .num_seconds()
            < MIN_RESTART_INTERVAL_SECS
    {
        return RestartDecision::Skip("restarted less than 10 s ago");
    }
    RestartDecision::Restart
}

/// The device plugin restarts this process made, and when: a DaemonSet read from the
/// watch cache a moment after a restart may not show its `restartedAt` yet, and two
/// attaches deciding at once would both restart it. Deciding and recording here under
/// one lock restarts each DaemonSet at most once per [`MIN_RESTART_INTERVAL_SECS`] from
/// this process, whatever its cache shows.
#[derive(Default)]
pub(crate) struct Restarts {
    made: std::sync::Mutex<HashMap<String, DateTime<Utc>>>,
}

impl Restarts {
    /// Whether `name` (as `ds` shows it) may be restarted at `now`; a restart is
    /// recorded as made when it may.
    fn decide(&self, name: &str, ds: &DaemonSet, now: DateTime<Utc>) -> RestartDecision {
        let mut made = self
            .made
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let decision = match made.get(name) {
            Some(last) if recent(*last, now) => {
                RestartDecision::Skip("restarted less than 10 s ago")
            }
            _ => restart_decision(ds, now),
        };
        if decision == RestartDecision::Restart {
            made.insert(name.to_owned(), now);
        }
        decision
    }

    /// Forgets a restart whose write failed, so that the next GPU change tries again.
    fn failed(&self, name: &str, at: DateTime<Utc>) {
        let mut made = self
            .made
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if made.get(name) == Some(&at) {
            made.remove(name);
        }
    }
}

fn recent(last: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    now.signed_duration_since(last).num_seconds() < MIN_RESTART_INTERVAL_SECS
}

/// Restarts the device plugin and DCGM daemonsets where allowed; a missing one is
/// skipped (DCGM is optional). `cached` answers from the watch cache (`None`: it has not
/// listed, so the API server is asked; `Some(None)`: no such DaemonSet).
pub(crate) async fn restart_device_plugins(
    client: &kube::Client,
    namespace: &str,
    cached: impl Fn(&str) -> Option<Option<std::sync::Arc<DaemonSet>>>,
    restarts: &Restarts,
) -> Result<Vec<String>, NodeOpsError> {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let mut restarted = Vec::new();
    for name in DEVICE_PLUGIN_DAEMONSETS {
        let ds = match cached(name) {
            Some(ds) => ds,
            None => api.get_opt(name).await?.map(std::sync::Arc::new),
        };
        let Some(ds) = ds else {
            tracing::debug!(namespace, name, "daemonset not found; not restarted");
            continue;
        };
        let now = Utc::now();
        match restarts.decide(name, &ds, now) {
            RestartDecision::Skip(why) => tracing::debug!(namespace, name, why, "restart skipped"),
            RestartDecision::Restart => {
                let patch = serde_json::json!({"spec": {"template": {"metadata": {"annotations": {
                    RESTARTED_AT: now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                }}}}});
                if let Err(e) = api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    restarts.failed(name, now);
                    return Err(e.into());
                }
                restarted.push(name.to_owned());
            }
        }
    }
    Ok(restarted)
}

/// Whether a pod is one of the DRA kubelet plugin's, by either naming.
pub(crate) fn is_dra_plugin_pod(name: &str) -> bool {
    DRA_PLUGIN_POD_PREFIXES.iter().any(|p| {
        name.strip_prefix(p)
            .is_some_and(|rest| rest.starts_with('-'))
    })
}

/// Whether the DRA kubelet plugin pod `pod` may be deleted (restarted) now.
pub(crate) fn plugin_restart_decision(pod: &Pod, now: DateTime<Utc>) -> RestartDecision {
    if pod.metadata.deletion_timestamp.is_some() {
        return RestartDecision::Skip("already being deleted");
    }
    let Some(created) = pod.metadata.creation_timestamp.as_ref() else {
        return RestartDecision::Restart;
    };
    let created = created.0.as_second();
    if now.timestamp().saturating_sub(created) < MIN_PLUGIN_POD_AGE_SECS {
        return RestartDecision::Skip("younger than 10 s: still starting");
    }
    RestartDecision::Restart
}

/// Deletes the DRA kubelet plugin pod on `node` so that it rescans the node's GPUs;
/// returns how many were deleted (0 when the pod is still starting).
pub(crate) async fn restart_dra_plugin(
    client: &kube::Client,
    node: &str,
) -> Result<usize, NodeOpsError> {
    let pods: Api<Pod> = Api::all(client.clone());
    // By name, not label: the two chart generations label their pods differently.
    let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let mut deleted = 0;
    let now = Utc::now();
    for pod in pods.list(&params).await?.items {
        let decision = plugin_restart_decision(&pod, now);
        let (Some(name), Some(ns)) = (pod.metadata.name, pod.metadata.namespace) else {
            continue;
        };
        if !is_dra_plugin_pod(&name) {
            continue;
        }
        if let RestartDecision::Skip(why) = decision {
            tracing::debug!(pod = %name, node, why, "DRA kubelet plugin not restarted");
            continue;
        }
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => deleted += 1,
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{DaemonSetSpec, DaemonSetStatus};
    use k8s_openapi::api::core::v1::PodTemplateSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn ds(desired: i32, ready: i32, restarted: Option<&str>) -> DaemonSet {
        DaemonSet {
            spec: DaemonSetSpec {
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        annotations: restarted
                            .map(|t| [(RESTARTED_AT.to_string(), t.to_string())].into()),
                        ..Default::default()
                    }),
                    spec: None,
                },
                ..Default::default()
            },
            status: Some(DaemonSetStatus {
                desired_number_scheduled: desired,
                number_ready: ready,
                updated_number_scheduled: Some(ready),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_restart_this_process_made_holds_whatever_a_stale_cache_shows() {
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        let restarts = Restarts::default();
        // The cache shows the DaemonSet ready and last restarted long ago: restart, once.
        let stale = ds(2, 2, Some("2026-01-01T00:00:00Z"));
        let t0 = at("2026-01-01T01:00:00Z");
        assert_eq!(
            restarts.decide("nvidia-dcgm", &stale, t0),
            RestartDecision::Restart
        );
        // A moment later the cache still shows the old copy: not again.
        assert_eq!(
            restarts.decide("nvidia-dcgm", &stale, at("2026-01-01T01:00:05Z")),
            RestartDecision::Skip("restarted less than 10 s ago")
        );
        // The other DaemonSet is decided on its own.
        assert_eq!(
            restarts.decide("nvidia-device-plugin-daemonset", &stale, t0),
            RestartDecision::Restart
        );
        // 10 s on, the DaemonSet's own state decides again.
        let later = at("2026-01-01T01:00:10Z");
        assert_eq!(
            restarts.decide("nvidia-dcgm", &ds(2, 1, None), later),
            RestartDecision::Skip("not fully ready")
        );
        assert_eq!(
            restarts.decide("nvidia-dcgm", &stale, later),
            RestartDecision::Restart
        );
        // A restart whose write failed is forgotten: the next change tries again.
        restarts.failed("nvidia-dcgm", later);
        assert_eq!(
            restarts.decide("nvidia-dcgm", &stale, at("2026-01-01T01:00:11Z")),
            RestartDecision::Restart
        );
    }

    #[test]
    fn both_dra_plugin_namings_are_recognised() {
        assert!(is_dra_plugin_pod(
            "nvidia-dra-driver-gpu-kubelet-plugin-x7k2p"
        ));
        assert!(is_dra_plugin_pod(
            "dra-driver-nvidia-gpu-kubelet-plugin-abcde"
        ));
        assert!(!is_dra_plugin_pod("nvidia-dra-driver-gpu-controller-abcde"));
        assert!(!is_dra_plugin_pod("dra-driver-nvidia-gpu-kubelet-pluginx"));
        assert!(!is_dra_plugin_pod("nvidia-device-plugin-daemonset-abcde"));
    }

    #[test]
    fn young_plugin_pods_are_not_restarted() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        let pod = |created: &str| Pod {
            metadata: ObjectMeta {
                creation_timestamp: Some(Time(created.parse().unwrap())),
                ..Default::default()
            },
            ..Default::default()
        };
        let now = at("2026-01-01T00:00:30Z");
        assert_eq!(
            plugin_restart_decision(&pod("2026-01-01T00:00:25Z"), now),
            RestartDecision::Skip("younger than 10 s: still starting")
        );
        assert_eq!(
            plugin_restart_decision(&pod("2026-01-01T00:00:20Z"), now),
            RestartDecision::Restart
        );
        let mut deleting = pod("2026-01-01T00:00:00Z");
        deleting.metadata.deletion_timestamp = Some(Time("2026-01-01T00:00:29Z".parse().unwrap()));
        assert_eq!(
            plugin_restart_decision(&deleting, now),
            RestartDecision::Skip("already being deleted")
        );
    }

    #[test]
    fn restart_rules() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T00:00:30Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(
            restart_decision(&ds(0, 0, None), now),
            RestartDecision::Skip("no desired pods")
        );
        assert_eq!(
            restart_decision(&ds(3, 2, None), now),
            RestartDecision::Skip("not fully ready")
        );
        assert_eq!(
            restart_decision(&ds(3, 3, Some("2026-01-01T00:00:25Z")), now),
            RestartDecision::Skip("restarted less than 10 s ago")
        );
        assert_eq!(
            restart_decision(&ds(3, 3, Some("2026-01-01T00:00:10Z")), now),
            RestartDecision::Restart
        );
        assert_eq!(
            restart_decision(&ds(3, 3, Some("garbage")), now),
            RestartDecision::Restart
        );
        assert_eq!(
            restart_decision(&ds(3, 3, None), now),
            RestartDecision::Restart
        );
    }
}

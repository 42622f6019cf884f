//! The `Ready` condition of both kinds, derived from `status.state` and `status.error`.
//!
//! It is written together with `status.error` at the end of every reconciliation (see
//! [`crate::plumbing::reconcile::run`]), so it always describes the state the reconciliation left.
//! `lastTransitionTime` moves only when the condition's status flips, as the Kubernetes
//! API conventions ask; reason, message and observedGeneration follow every change.

use cro_api::{ComposabilityRequest, ComposableResource, RequestState, ResourceState};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;

use crate::plumbing::patch::{ReportPatch, ResourceStatusPatch};

/// The condition type this module maintains.
pub(crate) const READY: &str = "Ready";

/// Ready=False reasons of an Online resource whose health check failed
/// (docs/troubleshooting.md): the fabric no longer reports the device, or reports it
/// critical. The state stays `Online`, as the Go operator left it.
pub(crate) const DEVICE_MISSING: &str = "DeviceMissing";
pub(crate) const DEVICE_CRITICAL: &str = "DeviceCritical";
/// Ready=False reason of a Running request some of whose resources are not Ready.
pub(crate) const DEVICES_NOT_READY: &str = "DevicesNotReady";
/// Ready=False reasons of an Attaching resource whose device the fabric attached and
/// that waits on its node (docs/troubleshooting.md): for the NVIDIA driver pod, or for
/// the GPU to show up (nvidia-smi, or a ResourceSlice). Nothing failed: `status.error`
/// stays empty. The attach writes them itself ([`wait_patch`]); they stay while the
/// resource is Attaching and no error is reported.
pub(crate) const WAITING_FOR_DRIVER: &str = "WaitingForDriver";
pub(crate) const WAITING_FOR_DEVICE: &str = "WaitingForDevice";
const WAITS: [&str; 2] = [WAITING_FOR_DRIVER, WAITING_FOR_DEVICE];

/// Longest message the API server accepts in a condition.
const MAX_MESSAGE: usize = 32768;

/// What the `Ready` condition should say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Readiness {
    pub(crate) ready: bool,
    /// CamelCase, as the condition schema requires.
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

impl Readiness {
    fn not_ready(error: &str, reason: &'static str, message: impl Into<String>) -> Self {
        if error.is_empty() {
            Self {
                ready: false,
                reason,
                message: message.into(),
            }
        } else {
            Self {
                ready: false,
                reason: "Error",
                message: error.to_owned(),
            }
        }
    }
}

/// A kind whose status carries `error` and `conditions`.
pub(crate) trait Reported: Resource<DynamicType = ()> {
    fn status_error(&self) -> &str;
    fn conditions(&self) -> &[Condition];
    /// `status.state` as written ("" for a new object).
    fn state_name(&self) -> String;
    /// The Ready condition this object should have if its `status.error` were `error`.
    fn readiness(&self, error: &str) -> Readiness;
}

impl Reported for ComposabilityRequest {
    fn status_error(&self) -> &str {
        self.status.as_ref().map(|s| s.error.as_str()).unwrap_or("")
    }

    fn state_name(&self) -> String {
        self.state().as_str().to_owned()
    }

    fn conditions(&self) -> &[Condition] {
        self.status
            .as_ref()
            .map(|s| &s.conditions[..])
            .unwrap_or(&[])
    }

    fn readiness(&self, error: &str) -> Readiness {
        let devices = self.status.as_ref().map(|s| s.resources.len()).unwrap_or(0);
        request_readiness(&self.state(), error, devices)
    }
}

impl Reported for ComposableResource {
    fn status_error(&self) -> &str {
        self.status.as_ref().map(|s| s.error.as_str()).unwrap_or("")
    }

    fn state_name(&self) -> String {
        self.state().as_str().to_owned()
    }

    fn conditions(&self) -> &[Condition] {
        self.status
            .as_ref()
            .map(|s| &s.conditions[..])
            .unwrap_or(&[])
    }

    fn readiness(&self, error: &str) -> Readiness {
        let state = self.state();
        if error.is_empty()
            && state == ResourceState::Attaching
            && let Some(wait) = current_wait(self.conditions())
        {
            return wait;
        }
        resource_readiness(
            &state,
            error,
            self.device_id().unwrap_or("?"),
            &self.spec.target_node,
        )
    }
}

/// The wait the Ready condition names now, if it names one.
fn current_wait(conditions: &[Condition]) -> Option<Readiness> {
    let ready = conditions.iter().find(|c| c.type_ == READY)?;
    let reason = WAITS.into_iter().find(|w| *w == ready.reason)?;
    (ready.status == "False").then(|| Readiness {
        ready: false,
        reason,
        message: ready.message.clone(),
    })
}

/// The status patch that says an Attaching resource waits on its node: Ready False with
/// `reason` ([`WAITING_FOR_DRIVER`] or [`WAITING_FOR_DEVICE`]) and `message`, and no
/// error; `None` when the resource says so already.
pub(crate) fn wait_patch(
    res: &ComposableResource,
    reason: &'static str,
    message: &str,
    now: Timestamp,
) -> Option<ReportPatch> {
    let readiness = Readiness {
        ready: false,
        reason,
        message: message.to_owned(),
    };
    let patch = ReportPatch {
        error: (!res.status_error().is_empty()).then(String::new),
        conditions: with_ready(res.conditions(), &readiness, res.meta().generation, now),
    };
    (patch != ReportPatch::default()).then_some(patch)
}

/// Ready while Running. An error on a Running request (a failed reconciliation) does
/// not take its attached devices away, so it only shows in the message.
pub(crate) fn request_readiness(state: &RequestState, error: &str, devices: usize) -> Readiness {
    match state {
        RequestState::Running => Readiness {
            ready: true,
            reason: "Running",
            message: if error.is_empty() {
                format!("all {devices} devices are online")
            } else {
                error.to_owned()
            },
        },
        RequestState::Empty | RequestState::NodeAllocating => {
            Readiness::not_ready(error, "Allocating", "choosing nodes for the devices")
        }
        RequestState::Updating => Readiness::not_ready(
            error,
            "Updating",
            "attaching or removing devices until every one is online",
        ),
        RequestState::Cleaning => Readiness::not_ready(
            error,
            "Cleaning",
            "detaching every device before the request is deleted",
        ),
        RequestState::Deleting => Readiness::not_ready(error, "Deleting", "being deleted"),
        RequestState::Unknown(s) => {
            Readiness::not_ready(error, "UnknownState", format!("unknown state {s:?}"))
        }
    }
}

/// Ready while Online; a health warning while Online only shows in the message. (A
/// device the fabric lost or reports critical is not Ready: the health check says so
/// through [`report_patch`]'s `not_ready`, see [`DEVICE_MISSING`].)
pub(crate) fn resource_readiness(
    state: &ResourceState,
    error: &str,
    device: &str,
    node: &str,
) -> Readiness {
    match state {
        ResourceState::Online => Readiness {
            ready: true,
            reason: "Online",
            message: if error.is_empty() {
                format!("device {device} is online on node {node}")
            } else {
                error.to_owned()
            },
        },
        ResourceState::Empty => {
            Readiness::not_ready(error, "Pending", "waiting for the operator to start")
        }
        ResourceState::Attaching => Readiness::not_ready(
            error,
            "Attaching",
            format!("attaching a device to node {node}"),
        ),
        ResourceState::Detaching => Readiness::not_ready(
            error,
            "Detaching",
            format!("detaching device {device} from node {node}"),
        ),
        ResourceState::Deleting => Readiness::not_ready(error, "Deleting", "being deleted"),
        ResourceState::Unknown(s) => {
            Readiness::not_ready(error, "UnknownState", format!("unknown state {s:?}"))
        }
    }
}

/// The generation the Ready condition was written for, if any.
fn ready_generation<K: Reported>(obj: &K) -> Option<i64> {
    obj.conditions()
        .iter()
        .find(|c| c.type_ == READY)
        .and_then(|c| c.observed_generation)
}

/// `conditions` with Ready set to `readiness`, or `None` when Ready already says that.
/// The transition time is kept unless the status (True/False) changes.
pub(crate) fn with_ready(
    conditions: &[Condition],
    readiness: &Readiness,
    generation: Option<i64>,
    now: Timestamp,
) -> Option<Vec<Condition>> {
    let status = if readiness.ready { "True" } else { "False" };
    let existing = conditions.iter().position(|c| c.type_ == READY);
    let last_transition_time = existing
        .map(|i| &conditions[i])
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    let ready = Condition {
        type_: READY.to_owned(),
        status: status.to_owned(),
        reason: readiness.reason.to_owned(),
        message: crate::text::clip(&readiness.message, MAX_MESSAGE).to_owned(),
        last_transition_time,
        observed_generation: generation,
    };
    let mut out = conditions.to_vec();
    match existing {
        Some(i) if out[i] == ready => return None,
        Some(i) => out[i] = ready,
        None => out.push(ready),
    }
    Some(out)
}

/// `patch` with the Ready condition `res` will carry once `patch` is written folded in, so
/// a state and its condition are one write, not two (each write is a watch event every
/// watch of resources decodes, and wakes the resource again): the report after the
/// reconciliation (`reconcile::report_success`) then finds the condition in place.
pub(crate) fn with_ready_after(
    res: &ComposableResource,
    mut patch: ResourceStatusPatch,
    now: Timestamp,
) -> ResourceStatusPatch {
    let mut preview = res.clone();
    let status = preview.status.get_or_insert_with(Default::default);
    if let Some(state) = &patch.state {
        status.state = state.clone();
    }
    if let Some(error) = &patch.error {
        status.error = error.clone();
    }
    if let Some(id) = &patch.device_id {
        status.device_id = id.clone();
    }
    if let Some(id) = &patch.cdi_device_id {
        status.cdi_device_id = id.clone();
    }
    let error = status.error.clone();
    patch.conditions = report_patch(&preview, &error, None, now).and_then(|r| r.conditions);
    patch
}

/// The status patch that records `error` and the Ready condition it implies on `obj`, or
/// `None` when both are already there.
///
/// `not_ready` overrides what state and error imply: the reconciliation found the object
/// not Ready for a reason of its own (a device the fabric lost, a request whose devices
/// are not all Ready), with `error` as the message.
pub(crate) fn report_patch<K: Reported>(
    obj: &K,
    error: &str,
    not_ready: Option<&'static str>,
    now: Timestamp,
) -> Option<ReportPatch> {
    // Provider text ends up here: clip it like the condition's message.
    let error = crate::text::clip(error, MAX_MESSAGE);
    let readiness = match not_ready {
        Some(reason) => Readiness {
            ready: false,
            reason,
            message: if error.is_empty() {
                reason.to_owned()
            } else {
                error.to_owned()
            },
        },
        None => obj.readiness(error),
    };
    let mut conditions = with_ready(obj.conditions(), &readiness, obj.meta().generation, now);
    // The API server counts a deletion as a new generation (of an object holding a
    // finalizer): a Ready condition that says the same for the generation before needs no
    // write of its own (it comes with the next state written, if any: a request being
    // deleted that is gone before `Cleaning` is due writes nothing).
    if conditions.is_some()
        && obj.meta().deletion_timestamp.is_some()
        && with_ready(obj.conditions(), &readiness, ready_generation(obj), now).is_none()
    {
        conditions = None;
    }
    let patch = ReportPatch {
        error: (obj.status_error() != error).then(|| error.to_owned()),
        conditions,
    };
    (patch != ReportPatch::default()).then_some(patch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cro_api::{ComposabilityRequestStatus, ComposableResourceStatus, ResourceType};
    use serde_json::{Value, json};

    fn report(obj: &impl Reported, error: &str, now: Timestamp) -> Option<Value> {
        report_patch(obj, error, None, now).map(|p| serde_json::to_value(p).unwrap())
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn ready(conditions: &[Condition]) -> &Condition {
        conditions.iter().find(|c| c.type_ == READY).unwrap()
    }

    #[test]
    fn the_transition_time_moves_only_when_the_status_flips() {
        let t0 = at("2026-01-01T00:00:00Z");
        let attaching = resource_readiness(&ResourceState::Attaching, "", "?", "n1");
        let first = with_ready(&[], &attaching, Some(1), t0).unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(
            (ready(&first).status.as_str(), ready(&first).reason.as_str()),
            ("False", "Attaching")
        );
        assert_eq!(ready(&first).last_transition_time, Time(t0));
        assert_eq!(ready(&first).observed_generation, Some(1));

        // Same readiness again: nothing to write.
        assert_eq!(
            with_ready(&first, &attaching, Some(1), at("2026-01-01T00:01:00Z")),
            None
        );

        // Still False but now an error: reason and message change, the time does not.
        let failing = resource_readiness(&ResourceState::Attaching, "fabric down", "?", "n1");
        let second = with_ready(&first, &failing, Some(1), at("2026-01-01T00:02:00Z")).unwrap();
        assert_eq!(
            (
                ready(&second).reason.as_str(),
                ready(&second).message.as_str()
            ),
            ("Error", "fabric down")
        );
        assert_eq!(ready(&second).last_transition_time, Time(t0));

        // A new generation alone is recorded without a transition.
        let third = with_ready(&second, &failing, Some(2), at("2026-01-01T00:03:00Z")).unwrap();
        assert_eq!(ready(&third).observed_generation, Some(2));
        assert_eq!(ready(&third).last_transition_time, Time(t0));

        // Flipping to True moves the time, and so does flipping back.
        let t4 = at("2026-01-01T00:04:00Z");
        let online = resource_readiness(&ResourceState::Online, "", "GPU-1", "n1");
        let fourth = with_ready(&third, &online, Some(2), t4).unwrap();
        assert_eq!(
            (
                ready(&fourth).status.as_str(),
                ready(&fourth).reason.as_str()
            ),
            ("True", "Online")
        );
        assert_eq!(ready(&fourth).last_transition_time, Time(t4));
        let t5 = at("2026-01-01T00:05:00Z");
        let detaching = resource_readiness(&ResourceState::Detaching, "", "GPU-1", "n1");
        let fifth = with_ready(&fourth, &detaching, Some(2), t5).unwrap();
        assert_eq!(ready(&fifth).last_transition_time, Time(t5));
    }

    /// A deletion alone (the API server's new generation of an object holding a
    /// finalizer) is no Ready write; an error met while being deleted is.
    #[test]
    fn a_deletion_alone_does_not_rewrite_the_ready_condition() {
        use cro_api::{ComposabilityRequest, RequestState};
        let t0 = at("2026-01-01T00:00:00Z");
        let mut req: ComposabilityRequest = serde_json::from_value(json!({
            "apiVersion": "cro.hpsys.ibm.ie.com/v1alpha1",
            "kind": "ComposabilityRequest",
            "metadata": {"name": "r", "generation": 1},
            "spec": {"resource": {"type": "gpu", "model": "A100", "size": 1}},
        }))
        .unwrap();
        let running = request_readiness(&RequestState::Running, "", 0);
        req.status = Some(ComposabilityRequestStatus {
            state: RequestState::Running,
            conditions: with_ready(&[], &running, Some(1), t0).unwrap(),
            ..Default::default()
        });
        let later = at("2026-01-01T00:01:00Z");
        assert!(report_patch(&req, "", None, later).is_none());
        // Deleted: generation 2, deletionTimestamp set.
        req.metadata.generation = Some(2);
        req.metadata.deletion_timestamp = Some(Time(later));
        assert!(report_patch(&req, "", None, later).is_none());
        let failing = report(&req, "GPU busy", later).expect("an error is written");
        assert_eq!(failing["error"], "GPU busy");
        assert_eq!(failing["conditions"][0]["observedGeneration"], 2);
        // Not being deleted, a new generation is recorded.
        req.metadata.deletion_timestamp = None;
        assert!(report_patch(&req, "", None, later).is_some());
    }

    #[test]
    fn other_conditions_are_kept_in_place() {
        let other = Condition {
            type_: "Degraded".into(),
            status: "False".into(),
            reason: "Fine".into(),
            message: String::new(),
            last_transition_time: Time(at("2025-01-01T00:00:00Z")),
            observed_generation: None,
        };
        let readiness = request_readiness(&RequestState::Running, "", 2);
        let out = with_ready(
            std::slice::from_ref(&other),
            &readiness,
            Some(3),
            at("2026-01-01T00:00:00Z"),
        )
        .unwrap();
        assert_eq!(out[0], other);
        assert_eq!(out[1].message, "all 2 devices are online");
        let again = with_ready(&out, &readiness, Some(3), at("2026-02-01T00:00:00Z"));
        assert_eq!(again, None);
    }

    #[test]
    fn readiness_follows_the_state_and_the_error() {
        let cases = [
            (RequestState::Empty, "", false, "Allocating"),
            (RequestState::NodeAllocating, "", false, "Allocating"),
            (
                RequestState::NodeAllocating,
                "too few nodes",
                false,
                "Error",
            ),
            (RequestState::Updating, "", false, "Updating"),
            (RequestState::Cleaning, "", false, "Cleaning"),
            (RequestState::Running, "", true, "Running"),
            (RequestState::Running, "list failed", true, "Running"),
            (RequestState::Unknown("X".into()), "", false, "UnknownState"),
        ];
        for (state, error, ok, reason) in cases {
            let r = request_readiness(&state, error, 1);
            assert_eq!((r.ready, r.reason), (ok, reason), "{state:?} {error:?}");
            if !error.is_empty() {
                assert_eq!(r.message, error);
            }
        }
        let r = resource_readiness(&ResourceState::Online, "health warning", "G", "n");
        assert_eq!((r.ready, r.message.as_str()), (true, "health warning"));
        let r = resource_readiness(&ResourceState::Detaching, "GPU busy", "G", "n");
        assert_eq!(
            (r.ready, r.reason, r.message.as_str()),
            (false, "Error", "GPU busy")
        );
    }

    #[test]
    fn long_messages_are_cut_to_what_the_api_server_accepts() {
        let long = "é".repeat(MAX_MESSAGE + 10);
        let readiness = request_readiness(&RequestState::Updating, &long, 1);
        let out = with_ready(&[], &readiness, None, at("2026-01-01T00:00:00Z")).unwrap();
        assert_eq!(out[0].message.chars().count(), MAX_MESSAGE);
    }

    #[test]
    fn the_report_patch_carries_only_what_changed() {
        let details = cro_api::ScalarResourceDetails {
            resource_type: ResourceType::Gpu,
            model: "m".into(),
            size: 1,
            force_detach: false,
            allocation_policy: Default::default(),
            target_node: None,
            other_spec: None,
        };
        let mut res = ComposableResource::for_request("req", &details, "n1");
        res.metadata.generation = Some(4);
        res.status = Some(ComposableResourceStatus {
            state: ResourceState::Online,
            device_id: "GPU-1".into(),
            ..Default::default()
        });
        let now = at("2026-03-01T00:00:00Z");
        let patch = report(&res, "", now).unwrap();
        assert!(patch.get("error").is_none(), "{patch}");
        assert_eq!(
            patch["conditions"],
            json!([{"type": "Ready", "status": "True", "reason": "Online",
                    "message": "device GPU-1 is online on node n1",
                    "lastTransitionTime": "2026-03-01T00:00:00Z", "observedGeneration": 4}])
        );
        res.status.as_mut().unwrap().conditions =
            serde_json::from_value(patch["conditions"].clone()).unwrap();
        assert_eq!(report(&res, "", now), None);
        let patch = report(&res, "warning", now).unwrap();
        assert_eq!(patch["error"], "warning");
        assert_eq!(patch["conditions"][0]["message"], "warning");

        // An Attaching resource that waits on its node says for what, without an error,
        // until an error or another state replaces it.
        res.status = Some(ComposableResourceStatus {
            state: ResourceState::Attaching,
            device_id: "GPU-1".into(),
            error: "an earlier failure".into(),
            ..Default::default()
        });
        let wait = "waiting for the NVIDIA driver pod on node n1 (pod nvidia-driver-x not Ready)";
        let patch = wait_patch(&res, WAITING_FOR_DRIVER, wait, now).unwrap();
        let value = serde_json::to_value(&patch).unwrap();
        assert_eq!(value["error"], "");
        assert_eq!(value["conditions"][0]["reason"], "WaitingForDriver");
        assert_eq!(value["conditions"][0]["status"], "False");
        assert_eq!(value["conditions"][0]["message"], wait);
        let status = res.status.as_mut().unwrap();
        status.error = String::new();
        status.conditions = patch.conditions.unwrap();
        assert_eq!(wait_patch(&res, WAITING_FOR_DRIVER, wait, now), None);
        assert_eq!(report(&res, "", now), None, "the wait is kept");
        let patch = report(&res, "exec failed", now).unwrap();
        assert_eq!(patch["conditions"][0]["reason"], "Error");
        res.status.as_mut().unwrap().state = ResourceState::Online;
        let patch = report(&res, "", now).unwrap();
        assert_eq!(patch["conditions"][0]["reason"], "Online");

        let mut req = ComposabilityRequest::new(
            "req",
            cro_api::ComposabilityRequestSpec { resource: details },
        );
        req.status = Some(ComposabilityRequestStatus::default());
        let patch = report(&req, "", now).unwrap();
        assert_eq!(patch["conditions"][0]["reason"], "Allocating");
        assert_eq!(patch["conditions"][0]["observedGeneration"], Value::Null);
    }
}

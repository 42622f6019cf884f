//! Writes to the API server: status through the status subresource, finalizers on the
//! object. Writes that depend on what was read carry its resourceVersion, so a stale
//! read ends in a conflict (retried at once) instead of overwriting newer data.

use std::fmt::Debug;

use cro_api::{CroObjectExt, FINALIZER, RequestState, ResourceState};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::error::ReconcileError;

/// The field manager of every write the operator makes.
pub(crate) const FIELD_MANAGER: &str = "cro-operator";

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

fn conflict_or<K: Resource>(obj: &K, e: kube::Error) -> ReconcileError {
    match e {
        kube::Error::Api(ae) if ae.code == 409 => ReconcileError::Conflict(obj.name_any()),
        other => ReconcileError::Kube(other),
    }
}

/// The status fields of a ComposableResource a write sets; `None` leaves a field as it
/// is. Typed, so that the compiler finds every writer of a field.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct ResourceStatusPatch {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) state: Option<ResourceState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) device_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cdi_device_id: Option<String>,
    /// The Ready condition the new state implies, written with it
    /// (`conditions::with_ready_after`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) conditions: Option<Vec<Condition>>,
}

impl ResourceStatusPatch {
    /// A new state, with the error cleared.
    pub(crate) fn state(state: ResourceState) -> Self {
        Self {
            state: Some(state),
            error: Some(String::new()),
            ..Self::default()
        }
    }

    /// The ids of the device (both empty: none).
    pub(crate) fn ids(device_id: &str, cdi_device_id: &str) -> Self {
        Self {
            device_id: Some(device_id.to_owned()),
            cdi_device_id: Some(cdi_device_id.to_owned()),
            ..Self::default()
        }
    }

    pub(crate) fn with_state(mut self, state: ResourceState) -> Self {
        self.state = Some(state);
        self
    }

    pub(crate) fn with_error(mut self, error: impl Into<String>) -> Self {
        self.error = Some(error.into());
        self
    }

    /// Leaves `error` as it is.
    pub(crate) fn keep_error(mut self) -> Self {
        self.error = None;
        self
    }
}

/// The status fields of a ComposabilityRequest a partial write sets (whole statuses go
/// through [`replace_status`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct RequestStatusPatch {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) state: Option<RequestState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    /// The conditions as the new state implies them (the Ready condition in the same
    /// write as the state).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) conditions: Option<Vec<Condition>>,
}

impl RequestStatusPatch {
    /// A new state, with the error cleared.
    pub(crate) fn state(state: RequestState) -> Self {
        Self {
            state: Some(state),
            error: Some(String::new()),
            conditions: None,
        }
    }
}

/// What every reconciliation reports on either kind: `status.error` and the conditions.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct ReportPatch {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) conditions: Option<Vec<Condition>>,
}

/// Merge-patches the status fields of `status`. With `guarded`, the write only succeeds
/// if the object is still at the version `obj` was read at.
pub(crate) async fn status<K, P>(
    api: &Api<K>,
    obj: &K,
    status: &P,
    guarded: bool,
) -> Result<K, ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    P: Serialize,
{
    let status =
        serde_json::to_value(status).map_err(|e| ReconcileError::Invalid(e.to_string()))?;
    let mut patch = json!({ "status": status });
    if guarded && let Some(rv) = obj.resource_version() {
        patch["metadata"] = json!({ "resourceVersion": rv });
    }
    api.patch_status(&obj.name_any(), &params(), &Patch::Merge(&patch))
        .await
        .map_err(|e| conflict_or(obj, e))
}

/// Adds the operator's finalizer unless present.
pub(crate) async fn add_finalizer<K>(api: &Api<K>, obj: &K) -> Result<K, ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    if obj.has_cro_finalizer() {
        return Ok(obj.clone());
    }
    let mut finalizers = obj.finalizers().to_vec();
    finalizers.push(FINALIZER.to_owned());
    set_finalizers(api, obj, finalizers).await
}

/// Removes the operator's finalizer; the object may be gone afterwards.
pub(crate) async fn remove_finalizer<K>(api: &Api<K>, obj: &K) -> Result<(), ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    if !obj.has_cro_finalizer() {
        return Ok(());
    }
    let finalizers: Vec<String> = obj
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    match set_finalizers(api, obj, finalizers).await {
        Ok(_) => Ok(()),
        Err(ReconcileError::Kube(kube::Error::Api(e))) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

async fn set_finalizers<K>(
    api: &Api<K>,
    obj: &K,
    finalizers: Vec<String>,
) -> Result<K, ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": obj.resource_version(),
    }});
    api.patch(&obj.name_any(), &params(), &Patch::Merge(&patch))
        .await
        .map_err(|e| conflict_or(obj, e))
}

/// Deletes an object; one already gone counts as deleted.
pub(crate) async fn delete<K>(api: &Api<K>, name: &str) -> Result<(), ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The JSON merge patch (RFC 7386) that turns `old` into `new`: keys only in `old`
/// become null, changed values are replaced, nested objects are diffed recursively.
/// Needed because serialized statuses omit some empty fields, which a plain merge of
/// the new value would leave at their old values.
pub(crate) fn merge_diff(old: &Value, new: &Value) -> Value {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut out = serde_json::Map::new();
            for k in o.keys().filter(|k| !n.contains_key(*k)) {
                out.insert(k.clone(), Value::Null);
            }
            for (k, nv) in n {
                match o.get(k) {
                    Some(ov) if ov == nv => {}
                    Some(ov @ Value::Object(_)) if nv.is_object() => {
                        out.insert(k.clone(), merge_diff(ov, nv));
                    }
                    _ => {
                        out.insert(k.clone(), nv.clone());
                    }
                }
            }
            Value::Object(out)
        }
        _ => new.clone(),
    }
}

/// Writes `new` as the whole status, given the `old` one the object had.
pub(crate) async fn replace_status<K, S>(
    api: &Api<K>,
    obj: &K,
    old: &S,
    new: &S,
) -> Result<K, ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    S: serde::Serialize,
{
    let old = serde_json::to_value(old).map_err(|e| ReconcileError::Invalid(e.to_string()))?;
    let new = serde_json::to_value(new).map_err(|e| ReconcileError::Invalid(e.to_string()))?;
    status(api, obj, &merge_diff(&old, &new), true).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use cro_api::{ComposabilityRequestStatus, ComposableResourceStatus};

    fn keys(v: &Value) -> Vec<String> {
        v.as_object().unwrap().keys().cloned().collect()
    }

    #[test]
    fn typed_patches_name_the_status_fields_of_their_kind() {
        let full = ResourceStatusPatch::ids("GPU-1", "f-1")
            .with_state(ResourceState::Online)
            .with_error("e");
        let patch = serde_json::to_value(&full).unwrap();
        let status = serde_json::to_value(ComposableResourceStatus {
            state: ResourceState::Online,
            error: "e".into(),
            device_id: "GPU-1".into(),
            cdi_device_id: "f-1".into(),
            ..Default::default()
        })
        .unwrap();
        for k in keys(&patch) {
            assert!(
                status.get(&k).is_some(),
                "{k} is no ComposableResource status field"
            );
        }
        assert_eq!(
            patch,
            json!({"state": "Online", "error": "e", "device_id": "GPU-1", "cdi_device_id": "f-1"})
        );
        assert_eq!(
            serde_json::to_value(ResourceStatusPatch::state(ResourceState::Detaching).keep_error())
                .unwrap(),
            json!({"state": "Detaching"})
        );

        let request =
            serde_json::to_value(RequestStatusPatch::state(RequestState::Cleaning)).unwrap();
        let status = serde_json::to_value(ComposabilityRequestStatus {
            state: RequestState::Cleaning,
            error: "x".into(),
            ..Default::default()
        })
        .unwrap();
        for k in keys(&request) {
            assert!(
                status.get(&k).is_some(),
                "{k} is no ComposabilityRequest status field"
            );
        }
        assert_eq!(request, json!({"state": "Cleaning", "error": ""}));
        assert_eq!(
            serde_json::to_value(ReportPatch::default()).unwrap(),
            json!({})
        );
    }

    #[test]
    fn merge_diff_removes_replaces_and_recurses() {
        let old = json!({"state": "Running", "resources": {"a": {"state": "Online"}, "b": {"state": "Online"}},
                         "scalarResource": {"size": 2, "target_node": "n1", "other_spec": {"milli_cpu": 5, "memory": 1}}});
        let new = json!({"state": "Running", "resources": {"a": {"state": "Online"}, "c": {"state": ""}},
                         "scalarResource": {"size": 3, "other_spec": {"memory": 1}}});
        let d = merge_diff(&old, &new);
        assert_eq!(
            d,
            json!({"resources": {"b": null, "c": {"state": ""}},
                   "scalarResource": {"size": 3, "target_node": null, "other_spec": {"milli_cpu": null}}})
        );
        assert_eq!(merge_diff(&new, &new), json!({}));
        assert_eq!(merge_diff(&json!(null), &new), new);
    }
}

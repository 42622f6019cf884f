//! Writes to the API server: status through the status subresource, finalizers on the
//! object. Writes that depend on what was read carry its resourceVersion, so a stale
//! read ends in a conflict (retried at once) instead of overwriting newer data.

use std::fmt::Debug;

use cro_api::{CroObjectExt, FINALIZER};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::error::ReconcileError;

/// The field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "cro-operator";

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

/// Merge-patches `status` (a JSON object of status fields). With `guarded`, the write
/// only succeeds if the object is still at the version `obj` was read at.
pub async fn status<K>(
    api: &Api<K>,
    obj: &K,
    status: Value,
    guarded: bool,
) -> Result<K, ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let mut patch = json!({ "status": status });
    if guarded && let Some(rv) = obj.resource_version() {
        patch["metadata"] = json!({ "resourceVersion": rv });
    }
    api.patch_status(&obj.name_any(), &params(), &Patch::Merge(&patch))
        .await
        .map_err(|e| conflict_or(obj, e))
}

/// Adds the operator's finalizer unless present.
pub async fn add_finalizer<K>(api: &Api<K>, obj: &K) -> Result<K, ReconcileError>
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
pub async fn remove_finalizer<K>(api: &Api<K>, obj: &K) -> Result<(), ReconcileError>
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
pub async fn delete<K>(api: &Api<K>, name: &str) -> Result<(), ReconcileError>
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
pub fn merge_diff(old: &Value, new: &Value) -> Value {
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
pub async fn replace_status<K, S>(
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
    status(api, obj, merge_diff(&old, &new), true).await
}

#[cfg(test)]
mod tests {
    use super::*;

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

//! Small schema adjustments shared by the types.

use schemars::Schema;

/// Removes the `default` schemars derives from `#[serde(default)]`.
///
/// Status fields use `#[serde(default)]` only so that a partial status (for example one
/// written by the Go operator, which omits empty fields) deserializes; the API server should
/// not fill those defaults into every stored object.
pub(crate) fn drop_default(schema: &mut Schema) {
    schema.remove("default");
}

/// `skip_serializing_if` helper for flags whose absence means `false`, like Go's `omitempty`.
pub(crate) fn is_false(b: &bool) -> bool {
    !*b
}

/// `skip_serializing_if` helper for quantities whose absence means `0`, like Go's `omitempty`.
pub(crate) fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// Schema of a `conditions` list: keyed by `type` like every built-in kind's, so
/// server-side apply merges conditions by type, and without a default so objects that
/// have none (the Go operator's) are stored unchanged.
pub(crate) fn conditions_list(schema: &mut Schema) {
    schema.remove("default");
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert("x-kubernetes-list-map-keys".into(), vec!["type"].into());
}

/// Messages of the transition rules [`immutable_type_and_model`] adds (tests match them).
pub const TYPE_IMMUTABLE: &str =
    "type cannot change on an existing request: delete the request and create a new one";
pub const MODEL_IMMUTABLE: &str =
    "model cannot change on an existing request: delete the request and create a new one";

/// Transition rules (`x-kubernetes-validations`, checked by the API server on update only)
/// that keep `spec.resource.type` and `model` as created: changing either would detach
/// every device of a live request and attach different ones. Creating is unaffected, so
/// every manifest the Go operator's CRD accepted is still accepted.
pub(crate) fn immutable_type_and_model(schema: &mut Schema) {
    schema.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([
            {"rule": "self.type == oldSelf.type", "message": TYPE_IMMUTABLE},
            {"rule": "self.model == oldSelf.model", "message": MODEL_IMMUTABLE},
        ]),
    );
}

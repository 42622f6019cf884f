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

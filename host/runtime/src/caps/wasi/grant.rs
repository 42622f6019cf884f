//! The `wasi` section of the grants: WASI features beyond the deny-everything default.

use serde::{Deserialize, Serialize};

/// WASI features beyond the deny-everything default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WasiGrant {
    /// The real (or the runtime's injected) wall clock; otherwise it reads the Unix epoch
    /// and the monotonic clock stands still.
    #[serde(default)]
    pub clocks: bool,
}

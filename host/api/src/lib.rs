//! Custom resource types of the composable resource operator, `cro.hpsys.ibm.ie.com/v1alpha1`.
//!
//! The JSON field names, validation and well-known labels are those of the Go operator
//! (docs/behaviour.md §2), so manifests and objects written for it keep working. The CRDs committed in
//! `crds/` are generated from these types by `cargo run -p cro-api --bin crdgen`.

mod crds;
mod object_ext;
mod provider;
mod request;
mod resource;
mod resource_type;
mod schema;
mod state;
mod well_known;

pub use crds::{CrdError, CrdFile, REGENERATE_COMMAND, crd_files, crds};
pub use object_ext::CroObjectExt;
pub use provider::{
    CDI_PROVIDER_SOURCE_EXACTLY_ONE, CONDITION_DEGRADED, CONDITION_READY, CallCounts,
    CapabilityReport, CdiProvider, CdiProviderSpec, CdiProviderStatus, ComponentSource,
    ConfigMapSource, HTTPS_URL_PATTERN, HttpGrant, HttpsSource, LookupGrant,
    OCI_DIGEST_REFERENCE_PATTERN, OciSource, PoolStatus, ProviderDescription, ProviderGrants,
    ProviderLimits, SHA256_HEX_PATTERN, SecretGrant, SecretReference, SourceKind, WasiGrant,
    reasons,
};
pub use request::{
    AllocationPolicy, ComposabilityRequest, ComposabilityRequestSpec, ComposabilityRequestStatus,
    NodeSpec, ScalarResourceDetails, ScalarResourceStatus,
};
pub use resource::{
    ComposableResource, ComposableResourceSpec, ComposableResourceStatus, ReadyToDetach,
};
pub use resource_type::{ResourceType, UnknownResourceType};
pub use schema::{MODEL_IMMUTABLE, TYPE_IMMUTABLE};
pub use state::{RequestState, ResourceState};
pub use well_known::*;

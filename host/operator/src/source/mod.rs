//! Fetching a `CdiProvider`'s component bytes and verifying them against its spec.
//!
//! Every source is pinned: a ConfigMap is trusted as cluster state (its digest is
//! reported), an https download must have the sha256 the spec gives, and an OCI artifact
//! is pulled by manifest digest with its layer digest checked. Every source is bounded by
//! `max_component_bytes`, refused before downloading when the size is announced and
//! while streaming otherwise. docs/providers.md has the user's view.

mod configmap;
mod digest;
mod error;
mod https;
mod oci;
mod pull_secret;

use cro_api::{ComponentSource, SourceKind};

pub use digest::{is_sha256_hex, sha256_hex};
pub use error::SourceError;
pub use oci::{
    LEGACY_WASM_LAYER_MEDIA_TYPE, WASM_CONFIG_MEDIA_TYPE, WASM_LAYER_MEDIA_TYPE, parse_reference,
};
pub use pull_secret::auth_for;

/// Default size limit of a component: the FTI component is well under 1 MiB optimised and
/// about 4 MiB with line tables.
pub const DEFAULT_MAX_COMPONENT_BYTES: u64 = 32 << 20;

/// How sources are fetched.
#[derive(Clone, Debug)]
pub struct FetchOptions {
    /// Largest component accepted from any source.
    pub max_component_bytes: u64,
    /// Registries (`host:port`) reached over plain HTTP instead of https, like
    /// containerd's insecure registries; for a registry on loopback in tests.
    pub plain_http_registries: Vec<String>,
    /// The client for https sources (its trust roots decide which servers are accepted).
    pub https: reqwest::Client,
}

impl Default for FetchOptions {
    fn default() -> FetchOptions {
        FetchOptions {
            max_component_bytes: DEFAULT_MAX_COMPONENT_BYTES,
            plain_http_registries: Vec::new(),
            https: reqwest::Client::new(),
        }
    }
}

/// A component's verified bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    pub bytes: Vec<u8>,
    /// `sha256:<hex>` of `bytes` (for OCI, the layer's digest).
    pub digest: String,
    /// Where they came from, for logs and status.
    pub origin: String,
}

/// Fetches and verifies the component `source` names.
pub async fn fetch(
    kube: &kube::Client,
    source: &ComponentSource,
    options: &FetchOptions,
) -> Result<Fetched, SourceError> {
    match source.kind().ok_or(SourceError::NotExactlyOne)? {
        SourceKind::ConfigMap(c) => configmap::fetch(kube, c, options.max_component_bytes).await,
        SourceKind::Https(h) => https::fetch(&options.https, h, options.max_component_bytes).await,
        SourceKind::Oci(o) => oci::fetch(kube, o, options).await,
    }
}

//! Why a provider component could not be fetched or verified.

/// One error type for every source; each message names the origin, so a `CdiProvider`'s
/// status says which ConfigMap, URL or reference failed and why.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The source names none or several origins (the CRD refuses these; an object written
    /// around it still gets a clear answer).
    #[error("the source must name exactly one of configMap, https or oci")]
    NotExactlyOne,
    #[error("ConfigMap {namespace}/{name} not found")]
    ConfigMapNotFound { namespace: String, name: String },
    #[error(
        "ConfigMap {namespace}/{name} has no binaryData key {key:?} (components are binary: \
         put them in binaryData, not data)"
    )]
    ConfigMapKeyMissing {
        namespace: String,
        name: String,
        key: String,
    },
    #[error("cannot read {what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{url} is not an https URL: {reason}")]
    HttpsUrl { url: String, reason: String },
    #[error("download of {url} failed: {source}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("download of {url} failed: HTTP {status}")]
    HttpStatus { url: String, status: u16 },
    /// The digest given in the spec is not a sha256 digest.
    #[error("{origin}: {digest:?} is not a sha256 digest (64 lowercase hex digits)")]
    BadDigest { origin: String, digest: String },
    /// The bytes (or the manifest) are not the ones pinned.
    #[error("{origin}: digest mismatch: expected sha256:{expected}, got sha256:{actual}")]
    DigestMismatch {
        origin: String,
        expected: String,
        actual: String,
    },
    /// Larger than the limit: announced by the origin (`declared`) or seen while streaming.
    #[error("{origin}: component of {size} bytes{} is over the limit of {limit} bytes",
        if *.declared { " (as declared)" } else { "" })]
    TooLarge {
        origin: String,
        size: u64,
        limit: u64,
        declared: bool,
    },
    #[error("{reference:?} is not an OCI reference pinned by digest: {reason}")]
    OciReference { reference: String, reason: String },
    #[error("registry refused or failed {reference}: {source}")]
    Registry {
        reference: String,
        #[source]
        source: oci_client::errors::OciDistributionError,
    },
    /// The layer download broke off or failed the client's own digest check.
    #[error("{origin}: download failed: {reason}")]
    LayerStream { origin: String, reason: String },
    #[error("{reference}: the manifest is not an OCI image manifest: {reason}")]
    Manifest { reference: String, reason: String },
    /// The artifact has no layer of a wasm media type, or more than one.
    #[error("{reference}: expected exactly one layer of media type {accepted}, found {found:?}")]
    WasmLayer {
        reference: String,
        accepted: String,
        found: Vec<String>,
    },
    #[error("pull Secret {namespace}/{name} not found")]
    PullSecretNotFound { namespace: String, name: String },
    #[error("pull Secret {namespace}/{name}: {reason}")]
    PullSecret {
        namespace: String,
        name: String,
        reason: String,
    },
}

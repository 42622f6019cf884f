//! Turning a `CdiProvider` into a loaded, validated provider: the namespace rule for
//! granted Secrets, the fetch (crate::source), the runtime's load (contract, `describe()`,
//! grants, limits) and the check of configuration keys against `describe()`.

use std::sync::Arc;

use cro_api::{CdiProviderSpec, reasons};
use cro_runtime::{ProviderSpec, Runtime};

use crate::provider::node_cache::NodeCache;
use crate::provider::node_machine::RememberingCluster;
use crate::provider::node_scope::NodeScope;
use crate::source::{self, SourceError};

/// Why a `CdiProvider`'s component could not be made to serve.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoadError {
    #[error(
        "grants.secret {namespace}/{name}: Secrets may be granted only from the namespaces {allowed:?} (operator flag --provider-secret-namespaces)"
    )]
    SecretNamespace {
        namespace: String,
        name: String,
        allowed: Vec<String>,
    },
    #[error("invalid spec: {0}")]
    Spec(String),
    #[error("{0}")]
    Fetch(#[from] SourceError),
    #[error("load: {0}")]
    Load(String),
    /// The same bytes under the same spec failed before; not loaded again (the message
    /// is the earlier failure's).
    #[error("{message}")]
    Repeated { reason: String, message: String },
}

impl LoadError {
    /// The Degraded condition's reason.
    pub(crate) fn reason(&self) -> &str {
        match self {
            LoadError::Repeated { reason, .. } => reason,
            LoadError::SecretNamespace { .. } => "SecretNotAllowed",
            LoadError::Spec(_) | LoadError::Load(_) => reasons::LOAD_FAILED,
            LoadError::Fetch(
                SourceError::DigestMismatch { .. }
                | SourceError::BadDigest { .. }
                | SourceError::TooLarge { .. },
            ) => reasons::VERIFY_FAILED,
            LoadError::Fetch(_) => reasons::FETCH_FAILED,
        }
    }
}

/// The runtime's provider spec for `spec`, named `name` (the component's bytes are given
/// separately). The grants and limits share the spec file's field names, so the
/// runtime's own parser validates them.
pub(crate) fn provider_spec(name: &str, spec: &CdiProviderSpec) -> Result<ProviderSpec, LoadError> {
    let json = serde_json::json!({
        "name": name,
        "component": format!("cdiprovider/{name}"),
        "config": spec.config,
        "grants": spec.grants,
        "limits": spec.limits,
    });
    ProviderSpec::from_json(&json.to_string(), std::path::Path::new("/"))
        .map_err(|e| LoadError::Spec(e.to_string()))
}

/// Refuses a Secret grant outside `allowed` (least privilege: the operator reads
/// Secrets only where it was told it may).
pub(crate) fn check_secret_namespace(
    spec: &CdiProviderSpec,
    allowed: &[String],
) -> Result<(), LoadError> {
    match &spec.grants.secret {
        Some(s) if !allowed.iter().any(|a| a == &s.namespace) => Err(LoadError::SecretNamespace {
            namespace: s.namespace.clone(),
            name: s.name.clone(),
            allowed: allowed.to_vec(),
        }),
        _ => Ok(()),
    }
}

/// A loaded component and the digest of its bytes.
pub(crate) struct Loaded {
    pub(crate) provider: Arc<cro_runtime::Provider>,
    pub(crate) digest: String,
}

/// How a registry provider reads the cluster and reaches its fabric: its HTTP requests
/// ask `fence` before they are sent, its Node lookups `nodes` first, and its listings
/// of Nodes show what `scope` shows (the nodes routed to it).
pub(crate) struct Wiring {
    pub(crate) fence: cro_runtime::Fence,
    pub(crate) nodes: NodeCache,
    pub(crate) scope: NodeScope,
}

/// Loads `fetched` under `spec`, wired as `wiring` says, and validates it (contract,
/// `describe()`, grants, limits, configuration keys).
pub(crate) async fn instantiate(
    client: &kube::Client,
    runtime: &Runtime,
    spec: &ProviderSpec,
    fetched: source::Fetched,
    wiring: Wiring,
) -> Result<Loaded, LoadError> {
    let Wiring {
        fence,
        nodes,
        scope,
    } = wiring;
    let cluster = RememberingCluster::of_api_server(client.clone(), nodes).listing_only(scope);
    let options = cro_runtime::LoadOptions::default().with_fence(fence);
    let provider = runtime
        .load_bytes_with(spec, fetched.bytes, Arc::new(cluster), options)
        .await
        .map_err(|e| LoadError::Load(e.to_string()))?;
    crate::registry::startup::check_loaded(&provider)
        .map_err(|e| LoadError::Load(e.to_string()))?;
    Ok(Loaded {
        provider: Arc::new(provider),
        digest: fetched.digest,
    })
}

//! `CdiProvider`: one fabric provider (a WebAssembly component) as a cluster object.
//!
//! The spec says where the component comes from (exactly one of a ConfigMap key, an https
//! URL pinned by sha256, or an OCI artifact pinned by digest), what it is configured and
//! granted, its limits, and which nodes' devices it serves. `grants` and `limits` use the
//! field names of a provider spec file (docs/providers.md), so an administrator can paste
//! one into the other; the Secret grant is a reference (namespace, name, keys), never a value.
//! Top-level fields follow Kubernetes' camelCase, as a new kind without a Go ancestor.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};

use crate::schema::{conditions_list, drop_default, is_false};

/// Condition type: the component is loaded and serving.
pub const CONDITION_READY: &str = "Ready";
/// Condition type: the newest spec could not be applied (the previous component, if any,
/// keeps serving); the reason says which step failed.
pub const CONDITION_DEGRADED: &str = "Degraded";

/// Condition reasons of a `CdiProvider`.
pub mod reasons {
    /// The component of the current generation is loaded.
    pub const LOADED: &str = "Loaded";
    /// The component is being fetched or loaded.
    pub const LOADING: &str = "Loading";
    /// The component's bytes could not be fetched (ConfigMap, https or registry).
    pub const FETCH_FAILED: &str = "FetchFailed";
    /// The bytes were fetched but their digest or size is not the one pinned in the spec.
    pub const VERIFY_FAILED: &str = "VerificationFailed";
    /// The component was refused by the runtime (contract, `describe()`, grants, limits).
    pub const LOAD_FAILED: &str = "LoadFailed";
    /// Nothing is wrong.
    pub const HEALTHY: &str = "Healthy";
}

/// Message of the rule that a source names exactly one origin (tests match it).
pub const CDI_PROVIDER_SOURCE_EXACTLY_ONE: &str =
    "source must set exactly one of configMap, https or oci";
/// Pattern of a lowercase hex sha256 digest.
pub const SHA256_HEX_PATTERN: &str = "^[0-9a-f]{64}$";
/// Pattern of an OCI reference pinned by digest: `registry/repository[:tag]@sha256:<64 hex>`.
pub const OCI_DIGEST_REFERENCE_PATTERN: &str = "^[a-z0-9]+([._:-][a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?@sha256:[0-9a-f]{64}$";
/// Pattern of an https URL.
pub const HTTPS_URL_PATTERN: &str = "^https://[^\\s]+$";

/// Desired state of a CdiProvider.
// Each printcolumn(...) repeats the same keys, which clippy mistakes for duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "cro.hpsys.ibm.ie.com",
    version = "v1alpha1",
    kind = "CdiProvider",
    status = "CdiProviderStatus",
    derive = "PartialEq",
    doc = "A fabric provider (WebAssembly component) serving the devices of the nodes its selector matches.",
    category = "cro",
    shortname = "cdip",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Default", type_ = "boolean", json_path = ".spec.default"),
    printcolumn(
        name = "Contract",
        type_ = "string",
        json_path = ".status.contractVersion"
    ),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".status.describe.version"
    ),
    printcolumn(
        name = "Digest",
        type_ = "string",
        json_path = ".status.loadedDigest",
        priority = 1
    ),
    printcolumn(
        name = "Error",
        type_ = "string",
        json_path = ".status.lastError",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct CdiProviderSpec {
    /// Where the component's bytes come from, pinned so that what runs is what was reviewed.
    pub source: ComponentSource,
    /// The values the component's `config` interface serves.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(transform = drop_default)]
    pub config: BTreeMap<String, String>,
    /// What the component may reach; everything not granted is denied.
    #[serde(default, skip_serializing_if = "ProviderGrants::is_empty")]
    #[schemars(transform = drop_default)]
    pub grants: ProviderGrants,
    /// What the component may make the operator spend; unset fields take the defaults.
    #[serde(default, skip_serializing_if = "ProviderLimits::is_empty")]
    #[schemars(transform = drop_default)]
    pub limits: ProviderLimits,
    /// The nodes whose devices this provider serves. Unset selects no node (a default
    /// provider still serves the nodes no other provider's selector matches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// Serve the nodes that no provider's selector matches.
    #[serde(default, skip_serializing_if = "is_false")]
    #[schemars(transform = drop_default)]
    pub default: bool,
}

/// Where a component comes from: exactly one of the three.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = exactly_one_source)]
pub struct ComponentSource {
    /// A key of a ConfigMap's `binaryData` (for small components: a ConfigMap holds at
    /// most about 1 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapSource>,
    /// An https URL; the bytes must have the given sha256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https: Option<HttpsSource>,
    /// An OCI artifact in a registry, pinned by manifest digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oci: Option<OciSource>,
}

fn exactly_one_source(schema: &mut Schema) {
    schema.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([{
            "rule": "(has(self.configMap) ? 1 : 0) + (has(self.https) ? 1 : 0) + (has(self.oci) ? 1 : 0) == 1",
            "message": CDI_PROVIDER_SOURCE_EXACTLY_ONE,
        }]),
    );
}

/// Which of the three origins a source names, for messages and the fetcher's dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind<'a> {
    ConfigMap(&'a ConfigMapSource),
    Https(&'a HttpsSource),
    Oci(&'a OciSource),
}

impl ComponentSource {
    /// The one origin named, or `None` when none or several are set (the CRD refuses
    /// those; objects that bypassed it still get a clear error from the caller).
    pub fn kind(&self) -> Option<SourceKind<'_>> {
        match (&self.config_map, &self.https, &self.oci) {
            (Some(c), None, None) => Some(SourceKind::ConfigMap(c)),
            (None, Some(h), None) => Some(SourceKind::Https(h)),
            (None, None, Some(o)) => Some(SourceKind::Oci(o)),
            _ => None,
        }
    }
}

/// A ConfigMap key holding the component in `binaryData`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ConfigMapSource {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// A component served over https, pinned by its sha256.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HttpsSource {
    /// `https://…`; plain http is refused.
    #[schemars(length(max = 2048), regex(pattern = r"^https://[^\s]+$"))]
    pub url: String,
    /// The sha256 of the component's bytes, 64 lowercase hex digits.
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub sha256: String,
}

/// An OCI artifact whose manifest is pinned by digest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OciSource {
    /// `registry[:port]/repository[:tag]@sha256:<64 hex>`; a tag alone is refused, because
    /// a tag can be moved to other bytes.
    #[schemars(
        length(max = 1024),
        regex(
            pattern = r"^[a-z0-9]+([._:-][a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)+(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?@sha256:[0-9a-f]{64}$"
        )
    )]
    pub reference: String,
    /// A `kubernetes.io/dockerconfigjson` Secret with the registry's credentials; unset
    /// pulls anonymously.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret: Option<SecretReference>,
}

/// A Secret named from a cluster-scoped object, so the namespace is required.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SecretReference {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
}

/// The grants of a provider spec file, field for field (docs/providers.md); the runtime
/// validates them again when it loads the component.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProviderGrants {
    /// Endpoints the `http` interface may reach.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = drop_default)]
    pub http: Vec<HttpGrant>,
    /// The one Secret (and its keys) the `secrets` interface may read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretGrant>,
    /// Kinds the `lookup` interface may read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = drop_default)]
    pub lookup: Vec<LookupGrant>,
    /// WASI features beyond the deny-all default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wasi: Option<WasiGrant>,
}

impl ProviderGrants {
    fn is_empty(&self) -> bool {
        self == &ProviderGrants::default()
    }
}

/// One endpoint: `scheme://host[:port]`, `*.` host prefix allowed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HttpGrant {
    #[schemars(length(min = 1, max = 2048))]
    pub url: String,
    /// An extra trust root (PEM) for this endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_pem: Option<String>,
}

/// The Secret the provider may read, by reference, and which of its keys.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SecretGrant {
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1))]
    pub keys: Vec<String>,
}

/// A kind the provider may read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LookupGrant {
    #[schemars(length(min = 1))]
    pub api_version: String,
    #[schemars(length(min = 1))]
    pub kind: String,
}

/// WASI features the provider may use.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WasiGrant {
    /// The real wall clock instead of one frozen at the Unix epoch.
    #[serde(default, skip_serializing_if = "is_false")]
    #[schemars(transform = drop_default)]
    pub clocks: bool,
}

/// The limits of a provider spec file, field for field; each unset field takes the
/// runtime's default, and the runtime checks the bounds when it loads the component.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProviderLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub call_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_concurrent_calls: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_response_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub state_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub state_entries: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub host_call_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub log_lines_per_call: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub log_bytes_per_call: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub log_lines_per_minute: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub log_bytes_per_minute: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub cluster_reads_per_call: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub cluster_reads_per_second: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub provider_text_bytes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub http_requests_per_call: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub http_bytes_sent_per_call: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub wasi_handles_per_call: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub compile_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub compile_memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub compile_max_functions: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub compile_max_code_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub compile_max_locals: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub compile_max_nesting: Option<u32>,
}

impl ProviderLimits {
    fn is_empty(&self) -> bool {
        self == &ProviderLimits::default()
    }
}

/// Observed state of a CdiProvider, written by the operator.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CdiProviderStatus {
    /// The generation of the spec the rest of the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `sha256:<hex>` of the component bytes serving now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loaded_digest: Option<String>,
    /// The WIT contract version the component implements, e.g. `0.2.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contract_version: Option<String>,
    /// What the component's `describe()` reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub describe: Option<ProviderDescription>,
    /// Capabilities the component wants and the grants it was given, compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<CapabilityReport>,
    /// `Ready` and `Degraded`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = conditions_list)]
    pub conditions: Vec<Condition>,
    /// The last load or call error, empty when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Calls made to the component since it was loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<CallCounts>,
    /// What the operator last published of the fabric's free pool to the scheduler
    /// (DRA ResourceSlices, docs/dra.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolStatus>,
}

/// The free pool as last published.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolStatus {
    /// Devices the provider's ResourceSlices offer (free ones and those claims hold).
    #[serde(default)]
    pub devices: i64,
    /// Fabric pools published (one ResourcePool each).
    #[serde(default)]
    pub pools: i64,
    /// Why nothing is published, when nothing is (`not supported: ...`, a failed read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When what is published (or why nothing is) last changed. The status is written
    /// only then, not on every read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_changed: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// The component's own account of itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProviderDescription {
    #[serde(default)]
    #[schemars(transform = drop_default)]
    pub name: String,
    #[serde(default)]
    #[schemars(transform = drop_default)]
    pub vendor: String,
    #[serde(default)]
    #[schemars(transform = drop_default)]
    pub version: String,
}

/// Wanted-versus-granted, by capability name (e.g. `http:https://fm.example:8443`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapabilityReport {
    /// Declared by the component, not granted: calls needing them will be denied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = drop_default)]
    pub wanted_not_granted: Vec<String>,
    /// Granted but not declared: candidates to revoke.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = drop_default)]
    pub granted_unwanted: Vec<String>,
}

/// Call counters of the loaded component.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CallCounts {
    #[serde(default)]
    #[schemars(transform = drop_default)]
    pub total: u64,
    #[serde(default)]
    #[schemars(transform = drop_default)]
    pub failed: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;
    use serde_json::json;

    #[test]
    fn the_schema_patterns_are_the_published_constants() {
        let crd = serde_json::to_value(CdiProvider::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let source = &spec["properties"]["source"];
        assert_eq!(
            source["x-kubernetes-validations"][0]["message"],
            CDI_PROVIDER_SOURCE_EXACTLY_ONE
        );
        let p = &source["properties"];
        assert_eq!(
            p["https"]["properties"]["sha256"]["pattern"],
            SHA256_HEX_PATTERN
        );
        assert_eq!(
            p["https"]["properties"]["url"]["pattern"],
            HTTPS_URL_PATTERN
        );
        assert_eq!(
            p["oci"]["properties"]["reference"]["pattern"],
            OCI_DIGEST_REFERENCE_PATTERN
        );
        assert_eq!(spec["required"], json!(["source"]));
    }

    #[test]
    fn kind_names_the_single_origin() {
        let mut s = ComponentSource::default();
        assert_eq!(s.kind(), None);
        s.https = Some(HttpsSource::default());
        assert!(matches!(s.kind(), Some(SourceKind::Https(_))));
        s.oci = Some(OciSource::default());
        assert_eq!(s.kind(), None);
    }

    #[test]
    fn grants_and_limits_keep_the_spec_file_field_names() {
        let spec: CdiProviderSpec = serde_json::from_value(json!({
            "source": {"configMap": {"name": "c", "namespace": "n", "key": "k"}},
            "grants": {
                "http": [{"url": "https://fm:8443", "ca_pem": "PEM"}],
                "secret": {"namespace": "cro-system", "name": "creds", "keys": ["username"]},
                "lookup": [{"api_version": "v1", "kind": "Node"}],
                "wasi": {"clocks": true}
            },
            "limits": {"call_timeout_ms": 1000, "max_concurrent_calls": 4},
            "nodeSelector": {"matchLabels": {"pool": "a"}},
            "default": true
        }))
        .unwrap();
        assert_eq!(spec.grants.http[0].ca_pem.as_deref(), Some("PEM"));
        assert_eq!(spec.limits.call_timeout_ms, Some(1000));
        let back = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            back["limits"],
            json!({"call_timeout_ms": 1000, "max_concurrent_calls": 4})
        );
        assert_eq!(back["grants"]["lookup"][0]["api_version"], "v1");
    }
}

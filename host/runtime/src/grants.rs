//! What an administrator grants a provider: typed, deny-by-default, validated when parsed.
//!
//! A provider spec (YAML or JSON):
//!
//! ```yaml
//! name: fti
//! component: ./fti_provider.wasm        # relative to the spec file
//! config: {api_type: FM, endpoint: "https://127.0.0.1:8443/"}
//! grants:
//!   http:
//!     - url: "https://127.0.0.1:8443"   # scheme://host[:port]; `*.` host prefix allowed
//!       ca_pem: "-----BEGIN CERTIFICATE-----..."   # optional extra trust root
//!   secret: {namespace: cro-system, name: credentials, keys: [username, password]}
//!   lookup: [{api_version: v1, kind: Node}, {api_version: metal3.io/v1alpha1, kind: BareMetalHost}]
//!   wasi: {clocks: true}
//! limits: {call_timeout_ms: 30000, memory_bytes: 67108864, max_concurrent_calls: 16,
//!          max_response_bytes: 4194304, state_bytes: 1048576, state_entries: 4096,
//!          host_call_bytes: 8388608, log_lines_per_call: 256, log_bytes_per_call: 65536,
//!          log_lines_per_minute: 1200, log_bytes_per_minute: 1048576,
//!          cluster_reads_per_call: 512, cluster_reads_per_second: 50,
//!          provider_text_bytes: 4096}
//! ```
//!
//! Everything not written is denied: no `http` entry means no egress, no `secret` means no
//! Secret, no `lookup` means no cluster reads (not even Nodes), `wasi.clocks: false` means
//! the guest's wall clock is frozen at the Unix epoch. Files, environment, arguments and
//! sockets cannot be granted at all.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use url::Url;

use crate::base::{FieldError, is_dns_label};
// Each capability owns its grant type, and its registration gathers them into `Grants`
// (public paths kept here).
pub use crate::caps::Grants;
pub use crate::caps::http::grant::{CaPem, HostPattern, HttpGrant, HttpTarget, Scheme};
pub use crate::caps::lookup::grant::LookupGrant;
pub use crate::caps::secrets::grant::SecretGrant;
pub use crate::caps::wasi::grant::WasiGrant;
pub use crate::limits::Limits;

/// Why a provider spec was refused.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    #[error("cannot read provider spec {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The text does not parse, has an unknown field, or a field has a bad value
    /// (the message names the field and the line).
    #[error("invalid provider spec: {0}")]
    Syntax(String),
    /// The spec parsed but a value is not acceptable.
    #[error("invalid provider spec: {field}: {reason}")]
    Invalid { field: String, reason: String },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> GrantError {
    GrantError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

impl From<FieldError> for GrantError {
    fn from(e: FieldError) -> GrantError {
        GrantError::Invalid {
            field: e.field,
            reason: e.reason,
        }
    }
}

/// One provider as the administrator configured it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSpec {
    /// Names the provider in logs, metrics and denial messages.
    pub name: String,
    /// The component file. Relative paths are resolved against the spec file's folder.
    pub component: PathBuf,
    /// The values the `config` interface serves. Numbers and booleans are kept as text.
    #[serde(default, deserialize_with = "scalar_map")]
    pub config: BTreeMap<String, String>,
    #[serde(default)]
    pub grants: Grants,
    #[serde(default)]
    pub limits: Limits,
}

impl ProviderSpec {
    /// A spec with no grants and default limits.
    pub fn new(name: impl Into<String>, component: impl Into<PathBuf>) -> ProviderSpec {
        ProviderSpec {
            name: name.into(),
            component: component.into(),
            config: BTreeMap::new(),
            grants: Grants::default(),
            limits: Limits::default(),
        }
    }

    /// Parses and validates YAML; a relative `component` is resolved against `base_dir`.
    pub fn from_yaml(text: &str, base_dir: &Path) -> Result<ProviderSpec, GrantError> {
        let spec: ProviderSpec =
            serde_yaml::from_str(text).map_err(|e| GrantError::Syntax(e.to_string()))?;
        spec.finish(base_dir)
    }

    /// Parses and validates JSON; a relative `component` is resolved against `base_dir`.
    pub fn from_json(text: &str, base_dir: &Path) -> Result<ProviderSpec, GrantError> {
        let spec: ProviderSpec =
            serde_json::from_str(text).map_err(|e| GrantError::Syntax(e.to_string()))?;
        spec.finish(base_dir)
    }

    /// Reads a spec file: JSON when the name ends in `.json`, YAML otherwise.
    pub fn from_file(path: &Path) -> Result<ProviderSpec, GrantError> {
        let text = std::fs::read_to_string(path).map_err(|source| GrantError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"))
        {
            ProviderSpec::from_json(&text, base)
        } else {
            ProviderSpec::from_yaml(&text, base)
        }
    }

    fn finish(mut self, base_dir: &Path) -> Result<ProviderSpec, GrantError> {
        if self.component.is_relative() {
            self.component = base_dir.join(&self.component);
        }
        self.validate()?;
        Ok(self)
    }

    /// Checks everything the types alone do not; the parsers and `Runtime::load` call it.
    pub fn validate(&self) -> Result<(), GrantError> {
        if !is_dns_label(&self.name) {
            return Err(invalid(
                "name",
                format!(
                    "`{}` must be 1-63 lowercase letters, digits or '-', starting and ending \
                     with a letter or digit",
                    self.name
                ),
            ));
        }
        if self.component.as_os_str().is_empty() {
            return Err(invalid("component", "must name the component file"));
        }
        if let Some(key) = self.config.keys().find(|k| k.is_empty()) {
            return Err(invalid("config", format!("empty key `{key}`")));
        }
        self.grants.validate()?;
        self.limits.validate()?;
        Ok(())
    }
}

fn scalar_map<'de, D>(d: D) -> Result<BTreeMap<String, String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Scalar {
        Text(String),
        Int(i64),
        Float(f64),
        Bool(bool),
    }
    let raw: BTreeMap<String, Option<Scalar>> = BTreeMap::deserialize(d).map_err(|e| {
        serde::de::Error::custom(format!(
            "config must map names to strings, numbers or booleans ({e})"
        ))
    })?;
    raw.into_iter()
        .map(|(k, v)| {
            let text = match v {
                Some(Scalar::Text(s)) => s,
                Some(Scalar::Int(i)) => i.to_string(),
                Some(Scalar::Float(f)) => f.to_string(),
                Some(Scalar::Bool(b)) => b.to_string(),
                None => {
                    return Err(serde::de::Error::custom(format!(
                        "config `{k}` has no value"
                    )));
                }
            };
            Ok((k, text))
        })
        .collect()
}

impl Grants {
    /// The HTTP grant covering `url`, if any.
    pub fn http_grant_for(&self, url: &Url) -> Option<&HttpGrant> {
        self.http.iter().find(|g| g.allows(url))
    }

    /// Whether `get-object` (and, for `v1 Node`, `get-node`/`list-nodes`) may read the kind.
    pub fn allows_lookup(&self, api_version: &str, kind: &str) -> bool {
        self.lookup.iter().any(|g| g.allows(api_version, kind))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn http_targets_parse_and_match() {
        // (grant, request url, allowed)
        let table = [
            (
                "https://127.0.0.1:8443",
                "https://127.0.0.1:8443/redfish/v1",
                true,
            ),
            ("https://127.0.0.1:8443", "https://127.0.0.1:8444/", false),
            ("https://127.0.0.1:8443", "http://127.0.0.1:8443/", false),
            ("https://fabric.example", "https://fabric.example/x", true),
            (
                "https://fabric.example",
                "https://fabric.example:443/x",
                true,
            ),
            (
                "https://fabric.example",
                "https://fabric.example:8443/x",
                false,
            ),
            ("http://fabric.example", "http://fabric.example:80/", true),
            (
                "https://FABRIC.Example:443/",
                "https://fabric.example/",
                true,
            ),
            ("https://*.example.com", "https://a.example.com/", true),
            // A registrable domain under a public suffix may be wildcarded.
            ("https://*.fabric.co.uk", "https://api.fabric.co.uk/", true),
            ("https://*.example.com", "https://a.b.example.com/", true),
            ("https://*.example.com", "https://example.com/", false),
            ("https://*.example.com", "https://evilexample.com/", false),
            (
                "https://*.example.com",
                "https://a.example.com.evil/",
                false,
            ),
            ("https://[::1]:8443", "https://[::1]:8443/", true),
            (
                "https://fabric.example",
                "https://fabric.example.evil.com/",
                false,
            ),
        ];
        for (grant, request, allowed) in table {
            let target: HttpTarget = grant.parse().unwrap();
            assert_eq!(
                target.allows(&url(request)),
                allowed,
                "{grant} vs {request}"
            );
        }
    }

    #[test]
    fn bad_http_targets_say_why() {
        let table = [
            ("127.0.0.1:8443", "scheme://host"),
            ("ftp://fabric.example", "not http or https"),
            ("https://fabric.example/api", "remove the path"),
            ("https://fabric.example?x=1", "query"),
            ("https://user:pw@fabric.example", "credentials"),
            ("https://*.com", "two labels"),
            ("https://a.*.example.com", "wildcard is only allowed"),
            ("https://*.10.0.0.1", "wildcard needs a domain"),
            ("https://*.co.uk", "`co.uk` is a public suffix"),
            ("https://*.CO.UK", "is a public suffix"),
            ("https://*.github.io", "`github.io` is a public suffix"),
            ("https://*.com.au", "is a public suffix"),
            ("https://", "empty host"),
            ("https://fabric.example:99999", "invalid port"),
        ];
        for (grant, expected) in table {
            let err = grant.parse::<HttpTarget>().unwrap_err();
            assert!(err.contains(expected), "{grant}: {err}");
        }
    }

    #[test]
    fn target_display_round_trips() {
        for s in [
            "https://*.example.com:443",
            "http://10.0.0.1:8080",
            "https://[::1]:443",
        ] {
            let t: HttpTarget = s.parse().unwrap();
            assert_eq!(t.to_string(), s);
            assert_eq!(t.to_string().parse::<HttpTarget>().unwrap(), t);
        }
    }

    #[test]
    fn secret_and_lookup_grants_allow_only_what_they_list() {
        let secret = SecretGrant {
            namespace: "cro-system".into(),
            name: "credentials".into(),
            keys: vec!["username".into(), "password".into()],
        };
        assert!(secret.allows("username"));
        assert!(secret.allows("password"));
        assert!(!secret.allows("client_secret"));
        assert!(!secret.allows(""));

        let node = LookupGrant::new("v1", "Node");
        assert!(node.allows("v1", "Node"));
        assert!(!node.allows("v1", "Pod"));
        assert!(!node.allows("v2", "Node"));
        assert!(!node.allows("v1", "node"));
    }

    const GOOD: &str = r#"
name: fti
component: ./fti_provider.wasm
config: {api_type: FM, endpoint: "https://127.0.0.1:8443/", port: 8443, debug: true}
grants:
  http:
    - url: "https://127.0.0.1:8443"
    - url: "https://*.fabric.example"
  secret: {namespace: composable-resource-operator-system, name: credentials, keys: [username, password, client_id, client_secret, realm]}
  lookup: [{api_version: v1, kind: Node}, {api_version: machine.openshift.io/v1beta1, kind: Machine}, {api_version: metal3.io/v1alpha1, kind: BareMetalHost}]
  wasi: {clocks: true}
limits: {call_timeout_ms: 30000, memory_bytes: 67108864, max_concurrent_calls: 16, max_response_bytes: 4194304, state_bytes: 65536}
"#;

    #[test]
    fn good_spec_parses() {
        let spec = ProviderSpec::from_yaml(GOOD, Path::new("/etc/cro")).unwrap();
        assert_eq!(spec.name, "fti");
        assert_eq!(spec.component, Path::new("/etc/cro/./fti_provider.wasm"));
        assert_eq!(spec.config["port"], "8443");
        assert_eq!(spec.config["debug"], "true");
        assert_eq!(spec.grants.http.len(), 2);
        assert!(
            spec.grants
                .http_grant_for(&url("https://a.fabric.example/"))
                .is_some()
        );
        assert!(
            spec.grants
                .http_grant_for(&url("https://fabric.example/"))
                .is_none()
        );
        assert!(spec.grants.secret.as_ref().unwrap().allows("realm"));
        assert!(
            spec.grants
                .allows_lookup("metal3.io/v1alpha1", "BareMetalHost")
        );
        assert!(!spec.grants.allows_lookup("v1", "Pod"));
        assert!(spec.grants.wasi.clocks);
        assert_eq!(spec.limits.call_timeout(), Duration::from_secs(30));

        // The same spec as JSON, and an absolute component path stays as written.
        let json = serde_json::to_string(&spec).unwrap();
        let again = ProviderSpec::from_json(&json, Path::new("/elsewhere")).unwrap();
        assert_eq!(again, spec);
    }

    #[test]
    fn minimal_spec_denies_everything() {
        let spec = ProviderSpec::from_yaml("name: p\ncomponent: p.wasm\n", Path::new("")).unwrap();
        assert_eq!(spec.grants, Grants::default());
        assert!(spec.grants.http.is_empty());
        assert!(spec.grants.secret.is_none());
        assert!(spec.grants.lookup.is_empty());
        assert!(!spec.grants.wasi.clocks);
        assert_eq!(spec.limits, Limits::default());
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        let base = "name: p\ncomponent: p.wasm\n";
        // (yaml, text the error must contain)
        let table: &[(&str, &str)] = &[
            ("component: p.wasm\n", "missing field `name`"),
            ("name: p\n", "missing field `component`"),
            ("name: P_1\ncomponent: p.wasm\n", "lowercase"),
            (
                "name: p\ncomponent: p.wasm\ngrant: {}\n",
                "unknown field `grant`",
            ),
            (
                "grants: {http: [{url: \"https://a.example/api\"}]}\n",
                "remove the path",
            ),
            (
                "grants: {http: [{url: \"ftp://a.example\"}]}\n",
                "not http or https",
            ),
            (
                "grants: {http: [{url: \"https://a.example\", cert: x}]}\n",
                "unknown field `cert`",
            ),
            (
                "grants: {http: [{url: \"https://a.example\"}, {url: \"https://a.example:443\"}]}\n",
                "granted twice",
            ),
            (
                "grants: {http: [{url: \"https://a.example\", ca_pem: \"junk\"}]}\n",
                "BEGIN CERTIFICATE",
            ),
            (
                "grants: {http: [{url: \"http://a.example\", ca_pem: \"junk\"}]}\n",
                "BEGIN CERTIFICATE",
            ),
            (
                "grants: {secret: {namespace: ns, name: creds, keys: []}}\n",
                "grants.secret.keys",
            ),
            (
                "grants: {secret: {namespace: ns, name: creds, keys: [a, a]}}\n",
                "listed twice",
            ),
            (
                "grants: {secret: {namespace: Bad_NS, name: creds, keys: [a]}}\n",
                "not a namespace",
            ),
            (
                "grants: {secret: {namespace: ns, keys: [a]}}\n",
                "missing field `name`",
            ),
            (
                "grants: {lookup: [{api_version: v1, kind: node}]}\n",
                "written as in objects",
            ),
            (
                "grants: {lookup: [{api_version: \"a/b/c\", kind: Node}]}\n",
                "group/version",
            ),
            (
                "grants: {lookup: [{api_version: v1, kind: Secret}]}\n",
                "grants.secret",
            ),
            (
                "grants: {lookup: [{api_version: v1, kind: Node}, {api_version: v1, kind: Node}]}\n",
                "granted twice",
            ),
            (
                "grants: {wasi: {clocks: true, filesystem: true}}\n",
                "unknown field `filesystem`",
            ),
            ("grants: {wasi: {env: true}}\n", "unknown field `env`"),
            ("limits: {call_timeout_ms: 0}\n", "limits.call_timeout_ms"),
            ("limits: {memory_bytes: 1000}\n", "limits.memory_bytes"),
            (
                "limits: {max_concurrent_calls: 0}\n",
                "limits.max_concurrent_calls",
            ),
            ("limits: {timeout: 5}\n", "unknown field `timeout`"),
            ("config: {nested: {a: 1}}\n", "strings, numbers or booleans"),
            ("config: {empty: }\n", "has no value"),
        ];
        for (extra, expected) in table {
            let text = if extra.starts_with("name:") || extra.starts_with("component:") {
                extra.to_string()
            } else {
                format!("{base}{extra}")
            };
            let err = ProviderSpec::from_yaml(&text, Path::new("."))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(expected),
                "{extra:?}: `{err}` lacks `{expected}`"
            );
        }
    }

    #[test]
    fn a_real_ca_is_accepted() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["fabric.example".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let yaml = format!(
            "name: p\ncomponent: p.wasm\ngrants:\n  http:\n    - url: https://fabric.example\n      ca_pem: |\n{}",
            cert.pem()
                .lines()
                .map(|l| format!("        {l}\n"))
                .collect::<String>()
        );
        let spec = ProviderSpec::from_yaml(&yaml, Path::new(".")).unwrap();
        assert_eq!(
            spec.grants.http[0]
                .ca_pem
                .as_ref()
                .unwrap()
                .certificates()
                .len(),
            1
        );
    }

    #[test]
    fn spec_files_resolve_the_component_next_to_them() {
        let dir = tempfile::tempdir().unwrap();
        let yaml = dir.path().join("p.yaml");
        std::fs::write(&yaml, "name: p\ncomponent: p.wasm\n").unwrap();
        assert_eq!(
            ProviderSpec::from_file(&yaml).unwrap().component,
            dir.path().join("p.wasm")
        );
        let json = dir.path().join("p.json");
        std::fs::write(&json, r#"{"name": "p", "component": "/abs/p.wasm"}"#).unwrap();
        assert_eq!(
            ProviderSpec::from_file(&json).unwrap().component,
            Path::new("/abs/p.wasm")
        );
        let missing = dir.path().join("missing.yaml");
        let err = ProviderSpec::from_file(&missing).unwrap_err().to_string();
        assert!(err.contains("cannot read provider spec"), "{err}");
    }
}

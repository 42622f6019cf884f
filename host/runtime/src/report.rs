//! The capability report: what a provider says it needs (`describe`, contract 0.2.0)
//! against what its spec grants and configures. Least privilege made visible: what is
//! wanted but not granted fails at the first call that needs it, and what is granted
//! but never wanted is privilege to take back. A pure function of its inputs; each
//! capability module makes its own part of it (`crate::caps::capability::Capability::report`).

use std::fmt;

use serde::Serialize;

use crate::caps;
use crate::caps::capability::{Declared, Findings};
use crate::domain::ProviderInfo;
use crate::grants::ProviderSpec;

/// The report for one provider and spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CapabilityReport {
    /// False when the component's contract has no `describe` (0.1.0): nothing below
    /// can be known.
    pub declared: bool,
    /// Capabilities the provider wants that the spec does not grant.
    pub wanted_not_granted: Vec<String>,
    /// Grants the provider never said it wants.
    pub granted_not_wanted: Vec<String>,
    /// Configuration keys the spec sets that the provider does not accept.
    pub unknown_config: Vec<String>,
    /// Configuration keys the provider requires that the spec does not set.
    pub missing_config: Vec<String>,
}

impl CapabilityReport {
    /// Compares `info` (none: not declared) with `spec`'s grants and configuration:
    /// each registered capability adds its own findings.
    pub fn new(info: Option<&ProviderInfo>, spec: &ProviderSpec) -> CapabilityReport {
        let Some(info) = info else {
            return CapabilityReport::default();
        };
        let declared = Declared {
            info,
            config: &spec.config,
        };
        let mut findings = Findings::default();
        caps::report(&spec.grants, &declared, &mut findings);
        CapabilityReport {
            declared: true,
            wanted_not_granted: findings.wanted_not_granted,
            granted_not_wanted: findings.granted_not_wanted,
            unknown_config: findings.unknown_config,
            missing_config: findings.missing_config,
        }
    }

    /// Nothing wanted is missing and nothing granted is unused.
    pub fn is_clean(&self) -> bool {
        self.wanted_not_granted.is_empty()
            && self.granted_not_wanted.is_empty()
            && self.unknown_config.is_empty()
            && self.missing_config.is_empty()
    }
}

impl fmt::Display for CapabilityReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.declared {
            return writeln!(
                f,
                "capabilities: not declared (the component's contract has no `describe`)"
            );
        }
        if self.is_clean() {
            return writeln!(
                f,
                "capabilities: every grant is wanted and every want granted"
            );
        }
        writeln!(f, "capabilities:")?;
        for (title, items) in [
            ("wanted but not granted", &self.wanted_not_granted),
            ("granted but never wanted", &self.granted_not_wanted),
            ("config keys not accepted", &self.unknown_config),
            ("required config keys not set", &self.missing_config),
        ] {
            if !items.is_empty() {
                writeln!(f, "  {title}: {}", items.join(", "))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ConfigKey, LookupKind, WantedCapabilities};
    use crate::grants::{HttpGrant, LookupGrant, SecretGrant};

    fn info() -> ProviderInfo {
        ProviderInfo {
            name: "p".into(),
            vendor: "v".into(),
            version: "1".into(),
            devices: Vec::new(),
            capabilities: WantedCapabilities {
                http: vec!["${endpoint}".into(), "https://idm.example".into()],
                secret_keys: vec!["username".into(), "password".into()],
                lookup: vec![
                    LookupKind {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        when_config: None,
                    },
                    LookupKind {
                        api_version: "metal3.io/v1alpha1".into(),
                        kind: "BareMetalHost".into(),
                        when_config: Some("cluster_id".into()),
                    },
                ],
                clocks: true,
            },
            config: vec![
                ConfigKey {
                    name: "endpoint".into(),
                    required: true,
                    description: String::new(),
                },
                ConfigKey {
                    name: "timeout_ms".into(),
                    required: false,
                    description: String::new(),
                },
            ],
        }
    }

    fn spec() -> ProviderSpec {
        let mut spec = ProviderSpec::new("p", "p.wasm");
        spec.config
            .insert("endpoint".into(), "https://fabric.example:8443/api/".into());
        spec.grants.http = vec![
            HttpGrant::new("https://fabric.example:8443".parse().unwrap()),
            HttpGrant::new("https://idm.example".parse().unwrap()),
        ];
        spec.grants.secret = Some(SecretGrant {
            namespace: "ns".into(),
            name: "creds".into(),
            keys: vec!["username".into(), "password".into()],
        });
        spec.grants.lookup = vec![LookupGrant::new("v1", "Node")];
        spec.grants.wasi.clocks = true;
        spec
    }

    #[test]
    fn matching_grants_are_clean() {
        let r = CapabilityReport::new(Some(&info()), &spec());
        assert!(r.declared);
        assert!(r.is_clean(), "{r:?}");
        // With `cluster_id` set, the BareMetalHost lookup is wanted too.
        let mut with_cluster = spec();
        with_cluster.config.insert("cluster_id".into(), "c".into());
        let r = CapabilityReport::new(Some(&info()), &with_cluster);
        assert_eq!(
            r.wanted_not_granted,
            ["lookup metal3.io/v1alpha1 BareMetalHost"]
        );
        assert_eq!(r.unknown_config, ["cluster_id"]);
    }

    #[test]
    fn names_what_is_missing_and_what_is_extra() {
        let mut spec = spec();
        spec.grants.http.remove(0);
        spec.grants
            .http
            .push(HttpGrant::new("https://other.example".parse().unwrap()));
        spec.grants.secret.as_mut().unwrap().keys = vec!["username".into(), "token".into()];
        // Granted, but wanted only with `cluster_id`, which is not set.
        spec.grants.lookup = vec![LookupGrant::new("metal3.io/v1alpha1", "BareMetalHost")];
        spec.grants.wasi.clocks = false;
        spec.config.insert("api_typo".into(), "FM".into());
        let r = CapabilityReport::new(Some(&info()), &spec);
        assert_eq!(
            r.wanted_not_granted,
            [
                "http https://fabric.example:8443 (${endpoint})",
                "secret key password",
                "lookup v1 Node",
                "clocks"
            ]
        );
        assert_eq!(
            r.granted_not_wanted,
            [
                "http https://other.example:443",
                "secret key token (of ns/creds)",
                "lookup metal3.io/v1alpha1 BareMetalHost"
            ]
        );
        assert_eq!(r.unknown_config, ["api_typo"]);
        assert!(r.missing_config.is_empty());
        let text = r.to_string();
        assert!(
            text.contains("wanted but not granted: http https://fabric.example:8443"),
            "{text}"
        );
    }

    #[test]
    fn unset_config_key_and_undeclared_provider() {
        let mut spec = spec();
        spec.config
            .insert("endpoint".into(), "fabric.example:8443/".into());
        assert!(CapabilityReport::new(Some(&info()), &spec).is_clean());
        spec.config.clear();
        let r = CapabilityReport::new(Some(&info()), &spec);
        assert_eq!(r.missing_config, ["endpoint"]);
        assert_eq!(
            r.wanted_not_granted,
            ["http ${endpoint}: configuration key `endpoint` is not set"]
        );
        let none = CapabilityReport::new(None, &spec);
        assert!(!none.declared);
        assert!(none.to_string().contains("not declared"));
    }
}

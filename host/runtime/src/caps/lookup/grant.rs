//! The `lookup` capability's grant: the kinds of cluster object a provider may read;
//! the shape every name and namespace must have before any request is made; and the
//! gate's checks of both ([`Kind`], [`ObjectName`]).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::base::{FieldError, is_dns_label, is_dns_subdomain, quote};
use crate::gate::{CapabilityKind, Check};

/// A kind of cluster object a provider may read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LookupGrant {
    /// `v1` for the core group, `group/version` otherwise.
    pub api_version: String,
    /// The kind as written in objects (`Node`, `BareMetalHost`).
    pub kind: String,
}

impl LookupGrant {
    pub fn new(api_version: impl Into<String>, kind: impl Into<String>) -> LookupGrant {
        LookupGrant {
            api_version: api_version.into(),
            kind: kind.into(),
        }
    }

    pub fn allows(&self, api_version: &str, kind: &str) -> bool {
        self.api_version == api_version && self.kind == kind
    }

    pub(crate) fn validate(&self, i: usize) -> Result<(), FieldError> {
        let field = || format!("grants.lookup[{i}]");
        let version_ok = match self.api_version.split_once('/') {
            Some((group, version)) => is_dns_subdomain(group) && is_dns_label(version),
            None => is_dns_label(&self.api_version),
        };
        if !version_ok {
            return Err(FieldError::new(
                field(),
                format!(
                    "api_version `{}` must be `v1` or `group/version`",
                    self.api_version
                ),
            ));
        }
        let kind_ok = self.kind.starts_with(|c: char| c.is_ascii_uppercase())
            && self.kind.chars().all(|c| c.is_ascii_alphanumeric());
        if !kind_ok {
            return Err(FieldError::new(
                field(),
                format!(
                    "kind `{}` must be written as in objects, e.g. `Node`",
                    self.kind
                ),
            ));
        }
        if self.kind == "Secret" && self.api_version == "v1" {
            return Err(FieldError::new(
                field(),
                "Secrets are read through `grants.secret` (one Secret, listed keys), not lookup",
            ));
        }
        Ok(())
    }
}

/// Checks the `grants.lookup` list as a whole: each kind valid, none granted twice.
pub(crate) fn validate(grants: &[LookupGrant]) -> Result<(), FieldError> {
    let mut kinds = BTreeSet::new();
    for (i, grant) in grants.iter().enumerate() {
        grant.validate(i)?;
        if !kinds.insert((grant.api_version.as_str(), grant.kind.as_str())) {
            return Err(FieldError::new(
                format!("grants.lookup[{i}]"),
                format!("{} {} is granted twice", grant.api_version, grant.kind),
            ));
        }
    }
    Ok(())
}

/// Reading objects of a kind (`v1 Node` for `get-node`/`list-nodes`).
pub(crate) struct Kind<'a> {
    pub(crate) grants: &'a [LookupGrant],
    pub(crate) api_version: &'a str,
    pub(crate) kind: &'a str,
}

impl Check for Kind<'_> {
    fn kind(&self) -> Option<CapabilityKind> {
        Some(CapabilityKind::Lookup)
    }

    fn decide(&self) -> Result<(), String> {
        if self
            .grants
            .iter()
            .any(|g| g.allows(self.api_version, self.kind))
        {
            return Ok(());
        }
        Err(format!(
            "no lookup grant for {} {}",
            quote(self.api_version),
            quote(self.kind)
        ))
    }
}

/// The name (and namespace) of an object to read: must be a Kubernetes name
/// ([`check_name`]).
pub(crate) struct ObjectName<'a> {
    pub(crate) name: &'a str,
    pub(crate) namespace: Option<&'a str>,
}

impl Check for ObjectName<'_> {
    fn kind(&self) -> Option<CapabilityKind> {
        Some(CapabilityKind::Lookup)
    }

    fn decide(&self) -> Result<(), String> {
        check_name(self.name, self.namespace)
    }
}

/// Checks a name the guest wants read, before any request: an object name must be a
/// DNS subdomain (what Nodes, Machines and BareMetalHosts are) and a namespace a DNS
/// label. Anything else — `..`, `/proxy`, `?labelSelector=`, `%2F` — would become part of
/// the API server's URL path and could reach another resource (a node's proxy
/// subresource where RBAC allows it), so it is refused as malformed.
pub fn check_name(name: &str, namespace: Option<&str>) -> Result<(), String> {
    if !is_dns_subdomain(name) {
        return Err(format!(
            "`{}` is not a Kubernetes object name (lowercase letters, digits, '-' and '.', \
             at most 253)",
            quote(name)
        ));
    }
    if let Some(ns) = namespace
        && !is_dns_label(ns)
    {
        return Err(format!(
            "`{}` is not a Kubernetes namespace name",
            quote(ns)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kubernetes_names_pass() {
        for ok in ["worker-0", "m0", "a.b.c", "node-1.example.com"] {
            assert_eq!(check_name(ok, None), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "..",
            ".",
            "a/../b",
            "worker-0/proxy",
            "x?labelSelector=a",
            "x%2Fproxy",
            "Worker",
            "a..b",
            "-a",
            "a\nb",
        ] {
            assert!(check_name(bad, None).is_err(), "{bad:?}");
        }
        assert!(check_name("m0", Some("../kube-system")).is_err());
        assert!(check_name("m0", Some("a.b")).is_err());
        assert_eq!(check_name("m0", Some("openshift-machine-api")), Ok(()));
        let long = "a".repeat(1 << 20);
        let err = check_name(&long, None).unwrap_err();
        assert!(err.len() < 400, "{}", err.len());
    }
}

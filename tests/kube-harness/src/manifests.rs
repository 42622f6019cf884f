//! Applying rendered manifests (helm or kustomize output) to the API server: every object
//! through server-side apply, for real or as a dry run, so the server's own validation
//! (schemas, defaulting, admission) judges each one.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};
use serde::Deserialize;

use crate::crds::{CrdInstallError, install_crds};

const FIELD_MANAGER: &str = "kube-harness-manifests";
const CRD_WAIT: Duration = Duration::from_secs(60);

/// Why manifests could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// A YAML document could not be parsed.
    #[error("document {index} is not valid YAML: {source}")]
    Parse {
        /// Position in the stream (0-based).
        index: usize,
        /// The parser's error.
        source: serde_yaml::Error,
    },
    /// A document lacks apiVersion, kind or metadata.name.
    #[error("document {index} lacks apiVersion, kind or metadata.name: {doc}")]
    Incomplete {
        /// Position in the stream (0-based).
        index: usize,
        /// The document, as JSON.
        doc: String,
    },
    /// The API server does not serve the kind.
    #[error("the API server does not serve {0}")]
    UnknownKind(String),
    /// CRDs in the stream could not be installed.
    #[error(transparent)]
    Crds(#[from] CrdInstallError),
    /// Discovery failed.
    #[error("discovery failed: {0}")]
    Discovery(#[source] kube::Error),
    /// The API server refused an object.
    #[error("the API server refused {what}: {source}")]
    Refused {
        /// Kind, namespace and name.
        what: String,
        /// The error.
        source: kube::Error,
    },
}

/// One object of a rendered stream.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    /// `group/version` or `version`.
    pub api_version: String,
    /// The kind.
    pub kind: String,
    /// metadata.name.
    pub name: String,
    /// metadata.namespace, if set.
    pub namespace: Option<String>,
    /// The whole object.
    pub object: serde_json::Value,
}

impl Manifest {
    /// `Kind namespace/name`.
    pub fn describe(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        }
    }
}

/// Parses a multi-document YAML stream; empty documents (helm leaves some) are skipped.
pub fn parse(yaml: &str) -> Result<Vec<Manifest>, ManifestError> {
    let mut out = Vec::new();
    for (index, doc) in serde_yaml::Deserializer::from_str(yaml).enumerate() {
        let value = serde_json::Value::deserialize(doc)
            .map_err(|source| ManifestError::Parse { index, source })?;
        if value.is_null() {
            continue;
        }
        let text = |v: &serde_json::Value| v.as_str().map(str::to_owned);
        let (Some(api_version), Some(kind), Some(name)) = (
            text(&value["apiVersion"]),
            text(&value["kind"]),
            text(&value["metadata"]["name"]),
        ) else {
            return Err(ManifestError::Incomplete {
                index,
                doc: value.to_string(),
            });
        };
        out.push(Manifest {
            api_version,
            kind,
            name,
            namespace: text(&value["metadata"]["namespace"]),
            object: value,
        });
    }
    Ok(out)
}

/// Applies `manifests`: Namespaces and CRDs for real first (the rest may need them), then
/// every other object server-side, as a dry run when `dry_run` is set. Returns what was
/// applied, in order.
pub async fn apply(
    client: &kube::Client,
    manifests: &[Manifest],
    dry_run: bool,
) -> Result<Vec<String>, ManifestError> {
    let mut done = Vec::new();
    let crds: Vec<CustomResourceDefinition> = manifests
        .iter()
        .filter(|m| m.kind == "CustomResourceDefinition")
        .map(|m| {
            serde_json::from_value(m.object.clone()).map_err(|e| ManifestError::Refused {
                what: m.describe(),
                source: kube::Error::SerdeError(e),
            })
        })
        .collect::<Result<_, _>>()?;
    if !crds.is_empty() {
        install_crds(client, &crds, CRD_WAIT).await?;
        done.extend(crds.iter().map(|c| {
            format!(
                "CustomResourceDefinition {}",
                c.metadata.name.clone().unwrap_or_default()
            )
        }));
    }
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .map_err(ManifestError::Discovery)?;
    let (first, rest): (Vec<&Manifest>, Vec<&Manifest>) = manifests
        .iter()
        .filter(|m| m.kind != "CustomResourceDefinition")
        .partition(|m| m.kind == "Namespace");
    for (m, dry) in first
        .into_iter()
        .map(|m| (m, false))
        .chain(rest.into_iter().map(|m| (m, dry_run)))
    {
        let gvk = match m.api_version.split_once('/') {
            Some((group, version)) => GroupVersionKind::gvk(group, version, &m.kind),
            None => GroupVersionKind::gvk("", &m.api_version, &m.kind),
        };
        let (resource, caps) = discovery
            .resolve_gvk(&gvk)
            .ok_or_else(|| ManifestError::UnknownKind(format!("{}/{}", m.api_version, m.kind)))?;
        let api: Api<DynamicObject> = match (caps.scope, &m.namespace) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
            (Scope::Namespaced, None) => Api::default_namespaced_with(client.clone(), &resource),
            (Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
        };
        let mut params = PatchParams::apply(FIELD_MANAGER).force();
        params.dry_run = dry;
        // A misspelt or misplaced field is an error, not a warning that is dropped.
        params.field_validation = Some(kube::api::ValidationDirective::Strict);
        api.patch(&m.name, &params, &Patch::Apply(&m.object))
            .await
            .map_err(|source| ManifestError::Refused {
                what: m.describe(),
                source,
            })?;
        done.push(m.describe());
    }
    Ok(done)
}

/// A CRD that accepts any object of a third-party kind the manifests use but the test
/// cluster does not run (cert-manager's Certificate, Prometheus' ServiceMonitor): the
/// object's own fields are not checked, only that it is well-formed for the API server.
pub fn stand_in_crd(
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    namespaced: bool,
) -> CustomResourceDefinition {
    let scope = if namespaced { "Namespaced" } else { "Cluster" };
    // A fixed, valid document: deserialising it cannot fail.
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group,
            "scope": scope,
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": [{"name": version, "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
        },
    }))
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_skips_empty_documents_and_reads_identity() {
        let yaml = "---\n# only a comment\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  namespace: ns\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: b\n";
        let m = parse(yaml).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].describe(), "ConfigMap ns/a");
        assert_eq!(m[1].describe(), "ClusterRole b");
    }

    #[test]
    fn parse_refuses_an_object_without_a_name() {
        let err = parse("apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n").unwrap_err();
        assert!(
            matches!(err, ManifestError::Incomplete { index: 0, .. }),
            "{err}"
        );
    }

    #[test]
    fn stand_in_crds_are_well_formed() {
        let crd = stand_in_crd(
            "monitoring.coreos.com",
            "v1",
            "ServiceMonitor",
            "servicemonitors",
            true,
        );
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("servicemonitors.monitoring.coreos.com")
        );
        assert_eq!(crd.spec.scope, "Namespaced");
    }
}

//! Installing CustomResourceDefinitions and waiting until they are usable.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use serde::Deserialize;

const FIELD_MANAGER: &str = "kube-harness";
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Why CRDs could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum CrdInstallError {
    /// The directory or a file in it could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A YAML document is not a CustomResourceDefinition.
    #[error("{path} holds a document that is not a CustomResourceDefinition: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        source: serde_yaml::Error,
    },
    /// A document has no `metadata.name`.
    #[error("a CustomResourceDefinition in {0} has no name")]
    Unnamed(PathBuf),
    /// The API server refused a CRD.
    #[error("the API server refused the CRD {name}: {source}")]
    Apply {
        /// The CRD.
        name: String,
        /// The error.
        source: kube::Error,
    },
    /// A CRD did not become Established and served in time.
    #[error("the CRD {name} was not established and served within {waited:?}: {problem}")]
    NotEstablished {
        /// The CRD.
        name: String,
        /// How long we waited.
        waited: Duration,
        /// What was still missing.
        problem: String,
    },
}

/// Reads every CRD from the `*.yaml` / `*.yml` files of `dir` (multi-document files too),
/// in file-name order.
pub fn read_crd_dir(dir: &Path) -> Result<Vec<CustomResourceDefinition>, CrdInstallError> {
    let read_err = |path: &Path| {
        let path = path.to_owned();
        move |source| CrdInstallError::Read { path, source }
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_err(dir))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(read_err(dir))?;
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"));
    files.sort();
    let mut crds = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).map_err(read_err(&path))?;
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(document).map_err(|source| {
                CrdInstallError::Parse {
                    path: path.clone(),
                    source,
                }
            })?;
            if value.is_null() {
                continue; // an empty document, e.g. after a trailing `---`
            }
            let crd: CustomResourceDefinition =
                serde_yaml::from_value(value).map_err(|source| CrdInstallError::Parse {
                    path: path.clone(),
                    source,
                })?;
            if crd.metadata.name.is_none() {
                return Err(CrdInstallError::Unnamed(path));
            }
            crds.push(crd);
        }
    }
    Ok(crds)
}

/// Creates or updates each CRD (server-side apply) and waits until all are Established and
/// listed by discovery, so objects can be created right away. Returns their names.
pub async fn install_crds(
    client: &kube::Client,
    crds: &[CustomResourceDefinition],
    timeout: Duration,
) -> Result<Vec<String>, CrdInstallError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut names = Vec::new();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let mut crd = crd.clone();
        // An applied object must not carry server-owned fields.
        crd.metadata.resource_version = None;
        crd.metadata.managed_fields = None;
        crd.status = None;
        api.patch(&name, &params, &Patch::Apply(&crd))
            .await
            .map_err(|source| CrdInstallError::Apply {
                name: name.clone(),
                source,
            })?;
        names.push(name);
    }
    let started = Instant::now();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let not_ready = |problem: String| CrdInstallError::NotEstablished {
            name: name.clone(),
            waited: started.elapsed(),
            problem,
        };
        let remaining = timeout.saturating_sub(started.elapsed());
        match tokio::time::timeout(
            remaining,
            await_condition(api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(not_ready(e.to_string())),
            Err(_) => return Err(not_ready("no Established condition".into())),
        }
        for version in crd.spec.versions.iter().filter(|v| v.served) {
            let group_version = format!("{}/{}", crd.spec.group, version.name);
            loop {
                let problem = match client.list_api_group_resources(&group_version).await {
                    Ok(list)
                        if list
                            .resources
                            .iter()
                            .any(|r| r.name == crd.spec.names.plural) =>
                    {
                        break;
                    }
                    Ok(_) => format!(
                        "{group_version} does not list {} yet",
                        crd.spec.names.plural
                    ),
                    Err(e) => format!("discovery of {group_version}: {e}"),
                };
                if started.elapsed() >= timeout {
                    return Err(not_ready(problem));
                }
                tokio::time::sleep(POLL_INTERVAL).await;
            }
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CRD: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names: {kind: Widget, plural: widgets}
  scope: Cluster
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object}
";

    #[test]
    fn reads_multi_document_files_and_skips_other_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.yaml"), CRD).unwrap();
        let second = CRD
            .replace("widgets", "gadgets")
            .replace("Widget", "Gadget");
        std::fs::write(
            dir.path().join("a.yml"),
            format!("---\n{second}---\n{CRD}---\n"),
        )
        .unwrap();
        std::fs::write(dir.path().join("README.md"), "not yaml: [").unwrap();
        let names: Vec<_> = read_crd_dir(dir.path())
            .unwrap()
            .into_iter()
            .map(|c| c.metadata.name.unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "gadgets.example.com",
                "widgets.example.com",
                "widgets.example.com"
            ]
        );
    }

    #[test]
    fn rejects_documents_that_are_not_crds() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("x.yaml"), "kind: ConfigMap\nspec: 3\n").unwrap();
        assert!(matches!(
            read_crd_dir(dir.path()),
            Err(CrdInstallError::Parse { .. })
        ));
        let missing = dir.path().join("missing");
        assert!(matches!(
            read_crd_dir(&missing),
            Err(CrdInstallError::Read { .. })
        ));
    }
}

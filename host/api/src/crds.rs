//! The CustomResourceDefinitions of every kind, as committed in `crds/`.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::{CdiProvider, ComposabilityRequest, ComposableResource};

/// Command that regenerates the committed YAML.
pub const REGENERATE_COMMAND: &str = "cargo run -p cro-api --bin crdgen";

/// Why the CRD YAML could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// The CRD could not be serialized.
    #[error("cannot serialize the CRD {name} to YAML: {source}")]
    Yaml {
        /// Name of the CRD.
        name: String,
        /// The serializer's error.
        source: serde_yaml::Error,
    },
}

/// All CRDs, in a fixed order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        ComposabilityRequest::crd(),
        ComposableResource::crd(),
        CdiProvider::crd(),
    ]
}

/// One generated file of `crds/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrdFile {
    /// File name inside `crds/`: `<plural>.<group>.yaml`.
    pub file_name: String,
    /// Full file content.
    pub yaml: String,
}

/// The files `crds/` must contain, one per CRD.
pub fn crd_files() -> Result<Vec<CrdFile>, CrdError> {
    crds()
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let body = serde_yaml::to_string(&crd).map_err(|source| CrdError::Yaml {
                name: name.clone(),
                source,
            })?;
            Ok(CrdFile {
                file_name: format!("{name}.yaml"),
                yaml: format!(
                    "# Generated from the Rust types in host/api by `{REGENERATE_COMMAND}`.\n\
                     # Do not edit: change the types and regenerate.\n{body}"
                ),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::well_known::{GROUP, VERSION};
    use serde_json::{Value, json};

    fn schema_of(crd: &CustomResourceDefinition) -> Value {
        let version = &crd.spec.versions[0];
        serde_json::to_value(
            version
                .schema
                .as_ref()
                .unwrap()
                .open_api_v3_schema
                .as_ref()
                .unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn all_kinds_are_cluster_scoped_with_status_in_the_group() {
        for crd in crds() {
            assert_eq!(crd.spec.group, GROUP);
            assert_eq!(crd.spec.scope, "Cluster");
            assert_eq!(crd.spec.versions.len(), 1);
            let v = &crd.spec.versions[0];
            assert_eq!(v.name, VERSION);
            assert!(v.served && v.storage);
            assert!(v.subresources.as_ref().unwrap().status.is_some());
            let columns: Vec<_> = v
                .additional_printer_columns
                .as_ref()
                .unwrap()
                .iter()
                .map(|c| c.name.as_str())
                .collect();
            // The Go kinds lead with their state; a provider with its readiness.
            let first = if crd.spec.names.kind == "CdiProvider" {
                "Ready"
            } else {
                "State"
            };
            assert_eq!(columns.first(), Some(&first));
            assert_eq!(columns.last(), Some(&"Age"));
            assert_eq!(
                crd.spec.names.categories.as_deref(),
                Some(&["cro".to_owned()][..])
            );
        }
    }

    #[test]
    fn request_schema_has_the_go_operators_validation() {
        let schema = schema_of(&ComposabilityRequest::crd());
        let resource = &schema["properties"]["spec"]["properties"]["resource"];
        let props = &resource["properties"];
        assert_eq!(props["type"]["enum"], json!(["gpu", "cxlmemory"]));
        assert_eq!(props["model"]["minLength"], 1);
        assert_eq!(props["size"]["minimum"].as_f64(), Some(0.0));
        assert_eq!(props["size"]["format"], "int64");
        assert_eq!(
            props["allocation_policy"]["enum"],
            json!(["samenode", "differentnode"])
        );
        assert_eq!(props["allocation_policy"]["default"], "samenode");
        assert_eq!(props["force_detach"]["type"], "boolean");
        assert!(props["force_detach"].get("default").is_none());
        assert_eq!(props["target_node"]["type"], "string");
        for field in [
            "milli_cpu",
            "memory",
            "ephemeral_storage",
            "allowed_pod_number",
        ] {
            assert_eq!(
                props["other_spec"]["properties"][field]["minimum"].as_f64(),
                Some(0.0),
                "{field}"
            );
        }
        assert_eq!(resource["required"], json!(["model", "size", "type"]));

        let status = &schema["properties"]["status"]["properties"];
        let entry = &status["resources"]["additionalProperties"]["properties"];
        for field in ["state", "device_id", "cdi_device_id", "node_name", "error"] {
            assert_eq!(entry[field]["type"], "string", "{field}");
            assert!(entry[field].get("default").is_none(), "{field}");
        }
        assert_eq!(
            status["scalarResource"]["properties"]["type"]["enum"],
            json!(["gpu", "cxlmemory"])
        );
        assert!(status["state"].get("enum").is_none());
    }

    #[test]
    fn resource_schema_requires_what_the_operator_always_sets() {
        let schema = schema_of(&ComposableResource::crd());
        let spec = &schema["properties"]["spec"];
        assert_eq!(
            spec["properties"]["type"]["enum"],
            json!(["gpu", "cxlmemory"])
        );
        assert_eq!(spec["required"], json!(["model", "target_node", "type"]));
        let status = &schema["properties"]["status"]["properties"];
        for field in ["state", "error", "device_id", "cdi_device_id"] {
            assert_eq!(status[field]["type"], "string", "{field}");
        }
    }

    #[test]
    fn files_are_named_after_the_crds_and_marked_generated() {
        let files = crd_files().unwrap();
        let names: Vec<_> = files.iter().map(|f| f.file_name.as_str()).collect();
        assert_eq!(
            names,
            [
                "composabilityrequests.cro.hpsys.ibm.ie.com.yaml",
                "composableresources.cro.hpsys.ibm.ie.com.yaml",
                "cdiproviders.cro.hpsys.ibm.ie.com.yaml"
            ]
        );
        for f in &files {
            assert!(f.yaml.contains(REGENERATE_COMMAND));
            let back: CustomResourceDefinition = serde_yaml::from_str(&f.yaml).unwrap();
            assert!(crds().contains(&back));
        }
    }
}

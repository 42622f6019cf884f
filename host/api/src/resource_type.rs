//! The kind of composable device a request or resource is about.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `spec.resource.type` / `spec.type`: `gpu` or `cxlmemory`.
///
/// The CRD schema enumerates these values, so the API server refuses anything else and a
/// stored object always deserializes.
// Variants carry no doc comments on purpose: schemars would turn documented variants into a
// `oneOf`, and a plain `enum` keeps the CRD schema and the API server's message simple.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ResourceType {
    Gpu,
    CxlMemory,
}

/// A string that is not a resource type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown resource type {0:?}: expected \"gpu\" or \"cxlmemory\"")]
pub struct UnknownResourceType(pub String);

impl ResourceType {
    /// Every resource type.
    pub const ALL: [ResourceType; 2] = [ResourceType::Gpu, ResourceType::CxlMemory];

    /// The string used in manifests and resource names.
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceType::Gpu => "gpu",
            ResourceType::CxlMemory => "cxlmemory",
        }
    }

    /// A fresh ComposableResource name, `<type>-<uuid v4>` in lower case (docs/behaviour.md §2).
    pub fn new_resource_name(self) -> String {
        format!("{}-{}", self.as_str(), uuid::Uuid::new_v4())
    }
}

impl fmt::Display for ResourceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ResourceType {
    type Err = UnknownResourceType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ResourceType::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| UnknownResourceType(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_round_trip() {
        for t in ResourceType::ALL {
            assert_eq!(t.as_str().parse::<ResourceType>().unwrap(), t);
            assert_eq!(serde_json::to_value(t).unwrap(), t.as_str());
        }
        assert_eq!(
            "GPU".parse::<ResourceType>(),
            Err(UnknownResourceType("GPU".into()))
        );
        assert!(serde_json::from_str::<ResourceType>("\"fpga\"").is_err());
    }

    #[test]
    fn resource_names_are_type_dash_lowercase_uuid() {
        let name = ResourceType::CxlMemory.new_resource_name();
        let uuid = name.strip_prefix("cxlmemory-").unwrap();
        let parsed = uuid::Uuid::parse_str(uuid).unwrap();
        assert_eq!(parsed.get_version_num(), 4);
        assert_eq!(uuid, uuid.to_lowercase());
        assert_ne!(name, ResourceType::CxlMemory.new_resource_name());
    }

    #[test]
    fn schema_is_a_plain_string_enum() {
        let schema = schemars::schema_for!(ResourceType);
        assert_eq!(schema.get("type").unwrap(), "string");
        assert_eq!(
            schema.get("enum").unwrap(),
            &serde_json::json!(["gpu", "cxlmemory"])
        );
    }
}

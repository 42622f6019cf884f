//! Metadata helpers the operator needs on both kinds.

use kube::Resource;

use crate::well_known::FINALIZER;

/// Finalizer and deletion helpers for any Kubernetes object.
pub trait CroObjectExt: Resource {
    /// Whether the operator's finalizer is present.
    fn has_cro_finalizer(&self) -> bool {
        self.meta()
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER)
    }

    /// Whether deletion was requested (the API server set `deletionTimestamp`).
    fn is_being_deleted(&self) -> bool {
        self.meta().deletion_timestamp.is_some()
    }
}

impl<K: Resource> CroObjectExt for K {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        ComposabilityRequest, ComposabilityRequestSpec, ResourceType, ScalarResourceDetails,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::ResourceExt;

    #[test]
    fn finalizer_and_deletion_are_detected() {
        let mut req = ComposabilityRequest::new(
            "r",
            ComposabilityRequestSpec {
                resource: ScalarResourceDetails {
                    resource_type: ResourceType::Gpu,
                    model: "m".into(),
                    size: 1,
                    force_detach: false,
                    allocation_policy: Default::default(),
                    target_node: None,
                    other_spec: None,
                },
            },
        );
        assert!(!req.has_cro_finalizer());
        assert!(!req.is_being_deleted());
        req.finalizers_mut().push("other/finalizer".into());
        assert!(!req.has_cro_finalizer());
        req.finalizers_mut().push(FINALIZER.into());
        req.metadata.deletion_timestamp = Some(Time("2025-01-01T00:00:00Z".parse().unwrap()));
        assert!(req.has_cro_finalizer());
        assert!(req.is_being_deleted());
    }
}

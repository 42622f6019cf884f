//! The `Provider` trait: the five operations of contract 0.2.0 in the host's own terms.
//! A vendor implements it over a [`crate::Host`]; `export_provider!` makes it the
//! component's export.

use crate::model::{
    AddOutcome, AddRequest, Claim, ComposableResource, DeviceInfo, ProviderError, ProviderInfo,
    RemoveOutcome,
};

/// What a provider does. One value serves one call (instances live for one call).
pub trait Provider {
    /// What the provider is and needs. Must not use the host: it is called at load with
    /// nothing granted.
    fn describe() -> ProviderInfo
    where
        Self: Sized;

    /// Attach a device of the request's type and model to its target node.
    fn add_resource(&self, request: &AddRequest) -> Result<AddOutcome, ProviderError>;

    /// Detach the resource's device; a device already gone counts as detached.
    fn remove_resource(
        &self,
        resource: &ComposableResource,
    ) -> Result<RemoveOutcome, ProviderError>;

    /// Ok when the device is healthy; `warning`, `critical` or `not-found` otherwise.
    fn check_resource(&self, resource: &ComposableResource) -> Result<(), ProviderError>;

    /// Every device the fabric has attached to the cluster's machines; `claims` are the
    /// devices ComposableResources hold.
    fn get_resources(&self, claims: &[Claim]) -> Result<Vec<DeviceInfo>, ProviderError>;
}

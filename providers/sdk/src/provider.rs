//! The `Provider` trait: the six operations of contract 0.3.0 in the host's own terms.
//! A vendor implements it over a [`crate::Host`]; `export_provider!` makes it the
//! component's export.

use crate::model::{
    AddOutcome, AddRequest, Claim, ComposableResource, DeviceInfo, PoolOutcome, PoolQuery,
    ProviderError, ProviderInfo, RemoveOutcome,
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

    /// The fabric's free devices of the query's kinds, by pool, and which of the query's
    /// nodes each pool reaches. A read: it must not attach or detach. A fabric that
    /// cannot tell its free devices answers `PoolOutcome::NotSupported` with why (no
    /// default: a provider says which it is).
    fn get_pool(&self, query: &PoolQuery) -> Result<PoolOutcome, ProviderError>;
}

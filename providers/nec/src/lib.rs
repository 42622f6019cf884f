//! The NEC CDI Manager (CDIM) provider: attaches a GPU to a node by connecting it to
//! the node's ExpEther I/O adapter with a CDIM layout apply (docs/nec-provider.md), as
//! the Go operator's NEC client (`internal/cdi/nec/client.go`) does.
//!
//! The vendor logic is a plain library over the SDK's [`Host`] trait, tested natively;
//! on `wasm32` (feature `component`) the SDK exports it as a `cro:provider@0.3.0`
//! component.
//!
//! - configuration: `configuration_manager_endpoint`, `layout_apply_endpoint`
//!   (required), `provisional_gpu_uuid`, `timeout_ms` ([`config`]);
//! - no Secret: CDIM takes no credentials;
//! - a node's CDIM node: the resource's `machine-id`, else its Node's `spec.providerID`
//!   verbatim ([`node`]);
//! - device ids: the GPU's CDIM device id is the fabric device id; the device id is
//!   `provisional_gpu_uuid` when set (the Go operator's `NEC_PROVISIONAL_GPU_UUID`: CDIM
//!   reports no GPU UUID), else the CDIM device id; the CDIM node id is the machine id.

mod attach;
mod client;
pub mod config;
mod detach;
mod inventory;
pub mod node;

pub use config::Config;
pub use cro_provider_sdk::{
    AddOutcome, AddRequest, Claim, ComposableResource, DeviceInfo, DeviceType, Host, PoolOutcome,
    PoolQuery, ProviderError, ProviderInfo, RemoveOutcome,
};
use cro_provider_sdk::{Capabilities, ConfigKey, DeviceKind, LookupKind, Provider};

use attach::Attach;
use client::Client;

/// The provider's operations over a host.
pub struct Nec<H: Host> {
    host: H,
}

impl<H: Host> Nec<H> {
    pub fn new(host: H) -> Self {
        Nec { host }
    }

    pub fn host(&self) -> &H {
        &self.host
    }

    fn with_client<T>(
        &self,
        f: impl FnOnce(&Client<'_, H>) -> Result<T, ProviderError>,
    ) -> Result<T, ProviderError> {
        let cfg = Config::load(&self.host)?;
        f(&Client::new(&self.host, &cfg))
    }

    pub fn add(&self, req: &AddRequest) -> Result<AddOutcome, ProviderError> {
        if req.attempt_key.trim().is_empty() {
            return Err(ProviderError::Other(
                "the attach has an empty attempt key".into(),
            ));
        }
        if req.resource.device_type != DeviceType::Gpu {
            return Err(ProviderError::Config(format!(
                "the NEC CDIM provider attaches GPUs only, not {}",
                req.resource.device_type
            )));
        }
        self.with_client(|client| {
            let node = node::node_of(&self.host, &req.resource)?;
            Attach {
                client,
                req,
                node: &node,
            }
            .run(|| node::place_of(client, &node))
        })
    }

    pub fn remove(&self, r: &ComposableResource) -> Result<RemoveOutcome, ProviderError> {
        self.with_client(|client| {
            // The node only guards against taking another node's GPU: a Node deleted
            // meanwhile does not stop the detach.
            let node = node::node_of(&self.host, r).ok();
            detach::remove(client, r, node.as_deref())
        })
    }

    pub fn check(&self, r: &ComposableResource) -> Result<(), ProviderError> {
        self.with_client(|client| inventory::check(client, r))
    }

    pub fn list(&self) -> Result<Vec<DeviceInfo>, ProviderError> {
        self.with_client(inventory::list)
    }

    /// CDIM's free GPUs of the query's models: one pool.
    pub fn pool(&self, query: &PoolQuery) -> Result<PoolOutcome, ProviderError> {
        self.with_client(|client| inventory::pool(client, query))
    }
}

/// What the NEC provider is and needs (`describe`).
pub fn info() -> ProviderInfo {
    ProviderInfo {
        name: "nec".into(),
        vendor: "NEC CDI Manager (CDIM)".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        devices: vec![DeviceKind {
            device_type: DeviceType::Gpu,
            // Whatever model CDIM's pool holds, matched by name.
            models: Vec::new(),
        }],
        capabilities: Capabilities {
            http: vec![
                "${configuration_manager_endpoint}/cdim/api/v1/*".into(),
                "${layout_apply_endpoint}/cdim/api/v1/*".into(),
            ],
            secret_keys: Vec::new(),
            // A node's CDIM node is its providerID; get-resources lists Nodes.
            lookup: vec![LookupKind::new("v1", "Node")],
            // Nothing here reads the wall clock: the host counts the `state` TTLs.
            clocks: false,
        },
        config: config::KEYS
            .iter()
            .map(|(name, required, description)| ConfigKey {
                name: name.to_string(),
                required: *required,
                description: description.to_string(),
            })
            .collect(),
    }
}

impl<H: Host> Provider for Nec<H> {
    fn describe() -> ProviderInfo {
        info()
    }

    fn add_resource(&self, request: &AddRequest) -> Result<AddOutcome, ProviderError> {
        self.add(request)
    }

    fn remove_resource(&self, r: &ComposableResource) -> Result<RemoveOutcome, ProviderError> {
        self.remove(r)
    }

    fn check_resource(&self, r: &ComposableResource) -> Result<(), ProviderError> {
        self.check(r)
    }

    /// CDIM's nodes say which GPUs are connected where; the claims are not needed to
    /// list.
    fn get_resources(&self, _claims: &[Claim]) -> Result<Vec<DeviceInfo>, ProviderError> {
        self.list()
    }

    fn get_pool(&self, query: &PoolQuery) -> Result<PoolOutcome, ProviderError> {
        self.pool(query)
    }
}

#[cfg(all(target_arch = "wasm32", feature = "component"))]
mod component {
    use cro_provider_sdk::guest::{FromHost, WasmHost};

    impl FromHost for crate::Nec<WasmHost> {
        fn from_host(host: WasmHost) -> Self {
            crate::Nec::new(host)
        }
    }

    cro_provider_sdk::export_provider!(crate::Nec<WasmHost>);
}

#[cfg(test)]
mod tests;

//! The DMTF Redfish composition provider: attaches a GPU or CXL memory device to a node
//! by composing a free *resource block* into the node's *computer system* through a
//! Redfish CompositionService (docs/redfish-provider.md; the API it speaks is
//! docs/redfish-api.md).
//!
//! The vendor logic is a plain library over the SDK's [`Host`] trait, tested natively;
//! on `wasm32` (feature `component`) the SDK exports it as a `cro:provider@0.2.0`
//! component.
//!
//! - configuration: `endpoint` (required), `timeout_ms` ([`config`]);
//! - Secret keys: `username`, `password` (a Redfish session; its token stays in `state`);
//! - a node's system: the resource's `machine-id`, else its Node's `spec.providerID`
//!   `redfish://<system id>` ([`machine`]);
//! - device ids: the device's `SerialNumber` (else `UUID`) is the device id, the block's
//!   `Id` the fabric device id, the system's `Id` the machine id.

mod attach;
mod client;
pub mod config;
mod detach;
mod fabric;
mod inventory;
mod locate;
pub mod machine;
mod resources;

pub use client::SESSION_KEY;
pub use config::Config;
pub use cro_provider_sdk::{
    AddOutcome, AddRequest, Claim, ComposableResource, DeviceInfo, DeviceType, Host, ProviderError,
    ProviderInfo, RemoveOutcome,
};
use cro_provider_sdk::{Capabilities, ConfigKey, DeviceKind, LookupKind, Provider};

use attach::Attach;
use client::Client;
use fabric::Fabric;

/// GPU models of the reference simulator (tests/redfish-sim) this provider is certified
/// against; it attaches whatever model the service reports, matched by name.
pub const GPU_MODELS: &[&str] = &["NVIDIA A100 80GB"];
/// CXL memory models of the reference simulator.
pub const CXL_MODELS: &[&str] = &["CXL 256GiB"];

/// The provider's operations over a host.
pub struct Redfish<H: Host> {
    host: H,
}

impl<H: Host> Redfish<H> {
    pub fn new(host: H) -> Self {
        Redfish { host }
    }

    pub fn host(&self) -> &H {
        &self.host
    }

    fn with_fabric<T>(
        &self,
        f: impl FnOnce(&Fabric<'_, H>) -> Result<T, ProviderError>,
    ) -> Result<T, ProviderError> {
        let cfg = Config::load(&self.host)?;
        let fabric = Fabric::new(Client::new(&self.host, &cfg));
        f(&fabric)
    }

    pub fn add(&self, req: &AddRequest) -> Result<AddOutcome, ProviderError> {
        if req.attempt_key.trim().is_empty() {
            return Err(ProviderError::Other(
                "the attach has an empty attempt key".into(),
            ));
        }
        self.with_fabric(|fabric| {
            let system = machine::system_of(&self.host, &req.resource)?;
            Attach {
                fabric,
                req,
                system: &system,
            }
            .run()
        })
    }

    pub fn remove(&self, r: &ComposableResource) -> Result<RemoveOutcome, ProviderError> {
        self.with_fabric(|fabric| {
            let system = machine::system_of(&self.host, r)?;
            detach::remove(fabric, r, &system)
        })
    }

    pub fn check(&self, r: &ComposableResource) -> Result<(), ProviderError> {
        self.with_fabric(|fabric| {
            let system = machine::system_of(&self.host, r)?;
            inventory::check(fabric, r, &system)
        })
    }

    pub fn list(&self) -> Result<Vec<DeviceInfo>, ProviderError> {
        self.with_fabric(inventory::list)
    }
}

/// What the Redfish provider is and needs (`describe`).
pub fn info() -> ProviderInfo {
    let models = |m: &[&str]| m.iter().map(|s| s.to_string()).collect();
    ProviderInfo {
        name: "redfish".into(),
        vendor: "DMTF Redfish".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        devices: vec![
            DeviceKind {
                device_type: DeviceType::Gpu,
                models: models(GPU_MODELS),
            },
            DeviceKind {
                device_type: DeviceType::Cxlmemory,
                models: models(CXL_MODELS),
            },
        ],
        capabilities: Capabilities {
            // Every request goes to the service root's tree on the configured endpoint.
            http: vec!["${endpoint}/redfish/v1/*".into()],
            secret_keys: config::SECRET_KEYS.iter().map(|k| k.to_string()).collect(),
            // A node's system id is its providerID; get-resources lists Nodes.
            lookup: vec![LookupKind::new("v1", "Node")],
            // Per-request timeouts and the session/task bookkeeping in `state` (TTLs)
            // run on the host's clock.
            clocks: true,
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

impl<H: Host> Provider for Redfish<H> {
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

    /// The service's systems say which blocks are composed where; the attach's claims
    /// are not needed to list.
    fn get_resources(&self, _claims: &[Claim]) -> Result<Vec<DeviceInfo>, ProviderError> {
        self.list()
    }
}

#[cfg(all(target_arch = "wasm32", feature = "component"))]
mod component {
    use cro_provider_sdk::guest::{FromHost, WasmHost};

    impl FromHost for crate::Redfish<WasmHost> {
        fn from_host(host: WasmHost) -> Self {
            crate::Redfish::new(host)
        }
    }

    cro_provider_sdk::export_provider!(crate::Redfish<WasmHost>);
}

//! The Fujitsu FTI provider: attaches and detaches composable devices through the
//! FTI Fabric Manager (FM) or Cluster Manager (CM) API.
//!
//! The vendor logic is a plain library over the [`Host`] trait, so it runs and is
//! tested natively; on `wasm32` the same code is compiled into a component of the
//! `cro:provider@0.1.0` `provider-world`, with [`Host`] implemented over the WIT imports.
//!
//! ```text
//! let fti = fti_provider::Fti::new(host);          // host: impl fti_provider::Host
//! match fti.add_resource(&resource)? {
//!     AddOutcome::Attached(d) => /* d.device_id, d.fabric_device_id */,
//!     AddOutcome::InProgress(why) => /* call again later */,
//! }
//! ```
//!
//! Configuration keys are listed in [`config`]. The access token is cached in the
//! host's state store under [`token::STATE_KEY`]; CM bookkeeping lives under `fti/cm/`.

mod cm;
pub mod config;
mod encode;
mod fabric;
mod fm;
mod health;
pub mod host;
pub mod jwt;
mod lenient;
pub mod machine;
pub mod model;
mod reply;
pub mod token;

#[cfg(target_arch = "wasm32")]
mod component;

pub use config::{ApiType, Config};
pub use host::{
    Host, HttpError, HttpRequest, HttpResponse, LogLevel, LookupError, Method, SecretError,
};
pub use model::{
    AddOutcome, AttachedDevice, ComposableResource, DeviceInfo, DeviceType, ProviderError,
    RemoveOutcome,
};

use fabric::Fabric;
use machine::MachineError;

/// The provider's four operations over a host.
pub struct Fti<H: Host> {
    host: H,
}

impl<H: Host> Fti<H> {
    pub fn new(host: H) -> Self {
        Fti { host }
    }

    pub fn host(&self) -> &H {
        &self.host
    }

    pub fn into_host(self) -> H {
        self.host
    }

    /// Attach a device of the resource's type and model to its target node.
    pub fn add_resource(&self, r: &ComposableResource) -> Result<AddOutcome, ProviderError> {
        let cfg = Config::load(&self.host)?;
        let machine = machine::of_node(&self.host, &cfg, &r.target_node)?;
        let f = Fabric::new(&self.host, &cfg);
        match cfg.api_type {
            ApiType::Fm => fm::add(&f, r, &machine),
            ApiType::Cm => cm::add(&f, r, &machine),
        }
    }

    /// Detach the resource's device; a device already gone counts as detached.
    pub fn remove_resource(&self, r: &ComposableResource) -> Result<RemoveOutcome, ProviderError> {
        let cfg = Config::load(&self.host)?;
        let machine = machine::of_node(&self.host, &cfg, &r.target_node)?;
        let f = Fabric::new(&self.host, &cfg);
        match cfg.api_type {
            ApiType::Fm => fm::remove(&f, r, &machine),
            ApiType::Cm => cm::remove(&f, r, &machine),
        }
    }

    /// Ok when the device is healthy; `warning`, `critical` or `not-found` otherwise.
    pub fn check_resource(&self, r: &ComposableResource) -> Result<(), ProviderError> {
        let cfg = Config::load(&self.host)?;
        let machine = machine::of_node(&self.host, &cfg, &r.target_node)?;
        let f = Fabric::new(&self.host, &cfg);
        match cfg.api_type {
            ApiType::Fm => fm::check(&f, r, &machine),
            ApiType::Cm => cm::check(&f, r, &machine),
        }
    }

    /// Every device the fabric has attached to the machines of the cluster's nodes.
    /// Nodes that are not fabric machines are skipped. So is, with a warning, a node
    /// whose machine lookup fails or whose machine the fabric does not know (404): one
    /// such node must not hide the devices of all the others (docs/fti-fabric-api.md).
    /// Refused grants, rejected credentials and fabric failures (5xx, unreachable) still
    /// fail the listing: they would hide every node's devices alike.
    pub fn get_resources(&self) -> Result<Vec<DeviceInfo>, ProviderError> {
        let cfg = Config::load(&self.host)?;
        let f = Fabric::new(&self.host, &cfg);
        let nodes = self.host.list_nodes().map_err(|e| match e {
            LookupError::Denied(m) => ProviderError::Denied(format!("listing Nodes: {m}")),
            LookupError::NotFound(m) | LookupError::Other(m) => {
                ProviderError::Other(format!("listing Nodes: {m}"))
            }
        })?;
        let mut out = Vec::new();
        for json in &nodes {
            let (node, machine) = machine::of_listed_node(&self.host, &cfg, json)?;
            let machine = match machine {
                Ok(m) => m,
                Err(MachineError::NotOnFabric(why)) => {
                    self.host.log(
                        LogLevel::Debug,
                        &format!("node {node} is not on the fabric: {why}"),
                    );
                    continue;
                }
                Err(MachineError::Lookup(e)) if skippable_lookup(&e) => {
                    self.skipped(&node, &format!("its machine lookup failed: {e}"));
                    continue;
                }
                Err(MachineError::Lookup(e)) => return Err(e),
            };
            let devices = match cfg.api_type {
                ApiType::Fm => fm::devices(&f, &node, &machine),
                ApiType::Cm => cm::devices(&f, &node, &machine),
            };
            match devices {
                Ok(devices) => out.extend(devices),
                Err(e) if unknown_machine(&e) => {
                    self.skipped(
                        &node,
                        &format!("the fabric does not know its machine {machine}: {e}"),
                    );
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    fn skipped(&self, node: &str, why: &str) {
        self.host.log(
            LogLevel::Warn,
            &format!("{SKIPPED_NODE_LOG_PREFIX} {node}: {why}"),
        );
    }
}

/// How the warning about a node left out of a device listing begins.
pub const SKIPPED_NODE_LOG_PREFIX: &str = "device listing skips node";

/// A lookup failure of one node's machine chain (a missing or unreadable Machine or
/// BareMetalHost); a refused grant is not one node's problem and fails the listing.
fn skippable_lookup(e: &ProviderError) -> bool {
    matches!(e, ProviderError::NotFound(_) | ProviderError::Other(_))
}

/// The fabric answered that it does not know the machine.
fn unknown_machine(e: &ProviderError) -> bool {
    matches!(
        e,
        ProviderError::NotFound(_) | ProviderError::Fabric { status: 404, .. }
    )
}

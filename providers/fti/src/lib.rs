//! The Fujitsu FTI provider: attaches and detaches composable devices through the
//! FTI Fabric Manager (FM) or Cluster Manager (CM) API.
//!
//! The vendor logic is a plain library over the SDK's [`Host`] trait, so it runs and is
//! tested natively; on `wasm32` (feature `component`, on by default) the SDK exports it
//! as a `cro:provider@0.3.0` component. The bindings and their plumbing live in
//! `cro-provider-sdk`; `providers/test-components/fti-v0-1-0` wraps the same logic in the 0.1.0 world.
//!
//! ```text
//! let fti = fti_provider::Fti::new(host);          // host: impl cro_provider_sdk::Host
//! match fti.add(&request)? {                       // request: AddRequest (claims, attempt key)
//!     AddOutcome::Attached(d) => /* d.device_id, d.fabric_device_id, d.machine_id */,
//!     AddOutcome::InProgress(why) => /* call again later */,
//! }
//! ```
//!
//! Configuration keys are listed in [`config`]. The access token is cached in the
//! host's state store under [`token::STATE_KEY`]; CM bookkeeping lives under `fti/cm/`.

mod cm;
pub mod config;
mod fabric;
mod fm;
mod health;
pub mod jwt;
pub mod machine;
mod pool;
mod reply;
mod reserve;
pub mod token;

pub use config::{ApiType, Config};
// The host abstraction and the contract's types are the SDK's.
pub use cro_provider_sdk::{
    AddOutcome, AddRequest, AttachedDevice, Claim, ComposableResource, DeviceInfo, DeviceType,
    FabricPool, FreeDevices, Host, HttpError, HttpRequest, HttpResponse, LogLevel, LookupError,
    Method, PoolKind, PoolOutcome, PoolQuery, ProviderError, ProviderInfo, RemoveOutcome,
    SecretError,
};
use cro_provider_sdk::{
    Capabilities, ConfigKey, DeviceKind, LookupKind, Provider, encode, lenient,
};
pub use cro_provider_sdk::{host, model};

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

    /// Attach a device of the resource's type and model to its target node, knowing
    /// no claims (what a contract 0.1.0 host asks).
    /// Without claims the Fabric Manager attach cannot tell a device a lost reply left
    /// behind from another resource's, so it always attaches a new one.
    pub fn add_resource(&self, r: &ComposableResource) -> Result<AddOutcome, ProviderError> {
        self.attach(&AddRequest::new(r.clone()), false)
    }

    /// Attach a device for the request; its claims keep another resource's device from
    /// being taken for this one, and let a retry after a lost reply adopt the device
    /// that attach left unclaimed instead of attaching a second one.
    pub fn add(&self, req: &AddRequest) -> Result<AddOutcome, ProviderError> {
        self.attach(req, true)
    }

    fn attach(&self, req: &AddRequest, known_claims: bool) -> Result<AddOutcome, ProviderError> {
        let r = &req.resource;
        let cfg = Config::load(&self.host)?;
        let machine = machine::of_node(&self.host, &cfg, &r.target_node)?;
        let f = Fabric::new(&self.host, &cfg);
        match cfg.api_type {
            ApiType::Fm => fm::add(&f, req, &machine, known_claims),
            ApiType::Cm => cm::add(&f, req, &machine),
        }
    }

    /// The resource's fabric machine: the one recorded at attach when the host passes
    /// it (no Node needed), else the target Node's.
    fn machine_of(&self, cfg: &Config, r: &ComposableResource) -> Result<String, ProviderError> {
        match r.machine_id.as_deref().map(str::trim) {
            Some(m) if !m.is_empty() => Ok(m.to_string()),
            _ => Ok(machine::of_node(&self.host, cfg, &r.target_node)?),
        }
    }

    /// Detach the resource's device; a device already gone counts as detached.
    pub fn remove_resource(&self, r: &ComposableResource) -> Result<RemoveOutcome, ProviderError> {
        let cfg = Config::load(&self.host)?;
        let machine = self.machine_of(&cfg, r)?;
        let f = Fabric::new(&self.host, &cfg);
        match cfg.api_type {
            ApiType::Fm => fm::remove(&f, r, &machine),
            ApiType::Cm => cm::remove(&f, r, &machine),
        }
    }

    /// Ok when the device is healthy; `warning`, `critical` or `not-found` otherwise.
    pub fn check_resource(&self, r: &ComposableResource) -> Result<(), ProviderError> {
        let cfg = Config::load(&self.host)?;
        let machine = self.machine_of(&cfg, r)?;
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
        let mut out = Vec::new();
        for (node, machine) in self.fabric_nodes(&cfg, |_| true)? {
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

    /// The free devices of the query's kinds, one pool per fabric (Fabric Manager).
    /// The Cluster Manager API has no read of free devices: `not-supported`.
    pub fn get_pool(&self, query: &PoolQuery) -> Result<PoolOutcome, ProviderError> {
        let cfg = Config::load(&self.host)?;
        if cfg.api_type == ApiType::Cm {
            return Ok(PoolOutcome::NotSupported(
                "the FTI Cluster Manager API does not report free devices; a provider with \
                 api_type fm (the Fabric Manager) does"
                    .into(),
            ));
        }
        let asked: std::collections::BTreeSet<&str> =
            query.nodes.iter().map(String::as_str).collect();
        let nodes = self.fabric_nodes(&cfg, |n| asked.contains(n))?;
        pool::read(&Fabric::new(&self.host, &cfg), &nodes, &query.kinds)
    }

    /// The cluster's nodes (those `keep` accepts) that are fabric machines, with their
    /// machines, from one listing of Nodes. Nodes that are not fabric machines are
    /// skipped; so is, with a warning, a node whose machine lookup fails: one such node
    /// must not hide all the others. A refused grant fails the whole read.
    fn fabric_nodes(
        &self,
        cfg: &Config,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<(String, String)>, ProviderError> {
        let nodes = self.host.list_nodes().map_err(|e| match e {
            LookupError::Denied(m) => ProviderError::Denied(format!("listing Nodes: {m}")),
            LookupError::NotFound(m) | LookupError::Other(m) => {
                ProviderError::Other(format!("listing Nodes: {m}"))
            }
        })?;
        let mut out = Vec::new();
        for json in &nodes {
            let (node, machine) = machine::of_listed_node(&self.host, cfg, json)?;
            if !keep(&node) {
                continue;
            }
            match machine {
                Ok(m) => out.push((node, m)),
                Err(MachineError::NotOnFabric(why)) => {
                    self.host.log(
                        LogLevel::Debug,
                        &format!("node {node} is not on the fabric: {why}"),
                    );
                }
                Err(MachineError::Lookup(e)) if skippable_lookup(&e) => {
                    self.skipped(&node, &format!("its machine lookup failed: {e}"));
                }
                Err(MachineError::Lookup(e)) => return Err(e),
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

/// What the FTI provider is and needs, for `describe`. The Secret keys are the
/// defaults of `*_key` (config.rs); an administrator who renames them sees them in the
/// capability report.
pub fn info() -> ProviderInfo {
    let keys = [
        "username",
        "password",
        "client_id",
        "client_secret",
        "realm",
    ];
    ProviderInfo {
        name: "fti".into(),
        vendor: "Fujitsu".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        devices: [DeviceType::Gpu, DeviceType::Cxlmemory]
            .into_iter()
            .map(|device_type| DeviceKind {
                device_type,
                models: Vec::new(),
            })
            .collect(),
        capabilities: Capabilities {
            // The identity manager (token) and the FM/CM APIs share the endpoint.
            http: vec!["${endpoint}".into()],
            secret_keys: keys.iter().map(|k| k.to_string()).collect(),
            lookup: vec![
                LookupKind::new("v1", "Node"),
                // The OpenShift/Metal3 chain is followed only with a CM cluster id.
                LookupKind::new(machine::MACHINE_API_VERSION, "Machine").when_config("cluster_id"),
                LookupKind::new(machine::BMH_API_VERSION, "BareMetalHost")
                    .when_config("cluster_id"),
            ],
            // The cached token's expiry is read against the wall clock.
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

impl<H: Host> Provider for Fti<H> {
    fn describe() -> ProviderInfo {
        info()
    }

    fn add_resource(&self, request: &AddRequest) -> Result<AddOutcome, ProviderError> {
        self.add(request)
    }

    fn remove_resource(&self, r: &ComposableResource) -> Result<RemoveOutcome, ProviderError> {
        Fti::remove_resource(self, r)
    }

    fn check_resource(&self, r: &ComposableResource) -> Result<(), ProviderError> {
        Fti::check_resource(self, r)
    }

    /// The fabric's own listing says which machine each device is on; claims are not
    /// needed to list.
    fn get_resources(&self, _claims: &[Claim]) -> Result<Vec<DeviceInfo>, ProviderError> {
        Fti::get_resources(self)
    }

    fn get_pool(&self, query: &PoolQuery) -> Result<PoolOutcome, ProviderError> {
        Fti::get_pool(self, query)
    }
}

#[cfg(all(target_arch = "wasm32", feature = "component"))]
mod component {
    use cro_provider_sdk::guest::{FromHost, WasmHost};

    impl FromHost for crate::Fti<WasmHost> {
        fn from_host(host: WasmHost) -> Self {
            crate::Fti::new(host)
        }
    }

    cro_provider_sdk::export_provider!(crate::Fti<WasmHost>);
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

//! The DMTF Redfish composition provider: attaches a GPU or CXL memory device to a node
//! by composing a free *resource block* into the node's *computer system* through a
//! Redfish CompositionService (docs/redfish-provider.md; the API it speaks is
//! docs/redfish-api.md).
//!
//! The vendor logic is a plain library over the SDK's [`Host`] trait, tested natively;
//! on `wasm32` (feature `component`) the SDK exports it as a `cro:provider@0.3.0`
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
    AddOutcome, AddRequest, Claim, ComposableResource, DeviceInfo, DeviceType, Host, PoolOutcome,
    PoolQuery, ProviderError, ProviderInfo, RemoveOutcome,
};
use cro_provider_sdk::{Capabilities, ConfigKey, DeviceKind, LookupKind, Provider};

use attach::Attach;
use client::Client;
use fabric::Fabric;

/// GPU models of the reference simulator (simulators/redfish) this provider is certified
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

    /// The unused blocks of the query's kinds: one pool, the composition service.
    pub fn pool(&self, query: &PoolQuery) -> Result<PoolOutcome, ProviderError> {
        self.with_fabric(|f| inventory::pool(f, query))
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
            // Asked for so the session and task bookkeeping may read the wall clock
            // (the grant agreed for this provider); today the TTLs of its `state`
            // records and the request timeouts are counted by the host.
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

    fn get_pool(&self, query: &PoolQuery) -> Result<PoolOutcome, ProviderError> {
        self.pool(query)
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

#[cfg(test)]
mod fake;

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;
    use crate::fake::Service;

    fn gpu(name: &str) -> ComposableResource {
        ComposableResource {
            name: name.into(),
            device_type: DeviceType::Gpu,
            model: "A100".into(),
            target_node: "w0".into(),
            device_id: None,
            fabric_device_id: None,
            machine_id: None,
            force_detach: false,
        }
    }

    fn request(name: &str, key: &str, claims: Vec<Claim>) -> AddRequest {
        AddRequest {
            resource: gpu(name),
            attempt_key: key.into(),
            size_bytes: None,
            claims,
        }
    }

    fn service() -> Rc<RefCell<Service>> {
        let svc = Rc::new(RefCell::new(Service::default()));
        {
            let mut s = svc.borrow_mut();
            s.system("s0");
            s.gpu("G1", "H100");
            s.gpu("G2", "A100");
            s.gpu("G3", "A100");
        }
        svc
    }

    fn block_of(o: AddOutcome) -> String {
        match o {
            AddOutcome::Attached(d) => d.fabric_device_id,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn attach_takes_a_free_block_of_the_model_that_no_claim_holds() {
        let svc = service();
        let p = Redfish::new(Service::host(&svc));
        let held = Claim {
            resource: "other".into(),
            device_id: Some("GPU-G2".into()),
            fabric_device_id: None,
        };
        let o = p.add(&request("a", "k", vec![held])).unwrap();
        let AddOutcome::Attached(d) = o else { panic!() };
        assert_eq!(
            (
                d.fabric_device_id.as_str(),
                d.device_id.as_str(),
                d.machine_id.as_deref()
            ),
            ("G3", "GPU-G3", Some("s0"))
        );
        // Nothing is left in state once attached (the session only).
        assert_eq!(p.host().state_keys(), [SESSION_KEY]);
    }

    #[test]
    fn a_lost_reply_is_found_again_by_the_record_or_by_the_scan() {
        let svc = service();
        let host = Service::host(&svc);
        let p = Redfish::new(&host);
        // The service acted but a proxy answered 502: an answer voids the attempt's
        // record, so the retry's scan finds the block composed into the system and held
        // by no claim, and composes nothing more.
        svc.borrow_mut().next_patch = Some((502, true));
        assert!(matches!(
            p.add(&request("a", "k", vec![])),
            Err(ProviderError::Fabric { status: 502, .. })
        ));
        assert_eq!(block_of(p.add(&request("a", "k", vec![])).unwrap()), "G2");
        assert_eq!(svc.borrow().patches, 1);
        // Another resource, holding nothing yet, and G2 claimed by "a": a new block.
        let claim = Claim {
            resource: "a".into(),
            device_id: None,
            fabric_device_id: Some("G2".into()),
        };
        assert_eq!(
            block_of(p.add(&request("b", "k2", vec![claim.clone()])).unwrap()),
            "G3"
        );
        // Nothing left: no capacity.
        let claim3 = Claim {
            resource: "b".into(),
            device_id: None,
            fabric_device_id: Some("G3".into()),
        };
        assert!(matches!(
            p.add(&request("c", "k3", vec![claim, claim3])),
            Err(ProviderError::NoCapacity(_))
        ));
    }

    #[test]
    fn a_block_reserved_by_another_attempt_is_not_taken() {
        let svc = service();
        let host = Service::host(&svc);
        // Attempt k1 chose G2 and its PATCH has not been answered (transport failure).
        host.state_set("redfish/reserved/G2", b"k1", None);
        let p = Redfish::new(&host);
        assert_eq!(block_of(p.add(&request("b", "k2", vec![])).unwrap()), "G3");
    }

    #[test]
    fn describe_declares_what_the_provider_uses() {
        let i = info();
        assert_eq!(
            (i.name.as_str(), i.vendor.as_str()),
            ("redfish", "DMTF Redfish")
        );
        assert_eq!(i.capabilities.http, ["${endpoint}/redfish/v1/*"]);
        assert_eq!(i.capabilities.secret_keys, ["username", "password"]);
        assert_eq!(i.capabilities.lookup, [LookupKind::new("v1", "Node")]);
        assert!(i.config.iter().any(|k| k.name == "endpoint" && k.required));
        assert!(
            i.config
                .iter()
                .any(|k| k.name == "timeout_ms" && !k.required)
        );
        // Every request the provider made in a run goes under the declared pattern and
        // uses only declared Secret keys.
        let svc = service();
        let host = Service::host(&svc);
        Redfish::new(&host).add(&request("a", "k", vec![])).unwrap();
        assert!(
            host.requests()
                .iter()
                .all(|r| r.url.starts_with("http://bmc/redfish/v1/"))
        );
    }
}

//! Contract `cro:provider@0.2.0` (`wit/since_v0.2.0`, world `provider-world`, export
//! `cdi-provider`): its bindgen world, the export calls, and the conversions to and from
//! the host's domain types. Its capability imports are 0.1.0's interfaces, mapped onto
//! the capability modules' bindings (`crate::caps::<name>::wit`), so the host implements
//! them once.

use wasmtime::Store;
use wasmtime::component::{HasSelf, InstancePre, Linker};

use crate::call::CallCtx;
use crate::domain::{self, AddRequest, Claim};

wasmtime::component::bindgen!({
    path: "../../wit/since_v0.2.0",
    world: "provider-world",
    with: {
        "cro:provider/http@0.1.0": crate::caps::http::wit::cro::provider::http,
        "cro:provider/secrets@0.1.0": crate::caps::secrets::wit::cro::provider::secrets,
        "cro:provider/lookup@0.1.0": crate::caps::lookup::wit::cro::provider::lookup,
        "cro:provider/config@0.1.0": crate::caps::config::wit::cro::provider::config,
        "cro:provider/log@0.1.0": crate::caps::log::wit::cro::provider::log,
        "cro:provider/state@0.1.0": crate::caps::state::wit::cro::provider::state,
    },
    exports: { default: async },
});

pub(crate) use self::cro::provider0_2_0::types as wit;

/// The version's own interfaces (its types) in the linker.
pub(crate) fn add_to_linker(linker: &mut Linker<CallCtx>) -> wasmtime::Result<()> {
    wit::add_to_linker::<CallCtx, HasSelf<CallCtx>>(linker, |c| c)
}

impl wit::Host for CallCtx {}

pub(crate) type Pre = ProviderWorldPre<CallCtx>;

pub(crate) fn pre(pre: InstancePre<CallCtx>) -> wasmtime::Result<Pre> {
    ProviderWorldPre::new(pre)
}

pub(crate) type Reply<T> = wasmtime::Result<Result<T, domain::ProviderError>>;

pub(crate) async fn describe(
    w: &ProviderWorld,
    s: &mut Store<CallCtx>,
) -> wasmtime::Result<domain::ProviderInfo> {
    Ok(w.cro_provider0_2_0_cdi_provider()
        .call_describe(s)
        .await?
        .into())
}

pub(crate) async fn add(
    w: &ProviderWorld,
    s: &mut Store<CallCtx>,
    req: &AddRequest,
) -> Reply<domain::AddOutcome> {
    let reply = w
        .cro_provider0_2_0_cdi_provider()
        .call_add_resource(s, &add_request(req))
        .await?;
    Ok(reply.map(Into::into).map_err(Into::into))
}

pub(crate) async fn remove(
    w: &ProviderWorld,
    s: &mut Store<CallCtx>,
    r: &domain::ComposableResource,
) -> Reply<domain::RemoveOutcome> {
    let r = wit::ComposableResource::from(r);
    let reply = w
        .cro_provider0_2_0_cdi_provider()
        .call_remove_resource(s, &r)
        .await?;
    Ok(reply.map(Into::into).map_err(Into::into))
}

pub(crate) async fn check(
    w: &ProviderWorld,
    s: &mut Store<CallCtx>,
    r: &domain::ComposableResource,
) -> Reply<()> {
    let r = wit::ComposableResource::from(r);
    let reply = w
        .cro_provider0_2_0_cdi_provider()
        .call_check_resource(s, &r)
        .await?;
    Ok(reply.map_err(Into::into))
}

pub(crate) async fn list(
    w: &ProviderWorld,
    s: &mut Store<CallCtx>,
    claimed: &[Claim],
) -> Reply<Vec<domain::DeviceInfo>> {
    let reply = w
        .cro_provider0_2_0_cdi_provider()
        .call_get_resources(s, &claims(claimed))
        .await?;
    Ok(reply
        .map(|v| v.into_iter().map(Into::into).collect())
        .map_err(Into::into))
}

/// The request as this version's record (0.3.0 shares it).
pub(super) fn add_request(req: &AddRequest) -> wit::AddRequest {
    wit::AddRequest {
        resource: (&req.resource).into(),
        attempt_key: req.attempt_key.clone(),
        size_bytes: req.size_bytes,
        claims: claims(&req.claims),
    }
}

pub(super) fn claims(claims: &[Claim]) -> Vec<wit::Claim> {
    claims
        .iter()
        .map(|c| wit::Claim {
            resource: c.resource.clone(),
            device_id: c.device_id.clone(),
            fabric_device_id: c.fabric_device_id.clone(),
        })
        .collect()
}

impl From<&domain::ComposableResource> for wit::ComposableResource {
    fn from(r: &domain::ComposableResource) -> wit::ComposableResource {
        wit::ComposableResource {
            name: r.name.clone(),
            device_type: r.device_type.into(),
            model: r.model.clone(),
            target_node: r.target_node.clone(),
            device_id: r.device_id.clone(),
            fabric_device_id: r.fabric_device_id.clone(),
            machine_id: r.machine_id.clone(),
            force_detach: r.force_detach,
        }
    }
}

impl From<domain::DeviceType> for wit::DeviceType {
    fn from(t: domain::DeviceType) -> wit::DeviceType {
        match t {
            domain::DeviceType::Gpu => wit::DeviceType::Gpu,
            domain::DeviceType::CxlMemory => wit::DeviceType::Cxlmemory,
        }
    }
}

impl From<wit::DeviceType> for domain::DeviceType {
    fn from(t: wit::DeviceType) -> domain::DeviceType {
        match t {
            wit::DeviceType::Gpu => domain::DeviceType::Gpu,
            wit::DeviceType::Cxlmemory => domain::DeviceType::CxlMemory,
        }
    }
}

impl From<wit::AddOutcome> for domain::AddOutcome {
    fn from(o: wit::AddOutcome) -> domain::AddOutcome {
        match o {
            wit::AddOutcome::Attached(d) => domain::AddOutcome::Attached(domain::AttachedDevice {
                device_id: d.device_id,
                fabric_device_id: d.fabric_device_id,
                machine_id: d.machine_id,
            }),
            wit::AddOutcome::InProgress(s) => domain::AddOutcome::InProgress(s),
        }
    }
}

impl From<wit::RemoveOutcome> for domain::RemoveOutcome {
    fn from(o: wit::RemoveOutcome) -> domain::RemoveOutcome {
        match o {
            wit::RemoveOutcome::Removed => domain::RemoveOutcome::Removed,
            wit::RemoveOutcome::InProgress(s) => domain::RemoveOutcome::InProgress(s),
        }
    }
}

impl From<wit::DeviceInfo> for domain::DeviceInfo {
    fn from(d: wit::DeviceInfo) -> domain::DeviceInfo {
        domain::DeviceInfo {
            node: d.node,
            machine_id: d.machine_id,
            device_type: d.device_type.into(),
            model: d.model,
            device_id: d.device_id,
            fabric_device_id: d.fabric_device_id,
        }
    }
}

impl From<wit::ProviderInfo> for domain::ProviderInfo {
    fn from(i: wit::ProviderInfo) -> domain::ProviderInfo {
        let caps = i.capabilities;
        domain::ProviderInfo {
            name: i.name,
            vendor: i.vendor,
            version: i.version,
            devices: i
                .devices
                .into_iter()
                .map(|d| domain::DeviceKind {
                    device_type: d.device_type.into(),
                    models: d.models,
                })
                .collect(),
            capabilities: domain::WantedCapabilities {
                http: caps.http,
                secret_keys: caps.secret_keys,
                lookup: caps
                    .lookup
                    .into_iter()
                    .map(|l| domain::LookupKind {
                        api_version: l.api_version,
                        kind: l.kind,
                        when_config: l.when_config,
                    })
                    .collect(),
                clocks: caps.clocks,
            },
            config: i
                .config
                .into_iter()
                .map(|k| domain::ConfigKey {
                    name: k.name,
                    required: k.required,
                    description: k.description,
                })
                .collect(),
        }
    }
}

impl From<wit::ProviderError> for domain::ProviderError {
    fn from(e: wit::ProviderError) -> domain::ProviderError {
        use domain::ProviderError as P;
        match e {
            wit::ProviderError::Fabric(f) => P::Fabric(domain::FabricError {
                status: f.status,
                code: f.code,
                message: f.message,
            }),
            wit::ProviderError::MalformedReply(m) => P::MalformedReply(m),
            wit::ProviderError::NotFound(m) => P::NotFound(m),
            wit::ProviderError::Warning(m) => P::Warning(m),
            wit::ProviderError::Critical(m) => P::Critical(m),
            wit::ProviderError::Denied(m) => P::Denied(m),
            wit::ProviderError::Config(m) => P::Config(m),
            wit::ProviderError::Unavailable(m) => P::Unavailable(m),
            wit::ProviderError::NoCapacity(m) => P::NoCapacity(m),
            wit::ProviderError::Other(m) => P::Other(m),
        }
    }
}

//! Contract `cro:provider@0.1.0` (`wit/since_v0.1.0`, world `provider-world`): its
//! bindgen world, the export calls, and the conversions to and from the host's domain
//! types. The capability imports it defines are the ones every version uses; their
//! bindings live in each capability's module (`crate::caps::<name>::wit`).

use wasmtime::Store;
use wasmtime::component::{HasSelf, InstancePre, Linker};

use crate::call::CallCtx;
use crate::domain::{self, AddRequest, Claim};

wasmtime::component::bindgen!({
    path: "../../wit/since_v0.1.0",
    world: "provider-world",
    // The capability imports are shared by every version (`crate::caps::<name>::wit`).
    with: {
        "cro:provider/http": crate::caps::http::wit::cro::provider::http,
        "cro:provider/secrets": crate::caps::secrets::wit::cro::provider::secrets,
        "cro:provider/lookup": crate::caps::lookup::wit::cro::provider::lookup,
        "cro:provider/config": crate::caps::config::wit::cro::provider::config,
        "cro:provider/log": crate::caps::log::wit::cro::provider::log,
        "cro:provider/state": crate::caps::state::wit::cro::provider::state,
    },
    exports: { default: async },
});

use self::cro::provider::types as wit;

/// The version's own interfaces (its types) in the linker; the capability imports are
/// added once for all versions by `crate::call`.
pub(crate) fn add_to_linker(linker: &mut Linker<CallCtx>) -> wasmtime::Result<()> {
    wit::add_to_linker::<CallCtx, HasSelf<CallCtx>>(linker, |c| c)
}

impl wit::Host for CallCtx {}

pub(crate) type Pre = ProviderWorldPre<CallCtx>;

pub(crate) fn pre(pre: InstancePre<CallCtx>) -> wasmtime::Result<Pre> {
    ProviderWorldPre::new(pre)
}

pub(crate) type Reply<T> = wasmtime::Result<Result<T, domain::ProviderError>>;

/// 0.1.0 has no claims, attempt key or size: an attach sees the resource only.
pub(crate) async fn add(
    w: &ProviderWorld,
    s: &mut Store<CallCtx>,
    req: &AddRequest,
) -> Reply<domain::AddOutcome> {
    let r = wit::ComposableResource::from(&req.resource);
    let reply = w.cro_provider_provider().call_add_resource(s, &r).await?;
    Ok(reply.map(Into::into).map_err(Into::into))
}

pub(crate) async fn remove(
    w: &ProviderWorld,
    s: &mut Store<CallCtx>,
    r: &domain::ComposableResource,
) -> Reply<domain::RemoveOutcome> {
    let r = wit::ComposableResource::from(r);
    let reply = w
        .cro_provider_provider()
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
    let reply = w.cro_provider_provider().call_check_resource(s, &r).await?;
    Ok(reply.map_err(Into::into))
}

pub(crate) async fn list(
    w: &ProviderWorld,
    s: &mut Store<CallCtx>,
    _claims: &[Claim],
) -> Reply<Vec<domain::DeviceInfo>> {
    let reply = w.cro_provider_provider().call_get_resources(s).await?;
    Ok(reply
        .map(|v| v.into_iter().map(Into::into).collect())
        .map_err(Into::into))
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
                machine_id: None,
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

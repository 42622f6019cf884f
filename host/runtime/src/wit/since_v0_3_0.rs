//! Contract `cro:provider@0.3.0` (`wit/since_v0.3.0`, world `provider-world`, export
//! `cdi-provider`): 0.2.0's operations and `get-pool`. Its records are 0.2.0's
//! (`cro:provider/types@0.2.0`, mapped onto [`super::since_v0_2_0`]'s bindings, whose
//! conversions serve both) plus its own `pool` interface, converted here.

use wasmtime::Store;
use wasmtime::component::{HasSelf, InstancePre, Linker};

use super::since_v0_2_0::{claims, wit as v2};
use crate::call::CallCtx;
use crate::domain::{self, AddRequest, Claim};

wasmtime::component::bindgen!({
    path: "../../wit/since_v0.3.0",
    world: "provider-world",
    with: {
        "cro:provider/types@0.2.0": super::since_v0_2_0::cro::provider0_2_0::types,
        "cro:provider/http@0.1.0": crate::caps::http::wit::cro::provider::http,
        "cro:provider/secrets@0.1.0": crate::caps::secrets::wit::cro::provider::secrets,
        "cro:provider/lookup@0.1.0": crate::caps::lookup::wit::cro::provider::lookup,
        "cro:provider/config@0.1.0": crate::caps::config::wit::cro::provider::config,
        "cro:provider/log@0.1.0": crate::caps::log::wit::cro::provider::log,
        "cro:provider/state@0.1.0": crate::caps::state::wit::cro::provider::state,
    },
    exports: { default: async },
});

use self::cro::provider0_3_0::pool as wit;

/// The version's own interface (the pool records) in the linker; 0.2.0's types are
/// linked by its module.
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
    Ok(w.cro_provider0_3_0_cdi_provider()
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
        .cro_provider0_3_0_cdi_provider()
        .call_add_resource(s, &super::since_v0_2_0::add_request(req))
        .await?;
    Ok(reply.map(Into::into).map_err(Into::into))
}

pub(crate) async fn remove(
    w: &ProviderWorld,
    s: &mut Store<CallCtx>,
    r: &domain::ComposableResource,
) -> Reply<domain::RemoveOutcome> {
    let r = v2::ComposableResource::from(r);
    let reply = w
        .cro_provider0_3_0_cdi_provider()
        .call_remove_resource(s, &r)
        .await?;
    Ok(reply.map(Into::into).map_err(Into::into))
}

pub(crate) async fn check(
    w: &ProviderWorld,
    s: &mut Store<CallCtx>,
    r: &domain::ComposableResource,
) -> Reply<()> {
    let r = v2::ComposableResource::from(r);
    let reply = w
        .cro_provider0_3_0_cdi_provider()
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
        .cro_provider0_3_0_cdi_provider()
        .call_get_resources(s, &claims(claimed))
        .await?;
    Ok(reply
        .map(|v| v.into_iter().map(Into::into).collect())
        .map_err(Into::into))
}

pub(crate) async fn pool(
    w: &ProviderWorld,
    s: &mut Store<CallCtx>,
    query: &domain::PoolQuery,
) -> Reply<domain::PoolOutcome> {
    let query = wit::PoolQuery {
        kinds: query.kinds.iter().map(kind_out).collect(),
        nodes: query.nodes.clone(),
    };
    let reply = w
        .cro_provider0_3_0_cdi_provider()
        .call_get_pool(s, &query)
        .await?;
    Ok(reply.map(outcome_in).map_err(Into::into))
}

fn kind_out(k: &domain::PoolKind) -> wit::DeviceKind {
    wit::DeviceKind {
        device_type: k.device_type.into(),
        model: k.model.clone(),
    }
}

fn kind_in(k: wit::DeviceKind) -> domain::PoolKind {
    domain::PoolKind {
        device_type: k.device_type.into(),
        model: k.model,
    }
}

fn outcome_in(o: wit::PoolOutcome) -> domain::PoolOutcome {
    match o {
        wit::PoolOutcome::Pools(pools) => domain::PoolOutcome::Pools(
            pools
                .into_iter()
                .map(|p| domain::FabricPool {
                    id: p.id,
                    nodes: p.nodes,
                    free: p
                        .free
                        .into_iter()
                        .map(|f| domain::FreeDevices {
                            kind: kind_in(f.kind),
                            count: f.count,
                            sizes: f.sizes,
                        })
                        .collect(),
                })
                .collect(),
        ),
        wit::PoolOutcome::NotSupported(why) => domain::PoolOutcome::NotSupported(why),
    }
}

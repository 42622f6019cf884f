//! The free pool published to the scheduler (docs/dra.md): every `pool_period`, each
//! provider is asked for its fabric's free devices of the configured kinds
//! (`--pool-devices`) over the nodes it serves, and its ResourceSlices of driver
//! `cro.hpsys.ibm.ie.com` are brought to what `decide::slices` makes of the answer and
//! of the devices claims hold. A provider that cannot tell (`not-supported`, a contract
//! before 0.3.0) or whose read failed publishes nothing: a slice never offers a device
//! cro could not confirm free in the last read. The outcome goes to the provider's
//! `CdiProvider` status (`status.pool`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};

use cro_api::{
    CONDITION_FABRIC_DEVICE_READY, CdiProvider, DRA_DRIVER, LABEL_MANAGED_BY, LABEL_POOL_PROVIDER,
    PoolStatus,
};
use cro_runtime::{PoolOutcome, PoolQuery};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::decide::slices::{self, DesiredSlice, Held};
use crate::error::ReconcileError;
use crate::plumbing::context::Context;
use crate::plumbing::reconcile;
use crate::registry::Registry;

/// The `app.kubernetes.io/managed-by` value of cro's slices.
const MANAGED_BY: &str = "cro";

/// Publishes every `pool_period` until `shutdown`. Without configured kinds it does
/// nothing at all: the operator then has no right to ResourceSlices (the chart grants
/// them with `pool.devices` only), and slices an earlier configuration left are the
/// administrator's to delete (docs/dra.md).
pub(crate) async fn run(
    ctx: &Context,
    registry: &Registry,
    shutdown: impl std::future::Future<Output = ()>,
) {
    if ctx.config.pool_devices.is_empty() {
        return;
    }
    let period = ctx.config.timings.pool_period;
    // What each provider's status last said (the status is written when it changes).
    let recorded = Mutex::new(BTreeMap::new());
    reconcile::every(ctx, "pool", period, shutdown, || async {
        publish(ctx, registry, &recorded)
            .await
            .map_err(ReconcileError::from)
    })
    .await;
}

/// Each provider's last recorded pool status, without its time.
type Recorded = Mutex<BTreeMap<String, PoolStatus>>;

/// One round: every provider's pool read, its slices written, its status recorded.
async fn publish(
    ctx: &Context,
    registry: &Registry,
    recorded: &Recorded,
) -> Result<(), kube::Error> {
    // Until every CdiProvider is read, a provider not read yet would look gone and its
    // published slices would be withdrawn, to come back a round later.
    if !registry.knows_all() {
        return Ok(());
    }
    let slices_api: Api<ResourceSlice> = Api::all(ctx.client.clone());
    let existing = slices_api
        .list(&ListParams::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}")))
        .await?
        .items;
    let mut providers_seen = BTreeSet::new();
    let held = held_devices(ctx).await?;
    let query = PoolQuery {
        kinds: ctx.config.pool_devices.clone(),
        nodes: node_names(ctx),
    };
    for (slot, outcome) in registry.pools(&query).await {
        let provider = slot.name();
        let (desired, status) = match outcome {
            Ok(PoolOutcome::Pools(pools)) => {
                let desired = slices::desired(&provider, &pools, &held);
                let devices = desired
                    .iter()
                    .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len) as i64)
                    .sum();
                let published = desired
                    .iter()
                    .map(|s| s.spec.pool.name.as_str())
                    .collect::<BTreeSet<_>>()
                    .len() as i64;
                (desired, status(devices, published, None))
            }
            Ok(PoolOutcome::NotSupported(why)) => (
                Vec::new(),
                status(0, 0, Some(format!("not supported: {why}"))),
            ),
            Err(e) => {
                tracing::warn!(provider = %provider, error = %e, "reading the free pool failed; its slices are withdrawn");
                (
                    Vec::new(),
                    status(0, 0, Some(format!("the pool read failed: {e}"))),
                )
            }
        };
        let mine: Vec<&ResourceSlice> = existing
            .iter()
            .filter(|s| s.labels().get(LABEL_POOL_PROVIDER) == Some(&provider))
            .collect();
        apply(&slices_api, &provider, desired, &mine).await?;
        let changed = recorded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&provider)
            != Some(&status);
        // Remembered only once written: a failed write is tried again next round.
        if changed && record(ctx, &provider, status.clone()).await {
            recorded
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(provider.clone(), status);
        }
        providers_seen.insert(provider);
    }
    // Slices of a provider that is gone (not one another replica holds: each replica
    // publishes the pools of the providers whose Leases it holds).
    for s in existing.iter().filter(|s| {
        s.labels()
            .get(LABEL_POOL_PROVIDER)
            .is_none_or(|p| !providers_seen.contains(p) && registry.slot(p).is_none())
    }) {
        delete(&slices_api, &s.name_any()).await?;
    }
    Ok(())
}

fn status(devices: i64, pools: i64, message: Option<String>) -> PoolStatus {
    PoolStatus {
        devices,
        pools,
        message,
        last_changed: None,
    }
}

/// The nodes the cluster has now (the watch cache).
fn node_names(ctx: &Context) -> Vec<String> {
    ctx.caches
        .nodes()
        .unwrap_or_default()
        .iter()
        .map(|n| n.name_any())
        .collect()
}

/// Devices of cro's pools that claims' allocations name, by pool, each marked pending
/// until its `FabricDeviceReady` condition is True.
async fn held_devices(ctx: &Context) -> Result<BTreeMap<String, Vec<Held>>, kube::Error> {
    let claims: Api<ResourceClaim> = Api::all(ctx.client.clone());
    let mut held: BTreeMap<String, Vec<Held>> = BTreeMap::new();
    for claim in claims.list(&ListParams::default()).await?.items {
        let Some(status) = &claim.status else {
            continue;
        };
        let results = status
            .allocation
            .as_ref()
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.clone())
            .unwrap_or_default();
        for r in results.iter().filter(|r| r.driver == DRA_DRIVER) {
            let ready = status.devices.iter().flatten().any(|d| {
                d.driver == r.driver
                    && d.pool == r.pool
                    && d.device == r.device
                    && d.conditions
                        .iter()
                        .flatten()
                        .any(|c| c.type_ == CONDITION_FABRIC_DEVICE_READY && c.status == "True")
            });
            held.entry(r.pool.clone()).or_default().push(Held {
                device: r.device.clone(),
                pending: !ready,
            });
        }
    }
    Ok(held)
}

/// Brings `provider`'s slices (`existing`) to `desired`. A pool whose slices change
/// gets a new generation on all of them (the scheduler reads only a pool's newest
/// generation); an unchanged pool is not written.
async fn apply(
    api: &Api<ResourceSlice>,
    provider: &str,
    desired: Vec<DesiredSlice>,
    existing: &[&ResourceSlice],
) -> Result<(), kube::Error> {
    let by_name: BTreeMap<String, &ResourceSlice> =
        existing.iter().map(|s| (s.name_any(), *s)).collect();
    let wanted: BTreeSet<String> = desired.iter().map(|d| d.name.clone()).collect();
    let mut pools: BTreeMap<String, Vec<DesiredSlice>> = BTreeMap::new();
    for d in desired {
        pools.entry(d.spec.pool.name.clone()).or_default().push(d);
    }
    for (pool, slices) in pools {
        let current: Vec<&ResourceSlice> = existing
            .iter()
            .filter(|s| s.spec.pool.name == pool)
            .copied()
            .collect();
        let generation = current
            .iter()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(0);
        let unchanged = current.len() == slices.len()
            && slices.iter().all(|d| {
                by_name
                    .get(&d.name)
                    .is_some_and(|s| same(&s.spec, &d.spec, generation))
            });
        if unchanged {
            continue;
        }
        for mut d in slices {
            d.spec.pool.generation = generation + 1;
            let stored = by_name.get(&d.name).copied();
            write(api, provider, d, stored).await?;
        }
    }
    for name in by_name.keys().filter(|n| !wanted.contains(*n)) {
        delete(api, name).await?;
    }
    Ok(())
}

/// Whether a slice as stored says what `desired` says (at the pool's generation).
fn same(stored: &ResourceSliceSpec, desired: &ResourceSliceSpec, generation: i64) -> bool {
    let mut want = desired.clone();
    want.pool.generation = generation;
    let normalize = |s: &ResourceSliceSpec| {
        let mut v = serde_json::to_value(s).unwrap_or_default();
        strip_empty(&mut v);
        v
    };
    normalize(stored) == normalize(&want)
}

/// Drops nulls, empty lists and `false` flags the API server may or may not echo.
fn strip_empty(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            map.retain(|_, x| {
                !(x.is_null()
                    || x.as_array().is_some_and(Vec::is_empty)
                    || x.as_object().is_some_and(serde_json::Map::is_empty)
                    || *x == serde_json::Value::Bool(false))
            });
            map.values_mut().for_each(strip_empty);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_empty),
        _ => {}
    }
}

async fn write(
    api: &Api<ResourceSlice>,
    provider: &str,
    d: DesiredSlice,
    stored: Option<&ResourceSlice>,
) -> Result<(), kube::Error> {
    let mut slice = ResourceSlice {
        metadata: ObjectMeta {
            name: Some(d.name.clone()),
            labels: Some(BTreeMap::from([
                (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
                (LABEL_POOL_PROVIDER.to_owned(), provider.to_owned()),
            ])),
            ..ObjectMeta::default()
        },
        spec: d.spec,
    };
    match stored {
        Some(s) => {
            slice.metadata.resource_version = s.resource_version();
            api.replace(&d.name, &PostParams::default(), &slice).await?;
        }
        None => {
            api.create(&PostParams::default(), &slice).await?;
        }
    }
    Ok(())
}

async fn delete(api: &Api<ResourceSlice>, name: &str) -> Result<(), kube::Error> {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// The provider's `CdiProvider` status, when it has one (the implicit provider does
/// not: its outcome is logged). False when the write failed.
async fn record(ctx: &Context, provider: &str, status: PoolStatus) -> bool {
    if let Some(message) = &status.message {
        tracing::debug!(provider, message = %message, "free pool not published");
    }
    let api: Api<CdiProvider> = Api::all(ctx.client.clone());
    let status = PoolStatus {
        last_changed: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        ..status
    };
    let patch = json!({"status": {"pool": status}});
    match api
        .patch_status(provider, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => true,
        Err(kube::Error::Api(e)) if e.code == 404 => true,
        Err(e) => {
            tracing::warn!(provider, error = %e, "cannot record the pool in the CdiProvider status");
            false
        }
    }
}

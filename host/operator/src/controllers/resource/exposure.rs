//! Whether the cluster sees a GPU, and making the node look again, in both
//! device-exposure modes (docs/node-operations.md, "Making the cluster see a GPU").

use crate::error::ReconcileError;
use crate::nodeops::dra::DraApis;
use crate::nodeops::{Driver, ExposureMode, NodeOpsError, plugins};
use crate::plumbing::context::Context;

fn dra(ctx: &Context) -> Result<&DraApis, ReconcileError> {
    ctx.dra.as_ref().ok_or_else(|| {
        ReconcileError::NodeOps(NodeOpsError::ApiUnavailable {
            what: "resource.k8s.io (DRA mode)",
            why: "the operator runs in DRA mode without DRA APIs".into(),
        })
    })
}

/// Device-plugin mode: nvidia-smi on the node lists the UUID. DRA: a ResourceSlice
/// device has it as its `uuid` attribute.
pub(crate) async fn visible(
    ctx: &Context,
    driver: &Driver,
    uuid: &str,
) -> Result<bool, ReconcileError> {
    match ctx.config.mode {
        ExposureMode::DevicePlugin => Ok(ctx.gpu.is_listed(driver, uuid).await?),
        ExposureMode::Dra => Ok(dra(ctx)?.find_device(&ctx.client, uuid).await?.is_some()),
    }
}

/// Makes the node's plugins notice a GPU that came or went. Device-plugin mode restarts
/// the daemonsets (which skip restarts less than 10 s apart themselves); DRA runs
/// nvidia-smi once after an attach and deletes the kubelet plugin pod, at most once
/// per rescan interval per resource.
pub(crate) async fn rescan(
    ctx: &Context,
    driver: &Driver,
    resource: &str,
    after_attach: bool,
) -> Result<(), ReconcileError> {
    match ctx.config.mode {
        ExposureMode::DevicePlugin => {
            let restarted = restart_device_plugins(ctx).await?;
            if !restarted.is_empty() {
                tracing::info!(resource, ?restarted, "restarted device plugin daemonsets");
            }
        }
        ExposureMode::Dra => {
            if !ctx.rescan_due(resource) {
                return Ok(());
            }
            if after_attach {
                ctx.gpu.initialise(driver).await?;
            }
            let deleted = plugins::restart_dra_plugin(&ctx.client, &driver.pod.node).await?;
            tracing::info!(resource, node = %driver.pod.node, deleted, "restarted the DRA kubelet plugin");
        }
    }
    Ok(())
}

/// Restarts the device plugin DaemonSets where allowed, reading them from the watch cache
/// (from the API server until it has listed).
async fn restart_device_plugins(ctx: &Context) -> Result<Vec<String>, ReconcileError> {
    Ok(plugins::restart_device_plugins(
        &ctx.client,
        &ctx.config.gpu_operator_namespace,
        |name| ctx.caches.daemon_set(name),
        &ctx.plugin_restarts,
    )
    .await?)
}

/// Makes the plugins notice a GPU that went, without running anything on the node
/// (a force_detach): device-plugin mode restarts the daemonsets; DRA deletes the
/// node's kubelet plugin pod (at most once per rescan interval per resource).
pub(crate) async fn rescan_after_detach(
    ctx: &Context,
    node: &str,
    resource: &str,
) -> Result<(), ReconcileError> {
    match ctx.config.mode {
        ExposureMode::DevicePlugin => {
            restart_device_plugins(ctx).await?;
        }
        ExposureMode::Dra => {
            if ctx.rescan_due(resource) {
                plugins::restart_dra_plugin(&ctx.client, node).await?;
            }
        }
    }
    Ok(())
}

/// DRA: a ResourceSlice still publishes the GPU. Device-plugin mode has no API-side
/// view of one GPU (only nvidia-smi on the node), so it answers false.
pub(crate) async fn still_published(ctx: &Context, uuid: &str) -> Result<bool, ReconcileError> {
    match ctx.config.mode {
        ExposureMode::DevicePlugin => Ok(false),
        ExposureMode::Dra => Ok(dra(ctx)?.find_device(&ctx.client, uuid).await?.is_some()),
    }
}

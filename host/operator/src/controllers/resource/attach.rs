//! Attaching: driver present, device from the fabric, ids stored, node sees it, Online.

use cro_api::{ComposableResource, ResourceState, ResourceType};
use cro_runtime::domain::AddOutcome;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::{Outcome, adopt, exposure};
use crate::error::ReconcileError;
use crate::nodeops::driver::CachedPods;
use crate::nodeops::{Discovery, ExposureMode, driver};
use crate::plumbing::conditions;
use crate::plumbing::context::Context;
use crate::plumbing::patch::{self, ResourceStatusPatch};
use crate::plumbing::reconcile::Step;
use crate::provider::Operation;
use crate::provider::node_machine::{ANNOTATION_NODE_MACHINE, NodeMachine};

pub(super) async fn attaching(res: ComposableResource, ctx: &Context) -> Outcome {
    let driver = gpu_driver(&res, ctx).await?;
    let mut res = res;
    if res.device_id().is_none()
        && let Some(step) = fabric_attach(ctx, &mut res).await?
    {
        return Ok((step, Some(res)));
    }
    if let Some(discovery) = driver
        && let Some(wait) = node_exposure(ctx, discovery, &res).await?
    {
        let res = report_wait(ctx, res, &wait).await?;
        return Ok((Step::requeue(ctx.config.timings.poll_interval), Some(res)));
    }
    online(ctx, res).await
}

/// The `Attaching` state with the Ready condition it implies.
pub(super) fn attaching_patch(res: &ComposableResource) -> ResourceStatusPatch {
    conditions::with_ready_after(
        res,
        ResourceStatusPatch::state(ResourceState::Attaching),
        Timestamp::now(),
    )
}

/// Writes `Attaching` on a resource whose state is still empty (asked from birth,
/// `super::start`), before its ids are known.
async fn state_attaching(
    api: &Api<ComposableResource>,
    res: &mut ComposableResource,
) -> Result<(), ReconcileError> {
    if res.state() == ResourceState::Empty {
        *res = patch::status(api, res, &attaching_patch(res), true).await?;
    }
    Ok(())
}

/// What an attach waits for on the node, as the Ready condition says it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Wait {
    /// [`conditions::WAITING_FOR_DRIVER`] or [`conditions::WAITING_FOR_DEVICE`].
    reason: &'static str,
    message: String,
}

/// Writes the wait into the Ready condition (not `status.error`: nothing failed), unless
/// it says so already or has lasted less than `timings.mirror_delay`: most waits (a
/// driver pod turning Ready, the device plugin listing the GPU) end sooner, and each
/// write is a watch event (a node's first GPU wrote two). Until then the condition says
/// `Attaching`. Logged when it changes.
async fn report_wait(
    ctx: &Context,
    res: ComposableResource,
    wait: &Wait,
) -> Result<ComposableResource, ReconcileError> {
    let Some(update) = conditions::wait_patch(&res, wait.reason, &wait.message, Timestamp::now())
    else {
        tracing::debug!(reason = wait.reason, "{}", wait.message);
        return Ok(res);
    };
    let delay = ctx.config.timings.mirror_delay;
    if ctx.progress_wait(&wait_key(&res), delay).is_some() {
        tracing::debug!(reason = wait.reason, "{}", wait.message);
        return Ok(res);
    }
    tracing::info!(reason = wait.reason, "{}", wait.message);
    let api: Api<ComposableResource> = Api::all(ctx.client.clone());
    patch::status(&api, &res, &update, false).await
}

/// The key of `res`'s unwritten wait in `Context::progress_wait`.
fn wait_key(res: &ComposableResource) -> String {
    format!("wait/{}", res.name_any())
}

/// The node's GPU driver, for a GPU (`None` for anything else). A GPU without a driver
/// on the node would be attached for nothing. A driver the GPU operator manages counts
/// although its pod is missing or not Ready: it schedules that pod only once the node has
/// a GPU, so the node's first GPU must come first.
async fn gpu_driver(
    res: &ComposableResource,
    ctx: &Context,
) -> Result<Option<Discovery>, ReconcileError> {
    if res.spec.resource_type != ResourceType::Gpu {
        return Ok(None);
    }
    let node = &res.spec.target_node;
    let discovery = driver::discover(
        &ctx.client,
        ctx.runner.as_ref(),
        node,
        &ctx.config.namespace,
        CachedPods::current(ctx.caches.driver_pods_current(node).await),
        &ctx.cluster_policy,
    )
    .await?;
    Ok(Some(discovery))
}

/// Asks the fabric for the device (or adopts the one an earlier attach got) and stores its
/// ids; `Some(step)` while the fabric is still attaching.
async fn fabric_attach(
    ctx: &Context,
    res: &mut ComposableResource,
) -> Result<Option<Step>, ReconcileError> {
    let api: Api<ComposableResource> = Api::all(ctx.client.clone());
    let node = res.spec.target_node.clone();
    // Stored before the fabric is asked, in the same write as the attempt record: a
    // device attached to a node whose Node is deleted later can still be released
    // (crate::provider::node_machine).
    let machine = machine_note(ctx, res).await?;
    let machine = machine.as_deref().map(|m| (ANNOTATION_NODE_MACHINE, m));
    // Held until the ids are stored: a detach on this node meanwhile must see them.
    let guard = ctx.provider.lock_node(&node).await;
    // Adopts the device of an earlier attach whose reply was lost, or asks the fabric.
    let device = match adopt::add(ctx, &guard, res, machine).await? {
        Ok(AddOutcome::InProgress(what)) => {
            tracing::info!(node = %node, what = %what, "attach in progress");
            // A slow fabric: say `Attaching` now rather than with the ids.
            state_attaching(&api, res).await?;
            return Ok(Some(Step::requeue(ctx.config.timings.poll_interval)));
        }
        Ok(AddOutcome::Attached(device)) => device,
        Err(e) => {
            // The error is written on an `Attaching` resource, as before the ask.
            state_attaching(&api, res).await?;
            return Err(ReconcileError::provider(Operation::Add, e));
        }
    };
    // Stored before anything else can fail, and unconditionally: losing these ids would
    // leak the device (until the upstream sync releases it).
    let mut ids =
        ResourceStatusPatch::ids(&device.device_id, &device.fabric_device_id).with_error("");
    if res.state() == ResourceState::Empty {
        // Asked straight from birth (`start`): the state comes with the ids.
        ids = conditions::with_ready_after(
            res,
            ids.with_state(ResourceState::Attaching),
            Timestamp::now(),
        );
    }
    *res = store_ids(&api, res, ids).await?;
    ctx.caches.note_ids_written(res);
    let fabric = device
        .machine_id
        .as_deref()
        .and_then(|m| fabric_machine_note(res, m));
    let fabric = fabric.as_deref().map(|m| (ANNOTATION_NODE_MACHINE, m));
    // Notes the fabric's machine, unless the record made with the resource said it (the
    // attempt record stays, unread once the ids are stored: adopt::settled).
    adopt::settled(&api, res, fabric).await;
    tracing::info!(node = %node, device = ?device.device_id,
        fabric_device = ?device.fabric_device_id, "attached by the fabric");
    // A request's devices are named by its `Running` Event, one Event for all of them.
    if res.managed_by().is_some() {
        return Ok(None);
    }
    ctx.event(
        &res.object_ref(&()),
        EventType::Normal,
        "Attached",
        "Attach",
        format!(
            "the fabric attached device {} ({}) to node {node}",
            device.device_id, device.fabric_device_id
        ),
    )
    .await;
    Ok(None)
}

/// Waits for the node's driver and for the GPU to be exposed the way the mode asks;
/// `Some(wait)` while it is not yet (rechecked every poll interval, and at once when the
/// node's driver pod turns Ready).
async fn node_exposure(
    ctx: &Context,
    discovery: Discovery,
    res: &ComposableResource,
) -> Result<Option<Wait>, ReconcileError> {
    let name = res.name_any();
    let node = &res.spec.target_node;
    let driver = match discovery {
        Discovery::Ready(driver) => driver,
        Discovery::ContainerPending { pod } => return Ok(Some(driver_wait(node, pod.as_deref()))),
    };
    let uuid = res.device_id().unwrap_or_default().to_owned();
    let seen = exposure::visible(ctx, &driver, &uuid).await?;
    match (ctx.config.mode, seen) {
        // The device plugin only reports GPUs the driver already lists.
        (ExposureMode::DevicePlugin, true) => {
            exposure::rescan(ctx, &driver, &name, true).await?;
        }
        (ExposureMode::Dra, true) => {}
        (mode, false) => {
            if mode == ExposureMode::Dra {
                exposure::rescan(ctx, &driver, &name, true).await?;
            }
            return Ok(Some(device_wait(
                mode,
                node,
                &uuid,
                &driver.pod.to_string(),
            )));
        }
    }
    Ok(None)
}

/// The wait for the GPU operator's driver pod on `node` (`pod`: its name, if it is
/// scheduled).
fn driver_wait(node: &str, pod: Option<&str>) -> Wait {
    Wait {
        reason: conditions::WAITING_FOR_DRIVER,
        message: match pod {
            Some(pod) => {
                format!("waiting for the NVIDIA driver pod on node {node} (pod {pod} not Ready)")
            }
            None => format!(
                "waiting for the NVIDIA driver pod on node {node} (not scheduled yet: the GPU operator schedules it once the node has a GPU)"
            ),
        },
    }
}

/// The wait for GPU `uuid` to show up where `mode` looks for it (`pod`: the driver pod
/// nvidia-smi runs in).
fn device_wait(mode: ExposureMode, node: &str, uuid: &str, pod: &str) -> Wait {
    Wait {
        reason: conditions::WAITING_FOR_DEVICE,
        message: match mode {
            ExposureMode::DevicePlugin => format!(
                "waiting for GPU {uuid} to show up on node {node} (nvidia-smi in pod {pod} does not list it yet)"
            ),
            ExposureMode::Dra => format!(
                "waiting for GPU {uuid} in node {node}'s ResourceSlice (the DRA kubelet plugin has not published it yet)"
            ),
        },
    }
}

/// Marks the resource Online; its health is checked from now on.
async fn online(ctx: &Context, res: ComposableResource) -> Outcome {
    let api: Api<ComposableResource> = Api::all(ctx.client.clone());
    let name = res.name_any();
    let node = res.spec.target_node.clone();
    let online = conditions::with_ready_after(
        &res,
        ResourceStatusPatch::state(ResourceState::Online),
        Timestamp::now(),
    );
    let res = patch::status(&api, &res, &online, true).await?;
    ctx.forget_rescan(&name);
    ctx.progress_written(&wait_key(&res));
    // No Event: one per device per phase. `Attached` named the device and its ids, and
    // the request's `Running` says when all its devices are online; the state and the
    // Ready condition say it of this one (docs/BENCHMARKS.md, the write budget).
    tracing::info!(node = %node, device = ?res.device_id().unwrap_or("?"), "online");
    Ok((Step::requeue(ctx.config.timings.health_period), Some(res)))
}

/// Writes the ids of a device the fabric just attached, retrying a few times over a few
/// seconds: a passing API hiccup must not cost a device.
async fn store_ids(
    api: &Api<ComposableResource>,
    res: &ComposableResource,
    ids: ResourceStatusPatch,
) -> Result<ComposableResource, ReconcileError> {
    let mut delay = std::time::Duration::from_millis(100);
    let mut attempt = 1;
    loop {
        match patch::status(api, res, &ids, false).await {
            Ok(r) => return Ok(r),
            Err(e) if attempt < 6 => {
                tracing::warn!(attempt, error = %e,
                    "cannot store the device ids yet; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// What names the node's machine, for the resource's record, unless the record already
/// has it: written before the first attach (with the attempt record, adopt::add). A
/// Node that names no machine records nothing: the provider could not attach there
/// either, and will say why.
async fn machine_note(
    ctx: &Context,
    res: &ComposableResource,
) -> Result<Option<String>, ReconcileError> {
    if res.annotations().contains_key(ANNOTATION_NODE_MACHINE) {
        return Ok(None);
    }
    // What names a node's machine is set when the node joins, so the cached Node will
    // do, naming a machine or not; one the cache does not show (yet) is read. Reading a
    // Node that names none again at every attach was a GET per device (docs/BENCHMARKS.md):
    // a label set within the watch's latency before an attach is missed here, and the
    // record learns the machine from the provider's reply instead (fabric_machine_note).
    let machine = match ctx.caches.node(&res.spec.target_node) {
        Some(node) => NodeMachine::of_node(&node),
        None => {
            let nodes: Api<Node> = Api::all(ctx.client.clone());
            nodes
                .get_opt(&res.spec.target_node)
                .await?
                .as_ref()
                .and_then(NodeMachine::of_node)
        }
    };
    Ok(machine.map(|m| m.to_annotation()))
}

/// The resource's machine record with the fabric machine the provider reported added, so
/// later calls (a detach after the Node is gone above all) name it directly; `None` when
/// the record already says so (or the provider named none).
fn fabric_machine_note(res: &ComposableResource, machine: &str) -> Option<String> {
    let mut record = NodeMachine::of_resource(res).unwrap_or_default();
    if machine.is_empty() || record.fabric_machine.as_deref() == Some(machine) {
        return None;
    }
    record.fabric_machine = Some(machine.to_owned());
    Some(record.to_annotation())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_name_the_node_the_pod_and_the_gpu() {
        let w = driver_wait("n1", Some("nvidia-driver-daemonset-x7k2p"));
        assert_eq!(w.reason, "WaitingForDriver");
        assert_eq!(
            w.message,
            "waiting for the NVIDIA driver pod on node n1 (pod nvidia-driver-daemonset-x7k2p not Ready)"
        );
        assert!(
            driver_wait("n1", None)
                .message
                .contains("not scheduled yet"),
            "{w:?}"
        );
        let w = device_wait(
            ExposureMode::DevicePlugin,
            "n1",
            "GPU-1",
            "gpu-operator/nvidia-driver-x",
        );
        assert_eq!(w.reason, "WaitingForDevice");
        assert!(
            w.message.contains("GPU GPU-1")
                && w.message.contains("node n1")
                && w.message
                    .contains("nvidia-smi in pod gpu-operator/nvidia-driver-x"),
            "{w:?}"
        );
        let w = device_wait(ExposureMode::Dra, "n1", "GPU-1", "p");
        assert!(w.message.contains("node n1's ResourceSlice"), "{w:?}");
    }
}

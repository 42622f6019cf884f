//! Upstream sync (docs/behaviour.md §5; docs/differences-from-go.md, "Upstream sync";
//! docs/fti-fabric-api.md says what a listing holds): GPUs the fabric has attached to the
//! cluster's machines that no ComposableResource holds are tracked, and after a grace
//! period released through a ready-to-detach ComposableResource. CXL memory is left
//! alone unless `release_orphan_cxl_memory` is set: the Go operator released only GPUs,
//! and memory attached outside the operator may be in use by the host without any
//! workload the operator could see.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use cro_api::{ComposableResource, ComposableResourceSpec, FINALIZER, ReadyToDetach, ResourceType};
use cro_runtime::domain::{DeviceInfo, DeviceType};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};

use crate::error::ReconcileError;
use crate::plumbing::context::Context;
use crate::plumbing::reconcile;
use crate::provider::Operation;
use crate::provider::node_machine::{self, ANNOTATION_NODE_MACHINE};

/// Unclaimed devices by device id, with when they were first seen unclaimed.
#[derive(Debug, Default)]
pub(crate) struct OrphanTracker {
    seen: BTreeMap<String, (DeviceInfo, Instant)>,
}

impl OrphanTracker {
    /// Updates the tracking with what the fabric reports now and which ids resources
    /// hold; returns the devices unclaimed for at least `grace`, and stops tracking them
    /// (the caller creates their resources, which claim them).
    pub(crate) fn observe(
        &mut self,
        reported: Vec<DeviceInfo>,
        claimed: &BTreeSet<String>,
        now: Instant,
        grace: Duration,
    ) -> Vec<DeviceInfo> {
        let reported: BTreeMap<String, DeviceInfo> = reported
            .into_iter()
            .filter(|d| !d.device_id.is_empty())
            .map(|d| (d.device_id.clone(), d))
            .collect();
        self.seen
            .retain(|id, _| reported.contains_key(id) && !claimed.contains(id));
        let mut due = Vec::new();
        for (id, device) in reported {
            if claimed.contains(&id) {
                continue;
            }
            let first = self
                .seen
                .entry(id.clone())
                .or_insert_with(|| (device.clone(), now))
                .1;
            if now.saturating_duration_since(first) >= grace {
                self.seen.remove(&id);
                due.push(device);
            }
        }
        due
    }

    pub(crate) fn tracked(&self) -> usize {
        self.seen.len()
    }

    /// Tracks `device` again from `now` after it was due but could not be released:
    /// it stays counted as an orphan and is tried again after another grace period.
    pub(crate) fn keep(&mut self, device: DeviceInfo, now: Instant) {
        self.seen.insert(device.device_id.clone(), (device, now));
    }
}

/// Device ids held by any ComposableResource: its status ids and its ready-to-detach
/// label (a resource created for an orphan holds the device before it has a status).
pub(crate) fn claimed_ids(resources: &[ComposableResource]) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for r in resources {
        if let Some(id) = r.device_id() {
            ids.insert(id.to_owned());
        }
        if let Some(orphan) = r.ready_to_detach() {
            ids.insert(orphan.device_id);
        }
    }
    ids
}

fn resource_type(t: DeviceType) -> ResourceType {
    match t {
        DeviceType::Gpu => ResourceType::Gpu,
        DeviceType::CxlMemory => ResourceType::CxlMemory,
    }
}

/// Whether the sync may release `device` when nobody holds it.
pub(crate) fn releasable(device: &DeviceInfo, release_cxl_memory: bool) -> bool {
    match device.device_type {
        DeviceType::Gpu => true,
        DeviceType::CxlMemory => release_cxl_memory,
    }
}

/// The ComposableResource that detaches an orphaned device. No force_detach: work
/// someone started on a device nobody requested is still not killed.
pub(crate) fn orphan_resource(device: &DeviceInfo) -> ComposableResource {
    let mut r = ComposableResource::for_orphan_device(
        ComposableResourceSpec {
            resource_type: resource_type(device.device_type),
            model: device.model.clone(),
            target_node: device.node.clone(),
            force_detach: false,
        },
        &ReadyToDetach {
            device_id: device.device_id.clone(),
            cdi_device_id: device.fabric_device_id.clone(),
        },
    );
    r.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
    r
}

/// One round: ask the fabric, compare, release what is due.
pub(crate) async fn sync_once(
    ctx: &Context,
    tracker: &mut OrphanTracker,
) -> Result<usize, ReconcileError> {
    // Until every CdiProvider is read nothing is listed (crate::registry): no round,
    // rather than a failed one.
    if !ctx.registry.knows_all() {
        return Ok(0);
    }
    let api: Api<ComposableResource> = Api::all(ctx.client.clone());
    // The claims tell a 0.2.0 provider which devices the cluster holds (the watch cache
    // is enough for that). The resources are listed after the fabric answered, so a device attached meanwhile is
    // compared with a list that already holds it, never taken for an orphan.
    let before = match ctx.caches.resources() {
        Some(cached) => cached.iter().map(|r| r.as_ref().clone()).collect(),
        None => api.list(&ListParams::default()).await?.items,
    };
    let mut reported = ctx
        .provider
        .list(&crate::provider::claims(&before))
        .await
        .map_err(|e| ReconcileError::provider(Operation::List, e))?;
    reported.retain(|d| releasable(d, ctx.config.release_orphan_cxl_memory));
    let resources = api.list(&ListParams::default()).await?.items;
    let due = tracker.observe(
        reported,
        &claimed_ids(&resources),
        Instant::now(),
        ctx.config.timings.orphan_grace,
    );
    let awaiting = crate::controllers::resource::awaiting_adoption(&resources);
    // Machines of deleted Nodes reach the listing through the machines resources
    // recorded (crate::provider::node_machine); a release resource for a device there needs the
    // record too, or its detach could not find the machine.
    let machines = node_machine::remembered(&resources);
    let mut released = 0;
    for device in due {
        let key = (
            device.node.clone(),
            device.device_type,
            device.model.clone(),
        );
        if awaiting.contains(&key) {
            // An attach whose reply was lost may adopt it (resource/adopt.rs).
            tracing::info!(device = ?device.device_id, node = ?device.node,
                "unclaimed device left for an attach that may adopt it");
            continue;
        }
        if device.node.is_empty() {
            tracing::warn!(device = ?device.device_id, machine = ?device.machine_id,
                "orphaned device on a machine without a node: cannot release it");
            tracker.keep(device, Instant::now());
            continue;
        }
        let mut obj = orphan_resource(&device);
        // The provider that listed it: a deleted Node's machine is listed by the
        // provider its resources name (crate::registry::Registry::route_held).
        if let Ok(p) = ctx.registry.route_held(&device.node) {
            obj.labels_mut()
                .insert(cro_api::LABEL_PROVIDER.to_owned(), p);
        }
        if let Some(m) = machines.get(&device.node) {
            obj.annotations_mut()
                .insert(ANNOTATION_NODE_MACHINE.to_owned(), m.to_annotation());
        }
        if let Err(e) = api.create(&PostParams::default(), &obj).await {
            tracker.keep(device, Instant::now());
            ctx.metrics.set_orphans(tracker.tracked());
            return Err(e.into());
        }
        released += 1;
        ctx.metrics.orphan_released();
        tracing::warn!(device = ?device.device_id, node = ?device.node,
            resource = obj.metadata.name.as_deref().unwrap_or("?"), "releasing a device no ComposableResource holds");
    }
    // Tracked devices, and those that were due but could not be released.
    ctx.metrics.set_orphans(tracker.tracked());
    Ok(released)
}

/// Runs rounds every sync period until `shutdown` resolves. Errors are logged and
/// counted; the next round tries again.
pub(crate) async fn run(ctx: &Context, shutdown: impl std::future::Future<Output = ()>) {
    // Rounds run one at a time; the lock only carries the tracker from one to the next.
    let tracker = tokio::sync::Mutex::new(OrphanTracker::default());
    let period = ctx.config.timings.sync_period;
    reconcile::every(ctx, "upstream-sync", period, shutdown, || async {
        sync_once(ctx, &mut *tracker.lock().await).await.map(drop)
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(id: &str) -> DeviceInfo {
        DeviceInfo {
            node: "n1".into(),
            machine_id: "m1".into(),
            device_type: DeviceType::Gpu,
            model: "A100".into(),
            device_id: id.into(),
            fabric_device_id: format!("f-{id}"),
        }
    }

    #[test]
    fn devices_are_released_only_after_the_grace_period() {
        let grace = Duration::from_secs(600);
        let t0 = Instant::now();
        let mut t = OrphanTracker::default();
        let claimed: BTreeSet<String> = ["GPU-held".to_string()].into();
        let due = t.observe(
            vec![device("GPU-held"), device("GPU-x")],
            &claimed,
            t0,
            grace,
        );
        assert!(due.is_empty());
        assert_eq!(t.tracked(), 1);
        let due = t.observe(
            vec![device("GPU-x")],
            &claimed,
            t0 + Duration::from_secs(599),
            grace,
        );
        assert!(due.is_empty());
        let due = t.observe(vec![device("GPU-x")], &claimed, t0 + grace, grace);
        assert_eq!(due, vec![device("GPU-x")]);
        assert_eq!(t.tracked(), 0);
    }

    #[test]
    fn tracking_stops_when_claimed_or_gone() {
        let grace = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut t = OrphanTracker::default();
        t.observe(vec![device("a"), device("b")], &BTreeSet::new(), t0, grace);
        assert_eq!(t.tracked(), 2);
        // a is claimed, b no longer reported.
        let claimed: BTreeSet<String> = ["a".to_string()].into();
        t.observe(
            vec![device("a")],
            &claimed,
            t0 + Duration::from_secs(5),
            grace,
        );
        assert_eq!(t.tracked(), 0);
        // b reappearing starts a new grace period.
        let due = t.observe(
            vec![device("b")],
            &BTreeSet::new(),
            t0 + Duration::from_secs(11),
            grace,
        );
        assert!(due.is_empty());
        assert_eq!(t.tracked(), 1);
    }

    #[test]
    fn only_gpus_are_released_unless_cxl_memory_is_allowed() {
        let gpu = device("GPU-a");
        let mut cxl = device("CXL-a");
        cxl.device_type = DeviceType::CxlMemory;
        assert!(releasable(&gpu, false) && releasable(&gpu, true));
        assert!(!releasable(&cxl, false));
        assert!(releasable(&cxl, true));
    }

    #[test]
    fn orphan_resources_hold_the_device_by_label() {
        let r = orphan_resource(&device("GPU-o"));
        assert_eq!(
            claimed_ids(std::slice::from_ref(&r)),
            ["GPU-o".to_string()].into()
        );
        assert_eq!(r.spec.target_node, "n1");
        assert!(!r.spec.force_detach);
        assert_eq!(r.ready_to_detach().unwrap().cdi_device_id, "f-GPU-o");
    }
}

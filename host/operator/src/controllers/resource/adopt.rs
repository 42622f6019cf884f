//! A lost reply never costs a second device.
//!
//! When the outcome of an attach is unknown (the call's deadline passed, the connection
//! dropped after the request went out, the provider trapped after its HTTP call, the
//! operator died mid-call) the fabric may have attached a device that nobody holds. So
//! before asking the provider, the attempt is recorded on the resource (annotation
//! [`ANNOTATION_ATTACH_ATTEMPT`], written *before* the call: crash-safe), and while such
//! a record says the outcome is unknown, the next attempt first lists the fabric's
//! devices on its target node (the provider's listing of Nodes shows that node alone:
//! `node_scope::focused_on`) and adopts one of the resource's type and model there that
//! no ComposableResource holds, instead of asking the fabric for another.
//!
//! A provider that answered "in progress" (FTI's Cluster Manager) keeps track of its
//! request in its own memory, which lives as long as this process: the record names
//! the process, so after a restart the next attempt looks first as well.
//!
//! The request controller creates each resource with the record already set (and the
//! node's machine noted, [`records_at_creation`]): no attach has been asked for yet, and
//! this process remembers which resources it has asked the fabric for
//! ([`ASKED`]), so the first attempt needs neither a write nor a look. Another process
//! (a restart, another replica) finds the record naming a process other than itself and
//! looks first, as after any unknown outcome.
//!
//! The record is written only when its value changes (it carries no timestamp): every
//! write is a watch event that reconciles the resource again at once, so a record
//! toggled on each retry would defeat the retry backoff. It therefore stays "unknown"
//! after a failed call, even one that certainly attached nothing; the next attempt then
//! looks first, which costs one device listing and finds nothing.
//!
//! See docs/differences-from-go.md, "Fabric path" (the Go operator asked the fabric again).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{LazyLock, Mutex, PoisonError};

use cro_api::{ComposableResource, CroObjectExt};
use cro_runtime::CallError;
use cro_runtime::domain::{
    self, AddOutcome, AttachedDevice, DeviceInfo, DeviceType, ProviderError,
};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::ReconcileError;
use crate::plumbing::context::Context;
use crate::plumbing::patch::FIELD_MANAGER;
use crate::provider::node_machine::{ANNOTATION_NODE_MACHINE, NodeMachine};
use crate::provider::node_scope;
use crate::provider::tenure::LeaseHolder;
use crate::provider::{
    NodeGuard, Operation, ProviderResult, add_request, claims, device_type, to_domain,
};

/// The record of an attach whose outcome is not known yet (JSON of [`Attempt`]).
pub const ANNOTATION_ATTACH_ATTEMPT: &str = "cro.hpsys.ibm.ie.com/attach-attempt";

/// This operator process; the provider's memory of requests in progress ends with it.
static PROCESS: LazyLock<String> =
    LazyLock::new(|| crate::provider::tenure::process_id().to_owned());

/// The resources this process has asked the fabric to attach a device for and whose ids
/// are not stored yet: while a resource's record names this process, an unknown outcome
/// can only come from one of these asks. Bounded by the resources in flight (an entry
/// goes when the ids are stored, [`settled`]).
static ASKED: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(Mutex::default);

fn asked(resource: &str) -> bool {
    ASKED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(resource)
}

fn note_asked(resource: &str, asked: bool) {
    let mut set = ASKED.lock().unwrap_or_else(PoisonError::into_inner);
    if asked {
        set.insert(resource.to_owned());
    } else {
        set.remove(resource);
    }
}

/// The annotations a new resource is created with, so that its first attach writes none:
/// the attempt record of the process that will make the attach (no attach asked for
/// yet), and, when known, the machine of its target node `node` (what [`add`] would
/// otherwise write first), with the fabric's machine one of `others` (the resources on
/// that node) noted (what [`settled`] would otherwise write after the attach). The
/// attach is made by the replica holding the provider's Lease, `holder` (its identity and
/// process, from the Lease; None: this process): a record naming any other process would
/// make the attach look for a lost device first.
pub(crate) fn records_at_creation<'a>(
    node: Option<&Node>,
    holder: Option<&LeaseHolder>,
    others: impl IntoIterator<Item = &'a ComposableResource>,
) -> BTreeMap<String, String> {
    let mut records = BTreeMap::new();
    let record = match holder {
        Some(h) => Attempt {
            process: h.process.clone(),
            outcome: Known::Unknown,
            holder: Some(h.identity.clone()),
        },
        None => Attempt::here(Known::Unknown, None),
    };
    if let Ok(record) = serde_json::to_string(&record) {
        records.insert(ANNOTATION_ATTACH_ATTEMPT.to_owned(), record);
    }
    if let Some(machine) = node.and_then(|n| NodeMachine::of_node_learned(n, others)) {
        records.insert(ANNOTATION_NODE_MACHINE.to_owned(), machine.to_annotation());
    }
    records
}

/// What is known of the last attach call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Known {
    /// Made or being made; the fabric may or may not have attached a device.
    Unknown,
    /// The provider accepted it and tracks it (until this process ends).
    InProgress,
}

/// The recorded attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Attempt {
    pub(crate) process: String,
    pub(crate) outcome: Known,
    /// The replica that asks, as its provider Lease names it (with several replicas):
    /// who acts on the device, for whoever reads the object after a failover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) holder: Option<String>,
}

impl Attempt {
    fn here(outcome: Known, holder: Option<&str>) -> Attempt {
        Attempt {
            process: PROCESS.clone(),
            outcome,
            holder: holder.map(str::to_owned),
        }
    }
}

/// The attempt recorded on `res`; an unreadable record counts as an unknown outcome.
pub(crate) fn recorded(res: &ComposableResource) -> Option<Attempt> {
    let raw = res.annotations().get(ANNOTATION_ATTACH_ATTEMPT)?;
    Some(serde_json::from_str(raw).unwrap_or_else(|_| Attempt {
        process: String::new(),
        outcome: Known::Unknown,
        holder: None,
    }))
}

/// Whether the next attach must first look for a device the last one may have left:
/// the record names another process (its asks are unknown here), or its outcome is
/// unknown and this process has `asked` the fabric already.
pub(crate) fn must_look_first(attempt: Option<&Attempt>, process: &str, asked: bool) -> bool {
    match attempt {
        None => false,
        Some(a) => a.process != process || (a.outcome == Known::Unknown && asked),
    }
}

/// A device of `r`'s type and model on its target node that nobody holds.
pub(crate) fn pick(
    devices: &[DeviceInfo],
    claimed: &BTreeSet<String>,
    r: &domain::ComposableResource,
) -> Option<AttachedDevice> {
    devices
        .iter()
        .find(|d| {
            !d.device_id.is_empty()
                && d.node == r.target_node
                && d.device_type == r.device_type
                && d.model == r.model
                && !claimed.contains(&d.device_id)
        })
        .map(|d| AttachedDevice {
            device_id: d.device_id.clone(),
            fabric_device_id: d.fabric_device_id.clone(),
            machine_id: Some(d.machine_id.clone()).filter(|m| !m.is_empty()),
        })
}

/// (node, type, model) of every resource whose attach may have left a device nobody
/// holds yet: the upstream sync leaves such devices to be adopted.
pub(crate) fn awaiting_adoption(
    resources: &[ComposableResource],
) -> HashSet<(String, DeviceType, String)> {
    resources
        .iter()
        .filter(|r| !r.is_being_deleted() && r.device_id().is_none() && recorded(r).is_some())
        .map(|r| {
            (
                r.spec.target_node.clone(),
                device_type(r.spec.resource_type),
                r.spec.model.clone(),
            )
        })
        .collect()
}

/// Device ids some resource holds: by its status, or by its ready-to-detach label (a
/// resource created to release an orphan holds the device before it has a status).
fn claimed_ids<'a>(
    resources: impl IntoIterator<Item = &'a ComposableResource>,
) -> BTreeSet<String> {
    resources
        .into_iter()
        .flat_map(|r| {
            let orphan = r.ready_to_detach().map(|o| o.device_id);
            r.device_id().map(str::to_owned).into_iter().chain(orphan)
        })
        .collect()
}

/// What a write does to the record (never removed: see [`settled`]).
#[derive(Clone, Copy)]
enum Record<'a> {
    Keep,
    Set(&'a Attempt),
}

/// Another annotation (key, value) written in the same patch as the record: one write
/// and one watch event where there were two.
pub(crate) type Note<'a> = Option<(&'a str, &'a str)>;

/// Changes the record and sets the note, each unless it already says exactly that; no
/// write at all when neither changes.
async fn write(
    api: &Api<ComposableResource>,
    res: &mut ComposableResource,
    record: Record<'_>,
    note: Note<'_>,
) -> Result<(), ReconcileError> {
    let mut annotations = serde_json::Map::new();
    let text = match record {
        Record::Keep => None,
        Record::Set(a) => {
            Some(serde_json::to_string(a).map_err(|e| ReconcileError::Invalid(e.to_string()))?)
        }
    };
    if let Some(text) = text
        && res.annotations().get(ANNOTATION_ATTACH_ATTEMPT) != Some(&text)
    {
        annotations.insert(ANNOTATION_ATTACH_ATTEMPT.to_owned(), text.into());
    }
    if let Some((key, value)) = note
        && res.annotations().get(key).map(String::as_str) != Some(value)
    {
        annotations.insert(key.to_owned(), value.into());
    }
    if annotations.is_empty() {
        return Ok(());
    }
    let patch = json!({"metadata": {"annotations": annotations}});
    let params = kube::api::PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    *res = api
        .patch(&res.name_any(), &params, &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// The attach of `res` (which holds no device yet), under the node's guard: adopts what
/// an earlier attempt may have left, else records the attempt and asks the provider.
/// `note` (the node's machine, which must be stored before the fabric attaches anything)
/// is written with the record, or alone where no record is written. `res` is updated to
/// the object as last written.
pub(crate) async fn add(
    ctx: &Context,
    guard: &NodeGuard,
    res: &mut ComposableResource,
    note: Note<'_>,
) -> Result<ProviderResult<AddOutcome>, ReconcileError> {
    let api: Api<ComposableResource> = Api::all(ctx.client.clone());
    let name = res.name_any();
    // Not holding the provider's Lease now: nothing is recorded and nothing asked, so
    // the outcome stays known (a record left "unknown" would make the next attach list
    // the whole fabric first). The registry asks the fence again at the call.
    if ctx.registry.tenure().is_leased()
        && let Err(why) = ctx.registry.fence_node(&res.spec.target_node)
    {
        return Ok(Err(CallError::Provider(ProviderError::Unavailable(why))));
    }
    let attempt = recorded(res);
    // What the node's resources hold, for the provider to tell its device from another's.
    let held = ctx.caches.node_resources(&ctx.client, res).await?;
    let claims = claims(held.iter().map(AsRef::as_ref));
    if must_look_first(attempt.as_ref(), &PROCESS, asked(&name)) {
        // Only the target node's devices can be picked: the listing asks about it alone.
        let devices = node_scope::focused_on(&res.spec.target_node, ctx.provider.list(&claims))
            .await
            .map_err(|e| ReconcileError::provider(Operation::List, e))?;
        let claimed = claimed_ids(held.iter().map(AsRef::as_ref));
        if let Some(device) = pick(&devices, &claimed, &to_domain(res)) {
            tracing::warn!(resource = %name, node = %res.spec.target_node,
                device = ?device.device_id,
                "adopting the device an attach with a lost reply left on the node");
            ctx.metrics.attach_adopted();
            write(&api, res, Record::Keep, note).await?;
            return Ok(Ok(AddOutcome::Attached(device)));
        }
    }
    // Recorded before the call: if this process dies during it, the next one looks
    // first. A request this process's provider tracks ("in progress") needs no new one.
    let tenure = ctx.registry.tenure();
    let holder = tenure.is_leased().then(|| tenure.identity());
    let tracked = Attempt::here(Known::InProgress, holder);
    let unknown = Attempt::here(Known::Unknown, holder);
    let record = if attempt.as_ref() == Some(&tracked) {
        Record::Keep
    } else {
        Record::Set(&unknown)
    };
    write(&api, res, record, note).await?;

    note_asked(&name, true);
    let result = ctx.provider.add(guard, &add_request(res, claims)).await;
    match &result {
        Ok(AddOutcome::InProgress(_)) => write(&api, res, Record::Set(&tracked), None).await?,
        Ok(AddOutcome::Attached(device)) => {
            // A device some other resource holds (a provider tracking its own requests
            // can hand out one adopted meanwhile) is not taken twice: the record stays
            // unknown, so the next attempt looks for this resource's own device first.
            // From the watch cache, caught up with `res` as written just before the call.
            let other = ctx
                .caches
                .find_holder(&ctx.client, res, &device.device_id, true)
                .await?;
            if let Some(other) = other {
                return Ok(Err(CallError::Provider(ProviderError::Other(format!(
                    "the fabric handed out device {} which {} already holds; looking again",
                    device.device_id,
                    other.name_any()
                )))));
            }
        }
        // Whatever the failure, the next attempt looks first (see the module comment).
        Err(_) => {
            write(&api, res, Record::Set(&unknown), None).await?;
        }
    }
    Ok(result)
}

/// The device's ids are stored: the record has served its purpose. It stays on the
/// resource (which process, and which replica, asked for the device), unread: a
/// resource holding a device never consults it, and its ids are never cleared (removing
/// it was one metadata write per device, docs/BENCHMARKS.md). `note` (the fabric's name
/// for the machine, when the record of the node's machine does not say it yet) is
/// written. Best effort: without the note the provider still finds the machine through
/// the Node or the record's stand-in.
pub(crate) async fn settled(
    api: &Api<ComposableResource>,
    res: &mut ComposableResource,
    note: Note<'_>,
) {
    note_asked(&res.name_any(), false);
    if let Err(e) = write(api, res, Record::Keep, note).await {
        tracing::warn!(resource = %res.name_any(), error = %e,
            "cannot note the fabric machine; detach will find the machine through the node");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(node: &str, model: &str, id: &str) -> DeviceInfo {
        DeviceInfo {
            node: node.into(),
            machine_id: "m".into(),
            device_type: DeviceType::Gpu,
            model: model.into(),
            device_id: id.into(),
            fabric_device_id: format!("f-{id}"),
        }
    }

    fn wanted() -> domain::ComposableResource {
        domain::ComposableResource {
            name: "gpu-1".into(),
            device_type: DeviceType::Gpu,
            model: "A100".into(),
            target_node: "n1".into(),
            device_id: None,
            fabric_device_id: None,
            machine_id: None,
            force_detach: false,
        }
    }

    #[test]
    fn looks_first_after_an_unknown_outcome_or_a_restart() {
        let at = |process: &str, outcome| Attempt {
            process: process.into(),
            outcome,
            holder: None,
        };
        for asked in [false, true] {
            assert!(!must_look_first(None, "p1", asked));
            assert!(!must_look_first(
                Some(&at("p1", Known::InProgress)),
                "p1",
                asked
            ));
            assert!(must_look_first(
                Some(&at("p0", Known::InProgress)),
                "p1",
                asked
            ));
            assert!(must_look_first(
                Some(&at("p0", Known::Unknown)),
                "p1",
                asked
            ));
        }
        // This process's record: unknown only once this process has asked the fabric
        // (the record a resource is created with, before any ask, needs no look).
        assert!(must_look_first(Some(&at("p1", Known::Unknown)), "p1", true));
        assert!(!must_look_first(
            Some(&at("p1", Known::Unknown)),
            "p1",
            false
        ));
    }

    #[test]
    fn picks_an_unclaimed_device_of_the_model_on_the_node() {
        let devices = vec![
            device("n2", "A100", "GPU-other-node"),
            device("n1", "H100", "GPU-other-model"),
            device("n1", "A100", "GPU-held"),
            device("n1", "A100", ""),
            device("n1", "A100", "GPU-free"),
        ];
        let claimed = BTreeSet::from(["GPU-held".to_string()]);
        assert_eq!(
            pick(&devices, &claimed, &wanted()).map(|d| d.device_id),
            Some("GPU-free".into())
        );
        let mut cxl = wanted();
        cxl.device_type = DeviceType::CxlMemory;
        assert_eq!(pick(&devices, &claimed, &cxl), None);
        let all = BTreeSet::from(["GPU-held".to_string(), "GPU-free".to_string()]);
        assert_eq!(pick(&devices, &all, &wanted()), None);
    }

    fn resource(name: &str, record: bool, device: Option<&str>) -> ComposableResource {
        let mut r = ComposableResource::new(
            name,
            cro_api::ComposableResourceSpec {
                resource_type: cro_api::ResourceType::Gpu,
                model: "A100".into(),
                target_node: "n1".into(),
                force_detach: false,
            },
        );
        if record {
            r.annotations_mut()
                .insert(ANNOTATION_ATTACH_ATTEMPT.into(), "{}".into());
        }
        if let Some(id) = device {
            r.status = Some(cro_api::ComposableResourceStatus {
                device_id: id.into(),
                ..Default::default()
            });
        }
        r
    }

    #[test]
    fn only_attempts_without_a_device_await_adoption() {
        let mut deleting = resource("c", true, None);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let list = [
            resource("a", true, Some("GPU-1")),
            resource("b", false, None),
            deleting,
        ];
        assert!(awaiting_adoption(&list).is_empty());
        let waiting = awaiting_adoption(&[resource("d", true, None)]);
        assert!(waiting.contains(&("n1".to_string(), DeviceType::Gpu, "A100".to_string())));
    }

    #[test]
    fn an_unreadable_record_counts_as_unknown() {
        let mut r = ComposableResource::new(
            "gpu-1",
            cro_api::ComposableResourceSpec {
                resource_type: cro_api::ResourceType::Gpu,
                model: "A100".into(),
                target_node: "n1".into(),
                force_detach: false,
            },
        );
        assert_eq!(recorded(&r), None);
        r.annotations_mut()
            .insert(ANNOTATION_ATTACH_ATTEMPT.into(), "garbage".into());
        assert_eq!(recorded(&r).map(|a| a.outcome), Some(Known::Unknown));
        let a = Attempt::here(Known::InProgress, Some("replica-1"));
        r.annotations_mut().insert(
            ANNOTATION_ATTACH_ATTEMPT.into(),
            serde_json::to_string(&a).unwrap(),
        );
        assert_eq!(recorded(&r), Some(a));
        // A record of a cro before replicas shared work reads without a holder.
        r.annotations_mut().insert(
            ANNOTATION_ATTACH_ATTEMPT.into(),
            r#"{"process":"p0","outcome":"unknown"}"#.into(),
        );
        assert_eq!(recorded(&r).and_then(|a| a.holder), None);
    }

    #[test]
    fn the_record_made_with_a_resource_names_the_process_that_will_attach() {
        let holder = LeaseHolder {
            identity: "replica-2".into(),
            process: "p-of-replica-2".into(),
        };
        let records = records_at_creation(None, Some(&holder), []);
        let a: Attempt = serde_json::from_str(&records[ANNOTATION_ATTACH_ATTEMPT]).unwrap();
        assert_eq!(a.process, "p-of-replica-2");
        assert_eq!(a.holder.as_deref(), Some("replica-2"));
        // That process has not asked yet: its first attach does not look first.
        assert!(!must_look_first(Some(&a), "p-of-replica-2", false));
        // Another process (the holder changed meanwhile) does.
        assert!(must_look_first(Some(&a), "p-of-replica-3", false));
        let alone = records_at_creation(None, None, []);
        let a: Attempt = serde_json::from_str(&alone[ANNOTATION_ATTACH_ATTEMPT]).unwrap();
        assert_eq!(a.process, *PROCESS);
    }
}

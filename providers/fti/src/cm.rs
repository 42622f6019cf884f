//! The Cluster Manager API: asynchronous resizes of a machine's resource specs.
//!
//! An attach asks for one more device of the matching spec and answers "in progress"
//! until a new device of that spec is `ADD_COMPLETE`. The Go operator told its own
//! device from others by listing every ComposableResource; since contract 0.2.0 the host
//! passes the same knowledge as the request's claims. The provider also remembers in
//! the host's state store which devices the spec held when it asked (the baseline), and
//! which new devices it already handed to a resource, so two resources attaching at once
//! on one machine never get the same device, and a device another ComposableResource
//! holds is never taken even when that state was lost.
//! A detach asks for the device's removal and answers "in progress" until the device
//! is gone from the machine.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::encode;
use crate::fabric::Fabric;
use crate::health;
use crate::host::{Host, LogLevel, Method};
use crate::lenient::{self, present};
use crate::model::{
    AddOutcome, AddRequest, AttachedDevice, ComposableResource, DeviceInfo, DeviceType,
    ProviderError, RemoveOutcome,
};
use crate::reserve::{HANDOUT_TTL_MS, Reservations};

pub const ADD_COMPLETE: &str = "ADD_COMPLETE";
pub const ADD_FAILED: &str = "ADD_FAILED";
pub const REMOVE_FAILED: &str = "REMOVE_FAILED";

/// How long an unanswered attach request is remembered; after that a new one is sent.
const PENDING_ADD_TTL_MS: u64 = 60 * 60 * 1000;
/// How long a removal request is awaited before it is sent again.
const PENDING_REMOVE_TTL_MS: u64 = 10 * 60 * 1000;
/// The new devices this API handed to a resource: reserved for it (minutes; the
/// operator stores the ids at once, so this only has to outlast one reconcile).
const CLAIMS: Reservations = Reservations::new("fti/cm/claim", HANDOUT_TTL_MS);

#[derive(Deserialize, Default, Debug)]
pub struct MachineReply {
    data: Option<Data>,
}

#[derive(Deserialize, Default, Debug)]
struct Data {
    cluster: Option<Cluster>,
}

#[derive(Deserialize, Default, Debug)]
struct Cluster {
    machine: Option<Machine>,
}

#[derive(Deserialize, Default, Debug)]
pub struct Machine {
    #[serde(default, deserialize_with = "lenient::list")]
    resspecs: Vec<ResSpec>,
}

#[derive(Deserialize, Default, Debug)]
pub struct ResSpec {
    #[serde(default, deserialize_with = "lenient::string")]
    spec_uuid: Option<String>,
    #[serde(default, rename = "type", deserialize_with = "lenient::string")]
    kind: Option<String>,
    selector: Option<Selector>,
    #[serde(default, deserialize_with = "lenient::count")]
    device_count: Option<u64>,
    #[serde(default, deserialize_with = "lenient::count")]
    max_resspec_count: Option<u64>,
    #[serde(default, deserialize_with = "lenient::list")]
    devices: Vec<Device>,
}

#[derive(Deserialize, Default, Debug)]
struct Selector {
    expression: Option<Expression>,
}

#[derive(Deserialize, Default, Debug)]
struct Expression {
    #[serde(default, deserialize_with = "lenient::list")]
    conditions: Vec<crate::fm::Condition>,
}

#[derive(Deserialize, Default, Debug)]
pub struct Device {
    #[serde(default, deserialize_with = "lenient::string")]
    device_id: Option<String>,
    #[serde(default, deserialize_with = "lenient::string")]
    status: Option<String>,
    #[serde(default, deserialize_with = "lenient::string")]
    status_reason: Option<String>,
    detail: Option<Detail>,
}

#[derive(Deserialize, Default, Debug)]
struct Detail {
    #[serde(default, deserialize_with = "lenient::string")]
    res_uuid: Option<String>,
    #[serde(default, deserialize_with = "lenient::string")]
    res_op_status: Option<String>,
    #[serde(default, deserialize_with = "lenient::list")]
    resspecs: Vec<DetailSpec>,
}

#[derive(Deserialize, Default, Debug)]
struct DetailSpec {
    #[serde(default, deserialize_with = "lenient::string")]
    model: Option<String>,
}

impl ResSpec {
    fn device_type(&self) -> Option<DeviceType> {
        self.kind.as_deref().and_then(DeviceType::from_fabric_str)
    }

    fn model(&self) -> Option<&str> {
        self.selector
            .as_ref()
            .and_then(|s| s.expression.as_ref())
            .and_then(|e| crate::fm::model_of(&e.conditions))
    }

    fn matches(&self, r: &ComposableResource) -> bool {
        self.device_type() == Some(r.device_type) && self.model() == Some(r.model.as_str())
    }

    /// The count the next resize starts from: the spec's own, else its device list.
    fn current_count(&self) -> u64 {
        self.device_count.unwrap_or(self.devices.len() as u64)
    }
}

impl Device {
    fn id(&self) -> Option<&str> {
        present(&self.device_id)
    }

    fn fabric_id(&self) -> Option<&str> {
        self.detail.as_ref().and_then(|d| present(&d.res_uuid))
    }

    fn status(&self) -> &str {
        self.status.as_deref().unwrap_or("")
    }

    fn failure(&self, code: &str) -> ProviderError {
        // The reason is the fabric's message; the status names what failed.
        ProviderError::Fabric {
            status: 200,
            code: code.to_string(),
            message: self.status_reason.clone().unwrap_or_default(),
        }
    }
}

/// An attach request sent and not yet answered by a new device.
#[derive(Serialize, Deserialize)]
struct PendingAdd {
    machine: String,
    spec_uuid: String,
    baseline: BTreeSet<String>,
    /// The spec's device count before the request.
    #[serde(default)]
    count_before: u64,
    /// The request's reply was lost (timeout, dropped connection): the fabric may or may
    /// not have taken it. A request that left no trace is sent again.
    #[serde(default)]
    unsure: bool,
}

/// A removal request sent and not yet done.
#[derive(Serialize, Deserialize)]
struct PendingRemove {
    machine: String,
    device_id: String,
}

fn add_key(r: &ComposableResource) -> String {
    format!("fti/cm/add/{}", r.name)
}

fn remove_key(r: &ComposableResource) -> String {
    format!("fti/cm/remove/{}", r.name)
}

fn load<T: for<'de> Deserialize<'de>>(host: &(impl Host + ?Sized), key: &str) -> Option<T> {
    serde_json::from_slice(&host.state_get(key)?).ok()
}

fn store<T: Serialize>(
    host: &(impl Host + ?Sized),
    key: &str,
    value: &T,
    ttl_ms: u64,
) -> Result<(), ProviderError> {
    let bytes = serde_json::to_vec(value)
        .map_err(|e| ProviderError::Other(format!("encoding provider state: {e}")))?;
    if host.state_set(key, &bytes, Some(ttl_ms)) {
        Ok(())
    } else {
        Err(ProviderError::Other(format!(
            "the host refused to store provider state '{key}'"
        )))
    }
}

fn machine_path(
    f: &Fabric<'_, impl Host + ?Sized>,
    machine: &str,
) -> Result<String, ProviderError> {
    let cfg = f.config();
    let cluster = cfg.cluster_id.as_deref().ok_or_else(|| {
        ProviderError::Config("the Cluster Manager API needs config key 'cluster_id'".into())
    })?;
    Ok(format!(
        "cluster_manager/cluster_autoscaler/v3/tenants/{}/clusters/{}/machines/{}",
        encode::component(&cfg.tenant_id),
        encode::component(cluster),
        encode::component(machine)
    ))
}

pub fn read_machine<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    machine: &str,
) -> Result<Machine, ProviderError> {
    let reply: MachineReply = f.call_json(
        Method::Get,
        &machine_path(f, machine)?,
        None,
        "machine reply",
    )?;
    reply
        .data
        .and_then(|d| d.cluster)
        .and_then(|c| c.machine)
        .ok_or_else(|| ProviderError::malformed("machine reply has no data.cluster.machine"))
}

fn resize<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    machine: &str,
    body: serde_json::Value,
) -> Result<(), ProviderError> {
    let path = format!("{}/actions/resize", machine_path(f, machine)?);
    f.call(Method::Post, &path, Some(&body)).map(|_| ())
}

pub fn add<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    req: &AddRequest,
    machine: &str,
) -> Result<AddOutcome, ProviderError> {
    let r = &req.resource;
    let host = f.host();
    let m = read_machine(f, machine)?;
    let spec = m.resspecs.iter().find(|s| s.matches(r)).ok_or_else(|| {
        ProviderError::NotFound(format!(
            "machine {machine} has no {} resource spec of model '{}'",
            r.device_type, r.model
        ))
    })?;
    let spec_uuid = present(&spec.spec_uuid)
        .ok_or_else(|| ProviderError::malformed("matching resource spec has no spec_uuid"))?;
    let waiting = || {
        AddOutcome::InProgress(format!(
            "waiting for the cluster manager to add a {} '{}' to machine {machine}",
            r.device_type, r.model
        ))
    };

    let pending = load::<PendingAdd>(host, &add_key(r))
        .filter(|p| p.machine == machine && p.spec_uuid == spec_uuid);
    match pending {
        Some(p) => follow_pending(f, req, machine, spec, spec_uuid, &p, waiting),
        None => ask(f, r, machine, spec, spec_uuid, waiting),
    }
}

/// Follows the resize an earlier call of this attach asked for (`p`): the new device
/// once it is added, its failure, or a new request when the first left no trace.
fn follow_pending<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    req: &AddRequest,
    machine: &str,
    spec: &ResSpec,
    spec_uuid: &str,
    p: &PendingAdd,
    waiting: impl Fn() -> AddOutcome,
) -> Result<AddOutcome, ProviderError> {
    let r = &req.resource;
    let host = f.host();
    let new_devices = spec
        .devices
        .iter()
        .any(|d| d.id().is_some_and(|id| !p.baseline.contains(id)));
    if p.unsure && !new_devices && spec.current_count() <= p.count_before {
        // The lost request left no trace on the fabric: ask again.
        host.state_remove(&add_key(r));
        host.log(
            LogLevel::Info,
            &format!("the unanswered resize of spec {spec_uuid} on machine {machine} left no trace; asking again"),
        );
        return ask(f, r, machine, spec, spec_uuid, waiting);
    }
    let mine = |d: &&Device| {
        d.id().is_some_and(|id| {
            // The cluster's claims (what ComposableResources hold) decide even when
            // the provider's own record of handed-out devices was lost.
            !p.baseline.contains(id)
                && !req.claimed_by_another(id)
                && CLAIMS.holder(host, id).is_none_or(|owner| owner == r.name)
        })
    };
    let new: Vec<&Device> = spec.devices.iter().filter(mine).collect();
    if let Some(d) = new.iter().find(|d| d.status() == ADD_COMPLETE) {
        let id = d.id().unwrap_or_default();
        let fabric_id = d.fabric_id().ok_or_else(|| {
            ProviderError::malformed(format!("added device {id} has no detail.res_uuid"))
        })?;
        CLAIMS.hand(host, id, &r.name);
        host.state_remove(&add_key(r));
        return Ok(AddOutcome::Attached(AttachedDevice {
            device_id: id.to_string(),
            fabric_device_id: fabric_id.to_string(),
            machine_id: Some(machine.to_string()),
        }));
    }
    if new.iter().any(|d| d.status() != ADD_FAILED) {
        return Ok(waiting());
    }
    if let Some(d) = new.first() {
        let id = d.id().unwrap_or_default();
        // Keep the failed device away from other resources waiting on this spec.
        CLAIMS.hand(host, id, &r.name);
        host.state_remove(&add_key(r));
        return Err(d.failure(ADD_FAILED));
    }
    Ok(waiting())
}

/// Asks the cluster manager for one more device of `spec`, remembering first what the
/// spec held, so that the new device is recognised (and a lost reply costs no second one).
fn ask<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    r: &ComposableResource,
    machine: &str,
    spec: &ResSpec,
    spec_uuid: &str,
    waiting: impl Fn() -> AddOutcome,
) -> Result<AddOutcome, ProviderError> {
    let host = f.host();
    let baseline: BTreeSet<String> = spec
        .devices
        .iter()
        .filter_map(|d| d.id().map(str::to_string))
        .collect();
    let target = spec.current_count().saturating_add(1);
    if let Some(max) = spec.max_resspec_count
        && target > max
    {
        return Err(ProviderError::NoCapacity(format!(
            "machine {machine} already holds {} of at most {max} {} '{}' devices",
            spec.current_count(),
            r.device_type,
            r.model
        )));
    }
    // Remember before asking, as unsure until the fabric answers: a lost reply (or a
    // call ended by its deadline mid-request) must not lead to a second request, and a
    // request that never arrived must not be waited for (docs/fti-fabric-api.md).
    let mut pending = PendingAdd {
        machine: machine.to_string(),
        spec_uuid: spec_uuid.to_string(),
        baseline,
        count_before: spec.current_count(),
        unsure: true,
    };
    store(host, &add_key(r), &pending, PENDING_ADD_TTL_MS)?;
    let body = json!({"increase_resource_count": {"spec_uuid": spec_uuid, "device_count": target}});
    if let Err(e) = resize(f, machine, body) {
        if !outcome_unknown(&e) {
            // The fabric answered with a refusal: nothing was added.
            host.state_remove(&add_key(r));
        }
        return Err(e);
    }
    pending.unsure = false;
    if let Err(e) = store(host, &add_key(r), &pending, PENDING_ADD_TTL_MS) {
        host.log(
            LogLevel::Warn,
            &format!("{e}; the attach stays marked unsure"),
        );
    }
    host.log(
        LogLevel::Info,
        &format!("asked the cluster manager for {target} devices of spec {spec_uuid} on machine {machine}"),
    );
    Ok(waiting())
}

/// A failure after which the fabric may have acted: no answer came back.
fn outcome_unknown(e: &ProviderError) -> bool {
    matches!(
        e,
        ProviderError::Unavailable(_) | ProviderError::MalformedReply(_)
    )
}

pub fn remove<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    r: &ComposableResource,
    machine: &str,
) -> Result<RemoveOutcome, ProviderError> {
    let host = f.host();
    let device_id = present(&r.device_id);
    let fabric_id = present(&r.fabric_device_id);
    if device_id.is_none() && fabric_id.is_none() {
        host.log(
            LogLevel::Info,
            &format!("{} holds no device id; nothing to detach", r.name),
        );
        return Ok(RemoveOutcome::Removed);
    }
    let m = read_machine(f, machine)?;
    // Search every spec: a device is ours by its id whatever its spec says now.
    let found = m.resspecs.iter().find_map(|s| {
        s.devices
            .iter()
            .find(|d| match device_id {
                Some(id) => d.id() == Some(id),
                None => d.fabric_id() == fabric_id,
            })
            .map(|d| (s, d))
    });
    let Some((spec, device)) = found else {
        host.state_remove(&remove_key(r));
        if let Some(id) = device_id {
            CLAIMS.release(host, id);
        }
        return Ok(RemoveOutcome::Removed);
    };
    let id = device.id().unwrap_or_default().to_string();
    let waiting = RemoveOutcome::InProgress(format!(
        "waiting for the cluster manager to remove device {id} from machine {machine}"
    ));
    let pending = load::<PendingRemove>(host, &remove_key(r))
        .filter(|p| p.machine == machine && p.device_id == id);
    let status = device.status();
    if pending.is_some() {
        if status == REMOVE_FAILED {
            host.state_remove(&remove_key(r));
            return Err(device.failure(REMOVE_FAILED));
        }
        return Ok(waiting);
    }
    if ![ADD_COMPLETE, ADD_FAILED, REMOVE_FAILED].contains(&status) {
        // A change of this device is under way already; ask once it settles.
        return Ok(waiting);
    }
    ask_removal(f, r, machine, spec, &id)?;
    Ok(waiting)
}

/// Asks the cluster manager to remove device `id` of `spec`, noting first that it was
/// asked (so the next call waits instead of asking again).
fn ask_removal<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    r: &ComposableResource,
    machine: &str,
    spec: &ResSpec,
    id: &str,
) -> Result<(), ProviderError> {
    let host = f.host();
    let spec_uuid = present(&spec.spec_uuid)
        .ok_or_else(|| ProviderError::malformed("the device's resource spec has no spec_uuid"))?;
    store(
        host,
        &remove_key(r),
        &PendingRemove {
            machine: machine.to_string(),
            device_id: id.to_string(),
        },
        PENDING_REMOVE_TTL_MS,
    )?;
    let body = json!({"remove_resources": {
        "spec_uuid": spec_uuid,
        "device_count": spec.current_count().saturating_sub(1),
        "devices": [id],
    }});
    if let Err(e) = resize(f, machine, body) {
        host.state_remove(&remove_key(r));
        return Err(e);
    }
    Ok(())
}

pub fn check<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    r: &ComposableResource,
    machine: &str,
) -> Result<(), ProviderError> {
    let device_id = present(&r.device_id)
        .ok_or_else(|| ProviderError::NotFound(format!("{} holds no device id", r.name)))?;
    let m = read_machine(f, machine)?;
    let device = m
        .resspecs
        .iter()
        .filter(|s| s.matches(r))
        .flat_map(|s| s.devices.iter())
        .find(|d| d.id() == Some(device_id))
        .ok_or_else(|| {
            ProviderError::NotFound(format!(
                "device {device_id} ({} '{}') is not attached to machine {machine}",
                r.device_type, r.model
            ))
        })?;
    let detail = device
        .detail
        .as_ref()
        .ok_or_else(|| ProviderError::malformed(format!("device {device_id} has no detail")))?;
    health::check(detail.res_op_status.as_deref(), device_id)
}

/// Every managed device on one machine.
pub fn devices<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    node: &str,
    machine: &str,
) -> Result<Vec<DeviceInfo>, ProviderError> {
    let m = read_machine(f, machine)?;
    let mut out = Vec::new();
    for spec in &m.resspecs {
        let Some(device_type) = spec.device_type() else {
            continue;
        };
        for d in &spec.devices {
            let Some(id) = d.id() else {
                f.host().log(
                    LogLevel::Debug,
                    &format!(
                        "machine {machine} lists a {device_type} without device_id yet; skipped"
                    ),
                );
                continue;
            };
            let model = spec
                .model()
                .or_else(|| {
                    d.detail
                        .as_ref()
                        .and_then(|x| x.resspecs.first())
                        .and_then(|s| s.model.as_deref())
                })
                .unwrap_or_default();
            out.push(DeviceInfo {
                node: node.to_string(),
                machine_id: machine.to_string(),
                device_type,
                model: model.to_string(),
                device_id: id.to_string(),
                fabric_device_id: d.fabric_id().unwrap_or_default().to_string(),
            });
        }
    }
    Ok(out)
}

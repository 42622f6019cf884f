//! The Fabric Manager API: synchronous attach (PATCH), detach (DELETE) and machine
//! reads (GET) under `fabric_manager/api/v1/machines/<machine>`, with `tenant_uuid`.
//!
//! An attach is retried when its reply was lost: the fabric attached a device, but
//! neither the provider nor the operator learned which. A retry that simply attached
//! again would leave that device on the machine, held by no ComposableResource. So,
//! with a contract 0.2.0 host, the provider notes each attempt key in the host's state
//! store before it sends the PATCH, and keeps it for two minutes after the attach
//! returned a device (the reply can still be lost between the host and the operator's
//! record of it). A call that finds its attempt key noted is a retry: it reads the machine first and
//! adopts a device of the requested type and model that no ComposableResource holds
//! (the request's claims) and that this provider has not just handed to another
//! resource (its hand-out record, which covers the moment between an attach and the
//! operator storing the ids), instead of attaching another. A first attempt attaches
//! at once, exactly as before: adopting on every attach would let two resources
//! attaching at once on one machine take the same new device before either is
//! claimed. A contract 0.1.0 host passes no claims: the provider cannot tell an orphan
//! from another resource's device and always attaches (docs/fti-fabric-api.md,
//! "Lost replies").

use serde::Deserialize;
use serde_json::json;

use crate::encode;
use crate::fabric::Fabric;
use crate::health::{self, OpStatus};
use crate::host::{Host, LogLevel, Method};
use crate::lenient::{self, present};
use crate::model::{
    AddOutcome, AddRequest, AttachedDevice, ComposableResource, DeviceInfo, DeviceType,
    ProviderError, RemoveOutcome,
};
// How long a handed-out device stays reserved for its resource is also how long an
// attempt in flight is remembered: the operator stores the ids at once and retries
// within minutes, so both only have to outlast a few reconciles.
use crate::reserve::{HANDOUT_TTL_MS, Reservations};

fn attempt_key(attempt: &str) -> String {
    format!("fti/fm/attempt/{attempt}")
}

/// The devices this API handed to a resource whose ids the operator may not have
/// stored yet: a retry must not adopt them for another resource.
const HANDED: Reservations = Reservations::new("fti/fm/handout", HANDOUT_TTL_MS);

#[derive(Deserialize, Default, Debug)]
pub struct MachinesReply {
    data: Option<MachinesData>,
}

#[derive(Deserialize, Default, Debug)]
struct MachinesData {
    #[serde(default, deserialize_with = "lenient::list")]
    machines: Vec<Machine>,
}

#[derive(Deserialize, Default, Debug)]
pub struct Machine {
    #[serde(default, deserialize_with = "lenient::string")]
    mach_uuid: Option<String>,
    #[serde(default, deserialize_with = "lenient::list")]
    resources: Vec<Resource>,
}

#[derive(Deserialize, Default, Debug)]
pub struct Resource {
    #[serde(default, deserialize_with = "lenient::string")]
    res_uuid: Option<String>,
    #[serde(default, deserialize_with = "lenient::string")]
    res_type: Option<String>,
    #[serde(default, deserialize_with = "lenient::string")]
    res_op_status: Option<String>,
    #[serde(default, deserialize_with = "lenient::string")]
    res_serial_num: Option<String>,
    res_spec: Option<Spec>,
}

#[derive(Deserialize, Default, Debug)]
struct Spec {
    #[serde(default, deserialize_with = "lenient::list")]
    condition: Vec<Condition>,
}

#[derive(Deserialize, Default, Debug)]
pub struct Condition {
    #[serde(default, deserialize_with = "lenient::string")]
    column: Option<String>,
    #[serde(default, deserialize_with = "lenient::string")]
    operator: Option<String>,
    #[serde(default, deserialize_with = "lenient::string")]
    value: Option<String>,
}

/// The value of a `model eq <value>` condition, if any.
pub fn model_of(conditions: &[Condition]) -> Option<&str> {
    conditions
        .iter()
        .find(|c| c.column.as_deref() == Some("model") && c.operator.as_deref() == Some("eq"))
        .and_then(|c| c.value.as_deref())
}

impl Resource {
    fn kind(&self) -> Option<DeviceType> {
        self.res_type
            .as_deref()
            .and_then(DeviceType::from_fabric_str)
    }

    fn conditions(&self) -> &[Condition] {
        self.res_spec
            .as_ref()
            .map(|s| s.condition.as_slice())
            .unwrap_or(&[])
    }

    fn has_model(&self, model: &str) -> bool {
        self.conditions().iter().any(|c| {
            c.column.as_deref() == Some("model")
                && c.operator.as_deref() == Some("eq")
                && c.value.as_deref() == Some(model)
        })
    }

    fn matches(&self, r: &ComposableResource) -> bool {
        self.kind() == Some(r.device_type) && self.has_model(&r.model)
    }
}

fn tenant_query(f: &Fabric<'_, impl Host + ?Sized>) -> String {
    format!("tenant_uuid={}", encode::component(&f.config().tenant_id))
}

fn machine_path(f: &Fabric<'_, impl Host + ?Sized>, machine: &str) -> String {
    format!(
        "fabric_manager/api/v1/machines/{}?{}",
        encode::component(machine),
        tenant_query(f)
    )
}

fn update_path(f: &Fabric<'_, impl Host + ?Sized>, machine: &str) -> String {
    format!(
        "fabric_manager/api/v1/machines/{}/update?{}",
        encode::component(machine),
        tenant_query(f)
    )
}

/// The machine as the fabric reports it: the entry whose `mach_uuid` is `machine`, or
/// the first when none carries that uuid.
pub fn read_machine<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    machine: &str,
) -> Result<Machine, ProviderError> {
    let reply: MachinesReply = f.call_json(
        Method::Get,
        &machine_path(f, machine),
        None,
        "machine reply",
    )?;
    pick_machine(reply, machine)
}

fn pick_machine(reply: MachinesReply, machine: &str) -> Result<Machine, ProviderError> {
    let data = reply
        .data
        .ok_or_else(|| ProviderError::malformed("machine reply has no 'data'"))?;
    let mut machines = data.machines;
    if machines.is_empty() {
        return Err(ProviderError::NotFound(format!(
            "the fabric reports no machine {machine}"
        )));
    }
    let at = machines
        .iter()
        .position(|m| m.mach_uuid.as_deref() == Some(machine))
        .unwrap_or(0);
    Ok(machines.swap_remove(at))
}

/// Whether a device on the machine may be adopted for the request: of the requested
/// type and model, with both ids, not held by another ComposableResource, not handed
/// by this provider to another resource, and not critical (a critical orphan is left
/// for an administrator; the resource gets a healthy device).
fn adoptable<'a>(
    machine: &'a Machine,
    req: &AddRequest,
    handed_to: impl Fn(&str) -> Option<String>,
) -> Option<&'a Resource> {
    let r = &req.resource;
    machine.resources.iter().find(|res| {
        let (Some(serial), Some(uuid)) = (present(&res.res_serial_num), present(&res.res_uuid))
        else {
            return false;
        };
        res.matches(r)
            && !req.claimed_by_another(serial)
            && !req.claimed_by_another(uuid)
            && handed_to(serial).is_none_or(|owner| owner == r.name)
            && !matches!(
                health::parse(res.res_op_status.as_deref(), serial),
                Ok(OpStatus::Critical) | Err(_)
            )
    })
}

/// Attaches a device for the request. With `known_claims` (a contract 0.2.0 host) a
/// retry of a noted attempt first adopts a device a lost reply left on the machine
/// (see the module docs).
pub fn add<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    req: &AddRequest,
    machine: &str,
    known_claims: bool,
) -> Result<AddOutcome, ProviderError> {
    let host = f.host();
    let retry = known_claims && host.state_get(&attempt_key(&req.attempt_key)).is_some();
    if retry && let Some(outcome) = adopt_after_lost_reply(f, req, machine)? {
        return Ok(outcome);
    }
    // Noted before the request goes out: if its reply is lost, the retry adopts.
    if known_claims {
        note_attempt(host, req);
    }
    let outcome = attach_one(f, &req.resource, machine)?;
    if known_claims {
        note_answered(host, req);
    }
    Ok(outcome)
}

/// A device of the request's kind on the machine that no resource holds, taken as the
/// one an earlier attach of this attempt got (its reply was lost).
fn adopt_after_lost_reply<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    req: &AddRequest,
    machine: &str,
) -> Result<Option<AddOutcome>, ProviderError> {
    let r = &req.resource;
    let m = read_machine(f, machine)?;
    let Some(res) = adoptable(&m, req, |id| HANDED.holder(f.host(), id)) else {
        return Ok(None);
    };
    let outcome = outcome_of(f, res, r, machine)?;
    f.host().log(
        LogLevel::Info,
        &format!(
            "machine {machine} already holds unclaimed {} '{}' {}; adopted for {} instead of attaching another (an earlier attach's reply was lost)",
            r.device_type,
            r.model,
            present(&res.res_serial_num).unwrap_or_default(),
            r.name
        ),
    );
    note_answered(f.host(), req);
    Ok(Some(outcome))
}

/// How long an attempt stays noted after it was answered: a retry of it within that
/// time (the answer lost on its way to the operator's record: a restarted operator asks
/// again within seconds) gets the same device. Short, because these notes share the
/// state store's entries with the notes of attaches in flight.
const ANSWERED_TTL_MS: u64 = 2 * 60 * 1000;

/// Keeps the attempt noted, for a while, after it was answered: the same attempt asked
/// again adopts the device it got (handed to this resource) instead of attaching
/// another.
fn note_answered<H: Host + ?Sized>(host: &H, req: &AddRequest) {
    // A refusal (the state store full) only loses that protection, as for a first note.
    let _ = host.state_set(
        &attempt_key(&req.attempt_key),
        req.resource.name.as_bytes(),
        Some(ANSWERED_TTL_MS),
    );
}

fn note_attempt<H: Host + ?Sized>(host: &H, req: &AddRequest) {
    let r = &req.resource;
    if !host.state_set(
        &attempt_key(&req.attempt_key),
        r.name.as_bytes(),
        Some(HANDOUT_TTL_MS),
    ) {
        host.log(
            LogLevel::Warn,
            &format!(
                "the host refused to note attach attempt {} of {}: a lost reply would not be adopted by the provider",
                req.attempt_key, r.name
            ),
        );
    }
}

/// PATCHes the machine for one device of the resource's type and model, and checks the
/// reply names such a device.
fn attach_one<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    r: &ComposableResource,
    machine: &str,
) -> Result<AddOutcome, ProviderError> {
    let body = json!({"tenants": {
        "tenant_uuid": f.config().tenant_id,
        "machines": [{
            "mach_uuid": machine,
            "resources": [{"res_specs": [{
                "res_type": r.device_type.as_fabric_str(),
                "res_spec": {"condition": [{"column": "model", "operator": "eq", "value": r.model}]},
                "res_num": 1,
            }]}],
        }],
    }});
    let reply: MachinesReply = f.call_json(
        Method::Patch,
        &update_path(f, machine),
        Some(&body),
        "attach reply",
    )?;
    let res = reply
        .data
        .and_then(|d| d.machines.into_iter().next())
        .and_then(|m| m.resources.into_iter().next())
        .ok_or_else(|| ProviderError::malformed("attach reply lists no resource"))?;
    if !res.matches(r) {
        return Err(ProviderError::malformed(format!(
            "attach reply's first resource is type '{}' model '{}', not the requested {} '{}'",
            res.res_type.as_deref().unwrap_or(""),
            model_of(res.conditions()).unwrap_or(""),
            r.device_type,
            r.model
        )));
    }
    outcome_of(f, &res, r, machine)
}

/// The resource's outcome for a device on the machine (attached or adopted), recorded
/// as handed out to it.
fn outcome_of<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    res: &Resource,
    r: &ComposableResource,
    machine: &str,
) -> Result<AddOutcome, ProviderError> {
    let serial = present(&res.res_serial_num)
        .ok_or_else(|| ProviderError::malformed("attached resource has no res_serial_num"))?;
    let uuid = present(&res.res_uuid)
        .ok_or_else(|| ProviderError::malformed("attached resource has no res_uuid"))?;
    match health::parse(res.res_op_status.as_deref(), serial)? {
        OpStatus::Ok => {}
        OpStatus::Warning => f.host().log(
            LogLevel::Warn,
            &format!("attached device {serial} ({uuid}) reports a warning"),
        ),
        OpStatus::Critical => {
            return Err(ProviderError::Critical(format!(
                "attached device {serial} ({uuid}) reports a critical state"
            )));
        }
    }
    HANDED.hand(f.host(), serial, &r.name);
    Ok(AddOutcome::Attached(AttachedDevice {
        device_id: serial.to_string(),
        fabric_device_id: uuid.to_string(),
        machine_id: Some(machine.to_string()),
    }))
}

pub fn remove<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    r: &ComposableResource,
    machine: &str,
) -> Result<RemoveOutcome, ProviderError> {
    let fabric_id = present(&r.fabric_device_id);
    let device_id = present(&r.device_id);
    if fabric_id.is_none() && device_id.is_none() {
        f.host().log(
            LogLevel::Info,
            &format!("{} holds no device id; nothing to detach", r.name),
        );
        return Ok(RemoveOutcome::Removed);
    }
    let m = read_machine(f, machine)?;
    let found = m.resources.iter().find(|res| match fabric_id {
        Some(id) => present(&res.res_uuid) == Some(id),
        None => present(&res.res_serial_num) == device_id,
    });
    let Some(res) = found else {
        f.host().log(
            LogLevel::Info,
            &format!(
                "device {} of {} is no longer on machine {machine}; already detached",
                device_id.or(fabric_id).unwrap_or(""),
                r.name
            ),
        );
        return Ok(RemoveOutcome::Removed);
    };
    let uuid = present(&res.res_uuid)
        .ok_or_else(|| ProviderError::malformed("machine lists the device without res_uuid"))?;
    let res_type = present(&res.res_type).unwrap_or(r.device_type.as_fabric_str());
    let body = json!({"tenants": {
        "tenant_uuid": f.config().tenant_id,
        "machines": [{
            "mach_uuid": machine,
            "resources": [{"res_specs": [{"res_type": res_type, "res_uuid": uuid, "res_num": 1}]}],
        }],
    }});
    f.call(Method::Delete, &update_path(f, machine), Some(&body))?;
    if let Some(serial) = present(&res.res_serial_num) {
        HANDED.release(f.host(), serial);
    }
    Ok(RemoveOutcome::Removed)
}

pub fn check<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    r: &ComposableResource,
    machine: &str,
) -> Result<(), ProviderError> {
    let device_id = present(&r.device_id)
        .ok_or_else(|| ProviderError::NotFound(format!("{} holds no device id", r.name)))?;
    let m = read_machine(f, machine)?;
    let res = m
        .resources
        .iter()
        .find(|res| res.matches(r) && present(&res.res_serial_num) == Some(device_id))
        .ok_or_else(|| {
            ProviderError::NotFound(format!(
                "device {device_id} ({} '{}') is not attached to machine {machine}",
                r.device_type, r.model
            ))
        })?;
    health::check(res.res_op_status.as_deref(), device_id)
}

/// Every managed device on one machine.
pub fn devices<H: Host + ?Sized>(
    f: &Fabric<'_, H>,
    node: &str,
    machine: &str,
) -> Result<Vec<DeviceInfo>, ProviderError> {
    let m = read_machine(f, machine)?;
    Ok(m.resources
        .iter()
        .filter_map(|res| {
            let device_type = res.kind()?;
            match (present(&res.res_serial_num), present(&res.res_uuid)) {
                (Some(serial), Some(uuid)) => Some(DeviceInfo {
                    node: node.to_string(),
                    machine_id: machine.to_string(),
                    device_type,
                    model: model_of(res.conditions()).unwrap_or_default().to_string(),
                    device_id: serial.to_string(),
                    fabric_device_id: uuid.to_string(),
                }),
                _ => {
                    f.host().log(
                        LogLevel::Warn,
                        &format!(
                            "machine {machine} lists a {device_type} without serial or res_uuid; skipped"
                        ),
                    );
                    None
                }
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_machine_with_the_uuid() {
        let reply: MachinesReply = serde_json::from_str(
            r#"{"data":{"machines":[{"mach_uuid":"a"},{"mach_uuid":"b","resources":[{}]}]}}"#,
        )
        .unwrap();
        let m = pick_machine(reply, "b").unwrap();
        assert_eq!(m.mach_uuid.as_deref(), Some("b"));
        assert_eq!(m.resources.len(), 1);
    }

    #[test]
    fn lenient_scalars_and_nulls() {
        let reply: MachinesReply = serde_json::from_str(
            r#"{"data":{"machines":[{"mach_uuid":null,"resources":[{"res_op_status":0,"res_spec":null,"res_type":"GPU"}]}]}}"#,
        )
        .unwrap();
        let m = pick_machine(reply, "x").unwrap();
        assert_eq!(m.resources[0].res_op_status.as_deref(), Some("0"));
        assert_eq!(m.resources[0].kind(), Some(DeviceType::Gpu));
        assert!(m.resources[0].conditions().is_empty());
    }

    fn machine_with(devices: &[(&str, &str, &str, &str)]) -> Machine {
        let resources: Vec<serde_json::Value> = devices
            .iter()
            .map(|(serial, res_type, model, status)| {
                json!({"res_uuid": format!("uuid-{serial}"), "res_serial_num": serial,
                    "res_type": res_type, "res_op_status": status,
                    "res_spec": {"condition": [{"column": "model", "operator": "eq", "value": model}]}})
            })
            .collect();
        serde_json::from_value(json!({"mach_uuid": "m", "resources": resources})).unwrap()
    }

    fn request(name: &str, claims: &[(&str, &str)]) -> AddRequest {
        let mut req = AddRequest::new(ComposableResource {
            name: name.into(),
            device_type: DeviceType::Gpu,
            model: "A100".into(),
            target_node: "n".into(),
            device_id: None,
            fabric_device_id: None,
            machine_id: None,
            force_detach: false,
        });
        req.claims = claims
            .iter()
            .map(|(resource, id)| crate::model::Claim {
                resource: resource.to_string(),
                device_id: Some(id.to_string()),
                fabric_device_id: None,
            })
            .collect();
        req
    }

    fn adopted(m: &Machine, req: &AddRequest, handed: &[(&str, &str)]) -> Option<String> {
        adoptable(m, req, |id| {
            handed
                .iter()
                .find(|(d, _)| *d == id)
                .map(|(_, owner)| owner.to_string())
        })
        .and_then(|res| res.res_serial_num.clone())
    }

    #[test]
    fn adopts_an_unclaimed_device_of_the_model_only() {
        let m = machine_with(&[
            ("held", "gpu", "A100", "0"),
            ("other-model", "gpu", "H100", "0"),
            ("memory", "cxlmemory", "A100", "0"),
            ("orphan", "gpu", "A100", "0"),
        ]);
        let req = request("mine", &[("theirs", "held")]);
        assert_eq!(adopted(&m, &req, &[]).as_deref(), Some("orphan"));
        // Claimed by the fabric id works as well as by the serial.
        let mut by_uuid = request("mine", &[]);
        by_uuid.claims.push(crate::model::Claim {
            resource: "theirs".into(),
            device_id: None,
            fabric_device_id: Some("uuid-held".into()),
        });
        assert_eq!(adopted(&m, &by_uuid, &[]).as_deref(), Some("orphan"));
        // Every matching device held: nothing to adopt, attach a new one.
        let all_held = request("mine", &[("theirs", "held"), ("else", "orphan")]);
        assert_eq!(adopted(&m, &all_held, &[]), None);
    }

    #[test]
    fn a_device_handed_to_another_resource_or_critical_is_not_adopted() {
        let m = machine_with(&[("a", "gpu", "A100", "0"), ("b", "gpu", "A100", "2")]);
        let req = request("mine", &[]);
        // Handed to another resource whose ids the operator has not stored yet.
        assert_eq!(adopted(&m, &req, &[("a", "theirs")]), None);
        // Handed to this resource: a retry gets it back.
        assert_eq!(adopted(&m, &req, &[("a", "mine")]).as_deref(), Some("a"));
        // The resource's own claim does not keep it from its device.
        let own = request("mine", &[("mine", "a")]);
        assert_eq!(adopted(&m, &own, &[]).as_deref(), Some("a"));
        // The critical device is left alone.
        let m = machine_with(&[("b", "gpu", "A100", "2"), ("c", "gpu", "A100", "")]);
        assert_eq!(adopted(&m, &req, &[]), None);
    }

    #[test]
    fn no_machine_is_not_found_and_no_data_is_malformed() {
        let empty: MachinesReply = serde_json::from_str(r#"{"data":{"machines":[]}}"#).unwrap();
        assert!(matches!(
            pick_machine(empty, "m"),
            Err(ProviderError::NotFound(_))
        ));
        let none: MachinesReply = serde_json::from_str(r#"{}"#).unwrap();
        assert!(matches!(
            pick_machine(none, "m"),
            Err(ProviderError::MalformedReply(_))
        ));
    }
}

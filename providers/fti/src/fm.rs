//! The Fabric Manager API: synchronous attach (PATCH), detach (DELETE) and machine
//! reads (GET) under `fabric_manager/api/v1/machines/<machine>`, with `tenant_uuid`.

use serde::Deserialize;
use serde_json::json;

use crate::encode;
use crate::fabric::Fabric;
use crate::health::{self, OpStatus};
use crate::host::{Host, LogLevel, Method};
use crate::lenient::{self, present};
use crate::model::{
    AddOutcome, AttachedDevice, ComposableResource, DeviceInfo, DeviceType, ProviderError,
    RemoveOutcome,
};

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

pub fn add<H: Host + ?Sized>(
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

//! Native tests of the vendor logic over a fake host.

mod cm;
mod fake;
mod fm;
mod machine;
mod props;
mod token;

use fti_provider::{ComposableResource, DeviceType};
use serde_json::{Value, json};

pub const MACHINE: &str = "9a7c1e2e-0000-4000-8000-000000000001";
pub const FM_MACHINE_PATH: &str =
    "fabric_manager/api/v1/machines/9a7c1e2e-0000-4000-8000-000000000001";
pub const MODEL: &str = "A100 40G";

pub fn gpu(name: &str, node: &str) -> ComposableResource {
    ComposableResource {
        name: name.into(),
        device_type: DeviceType::Gpu,
        model: MODEL.into(),
        target_node: node.into(),
        device_id: None,
        fabric_device_id: None,
        machine_id: None,
        force_detach: false,
    }
}

pub fn attached(name: &str, node: &str, serial: &str, uuid: &str) -> ComposableResource {
    ComposableResource {
        device_id: Some(serial.into()),
        fabric_device_id: Some(uuid.into()),
        ..gpu(name, node)
    }
}

/// One FM resource entry.
pub fn fm_res(serial: &str, uuid: &str, kind: &str, model: &str, op: &str) -> Value {
    json!({
        "res_uuid": uuid, "res_name": format!("{kind}-{uuid}"), "res_type": kind,
        "res_status": 0, "res_op_status": op, "res_serial_num": serial,
        "res_spec": {"condition": [{"column": "model", "operator": "eq", "value": model}]}
    })
}

/// An FM machine reply holding `resources`.
pub fn fm_machine(machine: &str, resources: Vec<Value>) -> Value {
    json!({"data": {"machines": [{
        "fabric_uuid": "fab-1", "fabric_id": 1, "mach_uuid": machine, "mach_id": 3,
        "mach_name": "m", "tenant_uuid": "tenant-1", "mach_status": 0, "mach_status_detail": "",
        "resources": resources
    }]}})
}

/// One CM device entry.
pub fn cm_dev(id: &str, uuid: &str, status: &str, op: &str) -> Value {
    json!({"device_id": id, "status": status, "status_reason": format!("reason of {id}"),
        "detail": {"fabric_uuid": "fab-1", "fabric_id": 1, "res_uuid": uuid, "fabr_gid": "g",
            "res_type": "gpu", "res_name": "n", "res_status": 0, "res_op_status": op,
            "resspecs": [{"resspec_uuid": "rs", "productname": "p", "model": MODEL, "vendor": "v", "removable": true}],
            "tenant_uuid": "tenant-1", "mach_uuid": MACHINE}})
}

/// A CM resource spec.
pub fn cm_spec(spec_uuid: &str, kind: &str, model: &str, count: u64, devices: Vec<Value>) -> Value {
    json!({"spec_uuid": spec_uuid, "type": kind,
        "selector": {"version": "1", "expression": {"conditions": [{"column": "model", "operator": "eq", "value": model}]}},
        "min_resspec_count": 0, "max_resspec_count": 8, "device_count": count, "devices": devices})
}

/// A CM machine reply holding `specs`.
pub fn cm_machine(machine: &str, specs: Vec<Value>) -> Value {
    json!({"data": {"tenant_uuid": "tenant-1", "cluster": {"cluster_uuid": "cluster-1", "machine": {
        "uuid": machine, "name": "m", "status": "ok", "status_reason": "", "resspecs": specs}}}})
}

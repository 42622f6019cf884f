//! Fabric Manager: `fabric_manager/api/v1/machines[/<machine>[/update |
//! /available-reserved-resources]]`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use serde_json::{Value, json};

use super::{ApiError, bad_request, codes, json_reply, model_condition, parse_json, query_param};
use crate::faults::Fault;
use crate::record::Route;
use crate::shared::{Shared, lock};
use crate::state::{AttachOptions, DeviceStatus, FabricError, Machine, SimDevice};

fn resource_json(d: &SimDevice) -> Value {
    json!({
        "res_uuid": d.res_uuid,
        "res_name": d.res_name,
        "res_type": d.res_type,
        "res_status": 0,
        "res_op_status": d.op_status,
        "res_serial_num": d.serial,
        "res_spec": {"condition": [{"column": "model", "operator": "eq", "value": d.model}]},
    })
}

/// The machine object; devices in `first` lead the resource list (attach replies).
fn machine_json(s: &Shared, m: &Machine, first: &[SimDevice]) -> Value {
    let rest = m
        .devices()
        .filter(|d| d.status != DeviceStatus::AddFailed)
        .filter(|d| !first.iter().any(|f| f.res_uuid == d.res_uuid));
    let resources: Vec<Value> = first.iter().chain(rest).map(resource_json).collect();
    json!({
        "fabric_uuid": s.fabric_uuid,
        "fabric_id": m.fabric_id,
        "mach_uuid": m.uuid,
        "mach_id": m.mach_id,
        "mach_name": m.name,
        "tenant_uuid": s.tenant_id,
        "mach_status": 0,
        "mach_status_detail": "",
        "resources": resources,
    })
}

fn reply(s: &Shared, mach: &str, first: &[SimDevice]) -> Result<Response, ApiError> {
    let mut fabric = lock(&s.fabric);
    fabric.settle(Some(Instant::now()));
    let m = fabric
        .machine(mach)
        .ok_or_else(|| FabricError::UnknownMachine(mach.to_string()))?;
    Ok(json_reply(
        200,
        &json!({"data": {"machines": [machine_json(s, m, first)]}}),
    ))
}

fn check_tenant(s: &Shared, query: Option<&str>) -> Result<(), ApiError> {
    match query_param(query, "tenant_uuid") {
        None => Err(bad_request("query parameter tenant_uuid is required")),
        Some(t) if t == s.tenant_id => Ok(()),
        Some(t) => Err(ApiError::new(
            403,
            codes::FORBIDDEN_TENANT,
            format!("tenant {t} is not accessible"),
        )),
    }
}

/// The single `res_specs` entry of `{"tenants": {"tenant_uuid", "machines": [{"mach_uuid",
/// "resources": [{"res_specs": [..]}]}]}}`, after checking tenant and machine.
fn res_spec<'a>(s: &Shared, body: &'a Value, mach: &str) -> Result<&'a Value, ApiError> {
    let tenants = body
        .get("tenants")
        .ok_or_else(|| bad_request("body has no tenants"))?;
    if tenants.get("tenant_uuid").and_then(Value::as_str) != Some(s.tenant_id.as_str()) {
        return Err(bad_request("tenants.tenant_uuid does not match the tenant"));
    }
    let machine = tenants
        .get("machines")
        .and_then(|m| m.get(0))
        .ok_or_else(|| bad_request("tenants.machines is empty"))?;
    if machine.get("mach_uuid").and_then(Value::as_str) != Some(mach) {
        return Err(bad_request("machines[0].mach_uuid does not match the path"));
    }
    machine
        .get("resources")
        .and_then(|r| r.get(0))
        .and_then(|r| r.get("res_specs"))
        .and_then(|r| r.get(0))
        .ok_or_else(|| bad_request("machines[0].resources[0].res_specs[0] is missing"))
}

fn res_num(spec: &Value) -> Result<usize, ApiError> {
    spec.get("res_num")
        .and_then(Value::as_u64)
        .filter(|n| *n >= 1)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| bad_request("res_num must be a positive integer"))
}

pub(crate) async fn get_machine(
    State(s): State<Arc<Shared>>,
    Path(mach): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    check_tenant(&s, query.as_deref())?;
    reply(&s, &mach, &[])
}

/// Every machine of the tenant, with its fabric and devices.
pub(crate) async fn list_machines(
    State(s): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    check_tenant(&s, query.as_deref())?;
    let mut fabric = lock(&s.fabric);
    fabric.settle(Some(Instant::now()));
    let machines: Vec<Value> = fabric
        .machines()
        .map(|m| machine_json(&s, m, &[]))
        .collect();
    Ok(json_reply(200, &json!({"data": {"machines": machines}})))
}

/// How many free devices of a type and model the machine's fabric holds:
/// `?tenant_uuid=..&res_type=..&condition={"column":"model","operator":"eq","value":..}`
/// → `{"fabric_id": N, "reserved_res_num_per_fabric": K}`. Like the real API, every
/// parameter is required and a condition that is not one `model eq` is refused.
pub(crate) async fn available(
    State(s): State<Arc<Shared>>,
    Path(mach): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    check_tenant(&s, query.as_deref())?;
    let res_type = query_param(query.as_deref(), "res_type")
        .ok_or_else(|| bad_request("query parameter res_type is required"))?;
    let condition = query_param(query.as_deref(), "condition")
        .ok_or_else(|| bad_request("query parameter condition is required"))?;
    let condition: Value = serde_json::from_str(&condition)
        .map_err(|e| bad_request(format!("condition is not JSON: {e}")))?;
    let model = model_condition(Some(&Value::Array(vec![condition]))).ok_or_else(|| {
        bad_request(
            "condition must be {\"column\": \"model\", \"operator\": \"eq\", \"value\": ..}",
        )
    })?;
    let mut fabric = lock(&s.fabric);
    fabric.settle(Some(Instant::now()));
    let fabric_id = fabric
        .machine(&mach)
        .map(|m| m.fabric_id)
        .ok_or_else(|| FabricError::UnknownMachine(mach.clone()))?;
    let free = fabric.free_in(fabric_id, &res_type, &model);
    Ok(json_reply(
        200,
        &json!({"fabric_id": fabric_id, "reserved_res_num_per_fabric": free}),
    ))
}

pub(crate) async fn attach(
    State(s): State<Arc<Shared>>,
    Path(mach): Path<String>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    check_tenant(&s, query.as_deref())?;
    let body = parse_json(&body)?;
    let spec = res_spec(&s, &body, &mach)?;
    let res_type = spec
        .get("res_type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad_request("res_type is missing"))?;
    let model = model_condition(spec.get("res_spec").and_then(|r| r.get("condition")))
        .ok_or_else(|| bad_request("res_spec.condition has no model eq condition"))?;
    let n = res_num(spec)?;

    let opts = {
        AttachOptions {
            no_free: s
                .take_fault(Route::FmAttach, |f| *f == Fault::NoFreeDevice)
                .is_some(),
            op_status: match s
                .take_fault(Route::FmAttach, |f| matches!(f, Fault::AttachOpStatus(_)))
            {
                Some(Fault::AttachOpStatus(op)) => Some(op),
                _ => None,
            },
            fail_reason: None,
        }
    };
    let attached = {
        let mut fabric = lock(&s.fabric);
        fabric.settle(Some(Instant::now()));
        fabric.fm_attach(&mach, res_type, &model, n, &opts)?
    };
    reply(&s, &mach, &attached)
}

pub(crate) async fn detach(
    State(s): State<Arc<Shared>>,
    Path(mach): Path<String>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Result<Response, ApiError> {
    check_tenant(&s, query.as_deref())?;
    let body = parse_json(&body)?;
    let spec = res_spec(&s, &body, &mach)?;
    let res_uuid = spec
        .get("res_uuid")
        .and_then(Value::as_str)
        .ok_or_else(|| bad_request("res_uuid is missing"))?;
    let res_type = spec.get("res_type").and_then(Value::as_str);
    {
        let mut fabric = lock(&s.fabric);
        fabric.settle(Some(Instant::now()));
        fabric.fm_detach(&mach, res_uuid, res_type)?;
    }
    reply(&s, &mach, &[])
}

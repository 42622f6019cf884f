//! Cluster Manager:
//! `cluster_manager/cluster_autoscaler/v3/tenants/<t>/clusters/<c>/machines/<m>[/actions/resize]`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::Response;
use serde_json::{Value, json};

use super::{ApiError, bad_request, codes, json_reply, parse_json};
use crate::faults::Fault;
use crate::record::Route;
use crate::shared::{Shared, lock};
use crate::state::{AttachOptions, Fabric, FabricError, Machine, SimDevice};

fn vendor(res_type: &str) -> &'static str {
    if res_type.eq_ignore_ascii_case("gpu") {
        "NVIDIA"
    } else {
        "GENERIC"
    }
}

fn device_json(s: &Shared, spec_uuid: &str, d: &SimDevice, mach: &str) -> Value {
    json!({
        "device_id": d.serial,
        "status": d.status.as_str(),
        "status_reason": d.status_reason,
        "detail": {
            "fabric_uuid": s.fabric_uuid,
            "fabric_id": 1,
            "res_uuid": d.res_uuid,
            "fabr_gid": format!("{}-{}", s.fabric_uuid, d.res_name),
            "res_type": d.res_type,
            "res_name": d.res_name,
            "res_status": 0,
            "res_op_status": d.op_status,
            "resspecs": [{
                "resspec_uuid": spec_uuid,
                "productname": d.model,
                "model": d.model,
                "vendor": vendor(&d.res_type),
                "removable": true,
            }],
            "tenant_uuid": s.tenant_id,
            "mach_uuid": mach,
        },
    })
}

fn machine_json(s: &Shared, fabric: &Fabric, m: &Machine) -> Value {
    let resspecs: Vec<Value> = fabric
        .specs()
        .map(|(key, spec_uuid)| {
            let devices: Vec<Value> = m
                .devices()
                .filter(|d| d.res_type == key.0 && d.model == key.1)
                .map(|d| device_json(s, spec_uuid, d, &m.uuid))
                .collect();
            json!({
                "spec_uuid": spec_uuid,
                "type": key.0,
                "selector": {"version": "1", "expression": {"conditions": [
                    {"column": "model", "operator": "eq", "value": key.1}
                ]}},
                "min_resspec_count": 0,
                "max_resspec_count": fabric.max_per_spec,
                "device_count": fabric.cm_count(m, key),
                "devices": devices,
            })
        })
        .collect();
    json!({"data": {
        "tenant_uuid": s.tenant_id,
        "cluster": {
            "cluster_uuid": s.cluster_id,
            "machine": {
                "uuid": m.uuid,
                "name": m.name,
                "status": if m.busy() { "RESIZING" } else { "ACTIVE" },
                "status_reason": "",
                "resspecs": resspecs,
            },
        },
    }})
}

fn reply(s: &Shared, code: u16, mach: &str) -> Result<Response, ApiError> {
    let mut fabric = lock(&s.fabric);
    fabric.settle(Some(Instant::now()));
    let m = fabric
        .machine(mach)
        .ok_or_else(|| FabricError::UnknownMachine(mach.to_string()))?;
    Ok(json_reply(code, &machine_json(s, &fabric, m)))
}

fn check_scope(s: &Shared, tenant: &str, cluster: &str) -> Result<(), ApiError> {
    if tenant != s.tenant_id || cluster != s.cluster_id {
        return Err(ApiError::new(
            404,
            codes::NOT_FOUND,
            format!("cluster {cluster} of tenant {tenant} not found"),
        ));
    }
    Ok(())
}

pub(crate) async fn get_machine(
    State(s): State<Arc<Shared>>,
    Path((tenant, cluster, mach)): Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    check_scope(&s, &tenant, &cluster)?;
    reply(&s, 200, &mach)
}

fn spec_and_count(req: &Value) -> Result<(String, u32), ApiError> {
    let spec = req
        .get("spec_uuid")
        .and_then(Value::as_str)
        .ok_or_else(|| bad_request("spec_uuid is missing"))?;
    let count = req
        .get("device_count")
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| bad_request("device_count must be a non-negative integer"))?;
    Ok((spec.to_string(), count))
}

pub(crate) async fn resize(
    State(s): State<Arc<Shared>>,
    Path((tenant, cluster, mach)): Path<(String, String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    check_scope(&s, &tenant, &cluster)?;
    let body = parse_json(&body)?;
    match (
        body.get("increase_resource_count"),
        body.get("remove_resources"),
    ) {
        (Some(inc), None) => increase(&s, &mach, inc)?,
        (None, Some(rem)) => remove(&s, &mach, rem)?,
        _ => {
            return Err(bad_request(
                "body needs exactly one of increase_resource_count and remove_resources",
            ));
        }
    }
    reply(&s, 202, &mach)
}

fn increase(s: &Shared, mach: &str, req: &Value) -> Result<(), ApiError> {
    let (spec, count) = spec_and_count(req)?;
    let opts = {
        AttachOptions {
            no_free: s
                .take_fault(Route::CmResize, |f| *f == Fault::NoFreeDevice)
                .is_some(),
            op_status: match s
                .take_fault(Route::CmResize, |f| matches!(f, Fault::AttachOpStatus(_)))
            {
                Some(Fault::AttachOpStatus(op)) => Some(op),
                _ => None,
            },
            fail_reason: match s
                .take_fault(Route::CmResize, |f| matches!(f, Fault::CmAddFailed { .. }))
            {
                Some(Fault::CmAddFailed { reason }) => Some(reason),
                _ => None,
            },
        }
    };
    let mut fabric = lock(&s.fabric);
    let now = Instant::now();
    fabric.settle(Some(now));
    fabric.cm_increase(mach, &spec, count, &opts, now)?;
    Ok(())
}

fn remove(s: &Shared, mach: &str, req: &Value) -> Result<(), ApiError> {
    let (spec, count) = spec_and_count(req)?;
    let devices: Vec<String> = req
        .get("devices")
        .and_then(Value::as_array)
        .ok_or_else(|| bad_request("remove_resources.devices must be an array"))?
        .iter()
        .map(|d| d.as_str().map(String::from))
        .collect::<Option<_>>()
        .ok_or_else(|| bad_request("remove_resources.devices must hold device ids"))?;
    let fail_reason = match s.take_fault(Route::CmResize, |f| {
        matches!(f, Fault::CmRemoveFailed { .. })
    }) {
        Some(Fault::CmRemoveFailed { reason }) => Some(reason),
        _ => None,
    };
    let mut fabric = lock(&s.fabric);
    let now = Instant::now();
    fabric.settle(Some(now));
    fabric.cm_remove(mach, &spec, count, &devices, fail_reason, now)?;
    Ok(())
}

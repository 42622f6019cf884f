//! The CDIM resources as JSON and the request dispatch (no sockets: `server` calls
//! [`handle`] with a whole request). Replies follow the OSS CDIM API reference
//! (project-cdim/docs, `api-reference/en/*/openapi.yaml`) for the envelopes, statuses
//! and error codes; the procedure fields and the fabric topology are the NEC CDI
//! Solution's, as the Go operator's client sends and reads them.

use std::time::{Instant, SystemTime};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::faults::Fault;
use crate::route::{Route, Service};
use crate::shared::{Shared, lock};
use crate::state::{Apply, ApplyError, Fate, Operation, Procedure, Resource, ResourceKind, State};

/// A whole request.
pub struct Req {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub body: Vec<u8>,
}

/// A whole reply.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Reply {
    fn ok(status: u16, body: Value) -> Reply {
        Reply { status, body }
    }
}

/// A CDIM error reply: `{"code", "message"}`.
pub fn error(status: u16, code: &str, message: &str) -> Reply {
    Reply {
        status,
        body: json!({"code": code, "message": message}),
    }
}

fn timestamp(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// `device` of a resource.
fn device_json(state: &State, r: &Resource) -> Value {
    let attribute = match r.kind {
        ResourceKind::HostAdapter => json!({"deviceSpecificInformation": {"status": "eesv"}}),
        ResourceKind::IoAdapter => json!({"deviceSpecificInformation": {"status": "eeio"}}),
        ResourceKind::Gpu | ResourceKind::Cpu => json!({}),
    };
    let links: Vec<Value> = state
        .links_of(r)
        .into_iter()
        .map(|(t, id)| json!({"type": t, "deviceID": id}))
        .collect();
    json!({
        "deviceID": r.id,
        "type": r.kind.device_type(),
        "model": r.model,
        "attribute": attribute,
        "status": {"state": r.state, "health": r.health},
        "powerState": "On",
        "deviceSwitchInfo": "",
        "links": links,
    })
}

/// A resource entry (`/resources`, `/resources/{id}`), with its node ids.
fn resource_json(state: &State, r: &Resource) -> Value {
    json!({
        "device": device_json(state, r),
        "resourceGroupIDs": ["00000000-0000-7000-8000-000000000000"],
        "annotation": {"available": true},
        "detected": r.detected,
        "nodeIDs": state.node_of(r).into_iter().collect::<Vec<_>>(),
    })
}

/// The representative items only (`detail` false or absent).
fn summary_json(r: &Resource) -> Value {
    json!({
        "device": {
            "deviceID": r.id,
            "type": r.kind.device_type(),
            "status": {"state": r.state, "health": r.health},
        },
        "detected": r.detected,
    })
}

/// A node and the resources linked to it, in ascending id order.
fn node_json(state: &State, node: &str, detail: bool) -> Value {
    let Some(n) = state.nodes.get(node) else {
        return Value::Null;
    };
    let mut ids: Vec<&String> = vec![&n.cpu, &n.host_adapter, &n.io_adapter];
    let gpus: Vec<String> = state.gpus_of(node).iter().map(|g| g.id.clone()).collect();
    ids.extend(gpus.iter());
    ids.sort();
    let resources: Vec<Value> = ids
        .into_iter()
        .filter_map(|id| state.resources.get(id))
        .map(|r| {
            if detail {
                let mut v = resource_json(state, r);
                // A resource is linked to one node: the node list has no node ids.
                if let Some(o) = v.as_object_mut() {
                    o.remove("nodeIDs");
                }
                v
            } else {
                summary_json(r)
            }
        })
        .collect();
    json!({"id": n.id, "resources": resources})
}

fn apply_json(a: &Apply) -> Value {
    let procedures: Vec<Value> = a
        .procedures
        .iter()
        .map(|p| {
            json!({
                "operationID": p.operation_id,
                "operation": p.operation.as_str(),
                "sourceDeviceID": p.source,
                "destinationDeviceID": p.destination,
                "dependencies": p.dependencies,
            })
        })
        .collect();
    let results: Vec<Value> = a
        .results
        .iter()
        .map(|r| {
            let mut v = json!({"operationID": r.operation_id, "status": r.status});
            if let Some(m) = &r.message {
                v["responseBody"] = json!({"code": "E40026", "message": m});
            }
            v
        })
        .collect();
    let mut v = json!({
        "applyID": a.id,
        "status": a.status.as_str(),
        "procedures": procedures,
        "applyResult": results,
        "startedAt": timestamp(a.started_at),
    });
    if let Some(end) = a.ended_at {
        v["endedAt"] = json!(timestamp(end));
    }
    if let Some(rb) = a.rollback_status {
        v["rollbackStatus"] = json!(rb);
        v["executeRollback"] = json!(true);
        if let Some(end) = a.ended_at {
            v["canceledAt"] = json!(timestamp(end));
        }
    }
    v
}

/// The `detail` query parameter: absent is false; anything but true/false (any case)
/// or another parameter is a 400, as the configuration manager answers.
fn detail(query: Option<&str>) -> Result<bool, Reply> {
    let mut detail = false;
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "detail" if v.eq_ignore_ascii_case("true") => detail = true,
            "detail" if v.eq_ignore_ascii_case("false") || v.is_empty() => detail = false,
            "detail" => {
                return Err(error(
                    400,
                    "E00001",
                    &format!("detail must be true or false, not {v:?}"),
                ));
            }
            other => {
                return Err(error(
                    400,
                    "E00001",
                    &format!("unknown query parameter {other:?}"),
                ));
            }
        }
    }
    Ok(detail)
}

fn no_query(query: Option<&str>) -> Result<(), Reply> {
    match query.filter(|q| !q.is_empty()) {
        None => Ok(()),
        Some(q) => Err(error(
            400,
            "E00001",
            &format!("this resource takes no query parameters, got {q:?}"),
        )),
    }
}

fn last_segment(path: &str) -> &str {
    path.trim_end_matches('/').rsplit('/').next().unwrap_or("")
}

/// The body of `POST /layout-apply`, read strictly: unknown fields are refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApplyRequest {
    procedures: Vec<ProcedureBody>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ProcedureBody {
    #[serde(rename = "operationID")]
    operation_id: u64,
    operation: String,
    #[serde(rename = "sourceDeviceID")]
    source_device_id: String,
    #[serde(rename = "destinationDeviceID")]
    destination_device_id: String,
    dependencies: Vec<u64>,
}

fn parse_apply(body: &[u8]) -> Result<Vec<Procedure>, Reply> {
    let req: ApplyRequest = serde_json::from_slice(body)
        .map_err(|e| error(400, "E40001", &format!("Invalid request body: {e}")))?;
    let mut out = Vec::new();
    for p in req.procedures {
        let operation = match p.operation.as_str() {
            "connect" => Operation::Connect,
            "disconnect" => Operation::Disconnect,
            other => {
                return Err(error(
                    400,
                    "E40001",
                    &format!(
                        "Invalid request body: operation {other:?} is not one this simulator carries out (connect, disconnect)"
                    ),
                ));
            }
        };
        if out
            .iter()
            .any(|q: &Procedure| q.operation_id == p.operation_id)
        {
            return Err(error(
                400,
                "E40001",
                &format!("Invalid request body: operationID {} twice", p.operation_id),
            ));
        }
        out.push(Procedure {
            operation_id: p.operation_id,
            operation,
            source: p.source_device_id,
            destination: p.destination_device_id,
            dependencies: p.dependencies,
        });
    }
    Ok(out)
}

/// Answers one request to `service`.
pub fn handle(shared: &Shared, service: Service, req: &Req, route: Option<Route>) -> Reply {
    let Some(route) = route else {
        return error(
            404,
            "E00404",
            &format!(
                "{} {} is not served by the {}",
                req.method,
                req.path,
                match service {
                    Service::ConfigurationManager => "configuration manager",
                    Service::LayoutApply => "layout-apply service",
                }
            ),
        );
    };
    let now = Instant::now();
    let mut state = lock(&shared.state);
    state.advance(now);
    let query = req.query.as_deref();
    let result = match route {
        Route::Resources => detail(query).map(|detail| {
            let resources: Vec<Value> = state
                .resources
                .values()
                .map(|r| {
                    if detail {
                        resource_json(&state, r)
                    } else {
                        summary_json(r)
                    }
                })
                .collect();
            Reply::ok(
                200,
                json!({"count": resources.len(), "resources": resources}),
            )
        }),
        Route::Resource => no_query(query).map(|()| {
            let id = last_segment(&req.path);
            match state.resources.get(id) {
                Some(r) => Reply::ok(200, resource_json(&state, r)),
                None => error(404, "E00002", &format!("resource {id} not found")),
            }
        }),
        Route::Nodes => detail(query).map(|detail| {
            let nodes: Vec<Value> = state
                .nodes
                .keys()
                .map(|id| node_json(&state, id, detail))
                .collect();
            Reply::ok(200, json!({"count": nodes.len(), "nodes": nodes}))
        }),
        Route::Node => no_query(query).map(|()| {
            let id = last_segment(&req.path);
            if state.nodes.contains_key(id) {
                Reply::ok(200, node_json(&state, id, true))
            } else {
                error(404, "E00002", &format!("node {id} not found"))
            }
        }),
        Route::LayoutApply => no_query(query).and_then(|()| {
            let procedures = parse_apply(&req.body)?;
            let fate = match shared
                .controls
                .take_fault(Some(&Route::LayoutApply), Fault::is_apply_fate)
            {
                Some(Fault::ApplyFails(m)) => Fate::Fail(m),
                Some(Fault::ApplyRollsBack) => Fate::RollBack,
                _ => Fate::Apply,
            };
            let delay = *lock(&shared.apply_delay);
            match state.post_apply(procedures, now, delay, fate) {
                Ok(id) => Ok(Reply::ok(202, json!({"applyID": id}))),
                Err(e @ ApplyError::AlreadyRunning) => Ok(error(409, "E40010", &e.to_string())),
                Err(ApplyError::Invalid(m)) => {
                    Ok(error(400, "E40001", &format!("Invalid request body: {m}")))
                }
            }
        }),
        Route::ApplyStatus => no_query(query).map(|()| {
            let id = last_segment(&req.path);
            match state.applies.get(id) {
                Some(a) => Reply::ok(200, apply_json(a)),
                None => error(404, "E40020", &format!("Specified {id} is not found.")),
            }
        }),
    };
    result.unwrap_or_else(|reply| reply)
}

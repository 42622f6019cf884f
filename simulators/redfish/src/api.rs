//! The Redfish resources as JSON and the request dispatch (no sockets: `server` calls
//! [`handle`] with a whole request).

use std::time::Instant;

use serde_json::{Value, json};

use crate::faults::Fault;
use crate::route::Route;
use crate::shared::{Shared, lock};
use crate::state::{Block, BlockKind, ComposeError, State, System, Task, TaskState};

pub const ROOT: &str = "/redfish/v1";
pub const BLOCKS: &str = "/redfish/v1/CompositionService/ResourceBlocks";
pub const ZONE: &str = "/redfish/v1/CompositionService/ResourceZones/1";
pub const SYSTEMS: &str = "/redfish/v1/Systems";
pub const SESSIONS: &str = "/redfish/v1/SessionService/Sessions";
pub const TASKS: &str = "/redfish/v1/TaskService/Tasks";
pub const MONITORS: &str = "/redfish/v1/TaskService/TaskMonitors";
/// The Base message registry version of every message id.
pub const BASE: &str = "Base.1.16.0";

/// A whole request.
pub struct Req {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Req {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A whole reply.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Option<Value>,
    /// An XML body instead of JSON (only `$metadata`).
    pub xml: Option<String>,
}

/// Headers every reply carries.
fn standard_headers() -> Vec<(String, String)> {
    vec![
        ("OData-Version".into(), "4.0".into()),
        ("Cache-Control".into(), "no-cache".into()),
    ]
}

/// The DMTF JSON schema a resource of `odata_type` is described by.
fn described_by(odata_type: &str) -> Option<String> {
    let t = odata_type.strip_prefix('#')?;
    let mut parts = t.split('.');
    let namespace = parts.next()?;
    let version = parts.next().filter(|v| v.starts_with('v'));
    Some(match version {
        Some(v) => {
            format!("<http://redfish.dmtf.org/schemas/v1/{namespace}.{v}.json>; rel=describedby")
        }
        None => format!("<http://redfish.dmtf.org/schemas/v1/{namespace}.json>; rel=describedby"),
    })
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Reply {
        let mut headers = standard_headers();
        if let Some(etag) = body.get("@odata.etag").and_then(Value::as_str) {
            headers.push(("ETag".into(), etag.to_string()));
        }
        if let Some(link) = body
            .get("@odata.type")
            .and_then(Value::as_str)
            .and_then(described_by)
        {
            headers.push(("Link".into(), link));
        }
        Reply {
            status,
            headers,
            body: Some(body),
            xml: None,
        }
    }

    fn with_header(mut self, k: &str, v: String) -> Reply {
        self.headers.push((k.into(), v));
        self
    }

    fn empty(status: u16) -> Reply {
        Reply {
            status,
            headers: standard_headers(),
            body: None,
            xml: None,
        }
    }
}

/// A Redfish error reply: `error.code` and one `@Message.ExtendedInfo` entry.
pub fn error(status: u16, message_id: &str, message: &str, args: &[&str]) -> Reply {
    let id = if message_id.contains('.') {
        message_id.to_string()
    } else {
        format!("{BASE}.{message_id}")
    };
    Reply::json(
        status,
        json!({"error": {
            "code": id,
            "message": message,
            "@Message.ExtendedInfo": [{
                "@odata.type": "#Message.v1_1_1.Message",
                "MessageId": id,
                "Message": message,
                "MessageArgs": args,
                "Severity": if status >= 500 { "Critical" } else { "Warning" },
                "MessageSeverity": if status >= 500 { "Critical" } else { "Warning" },
                "Resolution": resolution(message_id),
            }],
        }}),
    )
}

fn resolution(message_id: &str) -> &'static str {
    match message_id {
        "NoValidSession" => {
            "Establish a session (POST to the Sessions collection) and send its X-Auth-Token."
        }
        "ResourceMissingAtURI" => "Use a URI the service lists.",
        "MalformedJSON" => "Send a valid JSON object.",
        "PreconditionFailed" => "Read the resource again and retry with its current ETag.",
        _ => "None.",
    }
}

fn odata_ref(id: &str) -> Value {
    json!({"@odata.id": id})
}

fn etag(version: u64) -> String {
    format!("W/\"{version}\"")
}

fn collection(odata_id: &str, odata_type: &str, name: &str, members: Vec<String>) -> Value {
    json!({
        "@odata.id": odata_id,
        "@odata.type": odata_type,
        "Name": name,
        "Members@odata.count": members.len(),
        "Members": members.iter().map(|m| odata_ref(m)).collect::<Vec<_>>(),
    })
}

fn block_uri(id: &str) -> String {
    format!("{BLOCKS}/{id}")
}

fn system_uri(id: &str) -> String {
    format!("{SYSTEMS}/{id}")
}

fn device_uri(b: &Block) -> Option<String> {
    match b.kind {
        BlockKind::Gpu => Some(format!("{}/Processors/GPU0", block_uri(&b.id))),
        BlockKind::CxlMemory => Some(format!("{}/Memory/CXL0", block_uri(&b.id))),
        BlockKind::Compute => None,
    }
}

fn block_json(b: &Block) -> Value {
    let mut v = json!({
        "@odata.id": block_uri(&b.id),
        "@odata.type": "#ResourceBlock.v1_4_2.ResourceBlock",
        "@odata.etag": etag(b.version),
        "Id": b.id,
        "Name": format!("{} block {}", b.kind.redfish_type(), b.id),
        "ResourceBlockType": [b.kind.redfish_type()],
        "Status": {"State": "Enabled", "Health": b.health},
        "CompositionStatus": {
            "CompositionState": b.state.as_str(),
            "Reserved": false,
            "SharingCapable": false,
        },
        "Links": {
            "ComputerSystems": b.system.iter().map(|s| odata_ref(&system_uri(s))).collect::<Vec<_>>(),
            "Zones": [odata_ref(ZONE)],
        },
    });
    match (b.kind, device_uri(b)) {
        (BlockKind::Gpu, Some(d)) => {
            v["Processors"] = json!([odata_ref(&d)]);
            v["Processors@odata.count"] = json!(1);
        }
        (BlockKind::CxlMemory, Some(d)) => {
            v["Memory"] = json!([odata_ref(&d)]);
            v["Memory@odata.count"] = json!(1);
        }
        _ => {}
    }
    v
}

fn device_json(b: &Block) -> Option<Value> {
    let uri = device_uri(b)?;
    let status = json!({"State": "Enabled", "Health": b.health});
    Some(match b.kind {
        BlockKind::Gpu => json!({
            "@odata.id": uri,
            "@odata.type": "#Processor.v1_18_0.Processor",
            "Id": "GPU0",
            "Name": "GPU",
            "ProcessorType": "GPU",
            "Model": b.model,
            "SerialNumber": b.serial,
            "UUID": b.uuid,
            "Status": status,
        }),
        _ => json!({
            "@odata.id": uri,
            "@odata.type": "#Memory.v1_19_0.Memory",
            "Id": "CXL0",
            "Name": "CXL memory",
            "MemoryType": "DRAM",
            "Model": b.model,
            "SerialNumber": b.serial,
            "CapacityMiB": b.capacity_mib,
            "Status": status,
        }),
    })
}

fn system_json(s: &System) -> Value {
    json!({
        "@odata.id": system_uri(&s.id),
        "@odata.type": "#ComputerSystem.v1_22_0.ComputerSystem",
        "@odata.etag": etag(s.version),
        "Id": s.id,
        "Name": s.id,
        "SystemType": "Composed",
        "UUID": s.uuid,
        "PowerState": "On",
        "Status": {"State": "Enabled", "Health": "OK"},
        "Links": {
            "ResourceBlocks": s.blocks.iter().map(|b| odata_ref(&block_uri(b))).collect::<Vec<_>>(),
            "ResourceBlocks@odata.count": s.blocks.len(),
        },
    })
}

fn task_json(t: &Task) -> Value {
    json!({
        "@odata.id": format!("{TASKS}/{}", t.id),
        "@odata.type": "#Task.v1_7_3.Task",
        "Id": t.id.to_string(),
        "Name": format!("Recompose system {}", t.system),
        "TaskState": t.state.as_str(),
        "TaskStatus": match t.state { TaskState::Exception => "Critical", _ => "OK" },
        "PercentComplete": if t.state == TaskState::Running { 50 } else { 100 },
        "TaskMonitor": format!("{MONITORS}/{}", t.id),
        "Messages": [{
            "MessageId": match t.state {
                TaskState::Running => format!("{BASE}.Success"),
                TaskState::Completed => "TaskEvent.1.0.3.TaskCompletedOK".to_string(),
                TaskState::Exception => "TaskEvent.1.0.3.TaskAborted".to_string(),
            },
            "Message": t.message,
        }],
    })
}

fn service_root() -> Value {
    json!({
        "@odata.id": format!("{ROOT}/"),
        "@odata.type": "#ServiceRoot.v1_16_0.ServiceRoot",
        "Id": "RootService",
        "Name": "cro Redfish composition simulator",
        "RedfishVersion": "1.18.0",
        "UUID": "6f8a1c2e-5b1d-4c55-9c1e-2d7f0e9a0001",
        "SessionService": odata_ref("/redfish/v1/SessionService"),
        "CompositionService": odata_ref("/redfish/v1/CompositionService"),
        "Systems": odata_ref(SYSTEMS),
        "TaskService": odata_ref("/redfish/v1/TaskService"),
        "AccountService": odata_ref(ACCOUNT_SERVICE),
        "Links": {"Sessions": odata_ref(SESSIONS)},
    })
}

fn not_found(path: &str) -> Reply {
    error(
        404,
        "ResourceMissingAtURI",
        &format!("The resource at the URI {path} was not found."),
        &[path],
    )
}

fn method_not_allowed(method: &str, path: &str) -> Reply {
    error(
        405,
        "OperationNotAllowed",
        &format!("The {method} method is not allowed on {path}."),
        &[],
    )
    .with_header("Allow", "GET".into())
}

fn parse_object(body: &[u8]) -> Result<serde_json::Map<String, Value>, Reply> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(error(
            400,
            "MalformedJSON",
            "The request body must be a JSON object.",
            &[],
        )),
        Err(e) => Err(error(
            400,
            "MalformedJSON",
            &format!("The request body submitted was malformed JSON: {e}."),
            &[],
        )),
    }
}

/// Everything but `GET /redfish`, the service root, `odata`, `$metadata` and logging in
/// needs a session (or HTTP Basic credentials).
fn needs_session(route: Route, method: &str) -> bool {
    !(route == Route::ServiceRoot && method == "GET") && route != Route::CreateSession
}

/// `Authorization: Basic` with the service's credentials.
fn basic_auth_ok(shared: &Shared, req: &Req) -> bool {
    use base64::Engine as _;
    let Some(encoded) = req
        .header("Authorization")
        .and_then(|v| v.strip_prefix("Basic "))
    else {
        return false;
    };
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
        return false;
    };
    let expected = format!("{}:{}", shared.config.username, shared.config.password);
    decoded == expected.as_bytes()
}

/// The methods a route serves (the `Allow` header).
fn allowed(route: Route, path: &str) -> &'static str {
    match route {
        Route::SessionService if path.ends_with("/Sessions") => "GET, POST",
        Route::Session => "GET, DELETE",
        Route::System | Route::SystemPatch => "GET, PATCH",
        Route::CreateSession => "GET, POST",
        _ => "GET",
    }
}

const METADATA: &str = include_str!("metadata.xml");

const ACCOUNT_SERVICE: &str = "/redfish/v1/AccountService";
const ACCOUNTS: &str = "/redfish/v1/AccountService/Accounts";
const ROLES: &str = "/redfish/v1/AccountService/Roles";

/// The standard roles every Redfish service has, with their privileges.
const PREDEFINED_ROLES: &[(&str, &[&str])] = &[
    (
        "Administrator",
        &[
            "Login",
            "ConfigureManager",
            "ConfigureUsers",
            "ConfigureSelf",
            "ConfigureComponents",
        ],
    ),
    (
        "Operator",
        &["Login", "ConfigureSelf", "ConfigureComponents"],
    ),
    ("ReadOnly", &["Login", "ConfigureSelf"]),
];

/// The AccountService, read-only (ours): the one account the simulator is started
/// with, an Administrator, and the predefined roles. Accounts are not created or
/// changed through the API.
fn account_service(shared: &Shared, segs: &[&str], path: &str) -> Reply {
    match segs {
        ["AccountService"] => Reply::json(
            200,
            json!({
                "@odata.id": ACCOUNT_SERVICE,
                "@odata.type": "#AccountService.v1_15_0.AccountService",
                "Id": "AccountService", "Name": "Account Service",
                "ServiceEnabled": true,
                "Accounts": odata_ref(ACCOUNTS),
                "Roles": odata_ref(ROLES),
            }),
        ),
        ["AccountService", "Accounts"] => Reply::json(
            200,
            collection(
                ACCOUNTS,
                "#ManagerAccountCollection.ManagerAccountCollection",
                "Accounts",
                vec![format!("{ACCOUNTS}/1")],
            ),
        ),
        ["AccountService", "Accounts", "1"] => Reply::json(
            200,
            json!({
                "@odata.id": format!("{ACCOUNTS}/1"),
                "@odata.type": "#ManagerAccount.v1_12_0.ManagerAccount",
                // Never changes: accounts are read-only here.
                "@odata.etag": etag(1),
                "Id": "1", "Name": "User Account",
                "UserName": shared.config.username,
                "Password": null,
                "RoleId": "Administrator",
                "Enabled": true,
                "Locked": false,
                "Links": {"Role": odata_ref(&format!("{ROLES}/Administrator"))},
            }),
        ),
        ["AccountService", "Roles"] => Reply::json(
            200,
            collection(
                ROLES,
                "#RoleCollection.RoleCollection",
                "Roles",
                PREDEFINED_ROLES
                    .iter()
                    .map(|(id, _)| format!("{ROLES}/{id}"))
                    .collect(),
            ),
        ),
        ["AccountService", "Roles", id] => match PREDEFINED_ROLES.iter().find(|(r, _)| r == id) {
            Some((role, privileges)) => Reply::json(
                200,
                json!({
                    "@odata.id": format!("{ROLES}/{role}"),
                    "@odata.type": "#Role.v1_3_2.Role",
                    "Id": role, "Name": format!("{role} role"),
                    "RoleId": role,
                    "IsPredefined": true,
                    "AssignedPrivileges": privileges,
                }),
            ),
            None => not_found(path),
        },
        _ => not_found(path),
    }
}

/// Serves one request.
pub(crate) fn handle(shared: &Shared, req: &Req, route: Option<Route>) -> Reply {
    let mut reply = dispatch(shared, req, route);
    if let Some(route) = route
        && reply.status < 300
    {
        reply.headers.push((
            "Allow".into(),
            allowed(route, req.path.trim_end_matches('/')).into(),
        ));
    }
    reply
}

fn dispatch(shared: &Shared, req: &Req, route: Option<Route>) -> Reply {
    let now = Instant::now();
    let Some(route) = route else {
        return not_found(&req.path);
    };
    if let Some(refused) =
        refuse_odata_version(req).or_else(|| refuse_session(shared, req, route, now))
    {
        return refused;
    }
    let mut state = lock(&shared.state);
    state.advance(now);
    let path = req.path.trim_end_matches('/');
    let segs: Vec<&str> = path.split('/').skip(3).collect();
    let method = req.method.as_str();
    match (method, route) {
        ("GET", Route::ServiceRoot) => root_document(path),
        ("GET", Route::SessionService) => session_service(shared, &state, &segs),
        ("POST", Route::CreateSession) => create_session(shared, &mut state, req, now),
        ("GET" | "DELETE", Route::Session) => session(&mut state, method, &segs, path),
        ("GET", Route::AccountService) => account_service(shared, &segs, path),
        ("GET", Route::CompositionService) => composition_service(&state, &segs, path),
        ("GET", Route::ResourceBlocks) => Reply::json(
            200,
            collection(
                BLOCKS,
                "#ResourceBlockCollection.ResourceBlockCollection",
                "Resource Blocks",
                state.blocks.keys().map(|b| block_uri(b)).collect(),
            ),
        ),
        ("GET", Route::ResourceBlock) => resource_block(&state, req, &segs, path),
        ("GET", Route::Systems) => Reply::json(
            200,
            collection(
                SYSTEMS,
                "#ComputerSystemCollection.ComputerSystemCollection",
                "Computer Systems",
                state.systems.keys().map(|s| system_uri(s)).collect(),
            ),
        ),
        ("POST", Route::Systems) => error(
            405,
            "OperationNotAllowed",
            "This service does not compose new systems: expand or reduce an existing system \
             by PATCHing its Links.ResourceBlocks.",
            &[],
        )
        .with_header("Allow", "GET".into()),
        ("GET", Route::System) => match state.systems.get(segs[1]) {
            Some(s) => conditional(req, Reply::json(200, system_json(s))),
            None => not_found(path),
        },
        ("PATCH", Route::SystemPatch) => patch_system(shared, &mut state, req, segs[1], now),
        ("GET", Route::TaskMonitor) => task_monitor(&mut state, &segs, path),
        ("GET", Route::Task) => task_service(&state, &segs, path),
        _ => method_not_allowed(method, path),
    }
}

/// 412 for an `OData-Version` other than 4.0.
fn refuse_odata_version(req: &Req) -> Option<Reply> {
    let v = req.header("OData-Version")?;
    (v.trim() != "4.0").then(|| {
        error(
            412,
            "PreconditionFailed",
            &format!("OData-Version {v} is not supported; this service speaks 4.0."),
            &[],
        )
    })
}

/// 401 for a request that needs a session and has neither a live one (which it keeps
/// alive) nor Basic credentials.
fn refuse_session(shared: &Shared, req: &Req, route: Route, now: Instant) -> Option<Reply> {
    if !needs_session(route, &req.method) || basic_auth_ok(shared, req) {
        return None;
    }
    let token = req.header("X-Auth-Token").unwrap_or_default().to_string();
    let valid = !token.is_empty()
        && lock(&shared.state).touch_session(&token, now, shared.config.session_timeout);
    (!valid).then(|| {
        error(
            401,
            "NoValidSession",
            "There is no valid session established with the implementation.",
            &[],
        )
        .with_header("WWW-Authenticate", "X-Auth-Token".into())
    })
}

/// `/redfish`, the service root, its OData service document and `$metadata`.
fn root_document(path: &str) -> Reply {
    match path {
        "/redfish" => Reply::json(200, json!({"v1": "/redfish/v1/"})),
        "/redfish/v1/$metadata" => Reply {
            status: 200,
            headers: standard_headers(),
            body: None,
            xml: Some(METADATA.to_string()),
        },
        "/redfish/v1/odata" => Reply::json(
            200,
            json!({"@odata.context": "/redfish/v1/$metadata", "value": [
                {"name": "Service", "kind": "Singleton", "url": "/redfish/v1/"},
                {"name": "Systems", "kind": "Singleton", "url": SYSTEMS},
                {"name": "SessionService", "kind": "Singleton", "url": "/redfish/v1/SessionService"},
                {"name": "CompositionService", "kind": "Singleton", "url": "/redfish/v1/CompositionService"},
                {"name": "TaskService", "kind": "Singleton", "url": "/redfish/v1/TaskService"},
                {"name": "AccountService", "kind": "Singleton", "url": ACCOUNT_SERVICE},
            ]}),
        ),
        _ => Reply::json(200, service_root()),
    }
}

/// The SessionService and its collection of sessions.
fn session_service(shared: &Shared, state: &State, segs: &[&str]) -> Reply {
    match segs {
        ["SessionService"] => Reply::json(
            200,
            json!({
                "@odata.id": "/redfish/v1/SessionService",
                "@odata.type": "#SessionService.v1_1_9.SessionService",
                "Id": "SessionService", "Name": "Session Service",
                "ServiceEnabled": true,
                "SessionTimeout": shared.config.session_timeout.as_secs(),
                "Sessions": odata_ref(SESSIONS),
            }),
        ),
        _ => Reply::json(
            200,
            collection(
                SESSIONS,
                "#SessionCollection.SessionCollection",
                "Sessions",
                state
                    .sessions
                    .keys()
                    .map(|id| format!("{SESSIONS}/{id}"))
                    .collect(),
            ),
        ),
    }
}

/// One session: GET shows it, DELETE ends it.
fn session(state: &mut State, method: &str, segs: &[&str], path: &str) -> Reply {
    let id = segs.last().copied().unwrap_or_default();
    match state.sessions.get(id).cloned() {
        None => not_found(path),
        Some(_) if method == "DELETE" => {
            state.sessions.remove(id);
            Reply::empty(204)
        }
        Some(s) => Reply::json(
            200,
            json!({
                "@odata.id": format!("{SESSIONS}/{}", s.id),
                "@odata.type": "#Session.v1_7_0.Session",
                "Id": s.id, "Name": "User Session", "UserName": s.user,
            }),
        ),
    }
}

/// The CompositionService and its one resource zone.
fn composition_service(state: &State, segs: &[&str], path: &str) -> Reply {
    match segs {
        ["CompositionService"] => Reply::json(
            200,
            json!({
                "@odata.id": "/redfish/v1/CompositionService",
                "@odata.type": "#CompositionService.v1_2_2.CompositionService",
                "Id": "CompositionService", "Name": "Composition Service",
                "ServiceEnabled": true,
                "AllowOverprovisioning": false,
                "AllowZoneAffinity": true,
                "Status": {"State": "Enabled", "Health": "OK"},
                "ResourceBlocks": odata_ref(BLOCKS),
                "ResourceZones": odata_ref("/redfish/v1/CompositionService/ResourceZones"),
            }),
        ),
        ["CompositionService", "ResourceZones"] => Reply::json(
            200,
            collection(
                "/redfish/v1/CompositionService/ResourceZones",
                "#ZoneCollection.ZoneCollection",
                "Resource Zones",
                vec![ZONE.into()],
            ),
        ),
        ["CompositionService", "ResourceZones", "1"] => Reply::json(
            200,
            json!({
                "@odata.id": ZONE,
                "@odata.type": "#Zone.v1_6_1.Zone",
                "Id": "1", "Name": "Resource zone 1",
                "ZoneType": "ZoneOfResourceBlocks",
                "Status": {"State": "Enabled", "Health": "OK"},
                "Links": {"ResourceBlocks": state.blocks.keys().map(|b| odata_ref(&block_uri(b))).collect::<Vec<_>>()},
            }),
        ),
        _ => not_found(path),
    }
}

/// A resource block, its device collection (Processors or Memory) and its device.
fn resource_block(state: &State, req: &Req, segs: &[&str], path: &str) -> Reply {
    let block = segs.get(2).and_then(|id| state.blocks.get(*id));
    match (block, &segs[3..]) {
        (Some(b), []) => conditional(req, Reply::json(200, block_json(b))),
        (Some(b), ["Processors"] | ["Memory"]) if device_uri(b).is_some() => {
            let kind = segs[3];
            let members: Vec<String> = device_uri(b)
                .into_iter()
                .filter(|u| u.contains(&format!("/{kind}/")))
                .collect();
            if members.is_empty() {
                not_found(path)
            } else {
                Reply::json(
                    200,
                    collection(
                        path,
                        &format!("#{kind}Collection.{kind}Collection"),
                        kind,
                        members,
                    ),
                )
            }
        }
        (Some(b), [_, _]) if device_uri(b).as_deref() == Some(path) => {
            device_json(b).map_or_else(|| not_found(path), |d| Reply::json(200, d))
        }
        _ => not_found(path),
    }
}

/// A task monitor: 202 while its task runs, then once the task's outcome (the system,
/// or the error), then gone.
fn task_monitor(state: &mut State, segs: &[&str], path: &str) -> Reply {
    let id = segs[2].parse::<u64>().ok();
    match id.and_then(|id| state.tasks.get_mut(&id)) {
        Some(t) if t.monitor_open => match t.state {
            TaskState::Running => Reply::json(202, task_json(t))
                .with_header("Location", format!("{MONITORS}/{}", t.id))
                .with_header("Retry-After", "1".into()),
            TaskState::Completed => {
                t.monitor_open = false;
                let system = t.system.clone();
                match state.systems.get(&system) {
                    Some(s) => Reply::json(200, system_json(s)),
                    None => not_found(path),
                }
            }
            TaskState::Exception => {
                t.monitor_open = false;
                error(500, "GeneralError", &t.message.clone(), &[])
            }
        },
        _ => not_found(path),
    }
}

/// The TaskService, its collection of tasks and each task.
fn task_service(state: &State, segs: &[&str], path: &str) -> Reply {
    match segs {
        ["TaskService"] => Reply::json(
            200,
            json!({
                "@odata.id": "/redfish/v1/TaskService",
                "@odata.type": "#TaskService.v1_2_1.TaskService",
                "Id": "TaskService", "Name": "Task Service",
                "ServiceEnabled": true,
                "Tasks": odata_ref(TASKS),
            }),
        ),
        ["TaskService", "Tasks"] => Reply::json(
            200,
            collection(
                TASKS,
                "#TaskCollection.TaskCollection",
                "Tasks",
                state.tasks.keys().map(|t| format!("{TASKS}/{t}")).collect(),
            ),
        ),
        [_, _, id] => match id.parse::<u64>().ok().and_then(|id| state.tasks.get(&id)) {
            Some(t) => Reply::json(200, task_json(t)),
            None => not_found(path),
        },
        _ => not_found(path),
    }
}

/// `If-None-Match` with the current ETag: 304 without a body.
fn conditional(req: &Req, reply: Reply) -> Reply {
    let current = reply
        .headers
        .iter()
        .find(|(k, _)| k == "ETag")
        .map(|(_, v)| v.clone());
    match (req.header("If-None-Match"), current) {
        (Some(asked), Some(current)) if asked == current => Reply {
            status: 304,
            headers: reply.headers,
            body: None,
            xml: None,
        },
        _ => reply,
    }
}

fn create_session(shared: &Shared, state: &mut State, req: &Req, now: Instant) -> Reply {
    let body = match parse_object(&req.body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    for key in body.keys() {
        if key != "UserName" && key != "Password" {
            return error(
                400,
                "PropertyUnknown",
                &format!(
                    "The property {key} is not in the list of valid properties for the resource."
                ),
                &[key],
            );
        }
    }
    let (Some(user), Some(password)) = (
        body.get("UserName").and_then(Value::as_str),
        body.get("Password").and_then(Value::as_str),
    ) else {
        return error(
            400,
            "PropertyMissing",
            "The properties UserName and Password are required to create a session.",
            &["UserName", "Password"],
        );
    };
    if user != shared.config.username || password != shared.config.password {
        return error(
            401,
            "NoValidSession",
            "The user name or password is not valid.",
            &[],
        );
    }
    let session = state.new_session(user, now);
    let uri = format!("{SESSIONS}/{}", session.id);
    Reply::json(
        201,
        json!({
            "@odata.id": uri,
            "@odata.type": "#Session.v1_7_0.Session",
            "Id": session.id, "Name": "User Session", "UserName": user,
        }),
    )
    .with_header("X-Auth-Token", session.token)
    .with_header("Location", uri)
}

/// PATCH of a system: only `Links.ResourceBlocks` is writable; the list is the system's
/// new set of blocks.
fn patch_system(shared: &Shared, state: &mut State, req: &Req, id: &str, now: Instant) -> Reply {
    let path = system_uri(id);
    let Some(system) = state.systems.get(id) else {
        return not_found(&path);
    };
    if let Some(refused) = refuse_if_match(req, system.version) {
        return refused;
    }
    let wanted = match parse_object(&req.body).and_then(|body| wanted_blocks(&body)) {
        Ok(wanted) => wanted,
        Err(r) => return r,
    };
    let fails = match shared.controls.take_fault(Some(&Route::SystemPatch), |f| {
        matches!(f, Fault::ComposeFails(_))
    }) {
        Some(Fault::ComposeFails(reason)) => Some(reason),
        _ => None,
    };
    let delay = *lock(&shared.compose_delay);
    match state.recompose(id, &wanted, now, delay, fails) {
        Ok(None) => match state.systems.get(id) {
            Some(s) => Reply::json(200, system_json(s)),
            None => not_found(&path),
        },
        Ok(Some(task)) => match state.tasks.get(&task) {
            Some(t) => Reply::json(202, task_json(t))
                .with_header("Location", format!("{MONITORS}/{task}"))
                .with_header("Retry-After", "1".into()),
            None => error(500, "InternalError", "The task vanished.", &[]),
        },
        Err(e) => compose_error(&e),
    }
}

/// 412 for an `If-Match` that is neither `*` nor the system's current ETag.
fn refuse_if_match(req: &Req, version: u64) -> Option<Reply> {
    let asked = req.header("If-Match")?;
    (asked != "*" && asked != etag(version)).then(|| {
        error(
            412,
            "PreconditionFailed",
            "The ETag supplied did not match the ETag required to change this resource.",
            &[],
        )
    })
}

/// The blocks a PATCH body asks the system to have: `Links.ResourceBlocks` is the one
/// writable property, and it is required.
fn wanted_blocks(body: &serde_json::Map<String, Value>) -> Result<Vec<String>, Reply> {
    let mut wanted = None;
    for (key, value) in body {
        match key.as_str() {
            "Links" => {
                if let Some(ids) = linked_blocks(value)? {
                    wanted = Some(ids);
                }
            }
            "Id" | "Name" | "UUID" | "SystemType" | "Status" | "PowerState" => {
                return Err(error(
                    400,
                    "PropertyNotWritable",
                    &format!(
                        "The property {key} is a read only property and cannot be assigned a value."
                    ),
                    &[key],
                ));
            }
            _ => {
                return Err(error(
                    400,
                    "PropertyUnknown",
                    &format!(
                        "The property {key} is not in the list of valid properties for the resource."
                    ),
                    &[key],
                ));
            }
        }
    }
    wanted.ok_or_else(|| {
        error(
            400,
            "PropertyMissing",
            "The property Links/ResourceBlocks is required to recompose a system.",
            &["Links/ResourceBlocks"],
        )
    })
}

/// `Links` of a PATCH: only its `ResourceBlocks` may be written (the last one wins).
fn linked_blocks(links: &Value) -> Result<Option<Vec<String>>, Reply> {
    let Some(links) = links.as_object() else {
        return Err(error(
            400,
            "PropertyValueTypeError",
            "Links must be an object.",
            &["Links"],
        ));
    };
    let mut wanted = None;
    for (k, v) in links {
        if k != "ResourceBlocks" {
            return Err(error(
                400,
                "PropertyNotWritable",
                &format!(
                    "The property Links/{k} is a read only property and cannot be assigned a value."
                ),
                &[k],
            ));
        }
        wanted = Some(block_ids(v)?);
    }
    Ok(wanted)
}

fn compose_error(e: &ComposeError) -> Reply {
    let text = e.to_string();
    match e {
        ComposeError::NoSystem(_) => error(404, "ResourceMissingAtURI", &text, &[]),
        ComposeError::NoBlock(b) => error(
            400,
            "ResourceMissingAtURI",
            &format!("The resource at the URI {} was not found.", block_uri(b)),
            &[&block_uri(b)],
        ),
        ComposeError::InUse { .. } => error(409, "ResourceInUse", &text, &[]),
        ComposeError::ComputeBlock(_) => error(400, "PropertyValueConflict", &text, &[]),
        ComposeError::Busy(_) => error(409, "ResourceInUse", &text, &[]),
        ComposeError::Failed(_) => error(500, "GeneralError", &text, &[]),
    }
}

/// The block ids of a `ResourceBlocks` array of `{"@odata.id": ...}` references.
fn block_ids(v: &Value) -> Result<Vec<String>, Reply> {
    let bad = |what: &str| {
        error(
            400,
            "PropertyValueFormatError",
            &format!(
                "Links/ResourceBlocks: {what}; expected an array of {{\"@odata.id\": \"{BLOCKS}/<id>\"}}."
            ),
            &["Links/ResourceBlocks"],
        )
    };
    let Some(items) = v.as_array() else {
        return Err(bad("not an array"));
    };
    let mut ids = Vec::new();
    for item in items {
        let Some(uri) = item.get("@odata.id").and_then(Value::as_str) else {
            return Err(bad("an element has no @odata.id"));
        };
        if item.as_object().is_some_and(|o| o.len() != 1) {
            return Err(bad("an element has properties besides @odata.id"));
        }
        let Some(id) = uri
            .trim_end_matches('/')
            .strip_prefix(&format!("{BLOCKS}/"))
            .filter(|id| !id.is_empty() && !id.contains('/'))
        else {
            return Err(bad(&format!("{uri} is not a resource block")));
        };
        if !ids.iter().any(|i| i == id) {
            ids.push(id.to_string());
        }
    }
    Ok(ids)
}

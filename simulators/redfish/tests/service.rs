//! The Redfish simulator over real HTTP: sessions, links, composition, ETags, task
//! monitors, loud failures and injected faults.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use redfish_sim::{CompositionState, Fault, RedfishSim, Route, SimConfig};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const GPU_MODEL: &str = "NVIDIA A100 80GB";

struct Client {
    sim: RedfishSim,
    http: reqwest::Client,
    token: String,
}

struct Got {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Got {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The Redfish error's MessageId, checking the body's shape.
    fn message_id(&self) -> String {
        let e = &self.body["error"];
        let info = &e["@Message.ExtendedInfo"][0];
        assert!(e["message"].is_string(), "{}", self.body);
        assert_eq!(e["code"], info["MessageId"], "{}", self.body);
        info["MessageId"].as_str().unwrap_or_default().to_string()
    }
}

async fn send_raw(
    http: &reqwest::Client,
    sim: &RedfishSim,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Vec<u8>>,
    headers: &[(&str, &str)],
) -> Result<Got, reqwest::Error> {
    let url = format!("{}{}", sim.endpoint(), path.trim_start_matches('/'));
    let mut req = http.request(method, url);
    if let Some(t) = token {
        req = req.header("X-Auth-Token", t);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(b) = body {
        req = req.header("content-type", "application/json").body(b);
    }
    let resp = req.send().await?;
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.bytes().await?;
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
    };
    Ok(Got {
        status,
        headers,
        body,
    })
}

impl Client {
    async fn start(config: SimConfig) -> Client {
        let sim = RedfishSim::start(config).unwrap();
        // Plain HTTP, but reqwest still wants a rustls crypto provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let mut c = Client {
            sim,
            http,
            token: String::new(),
        };
        c.login().await;
        c
    }

    async fn login(&mut self) {
        let (user, password) = self.sim.credentials();
        let got = self
            .raw(
                Method::POST,
                "/redfish/v1/SessionService/Sessions",
                None,
                Some(json!({"UserName": user, "Password": password})),
            )
            .await;
        assert_eq!(got.status, StatusCode::CREATED, "{}", got.body);
        self.token = got.header("X-Auth-Token").unwrap().to_string();
    }

    async fn raw(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Got {
        send_raw(
            &self.http,
            &self.sim,
            method,
            path,
            token,
            body.map(|b| b.to_string().into_bytes()),
            &[],
        )
        .await
        .unwrap()
    }

    async fn get(&self, path: &str) -> Got {
        self.raw(Method::GET, path, Some(&self.token), None).await
    }

    async fn patch(&self, path: &str, body: Value) -> Got {
        self.raw(Method::PATCH, path, Some(&self.token), Some(body))
            .await
    }

    async fn try_patch(&self, path: &str, body: Value) -> Result<Got, reqwest::Error> {
        send_raw(
            &self.http,
            &self.sim,
            Method::PATCH,
            path,
            Some(&self.token),
            Some(body.to_string().into_bytes()),
            &[],
        )
        .await
    }
}

fn blocks(ids: &[&str]) -> Value {
    json!({"Links": {"ResourceBlocks": ids.iter()
        .map(|id| json!({"@odata.id": format!("/redfish/v1/CompositionService/ResourceBlocks/{id}")}))
        .collect::<Vec<_>>()}})
}

/// Every `@odata.id` inside a JSON value.
fn links(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                if k == "@odata.id" {
                    if let Some(s) = v.as_str() {
                        out.push(s.to_string());
                    }
                } else {
                    links(v, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| links(v, out)),
        _ => {}
    }
}

#[tokio::test]
async fn every_link_from_the_service_root_resolves_to_its_own_resource() {
    let c = Client::start(SimConfig::default()).await;
    c.sim.add_system("worker-0");
    c.sim.add_gpu_block(GPU_MODEL);
    c.sim.add_cxl_block("CXL 256GiB");
    let mut seen = BTreeSet::new();
    let mut queue = VecDeque::from(["/redfish/v1/".to_string()]);
    while let Some(uri) = queue.pop_front() {
        if !seen.insert(uri.trim_end_matches('/').to_string()) {
            continue;
        }
        let got = c.get(&uri).await;
        assert_eq!(got.status, StatusCode::OK, "{uri}: {}", got.body);
        assert_eq!(got.header("OData-Version"), Some("4.0"));
        assert_eq!(
            got.body["@odata.id"]
                .as_str()
                .map(|s| s.trim_end_matches('/')),
            Some(uri.trim_end_matches('/')),
            "{uri}"
        );
        assert!(
            got.body["@odata.type"]
                .as_str()
                .is_some_and(|t| t.starts_with('#')),
            "{uri}"
        );
        let mut found = Vec::new();
        links(&got.body, &mut found);
        queue.extend(found);
    }
    for expected in [
        "/redfish/v1/CompositionService/ResourceBlocks/GPU-1/Processors/GPU0",
        "/redfish/v1/CompositionService/ResourceBlocks/CXL-2/Memory/CXL0",
        "/redfish/v1/Systems/worker-0",
        "/redfish/v1/CompositionService/ResourceZones/1",
        "/redfish/v1/SessionService/Sessions/1",
    ] {
        assert!(seen.contains(expected), "{expected} not reached: {seen:?}");
    }
    let gpu = c
        .get("/redfish/v1/CompositionService/ResourceBlocks/GPU-1/Processors/GPU0")
        .await;
    assert_eq!(gpu.body["ProcessorType"], "GPU");
    assert_eq!(gpu.body["Model"], GPU_MODEL);
    assert!(
        gpu.body["SerialNumber"]
            .as_str()
            .unwrap()
            .starts_with("GPU-")
    );
}

#[tokio::test]
async fn sessions_are_required_and_end() {
    let c = Client::start(SimConfig::default()).await;
    // The service root is open; everything else needs a session.
    assert_eq!(
        c.raw(Method::GET, "/redfish/v1", None, None).await.status,
        StatusCode::OK
    );
    let denied = c.raw(Method::GET, "/redfish/v1/Systems", None, None).await;
    assert_eq!(denied.status, StatusCode::UNAUTHORIZED);
    assert!(denied.message_id().ends_with(".NoValidSession"));
    let forged = c
        .raw(Method::GET, "/redfish/v1/Systems", Some("forged"), None)
        .await;
    assert_eq!(forged.status, StatusCode::UNAUTHORIZED);

    let wrong = c
        .raw(
            Method::POST,
            "/redfish/v1/SessionService/Sessions",
            None,
            Some(json!({"UserName": "admin", "Password": "wrong"})),
        )
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let missing = c
        .raw(
            Method::POST,
            "/redfish/v1/SessionService/Sessions",
            None,
            Some(json!({"UserName": "admin"})),
        )
        .await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert!(missing.message_id().ends_with(".PropertyMissing"));

    let me = c.get("/redfish/v1/SessionService/Sessions/1").await;
    assert_eq!(me.body["UserName"], "admin");
    assert!(me.body.get("Password").is_none());
    // Log out: the token stops working.
    let out = c
        .raw(
            Method::DELETE,
            "/redfish/v1/SessionService/Sessions/1",
            Some(&c.token),
            None,
        )
        .await;
    assert_eq!(out.status, StatusCode::NO_CONTENT);
    assert_eq!(
        c.get("/redfish/v1/Systems").await.status,
        StatusCode::UNAUTHORIZED
    );

    let mut c = c;
    c.login().await;
    assert_eq!(c.get("/redfish/v1/Systems").await.status, StatusCode::OK);
    c.sim.expire_sessions();
    assert_eq!(
        c.get("/redfish/v1/Systems").await.status,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn an_idle_session_times_out() {
    let mut c = Client::start(SimConfig {
        session_timeout: Duration::from_millis(300),
        ..SimConfig::default()
    })
    .await;
    assert_eq!(c.get("/redfish/v1/Systems").await.status, StatusCode::OK);
    // The timeout is what is tested: wait past it.
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(
        c.get("/redfish/v1/Systems").await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(c.sim.session_count(), 0);
    c.login().await;
    assert_eq!(c.get("/redfish/v1/Systems").await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_patch_composes_and_decomposes_a_block_with_etags() {
    let c = Client::start(SimConfig::default()).await;
    c.sim.add_system("worker-0");
    let gpu = c.sim.add_gpu_block(GPU_MODEL).id;
    let sys = "/redfish/v1/Systems/worker-0";
    let before = c.get(sys).await;
    let etag = before.header("ETag").unwrap().to_string();
    assert_eq!(before.body["@odata.etag"], etag.as_str());
    assert_eq!(before.body["Links"]["ResourceBlocks@odata.count"], 1);

    // If-None-Match with the current ETag: 304.
    let same = send_raw(
        &c.http,
        &c.sim,
        Method::GET,
        sys,
        Some(&c.token),
        None,
        &[("If-None-Match", &etag)],
    )
    .await
    .unwrap();
    assert_eq!(same.status, StatusCode::NOT_MODIFIED);

    let body = blocks(&["Compute-worker-0", &gpu]);
    let done = send_raw(
        &c.http,
        &c.sim,
        Method::PATCH,
        sys,
        Some(&c.token),
        Some(body.to_string().into_bytes()),
        &[("If-Match", &etag)],
    )
    .await
    .unwrap();
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert_eq!(done.body["Links"]["ResourceBlocks@odata.count"], 2);
    assert_ne!(done.header("ETag"), Some(etag.as_str()));
    assert_eq!(c.sim.block(&gpu).unwrap().state, CompositionState::Composed);
    let block = c
        .get(&format!(
            "/redfish/v1/CompositionService/ResourceBlocks/{gpu}"
        ))
        .await;
    assert_eq!(
        block.body["CompositionStatus"]["CompositionState"],
        "Composed"
    );
    assert_eq!(block.body["Links"]["ComputerSystems"][0]["@odata.id"], sys);

    // The old ETag is stale now.
    let stale = send_raw(
        &c.http,
        &c.sim,
        Method::PATCH,
        sys,
        Some(&c.token),
        Some(blocks(&["Compute-worker-0"]).to_string().into_bytes()),
        &[("If-Match", &etag)],
    )
    .await
    .unwrap();
    assert_eq!(stale.status, StatusCode::PRECONDITION_FAILED);
    assert!(stale.message_id().ends_with(".PreconditionFailed"));
    assert_eq!(c.sim.block(&gpu).unwrap().state, CompositionState::Composed);

    // Decompose: the list without the GPU.
    let undone = c.patch(sys, blocks(&["Compute-worker-0"])).await;
    assert_eq!(undone.status, StatusCode::OK);
    let b = c.sim.block(&gpu).unwrap();
    assert_eq!((b.state, b.system), (CompositionState::Unused, None));
    // Again: nothing to do, still 200.
    assert_eq!(
        c.patch(sys, blocks(&["Compute-worker-0"])).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn bad_requests_fail_loudly_with_redfish_errors() {
    let c = Client::start(SimConfig::default()).await;
    c.sim.add_system("worker-0");
    c.sim.add_system("worker-1");
    let gpu = c.sim.add_gpu_block(GPU_MODEL).id;
    let sys = "/redfish/v1/Systems/worker-0";
    c.patch(sys, blocks(&["Compute-worker-0", &gpu])).await;

    let cases: Vec<(Got, StatusCode, &str)> = vec![
        (
            c.patch(
                "/redfish/v1/Systems/worker-1",
                blocks(&["Compute-worker-1", &gpu]),
            )
            .await,
            StatusCode::CONFLICT,
            "ResourceInUse",
        ),
        (
            c.patch(sys, blocks(&[&gpu])).await,
            StatusCode::BAD_REQUEST,
            "PropertyValueConflict",
        ),
        (
            c.patch(sys, blocks(&["Compute-worker-0", "GPU-404"])).await,
            StatusCode::BAD_REQUEST,
            "ResourceMissingAtURI",
        ),
        (
            c.patch(
                sys,
                json!({"Links": {"ResourceBlocks": [{"@odata.id": "/redfish/v1/Systems/x"}]}}),
            )
            .await,
            StatusCode::BAD_REQUEST,
            "PropertyValueFormatError",
        ),
        (
            c.patch(sys, json!({"Links": {"ResourceBlocks": "GPU-1"}}))
                .await,
            StatusCode::BAD_REQUEST,
            "PropertyValueFormatError",
        ),
        (
            c.patch(sys, json!({"Links": {"Chassis": []}})).await,
            StatusCode::BAD_REQUEST,
            "PropertyNotWritable",
        ),
        (
            c.patch(sys, json!({"Name": "x"})).await,
            StatusCode::BAD_REQUEST,
            "PropertyNotWritable",
        ),
        (
            c.patch(sys, json!({"Frobnicate": 1})).await,
            StatusCode::BAD_REQUEST,
            "PropertyUnknown",
        ),
        (
            c.patch(sys, json!({})).await,
            StatusCode::BAD_REQUEST,
            "PropertyMissing",
        ),
        (
            c.patch(sys, json!([1])).await,
            StatusCode::BAD_REQUEST,
            "MalformedJSON",
        ),
        (
            c.patch("/redfish/v1/Systems/nope", blocks(&[])).await,
            StatusCode::NOT_FOUND,
            "ResourceMissingAtURI",
        ),
        (
            c.get("/redfish/v1/Chassis").await,
            StatusCode::NOT_FOUND,
            "ResourceMissingAtURI",
        ),
        (
            c.get("/redfish/v1/Systems/worker-0/Bios").await,
            StatusCode::NOT_FOUND,
            "ResourceMissingAtURI",
        ),
        (
            c.get("/redfish/v1/CompositionService/ResourceBlocks/GPU-1/Memory")
                .await,
            StatusCode::NOT_FOUND,
            "ResourceMissingAtURI",
        ),
        (
            c.raw(
                Method::POST,
                "/redfish/v1/Systems",
                Some(&c.token),
                Some(json!({})),
            )
            .await,
            StatusCode::METHOD_NOT_ALLOWED,
            "OperationNotAllowed",
        ),
        (
            c.raw(Method::DELETE, sys, Some(&c.token), None).await,
            StatusCode::METHOD_NOT_ALLOWED,
            "OperationNotAllowed",
        ),
    ];
    for (i, (got, status, id)) in cases.into_iter().enumerate() {
        assert_eq!(got.status, status, "case {i}: {}", got.body);
        assert!(
            got.message_id().ends_with(&format!(".{id}")),
            "case {i}: {}",
            got.body
        );
    }
    let garbage = send_raw(
        &c.http,
        &c.sim,
        Method::PATCH,
        sys,
        Some(&c.token),
        Some(b"{not json".to_vec()),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(garbage.status, StatusCode::BAD_REQUEST);
    assert!(garbage.message_id().ends_with(".MalformedJSON"));
    // Nothing of that changed the composition.
    assert_eq!(
        c.sim.system("worker-0").unwrap().blocks,
        vec!["Compute-worker-0".to_string(), gpu.clone()]
    );
    assert_eq!(
        c.sim.system("worker-1").unwrap().blocks,
        vec!["Compute-worker-1".to_string()]
    );
}

/// Polls a task monitor until it stops answering 202, with a deadline.
async fn await_monitor(c: &Client, monitor: &str) -> Got {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let got = c.get(monitor).await;
        if got.status != StatusCode::ACCEPTED {
            return got;
        }
        assert_eq!(got.body["TaskState"], "Running");
        assert!(Instant::now() < end, "task monitor {monitor} still running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_slow_composition_answers_202_with_a_task_monitor() {
    let c = Client::start(SimConfig {
        compose_delay: Duration::from_millis(300),
        ..SimConfig::default()
    })
    .await;
    c.sim.add_system("worker-0");
    let gpu = c.sim.add_gpu_block(GPU_MODEL).id;
    let sys = "/redfish/v1/Systems/worker-0";
    let accepted = c.patch(sys, blocks(&["Compute-worker-0", &gpu])).await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{}", accepted.body);
    let monitor = accepted.header("Location").unwrap().to_string();
    assert!(monitor.starts_with("/redfish/v1/TaskService/TaskMonitors/"));
    assert_eq!(
        c.sim.block(&gpu).unwrap().state,
        CompositionState::Composing
    );
    // A second change while one runs is refused.
    let busy = c.patch(sys, blocks(&["Compute-worker-0"])).await;
    assert_eq!(busy.status, StatusCode::CONFLICT);

    let done = await_monitor(&c, &monitor).await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert_eq!(done.body["@odata.id"], sys);
    assert_eq!(c.sim.block(&gpu).unwrap().state, CompositionState::Composed);
    // The monitor answered its result; it is gone, the task stays.
    assert_eq!(c.get(&monitor).await.status, StatusCode::NOT_FOUND);
    let task = c.get(accepted.body["@odata.id"].as_str().unwrap()).await;
    assert_eq!(task.body["TaskState"], "Completed");

    // A failing composition ends in Exception and leaves the block unused.
    c.sim
        .inject(Fault::ComposeFails("PCIe link training failed".into()));
    let undo = c.patch(sys, blocks(&["Compute-worker-0"])).await;
    await_monitor(&c, undo.header("Location").unwrap()).await;
    let gpu2 = c.sim.add_gpu_block(GPU_MODEL).id;
    c.sim
        .inject(Fault::ComposeFails("PCIe link training failed".into()));
    let failing = c.patch(sys, blocks(&["Compute-worker-0", &gpu2])).await;
    assert_eq!(failing.status, StatusCode::ACCEPTED);
    let failed = await_monitor(&c, failing.header("Location").unwrap()).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        failed.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("PCIe link training failed")
    );
    assert_eq!(c.sim.block(&gpu2).unwrap().state, CompositionState::Unused);
    let task = c.get(failing.body["@odata.id"].as_str().unwrap()).await;
    assert_eq!(task.body["TaskState"], "Exception");
}

#[tokio::test]
async fn injected_faults() {
    let mut c = Client::start(SimConfig::default()).await;
    c.sim.add_system("worker-0");
    let gpu = c.sim.add_gpu_block(GPU_MODEL).id;
    let sys = "/redfish/v1/Systems/worker-0";
    let with_gpu = blocks(&["Compute-worker-0", &gpu]);
    let without = blocks(&["Compute-worker-0"]);

    // Latency.
    c.sim
        .inject(Fault::Latency(Duration::from_millis(200)).on(Route::System));
    let t = Instant::now();
    assert_eq!(c.get(sys).await.status, StatusCode::OK);
    assert!(t.elapsed() >= Duration::from_millis(200));

    // An error status with a Redfish body; state untouched.
    c.sim
        .inject(Fault::error(503, "ServiceTemporarilyUnavailable", "busy").on(Route::SystemPatch));
    let busy = c.patch(sys, with_gpu.clone()).await;
    assert_eq!(busy.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        busy.message_id()
            .ends_with(".ServiceTemporarilyUnavailable")
    );
    assert_eq!(c.sim.block(&gpu).unwrap().state, CompositionState::Unused);

    // A raw reply.
    c.sim.inject(
        Fault::Reply {
            status: 200,
            body: "<html>proxy</html>".into(),
        }
        .on(Route::Systems),
    );
    assert_eq!(
        c.get("/redfish/v1/Systems").await.body,
        Value::String("<html>proxy</html>".into())
    );

    // Malformed JSON after acting.
    c.sim.inject(Fault::MalformedJson.on(Route::SystemPatch));
    let cut = c.patch(sys, with_gpu.clone()).await;
    assert_eq!(cut.status, StatusCode::OK);
    assert!(cut.body.is_string(), "{}", cut.body);
    assert_eq!(c.sim.block(&gpu).unwrap().state, CompositionState::Composed);

    // Dropped before acting: no reply, nothing changed.
    c.sim.inject(Fault::Drop.on(Route::SystemPatch));
    assert!(c.try_patch(sys, without.clone()).await.is_err());
    assert_eq!(c.sim.block(&gpu).unwrap().state, CompositionState::Composed);

    // Dropped after acting: no reply, but decomposed.
    c.sim
        .inject(Fault::DropAfterProcessing.on(Route::SystemPatch));
    assert!(c.try_patch(sys, without.clone()).await.is_err());
    assert_eq!(c.sim.block(&gpu).unwrap().state, CompositionState::Unused);

    // An immediate composition failure.
    c.sim.inject(Fault::ComposeFails("no slot".into()));
    let failed = c.patch(sys, with_gpu.clone()).await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(failed.message_id().ends_with(".GeneralError"));
    assert_eq!(c.sim.block(&gpu).unwrap().state, CompositionState::Unused);

    // An expired session: 401, and the client must log in again.
    c.sim.inject(Fault::ExpireSession.on(Route::System));
    assert_eq!(c.get(sys).await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        c.get("/redfish/v1/Systems").await.status,
        StatusCode::UNAUTHORIZED
    );
    c.login().await;
    assert_eq!(c.get(sys).await.status, StatusCode::OK);

    assert_eq!(c.sim.active_faults(), 0);
    assert!(!c.sim.requests_to(Route::SystemPatch).is_empty());
}

#[tokio::test]
async fn protocol_details_dmtfs_protocol_validator_checks() {
    let c = Client::start(SimConfig::default()).await;
    // The OData metadata document, without a session, as XML.
    let url = format!("{}redfish/v1/$metadata", c.sim.endpoint());
    let meta = c.http.get(&url).send().await.unwrap();
    assert_eq!(meta.status(), StatusCode::OK);
    assert!(
        meta.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/xml")
    );
    let text = meta.text().await.unwrap();
    assert!(text.contains("<EntityContainer Name=\"Service\""), "{text}");

    // Headers of a GET: Allow, Cache-Control, OData-Version, Link rel=describedby.
    let root = c.get("/redfish/v1/Systems").await;
    assert_eq!(root.header("Allow"), Some("GET"));
    assert_eq!(root.header("Cache-Control"), Some("no-cache"));
    assert!(root.header("Link").unwrap().contains("rel=describedby"));
    assert_eq!(
        c.get("/redfish/v1/SessionService/Sessions")
            .await
            .header("Allow"),
        Some("GET, POST")
    );

    // An OData version the service does not speak.
    let v41 = send_raw(
        &c.http,
        &c.sim,
        Method::GET,
        "/redfish/v1/",
        None,
        None,
        &[("OData-Version", "4.1")],
    )
    .await
    .unwrap();
    assert_eq!(v41.status, StatusCode::PRECONDITION_FAILED);

    // HTTP Basic authentication instead of a session.
    let (user, password) = c.sim.credentials();
    let basic = c
        .http
        .get(format!("{}redfish/v1/Systems", c.sim.endpoint()))
        .basic_auth(&user, Some(&password))
        .send()
        .await
        .unwrap();
    assert_eq!(basic.status(), StatusCode::OK);
    let wrong = c
        .http
        .get(format!("{}redfish/v1/Systems", c.sim.endpoint()))
        .basic_auth(&user, Some("nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);

    // A POST to a collection's Members is a POST to the collection.
    let members = c
        .raw(
            Method::POST,
            "/redfish/v1/SessionService/Sessions/Members",
            None,
            Some(json!({"UserName": user, "Password": password})),
        )
        .await;
    assert_eq!(members.status, StatusCode::CREATED);
    assert_eq!(c.sim.session_count(), 2);
}

#[tokio::test]
async fn the_account_service_has_the_login_account_and_the_predefined_roles() {
    let c = Client::start(SimConfig::default()).await;
    let root = c.get("/redfish/v1/").await;
    assert_eq!(
        root.body["AccountService"]["@odata.id"],
        "/redfish/v1/AccountService"
    );
    let roles = c.get("/redfish/v1/AccountService/Roles").await;
    let ids: Vec<_> = roles.body["Members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["@odata.id"].as_str().unwrap().to_string())
        .collect();
    for role in ["Administrator", "Operator", "ReadOnly"] {
        let path = format!("/redfish/v1/AccountService/Roles/{role}");
        assert!(ids.contains(&path), "{ids:?}");
        let r = c.get(&path).await;
        assert_eq!(
            (r.body["RoleId"].as_str(), r.body["IsPredefined"].as_bool()),
            (Some(role), Some(true))
        );
        assert!(
            r.body["AssignedPrivileges"]
                .as_array()
                .unwrap()
                .contains(&json!("Login"))
        );
    }
    let account = c.get("/redfish/v1/AccountService/Accounts/1").await;
    assert_eq!(account.body["UserName"], c.sim.credentials().0);
    assert_eq!(account.body["RoleId"], "Administrator");
    assert!(account.header("ETag").is_some());
    assert_eq!(
        c.get("/redfish/v1/AccountService/Roles/Root").await.status,
        StatusCode::NOT_FOUND
    );
    // Read-only: no account is created through the API.
    let post = c
        .raw(
            Method::POST,
            "/redfish/v1/AccountService/Accounts",
            Some(&c.token),
            Some(json!({"UserName": "u2", "Password": "p", "RoleId": "ReadOnly"})),
        )
        .await;
    assert_eq!(post.status, StatusCode::METHOD_NOT_ALLOWED);
}

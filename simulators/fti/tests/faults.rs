//! Reply-level fault injection: latency, error bodies, malformed JSON, dropped
//! connections, route filters and scopes.

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::*;
use fabric_sim::{Fault, Route, SimConfig};
use serde_json::{Value, json};

#[tokio::test]
async fn latency_delays_only_the_matching_route() {
    let sim = start(SimConfig::default());
    let api = Api::new(&sim).await;
    let latency = Duration::from_millis(400);
    sim.inject(Fault::Latency(latency).on(Route::FmGetMachine).times(2));

    for _ in 0..2 {
        let asked = Instant::now();
        let (status, _) = api.fm_get(M1).await;
        assert_eq!(status, 200);
        assert!(asked.elapsed() >= latency);
    }
    assert_eq!(sim.active_faults(), 0);
}

#[tokio::test]
async fn error_replies_with_message_as_string_and_as_object() {
    let sim = start(SimConfig::default());
    sim.add_free_devices("gpu", MODEL, 1);
    let api = Api::new(&sim).await;

    sim.inject(Fault::error(409, "E0001", "resource is locked").on(Route::FmAttach));
    let (status, err) = api.fm_attach(M1, MODEL).await;
    assert_eq!(status, 409);
    assert_eq!(
        err,
        json!({"status": 409, "detail": {"code": "E0001", "message": "resource is locked"}})
    );

    let message = json!({"reason": "maintenance", "retry_after": 30});
    sim.inject(Fault::error_value(503, "E0002", message.clone()).on(Route::FmAttach));
    let (status, err) = api.fm_attach(M1, MODEL).await;
    assert_eq!(status, 503);
    assert_eq!(err["detail"]["code"], "E0002");
    assert_eq!(err["detail"]["message"], message);

    // Error faults do not touch state; the next attach goes through.
    assert_eq!(sim.free_devices("gpu", MODEL), 1);
    let (status, _) = api.fm_attach(M1, MODEL).await;
    assert_eq!(status, 200);

    sim.inject(
        Fault::Reply {
            status: 204,
            body: String::new(),
        }
        .on(Route::FmDetach),
    );
    let dev = &sim.machine_devices(M1)[0];
    let reply = api
        .http
        .delete(fm_update_url(&sim, M1))
        .bearer_auth(&api.token)
        .json(&detach_body(&sim, M1, &dev.res_uuid))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 204);
}

#[tokio::test]
async fn malformed_json_still_changes_state() {
    let sim = start(SimConfig::default());
    sim.add_free_devices("gpu", MODEL, 1);
    let api = Api::new(&sim).await;
    sim.inject(Fault::MalformedJson.on(Route::FmAttach));
    let reply = api
        .http
        .patch(fm_update_url(&sim, M1))
        .bearer_auth(&api.token)
        .json(&attach_body(&sim, M1, MODEL))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    assert_eq!(
        reply.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    let text = reply.text().await.unwrap();
    assert!(text.starts_with("{\"data\""), "{text}");
    assert!(serde_json::from_str::<Value>(&text).is_err());
    assert_eq!(sim.machine_devices(M1).len(), 1, "the attach happened");

    // On the token route as well.
    sim.inject(Fault::MalformedJson.on(Route::Token));
    let text = token_reply(&sim, &api.http).await.text().await.unwrap();
    assert!(serde_json::from_str::<Value>(&text).is_err());
}

#[tokio::test]
async fn dropped_connection_has_no_reply_at_all() {
    let sim = start(SimConfig::default());
    sim.add_free_devices("gpu", MODEL, 1);
    let api = Api::new(&sim).await;

    // Plain TCP on the HTTP port: the server closes without sending a byte.
    sim.inject(Fault::Drop.on(Route::FmGetMachine));
    let token = api.token.clone();
    let addr = sim.http_addr();
    let path = format!(
        "/fabric_manager/api/v1/machines/{M1}?tenant_uuid={}",
        sim.tenant_id()
    );
    let received = tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n"
        )
        .unwrap();
        let mut buf = Vec::new();
        // read_to_end returns at EOF; a timeout would be an error instead.
        stream.read_to_end(&mut buf).map(|_| buf)
    })
    .await
    .unwrap();
    assert_eq!(received.unwrap(), Vec::<u8>::new());

    // Over HTTPS with reqwest: an error that is not a timeout, and no state change.
    sim.inject(Fault::Drop.on(Route::FmAttach));
    let asked = Instant::now();
    let err = api
        .http
        .patch(fm_update_url(&sim, M1))
        .bearer_auth(&api.token)
        .json(&attach_body(&sim, M1, MODEL))
        .send()
        .await
        .unwrap_err();
    assert!(!err.is_timeout(), "{err:?}");
    assert!(asked.elapsed() < Duration::from_secs(20));
    assert_eq!(sim.free_devices("gpu", MODEL), 1);
    assert_eq!(
        sim.requests_to(Route::FmAttach).len(),
        1,
        "received, then dropped"
    );

    // The next request is served normally.
    let (status, _) = api.fm_attach(M1, MODEL).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn drop_after_processing_loses_the_reply_but_not_the_change() {
    let sim = start(SimConfig::default());
    sim.add_free_devices("gpu", MODEL, 1);
    let api = Api::new(&sim).await;
    sim.inject(Fault::DropAfterProcessing.on(Route::FmAttach));
    let err = api
        .http
        .patch(fm_update_url(&sim, M1))
        .bearer_auth(&api.token)
        .json(&attach_body(&sim, M1, MODEL))
        .send()
        .await
        .unwrap_err();
    assert!(!err.is_timeout());
    assert_eq!(sim.machine_devices(M1).len(), 1);
    assert_eq!(sim.free_devices("gpu", MODEL), 0);
}

#[tokio::test]
async fn stall_after_processing_acts_then_holds_the_reply_past_the_client_deadline() {
    let sim = start(SimConfig::default());
    sim.add_free_devices("gpu", MODEL, 1);
    let api = Api::new(&sim).await;
    sim.inject(Fault::StallAfterProcessing(Duration::from_secs(3)).on(Route::FmAttach));
    let started = Instant::now();
    let err = api
        .http
        .patch(fm_update_url(&sim, M1))
        .bearer_auth(&api.token)
        .timeout(Duration::from_millis(500))
        .json(&attach_body(&sim, M1, MODEL))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    // The fabric acted although the client never heard of it.
    assert_eq!(sim.machine_devices(M1).len(), 1);
    assert_eq!(sim.free_devices("gpu", MODEL), 0);
    // A patient client gets no reply either: the connection is closed after the hold.
    sim.add_free_devices("gpu", MODEL, 1);
    sim.inject(Fault::StallAfterProcessing(Duration::from_millis(300)).on(Route::FmAttach));
    let err = api
        .http
        .patch(fm_update_url(&sim, M1))
        .bearer_auth(&api.token)
        .json(&attach_body(&sim, M1, MODEL))
        .send()
        .await
        .unwrap_err();
    assert!(!err.is_timeout(), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(800));
    assert_eq!(sim.machine_devices(M1).len(), 2);
}

#[tokio::test]
async fn scopes_routes_and_clearing() {
    let sim = start(SimConfig::default());
    let api = Api::new(&sim).await;

    // Until cleared, on one route only.
    let id = sim.inject(
        Fault::error(500, "E0500", "down")
            .on(Route::CmGetMachine)
            .always(),
    );
    for _ in 0..3 {
        assert_eq!(api.cm_get(M1).await.0, 500);
        assert_eq!(api.fm_get(M1).await.0, 200);
    }
    assert!(sim.remove_fault(id));
    assert!(!sim.remove_fault(id));
    assert_eq!(api.cm_get(M1).await.0, 200);

    // A bare fault hits the next request whatever its route, once.
    sim.inject(Fault::error(502, "E0502", "bad gateway"));
    assert_eq!(api.fm_get(M1).await.0, 502);
    assert_eq!(api.cm_get(M1).await.0, 200);

    // Next N requests.
    sim.inject(Fault::error(500, "E0500", "x").times(2));
    assert_eq!(api.fm_get(M1).await.0, 500);
    assert_eq!(api.cm_get(M1).await.0, 500);
    assert_eq!(api.fm_get(M1).await.0, 200);

    sim.inject(Fault::Drop.always());
    sim.inject(Fault::Latency(Duration::from_secs(60)).always());
    assert_eq!(sim.active_faults(), 2);
    sim.clear_faults();
    assert_eq!(sim.active_faults(), 0);
    assert_eq!(api.fm_get(M1).await.0, 200);

    // A dropped token request really drops.
    sim.inject(Fault::Drop.on(Route::Token));
    let err = api
        .http
        .post(format!("{}{}", sim.endpoint(), sim.token_path()))
        .form(&token_form(&sim))
        .send()
        .await
        .unwrap_err();
    assert!(!err.is_timeout());
    assert_eq!(token_reply(&sim, &api.http).await.status(), 200);
}

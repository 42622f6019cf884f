//! Identity manager and bearer enforcement over real HTTPS.

mod common;

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::*;
use fabric_sim::{Fault, Route, SimConfig};
use serde_json::Value;

#[tokio::test]
async fn token_is_a_jwt_with_exp_from_the_injected_clock() {
    let clock = TestClock::new();
    let sim = start(
        SimConfig::default()
            .with_clock(clock.clock())
            .with_token_ttl(Duration::from_secs(120)),
    );
    let http = client(&sim);
    let reply = token_reply(&sim, &http).await;
    assert_eq!(reply.status(), 200);
    let body: Value = reply.json().await.unwrap();
    for key in [
        "access_token",
        "expires_in",
        "refresh_expires_in",
        "refresh_token",
        "token_type",
        "id_token",
        "not-before-policy",
        "session_state",
        "scope",
    ] {
        assert!(body.get(key).is_some(), "reply lacks {key}: {body}");
    }
    assert_eq!(body["expires_in"], 120);
    assert_eq!(body["token_type"], "Bearer");

    let access = body["access_token"].as_str().unwrap();
    let parts: Vec<&str> = access.split('.').collect();
    assert_eq!(parts.len(), 3);
    assert!(!access.contains('='), "base64url without padding");
    let header: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[0]).unwrap()).unwrap();
    assert_eq!(header["alg"], "HS256");
    let payload: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    assert_eq!(payload["iat"], TestClock::START);
    assert_eq!(payload["exp"], TestClock::START + 120);
    assert_eq!(payload["sub"], sim.credentials().username);
    assert_eq!(fabric_sim::jwt::decode_payload(access).unwrap(), payload);

    // The form the provider sent is on record.
    let recorded = sim.token_requests();
    assert_eq!(recorded.len(), 1);
    let req = &recorded[0];
    assert!(req.tls);
    assert_eq!(req.form_value("grant_type").as_deref(), Some("password"));
    assert_eq!(req.form_value("scope").as_deref(), Some("openid"));
    assert_eq!(
        req.form_value("response_type").as_deref(),
        Some("id_token token")
    );
    assert_eq!(
        req.form_value("client_secret"),
        Some(sim.credentials().client_secret)
    );

    // A later token follows the moved clock and a changed TTL.
    clock.advance(Duration::from_secs(1000));
    sim.set_token_ttl(Duration::from_secs(60));
    let later = token(&sim, &http).await;
    let payload = fabric_sim::jwt::decode_payload(&later).unwrap();
    assert_eq!(payload["exp"], TestClock::START + 1000 + 60);
    assert_eq!(sim.token_requests().len(), 2);
}

#[tokio::test]
async fn wrong_credentials_client_grant_and_realm_are_rejected() {
    let sim = start(SimConfig::default());
    let http = client(&sim);
    let url = format!("{}{}", sim.endpoint(), sim.token_path());

    let with = |key: &'static str, value: &str| {
        let mut form = token_form(&sim);
        for (k, v) in &mut form {
            if *k == key {
                *v = value.to_string();
            }
        }
        form
    };
    let cases = [
        (with("password", "nope"), 401, "invalid_grant"),
        (with("username", "nobody"), 401, "invalid_grant"),
        (with("client_secret", "nope"), 401, "unauthorized_client"),
        (
            with("grant_type", "client_credentials"),
            400,
            "unsupported_grant_type",
        ),
    ];
    for (form, status, error) in cases {
        let reply = http.post(&url).form(&form).send().await.unwrap();
        assert_eq!(reply.status(), status);
        let body: Value = reply.json().await.unwrap();
        assert_eq!(body["error"], error, "{body}");
    }

    let other_realm = format!(
        "{}id_manager/realms/other/protocol/openid-connect/token",
        sim.endpoint()
    );
    let reply = http
        .post(&other_realm)
        .form(&token_form(&sim))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 404);

    let reply = http
        .post(&url)
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 400);
    assert_eq!(sim.token_requests().len(), 6);
}

#[tokio::test]
async fn reject_credentials_fault_gives_401_then_recovers() {
    let sim = start(SimConfig::default());
    let http = client(&sim);
    sim.inject(Fault::RejectCredentials);
    let reply = token_reply(&sim, &http).await;
    assert_eq!(reply.status(), 401);
    let body: Value = reply.json().await.unwrap();
    assert_eq!(body["error"], "invalid_grant");
    assert_eq!(sim.active_faults(), 0);
    assert_eq!(token_reply(&sim, &http).await.status(), 200);
}

#[tokio::test]
async fn expired_tokens_fault_issues_tokens_already_expired() {
    let clock = TestClock::new();
    let sim = start(SimConfig::default().with_clock(clock.clock()));
    let http = client(&sim);
    sim.inject(Fault::ExpiredTokens.on(Route::Token));
    let expired = token(&sim, &http).await;
    let exp = fabric_sim::jwt::decode_payload(&expired).unwrap()["exp"]
        .as_u64()
        .unwrap();
    assert!(exp < clock.now_secs(), "exp {exp} not before now");

    let reply = http
        .get(fm_url(&sim, M1))
        .bearer_auth(&expired)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 401);
    let body: Value = reply.json().await.unwrap();
    assert_eq!(body["status"], 401);
    assert_eq!(body["detail"]["code"], "E0401");
    assert_eq!(body["detail"]["message"], "token expired");

    let fresh = token(&sim, &http).await;
    let reply = http
        .get(fm_url(&sim, M1))
        .bearer_auth(&fresh)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
}

#[tokio::test]
async fn every_api_call_needs_a_valid_bearer_token() {
    let clock = TestClock::new();
    let sim = start(
        SimConfig::default()
            .with_clock(clock.clock())
            .with_token_ttl(Duration::from_secs(300)),
    );
    let http = client(&sim);
    let good = token(&sim, &http).await;

    let forged = {
        let parts: Vec<&str> = good.split('.').collect();
        let payload = URL_SAFE_NO_PAD
            .encode(serde_json::json!({"exp": TestClock::START + 99999, "sub": "x"}).to_string());
        format!("{}.{}.{}", parts[0], payload, parts[2])
    };
    let urls = [
        (reqwest::Method::GET, fm_url(&sim, M1)),
        (reqwest::Method::PATCH, fm_update_url(&sim, M1)),
        (reqwest::Method::DELETE, fm_update_url(&sim, M1)),
        (reqwest::Method::GET, cm_url(&sim, M1)),
        (
            reqwest::Method::POST,
            format!("{}/actions/resize", cm_url(&sim, M1)),
        ),
    ];
    for (method, url) in &urls {
        for auth in [None, Some("garbage"), Some(forged.as_str())] {
            let mut req = http.request(method.clone(), url);
            if let Some(auth) = auth {
                req = req.bearer_auth(auth);
            }
            let reply = req.send().await.unwrap();
            assert_eq!(reply.status(), 401, "{method} {url} with {auth:?}");
            assert!(reply.headers().contains_key("www-authenticate"));
            let body: Value = reply.json().await.unwrap();
            assert_eq!(body["detail"]["code"], "E0401");
        }
    }
    let reply = http
        .get(fm_url(&sim, M1))
        .bearer_auth(&good)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);

    // Expiry follows the injected clock.
    clock.advance(Duration::from_secs(301));
    let reply = http
        .get(fm_url(&sim, M1))
        .bearer_auth(&good)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 401);

    // Revocation invalidates tokens that have not expired.
    let fresh = token(&sim, &http).await;
    sim.revoke_tokens();
    let reply = http
        .get(fm_url(&sim, M1))
        .bearer_auth(&fresh)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 401);

    // A token minted by the handle is honoured like one from the endpoint.
    let minted = sim.issue_token();
    let reply = http
        .get(fm_url(&sim, M1))
        .bearer_auth(&minted)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
}

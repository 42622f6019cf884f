//! Token fetching, caching and renewal, and configuration errors.

use fti_provider::{Fti, HttpError, Method, ProviderError, SecretError};

use crate::fake::{self, FakeHost, TOKEN_PATH, json_reply, jwt, token_reply};
use crate::*;

fn fm_host() -> FakeHost {
    let h = FakeHost::new("FM");
    h.add_node("n1", Some(&format!("fsas-cdi://{MACHINE}")));
    h.reply_json(
        Method::Get,
        FM_MACHINE_PATH,
        200,
        &fm_machine(MACHINE, vec![fm_res("GPU-1", "u1", "gpu", MODEL, "0")]),
    );
    h
}

fn check(h: &FakeHost) -> Result<(), ProviderError> {
    Fti::new(h).check_resource(&attached("r1", "n1", "GPU-1", "u1"))
}

#[test]
fn token_request_is_a_form_encoded_password_grant() {
    let h = fm_host();
    check(&h).unwrap();
    let reqs = h.requests.borrow();
    let t = &reqs[0];
    assert_eq!(t.method, Method::Post);
    assert_eq!(t.url, format!("{}{TOKEN_PATH}", fake::BASE));
    assert!(
        t.headers
            .iter()
            .any(|(k, v)| k == "content-type" && v == "application/x-www-form-urlencoded")
    );
    let body = String::from_utf8(t.body.clone()).unwrap();
    let mut fields: Vec<&str> = body.split('&').collect();
    fields.sort();
    assert_eq!(
        fields,
        vec![
            "client_id=cro",
            "client_secret=s3cret",
            "grant_type=password",
            "password=p%26ss+word",
            "response_type=id_token+token",
            "scope=openid",
            "username=alice",
        ]
    );
    // Every fabric call carries the token as bearer.
    let issued = fake::bearer(&reqs[1]);
    assert!(issued.starts_with("Bearer ey"), "{issued}");
    assert_eq!(
        reqs[1].url,
        format!("{}{FM_MACHINE_PATH}?tenant_uuid=tenant-1", fake::BASE)
    );
}

#[test]
fn one_token_is_reused_until_thirty_seconds_before_exp() {
    let h = fm_host();
    h.token_life.set(300);
    for _ in 0..5 {
        check(&h).unwrap();
    }
    assert_eq!(h.token_requests(), 1);
    h.advance(269); // 31 s before exp
    check(&h).unwrap();
    assert_eq!(h.token_requests(), 1);
    h.advance(1); // exactly 30 s before exp: renew
    check(&h).unwrap();
    assert_eq!(h.token_requests(), 2);
    check(&h).unwrap();
    assert_eq!(h.token_requests(), 2);
    // The renewed token is the one used.
    let reqs = h.requests.borrow();
    let bearers: Vec<String> = reqs
        .iter()
        .filter(|r| !r.url.contains("openid-connect"))
        .map(fake::bearer)
        .collect();
    assert_ne!(bearers.first(), bearers.last());
    assert_eq!(bearers[bearers.len() - 1], bearers[bearers.len() - 2]);
}

#[test]
fn a_token_already_near_expiry_is_used_once_but_not_cached() {
    let h = fm_host();
    h.token_life.set(20);
    check(&h).unwrap();
    check(&h).unwrap();
    assert_eq!(h.token_requests(), 2);
    assert!(h.state.borrow().is_empty());
}

#[test]
fn jwt_without_padding_or_with_trailing_whitespace_is_accepted() {
    let h = fm_host();
    // 14-byte payload: base64 would need padding.
    let exp = h.unix_now() + 1000;
    let tok = jwt(&format!(r#"{{"exp":{exp}}}"#));
    assert!(!tok.contains('='));
    h.reply(Method::Post, TOKEN_PATH, token_reply(&format!("{tok} \n")));
    check(&h).unwrap();
    check(&h).unwrap();
    assert_eq!(h.token_requests(), 1);
    let reqs = h.requests.borrow();
    assert_eq!(fake::bearer(&reqs[1]), format!("Bearer {tok}"));
}

#[test]
fn bad_tokens_are_malformed_replies() {
    for tok in [
        "only.two".to_string(),
        "a.b.c.d".to_string(),
        jwt(r#"{"sub":"no exp"}"#),
        "x.%%%.y".to_string(),
        String::new(),
    ] {
        let h = fm_host();
        h.reply(Method::Post, TOKEN_PATH, token_reply(&tok));
        assert!(
            matches!(check(&h), Err(ProviderError::MalformedReply(_))),
            "token {tok:?}"
        );
        assert!(h.fabric_calls().is_empty());
    }
    for body in ["not json", "{}", r#"{"access_token": 5}"#, "[]"] {
        let h = fm_host();
        h.reply(Method::Post, TOKEN_PATH, json_reply(200, body));
        assert!(
            matches!(check(&h), Err(ProviderError::MalformedReply(_))),
            "body {body:?}"
        );
    }
}

#[test]
fn rejected_credentials_are_a_clear_config_error() {
    let h = fm_host();
    h.reply(
        Method::Post,
        TOKEN_PATH,
        json_reply(
            401,
            r#"{"error":"invalid_grant","error_description":"Invalid user credentials"}"#,
        ),
    );
    match check(&h) {
        Err(ProviderError::Config(m)) => {
            assert!(m.contains("credentials rejected"), "{m}");
            assert!(m.contains("Invalid user credentials"), "{m}");
        }
        other => panic!("{other:?}"),
    }
    assert!(h.fabric_calls().is_empty());
}

#[test]
fn other_token_failures_carry_status_and_body() {
    let h = fm_host();
    h.reply(Method::Post, TOKEN_PATH, json_reply(503, "idm down"));
    assert_eq!(
        check(&h),
        Err(ProviderError::Fabric {
            status: 503,
            code: String::new(),
            message: "idm down".into()
        })
    );
    h.reply(
        Method::Post,
        TOKEN_PATH,
        Err(HttpError::Connect("refused".into())),
    );
    assert!(matches!(check(&h), Err(ProviderError::Unavailable(_))));
}

#[test]
fn a_cached_token_the_fabric_rejects_is_renewed_once() {
    let h = fm_host();
    check(&h).unwrap();
    assert_eq!(h.token_requests(), 1);
    // The fabric now rejects the first token only.
    let first = fake::bearer(&h.requests.borrow()[1]);
    h.reply(
        Method::Get,
        FM_MACHINE_PATH,
        json_reply(401, r#"{"detail":{"code":"E401","message":"expired"}}"#),
    );
    assert!(matches!(
        check(&h),
        Err(ProviderError::Fabric { status: 401, .. })
    ));
    // One retry with a fresh token, not more.
    assert_eq!(h.token_requests(), 2);
    let calls = h.fabric_calls();
    assert_eq!(calls.len(), 3);
    let last = fake::bearer(h.requests.borrow().last().unwrap());
    assert_ne!(first, last);
}

#[test]
fn credentials_come_from_the_configured_secret_keys() {
    let h = fm_host();
    h.set_config("username_key", "user");
    h.secrets
        .borrow_mut()
        .insert("user".into(), Ok("bob".into()));
    check(&h).unwrap();
    let body = String::from_utf8(h.requests.borrow()[0].body.clone()).unwrap();
    assert!(body.contains("username=bob"), "{body}");
}

#[test]
fn missing_or_denied_secret_keys_are_typed() {
    let h = fm_host();
    h.secrets.borrow_mut().remove("realm");
    assert!(matches!(check(&h), Err(ProviderError::Config(m)) if m.contains("'realm'")));
    h.secrets
        .borrow_mut()
        .insert("realm".into(), Err(SecretError::Denied("no grant".into())));
    assert!(matches!(check(&h), Err(ProviderError::Denied(_))));
    h.secrets
        .borrow_mut()
        .insert("realm".into(), Err(SecretError::Other("api down".into())));
    assert!(matches!(check(&h), Err(ProviderError::Other(_))));
    assert_eq!(h.requests.borrow().len(), 0);
}

#[test]
fn refused_state_store_still_works_with_a_token_per_call() {
    let h = fm_host();
    h.state_refuses.set(true);
    check(&h).unwrap();
    check(&h).unwrap();
    assert_eq!(h.token_requests(), 2);
    assert!(h.logged(fti_provider::LogLevel::Warn, "refused to cache"));
}

#[test]
fn configuration_errors() {
    let cases: &[(&str, Option<&str>)] = &[
        ("api_type", None),
        ("api_type", Some("XX")),
        ("endpoint", None),
        ("endpoint", Some("ftp://x/")),
        ("tenant_id", Some("  ")),
        ("timeout_ms", Some("soon")),
    ];
    for (key, value) in cases {
        let h = fm_host();
        match value {
            Some(v) => h.set_config(key, v),
            None => {
                h.config.borrow_mut().remove(*key);
            }
        }
        assert!(
            matches!(check(&h), Err(ProviderError::Config(_))),
            "{key}={value:?}"
        );
        assert!(h.requests.borrow().is_empty());
    }
    let h = fm_host();
    h.set_config("api_type", "CM");
    assert!(matches!(check(&h), Err(ProviderError::Config(m)) if m.contains("cluster_id")));
}

#[test]
fn endpoint_with_scheme_and_timeout_are_used() {
    let h = fm_host();
    h.set_config("endpoint", "http://127.0.0.1:9/base");
    h.set_config("timeout_ms", "1500");
    let _ = check(&h);
    let reqs = h.requests.borrow();
    assert!(
        reqs[0]
            .url
            .starts_with("http://127.0.0.1:9/base/id_manager/realms/cdi/")
    );
    assert_eq!(reqs[0].timeout_ms, Some(1500));
}

#[test]
fn a_clock_at_the_epoch_is_reported() {
    let h = fm_host();
    h.now.set(std::time::SystemTime::UNIX_EPOCH);
    check(&h).unwrap();
    assert!(h.logged(
        fti_provider::LogLevel::Warn,
        "grant the provider wasi clocks"
    ));
    let h = fm_host();
    check(&h).unwrap();
    assert!(!h.logged(fti_provider::LogLevel::Warn, "wasi clocks"));
}

//! `POST id_manager/realms/<realm>/protocol/openid-connect/token`, answered the way
//! Keycloak answers (its errors are `{"error": .., "error_description": ..}`).

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use axum::response::Response;
use serde_json::json;

use super::json_reply;
use crate::faults::Fault;
use crate::record::Route;
use crate::shared::{Shared, lock};

fn kc_error(status: u16, error: &str, description: &str) -> Response {
    json_reply(
        status,
        &json!({"error": error, "error_description": description}),
    )
}

pub(crate) async fn issue(
    State(s): State<Arc<Shared>>,
    Path(realm): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if realm != s.realm {
        return json_reply(404, &json!({"error": "Realm does not exist"}));
    }
    let form_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if !form_type {
        return kc_error(
            400,
            "invalid_request",
            "Content-Type must be application/x-www-form-urlencoded",
        );
    }
    let form: HashMap<String, String> = form_urlencoded::parse(&body).into_owned().collect();
    let field = |k: &str| form.get(k).map(String::as_str).unwrap_or_default();

    if field("grant_type") != "password" {
        return kc_error(400, "unsupported_grant_type", "Unsupported grant_type");
    }
    let creds = &s.credentials;
    if field("client_id") != creds.client_id || field("client_secret") != creds.client_secret {
        return kc_error(
            401,
            "unauthorized_client",
            "Invalid client or Invalid client credentials",
        );
    }
    let rejected = s
        .take_fault(Route::Token, |f| *f == Fault::RejectCredentials)
        .is_some();
    if rejected || field("username") != creds.username || field("password") != creds.password {
        return kc_error(401, "invalid_grant", "Invalid user credentials");
    }

    let ttl = i64::try_from(lock(&s.token_ttl).as_secs()).unwrap_or(i64::MAX / 2);
    let expired = s
        .take_fault(Route::Token, |f| *f == Fault::ExpiredTokens)
        .is_some();
    let now = s.now_secs();
    // An already-expired token looks like one issued a full TTL ago.
    let iat = if expired {
        now.saturating_sub(ttl).saturating_sub(1)
    } else {
        now
    };
    let exp = iat.saturating_add(ttl);
    let refresh_ttl = 1800;
    let access = s.issue_token(&creds.username, iat, exp, "Bearer");
    let refresh = s.issue_token(
        &creds.username,
        iat,
        iat.saturating_add(refresh_ttl),
        "Refresh",
    );
    let id_token = s.issue_token(&creds.username, iat, exp, "ID");
    json_reply(
        200,
        &json!({
            "access_token": access,
            "expires_in": ttl,
            "refresh_expires_in": refresh_ttl,
            "refresh_token": refresh,
            "token_type": "Bearer",
            "id_token": id_token,
            "not-before-policy": 0,
            "session_state": uuid::Uuid::new_v4().to_string(),
            "scope": "openid profile email",
        }),
    )
}

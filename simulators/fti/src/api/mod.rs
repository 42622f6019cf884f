//! The HTTP API: routes, handlers and the error bodies the fabric sends.

mod cm;
mod fm;
mod token;

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use serde_json::{Value, json};

use crate::shared::{BearerError, Shared};
use crate::state::FabricError;

/// Error codes the simulator itself sends (injected faults send whatever they are given).
pub mod codes {
    /// Malformed or inconsistent request body / query (400).
    pub const BAD_REQUEST: &str = "E0400";
    /// Missing, invalid, unknown or expired bearer token (401).
    pub const UNAUTHORIZED: &str = "E0401";
    /// `tenant_uuid` query parameter names another tenant (403).
    pub const FORBIDDEN_TENANT: &str = "E0403";
    /// Unknown path, machine, device, tenant/cluster or resource spec (404).
    pub const NOT_FOUND: &str = "E0404";
    /// Known path, wrong method (405).
    pub const METHOD_NOT_ALLOWED: &str = "E0405";
    /// No free device of the requested type and model in the pool (409).
    pub const NO_FREE_DEVICE: &str = "E0409";
    /// Device busy with a Cluster Manager change in progress (409).
    pub const CONFLICT: &str = "E0410";
}

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    let cm = "/cluster_manager/cluster_autoscaler/v3/tenants/{tenant}/clusters/{cluster}/machines/{mach}";
    Router::new()
        .route(
            "/id_manager/realms/{realm}/protocol/openid-connect/token",
            post(token::issue),
        )
        .route("/fabric_manager/api/v1/machines", get(fm::list_machines))
        .route(
            "/fabric_manager/api/v1/machines/{mach}",
            get(fm::get_machine),
        )
        .route(
            "/fabric_manager/api/v1/machines/{mach}/available-reserved-resources",
            get(fm::available),
        )
        .route(
            "/fabric_manager/api/v1/machines/{mach}/update",
            patch(fm::attach).delete(fm::detach),
        )
        .route(cm, get(cm::get_machine))
        .route(&format!("{cm}/actions/resize"), post(cm::resize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(shared)
}

async fn not_found() -> Response {
    fti_error(404, codes::NOT_FOUND, json!("no such API path"), None)
}

async fn method_not_allowed() -> Response {
    fti_error(
        405,
        codes::METHOD_NOT_ALLOWED,
        json!("method not allowed"),
        None,
    )
}

fn status(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// `{"status": N, "detail": {"code": .., "message": .., "data": ..}}` with status N.
pub(crate) fn fti_error(
    code_status: u16,
    code: &str,
    message: Value,
    data: Option<Value>,
) -> Response {
    let mut detail = json!({"code": code, "message": message});
    if let Some(data) = data {
        detail["data"] = data;
    }
    json_reply(
        code_status,
        &json!({"status": code_status, "detail": detail}),
    )
}

pub(crate) fn json_reply(code: u16, body: &Value) -> Response {
    raw_reply(code, body.to_string())
}

pub(crate) fn raw_reply(code: u16, body: String) -> Response {
    (
        status(code),
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

pub(crate) fn unauthorized(err: &BearerError) -> Response {
    let mut resp = fti_error(401, codes::UNAUTHORIZED, json!(err.to_string()), None);
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer error=\"invalid_token\""),
    );
    resp
}

/// An FTI error reply in the making; handlers return it with `?`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: u16,
    code: &'static str,
    message: Value,
    data: Option<Value>,
}

impl ApiError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: Value::String(message.into()),
            data: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        fti_error(self.status, self.code, self.message, self.data)
    }
}

impl From<FabricError> for ApiError {
    fn from(err: FabricError) -> Self {
        let message = err.to_string();
        match &err {
            FabricError::UnknownMachine(_)
            | FabricError::UnknownDevice { .. }
            | FabricError::UnknownSpec(_) => ApiError::new(404, codes::NOT_FOUND, message),
            FabricError::NoFreeDevice {
                res_type,
                model,
                available,
            } => ApiError {
                data: Some(json!({"res_type": res_type, "model": model, "available": available})),
                ..ApiError::new(409, codes::NO_FREE_DEVICE, message)
            },
            FabricError::BadRequest(_) => ApiError::new(400, codes::BAD_REQUEST, message),
            FabricError::Conflict(_) => ApiError::new(409, codes::CONFLICT, message),
        }
    }
}

pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError::new(400, codes::BAD_REQUEST, message)
}

/// Query parameters of a raw query string.
pub(crate) fn query_param(query: Option<&str>, key: &str) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes())
        .into_owned()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

/// The `model` of `[{"column": "model", "operator": "eq", "value": ..}]`.
pub(crate) fn model_condition(conditions: Option<&Value>) -> Option<String> {
    conditions?.as_array()?.iter().find_map(|c| {
        let is_model = c.get("column")?.as_str()? == "model";
        let is_eq = c.get("operator")?.as_str()? == "eq";
        (is_model && is_eq)
            .then(|| c.get("value")?.as_str().map(String::from))
            .flatten()
    })
}

pub(crate) fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| bad_request(format!("request body is not JSON: {e}")))
}

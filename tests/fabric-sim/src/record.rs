//! Which API a request is for, and the record kept of every request.

use std::time::SystemTime;

use serde_json::Value;

/// The simulated API calls (docs/fti-fabric-api.md), used to filter faults and records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// `POST id_manager/realms/<realm>/protocol/openid-connect/token`
    Token,
    /// `GET fabric_manager/api/v1/machines/<machine>`
    FmGetMachine,
    /// `PATCH fabric_manager/api/v1/machines/<machine>/update`
    FmAttach,
    /// `DELETE fabric_manager/api/v1/machines/<machine>/update`
    FmDetach,
    /// `GET cluster_manager/cluster_autoscaler/v3/tenants/<t>/clusters/<c>/machines/<machine>`
    CmGetMachine,
    /// `POST <CM machine>/actions/resize`
    CmResize,
}

impl Route {
    /// Classifies a request by method and path (leading slash, no query).
    pub fn classify(method: &str, path: &str) -> Option<Route> {
        let segs: Vec<&str> = path.strip_prefix('/')?.split('/').collect();
        match (method, segs.as_slice()) {
            (
                "POST",
                [
                    "id_manager",
                    "realms",
                    _,
                    "protocol",
                    "openid-connect",
                    "token",
                ],
            ) => Some(Route::Token),
            ("GET", ["fabric_manager", "api", "v1", "machines", _]) => Some(Route::FmGetMachine),
            ("PATCH", ["fabric_manager", "api", "v1", "machines", _, "update"]) => {
                Some(Route::FmAttach)
            }
            ("DELETE", ["fabric_manager", "api", "v1", "machines", _, "update"]) => {
                Some(Route::FmDetach)
            }
            (
                "GET",
                [
                    "cluster_manager",
                    "cluster_autoscaler",
                    "v3",
                    "tenants",
                    _,
                    "clusters",
                    _,
                    "machines",
                    _,
                ],
            ) => Some(Route::CmGetMachine),
            (
                "POST",
                [
                    "cluster_manager",
                    "cluster_autoscaler",
                    "v3",
                    "tenants",
                    _,
                    "clusters",
                    _,
                    "machines",
                    _,
                    "actions",
                    "resize",
                ],
            ) => Some(Route::CmResize),
            _ => None,
        }
    }
}

/// One request as the simulator received it.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// Arrival order, from 1.
    pub seq: u64,
    /// Arrival time on the simulator's clock.
    pub at: SystemTime,
    /// Came in over HTTPS.
    pub tls: bool,
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub route: Option<Route>,
    /// All headers, names lower-case, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RecordedRequest {
    /// First header with this name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The token of an `Authorization: Bearer` header.
    pub fn bearer(&self) -> Option<&str> {
        bearer_token(self.header("authorization")?)
    }

    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The body as form fields (token requests).
    pub fn form(&self) -> Vec<(String, String)> {
        form_urlencoded::parse(&self.body).into_owned().collect()
    }

    pub fn form_value(&self, key: &str) -> Option<String> {
        self.form()
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    pub fn query_param(&self, key: &str) -> Option<String> {
        form_urlencoded::parse(self.query.as_deref()?.as_bytes())
            .into_owned()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }
}

/// The token of a `Bearer <token>` header value (scheme case-insensitive).
pub(crate) fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_every_route() {
        let cm = "/cluster_manager/cluster_autoscaler/v3/tenants/t/clusters/c/machines/m";
        assert_eq!(
            Route::classify("POST", "/id_manager/realms/r/protocol/openid-connect/token"),
            Some(Route::Token)
        );
        assert_eq!(
            Route::classify("GET", "/fabric_manager/api/v1/machines/m"),
            Some(Route::FmGetMachine)
        );
        assert_eq!(
            Route::classify("PATCH", "/fabric_manager/api/v1/machines/m/update"),
            Some(Route::FmAttach)
        );
        assert_eq!(
            Route::classify("DELETE", "/fabric_manager/api/v1/machines/m/update"),
            Some(Route::FmDetach)
        );
        assert_eq!(Route::classify("GET", cm), Some(Route::CmGetMachine));
        assert_eq!(
            Route::classify("POST", &format!("{cm}/actions/resize")),
            Some(Route::CmResize)
        );
        assert_eq!(
            Route::classify("GET", "/fabric_manager/api/v1/machines/m/update"),
            None
        );
        assert_eq!(
            Route::classify("GET", "fabric_manager/api/v1/machines/m"),
            None
        );
        assert_eq!(
            Route::classify("GET", "//fabric_manager/api/v1/machines/m"),
            None
        );
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
    }
}

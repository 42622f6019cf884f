//! Which API a request is for, and the record kept of every request.

/// The simulated API calls (docs/fti-fabric-api.md), used to filter faults and records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// `POST id_manager/realms/<realm>/protocol/openid-connect/token`
    Token,
    /// `GET fabric_manager/api/v1/machines` (every machine of the tenant)
    FmListMachines,
    /// `GET fabric_manager/api/v1/machines/<machine>`
    FmGetMachine,
    /// `GET fabric_manager/api/v1/machines/<machine>/available-reserved-resources`
    FmAvailable,
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
            ("GET", ["fabric_manager", "api", "v1", "machines"]) => Some(Route::FmListMachines),
            ("GET", ["fabric_manager", "api", "v1", "machines", _]) => Some(Route::FmGetMachine),
            (
                "GET",
                [
                    "fabric_manager",
                    "api",
                    "v1",
                    "machines",
                    _,
                    "available-reserved-resources",
                ],
            ) => Some(Route::FmAvailable),
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
pub type RecordedRequest = sim_kit::RecordedRequest<Route>;

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
            Route::classify("GET", "/fabric_manager/api/v1/machines"),
            Some(Route::FmListMachines)
        );
        assert_eq!(
            Route::classify(
                "GET",
                "/fabric_manager/api/v1/machines/m/available-reserved-resources"
            ),
            Some(Route::FmAvailable)
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
}

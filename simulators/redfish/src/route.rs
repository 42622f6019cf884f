//! Which Redfish resource a request is for: used by fault injection and recording.

/// The routes of the simulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// `GET /redfish`, `/redfish/v1`, `/redfish/v1/odata`
    ServiceRoot,
    /// `GET /redfish/v1/SessionService`, `GET .../Sessions`
    SessionService,
    /// `POST /redfish/v1/SessionService/Sessions` (log in)
    CreateSession,
    /// `GET|DELETE /redfish/v1/SessionService/Sessions/<id>`
    Session,
    /// `GET /redfish/v1/CompositionService` and its zones
    CompositionService,
    /// `GET /redfish/v1/CompositionService/ResourceBlocks`
    ResourceBlocks,
    /// `GET .../ResourceBlocks/<id>` and its Processors / Memory
    ResourceBlock,
    /// `GET /redfish/v1/Systems`
    Systems,
    /// `GET /redfish/v1/Systems/<id>`
    System,
    /// `PATCH /redfish/v1/Systems/<id>` (compose / decompose)
    SystemPatch,
    /// `GET /redfish/v1/TaskService/TaskMonitors/<n>`
    TaskMonitor,
    /// `GET /redfish/v1/TaskService`, `.../Tasks`, `.../Tasks/<n>`
    Task,
    /// `GET /redfish/v1/AccountService`, its `Accounts` and `Roles` (read-only)
    AccountService,
}

impl Route {
    /// Classifies a request by method and path (no query); `None` for unknown paths.
    pub fn classify(method: &str, path: &str) -> Option<Route> {
        let path = path.trim_end_matches('/');
        let segs: Vec<&str> = path.split('/').skip(1).collect();
        Some(match segs.as_slice() {
            ["redfish"]
            | ["redfish", "v1"]
            | ["redfish", "v1", "odata"]
            | ["redfish", "v1", "$metadata"] => Route::ServiceRoot,
            ["redfish", "v1", "SessionService"] => Route::SessionService,
            ["redfish", "v1", "SessionService", "Sessions"] => match method {
                "POST" => Route::CreateSession,
                _ => Route::SessionService,
            },
            // A POST to a collection's `Members` is a POST to the collection.
            ["redfish", "v1", "SessionService", "Sessions", "Members"] if method == "POST" => {
                Route::CreateSession
            }
            ["redfish", "v1", "SessionService", "Sessions", _] => Route::Session,
            ["redfish", "v1", "CompositionService"]
            | ["redfish", "v1", "CompositionService", "ResourceZones", ..] => {
                Route::CompositionService
            }
            ["redfish", "v1", "CompositionService", "ResourceBlocks"] => Route::ResourceBlocks,
            [
                "redfish",
                "v1",
                "CompositionService",
                "ResourceBlocks",
                _,
                ..,
            ] => Route::ResourceBlock,
            ["redfish", "v1", "Systems"] => Route::Systems,
            ["redfish", "v1", "Systems", _] => match method {
                "PATCH" => Route::SystemPatch,
                _ => Route::System,
            },
            ["redfish", "v1", "TaskService", "TaskMonitors", _] => Route::TaskMonitor,
            ["redfish", "v1", "AccountService"]
            | ["redfish", "v1", "AccountService", "Accounts" | "Roles"]
            | ["redfish", "v1", "AccountService", "Accounts" | "Roles", _] => Route::AccountService,
            ["redfish", "v1", "TaskService"]
            | ["redfish", "v1", "TaskService", "Tasks"]
            | ["redfish", "v1", "TaskService", "Tasks", _] => Route::Task,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify() {
        assert_eq!(
            Route::classify("GET", "/redfish/v1/"),
            Some(Route::ServiceRoot)
        );
        assert_eq!(
            Route::classify("POST", "/redfish/v1/SessionService/Sessions"),
            Some(Route::CreateSession)
        );
        assert_eq!(
            Route::classify("PATCH", "/redfish/v1/Systems/node-0"),
            Some(Route::SystemPatch)
        );
        assert_eq!(
            Route::classify(
                "GET",
                "/redfish/v1/CompositionService/ResourceBlocks/GPU-1/Processors/GPU0"
            ),
            Some(Route::ResourceBlock)
        );
        assert_eq!(Route::classify("GET", "/redfish/v2"), None);
        assert_eq!(Route::classify("GET", "/redfish/v1/Systems/a/b"), None);
    }
}

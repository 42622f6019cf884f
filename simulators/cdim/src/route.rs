//! Which CDIM call a request is: used by fault injection and recording. CDIM serves
//! its configuration manager and its layout-apply service on ports of their own; each
//! listener knows only its service's paths.

/// The API base path of both services.
pub const BASE: &str = "/cdim/api/v1";

/// The two services.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Service {
    ConfigurationManager,
    LayoutApply,
}

/// The routes of the simulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// `GET /cdim/api/v1/resources`
    Resources,
    /// `GET /cdim/api/v1/resources/{id}`
    Resource,
    /// `GET /cdim/api/v1/nodes`
    Nodes,
    /// `GET /cdim/api/v1/nodes/{id}`
    Node,
    /// `POST /cdim/api/v1/layout-apply`
    LayoutApply,
    /// `GET /cdim/api/v1/layout-apply/{applyID}`
    ApplyStatus,
}

impl Route {
    /// Classifies a request to `service` by method and path (no query); `None` for
    /// what that service does not serve.
    pub fn classify(service: Service, method: &str, path: &str) -> Option<Route> {
        let rest = path.strip_prefix(BASE)?;
        let segs: Vec<&str> = rest.trim_end_matches('/').split('/').skip(1).collect();
        match (service, method, segs.as_slice()) {
            (Service::ConfigurationManager, "GET", ["resources"]) => Some(Route::Resources),
            (Service::ConfigurationManager, "GET", ["resources", id]) if !id.is_empty() => {
                Some(Route::Resource)
            }
            (Service::ConfigurationManager, "GET", ["nodes"]) => Some(Route::Nodes),
            (Service::ConfigurationManager, "GET", ["nodes", id]) if !id.is_empty() => {
                Some(Route::Node)
            }
            (Service::LayoutApply, "POST", ["layout-apply"]) => Some(Route::LayoutApply),
            (Service::LayoutApply, "GET", ["layout-apply", id]) if !id.is_empty() => {
                Some(Route::ApplyStatus)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_service_serves_its_own_paths() {
        let cm = Service::ConfigurationManager;
        let la = Service::LayoutApply;
        assert_eq!(
            Route::classify(cm, "GET", "/cdim/api/v1/resources"),
            Some(Route::Resources)
        );
        assert_eq!(
            Route::classify(cm, "GET", "/cdim/api/v1/resources/ABC"),
            Some(Route::Resource)
        );
        assert_eq!(
            Route::classify(cm, "GET", "/cdim/api/v1/nodes/"),
            Some(Route::Nodes)
        );
        assert_eq!(Route::classify(la, "GET", "/cdim/api/v1/nodes"), None);
        assert_eq!(
            Route::classify(la, "POST", "/cdim/api/v1/layout-apply"),
            Some(Route::LayoutApply)
        );
        assert_eq!(
            Route::classify(la, "GET", "/cdim/api/v1/layout-apply/0a1b2c3d4e"),
            Some(Route::ApplyStatus)
        );
        assert_eq!(
            Route::classify(cm, "POST", "/cdim/api/v1/layout-apply"),
            None
        );
        assert_eq!(
            Route::classify(cm, "DELETE", "/cdim/api/v1/resources/x"),
            None
        );
        assert_eq!(Route::classify(cm, "GET", "/cdim/api/v2/resources"), None);
        assert_eq!(
            Route::classify(cm, "GET", "/cdim/api/v1/resources/a/b"),
            None
        );
    }
}

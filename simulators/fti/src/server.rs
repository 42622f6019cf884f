//! The FTI protocol as the kit's server sees it: the routes, what the reply-level
//! faults do, and the bearer-token check in front of the FM and CM APIs.

use std::sync::Arc;
use std::time::SystemTime;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, header};
use bytes::Bytes;
use sim_kit::{Action, After, Controls, Listener, bind_loopback};
use tower::ServiceExt;

use crate::api;
use crate::faults::Fault;
use crate::record::Route;
use crate::shared::Shared;

pub(crate) struct Fti {
    shared: Arc<Shared>,
    router: Router,
}

impl Fti {
    pub fn new(shared: Arc<Shared>) -> Fti {
        let router = api::router(shared.clone());
        Fti { shared, router }
    }
}

impl sim_kit::Protocol for Fti {
    type Route = Route;
    type Fault = Fault;
    type Body = Body;

    fn controls(&self) -> &Controls<Fault, Route> {
        &self.shared.controls
    }

    fn now(&self) -> SystemTime {
        self.shared.now()
    }

    fn classify(&self, method: &str, path: &str) -> Option<Route> {
        Route::classify(method, path)
    }

    fn reply_fault(&self, fault: &Fault) -> Action<Response<Body>> {
        match fault {
            Fault::Drop => Action::Drop,
            Fault::Error {
                status,
                code,
                message,
            } => Action::Answer(api::fti_error(*status, code, message.clone(), None)),
            Fault::Reply { status, body } => Action::Answer(api::raw_reply(*status, body.clone())),
            Fault::DropAfterProcessing => Action::Handle(After::Drop),
            Fault::StallAfterProcessing(hold) => Action::Handle(After::Stall(*hold)),
            Fault::MalformedJson => Action::Handle(After::Truncate),
            // Not reply-level: the step they change takes them.
            _ => Action::Handle(After::Send),
        }
    }

    async fn handle(&self, req: Request<Bytes>, route: Option<Route>) -> Response<Body> {
        if route != Some(Route::Token) {
            let auth = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            if let Err(e) = self.shared.check_bearer(auth) {
                return api::unauthorized(&e);
            }
        }
        match self.router.clone().oneshot(req.map(Body::from)).await {
            Ok(resp) => resp,
            Err(never) => match never {},
        }
    }
}

/// Binds both listeners on 127.0.0.1: HTTPS with `tls`, and plain HTTP.
pub(crate) fn bind(
    https_port: u16,
    http_port: u16,
    tls: Arc<rustls::ServerConfig>,
) -> std::io::Result<[Listener; 2]> {
    Ok([
        Listener {
            socket: bind_loopback(https_port)?,
            tls: Some(tls),
        },
        Listener {
            socket: bind_loopback(http_port)?,
            tls: None,
        },
    ])
}

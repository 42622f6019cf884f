//! The CDIM protocol as the kit's server sees it, once per service: the routes, what
//! the reply-level faults do, and the conversion of [`api::handle`]'s replies to HTTP.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use sim_kit::{Action, After, Controls, raw_reply};

use crate::api::{self, Reply, Req};
use crate::faults::Fault;
use crate::route::{Route, Service};
use crate::shared::Shared;

/// Requests larger than this are refused (413) rather than buffered.
const MAX_BODY: usize = 1 << 20;

pub(crate) struct Cdim {
    pub shared: Arc<Shared>,
    pub service: Service,
}

impl sim_kit::Protocol for Cdim {
    type Route = Route;
    type Fault = Fault;
    type Body = Full<Bytes>;

    fn controls(&self) -> &Controls<Fault, Route> {
        &self.shared.controls
    }

    fn now(&self) -> SystemTime {
        SystemTime::now()
    }

    fn classify(&self, method: &str, path: &str) -> Option<Route> {
        Route::classify(self.service, method, path)
    }

    fn reply_fault(&self, fault: &Fault) -> Action<Response<Full<Bytes>>> {
        match fault {
            Fault::Drop => Action::Drop,
            Fault::Error {
                status,
                code,
                message,
            } => Action::Answer(to_response(api::error(*status, code, message))),
            Fault::Reply { status, body } => Action::Answer(raw_reply(*status, body.clone())),
            Fault::DropAfterProcessing => Action::Handle(After::Drop),
            Fault::MalformedJson => Action::Handle(After::Truncate),
            // Not reply-level: the layout-apply step takes them.
            Fault::Latency(_) | Fault::ApplyFails(_) | Fault::ApplyRollsBack => {
                Action::Handle(After::Send)
            }
        }
    }

    async fn handle(&self, req: Request<Bytes>, route: Option<Route>) -> Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let req = Req {
            method: parts.method.to_string(),
            path: parts.uri.path().to_string(),
            query: parts.uri.query().map(str::to_owned),
            body: body.to_vec(),
        };
        let reply = if req.body.len() > MAX_BODY {
            api::error(413, "E00413", "The request body is too large.")
        } else {
            api::handle(&self.shared, self.service, &req, route)
        };
        to_response(reply)
    }
}

fn to_response(reply: Reply) -> Response<Full<Bytes>> {
    let mut resp: Response<Full<Bytes>> = raw_reply(reply.status, String::new());
    *resp.body_mut() = Full::new(Bytes::from(
        serde_json::to_vec(&reply.body).unwrap_or_default(),
    ));
    resp.headers_mut().insert(
        "x-content-type-options",
        hyper::header::HeaderValue::from_static("nosniff"),
    );
    resp
}

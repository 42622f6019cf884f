//! The Redfish protocol as the kit's server sees it: the routes, what the reply-level
//! faults do, and the conversion of [`api::handle`]'s replies to HTTP.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use sim_kit::{Action, After, Controls, raw_reply};

use crate::api::{self, Reply, Req};
use crate::faults::Fault;
use crate::route::Route;
use crate::shared::{Shared, lock};

/// Requests larger than this are refused (413) rather than buffered.
const MAX_BODY: usize = 1 << 20;

pub(crate) struct Redfish {
    pub shared: Arc<Shared>,
}

impl sim_kit::Protocol for Redfish {
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
        Route::classify(method, path)
    }

    fn reply_fault(&self, fault: &Fault) -> Action<Response<Full<Bytes>>> {
        match fault {
            Fault::Drop => Action::Drop,
            Fault::Error {
                status,
                message_id,
                message,
            } => Action::Answer(to_response(api::error(*status, message_id, message, &[]))),
            Fault::Reply { status, body } => Action::Answer(raw_reply(*status, body.clone())),
            Fault::ExpireSession => {
                // Handled as usual, and so answered 401 for want of a session.
                lock(&self.shared.state).sessions.clear();
                Action::Handle(After::Send)
            }
            Fault::DropAfterProcessing => Action::Handle(After::Drop),
            Fault::MalformedJson => Action::Handle(After::Truncate),
            // Not reply-level: the composition step takes them.
            Fault::Latency(_) | Fault::ComposeFails(_) => Action::Handle(After::Send),
        }
    }

    async fn handle(&self, req: Request<Bytes>, route: Option<Route>) -> Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let req = Req {
            method: parts.method.to_string(),
            path: parts.uri.path().to_string(),
            headers: parts
                .headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body: body.to_vec(),
        };
        let reply = if req.body.len() > MAX_BODY {
            api::error(
                413,
                "PayloadTooLarge",
                "The request body is too large.",
                &[],
            )
        } else {
            api::handle(&self.shared, &req, route)
        };
        to_response(reply)
    }
}

fn to_response(reply: Reply) -> Response<Full<Bytes>> {
    let body = match (&reply.body, &reply.xml) {
        (_, Some(xml)) => xml.as_bytes().to_vec(),
        (Some(b), None) => serde_json::to_vec_pretty(b).unwrap_or_default(),
        (None, None) => Vec::new(),
    };
    let mut resp: Response<Full<Bytes>> = raw_reply(reply.status, String::new());
    *resp.body_mut() = Full::new(Bytes::from(body));
    if reply.xml.is_some() {
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/xml;charset=utf-8"),
        );
    } else if reply.body.is_some() {
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json;charset=utf-8"),
        );
    } else {
        resp.headers_mut().remove(hyper::header::CONTENT_TYPE);
    }
    for (k, v) in reply.headers {
        if let (Ok(k), Ok(v)) = (
            hyper::header::HeaderName::from_bytes(k.as_bytes()),
            hyper::header::HeaderValue::from_str(&v),
        ) {
            resp.headers_mut().append(k, v);
        }
    }
    resp
}

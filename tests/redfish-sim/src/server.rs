//! The HTTP side: a hyper server on its own thread, which records each request, applies
//! reply-level faults around [`api::handle`] and really drops connections.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::{self, Reply, Req};
use crate::faults::Fault;
use crate::route::Route;
use crate::shared::{RecordedRequest, Shared, lock};

/// Returned by the service to make hyper abandon the connection without a reply.
#[derive(Debug)]
struct DropConnection;

impl std::fmt::Display for DropConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped by fault injection")
    }
}

impl std::error::Error for DropConnection {}

/// Requests larger than this are refused (413) rather than buffered.
const MAX_BODY: usize = 1 << 20;

pub(crate) async fn serve(
    shared: Arc<Shared>,
    listener: std::net::TcpListener,
    mut shutdown: watch::Receiver<bool>,
    ready: std::sync::mpsc::Sender<std::io::Result<()>>,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => {
            let _ = ready.send(Ok(()));
            l
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    tokio::select! {
        () = accept_loop(listener, shared) => {}
        _ = shutdown.changed() => {}
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of descriptors and the like: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(req, shared.clone()));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    shared: Arc<Shared>,
) -> Result<Response<Full<Bytes>>, DropConnection> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|_| DropConnection)?.to_bytes();
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
    let route = Route::classify(&req.method, &req.path);
    lock(&shared.requests).push(RecordedRequest {
        method: req.method.clone(),
        path: req.path.clone(),
        route,
        headers: req.headers.clone(),
        body: req.body.clone(),
    });

    let plan = lock(&shared.faults).plan_reply(route);
    if !plan.latency.is_zero() {
        tokio::time::sleep(plan.latency).await;
    }
    match &plan.action {
        Some(Fault::Drop) => return Err(DropConnection),
        Some(Fault::Error {
            status,
            message_id,
            message,
        }) => return Ok(to_response(api::error(*status, message_id, message, &[]))),
        Some(Fault::Reply { status, body }) => return Ok(raw(*status, body.clone())),
        Some(Fault::ExpireSession) => {
            lock(&shared.state).sessions.clear();
        }
        _ => {}
    }
    let reply = if req.body.len() > MAX_BODY {
        api::error(
            413,
            "PayloadTooLarge",
            "The request body is too large.",
            &[],
        )
    } else {
        api::handle(&shared, &req, route)
    };
    match plan.action {
        Some(Fault::DropAfterProcessing) => Err(DropConnection),
        Some(Fault::MalformedJson) => {
            let mut resp = to_response(reply);
            let bytes = resp
                .body()
                .clone()
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            // Cut in half, and one more byte if the half still parses (e.g. `{}`).
            let mut cut = bytes.slice(..bytes.len() / 2).to_vec();
            if serde_json::from_slice::<serde_json::Value>(&cut).is_ok() {
                cut.push(b'{');
            }
            resp.headers_mut().remove(hyper::header::CONTENT_LENGTH);
            *resp.body_mut() = Full::new(Bytes::from(cut));
            Ok(resp)
        }
        _ => Ok(to_response(reply)),
    }
}

fn raw(status: u16, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

fn to_response(reply: Reply) -> Response<Full<Bytes>> {
    let body = match (&reply.body, &reply.xml) {
        (_, Some(xml)) => xml.as_bytes().to_vec(),
        (Some(b), None) => serde_json::to_vec_pretty(b).unwrap_or_default(),
        (None, None) => Vec::new(),
    };
    let mut resp = raw(reply.status, String::new());
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

//! Listeners, TLS, and the per-request wrapper that records requests, applies
//! reply-level faults, enforces bearer tokens and really drops connections.
//!
//! The server runs on its own thread with its own single-threaded runtime, so it keeps
//! answering whatever the caller does with its own threads (a blocking test, a
//! current-thread runtime busy inside a wasm call, a benchmark).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::api;
use crate::faults::Fault;
use crate::record::{RecordedRequest, Route};
use crate::shared::{Shared, lock};

/// Returned by the service to make hyper abandon the connection without a reply.
#[derive(Debug)]
struct DropConnection;

impl std::fmt::Display for DropConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped by fault injection")
    }
}

impl std::error::Error for DropConnection {}

pub(crate) struct Listeners {
    pub https: std::net::TcpListener,
    pub http: std::net::TcpListener,
}

/// Runs until `shutdown` changes or its sender is dropped.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    tls: Arc<rustls::ServerConfig>,
    listeners: Listeners,
    mut shutdown: watch::Receiver<bool>,
    ready: std::sync::mpsc::Sender<std::io::Result<()>>,
) {
    let converted = TcpListener::from_std(listeners.https)
        .and_then(|https| Ok((https, TcpListener::from_std(listeners.http)?)));
    let (https, http) = match converted {
        Ok(pair) => {
            let _ = ready.send(Ok(()));
            pair
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let router = api::router(shared.clone());
    let acceptor = TlsAcceptor::from(tls);
    tokio::select! {
        () = accept_loop(https, Some(acceptor), shared.clone(), router.clone()) => {}
        () = accept_loop(http, None, shared, router) => {}
        _ = shutdown.changed() => {}
    }
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    shared: Arc<Shared>,
    router: Router,
) {
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
        let router = router.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                Some(acceptor) => {
                    if let Ok(stream) = acceptor.accept(stream).await {
                        serve_connection(TokioIo::new(stream), true, shared, router).await;
                    }
                }
                None => serve_connection(TokioIo::new(stream), false, shared, router).await,
            }
        });
    }
}

async fn serve_connection<I>(io: I, tls: bool, shared: Arc<Shared>, router: Router)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = service_fn(move |req| handle(req, tls, shared.clone(), router.clone()));
    // An error here is a dropped connection or a client going away; either way the
    // stream is closed when this returns.
    let _ = http1::Builder::new().serve_connection(io, service).await;
}

async fn handle(
    req: Request<Incoming>,
    tls: bool,
    shared: Arc<Shared>,
    router: Router,
) -> Result<Response<Body>, DropConnection> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|_| DropConnection)?.to_bytes();
    let route = Route::classify(parts.method.as_str(), parts.uri.path());
    shared.record(RecordedRequest {
        seq: 0,
        at: shared.now(),
        tls,
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(String::from),
        route,
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
    });

    let plan = lock(&shared.faults).plan_reply(route);
    if !plan.latency.is_zero() {
        tokio::time::sleep(plan.latency).await;
    }
    match &plan.action {
        Some(Fault::Drop) => return Err(DropConnection),
        Some(Fault::Error {
            status,
            code,
            message,
        }) => return Ok(api::fti_error(*status, code, message.clone(), None)),
        Some(Fault::Reply { status, body }) => return Ok(api::raw_reply(*status, body.clone())),
        _ => {}
    }

    if route != Some(Route::Token) {
        let auth = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if let Err(e) = shared.check_bearer(auth) {
            return Ok(api::unauthorized(&e));
        }
    }

    let resp = match router
        .oneshot(Request::from_parts(parts, Body::from(body)))
        .await
    {
        Ok(resp) => resp,
        Err(never) => match never {},
    };
    match plan.action {
        Some(Fault::DropAfterProcessing) => Err(DropConnection),
        Some(Fault::StallAfterProcessing(hold)) => {
            tokio::time::sleep(hold).await;
            Err(DropConnection)
        }
        Some(Fault::MalformedJson) => Ok(truncate_body(resp).await),
        _ => Ok(resp),
    }
}

/// Same status and headers, the body cut in half so no JSON parser accepts it.
async fn truncate_body(resp: Response<Body>) -> Response<Body> {
    let (mut parts, body) = resp.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let mut cut = bytes.slice(..bytes.len() / 2).to_vec();
    if serde_json::from_slice::<serde_json::Value>(&cut).is_ok() {
        cut.extend_from_slice(b"{\"");
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(cut))
}

/// Binds both listeners on 127.0.0.1.
pub(crate) fn bind(https_port: u16, http_port: u16) -> std::io::Result<Listeners> {
    let bind = |port: u16| -> std::io::Result<std::net::TcpListener> {
        let l = std::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port)))?;
        l.set_nonblocking(true)?;
        Ok(l)
    };
    Ok(Listeners {
        https: bind(https_port)?,
        http: bind(http_port)?,
    })
}

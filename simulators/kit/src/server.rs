//! Loopback listeners served on a thread of their own, and the per-request wrapper that
//! records each request, applies reply-level faults around the simulator's handler and
//! really drops connections.
//!
//! The server runs on its own thread with its own single-threaded runtime, so it keeps
//! answering whatever the caller does with its own threads (a blocking test, a
//! current-thread runtime busy inside a wasm call, a benchmark).

use std::error::Error as StdError;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::controls::Controls;
use crate::faults::{Action, After, FaultKind};
use crate::lock;
use crate::record::RecordedRequest;

/// A simulator's protocol: how it names requests, what its reply-level faults do, and
/// how it answers. The kit does everything around that.
pub trait Protocol: Send + Sync + 'static {
    type Route: Copy + PartialEq + Send + Sync + 'static;
    type Fault: FaultKind + Send + 'static;
    /// The reply body: built from bytes when the kit rewrites a reply.
    type Body: Body<Data = Bytes, Error: Into<Box<dyn StdError + Send + Sync>>>
        + From<Vec<u8>>
        + Send
        + 'static;

    fn controls(&self) -> &Controls<Self::Fault, Self::Route>;

    /// Now on the simulator's clock (tests may move it): the arrival time recorded.
    fn now(&self) -> SystemTime;

    /// Which API call a request is, by method and path (leading slash, no query).
    fn classify(&self, method: &str, path: &str) -> Option<Self::Route>;

    /// What a reply-level fault ([`FaultKind::is_reply_level`]) does to this request.
    fn reply_fault(&self, fault: &Self::Fault) -> Action<Response<Self::Body>>;

    /// Answers a request (the body read in full).
    fn handle(
        &self,
        req: Request<Bytes>,
        route: Option<Self::Route>,
    ) -> impl Future<Output = Response<Self::Body>> + Send;
}

/// One socket to serve, with the TLS configuration if it speaks HTTPS.
pub struct Listener {
    pub socket: std::net::TcpListener,
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// Binds 127.0.0.1:`port` (0 picks a free port), non-blocking as the server needs it.
pub fn bind_loopback(port: u16) -> std::io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port)))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// A running server. It stops on [`Server::shutdown`] or when dropped.
pub struct Server {
    shutdown: watch::Sender<bool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

impl Server {
    /// Serves `listeners` with `protocol` on a thread named `name`; returns once they
    /// accept connections. Needs no async runtime from the caller.
    pub fn start<P: Protocol>(
        name: String,
        protocol: Arc<P>,
        listeners: Vec<Listener>,
    ) -> std::io::Result<Server> {
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            runtime.block_on(serve(protocol, listeners, shutdown_rx, ready_tx));
        })?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(std::io::Error::other(
                    "server thread ended before it was ready",
                ));
            }
        }
        Ok(Server {
            shutdown,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Stops the server and waits for its thread; open connections are closed.
    pub fn shutdown(&self) {
        let _ = self.shutdown.send(true);
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }
}

/// Runs until `shutdown` changes or its sender is dropped; the runtime ending with the
/// thread drops the accept loops and open connections.
async fn serve<P: Protocol>(
    protocol: Arc<P>,
    listeners: Vec<Listener>,
    mut shutdown: watch::Receiver<bool>,
    ready: std::sync::mpsc::Sender<std::io::Result<()>>,
) {
    let converted: std::io::Result<Vec<_>> = listeners
        .into_iter()
        .map(|l| {
            Ok((
                TcpListener::from_std(l.socket)?,
                l.tls.map(TlsAcceptor::from),
            ))
        })
        .collect();
    let listeners = match converted {
        Ok(listeners) => {
            let _ = ready.send(Ok(()));
            listeners
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    for (listener, tls) in listeners {
        tokio::spawn(accept_loop(listener, tls, protocol.clone()));
    }
    let _ = shutdown.changed().await;
}

async fn accept_loop<P: Protocol>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    protocol: Arc<P>,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(_) => {
                // Out of descriptors and the like: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        // The address the client connected to: with the peer, what names its socket.
        let Ok(local) = stream.local_addr() else {
            continue;
        };
        let protocol = protocol.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let conn = Arc::new(Connection {
                peer,
                local,
                caller: Mutex::new(caller_of(protocol.controls(), peer, local).await),
                tls: tls.is_some(),
            });
            match tls {
                Some(acceptor) => {
                    if let Ok(stream) = acceptor.accept(stream).await {
                        serve_connection(TokioIo::new(stream), conn, protocol).await;
                    }
                }
                None => serve_connection(TokioIo::new(stream), conn, protocol).await,
            }
        });
    }
}

/// What every request of one connection shares.
struct Connection {
    peer: SocketAddr,
    /// This server's side of the connection.
    local: SocketAddr,
    /// Named at accept; a connection the resolver could not name then is asked about
    /// again at its requests (see [`named_caller`]).
    caller: Mutex<Option<String>>,
    tls: bool,
}

/// The caller of `conn`, asking the resolver again if it was not named at accept (a
/// resolver installed after the accept, or a client it did not know then): the client is
/// waiting for this request's reply, so its socket exists.
async fn named_caller<F, R>(controls: &Controls<F, R>, conn: &Connection) -> Option<String>
where
    F: FaultKind,
    R: Clone + PartialEq,
{
    if let Some(name) = lock(&conn.caller).clone() {
        return Some(name);
    }
    let name = caller_of(controls, conn.peer, conn.local).await?;
    *lock(&conn.caller) = Some(name.clone());
    Some(name)
}

/// The caller the installed resolver names for `peer`, asked now, before the first
/// request: the client is waiting for this connection (its handshake, its reply), so its
/// socket exists. The resolver may read files (/proc), so it runs off the server's one
/// thread, which keeps serving the other connections meanwhile.
async fn caller_of<F, R>(
    controls: &Controls<F, R>,
    peer: SocketAddr,
    local: SocketAddr,
) -> Option<String>
where
    F: FaultKind,
    R: Clone + PartialEq,
{
    let resolve = controls.caller_resolver()?;
    tokio::task::spawn_blocking(move || resolve(peer, local))
        .await
        .ok()
        .flatten()
}

async fn serve_connection<I, P: Protocol>(io: I, conn: Arc<Connection>, protocol: Arc<P>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = service_fn(move |req| handle(req, conn.clone(), protocol.clone()));
    // An error here is a dropped connection or a client going away; either way the
    // stream is closed when this returns.
    let _ = http1::Builder::new().serve_connection(io, service).await;
}

/// Returned by the service to make hyper abandon the connection without a reply.
#[derive(Debug, thiserror::Error)]
#[error("connection dropped by fault injection")]
struct DropConnection;

async fn handle<P: Protocol>(
    req: Request<Incoming>,
    conn: Arc<Connection>,
    protocol: Arc<P>,
) -> Result<Response<P::Body>, DropConnection> {
    // Taken as the request arrives (its head read), before its body.
    let wall = SystemTime::now();
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|_| DropConnection)?.to_bytes();
    let route = protocol.classify(parts.method.as_str(), parts.uri.path());
    let controls = protocol.controls();
    let caller = named_caller(controls, &conn).await;
    controls.record(recorded(
        &parts,
        &body,
        (&conn, caller),
        route,
        (protocol.now(), wall),
    ));

    let plan = controls.plan_reply(route.as_ref());
    if !plan.latency.is_zero() {
        tokio::time::sleep(plan.latency).await;
    }
    let after = match plan.action.map(|fault| protocol.reply_fault(&fault)) {
        Some(Action::Drop) => return Err(DropConnection),
        Some(Action::Answer(reply)) => return Ok(reply),
        Some(Action::Handle(after)) => after,
        None => After::Send,
    };
    let reply = protocol
        .handle(Request::from_parts(parts, body), route)
        .await;
    match after {
        After::Send => Ok(reply),
        After::Drop => Err(DropConnection),
        After::Stall(hold) => {
            tokio::time::sleep(hold).await;
            Err(DropConnection)
        }
        After::Truncate => Ok(truncate_body(reply).await),
    }
}

/// `(at, wall)`: arrival on the simulator's clock and on the system's.
fn recorded<R>(
    parts: &hyper::http::request::Parts,
    body: &Bytes,
    (conn, caller): (&Connection, Option<String>),
    route: Option<R>,
    (at, wall): (SystemTime, SystemTime),
) -> RecordedRequest<R> {
    RecordedRequest {
        seq: 0,
        at,
        wall,
        peer: conn.peer,
        caller,
        tls: conn.tls,
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
    }
}

/// Same status and headers, the body cut in half so no JSON parser accepts it.
async fn truncate_body<B>(reply: Response<B>) -> Response<B>
where
    B: Body<Data = Bytes> + From<Vec<u8>>,
{
    let (mut parts, body) = reply.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let mut cut = bytes.slice(..bytes.len() / 2).to_vec();
    // Half of a short body may still parse (`12` cut to `1`): then add what no JSON
    // value continues with.
    if serde_json::from_slice::<serde_json::Value>(&cut).is_ok() {
        cut.extend_from_slice(b"{\"");
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, B::from(cut))
}

/// A reply of exactly this status and body, content type `application/json` (an
/// unknown status becomes 500).
pub fn raw_reply<B: From<Vec<u8>>>(status: u16, body: String) -> Response<B> {
    let mut reply = Response::new(B::from(body.into_bytes()));
    *reply.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    reply.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    reply
}

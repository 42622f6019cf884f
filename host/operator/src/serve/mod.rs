//! Serving HTTP(S) to clients we do not control (the API server calling the webhook,
//! anything that reaches the probe and metrics port) with every wait bounded: a
//! connection limit, a TLS handshake timeout, a header-read timeout, a body timeout and
//! size limit, and an idle timeout. Without them, a client that sends half a header or
//! announces a large body and then stalls holds a task and a socket forever.

pub(crate) mod certs;
pub(crate) mod metrics_auth;
pub(crate) mod probes;
pub(crate) mod webhook;

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

/// The bounds of one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ServerLimits {
    /// Connections served at once; more are closed as soon as they are accepted.
    pub(crate) max_connections: usize,
    /// From accepting a connection to a finished TLS handshake.
    pub(crate) handshake_timeout: Duration,
    /// From the first byte a request may start with to its last header line (also the
    /// wait for the next request on a kept-alive connection).
    pub(crate) header_read_timeout: Duration,
    /// From the end of the headers to the last byte of the body.
    pub(crate) body_timeout: Duration,
    /// Largest body accepted; a larger one (announced or sent) is refused with 413.
    pub(crate) max_body_bytes: usize,
    /// A connection without a byte read or written for this long is closed.
    pub(crate) idle_timeout: Duration,
}

impl ServerLimits {
    /// The webhook: AdmissionReviews are a few KiB; the API server calls with a 10 s
    /// timeout and reuses connections.
    pub(crate) const WEBHOOK: ServerLimits = ServerLimits {
        max_connections: 256,
        handshake_timeout: Duration::from_secs(10),
        header_read_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(10),
        max_body_bytes: 3 * 1024 * 1024,
        idle_timeout: Duration::from_secs(90),
    };
    /// Probes and metrics: bodiless GETs from the kubelet and a scraper.
    pub(crate) const PROBES: ServerLimits = ServerLimits {
        max_connections: 64,
        handshake_timeout: Duration::from_secs(10),
        header_read_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(10),
        max_body_bytes: 64 * 1024,
        idle_timeout: Duration::from_secs(60),
    };
}

/// Accepts connections on `listener` until `shutdown` resolves; each one is served by
/// `router`, over TLS when `tls` is given. Connections still open at shutdown are
/// dropped with the returned future's tasks aborted.
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    router: Router,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut connections = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    // Out of descriptors and the like: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            () = &mut shutdown => return,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Refusing at once keeps the limit a limit; the client sees a closed
            // connection and may retry.
            tracing::warn!(
                limit = limits.max_connections,
                "connection limit reached; closing a new connection"
            );
            drop(stream);
            continue;
        };
        let (tls, router) = (tls.clone(), router.clone());
        connections.spawn(async move {
            let _slot = slot;
            let activity = Arc::new(Activity::new());
            let io = Watched {
                inner: stream,
                activity: activity.clone(),
            };
            let served = async {
                match tls {
                    Some(acceptor) => {
                        match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(io))
                            .await
                        {
                            Ok(Ok(stream)) => serve_connection(stream, router, limits).await,
                            Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                            Err(_) => tracing::debug!("TLS handshake timed out"),
                        }
                    }
                    None => serve_connection(io, router, limits).await,
                }
            };
            tokio::select! {
                () = served => {}
                () = activity.idle_for(limits.idle_timeout) => {
                    tracing::debug!("closing an idle connection");
                }
            }
        });
    }
}

async fn serve_connection<S>(stream: S, router: Router, limits: ServerLimits)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request: Request<hyper::body::Incoming>| {
        let router = router.clone();
        async move { Ok::<_, Infallible>(handle(request, router, limits).await) }
    });
    if let Err(e) = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        tracing::debug!(error = %e, "connection ended");
    }
}

/// Reads the whole body within the limits, then hands the request to the router.
async fn handle(
    request: Request<hyper::body::Incoming>,
    router: Router,
    limits: ServerLimits,
) -> Response<Body> {
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > limits.max_body_bytes as u64) {
        return refusal(StatusCode::PAYLOAD_TOO_LARGE, "request body too large");
    }
    let (parts, body) = request.into_parts();
    let collected = tokio::time::timeout(
        limits.body_timeout,
        Limited::new(body, limits.max_body_bytes).collect(),
    )
    .await;
    let bytes = match collected {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return refusal(StatusCode::PAYLOAD_TOO_LARGE, "request body too large");
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "reading a request body failed");
            return refusal(StatusCode::BAD_REQUEST, "cannot read the request body");
        }
        Err(_) => return refusal(StatusCode::REQUEST_TIMEOUT, "request body too slow"),
    };
    let request = Request::from_parts(parts, Body::from(bytes));
    router
        .oneshot(request)
        .await
        .unwrap_or_else(|never| match never {})
}

fn refusal(status: StatusCode, message: &'static str) -> Response<Body> {
    let mut response = Response::new(Body::from(message));
    *response.status_mut() = status;
    // The rest of what the client sends is not read: the connection must not be reused.
    response.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    response
}

/// When a connection last moved a byte, in milliseconds since it was accepted.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Resolves once no byte has moved for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let until = last + idle;
            if Instant::now() >= until {
                return;
            }
            tokio::time::sleep_until(until.into()).await;
        }
    }
}

/// A stream that records its activity.
struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::{get, post};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    fn quick() -> ServerLimits {
        ServerLimits {
            max_connections: 150,
            handshake_timeout: Duration::from_millis(500),
            header_read_timeout: Duration::from_millis(500),
            body_timeout: Duration::from_millis(500),
            max_body_bytes: 1024,
            idle_timeout: Duration::from_secs(2),
        }
    }

    async fn start(
        limits: ServerLimits,
    ) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new()
            .route("/", get(|| async { "ok" }))
            .route("/echo", post(|body: String| async move { body }));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(listener, None, router, limits, async {
            let _ = rx.await;
        }));
        (addr, tx)
    }

    /// Reads until the peer closes (Ok) or `limit` passes (Err).
    async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Result<Vec<u8>, ()> {
        let mut got = Vec::new();
        tokio::time::timeout(limit, async {
            let mut buf = [0u8; 1024];
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await
        .map_err(|_| ())?;
        Ok(got)
    }

    #[tokio::test]
    async fn a_hundred_half_headers_are_all_closed() {
        let (addr, _stop) = start(quick()).await;
        let mut conns = Vec::new();
        for _ in 0..100 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .await
                .unwrap();
            conns.push(s);
        }
        // Every one is closed by the header timeout (0.5 s), long before the 10 s here.
        for s in &mut conns {
            closed_within(s, Duration::from_secs(10))
                .await
                .expect("still held");
        }
        // And the server still answers.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let reply = closed_within(&mut s, Duration::from_secs(10))
            .await
            .unwrap();
        assert!(String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 200"));
    }

    #[tokio::test]
    async fn an_announced_huge_body_is_refused_at_once() {
        let (addr, _stop) = start(quick()).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10737418240\r\n\r\n0123456789",
        )
        .await
        .unwrap();
        let reply = closed_within(&mut s, Duration::from_secs(10))
            .await
            .expect("held");
        assert!(
            String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 413"),
            "{}",
            String::from_utf8_lossy(&reply)
        );
    }

    #[tokio::test]
    async fn a_body_that_stops_arriving_is_cut_off() {
        // Within the size limit, but only 10 of the announced bytes ever come.
        let (addr, _stop) = start(quick()).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
            .await
            .unwrap();
        let reply = closed_within(&mut s, Duration::from_secs(10))
            .await
            .expect("held");
        assert!(
            String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 408"),
            "{}",
            String::from_utf8_lossy(&reply)
        );
        // A chunked body larger than the limit is refused too.
        let mut s = TcpStream::connect(addr).await.unwrap();
        let chunk = "x".repeat(2000);
        let req = format!(
            "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
            chunk.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let reply = closed_within(&mut s, Duration::from_secs(10))
            .await
            .expect("held");
        assert!(String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 413"));
    }

    #[tokio::test]
    async fn connections_over_the_limit_are_closed_and_idle_ones_time_out() {
        let mut limits = quick();
        limits.max_connections = 3;
        limits.idle_timeout = Duration::from_millis(800);
        limits.header_read_timeout = Duration::from_secs(30);
        let (addr, _stop) = start(limits).await;
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(TcpStream::connect(addr).await.unwrap());
        }
        // Let the server accept the three before the fourth arrives.
        let mut extra = TcpStream::connect(addr).await.unwrap();
        closed_within(&mut extra, Duration::from_secs(5))
            .await
            .expect("the fourth connection is closed at once");
        // The three say nothing: the idle timeout closes them.
        for s in &mut held {
            closed_within(s, Duration::from_secs(10))
                .await
                .expect("idle connection held");
        }
    }
}

//! `/metrics`, `/healthz` and `/readyz` over plain HTTP, or over HTTPS with `/metrics`
//! behind Kubernetes authn/authz ([`crate::serve::metrics_auth`]), with the bounds of
//! [`crate::serve`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::error::OperatorError;
use crate::metrics::Metrics;
use crate::serve::metrics_auth::{self, MetricsAuth};
use crate::serve::{self, ServerLimits};

/// Readiness: set once the operator serves (controllers running, or standing by for
/// the Lease with the webhook up).
#[derive(Debug, Default)]
pub struct Readiness(AtomicBool);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

#[derive(Clone)]
struct ProbeState {
    metrics: Arc<Metrics>,
    ready: Arc<Readiness>,
    /// When set, `/metrics` answers only authorised scrapers; probes stay open (the
    /// kubelet sends no token).
    auth: Option<MetricsAuth>,
}

fn router_with_auth(
    metrics: Arc<Metrics>,
    ready: Arc<Readiness>,
    auth: Option<MetricsAuth>,
) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready_handler))
        .with_state(ProbeState {
            metrics,
            ready,
            auth,
        })
}

async fn metrics_handler(State(s): State<ProbeState>, headers: HeaderMap) -> Response {
    if let Some(auth) = &s.auth
        && let Err(refused) = auth.check(&headers).await
    {
        return refused.into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
        .into_response()
}

async fn ready_handler(State(s): State<ProbeState>) -> impl IntoResponse {
    if s.ready.get() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

pub(crate) struct ProbeServer {
    listener: TcpListener,
    secure: Option<(MetricsAuth, Arc<rustls::ServerConfig>)>,
}

impl ProbeServer {
    pub(crate) async fn bind(addr: SocketAddr) -> Result<Self, OperatorError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| OperatorError::Listen { addr, source })?;
        Ok(Self {
            listener,
            secure: None,
        })
    }

    /// HTTPS (self-signed) with `/metrics` for authorised scrapers only.
    pub(crate) async fn bind_secure(
        addr: SocketAddr,
        client: kube::Client,
    ) -> Result<Self, OperatorError> {
        let tls = metrics_auth::self_signed_tls()
            .map_err(|e| OperatorError::Config(format!("metrics TLS: {e}")))?;
        let mut server = Self::bind(addr).await?;
        server.secure = Some((MetricsAuth::new(client), tls));
        Ok(server)
    }

    pub(crate) fn local_addr(&self) -> Result<SocketAddr, OperatorError> {
        self.listener
            .local_addr()
            .map_err(|e| OperatorError::Config(e.to_string()))
    }

    pub(crate) async fn serve(
        self,
        metrics: Arc<Metrics>,
        ready: Arc<Readiness>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), OperatorError> {
        let (auth, tls) = match self.secure {
            Some((auth, tls)) => (Some(auth), Some(TlsAcceptor::from(tls))),
            None => (None, None),
        };
        serve::serve(
            self.listener,
            tls,
            router_with_auth(metrics, ready, auth),
            ServerLimits::PROBES,
            shutdown,
        )
        .await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// Reads until the server closes; Err if it still holds the connection at `limit`.
    async fn closed_within(s: &mut TcpStream, limit: Duration) -> Result<String, ()> {
        let mut got = Vec::new();
        tokio::time::timeout(limit, async {
            let mut buf = [0u8; 512];
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
        })
        .await
        .map_err(|_| ())?;
        Ok(String::from_utf8_lossy(&got).into_owned())
    }

    /// The probe server as `cro run` starts it, attacked as in the issue: a request
    /// announcing a 10 GiB body and sending 10 bytes is answered at once instead of being
    /// held, and 100 connections sending half a header are all closed well within 40 s
    /// (those over the connection limit at once, the others by the 10 s header timeout).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slow_and_lying_clients_are_bounded() {
        let server = ProbeServer::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = server.local_addr().unwrap();
        let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(server.serve(
            Arc::new(Metrics::new()),
            Arc::new(Readiness::default()),
            async {
                let _ = stopped.await;
            },
        ));
        let mut liar = TcpStream::connect(addr).await.unwrap();
        liar.write_all(
            b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 10737418240\r\n\r\n0123456789",
        )
        .await
        .unwrap();
        let reply = closed_within(&mut liar, Duration::from_secs(5))
            .await
            .expect("the 10 GiB announcement is held");
        assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
        let mut half = Vec::new();
        for _ in 0..100 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Half: ")
                .await
                .unwrap();
            half.push(s);
        }
        for s in &mut half {
            closed_within(s, Duration::from_secs(40))
                .await
                .expect("a half-header connection is still held after 40 s");
        }
        // Still serving.
        let mut ok = TcpStream::connect(addr).await.unwrap();
        ok.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let reply = closed_within(&mut ok, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    }
}

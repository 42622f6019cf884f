//! `/metrics`, `/healthz` and `/readyz` over plain HTTP, with the bounds of
//! [`crate::serve`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::error::OperatorError;
use crate::metrics::Metrics;
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
}

pub fn router(metrics: Arc<Metrics>, ready: Arc<Readiness>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready_handler))
        .with_state(ProbeState { metrics, ready })
}

async fn metrics_handler(State(s): State<ProbeState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

async fn ready_handler(State(s): State<ProbeState>) -> impl IntoResponse {
    if s.ready.get() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

pub struct ProbeServer {
    listener: TcpListener,
}

impl ProbeServer {
    pub async fn bind(addr: SocketAddr) -> Result<Self, OperatorError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| OperatorError::Listen { addr, source })?;
        Ok(Self { listener })
    }

    pub fn local_addr(&self) -> Result<SocketAddr, OperatorError> {
        self.listener
            .local_addr()
            .map_err(|e| OperatorError::Config(e.to_string()))
    }

    pub async fn serve(
        self,
        metrics: Arc<Metrics>,
        ready: Arc<Readiness>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), OperatorError> {
        serve::serve(
            self.listener,
            None,
            router(metrics, ready),
            ServerLimits::PROBES,
            shutdown,
        )
        .await;
        Ok(())
    }
}

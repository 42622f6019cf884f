//! The validating admission webhook of ComposabilityRequest (SPEC §6), over TLS.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use cro_api::ComposabilityRequest;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::admission::{self, Refusal};
use crate::error::OperatorError;
use crate::metrics::Metrics;
use crate::views;

/// The path the Go operator's webhook configuration uses.
pub const VALIDATE_PATH: &str = "/validate-cro-hpsys-ibm-ie-com-v1alpha1-composabilityrequest";
/// A TLS handshake that takes longer is dropped, so idle sockets cannot pile up.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The webhook's server certificate and key.
#[derive(Clone)]
pub struct WebhookTls(Arc<rustls::ServerConfig>);

impl WebhookTls {
    pub fn from_pem(cert_chain: &[u8], key: &[u8]) -> Result<Self, OperatorError> {
        let bad =
            |what: &str, e: &dyn std::fmt::Display| OperatorError::Webhook(format!("{what}: {e}"));
        let certs = CertificateDer::pem_slice_iter(cert_chain)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad("certificate", &e))?;
        if certs.is_empty() {
            return Err(OperatorError::Webhook("no certificate in the PEM".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| bad("private key", &e))?;
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("TLS", &e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| bad("certificate and key", &e))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self(Arc::new(config)))
    }

    pub fn from_files(cert_file: &Path, key_file: &Path) -> Result<Self, OperatorError> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|e| OperatorError::Webhook(format!("{}: {e}", p.display())))
        };
        Self::from_pem(&read(cert_file)?, &read(key_file)?)
    }
}

#[derive(Clone)]
struct WebhookState {
    client: kube::Client,
    metrics: Arc<Metrics>,
}

/// A bound webhook listener; [`WebhookServer::serve`] answers until shutdown.
pub struct WebhookServer {
    listener: TcpListener,
    tls: WebhookTls,
}

impl WebhookServer {
    pub async fn bind(addr: SocketAddr, tls: WebhookTls) -> Result<Self, OperatorError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| OperatorError::Listen { addr, source })?;
        Ok(Self { listener, tls })
    }

    pub fn local_addr(&self) -> Result<SocketAddr, OperatorError> {
        self.listener
            .local_addr()
            .map_err(|e| OperatorError::Webhook(e.to_string()))
    }

    pub async fn serve(
        self,
        client: kube::Client,
        metrics: Arc<Metrics>,
        shutdown: impl Future<Output = ()>,
    ) {
        let router = router(client, metrics);
        let acceptor = TlsAcceptor::from(self.tls.0);
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let stream = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(error = %e, "webhook accept failed");
                        // Out of descriptors and the like: back off instead of spinning.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = &mut shutdown => return,
            };
            let acceptor = acceptor.clone();
            let router = router.clone();
            tokio::spawn(async move {
                let tls =
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "webhook TLS handshake failed");
                            return;
                        }
                        Err(_) => return,
                    };
                let service = service_fn(move |req| {
                    let router = router.clone();
                    async move {
                        Ok::<_, Infallible>(
                            router
                                .oneshot(req)
                                .await
                                .unwrap_or_else(|never| match never {}),
                        )
                    }
                });
                if let Err(e) = http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await
                {
                    tracing::debug!(error = %e, "webhook connection ended");
                }
            });
        }
    }
}

fn router(client: kube::Client, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route(VALIDATE_PATH, post(validate_handler))
        .with_state(WebhookState { client, metrics })
}

async fn validate_handler(
    State(state): State<WebhookState>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request: Result<AdmissionRequest<DynamicObject>, _> = review.try_into();
    let response = match request {
        Ok(request) => review_request(&state, &request).await,
        Err(e) => {
            state.metrics.admission("invalid", None);
            AdmissionResponse::invalid(e.to_string())
        }
    };
    Json(response.into_review())
}

fn refusal_label(r: &Refusal) -> &'static str {
    match r {
        Refusal::DifferentNodeWithTarget(_) => "differentnode_with_target",
        Refusal::DuplicateDifferentNode { .. } => "duplicate_differentnode",
        Refusal::DuplicateSameNode { .. } => "duplicate_samenode",
    }
}

fn typed(obj: &Option<DynamicObject>) -> Result<Option<ComposabilityRequest>, String> {
    obj.as_ref()
        .map(|o| {
            serde_json::to_value(o)
                .and_then(serde_json::from_value::<ComposabilityRequest>)
                .map_err(|e| format!("not a valid ComposabilityRequest: {e}"))
        })
        .transpose()
}

async fn review_request(
    state: &WebhookState,
    request: &AdmissionRequest<DynamicObject>,
) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    let deny =
        |response: AdmissionResponse, outcome: &str, reason: Option<&str>, message: String| {
            state.metrics.admission(outcome, reason);
            tracing::info!(name = %request.name, %message, "admission denied");
            response.deny(message)
        };
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        state.metrics.admission("allowed", None);
        return response;
    }
    let (new, old) = match (typed(&request.object), typed(&request.old_object)) {
        (Ok(Some(new)), Ok(old)) => (new, old),
        (Ok(None), _) => {
            return deny(
                response,
                "invalid",
                None,
                "the request has no object".into(),
            );
        }
        (Err(e), _) | (_, Err(e)) => return deny(response, "invalid", None, e),
    };
    // Metadata-only updates (finalizers, labels) and objects on their way out are not
    // re-judged: refusing them could block a deletion forever.
    let unchanged = old.as_ref().is_some_and(|o| o.spec == new.spec);
    if unchanged || new.metadata.deletion_timestamp.is_some() {
        state.metrics.admission("allowed", None);
        return response;
    }
    let api: Api<ComposabilityRequest> = Api::all(state.client.clone());
    let others = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(e) => {
            return deny(
                response,
                "error",
                None,
                format!("cannot list ComposabilityRequests to validate against: {e}"),
            );
        }
    };
    let summaries: Vec<_> = others.iter().map(views::request_summary).collect();
    let mut mine = views::request_summary(&new);
    if mine.name.is_empty() {
        // generateName: the final name is not known yet, and it collides with nobody.
        mine.name = format!("(new {})", uuid::Uuid::new_v4());
    }
    match admission::validate(&mine, &summaries) {
        Ok(()) => {
            state.metrics.admission("allowed", None);
            response
        }
        Err(refusal) => deny(
            response,
            "denied",
            Some(refusal_label(&refusal)),
            refusal.to_string(),
        ),
    }
}

//! The validating admission webhook of ComposabilityRequest (docs/behaviour.md §6), over TLS.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use cro_api::{CdiProvider, ComposabilityRequest};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::decide::admission::{self, Refusal};
use crate::decide::views;
use crate::error::OperatorError;
use crate::metrics::Metrics;
use crate::registry::admit::{self, ProviderRefusal};
use crate::registry::route::{self, RouteEntry};
use crate::serve::certs::ReloadingCert;
use crate::serve::{self, ServerLimits};

/// The path the Go operator's webhook configuration uses.
pub const VALIDATE_PATH: &str = "/validate-cro-hpsys-ibm-ie-com-v1alpha1-composabilityrequest";
/// The path of `CdiProvider` reviews (crate::registry::admit).
pub const VALIDATE_PROVIDER_PATH: &str = "/validate-cro-hpsys-ibm-ie-com-v1alpha1-cdiprovider";
/// How long a review waits for the cache's first list before refusing (the API server
/// gives the webhook 10 s).
const CACHE_WAIT: Duration = Duration::from_secs(5);

/// The webhook's TLS settings; the certificate comes from a [`ReloadingCert`], so a
/// renewed one is used from the next handshake on without a restart.
#[derive(Clone)]
pub(crate) struct WebhookTls {
    config: Arc<rustls::ServerConfig>,
    resolver: Arc<ReloadingCert>,
}

impl WebhookTls {
    /// TLS with whatever `resolver` holds (handshakes fail until it holds something).
    pub(crate) fn reloading(resolver: Arc<ReloadingCert>) -> Result<Self, OperatorError> {
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| OperatorError::Webhook(format!("TLS: {e}")))?
        .with_no_client_auth()
        .with_cert_resolver(resolver.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            config: Arc::new(config),
            resolver,
        })
    }

    pub(crate) fn from_pem(cert_chain: &[u8], key: &[u8]) -> Result<Self, OperatorError> {
        let resolver = Arc::new(ReloadingCert::default());
        resolver
            .set_pem(cert_chain, key)
            .map_err(|e| OperatorError::Webhook(e.to_string()))?;
        Self::reloading(resolver)
    }

    pub(crate) fn from_files(cert_file: &Path, key_file: &Path) -> Result<Self, OperatorError> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|e| OperatorError::Webhook(format!("{}: {e}", p.display())))
        };
        Self::from_pem(&read(cert_file)?, &read(key_file)?)
    }

    /// Where renewed certificates go.
    pub(crate) fn resolver(&self) -> Arc<ReloadingCert> {
        self.resolver.clone()
    }
}

#[derive(Clone)]
struct WebhookState {
    /// Every ComposabilityRequest, as the watch last saw them.
    requests: Store<ComposabilityRequest>,
    /// Reads the Node a new target_node names (one get per create or target change).
    nodes: Api<Node>,
    metrics: Arc<Metrics>,
    /// Every CdiProvider; set when providers come from objects, and then a request's
    /// target node must be served by one.
    providers: Option<Store<CdiProvider>>,
}

/// A bound webhook listener; [`WebhookServer::serve`] answers until shutdown.
pub(crate) struct WebhookServer {
    listener: TcpListener,
    tls: WebhookTls,
    providers: bool,
}

impl WebhookServer {
    pub(crate) async fn bind(addr: SocketAddr, tls: WebhookTls) -> Result<Self, OperatorError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| OperatorError::Listen { addr, source })?;
        Ok(Self {
            listener,
            tls,
            providers: false,
        })
    }

    /// Providers come from `CdiProvider` objects: review them too, and refuse requests
    /// whose target node none serves.
    pub(crate) fn with_providers(mut self) -> Self {
        self.providers = true;
        self
    }

    pub(crate) fn local_addr(&self) -> Result<SocketAddr, OperatorError> {
        self.listener
            .local_addr()
            .map_err(|e| OperatorError::Webhook(e.to_string()))
    }

    pub(crate) fn tls(&self) -> &WebhookTls {
        &self.tls
    }

    /// Answers reviews until `shutdown`. The other requests a review is judged against
    /// come from a watch-fed cache started here, not from a cluster-wide list per review.
    pub(crate) async fn serve(
        self,
        client: kube::Client,
        metrics: Arc<Metrics>,
        shutdown: impl Future<Output = ()>,
    ) {
        let (store, writer) = reflector::store::<ComposabilityRequest>();
        let nodes = Api::all(client.clone());
        let feed = reflector(
            writer,
            watcher(Api::all(client.clone()), watcher::Config::default()).default_backoff(),
        )
        .for_each(|event| async move {
            if let Err(e) = event {
                tracing::warn!(error = %e, "webhook cache: watch failed; retrying");
            }
        });
        let (providers, provider_feed) = if self.providers {
            let (pstore, pwriter) = reflector::store::<CdiProvider>();
            let feed = reflector(
                pwriter,
                watcher(Api::all(client), watcher::Config::default()).default_backoff(),
            )
            .for_each(|event| async move {
                if let Err(e) = event {
                    tracing::warn!(error = %e, "webhook cache: CdiProvider watch failed; retrying");
                }
            })
            .boxed();
            (Some(pstore), feed)
        } else {
            (None, futures::future::pending().boxed())
        };
        let router = router(store, nodes, metrics, providers);
        let acceptor = TlsAcceptor::from(self.tls.config.clone());
        tokio::select! {
            () = serve::serve(self.listener, Some(acceptor), router, ServerLimits::WEBHOOK, shutdown) => {}
            () = feed => {}
            () = provider_feed => {}
        }
    }
}

fn router(
    requests: Store<ComposabilityRequest>,
    nodes: Api<Node>,
    metrics: Arc<Metrics>,
    providers: Option<Store<CdiProvider>>,
) -> Router {
    Router::new()
        .route(VALIDATE_PATH, post(validate_handler))
        .route(VALIDATE_PROVIDER_PATH, post(validate_provider_handler))
        .with_state(WebhookState {
            requests,
            nodes,
            metrics,
            providers,
        })
}

async fn validate_handler(
    State(state): State<WebhookState>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let response = match request_of(&state, review) {
        Ok(request) => review_request(&state, &request).await,
        Err(invalid) => *invalid,
    };
    Json(response.into_review())
}

/// The request a review carries, or the `invalid` answer to a review that carries none.
fn request_of(
    state: &WebhookState,
    review: AdmissionReview<DynamicObject>,
) -> Result<AdmissionRequest<DynamicObject>, Box<AdmissionResponse>> {
    review
        .try_into()
        .map_err(|e: kube::core::admission::ConvertAdmissionReviewError| {
            state.metrics.admission("invalid", None);
            Box::new(AdmissionResponse::invalid(e.to_string()))
        })
}

fn refusal_label(r: &Refusal) -> &'static str {
    match r {
        Refusal::UnknownTargetNode(_) => "unknown_target_node",
        Refusal::DifferentNodeWithTarget(_) => "differentnode_with_target",
        Refusal::DuplicateDifferentNode { .. } => "duplicate_differentnode",
        Refusal::DuplicateSameNode { .. } => "duplicate_samenode",
    }
}

/// The review's object as a `K` (None when the review has none).
fn typed<K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned>(
    obj: &Option<DynamicObject>,
) -> Result<Option<K>, String> {
    obj.as_ref()
        .map(|o| {
            serde_json::to_value(o)
                .and_then(serde_json::from_value::<K>)
                .map_err(|e| format!("not a valid {}: {e}", K::kind(&())))
        })
        .transpose()
}

async fn review_request(
    state: &WebhookState,
    request: &AdmissionRequest<DynamicObject>,
) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    match judge(state, request).await {
        Ok(()) => {
            state.metrics.admission("allowed", None);
            response
        }
        Err(Denial {
            outcome,
            reason,
            message,
        }) => {
            state.metrics.admission(outcome, reason);
            tracing::info!(name = %request.name, %message, "admission denied");
            response.deny(message)
        }
    }
}

/// Why a review refused: the outcome and reason it is counted under, and what the
/// client is told.
struct Denial {
    /// `invalid` (the review itself is malformed), `denied` or `error` (retry).
    outcome: &'static str,
    reason: Option<&'static str>,
    message: String,
}

impl Denial {
    fn invalid(message: String) -> Self {
        Denial {
            outcome: "invalid",
            reason: None,
            message,
        }
    }

    fn error(message: String) -> Self {
        Denial {
            outcome: "error",
            reason: None,
            message,
        }
    }

    fn refused(refusal: &Refusal) -> Self {
        Denial {
            outcome: "denied",
            reason: Some(refusal_label(refusal)),
            message: refusal.to_string(),
        }
    }
}

/// Judges one review of a ComposabilityRequest.
async fn judge(
    state: &WebhookState,
    request: &AdmissionRequest<DynamicObject>,
) -> Result<(), Denial> {
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return Ok(());
    }
    let (new, old) = match (
        typed::<ComposabilityRequest>(&request.object),
        typed::<ComposabilityRequest>(&request.old_object),
    ) {
        (Ok(Some(new)), Ok(old)) => (new, old),
        (Ok(None), _) => return Err(Denial::invalid("the request has no object".into())),
        (Err(e), _) | (_, Err(e)) => return Err(Denial::invalid(e)),
    };
    // Metadata-only updates (finalizers, labels) and objects on their way out are not
    // re-judged: refusing them could block a deletion forever.
    let unchanged = old.as_ref().is_some_and(|o| o.spec == new.spec);
    if unchanged || new.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    // Until the first full list has arrived the cache cannot say who else exists.
    if tokio::time::timeout(CACHE_WAIT, state.requests.wait_until_ready())
        .await
        .map_or(true, |r| r.is_err())
    {
        return Err(Denial::error(
            "the webhook's view of ComposabilityRequests is not loaded yet; retry".into(),
        ));
    }
    check_against_others(state, &new)?;
    let old_target = old.as_ref().map(|o| o.spec.resource.target_node());
    match admission::target_to_check(new.spec.resource.target_node(), old_target) {
        Some(target) => check_target(state, target).await,
        None => Ok(()),
    }
}

/// The request against every other one the cache holds (docs/behaviour.md §6).
fn check_against_others(state: &WebhookState, new: &ComposabilityRequest) -> Result<(), Denial> {
    let others = state.requests.state();
    let summaries: Vec<_> = others.iter().map(|r| views::request_summary(r)).collect();
    let mut mine = views::request_summary(new);
    if mine.name.is_empty() {
        // generateName: the final name is not known yet, and it collides with nobody.
        mine.name = format!("(new {})", uuid::Uuid::new_v4());
    }
    admission::validate(&mine, &summaries).map_err(|refusal| Denial::refused(&refusal))
}

/// The target node exists, and a provider serves it.
async fn check_target(state: &WebhookState, target: &str) -> Result<(), Denial> {
    match state.nodes.get_opt(target).await {
        Ok(Some(node)) => match unserved(state, target, &node) {
            Some(message) => Err(Denial {
                outcome: "denied",
                reason: Some("no_provider"),
                message,
            }),
            None => Ok(()),
        },
        Ok(None) => Err(Denial::refused(&Refusal::UnknownTargetNode(
            target.to_owned(),
        ))),
        Err(e) => Err(Denial::error(format!(
            "cannot check that target_node {target} exists: {}; retry",
            crate::text::kube_error(&e)
        ))),
    }
}

fn route_entry(p: &CdiProvider) -> RouteEntry {
    RouteEntry {
        name: p.name_any(),
        selector: p.spec.node_selector.clone(),
        default: p.spec.default,
    }
}

/// Why no single provider serves `node`, when providers come from objects.
fn unserved(state: &WebhookState, name: &str, node: &Node) -> Option<String> {
    let providers = state.providers.as_ref()?;
    let entries: Vec<RouteEntry> = providers
        .state()
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| route_entry(p))
        .collect();
    let labels = node.metadata.labels.clone().unwrap_or_default();
    route::route(name, &labels, &entries)
        .err()
        .map(|e| e.to_string())
}

async fn validate_provider_handler(
    State(state): State<WebhookState>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let response = match request_of(&state, review) {
        Ok(request) => review_provider(&state, &request).await,
        Err(invalid) => *invalid,
    };
    Json(response.into_review())
}

async fn review_provider(
    state: &WebhookState,
    request: &AdmissionRequest<DynamicObject>,
) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    let deny =
        |response: AdmissionResponse, outcome: &str, reason: Option<&str>, message: String| {
            state.metrics.admission(outcome, reason);
            tracing::info!(name = %request.name, %message, "CdiProvider admission denied");
            response.deny(message)
        };
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        state.metrics.admission("allowed", None);
        return response;
    }
    let new = match typed::<CdiProvider>(&request.object) {
        Ok(Some(p)) => p,
        Err(e) => return deny(response, "invalid", None, e),
        Ok(None) => {
            return deny(
                response,
                "invalid",
                None,
                "the request has no object".into(),
            );
        }
    };
    if new.metadata.deletion_timestamp.is_some() {
        state.metrics.admission("allowed", None);
        return response;
    }
    if state.providers.is_none() {
        state.metrics.admission("allowed", None);
        return response;
    }
    // Read live, not from the watch cache: two overlapping providers created one
    // right after the other must not both pass because the cache had not yet seen the
    // first. CdiProviders are few and change rarely, so one list per review is cheap.
    let api: Api<CdiProvider> = Api::all(state.nodes.clone().into_client());
    let listed = tokio::time::timeout(CACHE_WAIT, api.list(&Default::default())).await;
    let existing = match listed {
        Ok(Ok(list)) => list.items,
        Ok(Err(e)) => {
            return deny(
                response,
                "error",
                None,
                format!("cannot read the existing CdiProviders: {e}; retry"),
            );
        }
        Err(_) => {
            return deny(
                response,
                "error",
                None,
                "reading the existing CdiProviders timed out; retry".into(),
            );
        }
    };
    let others: Vec<RouteEntry> = existing.iter().map(route_entry).collect();
    match admit::validate(&route_entry(&new), &others) {
        Ok(()) => {
            state.metrics.admission("allowed", None);
            response
        }
        Err(refusal) => {
            let label = match refusal {
                ProviderRefusal::Overlap { .. } => "provider_overlap",
                ProviderRefusal::SecondDefault { .. } => "second_default",
                ProviderRefusal::NameTooLong { .. } => "name_too_long",
            };
            deny(response, "denied", Some(label), refusal.to_string())
        }
    }
}

//! `/metrics` behind Kubernetes authentication and authorization, as the Go operator's
//! kubebuilder layout serves it: the scraper's bearer token is checked with a
//! TokenReview, and the user it names must be allowed `get` on the non-resource URL
//! `/metrics` (a SubjectAccessReview; the chart's `<release>-metrics-reader` ClusterRole
//! grants it). The listener is HTTPS with a self-signed certificate made at start, as
//! controller-runtime does; scrapers skip verification or pin nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode, header};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use crate::serve::certs::ReloadingCert;

/// Checks scrapers' tokens against the API server.
#[derive(Clone)]
pub(crate) struct MetricsAuth {
    client: kube::Client,
}

/// Why a scrape was refused: the status and a short message for the scraper.
pub(crate) type Refused = (StatusCode, &'static str);

impl MetricsAuth {
    pub(crate) fn new(client: kube::Client) -> Self {
        Self { client }
    }

    /// Ok when the request's bearer token belongs to someone allowed `get /metrics`.
    pub(crate) async fn check(&self, headers: &HeaderMap) -> Result<(), Refused> {
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or((StatusCode::UNAUTHORIZED, "a bearer token is required"))?;
        let unavailable = |e: kube::Error| {
            tracing::warn!(error = %crate::text::kube_error(&e), "metrics authorization: the API server did not answer");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "cannot check the token now",
            )
        };
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(unavailable)?;
        let status = reviewed.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => user,
            _ => return Err((StatusCode::UNAUTHORIZED, "the token is not valid")),
        };
        let extra: Option<BTreeMap<String, Vec<String>>> = user.extra.clone();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                uid: user.uid.clone(),
                groups: user.groups.clone(),
                extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let decided = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await
            .map_err(unavailable)?;
        if decided.status.is_some_and(|s| s.allowed) {
            Ok(())
        } else {
            tracing::info!(user = ?user.username, "metrics scrape refused: not allowed get /metrics");
            Err((StatusCode::FORBIDDEN, "not allowed to get /metrics"))
        }
    }
}

/// A self-signed serving certificate for the metrics listener.
pub(crate) fn self_signed_tls() -> Result<Arc<rustls::ServerConfig>, String> {
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let name = std::env::var("POD_NAME").unwrap_or_else(|_| "cro-metrics".into());
    let params =
        rcgen::CertificateParams::new(vec![name, "localhost".into()]).map_err(|e| e.to_string())?;
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    let resolver = Arc::new(ReloadingCert::default());
    resolver
        .set_pem(cert.pem().as_bytes(), key.serialize_pem().as_bytes())
        .map_err(|e| e.to_string())?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

//! The component reaches nothing but its granted endpoint.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::http::{StatusCode, Uri, header};
use axum::response::IntoResponse;
use cro_runtime::{AddRequest, ProviderError};
use provider_it::{Api, Fixture};
use serde_json::json;

use crate::*;

/// A loopback server answering every request with `reply`; returns its address and
/// the number of requests it got.
async fn serve(
    reply: impl Fn(Uri) -> axum::response::Response + Clone + Send + Sync + 'static,
) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let app = Router::new().fallback(move |uri: Uri| {
        let reply = reply.clone();
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            reply(uri)
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, hits)
}

async fn bystander() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    serve(|_| (StatusCode::OK, "{}").into_response()).await
}

#[tokio::test]
async fn a_redirect_to_another_host_is_denied() {
    let (other, other_hits) = bystander().await;
    let (rogue, rogue_hits) = serve(move |uri: Uri| {
        (
            StatusCode::TEMPORARY_REDIRECT,
            [(header::LOCATION, format!("http://{other}{uri}"))],
        )
            .into_response()
    })
    .await;
    let fx = Fixture::builder(Api::Fm)
        .with_config("endpoint", &format!("http://{rogue}/"))
        .with_http_grants(json!([{"url": format!("http://{rogue}")}]))
        .start()
        .await;
    fx.add_provider_id_node("worker-0");

    let e = provider_error(
        fx.provider
            .add(&AddRequest::new(fx.gpu("gpu-a", "worker-0")))
            .await,
    );
    assert!(
        matches!(&e, ProviderError::Denied(m) if m.contains(&other.port().to_string())),
        "{e:?}"
    );
    assert_eq!(rogue_hits.load(Ordering::SeqCst), 1);
    assert_eq!(other_hits.load(Ordering::SeqCst), 0);
    assert!(fx.provider.denials().http >= 1);
}

#[tokio::test]
async fn an_endpoint_that_is_not_granted_is_never_called() {
    let (other, other_hits) = bystander().await;
    // Granted: the simulator. Configured: another host.
    let fx = Fixture::builder(Api::Fm)
        .with_config("endpoint", &format!("http://{other}/"))
        .start()
        .await;
    fx.add_provider_id_node("worker-0");
    let e = provider_error(
        fx.provider
            .add(&AddRequest::new(fx.gpu("gpu-a", "worker-0")))
            .await,
    );
    assert!(matches!(e, ProviderError::Denied(_)), "{e:?}");
    assert_eq!(other_hits.load(Ordering::SeqCst), 0);
    assert!(fx.sim.requests().is_empty());

    // The simulator's own plain-HTTP port is another scheme and port than the grant.
    let fx = Fixture::builder(Api::Fm)
        .with_plain_http_endpoint()
        .start()
        .await;
    fx.add_provider_id_node("worker-0");
    let e = provider_error(
        fx.provider
            .add(&AddRequest::new(fx.gpu("gpu-a", "worker-0")))
            .await,
    );
    assert!(
        matches!(&e, ProviderError::Denied(m) if m.contains(&fx.sim.http_addr().port().to_string())),
        "{e:?}"
    );
    assert!(fx.sim.requests().is_empty());
    assert_eq!(fx.provider.denials().http, 1);
}

//! Shared helpers for the runtime's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use cro_runtime::cluster::{ClusterReader, StaticCluster};
use cro_runtime::{
    ComposableResource, DeviceType, Provider, ProviderSpec, Runtime, RuntimeOptions,
};

pub fn testkit() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| cro_test_support::component("cro-testkit"))
        .clone()
}

/// One runtime per test binary: it does not depend on any tokio runtime, and sharing it
/// shares the compiled testkit.
pub fn runtime() -> Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME
        .get_or_init(|| Runtime::new(RuntimeOptions::default()).unwrap())
        .clone()
}

/// A testkit spec in `mode` with the given extra config and no grants.
pub fn spec(mode: &str, config: &[(&str, &str)]) -> ProviderSpec {
    let mut spec = ProviderSpec::new("testkit", testkit());
    spec.config.insert("mode".into(), mode.into());
    for (k, v) in config {
        spec.config.insert((*k).into(), (*v).into());
    }
    spec
}

pub async fn load(spec: &ProviderSpec) -> Provider {
    load_with(spec, StaticCluster::new()).await
}

pub async fn load_with(spec: &ProviderSpec, cluster: impl ClusterReader + 'static) -> Provider {
    runtime().load(spec, Arc::new(cluster)).await.unwrap()
}

pub fn gpu(name: &str) -> ComposableResource {
    ComposableResource {
        name: name.into(),
        device_type: DeviceType::Gpu,
        model: "NVIDIA-A100-PCIE-40GB".into(),
        target_node: "worker-0".into(),
        device_id: None,
        fabric_device_id: None,
        force_detach: false,
    }
}

/// A resource whose call runs testkit mode `mode` whatever the provider's config says.
pub fn in_mode(name: &str, mode: &str) -> ComposableResource {
    ComposableResource {
        model: format!("mode:{mode}"),
        ..gpu(name)
    }
}

/// How long a call may overrun its deadline on a busy 2-core machine before a test calls
/// it a hang. Generous on purpose: speed is for benchmarks, this only catches hangs.
pub const SLACK: Duration = Duration::from_secs(5);

pub async fn timed<F: std::future::Future>(f: F) -> (F::Output, Duration) {
    let start = Instant::now();
    let out = f.await;
    (out, start.elapsed())
}

/// Serves `router` on 127.0.0.1 (an ephemeral port) for the rest of the test.
pub async fn serve(router: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

/// A CA and a server config whose certificate (for 127.0.0.1) it signed.
pub struct TestTls {
    pub ca_pem: String,
    pub server: Arc<rustls::ServerConfig>,
}

pub fn test_tls() -> TestTls {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap())
        .unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap();
    let server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![leaf.der().clone()], key)
    .unwrap();
    TestTls {
        ca_pem: ca.pem(),
        server: Arc::new(server),
    }
}

/// A bare HTTPS server answering every request with 200 and `body`.
pub async fn serve_tls(
    server: Arc<rustls::ServerConfig>,
    body: &'static str,
) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(server);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 65536 {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(reply.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    addr
}

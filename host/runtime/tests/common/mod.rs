//! Shared helpers for the runtime's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use cro_runtime::AddRequest;
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
        machine_id: None,
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

/// A provider component written by hand: one core module with `memories` linear memories
/// (1 page each to start), exporting the four operations. Each operation grows every
/// memory a page at a time, touching each new page, until the host refuses, then spins
/// for `spin` iterations (so a test can measure what it holds) and traps.
pub fn memory_hog(memories: usize, spin: u64) -> Vec<u8> {
    let mut mems = String::new();
    let mut grow = String::new();
    for m in 0..memories {
        mems.push_str(&format!("(memory $m{m} 1)\n"));
        // Grow memory m by one page until refused; write one byte per 4 KiB of it.
        grow.push_str(&format!(
            r#"
            (block $done{m}
              (loop $more{m}
                (local.set $old (memory.grow $m{m} (i32.const 1)))
                (br_if $done{m} (i32.eq (local.get $old) (i32.const -1)))
                (local.set $p (i32.mul (local.get $old) (i32.const 65536)))
                (local.set $end (i32.add (local.get $p) (i32.const 65536)))
                (loop $touch{m}
                  (i32.store8 $m{m} (local.get $p) (i32.const 1))
                  (local.set $p (i32.add (local.get $p) (i32.const 4096)))
                  (br_if $touch{m} (i32.lt_u (local.get $p) (local.get $end))))
                (br $more{m})))
            "#
        ));
    }
    let params = "(param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32)";
    let wat = format!(
        r#"(module
          {mems}
          (export "memory" (memory $m0))
          (global $heap (mut i32) (i32.const 1024))
          (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
            (local $p i32)
            (local.set $p (i32.and (i32.add (global.get $heap) (i32.const 7)) (i32.const -8)))
            (global.set $heap (i32.add (local.get $p) (local.get 3)))
            (if (i32.gt_u (global.get $heap) (i32.const 65536)) (then unreachable))
            (local.get $p))
          (func $hog
            (local $old i32) (local $p i32) (local $end i32) (local $i i64)
            {grow}
            (local.set $i (i64.const {spin}))
            (block $out
              (loop $spin
                (br_if $out (i64.eqz (local.get $i)))
                (local.set $i (i64.sub (local.get $i) (i64.const 1)))
                (br $spin)))
            unreachable)
          (func (export "cro:provider/provider@0.1.0#add-resource") {params} (result i32)
            call $hog unreachable)
          (func (export "cro:provider/provider@0.1.0#remove-resource") {params} (result i32)
            call $hog unreachable)
          (func (export "cro:provider/provider@0.1.0#check-resource") {params} (result i32)
            call $hog unreachable)
          (func (export "cro:provider/provider@0.1.0#get-resources") (result i32)
            call $hog unreachable))"#
    );
    provider_component(&wat, "since_v0.1.0")
}

/// A hand-written core module (`wat`) made into a component of the `provider-world` of
/// the contract in `wit/<version_dir>`.
pub fn provider_component(wat: &str, version_dir: &str) -> Vec<u8> {
    let mut module = wat::parse_str(wat).unwrap();
    let wit = cro_test_support::workspace_root()
        .join("wit")
        .join(version_dir);
    let mut resolve = wit_parser::Resolve::default();
    let (package, _) = resolve.push_dir(&wit).unwrap();
    let world = resolve
        .select_world(&[package], Some("provider-world"))
        .unwrap();
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
    )
    .unwrap();
    wit_component::ComponentEncoder::default()
        .module(&module)
        .unwrap()
        .validate(true)
        .encode()
        .unwrap()
}

/// A component (not a provider) that instantiates a module with `memories` memories
/// `instances` times: what the pool's per-component limits are for.
pub fn greedy_component(instances: usize, memories: usize) -> Vec<u8> {
    let mems = "(memory 1)\n".repeat(memories);
    let instantiate = "(core instance (instantiate $m))\n".repeat(instances);
    wat::parse_str(format!("(component (core module $m {mems}) {instantiate})")).unwrap()
}

/// The resident set of this process.
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let resident_pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    resident_pages * 4096
}

/// Runs `hostile` while a well-behaved provider (the fake fabric, its own spec) serves
/// calls next to it, and checks every one of those calls succeeded within its deadline.
/// Returns `hostile`'s output and how many good calls were served (at least one).
pub async fn beside_a_good_provider<F: std::future::Future>(hostile: F) -> (F::Output, usize) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut good_spec = spec("fake", &[]);
    good_spec.name = "good".into();
    good_spec.limits.call_timeout_ms = 10_000;
    let deadline = good_spec.limits.call_timeout();
    let good = load(&good_spec).await;
    let stop = AtomicBool::new(false);
    let serve = async {
        let mut served = 0;
        while !stop.load(Ordering::SeqCst) || served == 0 {
            let r = gpu(&format!("good-{served}"));
            let (out, took) = timed(good.add(&AddRequest::new(r.clone()))).await;
            assert!(
                matches!(out, Ok(cro_runtime::AddOutcome::Attached(_))),
                "the good provider failed: {out:?}"
            );
            assert!(took < deadline, "a good call took {took:?}");
            served += 1;
            tokio::task::yield_now().await;
        }
        served
    };
    let run = async {
        let out = hostile.await;
        stop.store(true, Ordering::SeqCst);
        out
    };
    let (out, served) = tokio::join!(run, serve);
    assert!(served > 0);
    (out, served)
}

/// A cluster that counts every read that reaches it.
#[derive(Clone)]
pub struct Counting {
    pub inner: StaticCluster,
    pub reads: Arc<std::sync::atomic::AtomicUsize>,
}

impl Counting {
    pub fn new(inner: StaticCluster) -> Counting {
        Counting {
            inner,
            reads: Default::default(),
        }
    }

    pub fn reads(&self) -> usize {
        self.reads.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn count(&self) {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl ClusterReader for Counting {
    fn get_secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> cro_runtime::cluster::BoxFuture<
        'a,
        Result<std::collections::BTreeMap<String, Vec<u8>>, cro_runtime::cluster::ClusterError>,
    > {
        self.count();
        self.inner.get_secret(namespace, name)
    }

    fn get_object<'a>(
        &'a self,
        api_version: &'a str,
        kind: &'a str,
        namespace: Option<&'a str>,
        name: &'a str,
    ) -> cro_runtime::cluster::BoxFuture<
        'a,
        Result<serde_json::Value, cro_runtime::cluster::ClusterError>,
    > {
        self.count();
        self.inner.get_object(api_version, kind, namespace, name)
    }

    fn list_objects<'a>(
        &'a self,
        api_version: &'a str,
        kind: &'a str,
    ) -> cro_runtime::cluster::BoxFuture<
        'a,
        Result<Vec<serde_json::Value>, cro_runtime::cluster::ClusterError>,
    > {
        self.count();
        self.inner.list_objects(api_version, kind)
    }
}

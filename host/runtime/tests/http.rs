//! The `http` capability over real loopback HTTP(S): granted and denied, redirects,
//! timeouts (the guest's own and the call's deadline), size caps, TLS trust.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{any, get, post};
use common::*;
use cro_runtime::AddRequest;
use cro_runtime::grants::HttpGrant;
use cro_runtime::{
    AddOutcome, AttachedDevice, CallError, Fence, LoadOptions, ProviderError, ProviderSpec,
};

/// The fabric the provider is granted.
async fn fabric() -> std::net::SocketAddr {
    serve(
        Router::new()
            .route("/hello", get(|| async { "hello" }))
            .route(
                "/echo",
                post(|body: String| async move { format!("echo:{body}") }),
            )
            .route(
                "/hop",
                get(|| async { (StatusCode::FOUND, [(header::LOCATION, "/hello")]) }),
            )
            .route(
                "/out",
                get(
                    |axum::extract::Query(q): axum::extract::Query<
                        std::collections::HashMap<String, String>,
                    >| async move {
                        (StatusCode::FOUND, [(header::LOCATION, q["to"].clone())]).into_response()
                    },
                ),
            )
            .route("/big", get(|| async { vec![b'x'; 2 << 20] }))
            .route(
                "/whoami",
                get(|headers: axum::http::HeaderMap| async move {
                    headers
                        .get(header::AUTHORIZATION)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("nobody")
                        .to_owned()
                }),
            )
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(120)).await;
                    "late"
                }),
            ),
    )
    .await
}

/// A server nobody granted; it counts what reaches it.
async fn elsewhere() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let router = Router::new()
        .fallback(any(|State(hits): State<Arc<AtomicUsize>>| async move {
            hits.fetch_add(1, Ordering::SeqCst);
            "you should not be here"
        }))
        .with_state(hits.clone());
    (serve(router).await, hits)
}

fn http_spec(url: &str, grant: Option<&str>, extra: &[(&str, &str)]) -> ProviderSpec {
    let mut config = vec![("url", url)];
    config.extend_from_slice(extra);
    let mut spec = spec("http", &config);
    if let Some(grant) = grant {
        spec.grants
            .http
            .push(HttpGrant::new(grant.parse().unwrap()));
    }
    spec
}

fn reply(device_id: &str) -> AddOutcome {
    AddOutcome::Attached(AttachedDevice {
        device_id: device_id.into(),
        fabric_device_id: "http".into(),
        machine_id: None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn granted_endpoint_is_reached() {
    let addr = fabric().await;
    let grant = format!("http://{addr}");
    let provider = load(&http_spec(
        &format!("http://{addr}/hello"),
        Some(&grant),
        &[],
    ))
    .await;
    assert_eq!(
        provider.add(&AddRequest::new(gpu("a"))).await.unwrap(),
        reply("200 hello")
    );

    let post = http_spec(
        &format!("http://{addr}/echo"),
        Some(&grant),
        &[("method", "POST"), ("body", "ping")],
    );
    let provider = load(&post).await;
    assert_eq!(
        provider.add(&AddRequest::new(gpu("a"))).await.unwrap(),
        reply("200 echo:ping")
    );
    assert_eq!(provider.denials().total(), 0);
}

/// Credentials in the request URL reach the fabric as basic authentication (as from any
/// HTTP client), never on the request line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_credentials_go_as_basic_authentication() {
    let addr = fabric().await;
    let provider = load(&http_spec(
        &format!("http://user:pw@{addr}/whoami"),
        Some(&format!("http://{addr}")),
        &[],
    ))
    .await;
    // base64("user:pw")
    assert_eq!(
        provider.add(&AddRequest::new(gpu("a"))).await.unwrap(),
        reply("200 Basic dXNlcjpwdw==")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ungranted_endpoint_is_denied_before_any_connection() {
    let (addr, hits) = elsewhere().await;
    let fabric = fabric().await;
    // Granted the fabric only; the same host on another port is not covered.
    let provider = load(&http_spec(
        &format!("http://{addr}/steal"),
        Some(&format!("http://{fabric}")),
        &[],
    ))
    .await;
    let err = provider.add(&AddRequest::new(gpu("a"))).await.unwrap_err();
    assert_eq!(
        err,
        CallError::Provider(ProviderError::Denied(format!(
            "no http grant for http://{addr}"
        )))
    );
    assert_eq!(
        err.denied(),
        Some(format!("no http grant for http://{addr}").as_str())
    );
    assert_eq!(hits.load(Ordering::SeqCst), 0);
    assert_eq!(provider.denials().http, 1);

    // No grants at all: same answer.
    let provider = load(&http_spec(&format!("http://{addr}/"), None, &[])).await;
    assert!(
        provider
            .add(&AddRequest::new(gpu("a")))
            .await
            .unwrap_err()
            .denied()
            .is_some()
    );
    assert_eq!(hits.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_are_followed_only_to_granted_targets() {
    let addr = fabric().await;
    let grant = format!("http://{addr}");
    let provider = load(&http_spec(&format!("http://{addr}/hop"), Some(&grant), &[])).await;
    assert_eq!(
        provider.add(&AddRequest::new(gpu("a"))).await.unwrap(),
        reply("200 hello")
    );

    let (evil, hits) = elsewhere().await;
    let url = format!("http://{addr}/out?to=http://{evil}/exfiltrate");
    let provider = load(&http_spec(&url, Some(&grant), &[])).await;
    let err = provider.add(&AddRequest::new(gpu("a"))).await.unwrap_err();
    let denied = err.denied().unwrap_or_else(|| panic!("{err:?}"));
    assert!(
        denied.starts_with(&format!("no http grant for http://{evil}")),
        "{denied}"
    );
    assert!(denied.contains("redirect from"), "{denied}");
    assert_eq!(hits.load(Ordering::SeqCst), 0);
    assert_eq!(provider.denials().http, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_bodies_are_capped() {
    let addr = fabric().await;
    let mut spec = http_spec(
        &format!("http://{addr}/big"),
        Some(&format!("http://{addr}")),
        &[],
    );
    spec.limits.max_response_bytes = 1 << 20;
    let provider = load(&spec).await;
    assert_eq!(
        provider.add(&AddRequest::new(gpu("a"))).await.unwrap_err(),
        CallError::Provider(ProviderError::MalformedReply(format!(
            "reply too large: {}",
            1 << 20
        )))
    );
    spec.limits.max_response_bytes = 4 << 20;
    let provider = load(&spec).await;
    assert!(provider.add(&AddRequest::new(gpu("a"))).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guests_own_timeout_is_an_http_error() {
    let addr = fabric().await;
    let spec = http_spec(
        &format!("http://{addr}/slow"),
        Some(&format!("http://{addr}")),
        &[("timeout_ms", "200")],
    );
    let provider = load(&spec).await;
    let (out, took) = timed(provider.add(&AddRequest::new(gpu("a")))).await;
    assert_eq!(
        out,
        Err(CallError::Provider(ProviderError::Unavailable(
            "http timeout".into()
        )))
    );
    assert!(took < Duration::from_millis(200) + SLACK, "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_call_deadline_covers_time_spent_in_host_io() {
    let addr = fabric().await;
    let mut spec = http_spec(
        &format!("http://{addr}/slow"),
        Some(&format!("http://{addr}")),
        // The guest asks for far more than the call has.
        &[("timeout_ms", "600000")],
    );
    spec.config.insert("mode".into(), "sleep-http".into());
    spec.limits.call_timeout_ms = 1000;
    let provider = load(&spec).await;
    let good = load(&common::spec("fake", &[])).await;
    let a = AddRequest::new(gpu("a"));
    let (slow, fast) = tokio::join!(timed(provider.add(&a)), async {
        // Other calls are served while the slow one waits on the network.
        good.add(&AddRequest::new(gpu("g"))).await
    });
    let (out, took) = slow;
    assert_eq!(out, Err(CallError::Timeout(Duration::from_millis(1000))));
    assert!(
        took >= Duration::from_millis(1000) && took < Duration::from_millis(1000) + SLACK,
        "{took:?}"
    );
    assert!(matches!(fast, Ok(AddOutcome::Attached(_))), "{fast:?}");
    // The provider is fine afterwards.
    let hello = http_spec(
        &format!("http://{addr}/hello"),
        Some(&format!("http://{addr}")),
        &[],
    );
    let provider = load(&hello).await;
    assert_eq!(
        provider.add(&AddRequest::new(gpu("a"))).await.unwrap(),
        reply("200 hello")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_http_and_https_urls() {
    let provider = load(&http_spec("file:///etc/passwd", None, &[])).await;
    assert_eq!(
        provider.add(&AddRequest::new(gpu("a"))).await.unwrap_err(),
        CallError::Provider(ProviderError::Config(
            "`file`: only http and https URLs".into()
        ))
    );
    let provider = load(&http_spec("not a url", None, &[])).await;
    assert!(matches!(
        provider.add(&AddRequest::new(gpu("a"))).await.unwrap_err(),
        CallError::Provider(ProviderError::Config(_))
    ));
    assert_eq!(provider.denials().total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_trusts_a_granted_ca_and_nothing_else() {
    let tls = test_tls();
    let addr = serve_tls(tls.server.clone(), "secure").await;
    let url = format!("https://{addr}/");
    let target = format!("https://{addr}").parse().unwrap();

    let mut trusted = spec("http", &[("url", &url)]);
    trusted.grants.http.push(HttpGrant {
        url: target,
        ca_pem: Some(tls.ca_pem.clone().try_into().unwrap()),
    });
    let provider = load(&trusted).await;
    assert_eq!(
        provider.add(&AddRequest::new(gpu("a"))).await.unwrap(),
        reply("200 secure")
    );

    // Granted the endpoint but not its CA: the TLS handshake fails, typed as such.
    let untrusted = http_spec(&url, Some(&format!("https://{addr}")), &[]);
    let provider = load(&untrusted).await;
    let err = provider.add(&AddRequest::new(gpu("a"))).await.unwrap_err();
    let CallError::Provider(ProviderError::Unavailable(message)) = &err else {
        panic!("{err:?}")
    };
    assert!(message.starts_with("tls: "), "{message}");
    assert!(message.contains("certificate"), "{message}");
}

/// A server that accepts and closes every connection without a byte of reply.
async fn dropper() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            // Read the request first so the client has sent it, then drop the socket.
            let mut buf = [0u8; 4096];
            let _ = tokio::io::AsyncReadExt::read(&mut socket, &mut buf).await;
            drop(socket);
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_is_a_connect_error() {
    let addr = dropper().await;
    let spec = http_spec(
        &format!("http://{addr}/x"),
        Some(&format!("http://{addr}")),
        &[],
    );
    let provider = load(&spec).await;
    match provider.add(&AddRequest::new(gpu("a"))).await {
        Err(CallError::Provider(ProviderError::Unavailable(m))) => {
            assert!(m.starts_with("connect"), "{m}")
        }
        other => panic!("expected a connect error, got {other:?}"),
    }
}

/// A server that records the `Host` header of every request reaching it.
async fn host_recorder() -> (std::net::SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let router = Router::new()
        .fallback(any(
            |State(seen): State<Arc<std::sync::Mutex<Vec<String>>>>,
             headers: axum::http::HeaderMap| async move {
                let host = headers
                    .get(header::HOST)
                    .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
                    .unwrap_or_default();
                seen.lock().unwrap().push(host);
                "ok"
            },
        ))
        .with_state(seen.clone());
    (serve(router).await, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framing_and_routing_headers_never_go_on_the_wire() {
    let (addr, seen) = host_recorder().await;
    let grant = format!("http://{addr}");
    let url = format!("http://{addr}/x");
    let refused = [
        "Host: internal-admin.example",
        "host: internal-admin.example",
        "Connection: upgrade",
        "Transfer-Encoding: chunked",
        "Content-Length: 0",
        "Upgrade: h2c",
        "Proxy-Authorization: Basic eA==",
    ];
    let tries = async {
        for header in refused {
            let p = load(&http_spec(&url, Some(&grant), &[("headers", header)])).await;
            let out = p.add(&AddRequest::new(gpu("a"))).await;
            let Err(CallError::Provider(ProviderError::Denied(m))) = &out else {
                panic!("{header}: {out:?}")
            };
            assert!(m.contains("set by the host only"), "{m}");
            assert_eq!(p.denials().http, 1);
        }
    };
    beside_a_good_provider(tries).await;
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );
    // Ordinary headers go through, and the Host on the wire is the granted one.
    let p = load(&http_spec(
        &url,
        Some(&grant),
        &[(
            "headers",
            "Authorization: Bearer t|Content-Type: application/json",
        )],
    ))
    .await;
    assert_eq!(
        p.add(&AddRequest::new(gpu("a"))).await.unwrap(),
        reply("200 ok")
    );
    assert_eq!(*seen.lock().unwrap(), vec![addr.to_string()]);
}

/// A counting sink: every request that reaches it, and the bytes of their bodies.
async fn sink() -> (std::net::SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (hits, bytes) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let router = Router::new()
        .fallback(any(
            |State((hits, bytes)): State<(Arc<AtomicUsize>, Arc<AtomicUsize>)>,
             body: axum::body::Bytes| async move {
                hits.fetch_add(1, Ordering::SeqCst);
                bytes.fetch_add(body.len(), Ordering::SeqCst);
                "ok"
            },
        ))
        .with_state((hits.clone(), bytes.clone()))
        .layer(axum::extract::DefaultBodyLimit::disable());
    (serve(router).await, hits, bytes)
}

/// A provider looping on a tiny GET is stopped at `limits.http_requests_per_call`, one
/// sending 8 MB bodies at `limits.http_bytes_sent_per_call`: the fabric sees no request
/// past the budget, and the call ends with the budget named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_bytes_sent_per_call_are_budgeted() {
    let (addr, hits, bytes) = sink().await;
    let grant = format!("http://{addr}");
    let url = format!("http://{addr}/loop");

    let mut gets = http_spec(&url, Some(&grant), &[]);
    gets.config.insert("mode".into(), "http-loop".into());
    gets.limits.http_requests_per_call = 40;
    let p = load(&gets).await;
    let (out, served) = beside_a_good_provider(p.add(&AddRequest::new(gpu("a")))).await;
    assert_eq!(
        out,
        Err(CallError::Budget(cro_runtime::BudgetExceeded {
            budget: cro_runtime::Budget::HttpRequests,
            limit: 40
        }))
    );
    assert_eq!(hits.load(Ordering::SeqCst), 40);
    assert_eq!(p.budgets().get(cro_runtime::Budget::HttpRequests), 1);
    assert!(served > 0);
    let text = out.unwrap_err().to_string();
    assert!(text.contains("limits.http_requests_per_call"), "{text}");

    hits.store(0, Ordering::SeqCst);
    let mut posts = http_spec(
        &url,
        Some(&grant),
        &[("method", "POST"), ("size", "8000000")],
    );
    posts.config.insert("mode".into(), "http-loop".into());
    posts.limits.memory_bytes = 64 << 20;
    posts.limits.host_call_bytes = 16 << 20;
    posts.limits.http_bytes_sent_per_call = 20_000_000;
    let p = load(&posts).await;
    let out = p.add(&AddRequest::new(gpu("a"))).await;
    assert_eq!(
        out,
        Err(CallError::Budget(cro_runtime::BudgetExceeded {
            budget: cro_runtime::Budget::HttpBytesSent,
            limit: 20_000_000
        }))
    );
    // Two bodies fit in 20 MB; the third is refused before a byte of it is sent.
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    assert_eq!(bytes.load(Ordering::SeqCst), 16_000_000);
}

/// A fence the test opens and closes, counting how often it is asked.
struct Switch {
    open: Arc<AtomicBool>,
    asked: Arc<AtomicUsize>,
}

impl Switch {
    fn new(open: bool) -> Switch {
        Switch {
            open: Arc::new(AtomicBool::new(open)),
            asked: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn fence(&self) -> Fence {
        let (open, asked) = (self.open.clone(), self.asked.clone());
        Arc::new(move || {
            asked.fetch_add(1, Ordering::SeqCst);
            if open.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err("lease of testkit expired".into())
            }
        })
    }
}

async fn load_fenced(spec: &ProviderSpec, fence: Fence) -> cro_runtime::Provider {
    runtime()
        .load_with(
            spec,
            Arc::new(cro_runtime::cluster::StaticCluster::new()),
            LoadOptions::default().with_fence(fence),
        )
        .await
        .unwrap()
}

/// What the guest gets for a fenced request: a connection failure naming the reason
/// (the testkit maps `connect` to `unavailable`), never `denied`.
fn fenced(reason: &str) -> CallError {
    CallError::Provider(ProviderError::Unavailable(format!(
        "connect: not sent: {reason}"
    )))
}

/// A replica whose Lease expired makes no further fabric call: a closed fence keeps the
/// request off the wire (the server counts nothing), is not counted as a denial, and
/// opening or closing it again takes effect on the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_fence_keeps_requests_off_the_wire() {
    let (addr, hits, _) = sink().await;
    let switch = Switch::new(false);
    let spec = http_spec(
        &format!("http://{addr}/attach"),
        Some(&format!("http://{addr}")),
        &[],
    );
    let provider = load_fenced(&spec, switch.fence()).await;
    let a = AddRequest::new(gpu("a"));

    assert_eq!(
        provider.add(&a).await.unwrap_err(),
        fenced("lease of testkit expired")
    );
    assert_eq!(hits.load(Ordering::SeqCst), 0);
    assert_eq!(provider.denials().total(), 0);

    switch.open.store(true, Ordering::SeqCst);
    assert_eq!(provider.add(&a).await.unwrap(), reply("200 ok"));
    assert_eq!(hits.load(Ordering::SeqCst), 1);

    switch.open.store(false, Ordering::SeqCst);
    assert_eq!(
        provider.add(&a).await.unwrap_err(),
        fenced("lease of testkit expired")
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    // Each request is asked once before it is handed to the client; the one sent was
    // asked once more, by its connection's write (head and body leave in one write).
    assert_eq!(switch.asked.load(Ordering::SeqCst), 4);

    // The grants come first: an ungranted request is denied as always, and the fence
    // is not even asked.
    let (evil, evil_hits) = elsewhere().await;
    let ungranted = http_spec(
        &format!("http://{evil}/x"),
        Some(&format!("http://{addr}")),
        &[],
    );
    let before = switch.asked.load(Ordering::SeqCst);
    let provider = load_fenced(&ungranted, switch.fence()).await;
    let err = provider.add(&a).await.unwrap_err();
    assert!(err.denied().is_some(), "{err:?}");
    assert_eq!(provider.denials().http, 1);
    assert_eq!(switch.asked.load(Ordering::SeqCst), before);
    assert_eq!(evil_hits.load(Ordering::SeqCst), 0);
}

/// The fence is asked per request, not per call: closed while a call is under way (the
/// Lease expired mid-call), it stops that call's very next request, redirect hops
/// included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_closed_mid_call_stops_the_next_request() {
    let switch = Switch::new(true);
    let hits = Arc::new(AtomicUsize::new(0));
    // Each request that arrives closes the fence before it is answered.
    let router = Router::new()
        .route(
            "/first",
            get(|| async { (StatusCode::FOUND, [(header::LOCATION, "/second")]) }),
        )
        .fallback(any(|State(hits): State<Arc<AtomicUsize>>| async move {
            hits.fetch_add(1, Ordering::SeqCst);
            "ok"
        }))
        .layer(axum::middleware::from_fn_with_state(
            switch.open.clone(),
            |State(open): State<Arc<AtomicBool>>,
             request: axum::extract::Request,
             next: axum::middleware::Next| async move {
                open.store(false, Ordering::SeqCst);
                next.run(request).await
            },
        ))
        .with_state(hits.clone());
    let addr = serve(router).await;
    let grant = format!("http://{addr}");

    // A provider sending five requests in one call: only the first reaches the fabric.
    let mut looping = http_spec(&format!("http://{addr}/loop"), Some(&grant), &[]);
    looping.config.insert("mode".into(), "http-loop".into());
    looping.config.insert("count".into(), "5".into());
    let provider = load_fenced(&looping, switch.fence()).await;
    provider.add(&AddRequest::new(gpu("a"))).await.unwrap();
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    // Five requests asked, and the first one's write.
    assert_eq!(switch.asked.load(Ordering::SeqCst), 6);
    assert_eq!(provider.denials().total(), 0);

    // A redirect hop is a new request: the first reply closed the fence, so the hop to
    // `/second` is never sent.
    switch.open.store(true, Ordering::SeqCst);
    let provider = load_fenced(
        &http_spec(&format!("http://{addr}/first"), Some(&grant), &[]),
        switch.fence(),
    )
    .await;
    let err = provider.add(&AddRequest::new(gpu("a"))).await.unwrap_err();
    let CallError::Provider(ProviderError::Unavailable(message)) = &err else {
        panic!("{err:?}")
    };
    assert!(
        message.starts_with("connect: not sent: lease of testkit expired (redirect from"),
        "{message}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert_eq!(provider.denials().total(), 0);
}

/// A fence answering from a script, one answer per ask in order (refusing once the
/// script runs out), counting the asks.
fn scripted(answers: &[bool]) -> (Fence, Arc<AtomicUsize>) {
    let answers: Arc<[bool]> = answers.into();
    let asked = Arc::new(AtomicUsize::new(0));
    let count = asked.clone();
    let fence: Fence = Arc::new(move || {
        let n = count.fetch_add(1, Ordering::SeqCst);
        if answers.get(n).copied().unwrap_or(false) {
            Ok(())
        } else {
            Err("lease of testkit moved".into())
        }
    });
    (fence, asked)
}

/// The window between a request's check and its first byte (where a process paused by
/// SIGSTOP and resumed after its Lease moved would otherwise send under the old Lease):
/// the connection asks the fence again before each write, so a fence closed after the
/// request's check keeps the request off the wire, on a new connection and on a pooled
/// one alike, and the guest gets the same "not sent" as a request refused up front.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_closed_after_the_check_stops_the_write() {
    let (addr, hits, _) = sink().await;
    let spec = http_spec(
        &format!("http://{addr}/attach"),
        Some(&format!("http://{addr}")),
        &[],
    );
    let a = AddRequest::new(gpu("a"));

    // A new connection: the request's check passes, its connection's write is refused.
    let (fence, asked) = scripted(&[true]);
    let provider = load_fenced(&spec, fence).await;
    assert_eq!(
        provider.add(&a).await.unwrap_err(),
        fenced("lease of testkit moved")
    );
    assert_eq!(hits.load(Ordering::SeqCst), 0);
    assert_eq!(asked.load(Ordering::SeqCst), 2);
    assert_eq!(provider.denials().total(), 0);

    // A pooled connection: the first request goes out (check, write) and leaves its
    // connection idle; the second passes its check and is refused at the write.
    let (fence, asked) = scripted(&[true, true, true]);
    let provider = load_fenced(&spec, fence).await;
    assert_eq!(provider.add(&a).await.unwrap(), reply("200 ok"));
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert_eq!(
        provider.add(&a).await.unwrap_err(),
        fenced("lease of testkit moved")
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert_eq!(asked.load(Ordering::SeqCst), 4);
}

/// Over TLS the fence sits under the TLS layer: a fence closed after the request's check
/// stops the handshake's first write, and nothing reaches the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_closed_after_the_check_stops_a_tls_handshake() {
    let tls = test_tls();
    let addr = serve_tls(tls.server.clone(), "secure").await;
    let mut spec = spec("http", &[("url", &format!("https://{addr}/"))]);
    spec.grants.http.push(HttpGrant {
        url: format!("https://{addr}").parse().unwrap(),
        ca_pem: Some(tls.ca_pem.clone().try_into().unwrap()),
    });
    let (fence, asked) = scripted(&[true]);
    let provider = load_fenced(&spec, fence).await;
    assert_eq!(
        provider.add(&AddRequest::new(gpu("a"))).await.unwrap_err(),
        fenced("lease of testkit moved")
    );
    assert_eq!(asked.load(Ordering::SeqCst), 2);
}

//! https sources against a real TLS server on loopback (rustls, a self-signed certificate
//! the client trusts), serving the FTI component with or without a Content-Length.

use std::sync::Arc;

use cro_api::{ComponentSource, HttpsSource};
use cro_operator::source::{self, FetchOptions, SourceError, sha256_hex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Serves `body` for any GET on `/c.wasm` (404 elsewhere); `content_length: false` sends
/// a close-delimited body, so only the streaming limit can stop it.
async fn serve(body: Vec<u8>, content_length: bool) -> (String, reqwest::Client) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let server = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into()),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let body = body.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let found = head.starts_with(b"GET /c.wasm ");
                let status = if found { "200 OK" } else { "404 Not Found" };
                let body: &[u8] = if found { &body } else { b"" };
                let length = if content_length || !found {
                    format!("content-length: {}\r\n", body.len())
                } else {
                    String::new()
                };
                let reply = format!("HTTP/1.1 {status}\r\n{length}connection: close\r\n\r\n");
                let _ = tls.write_all(reply.as_bytes()).await;
                let _ = tls.write_all(body).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(cert.cert.pem().as_bytes()).unwrap())
        .resolve("localhost", ([127, 0, 0, 1], port).into())
        .build()
        .unwrap();
    (format!("https://localhost:{port}"), client)
}

fn https(url: String, sha256: String) -> ComponentSource {
    ComponentSource {
        https: Some(HttpsSource { url, sha256 }),
        ..ComponentSource::default()
    }
}

#[tokio::test]
async fn an_https_component_is_accepted_only_with_its_sha256_and_within_the_limit() {
    let kube = kube_harness::shared().await.unwrap().client().unwrap();
    let wasm = super::fti_component();
    let good = sha256_hex(&wasm);
    for content_length in [true, false] {
        let (base, client) = serve(wasm.clone(), content_length).await;
        let options = FetchOptions {
            https: client,
            ..FetchOptions::default()
        };
        let url = format!("{base}/c.wasm");
        let fetched = source::fetch(&kube, &https(url.clone(), good.clone()), &options)
            .await
            .unwrap();
        assert!(fetched.bytes == wasm);
        assert_eq!(fetched.digest, format!("sha256:{good}"));

        let wrong = sha256_hex(b"another build");
        let err = source::fetch(&kube, &https(url.clone(), wrong.clone()), &options)
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("expected sha256:{wrong}, got sha256:{good}"))
                && msg.contains(&url),
            "{msg}"
        );

        let small = FetchOptions {
            max_component_bytes: 4096,
            ..options.clone()
        };
        let err = source::fetch(&kube, &https(url.clone(), good.clone()), &small)
            .await
            .unwrap_err();
        // Announced: refused before the body; close-delimited: refused while streaming.
        assert!(
            matches!(err, SourceError::TooLarge { declared, limit: 4096, .. } if declared == content_length),
            "{err:?}"
        );

        let err = source::fetch(
            &kube,
            &https(format!("{base}/missing.wasm"), good.clone()),
            &options,
        )
        .await
        .unwrap_err();
        assert!(
            matches!(err, SourceError::HttpStatus { status: 404, .. }),
            "{err:?}"
        );
    }
    let err = source::fetch(
        &kube,
        &https("http://localhost/c.wasm".into(), good),
        &FetchOptions::default(),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("scheme http is not https"),
        "{err}"
    );
}

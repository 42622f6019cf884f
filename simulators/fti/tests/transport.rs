//! HTTPS with the simulator's CA, plain HTTP, request recording (with the callers),
//! sharing the handle across tasks, shutdown, and the `fabric-sim` binary.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use fabric_sim::{FabricSim, Route, SimConfig};
use serde_json::Value;

#[tokio::test]
async fn https_needs_the_simulator_ca() {
    let sim = start(SimConfig::default());
    assert!(sim.endpoint().starts_with("https://127.0.0.1:"));
    assert!(sim.endpoint().ends_with('/'));

    // Trusting the CA from its PEM, as a provider host would.
    let mut roots = rustls::RootCertStore::empty();
    let pem = sim.ca_pem();
    let der = {
        use base64::Engine;
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        base64::engine::general_purpose::STANDARD
            .decode(body)
            .unwrap()
    };
    assert_eq!(der, sim.ca_der());
    roots
        .add(rustls::pki_types::CertificateDer::from(der))
        .unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let http = reqwest::Client::builder()
        .use_preconfigured_tls(config)
        .build()
        .unwrap();
    assert_eq!(token(&sim, &http).await.split('.').count(), 3);

    // "localhost" is in the certificate too.
    let localhost = sim.endpoint().replace("127.0.0.1", "localhost");
    let reply = http
        .post(format!("{localhost}{}", sim.token_path()))
        .form(&token_form(&sim))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);

    // Without the CA the handshake fails.
    let untrusted = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let http = reqwest::Client::builder()
        .use_preconfigured_tls(untrusted)
        .build()
        .unwrap();
    let err = http
        .post(format!("{}{}", sim.endpoint(), sim.token_path()))
        .form(&token_form(&sim))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_connect(), "{err:?}");
    assert_eq!(
        sim.token_requests().len(),
        2,
        "the refused client got nowhere"
    );
}

#[tokio::test]
async fn plain_http_serves_the_same_state() {
    let sim = start(SimConfig::default());
    sim.attach_directly(M1, "gpu", MODEL).unwrap();
    let http = client(&sim);
    let reply = http
        .post(format!("{}{}", sim.http_endpoint(), sim.token_path()))
        .form(&token_form(&sim))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    let token = reply.json::<Value>().await.unwrap()["access_token"]
        .as_str()
        .unwrap()
        .to_string();
    let url = fm_url(&sim, M1).replace(&sim.endpoint(), &sim.http_endpoint());
    let body: Value = http
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(resources(&body).len(), 1);
    assert!(sim.requests().iter().all(|r| !r.tls));
}

#[tokio::test]
async fn requests_are_recorded_in_order_and_can_be_cleared() {
    let sim = start(SimConfig::default());
    let api = Api::new(&sim).await;
    api.fm_get(M1).await;
    api.cm_get(M2).await;
    let _ = api
        .http
        .get(format!("{}somewhere/else", sim.endpoint()))
        .send()
        .await
        .unwrap();

    let all = sim.requests();
    assert_eq!(all.len(), 4);
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(all[0].route, Some(Route::Token));
    assert_eq!(all[0].method, "POST");
    assert_eq!(
        all[0].header("content-type"),
        Some("application/x-www-form-urlencoded")
    );
    assert_eq!(all[1].route, Some(Route::FmGetMachine));
    assert_eq!(all[1].path, format!("/fabric_manager/api/v1/machines/{M1}"));
    assert_eq!(
        all[1].query.as_deref(),
        Some(format!("tenant_uuid={}", sim.tenant_id()).as_str())
    );
    assert_eq!(all[1].bearer(), Some(api.token.as_str()));
    assert_eq!(all[2].route, Some(Route::CmGetMachine));
    assert_eq!(all[3].route, None);
    assert_eq!(all[3].bearer(), None);
    assert_eq!(sim.token_requests().len(), 1);
    assert_eq!(sim.requests_to(Route::CmGetMachine).len(), 1);

    sim.clear_requests();
    assert!(sim.requests().is_empty());
    api.fm_get(M1).await;
    assert_eq!(sim.requests().len(), 1);
    assert!(sim.token_requests().is_empty());
}

/// One request on an open connection, kept open (HTTP/1.1 keep-alive); the status.
fn request_on(conn: &mut std::net::TcpStream, path: &str) -> u16 {
    use std::io::{Read, Write};
    write!(conn, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        conn.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .expect("a sized reply");
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body).unwrap();
    head.split(' ').nth(1).unwrap().parse().unwrap()
}

#[test]
fn calls_are_recorded_with_their_caller() {
    use fabric_sim::PidResolver;
    use std::net::TcpStream;
    use std::time::SystemTime;

    let sim = start(SimConfig::default());
    let path = format!("/fabric_manager/api/v1/machines/{M1}");
    // A connection accepted before callers are recorded has no caller for what it sent
    // then; asked again at its next request, it has one.
    let mut early = TcpStream::connect(sim.http_addr()).unwrap();
    assert_eq!(request_on(&mut early, &path), 401);

    let resolver = PidResolver::new();
    resolver.insert(std::process::id(), "test-process");
    sim.record_callers(resolver.resolver());
    let before = SystemTime::now();
    let mut conn = TcpStream::connect(sim.http_addr()).unwrap();
    assert_eq!(request_on(&mut conn, &path), 401);
    assert_eq!(request_on(&mut conn, "/elsewhere"), 401);
    assert_eq!(request_on(&mut early, &path), 401);
    let after = SystemTime::now();

    let calls = sim.calls();
    assert_eq!(calls.len(), 4);
    assert_eq!(
        calls
            .iter()
            .map(|c| c.caller.as_deref())
            .collect::<Vec<_>>(),
        [
            None,
            Some("test-process"),
            Some("test-process"),
            Some("test-process")
        ]
    );
    assert!(calls.iter().all(|c| c.method == "GET"));
    assert_eq!(calls[1].route, Some(Route::FmGetMachine));
    assert_eq!(calls[1].path, path);
    assert_eq!(calls[2].route, None);
    assert_eq!(calls[1].peer, conn.local_addr().unwrap());
    assert_eq!(calls[0].peer, early.local_addr().unwrap());
    assert!(calls[1..3].iter().all(|c| before <= c.at && c.at <= after));
    assert!(calls.windows(2).all(|w| w[0].seq < w[1].seq));

    // A process the resolver does not know is recorded as unknown.
    resolver.remove(std::process::id());
    let mut unknown = TcpStream::connect(sim.http_addr()).unwrap();
    assert_eq!(request_on(&mut unknown, &path), 401);
    assert_eq!(sim.calls().last().unwrap().caller, None);

    // Clearing the calls keeps the request log (the node simulation reads it).
    sim.clear_calls();
    assert!(sim.calls().is_empty());
    assert_eq!(sim.requests().len(), 5);
    resolver.insert(std::process::id(), "test-process");
    assert_eq!(request_on(&mut conn, &path), 401);
    let calls = sim.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].caller.as_deref(), Some("test-process"));

    // Stopped: new connections are not named, open ones keep their name.
    sim.stop_recording_callers();
    let mut late = TcpStream::connect(sim.http_addr()).unwrap();
    assert_eq!(request_on(&mut late, &path), 401);
    assert_eq!(request_on(&mut conn, &path), 401);
    let callers: Vec<_> = sim.calls().into_iter().map(|c| c.caller).collect();
    assert_eq!(
        callers,
        [
            Some("test-process".to_owned()),
            None,
            Some("test-process".to_owned())
        ]
    );
    sim.clear_requests();
    assert!(sim.calls().is_empty(), "a view of the request log");
}

/// A call from another process is recorded under that process's name (bash's
/// `/dev/tcp` as the client: no HTTP client needed in the child).
#[test]
fn a_call_from_a_child_process_names_the_child() {
    use fabric_sim::PidResolver;

    let sim = start(SimConfig::default());
    let resolver = PidResolver::new();
    resolver.insert(std::process::id(), "parent");
    sim.record_callers(resolver.resolver());
    let port = sim.http_addr().port();
    let script = format!(
        "read -r go; exec 3<>/dev/tcp/127.0.0.1/{port}; printf 'GET /from-child HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n' >&3; cat <&3 >/dev/null"
    );
    let mut child = Command::new("bash")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // The child connects once told to, when the resolver knows it.
    resolver.insert(child.id(), "child");
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"go\n").unwrap();
    assert!(child.wait().unwrap().success());
    let calls = sim.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].path, "/from-child");
    assert_eq!(calls[0].caller.as_deref(), Some("child"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handle_is_shared_across_tasks() {
    let sim = start(SimConfig::default());
    sim.add_free_devices("gpu", MODEL, 8);
    let api = std::sync::Arc::new(Api::new(&sim).await);
    let mut tasks = Vec::new();
    for i in 0..8 {
        let api = api.clone();
        let sim = sim.clone();
        tasks.push(tokio::spawn(async move {
            let machine = if i % 2 == 0 { M1 } else { M2 };
            let (status, _) = api.fm_attach(machine, MODEL).await;
            assert_eq!(status, 200);
            sim.machine_devices(machine).len()
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap() >= 1);
    }
    assert_eq!(sim.free_devices("gpu", MODEL), 0);
    assert_eq!(sim.machine_devices(M1).len(), 4);
    assert_eq!(sim.machine_devices(M2).len(), 4);
    assert_eq!(sim.requests_to(Route::FmAttach).len(), 8);
}

#[tokio::test]
async fn shutdown_and_last_drop_stop_the_server() {
    let sim = start(SimConfig::default());
    let http = client(&sim);
    token(&sim, &http).await;
    let addr = sim.https_addr();
    sim.shutdown();
    assert!(std::net::TcpStream::connect(addr).is_err());

    let sim = FabricSim::start(SimConfig::default()).unwrap();
    let addr = sim.http_addr();
    let copy = sim.clone();
    drop(sim);
    assert!(
        std::net::TcpStream::connect(addr).is_ok(),
        "a clone keeps it up"
    );
    drop(copy);
    poll(Duration::from_secs(10), || async {
        std::net::TcpStream::connect(addr).is_err().then_some(())
    })
    .await;
}

#[tokio::test]
async fn binary_prints_connection_details_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    let setup = dir.path().join("sim.yaml");
    std::fs::write(
        &setup,
        format!(
            "realm: demo\nmachines:\n  - uuid: {M1}\n    name: worker-1\n    devices: [{{type: gpu, model: \"{MODEL}\"}}]\npools:\n  - {{type: gpu, model: \"{MODEL}\", count: 2}}\n"
        ),
    )
    .unwrap();
    let ca_file = dir.path().join("ca.pem");
    let mut child = Command::new(env!("CARGO_BIN_EXE_fabric-sim"))
        .arg("--config")
        .arg(&setup)
        .args(["--machine", "worker-2", "--json", "--ca-out"])
        .arg(&ca_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await
    .unwrap()
    .unwrap();
    let info: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(info["realm"], "demo");
    assert_eq!(info["machines"].as_array().unwrap().len(), 2);
    assert_eq!(info["machines"][0]["devices"][0]["model"], MODEL);
    assert_eq!(info["ca_file"], ca_file.to_str().unwrap());
    let ca = std::fs::read(&ca_file).unwrap();

    // Talk to it with only what it printed.
    let mut roots = rustls::RootCertStore::empty();
    let der = {
        use base64::Engine;
        let text = String::from_utf8(ca).unwrap();
        let body: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
        base64::engine::general_purpose::STANDARD
            .decode(body)
            .unwrap()
    };
    roots
        .add(rustls::pki_types::CertificateDer::from(der))
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let http = reqwest::Client::builder()
        .use_preconfigured_tls(config)
        .build()
        .unwrap();
    let endpoint = info["endpoint"].as_str().unwrap();
    let creds = &info["credentials"];
    let form = [
        ("client_id", creds["client_id"].as_str().unwrap()),
        ("client_secret", creds["client_secret"].as_str().unwrap()),
        ("username", creds["username"].as_str().unwrap()),
        ("password", creds["password"].as_str().unwrap()),
        ("grant_type", "password"),
        ("scope", "openid"),
    ];
    let result = http
        .post(format!(
            "{endpoint}id_manager/realms/demo/protocol/openid-connect/token"
        ))
        .form(&form)
        .send()
        .await;
    let token: Value = match result {
        Ok(reply) => reply.json().await.unwrap(),
        Err(e) => {
            let _ = child.kill();
            panic!("{e:?}");
        }
    };
    let tenant = info["tenant_id"].as_str().unwrap();
    let reply: Value = http
        .get(format!(
            "{endpoint}fabric_manager/api/v1/machines/{M1}?tenant_uuid={tenant}"
        ))
        .bearer_auth(token["access_token"].as_str().unwrap())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(resources(&reply).len(), 1);
}

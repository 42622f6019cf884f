//! Every non-HTTP capability granted and denied: secrets, lookups (incl. list-nodes),
//! config, log, state (bound and TTL), and the WASI surface (clocks only when granted;
//! never files, environment or sockets).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::*;
use cro_runtime::cluster::StaticCluster;
use cro_runtime::grants::{LookupGrant, SecretGrant, WasiGrant};
use cro_runtime::{
    AddOutcome, AttachedDevice, CallError, ProviderError, ProviderSpec, Runtime, RuntimeOptions,
};
use serde_json::json;

fn ok(device_id: &str, mode: &str) -> Result<AddOutcome, CallError> {
    Ok(AddOutcome::Attached(AttachedDevice {
        device_id: device_id.into(),
        fabric_device_id: mode.into(),
    }))
}

fn denied(message: &str) -> Result<AddOutcome, CallError> {
    Err(CallError::Provider(ProviderError::Denied(message.into())))
}

fn cluster() -> StaticCluster {
    StaticCluster::new()
        .with_node("worker-0")
        .with_node("worker-1")
        .with_object(json!({
            "apiVersion": "metal3.io/v1alpha1",
            "kind": "BareMetalHost",
            "metadata": {"name": "bmh-0", "namespace": "openshift-machine-api"},
            "spec": {"bootMACAddress": "00:11:22:33:44:55"},
        }))
        .unwrap()
        .with_secret(
            "cro-system",
            "credentials",
            [
                ("username", b"admin".as_slice()),
                ("password", b"hunter2".as_slice()),
                ("binary", b"\xff\xfe".as_slice()),
            ],
        )
}

fn secret_spec(key: &str, keys: &[&str]) -> ProviderSpec {
    let mut spec = spec("secret", &[("key", key)]);
    spec.grants.secret = Some(SecretGrant {
        namespace: "cro-system".into(),
        name: "credentials".into(),
        keys: keys.iter().map(|k| k.to_string()).collect(),
    });
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_granted_and_denied() {
    let granted = load_with(&secret_spec("username", &["username"]), cluster()).await;
    assert_eq!(granted.add_resource(&gpu("a")).await, ok("admin", "secret"));

    let other_key = load_with(&secret_spec("password", &["username"]), cluster()).await;
    assert_eq!(
        other_key.add_resource(&gpu("a")).await,
        denied("no secret grant for key `password` of cro-system/credentials")
    );
    assert_eq!(other_key.denials().secret, 1);

    let none = load_with(&spec("secret", &[("key", "password")]), cluster()).await;
    assert_eq!(
        none.add_resource(&gpu("a")).await,
        denied("no secret grant (the provider asked for key `password`)")
    );

    // Granted but absent, or not text.
    let absent = load_with(&secret_spec("realm", &["realm"]), cluster()).await;
    assert_eq!(
        absent.add_resource(&gpu("a")).await,
        Err(CallError::Provider(ProviderError::NotFound(
            "key `realm` is not in Secret cro-system/credentials".into()
        )))
    );
    let binary = load_with(&secret_spec("binary", &["binary"]), cluster()).await;
    assert!(matches!(
        binary.add_resource(&gpu("a")).await,
        Err(CallError::Provider(ProviderError::Other(m))) if m.contains("not UTF-8")
    ));
    let no_secret = load_with(
        &secret_spec("username", &["username"]),
        StaticCluster::new(),
    )
    .await;
    assert_eq!(
        no_secret.add_resource(&gpu("a")).await,
        Err(CallError::Provider(ProviderError::NotFound(
            "Secret cro-system/credentials not found".into()
        )))
    );
}

fn lookup_spec(config: &[(&str, &str)], grants: &[(&str, &str)]) -> ProviderSpec {
    let mut spec = spec("lookup", config);
    spec.grants.lookup = grants
        .iter()
        .map(|(v, k)| LookupGrant::new(*v, *k))
        .collect();
    spec
}

fn attached_json(out: Result<AddOutcome, CallError>) -> Vec<serde_json::Value> {
    let Ok(AddOutcome::Attached(AttachedDevice { device_id, .. })) = out else {
        panic!("{out:?}")
    };
    device_id
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_granted_and_denied() {
    let node = [("v1", "Node")];
    let p = load_with(
        &lookup_spec(&[("what", "node"), ("name", "worker-1")], &node),
        cluster(),
    )
    .await;
    let got = attached_json(p.add_resource(&gpu("a")).await);
    assert_eq!(got[0]["metadata"]["name"], "worker-1");
    assert_eq!(got[0]["kind"], "Node");

    let p = load_with(&lookup_spec(&[("what", "nodes")], &node), cluster()).await;
    let names: Vec<_> = attached_json(p.add_resource(&gpu("a")).await)
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["worker-0", "worker-1"]);

    let p = load_with(
        &lookup_spec(&[("what", "node"), ("name", "worker-9")], &node),
        cluster(),
    )
    .await;
    assert_eq!(
        p.add_resource(&gpu("a")).await,
        Err(CallError::Provider(ProviderError::NotFound(
            "v1 Node worker-9 not found".into()
        )))
    );

    for what in ["node", "nodes"] {
        let p = load_with(
            &lookup_spec(&[("what", what), ("name", "worker-0")], &[]),
            cluster(),
        )
        .await;
        assert_eq!(
            p.add_resource(&gpu("a")).await,
            denied("no lookup grant for v1 Node")
        );
        assert_eq!(p.denials().lookup, 1);
    }

    let bmh = [
        ("what", "object"),
        ("api_version", "metal3.io/v1alpha1"),
        ("kind", "BareMetalHost"),
        ("namespace", "openshift-machine-api"),
        ("name", "bmh-0"),
    ];
    let p = load_with(
        &lookup_spec(&bmh, &[("metal3.io/v1alpha1", "BareMetalHost")]),
        cluster(),
    )
    .await;
    let got = attached_json(p.add_resource(&gpu("a")).await);
    assert_eq!(got[0]["spec"]["bootMACAddress"], "00:11:22:33:44:55");

    // Granting Node does not grant BareMetalHost.
    let p = load_with(&lookup_spec(&bmh, &node), cluster()).await;
    assert_eq!(
        p.add_resource(&gpu("a")).await,
        denied("no lookup grant for metal3.io/v1alpha1 BareMetalHost")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_serves_the_providers_own_values() {
    let p = load(&spec(
        "config",
        &[("key", "endpoint"), ("endpoint", "https://fabric")],
    ))
    .await;
    // mode, key, endpoint
    assert_eq!(
        p.add_resource(&gpu("a")).await,
        ok("https://fabric|3", "config")
    );
    let p = load(&spec("config", &[("key", "missing")])).await;
    assert_eq!(p.add_resource(&gpu("a")).await, ok("<none>|2", "config"));
}

/// A `MakeWriter` into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

// Current-thread runtime: the call runs on this thread, under this thread's subscriber.
#[tokio::test(flavor = "current_thread")]
async fn logs_and_denials_reach_tracing_with_the_providers_name() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let mut logging = spec("log", &[("message", "hello from the guest")]);
    logging.name = "vendor-x".into();
    let p = load(&logging).await;
    assert_eq!(p.add_resource(&gpu("a")).await, ok("logged", "log"));

    let mut nosy = secret_spec("password", &["username"]);
    nosy.name = "vendor-y".into();
    let p = load_with(&nosy, cluster()).await;
    assert!(p.add_resource(&gpu("a")).await.is_err());

    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let guest_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("hello from the guest"))
        .collect();
    // trace is below the subscriber's level; debug..error arrive.
    assert_eq!(guest_lines.len(), 4, "{text}");
    for (line, level) in guest_lines.iter().zip(["DEBUG", "INFO", "WARN", "ERROR"]) {
        assert!(line.contains(level) && line.contains("vendor-x"), "{line}");
    }
    let denial = text
        .lines()
        .find(|l| l.contains("capability denied"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        denial.contains("WARN") && denial.contains("vendor-y"),
        "{denial}"
    );
    assert!(
        denial.contains("no secret grant for key `password`"),
        "{denial}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_is_bounded() {
    let mut small = spec("state", &[("bytes", "100")]);
    small.limits.state_bytes = 1024;
    let p = load(&small).await;
    assert_eq!(p.add_resource(&gpu("a")).await, ok("stored", "state"));
    let mut big = small.clone();
    big.config.insert("bytes".into(), "2000".into());
    let p_big = load(&big).await;
    assert_eq!(
        p_big.add_resource(&gpu("a")).await,
        Err(CallError::Provider(ProviderError::Other(
            "state refused the value".into()
        )))
    );
    // No state at all when the limit is zero.
    small.limits.state_bytes = 0;
    let p = load(&small).await;
    assert!(p.add_resource(&gpu("a")).await.is_err());
}

/// A runtime whose wall clock the test moves.
fn clocked_runtime(start_secs: u64) -> (Runtime, Arc<AtomicU64>) {
    let now = Arc::new(AtomicU64::new(start_secs));
    let read = now.clone();
    let options = RuntimeOptions {
        wall_clock: Some(Arc::new(move || {
            SystemTime::UNIX_EPOCH + Duration::from_secs(read.load(Ordering::SeqCst))
        })),
        max_instances: 8,
        ..RuntimeOptions::default()
    };
    (Runtime::new(options).unwrap(), now)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_survives_calls_and_expires_on_the_runtimes_clock() {
    let (runtime, now) = clocked_runtime(1_700_000_000);
    let set = spec(
        "state",
        &[("key", "token"), ("bytes", "32"), ("ttl_ms", "60000")],
    );
    let p = runtime
        .load(&set, Arc::new(StaticCluster::new()))
        .await
        .unwrap();
    let get = in_mode("get", "state;op=get");
    assert!(p.get_resources().await.is_ok());
    assert_eq!(p.add_resource(&gpu("set")).await, ok("stored", "state"));
    assert_eq!(p.add_resource(&get).await, ok("32", "state"));
    now.fetch_add(59, Ordering::SeqCst);
    assert_eq!(p.add_resource(&get).await, ok("32", "state"));
    now.fetch_add(2, Ordering::SeqCst);
    assert_eq!(
        p.add_resource(&get).await,
        Err(CallError::Provider(ProviderError::NotFound(
            "state key token is absent".into()
        )))
    );
    // Another handle of the same spec has its own (empty) state.
    let q = runtime
        .load(&set, Arc::new(StaticCluster::new()))
        .await
        .unwrap();
    assert!(q.add_resource(&get).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasi_clock_only_when_granted() {
    let (runtime, now) = clocked_runtime(1_700_000_000);
    let cluster = Arc::new(StaticCluster::new());
    let frozen = runtime
        .load(&spec("wasi-clock", &[]), cluster.clone())
        .await
        .unwrap();
    assert_eq!(frozen.add_resource(&gpu("a")).await, ok("0", "wasi-clock"));

    let mut granted = spec("wasi-clock", &[]);
    granted.grants.wasi = WasiGrant { clocks: true };
    let p = runtime.load(&granted, cluster.clone()).await.unwrap();
    assert_eq!(
        p.add_resource(&gpu("a")).await,
        ok("1700000000", "wasi-clock")
    );
    now.fetch_add(3600, Ordering::SeqCst);
    assert_eq!(
        p.add_resource(&gpu("a")).await,
        ok("1700003600", "wasi-clock")
    );

    // Without an injected clock a granted clock is the system's.
    let p = load(&granted).await;
    let Ok(AddOutcome::Attached(d)) = p.add_resource(&gpu("a")).await else {
        panic!()
    };
    let guest: u64 = d.device_id.parse().unwrap();
    let host = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(host.abs_diff(guest) < 60, "guest {guest} host {host}");
}

fn denied_report(out: Result<AddOutcome, CallError>) -> String {
    match out {
        Err(CallError::Provider(ProviderError::Denied(report))) => report,
        other => panic!("the guest got through: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_files() {
    let p = load(&spec("wasi-fs", &[])).await;
    let report = denied_report(p.add_resource(&gpu("a")).await);
    assert!(report.contains("read /etc/passwd: Err"), "{report}");
    assert!(report.contains("list /: Err"), "{report}");
    assert!(report.contains("create /tmp/cro-testkit: Err"), "{report}");
    assert!(!std::path::Path::new("/tmp/cro-testkit").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_environment_or_arguments() {
    assert!(
        std::env::vars_os().count() > 0,
        "the host has an environment to leak"
    );
    let p = load(&spec("wasi-env", &[])).await;
    assert_eq!(
        p.add_resource(&gpu("a")).await,
        ok("vars=0 args=0", "wasi-env")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sockets() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let p = load(&spec("wasi-socket", &[("addr", &addr)])).await;
    let report = denied_report(p.add_resource(&gpu("a")).await);
    assert!(report.contains(&format!("tcp {addr}: Err")), "{report}");
    assert!(report.contains("udp bind: Err"), "{report}");
    assert!(report.contains("dns: Err"), "{report}");
    // Nothing ever connected.
    let accepted = listener.accept();
    assert!(
        matches!(&accepted, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "{accepted:?}"
    );
}

//! Every non-HTTP capability granted and denied: secrets, lookups (incl. list-nodes),
//! config, log, state (bound and TTL), and the WASI surface (clocks only when granted;
//! never files, environment or sockets).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::*;
use cro_runtime::AddRequest;
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
        machine_id: None,
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
    assert_eq!(
        granted.add(&AddRequest::new(gpu("a"))).await,
        ok("admin", "secret")
    );

    let other_key = load_with(&secret_spec("password", &["username"]), cluster()).await;
    assert_eq!(
        other_key.add(&AddRequest::new(gpu("a"))).await,
        denied("no secret grant for key `password` of cro-system/credentials")
    );
    assert_eq!(other_key.denials().secret, 1);

    let none = load_with(&spec("secret", &[("key", "password")]), cluster()).await;
    assert_eq!(
        none.add(&AddRequest::new(gpu("a"))).await,
        denied("no secret grant (the provider asked for key `password`)")
    );

    // Granted but absent, or not text.
    let absent = load_with(&secret_spec("realm", &["realm"]), cluster()).await;
    assert_eq!(
        absent.add(&AddRequest::new(gpu("a"))).await,
        Err(CallError::Provider(ProviderError::NotFound(
            "key `realm` is not in Secret cro-system/credentials".into()
        )))
    );
    let binary = load_with(&secret_spec("binary", &["binary"]), cluster()).await;
    assert!(matches!(
        binary.add(&AddRequest::new(gpu("a"))).await,
        Err(CallError::Provider(ProviderError::Other(m))) if m.contains("not UTF-8")
    ));
    let no_secret = load_with(
        &secret_spec("username", &["username"]),
        StaticCluster::new(),
    )
    .await;
    assert_eq!(
        no_secret.add(&AddRequest::new(gpu("a"))).await,
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
    // One JSON value: an object, or the array `what=nodes` answers (an id holds no
    // newline, so the testkit cannot answer one object per line).
    match serde_json::from_str(&device_id).unwrap() {
        serde_json::Value::Array(items) => items,
        one => vec![one],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_granted_and_denied() {
    let node = [("v1", "Node")];
    let p = load_with(
        &lookup_spec(&[("what", "node"), ("name", "worker-1")], &node),
        cluster(),
    )
    .await;
    let got = attached_json(p.add(&AddRequest::new(gpu("a"))).await);
    assert_eq!(got[0]["metadata"]["name"], "worker-1");
    assert_eq!(got[0]["kind"], "Node");

    let p = load_with(&lookup_spec(&[("what", "nodes")], &node), cluster()).await;
    let names: Vec<_> = attached_json(p.add(&AddRequest::new(gpu("a"))).await)
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
        p.add(&AddRequest::new(gpu("a"))).await,
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
            p.add(&AddRequest::new(gpu("a"))).await,
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
    let got = attached_json(p.add(&AddRequest::new(gpu("a"))).await);
    assert_eq!(got[0]["spec"]["bootMACAddress"], "00:11:22:33:44:55");

    // Granting Node does not grant BareMetalHost.
    let p = load_with(&lookup_spec(&bmh, &node), cluster()).await;
    assert_eq!(
        p.add(&AddRequest::new(gpu("a"))).await,
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
        p.add(&AddRequest::new(gpu("a"))).await,
        ok("https://fabric|3", "config")
    );
    let p = load(&spec("config", &[("key", "missing")])).await;
    assert_eq!(
        p.add(&AddRequest::new(gpu("a"))).await,
        ok("<none>|2", "config")
    );
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
    assert_eq!(p.add(&AddRequest::new(gpu("a"))).await, ok("logged", "log"));

    let mut nosy = secret_spec("password", &["username"]);
    nosy.name = "vendor-y".into();
    let p = load_with(&nosy, cluster()).await;
    assert!(p.add(&AddRequest::new(gpu("a"))).await.is_err());

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
    assert_eq!(
        p.add(&AddRequest::new(gpu("a"))).await,
        ok("stored", "state")
    );
    let mut big = small.clone();
    big.config.insert("bytes".into(), "2000".into());
    let p_big = load(&big).await;
    assert_eq!(
        p_big.add(&AddRequest::new(gpu("a"))).await,
        Err(CallError::Provider(ProviderError::Other(
            "state refused the value".into()
        )))
    );
    // No state at all when the limit is zero.
    small.limits.state_bytes = 0;
    let p = load(&small).await;
    assert!(p.add(&AddRequest::new(gpu("a"))).await.is_err());
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
    assert!(p.list(&[]).await.is_ok());
    assert_eq!(
        p.add(&AddRequest::new(gpu("set"))).await,
        ok("stored", "state")
    );
    assert_eq!(
        p.add(&AddRequest::new(get.clone())).await,
        ok("32", "state")
    );
    now.fetch_add(59, Ordering::SeqCst);
    assert_eq!(
        p.add(&AddRequest::new(get.clone())).await,
        ok("32", "state")
    );
    now.fetch_add(2, Ordering::SeqCst);
    assert_eq!(
        p.add(&AddRequest::new(get.clone())).await,
        Err(CallError::Provider(ProviderError::NotFound(
            "state key token is absent".into()
        )))
    );
    // Another handle of the same spec has its own (empty) state.
    let q = runtime
        .load(&set, Arc::new(StaticCluster::new()))
        .await
        .unwrap();
    assert!(q.add(&AddRequest::new(get.clone())).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasi_clock_only_when_granted() {
    let (runtime, now) = clocked_runtime(1_700_000_000);
    let cluster = Arc::new(StaticCluster::new());
    let frozen = runtime
        .load(&spec("wasi-clock", &[]), cluster.clone())
        .await
        .unwrap();
    assert_eq!(
        frozen.add(&AddRequest::new(gpu("a"))).await,
        ok("0", "wasi-clock")
    );

    let mut granted = spec("wasi-clock", &[]);
    granted.grants.wasi = WasiGrant { clocks: true };
    let p = runtime.load(&granted, cluster.clone()).await.unwrap();
    assert_eq!(
        p.add(&AddRequest::new(gpu("a"))).await,
        ok("1700000000", "wasi-clock")
    );
    now.fetch_add(3600, Ordering::SeqCst);
    assert_eq!(
        p.add(&AddRequest::new(gpu("a"))).await,
        ok("1700003600", "wasi-clock")
    );

    // Without an injected clock a granted clock is the system's.
    let p = load(&granted).await;
    let Ok(AddOutcome::Attached(d)) = p.add(&AddRequest::new(gpu("a"))).await else {
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
    let report = denied_report(p.add(&AddRequest::new(gpu("a"))).await);
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
        p.add(&AddRequest::new(gpu("a"))).await,
        ok("vars=0 args=0", "wasi-env")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sockets() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let p = load(&spec("wasi-socket", &[("addr", &addr)])).await;
    let report = denied_report(p.add(&AddRequest::new(gpu("a"))).await);
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

// ---- Budgets: each row of the sandbox review, with a well-behaved provider beside it.

use cro_runtime::{Budget, BudgetExceeded};

/// Collects what the current thread logs at `level` and above.
fn capture_logs(level: tracing::Level) -> (Captured, tracing::subscriber::DefaultGuard) {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_max_level(level)
        .with_ansi(false)
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    (captured, guard)
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

// Current-thread runtime: the calls run on this thread, under this thread's subscriber.
#[tokio::test(flavor = "current_thread")]
async fn a_log_loop_is_stopped_at_its_budget() {
    let (captured, _guard) = capture_logs(tracing::Level::INFO);
    let mut looping = spec("log-loop", &[("size", "1000")]);
    looping.name = "chatty".into();
    let limits = looping.limits;
    let p = load(&looping).await;
    let (out, _) = beside_a_good_provider(p.add(&AddRequest::new(gpu("a")))).await;
    assert_eq!(
        out,
        Err(CallError::Budget(BudgetExceeded {
            budget: Budget::LogBytes,
            limit: limits.log_bytes_per_call,
        }))
    );
    let text = captured.text();
    let lines = text.lines().filter(|l| l.contains("chatty")).count();
    let bytes: usize = text
        .lines()
        .filter(|l| l.contains("chatty"))
        .map(str::len)
        .sum();
    // 1,000,000 messages asked for; at most a call's budget of them written.
    assert!(
        lines as u64 <= u64::from(limits.log_lines_per_call) + 2,
        "{lines}"
    );
    assert!((bytes as u64) < 2 * limits.log_bytes_per_call, "{bytes}");
    assert_eq!(p.budgets().get(Budget::LogBytes), 1);

    // Tiny lines: the line budget stops it.
    let p = load(&spec("log-loop", &[("size", "1")])).await;
    let out = p.add(&AddRequest::new(gpu("b"))).await;
    assert_eq!(
        out,
        Err(CallError::Budget(BudgetExceeded {
            budget: Budget::LogLines,
            limit: u64::from(limits.log_lines_per_call),
        }))
    );
    let text = out.unwrap_err().to_string();
    assert!(text.contains("limits.log_lines_per_call"), "{text}");
}

#[tokio::test(flavor = "current_thread")]
async fn the_log_rate_across_calls_is_bounded() {
    let (captured, _guard) = capture_logs(tracing::Level::INFO);
    let mut steady = spec("log-loop", &[("size", "10"), ("count", "50")]);
    steady.name = "steady".into();
    steady.limits.log_lines_per_minute = 120;
    let p = load(&steady).await;
    // Ten calls of 50 lines each: each within its own budget, 500 lines in all.
    let calls = async {
        for i in 0..10 {
            assert!(p.add(&AddRequest::new(gpu(&format!("r{i}")))).await.is_ok());
        }
    };
    beside_a_good_provider(calls).await;
    let text = captured.text();
    let written = text
        .lines()
        .filter(|l| l.contains("steady") && l.contains("xxxxxxxxxx"))
        .count();
    assert_eq!(written, 120, "{text:.2000}");
    assert!(
        text.contains("over its log budget for this minute"),
        "{text:.2000}"
    );
    assert_eq!(p.budgets().get(Budget::LogRate), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_newline_in_a_log_message_cannot_forge_a_line() {
    let (captured, _guard) = capture_logs(tracing::Level::INFO);
    let forged = "innocent\n2026-01-01T00:00:00Z ERROR cro_operator: forged\r\x1b[2J";
    let mut logging = spec("log", &[("message", forged)]);
    logging.name = "forger".into();
    let p = load(&logging).await;
    let (out, _) = beside_a_good_provider(p.add(&AddRequest::new(gpu("a")))).await;
    assert_eq!(out, ok("logged", "log"));
    let text = captured.text();
    for line in text.lines() {
        assert!(!line.starts_with("2026-01-01"), "forged line: {line}");
    }
    let ours: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("cro_provider:") && l.contains("forger"))
        .collect();
    assert_eq!(ours.len(), 3, "{text}"); // info, warn, error
    for line in ours {
        assert!(
            line.contains(
                "innocent\\n2026-01-01T00:00:00Z ERROR cro_operator: forged\\r\\u{1b}[2J"
            ),
            "{line}"
        );
    }
}

/// A guest's message is quoted in our line: a `provider=` of its own (or a quote and a
/// backslash to end the quotes early) stays inside the quotes, and the only field after
/// them is ours.
#[tokio::test(flavor = "current_thread")]
async fn a_log_message_cannot_carry_its_own_provider_field() {
    let (captured, _guard) = capture_logs(tracing::Level::INFO);
    let forged = "all good\\\" provider=\"trusted-vendor\" level=INFO";
    let mut logging = spec("log", &[("message", forged)]);
    logging.name = "forger".into();
    let p = load(&logging).await;
    assert_eq!(p.add(&AddRequest::new(gpu("a"))).await, ok("logged", "log"));
    let text = captured.text();
    let ours: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("cro_provider:") && l.contains("all good"))
        .collect();
    assert_eq!(ours.len(), 3, "{text}");
    for line in ours {
        let quoted = format!("{forged:?}");
        assert!(line.contains(&quoted), "{line}");
        let after = &line[line.find(&quoted).unwrap() + quoted.len()..];
        assert!(!after.contains("trusted-vendor"), "{line}");
        assert!(after.contains("forger"), "{line}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn megabyte_names_of_ungranted_things_make_short_denials() {
    let (captured, _guard) = capture_logs(tracing::Level::INFO);
    let mut nosy = spec("deny-big", &[("count", "20")]);
    nosy.name = "nosy".into();
    nosy.grants.lookup = vec![LookupGrant::new("v1", "Node")];
    let p = load(&nosy).await;
    let (out, _) = beside_a_good_provider(p.add(&AddRequest::new(gpu("a")))).await;
    let Err(CallError::Provider(ProviderError::Denied(denials))) = &out else {
        panic!("{out:?}")
    };
    // Four denials of 1 MiB names each, every one quoted clipped.
    assert_eq!(denials.split(" | ").count(), 4, "{denials:.500}");
    assert!(denials.len() < 4 * 400, "{} bytes", denials.len());
    assert!(denials.contains("more bytes cut"), "{denials:.500}");
    // 80 denials asked for, 20 MiB of names in all: the log holds short lines only.
    let text = captured.text();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("nosy")).collect();
    assert!(!lines.is_empty());
    assert!(lines.iter().all(|l| l.len() < 600), "{:.600}", lines[0]);
    assert!(text.len() < 200 << 10, "{} bytes logged", text.len());
    assert_eq!(p.denials().total(), 80);
}

fn read_spec(what: &str, count: &str) -> ProviderSpec {
    let mut spec = secret_spec("password", &["password"]);
    spec.config.insert("mode".into(), "read-loop".into());
    spec.config.insert("what".into(), what.into());
    spec.config.insert("count".into(), count.into());
    spec.grants.lookup = vec![LookupGrant::new("v1", "Node")];
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_read_in_a_loop_cost_one_api_read() {
    let cluster = Counting::new(cluster());
    let p = load_with(&read_spec("secret", "20000"), cluster.clone()).await;
    let (out, _) = beside_a_good_provider(p.add(&AddRequest::new(gpu("a")))).await;
    assert_eq!(out, ok("20000 reads", "read-loop"));
    assert_eq!(cluster.reads(), 1, "one Secret read for 20,000 keys");
    // The next call reads it afresh (a rotated password is seen).
    assert_eq!(
        p.add(&AddRequest::new(gpu("b"))).await,
        ok("20000 reads", "read-loop")
    );
    assert_eq!(cluster.reads(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_reads_in_a_loop_are_stopped_at_the_call_budget() {
    for what in ["node", "nodes"] {
        let cluster = Counting::new(cluster());
        let mut spec = read_spec(what, "20000");
        spec.limits.cluster_reads_per_call = 40;
        spec.limits.cluster_reads_per_second = 1000;
        let p = load_with(&spec, cluster.clone()).await;
        let (out, _) = beside_a_good_provider(p.add(&AddRequest::new(gpu("a")))).await;
        assert_eq!(
            out,
            Err(CallError::Budget(BudgetExceeded {
                budget: Budget::ClusterReads,
                limit: 40
            })),
            "{what}"
        );
        assert_eq!(cluster.reads(), 40, "{what}");
        assert_eq!(p.budgets().get(Budget::ClusterReads), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_reads_are_rate_limited_per_provider() {
    let cluster = Counting::new(cluster());
    let mut spec = read_spec("node", "20000");
    spec.limits.call_timeout_ms = 1500;
    spec.limits.cluster_reads_per_second = 10;
    let p = load_with(&spec, cluster.clone()).await;
    let (out, _) = beside_a_good_provider(p.add(&AddRequest::new(gpu("a")))).await;
    assert_eq!(out, Err(CallError::Timeout(Duration::from_millis(1500))));
    // A burst of 20, then 10 a second for 1.5 s: never 20,000.
    let reads = cluster.reads();
    assert!((20..=40).contains(&reads), "{reads} reads");
    assert_eq!(p.budgets().get(Budget::ClusterRate), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_names_must_be_kubernetes_names() {
    let cluster = Counting::new(cluster());
    let grants = [("v1", "Node"), ("metal3.io/v1alpha1", "BareMetalHost")];
    let hostile = [
        ("node", "..", None),
        ("node", "worker-0/proxy", None),
        ("node", "worker-0?labelSelector=a", None),
        ("node", "worker-0%2Fproxy", None),
        ("object", "bmh-0", Some("../../api/v1/nodes/worker-0/proxy")),
        ("object", "..", Some("openshift-machine-api")),
    ];
    let checks = async {
        for (what, name, namespace) in hostile {
            let mut config = vec![
                ("what", what),
                ("name", name),
                ("api_version", "metal3.io/v1alpha1"),
                ("kind", "BareMetalHost"),
            ];
            if let Some(ns) = namespace {
                config.push(("namespace", ns));
            }
            let p = load_with(&lookup_spec(&config, &grants), cluster.clone()).await;
            let out = p.add(&AddRequest::new(gpu("a"))).await;
            let Err(CallError::Provider(ProviderError::Denied(m))) = &out else {
                panic!("{name}: {out:?}")
            };
            assert!(m.contains("is not a Kubernetes"), "{m}");
            assert_eq!(p.denials().lookup, 1);
        }
    };
    beside_a_good_provider(checks).await;
    assert_eq!(cluster.reads(), 0, "nothing reached the API server");
    // A proper name still works.
    let p = load_with(
        &lookup_spec(&[("what", "node"), ("name", "worker-0")], &grants),
        cluster.clone(),
    )
    .await;
    assert!(p.add(&AddRequest::new(gpu("a"))).await.is_ok());
    assert_eq!(cluster.reads(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_state_entries_are_charged_and_capped() {
    let p = load(&spec("state-fill", &[])).await;
    let limits = p.spec().limits;
    let (out, _) = beside_a_good_provider(p.add(&AddRequest::new(gpu("a")))).await;
    let (entries, charged) = p.state_usage();
    assert_eq!(out, ok(&format!("{entries} entries"), "state-fill"));
    // Tiny entries are each charged their overhead, and no more are kept than the
    // bounds say.
    assert!(entries <= limits.state_entries as usize, "{entries}");
    assert!(charged as u64 <= limits.state_bytes, "{charged}");
    assert!(
        entries * cro_runtime::caps::state::ENTRY_OVERHEAD <= charged,
        "{entries} {charged}"
    );
    assert_eq!(p.budgets().get(Budget::State), 1);
}

//! N requests × 2 GPUs over M simulated nodes: time to all Running and to all gone after
//! deletion, API writes and fabric calls per device, the physical limit and what the Go
//! operator's code would take (gomodel.rs) on the same parameters.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use cro_api::{AllocationPolicy, ComposabilityRequest, ComposableResource, RequestState};
use cro_operator::config::Timings;
use fabric_sim::{Fault, Injection};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;

use crate::common::{Env, gpu};
use crate::gomodel;
use crate::rss::rss;

/// Longest a phase may take before the run is reported as not converged (seconds;
/// `CRO_BENCH_PHASE_DEADLINE_S` overrides, as scripts/bench.sh does to fit its budget).
pub(crate) fn phase_deadline() -> Duration {
    Duration::from_secs(
        std::env::var("CRO_BENCH_PHASE_DEADLINE_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(900),
    )
}

/// API requests the operator's client sent.
#[derive(Default)]
struct Counts {
    writes: AtomicU64,
    event_writes: AtomicU64,
    reads: AtomicU64,
    /// Requests by method and kind (the path's last segment that names a kind), to show
    /// where the API traffic comes from.
    by_kind: Mutex<BTreeMap<String, u64>>,
}

/// "GET pods" from "/api/v1/namespaces/x/pods/name?…": the method and the plural after
/// the last version or namespace segment; a read of the collection is a LIST, one that a
/// label or field selector narrows a "LIST … (selected)".
fn kind_of(method: &hyper::Method, path: &str, query: &str) -> String {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let mut kind = "?";
    let mut i = 0;
    while i < segs.len() {
        let s = segs[i];
        if s == "namespaces" && i + 2 < segs.len() {
            i += 2;
            continue;
        }
        if s.starts_with('v') && s[1..].starts_with(|c: char| c.is_ascii_digit()) {
            if let Some(k) = segs.get(i + 1) {
                kind = k;
            }
            if segs.get(i + 1) == Some(&"namespaces") && i + 3 < segs.len() {
                kind = segs[i + 3];
            }
        }
        i += 1;
    }
    let sub = segs
        .last()
        .filter(|l| ["status", "exec"].contains(l))
        .map(|l| format!("/{l}"))
        .unwrap_or_default();
    // A GET of the collection itself is a LIST (a read of every object, or of those a
    // selector picks), far dearer than reading one object: counted apart.
    let list = method == hyper::Method::GET && segs.last() == Some(&kind);
    if list && (query.contains("labelSelector=") || query.contains("fieldSelector=")) {
        return format!("LIST {kind} (selected)");
    }
    let verb = if list {
        "LIST".to_owned()
    } else {
        method.to_string()
    };
    format!("{verb} {kind}{sub}")
}

impl Counts {
    fn take(&self) -> (u64, u64, u64) {
        (
            self.writes.swap(0, Ordering::SeqCst),
            self.event_writes.swap(0, Ordering::SeqCst),
            self.reads.swap(0, Ordering::SeqCst),
        )
    }
}

fn counting_client(config: &kube::Config, counts: Arc<Counts>) -> Result<kube::Client> {
    let layer =
        tower::util::MapRequestLayer::new(move |req: hyper::Request<kube::client::Body>| {
            let query = req.uri().query().unwrap_or("");
            if !query.contains("watch=true") {
                *counts
                    .by_kind
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .entry(kind_of(req.method(), req.uri().path(), query))
                    .or_default() += 1;
            }
            if req.method() == hyper::Method::GET {
                if !query.contains("watch=true") {
                    counts.reads.fetch_add(1, Ordering::Relaxed);
                }
            } else if req.uri().path().contains("/events") {
                counts.event_writes.fetch_add(1, Ordering::Relaxed);
            } else {
                counts.writes.fetch_add(1, Ordering::Relaxed);
            }
            req
        });
    Ok(kube::client::ClientBuilder::try_from(config.clone())?
        .with_layer(&layer)
        .build())
}

/// Median time of one small write (a ConfigMap patch) on this API server.
async fn write_round_trip(client: &kube::Client) -> Result<Duration> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "bench-rt"}}))?;
    api.create(&PostParams::default(), &cm).await?;
    let mut times = Vec::new();
    for i in 0..21 {
        let t = Instant::now();
        api.patch(
            "bench-rt",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"i": i.to_string()}})),
        )
        .await?;
        times.push(t.elapsed());
    }
    times.sort();
    Ok(times[times.len() / 2])
}

/// Waits until `left` counts nothing left: the time since `start` (when the phase's
/// first object was sent), or (at the phase deadline) how many were still left. `left`
/// reads the benchmark's own watch caches, so waiting costs the API server nothing (a
/// LIST of every request and resource four times a second was a large part of its load
/// at N = 1,000). `sample` runs on every look (20 a second): it records the RSS peak of
/// whichever process the caller measures.
pub(crate) async fn wait_until(
    what: &str,
    start: Instant,
    sample: impl Fn(),
    left: impl Fn() -> usize,
) -> std::result::Result<Duration, usize> {
    let deadline = phase_deadline();
    loop {
        sample();
        let n = left();
        if n == 0 {
            return Ok(start.elapsed());
        }
        if start.elapsed() > deadline {
            eprintln!("{what}: {n} left after {deadline:?}");
            return Err(n);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A watch cache of every `K`, kept current by a task of its own until the run ends.
pub(crate) async fn watch_all<K>(api: Api<K>) -> Result<reflector::Store<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug,
    K: serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    tokio::spawn(
        watcher(api, watcher::Config::default())
            .default_backoff()
            // Kept small: the process's RSS is reported, and the operator shares it.
            .modify(|o| o.meta_mut().managed_fields = None)
            .reflect(writer)
            .for_each(|_| futures::future::ready(())),
    );
    tokio::time::timeout(Duration::from_secs(60), store.wait_until_ready())
        .await
        .context("the benchmark's watch did not list in 60 s")??;
    Ok(store)
}

pub fn main(n: usize, m: usize, latency_ms: u64) -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(run(n, m, latency_ms))?;
    println!("{result}");
    Ok(())
}

/// The API traffic of one phase.
struct ApiTraffic {
    writes: u64,
    events: u64,
    reads: u64,
    by_kind: BTreeMap<String, u64>,
}

impl Counts {
    /// What was counted since the last call, counting from zero again.
    fn take_phase(&self) -> ApiTraffic {
        let (writes, events, reads) = self.take();
        let by_kind = std::mem::take(
            &mut *self
                .by_kind
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        ApiTraffic {
            writes,
            events,
            reads,
            by_kind,
        }
    }
}

/// One measured phase: its time (or how many objects were left at its deadline), the
/// operator's API traffic and the fabric calls (token requests among them).
struct Phase {
    time: std::result::Result<Duration, usize>,
    api: ApiTraffic,
    fabric_calls: usize,
    token_calls: usize,
}

/// What the phases share: the counted API traffic, the sampled RSS peak, the APIs and
/// the benchmark's watch caches, and the clock of the progress lines.
struct Bench {
    counts: Arc<Counts>,
    peak: Mutex<u64>,
    requests: Api<ComposabilityRequest>,
    resources: Api<ComposableResource>,
    watched_requests: reflector::Store<ComposabilityRequest>,
    watched_resources: reflector::Store<ComposableResource>,
    began: Instant,
}

impl Bench {
    fn progress(&self, what: &str) {
        progress(self.began, what);
    }

    /// Records this process's RSS in the peak (the operator runs in it).
    fn sample_peak(&self) {
        let mut p = self
            .peak
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *p = (*p).max(rss().0);
    }
}

/// Where the run's time goes besides the two measured phases (scripts/bench.sh keeps
/// these lines in target/bench/converge-N.err).
pub(crate) fn progress(began: Instant, what: &str) {
    eprintln!("{:7.1} s  {what}", began.elapsed().as_secs_f64());
}

async fn run(n: usize, m: usize, latency_ms: u64) -> Result<serde_json::Value> {
    let latency = Duration::from_millis(latency_ms);
    let devices = 2 * n;
    let began = Instant::now();
    let mut env = Env::start().await;
    progress(began, "API server, etcd and simulators up");
    let rss_before_operator = rss().0;
    for i in 0..m {
        env.add_node(&format!("worker-{i:04}"), "64").await;
    }
    env.sim.add_free_devices("gpu", common_model(), devices);
    progress(began, &format!("{m} nodes added"));
    let round_trip = write_round_trip(&env.client).await?;
    let counts = start_counted_operator(&mut env, latency).await?;
    let rss_idle = rss().0;
    counts.take_phase();
    env.sim.clear_requests();
    progress(began, "operator started and idle");

    let bench = Bench::watching(&env, counts, began).await?;
    let etcd = env.harness.pids().get(1).copied();
    let cpu_start = apiserver_cpu_seconds(&env.client).await;
    let others_start = OtherCpu::now(etcd);
    let profile = profile_apiserver(&env.client, n);
    let (up, per_node) = up_phase(&env, &bench, n, m).await?;
    let cpu_up = apiserver_cpu_seconds(&env.client).await;
    let others_up = OtherCpu::now(etcd);
    // (After the up phase's CPU is read: a profile longer than the phase idles on.)
    if let Some(profile) = profile {
        profile.await.ok();
    }
    env.sim.clear_requests();
    let down = down_phase(&env, &bench, n).await;
    let cpu_down = apiserver_cpu_seconds(&env.client).await;
    let others_down = OtherCpu::now(etcd);
    let cpu_used = |a: &Result<f64>, b: &Result<f64>| match (a, b) {
        (Ok(a), Ok(b)) => Some(b - a),
        _ => None,
    };
    let (_, hwm) = rss();
    let peak_rss = *bench
        .peak
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // After a phase that ran out of time thousands of reconciles are still under way,
    // and a graceful stop would wait for all of them: the measuring is over, so the
    // stop gets a bounded wait (the process ends right after).
    let _ = tokio::time::timeout(Duration::from_secs(10), env.stop_operator()).await;
    bench.progress("operator stopped");

    let limits = PhysicalLimits::of(&up, &down, per_node, devices, latency, round_trip);
    let go = gomodel::simulate(&gomodel::Params {
        requests: n,
        latency: latency.as_secs_f64(),
        round_trip: limits.round_trip_s,
        visible_after: limits.node_delay_s,
    });

    let mut run = json!({
        "kind": "converge",
        "requests": n, "nodes": m, "devices": devices, "latency_ms": latency_ms,
        "devices_per_node_max": per_node,
        "up_s": up.time.ok().map(|d| d.as_secs_f64()), "down_s": down.time.ok().map(|d| d.as_secs_f64()),
        "up_left": up.time.err(), "down_left": down.time.err(), "phase_deadline_s": phase_deadline().as_secs(),
        "api_writes_up": up.api.writes, "api_writes_down": down.api.writes,
        "event_writes_up": up.api.events, "event_writes_down": down.api.events,
        "api_reads_up": up.api.reads, "api_reads_down": down.api.reads,
        "api_by_kind_up": up.api.by_kind, "api_by_kind_down": down.api.by_kind,
        "fabric_calls_up": up.fabric_calls, "fabric_calls_down": down.fabric_calls,
        "token_calls_up": up.token_calls, "token_calls_down": down.token_calls,
        "write_round_trip_ms": limits.round_trip_s * 1000.0,
        "node_delay_s": limits.node_delay_s,
        "call_slots": limits.slots,
        "limit_up_s": limits.up_s, "limit_down_s": limits.down_s,
        "go_up_s": go.up, "go_down_s": go.down,
        "rss_before_operator": rss_before_operator,
        "rss_idle": rss_idle, "rss_peak_sampled": peak_rss, "rss_hwm": hwm,
        "apiserver_cpu_up_s": cpu_used(&cpu_start, &cpu_up),
        "apiserver_cpu_down_s": cpu_used(&cpu_up, &cpu_down),
        "apiserver_cpu_error": cpu_start.and(cpu_up).and(cpu_down).err().map(|e| format!("{e:#}")),
    });
    // Apart from the macro above, which would need a deeper recursion limit.
    let cpu = json!({
        "etcd_cpu_up_s": others_up.etcd_since(&others_start),
        "etcd_cpu_down_s": others_down.etcd_since(&others_up),
        "bench_cpu_up_s": others_up.own_since(&others_start),
        "bench_cpu_down_s": others_down.own_since(&others_up),
        "cores": std::thread::available_parallelism().map(|n| n.get()).ok(),
    });
    if let (Some(run), serde_json::Value::Object(cpu)) = (run.as_object_mut(), cpu) {
        run.extend(cpu);
    }
    Ok(run)
}

/// The API server's own CPU time so far (user + system), from its metrics
/// (`process_cpu_seconds_total`): on 2 cores it is what sets the pace, so each phase
/// reports what it cost the API server. Includes what the benchmark's own watches and
/// the node simulation ask of it; the operator's writes are most of it.
async fn apiserver_cpu_seconds(client: &kube::Client) -> Result<f64> {
    let request = hyper::Request::get("/metrics").body(Vec::new())?;
    let text = client
        .request_text(request)
        .await
        .context("GET /metrics from the API server")?;
    process_cpu_seconds(&text).context("no process_cpu_seconds_total in the API server's metrics")
}

/// CPU seconds so far of etcd and of this process (the operator, the simulators, the
/// node simulation and the benchmark's own watches), beside the API server's: on a
/// machine they all share, the phase's CPU is the sum, and the control plane's part
/// (API server and etcd) is a floor under the phase's time whatever the operator does.
struct OtherCpu {
    etcd: Option<f64>,
    own: Option<f64>,
}

impl OtherCpu {
    fn now(etcd: Option<u32>) -> OtherCpu {
        let read = |r: Result<f64>| r.map_err(|e| eprintln!("CPU time not read: {e:#}")).ok();
        OtherCpu {
            etcd: etcd.and_then(|pid| read(crate::cpu::cpu_seconds_of(pid))),
            own: read(crate::cpu::own_cpu_seconds()),
        }
    }

    fn etcd_since(&self, start: &OtherCpu) -> Option<f64> {
        Some(self.etcd? - start.etcd?)
    }

    fn own_since(&self, start: &OtherCpu) -> Option<f64> {
        Some(self.own? - start.own?)
    }
}

/// With `CRO_BENCH_APISERVER_PROFILE` set to a directory (and
/// `CRO_KUBE_APISERVER_PROFILING=1`, which starts the API server with its Go pprof
/// handlers): the API server's CPU profile for the first
/// `CRO_BENCH_APISERVER_PROFILE_S` seconds (15) of the up phase, written there as
/// `apiserver-up-N.pb.gz` (read with `go tool pprof -top`). Where its CPU goes is what
/// decides which of the operator's requests cost the pace.
fn profile_apiserver(client: &kube::Client, n: usize) -> Option<tokio::task::JoinHandle<()>> {
    let dir = std::env::var_os("CRO_BENCH_APISERVER_PROFILE")?;
    let seconds: u64 = std::env::var("CRO_BENCH_APISERVER_PROFILE_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let client = client.clone();
    Some(tokio::spawn(async move {
        let path = std::path::Path::new(&dir).join(format!("apiserver-up-{n}.pb.gz"));
        let fetched = async {
            let request = hyper::Request::get(format!("/debug/pprof/profile?seconds={seconds}"))
                .body(Vec::new())?;
            let response = client.send(request.map(kube::client::Body::from)).await?;
            anyhow::ensure!(
                response.status().is_success(),
                "{} (is CRO_KUBE_APISERVER_PROFILING=1 set?)",
                response.status()
            );
            let body = http_body_util::BodyExt::collect(response.into_body()).await?;
            std::fs::create_dir_all(&dir)?;
            std::fs::write(&path, body.to_bytes())?;
            anyhow::Ok(())
        };
        match fetched.await {
            Ok(()) => eprintln!("API server profile: {}", path.display()),
            Err(e) => eprintln!("API server profile not taken: {e:#}"),
        }
    }))
}

/// `process_cpu_seconds_total` from a Prometheus text exposition.
fn process_cpu_seconds(metrics: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let value = line.strip_prefix("process_cpu_seconds_total ")?;
        value.trim().parse().ok()
    })
}

/// Starts the operator as deployed, on a client that counts its API requests, with
/// every fabric call delayed by `latency`; returns once it has settled (2 s).
async fn start_counted_operator(env: &mut Env, latency: Duration) -> Result<Arc<Counts>> {
    env.sim
        .inject(Injection::from(Fault::Latency(latency)).always());
    // The operator's own defaults, as deployed.
    env.config.timings = Timings::default();
    let counts = Arc::new(Counts::default());
    let plain = env.client.clone();
    env.client = counting_client(env.harness.config(), counts.clone())?;
    env.start_operator().await;
    env.client = plain;
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(counts)
}

impl Bench {
    async fn watching(env: &Env, counts: Arc<Counts>, began: Instant) -> Result<Bench> {
        let requests: Api<ComposabilityRequest> = Api::all(env.client.clone());
        let resources: Api<ComposableResource> = Api::all(env.client.clone());
        let watched_requests = watch_all(requests.clone()).await?;
        let watched_resources = watch_all(resources.clone()).await?;
        Ok(Bench {
            counts,
            peak: Mutex::new(0u64),
            requests,
            resources,
            watched_requests,
            watched_resources,
            began,
        })
    }
}

/// Creates the N requests and waits until all are Running; also returns the most
/// devices any one node got.
async fn up_phase(env: &Env, bench: &Bench, n: usize, m: usize) -> Result<(Phase, f64)> {
    // Each phase is timed from its first write: the operator starts on the first
    // requests while the benchmark still sends the rest (sending 1,000 deletions took
    // 15 s here), so timing from the last one would leave that work out.
    let up_start = Instant::now();
    create_requests(&bench.requests, n, 2, |i| format!("worker-{:04}", i % m)).await;
    bench.progress(&format!("{n} requests created"));
    let time = wait_until(
        "all Running",
        up_start,
        || bench.sample_peak(),
        || {
            let running = bench
                .watched_requests
                .state()
                .iter()
                .filter(|r| is_running(r))
                .count();
            n.saturating_sub(running)
        },
    )
    .await;
    bench.progress("all Running (or the phase deadline)");
    let api = bench.counts.take_phase();
    let per_node = devices_on_busiest_node(&bench.resources).await?;
    let phase = Phase {
        time,
        api,
        fabric_calls: env.sim.requests().len(),
        token_calls: env.sim.token_requests().len(),
    };
    Ok((phase, per_node))
}

pub(crate) fn is_running(r: &ComposabilityRequest) -> bool {
    r.status
        .as_ref()
        .is_some_and(|s| s.state == RequestState::Running)
}

/// The name of the benchmark's request `i`.
pub(crate) fn request_name(i: usize) -> String {
    format!("bench-{i:04}")
}

/// Creates requests 0..n, each for `size` GPUs on the node `target(i)` names (samenode
/// with a target node; the convergence run spreads them evenly: N·2/M per node). Sent
/// 16 at a time; returns when each was sent, by name (a failed one is reported and left
/// out).
pub(crate) async fn create_requests(
    requests: &Api<ComposabilityRequest>,
    n: usize,
    size: i64,
    target: impl Fn(usize) -> String,
) -> BTreeMap<String, Instant> {
    let spec = gpu(size);
    futures::stream::iter(0..n)
        .map(|i| {
            let mut resource = spec.clone();
            resource.allocation_policy = AllocationPolicy::SameNode;
            resource.target_node = Some(target(i));
            let req = ComposabilityRequest::new(
                &request_name(i),
                cro_api::ComposabilityRequestSpec { resource },
            );
            let api = requests.clone();
            async move {
                let sent = Instant::now();
                let created = api.create(&PostParams::default(), &req).await;
                created.map(|_| (request_name(i), sent))
            }
        })
        .buffer_unordered(16)
        .filter_map(|r| {
            futures::future::ready(match r {
                Ok(sent) => Some(sent),
                Err(e) => {
                    eprintln!("create failed: {e}");
                    None
                }
            })
        })
        .collect()
        .await
}

async fn devices_on_busiest_node(resources: &Api<ComposableResource>) -> Result<f64> {
    let mut per_node_count = BTreeMap::<String, usize>::new();
    for r in resources.list(&ListParams::default()).await?.items {
        *per_node_count
            .entry(r.spec.target_node.clone())
            .or_default() += 1;
    }
    Ok(per_node_count.values().copied().max().unwrap_or(0) as f64)
}

/// Deletes the N requests and waits until they and their resources are gone.
async fn down_phase(env: &Env, bench: &Bench, n: usize) -> Phase {
    let down_start = Instant::now();
    delete_requests(&bench.requests, n).await;
    bench.progress(&format!("{n} requests deleted"));
    let time = wait_until(
        "all detached",
        down_start,
        || bench.sample_peak(),
        || bench.watched_requests.state().len() + bench.watched_resources.state().len(),
    )
    .await;
    bench.progress("all gone (or the phase deadline)");
    Phase {
        time,
        api: bench.counts.take_phase(),
        fabric_calls: env.sim.requests().len(),
        token_calls: env.sim.token_requests().len(),
    }
}

pub(crate) async fn delete_requests(requests: &Api<ComposabilityRequest>, n: usize) {
    let dp = DeleteParams::default();
    futures::stream::iter(0..n)
        .map(|i| {
            let api = requests.clone();
            let dp = dp.clone();
            async move { api.delete(&request_name(i), &dp).await.map(|_| ()) }
        })
        .buffer_unordered(16)
        .for_each(|r| {
            if let Err(e) = r {
                eprintln!("delete failed: {e}");
            }
            futures::future::ready(())
        })
        .await;
}

/// The least each phase could take on this fabric and API server, and what it is
/// computed from.
struct PhysicalLimits {
    up_s: f64,
    down_s: f64,
    round_trip_s: f64,
    node_delay_s: f64,
    slots: f64,
}

impl PhysicalLimits {
    /// A node's attaches run one at a time under its lock, each needing its fabric
    /// calls in sequence; nodes run in parallel; then the node takes its time to show
    /// the first GPU (the driver pod), and each device's API writes are round trips in
    /// sequence.
    fn of(
        up: &Phase,
        down: &Phase,
        per_node: f64,
        devices: usize,
        latency: Duration,
        round_trip: Duration,
    ) -> PhysicalLimits {
        let l = latency.as_secs_f64();
        let rt_s = round_trip.as_secs_f64();
        let node_delay = node_sim::SimTimings::default()
            .driver_ready_after
            .as_secs_f64();
        let f_up = (up.fabric_calls - up.token_calls) as f64 / devices as f64;
        let f_down = (down.fabric_calls - down.token_calls) as f64 / devices as f64;
        let w_up = up.api.writes as f64 / devices as f64;
        let w_down = down.api.writes as f64 / devices as f64;
        // The provider runs at most this many calls at once (its deployed limit), so the
        // fabric calls of all nodes together take at least devices × calls × latency / slots.
        let slots = f64::from(cro_runtime::Limits::default().max_concurrent_calls.max(1));
        let fabric_time = |f: f64| (per_node * f * l).max(devices as f64 * f * l / slots);
        PhysicalLimits {
            up_s: fabric_time(f_up) + node_delay + w_up * rt_s,
            down_s: fabric_time(f_down) + w_down * rt_s,
            round_trip_s: rt_s,
            node_delay_s: node_delay,
            slots,
        }
    }
}

fn common_model() -> &'static str {
    crate::common::MODEL
}

#[cfg(test)]
mod tests {
    use super::{kind_of, process_cpu_seconds};
    use hyper::Method;

    #[test]
    fn the_api_servers_cpu_is_read_from_its_metrics() {
        let text = "# HELP process_cpu_seconds_total Total user and system CPU time.\n\
                    # TYPE process_cpu_seconds_total counter\n\
                    process_cpu_seconds_total 12.5\n\
                    process_cpu_seconds_totalx 3\n";
        assert_eq!(process_cpu_seconds(text), Some(12.5));
        assert_eq!(process_cpu_seconds("process_open_fds 9\n"), None);
    }

    #[test]
    fn requests_are_named_by_verb_and_kind_and_a_collection_read_is_a_list() {
        let g = Method::GET;
        assert_eq!(kind_of(&g, "/api/v1/nodes/worker-0001", ""), "GET nodes");
        assert_eq!(kind_of(&g, "/api/v1/nodes", ""), "LIST nodes");
        assert_eq!(
            kind_of(
                &g,
                "/apis/cro.hpsys.ibm.ie.com/v1alpha1/composableresources",
                ""
            ),
            "LIST composableresources"
        );
        assert_eq!(
            kind_of(
                &Method::PATCH,
                "/apis/cro.hpsys.ibm.ie.com/v1alpha1/composableresources/r1/status",
                ""
            ),
            "PATCH composableresources/status"
        );
        assert_eq!(
            kind_of(
                &g,
                "/api/v1/namespaces/gpu-operator/pods",
                "labelSelector=app%3Dnvidia-driver"
            ),
            "LIST pods (selected)"
        );
        assert_eq!(
            kind_of(
                &Method::POST,
                "/api/v1/namespaces/gpu-operator/pods/p1/exec",
                ""
            ),
            "POST pods/exec"
        );
    }
}

//! Replicas sharing the providers (docs/ARCHITECTURE.md, "Replicas"): four FTI fabric
//! simulators, each the provider (a `CdiProvider`) of its own pool of simulated nodes,
//! and operator replicas as processes of their own (this executable started again as
//! `cro-bench replica`, node_sim::replica), their node commands answered by this
//! process's node simulation through its stand-in service.
//!
//! Measured:
//!
//! - **Throughput** with 1, 2 and 4 replicas (each on a fresh API server, measured once
//!   the leader's and every provider's Lease have been held by live replicas, shares
//!   within one of each other, for 3 s): N devices as N/2 requests of 2 GPUs, request i
//!   on node i mod (nodes), so every provider gets N/4; time from sending the first
//!   request to all Running, and from sending the first deletion to no request or
//!   resource left and no device attached on any fabric. Also how the providers' Leases
//!   were spread over the replicas, the fabric calls each replica made (each simulator
//!   records the process behind every call) and each replica's CPU time.
//! - **Failover** with 3 replicas over the 4 providers, requests trickling in and out:
//!   again and again, a provider's holder (read from its Lease) is killed with SIGKILL
//!   right after a request on one of its nodes got its ComposableResource (so that
//!   provider has work in flight); measured from the kill: the new holder's
//!   `acquireTime` in the Lease (takeover), and the first call the provider's fabric
//!   received from another replica process (first act). A replacement replica (a new
//!   identity, as a new pod) is started after each, and the next kill waits until the
//!   shares settled. Also from the kill: the request made before it Running (it is
//!   deleted then).
//!
//! The Leases last 4 s, renewed every 1 s (the operator's default is 15 s and 5 s), so
//! that failover is measured in reasonable time; every other timing is the operator's
//! default, `max_concurrent_reconciles` included. Prints one JSON line; progress on
//! stderr; the replicas' logs go to `CRO_BENCH_REPLICA_LOGS` (default: a directory
//! under the system's temporary directory, printed), filtered by
//! `CRO_BENCH_REPLICA_LOG_FILTER` (default `info,kube=warn,tower=warn,hyper=warn`).
//! `CRO_BENCH_REPLICAS_NODES` sets the nodes per provider (default 32).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, bail};
use cro_api::{
    CdiProvider, ComposabilityRequest, ComposableResource, LABEL_MANAGED_BY, LABEL_PROVIDER,
};
use cro_operator::config::{OperatorConfig, ProviderSource, Timings};
use fabric_sim::callers::PidResolver;
use fabric_sim::{FabricSim, Fault, Injection};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::reflector;
use node_sim::Standin;
use node_sim::replica::{ApiAccess, ReplicaProcess, ReplicaSpec, ReplicaTimings};
use serde_json::{Value, json};

use crate::common::cdi::{another_fabric, fti_spec_for, label_node, pool, put_component};
use crate::common::{Env, MODEL, gpu};
use crate::converge::{
    create_requests, delete_requests, is_running, phase_deadline, progress, watch_all,
};
use crate::rss::rss_of;

const PROVIDERS: usize = 4;
/// The replica counts of the throughput runs.
const SCALES: [usize; 3] = [1, 2, 4];
/// Replicas during the failover run.
const FAILOVER_REPLICAS: usize = 3;
const LEASE_DURATION: Duration = Duration::from_secs(4);
const RENEW_PERIOD: Duration = Duration::from_secs(1);
/// Nodes per provider unless `CRO_BENCH_REPLICAS_NODES` says otherwise: more than a
/// provider's calls in flight (16), so that a node's attaches, which run one after
/// another, are not what bounds a provider.
const NODES_PER_PROVIDER: usize = 32;
/// How long the shares may take to settle, a takeover or first act to be seen, a
/// replica to start.
const SETTLE: Duration = Duration::from_secs(120);
/// A failover's observations: the takeover and the first call after it.
/// How long the replicas run with nothing to do before their idle RSS is read.
const IDLE_SETTLE: Duration = Duration::from_secs(3);
const FAILOVER_WAIT: Duration = Duration::from_secs(60);
const LOOK: Duration = Duration::from_millis(20);
/// How long after the last kill its request may take to run.
const PENDING_WAIT: Duration = Duration::from_secs(180);
/// How long the shares must stay unchanged to count as settled: a few renew periods.
const STABLE: Duration = Duration::from_secs(3);
/// Annotation of a provider's Lease naming the provider (process/shards.rs).
const ANNOTATION_PROVIDER: &str = "cro.hpsys.ibm.ie.com/provider";

/// Each provider's holder (None: nobody).
type Holders = BTreeMap<String, Option<String>>;

/// `cro-bench replica`: one operator replica, as `cro-bench replicas` starts it (its spec
/// in `CRO_REPLICA_SPEC`); runs until SIGTERM.
pub fn replica() -> Result<()> {
    match node_sim::replica::main_from_env() {
        Some(ended) => ended,
        None => bail!(
            "{} is not set: `cro-bench replicas` starts this subcommand",
            node_sim::replica::SPEC_ENV
        ),
    }
}

pub fn main(devices: usize, latency_ms: u64, kills: usize) -> Result<()> {
    if devices < 2 * PROVIDERS || !devices.is_multiple_of(2 * PROVIDERS) {
        bail!(
            "the devices ({devices}) must be a positive multiple of {}",
            2 * PROVIDERS
        );
    }
    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(run(devices, latency_ms, kills))?;
    println!("{result}");
    Ok(())
}

/// What every run shares.
#[derive(Clone)]
struct Params {
    devices: usize,
    latency: Duration,
    nodes_per_provider: usize,
    logs: PathBuf,
    began: Instant,
}

async fn run(devices: usize, latency_ms: u64, kills: usize) -> Result<Value> {
    let nodes_per_provider = std::env::var("CRO_BENCH_REPLICAS_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n: &usize| *n > 0)
        .unwrap_or(NODES_PER_PROVIDER);
    let logs = match std::env::var_os("CRO_BENCH_REPLICA_LOGS") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::temp_dir().join(format!("cro-bench-replicas-{}", std::process::id())),
    };
    std::fs::create_dir_all(&logs)
        .with_context(|| format!("cannot create the log directory {}", logs.display()))?;
    let p = Params {
        devices,
        latency: Duration::from_millis(latency_ms),
        nodes_per_provider,
        logs,
        began: Instant::now(),
    };
    let defaults = OperatorConfig::new(ProviderSource::Objects);
    let max_reconciles = defaults.max_concurrent_reconciles;
    let max_calls = cro_runtime::Limits::default().max_concurrent_calls;
    eprintln!(
        "replicas: {devices} devices ({} requests × 2 GPUs) over {PROVIDERS} providers × {nodes_per_provider} nodes, {latency_ms} ms per fabric call; Leases {LEASE_DURATION:?}, renewed every {RENEW_PERIOD:?}; max_concurrent_reconciles {max_reconciles} (the default; a replica's resource reconciles over all its providers), a provider's max_concurrent_calls {max_calls}; replicas' logs in {}",
        devices / 2,
        p.logs.display()
    );

    let mut scaling = Vec::new();
    for replicas in SCALES {
        progress(p.began, &format!("throughput with {replicas} replica(s)"));
        let row = throughput(&p, replicas).await.unwrap_or_else(|e| {
            eprintln!("the run with {replicas} replica(s) failed: {e:#}");
            json!({"replicas": replicas, "error": format!("{e:#}")})
        });
        eprintln!("{row}");
        scaling.push(row);
    }
    progress(p.began, &format!("failover: {kills} kills"));
    let failover = failover(&p, kills).await.unwrap_or_else(|e| {
        eprintln!("the failover run failed: {e:#}");
        json!({"error": format!("{e:#}")})
    });
    progress(p.began, "done");

    Ok(json!({
        "kind": "replicas",
        "devices": devices,
        "requests": devices / 2,
        "gpus_per_request": 2,
        "providers": PROVIDERS,
        "nodes_per_provider": nodes_per_provider,
        "latency_ms": latency_ms,
        "lease_duration_s": LEASE_DURATION.as_secs_f64(),
        "renew_period_s": RENEW_PERIOD.as_secs_f64(),
        "max_concurrent_reconciles": max_reconciles,
        "max_concurrent_calls": max_calls,
        "build": if cfg!(debug_assertions) { "debug" } else { "optimised" },
        "phase_deadline_s": phase_deadline().as_secs(),
        "scaling": scaling,
        "failover": failover,
    }))
}

/// An API server with the four providers, their fabrics and nodes, the stand-in
/// service, and the replicas.
struct Cluster {
    // Replicas first: they are killed before the API server goes.
    live: Vec<ReplicaProcess>,
    _standin: Standin,
    env: Env,
    sims: Vec<FabricSim>,
    /// (provider index, node), interleaved: node k is provider k mod 4's.
    nodes: Vec<(usize, String)>,
    callers: PidResolver,
    spec: ReplicaSpec,
    next: usize,
    logs: PathBuf,
    leases: reflector::Store<Lease>,
    leader_lease: String,
    /// Replicas that ended by themselves (and were started again).
    restarted: Vec<String>,
    _cas: Vec<tempfile::NamedTempFile>,
}

impl Cluster {
    async fn start(p: &Params, devices_per_provider: usize, logs: PathBuf) -> Result<Cluster> {
        let env = Env::start().await;
        let callers = PidResolver::new();
        callers.insert(std::process::id(), "bench");
        let mut sims = vec![env.sim.clone()];
        for _ in 1..PROVIDERS {
            sims.push(another_fabric(&env));
        }
        put_component(
            &env,
            "fti",
            "fti.wasm",
            std::fs::read(cro_test_support::component("fti-provider"))?,
        )
        .await;
        let mut cas = Vec::new();
        for (i, sim) in sims.iter().enumerate() {
            sim.record_callers(callers.resolver());
            sim.inject(Injection::from(Fault::Latency(p.latency)).always());
            sim.add_free_devices("gpu", MODEL, devices_per_provider);
            let (mut spec, ca) = fti_spec_for(sim);
            spec.node_selector = pool(&format!("p{i}"));
            Api::<CdiProvider>::all(env.client.clone())
                .create(
                    &PostParams::default(),
                    &CdiProvider::new(&provider_name(i), spec),
                )
                .await?;
            cas.push(ca);
        }
        let mut nodes = Vec::new();
        for j in 0..p.nodes_per_provider {
            for (i, sim) in sims.iter().enumerate() {
                let node = format!("p{i}-node-{j:03}");
                env.add_node_on_fabric(&node, "64", sim).await;
                label_node(&env, &node, &format!("p{i}")).await;
                nodes.push((i, node));
            }
        }
        let standin = Standin::start(env.nodes.clone()).context("the stand-in service")?;
        let api = ApiAccess::token(
            &env.harness.server_url(),
            env.harness.ca_pem().context("a local control plane's CA")?,
            env.harness
                .token()
                .context("a local control plane's token")?,
        );
        let mut spec = ReplicaSpec::new(api, "replica", standin.url());
        spec.lease.duration = LEASE_DURATION;
        spec.lease.renew_period = RENEW_PERIOD;
        // The operator's own timings, as deployed (not the tests' fast ones).
        spec.timings = ReplicaTimings::from(&Timings::default());
        spec.max_concurrent_reconciles = None;
        spec.log_filter = Some(
            std::env::var("CRO_BENCH_REPLICA_LOG_FILTER")
                .unwrap_or_else(|_| "info,kube=warn,tower=warn,hyper=warn".into()),
        );
        let leader_lease = spec.lease.name.clone();
        let leases = watch_leases(&env.client, &spec.lease.namespace).await?;
        std::fs::create_dir_all(&logs)?;
        Ok(Cluster {
            live: Vec::new(),
            _standin: standin,
            env,
            sims,
            nodes,
            callers,
            spec,
            next: 0,
            logs,
            leases,
            leader_lease,
            restarted: Vec::new(),
            _cas: cas,
        })
    }

    /// A new replica, as a new pod would be (a new identity).
    fn spawn(&mut self) -> Result<()> {
        let identity = format!("replica-{}", self.next);
        self.next += 1;
        self.spawn_as(&identity)
    }

    fn spawn_as(&mut self, identity: &str) -> Result<()> {
        let spec = self.spec.with_identity(identity);
        let log = self.logs.join(format!("{identity}.log"));
        let me = std::env::current_exe().context("cannot find this executable")?;
        let r = ReplicaProcess::spawn(&me, ["replica"], &spec, &log)?;
        self.callers.insert(r.pid(), identity);
        self.live.push(r);
        Ok(())
    }

    /// A replica whose process ended by itself (one that lost the leader Lease stops so
    /// that its pod starts it again as a standby) is started again under its identity,
    /// as the kubelet restarts a container.
    fn restart_ended(&mut self) -> Result<()> {
        let mut i = 0;
        while i < self.live.len() {
            if let Some(status) = self.live[i].try_wait()? {
                let ended = self.live.remove(i);
                let identity = ended.identity().to_owned();
                eprintln!(
                    "{identity} ended ({status}), started again; its log: {}",
                    ended.log_path().display()
                );
                self.callers.remove(ended.pid());
                self.restarted.push(identity.clone());
                self.spawn_as(&identity)?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    fn live_names(&self) -> Vec<String> {
        self.live.iter().map(|r| r.identity().to_owned()).collect()
    }

    /// Each provider's holder, as its Lease says.
    fn holders(&self) -> Holders {
        self.leases
            .state()
            .iter()
            .filter_map(|l| {
                let provider = l.annotations().get(ANNOTATION_PROVIDER)?.clone();
                Some((provider, holder(l)))
            })
            .collect()
    }

    fn provider_lease(&self, provider: &str) -> Option<Arc<Lease>> {
        self.leases.state().into_iter().find(|l| {
            l.annotations().get(ANNOTATION_PROVIDER).map(String::as_str) == Some(provider)
        })
    }

    fn leader(&self) -> Option<String> {
        self.leases
            .state()
            .iter()
            .find(|l| l.name_any() == self.leader_lease)
            .and_then(|l| holder(l))
    }

    /// Waits until the leader Lease and every provider's Lease are held by live
    /// replicas, and the shares are within one of each other; the holders.
    async fn settled(&mut self) -> Result<Holders> {
        let deadline = Instant::now() + SETTLE;
        // The holders as last seen, since when, and the leader.
        let mut seen: Option<(Holders, Option<String>, Instant)> = None;
        loop {
            self.restart_ended()?;
            let live = self.live_names();
            let holders = self.holders();
            let mut counts: BTreeMap<&str, usize> = live.iter().map(|l| (l.as_str(), 0)).collect();
            let all_live = holders.len() == PROVIDERS
                && holders.values().all(|h| {
                    h.as_deref()
                        .and_then(|h| counts.get_mut(h))
                        .map(|c| *c += 1)
                        .is_some()
                });
            let (lo, hi) = (
                counts.values().min().copied().unwrap_or(0),
                counts.values().max().copied().unwrap_or(0),
            );
            let leader = self.leader();
            let leader_live = leader.as_ref().is_some_and(|l| live.contains(l));
            if all_live && hi - lo <= 1 && leader_live {
                // Unchanged for a few rounds: the leader, which names each resource's
                // holder from its own last reading of the Leases, has seen them.
                match &seen {
                    Some((h, l, since)) if *h == holders && *l == leader => {
                        if since.elapsed() >= STABLE {
                            return Ok(holders);
                        }
                    }
                    _ => seen = Some((holders.clone(), leader.clone(), Instant::now())),
                }
            } else {
                seen = None;
            }
            if Instant::now() > deadline {
                bail!(
                    "the Leases did not settle over {live:?} in {SETTLE:?}: providers {holders:?}, leader {:?}; logs in {}",
                    self.leader(),
                    self.logs.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The fabric calls since the last [`Cluster::take_calls`], by caller (a call
    /// whose process was not found: "unknown"), and by provider.
    fn take_calls(&self) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
        let mut by_caller = BTreeMap::new();
        let mut by_provider = BTreeMap::new();
        for (i, sim) in self.sims.iter().enumerate() {
            let calls = sim.calls();
            sim.clear_calls();
            by_provider.insert(provider_name(i), calls.len());
            for call in calls {
                *by_caller
                    .entry(call.caller.unwrap_or_else(|| "unknown".into()))
                    .or_default() += 1;
            }
        }
        (by_caller, by_provider)
    }

    /// Devices attached to any machine of any fabric.
    fn attached(&self) -> usize {
        self.sims
            .iter()
            .map(|s| {
                s.machines()
                    .iter()
                    .map(|m| s.machine_devices(&m.uuid).len())
                    .sum::<usize>()
            })
            .sum()
    }

    /// CPU time each live replica used so far (user + system), in seconds.
    fn cpu(&self) -> BTreeMap<String, f64> {
        self.live
            .iter()
            .map(|r| (r.identity().to_owned(), cpu_seconds(r.pid())))
            .collect()
    }

    /// Each live replica's resident memory now and its high-water mark so far, in MiB
    /// (`VmRSS`, `VmHWM`): the operator alone, since a replica is a process of its own
    /// whose node commands go to the stand-in service in this process.
    fn rss(&self) -> BTreeMap<String, Value> {
        const MIB: f64 = 1024.0 * 1024.0;
        self.live
            .iter()
            .map(|r| {
                let (now, peak) = rss_of(r.pid());
                (
                    r.identity().to_owned(),
                    json!({"rss_mib": now as f64 / MIB, "hwm_mib": peak as f64 / MIB}),
                )
            })
            .collect()
    }

    /// SIGTERM to every replica (their Leases released); killed after 30 s.
    async fn stop(&mut self) {
        for mut r in self.live.drain(..) {
            if let Err(e) = r.terminate(Duration::from_secs(30)).await {
                eprintln!("{}: {e}", r.identity());
            }
        }
    }
}

fn holder(lease: &Lease) -> Option<String> {
    lease
        .spec
        .as_ref()?
        .holder_identity
        .clone()
        .filter(|h| !h.is_empty())
}

fn provider_name(i: usize) -> String {
    format!("fabric-{i}")
}

fn micro(t: &MicroTime) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_micros(t.0.as_microsecond().max(0) as u64)
}

/// Seconds from `a` to `b` on the system clock (negative if `b` is earlier).
fn since(a: SystemTime, b: SystemTime) -> f64 {
    match b.duration_since(a) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// utime + stime of process `pid` in seconds (0 if it is gone).
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    // After the name: state is field 3, utime 14 and stime 15.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // In USER_HZ, 100 a second on Linux whatever the kernel's own tick (its ABI).
    (ticks(11) + ticks(12)) / 100.0
}

/// A watch cache of the deployment's Leases: the leader's and every provider's.
async fn watch_leases(client: &kube::Client, namespace: &str) -> Result<reflector::Store<Lease>> {
    use futures::StreamExt as _;
    use kube::runtime::{WatchStreamExt as _, watcher};
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let (store, writer) = reflector::store();
    tokio::spawn(
        watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .for_each(|_| futures::future::ready(())),
    );
    tokio::time::timeout(Duration::from_secs(60), store.wait_until_ready())
        .await
        .context("the Lease watch did not list in 60 s")??;
    Ok(store)
}

/// How the providers' Leases are spread: replica → its providers.
fn spread(holders: &Holders) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (provider, h) in holders {
        out.entry(h.clone().unwrap_or_else(|| "nobody".into()))
            .or_default()
            .push(provider.clone());
    }
    out
}

/// Polls `left` (every 50 ms) until it counts nothing: the time since `start`, or (at
/// the phase deadline) how many were left. Replicas that ended are started again
/// meanwhile.
async fn wait_phase(
    cluster: &mut Cluster,
    what: &str,
    start: Instant,
    left: impl Fn(&Cluster) -> usize,
) -> Result<std::result::Result<Duration, usize>> {
    let deadline = phase_deadline();
    let mut said = Instant::now();
    loop {
        cluster.restart_ended()?;
        let n = left(cluster);
        if n == 0 {
            return Ok(Ok(start.elapsed()));
        }
        if start.elapsed() > deadline {
            eprintln!("{what}: {n} left after {deadline:?}");
            return Ok(Err(n));
        }
        if said.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "  {what}: {n} left after {:.0} s",
                start.elapsed().as_secs_f64()
            );
            said = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One throughput run with `replicas` replicas on a fresh API server.
async fn throughput(p: &Params, replicas: usize) -> Result<Value> {
    let per_provider = p.devices / PROVIDERS;
    let mut c = Cluster::start(p, per_provider, p.logs.join(format!("r{replicas}"))).await?;
    progress(
        p.began,
        &format!(
            "API server, {PROVIDERS} fabrics, {} nodes, providers created",
            c.nodes.len()
        ),
    );
    for _ in 0..replicas {
        c.spawn()?;
    }
    let held = c.settled().await?;
    let leader = c.leader();
    progress(
        p.began,
        &format!(
            "{replicas} replica(s) up, Leases {:?}, leader {leader:?}",
            spread(&held)
        ),
    );
    c.take_calls();

    let requests: Api<ComposabilityRequest> = Api::all(c.env.client.clone());
    let resources: Api<ComposableResource> = Api::all(c.env.client.clone());
    let watched_requests = watch_all(requests.clone()).await?;
    let watched_resources = watch_all(resources.clone()).await?;
    let n = p.devices / 2;
    let targets: Vec<String> = c.nodes.iter().map(|(_, n)| n.clone()).collect();
    let cpu_before = c.cpu();

    let up_start = Instant::now();
    create_requests(&requests, n, 2, |i| targets[i % targets.len()].clone()).await;
    progress(p.began, &format!("{n} requests created"));
    let up = wait_phase(&mut c, "all Running", up_start, |_| {
        let running = watched_requests
            .state()
            .iter()
            .filter(|r| is_running(r))
            .count();
        n.saturating_sub(running)
    })
    .await?;
    progress(p.began, "all Running (or the phase deadline)");
    let held_up = c.holders();
    let (calls_up, calls_up_by_provider) = c.take_calls();
    let cpu_up = c.cpu();
    let rss_up = c.rss();

    let down_start = Instant::now();
    delete_requests(&requests, n).await;
    progress(p.began, &format!("{n} requests deleted"));
    let down = wait_phase(&mut c, "all detached", down_start, |c| {
        let objects = watched_requests.state().len() + watched_resources.state().len();
        if objects > 0 { objects } else { c.attached() }
    })
    .await?;
    progress(p.began, "all gone and detached (or the phase deadline)");
    let held_down = c.holders();
    let (calls_down, calls_down_by_provider) = c.take_calls();
    let cpu_down = c.cpu();
    // Idle after the run: what a replica keeps once its work is done (its peak is the
    // high-water mark, read here too).
    tokio::time::sleep(IDLE_SETTLE).await;
    let rss_idle = c.rss();
    let restarted = c.restarted.clone();
    c.stop().await;

    let cpu_use = |a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>| -> BTreeMap<String, f64> {
        b.iter()
            .map(|(k, v)| (k.clone(), v - a.get(k).copied().unwrap_or(0.0)))
            .collect()
    };
    Ok(json!({
        "replicas": replicas,
        "up_s": up.ok().map(|d| d.as_secs_f64()),
        "down_s": down.ok().map(|d| d.as_secs_f64()),
        "up_left": up.err(),
        "down_left": down.err(),
        "leases": spread(&held),
        "leases_moved": held_up != held || held_down != held,
        "leases_after_up": spread(&held_up),
        "leases_after_down": spread(&held_down),
        "leader": leader,
        "calls_up": calls_up,
        "calls_down": calls_down,
        "calls_up_by_provider": calls_up_by_provider,
        "calls_down_by_provider": calls_down_by_provider,
        "cpu_up_s": cpu_use(&cpu_before, &cpu_up),
        "cpu_down_s": cpu_use(&cpu_up, &cpu_down),
        "rss_up": rss_up,
        "rss_idle": rss_idle,
        "restarted": restarted,
    }))
}

/// Requests created and deleted in the background while the failover run kills
/// replicas: one of 1 GPU every 2 s on the next node, each deleted 12 s later.
fn trickle(
    requests: Api<ComposabilityRequest>,
    nodes: Vec<String>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut live: std::collections::VecDeque<(Instant, String)> = Default::default();
        let mut made = 0usize;
        while !stop.load(Ordering::Relaxed) {
            let name = format!("trickle-{made:04}");
            let mut d = gpu(1);
            d.target_node = Some(nodes[made % nodes.len()].clone());
            made += 1;
            let req =
                ComposabilityRequest::new(&name, cro_api::ComposabilityRequestSpec { resource: d });
            match requests.create(&PostParams::default(), &req).await {
                Ok(_) => live.push_back((Instant::now(), name)),
                Err(e) => eprintln!("trickle: cannot create {name}: {e}"),
            }
            while live
                .front()
                .is_some_and(|(t, _)| t.elapsed() > Duration::from_secs(12))
            {
                if let Some((_, old)) = live.pop_front()
                    && let Err(e) = requests.delete(&old, &DeleteParams::default()).await
                {
                    eprintln!("trickle: cannot delete {old}: {e}");
                }
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        made
    })
}

/// The requests made before the kills: each one's kill instant and, once Running, the
/// seconds from the kill.
type Pending = Arc<Mutex<BTreeMap<String, (Instant, Option<f64>)>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Notes when each pending request is first seen Running, and deletes it then.
fn follow_pending(
    requests: Api<ComposabilityRequest>,
    watched: reflector::Store<ComposabilityRequest>,
    pending: Pending,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            let running: Vec<String> = {
                let mut map = lock(&pending);
                let mut now_running = Vec::new();
                for r in watched.state() {
                    if let Some((t0, ran @ None)) = map.get_mut(&r.name_any())
                        && is_running(&r)
                    {
                        *ran = Some(t0.elapsed().as_secs_f64());
                        now_running.push(r.name_any());
                    }
                }
                now_running
            };
            for name in running {
                if let Err(e) = requests.delete(&name, &DeleteParams::default()).await {
                    eprintln!("cannot delete {name}: {e}");
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

/// One kill: what was measured.
struct Kill {
    provider: String,
    victim: String,
    victim_led: bool,
    victim_held: usize,
    new_holder: Option<String>,
    takeover_s: Option<f64>,
    first_act_s: Option<f64>,
    first_act_by: Option<String>,
    first_call: Option<String>,
    /// The request made just before the kill, and from the kill to it Running.
    pending: String,
    pending_running_s: Option<f64>,
}

impl Kill {
    fn json(&self) -> Value {
        json!({
            "provider": self.provider, "victim": self.victim, "victim_led": self.victim_led,
            "victim_held": self.victim_held,
            "new_holder": self.new_holder, "takeover_s": self.takeover_s,
            "first_act_s": self.first_act_s, "first_act_by": self.first_act_by,
            "first_call": self.first_call, "pending": self.pending,
            "pending_running_s": self.pending_running_s,
        })
    }
}

async fn failover(p: &Params, kills: usize) -> Result<Value> {
    let per_provider = p.devices / PROVIDERS;
    let mut c = Cluster::start(p, per_provider, p.logs.join("failover")).await?;
    for _ in 0..FAILOVER_REPLICAS {
        c.spawn()?;
    }
    let held = c.settled().await?;
    progress(
        p.began,
        &format!(
            "{FAILOVER_REPLICAS} replicas up, Leases {:?}, leader {:?}",
            spread(&held),
            c.leader()
        ),
    );
    let requests: Api<ComposabilityRequest> = Api::all(c.env.client.clone());
    let resources: Api<ComposableResource> = Api::all(c.env.client.clone());
    let watched_requests = watch_all(requests.clone()).await?;
    let watched_resources = watch_all(resources.clone()).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let trickle = trickle(
        requests.clone(),
        c.nodes.iter().map(|(_, n)| n.clone()).collect(),
        stop.clone(),
    );

    // Each request made before a kill: the kill's instant and, once seen Running, the
    // seconds from the kill (then it is deleted).
    let pending_runs: Pending = Arc::default();
    let follower = follow_pending(
        requests.clone(),
        watched_requests.clone(),
        pending_runs.clone(),
        stop.clone(),
    );
    let mut done: Vec<Kill> = Vec::new();
    for k in 0..kills {
        let holders = c.settled().await?;
        let provider_index = k % PROVIDERS;
        let provider = provider_name(provider_index);
        let victim = holders
            .get(&provider)
            .cloned()
            .flatten()
            .context("a settled provider has a holder")?;
        let victim_held = holders
            .values()
            .filter(|h| h.as_deref() == Some(victim.as_str()))
            .count();
        // Work in flight for the provider: a request on one of its nodes, whose
        // resource the victim is attaching as it dies.
        let nodes: Vec<&String> = c
            .nodes
            .iter()
            .filter(|(i, _)| *i == provider_index)
            .map(|(_, n)| n)
            .collect();
        let node = nodes[(k / PROVIDERS) % nodes.len()].clone();
        let pending = format!("failover-{k:03}");
        let mut d = gpu(1);
        d.target_node = Some(node);
        requests
            .create(
                &PostParams::default(),
                &ComposabilityRequest::new(
                    &pending,
                    cro_api::ComposabilityRequestSpec { resource: d },
                ),
            )
            .await?;
        let deadline = Instant::now() + SETTLE;
        while !watched_resources.state().iter().any(|r| {
            r.labels().get(LABEL_MANAGED_BY) == Some(&pending)
                && r.labels().get(LABEL_PROVIDER) == Some(&provider)
        }) {
            if Instant::now() > deadline {
                bail!("{pending} got no ComposableResource of {provider} in {SETTLE:?}");
            }
            tokio::time::sleep(LOOK).await;
        }

        // The kill.
        let victim_led = c.leader().as_deref() == Some(victim.as_str());
        let i = c
            .live
            .iter()
            .position(|r| r.identity() == victim)
            .context("the holder is a live replica")?;
        let mut process = c.live.remove(i);
        let t0 = SystemTime::now();
        let t0_instant = Instant::now();
        process.kill()?;
        c.callers.remove(process.pid());
        drop(process);

        // Takeover: the Lease's new holder and its acquire time.
        let mut new_holder = None;
        let mut takeover_s = None;
        // First act: the first call the provider's fabric got from another replica.
        let mut first_act = None;
        let sim = c.sims[provider_index].clone();
        let deadline = Instant::now() + FAILOVER_WAIT;
        while (takeover_s.is_none() || first_act.is_none()) && Instant::now() < deadline {
            if takeover_s.is_none()
                && let Some(lease) = c.provider_lease(&provider)
                && let Some(h) = holder(&lease).filter(|h| *h != victim)
                && let Some(at) = lease.spec.as_ref().and_then(|s| s.acquire_time.as_ref())
            {
                takeover_s = Some(since(t0, micro(at)));
                new_holder = Some(h);
            }
            if first_act.is_none() {
                first_act = sim.calls().into_iter().find(|call| {
                    call.at >= t0
                        && call
                            .caller
                            .as_deref()
                            .is_some_and(|who| who != victim && who != "bench")
                });
            }
            tokio::time::sleep(LOOK).await;
        }
        // A replacement, as the Deployment would start.
        c.spawn()?;
        lock(&pending_runs).insert(pending.clone(), (t0_instant, None));
        let kill = Kill {
            provider: provider.clone(),
            victim: victim.clone(),
            victim_led,
            victim_held,
            new_holder,
            takeover_s,
            first_act_s: first_act.as_ref().map(|call| since(t0, call.at)),
            first_act_by: first_act.as_ref().and_then(|call| call.caller.clone()),
            first_call: first_act
                .as_ref()
                .map(|call| format!("{} {}", call.method, call.path)),
            pending: pending.clone(),
            pending_running_s: None,
        };
        progress(
            p.began,
            &format!(
                "kill {}: {victim} (held {victim_held}{}) for {provider}: taken over by {:?} after {:?} s, first call by {:?} after {:?} s ({})",
                k + 1,
                if victim_led { ", leader" } else { "" },
                kill.new_holder,
                kill.takeover_s.map(|s| (s * 1000.0).round() / 1000.0),
                kill.first_act_by,
                kill.first_act_s.map(|s| (s * 1000.0).round() / 1000.0),
                kill.first_call.as_deref().unwrap_or("-"),
            ),
        );
        if kill.first_act_by.is_some() && kill.first_act_by != kill.new_holder {
            eprintln!(
                "  odd: the first call after the kill came from {:?}, the Lease names {:?}",
                kill.first_act_by, kill.new_holder
            );
        }
        done.push(kill);
        for sim in &c.sims {
            sim.clear_calls();
        }
    }
    // The last kills' requests get their time to run (an attach the killed holder left
    // behind first lists the fabric's devices, one call per node).
    let deadline = Instant::now() + PENDING_WAIT;
    while lock(&pending_runs).values().any(|(_, s)| s.is_none()) && Instant::now() < deadline {
        c.restart_ended()?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let trickled = trickle.await.unwrap_or(0);
    let _ = follower.await;
    for kill in &mut done {
        kill.pending_running_s = lock(&pending_runs).get(&kill.pending).and_then(|(_, s)| *s);
    }
    let restarted = c.restarted.clone();
    // Clean up (not measured): every request deleted, then the replicas stopped.
    for r in watched_requests.state() {
        let _ = requests
            .delete(&r.name_any(), &DeleteParams::default())
            .await;
    }
    let _ = tokio::time::timeout(
        SETTLE,
        wait_phase(&mut c, "failover clean-up", Instant::now(), |c| {
            watched_requests.state().len() + watched_resources.state().len() + c.attached()
        }),
    )
    .await;
    c.stop().await;

    let stats = |get: fn(&Kill) -> Option<f64>| -> Value {
        let mut v: Vec<f64> = done.iter().filter_map(get).collect();
        v.sort_by(f64::total_cmp);
        json!({
            "n": v.len(),
            "median_s": median(&v),
            "max_s": v.last(),
            "min_s": v.first(),
        })
    };
    Ok(json!({
        "replicas": FAILOVER_REPLICAS,
        "kills": done.len(),
        "takeover": stats(|k| k.takeover_s),
        "first_act": stats(|k| k.first_act_s),
        "pending_running": stats(|k| k.pending_running_s),
        "victims_leading": done.iter().filter(|k| k.victim_led).count(),
        "trickle_requests": trickled,
        "restarted": restarted,
        "each": done.iter().map(Kill::json).collect::<Vec<_>>(),
    }))
}

fn median(sorted: &[f64]) -> Option<f64> {
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => Some(sorted[n / 2]),
        n => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

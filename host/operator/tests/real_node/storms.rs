//! Faults under load on the real node (docs/deploying.md, "Failover and faults"). cro is
//! installed with helm and runs as two replicas: the chart's Deployment, and the same
//! Deployment rendered for other host ports (what a second node would run: one replica
//! per node is what host ports allow). While [`REQUESTS`] requests are created, resized
//! and deleted, the storms come one after another: the leader's pod killed again and
//! again (SIGKILL of its container, and deletion with grace 0), the kubelet restarted,
//! containerd restarted, the API server restarted, the fabric dropping replies after
//! acting. After each storm every request converges and every device is accounted for:
//! held by exactly one ComposableResource or free, never twice, each pool whole, nothing
//! left of a deleted request. Seeded (`CRO_STORM_SEED` replays a run; a failure prints
//! the seed); the failover times (leader killed → first reconcile of the new leader) are
//! printed for docs/deploying.md.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cro_api::{ComposabilityRequest, ResourceState};
use fabric_sim::{Fault, Route};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kube_harness::real_node::NODE_NAME;
use kube_harness::tools::DEPLOY_DIR;
use serde_json::json;

use super::install::{
    Helm, LEASE, Ports, RELEASE, free_port, install_values, is_ready, lease_holder,
    node_with_image, one_ready_pod, operator_pods,
};
use crate::common::{CONVERGE, Env, OPERATOR_NS, Rng, eventually};

/// Requests under load: each asks for GPUs of its own model (two requests for one
/// model on one node would be refused as duplicates, as by the Go operator).
const REQUESTS: usize = 20;
/// Leader kills, alternating SIGKILL and deletion with grace 0: ten of each.
const KILLS: usize = 20;
/// Restarts of the kubelet, containerd and the API server, each.
const RESTARTS: usize = 2;
/// Replies the fabric drops after acting, on attach and on detach each.
const DROPS: u32 = 4;
/// Free GPUs of each request's model: sizes go up to 2, so a leak shows.
const DEVICES_PER_MODEL: usize = 3;
const DEFAULT_SEED: u64 = 0x5707_2026_0023;
/// The standby: the chart's Deployment under another name, on other host ports.
const STANDBY_DEPLOYMENT: &str = "cro-controller-standby";
const STANDBY_INSTANCE: &str = "cro-standby";
const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// How long the whole cluster gets to converge after a storm (20 requests on one node,
/// each GPU attach and detach with its node commands and plugin restarts).
const SETTLE: Duration = Duration::from_secs(300);

/// Prints the seed when the test fails, so the run can be replayed.
struct SeedOnFailure(u64);

impl Drop for SeedOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "storm seed {0}: CRO_STORM_SEED={0} replays this run",
                self.0
            );
        }
    }
}

fn model(slot: usize) -> String {
    format!("STORM-GPU-{slot:02}")
}

fn request_name(slot: usize) -> String {
    format!("storm-{slot:02}")
}

fn request(slot: usize, size: i64) -> ComposabilityRequest {
    serde_json::from_value(json!({
        "apiVersion": "cro.hpsys.ibm.ie.com/v1alpha1",
        "kind": "ComposabilityRequest",
        "metadata": {"name": request_name(slot)},
        "spec": {"resource": {
            "type": "gpu", "model": model(slot), "size": size,
            "allocation_policy": "samenode", "target_node": NODE_NAME,
        }},
    }))
    .expect("a storm request")
}

/// One replica of the operator: the pods of one Deployment and where their metrics are.
#[derive(Debug, Clone, Copy)]
struct Replica {
    instance: &'static str,
    metrics: u16,
}

/// One operator process as its `/metrics` shows it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Process {
    started: f64,
    leader: bool,
    reconciles: f64,
}

async fn scrape(http: &reqwest::Client, port: u16) -> Option<Process> {
    let text = http
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let value = |line: &str| line.rsplit(' ').next()?.parse::<f64>().ok();
    let mut process = Process {
        started: 0.0,
        leader: false,
        reconciles: 0.0,
    };
    for line in text.lines() {
        if line.starts_with("cro_process_start_time_seconds ") {
            process.started = value(line)?;
        } else if line.starts_with("cro_leader ") {
            process.leader = value(line)? == 1.0;
        } else if line.starts_with("cro_reconciles_total{") {
            process.reconciles += value(line)?;
        }
    }
    (process.started > 0.0).then_some(process)
}

/// The storm's values: the documented one-node values with plain-HTTP metrics (scraped
/// here every 100 ms to time failovers) and a short orphan grace, so a device attached
/// by a call whose reply was lost is released within the test.
fn storm_values(env: &Env, ports: &Ports) -> String {
    let mut values: serde_json::Value =
        serde_json::from_str(&install_values(env, ports)).expect("the install values");
    values["metrics"]["secure"] = json!(false);
    let extra = values["extraEnv"]
        .as_array_mut()
        .expect("install values have extraEnv");
    extra.push(json!({"name": "CRO_SYNC_PERIOD", "value": "5s"}));
    extra.push(json!({"name": "CRO_ORPHAN_GRACE_PERIOD", "value": "10s"}));
    values.to_string()
}

fn write_values(dir: &Path, name: &str, values: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, values).unwrap();
    path.to_str().unwrap().to_owned()
}

/// helm install (the chart's replica), then the standby: the chart's Deployment rendered
/// by `helm template` for other ports, renamed, with its own selector.
async fn install_two_replicas(env: &Env) -> [Replica; 2] {
    let dir = tempfile::tempdir().unwrap();
    let helm = Helm::new(env);
    let chart = Path::new(DEPLOY_DIR).join("helm/cro");
    let chart = chart.to_str().unwrap();
    let ports = [0, 1].map(|_| Ports {
        metrics: free_port(),
        probes: free_port(),
        webhook: free_port(),
    });
    let primary = write_values(dir.path(), "primary.json", &storm_values(env, &ports[0]));
    helm.run(&["install", RELEASE, chart, "--values", &primary])
        .unwrap_or_else(|e| panic!("{e}"));
    one_ready_pod(env, None).await;

    let standby = write_values(dir.path(), "standby.json", &storm_values(env, &ports[1]));
    let rendered = helm
        .run(&[
            "template",
            RELEASE,
            chart,
            "--values",
            &standby,
            "--show-only",
            "templates/deployment.yaml",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
    let mut deployment: Deployment = serde_yaml::from_str(&rendered).expect("a Deployment");
    deployment.metadata.name = Some(STANDBY_DEPLOYMENT.into());
    let spec = &mut deployment.spec;
    for labels in [
        spec.selector.match_labels.as_mut(),
        spec.template
            .metadata
            .as_mut()
            .and_then(|m| m.labels.as_mut()),
    ]
    .into_iter()
    .flatten()
    {
        labels.insert(INSTANCE_LABEL.into(), STANDBY_INSTANCE.into());
    }
    Api::<Deployment>::namespaced(env.client.clone(), OPERATOR_NS)
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let replicas = [
        Replica {
            instance: RELEASE,
            metrics: ports[0].metrics,
        },
        Replica {
            instance: STANDBY_INSTANCE,
            metrics: ports[1].metrics,
        },
    ];
    both_ready_and_one_leads(env, &replicas).await;
    replicas
}

fn instance_of(pod: &Pod) -> Option<&str> {
    pod.labels().get(INSTANCE_LABEL).map(String::as_str)
}

/// Waits until each replica has one Ready pod and one of them holds the Lease; returns
/// the leader's pod.
async fn both_ready_and_one_leads(env: &Env, replicas: &[Replica; 2]) -> Pod {
    eventually("both replicas Ready, one leading", SETTLE, || async {
        let pods = operator_pods(env).await;
        let ready: Vec<&Pod> = pods.iter().filter(|p| is_ready(p)).collect();
        let each_one = replicas.iter().all(|r| {
            ready
                .iter()
                .filter(|p| instance_of(p) == Some(r.instance))
                .count()
                == 1
        });
        if !each_one {
            return None;
        }
        let lease = Api::<Lease>::namespaced(env.client.clone(), OPERATOR_NS)
            .get_opt(LEASE)
            .await
            .ok()?;
        let holder = lease_holder(lease)?;
        ready.into_iter().find(|p| p.name_any() == holder).cloned()
    })
    .await
}

/// How the leader is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kill {
    /// Its container's process gets SIGKILL (a crash): the kubelet restarts it.
    Sigkill,
    /// Its pod is deleted with grace 0: the ReplicaSet makes a new one.
    DeleteGraceZero,
}

async fn kill(env: &Env, pod: &Pod, how: Kill) {
    match how {
        Kill::Sigkill => {
            let id = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.iter().find(|c| c.name == "manager"))
                .and_then(|c| c.container_id.as_deref())
                .and_then(|id| id.strip_prefix("containerd://"))
                .expect("the leader's container id")
                .to_owned();
            env.node_sim
                .real()
                .node
                .ctr(&["tasks", "kill", "--signal", "SIGKILL", &id])
                .expect("ctr kills the leader's container");
        }
        Kill::DeleteGraceZero => {
            Api::<Pod>::namespaced(env.client.clone(), OPERATOR_NS)
                .delete(
                    &pod.name_any(),
                    &DeleteParams {
                        grace_period_seconds: Some(0),
                        ..DeleteParams::default()
                    },
                )
                .await
                .expect("the leader's pod is deleted");
        }
    }
}

/// Kills the leader `kills` times, each once both replicas are up again and a few
/// seconds have passed; returns each failover: from the kill to the first reconcile a
/// new leader process completed (scraped every 100 ms).
async fn leader_kills(
    env: &Env,
    replicas: &[Replica; 2],
    rng: &mut Rng,
    kills: usize,
) -> Vec<(Kill, Duration)> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let mut failovers = Vec::new();
    for k in 0..kills {
        both_ready_and_one_leads(env, replicas).await;
        // The storm's rhythm (the load runs meanwhile), not a wait for a condition: the
        // leader is killed a few seconds into its term.
        tokio::time::sleep(rng.between(Duration::from_secs(1), Duration::from_secs(4))).await;
        let leader = both_ready_and_one_leads(env, replicas).await;
        let leader_replica = replicas
            .iter()
            .find(|r| instance_of(&leader) == Some(r.instance))
            .copied()
            .expect("the leader is one of the replicas");
        let killed = eventually("the leader's metrics", CONVERGE, || {
            scrape(&http, leader_replica.metrics)
        })
        .await;
        let mut before = BTreeMap::new();
        for r in replicas {
            if let Some(p) = scrape(&http, r.metrics).await {
                before.insert(r.metrics, p);
            }
        }
        let how = if k % 2 == 0 {
            Kill::Sigkill
        } else {
            Kill::DeleteGraceZero
        };
        kill(env, &leader, how).await;
        let t0 = Instant::now();
        let (port, new) = eventually("a new leader's first reconcile", SETTLE, || async {
            for r in replicas {
                let Some(p) = scrape(&http, r.metrics).await else {
                    continue;
                };
                let same_process = |q: &Process| q.started == p.started;
                if r.metrics == leader_replica.metrics && same_process(&killed) {
                    continue;
                }
                let baseline = before
                    .get(&r.metrics)
                    .filter(|q| same_process(q))
                    .map_or(0.0, |q| q.reconciles);
                if p.leader && p.reconciles > baseline {
                    return Some((r.metrics, p));
                }
            }
            None
        })
        .await;
        let took = t0.elapsed();
        let restarted = if port == leader_replica.metrics {
            "the killed replica, restarted"
        } else {
            "the standby"
        };
        eprintln!(
            "kill {}: {how:?} of {}; {restarted} reconciled after {took:?} (process started {:.1})",
            k + 1,
            leader.name_any(),
            new.started
        );
        failovers.push((how, took));
    }
    failovers
}

/// Requests created, resized and deleted at random until stopped. Every change goes
/// through the API (and the webhook); one refused or lost is simply not made (the API
/// server's record is the intent checked afterwards).
struct Load {
    stop: Arc<AtomicBool>,
    made: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    fn start(client: Client, seed: u64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let made = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let (stop, made, failed) = (stop.clone(), made.clone(), failed.clone());
            async move {
                let api: Api<ComposabilityRequest> = Api::all(client);
                let mut rng = Rng::new(seed);
                while !stop.load(Ordering::Relaxed) {
                    let slot = rng.below(REQUESTS as u64) as usize;
                    let counter = match change(&api, slot, &mut rng).await {
                        Ok(true) => &made,
                        Ok(false) => continue,
                        Err(_) => &failed,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    let pause = rng.between(Duration::from_millis(200), Duration::from_millis(900));
                    tokio::time::sleep(pause).await;
                }
            }
        });
        Load {
            stop,
            made,
            failed,
            task,
        }
    }

    /// Stops and returns (changes made, changes refused or lost).
    async fn stop(self) -> (usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the load task");
        (
            self.made.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

/// One change to a request: created if absent, else deleted or resized between 1 and 2
/// (false: nothing to do, it is being deleted).
async fn change(
    api: &Api<ComposabilityRequest>,
    slot: usize,
    rng: &mut Rng,
) -> Result<bool, kube::Error> {
    let name = request_name(slot);
    let Some(current) = api.get_opt(&name).await? else {
        let size = 1 + rng.below(2) as i64;
        api.create(&PostParams::default(), &request(slot, size))
            .await?;
        return Ok(true);
    };
    if current.metadata.deletion_timestamp.is_some() {
        return Ok(false);
    }
    if rng.below(2) == 0 {
        api.delete(&name, &DeleteParams::default()).await?;
    } else {
        let size = 3 - current.spec.resource.size.clamp(1, 2);
        let patch = json!({"spec": {"resource": {"size": size}}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(true)
}

/// What the API server holds as each request's intent: its size, or None when it is
/// absent or being deleted.
async fn intents(env: &Env) -> Vec<Option<i64>> {
    let mut out = Vec::new();
    for slot in 0..REQUESTS {
        let request = eventually("the request readable", CONVERGE, || async {
            env.requests().get_opt(&request_name(slot)).await.ok()
        })
        .await;
        out.push(
            request
                .filter(|r| r.metadata.deletion_timestamp.is_none())
                .map(|r| r.spec.resource.size),
        );
    }
    out
}

/// Every request converges to its intent, and then every device is accounted for.
async fn assert_converged_and_accounted(env: &Env, machine: &str, storm: &str) {
    let t0 = Instant::now();
    let intents = intents(env).await;
    for (slot, intent) in intents.iter().enumerate() {
        let name = request_name(slot);
        match intent {
            Some(size) => {
                eventually(
                    &format!("{storm}: {name} Running with {size}"),
                    SETTLE,
                    || async {
                        let r = env.request(&name).await?;
                        let s = r.status.as_ref()?;
                        (s.state == cro_api::RequestState::Running
                            && s.resources.len() == *size as usize
                            && env.resources_of(&name).await.len() == *size as usize)
                            .then_some(())
                    },
                )
                .await;
            }
            None => {
                eventually(
                    &format!("{storm}: {name} and its resources gone"),
                    SETTLE,
                    || async {
                        (env.request(&name).await.is_none()
                            && env.resources_of(&name).await.is_empty())
                        .then_some(())
                    },
                )
                .await;
            }
        }
    }
    // Devices attached by a call whose reply was lost are released after the grace.
    eventually(&format!("{storm}: the fabric agrees"), SETTLE, || async {
        accounting(env, machine, &intents).await.ok()
    })
    .await;
    if let Err(e) = accounting(env, machine, &intents).await {
        panic!("{storm}: {e}");
    }
    eprintln!(
        "{storm}: {} requests Running, {} absent, all devices accounted for, {:?} after the storm",
        intents.iter().flatten().count(),
        intents.iter().filter(|i| i.is_none()).count(),
        t0.elapsed()
    );
}

/// Every ComposableResource belongs to a live request and is Online; every device held
/// is attached to the node's machine and held once; every attached device is held;
/// each model's pool is whole (free + attached = what the fabric was given).
async fn accounting(env: &Env, machine: &str, intents: &[Option<i64>]) -> Result<(), String> {
    let resources = env
        .resources()
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items;
    let mut holders: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in &resources {
        let owner = r.managed_by().unwrap_or_default();
        let live = (0..REQUESTS).any(|slot| request_name(slot) == owner && intents[slot].is_some());
        if !live {
            return Err(format!("{} outlived its request {owner}", r.name_any()));
        }
        if r.state() != ResourceState::Online {
            return Err(format!("{} is {:?}", r.name_any(), r.state()));
        }
        let id = r
            .device_id()
            .ok_or_else(|| format!("{} holds no device", r.name_any()))?;
        holders.entry(id.to_owned()).or_default().push(r.name_any());
    }
    if let Some((id, names)) = holders.iter().find(|(_, n)| n.len() > 1) {
        return Err(format!("device {id} held twice: {names:?}"));
    }
    let attached = env.sim.machine_devices(machine);
    for d in &attached {
        if !holders.contains_key(&d.serial) {
            return Err(format!(
                "{} ({}) attached but held by nobody",
                d.serial, d.model
            ));
        }
    }
    for id in holders.keys() {
        if !attached.iter().any(|d| &d.serial == id) {
            return Err(format!("{id} held but not attached"));
        }
    }
    for (slot, intent) in intents.iter().enumerate() {
        let m = model(slot);
        let on = attached.iter().filter(|d| d.model == m).count();
        let free = env.sim.free_devices("gpu", &m);
        if on + free != DEVICES_PER_MODEL {
            return Err(format!("pool {m}: {on} attached + {free} free"));
        }
        if on != intent.unwrap_or(0) as usize {
            return Err(format!("{m}: {on} attached for {intent:?}"));
        }
    }
    Ok(())
}

/// A storm under way: the load changing requests while the faults come.
struct Storm {
    name: &'static str,
    started: Instant,
    load: Load,
}

impl Storm {
    fn begin(env: &Env, name: &'static str, seed: u64) -> Storm {
        eprintln!("storm {name}: starting");
        Storm {
            name,
            started: Instant::now(),
            load: Load::start(env.client.clone(), seed),
        }
    }

    /// Stops the load, then checks the aftermath.
    async fn end(self, env: &Env, machine: &str) {
        let (made, failed) = self.load.stop().await;
        eprintln!(
            "storm {}: {made} changes made, {failed} refused or lost, in {:?}",
            self.name,
            self.started.elapsed()
        );
        assert!(made > 0, "{}: the load made no change", self.name);
        assert_converged_and_accounted(env, machine, self.name).await;
    }
}

/// The storm's rhythm between two faults (not a wait for a condition: the load runs
/// meanwhile).
async fn pause(rng: &mut Rng) {
    tokio::time::sleep(rng.between(Duration::from_secs(2), Duration::from_secs(6))).await;
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// REQUESTS requests under load through five storms on the real node, with cro
/// installed by helm as two replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fault_storms_under_load_leave_every_device_accounted_for() {
    let seed = std::env::var("CRO_STORM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    eprintln!("storm seed {seed}");
    let _seed = SeedOnFailure(seed);
    let mut rng = Rng::new(seed);

    let (mut env, machine) = node_with_image().await;
    for slot in 0..REQUESTS {
        env.sim
            .add_free_devices("gpu", &model(slot), DEVICES_PER_MODEL);
    }
    let replicas = install_two_replicas(&env).await;

    // Every request created, then converged, before the first storm.
    let t0 = Instant::now();
    for slot in 0..REQUESTS {
        let size = 1 + rng.below(2) as i64;
        env.requests()
            .create(&PostParams::default(), &request(slot, size))
            .await
            .unwrap();
    }
    assert_converged_and_accounted(&env, &machine, "start").await;
    eprintln!("{REQUESTS} requests converged in {:?}", t0.elapsed());

    let storm = Storm::begin(&env, "leader kills", rng.below(u64::MAX));
    let failovers = leader_kills(&env, &replicas, &mut rng, KILLS).await;
    storm.end(&env, &machine).await;

    let storm = Storm::begin(&env, "kubelet restarts", rng.below(u64::MAX));
    for _ in 0..RESTARTS {
        pause(&mut rng).await;
        let node = &mut env.node_sim.real_mut().node;
        node.restart_kubelet().await.expect("the kubelet restarts");
    }
    pause(&mut rng).await;
    storm.end(&env, &machine).await;

    let storm = Storm::begin(&env, "containerd restarts", rng.below(u64::MAX));
    for _ in 0..RESTARTS {
        pause(&mut rng).await;
        let node = &mut env.node_sim.real_mut().node;
        node.restart_containerd()
            .await
            .expect("containerd restarts");
    }
    pause(&mut rng).await;
    storm.end(&env, &machine).await;

    let storm = Storm::begin(&env, "API server restarts", rng.below(u64::MAX));
    for _ in 0..RESTARTS {
        pause(&mut rng).await;
        let gone = env
            .harness
            .restart_apiserver(CONVERGE)
            .await
            .expect("the API server restarts");
        eprintln!("the API server was gone for {gone:?}");
    }
    pause(&mut rng).await;
    storm.end(&env, &machine).await;

    // The fabric acts, and its reply is lost: attaches and detaches alike.
    let storm = Storm::begin(&env, "fabric drops replies", rng.below(u64::MAX));
    let attaches = env.sim.requests_to(Route::FmAttach).len();
    let detaches = env.sim.requests_to(Route::FmDetach).len();
    env.sim
        .inject(Fault::DropAfterProcessing.on(Route::FmAttach).times(DROPS));
    env.sim
        .inject(Fault::DropAfterProcessing.on(Route::FmDetach).times(DROPS));
    eventually(
        "every reply the fabric was to drop dropped",
        SETTLE,
        || async {
            (env.sim.requests_to(Route::FmAttach).len() >= attaches + DROPS as usize
                && env.sim.requests_to(Route::FmDetach).len() >= detaches + DROPS as usize)
                .then_some(())
        },
    )
    .await;
    pause(&mut rng).await;
    env.sim.clear_faults();
    storm.end(&env, &machine).await;

    // Everything deleted: no device left attached, no object left behind.
    for slot in 0..REQUESTS {
        let _ = env
            .requests()
            .delete(&request_name(slot), &DeleteParams::default())
            .await;
    }
    eventually("every request and resource gone", SETTLE, || async {
        let requests = env.requests().list(&ListParams::default()).await.ok()?;
        let resources = env.resources().list(&ListParams::default()).await.ok()?;
        (requests.items.is_empty() && resources.items.is_empty()).then_some(())
    })
    .await;
    env.assert_nothing_attached().await;

    assert!(failovers.len() >= KILLS);
    for (what, kind) in [
        ("all kills", None),
        ("SIGKILL", Some(Kill::Sigkill)),
        ("deletion with grace 0", Some(Kill::DeleteGraceZero)),
    ] {
        let times: Vec<Duration> = failovers
            .iter()
            .filter(|(k, _)| kind.is_none_or(|kind| *k == kind))
            .map(|(_, t)| *t)
            .collect();
        eprintln!(
            "failover, {what} ({}): median {:?}, max {:?}",
            times.len(),
            median(times.clone()),
            times.iter().max().copied().unwrap_or_default()
        );
    }
}

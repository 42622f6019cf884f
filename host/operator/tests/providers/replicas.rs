//! Replicas share the providers (docs/ARCHITECTURE.md, "Replicas"): three `cro`
//! replicas, each a process of its own (this test binary started again on
//! `replica_entry`), over four providers, each its own FTI fabric and node pool. While
//! requests come and go, holders are killed (SIGKILL) and paused (SIGSTOP, resumed after
//! their Lease moved on). Each fabric records which process made every call, and a
//! watch records every change of the providers' Leases, so the test can say who held a
//! provider at the instant of each call.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use cro_api::{LABEL_PROVIDER, RequestState};
use fabric_sim::callers::PidResolver;
use fabric_sim::{Fault, Injection};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use node_sim::Standin;
use node_sim::replica::{ApiAccess, ReplicaProcess, ReplicaSpec};

use super::{create_provider, fti_bytes};
use crate::common::cdi::{another_fabric, fti_spec_for, label_node, pool, put_component};
use crate::common::{CONVERGE, Env, MODEL, OPERATOR_NS, Rng, eventually, gpu};

/// A replica process: the sharding test starts this binary again on this entry (with
/// `--ignored` and the replica's spec in `CRO_REPLICA_SPEC`). Not a test of its own.
#[test]
#[ignore = "a replica process of the sharding test, started by it"]
fn replica_entry() {
    let ended = node_sim::replica::main_from_env()
        .expect("started without CRO_REPLICA_SPEC: the sharding test starts this entry");
    ended.expect("the replica failed");
}

const PROVIDERS: usize = 4;
const LEASE: &str = "cro-shards";
const LEASE_DURATION: Duration = Duration::from_secs(2);
/// How late a request sent by a replica just before its SIGKILL may reach a fabric.
const KILLED_IN_FLIGHT: Duration = Duration::from_secs(2);

/// One change of a provider's Lease: from `at` on, `holder` holds it (None: nobody).
#[derive(Debug, Clone)]
struct Term {
    at: SystemTime,
    holder: Option<String>,
}

/// Every holder change of every provider's Lease, as the watch saw the records.
#[derive(Default)]
struct History {
    terms: BTreeMap<String, Vec<Term>>,
    last: BTreeMap<String, (Option<String>, Option<String>)>,
}

fn micro(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_micros(t.0.as_microsecond().max(0) as u64)
}

impl History {
    fn see(&mut self, lease: &Lease) {
        let Some(provider) = lease
            .annotations()
            .get("cro.hpsys.ibm.ie.com/provider")
            .cloned()
        else {
            return;
        };
        let Some(spec) = &lease.spec else { return };
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let acquired = spec.acquire_time.as_ref().map(micro);
        let key = (holder.clone(), acquired.map(|t| format!("{t:?}")));
        if self.last.get(&provider) == Some(&key) {
            return;
        }
        self.last.insert(provider.clone(), key);
        // A holder's term starts when it wrote its acquire time (before it could act);
        // a release ends it when the releasing write says it was renewed.
        let at = match &holder {
            Some(_) => spec.acquire_time.as_ref().map(micro),
            None => spec.renew_time.as_ref().map(micro),
        };
        if let Some(at) = at {
            self.terms
                .entry(provider)
                .or_default()
                .push(Term { at, holder });
        }
    }

    /// Who held `provider` at `t`.
    fn holder_at(&self, provider: &str, t: SystemTime) -> Option<String> {
        self.terms
            .get(provider)?
            .iter()
            .filter(|term| term.at <= t)
            .max_by_key(|term| term.at)
            .and_then(|term| term.holder.clone())
    }
}

async fn provider_leases(client: &kube::Client) -> BTreeMap<String, Option<String>> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NS);
    let list = leases
        .list(&ListParams::default().labels(&format!("{}={LEASE}", cro_api::LABEL_LEASES_OF)))
        .await
        .unwrap();
    list.items
        .iter()
        .filter_map(|l| {
            let p = l
                .annotations()
                .get("cro.hpsys.ibm.ie.com/provider")?
                .clone();
            let h = l
                .spec
                .as_ref()?
                .holder_identity
                .clone()
                .filter(|h| !h.is_empty());
            Some((p, h))
        })
        .collect()
}

struct Replicas {
    spec: ReplicaSpec,
    live: Vec<ReplicaProcess>,
    dead: Vec<ReplicaProcess>,
    logs: tempfile::TempDir,
    callers: PidResolver,
    next: usize,
}

impl Replicas {
    /// A new replica, as a new pod would be (a new identity).
    fn spawn(&mut self) {
        let identity = format!("replica-{}", self.next);
        self.next += 1;
        self.spawn_as(&identity);
    }

    /// Replicas whose process ended (one that lost the leader Lease stops, so that it
    /// starts again as a standby) are started again under the same identity, as the
    /// kubelet restarts a pod's container.
    fn restart_ended(&mut self) {
        let mut i = 0;
        while i < self.live.len() {
            if let Ok(Some(status)) = self.live[i].try_wait() {
                let ended = self.live.remove(i);
                eprintln!("{} ended ({status}): restarted", ended.identity());
                self.callers.remove(ended.pid());
                let identity = ended.identity().to_owned();
                self.dead.push(ended);
                self.spawn_as(&identity);
            } else {
                i += 1;
            }
        }
    }

    fn spawn_as(&mut self, identity: &str) {
        let spec = self.spec.with_identity(identity);
        let log = self.logs.path().join(format!("{identity}.log"));
        let me = std::env::current_exe().unwrap();
        let args = [
            "--exact",
            "providers::replicas::replica_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ];
        let r = ReplicaProcess::spawn(&me, args, &spec, &log).unwrap();
        self.callers.insert(r.pid(), identity);
        self.live.push(r);
    }

    fn live_names(&self) -> Vec<String> {
        self.live.iter().map(|r| r.identity().to_owned()).collect()
    }

    fn take(&mut self, identity: &str) -> ReplicaProcess {
        let i = self
            .live
            .iter()
            .position(|r| r.identity() == identity)
            .unwrap_or_else(|| panic!("{identity} is not a live replica"));
        self.live.remove(i)
    }

    fn logs(&self) -> String {
        self.live
            .iter()
            .chain(&self.dead)
            .map(|r| format!("--- {} ---\n{}", r.identity(), tail(&r.log(), 60)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Waits until every provider is held by a live replica and no replica holds more
/// than its share, ceil(providers / live replicas).
async fn settled(env: &Env, replicas: &mut Replicas) -> BTreeMap<String, Option<String>> {
    let deadline = Instant::now() + CONVERGE;
    loop {
        replicas.restart_ended();
        let live = replicas.live_names();
        let share = PROVIDERS.div_ceil(live.len());
        let leases = provider_leases(&env.client).await;
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        let all_live = leases.len() == PROVIDERS
            && leases.values().all(|h| {
                h.as_deref().is_some_and(|h| {
                    *counts.entry(h).or_default() += 1;
                    live.iter().any(|l| l == h)
                })
            });
        if all_live && counts.values().all(|c| *c <= share) {
            return leases;
        }
        assert!(
            Instant::now() < deadline,
            "the providers' Leases did not settle over {live:?}: {leases:?}\n{}",
            replicas.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every resource carries the provider of its node (`p<i>-node-<j>` is fabric-i's), and
/// an attach record names a replica.
async fn check_resources(env: &Env, replicas: &Replicas) {
    let all = env.resources().list(&ListParams::default()).await.unwrap();
    for r in &all.items {
        let pool = r.spec.target_node.split('-').next().unwrap_or_default();
        let want = format!("fabric-{}", pool.trim_start_matches('p'));
        assert_eq!(
            r.labels().get(LABEL_PROVIDER),
            Some(&want),
            "{} on {}\n{}",
            r.name_any(),
            r.spec.target_node,
            replicas.logs()
        );
        if let Some(record) = r.annotations().get(cro_operator::ANNOTATION_ATTACH_ATTEMPT) {
            let record: serde_json::Value = serde_json::from_str(record).unwrap();
            // No holder only when the provider's Lease was free as the resource was made.
            assert!(
                record.get("holder").is_none()
                    || record["holder"]
                        .as_str()
                        .is_some_and(|h| h.starts_with("replica-")),
                "{}: {record}",
                r.name_any()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_providers_and_no_fabric_call_comes_from_a_replica_without_the_lease() {
    let seed = std::env::var("CRO_SHARD_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_micros() as u64
        });
    eprintln!("CRO_SHARD_SEED={seed}");
    let mut rng = Rng::new(seed);
    let env = Env::start().await;

    // Four fabrics, each the provider of its own pool of two nodes. Calls take a little
    // while, so that kills and pauses land on calls in flight.
    let mut sims = vec![env.sim.clone()];
    for _ in 1..PROVIDERS {
        sims.push(another_fabric(&env));
    }
    let callers = PidResolver::new();
    callers.insert(std::process::id(), "test");
    let mut nodes = Vec::new();
    put_component(&env, "fti", "fti.wasm", fti_bytes()).await;
    let mut cas = Vec::new();
    for (i, sim) in sims.iter().enumerate() {
        sim.record_callers(callers.resolver());
        sim.inject(Injection::from(Fault::Latency(Duration::from_millis(40))).always());
        // Room for the worst case: every live request (at most six, two GPUs each) on
        // one fabric.
        sim.add_free_devices("gpu", MODEL, 12);
        for j in 0..2 {
            let node = format!("p{i}-node-{j}");
            env.add_node_on_fabric(&node, "16", sim).await;
            label_node(&env, &node, &format!("p{i}")).await;
            nodes.push((i, node));
        }
        let (mut spec, ca) = fti_spec_for(sim);
        spec.node_selector = pool(&format!("p{i}"));
        create_provider(&env, &format!("fabric-{i}"), spec).await;
        cas.push(ca);
    }

    // Every change of the providers' Leases, from before the first replica.
    let history = Arc::new(Mutex::new(History::default()));
    let seen = history.clone();
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), OPERATOR_NS);
    let watch = tokio::spawn(async move {
        let config =
            watcher::Config::default().labels(&format!("{}={LEASE}", cro_api::LABEL_LEASES_OF));
        let mut events =
            std::pin::pin!(watcher(leases, config).default_backoff().applied_objects());
        while let Some(event) = events.next().await {
            if let Ok(lease) = event {
                seen.lock().unwrap().see(&lease);
            }
        }
    });

    let standin = Standin::start(env.nodes.clone()).unwrap();
    let api = ApiAccess::token(
        &env.harness.server_url(),
        env.harness.ca_pem().expect("a local control plane"),
        env.harness.token().expect("a local control plane"),
    );
    let mut spec = ReplicaSpec::new(api, "replica", standin.url());
    spec.lease.name = LEASE.into();
    spec.lease.duration = LEASE_DURATION;
    spec.lease.renew_period = Duration::from_millis(300);
    spec.log_filter = Some("info,kube=warn,tower=warn".into());
    let mut replicas = Replicas {
        spec,
        live: Vec::new(),
        dead: Vec::new(),
        logs: tempfile::tempdir().unwrap(),
        callers: callers.clone(),
        next: 0,
    };
    for _ in 0..3 {
        replicas.spawn();
    }
    let held = settled(&env, &mut replicas).await;
    eprintln!("settled: {held:?}");

    // Storms: requests created and deleted at random while a holder is killed or paused.
    let mut live_requests: Vec<String> = Vec::new();
    let mut made = 0usize;
    let mut storm_requests = |rng: &mut Rng, live: &mut Vec<String>| {
        let mut create = Vec::new();
        let mut delete = Vec::new();
        for _ in 0..3 {
            if live.len() > 5 || (!live.is_empty() && rng.below(3) == 0) {
                let i = rng.below(live.len() as u64) as usize;
                delete.push(live.remove(i));
            } else {
                let (_, node) = &nodes[rng.below(nodes.len() as u64) as usize];
                let name = format!("req-{made}");
                made += 1;
                let mut d = gpu(1 + rng.below(2) as i64);
                d.target_node = Some(node.clone());
                create.push((name.clone(), d));
                live.push(name);
            }
        }
        (create, delete)
    };
    // (when, whom): a request a replica sent just before its SIGKILL may be accepted
    // after the process and its socket are gone, and then has no caller.
    let mut kills: Vec<(SystemTime, String)> = Vec::new();
    for round in 0..6 {
        let (create, delete) = storm_requests(&mut rng, &mut live_requests);
        for (name, d) in create {
            env.create_request(&name, d).await;
        }
        for name in delete {
            env.delete_request(&name).await;
        }
        // Let attaches and detaches get under way, then strike a provider's holder.
        tokio::time::sleep(Duration::from_millis(200 + rng.below(400))).await;
        let held = provider_leases(&env.client).await;
        let provider = format!("fabric-{}", rng.below(PROVIDERS as u64));
        let Some(holder) = held.get(&provider).cloned().flatten() else {
            continue;
        };
        if round % 2 == 0 {
            eprintln!("round {round}: SIGKILL {holder} (holds {provider})");
            let mut victim = replicas.take(&holder);
            let killed_at = SystemTime::now();
            victim.kill().unwrap();
            kills.push((killed_at, holder.clone()));
            callers.remove(victim.pid());
            replicas.dead.push(victim);
            replicas.spawn();
        } else {
            eprintln!("round {round}: SIGSTOP {holder} (holds {provider})");
            let mut paused = replicas.take(&holder);
            paused.stop().unwrap();
            // Its Leases move on: the others see it unchanged for the lease duration.
            eventually(
                &format!("{holder}'s Leases taken over while it is paused"),
                CONVERGE,
                || async {
                    let now = provider_leases(&env.client).await;
                    (now.len() == PROVIDERS
                        && now
                            .values()
                            .all(|h| h.as_deref().is_some_and(|h| h != holder)))
                    .then_some(())
                },
            )
            .await;
            // Resumed: whatever it was doing, it may not call a fabric any more, not
            // even a request that had passed its checks before the pause (its
            // connection asks the fence again before each write).
            paused.cont().unwrap();
            replicas.live.push(paused);
        }
        settled(&env, &mut replicas).await;
        check_resources(&env, &replicas).await;
    }

    // Every request still wanted converges, and deleted ones are gone with their devices.
    for name in &live_requests {
        let deadline = Instant::now() + CONVERGE;
        loop {
            let r = env.request(name).await;
            let running = r
                .as_ref()
                .and_then(|r| r.status.as_ref())
                .is_some_and(|s| s.state == RequestState::Running);
            if running {
                break;
            }
            replicas.restart_ended();
            assert!(
                Instant::now() < deadline,
                "request {name} did not converge: {:?}\n{}",
                r.and_then(|r| r.status),
                replicas.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    for name in live_requests.drain(..) {
        env.delete_request(&name).await;
    }
    // Every request and resource gone (a replica that ends meanwhile is started again,
    // as its pod would be); what is left is said if not.
    let deadline = Instant::now() + CONVERGE;
    loop {
        let requests = env.requests().list(&ListParams::default()).await;
        let resources = env.resources().list(&ListParams::default()).await;
        let left: Vec<String> = match (&requests, &resources) {
            (Ok(requests), Ok(resources)) => requests
                .items
                .iter()
                .map(|r| format!("request {}: {:?}", r.name_any(), r.status))
                .chain(
                    resources
                        .items
                        .iter()
                        .map(|r| format!("resource {}: {:?}", r.name_any(), r.status)),
                )
                .collect(),
            _ => vec![format!("not listed: {requests:?} {resources:?}")],
        };
        if left.is_empty() {
            break;
        }
        replicas.restart_ended();
        assert!(
            Instant::now() < deadline,
            "not gone after {CONVERGE:?}:\n{}\nLeases: {:?}\n{}",
            left.join("\n"),
            provider_leases(&env.client).await,
            replicas.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every device is free again on every fabric, none held twice on the way.
    for (i, sim) in sims.iter().enumerate() {
        for m in sim.machines() {
            assert!(
                sim.machine_devices(&m.uuid).is_empty(),
                "fabric-{i}: machine {} still holds {:?}\n{}",
                m.uuid,
                sim.machine_devices(&m.uuid),
                replicas.logs()
            );
        }
    }

    // Every fabric call came from the replica holding that provider's Lease at the time.
    watch.abort();
    let history = std::mem::take(&mut *history.lock().unwrap());
    let mut by_caller: BTreeMap<String, usize> = BTreeMap::new();
    for (i, sim) in sims.iter().enumerate() {
        let provider = format!("fabric-{i}");
        for call in sim.calls() {
            let Some(caller) = call.caller.clone() else {
                // Only a request in flight as its sender was killed holding the Lease:
                // accepted after the process and its socket are gone, it has no caller.
                let in_flight = kills.iter().any(|(k, victim)| {
                    *k <= call.at
                        && call.at <= *k + KILLED_IN_FLIGHT
                        && history.holder_at(&provider, *k).as_deref() == Some(victim)
                });
                assert!(
                    in_flight,
                    "{provider}: a call from an unknown process ({}) at {:?}: {} {}; kills: {kills:?}",
                    call.peer, call.at, call.method, call.path
                );
                continue;
            };
            if caller == "test" {
                continue;
            }
            *by_caller.entry(caller.clone()).or_default() += 1;
            let holder = history.holder_at(&provider, call.at);
            assert_eq!(
                holder.as_deref(),
                Some(caller.as_str()),
                "{provider}: {caller} called {} {} at {:?} while the Lease was {holder:?}'s\nterms: {:?}\n{}",
                call.method,
                call.path,
                call.at,
                history.terms.get(&provider),
                replicas.logs()
            );
        }
    }
    eprintln!("fabric calls by replica: {by_caller:?}");
    assert!(
        by_caller.len() >= 3,
        "the work was not shared: {by_caller:?}"
    );

    for mut r in replicas.live.drain(..) {
        // A paused leader stops on its own once resumed (it lost the leader Lease), so
        // that its pod starts it again as a standby; any other end is a failure.
        if let Ok(Some(status)) = r.try_wait() {
            assert!(
                r.log().contains("lost the leader Lease"),
                "{} ended: {status}\n{}",
                r.identity(),
                r.log()
            );
            continue;
        }
        let status = r.terminate(Duration::from_secs(30)).await.unwrap();
        assert!(status.success(), "{status}\n{}", r.log());
    }
    // A graceful stop gives every Lease up.
    let leases = provider_leases(&env.client).await;
    assert!(leases.values().all(Option::is_none), "{leases:?}");
}

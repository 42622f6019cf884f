//! Replicas share the providers (docs/ARCHITECTURE.md, "Replicas"): each provider has a
//! Lease, each replica holds a fair share of them ([`crate::decide::shards`]), and the
//! work of a provider (its resource controller) runs only in the replica holding its
//! Lease, started when the Lease is taken and stopped before it is given up.
//!
//! Every round (each renew period) one LIST reads every Lease of this deployment: a
//! membership Lease per replica (renewed each round: who is alive, so shares follow
//! the live replicas) and a Lease per provider. Then the replica gives up, renews and
//! takes provider Leases as the plan says, and tells the fence
//! ([`crate::provider::tenure`]) until when it may act for each.
//!
//! Without leader election there is one replica: it holds every provider, no Lease is
//! written, and this loop only starts and stops the work of providers as they come and
//! go (`CdiProvider` objects).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use tokio::task::JoinHandle;

use super::leader::LeaderElector;
use super::signals::{Signal, signal};
use crate::config::LeaderElectionConfig;
use crate::decide::shards::{self, Holder, View};
use crate::metrics::Metrics;
use crate::provider::tenure::{LeaseHolder, Tenure, process_id};
use crate::registry::Registry;

use cro_api::LABEL_LEASES_OF;
/// Annotation on a provider's Lease: the provider (a label value could not hold every
/// name a Lease name can).
const ANNOTATION_PROVIDER: &str = "cro.hpsys.ibm.ie.com/provider";
/// Annotation on a provider's Lease: the holder's process, so that a resource made for
/// that provider names the process that will attach it (crate::controllers::resource).
const ANNOTATION_PROCESS: &str = "cro.hpsys.ibm.ie.com/holder-process";

/// Annotation on a replica's membership Lease: its identity, kept when the Lease is
/// released (a replica that stopped is still known as one of cro's, not a foreign one).
const ANNOTATION_REPLICA: &str = "cro.hpsys.ibm.ie.com/replica";

/// How long the work of a provider being given up may take to finish its reconciles
/// before it is aborted (safe: every step stores its plan before acting). Short: the
/// round waits for it, and at shutdown the Leases must be released within the process's
/// own stop grace (crate::process::run).
const STOP_WORK_GRACE: Duration = Duration::from_secs(5);

/// Starts a provider's work; it runs until the signal resolves.
pub(crate) type StartWork = Arc<dyn Fn(String, Signal) -> BoxFuture<'static, ()> + Send + Sync>;

/// A provider's work running in this replica.
struct Running {
    stop: futures::channel::oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// The fraction of the lease duration the fence closes early: a renewal sent at `t` lets
/// this replica act until `t + duration × (1 − SAFETY)`.
const SAFETY: f64 = 1.0 / 3.0;

pub(crate) struct Shards {
    metrics: Arc<Metrics>,
    registry: Arc<Registry>,
    tenure: Arc<Tenure>,
    start_work: StartWork,
    running: BTreeMap<String, Running>,
    leases: Option<Leases>,
    /// Whether a foreign leader was said (said once per stretch).
    foreign_said: bool,
}

/// The Lease side (with leader election).
struct Leases {
    api: Api<Lease>,
    client: kube::Client,
    config: LeaderElectionConfig,
    member: LeaderElector,
    /// One elector per Lease seen or wanted, by Lease name: it remembers when each
    /// record was first seen as it is (expiry is judged on this clock).
    electors: BTreeMap<String, LeaderElector>,
}

/// A Lease name from parts: a DNS subdomain of at most 253 characters (long or odd
/// parts are cut and the whole is told apart by a hash).
fn lease_name(prefix: &str, kind: &str, part: &str) -> String {
    let clean: String = part
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let full = format!("{prefix}-{kind}-{clean}");
    let full = full.trim_end_matches(['-', '.']).to_owned();
    if full.len() <= 253 && clean == part {
        return full;
    }
    let hash = format!("{:016x}", fnv(part));
    let keep = 253 - hash.len() - 1;
    let cut: String = full.chars().take(keep).collect();
    format!("{}-{hash}", cut.trim_end_matches(['-', '.']))
}

fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The value of [`LABEL_LEASES_OF`] for the leader Lease `lease_name` (label values:
/// 63 characters at most).
pub fn leases_of(lease_name: &str) -> String {
    if lease_name.len() <= 63 {
        lease_name.to_owned()
    } else {
        format!("h-{:016x}", fnv(lease_name))
    }
}

impl Leases {
    fn provider_lease(&self, provider: &str) -> String {
        lease_name(&self.config.lease_name, "provider", provider)
    }

    fn elector(&mut self, name: &str, annotations: BTreeMap<String, String>) -> &mut LeaderElector {
        let (client, config) = (self.client.clone(), &self.config);
        let elector = self.electors.entry(name.to_owned()).or_insert_with(|| {
            let mut c = config.clone();
            c.lease_name = name.to_owned();
            let labels =
                BTreeMap::from([(LABEL_LEASES_OF.to_owned(), leases_of(&config.lease_name))]);
            LeaderElector::new(client, c).with_labels(labels)
        });
        // Only writers say what to write; readers (expiry, release) pass none.
        if !annotations.is_empty() {
            elector.set_annotations(annotations);
        }
        elector
    }
}

impl Shards {
    pub(crate) fn new(
        client: kube::Client,
        metrics: Arc<Metrics>,
        registry: Arc<Registry>,
        tenure: Arc<Tenure>,
        leader_election: Option<LeaderElectionConfig>,
        start_work: StartWork,
    ) -> Shards {
        let leases = leader_election.map(|config| {
            let mut member_config = config.clone();
            member_config.lease_name = lease_name(&config.lease_name, "member", &config.identity);
            let labels =
                BTreeMap::from([(LABEL_LEASES_OF.to_owned(), leases_of(&config.lease_name))]);
            Leases {
                api: Api::namespaced(client.clone(), &config.namespace),
                member: LeaderElector::new(client.clone(), member_config)
                    .with_labels(labels)
                    .with_annotations(BTreeMap::from([
                        (ANNOTATION_PROCESS.to_owned(), process_id().to_owned()),
                        (ANNOTATION_REPLICA.to_owned(), config.identity.clone()),
                    ])),
                client,
                config,
                electors: BTreeMap::new(),
            }
        });
        Shards {
            metrics,
            registry,
            tenure,
            start_work,
            running: BTreeMap::new(),
            leases,
            foreign_said: false,
        }
    }

    /// The tenure for `leader_election`: leased with it, everything without.
    pub(crate) fn tenure_for(leader_election: Option<&LeaderElectionConfig>) -> Tenure {
        match leader_election {
            Some(le) => Tenure::leased(&le.identity),
            None => Tenure::everything(""),
        }
    }

    /// Runs rounds until `stop`, then stops every provider's work and gives its Leases up.
    pub(crate) async fn run(mut self, period: Duration, stop: Signal) {
        let mut stop = std::pin::pin!(stop);
        loop {
            self.round().await;
            tokio::select! {
                () = tokio::time::sleep(period) => {}
                () = self.registry.changed() => {}
                () = &mut stop => break,
            }
        }
        self.give_everything_up().await;
    }

    async fn round(&mut self) {
        let providers: Vec<String> = self.registry.slots().iter().map(|s| s.name()).collect();
        if self.leases.is_some() {
            self.lease_round(&providers).await;
        }
        let held: Vec<String> = providers
            .iter()
            .filter(|p| self.tenure.check(p).is_ok())
            .cloned()
            .collect();
        self.follow(&held).await;
        self.metrics.set_providers_held(held.len());
        self.tenure.announce(held);
        self.tenure.round_done();
    }

    /// Starts the work of providers newly held and stops that of providers no longer held.
    async fn follow(&mut self, held: &[String]) {
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|p| !held.contains(p))
            .cloned()
            .collect();
        for p in gone {
            self.stop_work(&p).await;
        }
        for p in held {
            if !self.running.contains_key(p) {
                let (tx, rx) = signal();
                let task = tokio::spawn((self.start_work)(p.clone(), rx));
                tracing::info!(provider = %p, "provider's work started here");
                self.running.insert(p.clone(), Running { stop: tx, task });
            }
        }
    }

    async fn stop_work(&mut self, provider: &str) {
        let Some(r) = self.running.remove(provider) else {
            return;
        };
        let _ = r.stop.send(());
        let mut task = r.task;
        if tokio::time::timeout(STOP_WORK_GRACE, &mut task)
            .await
            .is_err()
        {
            tracing::warn!(provider, grace = ?STOP_WORK_GRACE, "the provider's work did not stop in time; aborted");
            task.abort();
            // Aborted work runs no further step: awaited, it is over for sure, and only
            // then is the provider's Lease given up.
            let _ = task.await;
        }
        tracing::info!(provider, "provider's work stopped here");
    }

    async fn lease_round(&mut self, providers: &[String]) {
        let Some(leases) = self.leases.as_mut() else {
            return;
        };
        // Taken before anything is read: a renewal lets this replica act for the lease
        // duration (less the margin) from before it was even sent.
        let sent = Instant::now();
        // The leader Lease is read before the replicas' Leases: a replica leads only
        // after its membership Lease exists, so the listing after this read shows it.
        let leader_name = leases.config.lease_name.clone();
        let leader = match leases.api.get_opt(&leader_name).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %leases.member.describe_error(&e), "replicas: cannot read the leader Lease");
                return;
            }
        };
        let selector = format!("{LABEL_LEASES_OF}={}", leases_of(&leases.config.lease_name));
        let listed = match leases
            .api
            .list(&ListParams::default().labels(&selector))
            .await
        {
            Ok(l) => l.items,
            Err(e) => {
                // Nothing renewed: the fence closes by itself when its time is up.
                tracing::warn!(error = %leases.member.describe_error(&e), "replicas: cannot list the Leases");
                return;
            }
        };
        let by_name: BTreeMap<String, Lease> =
            listed.into_iter().map(|l| (l.name_any(), l)).collect();
        let me = leases.config.identity.clone();
        let member_name = leases.member.lease_name().to_owned();
        if let Err(e) = leases
            .member
            .attempt(by_name.get(&member_name).cloned())
            .await
        {
            tracing::warn!(error = %leases.member.describe_error(&e), "replicas: cannot renew this replica's membership");
        }
        let (members, replicas) = Self::members(leases, &by_name, &me, &member_name);
        let (holders, known) = Self::holders(leases, &by_name, providers, &me);
        self.tenure.set_holders(known);
        let foreign = Self::foreign_leader(leases, leader.as_ref(), &replicas);
        let plan = match &foreign {
            // Another operator leads (the Go operator, an older cro): it acts on every
            // device, so no replica here may act on any.
            Some(holder) => {
                if !self.foreign_said {
                    tracing::warn!(leader = %holder, lease = %leases.config.lease_name,
                        "the leader Lease is held by an operator that is not a cro replica: acting for no provider until it is gone");
                }
                shards::Plan {
                    release: holders
                        .iter()
                        .filter(|(_, h)| **h == Holder::Me)
                        .map(|(p, _)| p.clone())
                        .collect(),
                    ..shards::Plan::default()
                }
            }
            None => shards::plan(&View {
                me: &me,
                providers,
                holders: &holders,
                members: &members,
            }),
        };
        self.foreign_said = foreign.is_some();
        let Some(leases) = self.leases.as_mut() else {
            return;
        };
        let valid = leases.config.lease_duration.mul_f64(1.0 - SAFETY);
        let annotations =
            BTreeMap::from([(ANNOTATION_PROCESS.to_owned(), process_id().to_owned())]);
        for p in plan.renew.iter().chain(&plan.acquire) {
            let name = leases.provider_lease(p);
            let mut notes = annotations.clone();
            notes.insert(ANNOTATION_PROVIDER.to_owned(), p.clone());
            let existing = by_name.get(&name).cloned();
            let taking = plan.acquire.contains(p);
            let elector = leases.elector(&name, notes);
            match elector.attempt(existing).await {
                Ok(true) => {
                    self.tenure.hold_until(p, sent + valid);
                    if taking {
                        tracing::info!(provider = %p, "took the provider's Lease");
                    }
                }
                Ok(false) => {
                    if !taking {
                        tracing::warn!(provider = %p, "lost the provider's Lease to another replica");
                    }
                    self.tenure.drop_provider(p);
                }
                // Kept until its time is up: the fence closes by itself.
                Err(e) => {
                    tracing::warn!(provider = %p, error = %elector.describe_error(&e), "cannot renew or take the provider's Lease")
                }
            }
        }
        // Given up last: stopping a provider's work may wait for its reconciles, and the
        // Leases kept must be renewed first, or their fences would lapse meanwhile.
        for p in &plan.release {
            self.stop_work(p).await;
            self.tenure.drop_provider(p);
            let Some(leases) = self.leases.as_mut() else {
                return;
            };
            let name = leases.provider_lease(p);
            let elector = leases.elector(&name, BTreeMap::new());
            match elector.release().await {
                Ok(()) => {
                    tracing::info!(provider = %p, "gave up the provider's Lease (fair share)")
                }
                Err(e) => {
                    tracing::warn!(provider = %p, error = %elector.describe_error(&e), "cannot give up the provider's Lease; it expires")
                }
            }
        }
        // Held here but neither renewed nor taken (a provider that went away): stop.
        for p in providers
            .iter()
            .filter(|p| !plan.renew.contains(p) && !plan.acquire.contains(p))
        {
            self.tenure.drop_provider(p);
        }
    }

    /// The holder of the leader Lease when it is live and not a cro replica (no
    /// membership Lease names it, live or not: a paused cro leader is still one of us):
    /// the Go operator, or a cro from before replicas shared work.
    fn foreign_leader(
        leases: &mut Leases,
        lease: Option<&Lease>,
        replicas: &BTreeSet<String>,
    ) -> Option<String> {
        let name = leases.config.lease_name.clone();
        let seen = leases.elector(&name, BTreeMap::new()).sees(Some(lease?));
        match (seen.holder, seen.expired) {
            (Some(h), false) if !replicas.contains(&h) => Some(h),
            _ => None,
        }
    }

    /// The replicas whose membership Lease this replica has seen renewed within its
    /// duration (this one always), and every replica a membership Lease names, live or
    /// not.
    fn members(
        leases: &mut Leases,
        by_name: &BTreeMap<String, Lease>,
        me: &str,
        member_name: &str,
    ) -> (BTreeSet<String>, BTreeSet<String>) {
        let mut live = BTreeSet::from([me.to_owned()]);
        let mut named = live.clone();
        let prefix = format!("{}-member-", leases.config.lease_name);
        for (name, lease) in by_name {
            if name == member_name || !name.starts_with(&prefix) {
                continue;
            }
            if let Some(replica) = lease.annotations().get(ANNOTATION_REPLICA) {
                named.insert(replica.clone());
            }
            let seen = leases.elector(name, BTreeMap::new()).sees(Some(lease));
            if let Some(holder) = seen.holder {
                if !seen.expired {
                    live.insert(holder.clone());
                }
                named.insert(holder);
            }
        }
        (live, named)
    }

    /// Each provider's holder as this replica judges it, and who the Leases name (with
    /// their processes) for resources made meanwhile.
    fn holders(
        leases: &mut Leases,
        by_name: &BTreeMap<String, Lease>,
        providers: &[String],
        me: &str,
    ) -> (BTreeMap<String, Holder>, BTreeMap<String, LeaseHolder>) {
        let mut holders = BTreeMap::new();
        let mut known = BTreeMap::new();
        for p in providers {
            let name = leases.provider_lease(p);
            let lease = by_name.get(&name);
            let seen = leases.elector(&name, BTreeMap::new()).sees(lease);
            let holder = match (&seen.holder, seen.expired) {
                (Some(h), _) if h == me => Holder::Me,
                (Some(h), false) => Holder::Live(h.clone()),
                _ => Holder::Free,
            };
            if let (Some(h), Some(l)) = (&seen.holder, lease)
                && !seen.expired
            {
                let process = l
                    .annotations()
                    .get(ANNOTATION_PROCESS)
                    .cloned()
                    .unwrap_or_default();
                known.insert(
                    p.clone(),
                    LeaseHolder {
                        identity: h.clone(),
                        process,
                    },
                );
            }
            holders.insert(p.clone(), holder);
        }
        (holders, known)
    }

    /// Stops every provider's work, then gives its Lease and this replica's membership
    /// up, so that the others take over at once rather than after the lease duration.
    async fn give_everything_up(&mut self) {
        let running: Vec<String> = self.running.keys().cloned().collect();
        // All at once: one grace for all, not one per provider.
        let stops: Vec<_> = std::mem::take(&mut self.running).into_iter().collect();
        let mut tasks = Vec::new();
        for (p, r) in stops {
            let _ = r.stop.send(());
            tasks.push((p, r.task));
        }
        let deadline = tokio::time::Instant::now() + STOP_WORK_GRACE;
        for (p, mut task) in tasks {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                tracing::warn!(provider = %p, grace = ?STOP_WORK_GRACE, "the provider's work did not stop in time; aborted");
                task.abort();
                // Aborted work runs no further step: awaited, it is over for sure.
                let _ = task.await;
            }
            self.tenure.drop_provider(&p);
        }
        self.tenure.announce(Vec::new());
        self.metrics.set_providers_held(0);
        let Some(leases) = self.leases.as_mut() else {
            return;
        };
        for p in &running {
            let name = leases.provider_lease(p);
            let elector = leases.elector(&name, BTreeMap::new());
            if let Err(e) = elector.release().await {
                tracing::warn!(provider = %p, error = %elector.describe_error(&e), "cannot give up the provider's Lease; it expires");
            }
        }
        if let Err(e) = leases.member.release().await {
            tracing::warn!(error = %leases.member.describe_error(&e), "cannot end this replica's membership; it expires");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_are_dns_subdomains_told_apart() {
        assert_eq!(
            lease_name("c5744f42.hpsys.ibm.ie.com", "provider", "fti-a"),
            "c5744f42.hpsys.ibm.ie.com-provider-fti-a"
        );
        let odd = lease_name("cro", "member", "Host_Name:1");
        assert!(odd.starts_with("cro-member-host-name-1-"), "{odd}");
        assert_ne!(odd, lease_name("cro", "member", "host-name-1"));
        let long = lease_name("cro", "member", &"x".repeat(300));
        assert!(long.len() <= 253, "{}", long.len());
        assert_eq!(leases_of("cro"), "cro");
        assert!(leases_of(&"y".repeat(64)).len() <= 63);
    }
}

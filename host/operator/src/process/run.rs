//! Starting the operator: probes, webhook, leader election, the two controllers and the
//! upstream sync, until shutdown or loss of leadership.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use cro_api::ComposabilityRequest;
use kube::api::{Api, ListParams};
use tokio::task::JoinSet;

use futures::FutureExt;

use super::leader::{self, Leadership};
use super::shards::{Shards, StartWork};
use super::signals::{Signal, shutdown_signal, signal};
use crate::config::{OperatorConfig, ProviderSource, WebhookCerts};
use crate::controllers::{binding, pool, request, resource, routing, sync};
use crate::error::OperatorError;
use crate::metrics::Metrics;
use crate::nodeops::dra::DraApis;
use crate::nodeops::{CommandRunner, ExposureMode, KubeExecRunner};
use crate::plumbing::context::Context;
use crate::provider::DeviceProvider;
use crate::provider::credentials::NamingSecret;
use crate::provider::node_cache::NodeCache;
use crate::provider::tenure::{Tenure, TenureCell};
use crate::registry;
use crate::registry::spec::load_provider;
use crate::registry::watch::WatchOptions;
use crate::registry::{IMPLICIT_PROVIDER, Registry};
use crate::serve::certs::{self, ReloadingCert};
use crate::serve::probes::{ProbeServer, Readiness};
use crate::serve::webhook::{WebhookServer, WebhookTls};

/// How often mounted certificate files are compared with the ones in use.
const CERT_FILE_CHECK: std::time::Duration = std::time::Duration::from_secs(10);
/// How long the controllers wait for the watch caches' first listing before they start
/// anyway (their reads then fall back to asking the API server, crate::plumbing::cache).
const CACHES_FIRST_LISTING: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a stopping operator waits for its controllers' reconciles in flight: under
/// the 30 s grace period Kubernetes gives a pod by default.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(20);

/// The operator with its parts chosen: tests give it their own client, provider and
/// command runner; [`run`] gives it the real ones.
pub struct Operator {
    client: kube::Client,
    runner: Arc<dyn CommandRunner>,
    config: OperatorConfig,
    metrics: Arc<Metrics>,
    ready: Arc<Readiness>,
    webhook: Option<WebhookServer>,
    probes: Option<ProbeServer>,
    health: Option<ProbeServer>,
    /// Providers from `CdiProvider` objects, kept current while the operator leads.
    objects: Option<(Arc<Registry>, WatchOptions)>,
    /// Every provider by name: the free pool is read per provider.
    registry: Arc<Registry>,
    /// Where the providers' cluster views look Nodes up first: the operator lends its
    /// Node cache there when its caches start (crate::provider::node_cache).
    nodes: NodeCache,
}

impl Operator {
    pub fn new(
        client: kube::Client,
        provider: Arc<dyn DeviceProvider>,
        runner: Arc<dyn CommandRunner>,
        config: OperatorConfig,
    ) -> Self {
        Self::new_in(client, provider, runner, config, TenureCell::default())
    }

    /// [`Operator::new`] whose tenure goes in `tenure`, where the provider's fence reads it.
    fn new_in(
        client: kube::Client,
        provider: Arc<dyn DeviceProvider>,
        runner: Arc<dyn CommandRunner>,
        config: OperatorConfig,
        tenure: TenureCell,
    ) -> Self {
        let provider: Arc<dyn DeviceProvider> = match &config.credentials {
            Some(secret) => Arc::new(NamingSecret::new(provider, secret.clone())),
            None => provider,
        };
        // `--provider-spec` or the Go environment: one implicit provider serving every
        // node, under its name in logs (crate::registry).
        let registry = Registry::single_in(IMPLICIT_PROVIDER, provider, tenure);
        Self::with_provider(client, registry, runner, config, NodeCache::default())
    }

    /// The provider's Node lookups through `nodes` (the handle its cluster view was
    /// built with, [`crate::RememberingCluster::of_api_server`]) are answered from this
    /// operator's Node cache while it runs.
    pub fn serving_node_lookups(mut self, nodes: NodeCache) -> Self {
        self.nodes = nodes;
        self
    }

    /// The operator running the providers of the cluster's `CdiProvider` objects.
    pub fn for_objects(
        client: kube::Client,
        runner: Arc<dyn CommandRunner>,
        config: OperatorConfig,
        fetch: crate::source::FetchOptions,
    ) -> Self {
        let nodes = NodeCache::default();
        let registry = Registry::for_objects(nodes.clone());
        let options = WatchOptions {
            fetch,
            allowed_secret_namespaces: config.secret_namespaces(),
            resync: config.timings.sync_period,
            controller_name: config.controller_name.clone(),
        };
        let mut operator = Self::with_provider(client, registry.clone(), runner, config, nodes);
        operator.objects = Some((registry, options));
        operator
    }

    fn with_provider(
        client: kube::Client,
        registry: Arc<Registry>,
        runner: Arc<dyn CommandRunner>,
        config: OperatorConfig,
        nodes: NodeCache,
    ) -> Self {
        let metrics = Arc::new(Metrics::new());
        let routed = registry.clone();
        metrics.watch_routed_calls(move || {
            routed
                .slots()
                .iter()
                .map(|s| {
                    let (calls, failed) = s.counts();
                    (s.name(), calls, failed)
                })
                .collect()
        });
        let provider: Arc<dyn DeviceProvider> = registry.clone();
        let counted = provider.clone();
        metrics.watch_denials(move || counted.counters().map(|c| c.denials));
        let counted = provider.clone();
        metrics.watch_budgets(move || counted.counters().map(|c| (c.provider, c.budgets)));
        metrics.watch_provider_warnings(move || provider.counters().map(|c| c.warnings));
        Self {
            client,
            runner,
            config,
            metrics,
            ready: Arc::new(Readiness::default()),
            webhook: None,
            probes: None,
            health: None,
            objects: None,
            registry,
            nodes,
        }
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    pub fn readiness(&self) -> Arc<Readiness> {
        self.ready.clone()
    }

    /// The address of the separate health-probe listener, once bound.
    pub fn health_addr(&self) -> Option<std::net::SocketAddr> {
        self.health.as_ref().and_then(|h| h.local_addr().ok())
    }

    /// Binds the listeners of the configuration now (so their addresses are known
    /// before [`Operator::run_until`]); returns the bound addresses (probes, webhook).
    pub async fn bind(
        &mut self,
    ) -> Result<(Option<std::net::SocketAddr>, Option<std::net::SocketAddr>), OperatorError> {
        if self.probes.is_none()
            && let Some(addr) = self.config.metrics_addr
        {
            self.probes = Some(if self.config.metrics_secure {
                ProbeServer::bind_secure(addr, self.client.clone()).await?
            } else {
                ProbeServer::bind(addr).await?
            });
        }
        if self.health.is_none()
            && let Some(addr) = self.config.probe_addr
        {
            self.health = Some(ProbeServer::bind(addr).await?);
        }
        if self.webhook.is_none()
            && let Some(w) = &self.config.webhook
        {
            let tls = match &w.certs {
                WebhookCerts::Files {
                    cert_file,
                    key_file,
                } => WebhookTls::from_files(cert_file, key_file)?,
                WebhookCerts::SelfManaged(_) => {
                    WebhookTls::reloading(Arc::new(ReloadingCert::default()))?
                }
            };
            let server = WebhookServer::bind(w.addr, tls).await?;
            self.webhook = Some(if self.config.provider == ProviderSource::Objects {
                server.with_providers()
            } else {
                server
            });
        }
        let probes = self.probes.as_ref().map(|p| p.local_addr()).transpose()?;
        let webhook = self.webhook.as_ref().map(|w| w.local_addr()).transpose()?;
        Ok((probes, webhook))
    }

    /// One line with every address and mode, so a log shows how this replica serves.
    fn log_start_line(&self) {
        let addr =
            |a: Option<std::net::SocketAddr>| a.map_or_else(|| "off".to_owned(), |a| a.to_string());
        let probes = self.probes.as_ref().and_then(|p| p.local_addr().ok());
        let webhook = self.webhook.as_ref().and_then(|w| w.local_addr().ok());
        let webhook_certs = match self.config.webhook.as_ref().map(|w| &w.certs) {
            None => "off",
            Some(WebhookCerts::Files { .. }) => "files",
            Some(WebhookCerts::SelfManaged(_)) => "self-managed",
        };
        let leader = self.config.leader_election.as_ref().map_or_else(
            || "off".to_owned(),
            |l| format!("Lease {}/{}", l.namespace, l.lease_name),
        );
        tracing::info!(
            metrics_and_probes = %addr(probes),
            metrics_https = self.config.metrics_secure,
            health_probes = %addr(self.health_addr()),
            webhook = %addr(webhook),
            webhook_certs = %webhook_certs,
            leader_election = %leader,
            exposure = %self.config.mode.as_str(),
            namespace = %self.config.namespace,
            "cro starting"
        );
        // Said apart from "webhook=off": the certificate settings may ask for a webhook
        // that the Go operator's switch overrides, which would otherwise puzzle a reader.
        if self.config.webhook_disabled_by_env {
            tracing::info!(
                "ENABLE_WEBHOOKS=false: the webhook is off, whatever its certificate settings say"
            );
        }
    }

    /// Runs until `shutdown` resolves (Ok) or the operator cannot go on (Err: lost
    /// leadership, a listener failed, the CRDs are missing).
    pub async fn run_until(
        mut self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), OperatorError> {
        self.bind().await?;
        self.log_start_line();
        check_crds(&self.client).await?;
        let dra = discover_dra(&self.client, self.config.mode).await?;

        let (stop_tx, stop) = signal();
        let mut shutdown = std::pin::pin!(shutdown);
        let mut background = tokio::task::JoinSet::new();
        self.start_servers(&mut background, &stop).await?;
        // A standby serves probes and the webhook: it is ready, just not leading.
        self.ready.set(true);

        // Which providers this replica acts for: all of them alone, those whose Leases
        // it holds among several (crate::process::shards).
        let tenure = Arc::new(Shards::tenure_for(self.config.leader_election.as_ref()));
        self.registry.set_tenure(tenure.clone());
        let ctx = Arc::new(Context::new(
            self.client.clone(),
            self.registry.clone(),
            self.runner.clone(),
            self.config.clone(),
            self.metrics.clone(),
            dra,
        ));
        // A JoinSet aborts its tasks when dropped: if this future is dropped (the
        // process is going down), no controller keeps running on its own.
        let mut workers = tokio::task::JoinSet::new();
        self.start_watches(&ctx, &mut workers, &stop);
        // The controllers start once the caches hold their first listing. Started
        // together, a reconcile that won the race against the caches' listings (often,
        // on a loaded machine) read through the fallback: a LIST of every Node and
        // request and a LIST by label per request reconcile until the caches were up.
        let stopped_early = tokio::select! {
            () = caches_listed(&ctx.caches) => false,
            () = &mut shutdown => true,
        };
        let mut leadership = None;
        let outcome = if stopped_early {
            Ok(())
        } else {
            start_replica_work(&ctx, &self.registry, tenure.clone(), &mut workers, &stop);
            match self.lead(&tenure, shutdown.as_mut()).await {
                Led::Leading(l) => {
                    leadership = l;
                    start_leader_work(&ctx, &mut workers, &stop);
                    until_stopped(shutdown.as_mut(), leadership.as_mut(), &mut background).await
                }
                Led::ShutDown => Ok(()),
                Led::Failed(e) => Err(e),
            }
        };
        self.ready.set(false);
        let _ = stop_tx.send(());
        wind_down(workers, background, leadership).await;
        match &outcome {
            Ok(()) => tracing::info!("operator stopped"),
            Err(e) => tracing::error!(error = %e, "operator stopped"),
        }
        outcome
    }

    /// Waits until this replica leads (at once without leader election), or shutdown.
    async fn lead<F: Future<Output = ()>>(&self, tenure: &Tenure, shutdown: Pin<&mut F>) -> Led {
        let Some(le) = self.config.leader_election.clone() else {
            return Led::Leading(None);
        };
        let metrics = self.metrics.clone();
        let client = self.client.clone();
        // Only once this replica's membership Lease is written: the other replicas then
        // know the leader as one of them, not as a foreign operator.
        let acquired = async move {
            tenure.after_first_round().await;
            leader::acquire(client, le, move |leading| metrics.set_leader(leading)).await
        };
        tokio::select! {
            l = acquired => match l {
                Ok(l) => Led::Leading(Some(l)),
                Err(e) => Led::Failed(e),
            },
            () = shutdown => Led::ShutDown,
        }
    }

    /// Starts serving probes, health probes and the webhook (with what keeps its
    /// certificate current); a self-managed certificate is issued before this returns.
    async fn start_servers(
        &mut self,
        background: &mut Servers,
        stop: &Signal,
    ) -> Result<(), OperatorError> {
        if let Some(probes) = self.probes.take() {
            let (m, r, s) = (self.metrics.clone(), self.ready.clone(), stop.clone());
            background.spawn(async move { probes.serve(m, r, s).await.map(|()| "probes") });
        }
        if let Some(health) = self.health.take() {
            let (m, r, s) = (self.metrics.clone(), self.ready.clone(), stop.clone());
            background.spawn(async move { health.serve(m, r, s).await.map(|()| "health probes") });
        }
        if let (Some(webhook), Some(w)) = (&self.webhook, &self.config.webhook) {
            let resolver = webhook.tls().resolver();
            match w.certs.clone() {
                WebhookCerts::Files {
                    cert_file,
                    key_file,
                } => {
                    let s = stop.clone();
                    background.spawn(async move {
                        certs::watch_files(cert_file, key_file, resolver, CERT_FILE_CHECK, s).await;
                        Ok("webhook certificate reloader")
                    });
                }
                WebhookCerts::SelfManaged(cfg) => {
                    // A certificate before the first review; later rounds in the background.
                    certs::reconcile_once(&self.client, &cfg, &resolver)
                        .await
                        .map_err(|e| OperatorError::Webhook(e.to_string()))?;
                    let (c, s) = (self.client.clone(), stop.clone());
                    background.spawn(async move {
                        certs::run(c, cfg, resolver, s).await;
                        Ok("webhook certificate manager")
                    });
                }
            }
        }
        if let Some(webhook) = self.webhook.take() {
            let (c, m, s) = (self.client.clone(), self.metrics.clone(), stop.clone());
            background.spawn(async move {
                webhook.serve(c, m, s).await;
                Ok("webhook")
            });
        }
        Ok(())
    }

    /// Starts the watch caches and, with `CdiProvider` objects, the watch that keeps the
    /// providers current.
    fn start_watches(&mut self, ctx: &Context, workers: &mut JoinSet<()>, stop: &Signal) {
        // The device plugin DaemonSets are restarted (and so read) in device-plugin
        // mode only.
        let daemon_sets = (ctx.config.mode == ExposureMode::DevicePlugin)
            .then_some(ctx.config.gpu_operator_namespace.as_str());
        let caches = ctx.caches.run(self.client.clone(), daemon_sets);
        let cache_stop = stop.clone();
        workers.spawn(async move {
            tokio::select! { () = caches => {}, () = cache_stop => {} }
        });
        // The providers' Node lookups and routing by node labels read this cache (for
        // `CdiProvider` objects both handles are the registry's), and routing by the
        // resources' provider labels the resource cache.
        self.nodes.serve_from(ctx.caches.node_store());
        if let Some(routing) = self.registry.node_cache() {
            routing.serve_from(ctx.caches.node_store());
        }
        if let Some(routing) = self.registry.resource_cache() {
            routing.serve_from(ctx.caches.resource_store());
        }
        if let Some((registry, options)) = self.objects.take() {
            let (c, s) = (self.client.clone(), stop.clone());
            workers.spawn(async move {
                tokio::select! { () = registry::watch::run(registry, c, options) => {}, () = s => {} }
            });
        }
    }
}

/// The tasks serving clients; each ends with what it was, or why it failed.
type Servers = JoinSet<Result<&'static str, OperatorError>>;

/// Fails unless the API server serves ComposabilityRequests (the CRDs are installed).
async fn check_crds(client: &kube::Client) -> Result<(), OperatorError> {
    let crd_probe: Api<ComposabilityRequest> = Api::all(client.clone());
    match crd_probe.list(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(ae)) if ae.code == 404 => Err(OperatorError::MissingCrds(ae.message)),
        Err(other) => Err(OperatorError::Kube(other)),
    }
}

/// The DRA APIs, when GPUs are exposed through DRA.
async fn discover_dra(
    client: &kube::Client,
    mode: ExposureMode,
) -> Result<Option<DraApis>, OperatorError> {
    match mode {
        ExposureMode::DevicePlugin => Ok(None),
        ExposureMode::Dra => DraApis::discover(client)
            .await
            .map(Some)
            .map_err(|e| OperatorError::Config(e.to_string())),
    }
}

/// How waiting for leadership ended.
enum Led {
    /// Leading (None: no leader election, this replica is alone).
    Leading(Option<Leadership>),
    ShutDown,
    Failed(OperatorError),
}

/// Starts what every replica runs over the providers whose Leases it holds: the
/// provider Leases themselves, with each held provider's resource controller, the
/// upstream sync and the free pool (docs/ARCHITECTURE.md, "Replicas").
fn start_replica_work(
    ctx: &Arc<Context>,
    registry: &Arc<Registry>,
    tenure: Arc<Tenure>,
    workers: &mut JoinSet<()>,
    stop: &Signal,
) {
    let work_ctx = ctx.clone();
    let start_work: StartWork = Arc::new(move |provider: String, stop: Signal| {
        let ctx = work_ctx.clone();
        async move { resource::controller(ctx, &provider, stop).await }.boxed()
    });
    let le = ctx.config.leader_election.clone();
    let period = le
        .as_ref()
        .map_or(ctx.config.timings.poll_interval, |l| l.renew_period);
    let shards = Shards::new(
        ctx.client.clone(),
        ctx.metrics.clone(),
        registry.clone(),
        tenure,
        le,
        start_work,
    );
    workers.spawn(shards.run(period, stop.clone()));
    let (sync_ctx, sync_stop) = (ctx.clone(), stop.clone());
    workers.spawn(async move { sync::run(&sync_ctx, sync_stop).await });
    let (pool_ctx, pool_registry, pool_stop) = (ctx.clone(), registry.clone(), stop.clone());
    workers.spawn(async move { pool::run(&pool_ctx, &pool_registry, pool_stop).await });
    tracing::info!(exposure = %ctx.config.mode.as_str(), "replica running: provider Leases, upstream sync and free pool started");
}

/// Starts what only the leader runs, because it decides over the whole cluster at once:
/// the request controller (placing devices on nodes of every provider), the binding of
/// claims, and the routing of unlabelled resources.
fn start_leader_work(ctx: &Arc<Context>, workers: &mut JoinSet<()>, stop: &Signal) {
    workers.spawn(request::controller(ctx.clone(), stop.clone()));
    let (bind_ctx, bind_stop) = (ctx.clone(), stop.clone());
    workers.spawn(async move { binding::run(&bind_ctx, bind_stop).await });
    let (route_ctx, route_stop) = (ctx.clone(), stop.clone());
    workers.spawn(async move { routing::run(&route_ctx, route_stop).await });
    tracing::info!("leading: request controller, claim binding and routing started");
}

/// Waits for the end: `shutdown` (Ok), the leader Lease lost, or a server that stopped.
async fn until_stopped<F: Future<Output = ()>>(
    shutdown: Pin<&mut F>,
    leadership: Option<&mut Leadership>,
    background: &mut Servers,
) -> Result<(), OperatorError> {
    let lost = async {
        match leadership {
            Some(l) => l.lost().await,
            None => futures::future::pending().await,
        }
    };
    tokio::select! {
        () = shutdown => Ok(()),
        () = lost => Err(OperatorError::Leadership("lost the leader Lease".into())),
        Some(ended) = background.join_next() => match ended {
            Ok(Ok(what)) => Err(OperatorError::Stopped(what)),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(OperatorError::Config(format!("a server task failed: {e}"))),
        },
    }
}

/// Once told to stop: the controllers finish their reconciles in flight, the servers
/// stop, the Lease is released.
async fn wind_down(
    mut workers: JoinSet<()>,
    mut background: Servers,
    leadership: Option<Leadership>,
) {
    // A bounded wait, because a process told to stop must stop (Kubernetes kills it
    // after its grace period anyway). Stopping mid-step is safe: every plan is stored
    // before it is acted on.
    let drained = tokio::time::timeout(STOP_GRACE, async {
        while workers.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(grace = ?STOP_GRACE, "controllers did not stop in time; aborting them");
        workers.shutdown().await;
    }
    while background.join_next().await.is_some() {}
    if let Some(l) = leadership {
        l.release().await;
    }
}

/// Returns once every watch cache has listed its kind once, or after
/// [`CACHES_FIRST_LISTING`] (an API server that refuses or stalls the lists: the
/// controllers then run on the readers' fallback rather than not at all).
async fn caches_listed(caches: &crate::plumbing::cache::Caches) {
    let deadline = tokio::time::Instant::now() + CACHES_FIRST_LISTING;
    while caches.nodes().is_none() || caches.requests().is_none() || caches.resources().is_none() {
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                waited = ?CACHES_FIRST_LISTING,
                "the watch caches have not listed yet: starting the controllers on direct reads"
            );
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// What `cro run` calls: the in-cluster (or kubeconfig) client, the configured provider,
/// commands through `pods/exec`; runs until SIGINT/SIGTERM.
pub async fn run(mut config: OperatorConfig) -> Result<(), OperatorError> {
    // kube's rustls needs a process-wide provider; ring is the one this project builds.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = kube::Client::try_default().await?;
    let runner = Arc::new(KubeExecRunner::new(client.clone()));
    if config.provider == ProviderSource::Objects {
        return Operator::for_objects(client, runner, config, Default::default())
            .run_until(shutdown_signal())
            .await;
    }
    // The provider's fence reads the tenure the operator puts here when it starts.
    let tenure = TenureCell::default();
    let nodes = NodeCache::default();
    let provider = load_provider(
        &mut config,
        client.clone(),
        tenure.fence(IMPLICIT_PROVIDER),
        nodes.clone(),
    )
    .await?;
    Operator::new_in(client, provider, runner, config, tenure)
        .serving_node_lookups(nodes)
        .run_until(shutdown_signal())
        .await
}

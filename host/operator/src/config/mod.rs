//! The operator's configuration: from flags and environment (`cro run`), or built
//! directly by tests.

pub mod compat;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::nodeops::ExposureMode;
use crate::nodeops::plugins::DEFAULT_GPU_OPERATOR_NAMESPACE;

/// Where controller-runtime (the Go operator) finds the webhook's `tls.crt` and `tls.key`
/// when no flag names them; the Go manifests mount cert-manager's Secret there.
pub(crate) const GO_WEBHOOK_CERT_DIR: &str = "/tmp/k8s-webhook-server/serving-certs";
pub(crate) const DEFAULT_NAMESPACE: &str = "composable-resource-operator-system";
/// The Go operator's leader-election id: sharing its Lease means a cro replica never acts
/// while a Go replica leads during a rollout (docs/migrating.md).
pub const DEFAULT_LEASE_NAME: &str = "c5744f42.hpsys.ibm.ie.com";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("DEVICE_RESOURCE_TYPE must be DEVICE_PLUGIN or DRA, not {0:?}")]
    BadMode(String),
    #[error("bad duration {0:?}: use a number with ms, s, m or h (e.g. 30s, 10m)")]
    BadDuration(String),
    #[error("duration {0:?} has no unit: write {0}s for seconds (or {0}ms, {0}m, {0}h)")]
    NoUnit(String),
    /// A setting's value was refused; names the flag and its environment variable.
    #[error("{setting}: {source}")]
    Setting {
        setting: &'static str,
        source: Box<ConfigError>,
    },
    #[error("{0}")]
    Invalid(String),
}

/// Parses `250ms`, `30s`, `10m` or `1h`. A bare number is refused (`0` aside): whether
/// `--sync-period 20` meant seconds or minutes is the reader's guess, as in Go's
/// `time.ParseDuration`.
pub fn parse_duration(text: &str) -> Result<Duration, ConfigError> {
    let t = text.trim();
    let bad = || ConfigError::BadDuration(text.to_owned());
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let d = match unit.trim() {
        "" if n == 0 => Duration::ZERO,
        "" => return Err(ConfigError::NoUnit(t.to_owned())),
        "s" => Duration::from_secs(n),
        "ms" => Duration::from_millis(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(bad)?),
        "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(bad)?),
        _ => return Err(bad()),
    };
    Ok(d)
}

const SYNC_PERIOD: &str = "--sync-period (CRO_SYNC_PERIOD)";
const ORPHAN_GRACE_PERIOD: &str = "--orphan-grace-period (CRO_ORPHAN_GRACE_PERIOD)";
const POOL_PERIOD: &str = "--pool-period (CRO_POOL_PERIOD)";

/// One `--pool-devices` entry, `TYPE=MODEL`.
fn pool_device(text: &str) -> Result<cro_runtime::PoolKind, ConfigError> {
    let bad = |why: &str| {
        ConfigError::Invalid(format!(
            "--pool-devices (CRO_POOL_DEVICES) entry {text:?}: {why}; write TYPE=MODEL, \
             TYPE gpu or cxlmemory, entries separated by ';'"
        ))
    };
    let (kind, model) = text.split_once('=').ok_or_else(|| bad("no '='"))?;
    let device_type = match kind.trim() {
        "gpu" => cro_runtime::DeviceType::Gpu,
        "cxlmemory" => cro_runtime::DeviceType::CxlMemory,
        other => return Err(bad(&format!("unknown type {other:?}"))),
    };
    let model = model.trim();
    if model.is_empty() {
        return Err(bad("no model"));
    }
    Ok(cro_runtime::PoolKind {
        device_type,
        model: model.to_owned(),
    })
}
const HEALTH_CHECK_PERIOD: &str = "--health-check-period (CRO_HEALTH_CHECK_PERIOD)";
const POLL_INTERVAL: &str = "--poll-interval (CRO_POLL_INTERVAL)";
const MAX_BACKOFF: &str = "--max-backoff (CRO_MAX_BACKOFF)";
/// See [`OperatorConfig::max_concurrent_reconciles`].
pub(crate) const DEFAULT_MAX_CONCURRENT_RECONCILES: u16 = 32;
const CA_VALIDITY: &str = "--webhook-ca-validity (CRO_WEBHOOK_CA_VALIDITY)";
const CERT_VALIDITY: &str = "--webhook-cert-validity (CRO_WEBHOOK_CERT_VALIDITY)";
const EXTRA_NAMES: &str = "--webhook-extra-names (CRO_WEBHOOK_EXTRA_NAMES)";

/// [`parse_duration`] of one setting; an error names the setting.
fn setting_duration(text: &str, setting: &'static str) -> Result<Duration, ConfigError> {
    parse_duration(text).map_err(|e| ConfigError::Setting {
        setting,
        source: Box::new(e),
    })
}

pub(crate) fn parse_mode(text: &str) -> Result<ExposureMode, ConfigError> {
    match text.trim() {
        "" | "DEVICE_PLUGIN" => Ok(ExposureMode::DevicePlugin),
        "DRA" => Ok(ExposureMode::Dra),
        other => Err(ConfigError::BadMode(other.to_owned())),
    }
}

/// Timings of the controllers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timings {
    /// How often the fabric is asked for every device (the upstream sync).
    pub sync_period: Duration,
    /// How long a device may stay unclaimed before it is detached (the upstream sync).
    pub orphan_grace: Duration,
    /// How often an Online device is health-checked.
    pub health_period: Duration,
    /// How soon a step that waits on something outside Kubernetes (a fabric operation
    /// in progress, a GPU appearing on a node) looks again.
    pub poll_interval: Duration,
    /// How long after making a node rescan it is asked again while the device is still
    /// not visible.
    pub rescan_interval: Duration,
    /// First retry delay after an error; doubles per consecutive error.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// How long a wait of an attach on its node (the driver, the GPU) lasts before the
    /// resource's Ready condition says so; 8 times this is how long a request's
    /// `status.resources` may lag its devices' progress while the request's state stays
    /// (30 times while it is Cleaning): progress seen within it is written together,
    /// usually with the request's next state (a change of the request's state or error,
    /// or of a device's error, is written at once).
    pub mirror_delay: Duration,
    /// How often each provider's free pool is read and its ResourceSlices brought up to
    /// date: a slice lags the fabric by at most this plus one pool read (docs/dra.md).
    pub pool_period: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            sync_period: Duration::from_secs(60),
            orphan_grace: Duration::from_secs(600),
            health_period: Duration::from_secs(60),
            poll_interval: Duration::from_secs(5),
            rescan_interval: Duration::from_secs(30),
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            mirror_delay: Duration::from_secs(2),
            pool_period: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    pub addr: SocketAddr,
    pub certs: WebhookCerts,
}

/// Where the webhook's serving certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookCerts {
    /// PEM files (cert-manager's Secret mounted into the pod); reloaded when they change.
    Files {
        cert_file: PathBuf,
        key_file: PathBuf,
    },
    /// The operator's own CA and certificate in a Secret, injected into the webhook
    /// configuration and renewed before expiry.
    SelfManaged(SelfManagedCerts),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderElectionConfig {
    pub namespace: String,
    pub lease_name: String,
    /// This instance's name in the Lease (pod name, or host name and a random suffix).
    pub identity: String,
    pub lease_duration: Duration,
    /// How often the holder renews.
    pub renew_period: Duration,
}

impl LeaderElectionConfig {
    pub fn new(namespace: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            lease_name: DEFAULT_LEASE_NAME.to_owned(),
            identity: identity.to_owned(),
            lease_duration: Duration::from_secs(15),
            renew_period: Duration::from_secs(5),
        }
    }
}

/// Where the provider comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderSource {
    /// A provider spec file (component path, grants, limits, configuration).
    SpecFile(PathBuf),
    /// The Go operator's environment (`CDI_PROVIDER_TYPE=FTI_CDI` and friends).
    GoEnvironment,
    /// `CdiProvider` objects (crate::registry): several providers, routed by node.
    Objects,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorConfig {
    pub mode: ExposureMode,
    pub gpu_operator_namespace: String,
    pub timings: Timings,
    pub provider: ProviderSource,
    /// `/metrics`, `/healthz`, `/readyz`; None disables the listener.
    pub metrics_addr: Option<SocketAddr>,
    /// A second listener serving the same paths, for manifests that probe another port
    /// than they scrape (the Go operator's `--health-probe-bind-address`).
    pub probe_addr: Option<SocketAddr>,
    /// The metrics listener speaks HTTPS and `/metrics` needs a token allowed
    /// `get /metrics` (the Go operator's `--metrics-secure`).
    pub metrics_secure: bool,
    pub webhook: Option<WebhookConfig>,
    /// The webhook is off because `ENABLE_WEBHOOKS=false` (the Go operator's switch), not
    /// for want of certificates: said once in the start-up log.
    pub webhook_disabled_by_env: bool,
    pub leader_election: Option<LeaderElectionConfig>,
    /// Name in Events' reporting controller.
    pub controller_name: String,
    /// The operator's namespace, where the node agent DaemonSet for host drivers lives.
    pub namespace: String,
    /// Whether the upstream sync also releases CXL memory no resource holds (the Go
    /// operator released only GPUs; docs/differences-from-go.md).
    pub release_orphan_cxl_memory: bool,
    /// The Secret the provider spec grants: credential failures name it
    /// (crate::provider::credentials). Set when the provider is loaded.
    pub credentials: Option<cro_runtime::grants::SecretGrant>,
    /// Namespaces a `CdiProvider` may grant a Secret from; empty means `namespace` only.
    pub provider_secret_namespaces: Vec<String>,
    /// Reconciliations each controller runs at once (never two of one object). Unbounded,
    /// a burst of a thousand new requests ran thousands of reconciliations at once, each
    /// with its own API connection and buffers: memory grew with the burst
    /// (docs/BENCHMARKS.md). Most of a reconciliation waits (API round trips, the fabric,
    /// a node's lock), so a few dozen keep the provider's calls and the API server busy.
    pub max_concurrent_reconciles: u16,
    /// The device kinds offered to the scheduler as DRA ResourceSlices from each
    /// provider's free pool (docs/dra.md); empty publishes none.
    pub pool_devices: Vec<cro_runtime::PoolKind>,
}

impl OperatorConfig {
    pub fn new(provider: ProviderSource) -> Self {
        Self {
            mode: ExposureMode::DevicePlugin,
            gpu_operator_namespace: DEFAULT_GPU_OPERATOR_NAMESPACE.to_owned(),
            timings: Timings::default(),
            provider,
            metrics_addr: None,
            probe_addr: None,
            metrics_secure: false,
            webhook: None,
            webhook_disabled_by_env: false,
            leader_election: None,
            max_concurrent_reconciles: DEFAULT_MAX_CONCURRENT_RECONCILES,
            controller_name: "cro-operator".to_owned(),
            namespace: DEFAULT_NAMESPACE.to_owned(),
            release_orphan_cxl_memory: false,
            credentials: None,
            provider_secret_namespaces: Vec::new(),
            pool_devices: Vec::new(),
        }
    }

    /// Namespaces a `CdiProvider` may grant a Secret from.
    pub(crate) fn secret_namespaces(&self) -> Vec<String> {
        if self.provider_secret_namespaces.is_empty() {
            vec![self.namespace.clone()]
        } else {
            self.provider_secret_namespaces.clone()
        }
    }
}

/// Lifetimes of the self-managed webhook certificates (crate::serve::certs) and how
/// often their state is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CertPolicy {
    pub ca_validity: Duration,
    pub serving_validity: Duration,
    /// How often the Secret and the webhook configuration are looked at; also how long a
    /// successor CA is in the bundle before it signs anything.
    pub check_period: Duration,
}

impl Default for CertPolicy {
    fn default() -> Self {
        Self {
            ca_validity: Duration::from_secs(5 * 365 * 24 * 3600),
            serving_validity: Duration::from_secs(90 * 24 * 3600),
            check_period: Duration::from_secs(60),
        }
    }
}

/// Where the certificates live and whom they serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelfManagedCerts {
    pub namespace: String,
    pub secret_name: String,
    /// The ValidatingWebhookConfiguration whose webhooks get the CA bundle.
    pub webhook_configuration: String,
    /// Names in the serving certificate (the Service's DNS names, or an IP for tests).
    pub dns_names: Vec<String>,
    pub policy: CertPolicy,
}

/// Environment variables `cro run` reads besides the flags' own (listed in its help).
pub(crate) const RUN_ENVIRONMENT_HELP: &str = "\
Environment variables besides the flags' own:
  RUST_LOG                   log filter (default: info), e.g. cro_operator=debug,kube=warn
  CRO_LOG_FORMAT             json: one JSON object per line; otherwise text
  NO_COLOR                   set: no colour codes even on a terminal (never when not a terminal)
  POD_NAME                   this replica's name in the leader Lease and in Events
  HOSTNAME                   the Lease identity when POD_NAME is not set
The Go operator's environment (when --provider-spec / CRO_PROVIDER_SPEC is not set):
  CDI_PROVIDER_TYPE          FTI_CDI runs the shipped FTI component
  FTI_CDI_API_TYPE           FM (default) or CM
  FTI_CDI_ENDPOINT           the fabric manager, host:port/ (HTTPS implied) or a URL
  FTI_CDI_TENANT_ID          the fabric tenant
  FTI_CDI_CLUSTER_ID         the CM cluster (required with CM)
  CRO_FTI_COMPONENT          the FTI component file (default /opt/cro/providers/fti_provider.wasm)
  CRO_FTI_CA_FILE            PEM CA the fabric's HTTPS certificate is checked against
  CRO_FTI_CALL_TIMEOUT       deadline of one provider call (default 240s)
  CRO_CREDENTIALS_NAMESPACE  namespace of the Secret `credentials` (default composable-resource-operator-system)
Durations take a unit: 250ms, 30s, 10m, 1h.";

/// `cro run`'s flags; every flag can also come from the environment variable named.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = RUN_ENVIRONMENT_HELP)]
pub struct RunArgs {
    /// How GPUs are exposed to pods: DEVICE_PLUGIN or DRA.
    #[arg(long, env = "DEVICE_RESOURCE_TYPE", default_value = "DEVICE_PLUGIN")]
    pub device_resource_type: String,
    /// Namespace of the NVIDIA GPU operator (device plugin and DCGM daemonsets).
    #[arg(long, env = "NVIDIA_GPU_OPERATOR_NAMESPACE", default_value = DEFAULT_GPU_OPERATOR_NAMESPACE)]
    pub gpu_operator_namespace: String,
    /// Provider spec file (component and grants). Without it, the Go operator's
    /// variables (CDI_PROVIDER_TYPE=FTI_CDI, FTI_CDI_*) select the shipped FTI component.
    #[arg(long, env = "CRO_PROVIDER_SPEC", conflicts_with = "provider_objects")]
    pub provider_spec: Option<PathBuf>,
    /// Run the providers the cluster's `CdiProvider` objects define (several fabrics,
    /// routed by node selector, reloaded on change) instead of one from a spec file or
    /// the Go environment.
    #[arg(long, env = "CRO_PROVIDER_OBJECTS", default_value_t = false, action = clap::ArgAction::Set)]
    pub provider_objects: bool,
    /// Namespaces a `CdiProvider` may grant a Secret from (comma-separated); by default
    /// only the operator's own namespace.
    #[arg(long, env = "CRO_PROVIDER_SECRET_NAMESPACES", value_delimiter = ',')]
    pub provider_secret_namespaces: Vec<String>,
    /// How often the fabric's devices are compared with the cluster's.
    #[arg(long, env = "CRO_SYNC_PERIOD", default_value = "60s")]
    pub sync_period: String,
    /// Device kinds offered to the scheduler from the fabric's free pool, as DRA
    /// ResourceSlices: `TYPE=MODEL` (type `gpu` or `cxlmemory`), several separated by `;`.
    #[arg(long, env = "CRO_POOL_DEVICES", value_delimiter = ';')]
    pub pool_devices: Vec<String>,
    /// How often each provider's free pool is read and its ResourceSlices updated.
    #[arg(long, env = "CRO_POOL_PERIOD", default_value = "10s")]
    pub pool_period: String,
    /// How long a device nobody holds stays attached before it is detached.
    #[arg(long, env = "CRO_ORPHAN_GRACE_PERIOD", default_value = "10m")]
    pub orphan_grace_period: String,
    /// How often an Online device's health is checked.
    #[arg(long, env = "CRO_HEALTH_CHECK_PERIOD", default_value = "60s")]
    pub health_check_period: String,
    /// How soon a wait on the fabric or a node looks again.
    #[arg(long, env = "CRO_POLL_INTERVAL", default_value = "5s")]
    pub poll_interval: String,
    /// Largest retry delay after repeated errors.
    #[arg(long, env = "CRO_MAX_BACKOFF", default_value = "5m")]
    pub max_backoff: String,
    /// Reconciliations each controller runs at once (at least 1; never two of one
    /// object): the requests', and the resources' of all the providers this replica
    /// holds together. Bounds the operator's memory and API connections under a burst.
    #[arg(long, env = "CRO_MAX_CONCURRENT_RECONCILES", default_value_t = DEFAULT_MAX_CONCURRENT_RECONCILES)]
    pub max_concurrent_reconciles: u16,
    /// Address of /metrics, /healthz and /readyz ("" or "0" disables it; ":8080" means
    /// every interface). `--metrics-bind-address` is the Go operator's name for it.
    #[arg(
        long,
        env = "CRO_METRICS_ADDR",
        default_value = "0.0.0.0:8080",
        alias = "metrics-bind-address"
    )]
    pub metrics_addr: String,
    /// Serve the metrics address over HTTPS (self-signed) with /metrics only for bearer
    /// tokens allowed `get` on `/metrics` (TokenReview + SubjectAccessReview); /healthz
    /// and /readyz stay open. The Go operator's flag.
    #[arg(long, env = "CRO_METRICS_SECURE", default_value_t = false, action = clap::ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    pub metrics_secure: bool,
    /// Another address serving the same paths (the Go operator's probe port, ":8081").
    #[arg(
        long,
        env = "CRO_HEALTH_PROBE_ADDR",
        alias = "health-probe-bind-address"
    )]
    pub health_probe_addr: Option<String>,
    /// Address of the validating webhook (HTTPS).
    #[arg(long, env = "CRO_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub webhook_addr: String,
    /// PEM certificate chain of the webhook. Without it (and without files in
    /// --webhook-cert-dir or --webhook-self-managed) the webhook is off.
    #[arg(long, env = "CRO_WEBHOOK_CERT")]
    pub webhook_cert: Option<PathBuf>,
    /// PEM private key of the webhook.
    #[arg(long, env = "CRO_WEBHOOK_KEY")]
    pub webhook_key: Option<PathBuf>,
    /// Without --webhook-cert/--webhook-key, the webhook serves `tls.crt` and `tls.key`
    /// from this directory when both exist (where the Go operator's manifests mount them).
    #[arg(long, env = "CRO_WEBHOOK_CERT_DIR", default_value = GO_WEBHOOK_CERT_DIR)]
    pub webhook_cert_dir: PathBuf,
    /// Serve the webhook with the operator's own CA and certificate (no cert-manager):
    /// kept in the Secret --webhook-secret, the CA injected into
    /// --webhook-configuration, renewed before expiry without a restart.
    #[arg(long, env = "CRO_WEBHOOK_SELF_MANAGED", default_value_t = false, action = clap::ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    pub webhook_self_managed: bool,
    /// The Secret (in the operator's namespace) holding the self-managed certificates.
    #[arg(long, env = "CRO_WEBHOOK_SECRET", default_value = "cro-webhook-tls")]
    pub webhook_secret: String,
    /// The ValidatingWebhookConfiguration that gets the self-managed CA.
    #[arg(
        long,
        env = "CRO_WEBHOOK_CONFIGURATION",
        default_value = "cro-validating-webhook"
    )]
    pub webhook_configuration: String,
    /// The webhook's Service; its DNS names go into the self-managed certificate.
    #[arg(long, env = "CRO_WEBHOOK_SERVICE", default_value = "cro-webhook")]
    pub webhook_service: String,
    /// More names for the self-managed certificate (comma-separated), besides the
    /// Service's: the host of `webhook.url` when the API server calls the webhook by URL
    /// (hostNetwork). An IP address becomes an IP SAN. A change reissues the certificate.
    #[arg(long, env = "CRO_WEBHOOK_EXTRA_NAMES", value_delimiter = ',')]
    pub webhook_extra_names: Vec<String>,
    /// The Go operator's switch (controller-runtime's convention): exactly `false` turns
    /// the webhook off, whatever the certificate settings say; any other value changes
    /// nothing.
    #[arg(long, env = "ENABLE_WEBHOOKS")]
    pub enable_webhooks: Option<String>,
    /// Lifetime of a self-managed serving certificate (renewed after two thirds).
    #[arg(long, env = "CRO_WEBHOOK_CERT_VALIDITY", default_value = "2160h")]
    pub webhook_cert_validity: String,
    /// Lifetime of the self-managed CA (a successor joins the bundle halfway).
    #[arg(long, env = "CRO_WEBHOOK_CA_VALIDITY", default_value = "43800h")]
    pub webhook_ca_validity: String,
    /// Run only while holding the leader Lease (for more than one replica). A bare
    /// `--leader-elect` means true, as in the Go operator.
    #[arg(long, env = "CRO_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: bool,
    /// Name of the leader Lease; the default is the Go operator's, so the two never lead
    /// at once.
    #[arg(long, env = "CRO_LEADER_ELECTION_ID", default_value = DEFAULT_LEASE_NAME)]
    pub leader_election_id: String,
    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = DEFAULT_NAMESPACE)]
    pub leader_election_namespace: String,
    /// This instance's identity in the Lease; defaults to the pod or host name.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Let the upstream sync also detach CXL memory that no ComposableResource holds
    /// (by default only GPUs are released, as by the Go operator).
    #[arg(long, env = "CRO_RELEASE_ORPHAN_CXL_MEMORY", default_value_t = false, action = clap::ArgAction::Set)]
    pub release_orphan_cxl_memory: bool,
}

impl RunArgs {
    pub fn into_config(self) -> Result<OperatorConfig, ConfigError> {
        let mut config = OperatorConfig::new(self.provider_source());
        config.mode = parse_mode(&self.device_resource_type)?;
        config.gpu_operator_namespace = self.gpu_operator_namespace.clone();
        config.namespace = self.leader_election_namespace.clone();
        config.release_orphan_cxl_memory = self.release_orphan_cxl_memory;
        config.provider_secret_namespaces = self
            .provider_secret_namespaces
            .iter()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        self.apply_pacing(&mut config)?;
        self.apply_listeners(&mut config)?;
        config.webhook_disabled_by_env = self.webhooks_switched_off();
        config.webhook = if config.webhook_disabled_by_env {
            None
        } else {
            self.webhook_config()?
        };
        config.leader_election = self.leader_election()?;
        Ok(config)
    }

    /// A spec file, the cluster's `CdiProvider` objects, or (neither given) the Go
    /// operator's environment.
    fn provider_source(&self) -> ProviderSource {
        match (&self.provider_spec, self.provider_objects) {
            (_, true) => ProviderSource::Objects,
            (Some(p), false) => ProviderSource::SpecFile(p.clone()),
            (None, false) => ProviderSource::GoEnvironment,
        }
    }

    /// The periods, backoff and concurrency; a period of 0 would spin, so it is refused.
    fn apply_pacing(&self, config: &mut OperatorConfig) -> Result<(), ConfigError> {
        config.timings.sync_period = setting_duration(&self.sync_period, SYNC_PERIOD)?;
        config.timings.orphan_grace =
            setting_duration(&self.orphan_grace_period, ORPHAN_GRACE_PERIOD)?;
        config.timings.health_period =
            setting_duration(&self.health_check_period, HEALTH_CHECK_PERIOD)?;
        config.timings.poll_interval = setting_duration(&self.poll_interval, POLL_INTERVAL)?;
        config.timings.pool_period = setting_duration(&self.pool_period, POOL_PERIOD)?;
        config.pool_devices = self
            .pool_devices
            .iter()
            .filter(|d| !d.trim().is_empty())
            .map(|d| pool_device(d))
            .collect::<Result<_, _>>()?;
        config.timings.backoff_max = setting_duration(&self.max_backoff, MAX_BACKOFF)?;
        if self.max_concurrent_reconciles == 0 {
            return Err(ConfigError::Invalid(
                "--max-concurrent-reconciles (CRO_MAX_CONCURRENT_RECONCILES) must be at least 1"
                    .into(),
            ));
        }
        config.max_concurrent_reconciles = self.max_concurrent_reconciles;
        for (name, d) in [
            ("sync period", config.timings.sync_period),
            ("health check period", config.timings.health_period),
            ("poll interval", config.timings.poll_interval),
            ("pool period", config.timings.pool_period),
        ] {
            if d.is_zero() {
                return Err(ConfigError::Invalid(format!("the {name} must not be 0")));
            }
        }
        Ok(())
    }

    /// The metrics and probe listeners; a probe address equal to the metrics one is
    /// served by the metrics listener alone.
    fn apply_listeners(&self, config: &mut OperatorConfig) -> Result<(), ConfigError> {
        config.metrics_addr = optional_listen_addr(&self.metrics_addr, "metrics address")?;
        config.metrics_secure = self.metrics_secure;
        config.probe_addr = match &self.health_probe_addr {
            Some(a) => optional_listen_addr(a, "health probe address")?,
            None => None,
        };
        if config.probe_addr.is_some() && config.probe_addr == config.metrics_addr {
            config.probe_addr = None;
        }
        Ok(())
    }

    /// Whether the Go operator's switch turns the webhook off. controller-runtime's
    /// convention: only the exact value `false` counts, so a deployment that sets
    /// anything else gets the webhook as before.
    fn webhooks_switched_off(&self) -> bool {
        self.enable_webhooks.as_deref() == Some("false")
    }

    /// The webhook: off, served from certificate files, or self-managed.
    fn webhook_config(&self) -> Result<Option<WebhookConfig>, ConfigError> {
        if !self.webhook_extra_names.is_empty() && !self.webhook_self_managed {
            // Names given for a certificate the operator does not make would be ignored
            // silently, and the API server would then refuse the certificate.
            return Err(ConfigError::Invalid(format!(
                "{EXTRA_NAMES} only names hosts in the --webhook-self-managed certificate"
            )));
        }
        let webhook_addr = listen_addr(&self.webhook_addr, "webhook address")?;
        let (cert, key) = self.webhook_files();
        match (cert, key, self.webhook_self_managed) {
            (Some(cert_file), Some(key_file), false) => Ok(Some(WebhookConfig {
                addr: webhook_addr,
                certs: WebhookCerts::Files {
                    cert_file,
                    key_file,
                },
            })),
            (None, None, false) => Ok(None),
            (None, None, true) => self.self_managed_webhook(webhook_addr).map(Some),
            (_, _, true) => Err(ConfigError::Invalid(
                "choose either webhook certificate files or a self-managed webhook".into(),
            )),
            _ => Err(ConfigError::Invalid(
                "the webhook needs both a certificate and a key".into(),
            )),
        }
    }

    /// The certificate and key named by flags, else both files of the certificate
    /// directory when both exist (and the webhook is not self-managed).
    fn webhook_files(&self) -> (Option<PathBuf>, Option<PathBuf>) {
        match (&self.webhook_cert, &self.webhook_key) {
            (None, None) if !self.webhook_self_managed => {
                let (c, k) = (
                    self.webhook_cert_dir.join("tls.crt"),
                    self.webhook_cert_dir.join("tls.key"),
                );
                if c.is_file() && k.is_file() {
                    (Some(c), Some(k))
                } else {
                    (None, None)
                }
            }
            (cert, key) => (cert.clone(), key.clone()),
        }
    }

    /// The self-managed webhook's Secret, configuration, DNS names and lifetimes.
    fn self_managed_webhook(&self, addr: SocketAddr) -> Result<WebhookConfig, ConfigError> {
        let ns = &self.leader_election_namespace;
        let policy = CertPolicy {
            ca_validity: setting_duration(&self.webhook_ca_validity, CA_VALIDITY)?,
            serving_validity: setting_duration(&self.webhook_cert_validity, CERT_VALIDITY)?,
            ..CertPolicy::default()
        };
        if policy.serving_validity < Duration::from_secs(3600)
            || policy.ca_validity < policy.serving_validity
        {
            return Err(ConfigError::Invalid(
                "webhook certificates must live at least 1h, the CA at least as long".into(),
            ));
        }
        Ok(WebhookConfig {
            addr,
            certs: WebhookCerts::SelfManaged(SelfManagedCerts {
                namespace: ns.clone(),
                secret_name: self.webhook_secret.clone(),
                webhook_configuration: self.webhook_configuration.clone(),
                dns_names: self.certificate_names()?,
                policy,
            }),
        })
    }

    /// The self-managed certificate's names: the Service's, then the extra ones (each
    /// once, so the list, and with it the decision to reissue, stays stable).
    fn certificate_names(&self) -> Result<Vec<String>, ConfigError> {
        let (ns, svc) = (&self.leader_election_namespace, &self.webhook_service);
        let mut names = vec![
            format!("{svc}.{ns}.svc"),
            format!("{svc}.{ns}.svc.cluster.local"),
        ];
        for extra in &self.webhook_extra_names {
            let name = extra_name(extra).map_err(|e| ConfigError::Setting {
                setting: EXTRA_NAMES,
                source: Box::new(e),
            })?;
            if !names.contains(&name) {
                names.push(name);
            }
        }
        Ok(names)
    }

    /// The leader Lease and this replica's identity in it, when leader election is on.
    fn leader_election(&self) -> Result<Option<LeaderElectionConfig>, ConfigError> {
        if !self.leader_elect {
            return Ok(None);
        }
        let identity = self
            .identity
            .clone()
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| {
                let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "cro".into());
                format!("{host}-{}", uuid::Uuid::new_v4().simple())
            });
        if self.leader_election_id.trim().is_empty() {
            return Err(ConfigError::Invalid(
                "the leader election id must not be empty".into(),
            ));
        }
        let mut le = LeaderElectionConfig::new(&self.leader_election_namespace, &identity);
        le.lease_name = self.leader_election_id.trim().to_owned();
        Ok(Some(le))
    }
}

/// One extra name of the self-managed certificate: a host name or an IP address, as a
/// TLS client names the server it calls. rcgen turns a name that parses as an IP into an
/// IP SAN, so an IP is kept as written.
fn extra_name(text: &str) -> Result<String, ConfigError> {
    let name = text.trim();
    let bad = |why: &str| ConfigError::Invalid(format!("{name:?}: {why}"));
    if name.is_empty() {
        return Err(bad("an empty name (a stray comma?)"));
    }
    match name.parse::<std::net::IpAddr>() {
        // 0.0.0.0 and :: are where a server listens, never what a client calls.
        Ok(ip) if ip.is_unspecified() => Err(bad(
            "a wildcard address names no host; give the address the API server calls",
        )),
        Ok(_) => Ok(name.to_owned()),
        Err(_) if rustls::pki_types::ServerName::try_from(name).is_ok() => Ok(name.to_owned()),
        Err(_) => Err(bad("neither a host name nor an IP address")),
    }
}

/// A listen address; the Go operator's ":8080" form means every interface.
fn listen_addr(text: &str, what: &str) -> Result<SocketAddr, ConfigError> {
    let full = match text.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => text.to_owned(),
    };
    full.parse()
        .map_err(|e| ConfigError::Invalid(format!("{what} {text:?}: {e}")))
}

/// A listen address that may be off: "" or "0" is how the Go operator switches a
/// listener off.
fn optional_listen_addr(text: &str, what: &str) -> Result<Option<SocketAddr>, ConfigError> {
    match text.trim() {
        "" | "0" => Ok(None),
        a => listen_addr(a, what).map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    #[test]
    fn pool_devices_are_type_equals_model_entries() {
        let cli = Cli::parse_from([
            "cro",
            "--pool-devices",
            "gpu=A100 40G; cxlmemory = CXL 256GiB;",
            "--pool-period",
            "2s",
        ]);
        let config = cli.run.into_config().unwrap();
        assert_eq!(
            config.pool_devices,
            [
                cro_runtime::PoolKind {
                    device_type: cro_runtime::DeviceType::Gpu,
                    model: "A100 40G".into()
                },
                cro_runtime::PoolKind {
                    device_type: cro_runtime::DeviceType::CxlMemory,
                    model: "CXL 256GiB".into()
                },
            ]
        );
        assert_eq!(config.timings.pool_period, Duration::from_secs(2));
        for bad in ["tpu=X", "gpu", "gpu= "] {
            let cli = Cli::parse_from(["cro", "--pool-devices", bad]);
            let e = cli.run.into_config().unwrap_err().to_string();
            assert!(
                e.contains("--pool-devices (CRO_POOL_DEVICES)") && e.contains(bad),
                "{e}"
            );
        }
        let cli = Cli::parse_from(["cro", "--pool-period", "0s"]);
        assert!(cli.run.into_config().is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(
            parse_duration("30").unwrap_err(),
            ConfigError::NoUnit("30".into())
        );
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration(" 2h ").unwrap(), Duration::from_secs(7200));
        for bad in ["", "s", "10x", "-1s", "1.5s", "99999999999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reconcile_concurrency_is_bounded_by_default_settable_and_never_zero() {
        let c = Cli::parse_from(["cro"]).run.into_config().unwrap();
        assert_eq!(
            c.max_concurrent_reconciles,
            DEFAULT_MAX_CONCURRENT_RECONCILES
        );
        let c = Cli::parse_from(["cro", "--max-concurrent-reconciles", "4"])
            .run
            .into_config()
            .unwrap();
        assert_eq!(c.max_concurrent_reconciles, 4);
        let e = Cli::parse_from(["cro", "--max-concurrent-reconciles", "0"])
            .run
            .into_config()
            .unwrap_err()
            .to_string();
        assert!(e.contains("CRO_MAX_CONCURRENT_RECONCILES"), "{e}");
    }

    #[test]
    fn a_duration_without_unit_is_refused_naming_the_setting() {
        let cli = Cli::parse_from(["cro", "--sync-period", "20"]);
        let e = cli.run.into_config().unwrap_err().to_string();
        assert!(
            e.contains("--sync-period (CRO_SYNC_PERIOD)") && e.contains("write 20s"),
            "{e}"
        );
        let cli = Cli::parse_from(["cro", "--max-backoff", "5"]);
        let e = cli.run.into_config().unwrap_err().to_string();
        assert!(e.contains("CRO_MAX_BACKOFF"), "{e}");
    }

    #[test]
    fn modes() {
        assert_eq!(parse_mode("DRA").unwrap(), ExposureMode::Dra);
        assert_eq!(
            parse_mode("DEVICE_PLUGIN").unwrap(),
            ExposureMode::DevicePlugin
        );
        assert_eq!(
            parse_mode("dra").unwrap_err(),
            ConfigError::BadMode("dra".into())
        );
    }

    #[test]
    fn provider_objects_and_secret_namespaces() {
        let default = Cli::parse_from(["cro", "--leader-election-namespace", "ops"])
            .run
            .into_config()
            .unwrap();
        assert_eq!(default.provider, ProviderSource::GoEnvironment);
        assert_eq!(default.secret_namespaces(), vec!["ops".to_owned()]);
        let objects = Cli::parse_from([
            "cro",
            "--provider-objects=true",
            "--provider-secret-namespaces",
            "a, b,",
        ])
        .run
        .into_config()
        .unwrap();
        assert_eq!(objects.provider, ProviderSource::Objects);
        assert_eq!(
            objects.secret_namespaces(),
            vec!["a".to_owned(), "b".to_owned()]
        );
        assert!(
            Cli::try_parse_from([
                "cro",
                "--provider-objects=true",
                "--provider-spec",
                "/etc/cro/fti.yaml"
            ])
            .is_err()
        );
    }

    #[test]
    fn flags_become_a_config() {
        let cli = Cli::parse_from([
            "cro",
            "--device-resource-type",
            "DRA",
            "--orphan-grace-period",
            "3s",
            "--metrics-addr",
            "",
            "--leader-elect",
            "false",
            "--provider-spec",
            "/etc/cro/fti.yaml",
        ]);
        let c = cli.run.into_config().unwrap();
        assert_eq!(c.mode, ExposureMode::Dra);
        assert_eq!(c.timings.orphan_grace, Duration::from_secs(3));
        assert_eq!(c.timings.sync_period, Duration::from_secs(60));
        assert_eq!(c.metrics_addr, None);
        assert_eq!(c.leader_election, None);
        assert_eq!(c.webhook, None);
        assert!(!c.release_orphan_cxl_memory);
        assert_eq!(c.namespace, DEFAULT_NAMESPACE);
        assert_eq!(
            c.provider,
            ProviderSource::SpecFile("/etc/cro/fti.yaml".into())
        );

        let half_webhook = Cli::parse_from(["cro", "--webhook-cert", "/tls/cert.pem"]);
        assert!(half_webhook.run.into_config().is_err());
        let both = Cli::parse_from([
            "cro",
            "--webhook-cert",
            "/c",
            "--webhook-key",
            "/k",
            "--webhook-self-managed",
        ]);
        assert!(both.run.into_config().is_err());
        let own = Cli::parse_from(["cro", "--webhook-self-managed"])
            .run
            .into_config()
            .unwrap();
        match own.webhook.unwrap().certs {
            WebhookCerts::SelfManaged(c) => {
                assert_eq!(c.namespace, DEFAULT_NAMESPACE);
                assert_eq!(c.secret_name, "cro-webhook-tls");
                assert_eq!(
                    c.dns_names[0],
                    "cro-webhook.composable-resource-operator-system.svc"
                );
            }
            other => panic!("{other:?}"),
        }
        let leader = Cli::parse_from(["cro", "--identity", "pod-1"])
            .run
            .into_config()
            .unwrap();
        assert_eq!(leader.leader_election.unwrap().identity, "pod-1");
    }

    fn self_managed_names(args: &[&str]) -> Result<Vec<String>, ConfigError> {
        let mut argv = vec!["cro", "--webhook-self-managed"];
        argv.extend_from_slice(args);
        let config = Cli::parse_from(argv).run.into_config()?;
        match config.webhook.map(|w| w.certs) {
            Some(WebhookCerts::SelfManaged(c)) => Ok(c.dns_names),
            other => panic!("{other:?}"),
        }
    }

    /// Issue 23: the host of `webhook.url` joins the Service's names; IPs are kept as
    /// written (rcgen makes them IP SANs), empty entries and wildcard IPs are refused.
    #[test]
    fn extra_webhook_names_follow_the_service_names() {
        let svc = "cro-webhook.composable-resource-operator-system.svc";
        assert_eq!(
            self_managed_names(&[]).unwrap(),
            vec![svc.to_owned(), format!("{svc}.cluster.local")]
        );
        assert_eq!(
            self_managed_names(&["--webhook-extra-names", "127.0.0.1, node-1.example,::1"])
                .unwrap(),
            vec![
                svc.to_owned(),
                format!("{svc}.cluster.local"),
                "127.0.0.1".to_owned(),
                "node-1.example".to_owned(),
                "::1".to_owned(),
            ]
        );
        // A name already there is not repeated.
        assert_eq!(
            self_managed_names(&["--webhook-extra-names", svc])
                .unwrap()
                .len(),
            2
        );
        for bad in ["127.0.0.1,,x.example", "0.0.0.0", "::", "not a name", " "] {
            let e = self_managed_names(&["--webhook-extra-names", bad])
                .unwrap_err()
                .to_string();
            assert!(e.contains("CRO_WEBHOOK_EXTRA_NAMES"), "{bad}: {e}");
        }
        // Without a self-managed certificate there is nothing to name them in.
        let e = Cli::parse_from([
            "cro",
            "--webhook-cert",
            "/c",
            "--webhook-key",
            "/k",
            "--webhook-extra-names",
            "127.0.0.1",
        ])
        .run
        .into_config()
        .unwrap_err()
        .to_string();
        assert!(e.contains("--webhook-self-managed"), "{e}");
    }

    /// Go parity (issue 29): controller-runtime skips the webhook when ENABLE_WEBHOOKS is
    /// exactly "false", whatever else is configured; any other value changes nothing.
    #[test]
    fn enable_webhooks_false_turns_the_webhook_off() {
        let with = |value: &str, rest: &[&str]| {
            let mut argv = vec!["cro", "--enable-webhooks", value];
            argv.extend_from_slice(rest);
            Cli::parse_from(argv).run.into_config()
        };
        for rest in [
            &["--webhook-self-managed"][..],
            &["--webhook-cert", "/c", "--webhook-key", "/k"],
            // Even settings that would be refused: the webhook is not set up at all.
            &["--webhook-cert", "/c"],
        ] {
            let c = with("false", rest).unwrap();
            assert_eq!(c.webhook, None, "{rest:?}");
            assert!(c.webhook_disabled_by_env, "{rest:?}");
        }
        for other in ["true", "False", "0", ""] {
            let c = with(other, &["--webhook-self-managed"]).unwrap();
            assert!(c.webhook.is_some(), "{other:?}");
            assert!(!c.webhook_disabled_by_env, "{other:?}");
        }
        let unset = Cli::parse_from(["cro", "--webhook-self-managed"])
            .run
            .into_config()
            .unwrap();
        assert!(unset.webhook.is_some() && !unset.webhook_disabled_by_env);
    }

    /// The Go manifests mount the webhook's certificate where controller-runtime looks.
    #[test]
    fn webhook_files_in_the_go_directory_are_used() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();
        let none = Cli::parse_from(["cro", "--webhook-cert-dir", d])
            .run
            .into_config()
            .unwrap();
        assert_eq!(none.webhook, None);
        std::fs::write(dir.path().join("tls.crt"), "c").unwrap();
        std::fs::write(dir.path().join("tls.key"), "k").unwrap();
        let c = Cli::parse_from(["cro", "--webhook-cert-dir", d])
            .run
            .into_config()
            .unwrap();
        let w = c.webhook.unwrap();
        assert_eq!(w.addr, "0.0.0.0:9443".parse().unwrap());
        assert_eq!(
            w.certs,
            WebhookCerts::Files {
                cert_file: dir.path().join("tls.crt"),
                key_file: dir.path().join("tls.key"),
            }
        );
    }

    /// The Go operator's Deployment args work unchanged.
    #[test]
    fn go_operator_flags_are_accepted() {
        let c = Cli::parse_from([
            "cro",
            "--leader-elect",
            "--health-probe-bind-address=:8081",
            "--metrics-bind-address=:8443",
            "--identity",
            "pod-1",
        ])
        .run
        .into_config()
        .unwrap();
        let le = c.leader_election.unwrap();
        assert_eq!(le.lease_name, "c5744f42.hpsys.ibm.ie.com");
        assert_eq!(le.namespace, "composable-resource-operator-system");
        assert_eq!(c.metrics_addr, Some("0.0.0.0:8443".parse().unwrap()));
        assert_eq!(c.probe_addr, Some("0.0.0.0:8081".parse().unwrap()));

        // Go's "0" disables the metrics listener.
        let c = Cli::parse_from(["cro", "--metrics-bind-address", "0", "--leader-elect=false"])
            .run
            .into_config()
            .unwrap();
        assert_eq!(c.metrics_addr, None);
        assert_eq!(c.leader_election, None);
        assert!(
            Cli::parse_from(["cro", "--health-probe-bind-address", "nonsense"])
                .run
                .into_config()
                .is_err()
        );
    }
}

//! The operator's configuration: from flags and environment (`cro run`), or built
//! directly by tests.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::nodeops::ExposureMode;
use crate::nodeops::plugins::DEFAULT_GPU_OPERATOR_NAMESPACE;

pub const DEFAULT_NAMESPACE: &str = "composable-resource-operator-system";
pub const DEFAULT_LEASE_NAME: &str = "cro-operator-leader";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("DEVICE_RESOURCE_TYPE must be DEVICE_PLUGIN or DRA, not {0:?}")]
    BadMode(String),
    #[error("bad duration {0:?}: use a number with ms, s, m or h (e.g. 30s, 10m)")]
    BadDuration(String),
    #[error("{0}")]
    Invalid(String),
}

/// Parses `250ms`, `30s`, `10m`, `1h` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, ConfigError> {
    let t = text.trim();
    let bad = || ConfigError::BadDuration(text.to_owned());
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let d = match unit.trim() {
        "" | "s" => Duration::from_secs(n),
        "ms" => Duration::from_millis(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(bad)?),
        "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(bad)?),
        _ => return Err(bad()),
    };
    Ok(d)
}

pub fn parse_mode(text: &str) -> Result<ExposureMode, ConfigError> {
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
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    pub addr: SocketAddr,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
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
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorConfig {
    pub mode: ExposureMode,
    pub gpu_operator_namespace: String,
    pub timings: Timings,
    pub provider: ProviderSource,
    /// `/metrics`, `/healthz`, `/readyz`; None disables the listener.
    pub metrics_addr: Option<SocketAddr>,
    pub webhook: Option<WebhookConfig>,
    pub leader_election: Option<LeaderElectionConfig>,
    /// Name in Events' reporting controller.
    pub controller_name: String,
    /// The operator's namespace, where the node agent DaemonSet for host drivers lives.
    pub namespace: String,
    /// Whether the upstream sync also releases CXL memory no resource holds (the Go
    /// operator released only GPUs; docs/differences-from-go.md).
    pub release_orphan_cxl_memory: bool,
}

impl OperatorConfig {
    pub fn new(provider: ProviderSource) -> Self {
        Self {
            mode: ExposureMode::DevicePlugin,
            gpu_operator_namespace: DEFAULT_GPU_OPERATOR_NAMESPACE.to_owned(),
            timings: Timings::default(),
            provider,
            metrics_addr: None,
            webhook: None,
            leader_election: None,
            controller_name: "cro-operator".to_owned(),
            namespace: DEFAULT_NAMESPACE.to_owned(),
            release_orphan_cxl_memory: false,
        }
    }
}

/// `cro run`'s flags; every flag can also come from the environment variable named.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// How GPUs are exposed to pods: DEVICE_PLUGIN or DRA.
    #[arg(long, env = "DEVICE_RESOURCE_TYPE", default_value = "DEVICE_PLUGIN")]
    pub device_resource_type: String,
    /// Namespace of the NVIDIA GPU operator (device plugin and DCGM daemonsets).
    #[arg(long, env = "NVIDIA_GPU_OPERATOR_NAMESPACE", default_value = DEFAULT_GPU_OPERATOR_NAMESPACE)]
    pub gpu_operator_namespace: String,
    /// Provider spec file (component and grants). Without it, the Go operator's
    /// variables (CDI_PROVIDER_TYPE=FTI_CDI, FTI_CDI_*) select the shipped FTI component.
    #[arg(long, env = "CRO_PROVIDER_SPEC")]
    pub provider_spec: Option<PathBuf>,
    /// How often the fabric's devices are compared with the cluster's.
    #[arg(long, env = "CRO_SYNC_PERIOD", default_value = "60s")]
    pub sync_period: String,
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
    /// Address of /metrics, /healthz and /readyz ("" disables it).
    #[arg(long, env = "CRO_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: String,
    /// Address of the validating webhook (HTTPS).
    #[arg(long, env = "CRO_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub webhook_addr: String,
    /// PEM certificate chain of the webhook; the webhook is off without it.
    #[arg(long, env = "CRO_WEBHOOK_CERT")]
    pub webhook_cert: Option<PathBuf>,
    /// PEM private key of the webhook.
    #[arg(long, env = "CRO_WEBHOOK_KEY")]
    pub webhook_key: Option<PathBuf>,
    /// Run only while holding the leader Lease (for more than one replica).
    #[arg(long, env = "CRO_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
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
        let provider = match self.provider_spec {
            Some(p) => ProviderSource::SpecFile(p),
            None => ProviderSource::GoEnvironment,
        };
        let mut config = OperatorConfig::new(provider);
        config.mode = parse_mode(&self.device_resource_type)?;
        config.gpu_operator_namespace = self.gpu_operator_namespace;
        config.namespace = self.leader_election_namespace.clone();
        config.release_orphan_cxl_memory = self.release_orphan_cxl_memory;
        config.timings.sync_period = parse_duration(&self.sync_period)?;
        config.timings.orphan_grace = parse_duration(&self.orphan_grace_period)?;
        config.timings.health_period = parse_duration(&self.health_check_period)?;
        config.timings.poll_interval = parse_duration(&self.poll_interval)?;
        config.timings.backoff_max = parse_duration(&self.max_backoff)?;
        for (name, d) in [
            ("sync period", config.timings.sync_period),
            ("health check period", config.timings.health_period),
            ("poll interval", config.timings.poll_interval),
        ] {
            if d.is_zero() {
                return Err(ConfigError::Invalid(format!("the {name} must not be 0")));
            }
        }
        let addr = |text: &str, what: &str| -> Result<SocketAddr, ConfigError> {
            text.parse()
                .map_err(|e| ConfigError::Invalid(format!("{what} {text:?}: {e}")))
        };
        config.metrics_addr = match self.metrics_addr.trim() {
            "" => None,
            a => Some(addr(a, "metrics address")?),
        };
        config.webhook = match (self.webhook_cert, self.webhook_key) {
            (Some(cert_file), Some(key_file)) => Some(WebhookConfig {
                addr: addr(&self.webhook_addr, "webhook address")?,
                cert_file,
                key_file,
            }),
            (None, None) => None,
            _ => {
                return Err(ConfigError::Invalid(
                    "the webhook needs both a certificate and a key".into(),
                ));
            }
        };
        if self.leader_elect {
            let identity = self.identity.filter(|i| !i.is_empty()).unwrap_or_else(|| {
                let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "cro".into());
                format!("{host}-{}", uuid::Uuid::new_v4().simple())
            });
            config.leader_election = Some(LeaderElectionConfig::new(
                &self.leader_election_namespace,
                &identity,
            ));
        }
        Ok(config)
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
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration(" 2h ").unwrap(), Duration::from_secs(7200));
        for bad in ["", "s", "10x", "-1s", "1.5s", "99999999999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
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
        let leader = Cli::parse_from(["cro", "--identity", "pod-1"])
            .run
            .into_config()
            .unwrap();
        assert_eq!(leader.leader_election.unwrap().identity, "pod-1");
    }
}

//! Operator replicas as processes of their own, for tests and benchmarks that kill,
//! stop and restart them: a replica runs the operator over the cluster's `CdiProvider`
//! objects with leader election, its node commands going to the test's stand-in service
//! ([`StandinRunner`]), so every replica shares the test's one node simulation.
//!
//! The parent describes a replica in a [`ReplicaSpec`] and starts a program with it in
//! the environment variable [`SPEC_ENV`] ([`ReplicaProcess::spawn`]); the program (the
//! test binary itself, re-executed on one test, or `cro-bench replica`) reads it back
//! and runs [`run_replica`]:
//!
//! ```no_run
//! // In the test binary: the entry the parent re-executes (`--exact replica_entry`).
//! #[test]
//! fn replica_entry() {
//!     if let Some(ended) = node_sim::replica::main_from_env() {
//!         ended.expect("the replica failed");
//!     }
//! }
//! ```
//!
//! The parent holds a [`ReplicaProcess`]: its pid, SIGKILL ([`ReplicaProcess::kill`]),
//! SIGSTOP / SIGCONT ([`ReplicaProcess::stop`], [`ReplicaProcess::cont`]), SIGTERM with
//! a deadline ([`ReplicaProcess::terminate`]); it is killed when dropped.

use std::ffi::OsStr;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use base64::Engine as _;
use cro_operator::config::{LeaderElectionConfig, OperatorConfig, ProviderSource, Timings};
use cro_operator::nodeops::ExposureMode;
use cro_operator::source::FetchOptions;
use cro_operator::{Operator, shutdown_signal};
use serde::{Deserialize, Serialize};
use tracing::Instrument as _;

use crate::remote::StandinRunner;

/// The environment variable a replica's spec is passed in, as JSON.
pub const SPEC_ENV: &str = "CRO_REPLICA_SPEC";

/// How long [`ReplicaProcess::stop`] and [`ReplicaProcess::cont`] wait for the kernel to
/// show the process stopped or running again.
const SIGNAL_SETTLE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error("{SPEC_ENV} is not a replica spec: {0}")]
    BadSpec(#[source] serde_json::Error),
    #[error("{SPEC_ENV} is not valid Unicode")]
    SpecNotUnicode,
    #[error("cannot encode the replica spec: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("the API server's client configuration: {0}")]
    Kubeconfig(String),
    #[error("log file {}: {source}", path.display())]
    Log {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot start replica {identity}: {source}")]
    Spawn {
        identity: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot send {signal} to replica {identity} (pid {pid}): {source}")]
    Signal {
        identity: String,
        pid: u32,
        signal: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("replica {identity} (pid {pid}) already ended: {status}")]
    Exited {
        identity: String,
        pid: u32,
        status: ExitStatus,
    },
    #[error("waiting for replica {identity} (pid {pid}): {source}")]
    Wait {
        identity: String,
        pid: u32,
        #[source]
        source: io::Error,
    },
    #[error("replica {identity} (pid {pid}) was not {what} within {waited:?}")]
    Timeout {
        identity: String,
        pid: u32,
        what: String,
        waited: Duration,
    },
}

/// How a replica reaches the API server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ApiAccess {
    /// The server's URL, its CA (PEM) and a bearer token: a local control plane's
    /// (`kube_harness::Harness::server_url`, `ca_pem`, `token`).
    Token {
        server_url: String,
        ca_pem: String,
        token: String,
    },
    /// A kubeconfig file (its current context).
    Kubeconfig { path: PathBuf },
}

impl ApiAccess {
    pub fn token(server_url: &str, ca_pem: &str, token: &str) -> Self {
        ApiAccess::Token {
            server_url: server_url.to_owned(),
            ca_pem: ca_pem.to_owned(),
            token: token.to_owned(),
        }
    }

    /// The client configuration.
    pub async fn client_config(&self) -> Result<kube::Config, ReplicaError> {
        use kube::config::{KubeConfigOptions, Kubeconfig};
        let bad = |e: &dyn std::fmt::Display| ReplicaError::Kubeconfig(e.to_string());
        let kubeconfig = match self {
            ApiAccess::Token {
                server_url,
                ca_pem,
                token,
            } => {
                let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
                serde_json::from_value::<Kubeconfig>(serde_json::json!({
                    "apiVersion": "v1", "kind": "Config",
                    "clusters": [{"name": "test", "cluster": {
                        "server": server_url, "certificate-authority-data": ca}}],
                    "users": [{"name": "replica", "user": {"token": token}}],
                    "contexts": [{"name": "test", "context": {"cluster": "test", "user": "replica"}}],
                    "current-context": "test",
                }))
                .map_err(|e| bad(&e))?
            }
            ApiAccess::Kubeconfig { path } => Kubeconfig::read_from(path).map_err(|e| bad(&e))?,
        };
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| bad(&e))
    }
}

/// The replica's leader-election Lease; with per-provider Leases, the name their names
/// start with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaLease {
    pub namespace: String,
    pub name: String,
    #[serde(with = "millis")]
    pub duration: Duration,
    /// How often the holder renews.
    #[serde(with = "millis")]
    pub renew_period: Duration,
}

/// The operator's [`Timings`], each in milliseconds on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaTimings {
    #[serde(with = "millis")]
    pub sync_period: Duration,
    #[serde(with = "millis")]
    pub orphan_grace: Duration,
    #[serde(with = "millis")]
    pub health_period: Duration,
    #[serde(with = "millis")]
    pub poll_interval: Duration,
    #[serde(with = "millis")]
    pub rescan_interval: Duration,
    #[serde(with = "millis")]
    pub backoff_base: Duration,
    #[serde(with = "millis")]
    pub backoff_max: Duration,
    #[serde(with = "millis")]
    pub mirror_delay: Duration,
    #[serde(with = "millis")]
    pub pool_period: Duration,
}

impl ReplicaTimings {
    /// What the operator's end-to-end tests run every operator with, in-process
    /// (host/operator/tests/common, `fast_timings`) or as a replica process: short
    /// periods and backoffs, and no orphan released within a test.
    pub fn fast() -> Self {
        Self {
            sync_period: Duration::from_millis(500),
            orphan_grace: Duration::from_secs(3600),
            health_period: Duration::from_secs(2),
            poll_interval: Duration::from_millis(200),
            rescan_interval: Duration::from_secs(1),
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
            mirror_delay: Duration::from_millis(300),
            pool_period: Duration::from_millis(500),
        }
    }

    /// These timings over `base`, which keeps any timing this type does not carry.
    pub fn apply(&self, base: &mut Timings) {
        base.sync_period = self.sync_period;
        base.orphan_grace = self.orphan_grace;
        base.health_period = self.health_period;
        base.poll_interval = self.poll_interval;
        base.rescan_interval = self.rescan_interval;
        base.backoff_base = self.backoff_base;
        base.backoff_max = self.backoff_max;
        base.mirror_delay = self.mirror_delay;
        base.pool_period = self.pool_period;
    }
}

impl From<&Timings> for ReplicaTimings {
    fn from(t: &Timings) -> Self {
        Self {
            sync_period: t.sync_period,
            orphan_grace: t.orphan_grace,
            health_period: t.health_period,
            poll_interval: t.poll_interval,
            rescan_interval: t.rescan_interval,
            backoff_base: t.backoff_base,
            backoff_max: t.backoff_max,
            mirror_delay: t.mirror_delay,
            pool_period: t.pool_period,
        }
    }
}

/// Everything a replica process needs, passed to it as JSON in [`SPEC_ENV`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaSpec {
    pub api: ApiAccess,
    /// The replica's name in the Leases (and in its log lines).
    pub identity: String,
    pub lease: ReplicaLease,
    /// The test's stand-in service ([`crate::Standin::url`]).
    pub standin_url: String,
    /// The operator's namespace (its node agent, the Secrets providers may grant).
    pub namespace: String,
    pub gpu_operator_namespace: String,
    /// DRA instead of the device plugin.
    #[serde(default)]
    pub dra: bool,
    pub timings: ReplicaTimings,
    /// None: the operator's default.
    #[serde(default)]
    pub max_concurrent_reconciles: Option<u16>,
    /// Namespaces a `CdiProvider` may grant a Secret from; empty: `namespace` only.
    #[serde(default)]
    pub provider_secret_namespaces: Vec<String>,
    /// `/metrics`, `/healthz`, `/readyz`; None: not served.
    #[serde(default)]
    pub metrics_addr: Option<SocketAddr>,
    /// The log filter (`RUST_LOG` syntax); None: `RUST_LOG`, else `info`.
    #[serde(default)]
    pub log_filter: Option<String>,
}

impl ReplicaSpec {
    /// A replica named `identity` with the operator's defaults (its namespace, the GPU
    /// operator's, the Go operator's Lease name, 15 s Leases renewed every 5 s), the
    /// tests' fast timings, and the device plugin.
    pub fn new(api: ApiAccess, identity: &str, standin_url: &str) -> Self {
        let defaults = OperatorConfig::new(ProviderSource::Objects);
        let le = LeaderElectionConfig::new(&defaults.namespace, identity);
        Self {
            api,
            identity: identity.to_owned(),
            lease: ReplicaLease {
                namespace: le.namespace,
                name: le.lease_name,
                duration: le.lease_duration,
                renew_period: le.renew_period,
            },
            standin_url: standin_url.to_owned(),
            namespace: defaults.namespace,
            gpu_operator_namespace: defaults.gpu_operator_namespace,
            dra: false,
            timings: ReplicaTimings::fast(),
            max_concurrent_reconciles: None,
            provider_secret_namespaces: Vec::new(),
            metrics_addr: None,
            log_filter: None,
        }
    }

    /// The same spec for another replica.
    pub fn with_identity(&self, identity: &str) -> Self {
        Self {
            identity: identity.to_owned(),
            ..self.clone()
        }
    }

    pub fn to_json(&self) -> Result<String, ReplicaError> {
        serde_json::to_string(self).map_err(ReplicaError::Encode)
    }

    pub fn from_json(text: &str) -> Result<Self, ReplicaError> {
        serde_json::from_str(text).map_err(ReplicaError::BadSpec)
    }

    /// The spec in [`SPEC_ENV`], if it is set.
    pub fn from_env() -> Result<Option<Self>, ReplicaError> {
        match std::env::var(SPEC_ENV) {
            Ok(text) => Self::from_json(&text).map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(ReplicaError::SpecNotUnicode),
        }
    }

    /// The operator's configuration: the `CdiProvider` objects, leader election, and
    /// the rest as an in-process test operator has it.
    pub fn operator_config(&self) -> OperatorConfig {
        let mut config = OperatorConfig::new(ProviderSource::Objects);
        // The objects' grants name their Secrets (as host/operator/tests/providers does).
        config.credentials = None;
        self.timings.apply(&mut config.timings);
        config.namespace = self.namespace.clone();
        config.gpu_operator_namespace = self.gpu_operator_namespace.clone();
        if self.dra {
            config.mode = ExposureMode::Dra;
        }
        if let Some(n) = self.max_concurrent_reconciles {
            config.max_concurrent_reconciles = n;
        }
        config.provider_secret_namespaces = self.provider_secret_namespaces.clone();
        config.metrics_addr = self.metrics_addr;
        let mut le = LeaderElectionConfig::new(&self.lease.namespace, &self.identity);
        le.lease_name = self.lease.name.clone();
        le.lease_duration = self.lease.duration;
        le.renew_period = self.lease.renew_period;
        config.leader_election = Some(le);
        config
    }
}

/// Durations as whole milliseconds.
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

/// Runs one replica until SIGTERM or SIGINT (Ok), or until the operator gives up (its
/// error): the operator over the cluster's `CdiProvider` objects, with leader election,
/// its node commands through the stand-in service. Logs go to stderr, tagged with the
/// identity.
pub async fn run_replica(spec: ReplicaSpec) -> anyhow::Result<()> {
    // kube's TLS needs a process-wide provider; installing fails only if one is there.
    let _ = rustls::crypto::ring::default_provider().install_default();
    init_logging(spec.log_filter.as_deref());
    let identity = spec.identity.clone();
    let kube_config = spec.api.client_config().await?;
    let client = kube::Client::try_from(kube_config).context("cannot build the API client")?;
    let runner = Arc::new(StandinRunner::new(&spec.standin_url)?);
    let config = spec.operator_config();
    tracing::info!(
        identity = %identity,
        pid = std::process::id(),
        lease = %spec.lease.name,
        standin = %spec.standin_url,
        "replica starting"
    );
    Operator::for_objects(client, runner, config, FetchOptions::default())
        .run_until(shutdown_signal())
        .instrument(tracing::info_span!("replica", identity = %identity))
        .await
        .with_context(|| format!("replica {identity}"))?;
    tracing::info!(identity = %identity, "replica stopped");
    Ok(())
}

/// [`run_replica`] on a runtime of its own, for a caller without one (a plain `#[test]`
/// or `main`).
pub fn run_replica_blocking(spec: ReplicaSpec) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the replica's runtime")?
        .block_on(run_replica(spec))
}

/// The replica a parent asked for in [`SPEC_ENV`], run to its end: None when the
/// variable is not set (this process is not a replica).
pub fn main_from_env() -> Option<anyhow::Result<()>> {
    match ReplicaSpec::from_env() {
        Ok(None) => None,
        Ok(Some(spec)) => Some(run_replica_blocking(spec)),
        Err(e) => Some(Err(e.into())),
    }
}

fn init_logging(filter: Option<&str>) {
    let filter = match filter {
        Some(f) => tracing_subscriber::EnvFilter::new(f),
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    // A program that set up its own logging (cro-bench) keeps it.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(io::stderr)
        .try_init();
}

/// A replica process the parent started. Killed (with anything it started) when
/// dropped.
#[derive(Debug)]
pub struct ReplicaProcess {
    child: Child,
    identity: String,
    log: PathBuf,
    /// Set once reaped: the pid may belong to another process from then on, so no
    /// signal is sent to it any more.
    exited: Option<ExitStatus>,
}

impl ReplicaProcess {
    /// Starts `program` with `args` and `spec` in [`SPEC_ENV`], its stdout and stderr
    /// appended to `log` (created with its directory if need be).
    pub fn spawn<I, S>(
        program: impl AsRef<OsStr>,
        args: I,
        spec: &ReplicaSpec,
        log: &Path,
    ) -> Result<Self, ReplicaError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Command::new(program);
        command.args(args);
        Self::spawn_command(command, spec, log)
    }

    /// [`ReplicaProcess::spawn`] of a command the caller set up (more environment, a
    /// working directory). Its stdin, stdout and stderr are replaced.
    pub fn spawn_command(
        mut command: Command,
        spec: &ReplicaSpec,
        log: &Path,
    ) -> Result<Self, ReplicaError> {
        let log_err = |source| ReplicaError::Log {
            path: log.to_owned(),
            source,
        };
        if let Some(dir) = log.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(log_err)?;
        }
        // Appended: a replica restarted under the same log keeps its earlier life.
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(log_err)?;
        let err = out.try_clone().map_err(log_err)?;
        command
            .env(SPEC_ENV, spec.to_json()?)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = kube_harness::spawn_tied(command).map_err(|source| ReplicaError::Spawn {
            identity: spec.identity.clone(),
            source,
        })?;
        Ok(Self {
            child,
            identity: spec.identity.clone(),
            log: log.to_owned(),
            exited: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The log so far ("" if it cannot be read).
    pub fn log(&self) -> String {
        std::fs::read(&self.log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The process's state letter in `/proc/<pid>/stat` (`R`, `S`, `T` stopped, `Z`
    /// ended but not reaped, ...); None once reaped.
    pub fn state(&self) -> Option<char> {
        if self.exited.is_some() {
            return None;
        }
        proc_state(self.pid())
    }

    /// How it ended, if it has (reaping it).
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>, ReplicaError> {
        if self.exited.is_none() {
            self.exited = self
                .child
                .try_wait()
                .map_err(|source| self.wait_err(source))?;
        }
        Ok(self.exited)
    }

    /// SIGSTOP: the process freezes where it is (its connections stay open, its Leases
    /// go unrenewed). Returns once the kernel shows it stopped.
    pub fn stop(&mut self) -> Result<(), ReplicaError> {
        self.signal(libc::SIGSTOP, "SIGSTOP")?;
        self.settle("stopped", |state| matches!(state, 'T' | 't'))
    }

    /// SIGCONT: a stopped process goes on. Returns once the kernel shows it running.
    pub fn cont(&mut self) -> Result<(), ReplicaError> {
        self.signal(libc::SIGCONT, "SIGCONT")?;
        self.settle("running again", |state| !matches!(state, 'T' | 't'))
    }

    /// SIGKILL to it and anything it started, then reaps it; how it ended (also when it
    /// had ended before).
    pub fn kill(&mut self) -> Result<ExitStatus, ReplicaError> {
        if let Some(status) = self.exited {
            return Ok(status);
        }
        // SAFETY: a plain syscall; the group id is the pid of our own child, not reaped
        // yet, so it cannot have been reused. The child leads its own group.
        unsafe {
            libc::kill(-(self.pid() as libc::pid_t), libc::SIGKILL);
        }
        // The group is gone already if the child had ended; the child itself still gets
        // it (a no-op on a zombie).
        let _ = self.child.kill();
        let status = self.child.wait().map_err(|source| self.wait_err(source))?;
        self.exited = Some(status);
        Ok(status)
    }

    /// SIGTERM (and SIGCONT, so that a stopped replica handles it), then waits up to
    /// `deadline` for it to end: how it ended. Past the deadline it is killed and the
    /// error says so.
    pub async fn terminate(&mut self, deadline: Duration) -> Result<ExitStatus, ReplicaError> {
        if let Some(status) = self.try_wait()? {
            return Ok(status);
        }
        self.signal(libc::SIGTERM, "SIGTERM")?;
        self.signal(libc::SIGCONT, "SIGCONT")?;
        match self.wait(deadline).await {
            Err(ReplicaError::Timeout { .. }) => {
                self.kill()?;
                Err(self.timeout("ended by SIGTERM", deadline))
            }
            ended => ended,
        }
    }

    /// Waits up to `timeout` for the process to end by itself: how it ended. Past the
    /// timeout it is left running and the error says so.
    pub async fn wait(&mut self, timeout: Duration) -> Result<ExitStatus, ReplicaError> {
        let began = Instant::now();
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            if began.elapsed() >= timeout {
                return Err(self.timeout("ended", timeout));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the log contains `needle`. Fails if the process ends first, or after
    /// `timeout`.
    pub async fn wait_for_log(
        &mut self,
        needle: &str,
        timeout: Duration,
    ) -> Result<(), ReplicaError> {
        let began = Instant::now();
        loop {
            if self.log().contains(needle) {
                return Ok(());
            }
            if let Some(status) = self.try_wait()? {
                // It may have written the line just before it ended.
                if self.log().contains(needle) {
                    return Ok(());
                }
                return Err(ReplicaError::Exited {
                    identity: self.identity.clone(),
                    pid: self.pid(),
                    status,
                });
            }
            if began.elapsed() >= timeout {
                return Err(self.timeout(&format!("logging {needle:?}"), timeout));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn signal(&mut self, signal: libc::c_int, name: &'static str) -> Result<(), ReplicaError> {
        if let Some(status) = self.try_wait()? {
            return Err(ReplicaError::Exited {
                identity: self.identity.clone(),
                pid: self.pid(),
                status,
            });
        }
        // SAFETY: a plain syscall to our own child, not reaped (just checked), so its
        // pid is still its own.
        if unsafe { libc::kill(self.pid() as libc::pid_t, signal) } != 0 {
            return Err(ReplicaError::Signal {
                identity: self.identity.clone(),
                pid: self.pid(),
                signal: name,
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Polls the process's state until `done` holds of it (a signal is delivered
    /// asynchronously). Fails if it ends meanwhile.
    fn settle(&mut self, what: &str, done: impl Fn(char) -> bool) -> Result<(), ReplicaError> {
        let began = Instant::now();
        loop {
            match proc_state(self.pid()) {
                Some('Z' | 'X') | None => {
                    let status = self.child.wait().map_err(|source| self.wait_err(source))?;
                    self.exited = Some(status);
                    return Err(ReplicaError::Exited {
                        identity: self.identity.clone(),
                        pid: self.pid(),
                        status,
                    });
                }
                Some(state) if done(state) => return Ok(()),
                Some(_) => {}
            }
            if began.elapsed() >= SIGNAL_SETTLE {
                return Err(self.timeout(what, SIGNAL_SETTLE));
            }
            // A signal takes effect within a scheduling tick: a short blocking wait.
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn wait_err(&self, source: io::Error) -> ReplicaError {
        ReplicaError::Wait {
            identity: self.identity.clone(),
            pid: self.pid(),
            source,
        }
    }

    fn timeout(&self, what: &str, waited: Duration) -> ReplicaError {
        ReplicaError::Timeout {
            identity: self.identity.clone(),
            pid: self.pid(),
            what: what.to_owned(),
            waited,
        }
    }
}

impl Drop for ReplicaProcess {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// The state letter of process `pid` in `/proc/<pid>/stat` (`R` running, `S` sleeping,
/// `D` waiting on I/O, `T` stopped, `t` stopped by a tracer, `Z` zombie); None if there
/// is no such process.
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ...": the name may hold spaces and parentheses, so the state is
    // read after the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn spec() -> ReplicaSpec {
        ReplicaSpec::new(
            ApiAccess::token("https://127.0.0.1:6443", "PEM", "tok"),
            "replica-0",
            "http://127.0.0.1:1234",
        )
    }

    fn log_dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    /// Waits (briefly) until `pid` is in a state `ok` accepts.
    fn wait_state(pid: u32, ok: impl Fn(Option<char>) -> bool) -> Option<char> {
        let began = Instant::now();
        loop {
            let state = proc_state(pid);
            if ok(state) || began.elapsed() > Duration::from_secs(5) {
                return state;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn the_spec_goes_through_json() {
        let mut spec = spec();
        spec.dra = true;
        spec.lease.duration = Duration::from_millis(1500);
        spec.max_concurrent_reconciles = Some(4);
        spec.metrics_addr = Some("127.0.0.1:0".parse().unwrap());
        let json = spec.to_json().unwrap();
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["lease"]["duration"], 1500);
        assert_eq!(value["timings"]["poll_interval"], 200);
        assert_eq!(value["api"]["kind"], "token");
        assert_eq!(ReplicaSpec::from_json(&json).unwrap(), spec);
        let other = spec.with_identity("replica-1");
        assert_eq!(
            (other.identity.as_str(), other.lease.clone()),
            ("replica-1", spec.lease)
        );
        assert!(matches!(
            ReplicaSpec::from_json("{}"),
            Err(ReplicaError::BadSpec(_))
        ));
        let kubeconfig = ApiAccess::Kubeconfig {
            path: "/tmp/kc".into(),
        };
        let text = serde_json::to_string(&kubeconfig).unwrap();
        assert_eq!(
            serde_json::from_str::<ApiAccess>(&text).unwrap(),
            kubeconfig
        );
    }

    #[test]
    fn the_operator_is_configured_from_the_spec() {
        let mut spec = spec();
        spec.lease.name = "cro-test".into();
        spec.lease.namespace = "lease-ns".into();
        spec.lease.duration = Duration::from_secs(3);
        spec.lease.renew_period = Duration::from_millis(500);
        spec.namespace = "ops".into();
        spec.dra = true;
        let config = spec.operator_config();
        assert_eq!(config.provider, ProviderSource::Objects);
        assert_eq!(config.namespace, "ops");
        assert_eq!(config.mode, ExposureMode::Dra);
        assert_eq!(config.timings.poll_interval, Duration::from_millis(200));
        assert_eq!(
            ReplicaTimings::from(&config.timings),
            ReplicaTimings::fast()
        );
        assert_eq!(config.metrics_addr, None);
        let le = config.leader_election.expect("leader election");
        assert_eq!(
            (
                le.namespace.as_str(),
                le.lease_name.as_str(),
                le.identity.as_str()
            ),
            ("lease-ns", "cro-test", "replica-0")
        );
        assert_eq!(
            (le.lease_duration, le.renew_period),
            (Duration::from_secs(3), Duration::from_millis(500))
        );
    }

    #[tokio::test]
    async fn an_api_server_is_reached_with_the_token_and_ca() {
        let fabric = fabric_sim::FabricSim::start(fabric_sim::SimConfig::default()).unwrap();
        let access = ApiAccess::token("https://127.0.0.1:6443", fabric.ca_pem(), "tok");
        let config = access.client_config().await.unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/");
        assert_eq!(config.root_cert.as_ref().map(Vec::len), Some(1));
        assert!(config.auth_info.token.is_some());
        let missing = ApiAccess::Kubeconfig {
            path: "/nonexistent/kubeconfig".into(),
        };
        assert!(matches!(
            missing.client_config().await,
            Err(ReplicaError::Kubeconfig(_))
        ));
    }

    #[tokio::test]
    async fn a_process_is_stopped_continued_and_killed() {
        let dir = log_dir();
        let mut p =
            ReplicaProcess::spawn("sleep", ["30"], &spec(), &dir.path().join("r/0.log")).unwrap();
        let pid = p.pid();
        assert_eq!(p.identity(), "replica-0");
        assert!(matches!(wait_state(pid, |s| s == Some('S')), Some('S')));
        p.stop().unwrap();
        assert_eq!(proc_state(pid), Some('T'));
        assert_eq!(p.state(), Some('T'));
        p.cont().unwrap();
        assert!(matches!(proc_state(pid), Some('S' | 'R')));
        // A stopped process is killed too.
        p.stop().unwrap();
        let status = p.kill().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert_eq!(p.state(), None);
        assert_eq!(proc_state(pid), None, "reaped");
        assert_eq!(p.kill().unwrap().signal(), Some(libc::SIGKILL));
        assert!(matches!(p.stop(), Err(ReplicaError::Exited { .. })));
        assert!(p.log_path().exists());
    }

    #[tokio::test]
    async fn terminate_ends_a_stopped_process_or_kills_it_at_the_deadline() {
        let dir = log_dir();
        let mut p =
            ReplicaProcess::spawn("sleep", ["30"], &spec(), &dir.path().join("t.log")).unwrap();
        wait_state(p.pid(), |s| s == Some('S'));
        p.stop().unwrap();
        let status = p.terminate(Duration::from_secs(10)).await.unwrap();
        assert_eq!(status.signal(), Some(libc::SIGTERM));

        // A process that ignores SIGTERM is killed at the deadline.
        let mut p = ReplicaProcess::spawn(
            "sh",
            ["-c", "trap '' TERM; echo ready; while :; do sleep 1; done"],
            &spec(),
            &dir.path().join("stubborn.log"),
        )
        .unwrap();
        p.wait_for_log("ready", Duration::from_secs(10))
            .await
            .unwrap();
        let e = p.terminate(Duration::from_millis(300)).await.unwrap_err();
        assert!(matches!(e, ReplicaError::Timeout { .. }), "{e}");
        assert_eq!(
            p.try_wait().unwrap().and_then(|s| s.signal()),
            Some(libc::SIGKILL)
        );
    }

    #[tokio::test]
    async fn the_child_gets_the_spec_and_its_output_goes_to_the_log() {
        let dir = log_dir();
        let log = dir.path().join("spec.log");
        let spec = spec();
        let mut p = ReplicaProcess::spawn(
            "sh",
            [
                "-c",
                "printf '%s\\n' \"$CRO_REPLICA_SPEC\"; echo to-stderr >&2",
            ],
            &spec,
            &log,
        )
        .unwrap();
        let status = p.wait(Duration::from_secs(10)).await.unwrap();
        assert!(status.success());
        p.wait_for_log("to-stderr", Duration::from_secs(1))
            .await
            .unwrap();
        let text = p.log();
        let first = text.lines().next().unwrap();
        assert_eq!(ReplicaSpec::from_json(first).unwrap(), spec);
        // A process that ends without the line is reported as ended.
        let e = p
            .wait_for_log("never", Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(matches!(e, ReplicaError::Exited { .. }), "{e}");

        // Restarted under the same log: appended.
        let mut again = ReplicaProcess::spawn("sh", ["-c", "echo second"], &spec, &log).unwrap();
        again
            .wait_for_log("second", Duration::from_secs(10))
            .await
            .unwrap();
        assert!(again.log().starts_with(first));
    }

    #[test]
    fn dropping_kills_the_process() {
        let dir = log_dir();
        let p = ReplicaProcess::spawn("sleep", ["30"], &spec(), &dir.path().join("d.log")).unwrap();
        let pid = p.pid();
        assert!(proc_state(pid).is_some());
        drop(p);
        assert_eq!(proc_state(pid), None);
    }

    #[test]
    fn a_missing_program_is_an_error() {
        let dir = log_dir();
        let e = ReplicaProcess::spawn(
            "/nonexistent/replica",
            Vec::<String>::new(),
            &spec(),
            &dir.path().join("m.log"),
        )
        .unwrap_err();
        assert!(matches!(e, ReplicaError::Spawn { .. }), "{e}");
    }
}

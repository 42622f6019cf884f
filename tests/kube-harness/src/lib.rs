//! A real Kubernetes API server for tests.
//!
//! [`Harness::start`] starts etcd and kube-apiserver on free loopback ports in a fresh
//! temporary directory, waits until `/readyz` answers, installs the CRDs from the
//! repository's `crds/` and waits until they are served. Dropping the harness kills both
//! processes and removes the directory, also when the test panics; if the test process is
//! killed instead, the kernel kills the processes (`PR_SET_PDEATHSIG`) and the next harness
//! sweeps the directory away.
//!
//! With `CRO_TEST_USE_EXISTING_CLUSTER=1` the harness uses the cluster of `KUBECONFIG`
//! instead (still installing the CRDs) and starts nothing.
//!
//! ```no_run
//! # async fn f() -> Result<(), kube_harness::HarnessError> {
//! let harness = kube_harness::Harness::start().await?;
//! let client = harness.client()?;
//! // other processes: harness.kubeconfig_path(), or server_url() + token() + ca_pem()
//! # Ok(()) }
//! ```
//!
//! There is no controller-manager: no garbage collection of owner references and no
//! namespace finalization. Tests must not rely on them. [`real_node`] is the other world:
//! a whole one-node cluster (controller-manager, scheduler, containerd, a kubelet).
//!
//! Environment: `CRO_KUBE_APISERVER` + `CRO_ETCD`, `KUBEBUILDER_ASSETS`, `CRO_CACHE_DIR`,
//! `CRO_K8S_VERSION` (see [`binaries`]), `CRO_TEST_STARTUP_TIMEOUT_SECS` (default 180),
//! `CRO_TEST_USE_EXISTING_CLUSTER`.

pub mod binaries;
mod certs;
mod cleanup;
mod control_plane;
mod crds;
pub mod manifests;
mod process;
pub mod real_node;
pub mod tools;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

pub use binaries::{Binaries, BinariesError, locate as locate_binaries};
pub use cleanup::{DIR_PREFIX, sweep_stale_dirs};
pub use control_plane::{StartError, StartupTimings};
pub use crds::{CrdInstallError, install_crds, read_crd_dir};
pub use process::{pid_alive, spawn_tied};

use control_plane::LocalControlPlane;

/// The repository's generated CRDs.
pub const DEFAULT_CRD_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../crds");
/// Environment variable that switches to the cluster of `KUBECONFIG`.
pub const USE_EXISTING_CLUSTER_ENV: &str = "CRO_TEST_USE_EXISTING_CLUSTER";
/// Environment variable overriding the startup deadline, in seconds.
pub const STARTUP_TIMEOUT_ENV: &str = "CRO_TEST_STARTUP_TIMEOUT_SECS";
const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(180);

/// Why the harness could not start or hand out a client.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The binaries could not be found or built.
    #[error(transparent)]
    Binaries(#[from] BinariesError),
    /// The control plane did not come up.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The CRDs could not be installed.
    #[error(transparent)]
    Crds(#[from] CrdInstallError),
    /// The existing cluster's kubeconfig could not be loaded.
    #[error("cannot load the kubeconfig of the existing cluster: {0}")]
    ExistingCluster(String),
    /// A client could not be built (for example outside a Tokio runtime).
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// The blocking lookup of the binaries was cancelled.
    #[error("the lookup of the control-plane binaries did not finish: {0}")]
    Join(String),
    /// Asked to restart the API server of a cluster this harness did not start.
    #[error("the API server of an existing cluster is not ours to restart")]
    NotLocal,
}

/// Installs ring as the process's rustls provider (kube's rustls needs one); idempotent.
pub fn install_crypto_provider() {
    // Fails only when a provider is already installed, which is what we want anyway.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Options for starting a [`Harness`].
#[derive(Clone, Debug)]
pub struct HarnessBuilder {
    crd_dirs: Vec<PathBuf>,
    extra_crds: Vec<CustomResourceDefinition>,
    apiserver_args: Vec<String>,
    startup_timeout: Duration,
    use_existing_cluster: bool,
    profile: control_plane::Profile,
}

impl Default for HarnessBuilder {
    fn default() -> Self {
        let startup_timeout = std::env::var(STARTUP_TIMEOUT_ENV)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_STARTUP_TIMEOUT);
        Self {
            crd_dirs: vec![PathBuf::from(DEFAULT_CRD_DIR)],
            extra_crds: Vec::new(),
            apiserver_args: Vec::new(),
            startup_timeout,
            use_existing_cluster: std::env::var(USE_EXISTING_CLUSTER_ENV)
                .is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes")),
            profile: control_plane::Profile::default(),
        }
    }
}

impl HarnessBuilder {
    /// Installs no CRDs from the repository's `crds/` (other dirs and CRDs still apply).
    pub fn without_default_crds(mut self) -> Self {
        self.crd_dirs.retain(|d| d != Path::new(DEFAULT_CRD_DIR));
        self
    }

    /// Also installs the CRDs of the YAML files in `dir`.
    pub fn crd_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.crd_dirs.push(dir.into());
        self
    }

    /// Also installs `crd` (e.g. `SomeKind::crd()`, or a stand-in for a third-party kind).
    pub fn crd(mut self, crd: CustomResourceDefinition) -> Self {
        self.extra_crds.push(crd);
        self
    }

    /// Passes an extra flag to kube-apiserver, e.g. `--runtime-config=...` or
    /// `--feature-gates=...` for beta APIs. Ignored for an existing cluster.
    pub fn apiserver_arg(mut self, arg: impl Into<String>) -> Self {
        self.apiserver_args.push(arg.into());
        self
    }

    /// How long starting and installing CRDs may take in total.
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// Uses the cluster of `KUBECONFIG` instead of starting one (default: from
    /// `CRO_TEST_USE_EXISTING_CLUSTER`).
    pub fn use_existing_cluster(mut self, yes: bool) -> Self {
        self.use_existing_cluster = yes;
        self
    }

    /// Serves a real node's cluster (see [`real_node`]): Node authorization, admission as
    /// real clusters run it, a kubelet client certificate. Never an existing cluster.
    pub(crate) fn for_real_node(mut self) -> Self {
        self.profile = control_plane::Profile::RealNode;
        self.use_existing_cluster = false;
        self
    }

    /// Starts the control plane (or connects to the existing cluster) and installs the CRDs.
    pub async fn start(self) -> Result<Harness, HarnessError> {
        install_crypto_provider();
        let deadline = Instant::now() + self.startup_timeout;
        let mut crds = Vec::new();
        for dir in &self.crd_dirs {
            crds.extend(read_crd_dir(dir)?);
        }
        crds.extend(self.extra_crds.iter().cloned());

        let harness = if self.use_existing_cluster {
            Harness::existing().await?
        } else {
            // Sweeping first keeps /tmp clean after killed runs; it never touches live dirs.
            sweep_stale_dirs();
            let binaries = tokio::task::spawn_blocking(binaries::locate)
                .await
                .map_err(|e| HarnessError::Join(e.to_string()))??;
            let local =
                LocalControlPlane::start(&binaries, &self.apiserver_args, self.profile, deadline)
                    .await?;
            Harness {
                config: local.config.clone(),
                kubeconfig_path: Some(local.kubeconfig_path.clone()),
                local: Some(local),
                crd_time: Duration::ZERO,
            }
        };
        let t = Instant::now();
        let mut harness = harness;
        if !crds.is_empty() {
            let remaining = deadline.saturating_duration_since(Instant::now());
            install_crds(&harness.client()?, &crds, remaining).await?;
        }
        harness.crd_time = t.elapsed();
        Ok(harness)
    }
}

/// A Kubernetes API server for a test; see the crate documentation.
#[derive(Debug)]
pub struct Harness {
    config: kube::Config,
    kubeconfig_path: Option<PathBuf>,
    local: Option<LocalControlPlane>,
    crd_time: Duration,
}

impl Harness {
    /// Starts with the default options: the repository's CRDs, environment-controlled mode.
    pub async fn start() -> Result<Self, HarnessError> {
        HarnessBuilder::default().start().await
    }

    /// Options for starting.
    pub fn builder() -> HarnessBuilder {
        HarnessBuilder::default()
    }

    async fn existing() -> Result<Self, HarnessError> {
        let config = kube::Config::from_kubeconfig(&kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| HarnessError::ExistingCluster(e.to_string()))?;
        let kubeconfig_path = std::env::var_os("KUBECONFIG")
            .and_then(|v| std::env::split_paths(&v).next())
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".kube/config")));
        Ok(Self {
            config,
            kubeconfig_path,
            local: None,
            crd_time: Duration::ZERO,
        })
    }

    /// A new client for the current Tokio runtime. Take one per test: a client keeps a
    /// background task on the runtime that created it.
    pub fn client(&self) -> Result<kube::Client, HarnessError> {
        kube::Client::try_from(self.config.clone()).map_err(HarnessError::Client)
    }

    /// The client configuration (server URL, CA, token).
    pub fn config(&self) -> &kube::Config {
        &self.config
    }

    /// A kubeconfig file for other processes (the operator binary, kubectl).
    pub fn kubeconfig_path(&self) -> Option<&Path> {
        self.kubeconfig_path.as_deref()
    }

    /// The API server's URL.
    pub fn server_url(&self) -> String {
        match &self.local {
            Some(local) => local.server_url.clone(),
            None => self.config.cluster_url.to_string(),
        }
    }

    /// The admin bearer token of a local control plane.
    pub fn token(&self) -> Option<&str> {
        self.local
            .as_ref()
            .map(|l| l.credentials.admin_token.as_str())
    }

    /// The CA certificate (PEM) of a local control plane.
    pub fn ca_pem(&self) -> Option<&str> {
        self.local.as_ref().map(|l| l.credentials.ca_pem.as_str())
    }

    /// A token the API server issues (TokenRequest) for the ServiceAccount
    /// `namespace/name`, valid for `ttl`: what a pod of that account would present, so a
    /// test (or a process it starts) runs under exactly the account's RBAC. The
    /// ServiceAccount must exist.
    pub async fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
        ttl: Duration,
    ) -> Result<String, HarnessError> {
        use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
        use k8s_openapi::api::core::v1::ServiceAccount;
        let api: kube::Api<ServiceAccount> = kube::Api::namespaced(self.client()?, namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX)),
                ..Default::default()
            }),
            ..Default::default()
        };
        let issued = api
            .create_token_request(name, &Default::default(), &request)
            .await
            .map_err(HarnessError::Client)?;
        issued
            .status
            .and_then(|s| s.token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                HarnessError::ExistingCluster("the TokenRequest returned no token".into())
            })
    }

    /// A client configuration that authenticates with [`Self::service_account_token`].
    pub async fn service_account_config(
        &self,
        namespace: &str,
        name: &str,
        ttl: Duration,
    ) -> Result<kube::Config, HarnessError> {
        let token = self.service_account_token(namespace, name, ttl).await?;
        let mut config = self.config.clone();
        config.auth_info = kube::config::AuthInfo {
            token: Some(secrecy::SecretString::from(token)),
            ..Default::default()
        };
        Ok(config)
    }

    /// Whether this is the cluster of `KUBECONFIG` rather than a local control plane.
    pub fn is_existing_cluster(&self) -> bool {
        self.local.is_none()
    }

    /// The temporary directory of a local control plane (logs: `etcd.log`,
    /// `kube-apiserver.log`).
    pub fn dir(&self) -> Option<&Path> {
        self.local.as_ref().map(|l| l.dir())
    }

    /// Kills kube-apiserver (SIGKILL, as a crash) and starts it again on the same port with
    /// the same flags; everything is kept in etcd. Returns, once `/readyz` answers again,
    /// how long the API server was gone. Clients built before keep working.
    pub async fn restart_apiserver(&self, timeout: Duration) -> Result<Duration, HarnessError> {
        let local = self.local.as_ref().ok_or(HarnessError::NotLocal)?;
        Ok(local.restart_apiserver(timeout).await?)
    }

    /// Process ids of kube-apiserver and etcd of a local control plane.
    pub fn pids(&self) -> Vec<u32> {
        self.local
            .as_ref()
            .map(|l| l.pids().to_vec())
            .unwrap_or_default()
    }

    /// How long etcd, kube-apiserver and the CRDs took to become ready.
    pub fn startup_timings(&self) -> (StartupTimings, Duration) {
        (
            self.local.as_ref().map(|l| l.timings).unwrap_or_default(),
            self.crd_time,
        )
    }
}

/// One harness for the whole test binary, started by the first caller. Its processes and
/// directory are removed when the process exits. Tests sharing it must use distinct object
/// names and take their own [`Harness::client`].
pub async fn shared() -> Result<&'static Harness, HarnessError> {
    static SHARED: tokio::sync::OnceCell<Harness> = tokio::sync::OnceCell::const_new();
    SHARED.get_or_try_init(Harness::start).await
}

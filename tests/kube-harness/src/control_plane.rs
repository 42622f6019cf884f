//! A throw-away etcd + kube-apiserver on loopback, in a temporary directory.

use std::fs::OpenOptions;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use base64::Engine as _;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::binaries::Binaries;
use crate::certs::{CertError, Credentials};
use crate::cleanup::HarnessDir;
use crate::process::Supervised;

/// How often a port clash is retried with fresh ports before giving up.
const PORT_ATTEMPTS: u32 = 5;
const POLL_INTERVAL: Duration = Duration::from_millis(100);
const ETCD_READY: &str = "ready to serve client requests";
const ADDRESS_IN_USE: &str = "address already in use";

/// Why the control plane did not come up.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// Credentials could not be generated.
    #[error(transparent)]
    Certs(#[from] CertError),
    /// A process exited during startup.
    #[error("{name} exited during startup ({status}); end of {log}:\n{tail}")]
    Exited {
        /// Which process.
        name: &'static str,
        /// How it exited.
        status: String,
        /// Its log file.
        log: String,
        /// The end of its log.
        tail: String,
    },
    /// A process did not become ready in time.
    #[error(
        "{name} was not ready within {waited:?}; last problem: {last_problem}; end of {log}:\n{tail}"
    )]
    Timeout {
        /// Which process.
        name: &'static str,
        /// How long we waited.
        waited: Duration,
        /// The last readiness error seen.
        last_problem: String,
        /// Its log file.
        log: String,
        /// The end of its log.
        tail: String,
    },
    /// Every attempt clashed with another process over a port.
    #[error("{name} found its port taken in {PORT_ATTEMPTS} attempts")]
    PortsExhausted {
        /// Which process.
        name: &'static str,
    },
    /// The generated kubeconfig was not usable.
    #[error("the generated kubeconfig is not usable: {0}")]
    Kubeconfig(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StartError {
    let what = what.into();
    move |source| StartError::Io { what, source }
}

/// How long each startup step took.
#[derive(Clone, Copy, Debug, Default)]
pub struct StartupTimings {
    /// Until etcd served clients.
    pub etcd: Duration,
    /// Until kube-apiserver answered `/readyz`.
    pub apiserver: Duration,
}

/// A running control plane. Dropping it kills both processes and removes the directory.
// Field order is drop order: the API server, then etcd, then the directory they use.
#[derive(Debug)]
pub struct LocalControlPlane {
    /// Replaced in place by [`LocalControlPlane::restart_apiserver`] (the harness is shared).
    apiserver: Mutex<Supervised>,
    /// How the API server was started, to start it again the same way.
    apiserver_command: (PathBuf, Vec<String>),
    etcd: Supervised,
    dir: HarnessDir,
    pub(crate) server_url: String,
    pub(crate) credentials: Credentials,
    pub(crate) kubeconfig_path: PathBuf,
    pub(crate) config: kube::Config,
    pub(crate) timings: StartupTimings,
}

impl LocalControlPlane {
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn pids(&self) -> [u32; 2] {
        let apiserver = self
            .apiserver
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pid();
        [apiserver, self.etcd.pid()]
    }

    /// Kills kube-apiserver (SIGKILL, as a crash) and starts it again on the same port
    /// with the same flags; etcd keeps every object, so clients carry on once it answers
    /// `/readyz` again. Returns how long it was gone.
    pub(crate) async fn restart_apiserver(
        &self,
        timeout: Duration,
    ) -> Result<Duration, StartError> {
        let t0 = Instant::now();
        self.apiserver
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .kill();
        let (program, args) = &self.apiserver_command;
        let log = self.dir.path().join("kube-apiserver.log");
        let mut process = spawn_logged(
            &self.dir,
            "kube-apiserver",
            program,
            args,
            &log,
            Restart::Append,
        )?;
        wait_apiserver_ready(&mut process, &self.config, &log, Instant::now() + timeout).await?;
        *self
            .apiserver
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = process;
        Ok(t0.elapsed())
    }

    /// Starts etcd, then kube-apiserver, and waits until `/readyz` answers.
    pub(crate) async fn start(
        binaries: &Binaries,
        extra_apiserver_args: &[String],
        profile: Profile,
        deadline: Instant,
    ) -> Result<Self, StartError> {
        Self::start_with_ports(
            binaries,
            extra_apiserver_args,
            profile,
            deadline,
            &mut free_ports,
        )
        .await
    }

    /// [`Self::start`] with the port choice injected, so tests can force clashes.
    async fn start_with_ports(
        binaries: &Binaries,
        extra_apiserver_args: &[String],
        profile: Profile,
        deadline: Instant,
        pick_ports: &mut PortPicker<'_>,
    ) -> Result<Self, StartError> {
        let dir = HarnessDir::create().map_err(io_err("cannot create the harness directory"))?;
        let credentials = Credentials::generate()?;
        let files = write_credentials(dir.path(), &credentials, profile)?;

        let t0 = Instant::now();
        let (etcd, etcd_port) = start_etcd(&dir, &binaries.etcd, deadline, pick_ports).await?;
        let etcd_time = t0.elapsed();

        let t1 = Instant::now();
        let mut attempt = 0;
        let (apiserver, args, server_url, kubeconfig_path, config) = loop {
            attempt += 1;
            let port = pick_ports(1)?[0];
            let server_url = format!("https://127.0.0.1:{port}");
            let kubeconfig_path = dir.path().join("kubeconfig");
            let kubeconfig = kubeconfig_yaml(&server_url, &credentials);
            std::fs::write(&kubeconfig_path, &kubeconfig)
                .map_err(io_err("cannot write the kubeconfig"))?;
            let config = config_from_kubeconfig(&kubeconfig).await?;

            let mut args = apiserver_args(port, etcd_port, &files, profile);
            args.extend(extra_apiserver_args.iter().cloned());
            let log = dir.path().join("kube-apiserver.log");
            let mut apiserver = spawn_logged(
                &dir,
                "kube-apiserver",
                &binaries.kube_apiserver,
                &args,
                &log,
                Restart::Truncate,
            )?;
            match wait_apiserver_ready(&mut apiserver, &config, &log, deadline).await {
                Ok(()) => break (apiserver, args, server_url, kubeconfig_path, config),
                Err(StartError::Exited { tail, .. })
                    if tail.contains(ADDRESS_IN_USE) && attempt < PORT_ATTEMPTS => {}
                Err(StartError::Exited { tail, .. }) if tail.contains(ADDRESS_IN_USE) => {
                    return Err(StartError::PortsExhausted {
                        name: "kube-apiserver",
                    });
                }
                Err(e) => return Err(e),
            }
        };
        let timings = StartupTimings {
            etcd: etcd_time,
            apiserver: t1.elapsed(),
        };
        Ok(Self {
            apiserver: Mutex::new(apiserver),
            apiserver_command: (binaries.kube_apiserver.clone(), args),
            etcd,
            dir,
            server_url,
            credentials,
            kubeconfig_path,
            config,
            timings,
        })
    }
}

/// What the API server serves: tests against the API alone, or a real node's cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Profile {
    /// No kubelet, no controller-manager: RBAC only, no ServiceAccount admission.
    #[default]
    ApiOnly,
    /// A kubelet and a controller-manager join: Node authorization and NodeRestriction
    /// (as real clusters run), ServiceAccount admission (the controller-manager makes the
    /// tokens), a client certificate the kubelet trusts for exec and logs, and a loopback
    /// service range so nothing ever points at a routable address.
    RealNode,
}

struct CredentialFiles {
    ca: PathBuf,
    kubelet_client_cert: PathBuf,
    kubelet_client_key: PathBuf,
    serving_cert: PathBuf,
    serving_key: PathBuf,
    sa_key: PathBuf,
    sa_public: PathBuf,
    tokens: PathBuf,
}

fn write_credentials(
    dir: &Path,
    c: &Credentials,
    profile: Profile,
) -> Result<CredentialFiles, StartError> {
    let files = CredentialFiles {
        ca: dir.join("ca.crt"),
        kubelet_client_cert: dir.join("apiserver-kubelet-client.crt"),
        kubelet_client_key: dir.join("apiserver-kubelet-client.key"),
        serving_cert: dir.join("apiserver.crt"),
        serving_key: dir.join("apiserver.key"),
        sa_key: dir.join("sa.key"),
        sa_public: dir.join("sa.pub"),
        tokens: dir.join("tokens.csv"),
    };
    for (path, content) in [
        (&files.ca, &c.ca_pem),
        (&files.serving_cert, &c.serving_cert_pem),
        (&files.serving_key, &c.serving_key_pem),
        (&files.sa_key, &c.service_account_key_pem),
        (&files.sa_public, &c.service_account_public_pem),
        (&files.tokens, &c.token_file()),
    ] {
        std::fs::write(path, content)
            .map_err(io_err(format!("cannot write {}", path.display())))?;
    }
    if profile == Profile::RealNode {
        // The kubelet authorises the API server's exec, logs and port-forward calls by
        // this certificate's group.
        let (cert, key) = c.client_cert("kube-apiserver-kubelet-client", &["system:masters"])?;
        std::fs::write(&files.kubelet_client_cert, cert)
            .map_err(io_err("cannot write the kubelet client certificate"))?;
        std::fs::write(&files.kubelet_client_key, key)
            .map_err(io_err("cannot write the kubelet client key"))?;
        std::fs::write(dir.join("ca.key"), c.ca_key_pem())
            .map_err(io_err("cannot write the CA key"))?;
        // The kubelet's identity: the Node authorizer and NodeRestriction key on it.
        let node_user = format!("system:node:{}", crate::real_node::NODE_NAME);
        let (cert, key) = c.client_cert(&node_user, &["system:nodes"])?;
        std::fs::write(dir.join("node.crt"), cert)
            .map_err(io_err("cannot write the node certificate"))?;
        std::fs::write(dir.join("node.key"), key).map_err(io_err("cannot write the node key"))?;
    }
    Ok(files)
}

/// Chooses `n` distinct loopback ports.
type PortPicker<'a> = dyn FnMut(usize) -> Result<Vec<u16>, StartError> + Send + 'a;

/// `n` distinct ports free right now. Another process may take one before our server binds
/// it; the callers detect that from the server's exit and retry with new ones.
fn free_ports(n: usize) -> Result<Vec<u16>, StartError> {
    // Hold every listener until all are chosen so the ports differ.
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .map_err(io_err("cannot pick a free loopback port"))?;
    listeners
        .iter()
        .map(|l| {
            Ok(l.local_addr()
                .map_err(io_err("cannot read a bound port"))?
                .port())
        })
        .collect()
}

/// Whether a process's log starts afresh or continues its predecessor's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Restart {
    Truncate,
    Append,
}

fn spawn_logged(
    dir: &HarnessDir,
    name: &'static str,
    program: &Path,
    args: &[String],
    log: &Path,
    restart: Restart,
) -> Result<Supervised, StartError> {
    // A restarted process appends, keeping its predecessor's lines above its own; a
    // first start (or a retry on another port) begins a fresh log.
    let out = OpenOptions::new()
        .create(true)
        .write(true)
        .append(restart == Restart::Append)
        .truncate(restart == Restart::Truncate)
        .open(log)
        .map_err(io_err(format!("cannot create {}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(io_err("cannot duplicate a log file handle"))?;
    let mut command = Command::new(program);
    command
        .args(args)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    // etcd reads ETCD_* as flags, and a systemd socket would receive its readiness message.
    command.env_remove("NOTIFY_SOCKET");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("ETCD_") {
            command.env_remove(key);
        }
    }
    Supervised::spawn_in(dir, name, command)
        .map_err(io_err(format!("cannot start {}", program.display())))
}

async fn start_etcd(
    dir: &HarnessDir,
    etcd: &Path,
    deadline: Instant,
    pick_ports: &mut PortPicker<'_>,
) -> Result<(Supervised, u16), StartError> {
    let log = dir.path().join("etcd.log");
    for _ in 0..PORT_ATTEMPTS {
        let ports = pick_ports(2)?;
        let (client, peer) = (ports[0], ports[1]);
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let args = vec![
            "--name=harness".to_owned(),
            format!("--data-dir={}", dir.path().join("etcd").display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=harness={peer_url}"),
            // The data is thrown away; fsync would only slow every test down.
            "--unsafe-no-fsync=true".to_owned(),
        ];
        let mut process = spawn_logged(dir, "etcd", etcd, &args, &log, Restart::Truncate)?;
        // "ready" is logged only after our own listeners are bound, so a clash with another
        // etcd on the same port cannot be mistaken for success.
        match wait_for_log(&mut process, &log, ETCD_READY, deadline).await {
            Ok(()) => return Ok((process, client)),
            Err(StartError::Exited { tail, .. }) if tail.contains(ADDRESS_IN_USE) => {
                let _ = std::fs::remove_dir_all(dir.path().join("etcd"));
            }
            Err(e) => return Err(e),
        }
    }
    Err(StartError::PortsExhausted { name: "etcd" })
}

fn apiserver_args(port: u16, etcd_port: u16, f: &CredentialFiles, profile: Profile) -> Vec<String> {
    let p = |path: &Path| path.display().to_string();
    let mut args = vec![
        "--advertise-address=127.0.0.1".to_owned(),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--secure-port={port}"),
        format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
        format!("--tls-cert-file={}", p(&f.serving_cert)),
        format!("--tls-private-key-file={}", p(&f.serving_key)),
        format!("--client-ca-file={}", p(&f.ca)),
        format!("--token-auth-file={}", p(&f.tokens)),
        format!("--service-account-issuer=https://127.0.0.1:{port}"),
        format!("--service-account-key-file={}", p(&f.sa_public)),
        format!("--service-account-signing-key-file={}", p(&f.sa_key)),
        // Loopback addresses are not valid endpoints for the `kubernetes` Service.
        "--endpoint-reconciler-type=none".to_owned(),
        "--allow-privileged=true".to_owned(),
        // Go's pprof handlers, for a benchmark that profiles the API server
        // (CRO_KUBE_APISERVER_PROFILING=1; docs/BENCHMARKS.md).
        format!(
            "--profiling={}",
            std::env::var_os("CRO_KUBE_APISERVER_PROFILING").is_some()
        ),
    ];
    match profile {
        Profile::ApiOnly => args.extend([
            "--authorization-mode=RBAC".to_owned(),
            "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
            // No controller-manager creates service-account tokens.
            "--disable-admission-plugins=ServiceAccount".to_owned(),
        ]),
        Profile::RealNode => args.extend([
            "--authorization-mode=Node,RBAC".to_owned(),
            "--enable-admission-plugins=NodeRestriction".to_owned(),
            // A loopback range: the `kubernetes` Service's address is never routable.
            "--service-cluster-ip-range=127.96.0.0/16".to_owned(),
            format!("--kubelet-client-certificate={}", p(&f.kubelet_client_cert)),
            format!("--kubelet-client-key={}", p(&f.kubelet_client_key)),
            "--kubelet-preferred-address-types=InternalIP,Hostname".to_owned(),
            "--enable-aggregator-routing=true".to_owned(),
            // DRA's DeviceTaintRules (what cro's DRA mode taints a leaving GPU with) are
            // off by default in 1.36, as is the version that serves them.
            format!("--feature-gates={}", crate::real_node::FEATURE_GATES),
            "--runtime-config=resource.k8s.io/v1beta2=true".to_owned(),
        ]),
    }
    args
}

fn kubeconfig_yaml(server_url: &str, c: &Credentials) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(&c.ca_pem);
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cro-harness", "cluster": {"server": server_url, "certificate-authority-data": ca}}],
        "users": [{"name": "cro-admin", "user": {"token": c.admin_token}}],
        "contexts": [{"name": "cro-harness", "context": {"cluster": "cro-harness", "user": "cro-admin"}}],
        "current-context": "cro-harness",
    });
    // Serializing a JSON value cannot fail.
    serde_yaml::to_string(&doc).unwrap_or_default()
}

pub(crate) async fn config_from_kubeconfig(yaml: &str) -> Result<kube::Config, StartError> {
    let kubeconfig =
        Kubeconfig::from_yaml(yaml).map_err(|e| StartError::Kubeconfig(e.to_string()))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| StartError::Kubeconfig(e.to_string()))
}

fn log_tail(log: &Path) -> String {
    const TAIL: usize = 4000;
    let text = std::fs::read(log)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let start = text.len().saturating_sub(TAIL);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    text[start..].to_owned()
}

fn exited(process: &mut Supervised, log: &Path) -> Result<Option<StartError>, StartError> {
    let status = process
        .exit_status()
        .map_err(io_err(format!("cannot wait for {}", process.name())))?;
    Ok(status.map(|status| StartError::Exited {
        name: process.name(),
        status: status.to_string(),
        log: log.display().to_string(),
        tail: log_tail(log),
    }))
}

async fn wait_for_log(
    process: &mut Supervised,
    log: &Path,
    marker: &str,
    deadline: Instant,
) -> Result<(), StartError> {
    let started = Instant::now();
    loop {
        if std::fs::read_to_string(log).is_ok_and(|text| text.contains(marker)) {
            return Ok(());
        }
        if let Some(e) = exited(process, log)? {
            return Err(e);
        }
        if Instant::now() >= deadline {
            return Err(StartError::Timeout {
                name: process.name(),
                waited: started.elapsed(),
                last_problem: format!("no {marker:?} in the log"),
                log: log.display().to_string(),
                tail: log_tail(log),
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

async fn wait_apiserver_ready(
    process: &mut Supervised,
    config: &kube::Config,
    log: &Path,
    deadline: Instant,
) -> Result<(), StartError> {
    let started = Instant::now();
    let mut probe_config = config.clone();
    probe_config.connect_timeout = Some(Duration::from_secs(2));
    probe_config.read_timeout = Some(Duration::from_secs(10));
    let client =
        kube::Client::try_from(probe_config).map_err(|e| StartError::Kubeconfig(e.to_string()))?;
    loop {
        if let Some(e) = exited(process, log)? {
            return Err(e);
        }
        // Only our server can pass TLS verification against our fresh CA, so an answer
        // cannot come from another test's server that grabbed the same port.
        let last_problem = match http::Request::get("/readyz").body(Vec::new()) {
            Ok(request) => match client.request_text(request).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => format!("/readyz answered {body:?}"),
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(StartError::Timeout {
                name: process.name(),
                waited: started.elapsed(),
                last_problem,
                log: log.display().to_string(),
                tail: log_tail(log),
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_and_bindable() {
        let ports = free_ports(3).unwrap();
        assert!(ports[0] != ports[1] && ports[1] != ports[2] && ports[0] != ports[2]);
        for p in ports {
            drop(TcpListener::bind(("127.0.0.1", p)).unwrap());
        }
    }

    /// Real servers: a port taken between choosing and binding it makes the server exit,
    /// and the start is retried with new ports.
    #[tokio::test]
    async fn port_clashes_are_retried_with_new_ports() {
        crate::install_crypto_provider();
        let binaries = tokio::task::spawn_blocking(crate::binaries::locate)
            .await
            .unwrap()
            .unwrap();
        let squatter = TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = squatter.local_addr().unwrap().port();
        let mut calls = Vec::new();
        let mut picker = |n: usize| {
            calls.push(n);
            // First etcd attempt and first apiserver attempt get the taken port.
            if calls.len() == 1 || calls.len() == 3 {
                let mut ports = free_ports(n)?;
                ports[0] = taken;
                Ok(ports)
            } else {
                free_ports(n)
            }
        };
        let deadline = Instant::now() + Duration::from_secs(180);
        let cp = LocalControlPlane::start_with_ports(
            &binaries,
            &[],
            Profile::ApiOnly,
            deadline,
            &mut picker,
        )
        .await
        .unwrap();
        assert_eq!(calls, [2, 2, 1, 1]);
        assert!(!cp.server_url.ends_with(&format!(":{taken}")));
        let etcd_log = std::fs::read_to_string(cp.dir().join("etcd.log")).unwrap();
        assert!(
            !etcd_log.contains(ADDRESS_IN_USE),
            "the log is of the successful attempt"
        );
        let client = kube::Client::try_from(cp.config.clone()).unwrap();
        assert!(client.apiserver_version().await.is_ok());
        drop(squatter);
    }

    #[tokio::test]
    async fn the_kubeconfig_points_at_the_server_with_our_token_and_ca() {
        crate::install_crypto_provider();
        let creds = Credentials::generate().unwrap();
        let yaml = kubeconfig_yaml("https://127.0.0.1:6443", &creds);
        let config = config_from_kubeconfig(&yaml).await.unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/");
        assert_eq!(config.root_cert.as_ref().map(Vec::len), Some(1));
        assert!(yaml.contains(&creds.admin_token));
    }

    #[test]
    fn log_tail_keeps_the_end_on_a_char_boundary() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("x.log");
        std::fs::write(&log, format!("{}é{}", "a".repeat(10), "b".repeat(3999))).unwrap();
        let tail = log_tail(&log);
        assert!(tail.ends_with('b') && tail.len() <= 4000);
        assert_eq!(log_tail(&dir.path().join("missing")), "");
    }
}

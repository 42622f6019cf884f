//! A real one-node Kubernetes cluster on this machine, for the real-node test tier
//! (docs/real-node.md): etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
//! containerd (with runc and the loopback CNI plugin) and a kubelet, every listener on
//! loopback. The node is named `127.0.0.1`; pods must use `hostNetwork: true`; images
//! come from archives built here (`tests/real-node/images/build.sh`), imported into
//! containerd, so pods use `imagePullPolicy: Never`.
//!
//! The kubelet and containerd are not confined to a directory: the kubelet registers
//! device plugins under `/var/lib/kubelet/device-plugins`, writes `/var/log/pods`,
//! creates `kubepods` cgroups and changes kernel sysctls; containerd's shims keep state
//! under `/run/containerd`. So only one such cluster runs on a machine at a time (a
//! machine-wide lock, waited for), and [`RealNode::teardown`] undoes all of it: the
//! processes by PID, the containers, the mounts, the cgroups, the sockets, the sysctls.
//! [`RealNode::teardown`] returns what it could not undo, and [`Leftovers::check`] lets a
//! test prove nothing is left. A cluster left by a killed test process is swept by the
//! next start.

mod files;
mod host;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::Api;

use crate::process::Supervised;
use crate::{Harness, HarnessError};

pub use host::{Leftovers, SavedForCheck};

/// The node's name (the kubelet's `--hostname-override`; its InternalIP too).
pub const NODE_NAME: &str = "127.0.0.1";
/// The image of the GPU node software stand-ins.
pub const STANDIN_IMAGE: &str = "cro.local/node-standin:dev";
/// The pod sandbox image.
pub const PAUSE_IMAGE: &str = "cro.local/pause:dev";
/// Feature gates every component of the node runs with (beyond the defaults).
pub const FEATURE_GATES: &str = "DRADeviceTaintRules=true";
/// Where the kubelet registers device plugins, whatever its root directory.
pub const DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";

const NODE_BINARIES_SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../control-plane/ensure-node-binaries.sh"
);
const CONTAINERD_SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../real-node/containerd/build.sh"
);
const IMAGES_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../real-node/images/build.sh");
/// The machine-wide lock: one real node at a time.
const LOCK_FILE: &str = "/run/lock/cro-real-node.lock";
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Why the real node could not start (or be restarted).
#[derive(Debug, thiserror::Error)]
pub enum RealNodeError {
    /// Something this machine must have is missing; the message names it and how to get it.
    #[error("the real-node tier needs {0}")]
    Prerequisite(String),
    /// A script that builds binaries or images failed.
    #[error("{script} failed: {message}")]
    Build { script: String, message: String },
    /// A process could not be started or exited early; its log's tail is included.
    #[error("{name} did not start: {message}\n--- last lines of {log} ---\n{tail}")]
    Process {
        name: &'static str,
        message: String,
        log: String,
        tail: String,
    },
    /// Waiting for the node to become Ready (or another step) timed out.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout { what: String, waited: Duration },
    /// A file or directory of the cluster could not be written.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The API server part.
    #[error(transparent)]
    Harness(#[from] HarnessError),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RealNodeError {
    let what = what.into();
    move |source| RealNodeError::Io { what, source }
}

/// The running cluster; see the module documentation. Dropping it tears it down (errors
/// ignored); call [`RealNode::teardown`] to see what was left.
pub struct RealNode {
    kubelet: Option<Supervised>,
    scheduler: Option<Supervised>,
    controller_manager: Option<Supervised>,
    containerd: Option<Supervised>,
    harness: Option<Arc<Harness>>,
    paths: files::Paths,
    host: host::HostState,
    bins: PathBuf,
    /// containerd 1.7 and its shim (built once; Debian's 1.6 reads no CDI specs).
    containerd_bins: PathBuf,
    ports: files::Ports,
    /// The host before the node started, for a test's own check after teardown.
    before: host::SavedForCheck,
    torn_down: bool,
    /// Held for the cluster's life; the kernel releases it if the process dies.
    _lock: File,
    /// How long each step of [`RealNode::start`] took.
    pub timings: Vec<(&'static str, Duration)>,
}

impl std::fmt::Debug for RealNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNode")
            .field("dir", &self.paths.root)
            .finish_non_exhaustive()
    }
}

impl RealNode {
    /// Builds what is missing (once: the node binaries and images are cached outside the
    /// repository), waits for the machine-wide lock, sweeps what a killed run left, and
    /// starts the cluster; returns once the node is Ready.
    pub async fn start() -> Result<RealNode, RealNodeError> {
        let mut timings = Vec::new();
        let t = Instant::now();
        host::check_prerequisites()?;
        let (bins, containerd_bins, images) = tokio::task::spawn_blocking(build_dependencies)
            .await
            .map_err(|e| RealNodeError::Prerequisite(format!("a build thread: {e}")))??;
        timings.push(("binaries and images", t.elapsed()));

        let t = Instant::now();
        let lock = tokio::task::spawn_blocking(take_machine_lock)
            .await
            .map_err(|e| RealNodeError::Prerequisite(format!("the lock thread: {e}")))??;
        host::sweep_stale();
        timings.push(("machine lock and sweep", t.elapsed()));

        let before = host::SavedForCheck::now();
        let t = Instant::now();
        let harness = Harness::builder().for_real_node().start().await?;
        timings.push(("etcd and kube-apiserver", t.elapsed()));
        let root = harness
            .dir()
            .ok_or_else(|| RealNodeError::Prerequisite("a local control plane".into()))?
            .join("node");
        let paths = files::Paths::new(&root);
        let ports = files::Ports::pick()?;
        let host = host::HostState::save(&paths)?;
        let mut node = RealNode {
            kubelet: None,
            scheduler: None,
            controller_manager: None,
            containerd: None,
            harness: Some(Arc::new(harness)),
            paths,
            host,
            bins,
            containerd_bins,
            ports,
            before,
            torn_down: false,
            _lock: lock,
            timings,
        };
        node.boot(&images).await?;
        Ok(node)
    }

    async fn boot(&mut self, images: &[PathBuf]) -> Result<(), RealNodeError> {
        let harness = self.harness();
        files::write_all(&self.paths, harness, &self.ports)?;
        let t = Instant::now();
        self.containerd = Some(self.start_containerd().await?);
        for image in images {
            self.ctr(&["images", "import", &image.display().to_string()])?;
        }
        self.timings.push(("containerd and images", t.elapsed()));
        let t = Instant::now();
        self.controller_manager = Some(self.spawn_controller_manager()?);
        self.scheduler = Some(self.spawn_scheduler()?);
        self.kubelet = Some(self.spawn_kubelet()?);
        self.wait_node_ready().await?;
        self.timings.push(("node Ready", t.elapsed()));
        Ok(())
    }

    /// The API server side (client, kubeconfig, token).
    pub fn harness(&self) -> &Harness {
        // Some until teardown, which consumes self.
        self.harness
            .as_ref()
            .expect("the harness lives until teardown")
    }

    /// The API server side, shared (an environment built on the node keeps it; the API
    /// server then lives until the last holder is gone, after the node's teardown).
    pub fn harness_arc(&self) -> Arc<Harness> {
        self.harness
            .clone()
            .expect("the harness lives until teardown")
    }

    /// A client for the current runtime.
    pub fn client(&self) -> Result<kube::Client, HarnessError> {
        self.harness().client()
    }

    /// The directory holding every log (`containerd.log`, `kubelet.log`, ...).
    pub fn dir(&self) -> &Path {
        &self.paths.root
    }

    /// The address of the containerd socket (for `ctr --address`).
    pub fn containerd_address(&self) -> &Path {
        &self.paths.containerd_sock
    }

    /// The kubelet's root directory (`--root-dir`): a kubelet plugin registers under its
    /// `plugins_registry` and serves under its `plugins`.
    pub fn kubelet_root(&self) -> &Path {
        &self.paths.kubelet_root
    }

    /// The CDI spec directory the node's containerd reads.
    pub fn cdi_dir(&self) -> &Path {
        &self.paths.cdi_dir
    }

    /// The kubelet's pid (a test kills or restarts it).
    pub fn kubelet_pid(&self) -> Option<u32> {
        self.kubelet.as_ref().map(Supervised::pid)
    }

    /// The host as it was before this node started (sysctls, the host directories the
    /// node writes), for [`Leftovers::check`] after teardown.
    pub fn host_before(&self) -> host::SavedForCheck {
        self.before.clone()
    }

    /// The pids of every process this node started (containerd, the kubelet, the
    /// controllers, the API server and etcd).
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = [
            &self.kubelet,
            &self.scheduler,
            &self.controller_manager,
            &self.containerd,
        ]
        .into_iter()
        .flatten()
        .map(Supervised::pid)
        .collect();
        if let Some(h) = &self.harness {
            pids.extend(h.pids());
        }
        pids
    }

    /// Kills the kubelet (SIGKILL, as a crash) and starts it again; returns once the node
    /// is Ready again. Running containers survive, as they do on a real node.
    pub async fn restart_kubelet(&mut self) -> Result<(), RealNodeError> {
        if let Some(mut k) = self.kubelet.take() {
            k.kill();
        }
        self.kubelet = Some(self.spawn_kubelet()?);
        self.wait_node_ready().await
    }

    /// Kills containerd (SIGKILL, as a crash) and starts it again with the same
    /// configuration; returns once the node is Ready again. The shims run in their own
    /// process groups, so containers survive, as they do on a real node; the kubelet
    /// reconnects to the new containerd.
    pub async fn restart_containerd(&mut self) -> Result<(), RealNodeError> {
        if let Some(mut c) = self.containerd.take() {
            c.kill();
        }
        self.containerd = Some(self.start_containerd().await?);
        self.wait_node_ready().await
    }

    /// Waits until `namespace` has its `default` ServiceAccount (the controller-manager
    /// makes it a few seconds after the namespace; pods are refused before).
    pub async fn wait_default_service_account(&self, namespace: &str) -> Result<(), RealNodeError> {
        let client = self.client()?;
        let api: Api<ServiceAccount> = Api::namespaced(client, namespace);
        wait_for(
            &format!("the default ServiceAccount of {namespace}"),
            READY_TIMEOUT,
            || async { api.get_opt("default").await.ok().flatten().is_some() },
        )
        .await
    }

    /// Runs `ctr -n k8s.io <args>` against this cluster's containerd.
    pub fn ctr(&self, args: &[&str]) -> Result<String, RealNodeError> {
        host::ctr(&self.paths.containerd_sock, args)
    }

    /// Runs `kubectl <args>` (the one built with the node's binaries) as the cluster's
    /// admin, in `dir` (where `-k`/`-f` paths are relative to); returns its stdout.
    pub fn kubectl(&self, args: &[&str], dir: &Path) -> Result<String, RealNodeError> {
        let out = Command::new(self.bins.join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.paths.admin_kubeconfig)
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
            .map_err(io_err("cannot run kubectl"))?;
        if !out.status.success() {
            return Err(RealNodeError::Build {
                script: format!("kubectl {}", args.join(" ")),
                message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Stops everything and undoes every change to the host; returns what could not be
    /// undone (empty when all went well).
    pub async fn teardown(mut self) -> Leftovers {
        self.torn_down = true;
        self.stop_all()
    }

    fn stop_all(&mut self) -> Leftovers {
        let mut pids = Vec::new();
        for p in [
            &mut self.kubelet,
            &mut self.scheduler,
            &mut self.controller_manager,
        ] {
            if let Some(mut process) = p.take() {
                pids.push(process.pid());
                process.kill();
            }
        }
        let containerd = self.containerd.take();
        if let Some(c) = &containerd {
            pids.push(c.pid());
        }
        let shims = host::stop_containers(&self.paths, containerd);
        pids.extend(shims);
        // The API server goes with the last holder: an environment built on the node may
        // still hold it, and then stops it itself (it changes nothing on the host).
        if let Some(Ok(harness)) = self.harness.take().map(Arc::try_unwrap) {
            pids.extend(harness.pids());
            drop(harness);
        }
        self.host.restore(&self.paths, &pids)
    }

    async fn start_containerd(&self) -> Result<Supervised, RealNodeError> {
        let mut cmd = Command::new(self.containerd_bins.join("containerd"));
        cmd.arg("--config").arg(&self.paths.containerd_config);
        // containerd looks its shim up on PATH: ours first, the same version.
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![self.containerd_bins.clone()];
        dirs.extend(std::env::split_paths(&path));
        if let Ok(joined) = std::env::join_paths(dirs) {
            cmd.env("PATH", joined);
        }
        let mut process = spawn_logged("containerd", cmd, &self.paths.log("containerd"))?;
        let sock = self.paths.containerd_sock.clone();
        let log = self.paths.log("containerd");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if sock.exists() && host::ctr(&sock, &["version"]).is_ok() {
                return Ok(process);
            }
            if let Ok(Some(status)) = process.exit_status() {
                return Err(process_error(
                    "containerd",
                    format!("exited: {status}"),
                    &log,
                ));
            }
            if Instant::now() > deadline {
                return Err(process_error("containerd", "no socket".into(), &log));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn spawn_controller_manager(&self) -> Result<Supervised, RealNodeError> {
        let dir = self.harness_dir();
        let mut cmd = Command::new(self.bins.join("kube-controller-manager"));
        cmd.args(self.controller_args(self.ports.controller_manager));
        cmd.args([
            format!(
                "--service-account-private-key-file={}",
                dir.join("sa.key").display()
            ),
            format!("--root-ca-file={}", dir.join("ca.crt").display()),
            "--use-service-account-credentials=true".into(),
            format!(
                "--cluster-signing-cert-file={}",
                dir.join("ca.crt").display()
            ),
            format!(
                "--cluster-signing-key-file={}",
                dir.join("ca.key").display()
            ),
            // Quick reactions keep the tests short; nothing here is under load.
            "--node-monitor-period=2s".into(),
        ]);
        spawn_logged(
            "kube-controller-manager",
            cmd,
            &self.paths.log("kube-controller-manager"),
        )
    }

    fn spawn_scheduler(&self) -> Result<Supervised, RealNodeError> {
        let mut cmd = Command::new(self.bins.join("kube-scheduler"));
        cmd.args(self.controller_args(self.ports.scheduler));
        spawn_logged("kube-scheduler", cmd, &self.paths.log("kube-scheduler"))
    }

    /// What the controller-manager and the scheduler share: the admin kubeconfig for
    /// everything, loopback, one instance (no leader election), the node's feature gates.
    fn controller_args(&self, port: u16) -> Vec<String> {
        let kubeconfig = self.paths.admin_kubeconfig.display();
        vec![
            format!("--kubeconfig={kubeconfig}"),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            "--leader-elect=false".into(),
            format!("--feature-gates={FEATURE_GATES}"),
            "--profiling=false".into(),
        ]
    }

    fn spawn_kubelet(&self) -> Result<Supervised, RealNodeError> {
        let mut cmd = Command::new(self.bins.join("kubelet"));
        cmd.args([
            format!("--config={}", self.paths.kubelet_config.display()),
            format!("--kubeconfig={}", self.paths.kubelet_kubeconfig.display()),
            format!("--root-dir={}", self.paths.kubelet_root.display()),
            format!(
                "--cert-dir={}",
                self.paths.kubelet_root.join("pki").display()
            ),
            format!("--hostname-override={NODE_NAME}"),
            "--v=2".into(),
        ]);
        spawn_logged("kubelet", cmd, &self.paths.log("kubelet"))
    }

    fn harness_dir(&self) -> PathBuf {
        self.harness()
            .dir()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    async fn wait_node_ready(&self) -> Result<(), RealNodeError> {
        let api: Api<Node> = Api::all(self.client()?);
        let started = Instant::now();
        loop {
            if let Ok(Some(node)) = api.get_opt(NODE_NAME).await
                && node_ready(&node)
            {
                return Ok(());
            }
            for (name, process) in [("kubelet", &self.kubelet), ("containerd", &self.containerd)] {
                if let Some(p) = process
                    && !crate::pid_alive(p.pid())
                {
                    return Err(process_error(
                        if name == "kubelet" {
                            "kubelet"
                        } else {
                            "containerd"
                        },
                        "exited".into(),
                        &self.paths.log(name),
                    ));
                }
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(RealNodeError::Timeout {
                    what: format!(
                        "node {NODE_NAME} to be Ready (see {})",
                        self.paths.log("kubelet").display()
                    ),
                    waited: started.elapsed(),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if !self.torn_down {
            self.torn_down = true;
            let left = self.stop_all();
            if !left.is_empty() {
                eprintln!("real node teardown left: {left}");
            }
        }
    }
}

/// Whether the Node's Ready condition is True.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<(), RealNodeError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        if started.elapsed() > timeout {
            return Err(RealNodeError::Timeout {
                what: what.to_owned(),
                waited: started.elapsed(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

fn spawn_logged(
    name: &'static str,
    mut cmd: Command,
    log: &Path,
) -> Result<Supervised, RealNodeError> {
    // Appended to: a restarted kubelet or containerd keeps its predecessor's lines, which
    // say what it was doing when it was killed.
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(io_err(format!("cannot create {}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(io_err("cannot duplicate a log file handle"))?;
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    cmd.env_remove("NOTIFY_SOCKET");
    Supervised::spawn(name, cmd).map_err(|e| process_error(name, e.to_string(), log))
}

fn process_error(name: &'static str, message: String, log: &Path) -> RealNodeError {
    let text = std::fs::read(log)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(30)..].join("\n");
    RealNodeError::Process {
        name,
        message,
        log: log.display().to_string(),
        tail,
    }
}

/// Runs a build script and returns the lines of its stdout.
fn run_script(script: &str) -> Result<Vec<String>, RealNodeError> {
    let out = Command::new("bash")
        .arg(script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| RealNodeError::Build {
            script: script.into(),
            message: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(RealNodeError::Build {
            script: script.into(),
            message: format!("{} (its log is above)", out.status),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect())
}

/// The directory a build script printed last.
fn built_dir(script: &str) -> Result<PathBuf, RealNodeError> {
    run_script(script)?
        .last()
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .ok_or_else(|| RealNodeError::Build {
            script: script.into(),
            message: "printed no directory".into(),
        })
}

/// The node binaries' directory, containerd's, and the image archives.
fn build_dependencies() -> Result<(PathBuf, PathBuf, Vec<PathBuf>), RealNodeError> {
    let bins = built_dir(NODE_BINARIES_SCRIPT)?;
    let containerd_bins = built_dir(CONTAINERD_SCRIPT)?;
    let lines = run_script(IMAGES_SCRIPT)?;
    let images: Vec<PathBuf> = lines
        .iter()
        .rev()
        .take(2)
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .collect();
    if images.len() != 2 {
        return Err(RealNodeError::Build {
            script: IMAGES_SCRIPT.into(),
            message: format!("expected two image archives, got {lines:?}"),
        });
    }
    Ok((bins, containerd_bins, images))
}

fn take_machine_lock() -> Result<File, RealNodeError> {
    let _ = std::fs::create_dir_all("/run/lock");
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK_FILE)
        .map_err(io_err(format!("cannot open {LOCK_FILE}")))?;
    // SAFETY: flock on a descriptor we own; blocks until another test's cluster is gone.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    if rc != 0 {
        return Err(RealNodeError::Io {
            what: format!("cannot lock {LOCK_FILE}"),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(file)
}

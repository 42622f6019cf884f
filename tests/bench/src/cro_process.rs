//! The operator as a process of its own: the real `cro run` (host/cli), configured as a
//! deployment migrated from the Go operator is (the Go operator's environment selects
//! the shipped FTI component), on a cluster's kubeconfig. Its RSS is then the operator's
//! alone: the simulators, the harness and the benchmark's client stay in this process.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use fabric_sim::FabricSim;
use tokio::process::{Child, Command};

use crate::common::{GPU_NS, OPERATOR_NS};
use crate::rss::rss_of;

/// What `cro run` logs (at info) once it leads: the request controller runs, and (the
/// leader takes its Lease only after its first round of provider Leases) so does the
/// provider's resource controller. Before it, requests would be timed with the
/// operator's start-up in them (host/operator/src/process/run.rs). The line has to
/// follow what `run` logs: when it changed with the provider Leases, this stage waited
/// for the old one until its timeout.
const RUNNING_LINE: &str = "leading: request controller, claim binding and routing started";
/// Loading the component (compiled once, then from the cache), the CRD check, the
/// leader Lease and the caches' first listing; a debug build on 2 loaded cores is slow.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// A graceful stop waits for the reconciliations under way.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// The Go operator's variables that select the shipped FTI component, on the fabric
/// `sim` (FM API), its certificate checked against `ca_file` (host/operator/src/config/
/// compat.rs reads them; the credentials come from the Secret `credentials` in the
/// operator's namespace, which the environment's setup creates).
pub fn go_environment(
    sim: &FabricSim,
    ca_file: &Path,
    component: &Path,
) -> [(&'static str, String); 6] {
    [
        ("CDI_PROVIDER_TYPE", "FTI_CDI".to_owned()),
        ("FTI_CDI_API_TYPE", "FM".to_owned()),
        ("FTI_CDI_ENDPOINT", sim.endpoint()),
        ("FTI_CDI_TENANT_ID", sim.tenant_id().to_string()),
        ("CRO_FTI_CA_FILE", ca_file.display().to_string()),
        ("CRO_FTI_COMPONENT", component.display().to_string()),
    ]
}

/// The `cro` executable: `CRO_BENCH_CRO`, else the one beside this executable (one cargo
/// invocation that builds both packages puts them in the same directory).
pub fn cro_executable() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("CRO_BENCH_CRO") {
        return Ok(PathBuf::from(path));
    }
    let me = std::env::current_exe().context("cannot find this executable")?;
    let cro = me.with_file_name("cro");
    if !cro.is_file() {
        bail!(
            "no cro executable at {} (build it with cro-bench: `cargo build -p cro-bench -p cro`, or set CRO_BENCH_CRO)",
            cro.display()
        );
    }
    Ok(cro)
}

/// A running `cro run`, its log file, and the highest RSS sampled.
pub struct OperatorProcess {
    child: Child,
    pid: u32,
    log: PathBuf,
    peak: Mutex<u64>,
    /// The fabric's CA file (and an empty webhook certificate directory) it reads.
    _files: tempfile::TempDir,
}

impl OperatorProcess {
    /// Starts `cro run` on the cluster of `kubeconfig` and the fabric `sim`, its log
    /// (stdout and stderr) in `log`; returns once its controllers run.
    pub async fn start(kubeconfig: &Path, sim: &FabricSim, log: &Path) -> Result<Self> {
        Self::start_with(kubeconfig, sim, log, &[]).await
    }

    /// [`Self::start`] with more environment (flags by their variables).
    pub async fn start_with(
        kubeconfig: &Path,
        sim: &FabricSim,
        log: &Path,
        extra_env: &[(&str, String)],
    ) -> Result<Self> {
        let files = tempfile::tempdir()?;
        let ca = files.path().join("fabric-ca.pem");
        std::fs::write(&ca, sim.ca_pem())?;
        let component =
            cro_test_support::try_component("fti-provider").map_err(anyhow::Error::msg)?;
        let cro = cro_executable()?;
        let mut command = Command::new(&cro);
        command
            .arg("run")
            .envs(go_environment(sim, &ca, &component))
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAMESPACE", OPERATOR_NS)
            .env("NVIDIA_GPU_OPERATOR_NAMESPACE", GPU_NS)
            // Nothing scrapes it here, and the default port (8080) may be taken.
            .env("CRO_METRICS_ADDR", "0")
            // Certificates left in the Go operator's default directory must not turn
            // the webhook on.
            .env("CRO_WEBHOOK_CERT_DIR", files.path().join("no-webhook"))
            // The deployed log level (scripts/bench.sh turns logs off for its own
            // processes); the start line is read from it.
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("CRO_PROVIDER_SPEC")
            .env_remove("CRO_PROVIDER_OBJECTS")
            .envs(extra_env.iter().map(|(k, v)| (*k, v)));
        let child = spawn_logging(command, log)
            .with_context(|| format!("cannot start `{} run`", cro.display()))?;
        let pid = child.id().context("cro run exited at once")?;
        let mut operator = OperatorProcess {
            child,
            pid,
            log: log.to_owned(),
            peak: Mutex::new(0),
            _files: files,
        };
        operator.wait_running().await?;
        Ok(operator)
    }

    /// Waits for the start line in the log; fails if the process ends first.
    async fn wait_running(&mut self) -> Result<()> {
        let began = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "cro run exited ({status}) before it ran: {}",
                    self.log_tail()
                );
            }
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            if log.contains(RUNNING_LINE) {
                return Ok(());
            }
            if began.elapsed() > START_TIMEOUT {
                bail!(
                    "cro run did not start its controllers in {START_TIMEOUT:?}: {}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Its RSS now, counted in the sampled peak.
    pub fn sample(&self) -> u64 {
        let (rss, _) = rss_of(self.pid);
        let mut peak = self
            .peak
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *peak = (*peak).max(rss);
        rss
    }

    /// The highest RSS [`Self::sample`] saw.
    pub fn peak(&self) -> u64 {
        *self
            .peak
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The kernel's high-water mark of its RSS (VmHWM), since it started.
    pub fn hwm(&self) -> u64 {
        rss_of(self.pid).1
    }

    /// Stops it as Kubernetes does, with SIGTERM, and returns how it ended (killed if it
    /// does not end within [`STOP_TIMEOUT`]).
    pub async fn stop(mut self) -> Result<ExitStatus> {
        let sent = std::process::Command::new("kill")
            .args(["-s", "TERM", &self.pid.to_string()])
            .status()
            .context("cannot run kill")?;
        if !sent.success() {
            bail!("kill -s TERM {} failed ({sent})", self.pid);
        }
        match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => {
                self.child.kill().await?;
                bail!(
                    "cro run did not stop within {STOP_TIMEOUT:?} of SIGTERM: {}",
                    self.log_tail()
                )
            }
        }
    }

    /// The last lines of its log, for an error.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        format!("{}:\n{tail}", self.log.display())
    }
}

/// Spawns `command` with stdout and stderr appended to a new file `log`. The child is
/// killed if this process unwinds without stopping it (a panic in the shared test
/// setup), so no operator outlives the benchmark's cluster.
pub fn spawn_logging(mut command: Command, log: &Path) -> Result<Child> {
    let out = std::fs::File::create(log)
        .with_context(|| format!("cannot create the operator's log {}", log.display()))?;
    command
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .kill_on_drop(true);
    Ok(command.spawn()?)
}

//! N requests × 1 GPU on the real one-node cluster (docs/real-node.md): a kubelet and
//! containerd run the GPU operator's driver and the device plugin as real pods, and
//! every node command goes through the API server's `pods/exec`. The operator is the
//! real `cro run` in a process of its own (cro_process.rs); the fabric simulator, the
//! stand-in service and the node's cluster side stay in this process.
//!
//! Measured: the time from creating the requests to all Running (in all, and per
//! request from its own creation), to all deleted and detached; the round trip of one
//! `nvidia-smi` through `KubeExecRunner` into the driver pod; the operator process's RSS
//! when started, at its sampled peak while the requests converge, its high-water mark,
//! and idle after.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use cro_api::{ComposabilityRequest, ComposableResource};
use cro_operator::nodeops::{CommandRunner, KubeExecRunner, PodRef, running_and_ready};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::reflector;
use kube_harness::real_node::NODE_NAME;
use serde_json::{Value, json};

use crate::common::nodes::{NodeOptions, NodeSetup};
use crate::common::{Env, GPU_NS, MODEL};
use crate::converge::{
    create_requests, delete_requests, is_running, phase_deadline, progress, wait_until, watch_all,
};
use crate::cro_process::OperatorProcess;

/// Round trips timed (after one that is not: the first exec of a pod is slower).
const EXEC_CALLS: usize = 100;
/// How long the operator runs with nothing to do before its idle RSS is read (its
/// start, and after the requests are gone).
const SETTLE: Duration = Duration::from_secs(3);

pub fn main(n: usize) -> Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(run(n))?;
    println!("{result}");
    Ok(())
}

/// The requests and resources as the benchmark's watch caches see them.
struct Watched {
    requests: Api<ComposabilityRequest>,
    watched_requests: reflector::Store<ComposabilityRequest>,
    watched_resources: reflector::Store<ComposableResource>,
}

impl Watched {
    async fn start(env: &Env) -> Result<Watched> {
        let requests: Api<ComposabilityRequest> = Api::all(env.client.clone());
        let resources: Api<ComposableResource> = Api::all(env.client.clone());
        Ok(Watched {
            watched_requests: watch_all(requests.clone()).await?,
            watched_resources: watch_all(resources).await?,
            requests,
        })
    }

    /// The names of the requests that are Running.
    fn running(&self) -> Vec<String> {
        self.watched_requests
            .state()
            .iter()
            .filter(|r| is_running(r))
            .map(|r| r.name_any())
            .collect()
    }

    fn objects_left(&self) -> usize {
        self.watched_requests.state().len() + self.watched_resources.state().len()
    }
}

/// The operator process's memory in bytes.
struct OperatorRss {
    started: u64,
    peak: u64,
    hwm: u64,
    idle: u64,
}

async fn run(n: usize) -> Result<Value> {
    let began = Instant::now();
    let env = Env::start_real(NodeSetup::gpu_operator()).await;
    let machine = env.add_real_node(NodeOptions::default()).await;
    env.sim.add_free_devices("gpu", MODEL, n.max(1));
    let node_up_s = began.elapsed().as_secs_f64();
    progress(began, "real node up, its GPU software installed");
    let operator = start_operator(&env).await?;
    tokio::time::sleep(SETTLE).await;
    let started = operator.sample();
    progress(began, "operator process running and idle");

    let watched = Watched::start(&env).await?;
    let up = up_phase(&watched, &operator, n, began).await;
    let down = down_phase(&env, &watched, &operator, &machine, n, began).await;
    let operator_commands = env.node_sim.real().standin.exec_answered().len();
    tokio::time::sleep(SETTLE).await;
    let idle = operator.sample();
    let exec = exec_round_trips(&env, &watched, began).await?;
    let rss = OperatorRss {
        started,
        peak: operator.peak(),
        hwm: operator.hwm(),
        idle,
    };
    let exit = operator.stop().await?;
    progress(began, &format!("operator stopped: {exit}"));
    let figures = Figures {
        n,
        node_up_s,
        up,
        down,
        exec,
        rss,
        exit_code: exit.code(),
        commands: Commands::of(&env, operator_commands),
    };
    Ok(figures.json())
}

/// Starts `cro run` on the real node's kubeconfig and the environment's fabric, its
/// log where `CRO_BENCH_OPERATOR_LOG` says (scripts/bench.sh: target/bench).
async fn start_operator(env: &Env) -> Result<OperatorProcess> {
    let kubeconfig = env
        .harness
        .kubeconfig_path()
        .context("the real node's harness wrote no kubeconfig")?;
    let log = std::env::var_os("CRO_BENCH_OPERATOR_LOG").map_or_else(
        || std::env::temp_dir().join("cro-bench-operator.log"),
        Into::into,
    );
    eprintln!("operator log: {}", log.display());
    OperatorProcess::start(kubeconfig, &env.sim, &log).await
}

/// The up phase: its time (or how many requests were not Running at the deadline) and
/// each request's time from its own creation to the first look that saw it Running.
struct UpPhase {
    time: std::result::Result<Duration, usize>,
    per_request: Vec<Duration>,
}

/// Creates the N requests (1 GPU each, on the real node) at once and waits until all
/// are Running, sampling the operator's RSS.
async fn up_phase(
    watched: &Watched,
    operator: &OperatorProcess,
    n: usize,
    began: Instant,
) -> UpPhase {
    let start = Instant::now();
    let sent = create_requests(&watched.requests, n, 1, |_| NODE_NAME.to_owned()).await;
    progress(began, &format!("{n} requests created"));
    let running_after = RefCell::new(BTreeMap::<String, Duration>::new());
    let time = wait_until(
        "all Running",
        start,
        || {
            operator.sample();
        },
        || {
            let mut seen = running_after.borrow_mut();
            for name in watched.running() {
                if let Some(sent) = sent.get(&name) {
                    seen.entry(name).or_insert_with(|| sent.elapsed());
                }
            }
            n.saturating_sub(seen.len())
        },
    )
    .await;
    progress(began, "all Running (or the phase deadline)");
    let mut per_request: Vec<Duration> = running_after.into_inner().into_values().collect();
    per_request.sort();
    UpPhase { time, per_request }
}

/// Deletes the N requests and waits until they, their resources and the devices on
/// the node's machine are gone.
async fn down_phase(
    env: &Env,
    watched: &Watched,
    operator: &OperatorProcess,
    machine: &str,
    n: usize,
    began: Instant,
) -> std::result::Result<Duration, usize> {
    let start = Instant::now();
    delete_requests(&watched.requests, n).await;
    progress(began, &format!("{n} requests deleted"));
    let time = wait_until(
        "all deleted and detached",
        start,
        || {
            operator.sample();
        },
        || watched.objects_left() + env.sim.machine_devices(machine).len(),
    )
    .await;
    progress(began, "all gone (or the phase deadline)");
    time
}

/// Round trips of `KubeExecRunner::run`, in seconds, sorted.
struct ExecFigures {
    times: Vec<f64>,
}

/// Attaches one GPU again (the driver pod comes with the node's first GPU), times
/// [`EXEC_CALLS`] plain `nvidia-smi` queries into the driver pod through the real
/// runner, then deletes the request again.
async fn exec_round_trips(env: &Env, watched: &Watched, began: Instant) -> Result<ExecFigures> {
    create_requests(&watched.requests, 1, 1, |_| NODE_NAME.to_owned()).await;
    wait_until(
        "the exec stage's GPU Running",
        Instant::now(),
        || {},
        || usize::from(watched.running().is_empty()),
    )
    .await
    .map_err(|_| anyhow!("the exec stage's request was not Running by the phase deadline"))?;
    let pod = driver_pod(&env.client).await?;
    progress(began, &format!("exec into {pod}"));
    let runner = KubeExecRunner::new(env.client.clone());
    smi_uuid(&runner, &pod).await?;
    let mut times = Vec::with_capacity(EXEC_CALLS);
    for _ in 0..EXEC_CALLS {
        let t = Instant::now();
        smi_uuid(&runner, &pod).await?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    progress(began, &format!("{EXEC_CALLS} execs timed"));
    delete_requests(&watched.requests, 1).await;
    wait_until(
        "the exec stage's request gone",
        Instant::now(),
        || {},
        || watched.objects_left(),
    )
    .await
    .map_err(|_| anyhow!("the exec stage's request was not gone by the phase deadline"))?;
    Ok(ExecFigures { times })
}

/// One `nvidia-smi --query-gpu=gpu_uuid` in the driver pod, which must answer with the
/// attached GPU's UUID.
async fn smi_uuid(runner: &KubeExecRunner, pod: &PodRef) -> Result<()> {
    let argv: Vec<String> = [
        "nvidia-smi",
        "--query-gpu=gpu_uuid",
        "--format=csv,noheader,nounits",
    ]
    .map(String::from)
    .to_vec();
    let out = runner
        .run(pod, &argv)
        .await
        .with_context(|| format!("exec into {pod}"))?;
    if out.exit_code != 0 || out.stdout.trim().is_empty() {
        bail!(
            "nvidia-smi in {pod} answered exit {} with {:?} (stderr {:?})",
            out.exit_code,
            out.stdout,
            out.stderr
        );
    }
    Ok(())
}

/// The GPU operator's Ready driver pod on the real node, the pod the operator execs into.
async fn driver_pod(client: &kube::Client) -> Result<PodRef> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), GPU_NS);
    let params = ListParams::default()
        .labels("app.kubernetes.io/component=nvidia-driver")
        .fields(&format!("spec.nodeName={NODE_NAME}"));
    let start = Instant::now();
    loop {
        if let Some(pod) = pods
            .list(&params)
            .await?
            .items
            .into_iter()
            .find(running_and_ready)
        {
            return Ok(crate::common::real::driver_pod_ref(&pod));
        }
        if start.elapsed() > phase_deadline() {
            bail!("no Ready driver pod on {NODE_NAME}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The `q` quantile of sorted `values` (nearest rank), or None when there are none.
fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// The node commands of the run: how many the operator sent (before the exec stage),
/// how many were answered in this process instead of through `pods/exec` (none should
/// be), and how many the stand-ins did not understand (none should be).
struct Commands {
    operator: usize,
    not_through_exec: usize,
    unknown: usize,
}

impl Commands {
    fn of(env: &Env, operator: usize) -> Commands {
        let all = env.nodes.commands().len();
        let through_exec = env.node_sim.real().standin.exec_answered().len();
        Commands {
            operator,
            not_through_exec: all.saturating_sub(through_exec),
            unknown: env.nodes.unknown_commands().len(),
        }
    }
}

/// Everything the stage measured.
struct Figures {
    n: usize,
    node_up_s: f64,
    up: UpPhase,
    down: std::result::Result<Duration, usize>,
    exec: ExecFigures,
    rss: OperatorRss,
    /// The operator's exit code after SIGTERM (None: ended by a signal).
    exit_code: Option<i32>,
    commands: Commands,
}

impl Figures {
    /// The stage's JSON line for the report.
    fn json(&self) -> Value {
        let per: Vec<f64> = self
            .up
            .per_request
            .iter()
            .map(Duration::as_secs_f64)
            .collect();
        let ms = |s: Option<f64>| s.map(|s| s * 1000.0);
        json!({
            "kind": "real_node",
            "requests": self.n, "gpus_per_request": 1, "node": NODE_NAME,
            "node_up_s": self.node_up_s,
            "up_s": self.up.time.as_ref().ok().map(Duration::as_secs_f64),
            "up_left": self.up.time.as_ref().err(),
            "per_request_median_s": quantile(&per, 0.5),
            "per_request_max_s": per.last(),
            "down_s": self.down.as_ref().ok().map(Duration::as_secs_f64),
            "down_left": self.down.as_ref().err(),
            "phase_deadline_s": phase_deadline().as_secs(),
            "exec_calls": self.exec.times.len(),
            "exec_median_ms": ms(quantile(&self.exec.times, 0.5)),
            "exec_p90_ms": ms(quantile(&self.exec.times, 0.9)),
            "operator_rss_started": self.rss.started,
            "operator_rss_peak_sampled": self.rss.peak,
            "operator_rss_hwm": self.rss.hwm,
            "operator_rss_idle": self.rss.idle,
            "operator_exit_code": self.exit_code,
            "operator_node_commands": self.commands.operator,
            "commands_not_through_exec": self.commands.not_through_exec,
            "unknown_commands": self.commands.unknown,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::quantile;

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), Some(5.0));
        assert_eq!(quantile(&v, 0.9), Some(9.0));
        assert_eq!(quantile(&v, 1.0), Some(10.0));
        assert_eq!(quantile(&[], 0.5), None);
    }
}

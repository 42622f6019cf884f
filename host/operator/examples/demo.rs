//! The local demo (`scripts/demo.sh`): the whole flow on one machine. A real
//! kube-apiserver and etcd, the fabric simulator, the real FTI component in the sandbox,
//! and the operator converge the Go operator's README request, then grow it, shrink it
//! and delete it.
//!
//! It reuses the operator's end-to-end test environment. As there, the nodes are
//! simulated (the `node-sim` crate): this API server has no kubelets, so the simulation
//! plays the GPU operator (a node's driver pod comes once it has a GPU and takes a moment
//! to be Ready), the device plugin, and the node commands the operator runs, all driven
//! by the fabric simulator's state.
//!
//! `RUST_LOG` sets the log filter (default `warn`). With `--hold` it pauses once the request
//! is Running, so `kubectl` can look at the objects, until Enter is pressed.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use common::{Env, MODEL};
use cro_api::{
    ComposabilityRequest, ComposableResource, LABEL_MANAGED_BY, RequestState, ResourceState,
};
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const NODES: [&str; 3] = ["worker-0", "worker-1", "worker-2"];
/// GPUs in the simulator's free pool: enough for the largest size the demo asks for.
const POOL: usize = 4;
/// How long each step may take to converge, generous for a loaded 2-core machine.
const STEP_DEADLINE: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(100);
const FIXTURE: &str = "host/api/tests/fixtures/go-readme-request.yaml";

#[tokio::main]
async fn main() -> ExitCode {
    init_tracing();
    let hold = std::env::args().skip(1).any(|a| a == "--hold");
    match run(hold).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\ndemo FAILED: {e:#}");
            eprintln!("(set RUST_LOG=cro_operator=info for the operator's log)");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            // The client logs each failed readiness probe while the API server starts.
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,kube_client::client::builder=off".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
}

fn workspace_root() -> &'static Path {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.ancestors().nth(2).unwrap_or(manifest)
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

async fn run(hold: bool) -> Result<()> {
    let total = Instant::now();
    let mut timings: Vec<(&'static str, Duration)> = Vec::new();
    println!("cro local demo: the operator converging a ComposabilityRequest end to end\n");

    let t = Instant::now();
    let mut env = start_parts(hold).await;
    timings.push((
        "start the control plane, simulator, component, operator",
        t.elapsed(),
    ));

    let outcome = flow(&env, hold, &mut timings).await;
    if outcome.is_err() {
        // Stopped before the API server goes, so it does not log lost connections.
        env.kill_operator().await;
        return outcome;
    }
    env.stop_operator()
        .await
        .context("the operator stopped with an error")?;

    println!("\nSummary");
    for (what, took) in &timings {
        println!("  {:<58} {:>7}", what, secs(*took));
    }
    println!("  {:<58} {:>7}", "total", secs(total.elapsed()));
    println!("\ndemo passed: attach, grow, shrink and delete all converged");
    // Dropping the environment stops the simulator, then the API server and etcd.
    drop(env);
    Ok(())
}

/// Step 1: the API server and etcd, the fabric simulator, the FTI component and the
/// operator, each printed with where to find it.
async fn start_parts(hold: bool) -> Env {
    println!("[1/6] Start the parts");
    let mut env = Env::start().await;
    let (apiserver, crds) = env.harness.startup_timings();
    println!(
        "  kube-apiserver + etcd  {}  (real binaries; up in {}, CRDs in {})",
        env.harness.server_url(),
        secs(apiserver.etcd + apiserver.apiserver),
        secs(crds)
    );
    if let Some(kubeconfig) = env.harness.kubeconfig_path() {
        println!("  kubeconfig             {}", kubeconfig.display());
        println!(
            "    while it runs, try:  kubectl --kubeconfig {} get composabilityrequests,composableresources",
            kubeconfig.display()
        );
        if !hold {
            println!("    (run with --hold to pause once the request is Running)");
        }
    }
    println!(
        "  fabric simulator       {}  (FTI Fabric Manager API, tenant {})",
        env.sim.endpoint(),
        env.sim.tenant_id()
    );
    let component = cro_test_support::component("fti-provider");
    println!(
        "  FTI provider           {}",
        component
            .strip_prefix(workspace_root())
            .unwrap_or(&component)
            .display()
    );
    println!(
        "                         loaded in the cro-runtime sandbox from the Go operator's FTI_CDI_* settings"
    );
    env.start_operator().await;
    println!(
        "  operator               running (nodes simulated: GPU operator, device plugin, nvidia-smi)"
    );
    env
}

/// Steps 2 to 6, against the running parts.
async fn flow(env: &Env, hold: bool, timings: &mut Vec<(&'static str, Duration)>) -> Result<()> {
    let t = Instant::now();
    let machines = nodes_and_pool(env).await;
    timings.push(("create 3 nodes and the pool", t.elapsed()));

    let request = read_readme_request()?;
    let name = request.name_any();
    let mut watch = Watch::new(env, &name, &machines);
    let took = apply_readme_request(env, &mut watch, &request).await?;
    timings.push(("attach 2 GPUs (README request)", took));
    if hold {
        hold_until_enter().await;
    }

    let took = grow(env, &mut watch, &name).await?;
    timings.push(("grow to 3", took));
    let took = shrink(env, &mut watch, &name).await?;
    timings.push(("shrink to 1", took));
    let took = delete(env, &mut watch, &name).await?;
    timings.push(("delete: detach all, release finalizers", took));

    let unknown = env.nodes.unknown_commands();
    if !unknown.is_empty() {
        bail!("the operator ran node commands no simulated node knows: {unknown:?}");
    }
    Ok(())
}

/// Step 2: nodes backed by simulator machines, and a pool of free GPUs. Returns
/// machine uuid → node name.
async fn nodes_and_pool(env: &Env) -> BTreeMap<String, String> {
    println!("\n[2/6] Nodes and the GPU pool");
    let mut machines: BTreeMap<String, String> = BTreeMap::new();
    for node in NODES {
        let machine = env.add_node(node, "16").await;
        println!(
            "  node {node}  providerID fsas-cdi://{machine}  (no GPU yet, so no driver pod yet)"
        );
        machines.insert(machine, node.to_string());
    }
    env.sim.add_free_devices("gpu", MODEL, POOL);
    println!(
        "  fabric pool: {} x {MODEL} free",
        env.sim.free_devices("gpu", MODEL)
    );
    machines
}

/// The Go operator's README request, exactly as in its README, printed as read.
fn read_readme_request() -> Result<ComposabilityRequest> {
    println!("\n[3/6] Apply the Go operator's README example ({FIXTURE}, unchanged)");
    let path = workspace_root().join(FIXTURE);
    let yaml = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    for line in yaml.lines().filter(|l| !l.trim().is_empty()) {
        println!("  | {line}");
    }
    serde_yaml::from_str(&yaml).with_context(|| format!("{FIXTURE} is not a request"))
}

/// Step 3: creates the request and waits until it runs with its GPUs on its target node.
async fn apply_readme_request(
    env: &Env,
    watch: &mut Watch<'_>,
    request: &ComposabilityRequest,
) -> Result<Duration> {
    let name = request.name_any();
    let size = usize::try_from(request.spec.resource.size).context("negative size")?;
    let target = request
        .spec
        .resource
        .target_node
        .clone()
        .unwrap_or_default();
    env.requests()
        .create(&PostParams::default(), request)
        .await
        .context("creating the request")?;
    let took = watch
        .until(&format!("{name} Running with {size} GPUs"), |s| {
            s.running(size)
        })
        .await?;
    watch.show_devices(env);
    let placed = watch
        .last
        .resources
        .iter()
        .all(|r| r.spec.target_node == target);
    if !placed {
        bail!("not every GPU went to the target node {target}");
    }
    println!("  all on {target}, the request's target_node");
    Ok(took)
}

/// `--hold`: the cluster stays as it is until Enter is pressed.
async fn hold_until_enter() {
    println!(
        "\n  holding: the cluster is yours to look at (kubeconfig above); press Enter to go on"
    );
    // EOF or an unreadable stdin just goes on.
    let _ = tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new())).await;
}

/// Step 4.
async fn grow(env: &Env, watch: &mut Watch<'_>, name: &str) -> Result<Duration> {
    println!("\n[4/6] Grow to 3");
    println!(
        "  (as: kubectl patch composabilityrequest {name} --type merge -p '{{\"spec\":{{\"resource\":{{\"size\":3}}}}}}')"
    );
    resize(env, name, 3).await?;
    let took = watch
        .until(&format!("{name} Running with 3 GPUs"), |s| s.running(3))
        .await?;
    watch.show_devices(env);
    Ok(took)
}

/// Step 5: the operator picks which device goes; the demo shows where each went.
async fn shrink(env: &Env, watch: &mut Watch<'_>, name: &str) -> Result<Duration> {
    println!("\n[5/6] Shrink to 1 (the operator chooses which GPUs to detach)");
    println!(
        "  (as: kubectl patch composabilityrequest {name} --type merge -p '{{\"spec\":{{\"resource\":{{\"size\":1}}}}}}')"
    );
    let before = watch.devices();
    resize(env, name, 1).await?;
    let took = watch
        .until(&format!("{name} Running with 1 GPU"), |s| s.running(1))
        .await?;
    let after = watch.devices();
    for (resource, device) in before.iter().filter(|(r, _)| !after.contains_key(*r)) {
        let home = match env.sim.device(device).and_then(|d| d.machine) {
            None => "back in the free pool".to_string(),
            Some(m) => format!("still on machine {m}"),
        };
        println!("  detached {device} (was {resource}): {home}");
    }
    watch.show_devices(env);
    Ok(took)
}

/// Step 6: devices go back, finalizers are released, nothing is left behind.
async fn delete(env: &Env, watch: &mut Watch<'_>, name: &str) -> Result<Duration> {
    println!("\n[6/6] Delete the request (as: kubectl delete composabilityrequest {name})");
    env.requests()
        .delete(name, &DeleteParams::default())
        .await
        .context("deleting the request")?;
    let took = watch
        .until("the request and its resources gone, every GPU free", |s| {
            s.request.is_none() && s.resources.is_empty() && s.free == POOL && s.held.is_empty()
        })
        .await?;
    let leftovers = env
        .resources()
        .list(&ListParams::default())
        .await
        .context("listing ComposableResources")?;
    if !leftovers.items.is_empty() {
        bail!("{} ComposableResources left behind", leftovers.items.len());
    }
    println!(
        "  no ComposabilityRequest or ComposableResource left (the operator released its finalizers)"
    );
    println!(
        "  fabric pool: {}/{POOL} GPUs free, no machine holds a GPU",
        env.sim.free_devices("gpu", MODEL)
    );
    Ok(took)
}

async fn resize(env: &Env, name: &str, size: i64) -> Result<()> {
    env.requests()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resource": {"size": size}}})),
        )
        .await
        .with_context(|| format!("resizing {name} to {size}"))?;
    Ok(())
}

/// What the demo sees at one poll.
#[derive(Default)]
struct Snapshot {
    request: Option<ComposabilityRequest>,
    resources: Vec<ComposableResource>,
    /// GPUs in the simulator's free pool.
    free: usize,
    /// Simulator machine → the GPUs it holds (machines holding none are left out).
    held: BTreeMap<String, Vec<String>>,
}

impl Snapshot {
    fn running(&self, size: usize) -> bool {
        let Some(req) = &self.request else {
            return false;
        };
        let Some(status) = &req.status else {
            return false;
        };
        status.state == RequestState::Running
            && status.scalar_resource.as_ref() == Some(&req.spec.resource)
            && status.resources.len() == size
            && self.resources.len() == size
            && self.resources.iter().all(|r| {
                r.status
                    .as_ref()
                    .is_some_and(|s| s.state == ResourceState::Online)
            })
            && self.held.values().map(Vec::len).sum::<usize>() == size
    }
}

/// Polls the request, its resources and the simulator, printing each change.
struct Watch<'a> {
    env: &'a Env,
    name: String,
    /// Machine uuid → node name.
    machines: &'a BTreeMap<String, String>,
    started: Instant,
    last: Snapshot,
    shown: BTreeMap<String, String>,
}

impl<'a> Watch<'a> {
    fn new(env: &'a Env, name: &str, machines: &'a BTreeMap<String, String>) -> Self {
        Watch {
            env,
            name: name.to_string(),
            machines,
            started: Instant::now(),
            last: Snapshot::default(),
            shown: BTreeMap::new(),
        }
    }

    async fn snapshot(&self) -> Result<Snapshot> {
        let request = self
            .env
            .requests()
            .get_opt(&self.name)
            .await
            .context("reading the request")?;
        let mut resources = self
            .env
            .resources()
            .list(&ListParams::default().labels(&format!("{LABEL_MANAGED_BY}={}", self.name)))
            .await
            .context("listing ComposableResources")?
            .items;
        resources.sort_by_key(|r| r.name_any());
        let held = self
            .machines
            .keys()
            .map(|m| (m.clone(), self.env.gpus_on(m)))
            .filter(|(_, gpus)| !gpus.is_empty())
            .collect();
        Ok(Snapshot {
            request,
            resources,
            free: self.env.sim.free_devices("gpu", MODEL),
            held,
        })
    }

    /// Polls until `done`, printing transitions (times from the start of this step);
    /// returns how long it took.
    async fn until(&mut self, what: &str, done: impl Fn(&Snapshot) -> bool) -> Result<Duration> {
        let t = Instant::now();
        self.started = t;
        loop {
            let snap = self.snapshot().await?;
            self.print_changes(&snap);
            let finished = done(&snap);
            self.last = snap;
            if finished {
                let took = t.elapsed();
                println!("  => {what} after {}", secs(took));
                return Ok(took);
            }
            if t.elapsed() > STEP_DEADLINE {
                bail!(
                    "{what}: not reached within {}. Last seen: {}",
                    secs(STEP_DEADLINE),
                    self.describe_all()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    fn print_changes(&mut self, snap: &Snapshot) {
        let mut now: BTreeMap<String, String> = BTreeMap::new();
        if let Some(req) = &snap.request {
            now.insert(
                format!("ComposabilityRequest {}", req.name_any()),
                describe_request(req),
            );
        }
        for r in &snap.resources {
            now.insert(
                format!("ComposableResource {}", r.name_any()),
                describe_resource(r),
            );
        }
        let at = self.started.elapsed().as_secs_f64();
        for (key, text) in &now {
            if self.shown.get(key) != Some(text) {
                println!("  {at:>6.1}s  {key}: {text}");
            }
        }
        for key in self.shown.keys().filter(|k| !now.contains_key(*k)) {
            println!("  {at:>6.1}s  {key}: deleted");
        }
        self.shown = now;
    }

    fn describe_all(&self) -> String {
        if self.shown.is_empty() {
            return "no request or resources".to_string();
        }
        let mut parts: Vec<String> = self
            .shown
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        parts.push(format!(
            "simulator: {} free, held {:?}",
            self.last.free, self.last.held
        ));
        parts.join("; ")
    }

    /// Resource name → device id, of the last poll.
    fn devices(&self) -> BTreeMap<String, String> {
        self.last
            .resources
            .iter()
            .map(|r| {
                let device = r
                    .status
                    .as_ref()
                    .map(|s| s.device_id.clone())
                    .unwrap_or_default();
                (r.name_any(), device)
            })
            .collect()
    }

    fn show_devices(&self, env: &Env) {
        for r in &self.last.resources {
            let Some(s) = &r.status else { continue };
            println!(
                "  {}  {}  fabric id {}  on {}",
                r.name_any(),
                s.device_id,
                s.cdi_device_id,
                r.spec.target_node
            );
        }
        for (machine, gpus) in &self.last.held {
            let node = self.machines.get(machine).map_or("?", String::as_str);
            println!(
                "  simulator: machine {machine} ({node}) holds {}",
                gpus.join(", ")
            );
        }
        println!(
            "  simulator: {} of {POOL} GPUs free in the pool",
            env.sim.free_devices("gpu", MODEL)
        );
    }
}

fn describe_request(req: &ComposabilityRequest) -> String {
    let mut text = match &req.status {
        Some(s) if !s.state.as_str().is_empty() => s.state.to_string(),
        _ => "(no status yet)".to_string(),
    };
    text.push_str(&format!(", size {}", req.spec.resource.size));
    if let Some(s) = &req.status
        && !s.error.is_empty()
    {
        text.push_str(&format!(", error: {}", s.error));
    }
    if req.metadata.deletion_timestamp.is_some() {
        text.push_str(&format!(", deleting (finalizers {:?})", req.finalizers()));
    }
    text
}

fn describe_resource(r: &ComposableResource) -> String {
    let mut text = match &r.status {
        Some(s) if !s.state.as_str().is_empty() => s.state.to_string(),
        _ => "(no status yet)".to_string(),
    };
    text.push_str(&format!(" on {}", r.spec.target_node));
    if let Some(s) = &r.status {
        if !s.device_id.is_empty() {
            text.push_str(&format!(", device {}", s.device_id));
        }
        if !s.error.is_empty() {
            text.push_str(&format!(", error: {}", s.error));
        }
    }
    if r.metadata.deletion_timestamp.is_some() {
        text.push_str(&format!(", deleting (finalizers {:?})", r.finalizers()));
    }
    text
}

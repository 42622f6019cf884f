//! N Pods, each with a ResourceClaim for one fabric GPU, created at once on the real
//! one-node cluster against a pool of M free GPUs (M < N): the scheduler allocates from
//! cro's ResourceSlices, cro (`cro run`, a process of its own) attaches and sets
//! `FabricDeviceReady`, the scheduler binds, and cro's kubelet plugin (`cro
//! kubelet-plugin`, another process, registered with the real kubelet) hands the
//! container its GPU. docs/dra.md.
//!
//! Measured, per Pod of the first wave, from its creation: allocated, attached, Online on
//! the node, `FabricDeviceReady`, bound, Running; the Pods beyond the pool: Pending and
//! unschedulable, with an Event, holding nothing; then each further wave's time from
//! deleting the Running Pods to the next ones Running; and at the end, that nothing is
//! left (claims, resources, attached GPUs, CDI specs) and the slice offers the whole
//! pool again.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use cro_api::{ComposableResource, ResourceState};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube_harness::real_node::{NODE_NAME, STANDIN_IMAGE};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use crate::common::nodes::{NodeOptions, NodeSetup};
use crate::common::{Env, MODEL};
use crate::converge::{phase_deadline, progress};
use crate::cro_process::{OperatorProcess, cro_executable, spawn_logging};

const NS: &str = "default";
const DRIVER: &str = cro_api::DRA_DRIVER;
/// The pool's read period: the slice follows a freed GPU within this and one read.
const POOL_PERIOD: &str = "2s";
/// How often the Pods, claims and resources are looked at.
const LOOK: Duration = Duration::from_millis(100);

/// The steps of one Pod, in order, as first seen.
const STEPS: [&str; 6] = [
    "allocated",
    "attached",
    "online",
    "ready",
    "bound",
    "running",
];

pub fn main(pods: usize, pool: usize) -> Result<()> {
    if pool == 0 || pool >= pods {
        bail!("the pool ({pool}) must hold some but not all of the {pods} Pods' GPUs");
    }
    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(run(pods, pool))?;
    println!("{result}");
    Ok(())
}

async fn run(n: usize, pool: usize) -> Result<Value> {
    let began = Instant::now();
    let env = Env::start_real(NodeSetup::gpu_operator()).await;
    let machine = env.add_real_node(NodeOptions::default()).await;
    env.sim.add_free_devices("gpu", MODEL, pool);
    let node_up_s = began.elapsed().as_secs_f64();
    progress(began, "real node up, its GPU software installed");

    let kubeconfig = env
        .harness
        .kubeconfig_path()
        .context("the real node's harness wrote no kubeconfig")?
        .to_path_buf();
    let logs = std::env::var_os("CRO_BENCH_OPERATOR_LOG").map_or_else(
        || std::env::temp_dir().join("cro-bench-dra-operator.log"),
        PathBuf::from,
    );
    let operator = OperatorProcess::start_with(
        &kubeconfig,
        &env.sim,
        &logs,
        &[
            ("CRO_POOL_DEVICES", format!("gpu={MODEL}")),
            ("CRO_POOL_PERIOD", POOL_PERIOD.to_owned()),
        ],
    )
    .await?;
    let node = &env.node_sim.real().node;
    let plugin =
        KubeletPlugin::start(&kubeconfig, node.kubelet_root(), node.cdi_dir(), &logs).await?;
    progress(began, "operator and kubelet plugin running");

    let client = env.client.clone();
    create_class_and_template(&client).await?;
    // Pods are refused until the controller-manager made the namespace's account.
    node.wait_default_service_account(NS).await?;
    wait_pool_offered(&client, pool).await?;
    progress(began, &format!("{pool} GPUs offered in cro's slice"));

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut looked = Looked::default();
    let names: Vec<String> = (0..n).map(|i| format!("trainer-{i:03}")).collect();
    let created_at = Instant::now();
    for name in &names {
        pods.create(&PostParams::default(), &pod(name))
            .await
            .with_context(|| format!("cannot create Pod {name}"))?;
    }
    progress(began, &format!("{n} Pods created"));

    // Wave 1: the pool's worth Running, the rest unschedulable and holding nothing.
    let first = wait_wave(&client, &mut looked, pool, n - pool, created_at).await?;
    progress(
        began,
        &format!("first wave: {pool} Running, {} waiting", n - pool),
    );
    let waiting: Vec<String> = names
        .iter()
        .filter(|p| !first.contains(*p))
        .cloned()
        .collect();
    let holding = resources_of_pods(&client, &waiting).await?;
    let events = failed_scheduling_events(&client, &waiting).await?;
    let steps = step_figures(&looked, &first);

    // Further waves: the Running Pods go, the next ones get their GPUs.
    let mut waves = Vec::new();
    let mut done: BTreeSet<String> = first.clone();
    let mut running = first;
    while done.len() < n {
        let held = claim_resources(&client).await?;
        let t = Instant::now();
        for name in &running {
            pods.delete(name, &DeleteParams::default().grace_period(1))
                .await
                .with_context(|| format!("cannot delete Pod {name}"))?;
        }
        // The freed GPUs' part: detached (the node drained first) before the pool's
        // next read offers them again.
        let deadline = Instant::now() + phase_deadline();
        while !claim_resources(&client).await?.is_disjoint(&held) {
            if Instant::now() > deadline {
                bail!(
                    "the deleted Pods' devices are still attached after {:?}",
                    phase_deadline()
                );
            }
            tokio::time::sleep(LOOK).await;
        }
        let detached_s = t.elapsed().as_secs_f64();
        let left = n - done.len();
        let expected = left.min(pool);
        let next = wait_wave(&client, &mut looked, expected, left - expected, created_at).await?;
        let fresh: BTreeSet<String> = next.difference(&done).cloned().collect();
        if fresh.len() != expected {
            bail!("a wave ran {} new Pods, not {expected}", fresh.len());
        }
        waves.push(
            json!({"pods": expected, "s": t.elapsed().as_secs_f64(), "detached_s": detached_s}),
        );
        progress(
            began,
            &format!("wave {}: {expected} more Running", waves.len() + 1),
        );
        done.extend(fresh.iter().cloned());
        running = next;
    }

    // The end: every Pod gone, nothing left anywhere, the whole pool offered again.
    let t = Instant::now();
    for name in &running {
        pods.delete(name, &DeleteParams::default().grace_period(1))
            .await
            .with_context(|| format!("cannot delete Pod {name}"))?;
    }
    let leftovers = wait_clean(&env, &machine, node.cdi_dir(), pool).await?;
    let cleanup_s = t.elapsed().as_secs_f64();
    progress(began, "all gone, the pool offered again");

    plugin.stop().await;
    let exit = operator.stop().await?;
    Ok(json!({
        "kind": "real_node_dra",
        "pods": n,
        "pool": pool,
        "node": NODE_NAME,
        "pool_period": POOL_PERIOD,
        "node_up_s": node_up_s,
        "first_wave": steps,
        "waiting_unschedulable": n - pool,
        "waiting_holding_devices": holding,
        "waiting_failed_scheduling_events": events,
        "waves": waves,
        "cleanup_s": cleanup_s,
        "leftovers": leftovers,
        "operator_exit_code": exit.code(),
    }))
}

/// `cro kubelet-plugin` as its own process, as the chart's DaemonSet runs it.
struct KubeletPlugin {
    child: Child,
    registration: PathBuf,
}

impl KubeletPlugin {
    async fn start(
        kubeconfig: &Path,
        kubelet_dir: &Path,
        cdi_dir: &Path,
        operator_log: &Path,
    ) -> Result<Self> {
        let log = operator_log.with_file_name("kubelet-plugin.log");
        let mut command = Command::new(cro_executable()?);
        command
            .arg("kubelet-plugin")
            .env("KUBECONFIG", kubeconfig)
            .env("NODE_NAME", NODE_NAME)
            .env("CRO_KUBELET_DIR", kubelet_dir)
            .env("CRO_CDI_DIR", cdi_dir)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1");
        let mut child = spawn_logging(command, &log)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "cro kubelet-plugin exited ({status}); its log: {}",
                    log.display()
                );
            }
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("the kubelet registered the plugin") {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "the kubelet did not register cro's plugin in 60 s; its log: {}",
                    log.display()
                );
            }
            tokio::time::sleep(LOOK).await;
        }
        Ok(Self {
            child,
            registration: kubelet_dir.join(format!("plugins_registry/{DRIVER}-reg.sock")),
        })
    }

    async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-s", "TERM", &pid.to_string()])
                .status();
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        if self.registration.exists() {
            eprintln!("note: the plugin left {}", self.registration.display());
        }
    }
}

/// The chart's DeviceClass for GPUs and a claim template for one GPU of [`MODEL`].
async fn create_class_and_template(client: &kube::Client) -> Result<()> {
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "gpu.cro.hpsys.ibm.ie.com"},
        "spec": {"selectors": [{"cel": {"expression":
            format!("device.driver == \"{DRIVER}\" && device.attributes[\"{DRIVER}\"].type == \"gpu\"")}}]},
    }))?;
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await?;
    let template: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.cro.hpsys.ibm.ie.com",
            "selectors": [{"cel": {"expression":
                format!("device.attributes[\"{DRIVER}\"].model == \"{MODEL}\"")}}],
        }}]}}},
    }))?;
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &template)
        .await?;
    Ok(())
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [{
                "name": "train", "image": STANDIN_IMAGE, "imagePullPolicy": "Never",
                "command": ["/node-standin", "pause", "--print-env", "NVIDIA_VISIBLE_DEVICES"],
                "resources": {"claims": [{"name": "gpu"}]},
            }],
        },
    }))
    .unwrap_or_else(|e| panic!("the Pod's JSON is a Pod: {e}"))
}

/// How many devices cro's slices offer.
async fn offered(client: &kube::Client) -> Result<usize> {
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=cro"))
        .await?;
    Ok(slices
        .items
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum())
}

async fn wait_pool_offered(client: &kube::Client, pool: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while offered(client).await? != pool {
        if Instant::now() > deadline {
            bail!("cro's slices do not offer the pool's {pool} GPUs after 60 s");
        }
        tokio::time::sleep(LOOK).await;
    }
    Ok(())
}

/// When each Pod's steps were first seen, from the Pods' creation.
#[derive(Default)]
struct Looked {
    seen: BTreeMap<String, BTreeMap<&'static str, Duration>>,
}

/// One look at the Pods, their claims and cro's resources; returns the Running Pods and
/// the unschedulable ones.
async fn look(
    client: &kube::Client,
    looked: &mut Looked,
    since: Instant,
) -> Result<(BTreeSet<String>, BTreeSet<String>)> {
    let pods = Api::<Pod>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await?;
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await?;
    let resources = Api::<ComposableResource>::all(client.clone())
        .list(&ListParams::default().labels(cro_api::LABEL_CLAIM_UID))
        .await?;
    let now = since.elapsed();
    let mut running = BTreeSet::new();
    let mut unschedulable = BTreeSet::new();
    for p in &pods.items {
        let name = p.name_any();
        let claim = claims.items.iter().find(|c| {
            c.owner_references()
                .iter()
                .any(|o| Some(&o.uid) == p.metadata.uid.as_ref())
        });
        let status = claim.and_then(|c| c.status.as_ref());
        let resource = claim.and_then(|c| {
            resources
                .items
                .iter()
                .find(|r| r.labels().get(cro_api::LABEL_CLAIM_UID) == c.metadata.uid.as_ref())
        });
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        let unsched = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                })
            });
        let now_true = [
            ("allocated", status.is_some_and(|s| s.allocation.is_some())),
            (
                "attached",
                resource.is_some_and(|r| r.device_id().is_some()),
            ),
            (
                "online",
                resource.is_some_and(|r| r.state() == ResourceState::Online),
            ),
            (
                "ready",
                status.and_then(|s| s.devices.as_ref()).is_some_and(|ds| {
                    ds.iter().any(|d| {
                        d.conditions.as_ref().is_some_and(|cs| {
                            cs.iter()
                                .any(|c| c.type_ == "FabricDeviceReady" && c.status == "True")
                        })
                    })
                }),
            ),
            (
                "bound",
                p.spec
                    .as_ref()
                    .is_some_and(|s| s.node_name.as_deref() == Some(NODE_NAME)),
            ),
            ("running", phase == Some("Running")),
        ];
        let seen = looked.seen.entry(name.clone()).or_default();
        for (step, yes) in now_true {
            if yes {
                seen.entry(step).or_insert(now);
            }
        }
        if phase == Some("Running") {
            running.insert(name);
        } else if unsched {
            unschedulable.insert(name);
        }
    }
    Ok((running, unschedulable))
}

/// Waits until exactly `running` Pods run and `waiting` are unschedulable.
async fn wait_wave(
    client: &kube::Client,
    looked: &mut Looked,
    running: usize,
    waiting: usize,
    since: Instant,
) -> Result<BTreeSet<String>> {
    let deadline = Instant::now() + phase_deadline();
    loop {
        let (r, u) = look(client, looked, since).await?;
        if r.len() == running && u.len() == waiting {
            return Ok(r);
        }
        if Instant::now() > deadline {
            bail!(
                "after {:?}: {} Pods Running (want {running}), {} unschedulable (want {waiting})",
                phase_deadline(),
                r.len(),
                u.len()
            );
        }
        tokio::time::sleep(LOOK).await;
    }
}

/// The names of cro's resources held for claims.
async fn claim_resources(client: &kube::Client) -> Result<BTreeSet<String>> {
    Ok(Api::<ComposableResource>::all(client.clone())
        .list(&ListParams::default().labels(cro_api::LABEL_CLAIM_UID))
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect())
}

/// cro's resources held for the claims of `pods` (the waiting ones must hold none).
async fn resources_of_pods(client: &kube::Client, pods: &[String]) -> Result<usize> {
    let resources = Api::<ComposableResource>::all(client.clone())
        .list(&ListParams::default().labels(cro_api::LABEL_CLAIM_UID))
        .await?;
    Ok(resources
        .items
        .iter()
        .filter(|r| {
            r.annotations()
                .get("cro.hpsys.ibm.ie.com/claim")
                .is_some_and(|c| pods.iter().any(|p| c.contains(p.as_str())))
        })
        .count())
}

/// How many of `pods` have a FailedScheduling Event saying why they wait.
async fn failed_scheduling_events(client: &kube::Client, pods: &[String]) -> Result<usize> {
    let events = Api::<Event>::namespaced(client.clone(), NS)
        .list(&ListParams::default().fields("reason=FailedScheduling"))
        .await?;
    Ok(pods
        .iter()
        .filter(|p| {
            events
                .items
                .iter()
                .any(|e| e.involved_object.name.as_deref() == Some(p.as_str()))
        })
        .count())
}

/// Median and max of each step over the Pods `of`, in seconds.
fn step_figures(looked: &Looked, of: &BTreeSet<String>) -> Value {
    let mut out = serde_json::Map::new();
    for step in STEPS {
        let mut times: Vec<f64> = of
            .iter()
            .filter_map(|p| looked.seen.get(p)?.get(step))
            .map(Duration::as_secs_f64)
            .collect();
        times.sort_by(f64::total_cmp);
        // The lower median: of two Pods, the first.
        let median = times.get(times.len().saturating_sub(1) / 2).copied();
        out.insert(
            step.to_owned(),
            json!({"median_s": median, "max_s": times.last(), "pods": times.len()}),
        );
    }
    Value::Object(out)
}

/// Waits until no claim, no resource, no attached GPU and no CDI spec is left and the
/// slices offer the whole pool again; returns what was left at the deadline (all 0).
async fn wait_clean(env: &Env, machine: &str, cdi_dir: &Path, pool: usize) -> Result<Value> {
    let client = &env.client;
    let deadline = Instant::now() + phase_deadline();
    loop {
        let claims = Api::<ResourceClaim>::namespaced(client.clone(), NS)
            .list(&ListParams::default())
            .await?
            .items
            .len();
        let resources = Api::<ComposableResource>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .len();
        let attached = env.sim.machine_devices(machine).len();
        let specs = std::fs::read_dir(cdi_dir)
            .map(|d| d.filter_map(Result::ok).count())
            .unwrap_or(0);
        let offered = offered(client).await?;
        let left = json!({"claims": claims, "resources": resources, "attached_gpus": attached,
            "cdi_specs": specs, "offered": offered});
        if claims + resources + attached + specs == 0 && offered == pool {
            return Ok(left);
        }
        if Instant::now() > deadline {
            bail!("not clean after {:?}: {left}", phase_deadline());
        }
        tokio::time::sleep(LOOK).await;
    }
}

//! Errors reach the user and clear again: fabric errors, unhealthy devices, busy GPUs
//! (which block a detach unless force_detach), a trapping provider call that fails
//! only its own resource, an empty pool (no capacity), and attach replies lost after
//! the fabric acted (which cost no second device).

mod common;
mod truth;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{CONVERGE, Env, FabricApi, MODEL, eventually, gpu};
use cro_api::{
    ComposabilityRequest, ComposableResource, RequestState, ResourceState, ResourceType,
};
use cro_operator::provider::{DeviceProvider, ProviderCounters, ProviderResult};
use cro_runtime::CallError;
use cro_runtime::cluster::KubeCluster;
use cro_runtime::domain::{self, AddOutcome, AddRequest, Claim, DeviceInfo, RemoveOutcome};
use cro_runtime::{ProviderSpec, Runtime, RuntimeOptions};
use fabric_sim::{Fault, Route};
use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

fn resource_error(r: &ComposableResource) -> String {
    r.status
        .as_ref()
        .map(|s| s.error.clone())
        .unwrap_or_default()
}

/// The Ready condition of an object's status, if written.
fn ready_of(conditions: Option<&[Condition]>) -> Option<Condition> {
    conditions?.iter().find(|c| c.type_ == "Ready").cloned()
}

fn resource_ready(r: &ComposableResource) -> Option<Condition> {
    ready_of(r.status.as_ref().map(|s| &s.conditions[..]))
}

fn request_ready(r: &ComposabilityRequest) -> Option<Condition> {
    ready_of(r.status.as_ref().map(|s| &s.conditions[..]))
}

async fn has_event(env: &Env, object: &str, reason: &str) -> bool {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(env.client.clone(), "default");
    events
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items.iter().any(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(object)
            })
        })
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fabric_errors_and_health_warnings_show_and_clear() {
    let mut env = Env::start().await;
    let m1 = env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 2);
    env.sim.inject(
        Fault::error(503, "E5030", "fabric manager is under maintenance")
            .on(Route::FmAttach)
            .always(),
    );
    env.start_operator().await;
    env.create_request("flaky", gpu(1)).await;

    let (name, error) = eventually("the fabric error in status.error", CONVERGE, || async {
        let r = env.resources_of("flaky").await.into_iter().next()?;
        let e = resource_error(&r);
        (!e.is_empty()).then(|| (r.name_any(), e))
    })
    .await;
    assert!(
        error.contains("E5030") && error.contains("under maintenance"),
        "{error}"
    );
    let r = env.resources().get(&name).await.unwrap();
    assert_eq!(r.state(), ResourceState::Attaching);
    assert_eq!(r.device_id(), None);
    assert!(env.gpus_on(&m1).is_empty());
    eventually("a ProviderFailed event", CONVERGE, || async {
        has_event(&env, &name, "ProviderFailed").await.then_some(())
    })
    .await;
    // The request mirrors the device's error and is not Running.
    let status = eventually("the error mirrored in the request", CONVERGE, || async {
        let s = env.request("flaky").await?.status?;
        s.resources
            .get(&name)
            .is_some_and(|e| e.error.contains("E5030"))
            .then_some(s)
    })
    .await;
    assert_ne!(status.state, RequestState::Running);
    // The Ready condition says the same on the resource, for its current generation.
    let ready = eventually("Ready=False with the fabric error", CONVERGE, || async {
        let r = env.resources().get(&name).await.ok()?;
        let c = resource_ready(&r)?;
        (c.reason == "Error").then_some((c, r.metadata.generation))
    })
    .await;
    assert_eq!(ready.0.status, "False");
    assert!(ready.0.message.contains("E5030"), "{:?}", ready.0);
    assert_eq!(ready.0.observed_generation, ready.1);
    let failed_since = ready.0.last_transition_time.clone();
    let req = env.request("flaky").await.unwrap();
    let ready = request_ready(&req).unwrap();
    assert_eq!(ready.status, "False");
    assert_ne!(ready.reason, "Running");

    // The fabric recovers: the retry (with backoff) attaches and the error clears.
    env.sim.clear_faults();
    let req = env.wait_running("flaky", 1).await;
    let r = env.resources().get(&name).await.unwrap();
    assert_eq!(resource_error(&r), "");
    assert_eq!(req.status.unwrap().resources[&name].error, "");
    let device = r.device_id().unwrap().to_owned();
    assert_eq!(env.gpus_on(&m1), vec![device.clone()]);
    let online = eventually("the resource Ready=True", CONVERGE, || async {
        let c = resource_ready(&env.resources().get(&name).await.ok()?)?;
        (c.status == "True").then_some(c)
    })
    .await;
    assert_eq!(online.reason, "Online");
    assert!(online.message.contains(&device), "{online:?}");
    assert!(online.last_transition_time.0 >= failed_since.0);
    let running = eventually("the request Ready=True", CONVERGE, || async {
        let req = env.request("flaky").await?;
        let c = request_ready(&req)?;
        (c.status == "True").then_some((c, req.metadata.generation))
    })
    .await;
    assert_eq!(running.0.reason, "Running");
    assert_eq!(running.0.message, "all 1 devices are online");
    assert_eq!(running.0.observed_generation, running.1);

    // The health check shows a warning while the fabric reports one, and clears.
    env.sim.set_op_status(&device, "1").unwrap();
    let warning = eventually("the health warning", CONVERGE, || async {
        let e = resource_error(&env.resources().get(&name).await.ok()?);
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert!(warning.contains("warning"), "{warning}");
    assert_eq!(
        env.resources().get(&name).await.unwrap().state(),
        ResourceState::Online
    );
    // A health warning does not take an attached device out of Ready: the message
    // changes, the transition time does not.
    let warned = eventually("the warning in the Ready message", CONVERGE, || async {
        let c = resource_ready(&env.resources().get(&name).await.ok()?)?;
        c.message.contains("warning").then_some(c)
    })
    .await;
    assert_eq!(warned.status, "True");
    assert_eq!(warned.last_transition_time, online.last_transition_time);
    env.sim.set_op_status(&device, "0").unwrap();
    eventually("the warning cleared", CONVERGE, || async {
        resource_error(&env.resources().get(&name).await.ok()?)
            .is_empty()
            .then_some(())
    })
    .await;
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_gpus_block_detach_unless_force_detach() {
    let mut env = Env::start().await;
    let m1 = env.add_node("worker-1", "16").await;
    let m2 = env.add_node("worker-2", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 2);
    env.start_operator().await;

    let mut careful = gpu(1);
    careful.target_node = Some("worker-1".into());
    env.create_request("careful", careful.clone()).await;
    let mut forced = gpu(1);
    forced.target_node = Some("worker-2".into());
    forced.force_detach = true;
    env.create_request("forced", forced.clone()).await;
    env.wait_running("careful", 1).await;
    env.wait_running("forced", 1).await;
    let careful_gpu = env.gpus_on(&m1)[0].clone();
    let forced_gpu = env.gpus_on(&m2)[0].clone();
    env.nodes.set_busy(&careful_gpu, &["python3"]);
    env.nodes.set_busy(&forced_gpu, &["python3"]);

    // force_detach: detached although busy.
    forced.size = 0;
    env.set_request("forced", &forced).await;
    env.wait_running("forced", 0).await;
    assert!(env.gpus_on(&m2).is_empty());

    // Without it: the device stays, Detaching, and the error names the GPU and process.
    careful.size = 0;
    env.set_request("careful", &careful).await;
    let name = env.resources_of("careful").await[0].name_any();
    let error = eventually("the busy error", CONVERGE, || async {
        let r = env.resources().get(&name).await.ok()?;
        let e = resource_error(&r);
        (r.state() == ResourceState::Detaching && !e.is_empty()).then_some(e)
    })
    .await;
    assert!(
        error.contains(&careful_gpu) && error.contains("python3"),
        "{error}"
    );
    assert_eq!(env.gpus_on(&m1), vec![careful_gpu.clone()]);
    assert_eq!(
        env.request("careful").await.unwrap().state(),
        RequestState::Updating
    );
    eventually("a GpuBusy event", CONVERGE, || async {
        has_event(&env, &name, "GpuBusy").await.then_some(())
    })
    .await;

    // The work ends: the detach completes.
    env.nodes.set_busy(&careful_gpu, &[]);
    env.wait_running("careful", 0).await;
    assert!(env.gpus_on(&m1).is_empty());
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}

/// A provider call that traps is an error on that resource only; other resources keep
/// converging at the same time. (CXL memory needs no node commands, so the testkit
/// component's fake fabric is enough here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trapping_provider_call_fails_only_its_own_resource() {
    let mut env = Env::start().await;
    env.add_node("worker-1", "16").await;
    env.add_node("worker-2", "16").await;
    let spec = ProviderSpec::new("testkit", cro_test_support::component("cro-testkit"));
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
    env.provider = Arc::new(
        runtime
            .load(&spec, Arc::new(KubeCluster::new(env.client.clone())))
            .await
            .unwrap(),
    );
    env.start_operator().await;

    let mut good = gpu(2);
    good.resource_type = ResourceType::CxlMemory;
    good.model = "CXL-256G".into();
    good.target_node = Some("worker-1".into());
    let mut bad = good.clone();
    bad.model = "mode:trap".into();
    bad.target_node = Some("worker-2".into());
    env.create_request("good", good).await;
    env.create_request("bad", bad).await;

    let req = env.wait_running("good", 2).await;
    for (_, entry) in req.status.unwrap().resources {
        assert!(entry.device_id.starts_with("CXL-"), "{entry:?}");
    }
    let error = eventually("the trap error", CONVERGE, || async {
        let r = env.resources_of("bad").await.into_iter().next()?;
        let e = resource_error(&r);
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert!(error.contains("trapped"), "{error}");
    assert_ne!(
        env.request("bad").await.unwrap().state(),
        RequestState::Running
    );
    env.stop_operator().await.unwrap();
}

/// The real provider, except that the n-th attach call traps after it has done its
/// work (its HTTP requests reached the fabric), as a provider bug after the call would.
struct TrapAfterEffect {
    inner: Arc<dyn DeviceProvider>,
    calls: AtomicUsize,
    trap_on: usize,
}

impl DeviceProvider for TrapAfterEffect {
    fn add<'a>(&'a self, request: &'a AddRequest) -> BoxFuture<'a, ProviderResult<AddOutcome>> {
        Box::pin(async move {
            let out = self.inner.add(request).await;
            if self.calls.fetch_add(1, Ordering::SeqCst) + 1 == self.trap_on {
                return Err(CallError::Trap {
                    message: "wasm trap: unreachable executed".into(),
                    stderr: String::new(),
                });
            }
            out
        })
    }

    fn remove<'a>(
        &'a self,
        r: &'a domain::ComposableResource,
    ) -> BoxFuture<'a, ProviderResult<RemoveOutcome>> {
        self.inner.remove(r)
    }

    fn check<'a>(&'a self, r: &'a domain::ComposableResource) -> BoxFuture<'a, ProviderResult<()>> {
        self.inner.check(r)
    }

    fn list<'a>(&'a self, claims: &'a [Claim]) -> BoxFuture<'a, ProviderResult<Vec<DeviceInfo>>> {
        self.inner.list(claims)
    }

    fn pool<'a>(
        &'a self,
        query: &'a cro_runtime::PoolQuery,
    ) -> BoxFuture<'a, ProviderResult<cro_runtime::PoolOutcome>> {
        self.inner.pool(query)
    }

    fn counters(&self) -> Option<ProviderCounters> {
        self.inner.counters()
    }
}

/// Attach replies are lost three ways (the connection drops after the fabric acted;
/// the fabric acts but answers after the call's deadline; the provider traps after its
/// request): every resource still ends with exactly one device and the pool loses none.
async fn lost_attach_replies_cost_no_second_device(api: FabricApi) {
    const DEVICES: usize = 6;
    let mut env = Env::start_with(kube_harness::Harness::builder(), api).await;
    let machine = env.add_node("worker-1", "16").await;
    // A node no request asks for: the look for a lost reply's device reads only its
    // target node's machine, so nothing but the upstream sync asks about this one (and
    // the sync lists once at most here).
    let elsewhere = env.add_node("worker-2", "16").await;
    env.config.timings.sync_period = Duration::from_secs(3600);
    env.sim.add_free_devices("gpu", MODEL, DEVICES);
    let route = match api {
        FabricApi::Fm => Route::FmAttach,
        FabricApi::Cm => Route::CmResize,
    };
    env.sim.inject(Fault::DropAfterProcessing.on(route));
    env.sim
        .inject(Fault::StallAfterProcessing(Duration::from_secs(6)).on(route));
    env.provider = Arc::new(TrapAfterEffect {
        inner: common::fti::with_call_timeout(&env, "3s").await,
        calls: AtomicUsize::new(0),
        trap_on: 3,
    });
    env.start_operator().await;
    let on_worker_1 = cro_api::ScalarResourceDetails {
        target_node: Some("worker-1".into()),
        ..gpu(3)
    };
    env.create_request("lossy", on_worker_1).await;
    env.wait_running("lossy", 3).await;

    let mut held: Vec<String> = env
        .resources_of("lossy")
        .await
        .iter()
        .map(|r| r.device_id().expect("a device id").to_owned())
        .collect();
    held.sort();
    held.dedup();
    assert_eq!(
        held.len(),
        3,
        "each resource holds its own device: {held:?}"
    );
    assert_eq!(
        env.gpus_on(&machine),
        held,
        "the fabric attached no extra device"
    );
    assert_eq!(env.sim.free_devices("gpu", MODEL), DEVICES - 3);
    // Each lost reply was answered by adoption, not by asking the fabric again.
    assert_eq!(env.sim.requests_to(route).len(), 3);
    let metrics = env.metrics.as_ref().unwrap().encode();
    let adopted: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("cro_attach_adoptions_total "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(adopted >= 1, "{metrics}");
    if api == FabricApi::Fm {
        assert_eq!(adopted, 3, "{metrics}");
    }
    // Each look read worker-1's machine alone (the code before read every node's: one
    // read of worker-2's machine per look, 3 more here with FM).
    let reads_elsewhere = env
        .sim
        .requests()
        .iter()
        .filter(|r| matches!(r.route, Some(Route::FmGetMachine | Route::CmGetMachine)))
        .filter(|r| r.path.ends_with(&format!("/{elsewhere}")))
        .count();
    eprintln!("reads of worker-2's machine: {reads_elsewhere}");
    assert!(
        reads_elsewhere <= 1,
        "{reads_elsewhere} reads of the machine of a node no look is about"
    );
    // The attempt records stay on the resources holding their devices (removing them was
    // a write per device, docs/BENCHMARKS.md): unread from then on, they hold nothing up
    // below (the detach releases every device).

    env.requests()
        .delete("lossy", &Default::default())
        .await
        .unwrap();
    eventually("every device back in the pool", CONVERGE, || async {
        (env.request("lossy").await.is_none() && env.sim.free_devices("gpu", MODEL) == DEVICES)
            .then_some(())
    })
    .await;
    assert!(env.gpus_on(&machine).is_empty());
    env.stop_operator().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_attach_replies_cost_no_second_device_fm() {
    lost_attach_replies_cost_no_second_device(FabricApi::Fm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_attach_replies_cost_no_second_device_cm() {
    lost_attach_replies_cost_no_second_device(FabricApi::Cm).await;
}

/// An empty pool is the typed no-capacity error in the status and the metrics, not a
/// generic fabric error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_free_device_is_reported_as_no_capacity() {
    let mut env = Env::start().await;
    env.add_node("worker-1", "16").await;
    env.start_operator().await;
    env.create_request("hungry", gpu(1)).await;
    let error = eventually("the no-capacity error", CONVERGE, || async {
        let r = env.resources_of("hungry").await.into_iter().next()?;
        let e = resource_error(&r);
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert!(error.contains("no capacity"), "{error}");
    let metrics = env.metrics.as_ref().unwrap().encode();
    assert!(
        metrics.contains(
            "cro_provider_calls_total{operation=\"add_resource\",outcome=\"no_capacity\"}"
        ),
        "{metrics}"
    );
    assert!(!metrics.contains("outcome=\"fabric\""), "{metrics}");
    // Devices arrive in the pool: the retry attaches one.
    env.sim.add_free_devices("gpu", MODEL, 1);
    env.wait_running("hungry", 1).await;
    env.stop_operator().await.unwrap();
}

/// A slow but working fabric (slower than the runtime's default deadline of 30 s,
/// within the 180 s the Go operator allowed) is waited for: one request, one device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_fabric_is_waited_for_in_the_go_environment() {
    let mut env = Env::start().await;
    let machine = env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 2);
    env.sim
        .inject(Fault::Latency(Duration::from_secs(35)).on(Route::FmAttach));
    env.start_operator().await;
    env.create_request("patient", gpu(1)).await;
    let req = eventually("patient Running with 1 device", CONVERGE, || async {
        let r = env.request("patient").await?;
        (r.status.as_ref()?.state == RequestState::Running).then_some(r)
    })
    .await;
    assert_eq!(req.status.unwrap().resources.len(), 1);
    assert_eq!(env.sim.requests_to(Route::FmAttach).len(), 1);
    assert_eq!(env.gpus_on(&machine).len(), 1);
    assert_eq!(env.sim.free_devices("gpu", MODEL), 1);
    env.stop_operator().await.unwrap();
}

/// What reached the provider, call by call.
#[derive(Default)]
struct Seen {
    adds: Vec<AddRequest>,
    lists: Vec<Vec<Claim>>,
}

/// The real provider, recording what each attach and listing handed it.
struct Recording {
    inner: Arc<dyn DeviceProvider>,
    seen: Arc<std::sync::Mutex<Seen>>,
}

impl Recording {
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl DeviceProvider for Recording {
    fn add<'a>(&'a self, request: &'a AddRequest) -> BoxFuture<'a, ProviderResult<AddOutcome>> {
        self.seen().adds.push(request.clone());
        self.inner.add(request)
    }

    fn remove<'a>(
        &'a self,
        r: &'a domain::ComposableResource,
    ) -> BoxFuture<'a, ProviderResult<RemoveOutcome>> {
        self.inner.remove(r)
    }

    fn check<'a>(&'a self, r: &'a domain::ComposableResource) -> BoxFuture<'a, ProviderResult<()>> {
        self.inner.check(r)
    }

    fn list<'a>(&'a self, claims: &'a [Claim]) -> BoxFuture<'a, ProviderResult<Vec<DeviceInfo>>> {
        self.seen().lists.push(claims.to_vec());
        self.inner.list(claims)
    }

    fn pool<'a>(
        &'a self,
        query: &'a cro_runtime::PoolQuery,
    ) -> BoxFuture<'a, ProviderResult<cro_runtime::PoolOutcome>> {
        self.inner.pool(query)
    }

    fn counters(&self) -> Option<ProviderCounters> {
        self.inner.counters()
    }
}

/// The Go environment's FTI provider is granted the `credentials` Secret, so the wiring
/// of `cro run` (`Operator::new`) wraps it to name that Secret in credential failures.
/// Through that wiring, everything the controllers pass must reach the provider: an
/// attach's attempt key (the resource's uid) and the devices other resources hold, and a
/// listing's claims. (A wrapper that fell back to the 0.1.0-shaped calls handed the
/// provider an attempt key of the resource's name and no claims at all.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attaches_and_listings_reach_a_provider_granted_a_secret_whole() {
    let mut env = Env::start().await;
    assert!(
        env.config.credentials.is_some(),
        "the Go environment's provider is granted a Secret"
    );
    let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
    env.provider = Arc::new(Recording {
        inner: env.provider.clone(),
        seen: seen.clone(),
    });
    env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 2);
    env.start_operator().await;

    env.create_request("whole", gpu(1)).await;
    env.wait_running("whole", 1).await;
    let first = env.resources_of("whole").await.remove(0);
    let first_device = first.device_id().expect("a device id").to_owned();
    env.set_request("whole", &gpu(2)).await;
    env.wait_running("whole", 2).await;
    let second = env
        .resources_of("whole")
        .await
        .into_iter()
        .find(|r| r.name_any() != first.name_any())
        .expect("a second resource");
    let second_device = second.device_id().expect("a device id").to_owned();

    // Every attach carried its resource's uid as the attempt key.
    let adds = std::mem::take(&mut seen.lock().unwrap().adds);
    assert!(!adds.is_empty());
    for add in &adds {
        let uid = [&first, &second]
            .into_iter()
            .find(|r| r.name_any() == add.resource.name)
            .and_then(|r| r.uid())
            .expect("an attach of one of the two resources");
        assert_eq!(add.attempt_key, uid, "attempt key of {}", add.resource.name);
    }
    // The second attach knew the device the first resource holds.
    let second_add = adds
        .iter()
        .rfind(|a| a.resource.name == second.name_any())
        .expect("the second resource's attach");
    assert!(
        second_add
            .claims
            .iter()
            .any(|c| c.resource == first.name_any()
                && c.device_id.as_deref() == Some(first_device.as_str())),
        "the second attach's claims name the first resource's device: {:?}",
        second_add.claims
    );
    // The upstream sync's listing names both held devices.
    eventually("a listing with both claims", CONVERGE, || {
        let seen = seen.clone();
        let (a, b) = (first_device.clone(), second_device.clone());
        async move {
            let seen = seen.lock().unwrap();
            seen.lists
                .iter()
                .any(|claims| {
                    [&a, &b].iter().all(|d| {
                        claims
                            .iter()
                            .any(|c| c.device_id.as_deref() == Some(d.as_str()))
                    })
                })
                .then_some(())
        }
    })
    .await;
    env.delete_request("whole").await;
    env.assert_nothing_attached().await;
    env.stop_operator().await.unwrap();
}

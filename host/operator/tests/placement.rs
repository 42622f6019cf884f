//! Where devices go: differentnode spreads, other_spec skips small nodes (in the Go
//! operator's units), too few nodes is an error that clears once a node is added.

mod common;

use std::collections::BTreeSet;

use common::{CONVERGE, Env, MODEL, eventually, gpu};
use cro_api::{AllocationPolicy, ComposableResource, NodeSpec, RequestState};
use cro_operator::INSUFFICIENT_NODES;
use kube::api::ListParams;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differentnode_spreads_and_waits_for_enough_nodes() {
    let mut env = Env::start().await;
    let m1 = env.add_node("worker-1", "16").await;
    let m2 = env.add_node("worker-2", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 3);
    env.start_operator().await;

    let mut spec = gpu(3);
    spec.allocation_policy = AllocationPolicy::DifferentNode;
    env.create_request("spread", spec.clone()).await;

    // Two nodes for three devices: the documented error, no device attached.
    let error = eventually("the allocation error", CONVERGE, || async {
        let r = env.request("spread").await?;
        let s = r.status?;
        (!s.error.is_empty()).then_some((s.state, s.error))
    })
    .await;
    assert_eq!(error.0, RequestState::NodeAllocating);
    assert!(error.1.contains(INSUFFICIENT_NODES), "{}", error.1);
    assert!(env.resources_of("spread").await.is_empty());
    assert!(env.gpus_on(&m1).is_empty() && env.gpus_on(&m2).is_empty());
    // The error is also an Event on the request.
    let events =
        kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(env.client.clone(), "default");
    eventually("an AllocationFailed event", CONVERGE, || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .any(|e| {
                e.reason.as_deref() == Some("AllocationFailed")
                    && e.type_.as_deref() == Some("Warning")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("spread")
            })
            .then_some(())
    })
    .await;

    // A third node arrives: the Node watch wakes the request, which now fits.
    let m3 = env.add_node("worker-3", "16").await;
    let req = env.wait_running("spread", 3).await;
    assert_eq!(req.status.unwrap().error, "");
    let nodes: BTreeSet<String> = env
        .resources_of("spread")
        .await
        .iter()
        .map(|r| r.spec.target_node.clone())
        .collect();
    assert_eq!(nodes.len(), 3);
    for m in [&m1, &m2, &m3] {
        assert_eq!(env.gpus_on(m).len(), 1);
    }
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}

/// other_spec places devices where the Go operator did (docs/differences-from-go.md keeps
/// its quirk): node `status.capacity`, not allocatable, with CPU as whole cores against
/// the request's `milli_cpu` number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_spec_compares_capacity_in_go_units_and_samenode_requests_do_not_share_nodes() {
    let mut env = Env::start().await;
    // 4 cores: too few for 8. Read as millicores (4000 >= 8) it would fit, and it is
    // first by name.
    let small = env.add_node("a-small", "4").await;
    // 16 cores of capacity, 4 allocatable: fits by capacity, not by allocatable.
    let reserved = env
        .add_node_with(
            "b-reserved",
            "16",
            "4",
            common::nodes::NodeOptions::default(),
        )
        .await;
    let other = env.add_node("c-other", "32").await;
    env.sim.add_free_devices("gpu", MODEL, 4);
    env.start_operator().await;

    let mut spec = gpu(2);
    spec.other_spec = Some(NodeSpec {
        milli_cpu: 8,
        ..NodeSpec::default()
    });
    env.create_request("needs-cpu", spec).await;
    env.wait_running("needs-cpu", 2).await;
    assert!(env.gpus_on(&small).is_empty());
    assert_eq!(env.gpus_on(&reserved).len(), 2);

    // A second samenode request without a target avoids the node the first one uses.
    let mut second = gpu(1);
    second.model = MODEL.into();
    second.other_spec = Some(NodeSpec {
        milli_cpu: 8,
        ..NodeSpec::default()
    });
    env.create_request("second", second).await;
    env.wait_running("second", 1).await;
    assert_eq!(env.gpus_on(&other).len(), 1);
    assert_eq!(env.gpus_on(&reserved).len(), 2);
    assert!(env.gpus_on(&small).is_empty());
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}

/// The API requests a client sent, by kind: the LISTs watches start with, LISTs of every
/// object a reconcile made, LISTs by label, and LISTs cut to one object. Watches are not
/// counted.
#[derive(Default, Debug, Clone)]
struct Lists {
    /// A watch's (re)listing: kube's watcher pages its LIST by 500 (its default page
    /// size), which no read of the operator's own does.
    watch: std::collections::BTreeMap<String, usize>,
    full: std::collections::BTreeMap<String, usize>,
    by_label: std::collections::BTreeMap<String, usize>,
    one: std::collections::BTreeMap<String, usize>,
}

fn counting_client(
    config: &kube::Config,
    counts: std::sync::Arc<std::sync::Mutex<Lists>>,
) -> kube::Client {
    let layer =
        tower::util::MapRequestLayer::new(move |req: hyper::Request<kube::client::Body>| {
            let path = req.uri().path().to_owned();
            let query = req.uri().query().unwrap_or("").to_owned();
            let kind = path.rsplit('/').next().unwrap_or("").to_owned();
            let is_list = req.method() == hyper::Method::GET
                && ["composableresources", "composabilityrequests", "nodes"]
                    .contains(&kind.as_str())
                && !query.contains("watch=true");
            if is_list {
                let mut c = counts.lock().unwrap();
                let bucket = if query.split('&').any(|p| p == "limit=500") {
                    &mut c.watch
                } else if query.contains("labelSelector") {
                    &mut c.by_label
                } else if query.contains("limit=1") {
                    &mut c.one
                } else {
                    &mut c.full
                };
                *bucket.entry(kind).or_default() += 1;
            }
            req
        });
    kube::client::ClientBuilder::try_from(config.clone())
        .unwrap()
        .with_layer(&layer)
        .build()
}

/// Starts the operator on a client that shows `see` the method and path of every
/// request it sends: the counting tests' view of the operator's own writes.
async fn start_operator_seeing(
    env: &mut Env,
    see: impl Fn(&hyper::Method, &str) + Send + Sync + 'static,
) {
    start_operator_seeing_uris(env, move |method, uri| see(method, uri.path())).await;
}

/// [`start_operator_seeing`], with each request's whole URI (its query too).
async fn start_operator_seeing_uris(
    env: &mut Env,
    see: impl Fn(&hyper::Method, &hyper::Uri) + Send + Sync + 'static,
) {
    let see = std::sync::Arc::new(see);
    let layer =
        tower::util::MapRequestLayer::new(move |req: hyper::Request<kube::client::Body>| {
            see(req.method(), req.uri());
            req
        });
    let plain = env.client.clone();
    env.client = kube::client::ClientBuilder::try_from(env.harness.config().clone())
        .unwrap()
        .with_layer(&layer)
        .build();
    env.start_operator().await;
    env.client = plain;
}

/// Starts the operator counting its writes of request `name`'s status.
async fn start_operator_counting_status_writes(
    env: &mut Env,
    name: &str,
) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    let writes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = writes.clone();
    let status = format!("/composabilityrequests/{name}/status");
    start_operator_seeing(env, move |method, path| {
        if matches!(*method, hyper::Method::PATCH | hyper::Method::PUT) && path.ends_with(&status) {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    })
    .await;
    writes
}

/// Request `name` once its Ready condition is True.
async fn ready_request(env: &Env, name: &str) -> cro_api::ComposabilityRequest {
    eventually("the Ready condition", CONVERGE, || async {
        let r = env.request(name).await?;
        let ready = r
            .status
            .as_ref()?
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(r)
    })
    .await
}

/// The reconciles `controller` made, as the operator's metrics count them.
fn reconciles(metrics: &str, controller: &str) -> usize {
    let prefix = format!("cro_reconciles_total{{controller=\"{controller}\",");
    metrics
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<usize>().ok())
        .sum()
}

/// Reconciliations read requests, nodes and resources from watch caches: planning N
/// requests and detaching their devices must not list every object per reconcile (that
/// made the work of N requests grow as N², docs/BENCHMARKS.md). The old code listed all
/// requests and all nodes per allocation, all resources per attach and per detach, and a request's
/// resources by label in every reconcile of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciles_read_watch_caches_instead_of_listing_every_object() {
    const N: usize = 8;
    let mut env = Env::start().await;
    for i in 1..=3 {
        env.add_node(&format!("worker-{i}"), "16").await;
    }
    env.sim.add_free_devices("gpu", MODEL, N);
    // The upstream sync lists every resource once per period (not per reconcile): keep
    // it out of these counts.
    env.config.timings.sync_period = std::time::Duration::from_secs(3600);
    let counts = std::sync::Arc::new(std::sync::Mutex::new(Lists::default()));
    let plain = env.client.clone();
    env.client = counting_client(env.harness.config(), counts.clone());
    env.start_operator().await;
    env.client = plain;

    // Same-node requests (the default) would not share a node: these may.
    let mut spec = gpu(1);
    spec.allocation_policy = AllocationPolicy::DifferentNode;
    for i in 0..N {
        env.create_request(&format!("r{i}"), spec.clone()).await;
    }
    for i in 0..N {
        env.wait_running(&format!("r{i}"), 1).await;
    }
    for i in 0..N {
        env.requests()
            .delete(&format!("r{i}"), &Default::default())
            .await
            .unwrap();
    }
    eventually("every request and resource gone", CONVERGE, || async {
        let left = env
            .requests()
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .len()
            + env
                .resources()
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .len();
        (left == 0).then_some(())
    })
    .await;
    let c = counts.lock().unwrap().clone();
    let metrics = env.metrics.as_ref().unwrap().encode();
    let request_reconciles = reconciles(&metrics, cro_operator::REQUEST_CONTROLLER);
    eprintln!(
        "LIST calls by the operator for {N} requests, up and down, over {request_reconciles} request reconciles: {c:?}"
    );
    let get =
        |m: &std::collections::BTreeMap<String, usize>, k: &str| m.get(k).copied().unwrap_or(0);
    // Each watch lists its kind once when it starts (the controllers' and the caches':
    // at most three per kind) and again when its stream breaks. A break needs the API
    // server to drop the watch, which it does on a loaded machine (seen once, for one
    // kind, with the whole suite running beside it): one relisting is allowed; a LIST per
    // reconcile would be dozens.
    for kind in ["composabilityrequests", "composableresources", "nodes"] {
        assert!(get(&c.watch, kind) <= 4, "{c:?}");
    }
    // Reconciles read nodes and requests from the caches, which the controllers wait
    // for: never a LIST of every one. (Before the controllers waited, a reconcile that
    // beat the caches' first listing on a loaded machine listed them.)
    assert_eq!(get(&c.full, "nodes"), 0, "{c:?}");
    assert_eq!(get(&c.full, "composabilityrequests"), 0, "{c:?}");
    // Resources: only the sync's first round (once per period); the old code listed
    // them once per attach and once per detach.
    assert!(get(&c.full, "composableresources") <= 1, "{c:?}");
    // By label only when the cache lacks a resource the request's status names (named
    // by the stored plan before it exists, or deleted and the last look before cleanup
    // ends); how many reconciles fall in those windows depends on timing, so this is
    // measured against the reconciles: the old code listed in every one, this a few per
    // request.
    let by_label = get(&c.by_label, "composableresources");
    assert!(request_reconciles > 0, "{metrics}");
    assert!(
        2 * by_label <= request_reconciles,
        "{c:?}, {request_reconciles} reconciles"
    );
    env.stop_operator().await.unwrap();
}

/// Each write to a resource is a watch event that every watch of resources decodes and
/// that reconciles the resource again, so an attach writes its resource's annotations
/// once: the machine record and the attempt record come with the resource's creation
/// (no attach asked for yet), and the fabric's machine goes together with the attempt
/// record's removal once the ids are stored (the code before wrote the first two in a
/// write of their own, the code before that each of the four apart:
/// docs/BENCHMARKS.md).
/// The records an attach needs (its attempt, the node's machine) come with the resource's
/// creation, and the attempt record stays once the ids are stored (unread from then on):
/// the old code removed it in a metadata write per device. The fabric's machine, which
/// the provider names only when it attaches, is noted by the node's first devices; a
/// resource created on that node later carries it from its creation and writes no
/// annotation at all (the old code: 1 each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attach_writes_its_resource_annotations_once() {
    let mut env = Env::start().await;
    env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 4);
    let patches = std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<
        String,
        usize,
    >::new()));
    let counted = patches.clone();
    start_operator_seeing(&mut env, move |method, path| {
        // A metadata write of one resource (not its status subresource).
        if method == hyper::Method::PATCH
            && let Some((collection, name)) = path.rsplit_once('/')
            && collection.ends_with("/composableresources")
        {
            *counted.lock().unwrap().entry(name.to_owned()).or_default() += 1;
        }
    })
    .await;

    env.create_request("r", gpu(2)).await;
    env.wait_running("r", 2).await;
    let mut on_the_node = gpu(2);
    on_the_node.target_node = Some("worker-1".into());
    env.create_request("later", on_the_node).await;
    env.wait_running("later", 2).await;
    let patches = patches.lock().unwrap().clone();
    for request in ["r", "later"] {
        for res in env.resources_of(request).await {
            let name = res.metadata.name.clone().unwrap();
            // The machine record names the fabric's machine; the attempt record stays.
            let record = cro_operator::NodeMachine::of_resource(&res)
                .unwrap_or_else(|| panic!("{name} has no machine record"));
            assert!(record.fabric_machine.is_some(), "{name}: {record:?}");
            assert!(
                res.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(cro_operator::ANNOTATION_ATTACH_ATTEMPT)),
                "{name} lost its attempt record"
            );
            // The node's first devices (created together) note the fabric's machine.
            let writes = patches.get(&name).copied().unwrap_or(0);
            let most = if request == "r" { 1 } else { 0 };
            assert!(
                writes <= most,
                "{name}: {writes} metadata writes (at most {most}): {patches:?}"
            );
        }
    }
}

/// A request's status mirrors its devices, and each write of it is a watch event every
/// watch of requests decodes: the old code wrote the request on every state of every
/// device (Attaching, ids, Online: at least three per device). Progress of its devices
/// now waits up to `timings.mirror_delay` and is written together; the request's state
/// and error are written at once, each with the Ready condition it implies (two writes
/// before). With the whole convergence inside one delay, a four-device request writes its
/// status twice (12 before) and ends with every device's final state and ids; deleted,
/// once (Cleaning).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_writes_its_status_per_request_state_not_per_device_state() {
    const DEVICES: usize = 4;
    let mut env = Env::start().await;
    env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, DEVICES);
    env.config.timings.mirror_delay = std::time::Duration::from_secs(60);
    let writes = start_operator_counting_status_writes(&mut env, "r").await;

    env.create_request("r", gpu(DEVICES as i64)).await;
    env.wait_running("r", DEVICES).await;
    // The Ready condition follows Running in its own write.
    let request = ready_request(&env, "r").await;
    let status = request.status.unwrap();
    assert_eq!(status.resources.len(), DEVICES);
    for (name, entry) in &status.resources {
        assert_eq!(
            entry.state,
            cro_api::ResourceState::Online,
            "{name}: {entry:?}"
        );
        assert!(
            !entry.device_id.is_empty(),
            "{name} has no device id: {entry:?}"
        );
    }
    let n = writes.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!("status writes of a {DEVICES}-device request: {n}");
    // Updating with its plan and Ready condition (a new request whose plan succeeds skips
    // NodeAllocating); Running with its Ready condition (2 measured), however many
    // devices. One more is allowed for a device's readiness seen late (Running while a
    // device is not Ready yet, then Ready).
    assert!(n <= 3, "{n} status writes");
    // On the way down: the finalizer's removal once every resource is gone, and no
    // status write. `Cleaning` waits `timings.mirror_delay` (here a minute) and the
    // deletion ends sooner; the devices detaching and going are progress. The previous
    // code wrote `Cleaning` first (1 measured), the older one each change, the Ready
    // condition apart and Deleting (5).
    writes.store(0, std::sync::atomic::Ordering::SeqCst);
    env.delete_request("r").await;
    let n = writes.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!("status writes of a {DEVICES}-device request on its way down: {n}");
    assert_eq!(n, 0, "{n} status writes on the way down");
    env.stop_operator().await.unwrap();
}

/// A request's devices' progress waits up to 16 s (8 × `timings.mirror_delay`) and
/// usually rides along with its next state, and a request being cleaned writes none
/// within a minute: at N = 1,000 the old paces (progress every `timings.mirror_delay`,
/// 2 s, while it kept coming; then a first within 2 s and more within 16 s, Cleaning
/// within 16 s) made up to 0.57 request writes per device up and 0.35 down more than the
/// states alone (docs/BENCHMARKS.md). Six devices on one node, attached one at a time
/// with every fabric call taking 1 s (8 s up): the old code wrote progress 2 s in, while
/// the request was Updating (a version of it, seen from a watch, showing a device's
/// state or ids before Running; 3 status writes measured); now its plan and Running (one
/// more is allowed for a device's readiness seen late). Down, with 1.6 s per call (about
/// 20 s): the old code wrote progress 16 s after the request went Cleaning (every 2 s
/// before that: 3 writes measured at 400 ms per call); now Cleaning alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_of_a_slow_request_is_written_at_a_slower_pace() {
    use fabric_sim::{Fault, Injection};
    use futures::StreamExt;
    const DEVICES: usize = 6;
    let mut env = Env::start().await;
    env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, DEVICES);
    env.sim
        .inject(Injection::from(Fault::Latency(std::time::Duration::from_secs(1))).always());
    // The default (the tests' own timings are faster).
    env.config.timings.mirror_delay = std::time::Duration::from_secs(2);
    // Every version of the request, as a watch sees it: its state, and how many of its
    // devices the mirror shows past their plan (a state or ids).
    let versions = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = versions.clone();
    let mut stream = kube::runtime::watcher(env.requests(), Default::default()).boxed();
    let watch = tokio::spawn(async move {
        while let Some(event) = stream.next().await {
            if let Ok(kube::runtime::watcher::Event::Apply(r)) = event {
                let status = r.status.clone().unwrap_or_default();
                let moved = status
                    .resources
                    .values()
                    .filter(|e| e.state != cro_api::ResourceState::Empty || !e.device_id.is_empty())
                    .count();
                seen.lock()
                    .unwrap()
                    .push((status.state.as_str().to_owned(), moved));
            }
        }
    });
    let writes = start_operator_counting_status_writes(&mut env, "r").await;

    let created = std::time::Instant::now();
    env.create_request("r", gpu(DEVICES as i64)).await;
    env.wait_running("r", DEVICES).await;
    // (A device's readiness seen late is written after Running.)
    ready_request(&env, "r").await;
    let up = writes.swap(0, std::sync::atomic::Ordering::SeqCst);
    eprintln!(
        "status writes of a {DEVICES}-device request over {:?} up: {up}",
        created.elapsed()
    );
    assert!(up <= 3, "{up} status writes up");
    eventually("the watch to see Running", CONVERGE, || async {
        let v = versions.lock().unwrap();
        v.iter().any(|(state, _)| state == "Running").then_some(())
    })
    .await;
    let early: Vec<_> = versions
        .lock()
        .unwrap()
        .iter()
        .filter(|(state, moved)| state == "Updating" && *moved > 0)
        .cloned()
        .collect();
    assert!(
        early.is_empty(),
        "progress written alone while Updating: {early:?}"
    );

    env.sim.clear_faults();
    env.sim
        .inject(Injection::from(Fault::Latency(std::time::Duration::from_millis(1600))).always());
    let deleted = std::time::Instant::now();
    env.delete_request("r").await;
    let down = writes.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!(
        "status writes on the way down over {:?}: {down}",
        deleted.elapsed()
    );
    assert!(down <= 1, "{down} status writes down");
    // A deletion that lasts shows `Cleaning` (written once it has lasted
    // `timings.mirror_delay`; a quicker one goes with its last state).
    watch.abort();
    let states: Vec<_> = versions
        .lock()
        .unwrap()
        .iter()
        .map(|(s, _)| s.clone())
        .collect();
    assert!(
        states.iter().any(|s| s == "Cleaning"),
        "a deletion of about 20 s never showed Cleaning: {states:?}"
    );
    env.stop_operator().await.unwrap();
}

/// A resource's state and the Ready condition it implies are one write, not two: each
/// write is a watch event every watch of resources decodes and wakes the resource again
/// (the old code wrote Attaching, then Ready False; Online, then Ready True). Seen from a
/// watch, no version of a resource is Online without Ready True, or Attaching without a
/// Ready condition saying why it is not ready. The writes per device are counted on the
/// operator's client and printed (docs/BENCHMARKS.md lists them), and a request's devices
/// are named by one Normal Event of the request per phase (before: each device's
/// `Attached` and `Online`, `Detaching` and `Detached`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_state_and_its_ready_condition_are_one_write() {
    use futures::StreamExt;
    const DEVICES: usize = 2;
    let mut env = Env::start().await;
    env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, DEVICES);
    // Waits on the node (the driver pod the GPU operator starts once the node has a GPU)
    // shorter than this are not written.
    env.config.timings.mirror_delay = std::time::Duration::from_secs(60);
    let writes = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let counted = writes.clone();
    let writes_at_delete = std::sync::Arc::new(std::sync::Mutex::new(None::<Vec<String>>));
    let counted_down = writes_at_delete.clone();
    // Every version of every resource, as a watch sees it: (name, state, Ready status).
    let versions = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = versions.clone();
    let mut stream = kube::runtime::watcher(env.resources(), Default::default()).boxed();
    let watch = tokio::spawn(async move {
        while let Some(event) = stream.next().await {
            if let Ok(kube::runtime::watcher::Event::Apply(r)) = event {
                let status = r.status.clone().unwrap_or_default();
                let ready = status
                    .conditions
                    .iter()
                    .find(|c| c.type_ == "Ready")
                    .map(|c| c.status.clone());
                seen.lock().unwrap().push((
                    r.metadata.name.clone().unwrap_or_default(),
                    status.state.as_str().to_owned(),
                    ready,
                ));
            }
        }
    });
    start_operator_seeing(&mut env, move |method, path| {
        if matches!(*method, hyper::Method::PATCH | hyper::Method::PUT)
            && let Some((_, rest)) = path.split_once("/composableresources/")
        {
            counted.lock().unwrap().push(rest.to_owned());
            if let Some(down) = counted_down.lock().unwrap().as_mut() {
                down.push(rest.to_owned());
            }
        }
    })
    .await;

    env.create_request("r", gpu(DEVICES as i64)).await;
    env.wait_running("r", DEVICES).await;
    let resources = env.resources().list(&ListParams::default()).await.unwrap();
    for res in &resources.items {
        let name = res.metadata.name.clone().unwrap();
        eventually("the resource's Ready condition", CONVERGE, || async {
            let r = env.resources().get(&name).await.ok()?;
            r.status?
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
                .then_some(())
        })
        .await;
    }
    // The watch has seen Ready True too before its versions are judged.
    eventually(
        "the watch to see every resource Ready",
        CONVERGE,
        || async {
            let v = versions.lock().unwrap();
            let ready = v
                .iter()
                .filter(|(_, state, ready)| state == "Online" && ready.as_deref() == Some("True"))
                .map(|(name, _, _)| name.clone())
                .collect::<BTreeSet<_>>();
            (ready.len() == DEVICES).then_some(())
        },
    )
    .await;
    watch.abort();
    let versions = versions.lock().unwrap().clone();
    let writes = writes.lock().unwrap().clone();
    for res in &resources.items {
        let name = res.metadata.name.clone().unwrap();
        let mine: Vec<_> = versions.iter().filter(|(n, _, _)| *n == name).collect();
        for (_, state, ready) in &mine {
            match state.as_str() {
                "Online" => assert_eq!(ready.as_deref(), Some("True"), "{name}: {mine:?}"),
                "Attaching" => assert_eq!(ready.as_deref(), Some("False"), "{name}: {mine:?}"),
                _ => {}
            }
        }
        let (status, meta) = writes_of(&writes, &name);
        eprintln!("{name} on its way up: {status} status writes, {meta} metadata writes");
        // Attaching with the ids, Online; the fabric's machine noted by the node's first
        // devices (the attempt record came with the resource's creation, says an attach
        // may be in flight, and stays: `Attaching` is not written before the fabric is
        // asked; `an_attach_writes_its_resource_annotations_once`). The old
        // code wrote 6 + 2 here: Attaching before the ask, Ready apart from Attaching and
        // from Online, the driver wait twice ("not scheduled", "not Ready"), and the
        // attempt record with the node's machine.
        assert!(status <= 2, "{name}: {status} status writes up");
        assert!(meta <= 1, "{name}: {meta} metadata writes up");
    }
    // At most one Event per device per phase (warnings apart). Up, one for the request:
    // its `Running` Event names every device; the old code also sent each device's
    // `Attached` and the request's `Allocated` (and, before that, `Online` per device).
    // Down, see below.
    let up_events = normal_events(&env).await;
    let running = normal_event_messages(&env, "r").await;
    eprintln!("the request on its way up: Events {running:?}");
    assert_eq!(running.len(), 1, "the request's Events up: {running:?}");
    assert_eq!(running[0].0, "Running");
    for res in &resources.items {
        let name = res.metadata.name.clone().unwrap();
        let mine = up_events.get(&name).cloned().unwrap_or_default();
        eprintln!("{name} on its way up: Events {mine:?}");
        assert!(mine.is_empty(), "{name}'s Events up: {mine:?}");
        assert_event_names(&running[0], res, "on worker-1");
    }
    // And on the way down, from the request's deletion until every resource is gone.
    writes_at_delete.lock().unwrap().replace(Vec::new());
    env.delete_request("r").await;
    let down = writes_at_delete.lock().unwrap().take().unwrap_or_default();
    for res in &resources.items {
        let name = res.metadata.name.clone().unwrap();
        let (status, meta) = writes_of(&down, &name);
        eprintln!("{name} on its way down: {status} status writes, {meta} metadata writes");
        // The finalizer's removal alone: a detach that ends in its first reconciliation
        // writes no `Detaching` (the old code wrote it before the fabric was asked, and
        // before that also the ids cleared with `Deleting`).
        assert_eq!(status, 0, "{name}: {status} status writes down");
        assert!(meta <= 1, "{name}: {meta} metadata writes down");
    }
    // Down as up: one Event for the request, `Detached` once its last device is gone
    // (sent after its finalizer's removal, so waited for), naming every device; the old
    // code sent a `Detached` per device instead.
    let detached = eventually("the request's Detached Event", CONVERGE, || async {
        let events = normal_event_messages(&env, "r").await;
        (events.len() > 1).then_some(events)
    })
    .await;
    eprintln!("the request on its way down: Events {:?}", &detached[1..]);
    assert_eq!(detached.len(), 2, "the request's Events: {detached:?}");
    assert_eq!(detached[1].0, "Detached");
    let all_events = normal_events(&env).await;
    for res in &resources.items {
        let name = res.metadata.name.clone().unwrap();
        let down: Vec<_> = all_events
            .get(&name)
            .into_iter()
            .flatten()
            .skip(up_events.get(&name).map_or(0, Vec::len))
            .collect();
        eprintln!("{name} on its way down: Events {down:?}");
        assert!(down.is_empty(), "{name}'s Events down: {down:?}");
        assert_event_names(&detached[1], res, "from worker-1");
    }
    env.stop_operator().await.unwrap();
}

/// Requests deleted together ask for each device's deletion once. Each reconciliation of
/// a request being cleaned reads its resources from the watch cache, which may not show
/// a deletion this process asked for a moment ago: the old code sent that DELETE again
/// (59 DELETEs for 40 devices in cro-bench's convergence at N = 20).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_deleted_together_delete_each_device_once() {
    const REQUESTS: usize = 8;
    let mut env = Env::start().await;
    // Requests of the default policy (samenode) do not share a node.
    for i in 0..REQUESTS {
        env.add_node(&format!("worker-{i}"), "16").await;
    }
    env.sim.add_free_devices("gpu", MODEL, 2 * REQUESTS);
    let deletes = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let counted = deletes.clone();
    start_operator_seeing(&mut env, move |method, path| {
        if method == hyper::Method::DELETE
            && let Some((_, name)) = path.split_once("/composableresources/")
        {
            counted.lock().unwrap().push(name.to_owned());
        }
    })
    .await;
    for i in 0..REQUESTS {
        env.create_request(&format!("r{i}"), gpu(2)).await;
    }
    for i in 0..REQUESTS {
        env.wait_running(&format!("r{i}"), 2).await;
    }
    for i in 0..REQUESTS {
        env.requests()
            .delete(&format!("r{i}"), &kube::api::DeleteParams::default())
            .await
            .unwrap();
    }
    eventually("every request and device gone", CONVERGE, || async {
        let left = env.resources().list(&ListParams::default()).await.ok()?;
        let reqs = env.requests().list(&ListParams::default()).await.ok()?;
        (left.items.is_empty() && reqs.items.is_empty()).then_some(())
    })
    .await;
    let deletes = deletes.lock().unwrap().clone();
    let mut per = std::collections::BTreeMap::<&str, usize>::new();
    for name in &deletes {
        *per.entry(name.as_str()).or_default() += 1;
    }
    eprintln!(
        "DELETEs of {} devices: {} ({per:?})",
        2 * REQUESTS,
        deletes.len()
    );
    assert_eq!(per.len(), 2 * REQUESTS, "{per:?}");
    assert!(
        per.values().all(|&n| n == 1),
        "a device deleted more than once: {per:?}"
    );
    env.stop_operator().await.unwrap();
}

/// Reads of an attach and a detach that watch caches answer now: the GPU operator's
/// device plugin DaemonSets (the old code read both with a GET at every attach and every
/// detach, 2 per device each way), and the resources of a request being cleaned while
/// its status still names a deleted one (the old code listed the request's resources by
/// label at each such reconcile, which the API server answers by scanning every resource
/// of the cluster: 2.65 lists per device at N = 1,000 in docs/BENCHMARKS.md), and reads
/// by name of a resource the cache saw deleted, one this process is about to create or
/// has just created, and the node's driver pods while an attach waits for the first to
/// turn Ready (the old code listed them at each look: 6 LISTs here), and the new
/// request at its first reconciliation (a GET before its finalizer's guarded write). The
/// device plugin is still restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemonsets_and_a_cleaned_requests_resources_are_read_from_watch_caches() {
    const DEVICES: usize = 2;
    let mut env = Env::start().await;
    env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, DEVICES);
    // The cleaning's progress waits: meanwhile its status names the deleted devices.
    env.config.timings.mirror_delay = std::time::Duration::from_secs(60);
    let reads = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let counted = reads.clone();
    let named = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let by_name = named.clone();
    let of_request = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let request_seen = of_request.clone();
    start_operator_seeing_uris(&mut env, move |method, uri| {
        let path = uri.path();
        if path.ends_with("/composabilityrequests/r")
            || path.ends_with("/composabilityrequests/r/status")
        {
            request_seen
                .lock()
                .unwrap()
                .push(format!("{method} {path}"));
        }
        if method != hyper::Method::GET {
            return;
        }
        let query = uri
            .query()
            .unwrap_or("")
            .replace("%2F", "/")
            .replace("%3D", "=");
        let by_request = query.contains(&format!("labelSelector={}=r", cro_api::LABEL_MANAGED_BY));
        // The node's driver pods, listed by node (not the cache's own list and watch).
        let driver_pods = path == "/api/v1/pods"
            && query.contains("nvidia-driver")
            && query.contains("fieldSelector=spec.nodeName");
        if path.contains("/daemonsets/")
            || path.starts_with("/api/v1/nodes/")
            || driver_pods
            || (path.ends_with("/composableresources") && by_request && !query.contains("watch="))
        {
            counted.lock().unwrap().push(format!("{path}?{query}"));
        }
        if path.contains("/composableresources/") {
            by_name.lock().unwrap().push(path.to_owned());
        }
    })
    .await;

    env.create_request("r", gpu(DEVICES as i64)).await;
    env.wait_running("r", DEVICES).await;
    let sets: kube::Api<k8s_openapi::api::apps::v1::DaemonSet> =
        kube::Api::namespaced(env.client.clone(), node_sim::GPU_OPERATOR_NS);
    eventually(
        "the device plugin restarted after the attach",
        CONVERGE,
        || async {
            let ds = sets.get(node_sim::DEVICE_PLUGIN_DS).await.ok()?;
            ds.spec
                .template
                .metadata?
                .annotations?
                .contains_key("kubectl.kubernetes.io/restartedAt")
                .then_some(())
        },
    )
    .await;
    env.requests()
        .delete("r", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    eventually("the request and its devices gone", CONVERGE, || async {
        let left = env.resources().list(&ListParams::default()).await.ok()?;
        let reqs = env.requests().list(&ListParams::default()).await.ok()?;
        (left.items.is_empty() && reqs.items.is_empty()).then_some(())
    })
    .await;
    let reads = reads.lock().unwrap().clone();
    assert!(
        reads.is_empty(),
        "reads a watch cache answers were sent to the API server: {reads:#?}"
    );
    // A reconciliation whose copy lags its own last write still reads, and so does a
    // detach whose finalizer removal conflicts: rarely, but a loaded CI machine once read
    // one of the 2 devices twice (3 reads). The old code read each device four times: at
    // its first reconciliation, before its creation, and at each reconciliation of the
    // cleaning while the status still named it.
    let named = named.lock().unwrap().clone();
    assert!(
        named.len() <= 2 * DEVICES,
        "resources read by name that the cache or this process knew of: {named:#?}"
    );
    // The new request's first reconciliation writes its finalizer, guarded by the
    // watch's copy, without reading it first (the old code read each new request once).
    let of_request = of_request.lock().unwrap().clone();
    assert!(
        of_request
            .first()
            .is_some_and(|first| first.starts_with("PATCH ")),
        "the new request was read before its first (guarded) write: {of_request:#?}"
    );
    env.stop_operator().await.unwrap();
}

/// GETs of Nodes the API server answered so far (its own request counter: the
/// provider's cluster view reads through a client of its own, which no layer of the
/// operator's client sees).
async fn node_gets(env: &Env) -> u64 {
    let request = hyper::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = env.client.request_text(request).await.unwrap();
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| {
            l.contains("resource=\"nodes\"")
                && l.contains("verb=\"GET\"")
                && l.contains("subresource=\"\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The provider looks its node's Node up on every attach (to find the node's fabric
/// machine); the operator answers those lookups from its own Node watch cache, lent to
/// the provider's cluster view as `cro run` does. Before, each was a GET of the API
/// server: one per device (3 here; 1 per device in docs/BENCHMARKS.md's count of the API
/// server's requests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_s_node_lookups_are_answered_from_the_operator_s_node_cache() {
    const DEVICES: usize = 3;
    let mut env = Env::start().await;
    let machine = env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, DEVICES);
    env.start_operator().await;
    let before = node_gets(&env).await;
    env.create_request("r", gpu(DEVICES as i64)).await;
    env.wait_running("r", DEVICES).await;
    let gets = node_gets(&env).await - before;
    println!("GETs of Nodes while {DEVICES} devices were attached: {gets}");
    assert_eq!(
        gets, 0,
        "the provider's Node lookups reached the API server"
    );
    // Each device went to the node's machine, which the provider read from the Node.
    let attached = env.gpus_on(&machine);
    assert_eq!(attached.len(), DEVICES, "attached: {attached:?}");
}

/// (status writes, metadata writes) of resource `name` among the written `paths` (each
/// the part after `/composableresources/`).
fn writes_of(paths: &[String], name: &str) -> (usize, usize) {
    let status = paths
        .iter()
        .filter(|p| **p == format!("{name}/status"))
        .count();
    (status, paths.iter().filter(|p| **p == name).count())
}

/// That a request's Event `(reason, note)` names `res` with its device id and where it
/// is (`on worker-1`, `from worker-1`).
fn assert_event_names(event: &(String, String), res: &ComposableResource, place: &str) {
    let name = res.metadata.name.clone().unwrap_or_default();
    let device = res
        .status
        .as_ref()
        .map(|s| s.device_id.clone())
        .unwrap_or_default();
    assert!(
        event.1.contains(&format!("{name} ({device}) {place}")),
        "the {} Event names {name}: {event:?}",
        event.0
    );
}

/// The (reason, message) of the Normal Events about `object`, oldest first.
async fn normal_event_messages(env: &Env, object: &str) -> Vec<(String, String)> {
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(env.client.clone(), "default");
    let mut list = events.list(&ListParams::default()).await.unwrap().items;
    list.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
    list.into_iter()
        .filter(|e| e.type_.as_deref() == Some("Normal"))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(object))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// The reasons of the Normal Events about each object, oldest first.
async fn normal_events(env: &Env) -> std::collections::BTreeMap<String, Vec<String>> {
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(env.client.clone(), "default");
    let mut list = events.list(&ListParams::default()).await.unwrap().items;
    list.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
    let mut by_object = std::collections::BTreeMap::<String, Vec<String>>::new();
    for e in list {
        if e.type_.as_deref() != Some("Normal") {
            continue;
        }
        let Some(object) = e.regarding.and_then(|r| r.name) else {
            continue;
        };
        by_object
            .entry(object)
            .or_default()
            .push(e.reason.unwrap_or_default());
    }
    by_object
}

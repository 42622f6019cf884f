//! Garbage collection when a node goes away and the upstream sync of GPUs nobody holds
//! (CXL memory is left alone).

mod common;
// Component sources (registry, ConfigMap, pull Secrets) share this binary's link.
mod sources;
// CdiProvider objects: routing, hot reload, deletion (crate::registry).
mod providers;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{CONVERGE, Env, MODEL, eventually, gpu};
use cro_api::{
    ComposableResource, LABEL_READY_TO_DETACH_CDI_DEVICE_ID, LABEL_READY_TO_DETACH_DEVICE_ID,
};
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_node_collects_its_requests_and_resources() {
    let mut env = Env::start().await;
    env.add_node("worker-1", "16").await;
    let m2 = env.add_node("worker-2", "16").await;
    let m3 = env.add_node("worker-3", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 4);
    env.start_operator().await;

    let mut pinned = gpu(1);
    pinned.target_node = Some("worker-2".into());
    env.create_request("pinned", pinned).await;
    env.create_request("floating", gpu(1)).await;
    env.wait_running("pinned", 1).await;
    env.wait_running("floating", 1).await;
    let pinned_resource = env.resources_of("pinned").await[0].name_any();
    let floating_before = env.resources_of("floating").await[0].clone();
    assert_eq!(floating_before.spec.target_node, "worker-1");

    // The pinned request's node goes: the request and its resource are deleted.
    env.delete_node("worker-2").await;
    eventually("pinned request and resource gone", CONVERGE, || async {
        (env.request("pinned").await.is_none()
            && env
                .resources()
                .get_opt(&pinned_resource)
                .await
                .ok()?
                .is_none())
        .then_some(())
    })
    .await;
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(env.client.clone(), "default");
    let notes: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("NodeGone"))
        .filter_map(|e| e.note)
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("target node worker-2 not found")),
        "{notes:?}"
    );
    // Its device is released on the fabric with the machine recorded at attach (the
    // Go operator left it attached).
    eventually("worker-2's device released", CONVERGE, || async {
        env.gpus_on(&m2).is_empty().then_some(())
    })
    .await;

    // The floating request's node goes: its device is collected and it allocates again
    // elsewhere (worker-3: worker-2 is gone too).
    env.delete_node("worker-1").await;
    let req = eventually("floating moved to worker-3", CONVERGE, || async {
        let r = env.request("floating").await?;
        let s = r.status.clone()?;
        let on3 = s.resources.values().all(|e| e.node_name == "worker-3");
        (s.state == cro_api::RequestState::Running && s.resources.len() == 1 && on3).then_some(r)
    })
    .await;
    assert!(
        !req.status
            .unwrap()
            .resources
            .contains_key(&floating_before.name_any())
    );
    assert_eq!(env.gpus_on(&m3).len(), 1);
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_nobody_holds_is_detached_after_the_grace_period() {
    let mut env = Env::start().await;
    let m1 = env.add_node("worker-1", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 1);
    let grace = Duration::from_secs(3);
    env.config.timings.orphan_grace = grace;
    env.start_operator().await;

    env.create_request("held", gpu(1)).await;
    env.wait_running("held", 1).await;
    let held = env.gpus_on(&m1);
    assert_eq!(held.len(), 1);

    // Every ready-to-detach resource that ever exists, however briefly.
    let seen: Arc<Mutex<Vec<ComposableResource>>> = Arc::default();
    let recorder = {
        let seen = seen.clone();
        let stream = watcher(
            env.resources(),
            watcher::Config::default().labels(LABEL_READY_TO_DETACH_DEVICE_ID),
        )
        .applied_objects();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(Ok(r)) = stream.next().await {
                seen.lock().unwrap().push(r);
            }
        })
    };

    // Someone attaches a device behind the operator's back, and some CXL memory.
    let stray = env.sim.attach_directly(&m1, "gpu", MODEL).unwrap();
    let memory = env
        .sim
        .attach_directly(&m1, "cxlmemory", "CXL-MEMORY-128GB")
        .unwrap();
    let attached_at = Instant::now();
    let mut expected = held.clone();
    expected.push(memory.serial.clone());
    expected.sort();
    eventually("the stray GPU detached", CONVERGE, || async {
        (env.gpus_on(&m1) == expected).then_some(())
    })
    .await;
    assert!(
        attached_at.elapsed() >= grace,
        "detached after {:?}, before the grace period of {grace:?}",
        attached_at.elapsed()
    );
    let orphan = seen
        .lock()
        .unwrap()
        .first()
        .cloned()
        .expect("a ready-to-detach resource");
    assert_eq!(
        orphan.labels()[LABEL_READY_TO_DETACH_DEVICE_ID],
        stray.serial
    );
    assert_eq!(
        orphan.labels()[LABEL_READY_TO_DETACH_CDI_DEVICE_ID],
        stray.res_uuid
    );
    assert_eq!(orphan.spec.target_node, "worker-1");
    eventually("the orphan resource gone", CONVERGE, || async {
        env.resources()
            .get_opt(&orphan.name_any())
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    recorder.abort();
    assert_eq!(env.resources_of("held").await.len(), 1);
    // CXL memory attached outside the operator is left alone (as by the Go operator):
    // it was never released, however long it stayed unclaimed.
    assert!(env.gpus_on(&m1).contains(&memory.serial));
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .all(|r| r.spec.resource_type == cro_api::ResourceType::Gpu),
        "only GPUs are released"
    );
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}

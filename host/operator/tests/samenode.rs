//! A samenode request end to end: attach, grow, shrink (docs/behaviour.md §3 priority), delete.

mod common;

use std::collections::BTreeMap;

use common::{CONVERGE, Env, MODEL, eventually, gpu, names};
use cro_api::{ANNOTATION_DELETE_DEVICE, ANNOTATION_LAST_USED_TIME, FINALIZER, ResourceState};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samenode_request_attaches_grows_shrinks_and_detaches_on_delete() {
    let mut env = Env::start().await;
    let m1 = env.add_node("worker-1", "16").await;
    let m2 = env.add_node("worker-2", "16").await;
    env.sim.add_free_devices("gpu", MODEL, 4);
    env.start_operator().await;

    env.create_request("train", gpu(2)).await;
    let req = env.wait_running("train", 2).await;

    // Both devices on the first node, attached in the simulator to its machine, with the
    // simulator's ids in both statuses.
    let resources = env.resources_of("train").await;
    assert!(resources.iter().all(|r| r.spec.target_node == "worker-1"));
    let on_m1 = env.gpus_on(&m1);
    assert_eq!(on_m1.len(), 2);
    assert!(env.gpus_on(&m2).is_empty());
    let status = req.status.unwrap();
    for r in &resources {
        let s = r.status.clone().unwrap();
        assert_eq!(s.state, ResourceState::Online);
        assert!(
            on_m1.contains(&s.device_id),
            "{} not on the machine",
            s.device_id
        );
        let device = env.sim.device(&s.device_id).unwrap();
        assert_eq!(s.cdi_device_id, device.res_uuid);
        assert!(r.finalizers().contains(&FINALIZER.to_string()));
        let mirrored = &status.resources[&r.name_any()];
        assert_eq!(mirrored.device_id, s.device_id);
        assert_eq!(mirrored.cdi_device_id, s.cdi_device_id);
        assert_eq!(mirrored.node_name, "worker-1");
        assert_eq!(mirrored.state, ResourceState::Online);
    }
    assert_eq!(status.scalar_resource, Some(gpu(2)));
    assert_eq!(status.error, "");

    // Grow to 3: the two stay, one more on the same node.
    let first_two = names(&resources);
    env.set_request("train", &gpu(3)).await;
    env.wait_running("train", 3).await;
    let grown = env.resources_of("train").await;
    assert!(first_two.iter().all(|n| names(&grown).contains(n)));
    assert!(grown.iter().all(|r| r.spec.target_node == "worker-1"));
    assert_eq!(env.gpus_on(&m1).len(), 3);

    // Shrink to 1. docs/behaviour.md §3: a device annotated delete-device goes first, then Online ones
    // oldest first by last-used time; the most recently used one stays.
    let mut by_age: Vec<String> = names(&grown);
    by_age.sort();
    let (marked, oldest, newest) = (&by_age[0], &by_age[1], &by_age[2]);
    let annotate = |name: String, annotations: serde_json::Value| {
        let api = env.resources();
        async move {
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
            )
            .await
            .unwrap();
        }
    };
    annotate(
        marked.clone(),
        json!({ANNOTATION_DELETE_DEVICE: "true", ANNOTATION_LAST_USED_TIME: "2030-01-01T00:00:00Z"}),
    )
    .await;
    annotate(
        oldest.clone(),
        json!({ANNOTATION_LAST_USED_TIME: "2020-01-01T00:00:00Z"}),
    )
    .await;
    annotate(
        newest.clone(),
        json!({ANNOTATION_LAST_USED_TIME: "2025-01-01T00:00:00Z"}),
    )
    .await;
    let device_of = |name: &str| {
        grown
            .iter()
            .find(|r| r.name_any() == name)
            .and_then(|r| r.device_id().map(str::to_owned))
            .unwrap()
    };
    let kept_device = device_of(newest);
    env.set_request("train", &gpu(1)).await;
    let req = env.wait_running("train", 1).await;
    assert_eq!(
        names(&env.resources_of("train").await),
        vec![newest.clone()]
    );
    assert_eq!(
        req.status
            .unwrap()
            .resources
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        vec![newest.clone()]
    );
    assert_eq!(env.gpus_on(&m1), vec![kept_device.clone()]);
    assert_eq!(env.sim.free_devices("gpu", MODEL), 3);

    // Delete: every device detached, every finalizer gone.
    env.requests()
        .delete("train", &DeleteParams::default())
        .await
        .unwrap();
    eventually("request and resources gone", CONVERGE, || async {
        (env.request("train").await.is_none() && env.resources_of("train").await.is_empty())
            .then_some(())
    })
    .await;
    assert!(env.gpus_on(&m1).is_empty());
    assert_eq!(env.sim.free_devices("gpu", MODEL), 4);

    // The node saw the drain sequence for each detached GPU.
    let drains: BTreeMap<String, usize> = env
        .nodes
        .commands()
        .iter()
        .filter(|(_, c)| c.iter().any(|a| a == "drain") && c.iter().any(|a| a == "-r"))
        .fold(BTreeMap::new(), |mut m, (node, _)| {
            *m.entry(node.clone()).or_default() += 1;
            m
        });
    assert_eq!(drains.get("worker-1"), Some(&3));
    env.assert_known_commands();
    env.stop_operator().await.unwrap();
}

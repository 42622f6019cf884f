//! Where devices go: differentnode spreads, other_spec skips small nodes (in the Go
//! operator's units), too few nodes is an error that clears once a node is added.

mod common;

use std::collections::BTreeSet;

use common::{CONVERGE, Env, MODEL, eventually, gpu};
use cro_api::{AllocationPolicy, NodeSpec, RequestState};
use cro_operator::allocation::INSUFFICIENT_NODES;
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

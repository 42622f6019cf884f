//! Fabric Manager API.

use std::time::Duration;

use cro_runtime::{
    AddRequest, Claim, DeviceInfo, DeviceType, PoolKind, PoolOutcome, PoolQuery, ProviderError,
    RemoveOutcome,
};
use fabric_sim::{Fault, Route, codes};
use provider_it::{Api, Build, Fixture, MODEL};
use serde_json::json;

use crate::*;

async fn fm() -> Fixture {
    let fx = Fixture::builder(Api::Fm).start().await;
    fx.sim.add_free_devices("gpu", MODEL, 3);
    fx
}

#[tokio::test]
async fn attach_returns_the_simulators_serial_and_fabric_uuid() {
    let fx = fm().await;
    let machine = fx.add_provider_id_node("worker-0");
    let (serial, uuid) = attached(
        fx.provider
            .add(&AddRequest::new(fx.gpu("gpu-a", "worker-0")))
            .await,
    );

    let on_machine = fx.sim.machine_devices(&machine);
    assert_eq!(on_machine.len(), 1);
    assert_eq!(on_machine[0].serial, serial);
    assert_eq!(on_machine[0].res_uuid, uuid);
    assert!(serial.starts_with("GPU-"));
    assert_eq!(fx.sim.free_devices("gpu", MODEL), 2);

    let patch = &fx.sim.requests_to(Route::FmAttach)[0];
    assert!(patch.tls);
    assert_eq!(
        patch.query_param("tenant_uuid").as_deref(),
        Some(fx.sim.tenant_id())
    );
    assert_eq!(
        patch.json().unwrap()["tenants"]["machines"][0]["resources"][0]["res_specs"][0]["res_spec"]
            ["condition"][0]["value"],
        MODEL
    );
}

/// Asks for `req` while the fabric drops its reply after acting on it; the machine's
/// devices afterwards.
async fn add_with_the_reply_lost(
    fx: &Fixture,
    req: &AddRequest,
    machine: &str,
) -> Vec<fabric_sim::SimDevice> {
    fx.sim
        .inject(Fault::DropAfterProcessing.on(Route::FmAttach));
    let lost = fx.provider.add(req).await;
    assert!(lost.is_err(), "the reply was dropped: {lost:?}");
    fx.sim.clear_faults();
    fx.sim.machine_devices(machine)
}

/// The fabric attaches but its reply is lost: the retry (same attempt key, the claims of
/// the cluster) adopts the device the lost reply left instead of attaching a second one,
/// and never takes the device another resource holds. A contract 0.1.0 host passes no
/// claims, so that build attaches again (documented in docs/fti-fabric-api.md).
#[tokio::test]
async fn a_retried_attach_after_a_lost_reply_adopts_the_device_it_left() {
    let fx = fm().await;
    let machine = fx.add_provider_id_node("worker-0");
    let (serial_a, uuid_a) = attached(
        fx.provider
            .add(&AddRequest::new(fx.gpu("gpu-a", "worker-0")))
            .await,
    );
    let mut req = AddRequest::new(fx.gpu("gpu-b", "worker-0"));
    req.attempt_key = "gpu-b-attempt-1".into();
    req.claims = vec![Claim {
        resource: "gpu-a".into(),
        device_id: Some(serial_a.clone()),
        fabric_device_id: Some(uuid_a),
    }];

    let left = add_with_the_reply_lost(&fx, &req, &machine).await;
    assert_eq!(left.len(), 2, "the fabric acted on the lost request");
    let orphan = left
        .iter()
        .find(|d| d.serial != serial_a)
        .map(|d| d.serial.clone())
        .unwrap();

    let (serial_b, _) = attached(fx.provider.add(&req).await);
    match fx.build {
        Build::Current => {
            assert_eq!(serial_b, orphan, "the retry adopts the orphan");
            assert_eq!(fx.sim.machine_devices(&machine).len(), 2);
            assert_eq!(
                fx.sim.requests_to(Route::FmAttach).len(),
                2,
                "no third attach"
            );
            // A later attach of another resource gets a new device, not b's.
            let (serial_c, _) = attached(
                fx.provider
                    .add(&AddRequest::new(fx.gpu("gpu-c", "worker-0")))
                    .await,
            );
            assert!(serial_c != serial_a && serial_c != serial_b);
            assert_eq!(fx.sim.machine_devices(&machine).len(), 3);
        }
        Build::V0_1 => {
            assert_ne!(serial_b, orphan);
            assert_ne!(serial_b, serial_a);
            assert_eq!(fx.sim.machine_devices(&machine).len(), 3);
        }
    }
}

/// The provider notes two things in the host's state store per attach (its attempt and
/// the device it handed out) and keeps them for minutes. With the host's default limits
/// an attach after hundreds of others must still be noted, so its lost reply is adopted
/// as above: with 256 entries and hand-outs kept an hour, the store was full after 128
/// attaches, the note was refused and the retry attached a second device.
#[tokio::test]
async fn a_lost_reply_is_still_adopted_after_hundreds_of_attaches() {
    const EARLIER: usize = 400;
    const NODES: usize = 20;
    let fx = Fixture::builder(Api::Fm).start().await;
    if fx.build == Build::V0_1 {
        // A 0.1.0 host passes no claims: that build notes nothing and never adopts.
        return;
    }
    fx.sim.add_free_devices("gpu", MODEL, EARLIER + 2);
    for n in 0..NODES {
        fx.add_provider_id_node(&format!("worker-{n}"));
    }
    for i in 0..EARLIER {
        let node = format!("worker-{}", i % NODES);
        attached(
            fx.provider
                .add(&AddRequest::new(fx.gpu(&format!("gpu-{i}"), &node)))
                .await,
        );
    }
    let machine = fx.add_provider_id_node("worker-last");
    let req = AddRequest::new(fx.gpu("gpu-last", "worker-last"));
    let left = add_with_the_reply_lost(&fx, &req, &machine).await;
    assert_eq!(left.len(), 1, "the fabric acted on the lost request");

    let (serial, _) = attached(fx.provider.add(&req).await);
    assert_eq!(
        serial, left[0].serial,
        "the retry adopts the device the lost reply left"
    );
    assert_eq!(
        fx.sim.machine_devices(&machine).len(),
        1,
        "no second device"
    );
}

/// The attach answered, but the answer never reached the operator's record (it
/// crashed first): the same attempt asked again gets the same device, and nothing more
/// is attached. A contract 0.1.0 host passes no claims, so that build attaches again.
#[tokio::test]
async fn the_same_attempt_asked_again_after_its_answer_gets_the_same_device() {
    let fx = fm().await;
    let machine = fx.add_provider_id_node("worker-0");
    let mut req = AddRequest::new(fx.gpu("gpu-a", "worker-0"));
    req.attempt_key = "gpu-a-attempt-1".into();
    let (serial, _) = attached(fx.provider.add(&req).await);
    let (again, _) = attached(fx.provider.add(&req).await);
    match fx.build {
        Build::Current => {
            assert_eq!(again, serial);
            assert_eq!(fx.sim.machine_devices(&machine).len(), 1);
            assert_eq!(
                fx.sim.requests_to(Route::FmAttach).len(),
                1,
                "no second attach"
            );
        }
        Build::V0_1 => {
            assert_ne!(again, serial);
            assert_eq!(fx.sim.machine_devices(&machine).len(), 2);
        }
    }
}

#[tokio::test]
async fn check_reports_healthy_warning_critical_and_missing() {
    let fx = fm().await;
    fx.add_provider_id_node("worker-0");
    let mut gpu = fx.gpu("gpu-a", "worker-0");
    let (serial, uuid) = attached(fx.provider.add(&AddRequest::new(gpu.clone())).await);
    gpu.device_id = Some(serial.clone());
    gpu.fabric_device_id = Some(uuid);

    fx.provider.check_resource(&gpu).await.unwrap();
    fx.sim.set_op_status(&serial, "1").unwrap();
    assert!(
        matches!(provider_error(fx.provider.check_resource(&gpu).await), ProviderError::Warning(m) if m.contains(&serial))
    );
    fx.sim.set_op_status(&serial, "2").unwrap();
    assert!(
        matches!(provider_error(fx.provider.check_resource(&gpu).await), ProviderError::Critical(m) if m.contains(&serial))
    );
    fx.sim.set_op_status(&serial, "").unwrap();
    assert!(matches!(
        provider_error(fx.provider.check_resource(&gpu).await),
        ProviderError::MalformedReply(_)
    ));
    fx.sim.set_op_status(&serial, "0").unwrap();
    fx.provider.check_resource(&gpu).await.unwrap();

    fx.sim.detach_directly(&serial).unwrap();
    assert!(
        matches!(provider_error(fx.provider.check_resource(&gpu).await), ProviderError::NotFound(m) if m.contains(&serial))
    );
}

#[tokio::test]
async fn detach_removes_the_device_and_an_already_gone_device_counts_as_detached() {
    let fx = fm().await;
    let machine = fx.add_provider_id_node("worker-0");
    let mut gpu = fx.gpu("gpu-a", "worker-0");
    let (serial, uuid) = attached(fx.provider.add(&AddRequest::new(gpu.clone())).await);
    gpu.device_id = Some(serial.clone());
    gpu.fabric_device_id = Some(uuid.clone());

    assert_eq!(
        fx.provider.remove_resource(&gpu).await.unwrap(),
        RemoveOutcome::Removed
    );
    assert!(fx.sim.machine_devices(&machine).is_empty());
    assert_eq!(fx.sim.free_devices("gpu", MODEL), 3);
    let deletes = fx.sim.requests_to(Route::FmDetach);
    assert_eq!(deletes.len(), 1);
    assert_eq!(
        deletes[0].json().unwrap()["tenants"]["machines"][0]["resources"][0]["res_specs"][0]["res_uuid"],
        json!(uuid)
    );

    // Gone already (here: detached by the call above): no second DELETE.
    assert_eq!(
        fx.provider.remove_resource(&gpu).await.unwrap(),
        RemoveOutcome::Removed
    );
    assert_eq!(fx.sim.requests_to(Route::FmDetach).len(), 1);

    // Detached behind the provider's back.
    let (serial2, uuid2) = attached(
        fx.provider
            .add(&AddRequest::new(fx.gpu("gpu-b", "worker-0")))
            .await,
    );
    fx.sim.detach_directly(&serial2).unwrap();
    let mut gpu2 = fx.gpu("gpu-b", "worker-0");
    gpu2.device_id = Some(serial2);
    gpu2.fabric_device_id = Some(uuid2);
    assert_eq!(
        fx.provider.remove_resource(&gpu2).await.unwrap(),
        RemoveOutcome::Removed
    );
    assert_eq!(fx.sim.requests_to(Route::FmDetach).len(), 1);
}

#[tokio::test]
async fn get_resources_lists_what_the_simulator_holds_across_nodes() {
    let fx = fm().await;
    let m0 = fx.add_provider_id_node("worker-0");
    let m1 = fx.add_provider_id_node("worker-1");
    fx.add_provider_id_node("worker-2");
    fx.add_plain_node("control-plane");
    fx.sim.add_free_devices("cxlmemory", "CMM-D 128G", 1);
    let a = fx.sim.attach_directly(&m0, "gpu", MODEL).unwrap();
    let b = fx
        .sim
        .attach_directly(&m0, "cxlmemory", "CMM-D 128G")
        .unwrap();
    let c = fx.sim.attach_directly(&m1, "gpu", "H100 80G").unwrap();

    let mut got = fx.provider.list(&[]).await.unwrap();
    got.sort_by(|x, y| x.device_id.cmp(&y.device_id));
    let info = |node: &str, machine: &str, t, d: &fabric_sim::SimDevice| DeviceInfo {
        node: node.into(),
        machine_id: machine.into(),
        device_type: t,
        model: d.model.clone(),
        device_id: d.serial.clone(),
        fabric_device_id: d.res_uuid.clone(),
    };
    let mut want = vec![
        info("worker-0", &m0, DeviceType::Gpu, &a),
        info("worker-0", &m0, DeviceType::CxlMemory, &b),
        info("worker-1", &m1, DeviceType::Gpu, &c),
    ];
    want.sort_by(|x, y| x.device_id.cmp(&y.device_id));
    assert_eq!(got, want);
    // Three fabric machines read, with one token.
    assert_eq!(fx.sim.requests_to(Route::FmGetMachine).len(), 3);
    assert_eq!(fx.sim.token_requests().len(), 1);
}

#[tokio::test]
async fn get_resources_skips_a_machine_the_fabric_does_not_know() {
    let fx = fm().await;
    let m0 = fx.add_provider_id_node("worker-0");
    let a = fx.sim.attach_directly(&m0, "gpu", MODEL).unwrap();
    // A node whose providerID names a machine the fabric has never heard of (404).
    fx.add_node_of_unknown_machine("worker-1");

    let warnings = fx.provider.warnings();
    let got = fx.provider.list(&[]).await.unwrap();
    assert_eq!(
        got.iter().map(|d| d.device_id.as_str()).collect::<Vec<_>>(),
        [a.serial.as_str()]
    );
    assert_eq!(fx.sim.requests_to(Route::FmGetMachine).len(), 2);
    // The skip is a warning the operator counts (cro_provider_warnings_total).
    assert_eq!(fx.provider.warnings(), warnings + 1);

    // A server error still fails the listing: it would hide every node's devices.
    fx.sim
        .inject(Fault::error(503, "E0503", "maintenance").on(Route::FmGetMachine));
    let e = fabric_error(fx.provider.list(&[]).await);
    assert_eq!((e.status, e.code.as_str()), (503, "E0503"));
}

#[tokio::test]
async fn each_injected_fault_gives_a_typed_error() {
    let fx = Fixture::builder(Api::Fm)
        .with_config("timeout_ms", "1000")
        .start()
        .await;
    fx.sim.add_free_devices("gpu", MODEL, 10);
    fx.add_provider_id_node("worker-0");
    // Each attach is a new resource's (a new attempt): a retry of a faulted attempt
    // would get back a device that attempt left on the machine (as after a lost reply)
    // and not reach the next fault.
    let attaches = std::cell::Cell::new(0);
    let fxr = &fx;
    let add = || {
        attaches.set(attaches.get() + 1);
        let gpu = fxr.gpu(&format!("gpu-{}", attaches.get()), "worker-0");
        async move { fxr.provider.add(&AddRequest::new(gpu.clone())).await }
    };

    fx.sim
        .inject(Fault::error(409, "E0001", "machine busy").on(Route::FmAttach));
    let e = fabric_error(add().await);
    assert_eq!(
        (e.status, e.code.as_str(), e.message.as_str()),
        (409, "E0001", "machine busy")
    );

    fx.sim.inject(
        Fault::error_value(500, "E0500", json!({"reason": "db", "retry": true}))
            .on(Route::FmAttach),
    );
    let e = fabric_error(add().await);
    assert_eq!((e.status, e.code.as_str()), (500, "E0500"));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&e.message).unwrap(),
        json!({"reason": "db", "retry": true})
    );

    // No free device is the typed no-capacity error, in the simulator's shape and in
    // the `{"error": "<code>"}` shape FTI deployments use.
    fx.sim.inject(Fault::NoFreeDevice.on(Route::FmAttach));
    assert!(
        matches!(provider_error(add().await), ProviderError::NoCapacity(m)
            if m.contains("no free resource") && m.contains(codes::NO_FREE_DEVICE))
    );
    fx.sim.inject(
        Fault::Reply {
            status: 409,
            body: r#"{"error": "insufficient_resources"}"#.into(),
        }
        .on(Route::FmAttach),
    );
    assert!(matches!(
        provider_error(add().await),
        ProviderError::NoCapacity(_)
    ));
    fx.sim.inject(
        Fault::Reply {
            status: 400,
            body: r#"{"error": "invalid_machine_state"}"#.into(),
        }
        .on(Route::FmAttach),
    );
    let e = fabric_error(add().await);
    assert_eq!((e.status, e.code.as_str()), (400, "invalid_machine_state"));

    fx.sim.inject(Fault::MalformedJson.on(Route::FmAttach));
    assert!(matches!(
        provider_error(add().await),
        ProviderError::MalformedReply(_)
    ));
    // The fabric attached before its reply broke: the retry of that attach (0.2.0)
    // adopts the unclaimed device instead of sending another PATCH; a 0.1.0 one
    // attaches anew.
    let patches = fx.sim.requests_to(Route::FmAttach).len();
    let retried = fx.gpu(&format!("gpu-{}", attaches.get()), "worker-0");
    attached(fx.provider.add(&AddRequest::new(retried.clone())).await);
    let sent = fx.sim.requests_to(Route::FmAttach).len() - patches;
    match fx.build {
        Build::Current => assert_eq!(sent, 0, "the device the malformed reply left is adopted"),
        Build::V0_1 => assert_eq!(sent, 1),
    }

    for op in ["", "x", "3"] {
        fx.sim
            .inject(Fault::AttachOpStatus(op.into()).on(Route::FmAttach));
        assert!(
            matches!(provider_error(add().await), ProviderError::MalformedReply(m) if m.contains("res_op_status")),
            "op {op:?}"
        );
    }
    fx.sim
        .inject(Fault::AttachOpStatus("2".into()).on(Route::FmAttach));
    assert!(matches!(
        provider_error(add().await),
        ProviderError::Critical(_)
    ));
    // Warning still attaches.
    fx.sim
        .inject(Fault::AttachOpStatus("1".into()).on(Route::FmAttach));
    let (serial, _) = attached(add().await);
    assert_eq!(sim_device(&fx, &serial).op_status, "1");

    fx.sim.inject(
        Fault::Reply {
            status: 200,
            body: r#"{"data": {"machines": []}}"#.into(),
        }
        .on(Route::FmAttach),
    );
    assert!(matches!(
        provider_error(add().await),
        ProviderError::MalformedReply(_)
    ));

    fx.sim.inject(Fault::Drop.on(Route::FmAttach));
    assert!(matches!(
        provider_error(add().await),
        ProviderError::Unavailable(_)
    ));

    fx.sim
        .inject(Fault::Latency(Duration::from_secs(3)).on(Route::FmAttach));
    assert!(
        matches!(provider_error(add().await), ProviderError::Unavailable(m) if m.contains("timed out"))
    );

    let mut held = fx.gpu("gpu-h", "worker-0");
    held.device_id = Some(serial);
    fx.sim
        .inject(Fault::error(423, "E0423", "locked").on(Route::FmDetach));
    let e = fabric_error(fx.provider.remove_resource(&held).await);
    assert_eq!(
        (e.status, e.code.as_str(), e.message.as_str()),
        (423, "E0423", "locked")
    );
    fx.sim
        .inject(Fault::error(503, "E0503", "maintenance").on(Route::FmGetMachine));
    let e = fabric_error(fx.provider.check_resource(&held).await);
    assert_eq!(
        (e.status, e.code.as_str(), e.message.as_str()),
        (503, "E0503", "maintenance")
    );

    // Faults used up: the provider works again (the device attached with a warning).
    assert_eq!(fx.sim.active_faults(), 0);
    assert!(matches!(
        provider_error(fx.provider.check_resource(&held).await),
        ProviderError::Warning(_)
    ));
    fx.sim
        .set_op_status(held.device_id.as_deref().unwrap(), "0")
        .unwrap();
    fx.provider.check_resource(&held).await.unwrap();
}

#[tokio::test]
async fn a_node_off_the_fabric_is_not_found() {
    let fx = fm().await;
    fx.add_plain_node("control-plane");
    assert!(matches!(
        provider_error(fx.provider.add(&AddRequest::new(fx.gpu("gpu-a", "control-plane"))).await),
        ProviderError::NotFound(m) if m.contains("providerID")
    ));
    assert!(matches!(
        provider_error(
            fx.provider
                .add(&AddRequest::new(fx.gpu("gpu-a", "no-such-node")))
                .await
        ),
        ProviderError::NotFound(_)
    ));
    assert!(fx.sim.requests().is_empty());
}

fn pool_query(nodes: &[&str]) -> PoolQuery {
    PoolQuery {
        kinds: [MODEL, "H100 80G"]
            .into_iter()
            .map(|model| PoolKind {
                device_type: DeviceType::Gpu,
                model: model.into(),
            })
            .collect(),
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
    }
}

/// `(pool id, nodes, free count of MODEL, free count of the other model)`, by pool id.
fn pools(
    outcome: Result<PoolOutcome, cro_runtime::CallError>,
) -> Vec<(String, Vec<String>, u32, u32)> {
    let Ok(PoolOutcome::Pools(pools)) = outcome else {
        panic!("{outcome:?}");
    };
    let mut out: Vec<_> = pools
        .into_iter()
        .map(|p| {
            let count = |model: &str| {
                p.free
                    .iter()
                    .find(|f| f.kind.model == model)
                    .map(|f| f.count)
                    .expect("every asked kind is counted")
            };
            (
                p.id.clone(),
                p.nodes.clone(),
                count(MODEL),
                count("H100 80G"),
            )
        })
        .collect();
    out.sort();
    out
}

/// A machine takes devices only from its own fabric, so the pool is one per fabric,
/// reaching the nodes on it; it follows attaches and devices taken behind the
/// provider's back; and it costs one machine list plus one count per fabric and model.
/// The 0.1.0 build has no pool and says so without calling the fabric.
#[tokio::test]
async fn the_pool_is_one_per_fabric_and_follows_the_fabric() {
    let fx = fm().await;
    fx.add_provider_id_node("worker-0");
    let m1 = fx.add_provider_id_node("worker-1");
    fx.add_provider_id_node("worker-2");
    fx.sim.set_machine_fabric(&m1, 2).unwrap();
    fx.sim.add_free_devices_on(2, "gpu", MODEL, 1);
    let query = pool_query(&["worker-0", "worker-1", "worker-2", "not-a-node"]);
    fx.sim.clear_requests();

    let first = fx.provider.pool(&query).await;
    if fx.build == Build::V0_1 {
        assert!(
            matches!(&first, Ok(PoolOutcome::NotSupported(why)) if why.contains("0.1.0")),
            "{first:?}"
        );
        assert!(fx.sim.requests().is_empty());
        return;
    }
    let w = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        pools(first),
        [
            ("1".to_string(), w(&["worker-0", "worker-2"]), 3, 0),
            ("2".to_string(), w(&["worker-1"]), 1, 0),
        ]
    );
    assert_eq!(fx.sim.requests_to(Route::FmListMachines).len(), 1);
    let counted = fx.sim.requests_to(Route::FmAvailable);
    assert_eq!(counted.len(), 4, "one count per fabric and model");
    assert_eq!(counted[0].query_param("res_type").as_deref(), Some("gpu"));

    // worker-1's attach takes fabric 2's device; another tenant takes one of fabric 1's.
    attached(
        fx.provider
            .add(&AddRequest::new(fx.gpu("gpu-a", "worker-1")))
            .await,
    );
    assert_eq!(fx.sim.free_devices_on(2, "gpu", MODEL), 0);
    assert_eq!(fx.sim.take_free_devices(1, "gpu", MODEL, 1), 1);
    assert_eq!(
        pools(fx.provider.pool(&query).await),
        [
            ("1".to_string(), w(&["worker-0", "worker-2"]), 2, 0),
            ("2".to_string(), w(&["worker-1"]), 0, 0),
        ]
    );

    // Only the asked nodes are placed; a failed count fails the read, typed.
    assert_eq!(
        pools(fx.provider.pool(&pool_query(&["worker-1"])).await),
        [("2".to_string(), w(&["worker-1"]), 0, 0)]
    );
    fx.sim
        .inject(Fault::error(503, "E50300", "busy").on(Route::FmAvailable));
    let err = fabric_error(fx.provider.pool(&query).await);
    assert_eq!(err.status, 503);
}

//! The Redfish provider component (`providers/redfish`) in the cro runtime against the
//! Redfish simulator over real HTTP (docs/redfish-provider.md).

use std::time::Duration;

use cro_runtime::{
    AddOutcome, AttachedDevice, CallError, Claim, ComposableResource, DeviceInfo, DeviceType,
    ProviderError, RemoveOutcome,
};
use provider_it::redfish::{CXL_MODEL, GPU_MODEL, RedfishFixture};
use redfish_sim::{CompositionState, Fault, Route};
use serde_json::json;

use crate::{eventually, fabric_error, provider_error};

fn attached_device(outcome: Result<AddOutcome, CallError>) -> AttachedDevice {
    match outcome {
        Ok(AddOutcome::Attached(d)) => d,
        other => panic!("expected an attached device, got {other:?}"),
    }
}

/// The resource as the operator records it once attached.
fn recorded(mut r: ComposableResource, d: &AttachedDevice) -> ComposableResource {
    r.device_id = Some(d.device_id.clone());
    r.fabric_device_id = Some(d.fabric_device_id.clone());
    r.machine_id = d.machine_id.clone();
    r
}

fn claim(name: &str, d: &AttachedDevice) -> Claim {
    Claim {
        resource: name.into(),
        device_id: Some(d.device_id.clone()),
        fabric_device_id: Some(d.fabric_device_id.clone()),
    }
}

/// Blocks of the system other than its compute block.
fn device_blocks(fx: &RedfishFixture, system: &str) -> Vec<String> {
    let s = fx.sim.system(system).expect("system");
    s.blocks
        .into_iter()
        .filter(|b| !b.starts_with("Compute-"))
        .collect()
}

#[tokio::test]
async fn redfish_attach_check_list_and_detach() {
    let fx = RedfishFixture::start().await;
    let sys0 = fx.add_node("worker-0");
    let sys1 = fx.add_node("worker-1");
    fx.add_plain_node("control-plane");
    let gpus: Vec<_> = (0..3).map(|_| fx.sim.add_gpu_block(GPU_MODEL)).collect();
    // A GPU of another model is never taken for this one.
    fx.sim.add_gpu_block("NVIDIA H100 80GB");
    let cxl = fx.sim.add_cxl_block(CXL_MODEL);

    // describe() and the grants agree.
    let info = fx.provider.info().expect("contract 0.2.0 describes itself");
    assert_eq!(
        (info.name.as_str(), info.vendor.as_str()),
        ("redfish", "DMTF Redfish")
    );
    let report = fx.provider.capability_report();
    assert!(report.is_clean(), "{report}");

    let gpu = fx.gpu("gpu-a", "worker-0");
    let a = attached_device(fx.provider.add(&fx.request(&gpu, "key-a", &[])).await);
    let block = fx.sim.block(&a.fabric_device_id).expect("the block exists");
    assert!(gpus.iter().any(|g| g.id == block.id));
    assert_eq!(a.device_id, block.serial);
    assert!(a.device_id.starts_with("GPU-"));
    assert_eq!(a.machine_id.as_deref(), Some(sys0.as_str()));
    assert_eq!(block.state, CompositionState::Composed);
    assert_eq!(block.system.as_deref(), Some(sys0.as_str()));
    let patch = &fx.sim.requests_to(Route::SystemPatch)[0];
    assert!(
        patch.header("If-Match").is_some(),
        "the PATCH names the ETag"
    );
    assert!(patch.header("X-Auth-Token").is_some());

    // CXL memory with a size that fits the block (256 GiB).
    let mem = fx.resource("mem-a", DeviceType::CxlMemory, "worker-1");
    let mut req = fx.request(&mem, "key-m", &[claim("gpu-a", &a)]);
    req.size_bytes = Some(64 << 30);
    let m = attached_device(fx.provider.add(&req).await);
    assert_eq!(m.fabric_device_id, cxl.id);
    assert_eq!(m.device_id, cxl.serial);

    // Health.
    let gpu = recorded(gpu, &a);
    fx.provider.check_resource(&gpu).await.unwrap();
    fx.sim.set_health(&a.fabric_device_id, "Warning").unwrap();
    assert!(
        matches!(provider_error(fx.provider.check_resource(&gpu).await), ProviderError::Warning(m) if m.contains(&a.fabric_device_id))
    );
    fx.sim.set_health(&a.fabric_device_id, "Critical").unwrap();
    assert!(matches!(
        provider_error(fx.provider.check_resource(&gpu).await),
        ProviderError::Critical(_)
    ));
    fx.sim.set_health(&a.fabric_device_id, "OK").unwrap();
    // Located by device id alone too.
    let mut by_serial = gpu.clone();
    by_serial.fabric_device_id = None;
    fx.provider.check_resource(&by_serial).await.unwrap();

    // The listing: both devices, with nodes, systems, models and ids.
    let mut listed = fx.provider.list(&[claim("gpu-a", &a)]).await.unwrap();
    listed.sort_by(|x, y| x.node.cmp(&y.node));
    assert_eq!(
        listed,
        [
            DeviceInfo {
                node: "worker-0".into(),
                machine_id: sys0.clone(),
                device_type: DeviceType::Gpu,
                model: GPU_MODEL.into(),
                device_id: a.device_id.clone(),
                fabric_device_id: a.fabric_device_id.clone(),
            },
            DeviceInfo {
                node: "worker-1".into(),
                machine_id: sys1.clone(),
                device_type: DeviceType::CxlMemory,
                model: CXL_MODEL.into(),
                device_id: m.device_id.clone(),
                fabric_device_id: m.fabric_device_id.clone(),
            },
        ]
    );

    // Detach, then detach again: the second finds the block unused and sends nothing.
    assert_eq!(
        fx.provider.remove_resource(&gpu).await.unwrap(),
        RemoveOutcome::Removed
    );
    let block = fx.sim.block(&a.fabric_device_id).unwrap();
    assert_eq!(block.state, CompositionState::Unused);
    assert!(device_blocks(&fx, &sys0).is_empty());
    let patches = fx.sim.requests_to(Route::SystemPatch).len();
    assert_eq!(
        fx.provider.remove_resource(&gpu).await.unwrap(),
        RemoveOutcome::Removed
    );
    assert_eq!(fx.sim.requests_to(Route::SystemPatch).len(), patches);
    assert!(matches!(
        provider_error(fx.provider.check_resource(&gpu).await),
        ProviderError::NotFound(_)
    ));
    // The recorded machine id is enough: no Node needed.
    let mut orphan = recorded(mem, &m);
    orphan.target_node = "gone-node".into();
    assert_eq!(
        fx.provider.remove_resource(&orphan).await.unwrap(),
        RemoveOutcome::Removed
    );
    assert!(device_blocks(&fx, &sys1).is_empty());
    // One session served every call.
    assert_eq!(fx.sim.requests_to(Route::CreateSession).len(), 1);
}

#[tokio::test]
async fn redfish_claims_are_honoured_and_no_free_block_is_no_capacity() {
    let fx = RedfishFixture::start().await;
    fx.add_node("worker-0");
    let b1 = fx.sim.add_gpu_block(GPU_MODEL);
    let b2 = fx.sim.add_gpu_block(GPU_MODEL);
    // Another resource holds b1 (by block id), though the service shows it unused.
    let held = Claim {
        resource: "gpu-other".into(),
        device_id: None,
        fabric_device_id: Some(b1.id.clone()),
    };
    let gpu = fx.gpu("gpu-a", "worker-0");
    let a = attached_device(
        fx.provider
            .add(&fx.request(&gpu, "key-a", std::slice::from_ref(&held)))
            .await,
    );
    assert_eq!(a.fabric_device_id, b2.id);

    // A second resource: b1 held (by serial now), b2 attached to gpu-a: nothing left.
    let held_by_serial = Claim {
        resource: "gpu-other".into(),
        device_id: Some(b1.serial.clone()),
        fabric_device_id: None,
    };
    let e = provider_error(
        fx.provider
            .add(&fx.request(
                &fx.gpu("gpu-b", "worker-0"),
                "key-b",
                &[held_by_serial, claim("gpu-a", &a)],
            ))
            .await,
    );
    assert!(
        matches!(e, ProviderError::NoCapacity(ref m) if m.contains(GPU_MODEL)),
        "{e:?}"
    );
    // A memory size no block has is no capacity either.
    fx.sim.add_cxl_block(CXL_MODEL);
    let mut req = fx.request(
        &fx.resource("mem", DeviceType::CxlMemory, "worker-0"),
        "key-m",
        &[],
    );
    req.size_bytes = Some(512 << 30);
    assert!(matches!(
        provider_error(fx.provider.add(&req).await),
        ProviderError::NoCapacity(_)
    ));
}

#[tokio::test]
async fn redfish_slow_composition_is_in_progress_until_the_task_ends() {
    let fx = RedfishFixture::start().await;
    let sys = fx.add_node("worker-0");
    fx.sim.add_gpu_block(GPU_MODEL);
    fx.sim.add_gpu_block(GPU_MODEL);
    fx.sim.set_compose_delay(Duration::from_millis(400));
    let gpu = fx.gpu("gpu-a", "worker-0");
    let req = fx.request(&gpu, "key-a", &[]);

    let first = fx.provider.add(&req).await;
    assert!(
        matches!(first, Ok(AddOutcome::InProgress(ref m)) if m.contains("task")),
        "{first:?}"
    );
    let a = eventually(
        Duration::from_secs(10),
        "the composition to finish",
        || async {
            match fx.provider.add(&req).await {
                Ok(AddOutcome::Attached(d)) => Some(d),
                Ok(AddOutcome::InProgress(_)) => None,
                Err(e) => panic!("attach failed: {e}"),
            }
        },
    )
    .await;
    assert_eq!(
        fx.sim.requests_to(Route::SystemPatch).len(),
        1,
        "one composition only"
    );
    assert_eq!(
        device_blocks(&fx, &sys),
        std::slice::from_ref(&a.fabric_device_id)
    );

    // Detach is in progress too, then removed; the task is watched, not re-sent.
    let gpu = recorded(gpu, &a);
    let first = fx.provider.remove_resource(&gpu).await;
    assert!(
        matches!(first, Ok(RemoveOutcome::InProgress(_))),
        "{first:?}"
    );
    eventually(
        Duration::from_secs(10),
        "the decomposition to finish",
        || async {
            match fx.provider.remove_resource(&gpu).await {
                Ok(RemoveOutcome::Removed) => Some(()),
                Ok(RemoveOutcome::InProgress(_)) => None,
                Err(e) => panic!("detach failed: {e}"),
            }
        },
    )
    .await;
    assert_eq!(fx.sim.requests_to(Route::SystemPatch).len(), 2);
    assert_eq!(
        fx.sim.block(&a.fabric_device_id).unwrap().state,
        CompositionState::Unused
    );

    // A resource deleted while its attach is composing (no ids recorded yet): the detach
    // waits for the composition, then takes the block back; nothing is left composed
    // for nobody, and the block is free for the next attach.
    let early = fx.gpu("gpu-early", "worker-0");
    let req_early = fx.request(&early, "key-early", &[]);
    assert!(matches!(
        fx.provider.add(&req_early).await,
        Ok(AddOutcome::InProgress(_))
    ));
    let first = fx.provider.remove_resource(&early).await;
    assert!(
        matches!(first, Ok(RemoveOutcome::InProgress(ref m)) if m.contains("composed")),
        "{first:?}"
    );
    eventually(Duration::from_secs(10), "the early detach", || async {
        match fx.provider.remove_resource(&early).await {
            Ok(RemoveOutcome::Removed) => Some(()),
            Ok(RemoveOutcome::InProgress(_)) => None,
            Err(e) => panic!("detach failed: {e}"),
        }
    })
    .await;
    eventually(Duration::from_secs(10), "the block to be free", || async {
        device_blocks(&fx, &sys).is_empty().then_some(())
    })
    .await;

    // A composition whose task fails: in progress, then the task's error; the next
    // attempt composes again and succeeds.
    fx.sim
        .inject(Fault::ComposeFails("the PCIe switch refused".into()).on(Route::SystemPatch));
    let req = fx.request(&fx.gpu("gpu-b", "worker-0"), "key-b", &[]);
    assert!(matches!(
        fx.provider.add(&req).await,
        Ok(AddOutcome::InProgress(_))
    ));
    let e = eventually(Duration::from_secs(10), "the failed task", || async {
        match fx.provider.add(&req).await {
            Ok(AddOutcome::InProgress(_)) => None,
            Err(CallError::Provider(ProviderError::Fabric(f))) => Some(f),
            other => panic!("expected the task's failure, got {other:?}"),
        }
    })
    .await;
    assert!(e.message.contains("the PCIe switch refused"), "{e:?}");
    assert!(device_blocks(&fx, &sys).is_empty());
    let b = eventually(
        Duration::from_secs(10),
        "the second composition",
        || async {
            match fx.provider.add(&req).await {
                Ok(AddOutcome::Attached(d)) => Some(d),
                Ok(AddOutcome::InProgress(_)) => None,
                Err(e) => panic!("attach failed: {e}"),
            }
        },
    )
    .await;
    assert_eq!(device_blocks(&fx, &sys), [b.fabric_device_id]);
}

#[tokio::test]
async fn redfish_a_retry_after_a_lost_reply_composes_no_second_block() {
    let fx = RedfishFixture::start().await;
    let sys = fx.add_node("worker-0");
    for _ in 0..3 {
        fx.sim.add_gpu_block(GPU_MODEL);
    }
    let gpu = fx.gpu("gpu-a", "worker-0");
    let req = fx.request(&gpu, "key-a", &[]);

    // The service composes, then the connection drops before the reply.
    fx.sim
        .inject(Fault::DropAfterProcessing.on(Route::SystemPatch));
    let e = provider_error(fx.provider.add(&req).await);
    assert!(matches!(e, ProviderError::Unavailable(_)), "{e:?}");
    let composed = device_blocks(&fx, &sys);
    assert_eq!(composed.len(), 1);

    // The retry finds the block its attempt recorded.
    let a = attached_device(fx.provider.add(&req).await);
    assert_eq!(vec![a.fabric_device_id.clone()], composed);
    assert_eq!(fx.sim.requests_to(Route::SystemPatch).len(), 1);

    // With the record lost too (a provider with empty state, as after a restart), the
    // unclaimed block in the system is the attempt's: still no second composition.
    let restarted = fx.reload().await;
    let again = attached_device(restarted.add(&req).await);
    assert_eq!(again.fabric_device_id, a.fabric_device_id);
    assert_eq!(fx.sim.requests_to(Route::SystemPatch).len(), 1);
    // Once another resource holds it, a new attach composes another block.
    let b = attached_device(
        restarted
            .add(&fx.request(&fx.gpu("gpu-b", "worker-0"), "key-b", &[claim("gpu-a", &a)]))
            .await,
    );
    assert_ne!(b.fabric_device_id, a.fabric_device_id);
    assert_eq!(device_blocks(&fx, &sys).len(), 2);
}

#[tokio::test]
async fn redfish_session_expiry_logs_in_again() {
    let fx = RedfishFixture::start().await;
    fx.add_node("worker-0");
    fx.sim.add_gpu_block(GPU_MODEL);
    let gpu = fx.gpu("gpu-a", "worker-0");
    let a = attached_device(fx.provider.add(&fx.request(&gpu, "key-a", &[])).await);
    let gpu = recorded(gpu, &a);
    assert_eq!(fx.sim.requests_to(Route::CreateSession).len(), 1);

    // The service ends every session (a restart of its manager).
    fx.sim.expire_sessions();
    fx.provider.check_resource(&gpu).await.unwrap();
    assert_eq!(fx.sim.requests_to(Route::CreateSession).len(), 2);
    // A request answered "session expired".
    fx.sim.inject(Fault::ExpireSession.on(Route::ResourceBlock));
    fx.provider.check_resource(&gpu).await.unwrap();
    assert_eq!(fx.sim.requests_to(Route::CreateSession).len(), 3);
    // Expired twice in a row: the second 401 is the error (no log-in loop).
    fx.sim
        .inject(Fault::ExpireSession.on(Route::ResourceBlock).times(2));
    let e = fabric_error(fx.provider.check_resource(&gpu).await);
    assert_eq!(
        (e.status, e.code.as_str()),
        (401, "Base.1.16.0.NoValidSession")
    );
    assert_eq!(fx.sim.requests_to(Route::CreateSession).len(), 4);
    // Wrong credentials: the log-in's own error.
    fx.cluster.insert_secret(
        provider_it::SECRET_NAMESPACE,
        provider_it::SECRET_NAME,
        [("username", "admin"), ("password", "wrong")],
    );
    fx.sim.expire_sessions();
    let e = fabric_error(fx.provider.check_resource(&gpu).await);
    assert_eq!(e.status, 401);
}

#[tokio::test]
async fn redfish_an_etag_conflict_is_retried_once() {
    let fx = RedfishFixture::start().await;
    let sys = fx.add_node("worker-0");
    fx.sim.add_gpu_block(GPU_MODEL);
    fx.sim.add_gpu_block(GPU_MODEL);
    fx.sim.inject(
        Fault::error(
            412,
            "PreconditionFailed",
            "The ETag supplied did not match.",
        )
        .on(Route::SystemPatch),
    );
    let a = attached_device(
        fx.provider
            .add(&fx.request(&fx.gpu("gpu-a", "worker-0"), "key-a", &[]))
            .await,
    );
    let patches = fx.sim.requests_to(Route::SystemPatch);
    assert_eq!(patches.len(), 2);
    assert_eq!(
        device_blocks(&fx, &sys),
        std::slice::from_ref(&a.fabric_device_id)
    );
    // Every PATCH names the ETag of the system as just read.
    let etag = patches[1].header("If-Match").expect("If-Match").to_string();
    assert!(etag.starts_with("W/\""), "{etag}");

    // Two conflicts in a row: the fabric's 412.
    fx.sim.inject(
        Fault::error(
            412,
            "PreconditionFailed",
            "The ETag supplied did not match.",
        )
        .on(Route::SystemPatch)
        .times(2),
    );
    let e = fabric_error(
        fx.provider
            .add(&fx.request(&fx.gpu("gpu-b", "worker-0"), "key-b", &[claim("gpu-a", &a)]))
            .await,
    );
    assert_eq!(
        (e.status, e.code.as_str()),
        (412, "Base.1.16.0.PreconditionFailed")
    );
    assert_eq!(device_blocks(&fx, &sys).len(), 1);
}

#[tokio::test]
async fn redfish_each_injected_fault_gives_a_typed_error() {
    let fx = RedfishFixture::builder()
        .with_config("timeout_ms", "500")
        .start()
        .await;
    let sys = fx.add_node("worker-0");
    fx.add_node("worker-1");
    for _ in 0..4 {
        fx.sim.add_gpu_block(GPU_MODEL);
    }
    let gpu = fx.gpu("gpu-a", "worker-0");
    let req = fx.request(&gpu, "key-a", &[]);
    let add = || fx.provider.add(&req);

    // A Redfish error body: its MessageId is the code.
    fx.sim.inject(
        Fault::error(409, "ResourceInUse", "The change is refused.").on(Route::SystemPatch),
    );
    let e = fabric_error(add().await);
    assert_eq!(
        (e.status, e.code.as_str(), e.message.as_str()),
        (409, "Base.1.16.0.ResourceInUse", "The change is refused.")
    );
    // Any other body: no code, the body verbatim.
    fx.sim.inject(
        Fault::Reply {
            status: 503,
            body: "maintenance window".into(),
        }
        .on(Route::ResourceBlocks),
    );
    let e = fabric_error(add().await);
    assert_eq!(
        (e.status, e.code.as_str(), e.message.as_str()),
        (503, "", "maintenance window")
    );
    // A body cut short.
    fx.sim.inject(Fault::MalformedJson.on(Route::System));
    assert!(matches!(
        provider_error(add().await),
        ProviderError::MalformedReply(_)
    ));
    // A 2xx that is not the resource.
    fx.sim.inject(
        Fault::Reply {
            status: 200,
            body: "[]".into(),
        }
        .on(Route::ResourceBlock),
    );
    assert!(matches!(
        provider_error(add().await),
        ProviderError::MalformedReply(_)
    ));
    // No reply at all, before anything changed: unavailable, and nothing composed.
    fx.sim.inject(Fault::Drop.on(Route::SystemPatch));
    assert!(matches!(
        provider_error(add().await),
        ProviderError::Unavailable(_)
    ));
    assert!(device_blocks(&fx, &sys).is_empty());
    // Slower than timeout_ms: unavailable.
    fx.sim
        .inject(Fault::Latency(Duration::from_millis(2000)).on(Route::System));
    assert!(matches!(
        provider_error(add().await),
        ProviderError::Unavailable(_)
    ));
    // The composition itself fails (no task): the service's 500.
    fx.sim
        .inject(Fault::ComposeFails("no lanes".into()).on(Route::SystemPatch));
    let e = fabric_error(add().await);
    assert_eq!(
        (e.status, e.code.as_str()),
        (500, "Base.1.16.0.GeneralError")
    );
    assert!(device_blocks(&fx, &sys).is_empty());
    // The log-in fails.
    fx.sim.expire_sessions();
    fx.sim.inject(
        Fault::error(503, "ServiceTemporarilyUnavailable", "busy").on(Route::CreateSession),
    );
    let e = fabric_error(add().await);
    assert_eq!(e.status, 503);
    // After all that, the same attempt attaches exactly one block.
    assert_eq!(fx.sim.active_faults(), 0);
    let a = attached_device(add().await);
    assert_eq!(
        device_blocks(&fx, &sys),
        std::slice::from_ref(&a.fabric_device_id)
    );

    // Another resource on another node gets another block.
    let r1 = fx.request(&fx.gpu("gpu-c", "worker-1"), "key-c", &[claim("gpu-a", &a)]);
    let c = attached_device(fx.provider.add(&r1).await);
    assert_ne!(c.fabric_device_id, a.fabric_device_id);

    // A Node that names no system is a configuration error naming it.
    fx.add_plain_node("kind-0");
    let e = provider_error(
        fx.provider
            .add(&fx.request(&fx.gpu("gpu-k", "kind-0"), "key-k", &[]))
            .await,
    );
    assert!(
        matches!(e, ProviderError::Config(ref m) if m.contains("kind-0")),
        "{e:?}"
    );
}

#[tokio::test]
async fn redfish_a_denied_grant_is_denied() {
    // The HTTP grant names another port: every request is refused by the host.
    let fx = RedfishFixture::builder()
        .with_http_grants(json!([{"url": "http://127.0.0.1:9"}]))
        .start()
        .await;
    fx.add_node("worker-0");
    fx.sim.add_gpu_block(GPU_MODEL);
    let req = fx.request(&fx.gpu("gpu-a", "worker-0"), "key-a", &[]);
    assert!(matches!(
        provider_error(fx.provider.add(&req).await),
        ProviderError::Denied(_)
    ));
    assert!(fx.sim.requests().is_empty());

    // The password is not a granted Secret key.
    let fx = RedfishFixture::builder()
        .with_secret_keys(vec!["username"])
        .start()
        .await;
    fx.add_node("worker-0");
    assert!(matches!(
        provider_error(fx.provider.add(&fx.request(&fx.gpu("gpu-a", "worker-0"), "key-a", &[])).await),
        ProviderError::Denied(m) if m.contains("password")
    ));
}

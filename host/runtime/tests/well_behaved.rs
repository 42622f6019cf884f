//! The well-behaved fake fabric end to end: load, the four operations, state between calls.

mod common;

use common::*;
use cro_runtime::AddRequest;
use cro_runtime::{AddOutcome, AttachedDevice, CallError, ProviderError, RemoveOutcome};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_fabric_round_trip() {
    let provider = load(&spec("fake", &[])).await;
    assert_eq!(provider.name(), "testkit");
    assert_eq!(provider.list(&[]).await.unwrap(), vec![]);

    let a = gpu("gpu-a");
    let attached = provider.add(&AddRequest::new(a.clone())).await.unwrap();
    let AddOutcome::Attached(AttachedDevice {
        device_id,
        fabric_device_id,
        // Contract 0.1.0 (the testkit) has no machine id.
        machine_id: None,
    }) = attached.clone()
    else {
        panic!("{attached:?}")
    };
    assert_eq!(device_id, "GPU-1");
    assert_eq!(fabric_device_id, "fab-1");
    // Idempotent: the same resource gets the same device (state survived the instance).
    assert_eq!(
        provider.add(&AddRequest::new(a.clone())).await.unwrap(),
        attached
    );
    provider.add(&AddRequest::new(gpu("gpu-b"))).await.unwrap();

    let devices = provider.list(&[]).await.unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[0].node, "worker-0");
    assert_eq!(devices[0].machine_id, "machine-worker-0");
    assert_eq!(devices[1].device_id, "GPU-2");

    provider.check_resource(&a).await.unwrap();
    assert_eq!(
        provider.remove_resource(&a).await.unwrap(),
        RemoveOutcome::Removed
    );
    assert!(matches!(
        provider.check_resource(&a).await,
        Err(CallError::Provider(ProviderError::NotFound(_)))
    ));
    assert_eq!(provider.list(&[]).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_progress_and_health_are_reported() {
    let provider = load(&spec(
        "fake",
        &[("in_progress", "once"), ("health", "critical")],
    ))
    .await;
    let r = gpu("gpu-x");
    assert_eq!(
        provider.add(&AddRequest::new(r.clone())).await.unwrap(),
        AddOutcome::InProgress("attaching".into())
    );
    assert!(matches!(
        provider.add(&AddRequest::new(r.clone())).await.unwrap(),
        AddOutcome::Attached(_)
    ));
    assert_eq!(
        provider.check_resource(&r).await,
        Err(CallError::Provider(ProviderError::Critical(
            "fake critical".into()
        )))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_do_not_share_state() {
    let one = load(&spec("fake", &[])).await;
    let two = load(&spec("fake", &[])).await;
    one.add(&AddRequest::new(gpu("gpu-a"))).await.unwrap();
    assert_eq!(one.list(&[]).await.unwrap().len(), 1);
    assert_eq!(two.list(&[]).await.unwrap().len(), 0);
    // Clones of a handle are the same provider.
    assert_eq!(one.clone().list(&[]).await.unwrap().len(), 1);
}

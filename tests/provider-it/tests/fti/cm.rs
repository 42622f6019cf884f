//! Cluster Manager API: asynchronous resizes.

use std::time::Duration;

use cro_runtime::{AddRequest, DeviceType, ProviderError, RemoveOutcome};
use fabric_sim::{DeviceStatus, Fault, Route, codes};
use provider_it::{Api, Fixture, MODEL};
use serde_json::json;

use crate::*;

/// CM changes finish only when the test says so.
async fn cm() -> Fixture {
    let fx = Fixture::builder(Api::Cm)
        .with_sim_config(|c| c.with_cm_delay(Duration::from_secs(3600)))
        .start()
        .await;
    fx.sim.add_free_devices("gpu", MODEL, 4);
    fx
}

fn resizes(fx: &Fixture) -> Vec<serde_json::Value> {
    fx.sim
        .requests_to(Route::CmResize)
        .iter()
        .map(|r| r.json().unwrap())
        .collect()
}

#[tokio::test]
async fn attach_is_in_progress_until_the_simulator_finishes() {
    let fx = cm().await;
    let machine = fx.add_openshift_node("worker-0");
    let gpu = fx.gpu("gpu-a", "worker-0");

    assert!(is_in_progress(
        &fx.provider.add(&AddRequest::new(gpu.clone())).await
    ));
    assert_eq!(
        resizes(&fx),
        vec![
            json!({"increase_resource_count": {"spec_uuid": fx.sim.spec_uuid("gpu", MODEL), "device_count": 1}})
        ]
    );
    let pending = fx.sim.machine_devices(&machine);
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].status, DeviceStatus::AddInProgress);

    // Asking again while the fabric works neither attaches nor asks for another device.
    assert!(is_in_progress(
        &fx.provider.add(&AddRequest::new(gpu.clone())).await
    ));
    assert_eq!(resizes(&fx).len(), 1);

    fx.sim.complete_pending();
    let (serial, uuid) = attached(fx.provider.add(&AddRequest::new(gpu.clone())).await);
    assert_eq!(
        (serial.as_str(), uuid.as_str()),
        (pending[0].serial.as_str(), pending[0].res_uuid.as_str())
    );
    assert_eq!(resizes(&fx).len(), 1);

    // With a real delay the device arrives by itself; a second resource gets another one.
    fx.sim.set_cm_delay(Duration::from_millis(300));
    let gpu_b = fx.gpu("gpu-b", "worker-0");
    assert!(is_in_progress(
        &fx.provider.add(&AddRequest::new(gpu_b.clone())).await
    ));
    assert_eq!(
        resizes(&fx)[1]["increase_resource_count"]["device_count"],
        2
    );
    let (serial_b, _) = eventually(Duration::from_secs(20), "gpu-b attached", || async {
        match fx.provider.add(&AddRequest::new(gpu_b.clone())).await {
            Ok(cro_runtime::AddOutcome::Attached(d)) => Some((d.device_id, d.fabric_device_id)),
            Ok(cro_runtime::AddOutcome::InProgress(_)) => None,
            Err(e) => panic!("{e}"),
        }
    })
    .await;
    assert_ne!(serial_b, serial);
    assert_eq!(
        sim_device(&fx, &serial_b).machine.as_deref(),
        Some(machine.as_str())
    );
    assert_eq!(resizes(&fx).len(), 2);
}

#[tokio::test]
async fn detach_is_in_progress_until_the_device_is_gone() {
    let fx = cm().await;
    let machine = fx.add_openshift_node("worker-0");
    let seeded = fx.sim.attach_directly(&machine, "gpu", MODEL).unwrap();
    let mut gpu = fx.gpu("gpu-a", "worker-0");
    gpu.device_id = Some(seeded.serial.clone());
    gpu.fabric_device_id = Some(seeded.res_uuid.clone());

    assert!(is_removing(&fx.provider.remove_resource(&gpu).await));
    assert_eq!(
        resizes(&fx),
        vec![
            json!({"remove_resources": {"spec_uuid": fx.sim.spec_uuid("gpu", MODEL), "device_count": 0, "devices": [seeded.serial]}})
        ]
    );
    assert_eq!(
        sim_device(&fx, &seeded.serial).status,
        DeviceStatus::RemoveInProgress
    );
    assert!(is_removing(&fx.provider.remove_resource(&gpu).await));
    assert_eq!(resizes(&fx).len(), 1);

    fx.sim.complete_pending();
    assert_eq!(
        fx.provider.remove_resource(&gpu).await.unwrap(),
        RemoveOutcome::Removed
    );
    assert!(fx.sim.machine_devices(&machine).is_empty());
    // Already gone: nothing more is asked.
    assert_eq!(
        fx.provider.remove_resource(&gpu).await.unwrap(),
        RemoveOutcome::Removed
    );
    assert_eq!(resizes(&fx).len(), 1);
}

#[tokio::test]
async fn check_reports_healthy_warning_critical_and_missing() {
    let fx = cm().await;
    let machine = fx.add_openshift_node("worker-0");
    let d = fx.sim.attach_directly(&machine, "gpu", MODEL).unwrap();
    let mut gpu = fx.gpu("gpu-a", "worker-0");
    gpu.device_id = Some(d.serial.clone());

    fx.provider.check_resource(&gpu).await.unwrap();
    fx.sim.set_op_status(&d.serial, "1").unwrap();
    assert!(matches!(
        provider_error(fx.provider.check_resource(&gpu).await),
        ProviderError::Warning(_)
    ));
    fx.sim.set_op_status(&d.serial, "2").unwrap();
    assert!(matches!(
        provider_error(fx.provider.check_resource(&gpu).await),
        ProviderError::Critical(_)
    ));
    fx.sim.set_op_status(&d.serial, "").unwrap();
    assert!(matches!(
        provider_error(fx.provider.check_resource(&gpu).await),
        ProviderError::MalformedReply(_)
    ));
    fx.sim.detach_directly(&d.serial).unwrap();
    assert!(matches!(
        provider_error(fx.provider.check_resource(&gpu).await),
        ProviderError::NotFound(_)
    ));
}

#[tokio::test]
async fn get_resources_lists_what_the_simulator_holds_across_openshift_nodes() {
    let fx = cm().await;
    let m0 = fx.add_openshift_node("worker-0");
    let m1 = fx.add_openshift_node("worker-1");
    fx.add_plain_node("control-plane");
    let a = fx.sim.attach_directly(&m0, "gpu", MODEL).unwrap();
    let b = fx.sim.attach_directly(&m1, "gpu", MODEL).unwrap();
    let c = fx.sim.attach_directly(&m1, "gpu", MODEL).unwrap();

    let mut got: Vec<_> = fx
        .provider
        .list(&[])
        .await
        .unwrap()
        .into_iter()
        .map(|d| {
            (
                d.node,
                d.machine_id,
                d.device_type,
                d.model,
                d.device_id,
                d.fabric_device_id,
            )
        })
        .collect();
    got.sort_by(|x, y| x.4.cmp(&y.4));
    let mut want = vec![
        (
            "worker-0".to_string(),
            m0.clone(),
            DeviceType::Gpu,
            MODEL.to_string(),
            a.serial,
            a.res_uuid,
        ),
        (
            "worker-1".to_string(),
            m1.clone(),
            DeviceType::Gpu,
            MODEL.to_string(),
            b.serial,
            b.res_uuid,
        ),
        (
            "worker-1".to_string(),
            m1.clone(),
            DeviceType::Gpu,
            MODEL.to_string(),
            c.serial,
            c.res_uuid,
        ),
    ];
    want.sort_by(|x, y| x.4.cmp(&y.4));
    assert_eq!(got, want);
}

#[tokio::test]
async fn add_failed_and_remove_failed_carry_the_fabric_reason() {
    let fx = cm().await;
    let machine = fx.add_openshift_node("worker-0");
    let gpu = fx.gpu("gpu-a", "worker-0");

    fx.sim.inject(
        Fault::CmAddFailed {
            reason: "PCIe link training failed".into(),
        }
        .on(Route::CmResize),
    );
    assert!(is_in_progress(
        &fx.provider.add(&AddRequest::new(gpu.clone())).await
    ));
    fx.sim.complete_pending();
    let e = fabric_error(fx.provider.add(&AddRequest::new(gpu.clone())).await);
    assert_eq!(
        (e.code.as_str(), e.message.as_str()),
        ("ADD_FAILED", "PCIe link training failed")
    );
    // The next try asks again and succeeds.
    assert!(is_in_progress(
        &fx.provider.add(&AddRequest::new(gpu.clone())).await
    ));
    assert_eq!(resizes(&fx).len(), 2);
    fx.sim.complete_pending();
    let (serial, uuid) = attached(fx.provider.add(&AddRequest::new(gpu.clone())).await);

    let mut held = gpu.clone();
    held.device_id = Some(serial.clone());
    held.fabric_device_id = Some(uuid);
    fx.sim.inject(
        Fault::CmRemoveFailed {
            reason: "device busy".into(),
        }
        .on(Route::CmResize),
    );
    assert!(is_removing(&fx.provider.remove_resource(&held).await));
    fx.sim.complete_pending();
    let e = fabric_error(fx.provider.remove_resource(&held).await);
    assert_eq!(
        (e.code.as_str(), e.message.as_str()),
        ("REMOVE_FAILED", "device busy")
    );
    assert!(is_removing(&fx.provider.remove_resource(&held).await));
    fx.sim.complete_pending();
    assert_eq!(
        fx.provider.remove_resource(&held).await.unwrap(),
        RemoveOutcome::Removed
    );
    assert!(
        fx.sim
            .machine_devices(&machine)
            .iter()
            .all(|d| d.serial != serial)
    );
}

#[tokio::test]
async fn each_injected_fault_gives_a_typed_error() {
    let fx = cm().await;
    fx.add_openshift_node("worker-0");
    let gpu = fx.gpu("gpu-a", "worker-0");

    fx.sim
        .inject(Fault::error(409, "CM-0042", "quota exceeded").on(Route::CmResize));
    let e = fabric_error(fx.provider.add(&AddRequest::new(gpu.clone())).await);
    assert_eq!(
        (e.status, e.code.as_str(), e.message.as_str()),
        (409, "CM-0042", "quota exceeded")
    );

    fx.sim.inject(Fault::NoFreeDevice.on(Route::CmResize));
    assert!(matches!(
        provider_error(fx.provider.add(&AddRequest::new(gpu.clone())).await),
        ProviderError::NoCapacity(m) if m.contains(codes::NO_FREE_DEVICE)
    ));

    fx.sim
        .inject(Fault::error_value(500, "CM-0500", json!(["db", 3])).on(Route::CmGetMachine));
    let e = fabric_error(fx.provider.add(&AddRequest::new(gpu.clone())).await);
    assert_eq!(
        (e.status, e.code.as_str(), e.message.as_str()),
        (500, "CM-0500", r#"["db",3]"#)
    );

    fx.sim.inject(Fault::MalformedJson.on(Route::CmGetMachine));
    assert!(matches!(
        provider_error(fx.provider.add(&AddRequest::new(gpu.clone())).await),
        ProviderError::MalformedReply(_)
    ));

    fx.sim.inject(Fault::Drop.on(Route::CmGetMachine));
    assert!(matches!(
        provider_error(fx.provider.add(&AddRequest::new(gpu.clone())).await),
        ProviderError::Unavailable(_)
    ));

    // None of the failures left a request behind: the next try asks once and proceeds.
    assert_eq!(fx.sim.active_faults(), 0);
    assert!(is_in_progress(
        &fx.provider.add(&AddRequest::new(gpu.clone())).await
    ));
    fx.sim.complete_pending();
    attached(fx.provider.add(&AddRequest::new(gpu.clone())).await);
}

#[tokio::test]
async fn a_full_spec_is_no_capacity() {
    let fx = Fixture::builder(Api::Cm)
        .with_sim_config(|c| {
            let mut c = c.with_cm_delay(Duration::from_secs(3600));
            c.max_devices_per_spec = 1;
            c
        })
        .start()
        .await;
    fx.sim.add_free_devices("gpu", MODEL, 2);
    let machine = fx.add_openshift_node("worker-0");
    fx.sim.attach_directly(&machine, "gpu", MODEL).unwrap();
    assert!(matches!(
        provider_error(
            fx.provider
                .add(&AddRequest::new(fx.gpu("gpu-a", "worker-0")))
                .await
        ),
        ProviderError::NoCapacity(_)
    ));
    assert!(resizes(&fx).is_empty());
}

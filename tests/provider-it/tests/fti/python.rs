//! The Python example provider (providers/python-example, built by componentize-py,
//! contract 0.2.0) in the real runtime against the fabric simulator's Fabric Manager
//! API.

use cro_runtime::{AddOutcome, AddRequest, Claim, ProviderError};
use fabric_sim::{Fault, Route};
use provider_it::MODEL;
use provider_it::python::start;
use serde_json::json;

use crate::*;

const MACHINE: &str = "0b1c2d3e-0000-4000-8000-00000000py01";

#[tokio::test]
async fn python_provider_attaches_checks_lists_and_detaches() {
    let fx = start(&[]).await;
    fx.sim.add_free_devices("gpu", MODEL, 2);
    fx.add_node("worker-0", MACHINE);
    let mut gpu = fx.gpu("gpu-py", "worker-0");

    // Contract 0.2.0, and describe() asks for exactly what the fixture grants.
    assert_eq!(fx.provider.contract_version(), "0.2.0");
    let info = fx.provider.info().expect("describe()");
    assert_eq!(
        (info.name.as_str(), info.vendor.as_str()),
        ("fti-python", "Fujitsu")
    );
    let report = fx.provider.capability_report();
    assert!(report.is_clean(), "{report}");

    let Ok(AddOutcome::Attached(a)) = fx.provider.add(&AddRequest::new(gpu.clone())).await else {
        panic!("attach failed")
    };
    assert_eq!(a.machine_id.as_deref(), Some(MACHINE));
    let (serial, uuid) = (a.device_id, a.fabric_device_id);
    let on_machine = fx.sim.machine_devices(MACHINE);
    assert_eq!(on_machine.len(), 1);
    assert_eq!(
        (&on_machine[0].serial, &on_machine[0].res_uuid),
        (&serial, &uuid)
    );
    assert_eq!(fx.sim.free_devices("gpu", MODEL), 1);
    gpu.device_id = Some(serial.clone());
    gpu.fabric_device_id = Some(uuid.clone());

    fx.provider.check_resource(&gpu).await.unwrap();
    fx.sim.set_op_status(&serial, "1").unwrap();
    assert!(matches!(
        provider_error(fx.provider.check_resource(&gpu).await),
        ProviderError::Warning(m) if m.contains(&serial)
    ));
    fx.sim.set_op_status(&serial, "0").unwrap();

    let listed = fx.provider.list(&[]).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].node, "worker-0");
    assert_eq!(listed[0].machine_id, MACHINE);
    assert_eq!(listed[0].model, MODEL);
    assert_eq!(listed[0].device_id, serial);

    // The token came once and was reused from the host's state store.
    assert_eq!(fx.sim.token_requests().len(), 1);

    assert_eq!(
        fx.provider.remove_resource(&gpu).await.unwrap(),
        cro_runtime::RemoveOutcome::Removed
    );
    assert!(fx.sim.machine_devices(MACHINE).is_empty());
    assert_eq!(fx.sim.free_devices("gpu", MODEL), 2);
    assert_eq!(fx.sim.requests_to(Route::FmDetach).len(), 1);
    // A second detach finds the device gone: done, without another DELETE.
    assert_eq!(
        fx.provider.remove_resource(&gpu).await.unwrap(),
        cro_runtime::RemoveOutcome::Removed
    );
    assert_eq!(fx.sim.requests_to(Route::FmDetach).len(), 1);
    assert!(matches!(
        provider_error(fx.provider.check_resource(&gpu).await),
        ProviderError::NotFound(_)
    ));
}

#[tokio::test]
async fn python_provider_honours_claims_and_a_retry_attaches_no_second_device() {
    let fx = start(&[]).await;
    fx.sim.add_free_devices("gpu", MODEL, 3);
    fx.add_node("worker-0", MACHINE);
    let request = |name: &str, key: &str, claims: Vec<Claim>| AddRequest {
        resource: fx.gpu(name, "worker-0"),
        attempt_key: key.into(),
        size_bytes: None,
        claims,
    };

    // The fabric attaches, then the connection drops before the reply.
    fx.sim
        .inject(Fault::DropAfterProcessing.on(Route::FmAttach));
    let req = request("gpu-a", "key-a", Vec::new());
    assert!(matches!(
        provider_error(fx.provider.add(&req).await),
        ProviderError::Unavailable(_)
    ));
    let on_machine = fx.sim.machine_devices(MACHINE);
    assert_eq!(on_machine.len(), 1);
    // The retry finds the device no resource holds: no second attach.
    let (serial, uuid) = attached(fx.provider.add(&req).await);
    assert_eq!(
        (&serial, &uuid),
        (&on_machine[0].serial, &on_machine[0].res_uuid)
    );
    assert_eq!(fx.sim.requests_to(Route::FmAttach).len(), 1);
    // And again (the reply lost on the host's side): the attempt's record answers.
    assert_eq!(
        attached(fx.provider.add(&req).await),
        (serial.clone(), uuid.clone())
    );
    assert_eq!(fx.sim.requests_to(Route::FmAttach).len(), 1);

    // Once gpu-a holds it, another resource gets a device of its own.
    let held = Claim {
        resource: "gpu-a".into(),
        device_id: Some(serial.clone()),
        fabric_device_id: Some(uuid.clone()),
    };
    let (serial_b, _) = attached(
        fx.provider
            .add(&request("gpu-b", "key-b", vec![held]))
            .await,
    );
    assert_ne!(serial_b, serial);
    assert_eq!(fx.sim.machine_devices(MACHINE).len(), 2);
    assert_eq!(fx.sim.requests_to(Route::FmAttach).len(), 2);

    // The recorded machine id detaches without the Node.
    let mut gone = fx.gpu("gpu-a", "no-such-node");
    gone.device_id = Some(serial);
    gone.fabric_device_id = Some(uuid);
    gone.machine_id = Some(MACHINE.into());
    assert_eq!(
        fx.provider.remove_resource(&gone).await.unwrap(),
        cro_runtime::RemoveOutcome::Removed
    );
    assert_eq!(fx.sim.machine_devices(MACHINE).len(), 1);
}

#[tokio::test]
async fn python_provider_reports_typed_errors() {
    let fx = start(&[]).await;
    fx.add_node("worker-0", MACHINE);
    // An empty pool: the simulator's no-capacity code becomes the typed error.
    assert!(matches!(
        provider_error(
            fx.provider
                .add(&AddRequest::new(fx.gpu("gpu-none", "worker-0")))
                .await
        ),
        ProviderError::NoCapacity(_)
    ));
    // A node that is not on the fabric.
    fx.cluster
        .insert_object(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "plain"}, "spec": {"providerID": "kind://docker/plain"}}))
        .unwrap();
    assert!(matches!(
        provider_error(fx.provider.add(&AddRequest::new(fx.gpu("gpu-p", "plain"))).await),
        ProviderError::NotFound(m) if m.contains("plain")
    ));

    // The Cluster Manager API is not implemented by this example: a typed config error.
    let cm = start(&[("api_type", "CM")]).await;
    assert!(matches!(
        provider_error(cm.provider.add(&AddRequest::new(cm.gpu("gpu-cm", "worker-0"))).await),
        ProviderError::Config(m) if m.contains("Fabric Manager")
    ));
}

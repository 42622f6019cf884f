//! Contract versions: the 0.1.0 and 0.2.0 builds of FTI side by side in one runtime,
//! and what only 0.2.0 carries (describe, machine ids, claims).

use cro_runtime::{AddOutcome, AddRequest, Claim, RemoveOutcome};
use provider_it::{Api, Build, Fixture, MODEL};

#[tokio::test]
async fn both_builds_attach_side_by_side_in_one_runtime() {
    let fx = Fixture::builder(Api::Fm)
        .with_build(Build::Current)
        .start()
        .await;
    fx.sim.add_free_devices("gpu", MODEL, 2);
    let machine = fx.add_provider_id_node("worker-0");
    let new = fx.provider.clone();
    let old = fx.load_build(Build::V0_1).await;
    assert_eq!(new.contract_version(), "0.3.0");
    assert_eq!(old.contract_version(), "0.1.0");

    // The fixture grants what FTI needs, plus the OpenShift lookups FTI wants only with
    // a `cluster_id` (Cluster Manager), which this Fabric Manager fixture does not set.
    let report = new.capability_report();
    assert!(report.declared);
    assert!(report.wanted_not_granted.is_empty(), "{report}");
    assert_eq!(
        report.granted_not_wanted,
        [
            "lookup machine.openshift.io/v1beta1 Machine",
            "lookup metal3.io/v1alpha1 BareMetalHost"
        ],
        "{report}"
    );
    assert!(report.unknown_config.is_empty() && report.missing_config.is_empty());
    assert!(!old.capability_report().declared);
    assert_eq!(new.info().map(|i| i.name.as_str()), Some("fti"));

    let Ok(AddOutcome::Attached(a)) = old.add(&AddRequest::new(fx.gpu("gpu-a", "worker-0"))).await
    else {
        panic!("0.1.0 attach failed")
    };
    assert_eq!(a.machine_id, None, "0.1.0 has no machine id");
    let Ok(AddOutcome::Attached(b)) = new.add(&AddRequest::new(fx.gpu("gpu-b", "worker-0"))).await
    else {
        panic!("0.2.0 attach failed")
    };
    assert_eq!(b.machine_id.as_deref(), Some(machine.as_str()));
    assert_ne!(a.device_id, b.device_id);

    // Both list the same two devices.
    let claims = [Claim {
        resource: "gpu-a".into(),
        device_id: Some(a.device_id.clone()),
        fabric_device_id: Some(a.fabric_device_id.clone()),
    }];
    let mut listed_old = old.list(&[]).await.unwrap();
    let mut listed_new = new.list(&claims).await.unwrap();
    listed_old.sort_by(|x, y| x.device_id.cmp(&y.device_id));
    listed_new.sort_by(|x, y| x.device_id.cmp(&y.device_id));
    assert_eq!(listed_old.len(), 2);
    assert_eq!(listed_old, listed_new);

    // Each detaches what the other attached.
    let mut ra = fx.gpu("gpu-a", "worker-0");
    ra.device_id = Some(a.device_id.clone());
    ra.fabric_device_id = Some(a.fabric_device_id.clone());
    assert_eq!(
        new.remove_resource(&ra).await.unwrap(),
        RemoveOutcome::Removed
    );
    let mut rb = fx.gpu("gpu-b", "worker-0");
    rb.device_id = Some(b.device_id.clone());
    rb.fabric_device_id = Some(b.fabric_device_id.clone());
    assert_eq!(
        old.remove_resource(&rb).await.unwrap(),
        RemoveOutcome::Removed
    );
    assert!(old.list(&[]).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_recorded_machine_detaches_without_the_node() {
    let fx = Fixture::builder(Api::Fm)
        .with_build(Build::Current)
        .start()
        .await;
    fx.sim.add_free_devices("gpu", MODEL, 1);
    fx.add_provider_id_node("worker-0");
    let mut req = AddRequest::new(fx.gpu("gpu-a", "worker-0"));
    req.attempt_key = "attempt-1".into();
    let Ok(AddOutcome::Attached(d)) = fx.provider.add(&req).await else {
        panic!("attach failed")
    };
    assert!(fx.cluster.remove_object("v1", "Node", None, "worker-0"));

    let mut r = fx.gpu("gpu-a", "worker-0");
    r.device_id = Some(d.device_id.clone());
    r.fabric_device_id = Some(d.fabric_device_id.clone());
    // Without the machine the provider needs the Node, which is gone.
    let err = fx.provider.remove_resource(&r).await.unwrap_err();
    assert!(err.to_string().contains("worker-0"), "{err}");
    r.machine_id = d.machine_id.clone();
    assert_eq!(
        fx.provider.remove_resource(&r).await.unwrap(),
        RemoveOutcome::Removed
    );
    assert!(
        fx.sim
            .device(&d.device_id)
            .and_then(|s| s.machine)
            .is_none()
    );
}

#[tokio::test]
async fn the_cluster_manager_fixture_grants_exactly_what_fti_declares() {
    let fx = Fixture::builder(Api::Cm)
        .with_build(Build::Current)
        .start()
        .await;
    let report = fx.provider.capability_report();
    assert!(report.declared && report.is_clean(), "{report}");
}

//! Node to machine resolution through the lookup interface.

use fti_provider::{Fti, LookupError, Method, ProviderError};
use serde_json::json;

use crate::fake::FakeHost;
use crate::*;

fn fm_host_with_machine() -> FakeHost {
    let h = FakeHost::new("FM");
    h.reply_json(
        Method::Get,
        FM_MACHINE_PATH,
        200,
        &fm_machine(MACHINE, vec![fm_res("GPU-1", "u1", "gpu", MODEL, "0")]),
    );
    h
}

fn check(h: &FakeHost, node: &str) -> Result<(), ProviderError> {
    Fti::new(h).check_resource(&attached("r1", node, "GPU-1", "u1"))
}

#[test]
fn provider_id_names_the_machine() {
    let h = fm_host_with_machine();
    h.add_node("n1", Some(&format!("fsas-cdi://{MACHINE}")));
    check(&h, "n1").unwrap();
    assert_eq!(
        h.fabric_calls(),
        vec![(
            Method::Get,
            format!("{FM_MACHINE_PATH}?tenant_uuid=tenant-1")
        )]
    );
}

#[test]
fn nodes_without_a_fabric_provider_id_are_not_found() {
    let h = fm_host_with_machine();
    h.add_node("aws", Some("aws:///us-east-1a/i-0"));
    h.add_node("bare", None);
    h.add_node("empty", Some("fsas-cdi://"));
    for node in ["aws", "bare", "empty"] {
        assert!(
            matches!(check(&h, node), Err(ProviderError::NotFound(m)) if m.contains("providerID")),
            "{node}"
        );
    }
    assert!(matches!(
        check(&h, "ghost"),
        Err(ProviderError::NotFound(_))
    ));
    *h.node_lookup_error.borrow_mut() = Some(LookupError::Denied("no Node grant".into()));
    assert!(matches!(check(&h, "aws"), Err(ProviderError::Denied(_))));
    *h.node_lookup_error.borrow_mut() = Some(LookupError::Other("api down".into()));
    assert!(matches!(check(&h, "aws"), Err(ProviderError::Other(_))));
    assert!(h.requests.borrow().is_empty());
}

#[test]
fn an_unreadable_node_is_an_error_not_a_panic() {
    let h = fm_host_with_machine();
    h.nodes.borrow_mut().insert("n1".into(), "{not json".into());
    assert!(matches!(check(&h, "n1"), Err(ProviderError::Other(_))));
}

#[test]
fn openshift_chain_names_the_machine() {
    let h = fm_host_with_machine();
    h.set_config("cluster_id", "cluster-1");
    h.add_openshift_node("ocp1", MACHINE);
    check(&h, "ocp1").unwrap();
    // The providerID is ignored once a cluster id is set.
    h.add_node("plain", Some(&format!("fsas-cdi://{MACHINE}")));
    assert!(
        matches!(check(&h, "plain"), Err(ProviderError::NotFound(m)) if m.contains("machine.openshift.io/machine"))
    );
}

#[test]
fn broken_openshift_chains_are_not_found() {
    let h = fm_host_with_machine();
    h.set_config("cluster_id", "cluster-1");

    // Annotation not namespace/name.
    h.nodes.borrow_mut().insert(
        "a".into(),
        json!({"metadata": {"name": "a", "annotations": {"machine.openshift.io/machine": "just-a-name"}}}).to_string(),
    );
    assert!(
        matches!(check(&h, "a"), Err(ProviderError::NotFound(m)) if m.contains("namespace/name"))
    );

    // Machine missing.
    h.nodes.borrow_mut().insert(
        "b".into(),
        json!({"metadata": {"name": "b", "annotations": {"machine.openshift.io/machine": "ns/missing"}}}).to_string(),
    );
    assert!(
        matches!(check(&h, "b"), Err(ProviderError::NotFound(m)) if m.contains("Machine ns/missing"))
    );

    // BareMetalHost without the machine annotation.
    h.add_openshift_node("c", MACHINE);
    h.add_object(
        "metal3.io/v1alpha1",
        "BareMetalHost",
        "openshift-machine-api",
        "c-bmh",
        json!({"metadata": {"annotations": {"other": "x"}}}),
    );
    assert!(
        matches!(check(&h, "c"), Err(ProviderError::NotFound(m)) if m.contains("cluster-manager.cdi.io/machine"))
    );

    // Machine without the BareMetalHost annotation.
    h.add_openshift_node("d", MACHINE);
    h.add_object(
        "machine.openshift.io/v1beta1",
        "Machine",
        "openshift-machine-api",
        "d-m",
        json!({"metadata": {}}),
    );
    assert!(
        matches!(check(&h, "d"), Err(ProviderError::NotFound(m)) if m.contains("metal3.io/BareMetalHost"))
    );
    assert!(h.requests.borrow().is_empty());
}

#[test]
fn machine_ids_are_encoded_into_the_path() {
    let h = FakeHost::new("FM");
    h.add_node("n1", Some("fsas-cdi://../../admin?x=1"));
    let _ = check(&h, "n1");
    let calls = h.fabric_calls();
    assert_eq!(
        calls[0].1,
        "fabric_manager/api/v1/machines/..%2F..%2Fadmin%3Fx%3D1?tenant_uuid=tenant-1"
    );
}

//! The Cluster Manager API: asynchronous resizes.

use fti_provider::{
    AddOutcome, AddRequest, AttachedDevice, Claim, DeviceType, Fti, Method, ProviderError,
    RemoveOutcome,
};
use serde_json::{Value, json};

use crate::fake::{FakeHost, json_reply};
use crate::*;

const BASE_PATH: &str = "cluster_manager/cluster_autoscaler/v3/tenants/tenant-1/clusters/cluster-1/machines/9a7c1e2e-0000-4000-8000-000000000001";

fn resize_path() -> String {
    format!("{BASE_PATH}/actions/resize")
}

fn host() -> FakeHost {
    let h = FakeHost::new("CM");
    h.set_config("cluster_id", "cluster-1");
    h.add_openshift_node("n1", MACHINE);
    h.reply(Method::Post, &resize_path(), json_reply(202, "{}"));
    h
}

fn machine(h: &FakeHost, count: u64, devices: Vec<Value>) {
    h.reply_json(
        Method::Get,
        BASE_PATH,
        200,
        &cm_machine(
            MACHINE,
            vec![
                cm_spec("spec-h100", "gpu", "H100", 0, vec![]),
                cm_spec("spec-a100", "gpu", MODEL, count, devices),
            ],
        ),
    );
}

fn posts(h: &FakeHost) -> usize {
    h.fabric_calls()
        .iter()
        .filter(|(m, _)| *m == Method::Post)
        .count()
}

#[test]
fn attach_resizes_then_reports_in_progress_until_the_device_is_added() {
    let h = host();
    let fti = Fti::new(&h);
    let r = gpu("r1", "n1");
    machine(&h, 1, vec![cm_dev("GPU-old", "u-old", "ADD_COMPLETE", "0")]);

    assert!(matches!(
        fti.add_resource(&r),
        Ok(AddOutcome::InProgress(_))
    ));
    assert_eq!(
        h.fabric_calls(),
        vec![
            (Method::Get, BASE_PATH.to_string()),
            (Method::Post, resize_path())
        ]
    );
    assert_eq!(
        h.last_body(Method::Post),
        json!({"increase_resource_count": {"spec_uuid": "spec-a100", "device_count": 2}})
    );

    // The fabric lists the new device while adding it: still in progress, no new resize.
    machine(
        &h,
        2,
        vec![
            cm_dev("GPU-old", "u-old", "ADD_COMPLETE", "0"),
            cm_dev("GPU-new", "u-new", "ADDING", "0"),
        ],
    );
    assert!(matches!(
        fti.add_resource(&r),
        Ok(AddOutcome::InProgress(_))
    ));
    // A device without id yet counts as in progress too.
    machine(
        &h,
        2,
        vec![
            cm_dev("GPU-old", "u-old", "ADD_COMPLETE", "0"),
            json!({"status": "ADDING"}),
        ],
    );
    assert!(matches!(
        fti.add_resource(&r),
        Ok(AddOutcome::InProgress(_))
    ));
    assert_eq!(posts(&h), 1);

    machine(
        &h,
        2,
        vec![
            cm_dev("GPU-old", "u-old", "ADD_COMPLETE", "0"),
            cm_dev("GPU-new", "u-new", "ADD_COMPLETE", "0"),
        ],
    );
    assert_eq!(
        fti.add_resource(&r).unwrap(),
        AddOutcome::Attached(AttachedDevice {
            device_id: "GPU-new".into(),
            fabric_device_id: "u-new".into(),
            machine_id: Some(MACHINE.into())
        })
    );
    assert_eq!(posts(&h), 1);
    assert!(!h.state.borrow().contains_key("fti/cm/add/r1"));
}

#[test]
fn concurrent_attaches_on_one_spec_get_distinct_devices() {
    let h = host();
    let fti = Fti::new(&h);
    let (r1, r2) = (gpu("r1", "n1"), gpu("r2", "n1"));
    machine(&h, 0, vec![]);
    assert!(matches!(
        fti.add_resource(&r1),
        Ok(AddOutcome::InProgress(_))
    ));
    // The spec already counts r1's request when r2 asks.
    machine(&h, 1, vec![]);
    assert!(matches!(
        fti.add_resource(&r2),
        Ok(AddOutcome::InProgress(_))
    ));
    assert_eq!(
        h.last_body(Method::Post)["increase_resource_count"]["device_count"],
        2
    );

    machine(
        &h,
        2,
        vec![
            cm_dev("GPU-a", "u-a", "ADD_COMPLETE", "0"),
            cm_dev("GPU-b", "u-b", "ADDING", "0"),
        ],
    );
    let AddOutcome::Attached(d2) = fti.add_resource(&r2).unwrap() else {
        panic!()
    };
    assert_eq!(d2.device_id, "GPU-a");
    // r1 must not get r2's device.
    assert!(matches!(
        fti.add_resource(&r1),
        Ok(AddOutcome::InProgress(_))
    ));
    machine(
        &h,
        2,
        vec![
            cm_dev("GPU-a", "u-a", "ADD_COMPLETE", "0"),
            cm_dev("GPU-b", "u-b", "ADD_COMPLETE", "0"),
        ],
    );
    let AddOutcome::Attached(d1) = fti.add_resource(&r1).unwrap() else {
        panic!()
    };
    assert_eq!(d1.device_id, "GPU-b");
}

#[test]
fn add_failed_is_an_error_with_the_reason_and_the_next_try_asks_again() {
    let h = host();
    let fti = Fti::new(&h);
    let r = gpu("r1", "n1");
    machine(&h, 0, vec![]);
    assert!(matches!(
        fti.add_resource(&r),
        Ok(AddOutcome::InProgress(_))
    ));
    machine(&h, 1, vec![cm_dev("GPU-f", "u-f", "ADD_FAILED", "")]);
    assert_eq!(
        fti.add_resource(&r),
        Err(ProviderError::Fabric {
            status: 200,
            code: "ADD_FAILED".into(),
            message: "reason of GPU-f".into()
        })
    );
    assert!(matches!(
        fti.add_resource(&r),
        Ok(AddOutcome::InProgress(_))
    ));
    assert_eq!(posts(&h), 2);
    assert_eq!(
        h.last_body(Method::Post)["increase_resource_count"]["device_count"],
        2
    );
}

#[test]
fn attach_errors_are_typed() {
    let h = host();
    let fti = Fti::new(&h);
    // No spec of the model.
    h.reply_json(
        Method::Get,
        BASE_PATH,
        200,
        &cm_machine(MACHINE, vec![cm_spec("s", "gpu", "H100", 0, vec![])]),
    );
    assert!(
        matches!(fti.add_resource(&gpu("r1", "n1")), Err(ProviderError::NotFound(m)) if m.contains(MODEL))
    );
    // Spec without uuid.
    h.reply_json(
        Method::Get,
        BASE_PATH,
        200,
        &cm_machine(MACHINE, vec![cm_spec("", "gpu", MODEL, 0, vec![])]),
    );
    assert!(matches!(
        fti.add_resource(&gpu("r1", "n1")),
        Err(ProviderError::MalformedReply(_))
    ));
    // Reply without the machine.
    h.reply_json(
        Method::Get,
        BASE_PATH,
        200,
        &json!({"data": {"cluster": {}}}),
    );
    assert!(matches!(
        fti.add_resource(&gpu("r1", "n1")),
        Err(ProviderError::MalformedReply(_))
    ));
    // Resize refused: the error is the fabric's and nothing stays pending.
    machine(&h, 0, vec![]);
    h.reply(
        Method::Post,
        &resize_path(),
        json_reply(
            409,
            r#"{"status":409,"detail":{"code":"CM-409","message":{"max":8}}}"#,
        ),
    );
    assert_eq!(
        fti.add_resource(&gpu("r1", "n1")),
        Err(ProviderError::Fabric {
            status: 409,
            code: "CM-409".into(),
            message: r#"{"max":8}"#.into()
        })
    );
    assert!(!h.state.borrow().contains_key("fti/cm/add/r1"));
    // A state store that refuses: no request is sent that could not be followed.
    h.reply(Method::Post, &resize_path(), json_reply(202, "{}"));
    h.state_refuses.set(true);
    let before = posts(&h);
    assert!(matches!(
        fti.add_resource(&gpu("r1", "n1")),
        Err(ProviderError::Other(_))
    ));
    assert_eq!(posts(&h), before);
}

#[test]
fn an_added_device_without_res_uuid_is_malformed() {
    let h = host();
    let fti = Fti::new(&h);
    machine(&h, 0, vec![]);
    fti.add_resource(&gpu("r1", "n1")).unwrap();
    machine(
        &h,
        1,
        vec![json!({"device_id": "GPU-n", "status": "ADD_COMPLETE"})],
    );
    assert!(matches!(
        fti.add_resource(&gpu("r1", "n1")),
        Err(ProviderError::MalformedReply(_))
    ));
}

#[test]
fn detach_resizes_then_reports_in_progress_until_the_device_is_gone() {
    let h = host();
    let fti = Fti::new(&h);
    let r = attached("r1", "n1", "GPU-1", "u1");
    machine(
        &h,
        2,
        vec![
            cm_dev("GPU-0", "u0", "ADD_COMPLETE", "0"),
            cm_dev("GPU-1", "u1", "ADD_COMPLETE", "0"),
        ],
    );
    assert!(matches!(
        fti.remove_resource(&r),
        Ok(RemoveOutcome::InProgress(_))
    ));
    assert_eq!(
        h.last_body(Method::Post),
        json!({"remove_resources": {"spec_uuid": "spec-a100", "device_count": 1, "devices": ["GPU-1"]}})
    );
    // Still listed (not yet picked up, then being removed): no second request.
    assert!(matches!(
        fti.remove_resource(&r),
        Ok(RemoveOutcome::InProgress(_))
    ));
    machine(
        &h,
        1,
        vec![
            cm_dev("GPU-0", "u0", "ADD_COMPLETE", "0"),
            cm_dev("GPU-1", "u1", "REMOVING", "0"),
        ],
    );
    assert!(matches!(
        fti.remove_resource(&r),
        Ok(RemoveOutcome::InProgress(_))
    ));
    assert_eq!(posts(&h), 1);
    machine(&h, 1, vec![cm_dev("GPU-0", "u0", "ADD_COMPLETE", "0")]);
    assert_eq!(fti.remove_resource(&r).unwrap(), RemoveOutcome::Removed);
    assert_eq!(posts(&h), 1);
    assert!(
        !h.state
            .borrow()
            .keys()
            .any(|k| k.starts_with("fti/cm/remove/"))
    );
}

#[test]
fn detach_of_a_device_already_gone_sends_nothing() {
    let h = host();
    machine(&h, 1, vec![cm_dev("GPU-0", "u0", "ADD_COMPLETE", "0")]);
    assert_eq!(
        Fti::new(&h)
            .remove_resource(&attached("r1", "n1", "GPU-1", "u1"))
            .unwrap(),
        RemoveOutcome::Removed
    );
    assert_eq!(posts(&h), 0);
}

#[test]
fn remove_failed_is_an_error_with_the_reason_and_the_next_try_asks_again() {
    let h = host();
    let fti = Fti::new(&h);
    let r = attached("r1", "n1", "GPU-1", "u1");
    machine(&h, 1, vec![cm_dev("GPU-1", "u1", "ADD_COMPLETE", "0")]);
    assert!(matches!(
        fti.remove_resource(&r),
        Ok(RemoveOutcome::InProgress(_))
    ));
    machine(&h, 1, vec![cm_dev("GPU-1", "u1", "REMOVE_FAILED", "0")]);
    assert_eq!(
        fti.remove_resource(&r),
        Err(ProviderError::Fabric {
            status: 200,
            code: "REMOVE_FAILED".into(),
            message: "reason of GPU-1".into()
        })
    );
    assert!(matches!(
        fti.remove_resource(&r),
        Ok(RemoveOutcome::InProgress(_))
    ));
    assert_eq!(posts(&h), 2);
}

#[test]
fn check_reports_health_of_the_device_detail() {
    let h = host();
    let r = attached("r1", "n1", "GPU-1", "u1");
    for (op, want) in [
        ("0", "ok"),
        ("1", "Warning"),
        ("2", "Critical"),
        ("", "MalformedReply"),
        ("9", "MalformedReply"),
    ] {
        machine(&h, 1, vec![cm_dev("GPU-1", "u1", "ADD_COMPLETE", op)]);
        let got = Fti::new(&h).check_resource(&r);
        let name = match &got {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("{e:?}"),
        };
        assert!(name.starts_with(want), "op {op:?} gave {got:?}");
    }
    machine(
        &h,
        1,
        vec![json!({"device_id": "GPU-1", "status": "ADD_COMPLETE"})],
    );
    assert!(matches!(
        Fti::new(&h).check_resource(&r),
        Err(ProviderError::MalformedReply(_))
    ));
    machine(&h, 1, vec![cm_dev("GPU-2", "u2", "ADD_COMPLETE", "0")]);
    assert!(matches!(
        Fti::new(&h).check_resource(&r),
        Err(ProviderError::NotFound(_))
    ));
}

#[test]
fn get_resources_lists_devices_with_models() {
    let h = host();
    let m2 = "22222222-0000-4000-8000-000000000002";
    h.add_openshift_node("n2", m2);
    h.add_node("worker-without-chain", Some("fsas-cdi://ignored"));
    machine(
        &h,
        1,
        vec![
            cm_dev("GPU-1", "u1", "ADD_COMPLETE", "0"),
            json!({"status": "ADDING"}),
        ],
    );
    h.reply_json(
        Method::Get,
        &BASE_PATH.replace(MACHINE, m2),
        200,
        &cm_machine(
            m2,
            vec![
                cm_spec(
                    "s-cxl",
                    "cxlmemory",
                    "CMM-D",
                    1,
                    vec![cm_dev("CXL-1", "c1", "ADD_COMPLETE", "0")],
                ),
                cm_spec(
                    "s-nic",
                    "nic",
                    "cx7",
                    1,
                    vec![cm_dev("NIC-1", "x1", "ADD_COMPLETE", "0")],
                ),
            ],
        ),
    );
    let mut got = Fti::new(&h).get_resources().unwrap();
    got.sort_by(|a, b| a.device_id.cmp(&b.device_id));
    let summary: Vec<_> = got
        .iter()
        .map(|d| {
            (
                d.node.as_str(),
                d.machine_id.as_str(),
                d.device_type,
                d.model.as_str(),
                d.device_id.as_str(),
                d.fabric_device_id.as_str(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("n2", m2, DeviceType::Cxlmemory, "CMM-D", "CXL-1", "c1"),
            ("n1", MACHINE, DeviceType::Gpu, MODEL, "GPU-1", "u1"),
        ]
    );
}

#[test]
fn a_spec_at_its_maximum_is_no_capacity_without_a_request() {
    let h = host();
    let mut spec = cm_spec(
        "spec-a100",
        "gpu",
        MODEL,
        2,
        vec![
            cm_dev("GPU-0", "u0", "ADD_COMPLETE", "0"),
            cm_dev("GPU-1", "u1", "ADD_COMPLETE", "0"),
        ],
    );
    spec["max_resspec_count"] = json!(2);
    h.reply_json(
        Method::Get,
        BASE_PATH,
        200,
        &cm_machine(MACHINE, vec![spec]),
    );
    assert!(matches!(
        Fti::new(&h).add_resource(&gpu("r1", "n1")),
        Err(ProviderError::NoCapacity(m)) if m.contains("at most 2")
    ));
    assert_eq!(posts(&h), 0);
}

#[test]
fn get_resources_skips_a_node_whose_machine_lookup_fails() {
    let h = host();
    machine(&h, 1, vec![cm_dev("GPU-1", "u1", "ADD_COMPLETE", "0")]);
    // n2's Machine cannot be read (the API server timed out on it).
    h.add_openshift_node("n2", "22222222-0000-4000-8000-000000000002");
    h.object_lookup_errors.borrow_mut().insert(
        "n2-m".into(),
        fti_provider::LookupError::Other("timeout".into()),
    );
    let got = Fti::new(&h).get_resources().unwrap();
    assert_eq!(
        got.iter().map(|d| d.device_id.as_str()).collect::<Vec<_>>(),
        ["GPU-1"]
    );
    assert!(h.logged(
        fti_provider::LogLevel::Warn,
        &format!("{} n2", fti_provider::SKIPPED_NODE_LOG_PREFIX)
    ));
    // The fabric does not know n2's machine: skipped as well.
    let m2 = "22222222-0000-4000-8000-000000000002";
    h.object_lookup_errors.borrow_mut().clear();
    h.reply(
        Method::Get,
        &BASE_PATH.replace(MACHINE, m2),
        json_reply(
            404,
            r#"{"status":404,"detail":{"code":"E0404","message":"no machine"}}"#,
        ),
    );
    assert_eq!(Fti::new(&h).get_resources().unwrap().len(), 1);
    // A refused grant is not one node's problem.
    h.object_lookup_errors.borrow_mut().insert(
        "n2-bmh".into(),
        fti_provider::LookupError::Denied("bmh".into()),
    );
    assert!(matches!(
        Fti::new(&h).get_resources(),
        Err(ProviderError::Denied(_))
    ));
}

#[test]
fn no_free_device_on_resize_is_no_capacity() {
    let h = host();
    machine(&h, 0, vec![]);
    h.reply(
        Method::Post,
        &resize_path(),
        json_reply(409, r#"{"error":"insufficient_resources"}"#),
    );
    assert!(matches!(
        Fti::new(&h).add_resource(&gpu("r1", "n1")),
        Err(ProviderError::NoCapacity(_))
    ));
}

#[test]
fn a_lost_resize_reply_never_asks_for_a_second_device() {
    let h = host();
    let fti = Fti::new(&h);
    let r = gpu("r1", "n1");
    machine(&h, 0, vec![]);
    // The connection drops after the request went out: the fabric took it.
    h.reply(
        Method::Post,
        &resize_path(),
        Err(fti_provider::HttpError::Other(
            "connection closed before message completed".into(),
        )),
    );
    assert!(matches!(
        fti.add_resource(&r),
        Err(ProviderError::Unavailable(_))
    ));
    machine(
        &h,
        1,
        vec![cm_dev("GPU-new", "u-new", "ADD_IN_PROGRESS", "0")],
    );
    h.reply(Method::Post, &resize_path(), json_reply(202, "{}"));
    assert!(matches!(
        fti.add_resource(&r),
        Ok(AddOutcome::InProgress(_))
    ));
    machine(&h, 1, vec![cm_dev("GPU-new", "u-new", "ADD_COMPLETE", "0")]);
    assert_eq!(
        fti.add_resource(&r).unwrap(),
        AddOutcome::Attached(AttachedDevice {
            device_id: "GPU-new".into(),
            fabric_device_id: "u-new".into(),
            machine_id: Some(MACHINE.into())
        })
    );
    assert_eq!(posts(&h), 1);
}

#[test]
fn a_lost_resize_that_left_no_trace_is_sent_again() {
    let h = host();
    let fti = Fti::new(&h);
    let r = gpu("r1", "n1");
    machine(&h, 0, vec![]);
    h.reply(
        Method::Post,
        &resize_path(),
        Err(fti_provider::HttpError::Timeout),
    );
    assert!(matches!(
        fti.add_resource(&r),
        Err(ProviderError::Unavailable(_))
    ));
    // The fabric shows nothing of it: asked again at once.
    h.reply(Method::Post, &resize_path(), json_reply(202, "{}"));
    assert!(matches!(
        fti.add_resource(&r),
        Ok(AddOutcome::InProgress(_))
    ));
    assert_eq!(posts(&h), 2);
    // Answered this time: a slow fabric showing nothing yet is waited for.
    assert!(matches!(
        fti.add_resource(&r),
        Ok(AddOutcome::InProgress(_))
    ));
    assert_eq!(posts(&h), 2);
    // A refusal forgets the request.
    let r2 = gpu("r2", "n1");
    h.reply(
        Method::Post,
        &resize_path(),
        json_reply(400, r#"{"error":"bad_count"}"#),
    );
    assert!(matches!(
        fti.add_resource(&r2),
        Err(ProviderError::Fabric { status: 400, .. })
    ));
    assert!(!h.state.borrow().contains_key("fti/cm/add/r2"));
}

/// The cluster's claims decide whose a new device is even when the provider's own
/// record of handed-out devices is gone: r1 holds GPU-a (its ComposableResource says
/// so), the `fti/cm/claim/*` entries were lost, and r2 must get GPU-b, not GPU-a.
#[test]
fn claims_keep_another_resources_device_when_the_claim_state_is_lost() {
    let h = host();
    let fti = Fti::new(&h);
    let (r1, r2) = (gpu("r1", "n1"), gpu("r2", "n1"));
    machine(&h, 0, vec![]);
    assert!(matches!(
        fti.add_resource(&r1),
        Ok(AddOutcome::InProgress(_))
    ));
    machine(&h, 1, vec![]);
    assert!(matches!(
        fti.add_resource(&r2),
        Ok(AddOutcome::InProgress(_))
    ));
    let both = vec![
        cm_dev("GPU-a", "u-a", "ADD_COMPLETE", "0"),
        cm_dev("GPU-b", "u-b", "ADD_COMPLETE", "0"),
    ];
    machine(&h, 2, both);
    let AddOutcome::Attached(first) = fti.add_resource(&r1).unwrap() else {
        panic!("r1 not attached")
    };
    assert_eq!(first.device_id, "GPU-a");
    // The provider's record of handing GPU-a to r1 is lost (state evicted).
    h.state
        .borrow_mut()
        .retain(|k, _| !k.starts_with("fti/cm/claim/"));

    let mut req = AddRequest::new(r2.clone());
    req.claims = vec![Claim {
        resource: "r1".into(),
        device_id: Some("GPU-a".into()),
        fabric_device_id: Some("u-a".into()),
    }];
    let AddOutcome::Attached(second) = fti.add(&req).unwrap() else {
        panic!("r2 not attached")
    };
    assert_eq!(second.device_id, "GPU-b");
    assert_eq!(second.machine_id.as_deref(), Some(MACHINE));
}

/// With the machine recorded at attach, a detach needs no Node lookup.
#[test]
fn detach_uses_the_recorded_machine_without_the_node() {
    let h = host();
    let fti = Fti::new(&h);
    machine(&h, 1, vec![cm_dev("GPU-a", "u-a", "ADD_COMPLETE", "0")]);
    let mut r = attached("r1", "gone-node", "GPU-a", "u-a");
    assert!(matches!(
        fti.remove_resource(&r),
        Err(ProviderError::NotFound(_))
    ));
    r.machine_id = Some(MACHINE.into());
    assert!(matches!(
        fti.remove_resource(&r),
        Ok(RemoveOutcome::InProgress(_))
    ));
}

//! The Fabric Manager API.

use fti_provider::{
    AddOutcome, AttachedDevice, DeviceInfo, DeviceType, Fti, HttpError, LogLevel, Method,
    ProviderError, RemoveOutcome,
};
use serde_json::json;

use crate::fake::{FakeHost, json_reply};
use crate::*;

const UPDATE: &str = "fabric_manager/api/v1/machines/9a7c1e2e-0000-4000-8000-000000000001/update";

fn host() -> FakeHost {
    let h = FakeHost::new("FM");
    h.add_node("n1", Some(&format!("fsas-cdi://{MACHINE}")));
    h
}

fn attach_reply(h: &FakeHost, res: serde_json::Value) {
    h.reply_json(Method::Patch, UPDATE, 200, &fm_machine(MACHINE, vec![res]));
}

fn add(h: &FakeHost) -> Result<AddOutcome, ProviderError> {
    Fti::new(h).add_resource(&gpu("r1", "n1"))
}

#[test]
fn attach_sends_the_documented_request_and_returns_serial_and_uuid() {
    let h = host();
    attach_reply(&h, fm_res("GPU-aaa", "uuid-aaa", "gpu", MODEL, "0"));
    assert_eq!(
        add(&h).unwrap(),
        AddOutcome::Attached(AttachedDevice {
            device_id: "GPU-aaa".into(),
            fabric_device_id: "uuid-aaa".into(),
            machine_id: Some(MACHINE.into())
        })
    );
    assert_eq!(
        h.fabric_calls(),
        vec![(Method::Patch, format!("{UPDATE}?tenant_uuid=tenant-1"))]
    );
    assert_eq!(
        h.last_body(Method::Patch),
        json!({"tenants": {"tenant_uuid": "tenant-1", "machines": [{"mach_uuid": MACHINE,
            "resources": [{"res_specs": [{"res_type": "gpu",
                "res_spec": {"condition": [{"column": "model", "operator": "eq", "value": MODEL}]},
                "res_num": 1}]}]}]}})
    );
    let req = h.requests.borrow().last().unwrap().clone();
    assert!(
        req.headers
            .iter()
            .any(|(k, v)| k == "content-type" && v == "application/json")
    );
}

#[test]
fn attach_with_warning_status_succeeds_and_logs() {
    let h = host();
    attach_reply(&h, fm_res("GPU-w", "uuid-w", "gpu", MODEL, "1"));
    assert!(matches!(add(&h), Ok(AddOutcome::Attached(d)) if d.device_id == "GPU-w"));
    assert!(h.logged(LogLevel::Warn, "GPU-w"));
}

#[test]
fn attach_with_critical_unknown_or_empty_status_fails_typed() {
    let h = host();
    attach_reply(&h, fm_res("GPU-c", "uuid-c", "gpu", MODEL, "2"));
    assert!(matches!(add(&h), Err(ProviderError::Critical(m)) if m.contains("GPU-c")));
    for op in ["", "3", "x0", "-"] {
        attach_reply(&h, fm_res("GPU-c", "uuid-c", "gpu", MODEL, op));
        assert!(
            matches!(add(&h), Err(ProviderError::MalformedReply(_))),
            "op {op:?}"
        );
    }
    let mut res = fm_res("GPU-c", "uuid-c", "gpu", MODEL, "0");
    res.as_object_mut().unwrap().remove("res_op_status");
    attach_reply(&h, res);
    assert!(matches!(add(&h), Err(ProviderError::MalformedReply(_))));
    let mut res = fm_res("GPU-c", "uuid-c", "gpu", MODEL, "0");
    res["res_op_status"] = serde_json::Value::Null;
    attach_reply(&h, res);
    assert!(matches!(add(&h), Err(ProviderError::MalformedReply(_))));
}

#[test]
fn attach_reply_not_matching_the_request_is_malformed() {
    let h = host();
    for res in [
        fm_res("GPU-x", "uuid-x", "cxlmemory", MODEL, "0"),
        fm_res("GPU-x", "uuid-x", "gpu", "H100", "0"),
        json!({"res_type": "gpu", "res_op_status": "0", "res_serial_num": "s", "res_uuid": "u"}),
        fm_res("", "uuid-x", "gpu", MODEL, "0"),
        fm_res("GPU-x", "", "gpu", MODEL, "0"),
    ] {
        attach_reply(&h, res.clone());
        assert!(
            matches!(add(&h), Err(ProviderError::MalformedReply(_))),
            "{res}"
        );
    }
    for body in [
        json!({"data": {"machines": []}}),
        json!({"data": {"machines": [{"resources": []}]}}),
        json!({"data": null}),
        json!({}),
        json!([1, 2]),
        json!({"data": {"machines": "nope"}}),
    ] {
        h.reply_json(Method::Patch, UPDATE, 200, &body);
        assert!(
            matches!(add(&h), Err(ProviderError::MalformedReply(_))),
            "{body}"
        );
    }
    h.reply(Method::Patch, UPDATE, json_reply(200, "{\"data\": {"));
    assert!(matches!(add(&h), Err(ProviderError::MalformedReply(_))));
}

#[test]
fn fabric_error_replies_carry_code_and_message() {
    let h = host();
    h.reply(
        Method::Patch,
        UPDATE,
        json_reply(
            409,
            r#"{"status":409,"detail":{"code":"E0001","message":"no free device","data":{}}}"#,
        ),
    );
    assert_eq!(
        add(&h),
        Err(ProviderError::Fabric {
            status: 409,
            code: "E0001".into(),
            message: "no free device".into()
        })
    );
    h.reply(
        Method::Patch,
        UPDATE,
        json_reply(
            500,
            r#"{"status":500,"detail":{"code":"E5000","message":{"reason":"db","retry":true}}}"#,
        ),
    );
    assert_eq!(
        add(&h),
        Err(ProviderError::Fabric {
            status: 500,
            code: "E5000".into(),
            message: r#"{"reason":"db","retry":true}"#.into()
        })
    );
    h.reply(Method::Patch, UPDATE, json_reply(502, "Bad Gateway"));
    assert_eq!(
        add(&h),
        Err(ProviderError::Fabric {
            status: 502,
            code: "".into(),
            message: "Bad Gateway".into()
        })
    );
}

#[test]
fn transport_failures_are_typed() {
    let h = host();
    let cases = [
        (HttpError::Timeout, "Unavailable"),
        (HttpError::Connect("reset".into()), "Unavailable"),
        (HttpError::Tls("bad cert".into()), "Unavailable"),
        (
            HttpError::Denied("no grant for https://evil:1".into()),
            "Denied",
        ),
        (HttpError::TooLarge(1024), "MalformedReply"),
        (HttpError::InvalidRequest("url".into()), "Config"),
        (
            HttpError::Other("connection closed before message completed".into()),
            "Unavailable",
        ),
    ];
    for (err, want) in cases {
        h.reply(Method::Patch, UPDATE, Err(err.clone()));
        let got = add(&h).unwrap_err();
        assert!(format!("{got:?}").starts_with(want), "{err:?} gave {got:?}");
    }
}

#[test]
fn detach_reads_the_machine_then_deletes_by_res_uuid() {
    let h = host();
    h.reply_json(
        Method::Get,
        FM_MACHINE_PATH,
        200,
        &fm_machine(
            MACHINE,
            vec![
                fm_res("GPU-1", "u1", "gpu", MODEL, "0"),
                fm_res("GPU-2", "u2", "gpu", MODEL, "0"),
            ],
        ),
    );
    h.reply(Method::Delete, UPDATE, json_reply(204, ""));
    let out = Fti::new(&h)
        .remove_resource(&attached("r2", "n1", "GPU-2", "u2"))
        .unwrap();
    assert_eq!(out, RemoveOutcome::Removed);
    assert_eq!(
        h.fabric_calls(),
        vec![
            (
                Method::Get,
                format!("{FM_MACHINE_PATH}?tenant_uuid=tenant-1")
            ),
            (Method::Delete, format!("{UPDATE}?tenant_uuid=tenant-1")),
        ]
    );
    assert_eq!(
        h.last_body(Method::Delete),
        json!({"tenants": {"tenant_uuid": "tenant-1", "machines": [{"mach_uuid": MACHINE,
            "resources": [{"res_specs": [{"res_type": "gpu", "res_uuid": "u2", "res_num": 1}]}]}]}})
    );
}

#[test]
fn detach_finds_the_device_by_serial_when_the_fabric_id_is_unknown() {
    let h = host();
    h.reply_json(
        Method::Get,
        FM_MACHINE_PATH,
        200,
        &fm_machine(MACHINE, vec![fm_res("GPU-2", "u2", "gpu", MODEL, "2")]),
    );
    h.reply(Method::Delete, UPDATE, json_reply(200, "{}"));
    let mut r = attached("r2", "n1", "GPU-2", "");
    r.fabric_device_id = None;
    assert_eq!(
        Fti::new(&h).remove_resource(&r).unwrap(),
        RemoveOutcome::Removed
    );
    assert_eq!(
        h.last_body(Method::Delete)["tenants"]["machines"][0]["resources"][0]["res_specs"][0]["res_uuid"],
        "u2"
    );
}

#[test]
fn detach_of_a_device_already_gone_sends_no_delete() {
    let h = host();
    h.reply_json(
        Method::Get,
        FM_MACHINE_PATH,
        200,
        &fm_machine(MACHINE, vec![fm_res("GPU-1", "u1", "gpu", MODEL, "0")]),
    );
    let out = Fti::new(&h)
        .remove_resource(&attached("r2", "n1", "GPU-2", "u2"))
        .unwrap();
    assert_eq!(out, RemoveOutcome::Removed);
    assert_eq!(h.fabric_calls().len(), 1);
    // Nothing recorded: nothing to do, nothing asked.
    let h = host();
    assert_eq!(
        Fti::new(&h).remove_resource(&gpu("r3", "n1")).unwrap(),
        RemoveOutcome::Removed
    );
    assert!(h.requests.borrow().is_empty());
}

#[test]
fn detach_errors_are_typed() {
    let h = host();
    h.reply_json(
        Method::Get,
        FM_MACHINE_PATH,
        200,
        &fm_machine(MACHINE, vec![fm_res("GPU-1", "u1", "gpu", MODEL, "0")]),
    );
    h.reply(
        Method::Delete,
        UPDATE,
        json_reply(
            423,
            r#"{"status":423,"detail":{"code":"E0042","message":"locked"}}"#,
        ),
    );
    assert_eq!(
        Fti::new(&h).remove_resource(&attached("r1", "n1", "GPU-1", "u1")),
        Err(ProviderError::Fabric {
            status: 423,
            code: "E0042".into(),
            message: "locked".into()
        })
    );
    h.reply(
        Method::Get,
        FM_MACHINE_PATH,
        json_reply(404, r#"{"detail":{"code":"E0404","message":"no machine"}}"#),
    );
    assert!(matches!(
        Fti::new(&h).remove_resource(&attached("r1", "n1", "GPU-1", "u1")),
        Err(ProviderError::Fabric { status: 404, .. })
    ));
    h.reply_json(
        Method::Get,
        FM_MACHINE_PATH,
        200,
        &json!({"data": {"machines": []}}),
    );
    assert!(matches!(
        Fti::new(&h).remove_resource(&attached("r1", "n1", "GPU-1", "u1")),
        Err(ProviderError::NotFound(_))
    ));
}

#[test]
fn check_reports_health_by_op_status() {
    let h = host();
    let set = |op: &str| {
        h.reply_json(
            Method::Get,
            FM_MACHINE_PATH,
            200,
            &fm_machine(
                MACHINE,
                vec![
                    fm_res("GPU-0", "u0", "gpu", "H100", "0"),
                    fm_res("GPU-1", "u1", "gpu", MODEL, op),
                ],
            ),
        )
    };
    let check = || Fti::new(&h).check_resource(&attached("r1", "n1", "GPU-1", "u1"));
    set("0");
    assert_eq!(check(), Ok(()));
    set("1");
    assert!(matches!(check(), Err(ProviderError::Warning(m)) if m.contains("GPU-1")));
    set("2");
    assert!(matches!(check(), Err(ProviderError::Critical(m)) if m.contains("GPU-1")));
    set("");
    assert!(matches!(check(), Err(ProviderError::MalformedReply(_))));
    set("7");
    assert!(matches!(check(), Err(ProviderError::MalformedReply(_))));
    // Missing, or present under another model: not found.
    set("0");
    assert!(matches!(
        Fti::new(&h).check_resource(&attached("r9", "n1", "GPU-9", "u9")),
        Err(ProviderError::NotFound(_))
    ));
    assert!(matches!(
        Fti::new(&h).check_resource(&attached("r0", "n1", "GPU-0", "u0")),
        Err(ProviderError::NotFound(_))
    ));
    assert!(matches!(
        Fti::new(&h).check_resource(&gpu("r0", "n1")),
        Err(ProviderError::NotFound(_))
    ));
}

#[test]
fn get_resources_lists_devices_of_every_fabric_node() {
    let h = host();
    let m2 = "22222222-0000-4000-8000-000000000002";
    h.add_node("n2", Some(&format!("fsas-cdi://{m2}")));
    h.add_node("cpu-only", Some("kind://docker/x"));
    h.reply_json(
        Method::Get,
        FM_MACHINE_PATH,
        200,
        &fm_machine(
            MACHINE,
            vec![
                fm_res("GPU-1", "u1", "gpu", MODEL, "0"),
                fm_res("CXL-1", "c1", "cxlmemory", "CMM-D 128G", "1"),
                fm_res("NIC-1", "x1", "nic", "cx7", "0"),
            ],
        ),
    );
    h.reply_json(
        Method::Get,
        &format!("fabric_manager/api/v1/machines/{m2}"),
        200,
        &fm_machine(
            m2,
            vec![
                fm_res("GPU-2", "u2", "gpu", "H100", "2"),
                fm_res("", "u3", "gpu", MODEL, "0"),
            ],
        ),
    );
    let mut got = Fti::new(&h).get_resources().unwrap();
    got.sort_by(|a, b| a.device_id.cmp(&b.device_id));
    let info = |node: &str, machine: &str, t, model: &str, id: &str, fid: &str| DeviceInfo {
        node: node.into(),
        machine_id: machine.into(),
        device_type: t,
        model: model.into(),
        device_id: id.into(),
        fabric_device_id: fid.into(),
    };
    assert_eq!(
        got,
        vec![
            info(
                "n1",
                MACHINE,
                DeviceType::Cxlmemory,
                "CMM-D 128G",
                "CXL-1",
                "c1"
            ),
            info("n1", MACHINE, DeviceType::Gpu, MODEL, "GPU-1", "u1"),
            info("n2", m2, DeviceType::Gpu, "H100", "GPU-2", "u2"),
        ]
    );
    assert!(h.logged(LogLevel::Debug, "cpu-only"));
    assert!(h.logged(LogLevel::Warn, "without serial"));
    // One token for the whole listing.
    assert_eq!(h.token_requests(), 1);
}

#[test]
fn get_resources_propagates_fabric_and_grant_errors() {
    let h = host();
    h.reply(
        Method::Get,
        FM_MACHINE_PATH,
        json_reply(500, r#"{"detail":{"code":"E1","message":"down"}}"#),
    );
    assert!(matches!(
        Fti::new(&h).get_resources(),
        Err(ProviderError::Fabric { status: 500, .. })
    ));
    *h.node_lookup_error.borrow_mut() = Some(fti_provider::LookupError::Denied("nodes".into()));
    assert!(matches!(
        Fti::new(&h).get_resources(),
        Err(ProviderError::Denied(_))
    ));
}

#[test]
fn get_resources_skips_a_machine_the_fabric_does_not_know() {
    let h = host();
    let m2 = "22222222-0000-4000-8000-000000000002";
    h.add_node("n2", Some(&format!("fsas-cdi://{m2}")));
    h.reply_json(
        Method::Get,
        FM_MACHINE_PATH,
        200,
        &fm_machine(MACHINE, vec![fm_res("GPU-1", "u1", "gpu", MODEL, "0")]),
    );
    // n2's machine: 404 in the FTI error shape.
    h.reply(
        Method::Get,
        &format!("fabric_manager/api/v1/machines/{m2}"),
        json_reply(404, r#"{"error":"machine_not_found"}"#),
    );
    let got = Fti::new(&h).get_resources().unwrap();
    assert_eq!(
        got.iter().map(|d| d.device_id.as_str()).collect::<Vec<_>>(),
        ["GPU-1"]
    );
    assert!(h.logged(
        LogLevel::Warn,
        &format!("{} n2", fti_provider::SKIPPED_NODE_LOG_PREFIX)
    ));

    // A machine reply listing no machine is the same as a 404.
    h.reply_json(
        Method::Get,
        &format!("fabric_manager/api/v1/machines/{m2}"),
        200,
        &json!({"data": {"machines": []}}),
    );
    assert_eq!(Fti::new(&h).get_resources().unwrap().len(), 1);
}

#[test]
fn get_resources_still_fails_on_rejected_credentials_and_server_errors() {
    for (status, body) in [
        (401, r#"{"error":"invalid_token"}"#),
        (
            403,
            r#"{"status":403,"detail":{"code":"E0403","message":"tenant"}}"#,
        ),
        (500, r#"{"error":"internal"}"#),
        (503, "Service Unavailable"),
    ] {
        let h = host();
        let m2 = "22222222-0000-4000-8000-000000000002";
        h.add_node("n2", Some(&format!("fsas-cdi://{m2}")));
        h.reply_json(
            Method::Get,
            FM_MACHINE_PATH,
            200,
            &fm_machine(MACHINE, vec![fm_res("GPU-1", "u1", "gpu", MODEL, "0")]),
        );
        h.reply(
            Method::Get,
            &format!("fabric_manager/api/v1/machines/{m2}"),
            json_reply(status, body),
        );
        assert!(
            matches!(
                Fti::new(&h).get_resources(),
                Err(ProviderError::Fabric { status: s, .. }) if s == status
            ),
            "{status}"
        );
    }
}

#[test]
fn vendor_error_bodies_keep_their_code_and_no_free_device_is_no_capacity() {
    let h = host();
    h.reply(
        Method::Patch,
        UPDATE,
        json_reply(400, r#"{"error":"invalid_res_spec"}"#),
    );
    assert!(matches!(
        add(&h),
        Err(ProviderError::Fabric { status: 400, ref code, .. }) if code == "invalid_res_spec"
    ));
    h.reply(
        Method::Patch,
        UPDATE,
        json_reply(409, r#"{"error":"insufficient_resources"}"#),
    );
    assert!(
        matches!(add(&h), Err(ProviderError::NoCapacity(ref m)) if m.contains("insufficient_resources"))
    );
    // A deployment with its own code for it, configured.
    h.set_config("no_capacity_codes", " E7001 , E7002");
    h.reply(
        Method::Patch,
        UPDATE,
        json_reply(
            409,
            r#"{"status":409,"detail":{"code":"E7002","message":"pool empty"}}"#,
        ),
    );
    assert!(matches!(add(&h), Err(ProviderError::NoCapacity(ref m)) if m.contains("pool empty")));
}

//! Property tests: whatever the fabric (or identity manager) replies, every operation
//! returns a success or a typed error, never a panic.

use fti_provider::{Fti, HttpResponse, Method, jwt};
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::fake::{self, FakeHost, TOKEN_PATH};
use crate::*;

const FM_UPDATE: &str =
    "fabric_manager/api/v1/machines/9a7c1e2e-0000-4000-8000-000000000001/update";
const CM_BASE: &str = "cluster_manager/cluster_autoscaler/v3/tenants/tenant-1/clusters/cluster-1/machines/9a7c1e2e-0000-4000-8000-000000000001";

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        // Strings that look like what the fabric sends, plus noise.
        prop_oneof![
            Just("0".to_string()),
            Just("1".to_string()),
            Just("2".to_string()),
            Just(String::new()),
            Just("gpu".to_string()),
            Just(MODEL.to_string()),
            Just("ADD_COMPLETE".to_string()),
            Just("ADD_FAILED".to_string()),
            Just("REMOVE_FAILED".to_string()),
            Just("GPU-1".to_string()),
            Just("spec-a100".to_string()),
            ".*",
        ]
        .prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 8, |inner| {
        let keys = prop_oneof![
            Just("data".to_string()),
            Just("machines".to_string()),
            Just("resources".to_string()),
            Just("res_op_status".to_string()),
            Just("res_type".to_string()),
            Just("res_serial_num".to_string()),
            Just("res_uuid".to_string()),
            Just("res_spec".to_string()),
            Just("condition".to_string()),
            Just("cluster".to_string()),
            Just("machine".to_string()),
            Just("resspecs".to_string()),
            Just("devices".to_string()),
            Just("device_id".to_string()),
            Just("status".to_string()),
            Just("detail".to_string()),
            Just("code".to_string()),
            Just("message".to_string()),
            "[a-z_]{1,8}",
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(keys, inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A body: raw bytes, arbitrary JSON, or arbitrary JSON inside the real envelopes.
fn arb_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        arb_json().prop_map(|v| v.to_string().into_bytes()),
        arb_json().prop_map(|v| json!({"data": {"machines": [{"resources": [v]}]}})
            .to_string()
            .into_bytes()),
        (arb_json(), arb_json()).prop_map(|(s, d)| {
            let mut spec = cm_spec("spec-a100", "gpu", MODEL, 1, vec![d]);
            spec["selector"] = s;
            cm_machine(MACHINE, vec![spec]).to_string().into_bytes()
        }),
        arb_json().prop_map(|d| cm_machine(
            MACHINE,
            vec![cm_spec("spec-a100", "gpu", MODEL, 1, vec![d])]
        )
        .to_string()
        .into_bytes()),
        arb_json().prop_map(
            |v| json!({"status": 409, "detail": {"code": "E1", "message": v}})
                .to_string()
                .into_bytes()
        ),
    ]
}

fn arb_status() -> impl Strategy<Value = u16> {
    prop_oneof![
        Just(200u16),
        Just(204),
        Just(401),
        Just(409),
        Just(500),
        any::<u16>()
    ]
}

fn arb_token_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        arb_body(),
        ".*".prop_map(|t| json!({"access_token": t}).to_string().into_bytes()),
        arb_json().prop_map(|p| json!({"access_token": fake::jwt(&p.to_string())})
            .to_string()
            .into_bytes()),
    ]
}

fn run_all(api: &str, replies: &[(u16, Vec<u8>)], token: Option<(u16, Vec<u8>)>) {
    let h = FakeHost::new(api);
    h.set_config("cluster_id", "cluster-1");
    h.add_openshift_node("n1", MACHINE);
    let paths: [(Method, String); 6] = [
        (Method::Get, FM_MACHINE_PATH.to_string()),
        (Method::Patch, FM_UPDATE.to_string()),
        (Method::Delete, FM_UPDATE.to_string()),
        (Method::Get, CM_BASE.to_string()),
        (Method::Post, format!("{CM_BASE}/actions/resize")),
        (Method::Get, FM_MACHINE_PATH.to_string()),
    ];
    for ((method, path), (status, body)) in paths.iter().zip(replies.iter().cycle()) {
        h.reply(
            *method,
            path,
            Ok(HttpResponse {
                status: *status,
                headers: vec![],
                body: body.clone(),
            }),
        );
    }
    if let Some((status, body)) = token {
        h.reply(
            Method::Post,
            TOKEN_PATH,
            Ok(HttpResponse {
                status,
                headers: vec![],
                body,
            }),
        );
    }
    let fti = Fti::new(&h);
    // Twice each, so CM's second calls see the state the first ones left.
    for _ in 0..2 {
        let _ = fti.add_resource(&gpu("r1", "n1"));
        let _ = fti.remove_resource(&attached("r1", "n1", "GPU-1", "u1"));
        let _ = fti.check_resource(&attached("r1", "n1", "GPU-1", "u1"));
        let _ = fti.get_resources();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn fm_survives_any_fabric_reply(replies in prop::collection::vec((arb_status(), arb_body()), 1..4)) {
        run_all("FM", &replies, None);
    }

    #[test]
    fn cm_survives_any_fabric_reply(replies in prop::collection::vec((arb_status(), arb_body()), 1..4)) {
        run_all("CM", &replies, None);
    }

    #[test]
    fn any_token_reply_is_handled(status in arb_status(), body in arb_token_body(), api in prop_oneof![Just("FM"), Just("CM")]) {
        run_all(api, &[(200, b"{}".to_vec())], Some((status, body)));
    }

    #[test]
    fn jwt_expiry_never_panics(s in ".*") {
        let _ = jwt::expiry(&s);
    }

    #[test]
    fn jwt_expiry_reads_exp_of_any_payload(exp in any::<u64>(), pad in prop::bool::ANY, ws in "[ \t\n]{0,3}") {
        use base64::Engine;
        use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
        let payload = format!(r#"{{"exp":{exp},"sub":"x"}}"#);
        let enc = if pad { URL_SAFE.encode(&payload) } else { URL_SAFE_NO_PAD.encode(&payload) };
        let t = format!("eyJhbGciOiJSUzI1NiJ9.{enc}.c2ln{ws}");
        prop_assert_eq!(jwt::expiry(&t), Ok(exp));
    }
}

#[test]
fn typed_results_for_canned_garbage() {
    // A deterministic spot check that garbage yields errors, not silent success.
    let h = FakeHost::new("FM");
    h.add_node("n1", Some(&format!("fsas-cdi://{MACHINE}")));
    h.reply(
        Method::Patch,
        FM_UPDATE,
        Ok(HttpResponse {
            status: 200,
            headers: vec![],
            body: vec![0xff, 0xfe],
        }),
    );
    assert!(matches!(
        Fti::new(&h).add_resource(&gpu("r1", "n1")),
        Err(fti_provider::ProviderError::MalformedReply(_))
    ));
}

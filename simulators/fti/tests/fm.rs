//! Fabric Manager attach / get / detach over real HTTPS.

mod common;

use common::*;
use fabric_sim::{DeviceStatus, Fault, Route, SimConfig};
use serde_json::json;

#[tokio::test]
async fn attach_get_detach_round_trip() {
    let sim = start(SimConfig::default());
    let existing = sim.attach_directly(M1, "gpu", "H100").unwrap();
    let pool = sim.add_free_devices("gpu", MODEL, 2);
    let api = Api::new(&sim).await;

    let (status, reply) = api.fm_attach(M1, MODEL).await;
    assert_eq!(status, 200, "{reply}");
    let machine = &reply["data"]["machines"][0];
    assert_eq!(machine["mach_uuid"], M1);
    assert_eq!(machine["mach_name"], "worker-1");
    assert_eq!(machine["tenant_uuid"], sim.tenant_id());
    assert_eq!(machine["fabric_uuid"], sim.fabric_uuid());
    let res = resources(&reply);
    assert_eq!(res.len(), 2, "attached device plus the seeded one");
    let attached = &res[0];
    assert_eq!(attached["res_type"], "gpu");
    assert_eq!(attached["res_op_status"], "0");
    assert_eq!(attached["res_spec"]["condition"][0]["column"], "model");
    assert_eq!(attached["res_spec"]["condition"][0]["operator"], "eq");
    assert_eq!(attached["res_spec"]["condition"][0]["value"], MODEL);
    // The pool hands out devices in order, and the serial is GPU-<uuid>.
    assert_eq!(attached["res_serial_num"], pool[0].serial.as_str());
    assert_eq!(attached["res_uuid"], pool[0].res_uuid.as_str());
    assert!(pool[0].serial.starts_with("GPU-"));
    assert_eq!(res[1]["res_uuid"], existing.res_uuid.as_str());
    assert_eq!(sim.free_devices("gpu", MODEL), 1);

    let on_machine = sim.machine_devices(M1);
    assert_eq!(on_machine.len(), 2);
    assert!(
        on_machine
            .iter()
            .all(|d| d.status == DeviceStatus::AddComplete)
    );
    assert_eq!(
        sim.device(&pool[0].serial).unwrap().machine.as_deref(),
        Some(M1)
    );

    let (status, got) = api.fm_get(M1).await;
    assert_eq!(status, 200);
    let serials: Vec<String> = resources(&got)
        .iter()
        .map(|r| r["res_serial_num"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(serials.len(), 2);
    assert!(serials.contains(&pool[0].serial) && serials.contains(&existing.serial));

    let (status, other) = api.fm_get(M2).await;
    assert_eq!(status, 200);
    assert!(resources(&other).is_empty());

    let (status, after) = api.fm_detach(M1, &pool[0].res_uuid).await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(resources(&after).len(), 1);
    assert_eq!(sim.free_devices("gpu", MODEL), 2);
    assert_eq!(sim.machine_devices(M1), vec![existing.clone()]);

    // Detaching again: the device is not on the machine any more.
    let (status, err) = api.fm_detach(M1, &pool[0].res_uuid).await;
    assert_eq!(status, 404);
    assert_eq!(err["status"], 404);
    assert_eq!(err["detail"]["code"], "E0404");

    let routes: Vec<Option<Route>> = sim.requests().iter().map(|r| r.route).collect();
    assert_eq!(
        routes,
        vec![
            Some(Route::Token),
            Some(Route::FmAttach),
            Some(Route::FmGetMachine),
            Some(Route::FmGetMachine),
            Some(Route::FmDetach),
            Some(Route::FmDetach),
        ]
    );
    let attach = &sim.requests_to(Route::FmAttach)[0];
    assert_eq!(attach.method, "PATCH");
    assert_eq!(
        attach.query_param("tenant_uuid").as_deref(),
        Some(sim.tenant_id())
    );
    assert_eq!(attach.bearer(), Some(api.token.as_str()));
    assert_eq!(
        attach.json().unwrap()["tenants"]["machines"][0]["mach_uuid"],
        M1
    );
}

#[tokio::test]
async fn empty_pool_gives_the_no_free_device_error() {
    let sim = start(SimConfig::default());
    let api = Api::new(&sim).await;
    let (status, err) = api.fm_attach(M1, MODEL).await;
    assert_eq!(status, 409);
    assert_eq!(err["status"], 409);
    assert_eq!(err["detail"]["code"], "E0409");
    assert_eq!(
        err["detail"]["message"],
        "no free resource of type gpu, model A100 40G (available: 0)"
    );
    assert_eq!(err["detail"]["data"]["available"], 0);

    // The fault makes a non-empty pool look empty, once.
    sim.add_free_devices("gpu", MODEL, 1);
    sim.inject(Fault::NoFreeDevice.on(Route::FmAttach));
    let (status, err) = api.fm_attach(M1, MODEL).await;
    assert_eq!((status, &err["detail"]["code"]), (409, &json!("E0409")));
    assert_eq!(sim.free_devices("gpu", MODEL), 1);
    let (status, _) = api.fm_attach(M1, MODEL).await;
    assert_eq!(status, 200);
    assert_eq!(sim.free_devices("gpu", MODEL), 0);
}

#[tokio::test]
async fn op_status_of_devices_and_of_the_next_attach() {
    let sim = start(SimConfig::default());
    sim.add_free_devices("gpu", MODEL, 5);
    let api = Api::new(&sim).await;

    for op in ["", "x", "1", "2"] {
        sim.inject(Fault::AttachOpStatus(op.into()));
        let (status, reply) = api.fm_attach(M1, MODEL).await;
        assert_eq!(status, 200);
        let res = resources(&reply);
        assert_eq!(res[0]["res_op_status"], op);
        let serial = res[0]["res_serial_num"].as_str().unwrap();
        assert_eq!(sim.device(serial).unwrap().op_status, op);
    }
    let (_, reply) = api.fm_attach(M1, MODEL).await;
    let serial = resources(&reply)[0]["res_serial_num"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(resources(&reply)[0]["res_op_status"], "0");

    sim.set_op_status(&serial, "2").unwrap();
    let (_, got) = api.fm_get(M1).await;
    let dev = resources(&got)
        .into_iter()
        .find(|r| r["res_serial_num"] == serial.as_str())
        .unwrap();
    assert_eq!(dev["res_op_status"], "2");
    assert!(sim.set_op_status("GPU-nope", "1").is_err());
}

#[tokio::test]
async fn requests_are_checked_against_tenant_machine_and_body() {
    let sim = start(SimConfig::default());
    sim.add_free_devices("gpu", MODEL, 1);
    let api = Api::new(&sim).await;
    let update = fm_update_url(&sim, M1);

    let no_tenant = format!("{}fabric_manager/api/v1/machines/{M1}", sim.endpoint());
    let (status, err) = api.send(reqwest::Method::GET, &no_tenant, None).await;
    assert_eq!((status, &err["detail"]["code"]), (400, &json!("E0400")));

    let other_tenant = format!("{no_tenant}?tenant_uuid=someone-else");
    let (status, err) = api.send(reqwest::Method::GET, &other_tenant, None).await;
    assert_eq!((status, &err["detail"]["code"]), (403, &json!("E0403")));

    let (status, err) = api.fm_get("no-such-machine").await;
    assert_eq!((status, &err["detail"]["code"]), (404, &json!("E0404")));

    let mut wrong_machine = attach_body(&sim, M2, MODEL);
    wrong_machine["tenants"]["machines"][0]["mach_uuid"] = json!(M2);
    let (status, _) = api
        .send(reqwest::Method::PATCH, &update, Some(&wrong_machine))
        .await;
    assert_eq!(status, 400);

    let mut no_model = attach_body(&sim, M1, MODEL);
    no_model["tenants"]["machines"][0]["resources"][0]["res_specs"][0]["res_spec"] =
        json!({"condition": []});
    let (status, _) = api
        .send(reqwest::Method::PATCH, &update, Some(&no_model))
        .await;
    assert_eq!(status, 400);

    let reply = api
        .http
        .patch(&update)
        .bearer_auth(&api.token)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 400);

    let (status, _) = api
        .send(
            reqwest::Method::PUT,
            &update,
            Some(&attach_body(&sim, M1, MODEL)),
        )
        .await;
    assert_eq!(status, 405);
    let (status, _) = api
        .send(
            reqwest::Method::GET,
            &format!("{}no/such/path", sim.endpoint()),
            None,
        )
        .await;
    assert_eq!(status, 404);

    // None of that touched the pool.
    assert_eq!(sim.free_devices("gpu", MODEL), 1);
}

#[tokio::test]
async fn device_detached_behind_the_providers_back_is_gone() {
    let sim = start(SimConfig::default());
    let dev = sim.attach_directly(M2, "gpu", MODEL).unwrap();
    let api = Api::new(&sim).await;
    assert_eq!(resources(&api.fm_get(M2).await.1).len(), 1);

    let gone = sim.detach_directly(&dev.serial).unwrap();
    assert_eq!(gone.res_uuid, dev.res_uuid);
    assert!(resources(&api.fm_get(M2).await.1).is_empty());
    assert_eq!(sim.free_devices("gpu", MODEL), 1);
    assert_eq!(sim.device(&dev.res_uuid).unwrap().machine, None);
    let (status, _) = api.fm_detach(M2, &dev.res_uuid).await;
    assert_eq!(status, 404);
    assert!(sim.detach_directly(&dev.serial).is_err());
}

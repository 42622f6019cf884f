//! Cluster Manager view and asynchronous resize over real HTTPS.

mod common;

use std::time::{Duration, Instant};

use common::*;
use fabric_sim::{DeviceStatus, Fault, Route, SimConfig};
use serde_json::{Value, json};

fn increase(spec: &str, count: u64) -> Value {
    json!({"increase_resource_count": {"spec_uuid": spec, "device_count": count}})
}

fn remove(spec: &str, count: u64, device: &str) -> Value {
    json!({"remove_resources": {"spec_uuid": spec, "device_count": count, "devices": [device]}})
}

fn devices(spec: &Value) -> Vec<Value> {
    spec["devices"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn machine_view_has_resspecs_and_device_details() {
    let sim = start(SimConfig::default());
    let seeded = sim.attach_directly(M1, "gpu", MODEL).unwrap();
    sim.add_free_devices("gpu", "H100", 1);
    let api = Api::new(&sim).await;

    let (status, reply) = api.cm_get(M1).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["data"]["tenant_uuid"], sim.tenant_id());
    let cluster = &reply["data"]["cluster"];
    assert_eq!(cluster["cluster_uuid"], sim.cluster_id());
    assert_eq!(cluster["machine"]["uuid"], M1);
    assert_eq!(cluster["machine"]["name"], "worker-1");
    assert_eq!(cluster["machine"]["resspecs"].as_array().unwrap().len(), 2);

    let spec = resspec(&reply, MODEL);
    assert_eq!(spec["spec_uuid"], sim.spec_uuid("gpu", MODEL));
    assert_eq!(spec["type"], "gpu");
    assert_eq!(spec["selector"]["version"], "1");
    assert_eq!(
        spec["selector"]["expression"]["conditions"][0]["column"],
        "model"
    );
    assert_eq!(
        spec["selector"]["expression"]["conditions"][0]["operator"],
        "eq"
    );
    assert_eq!(spec["min_resspec_count"], 0);
    assert_eq!(spec["max_resspec_count"], 8);
    assert_eq!(spec["device_count"], 1);
    let dev = &devices(&spec)[0];
    assert_eq!(dev["device_id"], seeded.serial.as_str());
    assert_eq!(dev["status"], "ADD_COMPLETE");
    assert_eq!(dev["status_reason"], "");
    let detail = &dev["detail"];
    assert_eq!(detail["res_uuid"], seeded.res_uuid.as_str());
    assert_eq!(detail["res_type"], "gpu");
    assert_eq!(detail["res_op_status"], "0");
    assert_eq!(detail["mach_uuid"], M1);
    assert_eq!(detail["tenant_uuid"], sim.tenant_id());
    assert_eq!(detail["fabric_uuid"], sim.fabric_uuid());
    assert_eq!(detail["resspecs"][0]["model"], MODEL);
    assert_eq!(detail["resspecs"][0]["removable"], true);

    let h100 = resspec(&reply, "H100");
    assert_eq!(h100["device_count"], 0);
    assert!(devices(&h100).is_empty());

    // Tenant and cluster are part of the path.
    let wrong = cm_url(&sim, M1).replace(sim.cluster_id(), "other-cluster");
    let (status, err) = api.send(reqwest::Method::GET, &wrong, None).await;
    assert_eq!((status, &err["detail"]["code"]), (404, &json!("E0404")));
    let (status, _) = api.cm_get("no-such-machine").await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn resize_is_in_progress_until_the_delay_passes() {
    // A long delay makes "in progress" observable however slow the machine is.
    let sim = start(SimConfig::default().with_cm_delay(Duration::from_secs(600)));
    sim.add_free_devices("gpu", MODEL, 2);
    let spec = sim.spec_uuid("gpu", MODEL);
    let api = Api::new(&sim).await;

    let (status, reply) = api.cm_resize(M1, increase(&spec, 1)).await;
    assert_eq!(status, 202, "{reply}");
    let s = resspec(&reply, MODEL);
    assert_eq!(s["device_count"], 1);
    assert_eq!(devices(&s)[0]["status"], "ADD_IN_PROGRESS");
    assert_eq!(reply["data"]["cluster"]["machine"]["status"], "RESIZING");
    assert_eq!(sim.free_devices("gpu", MODEL), 1);

    let (_, reply) = api.cm_get(M1).await;
    assert_eq!(
        devices(&resspec(&reply, MODEL))[0]["status"],
        "ADD_IN_PROGRESS"
    );
    // FM sees the device being added too.
    let (_, fm) = api.fm_get(M1).await;
    assert_eq!(resources(&fm).len(), 1);

    sim.complete_pending();
    let (_, reply) = api.cm_get(M1).await;
    let dev = devices(&resspec(&reply, MODEL))[0].clone();
    assert_eq!(dev["status"], "ADD_COMPLETE");
    assert_eq!(reply["data"]["cluster"]["machine"]["status"], "ACTIVE");
    let device_id = dev["device_id"].as_str().unwrap().to_string();

    let (status, reply) = api.cm_resize(M1, remove(&spec, 0, &device_id)).await;
    assert_eq!(status, 202, "{reply}");
    let s = resspec(&reply, MODEL);
    assert_eq!(s["device_count"], 0);
    assert_eq!(devices(&s)[0]["status"], "REMOVE_IN_PROGRESS");
    assert_eq!(
        sim.machine_devices(M1)[0].status,
        DeviceStatus::RemoveInProgress
    );

    sim.complete_pending();
    let (_, reply) = api.cm_get(M1).await;
    assert!(devices(&resspec(&reply, MODEL)).is_empty());
    assert_eq!(sim.free_devices("gpu", MODEL), 2);
}

#[tokio::test]
async fn resize_completes_by_itself_after_the_configured_delay() {
    let delay = Duration::from_millis(300);
    let sim = start(SimConfig::default().with_cm_delay(delay));
    sim.add_free_devices("gpu", MODEL, 1);
    let spec = sim.spec_uuid("gpu", MODEL);
    let api = Api::new(&sim).await;

    let asked = Instant::now();
    let (status, _) = api.cm_resize(M1, increase(&spec, 1)).await;
    assert_eq!(status, 202);
    let device_id: String = poll(Duration::from_secs(10), || async {
        let (_, reply) = api.cm_get(M1).await;
        let dev = devices(&resspec(&reply, MODEL)).into_iter().next()?;
        (dev["status"] == "ADD_COMPLETE").then(|| dev["device_id"].as_str().unwrap().to_string())
    })
    .await;
    assert!(asked.elapsed() >= delay);
    assert!(device_id.starts_with("GPU-"));

    let asked = Instant::now();
    let (status, _) = api.cm_resize(M1, remove(&spec, 0, &device_id)).await;
    assert_eq!(status, 202);
    poll(Duration::from_secs(10), || async {
        let (_, reply) = api.cm_get(M1).await;
        devices(&resspec(&reply, MODEL)).is_empty().then_some(())
    })
    .await;
    assert!(asked.elapsed() >= delay);
    assert_eq!(sim.free_devices("gpu", MODEL), 1);
}

#[tokio::test]
async fn add_and_remove_failures_carry_their_reason() {
    let sim = start(SimConfig::default().with_cm_delay(Duration::from_secs(600)));
    sim.add_free_devices("gpu", MODEL, 2);
    let spec = sim.spec_uuid("gpu", MODEL);
    let api = Api::new(&sim).await;

    sim.inject(Fault::CmAddFailed {
        reason: "fabric switch port down".into(),
    });
    let (status, _) = api.cm_resize(M1, increase(&spec, 1)).await;
    assert_eq!(status, 202);
    sim.complete_pending();
    let (_, reply) = api.cm_get(M1).await;
    let s = resspec(&reply, MODEL);
    let failed = devices(&s)[0].clone();
    assert_eq!(failed["status"], "ADD_FAILED");
    assert_eq!(failed["status_reason"], "fabric switch port down");
    assert_eq!(s["device_count"], 0, "a failed add is not counted");
    // FM does not list a device that never got attached.
    let (_, fm) = api.fm_get(M1).await;
    assert!(resources(&fm).is_empty());

    // The failed device can be cleaned up (device_count current − 1 is accepted).
    let failed_id = failed["device_id"].as_str().unwrap().to_string();
    let (status, reply) = api.cm_resize(M1, remove(&spec, 0, &failed_id)).await;
    assert_eq!(status, 202, "{reply}");
    sim.complete_pending();
    assert_eq!(sim.free_devices("gpu", MODEL), 2);

    let (status, _) = api.cm_resize(M1, increase(&spec, 1)).await;
    assert_eq!(status, 202);
    sim.complete_pending();
    let (_, reply) = api.cm_get(M1).await;
    let id = devices(&resspec(&reply, MODEL))[0]["device_id"]
        .as_str()
        .unwrap()
        .to_string();
    sim.inject(
        Fault::CmRemoveFailed {
            reason: "device busy".into(),
        }
        .on(Route::CmResize),
    );
    let (status, _) = api.cm_resize(M1, remove(&spec, 0, &id)).await;
    assert_eq!(status, 202);
    sim.complete_pending();
    let (_, reply) = api.cm_get(M1).await;
    let s = resspec(&reply, MODEL);
    assert_eq!(devices(&s)[0]["status"], "REMOVE_FAILED");
    assert_eq!(devices(&s)[0]["status_reason"], "device busy");
    assert_eq!(s["device_count"], 1);
}

#[tokio::test]
async fn resize_requests_are_validated() {
    let sim = start(SimConfig::default().with_cm_delay(Duration::from_secs(600)));
    sim.add_free_devices("gpu", MODEL, 1);
    let spec = sim.spec_uuid("gpu", MODEL);
    let api = Api::new(&sim).await;

    let cases = [
        (increase("no-such-spec", 1), 404, "E0404"),
        (increase(&spec, 0), 400, "E0400"),
        (increase(&spec, 9), 400, "E0400"),
        (increase(&spec, 2), 409, "E0409"),
        (json!({}), 400, "E0400"),
        (remove(&spec, 0, "GPU-unknown"), 404, "E0404"),
    ];
    for (body, status, code) in cases {
        let (got, err) = api.cm_resize(M1, body.clone()).await;
        assert_eq!(
            (got, &err["detail"]["code"]),
            (status, &json!(code)),
            "{body}"
        );
    }
    sim.inject(Fault::NoFreeDevice.on(Route::CmResize));
    let (status, err) = api.cm_resize(M1, increase(&spec, 1)).await;
    assert_eq!((status, &err["detail"]["code"]), (409, &json!("E0409")));

    let (status, reply) = api.cm_resize(M1, increase(&spec, 1)).await;
    assert_eq!(status, 202);
    let id = devices(&resspec(&reply, MODEL))[0]["device_id"]
        .as_str()
        .unwrap()
        .to_string();
    // Removing while the add is still running is a conflict.
    let (status, err) = api.cm_resize(M1, remove(&spec, 0, &id)).await;
    assert_eq!((status, &err["detail"]["code"]), (409, &json!("E0410")));
    sim.complete_pending();
    // A count that does not match the removal is refused.
    let (status, _) = api.cm_resize(M1, remove(&spec, 1, &id)).await;
    assert_eq!(status, 400);
    assert_eq!(sim.machine_devices(M1).len(), 1);
}

#[tokio::test]
async fn op_status_fault_applies_to_cm_adds() {
    let sim = start(SimConfig::default().with_cm_delay(Duration::ZERO));
    sim.add_free_devices("gpu", MODEL, 1);
    let spec = sim.spec_uuid("gpu", MODEL);
    let api = Api::new(&sim).await;
    sim.inject(Fault::AttachOpStatus("1".into()).on(Route::CmResize));
    let (status, _) = api.cm_resize(M1, increase(&spec, 1)).await;
    assert_eq!(status, 202);
    let (_, reply) = api.cm_get(M1).await;
    let dev = &devices(&resspec(&reply, MODEL))[0];
    assert_eq!(dev["status"], "ADD_COMPLETE");
    assert_eq!(dev["detail"]["res_op_status"], "1");
}

//! The NEC CDIM provider component (`providers/nec`) in the cro runtime against the CDIM
//! simulator over real HTTP (docs/nec-provider.md): the Go operator's walk and its
//! asynchronous layout applies, a lost reply, a failed and a rolled-back apply, and the
//! Go environment's spec loading the component.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cdim_sim::{ApplyStatus, CdimSim, Fault, Route, SimConfig};
use cro_runtime::cluster::StaticCluster;
use cro_runtime::{
    AddOutcome, AddRequest, AttachedDevice, CallError, Claim, ComposableResource, DeviceType,
    Provider, ProviderError, ProviderSpec, RemoveOutcome,
};
use serde_json::json;

use crate::{eventually, provider_error};

const MODEL: &str = "NVIDIA-A100-PCIE-40GB";
const SETTLE: Duration = Duration::from_secs(20);

struct Fx {
    sim: CdimSim,
    node: String,
    provider: Provider,
}

/// The component loaded from the spec the Go operator's NEC environment gives (the
/// same function `cro run` uses), seeing Node `worker-2` on a CDIM node.
async fn start(provisional: Option<&str>) -> Fx {
    let sim = CdimSim::start(SimConfig {
        apply_delay: Duration::from_millis(200),
        ..SimConfig::default()
    })
    .unwrap();
    let node = sim.add_node().id;
    let component = cro_test_support::component("nec-provider");
    let mut vars: BTreeMap<&str, String> = BTreeMap::from([
        ("CDI_PROVIDER_TYPE", "NEC".to_string()),
        ("NEC_CDIM_IP", sim.ip()),
        ("LAYOUT_APPLY_PORT", sim.layout_apply_port().to_string()),
        (
            "CONFIGURATION_MANAGER_PORT",
            sim.configuration_manager_port().to_string(),
        ),
        ("CRO_NEC_COMPONENT", component.display().to_string()),
    ]);
    if let Some(p) = provisional {
        vars.insert("NEC_PROVISIONAL_GPU_UUID", p.to_string());
    }
    let spec: ProviderSpec = cro_operator_spec(&vars);
    let cluster = StaticCluster::new();
    cluster
        .insert_object(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "worker-2"}, "spec": {"providerID": node}}))
        .unwrap();
    let runtime = cro_runtime::Runtime::new(cro_runtime::RuntimeOptions::default()).unwrap();
    let provider = runtime.load(&spec, Arc::new(cluster)).await.unwrap();
    Fx {
        sim,
        node,
        provider,
    }
}

/// The spec of the Go environment, as a JSON round trip of what compat builds: the
/// provider-it crate does not link the operator, so the variables are mapped here the
/// way host/operator/src/config/compat.rs maps them (its own tests hold that mapping).
fn cro_operator_spec(vars: &BTreeMap<&str, String>) -> ProviderSpec {
    let http = |port: &str| format!("http://{}:{}", vars["NEC_CDIM_IP"], vars[port]);
    let mut config = json!({
        "configuration_manager_endpoint": http("CONFIGURATION_MANAGER_PORT"),
        "layout_apply_endpoint": http("LAYOUT_APPLY_PORT"),
        "timeout_ms": "30000",
    });
    if let Some(p) = vars.get("NEC_PROVISIONAL_GPU_UUID") {
        config["provisional_gpu_uuid"] = json!(p);
    }
    let spec = json!({
        "name": "nec",
        "component": vars["CRO_NEC_COMPONENT"],
        "config": config,
        "grants": {
            "http": [{"url": http("CONFIGURATION_MANAGER_PORT")}, {"url": http("LAYOUT_APPLY_PORT")}],
            "lookup": [{"api_version": "v1", "kind": "Node"}],
        },
        "limits": {"call_timeout_ms": 20000},
    });
    ProviderSpec::from_json(&spec.to_string(), std::path::Path::new("/")).unwrap()
}

fn gpu(name: &str) -> ComposableResource {
    ComposableResource {
        name: name.into(),
        device_type: DeviceType::Gpu,
        model: MODEL.into(),
        target_node: "worker-2".into(),
        device_id: None,
        fabric_device_id: None,
        machine_id: None,
        force_detach: false,
    }
}

fn request(name: &str, key: &str, claims: Vec<Claim>) -> AddRequest {
    AddRequest {
        resource: gpu(name),
        attempt_key: key.into(),
        size_bytes: None,
        claims,
    }
}

fn held(name: &str, d: &AttachedDevice) -> ComposableResource {
    let mut r = gpu(name);
    r.device_id = Some(d.device_id.clone());
    r.fabric_device_id = Some(d.fabric_device_id.clone());
    r.machine_id = d.machine_id.clone();
    r
}

async fn attach(p: &Provider, req: &AddRequest) -> Result<AttachedDevice, CallError> {
    let end = std::time::Instant::now() + SETTLE;
    loop {
        match p.add(req).await? {
            AddOutcome::Attached(d) => return Ok(d),
            AddOutcome::InProgress(_) => {
                assert!(std::time::Instant::now() < end, "attach still in progress");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn detach(p: &Provider, r: &ComposableResource) {
    eventually(SETTLE, "the detach", || async {
        (p.remove_resource(r).await.unwrap() == RemoveOutcome::Removed).then_some(())
    })
    .await;
}

/// The Go README request's two GPUs on worker-2, through the sandboxed component with
/// the Go environment's provisional UUID: each is its own CDIM GPU, both report the
/// provisional UUID (the documented limitation), one layout apply at a time.
#[tokio::test]
async fn nec_two_gpus_on_worker_2_with_the_provisional_uuid() {
    let fx = start(Some("8f0e1d2c-0000-4000-8000-000000000001")).await;
    for _ in 0..3 {
        fx.sim.add_gpu(MODEL);
    }
    let info = fx.provider.info().expect("contract 0.2.0 describes itself");
    assert_eq!(info.name, "nec");
    let report = fx.provider.capability_report();
    assert!(report.is_clean(), "{report}");

    // Both attaches start together, as the operator starts them: CDIM takes one apply
    // at a time, the other waits.
    let (a, b) = (
        request("gpu-a", "k-a", vec![]),
        request("gpu-b", "k-b", vec![]),
    );
    assert!(matches!(
        fx.provider.add(&a).await,
        Ok(AddOutcome::InProgress(_))
    ));
    assert!(matches!(
        fx.provider.add(&b).await,
        Ok(AddOutcome::InProgress(_))
    ));
    let da = attach(&fx.provider, &a).await.unwrap();
    let claims = vec![Claim {
        resource: "gpu-a".into(),
        device_id: Some(da.device_id.clone()),
        fabric_device_id: Some(da.fabric_device_id.clone()),
    }];
    let db = attach(&fx.provider, &request("gpu-b", "k-b", claims))
        .await
        .unwrap();
    assert_ne!(da.fabric_device_id, db.fabric_device_id);
    assert_eq!(da.device_id, "GPU-8f0e1d2c-0000-4000-8000-000000000001");
    assert_eq!(db.device_id, da.device_id);
    assert_eq!(da.machine_id.as_deref(), Some(fx.node.as_str()));
    assert_eq!(fx.sim.gpus_on(&fx.node).len(), 2);
    let listed = fx.provider.list(&[]).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|d| d.node == "worker-2"));
    fx.provider
        .check_resource(&held("gpu-a", &da))
        .await
        .unwrap();
    detach(&fx.provider, &held("gpu-a", &da)).await;
    detach(&fx.provider, &held("gpu-b", &db)).await;
    assert!(fx.sim.gpus_on(&fx.node).is_empty());
}

/// In the sandbox, where `state` is the host's: a lost reply connects one GPU, a
/// failed and a rolled-back layout apply are fabric errors that leave nothing
/// connected, and each retry connects exactly one.
#[tokio::test]
async fn nec_lost_replies_and_failed_applies_in_the_sandbox() {
    let fx = start(None).await;
    for _ in 0..2 {
        fx.sim.add_gpu(MODEL);
    }
    fx.sim
        .inject(Fault::DropAfterProcessing.on(Route::LayoutApply));
    let req = request("gpu-a", "k-lost", vec![]);
    assert!(matches!(
        provider_error(fx.provider.add(&req).await),
        ProviderError::Unavailable(_)
    ));
    let d = attach(&fx.provider, &req).await.unwrap();
    assert_eq!(fx.sim.gpus_on(&fx.node).len(), 1);
    assert_eq!(d.device_id, d.fabric_device_id);
    detach(&fx.provider, &held("gpu-a", &d)).await;

    for (fault, status) in [
        (
            Fault::ApplyFails("the I/O slot did not power on".into()),
            "FAILED",
        ),
        (Fault::ApplyRollsBack, "CANCELED"),
    ] {
        fx.sim.inject(fault.on(Route::LayoutApply));
        let req = request("gpu-b", &format!("k-{status}"), vec![]);
        match attach(&fx.provider, &req).await {
            Err(CallError::Provider(ProviderError::Fabric(f))) => {
                assert_eq!(f.code, status, "{}", f.message)
            }
            other => panic!("{status}: {other:?}"),
        }
        assert!(fx.sim.gpus_on(&fx.node).is_empty(), "{status}");
        let d = attach(&fx.provider, &req).await.unwrap();
        assert_eq!(fx.sim.gpus_on(&fx.node).len(), 1);
        detach(&fx.provider, &held("gpu-b", &d)).await;
    }
    let statuses: Vec<ApplyStatus> = fx.sim.applies().iter().map(|a| a.status).collect();
    assert!(statuses.contains(&ApplyStatus::Failed) && statuses.contains(&ApplyStatus::Canceled));
}

//! The NEC logic against the CDIM simulator (simulators/cdim) over real HTTP, natively:
//! the SDK's `TestHost` answers the provider's HTTP by forwarding each request to the
//! simulator on loopback, so what is tested here is the provider's protocol and its
//! bookkeeping in `state`; tests/provider-it runs the same component in the sandbox.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use cdim_sim::{CdimSim, Fault, Route, SimConfig};
use cro_provider_sdk::testing::TestHost;
use cro_provider_sdk::{HttpError, HttpRequest, HttpResponse};

use super::*;

const MODEL: &str = "NVIDIA-A100-PCIE-40GB";

/// One request over a fresh connection (the simulator answers with a Content-Length).
fn forward(r: &HttpRequest) -> Result<HttpResponse, HttpError> {
    let rest = r
        .url
        .strip_prefix("http://")
        .ok_or_else(|| HttpError::InvalidRequest(r.url.clone()))?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut s = TcpStream::connect(authority).map_err(|e| HttpError::Connect(e.to_string()))?;
    let timeout = Duration::from_millis(u64::from(r.timeout_ms.unwrap_or(10_000)));
    s.set_read_timeout(Some(timeout))
        .map_err(|e| HttpError::Other(e.to_string()))?;
    let mut head = format!(
        "{} {path} HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\ncontent-length: {}\r\n",
        r.method.as_str(),
        r.body.len()
    );
    for (k, v) in &r.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())
        .and_then(|()| s.write_all(&r.body))
        .map_err(|e| HttpError::Other(e.to_string()))?;
    let mut raw = Vec::new();
    match s.read_to_end(&mut raw) {
        Ok(_) => {}
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            return Err(HttpError::Timeout);
        }
        Err(e) => return Err(HttpError::Other(e.to_string())),
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| HttpError::Other("the connection closed without a reply".into()))?;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| HttpError::Other(format!("no status line in {head:?}")))?;
    Ok(HttpResponse {
        status,
        headers: Vec::new(),
        body: raw[split + 4..].to_vec(),
    })
}

struct Fx {
    sim: CdimSim,
    node: cdim_sim::Node,
}

impl Fx {
    fn start() -> Fx {
        let sim = CdimSim::start(SimConfig {
            apply_delay: Duration::from_millis(150),
            ..SimConfig::default()
        })
        .unwrap();
        let node = sim.add_node();
        Fx { sim, node }
    }

    /// A host that sees Node `w0` on the fixture's CDIM node, and a Node of no CDIM
    /// node.
    fn host(&self) -> TestHost {
        let host = TestHost::new()
            .with_config(
                "configuration_manager_endpoint",
                &self.sim.configuration_manager_url(),
            )
            .with_config("layout_apply_endpoint", &self.sim.layout_apply_url())
            .with_node(
                "w0",
                &format!(
                    r#"{{"metadata": {{"name": "w0"}}, "spec": {{"providerID": "{}"}}}}"#,
                    self.node.id
                ),
            )
            .with_node("cp", r#"{"metadata": {"name": "cp"}, "spec": {}}"#);
        host.on_http(forward);
        host
    }
}

fn gpu(name: &str) -> ComposableResource {
    ComposableResource {
        name: name.into(),
        device_type: DeviceType::Gpu,
        model: MODEL.into(),
        target_node: "w0".into(),
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

fn held(name: &str, d: &cro_provider_sdk::AttachedDevice) -> ComposableResource {
    let mut r = gpu(name);
    r.device_id = Some(d.device_id.clone());
    r.fabric_device_id = Some(d.fabric_device_id.clone());
    r.machine_id = d.machine_id.clone();
    r
}

fn claim(name: &str, d: &cro_provider_sdk::AttachedDevice) -> Claim {
    Claim {
        resource: name.into(),
        device_id: Some(d.device_id.clone()),
        fabric_device_id: Some(d.fabric_device_id.clone()),
    }
}

const SETTLE: Duration = Duration::from_secs(10);

/// Attaches, asking again while in progress; every error is returned.
fn attach<H: Host>(
    p: &Nec<H>,
    req: &AddRequest,
) -> Result<cro_provider_sdk::AttachedDevice, ProviderError> {
    let end = Instant::now() + SETTLE;
    loop {
        match p.add(req)? {
            AddOutcome::Attached(d) => return Ok(d),
            AddOutcome::InProgress(_) => {
                assert!(Instant::now() < end, "still in progress after {SETTLE:?}");
                std::thread::sleep(Duration::from_millis(30));
            }
        }
    }
}

fn detach<H: Host>(p: &Nec<H>, r: &ComposableResource) {
    let end = Instant::now() + SETTLE;
    while p.remove(r).unwrap() != RemoveOutcome::Removed {
        assert!(Instant::now() < end, "detach still in progress");
        std::thread::sleep(Duration::from_millis(30));
    }
}

#[test]
fn attach_check_list_and_detach_as_the_go_client_walks() {
    let fx = Fx::start();
    let other = fx.sim.add_gpu("NVIDIA-H100");
    let gpus: Vec<String> = (0..2).map(|_| fx.sim.add_gpu(MODEL)).collect();
    // A node of no Kubernetes Node: its GPUs are not listed.
    let stranger = fx.sim.add_node();
    let theirs = fx.sim.add_gpu(MODEL);
    fx.sim.connect_directly(&stranger.id, &theirs).unwrap();
    let host = fx.host();
    let p = Nec::new(&host);

    // The first call posts the connect and answers in progress.
    assert!(matches!(
        p.add(&request("a", "k-a", vec![])).unwrap(),
        AddOutcome::InProgress(_)
    ));
    let a = attach(&p, &request("a", "k-a", vec![])).unwrap();
    assert!(gpus.contains(&a.fabric_device_id), "{a:?}");
    assert_ne!(a.fabric_device_id, other);
    assert_eq!(a.device_id, a.fabric_device_id);
    assert_eq!(a.machine_id.as_deref(), Some(fx.node.id.as_str()));
    let on = fx.sim.gpus_on(&fx.node.id);
    assert_eq!(on.len(), 1);
    assert_eq!(on[0].id, a.fabric_device_id);
    let apply = &fx.sim.applies()[0];
    assert_eq!(
        apply.procedures,
        [(
            "connect".to_string(),
            fx.node.io_adapter.clone(),
            a.fabric_device_id.clone()
        )]
    );
    // Nothing left in state once attached.
    assert!(host.state_keys().is_empty(), "{:?}", host.state_keys());

    p.check(&held("a", &a)).unwrap();
    let listed = p.list().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (listed[0].node.as_str(), listed[0].fabric_device_id.as_str()),
        ("w0", a.fabric_device_id.as_str())
    );
    assert_eq!(listed[0].model, MODEL);

    // A second resource gets the other GPU of the model, never the H100.
    let b = attach(&p, &request("b", "k-b", vec![claim("a", &a)])).unwrap();
    assert_ne!(b.fabric_device_id, a.fabric_device_id);
    assert!(gpus.contains(&b.fabric_device_id));
    assert!(matches!(
        p.add(&request("c", "k-c", vec![claim("a", &a), claim("b", &b)])),
        Err(ProviderError::NoCapacity(_))
    ));

    assert!(matches!(
        p.remove(&held("a", &a)).unwrap(),
        RemoveOutcome::InProgress(_)
    ));
    detach(&p, &held("a", &a));
    assert_eq!(fx.sim.gpu(&a.fabric_device_id).unwrap().node, None);
    // Twice: removed, nothing posted.
    let posted = fx.sim.requests_to(Route::LayoutApply).len();
    assert_eq!(p.remove(&held("a", &a)).unwrap(), RemoveOutcome::Removed);
    assert_eq!(fx.sim.requests_to(Route::LayoutApply).len(), posted);
    assert!(matches!(
        p.check(&held("a", &a)),
        Err(ProviderError::NotFound(_))
    ));
    detach(&p, &held("b", &b));
    assert!(fx.sim.gpus_on(&fx.node.id).is_empty());
}

#[test]
fn a_lost_reply_connects_one_gpu_and_a_lost_record_adopts_it() {
    let fx = Fx::start();
    for _ in 0..3 {
        fx.sim.add_gpu(MODEL);
    }
    let host = fx.host();
    let p = Nec::new(&host);
    // CDIM starts the apply, the reply never comes.
    fx.sim
        .inject(Fault::DropAfterProcessing.on(Route::LayoutApply));
    assert!(matches!(
        p.add(&request("a", "k-a", vec![])),
        Err(ProviderError::Unavailable(_))
    ));
    let a = attach(&p, &request("a", "k-a", vec![])).unwrap();
    assert_eq!(fx.sim.gpus_on(&fx.node.id).len(), 1);
    // The retry while the lost apply ran was refused (one apply at a time), not a
    // second connect.
    assert_eq!(
        fx.sim
            .applies()
            .iter()
            .filter(|a| a.status == cdim_sim::ApplyStatus::Completed)
            .count(),
        1
    );

    // Again, and the operator restarts (its state is lost) before the retry: the GPU
    // connected for nobody is adopted, the claimed one is not.
    fx.sim
        .inject(Fault::DropAfterProcessing.on(Route::LayoutApply));
    assert!(p.add(&request("b", "k-b", vec![claim("a", &a)])).is_err());
    let end = Instant::now() + SETTLE;
    while fx.sim.gpus_on(&fx.node.id).len() < 2 {
        assert!(Instant::now() < end, "the lost apply never ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    let restarted = fx.host();
    let p2 = Nec::new(&restarted);
    let b = attach(&p2, &request("b", "k-b", vec![claim("a", &a)])).unwrap();
    assert_ne!(b.fabric_device_id, a.fabric_device_id);
    assert_eq!(fx.sim.gpus_on(&fx.node.id).len(), 2);
    assert!(
        restarted
            .logs()
            .iter()
            .any(|(_, m)| m.contains("held by no resource"))
    );
}

#[test]
fn failed_and_rolled_back_applies_are_errors_and_the_retry_connects_one() {
    let fx = Fx::start();
    for _ in 0..2 {
        fx.sim.add_gpu(MODEL);
    }
    let host = fx.host();
    let p = Nec::new(&host);
    for (fault, status) in [
        (
            Fault::ApplyFails("the I/O slot did not power on".into()),
            "FAILED",
        ),
        (Fault::ApplyRollsBack, "CANCELED"),
    ] {
        fx.sim.inject(fault.on(Route::LayoutApply));
        let req = request("a", &format!("k-{status}"), vec![]);
        match attach(&p, &req) {
            Err(ProviderError::Fabric { code, message, .. }) => {
                assert_eq!(code, status, "{message}");
                assert!(message.contains("layout apply"), "{message}");
            }
            other => panic!("{status}: expected the apply's failure, got {other:?}"),
        }
        assert!(fx.sim.gpus_on(&fx.node.id).is_empty(), "{status}");
        let d = attach(&p, &req).unwrap();
        assert_eq!(fx.sim.gpus_on(&fx.node.id).len(), 1);
        detach(&p, &held("a", &d));
    }
}

#[test]
fn one_apply_at_a_time_means_wait_and_a_detach_waits_for_its_attach() {
    let fx = Fx::start();
    fx.sim.set_apply_delay(Duration::from_millis(400));
    for _ in 0..2 {
        fx.sim.add_gpu(MODEL);
    }
    let host = fx.host();
    let p = Nec::new(&host);
    assert!(matches!(
        p.add(&request("a", "k-a", vec![])).unwrap(),
        AddOutcome::InProgress(_)
    ));
    // CDIM answers 409 E40010: in progress, as the Go client's "already running".
    match p.add(&request("b", "k-b", vec![])).unwrap() {
        AddOutcome::InProgress(why) => assert!(why.contains("another layout apply"), "{why}"),
        other => panic!("{other:?}"),
    }
    // The resource being attached is deleted: its detach waits for the connect.
    match p.remove(&gpu("a")).unwrap() {
        RemoveOutcome::InProgress(why) => assert!(why.contains("still connecting"), "{why}"),
        other => panic!("{other:?}"),
    }
    let b = attach(&p, &request("b", "k-b", vec![])).unwrap();
    detach(&p, &gpu("a"));
    assert_eq!(
        fx.sim
            .gpus_on(&fx.node.id)
            .into_iter()
            .map(|g| g.id)
            .collect::<Vec<_>>(),
        std::slice::from_ref(&b.fabric_device_id)
    );
}

#[test]
fn health_maps_to_check_and_the_provisional_uuid_is_every_gpus() {
    let fx = Fx::start();
    let g = fx.sim.add_gpu(MODEL);
    let host = fx.host().with_config(
        "provisional_gpu_uuid",
        "8f0e0000-0000-0000-0000-000000000001",
    );
    let p = Nec::new(&host);
    let a = attach(&p, &request("a", "k-a", vec![])).unwrap();
    assert_eq!(a.device_id, "GPU-8f0e0000-0000-0000-0000-000000000001");
    assert_eq!(a.fabric_device_id, g);
    // A free GPU the refusal below could have connected.
    fx.sim.add_gpu(MODEL);
    // A second GPU on the node would report the same id, so the host could not tell it
    // from the first: refused before anything is connected.
    let refused = p.add(&request("b", "k-b", vec![claim("a", &a)]));
    assert!(
        matches!(&refused, Err(ProviderError::NoCapacity(m)) if m.contains("one GPU per node")),
        "{refused:?}"
    );
    let listed = p.list().unwrap();
    assert_eq!(listed.len(), 1, "nothing more was connected: {listed:?}");
    assert_eq!(listed[0].device_id, a.device_id);

    let r = held("a", &a);
    fx.sim.set_health(&g, "Warning").unwrap();
    assert!(matches!(p.check(&r), Err(ProviderError::Warning(_))));
    fx.sim.set_health(&g, "Critical").unwrap();
    assert!(matches!(p.check(&r), Err(ProviderError::Critical(_))));
    fx.sim.set_health(&g, "OK").unwrap();
    fx.sim.set_state(&g, "Disabled").unwrap();
    assert!(matches!(p.check(&r), Err(ProviderError::Warning(_))));
    fx.sim.set_state(&g, "Enabled").unwrap();
    fx.sim.set_detected(&g, false).unwrap();
    assert!(matches!(p.check(&r), Err(ProviderError::NotFound(_))));
    fx.sim.set_detected(&g, true).unwrap();
    p.check(&r).unwrap();

    // Typed failures: a 5xx, a cut body, no connection.
    fx.sim
        .inject(Fault::error(503, "E00503", "busy").on(Route::Resource));
    assert!(matches!(
        p.check(&r),
        Err(ProviderError::Fabric { status: 503, ref code, .. }) if code == "E00503"
    ));
    fx.sim.inject(Fault::MalformedJson.on(Route::Resource));
    assert!(matches!(p.check(&r), Err(ProviderError::MalformedReply(_))));
    fx.sim.inject(Fault::Drop.on(Route::Resource));
    assert!(matches!(p.check(&r), Err(ProviderError::Unavailable(_))));
}

#[test]
fn cxl_memory_and_unknown_nodes_are_refused_with_their_reason() {
    let fx = Fx::start();
    fx.sim.add_gpu(MODEL);
    let host = fx.host();
    let p = Nec::new(&host);
    let mut cxl = request("m", "k-m", vec![]);
    cxl.resource.device_type = DeviceType::Cxlmemory;
    assert!(matches!(p.add(&cxl), Err(ProviderError::Config(m)) if m.contains("GPUs only")));
    let mut nowhere = request("n", "k-n", vec![]);
    nowhere.resource.machine_id = Some("no-such-node".into());
    assert!(matches!(p.add(&nowhere), Err(ProviderError::NotFound(_))));
    let mut bare = request("c", "k-c", vec![]);
    bare.resource.target_node = "cp".into();
    assert!(matches!(p.add(&bare), Err(ProviderError::Config(_))));
    assert!(fx.sim.applies().is_empty());
}

#[test]
fn describe_declares_what_the_provider_uses() {
    let i = info();
    assert_eq!(
        (i.name.as_str(), i.vendor.as_str()),
        ("nec", "NEC CDI Manager (CDIM)")
    );
    assert_eq!(i.devices.len(), 1);
    assert!(i.capabilities.secret_keys.is_empty());
    assert_eq!(i.capabilities.lookup, [LookupKind::new("v1", "Node")]);
    for key in ["configuration_manager_endpoint", "layout_apply_endpoint"] {
        assert!(
            i.config.iter().any(|k| k.name == key && k.required),
            "{key}"
        );
    }
    // Every request of a run goes to one of the two declared services' API.
    let fx = Fx::start();
    fx.sim.add_gpu(MODEL);
    let host = fx.host();
    let p = Nec::new(&host);
    let a = attach(&p, &request("a", "k", vec![])).unwrap();
    p.list().unwrap();
    detach(&p, &held("a", &a));
    let cm = format!("{}/cdim/api/v1/", fx.sim.configuration_manager_url());
    let la = format!("{}/cdim/api/v1/layout-apply", fx.sim.layout_apply_url());
    assert!(
        host.requests()
            .iter()
            .all(|r| r.url.starts_with(&cm) || r.url.starts_with(&la)),
        "{:?}",
        host.requests().iter().map(|r| &r.url).collect::<Vec<_>>()
    );
}

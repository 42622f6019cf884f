//! What a provider call costs: a fresh instance plus an empty call (the testkit
//! component), and the FTI provider's operations as the WebAssembly component in the
//! runtime beside the same library linked natively, both against the fabric simulator
//! on loopback; plus calls per second at 1, 4 and 16 concurrent calls.
//!
//! `cargo bench -p cro-runtime --bench provider_call` (criterion; see docs/BENCHMARKS.md).
//! `CRO_BENCH_QUICK=1` shortens every measurement (used by scripts/bench.sh).
//!
//! The native side is [`NativeHost`]: the FTI library's `Host` trait over reqwest and
//! in-memory config, secrets and nodes, self-contained in this file so it can follow the
//! trait wherever it moves.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use cro_runtime::cluster::StaticCluster;
use cro_runtime::{
    AddRequest, ComposableResource, DeviceType, Provider, ProviderSpec, Runtime, RuntimeOptions,
};
use fabric_sim::{FabricSim, SimConfig};
use fti_provider::host::{
    Host, HttpError, HttpRequest, HttpResponse, LogLevel, LookupError, Method, SecretError,
};
use serde_json::json;

const MODEL: &str = "A100 40G";
const SECRET_NS: &str = "composable-resource-operator-system";
const SECRET_NAME: &str = "credentials";
const NODE: &str = "worker-0";
const MACHINE: &str = "6b3c2a10-8f1e-4c1d-9a2b-0c1d2e3f4a5b";

/// The FTI library's host, natively: HTTP through reqwest on a tokio runtime, the rest
/// from maps. Calls run on a thread outside the runtime (they block on it).
struct NativeHost {
    http: reqwest::Client,
    rt: tokio::runtime::Handle,
    config: HashMap<String, String>,
    secrets: HashMap<String, String>,
    nodes: HashMap<String, String>,
    state: Mutex<HashMap<String, Vec<u8>>>,
}

impl Host for NativeHost {
    fn http_send(&self, r: HttpRequest) -> Result<HttpResponse, HttpError> {
        let method = match r.method {
            Method::Get => reqwest::Method::GET,
            Method::Head => reqwest::Method::HEAD,
            Method::Post => reqwest::Method::POST,
            Method::Put => reqwest::Method::PUT,
            Method::Patch => reqwest::Method::PATCH,
            Method::Delete => reqwest::Method::DELETE,
        };
        let mut b = self.http.request(method, &r.url).body(r.body);
        for (k, v) in &r.headers {
            b = b.header(k, v);
        }
        if let Some(ms) = r.timeout_ms {
            b = b.timeout(Duration::from_millis(u64::from(ms)));
        }
        self.rt.block_on(async move {
            let resp = b
                .send()
                .await
                .map_err(|e| HttpError::Connect(e.to_string()))?;
            let status = resp.status().as_u16();
            let headers = resp
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
                .collect();
            let body = resp
                .bytes()
                .await
                .map_err(|e| HttpError::Other(e.to_string()))?
                .to_vec();
            Ok(HttpResponse {
                status,
                headers,
                body,
            })
        })
    }
    fn secret_get(&self, key: &str) -> Result<String, SecretError> {
        self.secrets
            .get(key)
            .cloned()
            .ok_or_else(|| SecretError::NotFound(key.into()))
    }
    fn get_node(&self, name: &str) -> Result<String, LookupError> {
        self.nodes
            .get(name)
            .cloned()
            .ok_or_else(|| LookupError::NotFound(name.into()))
    }
    fn list_nodes(&self) -> Result<Vec<String>, LookupError> {
        Ok(self.nodes.values().cloned().collect())
    }
    fn get_object(
        &self,
        _: &str,
        kind: &str,
        _: Option<&str>,
        name: &str,
    ) -> Result<String, LookupError> {
        Err(LookupError::NotFound(format!("{kind} {name}")))
    }
    fn config_get(&self, key: &str) -> Option<String> {
        self.config.get(key).cloned()
    }
    fn log(&self, _: LogLevel, _: &str) {}
    fn state_get(&self, key: &str) -> Option<Vec<u8>> {
        self.state.lock().unwrap().get(key).cloned()
    }
    fn state_set(&self, key: &str, value: &[u8], _: Option<u64>) -> bool {
        self.state.lock().unwrap().insert(key.into(), value.into());
        true
    }
    fn state_remove(&self, key: &str) {
        self.state.lock().unwrap().remove(key);
    }
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

fn gpu(name: &str) -> ComposableResource {
    ComposableResource {
        name: name.into(),
        device_type: DeviceType::Gpu,
        model: MODEL.into(),
        target_node: NODE.into(),
        device_id: None,
        fabric_device_id: None,
        machine_id: None,
        force_detach: false,
    }
}

fn native_gpu(r: &ComposableResource) -> fti_provider::ComposableResource {
    fti_provider::ComposableResource {
        name: r.name.clone(),
        device_type: fti_provider::DeviceType::Gpu,
        model: r.model.clone(),
        target_node: r.target_node.clone(),
        device_id: r.device_id.clone(),
        fabric_device_id: r.fabric_device_id.clone(),
        machine_id: r.machine_id.clone(),
        force_detach: r.force_detach,
    }
}

/// The simulator, the FTI component loaded against it, and the same logic natively.
struct Fti {
    _sim: FabricSim,
    wasm: Provider,
    native: Arc<fti_provider::Fti<NativeHost>>,
    /// A GPU attached to NODE (ids filled), for check.
    attached: ComposableResource,
    /// The component's spec and cluster (the Python example is loaded with them).
    spec: ProviderSpec,
    cluster: Arc<StaticCluster>,
}

fn quick() -> bool {
    std::env::var_os("CRO_BENCH_QUICK").is_some()
}

fn fti(rt: &tokio::runtime::Runtime, runtime: &Runtime) -> Fti {
    let _enter = rt.enter();
    let sim = FabricSim::start(SimConfig::default()).expect("fabric simulator");
    sim.add_machine(MACHINE, NODE);
    sim.add_free_devices("gpu", MODEL, 4096);
    let secrets = sim_secrets(&sim);
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
        "spec": {"providerID": format!("fsas-cdi://{MACHINE}")}});
    let config =
        json!({"api_type": "FM", "endpoint": sim.endpoint(), "tenant_id": sim.tenant_id()});
    let spec = fti_spec(&sim, &config);
    let cluster = StaticCluster::new().with_secret(
        SECRET_NS,
        SECRET_NAME,
        secrets.iter().map(|(k, v)| (k.as_str(), v.clone())),
    );
    cluster.insert_object(node.clone()).expect("node");
    let cluster = Arc::new(cluster);
    let wasm = rt
        .block_on(runtime.load(&spec, cluster.clone()))
        .expect("FTI component");
    let native = native_fti(rt, &sim, &config, secrets, &node);
    let attached = attach_held(rt, &wasm);
    Fti {
        _sim: sim,
        wasm,
        native: Arc::new(native),
        attached,
        spec,
        cluster,
    }
}

/// The credentials the simulator accepts, as the Secret holds them.
fn sim_secrets(sim: &FabricSim) -> HashMap<String, String> {
    let creds = sim.credentials();
    [
        ("username", creds.username.clone()),
        ("password", creds.password.clone()),
        ("client_id", creds.client_id.clone()),
        ("client_secret", creds.client_secret.clone()),
        ("realm", sim.realm().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// The FTI component's spec against the simulator.
fn fti_spec(sim: &FabricSim, config: &serde_json::Value) -> ProviderSpec {
    let spec = json!({
        "name": "fti",
        "component": cro_test_support::component("fti-provider"),
        "config": config,
        "grants": {
            "http": [{"url": format!("https://{}", sim.https_addr()), "ca_pem": sim.ca_pem()}],
            "secret": {"namespace": SECRET_NS, "name": SECRET_NAME,
                "keys": ["username", "password", "client_id", "client_secret", "realm"]},
            "lookup": [{"api_version": "v1", "kind": "Node"}],
            "wasi": {"clocks": true},
        },
        // The per-provider rate of cluster reads is a throttle (50/s by default): left on,
        // a tight loop of calls that each look up the node would measure that setting,
        // not the sandbox. The per-call read budget stays as it is.
        "limits": {"cluster_reads_per_second": cro_runtime::Limits::MAX_CLUSTER_READS_PER_SECOND},
    });
    ProviderSpec::from_json(&spec.to_string(), std::path::Path::new("/")).expect("spec")
}

/// The FTI library over [`NativeHost`], with the same configuration, credentials and
/// node as the component.
fn native_fti(
    rt: &tokio::runtime::Runtime,
    sim: &FabricSim,
    config: &serde_json::Value,
    secrets: HashMap<String, String>,
    node: &serde_json::Value,
) -> fti_provider::Fti<NativeHost> {
    let ca = reqwest::Certificate::from_pem(sim.ca_pem().as_bytes()).expect("CA");
    let http = reqwest::Client::builder()
        .add_root_certificate(ca)
        .build()
        .expect("HTTP client");
    fti_provider::Fti::new(NativeHost {
        http,
        rt: rt.handle().clone(),
        config: config
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
            .collect(),
        secrets,
        nodes: HashMap::from([(NODE.to_owned(), node.to_string())]),
        state: Mutex::default(),
    })
}

/// Attaches the GPU `check` measures, through the component.
fn attach_held(rt: &tokio::runtime::Runtime, wasm: &Provider) -> ComposableResource {
    match rt
        .block_on(wasm.add(&AddRequest::new(gpu("held"))))
        .expect("attach")
    {
        // As the operator records it: later calls name the machine, no node lookup.
        cro_runtime::AddOutcome::Attached(d) => ComposableResource {
            device_id: Some(d.device_id),
            fabric_device_id: Some(d.fabric_device_id),
            machine_id: d.machine_id,
            ..gpu("held")
        },
        other => panic!("attach did not finish: {other:?}"),
    }
}

/// The Python example component (CPython inside), loaded against `f`'s simulator and
/// cluster when it has been built (`build_python_example` in scripts/setup.sh; the
/// bench does not build it: that takes minutes). Its own runtime: CPython needs more
/// core instances, memories and tables per slot than the default pool gives.
fn python(rt: &tokio::runtime::Runtime, f: &Fti) -> Option<Provider> {
    let path = cro_test_support::workspace_root().join("target/wasm/python/python_example.wasm");
    if !path.exists() {
        eprintln!("python example not built ({}): skipped", path.display());
        return None;
    }
    let runtime = Runtime::new(RuntimeOptions {
        max_instances: 4,
        max_core_instances_per_component: 32,
        max_memories_per_component: 8,
        max_tables_per_component: 8,
        ..RuntimeOptions::default()
    })
    .expect("runtime");
    let mut spec = f.spec.clone();
    spec.name = "python-fti".into();
    spec.component = path;
    spec.limits.memory_bytes = 128 << 20;
    spec.limits.call_timeout_ms = 20_000;
    Some(
        rt.block_on(runtime.load(&spec, f.cluster.clone()))
            .expect("Python component"),
    )
}

fn benches(c: &mut Criterion) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    let runtime = Runtime::new(RuntimeOptions::default()).expect("runtime");
    fresh_instance(c, &rt, &runtime);
    wasmtime_alone(c, &rt, &runtime);
    let f = fti(&rt, &runtime);
    fti_calls(c, &rt, &f);
    no_io_calls(c, &rt, &f);
    concurrent_calls(c, &rt, &f);
}

/// Fresh instance + empty call: the testkit's check in its "fake" mode does nothing.
fn fresh_instance(c: &mut Criterion, rt: &tokio::runtime::Runtime, runtime: &Runtime) {
    let mut spec = ProviderSpec::new("testkit", cro_test_support::component("cro-testkit"));
    spec.config.insert("mode".into(), "fake".into());
    let testkit = rt
        .block_on(runtime.load(&spec, Arc::new(StaticCluster::new())))
        .expect("testkit");
    let empty = gpu("empty");
    c.bench_function("instance/fresh_instance_empty_call", |b| {
        b.iter(|| rt.block_on(testkit.check_resource(&empty)))
    });
}

/// The same components instantiated by wasmtime alone in cro's own engine (its pool,
/// reset-in-place settings and epoch ticking), and a minimal component, so the report
/// can say what of a fresh instance is cro's (the call's gate, store and deadline) and
/// what is wasmtime's for a component of this shape (its imports and the core instances
/// around its module). Each instance is made in a new store and dropped with it, as a
/// call's is. The imports are defined as trapping functions: what instantiation costs
/// per import is the same whatever the function does.
fn wasmtime_alone(c: &mut Criterion, rt: &tokio::runtime::Runtime, runtime: &Runtime) {
    use wasmtime::component::{Component, Linker};
    let engine = runtime.wasmtime_engine();
    let file = |name: &str| {
        Component::from_file(engine, cro_test_support::component(name)).expect("component")
    };
    let minimal = Component::new(engine, MINIMAL_COMPONENT).expect("minimal component");
    let components = [
        ("testkit", file("cro-testkit")),
        ("fti", file("fti-provider")),
        ("minimal", minimal),
    ];
    for (name, component) in &components {
        let mut linker = Linker::<()>::new(engine);
        linker
            .define_unknown_imports_as_traps(component)
            .expect("imports");
        let pre = linker.instantiate_pre(component).expect("pre-instantiate");
        c.bench_function(&format!("instance/wasmtime_alone/{name}"), |b| {
            b.iter(|| {
                rt.block_on(async {
                    let mut store = wasmtime::Store::new(engine, ());
                    // The engine interrupts guests at each epoch: a store without a
                    // deadline would stop the components' start functions at once. The
                    // deadline is added to the current epoch, so not u64::MAX.
                    store.set_epoch_deadline(1 << 40);
                    pre.instantiate_async(&mut store).await.expect("instance");
                })
            })
        });
    }
}

/// One core module with one function, lifted as the component's only export.
const MINIMAL_COMPONENT: &str = r#"(component
  (core module $m (func (export "run")))
  (core instance $i (instantiate $m))
  (func (export "run") (canon lift (core func $i "run"))))"#;

/// The FTI operations, component beside library.
fn fti_calls(c: &mut Criterion, rt: &tokio::runtime::Runtime, f: &Fti) {
    let mut g = c.benchmark_group("fti");
    g.bench_function("get_resources/wasm", |b| {
        b.iter(|| rt.block_on(f.wasm.list(&[])).expect("list"))
    });
    g.bench_function("get_resources/native", |b| {
        b.iter(|| f.native.get_resources().expect("list"))
    });
    let held = f.attached.clone();
    g.bench_function("check_resource/wasm", |b| {
        b.iter(|| rt.block_on(f.wasm.check_resource(&held)).expect("check"))
    });
    let native_held = native_gpu(&held);
    g.bench_function("check_resource/native", |b| {
        b.iter(|| f.native.check_resource(&native_held).expect("check"))
    });
    // add then remove, so every iteration finds a free device and leaves none attached.
    g.bench_function("add_remove/wasm", |b| {
        b.iter(|| {
            let added = rt.block_on(f.wasm.add(&AddRequest::new(gpu("b"))));
            let d = match added.expect("add") {
                cro_runtime::AddOutcome::Attached(d) => d,
                other => panic!("{other:?}"),
            };
            let r = ComposableResource {
                device_id: Some(d.device_id),
                fabric_device_id: Some(d.fabric_device_id),
                ..gpu("b")
            };
            rt.block_on(f.wasm.remove_resource(&r)).expect("remove")
        })
    });
    g.bench_function("add_remove/native", |b| {
        b.iter(|| {
            let d = match f.native.add_resource(&native_gpu(&gpu("b"))).expect("add") {
                fti_provider::AddOutcome::Attached(d) => d,
                other => panic!("{other:?}"),
            };
            let r = fti_provider::ComposableResource {
                device_id: Some(d.device_id),
                fabric_device_id: Some(d.fabric_device_id),
                ..native_gpu(&gpu("b"))
            };
            f.native.remove_resource(&r).expect("remove")
        })
    });
    g.finish();
}

/// A call that reaches no fabric (remove of a resource without a device): instantiate
/// plus the provider's own code, for the FTI component and the Python example.
fn no_io_calls(c: &mut Criterion, rt: &tokio::runtime::Runtime, f: &Fti) {
    let nothing = ComposableResource {
        device_id: None,
        fabric_device_id: None,
        ..f.attached.clone()
    };
    let mut g = c.benchmark_group("no_io_call");
    g.bench_function("fti", |b| {
        b.iter(|| {
            rt.block_on(f.wasm.remove_resource(&nothing))
                .expect("remove")
        })
    });
    let py = python(rt, f);
    if let Some(py) = &py {
        g.bench_function("python", |b| {
            b.iter(|| rt.block_on(py.remove_resource(&nothing)).expect("remove"))
        });
    }
    g.finish();
    if let Some(py) = &py {
        let held = f.attached.clone();
        let mut g = c.benchmark_group("check_resource");
        g.bench_function("python", |b| {
            b.iter(|| rt.block_on(py.check_resource(&held)).expect("check"))
        });
        g.finish();
    }
}

/// Calls per second with k calls in flight (criterion's throughput is per element:
/// one element = one call). Each of the k callers makes `iters` calls back to back,
/// so neither side pays a thread or task start per call: k tasks on the runtime for
/// the component, k threads for the library (which blocks).
fn concurrent_calls(c: &mut Criterion, rt: &tokio::runtime::Runtime, f: &Fti) {
    let mut g = c.benchmark_group("fti_concurrent_get_resources");
    for k in [1usize, 4, 16] {
        g.throughput(Throughput::Elements(k as u64));
        g.bench_with_input(BenchmarkId::new("wasm", k), &k, |b, &k| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                rt.block_on(futures::future::join_all((0..k).map(|_| async {
                    for _ in 0..iters {
                        f.wasm.list(&[]).await.expect("list");
                    }
                })));
                start.elapsed()
            })
        });
        g.bench_with_input(BenchmarkId::new("native", k), &k, |b, &k| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                std::thread::scope(|s| {
                    for _ in 0..k {
                        s.spawn(|| {
                            for _ in 0..iters {
                                f.native.get_resources().expect("list");
                            }
                        });
                    }
                });
                start.elapsed()
            })
        });
    }
    g.finish();
}

fn config() -> Criterion {
    let c = Criterion::default();
    if quick() {
        c.sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1))
    } else {
        c
    }
}

criterion_group! { name = provider_call; config = config(); targets = benches }
criterion_main!(provider_call);

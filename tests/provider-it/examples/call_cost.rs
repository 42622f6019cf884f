//! What a provider call and a provider load cost, for the Rust (FTI and Redfish) and the
//! Python example components:
//! `cargo run --release -p provider-it --example call_cost [CALLS]`.
//!
//! - load: compiling the component (no cache, as with `CRO_COMPONENT_CACHE=off`), a
//!   first load through an empty on-disk cache (compile + store), and a load in a fresh
//!   runtime from that cache (the warm case);
//! - call: the median (and p90) of CALLS calls (default 50), each on a fresh instance
//!   as the runtime always does: `remove_resource` of a resource without a device id
//!   (instantiate + call, no I/O) and `check_resource` of an attached device
//!   (instantiate + call + one request to the simulator: HTTPS for FTI and Python, plain
//!   HTTP to the Redfish simulator);
//! - instantiate only, with wasmtime used directly, under several engine settings
//!   (pooling or on-demand allocation, copy-on-write memory images on or off, memory
//!   kept resident between instances), to show what each setting buys.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cro_runtime::cluster::StaticCluster;
use cro_runtime::{
    AddOutcome, AddRequest, ComponentCache, ComposableResource, Provider, ProviderSpec, Runtime,
    RuntimeOptions,
};
use provider_it::redfish::{GPU_MODEL, RedfishFixture};
use provider_it::{Api, Fixture, MODEL, python};

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

async fn load_times(name: &str, component: &Path, options: RuntimeOptions) {
    let spec = ProviderSpec::new("cost", component);
    let dir = std::env::temp_dir().join(format!("cro-call-cost-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let load = |cache: Option<ComponentCache>| {
        let runtime = Runtime::new(RuntimeOptions {
            component_cache: cache,
            ..options.clone()
        });
        let spec = spec.clone();
        async move {
            let runtime = runtime.expect("runtime");
            let start = Instant::now();
            runtime
                .load(&spec, Arc::new(StaticCluster::new()))
                .await
                .expect("load");
            start.elapsed()
        }
    };
    let plain = load(None).await;
    let cache = ComponentCache::new(&dir, 4 << 30);
    let first = load(Some(cache.clone())).await;
    let cached = load(Some(cache.clone())).await;
    let size = std::fs::metadata(component).map(|m| m.len()).unwrap_or(0);
    println!(
        "{name}: component {:.1} MB; load without cache {}, first load (compile + store) {}, \
         load from the cache {} ({:?})",
        size as f64 / 1e6,
        ms(plain),
        ms(first),
        ms(cached),
        cache.stats()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

async fn call_times(name: &str, provider: &Provider, attached: &ComposableResource, n: usize) {
    let nothing = ComposableResource {
        device_id: None,
        fabric_device_id: None,
        ..attached.clone()
    };
    let mut bare = Vec::with_capacity(n);
    let mut check = Vec::with_capacity(n);
    // One warm-up call each (first-touch page faults of the pool slot).
    provider.remove_resource(&nothing).await.expect("remove");
    provider.check_resource(attached).await.expect("check");
    for _ in 0..n {
        let t = Instant::now();
        provider.remove_resource(&nothing).await.expect("remove");
        bare.push(t.elapsed());
        let t = Instant::now();
        provider.check_resource(attached).await.expect("check");
        check.push(t.elapsed());
    }
    let stat = |v: &mut Vec<Duration>| {
        v.sort();
        (v[v.len() / 2], v[v.len() * 9 / 10])
    };
    let (b50, b90) = stat(&mut bare);
    let (c50, c90) = stat(&mut check);
    println!(
        "{name}: {n} calls, fresh instance each: instantiate + call (no I/O) median {} p90 {}; \
         check (one GET) median {} p90 {}",
        ms(b50),
        ms(b90),
        ms(c50),
        ms(c90)
    );
}

fn with_ids(mut r: ComposableResource, outcome: AddOutcome) -> ComposableResource {
    match outcome {
        AddOutcome::Attached(d) => {
            r.device_id = Some(d.device_id);
            r.fabric_device_id = Some(d.fabric_device_id);
            r
        }
        other => panic!("not attached: {other:?}"),
    }
}

/// Median time to instantiate (no call) `bytes` under one engine setting. Imports are
/// defined as traps: instantiation calls none of them.
async fn instantiate_median(
    label: &str,
    bytes: &[u8],
    pooling: bool,
    cow: bool,
    keep_resident: usize,
    n: usize,
) {
    use wasmtime::component::{Component, Linker};
    use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .wasm_gc(false)
        .gc_support(false)
        .memory_init_cow(cow)
        .memory_reservation(256 << 20);
    if pooling {
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(4)
            .total_core_instances(128)
            .total_memories(32)
            .total_tables(32)
            .max_core_instances_per_component(32)
            .max_memories_per_component(8)
            .max_tables_per_component(8)
            .max_memories_per_module(8)
            .max_tables_per_module(8)
            .total_stacks(4)
            .max_memory_size(256 << 20)
            .linear_memory_keep_resident(keep_resident)
            .table_keep_resident(keep_resident.min(1 << 20));
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    let engine = Engine::new(&config).expect("engine");
    let component = Component::new(&engine, bytes).expect("compile");
    let mut linker: Linker<()> = Linker::new(&engine);
    linker
        .define_unknown_imports_as_traps(&component)
        .expect("trap imports");
    let pre = linker.instantiate_pre(&component).expect("instantiate_pre");
    let mut times = Vec::with_capacity(n);
    for _ in 0..=n {
        let mut store = Store::new(&engine, ());
        let t = Instant::now();
        pre.instantiate(&mut store).expect("instantiate");
        times.push(t.elapsed());
        drop(store);
    }
    times.remove(0);
    times.sort();
    println!(
        "  {label}: instantiate median {} p90 {}",
        ms(times[times.len() / 2]),
        ms(times[times.len() * 9 / 10])
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(50);
    let fti = cro_test_support::component("fti-provider");
    let redfish = cro_test_support::component("cro-provider-redfish");
    let py = python::python_component();

    load_times("fti (Rust)", &fti, RuntimeOptions::default()).await;
    load_times("redfish (Rust)", &redfish, RuntimeOptions::default()).await;
    load_times("python-example", &py, python::python_options()).await;

    let fx = Fixture::builder(Api::Fm).start().await;
    fx.sim.add_free_devices("gpu", MODEL, 1);
    fx.add_provider_id_node("worker-0");
    let gpu = fx.gpu("gpu-cost", "worker-0");
    let gpu = with_ids(
        gpu.clone(),
        fx.provider
            .add(&AddRequest::new(gpu.clone()))
            .await
            .expect("add"),
    );
    call_times("fti (Rust)", &fx.provider, &gpu, n).await;

    let rx = RedfishFixture::start().await;
    rx.add_node("worker-0");
    rx.sim.add_gpu_block(GPU_MODEL);
    let gpu = rx.gpu("gpu-cost", "worker-0");
    let gpu = with_ids(
        gpu.clone(),
        rx.provider
            .add(&rx.request(&gpu, "cost", &[]))
            .await
            .expect("add"),
    );
    call_times("redfish (Rust)", &rx.provider, &gpu, n).await;

    let px = python::start(&[]).await;
    px.sim.add_free_devices("gpu", MODEL, 1);
    px.add_node("worker-0", "0b1c2d3e-0000-4000-8000-0000000cost1");
    let gpu = px.gpu("gpu-cost", "worker-0");
    let gpu = with_ids(
        gpu.clone(),
        px.provider
            .add(&AddRequest::new(gpu.clone()))
            .await
            .expect("add"),
    );
    call_times("python-example", &px.provider, &gpu, n).await;

    for (name, path) in [
        ("fti (Rust)", &fti),
        ("redfish (Rust)", &redfish),
        ("python-example", &py),
    ] {
        let bytes = std::fs::read(path).expect("read component");
        println!("{name}: instantiate only, by engine setting ({n} instances each):");
        instantiate_median(
            "pooling + copy-on-write images (cro's setting)",
            &bytes,
            true,
            true,
            0,
            n,
        )
        .await;
        instantiate_median("pooling, copy-on-write off", &bytes, true, false, 0, n).await;
        instantiate_median(
            "pooling + CoW, 64 MiB kept resident per slot",
            &bytes,
            true,
            true,
            64 << 20,
            n,
        )
        .await;
        instantiate_median("on-demand allocation + CoW", &bytes, false, true, 0, n).await;
    }
}

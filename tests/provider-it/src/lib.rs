//! A fixture for running the FTI provider component (built from `providers/fti`) in the
//! cro runtime against the fabric simulator, over HTTPS on loopback.
//!
//! Two builds of FTI can be loaded ([`Build`]): the contract 0.3.0 component (the
//! default) and the 0.1.0 fixture `providers/test-components/fti-v0-1-0`. `CRO_FTI_CONTRACT=0.1.0` makes
//! every fixture load the 0.1.0 build, so the whole suite proves old components still
//! work (scripts/test.sh runs it both ways).
//!
//! ```no_run
//! # async fn demo() {
//! use cro_runtime::AddRequest;
//! use provider_it::{Api, Fixture};
//! let fx = Fixture::builder(Api::Fm).start().await;
//! fx.sim.add_free_devices("gpu", provider_it::MODEL, 1);
//! let machine = fx.add_provider_id_node("worker-0");
//! let outcome = fx.provider.add(&AddRequest::new(fx.gpu("gpu-1", "worker-0"))).await;
//! # }
//! ```

pub mod python;
pub mod redfish;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use cro_runtime::cluster::StaticCluster;
use cro_runtime::{
    ComposableResource, DeviceType, Provider, ProviderSpec, Runtime, RuntimeOptions, WallClock,
};
use fabric_sim::{FabricSim, SimConfig};
use serde_json::{Value, json};

/// The model every fixture seeds.
pub const MODEL: &str = "A100 40G";
/// Where the Go operator kept its credentials; the grant names the same Secret.
pub const SECRET_NAMESPACE: &str = "composable-resource-operator-system";
pub const SECRET_NAME: &str = "credentials";
pub const MACHINE_API_NAMESPACE: &str = "openshift-machine-api";

/// Which FTI API the provider is configured for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Fm,
    Cm,
}

/// A frozen wall clock that only moves when told, shared by the simulator (token `exp`)
/// and the runtime (the guest's WASI clock and state TTLs).
#[derive(Clone)]
pub struct TestClock {
    base: SystemTime,
    offset_secs: Arc<AtomicU64>,
}

impl Default for TestClock {
    fn default() -> Self {
        let secs = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(1_700_000_000);
        TestClock {
            base: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
            offset_secs: Arc::default(),
        }
    }
}

impl TestClock {
    pub fn now(&self) -> SystemTime {
        self.base + Duration::from_secs(self.offset_secs.load(Ordering::SeqCst))
    }

    pub fn advance(&self, by: Duration) {
        self.offset_secs.fetch_add(by.as_secs(), Ordering::SeqCst);
    }

    pub fn closure(&self) -> WallClock {
        let this = self.clone();
        Arc::new(move || this.now())
    }
}

/// The runtime of tests that leave the clock alone: the component is compiled once per
/// process, not once per test.
pub(crate) fn shared_runtime() -> Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME
        .get_or_init(|| match Runtime::new(RuntimeOptions::default()) {
            Ok(r) => r,
            Err(e) => panic!("cannot start the runtime: {e}"),
        })
        .clone()
}

/// A build of the FTI provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    /// `providers/fti`: the SDK's contract (0.3.0).
    Current,
    /// `providers/test-components/fti-v0-1-0`: the same logic in the 0.1.0 world.
    V0_1,
}

impl Build {
    pub fn package(self) -> &'static str {
        match self {
            Build::Current => "fti-provider",
            Build::V0_1 => "fti-v0-1-0",
        }
    }

    /// `CRO_FTI_CONTRACT=0.1.0` selects the 0.1.0 build; `0.3.0` (or nothing) the
    /// current one.
    pub fn from_env() -> Build {
        match std::env::var("CRO_FTI_CONTRACT").as_deref() {
            Ok("0.1.0") => Build::V0_1,
            Ok("0.3.0") | Err(_) => Build::Current,
            Ok(other) => panic!("CRO_FTI_CONTRACT must be 0.1.0 or 0.3.0, not {other:?}"),
        }
    }
}

/// The component of the build `CRO_FTI_CONTRACT` selects, built once per process.
pub fn component_bytes() -> Arc<Vec<u8>> {
    component_bytes_of(Build::from_env())
}

/// A build's component, built once per process.
///
/// The 0.1.0 fixture depends on `fti-provider` without its `component` feature, and
/// cargo builds a dependency's `cdylib` too: building the fixture overwrites
/// `fti_provider.wasm` with a component that exports nothing. So both builds are built
/// and read under one lock, and tests that need a file use [`component_file_of`].
pub fn component_bytes_of(build: Build) -> Arc<Vec<u8>> {
    static BYTES: [OnceLock<Arc<Vec<u8>>>; 2] = [OnceLock::new(), OnceLock::new()];
    static BUILDING: Mutex<()> = Mutex::new(());
    let slot = match build {
        Build::Current => &BYTES[0],
        Build::V0_1 => &BYTES[1],
    };
    let _building = BUILDING.lock().unwrap_or_else(|p| p.into_inner());
    slot.get_or_init(|| {
        let path = cro_test_support::component(build.package());
        match std::fs::read(&path) {
            Ok(b) => Arc::new(b),
            Err(e) => panic!("cannot read {}: {e}", path.display()),
        }
    })
    .clone()
}

/// A build's component as a file of this process's own (for tools that take a path,
/// such as the conformance suite): a copy of [`component_bytes_of`], which another
/// build cannot overwrite.
pub fn component_file_of(build: Build) -> PathBuf {
    static FILES: [OnceLock<PathBuf>; 2] = [OnceLock::new(), OnceLock::new()];
    let slot = match build {
        Build::Current => &FILES[0],
        Build::V0_1 => &FILES[1],
    };
    slot.get_or_init(|| {
        let path = std::env::temp_dir().join(format!(
            "cro-provider-it-{}-{}.wasm",
            std::process::id(),
            build.package()
        ));
        if let Err(e) = std::fs::write(&path, component_bytes_of(build).as_slice()) {
            panic!("cannot write {}: {e}", path.display());
        }
        path
    })
    .clone()
}

pub struct FixtureBuilder {
    api: Api,
    build: Build,
    clock: Option<TestClock>,
    sim_config: SimConfig,
    config: Vec<(String, String)>,
    /// Overrides the HTTP grants (default: the simulator's HTTPS endpoint with its CA).
    http_grants: Option<Value>,
    plain_http_endpoint: bool,
}

impl FixtureBuilder {
    /// Gives the simulator and the runtime a shared, movable clock (and a runtime of
    /// their own, since the clock is a runtime option).
    pub fn with_clock(mut self, clock: TestClock) -> Self {
        self.clock = Some(clock);
        self
    }

    pub fn with_sim_config(mut self, f: impl FnOnce(SimConfig) -> SimConfig) -> Self {
        self.sim_config = f(self.sim_config);
        self
    }

    /// Loads this build of FTI (default: [`Build::from_env`]).
    pub fn with_build(mut self, build: Build) -> Self {
        self.build = build;
        self
    }

    /// Sets (or overrides) a provider config key.
    pub fn with_config(mut self, key: &str, value: &str) -> Self {
        self.config.push((key.into(), value.into()));
        self
    }

    pub fn with_http_grants(mut self, grants: Value) -> Self {
        self.http_grants = Some(grants);
        self
    }

    /// Configures the simulator's plain-HTTP endpoint (the grant stays on HTTPS).
    pub fn with_plain_http_endpoint(mut self) -> Self {
        self.plain_http_endpoint = true;
        self
    }

    pub async fn start(self) -> Fixture {
        let mut sim_config = self.sim_config;
        if let Some(clock) = &self.clock {
            sim_config = sim_config.with_clock(clock.closure());
        }
        let sim = match FabricSim::start(sim_config) {
            Ok(s) => s,
            Err(e) => panic!("cannot start the simulator: {e}"),
        };
        let mut config = json!({
            "api_type": match self.api { Api::Fm => "FM", Api::Cm => "CM" },
            "endpoint": if self.plain_http_endpoint { sim.http_endpoint() } else { sim.endpoint() },
            "tenant_id": sim.tenant_id(),
        });
        if self.api == Api::Cm {
            config["cluster_id"] = sim.cluster_id().into();
        }
        for (k, v) in self.config {
            config[k] = v.into();
        }
        let http = self.http_grants.unwrap_or_else(
            || json!([{"url": format!("https://{}", sim.https_addr()), "ca_pem": sim.ca_pem()}]),
        );
        let spec_json = json!({
            "name": "fti",
            "component": cro_test_support::component(self.build.package()),
            "config": config,
            "grants": {
                "http": http,
                "secret": {"namespace": SECRET_NAMESPACE, "name": SECRET_NAME,
                    "keys": ["username", "password", "client_id", "client_secret", "realm"]},
                "lookup": [
                    {"api_version": "v1", "kind": "Node"},
                    {"api_version": "machine.openshift.io/v1beta1", "kind": "Machine"},
                    {"api_version": "metal3.io/v1alpha1", "kind": "BareMetalHost"},
                ],
                "wasi": {"clocks": true},
            },
            "limits": {"call_timeout_ms": 20000},
        });
        let spec = match ProviderSpec::from_json(&spec_json.to_string(), std::path::Path::new("/"))
        {
            Ok(s) => s,
            Err(e) => panic!("provider spec refused: {e}"),
        };

        let cluster =
            StaticCluster::new().with_secret(SECRET_NAMESPACE, SECRET_NAME, sim.secret_data());
        let runtime = match &self.clock {
            None => shared_runtime(),
            Some(clock) => match Runtime::new(RuntimeOptions {
                wall_clock: Some(clock.closure()),
                ..RuntimeOptions::default()
            }) {
                Ok(r) => r,
                Err(e) => panic!("cannot start the runtime: {e}"),
            },
        };
        let provider = match runtime
            .load_bytes(
                &spec,
                component_bytes_of(self.build).to_vec(),
                Arc::new(cluster.clone()),
            )
            .await
        {
            Ok(p) => p,
            Err(e) => panic!("cannot load the FTI component: {e}"),
        };
        Fixture {
            sim,
            cluster,
            provider,
            runtime,
            spec,
            api: self.api,
            build: self.build,
        }
    }
}

/// A simulator, a cluster and the FTI provider loaded against them.
pub struct Fixture {
    pub sim: FabricSim,
    pub cluster: StaticCluster,
    pub provider: Provider,
    pub runtime: Runtime,
    pub spec: ProviderSpec,
    pub api: Api,
    /// Which build of FTI `provider` is.
    pub build: Build,
}

impl Fixture {
    pub fn builder(api: Api) -> FixtureBuilder {
        FixtureBuilder {
            api,
            build: Build::from_env(),
            clock: None,
            sim_config: SimConfig::default(),
            config: Vec::new(),
            http_grants: None,
            plain_http_endpoint: false,
        }
    }

    /// A fresh machine uuid, registered with the simulator.
    pub fn add_machine(&self, name: &str) -> String {
        let uuid = uuid_like(name);
        self.sim.add_machine(&uuid, name);
        uuid
    }

    /// A Node whose `spec.providerID` is `fsas-cdi://<machine>`; returns the machine.
    pub fn add_provider_id_node(&self, node: &str) -> String {
        let machine = self.add_machine(node);
        self.insert(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node},
            "spec": {"providerID": format!("fsas-cdi://{machine}")},
        }));
        machine
    }

    /// A Node linked to its machine through an OpenShift Machine and a Metal3
    /// BareMetalHost; returns the machine.
    pub fn add_openshift_node(&self, node: &str) -> String {
        let machine = self.add_machine(node);
        let (m, bmh) = (format!("{node}-machine"), format!("{node}-bmh"));
        self.insert(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "annotations": {
                "machine.openshift.io/machine": format!("{MACHINE_API_NAMESPACE}/{m}")}},
        }));
        self.insert(json!({
            "apiVersion": "machine.openshift.io/v1beta1", "kind": "Machine",
            "metadata": {"name": m, "namespace": MACHINE_API_NAMESPACE, "annotations": {
                "metal3.io/BareMetalHost": format!("{MACHINE_API_NAMESPACE}/{bmh}")}},
        }));
        self.insert(json!({
            "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
            "metadata": {"name": bmh, "namespace": MACHINE_API_NAMESPACE, "annotations": {
                "cluster-manager.cdi.io/machine": machine}},
        }));
        machine
    }

    /// A Node whose `spec.providerID` names a machine the simulator does not know;
    /// returns that machine.
    pub fn add_node_of_unknown_machine(&self, node: &str) -> String {
        let machine = uuid_like(node);
        self.insert(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node},
            "spec": {"providerID": format!("fsas-cdi://{machine}")},
        }));
        machine
    }

    /// A Node that is not a fabric machine.
    pub fn add_plain_node(&self, node: &str) {
        self.insert(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node},
            "spec": {"providerID": format!("kind://docker/{node}")},
        }));
    }

    fn insert(&self, object: Value) {
        if let Err(e) = self.cluster.insert_object(object) {
            panic!("cannot add object: {e}");
        }
    }

    /// Loads the other build of FTI with the same spec, cluster and runtime.
    pub async fn load_build(&self, build: Build) -> Provider {
        let mut spec = self.spec.clone();
        spec.name = format!("fti-{}", build.package());
        match self
            .runtime
            .load_bytes(
                &spec,
                component_bytes_of(build).to_vec(),
                Arc::new(self.cluster.clone()),
            )
            .await
        {
            Ok(p) => p,
            Err(e) => panic!("cannot load {}: {e}", build.package()),
        }
    }

    pub fn gpu(&self, name: &str, node: &str) -> ComposableResource {
        ComposableResource {
            name: name.into(),
            device_type: DeviceType::Gpu,
            model: MODEL.into(),
            target_node: node.into(),
            device_id: None,
            fabric_device_id: None,
            machine_id: None,
            force_detach: false,
        }
    }
}

/// A uuid-shaped machine id derived from a name, unique within a simulator.
fn uuid_like(name: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(1);
    let n = N.fetch_add(1, Ordering::SeqCst);
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        h >> 32,
        (h >> 16) & 0xffff,
        h & 0xfff,
        n & 0xfff,
        n
    )
}

//! The shared engine and the loading of providers.

use std::collections::HashMap;
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::Semaphore;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::bindings::{ProviderWorld, ProviderWorldPre};
use crate::cluster::ClusterReader;
use crate::gate::Gate;
use crate::grants::{GrantError, ProviderSpec};
use crate::host::http::HttpEgress;
use crate::host::state::StateStore;
use crate::host::{CallCtx, ProviderShared};
use crate::inspect::{self, ComponentInfo, InspectError, SUPPORTED_VERSIONS};
use crate::provider::{Provider, ProviderInner};

/// The wall clock the runtime uses for state TTLs and (when granted) the guest's
/// `wasi:clocks/wall-clock`. Tests inject one to drive token expiry.
pub type WallClock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// Engine-wide settings.
#[derive(Clone)]
pub struct RuntimeOptions {
    /// Instances alive at once across all providers (the pooling allocator's size). Calls
    /// beyond it wait for a slot.
    pub max_instances: u32,
    /// The largest `limits.memory_bytes` a provider may be given (each pool slot reserves
    /// this much address space).
    pub max_memory_bytes: u64,
    /// How often the epoch advances: the granularity of deadlines for guest code and of
    /// yielding to other tasks.
    pub epoch_tick: Duration,
    /// Bytes of each call's stdout and stderr kept (the tail).
    pub guest_output_bytes: usize,
    /// The wall clock; `None` is the system clock.
    pub wall_clock: Option<WallClock>,
}

impl Default for RuntimeOptions {
    /// Sized for a small operator (2 cores, a few GiB): 64 instances of up to 256 MiB.
    fn default() -> RuntimeOptions {
        RuntimeOptions {
            max_instances: 64,
            max_memory_bytes: 256 << 20,
            epoch_tick: Duration::from_millis(10),
            guest_output_bytes: 16 << 10,
            wall_clock: None,
        }
    }
}

impl fmt::Debug for RuntimeOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RuntimeOptions")
            .field("max_instances", &self.max_instances)
            .field("max_memory_bytes", &self.max_memory_bytes)
            .field("epoch_tick", &self.epoch_tick)
            .field("guest_output_bytes", &self.guest_output_bytes)
            .field("wall_clock", &self.wall_clock.as_ref().map(|_| "injected"))
            .finish()
    }
}

/// Why a provider could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read component {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Spec(#[from] GrantError),
    #[error(transparent)]
    Component(#[from] InspectError),
    /// The component exports no `cro:provider/provider` interface at all.
    #[error(
        "the component is not a cro provider: it does not export {interface}@{supported} \
         (it exports: {exports}); it was built for another world",
        interface = inspect::PROVIDER_INTERFACE,
        supported = SUPPORTED_VERSIONS.join(", "),
        exports = if exports.is_empty() { "nothing".to_string() } else { exports.join(", ") }
    )]
    WrongWorld { exports: Vec<String> },
    /// The component targets a contract version this host does not serve.
    #[error(
        "the component targets cro:provider@{found}; this host supports {}",
        SUPPORTED_VERSIONS.join(", ")
    )]
    UnsupportedVersion { found: String },
    /// The component imports something the host does not provide.
    #[error(
        "the component imports what this host does not provide: {}; {detail}",
        if imports.is_empty() { "(see detail)".to_string() } else { imports.join(", ") }
    )]
    UnsatisfiedImports {
        imports: Vec<String>,
        detail: String,
    },
    /// The provider interface is there but its types differ from the contract.
    #[error("the component's provider interface does not match the contract: {0}")]
    Incompatible(String),
    #[error("provider limits: {0}")]
    Limits(String),
    #[error("provider HTTP client: {0}")]
    Http(String),
    #[error("runtime: {0}")]
    Engine(String),
}

/// Distinct binaries kept compiled for reuse.
const MAX_CACHED_COMPONENTS: usize = 16;

/// A compiled component with its inspection.
#[derive(Clone)]
struct Compiled {
    bytes: Arc<[u8]>,
    component: Component,
    info: Arc<ComponentInfo>,
}

pub(crate) struct RuntimeInner {
    pub(crate) engine: Engine,
    linker: Linker<CallCtx>,
    pub(crate) options: RuntimeOptions,
    pub(crate) clock: WallClock,
    /// One permit per pool slot, so calls wait instead of failing when the pool is busy.
    pub(crate) slots: Arc<Semaphore>,
    compiled: Mutex<HashMap<u64, Vec<Compiled>>>,
}

/// The provider host: one engine, one linker, compiled components. Cheap to clone.
///
/// The epoch ticker is a plain thread, not a tokio task: a guest spinning on a
/// current-thread runtime would starve a task, and its deadline would never come.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<RuntimeInner>,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

fn engine(options: &RuntimeOptions) -> Result<Engine, LoadError> {
    let memory = usize::try_from(options.max_memory_bytes)
        .map_err(|_| LoadError::Engine("max_memory_bytes does not fit this platform".into()))?;
    let n = options.max_instances.max(1);
    let mut pool = PoolingAllocationConfig::new();
    // Rust components have one memory and a handful of core instances and tables (main
    // module plus the shims that wire up indirect lowering); leave headroom.
    pool.total_component_instances(n)
        .total_core_instances(n.saturating_mul(8))
        .total_memories(n.saturating_mul(2))
        .total_tables(n.saturating_mul(4))
        .total_stacks(n)
        .max_memory_size(memory);
    let mut config = inspect::base_config();
    config
        .epoch_interruption(true)
        .memory_reservation(options.max_memory_bytes)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&config).map_err(|e| LoadError::Engine(inspect::error_chain(&e)))
}

fn start_ticker(engine: &Engine, tick: Duration) -> Result<(), LoadError> {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("cro-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(tick);
            }
        })
        .map(|_| ())
        .map_err(|e| LoadError::Engine(format!("cannot start the epoch thread: {e}")))
}

impl Runtime {
    pub fn new(options: RuntimeOptions) -> Result<Runtime, LoadError> {
        if options.epoch_tick.is_zero() {
            return Err(LoadError::Engine("epoch_tick must be positive".into()));
        }
        let engine = engine(&options)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| LoadError::Engine(inspect::error_chain(&e)))?;
        ProviderWorld::add_to_linker::<CallCtx, HasSelf<CallCtx>>(&mut linker, |c| c)
            .map_err(|e| LoadError::Engine(inspect::error_chain(&e)))?;
        start_ticker(&engine, options.epoch_tick)?;
        let clock = options
            .wall_clock
            .clone()
            .unwrap_or_else(|| Arc::new(SystemTime::now));
        Ok(Runtime {
            inner: Arc::new(RuntimeInner {
                slots: Arc::new(Semaphore::new(options.max_instances.max(1) as usize)),
                engine,
                linker,
                options,
                clock,
                compiled: Mutex::new(HashMap::new()),
            }),
        })
    }

    pub fn options(&self) -> &RuntimeOptions {
        &self.inner.options
    }

    /// Describes a component (world, contract version, imports, exports).
    pub fn inspect(&self, bytes: &[u8]) -> Result<ComponentInfo, InspectError> {
        Ok(self.compile(bytes)?.info.as_ref().clone())
    }

    /// Loads `spec.component` and makes a provider of it.
    pub async fn load(
        &self,
        spec: &ProviderSpec,
        cluster: Arc<dyn ClusterReader>,
    ) -> Result<Provider, LoadError> {
        let bytes = tokio::fs::read(&spec.component)
            .await
            .map_err(|source| LoadError::Read {
                path: spec.component.clone(),
                source,
            })?;
        self.load_bytes(spec, bytes, cluster).await
    }

    /// Like [`Runtime::load`] with the component's bytes given (`spec.component` unused).
    pub async fn load_bytes(
        &self,
        spec: &ProviderSpec,
        bytes: Vec<u8>,
        cluster: Arc<dyn ClusterReader>,
    ) -> Result<Provider, LoadError> {
        spec.validate()?;
        if spec.limits.memory_bytes > self.inner.options.max_memory_bytes {
            return Err(LoadError::Limits(format!(
                "memory_bytes {} is above this runtime's maximum of {}",
                spec.limits.memory_bytes, self.inner.options.max_memory_bytes
            )));
        }
        let this = self.clone();
        // Compiling takes seconds of CPU: keep it off the async workers.
        let compiled = tokio::task::spawn_blocking(move || this.compile(&bytes))
            .await
            .map_err(|e| LoadError::Engine(format!("compilation task failed: {e}")))??;
        let info = &compiled.info;
        match &info.contract_version {
            None => {
                return Err(LoadError::WrongWorld {
                    exports: info.exports.iter().map(|e| e.name.clone()).collect(),
                });
            }
            Some(found) if !info.supported_version => {
                return Err(LoadError::UnsupportedVersion {
                    found: found.clone(),
                });
            }
            Some(_) => {}
        }
        let pre = self
            .inner
            .linker
            .instantiate_pre(&compiled.component)
            .map_err(|e| LoadError::UnsatisfiedImports {
                imports: info.unsatisfied_imports.clone(),
                detail: inspect::error_chain(&e),
            })?;
        let pre = ProviderWorldPre::new(pre)
            .map_err(|e| LoadError::Incompatible(inspect::error_chain(&e)))?;
        let gate = Arc::new(Gate::new(spec.name.clone(), Arc::new(spec.grants.clone())));
        let http = HttpEgress::new(&spec.grants, gate.clone(), spec.limits.max_response_bytes)
            .map_err(LoadError::Http)?;
        let state_bytes = usize::try_from(spec.limits.state_bytes)
            .map_err(|_| LoadError::Limits("state_bytes does not fit this platform".into()))?;
        let shared = Arc::new(ProviderShared {
            name: spec.name.clone(),
            config: spec.config.clone(),
            gate,
            state: StateStore::new(state_bytes, self.inner.clock.clone()),
            http,
            cluster,
            warnings: Default::default(),
        });
        tracing::info!(
            provider = %spec.name,
            contract = info.contract_version.as_deref().unwrap_or_default(),
            "provider loaded"
        );
        Ok(Provider::new(ProviderInner::new(
            self.inner.clone(),
            spec.clone(),
            pre,
            shared,
        )))
    }

    /// Compiles once per distinct binary (the same bytes loaded twice share the code).
    fn compile(&self, bytes: &[u8]) -> Result<Compiled, InspectError> {
        inspect::sniff(bytes)?;
        let mut hasher = DefaultHasher::new();
        bytes.hash(&mut hasher);
        let key = hasher.finish();
        let cached = self
            .inner
            .compiled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .and_then(|v| v.iter().find(|c| *c.bytes == *bytes).cloned());
        if let Some(c) = cached {
            return Ok(c);
        }
        let component = Component::new(&self.inner.engine, bytes)
            .map_err(|e| InspectError::Invalid(inspect::error_chain(&e)))?;
        let info = Arc::new(inspect::describe(&self.inner.engine, &component));
        let compiled = Compiled {
            bytes: bytes.into(),
            component,
            info,
        };
        let mut cache = self
            .inner
            .compiled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Reloads of new builds would otherwise pile up; providers already loaded keep
        // their own reference to the code.
        if cache.values().map(Vec::len).sum::<usize>() >= MAX_CACHED_COMPONENTS {
            cache.clear();
        }
        cache.entry(key).or_default().push(compiled.clone());
        Ok(compiled)
    }
}

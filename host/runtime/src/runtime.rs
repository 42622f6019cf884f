//! Loading providers: compiling components once, checking them against the contract and
//! the pool, and wiring each provider's capabilities.

use std::collections::HashMap;
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use wasmtime::component::Component;

use crate::base::error_chain;
use crate::budget::BudgetCounters;
use crate::cache;
use crate::call::ProviderCaps;
use crate::caps::Capabilities;
use crate::caps::capability::{Load, SetupError};
use crate::caps::reads::ReadLimiter;
use crate::cluster::ClusterReader;
use crate::compile::{self, Bounds, CompileError, Shape};
use crate::domain::ProviderInfo;
use crate::engine::{EngineError, EngineShared, RuntimeOptions};
use crate::gate::{CapabilityObserver, Fence, Gate};
use crate::grants::{GrantError, ProviderSpec};
use crate::inspect::{self, ComponentInfo, InspectError, SUPPORTED_VERSIONS};
use crate::provider::{Provider, ProviderInner};
use crate::report::CapabilityReport;
use crate::wit::{ProviderPre, Version};

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
    /// The component exports no `cro:provider` interface at all.
    #[error(
        "the component is not a cro provider: it does not export {interfaces} \
         (it exports: {exports}); it was built for another world",
        interfaces = inspect::served_exports(),
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
    /// `describe` (contract 0.2.0 and later), called at load with nothing granted,
    /// failed: the component cannot say what it is.
    #[error("the provider's describe failed at load: {0}")]
    Describe(String),
    #[error("provider limits: {0}")]
    Limits(String),
    /// Compiling was refused or stopped by `limits.compile_*` (the pre-scan, the
    /// compiler's time or memory), or the compile worker could not run.
    #[error(transparent)]
    Compile(CompileError),
    /// The component needs more core instances, memories or tables than one pool slot
    /// holds (`RuntimeOptions::max_*_per_component`); running it would take what other
    /// providers' calls need.
    #[error("the component is larger than a provider may be: {0}")]
    TooLarge(String),
    #[error("provider HTTP client: {0}")]
    Http(String),
    #[error("runtime: {0}")]
    Engine(String),
}

impl From<EngineError> for LoadError {
    fn from(e: EngineError) -> LoadError {
        LoadError::Engine(e.0)
    }
}

/// What an embedder may attach to one provider when loading it, beyond its spec
/// ([`Runtime::load_with`], [`Runtime::load_bytes_with`]). Empty by default.
#[derive(Clone, Default)]
pub struct LoadOptions {
    observer: Option<Arc<dyn CapabilityObserver>>,
    fence: Option<Fence>,
}

impl LoadOptions {
    /// Tells `observer` of every capability the provider's calls use and of every
    /// call's cost (see [`CapabilityObserver`]).
    pub fn with_observer(mut self, observer: Arc<dyn CapabilityObserver>) -> LoadOptions {
        self.observer = Some(observer);
        self
    }

    /// Asks `fence` right before every outgoing HTTP request of the provider's calls;
    /// a refusal keeps the request from being sent (see [`Fence`]).
    pub fn with_fence(mut self, fence: Fence) -> LoadOptions {
        self.fence = Some(fence);
        self
    }
}

impl fmt::Debug for LoadOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadOptions")
            .field("observed", &self.observer.is_some())
            .field("fenced", &self.fence.is_some())
            .finish()
    }
}

/// Distinct binaries kept compiled for reuse.
const MAX_CACHED_COMPONENTS: usize = 16;

/// A compiled component with its inspection.
#[derive(Clone)]
struct Compiled {
    bytes: Arc<[u8]>,
    /// What the pre-scan found: checked against each load's own limits.
    shape: Shape,
    component: Component,
    info: Arc<ComponentInfo>,
}

struct RuntimeInner {
    shared: Arc<EngineShared>,
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
            .field("options", &self.inner.shared.options)
            .finish_non_exhaustive()
    }
}

/// wasmtime refuses a component above the pool's per-component limits when compiling
/// it; its error type is private, so it is recognised by its words.
/// A compile worker's output is refused in the same words when mapped into the engine.
fn pool_refusal(e: &wasmtime::Error) -> Option<String> {
    let text = error_chain(e);
    text.contains("pooling allocator").then_some(text)
}

impl Runtime {
    pub fn new(options: RuntimeOptions) -> Result<Runtime, LoadError> {
        Ok(Runtime {
            inner: Arc::new(RuntimeInner {
                shared: Arc::new(EngineShared::start(options)?),
                compiled: Mutex::new(HashMap::new()),
            }),
        })
    }

    pub fn options(&self) -> &RuntimeOptions {
        &self.inner.shared.options
    }

    /// The engine every provider of this runtime is compiled and instantiated in: its
    /// pool, limits and epoch ticking. Only for the call-path benchmark, which measures
    /// what wasmtime alone costs in this very engine (`benches/provider_call.rs`).
    #[doc(hidden)]
    pub fn wasmtime_engine(&self) -> &wasmtime::Engine {
        &self.inner.shared.engine
    }

    /// Describes a component (world, contract version, imports, exports).
    pub fn inspect(&self, bytes: &[u8]) -> Result<ComponentInfo, InspectError> {
        match self.compile(bytes, &crate::Limits::default()) {
            Ok(c) => Ok(c.info.as_ref().clone()),
            Err(LoadError::Component(e)) => Err(e),
            Err(e) => Err(InspectError::Invalid(e.to_string())),
        }
    }

    /// Loads `spec.component` and makes a provider of it.
    pub async fn load(
        &self,
        spec: &ProviderSpec,
        cluster: Arc<dyn ClusterReader>,
    ) -> Result<Provider, LoadError> {
        self.load_with(spec, cluster, LoadOptions::default()).await
    }

    /// Like [`Runtime::load`], with `options` attached to the provider.
    pub async fn load_with(
        &self,
        spec: &ProviderSpec,
        cluster: Arc<dyn ClusterReader>,
        options: LoadOptions,
    ) -> Result<Provider, LoadError> {
        let bytes = tokio::fs::read(&spec.component)
            .await
            .map_err(|source| LoadError::Read {
                path: spec.component.clone(),
                source,
            })?;
        self.load_bytes_with(spec, bytes, cluster, options).await
    }

    /// Like [`Runtime::load`] with the component's bytes given (`spec.component` unused).
    pub async fn load_bytes(
        &self,
        spec: &ProviderSpec,
        bytes: Vec<u8>,
        cluster: Arc<dyn ClusterReader>,
    ) -> Result<Provider, LoadError> {
        self.load_bytes_with(spec, bytes, cluster, LoadOptions::default())
            .await
    }

    /// Like [`Runtime::load_bytes`], with `options` attached to the provider.
    pub async fn load_bytes_with(
        &self,
        spec: &ProviderSpec,
        bytes: Vec<u8>,
        cluster: Arc<dyn ClusterReader>,
        options: LoadOptions,
    ) -> Result<Provider, LoadError> {
        self.load_logged(spec, bytes, cluster, true, options).await
    }

    /// Like [`Runtime::load_bytes`], telling `observer` of every capability the
    /// provider's calls use and of every call's cost (`describe` at load is not
    /// observed). For tools (`cro provider call`/`test`); the operator loads without.
    pub async fn load_observed(
        &self,
        spec: &ProviderSpec,
        bytes: Vec<u8>,
        cluster: Arc<dyn ClusterReader>,
        observer: Arc<dyn CapabilityObserver>,
    ) -> Result<Provider, LoadError> {
        let options = LoadOptions::default().with_observer(observer);
        self.load_bytes_with(spec, bytes, cluster, options).await
    }

    /// Loads; `log` says whether the load and its capability report are logged (not
    /// for a provider made only to be described).
    async fn load_logged(
        &self,
        spec: &ProviderSpec,
        bytes: Vec<u8>,
        cluster: Arc<dyn ClusterReader>,
        log: bool,
        options: LoadOptions,
    ) -> Result<Provider, LoadError> {
        spec.validate()?;
        let engine = &self.inner.shared;
        if spec.limits.memory_bytes > engine.options.max_memory_bytes {
            return Err(LoadError::Limits(format!(
                "memory_bytes {} is above this runtime's maximum of {}",
                spec.limits.memory_bytes, engine.options.max_memory_bytes
            )));
        }
        let this = self.clone();
        let limits = spec.limits;
        // Compiling takes seconds of CPU: keep it off the async workers.
        let compiled = tokio::task::spawn_blocking(move || this.compile(&bytes, &limits))
            .await
            .map_err(|e| LoadError::Engine(format!("compilation task failed: {e}")))??;
        let info = &compiled.info;
        let version = match &info.contract_version {
            None => {
                return Err(LoadError::WrongWorld {
                    exports: info.exports.iter().map(|e| e.name.clone()).collect(),
                });
            }
            Some(found) => match Version::of(found) {
                Some(v) if info.supported_version => v,
                _ => {
                    return Err(LoadError::UnsupportedVersion {
                        found: found.clone(),
                    });
                }
            },
        };
        let pre = engine
            .linker
            .instantiate_pre(&compiled.component)
            .map_err(|e| LoadError::UnsatisfiedImports {
                imports: info.unsatisfied_imports.clone(),
                detail: error_chain(&e),
            })?;
        let pre =
            ProviderPre::new(version, pre).map_err(|e| LoadError::Incompatible(error_chain(&e)))?;
        let caps = self.capabilities(spec, cluster.clone(), options)?;
        // `describe` runs with nothing granted and no configuration: what a provider
        // is must not depend on what it was given. Nor is it fenced: with no HTTP grant
        // it cannot send anything.
        let bare = ProviderSpec::new(spec.name.clone(), spec.component.clone());
        let bare_caps = self.capabilities(&bare, cluster, LoadOptions::default())?;
        let provider = Provider::new(ProviderInner::new(
            engine.clone(),
            spec.clone(),
            pre,
            Arc::new(caps),
        ));
        let declared = provider
            .describe_with(&bare_caps)
            .await
            .map_err(|e| LoadError::Describe(e.to_string()))?;
        let report = CapabilityReport::new(declared.as_ref(), spec);
        if log {
            log_load(spec, version, &report);
        }
        provider.set_declared(declared, report);
        Ok(provider)
    }

    /// What a component declares (`describe`, none for 0.1.0), called with nothing
    /// granted, as `cro provider inspect` shows it.
    pub async fn describe_bytes(&self, bytes: Vec<u8>) -> Result<Option<ProviderInfo>, LoadError> {
        let spec = ProviderSpec::new("inspect", "component.wasm");
        let cluster = Arc::new(crate::cluster::StaticCluster::new());
        let provider = self
            .load_logged(&spec, bytes, cluster, false, LoadOptions::default())
            .await?;
        Ok(provider.info().cloned())
    }

    /// Each capability's provider-level side, from the spec.
    fn capabilities(
        &self,
        spec: &ProviderSpec,
        cluster: Arc<dyn ClusterReader>,
        options: LoadOptions,
    ) -> Result<ProviderCaps, LoadError> {
        let limits = &spec.limits;
        let mut gate = Gate::new(spec.name.clone());
        if let Some(observer) = options.observer {
            gate = gate.with_observer(observer);
        }
        if let Some(fence) = options.fence {
            gate = gate.with_fence(fence);
        }
        let gate = Arc::new(gate);
        let budgets = Arc::new(BudgetCounters::default());
        let shared = &self.inner.shared;
        let load = Load {
            provider: &spec.name,
            config: &spec.config,
            limits,
            gate: &gate,
            budgets: &budgets,
            cluster: &cluster,
            clock: &shared.clock,
            guest_output_bytes: shared.options.guest_output_bytes,
        };
        let caps = Capabilities::load(&spec.grants, &load).map_err(|e| match e {
            SetupError::Limits(m) => LoadError::Limits(m),
            SetupError::Client(m) => LoadError::Http(m),
        })?;
        Ok(ProviderCaps {
            reads: Arc::new(ReadLimiter::new(
                limits.cluster_reads_per_call,
                limits.cluster_reads_per_second,
                budgets.clone(),
            )),
            gate,
            budgets,
            caps,
        })
    }

    /// Compiles once per distinct binary (the same bytes loaded twice share the code),
    /// within `limits` (`crate::compile`): a binary above them is refused even when
    /// compiled already for a load with larger limits.
    fn compile(&self, bytes: &[u8], limits: &crate::Limits) -> Result<Compiled, LoadError> {
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
            compile::check(&c.shape, limits).map_err(LoadError::Compile)?;
            return Ok(c);
        }
        let shape = compile::scan::shape(bytes)
            .map_err(|e| LoadError::Component(InspectError::Invalid(e.to_string())))?;
        compile::check(&shape, limits).map_err(LoadError::Compile)?;
        let shared = &self.inner.shared;
        let options = &shared.options;
        let bounds = Bounds::of(limits);
        let component = cache::compile(
            options.component_cache.as_ref(),
            &shared.engine,
            bytes,
            || {
                compile::compile(
                    &options.compiler,
                    &shared.engine,
                    options.max_memory_bytes,
                    bytes,
                    &bounds,
                )
                .map_err(wasmtime::Error::new)
            },
        )
        .map_err(compile_error)?;
        let info = Arc::new(inspect::describe(&shared.engine, &component, shape));
        let compiled = Compiled {
            bytes: bytes.into(),
            shape,
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

/// What a failed compile is: over a pool slot's share, stopped by a compile limit, or
/// not a valid component.
fn compile_error(e: wasmtime::Error) -> LoadError {
    if let Some(text) = pool_refusal(&e) {
        return LoadError::TooLarge(text);
    }
    match e.downcast::<CompileError>() {
        Ok(CompileError::Invalid(text)) => LoadError::Component(InspectError::Invalid(text)),
        Ok(e) => LoadError::Compile(e),
        Err(e) => LoadError::Component(InspectError::Invalid(error_chain(&e))),
    }
}

/// The load's log line: the operator's record of what a provider declared and what it
/// is granted (a warning when they differ).
fn log_load(spec: &ProviderSpec, version: Version, report: &CapabilityReport) {
    if !report.declared {
        tracing::info!(
            provider = %spec.name,
            contract = version.as_str(),
            "provider loaded; its capabilities are not declared"
        );
    } else if report.is_clean() {
        tracing::info!(
            provider = %spec.name,
            contract = version.as_str(),
            "provider loaded; its grants match what it declares"
        );
    } else {
        tracing::warn!(
            provider = %spec.name,
            contract = version.as_str(),
            wanted_not_granted = ?report.wanted_not_granted,
            granted_not_wanted = ?report.granted_not_wanted,
            unknown_config = ?report.unknown_config,
            missing_config = ?report.missing_config,
            "provider loaded; its capabilities differ from its grants"
        );
    }
}

//! The shared engine: one wasmtime engine (component model, pooling allocator, epoch
//! interruption), one linker with every import, the epoch ticker, the wall clock and the
//! pool's slots. Loading (`crate::runtime`) and calling (`crate::provider`) both use it.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::Semaphore;
use wasmtime::component::Linker;
use wasmtime::{Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::base::{WallClock, error_chain};
use crate::cache::ComponentCache;
use crate::call::{self, CallCtx, SlotSize};
use crate::compile::{Compiler, compile_config};

/// Why the engine could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EngineError(pub String);

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
    /// Core module instances one component may have (each pool slot's share). A
    /// component needing more is refused when loaded.
    pub max_core_instances_per_component: u32,
    /// Linear memories one component may have (each pool slot's share).
    pub max_memories_per_component: u32,
    /// Tables one component may have (each pool slot's share).
    pub max_tables_per_component: u32,
    /// The wall clock; `None` is the system clock.
    pub wall_clock: Option<WallClock>,
    /// Where compiled components are kept across runs; `None` compiles every time.
    /// The default comes from the environment ([`ComponentCache::from_env`]).
    pub component_cache: Option<ComponentCache>,
    /// Where components are compiled: in a bounded worker process when this executable
    /// registered itself as one ([`Compiler::from_process`]), else in process.
    pub compiler: Compiler,
}

/// The default of [`RuntimeOptions::max_memory_bytes`].
pub(crate) const DEFAULT_MAX_MEMORY_BYTES: u64 = 256 << 20;

impl Default for RuntimeOptions {
    /// Sized for a small operator (2 cores, a few GiB): 64 instances of up to 256 MiB.
    fn default() -> RuntimeOptions {
        RuntimeOptions {
            max_instances: 64,
            max_memory_bytes: DEFAULT_MAX_MEMORY_BYTES,
            epoch_tick: Duration::from_millis(10),
            guest_output_bytes: 16 << 10,
            // A Rust wasm32-wasip2 component has one main module with one memory and
            // one table, the WASI adapter, and a few shim modules wiring up indirect
            // lowering; these leave room for that and nothing like a hundred memories.
            max_core_instances_per_component: 8,
            max_memories_per_component: 2,
            max_tables_per_component: 4,
            wall_clock: None,
            component_cache: ComponentCache::from_env(),
            compiler: Compiler::from_process(),
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
            .field(
                "max_core_instances_per_component",
                &self.max_core_instances_per_component,
            )
            .field(
                "max_memories_per_component",
                &self.max_memories_per_component,
            )
            .field("max_tables_per_component", &self.max_tables_per_component)
            .field("wall_clock", &self.wall_clock.as_ref().map(|_| "injected"))
            .field("component_cache", &self.component_cache)
            .field("compiler", &self.compiler)
            .finish()
    }
}

pub(crate) struct EngineShared {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<CallCtx>,
    pub(crate) options: RuntimeOptions,
    pub(crate) clock: WallClock,
    /// One permit per pool slot, so calls wait instead of failing when the pool is busy.
    pub(crate) slots: Arc<Semaphore>,
}

impl EngineShared {
    pub(crate) fn start(options: RuntimeOptions) -> Result<EngineShared, EngineError> {
        if options.epoch_tick.is_zero() {
            return Err(EngineError("epoch_tick must be positive".into()));
        }
        let engine = engine(&options)?;
        let mut linker = Linker::new(&engine);
        call::add_to_linker(&mut linker).map_err(|e| EngineError(error_chain(&e)))?;
        crate::wit::add_to_linker(&mut linker).map_err(|e| EngineError(error_chain(&e)))?;
        start_ticker(&engine, options.epoch_tick)?;
        let clock = options
            .wall_clock
            .clone()
            .unwrap_or_else(|| Arc::new(SystemTime::now));
        Ok(EngineShared {
            slots: Arc::new(Semaphore::new(options.max_instances.max(1) as usize)),
            engine,
            linker,
            options,
            clock,
        })
    }

    /// What one component instance may hold.
    pub(crate) fn slot_size(&self) -> SlotSize {
        let o = &self.options;
        SlotSize {
            core_instances: o.max_core_instances_per_component.max(1) as usize,
            memories: o.max_memories_per_component.max(1) as usize,
            tables: o.max_tables_per_component.max(1) as usize,
        }
    }
}

/// Bytes of each linear memory and table reset in place rather than returned to the
/// kernel when an instance ends (see `engine`).
const KEEP_RESIDENT_MEMORY: usize = 1 << 20;
const KEEP_RESIDENT_TABLE: usize = 64 << 10;

fn engine(options: &RuntimeOptions) -> Result<Engine, EngineError> {
    let memory = usize::try_from(options.max_memory_bytes)
        .map_err(|_| EngineError("max_memory_bytes does not fit this platform".into()))?;
    let n = options.max_instances.max(1);
    let (instances, memories, tables) = (
        options.max_core_instances_per_component.max(1),
        options.max_memories_per_component.max(1),
        options.max_tables_per_component.max(1),
    );
    let mut pool = PoolingAllocationConfig::new();
    // The totals are exactly `n` slots of one component each, and the per-component
    // limits make wasmtime refuse (when compiling) a component needing more than one
    // slot's share: one provider can never take the core instances, memories or tables
    // another provider's call needs.
    pool.total_component_instances(n)
        .total_core_instances(n.saturating_mul(instances))
        .total_memories(n.saturating_mul(memories))
        .total_tables(n.saturating_mul(tables))
        .max_core_instances_per_component(instances)
        .max_memories_per_component(memories)
        .max_tables_per_component(tables)
        .max_memories_per_module(memories)
        .max_tables_per_module(tables)
        .total_stacks(n)
        .max_memory_size(memory)
        // A call's instance dirties a few pages of its slot's memory and tables. By
        // default wasmtime gives them back to the kernel when the instance goes
        // (madvise), and the next call on the slot takes a page fault for each again:
        // most of a fresh instance's cost. Pages up to these sizes are instead reset in
        // place (only the ones actually dirtied, found with the PAGEMAP_SCAN ioctl where
        // the kernel has it), so every call still starts from the component's pristine
        // memory image. The pages stay resident per warm slot (see docs/BENCHMARKS.md for
        // the memory this costs).
        .linear_memory_keep_resident(KEEP_RESIDENT_MEMORY)
        .table_keep_resident(KEEP_RESIDENT_TABLE)
        .pagemap_scan(wasmtime::Enabled::Auto);
    let mut config = compile_config(options.max_memory_bytes);
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&config).map_err(|e| EngineError(error_chain(&e)))
}

fn start_ticker(engine: &Engine, tick: Duration) -> Result<(), EngineError> {
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
        .map_err(|e| EngineError(format!("cannot start the epoch thread: {e}")))
}

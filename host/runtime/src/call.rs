//! The store data of one call, made from each registered capability's per-call side
//! (`crate::caps`), and the provider-level capabilities they are made from.
//! The linker projects each import to its capability's part, so no capability module
//! knows this one.

use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::Linker;
use wasmtime_wasi::{WasiCtxView, WasiView};

use crate::budget::BudgetCounters;
use crate::caps::capability::CallSetup;
use crate::caps::memory::MemoryLimiter;
use crate::caps::reads::{CallReads, ReadLimiter};
use crate::caps::{self, CallCapabilities, Capabilities, HasCapabilities};
use crate::gate::Gate;

/// What a provider's calls share (owned by the `Provider` handle).
pub(crate) struct ProviderCaps {
    pub(crate) gate: Arc<Gate>,
    pub(crate) budgets: Arc<BudgetCounters>,
    /// The cluster-read budget every capability reading the cluster shares.
    pub(crate) reads: Arc<ReadLimiter>,
    pub(crate) caps: Capabilities,
}

/// Per-store counts of what one component instance may hold (the pool slot's size).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlotSize {
    pub(crate) core_instances: usize,
    pub(crate) memories: usize,
    pub(crate) tables: usize,
}

impl ProviderCaps {
    /// The store data of a new call.
    pub(crate) fn call(&self, deadline: Instant, memory_limit: usize, slot: SlotSize) -> CallCtx {
        let setup = CallSetup {
            deadline,
            reads: Arc::new(CallReads::new(self.reads.clone())),
        };
        CallCtx {
            deadline,
            limiter: MemoryLimiter::new(
                memory_limit,
                slot.core_instances,
                slot.memories,
                slot.tables,
            ),
            caps: self.caps.call(&setup),
        }
    }
}

/// The store data of one call.
pub(crate) struct CallCtx {
    pub(crate) deadline: Instant,
    pub(crate) limiter: MemoryLimiter,
    pub(crate) caps: CallCapabilities,
}

impl HasCapabilities for CallCtx {
    fn capabilities(&mut self) -> &mut CallCapabilities {
        &mut self.caps
    }
}

/// WASI's bindings need the store's data to be a `WasiView`: the call's WASI context
/// is the `wasi` capability's.
impl WasiView for CallCtx {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        self.caps.wasi.ctx()
    }
}

/// The imports every provider may use: each registered capability's (WASI included).
/// Each contract version's own interfaces are added by `crate::wit`.
pub(crate) fn add_to_linker(linker: &mut Linker<CallCtx>) -> wasmtime::Result<()> {
    caps::add_to_linker(linker)
}

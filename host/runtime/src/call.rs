//! The store data of one call, gathered from each capability's per-call side, and the
//! provider-level capabilities they are made from. The linker projects each import to
//! its capability's struct, so no capability module knows this one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::{Linker, ResourceTable};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::budget::BudgetCounters;
use crate::caps::config::ConfigCall;
use crate::caps::http::{Http, HttpCall};
use crate::caps::log::{Log, LogCall};
use crate::caps::lookup::{Lookup, LookupCall};
use crate::caps::memory::MemoryLimiter;
use crate::caps::reads::{CallReads, ReadLimiter};
use crate::caps::secrets::{Secrets, SecretsCall};
use crate::caps::state::{StateCall, StateStore};
use crate::caps::{config, http, log, lookup, secrets, state};
use crate::gate::Gate;

/// What a provider's calls share (owned by the `Provider` handle).
pub(crate) struct ProviderCaps {
    pub(crate) gate: Arc<Gate>,
    pub(crate) budgets: Arc<BudgetCounters>,
    pub(crate) config: Arc<BTreeMap<String, String>>,
    pub(crate) http: Arc<Http>,
    pub(crate) secrets: Arc<Secrets>,
    pub(crate) lookup: Arc<Lookup>,
    pub(crate) reads: Arc<ReadLimiter>,
    pub(crate) log: Arc<Log>,
    pub(crate) state: Arc<StateStore>,
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
    pub(crate) fn call(
        &self,
        deadline: Instant,
        memory_limit: usize,
        slot: SlotSize,
        wasi: WasiCtx,
    ) -> CallCtx {
        let reads = Arc::new(CallReads::new(self.reads.clone()));
        CallCtx {
            deadline,
            limiter: MemoryLimiter::new(
                memory_limit,
                slot.core_instances,
                slot.memories,
                slot.tables,
            ),
            http: HttpCall::new(self.http.clone(), deadline),
            secrets: SecretsCall::new(self.secrets.clone(), reads.clone(), deadline),
            lookup: LookupCall::new(self.lookup.clone(), reads, deadline),
            config: ConfigCall::new(self.config.clone(), self.gate.clone()),
            log: LogCall::new(self.log.clone()),
            state: StateCall::new(self.state.clone(), self.gate.clone()),
            wasi,
            table: ResourceTable::new(),
        }
    }
}

/// The store data of one call.
pub(crate) struct CallCtx {
    pub(crate) deadline: Instant,
    pub(crate) limiter: MemoryLimiter,
    http: HttpCall,
    secrets: SecretsCall,
    lookup: LookupCall,
    config: ConfigCall,
    log: LogCall,
    state: StateCall,
    wasi: WasiCtx,
    table: ResourceTable,
}

impl WasiView for CallCtx {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// The imports every provider may use: WASI (deny-everything context) and each
/// capability. Each contract version's own interfaces are added by `crate::wit`.
pub(crate) fn add_to_linker(linker: &mut Linker<CallCtx>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    http::add_to_linker(linker, |c| &mut c.http)?;
    secrets::add_to_linker(linker, |c| &mut c.secrets)?;
    lookup::add_to_linker(linker, |c| &mut c.lookup)?;
    config::add_to_linker(linker, |c| &mut c.config)?;
    log::add_to_linker(linker, |c| &mut c.log)?;
    state::add_to_linker(linker, |c| &mut c.state)?;
    Ok(())
}

//! `cro-runtime`: the sandboxed host for cro vendor providers.
//!
//! A provider is a WebAssembly component of a `cro:provider/provider-world` world, of
//! any version in [`wit::SUPPORTED_VERSIONS`] (`wit/since_v*`); [`wit`] picks the
//! version's bindings when the component is loaded. The [`Runtime`] compiles it once with one shared wasmtime engine
//! (component model, pooling allocator, epoch interruption) and hands out a [`Provider`]
//! whose async methods run the four operations. A provider reaches the outside world only
//! through its host imports, and every import asks the provider's [`gate::Gate`] first,
//! which decides with the capability's own check of the administrator's [`grants`]
//! (deny by default). An embedder may also give a [`Fence`] at load
//! ([`LoadOptions::with_fence`]): asked through the same gate right before every outgoing
//! HTTP request, it stops a process that may no longer act for the provider (its Lease
//! expired) from making a further fabric call.
//!
//! ```no_run
//! use std::sync::Arc;
//! use cro_runtime::{AddRequest, ComposableResource, DeviceType, ProviderSpec, Runtime, RuntimeOptions};
//! use cro_runtime::cluster::StaticCluster;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = Runtime::new(RuntimeOptions::default())?;
//! let spec = ProviderSpec::from_file(std::path::Path::new("providers/fti.yaml"))?;
//! let cluster = StaticCluster::new().with_node("worker-0");
//! let provider = runtime.load(&spec, Arc::new(cluster)).await?;
//! let gpu = ComposableResource {
//!     name: "gpu-1".into(),
//!     device_type: DeviceType::Gpu,
//!     model: "NVIDIA-A100-PCIE-40GB".into(),
//!     target_node: "worker-0".into(),
//!     device_id: None,
//!     fabric_device_id: None,
//!     machine_id: None,
//!     force_detach: false,
//! };
//! match provider.add(&AddRequest::new(gpu)).await {
//!     Ok(outcome) => println!("{outcome:?}"),
//!     // A trap, timeout, memory overrun or denial fails this call only.
//!     Err(e) => eprintln!("{e}"),
//! }
//! # Ok(()) }
//! ```
//!
//! # Isolation
//!
//! Every call gets a fresh `Store` and instance from the pre-instantiated component, with
//! a wall-clock deadline (`limits.call_timeout_ms`) that covers host I/O too: host imports
//! stop at the deadline, HTTP timeouts are capped by what is left of it, and guest code is
//! interrupted by the epoch callback (which also yields to tokio every tick, so a spinning
//! guest cannot starve other calls on a 2-core runtime). Memory is capped per call
//! (`limits.memory_bytes`, all memories and tables together) and by the pool, whose
//! per-component limits refuse at load a component that would take more than one slot.
//! Everything else a call can make the host spend has a budget too (see [`budget`] and
//! `docs/sandbox.md`). A trap, timeout, memory overrun or budget overrun becomes a
//! [`CallError`] for that call only; the instance is dropped. State survives between calls
//! only through the host `state` interface: a per-provider, size-bounded in-memory map
//! with TTLs (that is where the FTI provider keeps its token).
//!
//! Components built with Rust `std` import `wasi:*` 0.2; the linker provides them with a
//! deny-everything context: no files, no environment, no arguments, no sockets, stdout and
//! stderr captured (bounded; a panic message ends up in [`CallError::Trap`]), clocks only
//! when granted (otherwise the wall clock reads the Unix epoch).
//!
//! # Why a custom `http` interface rather than `wasi:http`
//!
//! Providers send HTTP through the contract's own `cro:provider/http` interface, backed by
//! one pooled `hyper` client per provider; `wasi:http` is deliberately not in the linker.
//! A single synchronous `send(request) -> result<response, http-error>` is the whole
//! surface: the gate sees the complete URL before any connection exists, every redirect
//! hop goes through the same gate (the egress follows redirects itself), timeouts are capped by the
//! call's deadline in one place, the reply body is bounded, and a refusal is a typed
//! `denied` error naming the missing grant rather than an opaque I/O failure. `wasi:http`
//! would bring streams, resources and futures whose every path (outgoing handler, body
//! streams, trailers) would need gating, for providers that only make small REST calls.
//! Vendors pay a small price: they use our `http::send` instead of a `wasi:http` client.
//!
//! # Modules
//! - [`grants`]: the provider spec, its capability grants and its limits (YAML/JSON,
//!   validated).
//! - [`gate`]: the single choke point every host import goes through.
//! - [`caps`]: one module per capability (grant, checks, budget, state, import
//!   bindings, host functions, report), listed once in its registry.
//! - [`budget`]: what a provider can spend and the counters of budgets hit.
//! - [`cluster`]: read-only cluster access ([`cluster::StaticCluster`],
//!   [`cluster::KubeCluster`]).
//! - [`mod@inspect`]: a component's world, version, imports and exports.
//! - [`wit`]: the contract versions served (one module each) behind one dispatch.
//! - [`report`]: what a provider declares it needs against what it is granted.
//! - [`cache`]: compiled components kept on disk across runs.
//! - [`compile`]: compiling within bounds (a pre-scan, then a worker process).

mod base;
pub mod budget;
pub mod cache;
mod call;
pub mod caps;
pub mod cluster;
pub mod compile;
pub mod domain;
mod engine;
pub mod gate;
pub mod grants;
pub mod inspect;
mod limits;
mod provider;
pub mod report;
mod runtime;
pub mod wit;

pub use base::{WallClock, escape_line, is_invisible_format};
pub use budget::{Budget, BudgetCounters, BudgetExceeded};
pub use cache::{CacheError, CacheOutcome, CacheStats, ComponentCache};
pub use compile::{CompileError, Compiler};
pub use domain::{
    AddOutcome, AddRequest, AttachedDevice, Claim, ComposableResource, DeviceInfo, DeviceType,
    FabricError, FabricPool, FreeDevices, PoolKind, PoolOutcome, PoolQuery, ProviderError,
    ProviderInfo, RemoveOutcome,
};
pub use engine::{EngineError, RuntimeOptions};
pub use gate::{
    CallStats, CapabilityKind, CapabilityObserver, CapabilityUse, Fence, HttpExchange, UseOutcome,
};
pub use grants::{GrantError, Limits, ProviderSpec};
pub use inspect::{ComponentInfo, InspectError, inspect};
pub use provider::{CallError, Provider};
pub use report::CapabilityReport;
pub use runtime::{LoadError, LoadOptions, Runtime};

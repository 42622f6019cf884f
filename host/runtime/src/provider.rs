//! A loaded provider and its calls.
//!
//! Isolation model: every call gets a fresh `Store` and a fresh instance from the
//! pre-instantiated component, and both are dropped when the call ends — whether it
//! returned, trapped, ran out of memory or time. Nothing a call does to its instance can
//! reach another call; state survives only through the host's `state` interface (a
//! per-provider, size-bounded map with TTLs owned by this handle).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use wasmtime::{Store, UpdateDeadline};

use crate::base::{DeadlineExceeded, clip, error_chain, escape_line, needs_escape};
use crate::budget::{Budget, BudgetCounters, BudgetExceeded};
use crate::call::{CallCtx, ProviderCaps};
use crate::caps::wasi::capture::TailCapture;
use crate::domain::{
    AddOutcome, AddRequest, AttachedDevice, Claim, ComposableResource, DeviceInfo, FabricError,
    FabricPool, FreeDevices, InvalidId, PoolKind, PoolOutcome, PoolQuery, ProviderError,
    ProviderInfo, RemoveOutcome,
};
use crate::engine::EngineShared;
use crate::gate::{CallStats, DenialCounts};
use crate::grants::ProviderSpec;
use crate::report::CapabilityReport;
use crate::wit::{ProviderInstance, ProviderPre, Version};

/// How long after the deadline the outer timeout fires. Guest code and host imports stop
/// at the deadline themselves; this only catches what ignores it.
const DEADLINE_GRACE: Duration = Duration::from_millis(250);

/// Why one provider call failed. Only that call is affected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The provider returned an error (a capability denial arrives as
    /// `ProviderError::Denied`).
    #[error("{0}")]
    Provider(#[from] ProviderError),
    /// The guest trapped (a panic, `unreachable`, stack overflow, `exit`). `stderr` is the
    /// tail of what it wrote there, which holds a Rust panic's message.
    #[error("provider trapped: {message}{}", if stderr.is_empty() { String::new() } else { format!(" (stderr: {stderr})") })]
    Trap { message: String, stderr: String },
    /// The call ran past `limits.call_timeout_ms` (guest code or host I/O).
    #[error("provider call exceeded its deadline of {} ms", .0.as_millis())]
    Timeout(Duration),
    /// The guest asked for more than `limits.memory_bytes` (all its memories and tables
    /// together).
    #[error("provider exceeded its memory limit of {limit_bytes} bytes")]
    OutOfMemory { limit_bytes: u64 },
    /// The call spent more of something than its provider's `limits` allow (log lines,
    /// cluster reads, bytes handed to the host); the host stopped it.
    #[error("{0}")]
    Budget(BudgetExceeded),
    /// No instance could be made (not a guest fault).
    #[error("provider could not be instantiated: {0}")]
    Instantiate(String),
}

impl CallError {
    /// The missing grant, when the provider failed because a capability was denied.
    pub fn denied(&self) -> Option<&str> {
        match self {
            CallError::Provider(ProviderError::Denied(m)) => Some(m),
            _ => None,
        }
    }

    /// The budget the call ran over, if that is why it failed.
    pub fn budget(&self) -> Option<Budget> {
        match self {
            CallError::Budget(b) => Some(b.budget),
            CallError::OutOfMemory { .. } => Some(Budget::Memory),
            _ => None,
        }
    }
}

/// wasmtime's "hostcall fuel" error type is private; it is recognised by its words.
fn hostcall_fuel_exhausted(e: &wasmtime::Error) -> bool {
    e.chain().any(|c| {
        c.to_string()
            .contains("fuel allocated for hostcalls has been exhausted")
    })
}

pub(crate) struct ProviderInner {
    runtime: Arc<EngineShared>,
    spec: ProviderSpec,
    pre: ProviderPre,
    caps: Arc<ProviderCaps>,
    calls: Semaphore,
    /// What `describe` said at load (none before 0.2.0) and the capability report.
    declared: OnceLock<(Option<ProviderInfo>, CapabilityReport)>,
}

impl ProviderInner {
    pub(crate) fn new(
        runtime: Arc<EngineShared>,
        spec: ProviderSpec,
        pre: ProviderPre,
        caps: Arc<ProviderCaps>,
    ) -> ProviderInner {
        let calls = Semaphore::new(spec.limits.max_concurrent_calls as usize);
        ProviderInner {
            runtime,
            spec,
            pre,
            caps,
            calls,
            declared: OnceLock::new(),
        }
    }
}

/// A loaded provider. Cheap to clone; calls may run concurrently (up to
/// `limits.max_concurrent_calls`, more wait).
#[derive(Clone)]
pub struct Provider {
    inner: Arc<ProviderInner>,
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider")
            .field("name", &self.inner.spec.name)
            .finish_non_exhaustive()
    }
}

/// One export call against a fresh instance.
type Invoke<R> = Box<
    dyn for<'a> FnOnce(
            &'a ProviderInstance,
            &'a mut Store<CallCtx>,
        ) -> Pin<Box<dyn Future<Output = wasmtime::Result<R>> + Send + 'a>>
        + Send,
>;

enum Failure {
    Instantiate(wasmtime::Error),
    Call(wasmtime::Error),
}

impl Provider {
    pub(crate) fn new(inner: ProviderInner) -> Provider {
        Provider {
            inner: Arc::new(inner),
        }
    }

    pub fn name(&self) -> &str {
        &self.inner.spec.name
    }

    pub fn spec(&self) -> &ProviderSpec {
        &self.inner.spec
    }

    /// Capability denials so far (for metrics).
    pub fn denials(&self) -> DenialCounts {
        self.inner.caps.gate.denials()
    }

    /// How often each budget was hit so far (for metrics).
    pub fn budgets(&self) -> &BudgetCounters {
        &self.inner.caps.budgets
    }

    /// Entries and bytes (as charged) the provider's `state` holds now.
    pub fn state_usage(&self) -> (usize, usize) {
        self.inner.caps.caps.state.store.usage()
    }

    fn text(&self) -> Clipper<'_> {
        Clipper {
            max: self.inner.spec.limits.provider_text_bytes as usize,
            budgets: &self.inner.caps.budgets,
        }
    }

    /// Warnings and errors the provider logged so far (for metrics).
    pub fn warnings(&self) -> u64 {
        self.inner.caps.caps.log.warnings()
    }

    /// The contract version the component targets.
    pub fn contract_version(&self) -> &'static str {
        self.inner.pre.version().as_str()
    }

    /// What the provider declared at load (`describe`); none when its contract has none.
    pub fn info(&self) -> Option<&ProviderInfo> {
        self.inner
            .declared
            .get()
            .and_then(|(info, _)| info.as_ref())
    }

    /// What it declared it needs against what its spec grants and configures.
    pub fn capability_report(&self) -> CapabilityReport {
        self.inner
            .declared
            .get()
            .map(|(_, report)| report.clone())
            .unwrap_or_default()
    }

    pub(crate) fn set_declared(&self, info: Option<ProviderInfo>, report: CapabilityReport) {
        // Set once, at load, before the provider is handed out.
        let _ = self.inner.declared.set((info, report));
    }

    /// Calls `describe` (when the contract has it) with the given capabilities.
    pub(crate) async fn describe_with(
        &self,
        caps: &ProviderCaps,
    ) -> Result<Option<ProviderInfo>, CallError> {
        if self.inner.pre.version() == Version::V0_1 {
            return Ok(None);
        }
        let info = self
            .call_in(caps, Box::new(|g, s| Box::pin(g.describe(s))))
            .await?;
        let t = self.text();
        Ok(info.map(|i| t.info(i)))
    }

    /// Attaches a device for the request (resource, attempt key, size, claims).
    pub async fn add(&self, request: &AddRequest) -> Result<AddOutcome, CallError> {
        let req = request.clone();
        let reply = self
            .call(Box::new(move |g, s| {
                Box::pin(async move { g.add(s, &req).await })
            }))
            .await?;
        let t = self.text();
        match reply {
            Ok(outcome) => {
                // Ids are identifiers: one that could forge or disguise a log line is
                // refused whole, since escaping it would change it (`forbidden_in_id`).
                outcome.check_ids().map_err(|e| self.refused_id(e))?;
                Ok(t.add_outcome(outcome))
            }
            Err(e) => Err(t.error(e).into()),
        }
    }

    /// Detaches the resource's device.
    pub async fn remove_resource(
        &self,
        resource: &ComposableResource,
    ) -> Result<RemoveOutcome, CallError> {
        let r = resource.clone();
        let reply = self
            .call(Box::new(move |g, s| {
                Box::pin(async move { g.remove(s, &r).await })
            }))
            .await?;
        let t = self.text();
        match reply {
            Ok(outcome) => Ok(t.remove_outcome(outcome)),
            Err(e) => Err(t.error(e).into()),
        }
    }

    /// Checks the health of an attached device.
    pub async fn check_resource(&self, resource: &ComposableResource) -> Result<(), CallError> {
        let r = resource.clone();
        let reply = self
            .call(Box::new(move |g, s| {
                Box::pin(async move { g.check(s, &r).await })
            }))
            .await?;
        reply.map_err(|e| self.text().error(e).into())
    }

    /// Every device the fabric has attached to the cluster's machines; `claims` are the
    /// devices ComposableResources hold.
    pub async fn list(&self, claims: &[Claim]) -> Result<Vec<DeviceInfo>, CallError> {
        let claims = claims.to_vec();
        let reply = self
            .call(Box::new(move |g, s| {
                Box::pin(async move { g.list(s, &claims).await })
            }))
            .await?;
        let t = self.text();
        match reply {
            Ok(devices) => {
                // One forged id refuses the whole listing: the provider is broken or
                // hostile, and a partial listing would read as devices gone.
                devices
                    .iter()
                    .try_for_each(DeviceInfo::check_ids)
                    .map_err(|e| self.refused_id(e))?;
                Ok(devices.into_iter().map(|d| t.device(d)).collect())
            }
            Err(e) => Err(t.error(e).into()),
        }
    }

    /// The fabric's free devices by pool (contract 0.3.0 and later). A provider of an
    /// older contract is not called: its answer is `not-supported`, saying so.
    pub async fn pool(&self, query: &PoolQuery) -> Result<PoolOutcome, CallError> {
        let version = self.inner.pre.version();
        if matches!(version, Version::V0_1 | Version::V0_2) {
            return Ok(PoolOutcome::NotSupported(format!(
                "the provider targets contract {}, which has no pool (added in 0.3.0)",
                version.as_str()
            )));
        }
        let query = query.clone();
        let reply = self
            .call(Box::new(move |g, s| {
                Box::pin(async move {
                    match g.pool(s, &query).await {
                        Some(reply) => reply,
                        None => Ok(Ok(PoolOutcome::NotSupported(
                            "this contract version has no pool".into(),
                        ))),
                    }
                })
            }))
            .await?;
        let t = self.text();
        match reply {
            Ok(PoolOutcome::Pools(pools)) => {
                // Like a listing, one bad pool refuses the whole reply: publishing part
                // of a pool would advertise a fabric the provider cannot describe.
                if let Err(e) = pools.iter().try_for_each(FabricPool::check) {
                    tracing::warn!(
                        provider = %self.inner.spec.name,
                        error = %escape_line(&e.to_string(), LOGGED_ERROR_BYTES),
                        "provider returned a malformed pool"
                    );
                    return Err(t.error(e).into());
                }
                Ok(PoolOutcome::Pools(
                    pools.into_iter().map(|p| t.pool(p)).collect(),
                ))
            }
            Ok(PoolOutcome::NotSupported(why)) => Ok(PoolOutcome::NotSupported(t.prose(why))),
            Err(e) => Err(t.error(e).into()),
        }
    }

    /// A reply's id that is not an identifier: logged (its text is escaped) and returned
    /// as the malformed reply it is.
    fn refused_id(&self, e: InvalidId) -> CallError {
        tracing::warn!(
            provider = %self.inner.spec.name,
            error = %e,
            "provider returned an id that is not an identifier"
        );
        CallError::Provider(ProviderError::from(e))
    }

    async fn call<R>(&self, invoke: Invoke<R>) -> Result<R, CallError> {
        let caps = self.inner.caps.clone();
        self.call_in(&caps, invoke).await
    }

    /// One call against a fresh instance in a fresh store, with `caps`: waits for a
    /// slot, runs to the deadline, and turns whatever went wrong into a [`CallError`].
    async fn call_in<R>(&self, caps: &ProviderCaps, invoke: Invoke<R>) -> Result<R, CallError> {
        let inner = &self.inner;
        let closed = |_| CallError::Instantiate("the runtime is shutting down".into());
        let _call = inner.calls.acquire().await.map_err(closed)?;
        let _slot = inner.runtime.slots.acquire().await.map_err(closed)?;

        let started = Instant::now();
        let deadline = started + inner.spec.limits.call_timeout();
        let mut store = self.store(caps, deadline);
        let (stdout, stderr) = store.data().caps.wasi.output();
        let outcome = self.run(&mut store, invoke, deadline).await;
        let memory_refused = store.data().limiter.refused();
        let peak_memory_bytes = store.data().limiter.used() as u64;
        caps.gate.call_finished(|| CallStats {
            duration: started.elapsed(),
            peak_memory_bytes,
        });
        // The instance goes with the store, whatever happened.
        drop(store);
        self.log_output(&stdout, &stderr);

        let failure = match outcome {
            Ok(Ok(reply)) => return Ok(reply),
            Err(_elapsed) => return Err(CallError::Timeout(inner.spec.limits.call_timeout())),
            Ok(Err(failure)) => failure,
        };
        let err = self.classify(&caps.budgets, failure, memory_refused, &stderr);
        let err = self.text().call_error(err);
        tracing::warn!(
            provider = %inner.spec.name,
            error = %escape_line(&err.to_string(), LOGGED_ERROR_BYTES),
            "provider call failed"
        );
        Err(err)
    }

    /// A new call's store: its capabilities, memory limiter, hostcall fuel and deadline.
    fn store(&self, caps: &ProviderCaps, deadline: Instant) -> Store<CallCtx> {
        let inner = &self.inner;
        let limits = &inner.spec.limits;
        let memory = usize::try_from(limits.memory_bytes).unwrap_or(usize::MAX);
        let ctx = caps.call(deadline, memory, inner.runtime.slot_size());
        let mut store = Store::new(&inner.runtime.engine, ctx);
        store.limiter(|c| &mut c.limiter);
        // What wasmtime copies out of the guest for one host call or result (strings and
        // lists, each alias of the same bytes counted again) is bounded like memory.
        let fuel = usize::try_from(limits.effective_host_call_bytes()).unwrap_or(usize::MAX);
        store.set_hostcall_fuel(fuel);
        // Check every tick: yield so other tasks run on the same worker, and stop the
        // guest once the deadline has passed.
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|ctx| {
            if Instant::now() >= ctx.data().deadline {
                Err(wasmtime::Error::new(DeadlineExceeded))
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });
        store
    }

    /// Instantiates and invokes, bounded by the deadline (and a grace after it for what
    /// ignores the deadline).
    async fn run<R>(
        &self,
        store: &mut Store<CallCtx>,
        invoke: Invoke<R>,
        deadline: Instant,
    ) -> Result<Result<R, Failure>, tokio::time::error::Elapsed> {
        let run = async {
            let instance = self
                .inner
                .pre
                .instantiate(store)
                .await
                .map_err(Failure::Instantiate)?;
            invoke(&instance, store).await.map_err(Failure::Call)
        };
        tokio::time::timeout_at(
            tokio::time::Instant::from_std(deadline + DEADLINE_GRACE),
            run,
        )
        .await
    }

    /// What a failed call's error was: its deadline, a budget, memory, an exit, a trap,
    /// or no instance at all. Budgets detected here are counted here.
    fn classify(
        &self,
        budgets: &BudgetCounters,
        failure: Failure,
        memory_refused: bool,
        stderr: &TailCapture,
    ) -> CallError {
        let limits = &self.inner.spec.limits;
        let (error, instantiating) = match failure {
            Failure::Instantiate(e) => (e, true),
            Failure::Call(e) => (e, false),
        };
        if error.downcast_ref::<DeadlineExceeded>().is_some() {
            CallError::Timeout(limits.call_timeout())
        } else if let Some(over) = error.downcast_ref::<BudgetExceeded>() {
            // Counted where it was detected.
            CallError::Budget(*over)
        } else if hostcall_fuel_exhausted(&error) {
            budgets.hit(Budget::HostCallBytes);
            CallError::Budget(BudgetExceeded {
                budget: Budget::HostCallBytes,
                limit: limits.effective_host_call_bytes(),
            })
        } else if wasi_table_full(&error) {
            budgets.hit(Budget::WasiHandles);
            CallError::Budget(BudgetExceeded {
                budget: Budget::WasiHandles,
                limit: u64::from(limits.wasi_handles_per_call),
            })
        } else if memory_refused {
            budgets.hit(Budget::Memory);
            CallError::OutOfMemory {
                limit_bytes: limits.memory_bytes,
            }
        } else if let Some(exit) = error.downcast_ref::<wasmtime_wasi::I32Exit>() {
            CallError::Trap {
                message: format!("the provider called exit({})", exit.0),
                stderr: stderr.text(),
            }
        } else if let Some(trap) = error.downcast_ref::<wasmtime::Trap>() {
            CallError::Trap {
                message: trap.to_string(),
                stderr: stderr.text(),
            }
        } else if instantiating {
            CallError::Instantiate(error_chain(&error))
        } else {
            CallError::Trap {
                message: error_chain(&error),
                stderr: stderr.text(),
            }
        }
    }

    fn log_output(&self, stdout: &TailCapture, stderr: &TailCapture) {
        for (stream, capture) in [("stdout", stdout), ("stderr", stderr)] {
            let text = capture.text();
            if !text.is_empty() {
                let text = escape_line(&text, self.inner.runtime.options.guest_output_bytes);
                tracing::debug!(provider = %self.inner.spec.name, stream, "{text}");
            }
        }
    }
}

/// The call's WASI resource table refused another handle (`limits.wasi_handles_per_call`,
/// see `caps::wasi`): wasmtime-wasi turns that into a trap carrying the table's error.
fn wasi_table_full(error: &wasmtime::Error) -> bool {
    error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<wasmtime::component::ResourceTableError>(),
            Some(wasmtime::component::ResourceTableError::Full)
        )
    })
}

/// Bytes of a failed call's error quoted in its warning line.
const LOGGED_ERROR_BYTES: usize = 2048;

/// Cuts every string a provider hands back to `limits.provider_text_bytes`, counting
/// each cut: what reaches the operator (and `status.error`, Events, logs) is bounded
/// whatever the component returns.
struct Clipper<'a> {
    max: usize,
    budgets: &'a BudgetCounters,
}

impl Clipper<'_> {
    fn s(&self, text: String) -> String {
        let (text, cut) = self.cut(text);
        if cut {
            self.budgets.hit(Budget::ProviderText);
        }
        text
    }

    /// `text` cut to `max` bytes with a note of what went; true when something did.
    fn cut(&self, text: String) -> (String, bool) {
        if text.len() <= self.max {
            return (text, false);
        }
        let cut = text.len() - clip(&text, self.max).len();
        let mut text = text;
        text.truncate(text.len() - cut);
        text.push_str(&format!("… [{cut} more bytes cut]"));
        (text, true)
    }

    /// Provider prose (error and progress messages): control characters escaped, then
    /// clipped. It ends up in the operator's log lines and `status.error`, where a guest's
    /// `\n` must not start a forged line of its own. Ids are clipped only ([`Self::s`]):
    /// escaping would change them; one holding a character this would escape was
    /// refused before (`check_ids`).
    fn prose(&self, text: String) -> String {
        if !text.chars().any(needs_escape) {
            return self.s(text);
        }
        // Clipped before it is escaped: escaping all of an 8 MiB string of control
        // characters cost more time and memory than the call it came from, after its
        // deadline. Escaping can grow what was kept: cut again (one cut, counted once).
        let clipped = text.len() > self.max;
        let (escaped, cut) = self.cut(escape_line(&text, self.max));
        if clipped || cut {
            self.budgets.hit(Budget::ProviderText);
        }
        escaped
    }

    /// The last `max` bytes (a panic message comes last on stderr), escaped like prose.
    fn tail(&self, text: String) -> String {
        // Only the last `max` bytes can be kept: escape no more than those.
        let mut from = text.len().saturating_sub(self.max);
        while !text.is_char_boundary(from) {
            from += 1;
        }
        let dropped = from;
        let text = if text[from..].chars().any(needs_escape) {
            escape_line(&text[from..], self.max)
        } else {
            text[from..].to_owned()
        };
        if text.len() <= self.max && dropped == 0 {
            return text;
        }
        if text.len() <= self.max {
            self.budgets.hit(Budget::ProviderText);
            return format!("[{dropped} earlier bytes dropped] {text}");
        }
        // Escaping grew the kept part past `max`: keep its end.
        self.budgets.hit(Budget::ProviderText);
        let mut start = text.len() - self.max;
        while !text.is_char_boundary(start) {
            start += 1;
        }
        format!(
            "[{} earlier bytes dropped] {}",
            dropped + start,
            &text[start..]
        )
    }

    fn error(&self, e: ProviderError) -> ProviderError {
        use ProviderError as P;
        match e {
            P::Fabric(f) => P::Fabric(FabricError {
                status: f.status,
                code: self.prose(f.code),
                message: self.prose(f.message),
            }),
            P::MalformedReply(m) => P::MalformedReply(self.prose(m)),
            P::NotFound(m) => P::NotFound(self.prose(m)),
            P::Warning(m) => P::Warning(self.prose(m)),
            P::Critical(m) => P::Critical(self.prose(m)),
            P::Denied(m) => P::Denied(self.prose(m)),
            P::Config(m) => P::Config(self.prose(m)),
            P::Unavailable(m) => P::Unavailable(self.prose(m)),
            P::NoCapacity(m) => P::NoCapacity(self.prose(m)),
            P::Other(m) => P::Other(self.prose(m)),
        }
    }

    fn call_error(&self, e: CallError) -> CallError {
        match e {
            CallError::Trap { message, stderr } => CallError::Trap {
                message: self.prose(message),
                stderr: self.tail(stderr),
            },
            CallError::Instantiate(m) => CallError::Instantiate(self.prose(m)),
            other => other,
        }
    }

    fn add_outcome(&self, o: AddOutcome) -> AddOutcome {
        match o {
            AddOutcome::Attached(d) => AddOutcome::Attached(AttachedDevice {
                device_id: self.s(d.device_id),
                fabric_device_id: self.s(d.fabric_device_id),
                machine_id: d.machine_id.map(|m| self.s(m)),
            }),
            AddOutcome::InProgress(m) => AddOutcome::InProgress(self.prose(m)),
        }
    }

    fn remove_outcome(&self, o: RemoveOutcome) -> RemoveOutcome {
        match o {
            RemoveOutcome::Removed => RemoveOutcome::Removed,
            RemoveOutcome::InProgress(m) => RemoveOutcome::InProgress(self.prose(m)),
        }
    }

    fn device(&self, d: DeviceInfo) -> DeviceInfo {
        DeviceInfo {
            node: self.s(d.node),
            machine_id: self.s(d.machine_id),
            device_type: d.device_type,
            model: self.s(d.model),
            device_id: self.s(d.device_id),
            fabric_device_id: self.s(d.fabric_device_id),
        }
    }

    /// A pool's ids clipped (they were checked), its model names clipped like a
    /// listed device's.
    fn pool(&self, p: FabricPool) -> FabricPool {
        FabricPool {
            id: self.s(p.id),
            nodes: p.nodes.into_iter().map(|n| self.s(n)).collect(),
            free: p
                .free
                .into_iter()
                .map(|f| FreeDevices {
                    kind: PoolKind {
                        device_type: f.kind.device_type,
                        model: self.s(f.kind.model),
                    },
                    count: f.count,
                    sizes: f.sizes,
                })
                .collect(),
        }
    }

    /// What `describe` said, every string bounded like any other reply.
    fn info(&self, i: ProviderInfo) -> ProviderInfo {
        let list = |v: Vec<String>| v.into_iter().map(|x| self.prose(x)).collect::<Vec<_>>();
        ProviderInfo {
            name: self.prose(i.name),
            vendor: self.prose(i.vendor),
            version: self.prose(i.version),
            devices: i
                .devices
                .into_iter()
                .map(|d| crate::domain::DeviceKind {
                    device_type: d.device_type,
                    models: list(d.models),
                })
                .collect(),
            capabilities: crate::domain::WantedCapabilities {
                http: list(i.capabilities.http),
                secret_keys: list(i.capabilities.secret_keys),
                lookup: i
                    .capabilities
                    .lookup
                    .into_iter()
                    .map(|l| crate::domain::LookupKind {
                        api_version: self.prose(l.api_version),
                        kind: self.prose(l.kind),
                        when_config: l.when_config.map(|k| self.prose(k)),
                    })
                    .collect(),
                clocks: i.capabilities.clocks,
            },
            config: i
                .config
                .into_iter()
                .map(|k| crate::domain::ConfigKey {
                    name: self.prose(k.name),
                    required: k.required,
                    description: self.prose(k.description),
                })
                .collect(),
        }
    }
}

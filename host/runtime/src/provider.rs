//! A loaded provider and its calls.
//!
//! Isolation model: every call gets a fresh `Store` and a fresh instance from the
//! pre-instantiated component, and both are dropped when the call ends — whether it
//! returned, trapped, ran out of memory or time. Nothing a call does to its instance can
//! reach another call; state survives only through the host's `state` interface (a
//! per-provider, size-bounded map with TTLs owned by this handle).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use wasmtime::{Store, UpdateDeadline};

use crate::bindings::ProviderWorldPre;
use crate::bindings::cro::provider::types as wit;
use crate::bindings::exports::cro::provider::provider::Guest;
use crate::domain::{AddOutcome, ComposableResource, DeviceInfo, ProviderError, RemoveOutcome};
use crate::gate::DenialCounts;
use crate::grants::ProviderSpec;
use crate::host::capture::TailCapture;
use crate::host::{CallCtx, DeadlineExceeded, ProviderShared, wasi};
use crate::inspect::error_chain;
use crate::runtime::RuntimeInner;

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
    /// The guest asked for more than `limits.memory_bytes`.
    #[error("provider exceeded its memory limit of {limit_bytes} bytes")]
    OutOfMemory { limit_bytes: u64 },
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
}

pub(crate) struct ProviderInner {
    runtime: Arc<RuntimeInner>,
    spec: ProviderSpec,
    pre: ProviderWorldPre<CallCtx>,
    shared: Arc<ProviderShared>,
    calls: Semaphore,
}

impl ProviderInner {
    pub(crate) fn new(
        runtime: Arc<RuntimeInner>,
        spec: ProviderSpec,
        pre: ProviderWorldPre<CallCtx>,
        shared: Arc<ProviderShared>,
    ) -> ProviderInner {
        let calls = Semaphore::new(spec.limits.max_concurrent_calls as usize);
        ProviderInner {
            runtime,
            spec,
            pre,
            shared,
            calls,
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
            &'a Guest,
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
        self.inner.shared.gate.denials()
    }

    /// Warnings and errors the provider logged so far (for metrics).
    pub fn warnings(&self) -> u64 {
        self.inner
            .shared
            .warnings
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Attaches a device of the resource's type and model to its target node.
    pub async fn add_resource(
        &self,
        resource: &ComposableResource,
    ) -> Result<AddOutcome, CallError> {
        let r = wit::ComposableResource::from(resource);
        let reply = self
            .call(Box::new(move |g, s| {
                Box::pin(async move { g.call_add_resource(s, &r).await })
            }))
            .await?;
        Ok(reply.map_err(ProviderError::from)?.into())
    }

    /// Detaches the resource's device.
    pub async fn remove_resource(
        &self,
        resource: &ComposableResource,
    ) -> Result<RemoveOutcome, CallError> {
        let r = wit::ComposableResource::from(resource);
        let reply = self
            .call(Box::new(move |g, s| {
                Box::pin(async move { g.call_remove_resource(s, &r).await })
            }))
            .await?;
        Ok(reply.map_err(ProviderError::from)?.into())
    }

    /// Checks the health of an attached device.
    pub async fn check_resource(&self, resource: &ComposableResource) -> Result<(), CallError> {
        let r = wit::ComposableResource::from(resource);
        let reply = self
            .call(Box::new(move |g, s| {
                Box::pin(async move { g.call_check_resource(s, &r).await })
            }))
            .await?;
        Ok(reply.map_err(ProviderError::from)?)
    }

    /// Every device the fabric has attached to the cluster's machines.
    pub async fn get_resources(&self) -> Result<Vec<DeviceInfo>, CallError> {
        let reply = self
            .call(Box::new(|g, s| Box::pin(g.call_get_resources(s))))
            .await?;
        Ok(reply
            .map_err(ProviderError::from)?
            .into_iter()
            .map(DeviceInfo::from)
            .collect())
    }

    async fn call<R>(&self, invoke: Invoke<R>) -> Result<R, CallError> {
        let inner = &self.inner;
        let closed = |_| CallError::Instantiate("the runtime is shutting down".into());
        let _call = inner.calls.acquire().await.map_err(closed)?;
        let _slot = inner.runtime.slots.acquire().await.map_err(closed)?;

        let limits = &inner.spec.limits;
        let timeout = limits.call_timeout();
        let deadline = Instant::now() + timeout;
        let output = inner.runtime.options.guest_output_bytes;
        let (stdout, stderr) = (TailCapture::new(output), TailCapture::new(output));
        let wasi = wasi::context(
            inner.spec.grants.wasi,
            &inner.runtime.clock,
            stdout.clone(),
            stderr.clone(),
        );
        let memory = usize::try_from(limits.memory_bytes).unwrap_or(usize::MAX);
        let ctx = CallCtx::new(inner.shared.clone(), deadline, memory, wasi);
        let mut store = Store::new(&inner.runtime.engine, ctx);
        store.limiter(|c| &mut c.limiter);
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

        let run = async {
            let world = inner
                .pre
                .instantiate_async(&mut store)
                .await
                .map_err(Failure::Instantiate)?;
            invoke(world.cro_provider_provider(), &mut store)
                .await
                .map_err(Failure::Call)
        };
        let outcome = tokio::time::timeout_at(
            tokio::time::Instant::from_std(deadline + DEADLINE_GRACE),
            run,
        )
        .await;
        let memory_refused = store.data().limiter.refused();
        // The instance goes with the store, whatever happened.
        drop(store);
        self.log_output(&stdout, &stderr);

        let failure = match outcome {
            Ok(Ok(reply)) => return Ok(reply),
            Err(_elapsed) => return Err(CallError::Timeout(timeout)),
            Ok(Err(failure)) => failure,
        };
        let (error, instantiating) = match failure {
            Failure::Instantiate(e) => (e, true),
            Failure::Call(e) => (e, false),
        };
        let err = if error.downcast_ref::<DeadlineExceeded>().is_some() {
            CallError::Timeout(timeout)
        } else if memory_refused {
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
        };
        tracing::warn!(provider = %inner.spec.name, error = %err, "provider call failed");
        Err(err)
    }

    fn log_output(&self, stdout: &TailCapture, stderr: &TailCapture) {
        for (stream, capture) in [("stdout", stdout), ("stderr", stderr)] {
            let text = capture.text();
            if !text.is_empty() {
                tracing::debug!(provider = %self.inner.spec.name, stream, "{text}");
            }
        }
    }
}

//! The provider as the controllers see it: four operations on one device, whatever runs
//! behind them (the host runtime with a vendor component in production).

pub(crate) mod credentials;
pub(crate) mod node_cache;
pub(crate) mod node_machine;
pub(crate) mod node_scope;
pub(crate) mod tenure;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cro_api::{ComposableResource, ResourceType};
use cro_runtime::CallError;
use cro_runtime::domain::{
    self, AddOutcome, AddRequest, Claim, DeviceInfo, DeviceType, PoolOutcome, PoolQuery,
    ProviderError, RemoveOutcome,
};
use futures::future::BoxFuture;
use kube::ResourceExt;

use crate::metrics::Metrics;

/// Why a provider call failed: the provider said so, or the host could not get an
/// answer (trap, deadline, memory cap). Only that call is affected.
pub type ProviderCallError = cro_runtime::CallError;

/// A short label of a failure, for metrics.
pub(crate) fn error_kind(e: &ProviderCallError) -> &'static str {
    match e {
        CallError::Provider(e) => match e {
            ProviderError::Fabric(_) => "fabric",
            ProviderError::MalformedReply(_) => "malformed_reply",
            ProviderError::NotFound(_) => "not_found",
            ProviderError::Warning(_) => "warning",
            ProviderError::Critical(_) => "critical",
            ProviderError::Denied(_) => "denied",
            ProviderError::Config(_) => "config",
            ProviderError::Unavailable(_) => "unavailable",
            ProviderError::NoCapacity(_) => "no_capacity",
            ProviderError::Other(_) => "other",
        },
        CallError::Trap { .. } => "trap",
        CallError::Timeout(_) => "timeout",
        CallError::OutOfMemory { .. } => "out_of_memory",
        CallError::Budget(_) => "budget_exceeded",
        CallError::Instantiate(_) => "instantiate",
    }
}

pub type ProviderResult<T> = Result<T, ProviderCallError>;

/// What the controllers call. Dyn-compatible so tests and the runtime adapter share one
/// `Arc<dyn DeviceProvider>`.
///
/// Every method is required: a wrapper (credentials naming, routing, a test's fault
/// injector) must say what it does with each one, so none can fall back to a lesser
/// call and drop what the caller passed (an attach's claims and attempt key, a
/// listing's claims). Providers of contract 0.1.0 see less of a request; that downgrade
/// happens in the runtime's 0.1.0 bindings, nowhere above them.
pub trait DeviceProvider: Send + Sync + 'static {
    /// Attaches a device for the request: the resource, its attempt key (the same for
    /// every retry of one attach), the CXL size, and the devices other resources hold.
    fn add<'a>(&'a self, request: &'a AddRequest) -> BoxFuture<'a, ProviderResult<AddOutcome>>;

    /// Detaches the resource's device.
    fn remove<'a>(
        &'a self,
        resource: &'a domain::ComposableResource,
    ) -> BoxFuture<'a, ProviderResult<RemoveOutcome>>;

    /// Checks the health of the resource's device.
    fn check<'a>(
        &'a self,
        resource: &'a domain::ComposableResource,
    ) -> BoxFuture<'a, ProviderResult<()>>;

    /// The fabric's devices, telling the provider which ComposableResources hold which.
    fn list<'a>(&'a self, claims: &'a [Claim]) -> BoxFuture<'a, ProviderResult<Vec<DeviceInfo>>>;

    /// The fabric's free devices of the query's kinds, by pool (contract 0.3.0; older
    /// providers answer `not-supported`).
    fn pool<'a>(&'a self, query: &'a PoolQuery) -> BoxFuture<'a, ProviderResult<PoolOutcome>>;

    /// What the provider counted so far, read when the metrics are scraped; `None`
    /// where nothing keeps count (a test double, several providers at once).
    fn counters(&self) -> Option<ProviderCounters>;
}

/// What a provider counted so far: one snapshot, so a wrapper forwards it in one line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProviderCounters {
    /// The provider's name, the label of its budget metrics.
    pub provider: String,
    /// Capability requests its grants refused.
    pub denials: cro_runtime::gate::DenialCounts,
    /// (budget label, times hit) for every budget.
    pub budgets: Vec<(&'static str, u64)>,
    /// Warnings and errors it logged.
    pub warnings: u64,
}

/// The host runtime's provider (a vendor component) is the production implementation.
impl DeviceProvider for cro_runtime::Provider {
    fn add<'a>(&'a self, request: &'a AddRequest) -> BoxFuture<'a, ProviderResult<AddOutcome>> {
        Box::pin(cro_runtime::Provider::add(self, request))
    }

    fn remove<'a>(
        &'a self,
        resource: &'a domain::ComposableResource,
    ) -> BoxFuture<'a, ProviderResult<RemoveOutcome>> {
        Box::pin(cro_runtime::Provider::remove_resource(self, resource))
    }

    fn check<'a>(
        &'a self,
        resource: &'a domain::ComposableResource,
    ) -> BoxFuture<'a, ProviderResult<()>> {
        Box::pin(cro_runtime::Provider::check_resource(self, resource))
    }

    fn list<'a>(&'a self, claims: &'a [Claim]) -> BoxFuture<'a, ProviderResult<Vec<DeviceInfo>>> {
        Box::pin(cro_runtime::Provider::list(self, claims))
    }

    fn pool<'a>(&'a self, query: &'a PoolQuery) -> BoxFuture<'a, ProviderResult<PoolOutcome>> {
        Box::pin(cro_runtime::Provider::pool(self, query))
    }

    fn counters(&self) -> Option<ProviderCounters> {
        let budgets = cro_runtime::Provider::budgets(self).snapshot();
        Some(ProviderCounters {
            provider: self.name().to_owned(),
            denials: cro_runtime::Provider::denials(self),
            budgets: budgets.into_iter().map(|(b, n)| (b.as_str(), n)).collect(),
            warnings: cro_runtime::Provider::warnings(self),
        })
    }
}

/// The operations, for metrics and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Operation {
    Add,
    Remove,
    Check,
    List,
}

impl Operation {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Operation::Add => "add_resource",
            Operation::Remove => "remove_resource",
            Operation::Check => "check_resource",
            Operation::List => "get_resources",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

pub(crate) fn device_type(t: ResourceType) -> DeviceType {
    match t {
        ResourceType::Gpu => DeviceType::Gpu,
        ResourceType::CxlMemory => DeviceType::CxlMemory,
    }
}

/// The provider's view of a ComposableResource.
pub(crate) fn to_domain(resource: &ComposableResource) -> domain::ComposableResource {
    domain::ComposableResource {
        name: resource.name_any(),
        device_type: device_type(resource.spec.resource_type),
        model: resource.spec.model.clone(),
        target_node: resource.spec.target_node.clone(),
        device_id: resource.device_id().map(str::to_owned),
        fabric_device_id: resource.cdi_device_id().map(str::to_owned),
        // The fabric machine a provider reported at attach (crate::provider::node_machine); without
        // one the provider finds the machine through the Node (or its stand-in).
        machine_id: crate::provider::node_machine::NodeMachine::of_resource(resource)
            .and_then(|m| m.fabric_machine),
        force_detach: resource.spec.force_detach,
    }
}

/// The devices ComposableResources hold (their status, or the device an orphan's
/// ready-to-detach label names), as claims for the provider.
pub(crate) fn claims<'a>(
    resources: impl IntoIterator<Item = &'a ComposableResource>,
) -> Vec<Claim> {
    resources
        .into_iter()
        .filter_map(|r| {
            let orphan = r.ready_to_detach().map(|o| o.device_id);
            let device_id = r.device_id().map(str::to_owned).or(orphan)?;
            Some(Claim {
                resource: r.name_any(),
                device_id: Some(device_id),
                fabric_device_id: r.cdi_device_id().map(str::to_owned),
            })
        })
        .collect()
}

/// The attach request for `resource`. Its attempt key is the resource's uid: a
/// ComposableResource is attached at most once in its life, so the uid is the same for
/// every retry of that attach (across operator restarts too) and differs for any other.
pub(crate) fn add_request(resource: &ComposableResource, claims: Vec<Claim>) -> AddRequest {
    AddRequest {
        attempt_key: resource.uid().unwrap_or_else(|| resource.name_any()),
        resource: to_domain(resource),
        size_bytes: None,
        claims,
    }
}

/// Exclusive right to change the devices of one node; see [`InstrumentedProvider`].
pub(crate) struct NodeGuard {
    node: String,
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

/// Calls the provider and records every call in the metrics (operation, outcome, latency)
/// and the log. The controllers go through this, never through the provider directly.
///
/// Attaches and detaches need a [`NodeGuard`]: changes to one node are serialized. A
/// fabric API that resizes a machine by device count (FTI's Cluster Manager) reads the
/// count and writes a new one, so two concurrent changes to one machine would race; and
/// the controller keeps the guard while it stores an attached device's ids or checks
/// that a device it is about to detach is not already someone else's. Different nodes
/// run in parallel.
#[derive(Clone)]
pub(crate) struct InstrumentedProvider {
    inner: Arc<dyn DeviceProvider>,
    metrics: Arc<Metrics>,
    node_locks: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

impl InstrumentedProvider {
    pub(crate) fn new(inner: Arc<dyn DeviceProvider>, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            metrics,
            node_locks: Arc::default(),
        }
    }

    fn record<T>(
        &self,
        op: Operation,
        started: Instant,
        result: &ProviderResult<T>,
        outcome: &str,
    ) {
        let outcome = match result {
            Ok(_) => outcome,
            Err(e) => error_kind(e),
        };
        self.metrics
            .provider_call(op.as_str(), outcome, started.elapsed());
    }

    /// Waits until no other change to `node` is in progress and holds off new ones
    /// until the guard is dropped.
    pub(crate) async fn lock_node(&self, node: &str) -> NodeGuard {
        let lock = {
            let mut locks = self
                .node_locks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Drop locks nobody holds or waits for, so the map does not grow with old nodes.
            locks.retain(|_, l| Arc::strong_count(l) > 1);
            locks.entry(node.to_owned()).or_default().clone()
        };
        NodeGuard {
            node: node.to_owned(),
            _guard: lock.lock_owned().await,
        }
    }

    fn check_guard(guard: &NodeGuard, r: &domain::ComposableResource) -> ProviderResult<()> {
        if guard.node == r.target_node {
            Ok(())
        } else {
            Err(CallError::Instantiate(format!(
                "internal error: change to node {} under the guard of node {}",
                r.target_node, guard.node
            )))
        }
    }

    pub(crate) async fn add(
        &self,
        guard: &NodeGuard,
        request: &AddRequest,
    ) -> ProviderResult<AddOutcome> {
        let r = &request.resource;
        Self::check_guard(guard, r)?;
        let started = Instant::now();
        let result = self.inner.add(request).await;
        let outcome = match &result {
            Ok(AddOutcome::InProgress(_)) => "in_progress",
            _ => "ok",
        };
        self.record(Operation::Add, started, &result, outcome);
        tracing::debug!(resource = %r.name, ?result, "provider add_resource");
        result
    }

    pub(crate) async fn remove(
        &self,
        guard: &NodeGuard,
        r: &domain::ComposableResource,
    ) -> ProviderResult<RemoveOutcome> {
        Self::check_guard(guard, r)?;
        let started = Instant::now();
        let result = self.inner.remove(r).await;
        let outcome = match &result {
            Ok(RemoveOutcome::InProgress(_)) => "in_progress",
            _ => "ok",
        };
        self.record(Operation::Remove, started, &result, outcome);
        tracing::debug!(resource = %r.name, ?result, "provider remove_resource");
        result
    }

    pub(crate) async fn check(&self, r: &domain::ComposableResource) -> ProviderResult<()> {
        let started = Instant::now();
        let result = self.inner.check(r).await;
        self.record(Operation::Check, started, &result, "ok");
        result
    }

    /// The fabric's devices, telling the provider what ComposableResources hold.
    pub(crate) async fn list(&self, claims: &[Claim]) -> ProviderResult<Vec<DeviceInfo>> {
        let started = Instant::now();
        let result = self.inner.list(claims).await;
        self.record(Operation::List, started, &result, "ok");
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Records the most calls in flight at once.
    #[derive(Default)]
    struct Overlap {
        now: AtomicUsize,
        max: AtomicUsize,
    }

    impl DeviceProvider for Overlap {
        fn add<'a>(&'a self, _: &'a AddRequest) -> BoxFuture<'a, ProviderResult<AddOutcome>> {
            Box::pin(async move {
                let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
                self.max.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                self.now.fetch_sub(1, Ordering::SeqCst);
                Err(CallError::Provider(ProviderError::NoCapacity(
                    "none".into(),
                )))
            })
        }
        fn remove<'a>(
            &'a self,
            _: &'a domain::ComposableResource,
        ) -> BoxFuture<'a, ProviderResult<RemoveOutcome>> {
            Box::pin(async { Ok(RemoveOutcome::Removed) })
        }
        fn check<'a>(
            &'a self,
            _: &'a domain::ComposableResource,
        ) -> BoxFuture<'a, ProviderResult<()>> {
            Box::pin(async { Ok(()) })
        }
        fn list<'a>(&'a self, _: &'a [Claim]) -> BoxFuture<'a, ProviderResult<Vec<DeviceInfo>>> {
            Box::pin(async { Ok(Vec::new()) })
        }
        fn pool<'a>(&'a self, _: &'a PoolQuery) -> BoxFuture<'a, ProviderResult<PoolOutcome>> {
            Box::pin(async { Ok(PoolOutcome::NotSupported("a test double".into())) })
        }
        fn counters(&self) -> Option<ProviderCounters> {
            None
        }
    }

    fn resource(node: &str) -> domain::ComposableResource {
        domain::ComposableResource {
            name: format!("gpu-{node}"),
            device_type: DeviceType::Gpu,
            model: "A100".into(),
            target_node: node.into(),
            device_id: None,
            fabric_device_id: None,
            machine_id: None,
            force_detach: false,
        }
    }

    async fn max_overlap(nodes: [&str; 3]) -> (usize, String) {
        let inner = Arc::new(Overlap::default());
        let metrics = Arc::new(Metrics::new());
        let p = InstrumentedProvider::new(inner.clone(), metrics.clone());
        let calls = nodes.map(resource);
        futures::future::join_all(calls.iter().map(|r| async {
            let guard = p.lock_node(&r.target_node).await;
            p.add(&guard, &AddRequest::new(r.clone())).await
        }))
        .await;
        (inner.max.load(Ordering::SeqCst), metrics.encode())
    }

    fn held(name: &str, uid: Option<&str>, device: Option<&str>) -> ComposableResource {
        let mut r = ComposableResource::new(
            name,
            cro_api::ComposableResourceSpec {
                resource_type: cro_api::ResourceType::Gpu,
                model: "A100".into(),
                target_node: "n1".into(),
                force_detach: false,
            },
        );
        r.metadata.uid = uid.map(str::to_owned);
        if let Some(id) = device {
            r.status = Some(cro_api::ComposableResourceStatus {
                device_id: id.into(),
                cdi_device_id: format!("fabric-{id}"),
                ..Default::default()
            });
        }
        r
    }

    #[test]
    fn claims_name_held_devices_and_the_attempt_key_is_the_uid() {
        let rs = [
            held("a", Some("uid-a"), Some("GPU-1")),
            held("b", Some("uid-b"), None),
        ];
        assert_eq!(
            claims(&rs),
            [Claim {
                resource: "a".into(),
                device_id: Some("GPU-1".into()),
                fabric_device_id: Some("fabric-GPU-1".into()),
            }]
        );
        let req = add_request(&rs[1], claims(&rs));
        assert_eq!(req.attempt_key, "uid-b");
        assert_eq!(req.resource.name, "b");
        assert_eq!(req.claims.len(), 1);
        // A resource not yet stored (no uid) falls back to its name.
        assert_eq!(
            add_request(&held("c", None, None), Vec::new()).attempt_key,
            "c"
        );
    }

    #[tokio::test]
    async fn changes_on_one_node_are_serialized_and_counted() {
        let (same, metrics) = max_overlap(["n1", "n1", "n1"]).await;
        assert_eq!(same, 1);
        assert!(metrics.contains(
            "cro_provider_calls_total{operation=\"add_resource\",outcome=\"no_capacity\"} 3"
        ));
        let (spread, _) = max_overlap(["n1", "n2", "n3"]).await;
        assert_eq!(spread, 3);
    }
}

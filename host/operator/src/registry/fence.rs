//! Node commands pass the same fence as fabric calls: a command on a node is made only
//! while this replica holds the Lease of the provider serving that node
//! (crate::provider::tenure). Draining a GPU or reloading a driver on behalf of a
//! provider another replica now holds would race that replica's own steps on the node.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::Registry;
use crate::nodeops::{CommandRunner, ExecOutput, NodeOpsError, PodRef};

/// A [`CommandRunner`] that asks the registry's fence before each command.
pub(crate) struct FencedRunner {
    inner: Arc<dyn CommandRunner>,
    registry: Arc<Registry>,
}

impl FencedRunner {
    pub(crate) fn new(inner: Arc<dyn CommandRunner>, registry: Arc<Registry>) -> Self {
        Self { inner, registry }
    }
}

impl CommandRunner for FencedRunner {
    fn run<'a>(
        &'a self,
        pod: &'a PodRef,
        command: &'a [String],
    ) -> BoxFuture<'a, Result<ExecOutput, NodeOpsError>> {
        Box::pin(async move {
            // Alone, every provider is held and routing is not even asked.
            if self.registry.tenure().is_leased()
                && let Err(why) = self.registry.fence_node(&pod.node)
            {
                return Err(NodeOpsError::Fenced {
                    node: pod.node.clone(),
                    command: command.join(" "),
                    why,
                });
            }
            self.inner.run(pod, command).await
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use cro_runtime::domain::{
        self, AddOutcome, AddRequest, Claim, DeviceInfo, PoolOutcome, PoolQuery, RemoveOutcome,
    };

    use super::*;
    use crate::provider::tenure::{Tenure, TenureCell};
    use crate::provider::{DeviceProvider, ProviderResult};

    /// Counts what reaches it.
    #[derive(Default)]
    struct Counting(AtomicUsize);

    impl CommandRunner for Counting {
        fn run<'a>(
            &'a self,
            _: &'a PodRef,
            _: &'a [String],
        ) -> BoxFuture<'a, Result<ExecOutput, NodeOpsError>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async {
                Ok(ExecOutput {
                    stdout: "ok".into(),
                    stderr: String::new(),
                    exit_code: 0,
                })
            })
        }
    }

    impl DeviceProvider for Counting {
        fn add<'a>(&'a self, _: &'a AddRequest) -> BoxFuture<'a, ProviderResult<AddOutcome>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(AddOutcome::InProgress("later".into())) })
        }
        fn remove<'a>(
            &'a self,
            _: &'a domain::ComposableResource,
        ) -> BoxFuture<'a, ProviderResult<RemoveOutcome>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(RemoveOutcome::Removed) })
        }
        fn check<'a>(
            &'a self,
            _: &'a domain::ComposableResource,
        ) -> BoxFuture<'a, ProviderResult<()>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(()) })
        }
        fn list<'a>(&'a self, _: &'a [Claim]) -> BoxFuture<'a, ProviderResult<Vec<DeviceInfo>>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(Vec::new()) })
        }
        fn pool<'a>(&'a self, _: &'a PoolQuery) -> BoxFuture<'a, ProviderResult<PoolOutcome>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(PoolOutcome::NotSupported("a test double".into())) })
        }
        fn counters(&self) -> Option<crate::provider::ProviderCounters> {
            None
        }
    }

    fn resource() -> domain::ComposableResource {
        domain::ComposableResource {
            name: "gpu-1".into(),
            device_type: domain::DeviceType::Gpu,
            model: "A100".into(),
            target_node: "n1".into(),
            device_id: Some("GPU-1".into()),
            fabric_device_id: None,
            machine_id: None,
            force_detach: false,
        }
    }

    /// Commands and calls reach the node and the provider only while the tenure holds
    /// the provider: not before its Lease is held, and not once its time is up.
    #[tokio::test]
    async fn commands_and_calls_pass_only_while_the_lease_is_held() {
        let provider = Arc::new(Counting::default());
        let cell = TenureCell::default();
        let registry = Registry::single_in("default", provider.clone(), cell.clone());
        let tenure = Arc::new(Tenure::leased("replica-a"));
        cell.set(tenure.clone());
        let node = Arc::new(Counting::default());
        let runner = FencedRunner::new(node.clone(), registry.clone());
        let pod = PodRef {
            namespace: "gpu-operator".into(),
            name: "driver".into(),
            node: "n1".into(),
            container: None,
        };
        let command = ["nvidia-smi".to_owned()];

        let refused = runner.run(&pod, &command).await.unwrap_err();
        assert!(matches!(refused, NodeOpsError::Fenced { .. }), "{refused}");
        assert!(
            refused
                .to_string()
                .contains("replica replica-a does not hold provider default's Lease"),
            "{refused}"
        );
        let call = registry.check(&resource()).await.unwrap_err();
        assert!(call.to_string().contains("does not hold"), "{call}");
        assert_eq!(node.0.load(Ordering::SeqCst), 0);
        assert_eq!(provider.0.load(Ordering::SeqCst), 0);

        tenure.hold_until("default", Instant::now() + Duration::from_secs(60));
        runner.run(&pod, &command).await.unwrap();
        registry.check(&resource()).await.unwrap();
        assert_eq!(node.0.load(Ordering::SeqCst), 1);
        assert_eq!(provider.0.load(Ordering::SeqCst), 1);

        // Its time up (a pause outlived it): refused again, with nothing sent.
        tenure.hold_until("default", Instant::now());
        assert!(runner.run(&pod, &command).await.is_err());
        assert!(registry.check(&resource()).await.is_err());
        assert_eq!(node.0.load(Ordering::SeqCst), 1);
        assert_eq!(provider.0.load(Ordering::SeqCst), 1);
        // The runtime's fence answers the same.
        assert!(registry.fence("default")().is_err());
    }
}

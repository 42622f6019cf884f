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

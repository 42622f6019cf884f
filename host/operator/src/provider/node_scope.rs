//! Which Nodes a provider's listing of Nodes shows: the nodes it serves.
//!
//! A provider lists the cluster's Nodes to list its fabric's devices; the FTI provider
//! then asks its fabric about each node's machine, one call per node. Where several
//! CdiProviders split the nodes between them (their `nodeSelector`s), each one listed
//! every Node and asked its fabric about the other providers' nodes too: calls that
//! could only fail (the fabric does not know those machines) or find nothing, whose
//! devices the registry then dropped. In the replicas benchmark (4 providers of 32 nodes
//! each, 500 ms per fabric call) one listing made 128 calls, 64 s, where 32 do, and the
//! attach that must look first after a replica's crash waited for it. So the registry
//! gives each provider a [`NodeScope`]: its cluster view's listing of Nodes shows only
//! the nodes the registry routes to it (docs/providers.md, "Routing"). A lookup of one
//! Node by name is not scoped: a provider asked about a node reads that node.

use std::future::Future;
use std::sync::Arc;

tokio::task_local! {
    /// The one node a call made within [`focused_on`] is about.
    static FOCUS: String;
}

/// Runs `call` with every listing of Nodes it makes (in this task) showing at most
/// `node`. For a call whose answer only matters for one node: the look for the device
/// an attach with a lost reply may have left (`controllers::resource::adopt`) reads
/// only its target node's devices, and a provider that lists its fabric node by node
/// (FTI: one fabric call per node's machine) then asks about that one machine instead
/// of every node it serves (32 calls of 500 ms in the replicas benchmark, while the
/// attach waits). Task-local, so a provider's other calls in flight meanwhile list as
/// before.
pub(crate) async fn focused_on<F: Future>(node: &str, call: F) -> F::Output {
    FOCUS.scope(node.to_owned(), call).await
}

/// Whether a provider serves a node (by name).
type Serves = dyn Fn(&str) -> bool + Send + Sync;

/// Which nodes a listing shows. Clones share the rule.
#[derive(Clone, Default)]
pub struct NodeScope {
    /// None: every node.
    serves: Option<Arc<Serves>>,
}

impl NodeScope {
    /// Every node: a provider that serves them all (`cro run`'s implicit provider).
    pub fn every_node() -> NodeScope {
        NodeScope::default()
    }

    /// The nodes `serves` accepts, asked at each listing (routing changes as
    /// providers and node labels do).
    pub(crate) fn only(serves: impl Fn(&str) -> bool + Send + Sync + 'static) -> NodeScope {
        NodeScope {
            serves: Some(Arc::new(serves)),
        }
    }

    /// Whether a listing shows node `name` (within [`focused_on`], only its node).
    pub(crate) fn shows(&self, name: &str) -> bool {
        FOCUS.try_with(|focus| focus == name).unwrap_or(true)
            && self.serves.as_ref().is_none_or(|serves| serves(name))
    }
}

impl std::fmt::Debug for NodeScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rule = if self.serves.is_some() {
            "the nodes routed to the provider"
        } else {
            "every node"
        };
        f.debug_tuple("NodeScope").field(&rule).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_shows_every_node_or_those_its_rule_accepts() {
        assert!(NodeScope::every_node().shows("w1"));
        let scope = NodeScope::only(|node| node.starts_with("pool-a-"));
        assert!(scope.shows("pool-a-1"));
        assert!(!scope.shows("pool-b-1"));
        assert!(!scope.clone().shows("pool-b-1"), "clones share the rule");
    }

    #[tokio::test]
    async fn a_focused_call_lists_its_node_alone_and_other_tasks_list_as_before() {
        let every = NodeScope::every_node();
        let pool_a = NodeScope::only(|node| node.starts_with("pool-a-"));
        let (inside, outside) = tokio::join!(
            focused_on("pool-a-1", async {
                // The focus holds across awaits within the call.
                tokio::task::yield_now().await;
                [
                    every.shows("pool-a-1"),
                    every.shows("pool-a-2"),
                    pool_a.shows("pool-a-1"),
                    pool_a.shows("pool-a-2"),
                ]
            }),
            // Another task's listing meanwhile is not focused.
            tokio::spawn({
                let every = every.clone();
                async move { every.shows("pool-a-2") }
            }),
        );
        assert_eq!(inside, [true, false, true, false]);
        assert!(outside.unwrap());
        // Focused on a node the provider does not serve: nothing shows.
        assert!(!focused_on("pool-b-1", async { pool_a.shows("pool-b-1") }).await);
        assert!(every.shows("pool-a-2"), "no focus after the call");
    }
}

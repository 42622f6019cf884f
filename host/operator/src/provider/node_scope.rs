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

use std::sync::Arc;

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

    /// Whether a listing shows node `name`.
    pub(crate) fn shows(&self, name: &str) -> bool {
        self.serves.as_ref().is_none_or(|serves| serves(name))
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
}

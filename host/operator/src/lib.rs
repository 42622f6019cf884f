//! The operator: decisions of docs/behaviour.md §3–§6 kept as plain functions over small views of the
//! cluster, so they are tested without an API server; the controllers map Kubernetes
//! objects onto these views and carry the decisions out.
//!
//! - [`request`]: the ComposabilityRequest controller (allocation, creating and dropping
//!   ComposableResources, mirroring their state, cleanup on deletion, node GC).
//! - [`resource`]: the ComposableResource controller (attach, health checks, detach with
//!   the drain sequence of [`nodeops`], node GC).
//! - [`sync`]: devices the fabric holds that no resource claims (docs/behaviour.md §5).
//! - [`webhook`]: the validating admission webhook (docs/behaviour.md §6) over TLS.
//! - [`conditions`]: the Ready condition of both kinds, written after every reconciliation.
//! - [`leader`], [`probes`], [`metrics`], [`config`]: plumbing; [`run()`] starts it all.
//!
//! The provider is reached through [`provider::DeviceProvider`] (the host runtime's
//! `Provider` implements it); nodes only through [`nodeops::CommandRunner`].
//!
//! Permissions the operator needs (cluster-wide unless noted): ComposabilityRequests and
//! ComposableResources (all verbs, and their `status`); Nodes (get, list, watch); Pods
//! (list, delete) and `pods/exec` (create); DaemonSets in the GPU operator's namespace
//! (get, patch); `nvidia.com` ClusterPolicies (list); `resource.k8s.io` ResourceSlices
//! (list) and DeviceTaintRules (create, delete); `events.k8s.io` Events (create, patch);
//! Leases in its namespace (get, create, update); the provider's granted Secret (get) and
//! lookup kinds (get, list).

pub mod admission;
pub mod allocation;
pub mod cache;
pub mod certs;
pub mod compat;
pub mod conditions;
pub mod config;
pub mod context;
pub mod credentials;
pub mod error;
pub mod leader;
pub mod metrics;
pub mod metrics_auth;
pub mod node_machine;
pub mod nodeops;
pub mod patch;
pub mod probes;
pub mod provider;
pub mod quantity;
pub mod reconcile;
pub mod registry;
pub mod request;
pub mod resource;
pub mod run;
pub mod serve;
pub mod source;
pub mod startup;
pub mod sync;
pub mod text;
pub mod triggers;
pub mod views;
pub mod webhook;

pub use config::{OperatorConfig, RunArgs};
pub use error::{OperatorError, ReconcileError};
pub use provider::{DeviceProvider, ProviderCallError};
pub use run::{Operator, run};

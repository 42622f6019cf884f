//! The operator: decisions of docs/behaviour.md §3–§6 kept as plain functions over small
//! views of the cluster, so they are tested without an API server; the controllers map
//! Kubernetes objects onto these views and carry the decisions out.
//!
//! The crate's folders, from the bottom up (each uses only those above it in this list,
//! and the root's `text`, `metrics` and `error`):
//!
//! - `decide`: the pure decisions (allocation, admission) and the views they work on.
//! - [`nodeops`]: commands on nodes (driver discovery, the GPU drain sequence, DRA,
//!   device-plugin restarts), reached only through [`nodeops::CommandRunner`].
//! - [`source`]: fetching provider components (HTTPS, OCI, ConfigMap).
//! - [`provider`]: the provider as the controllers see it ([`DeviceProvider`]; the host
//!   runtime's `Provider` implements it), its credentials, and the machine behind a node.
//! - [`config`]: the operator's configuration, from flags and environment or built by
//!   tests, and the Go operator's environment ([`compat`]).
//! - `registry`: the providers by node (one implicit provider, or the cluster's
//!   `CdiProvider` objects), and loading one from a spec ([`provider_spec`]).
//! - `plumbing`: the Kubernetes plumbing the controllers stand on: watch caches, writes,
//!   the Ready condition, one reconciliation's bookkeeping, the shared context.
//! - `controllers`: the ComposabilityRequest and ComposableResource controllers, the
//!   upstream sync of devices no resource claims (docs/behaviour.md §5), and the free
//!   pool published to the scheduler with the binding of claims allocated from it
//!   (docs/dra.md).
//! - `serve`: beside the controllers, what serves clients: probes and `/metrics`, the
//!   validating webhook (docs/behaviour.md §6) and its certificates.
//! - `process`: the operator process: [`Operator`] and [`run()`], signals, leader
//!   election.
//!
//! # Public API
//!
//! What other crates (the `cro` CLI, the benchmarks, the node simulator, the integration
//! tests) use; everything else is `pub(crate)`.
//!
//! - Running: [`run()`], [`Operator`], [`Readiness`], [`OperatorError`], [`Metrics`],
//!   [`shutdown_signal`] (the CLI's kubelet plugin stops on the same signals).
//! - Configuration: the [`config`] module ([`config::RunArgs`], [`config::OperatorConfig`],
//!   [`config::ProviderSource`], [`config::Timings`], [`config::WebhookConfig`],
//!   [`config::WebhookCerts`], [`config::CertPolicy`], [`config::SelfManagedCerts`],
//!   [`config::LeaderElectionConfig`], [`config::DEFAULT_LEASE_NAME`]) and [`compat`]
//!   ([`compat::fti_spec_from_env`], [`compat::CREDENTIALS_SECRET`],
//!   [`compat::DEFAULT_FTI_COMPONENT`]).
//! - Providers: [`DeviceProvider`], [`ProviderCounters`], [`ProviderResult`],
//!   [`ProviderCallError`], [`provider_spec`], [`check_loaded`], [`NodeMachine`],
//!   [`RememberingCluster`], and [`source`] (fetching components); the first four also
//!   at [`provider`].
//! - Nodes: [`nodeops`] ([`nodeops::CommandRunner`], [`nodeops::KubeExecRunner`],
//!   [`nodeops::ExecOutput`], [`nodeops::PodRef`], [`nodeops::NodeOpsError`],
//!   [`nodeops::ExposureMode`], [`nodeops::running_and_ready`]).
//! - Leader election: [`LeaderElector`], [`LeaderElectionConfig`](config::LeaderElectionConfig),
//!   [`leader`] ([`leader::acquire`], [`leader::Leadership`], [`leader::Waiting`]).
//!   [`leases_of`]: the label value naming a deployment's provider and member Leases
//!   (`cro before-uninstall` deletes them).
//! - Names tests look for: [`VALIDATE_PATH`], [`VALIDATE_PROVIDER_PATH`],
//!   [`INSUFFICIENT_NODES`], [`REQUEST_CONTROLLER`], [`ANNOTATION_ATTACH_ATTEMPT`].
//!
//! Permissions the operator needs (cluster-wide unless noted): ComposabilityRequests and
//! ComposableResources (all verbs, and their `status`); Nodes (get, list, watch); Pods
//! (list, delete) and `pods/exec` (create); DaemonSets in the GPU operator's namespace
//! (get, list, watch, patch: without list and watch, each GPU change reads them
//! instead); `nvidia.com` ClusterPolicies (list); `resource.k8s.io` ResourceSlices
//! (list; with `--pool-devices` also create, update, delete), ResourceClaims (with
//! `--pool-devices`: list, and `status` patch) and DeviceTaintRules (create, delete); `events.k8s.io` Events (create, patch);
//! Leases in its namespace (get, list, create, update); the provider's granted Secret (get) and
//! lookup kinds (get, list).

pub mod config;
mod controllers;
mod decide;
mod error;
mod metrics;
pub mod nodeops;
mod plumbing;
mod process;
pub mod provider;
mod registry;
mod serve;
pub mod source;
mod text;

pub use config::compat;
pub use controllers::request::CONTROLLER as REQUEST_CONTROLLER;
pub use controllers::resource::ANNOTATION_ATTACH_ATTEMPT;
pub use decide::allocation::INSUFFICIENT_NODES;
pub use error::OperatorError;
pub use metrics::Metrics;
pub use process::leader::{self, LeaderElector};
pub use process::run::{Operator, run};
pub use process::shards::leases_of;
pub use process::signals::shutdown_signal;
pub use provider::node_cache::{LentCache, NodeCache};
pub use provider::node_machine::{NodeMachine, RememberingCluster};
pub use provider::{DeviceProvider, ProviderCallError, ProviderCounters, ProviderResult};
pub use registry::spec::provider_spec;
pub use registry::startup::check_loaded;
pub use serve::probes::Readiness;
pub use serve::webhook::{VALIDATE_PATH, VALIDATE_PROVIDER_PATH};

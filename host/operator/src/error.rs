//! Errors of reconciliation (shown in `status.error` and Events) and of the operator
//! process.

use crate::decide::allocation::AllocationError;
use crate::nodeops::NodeOpsError;
use crate::provider::{Operation, ProviderCallError};

/// Why one reconciliation did not finish. Its text is what users see in `status.error`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReconcileError {
    #[error("kubernetes API: {}", crate::text::kube_error(.0))]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    NodeOps(#[from] NodeOpsError),
    #[error("provider {op} failed: {source}")]
    Provider {
        op: Operation,
        #[source]
        source: ProviderCallError,
    },
    #[error(transparent)]
    Allocation(#[from] AllocationError),
    /// The object changed since it was read; the next reconcile reads it again.
    #[error("{0} changed while being reconciled")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
}

impl ReconcileError {
    pub(crate) fn provider(op: Operation, source: ProviderCallError) -> Self {
        ReconcileError::Provider { op, source }
    }

    /// A short label for metrics.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            ReconcileError::Kube(_) => "kube",
            ReconcileError::NodeOps(e) => match e {
                NodeOpsError::DriverInstalling { .. }
                | NodeOpsError::NoDriver(_)
                | NodeOpsError::NoGpuOperator(_)
                | NodeOpsError::NoAgent { .. }
                | NodeOpsError::NoAgentDaemonSet { .. } => "driver",
                NodeOpsError::GpuBusy { .. } | NodeOpsError::DeviceHeld { .. } => "gpu_busy",
                _ => "node",
            },
            ReconcileError::Provider { .. } => "provider",
            ReconcileError::Allocation(_) => "allocation",
            ReconcileError::Conflict(_) => "conflict",
            ReconcileError::Invalid(_) => "invalid",
        }
    }

    /// Conflicts are retried at once and are not worth a user's attention.
    pub(crate) fn is_conflict(&self) -> bool {
        match self {
            ReconcileError::Conflict(_) => true,
            ReconcileError::Kube(kube::Error::Api(e)) => e.code == 409,
            _ => false,
        }
    }
}

/// Why the operator could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("configuration: {0}")]
    Config(String),
    #[error("kubernetes client: {}", crate::text::kube_error(.0))]
    Kube(#[from] kube::Error),
    #[error("provider: {0}")]
    Provider(String),
    #[error("webhook: {0}")]
    Webhook(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("leader election: {0}")]
    Leadership(String),
    #[error("the custom resource definitions are not installed: {0}")]
    MissingCrds(String),
    #[error("{0} stopped unexpectedly")]
    Stopped(&'static str),
}

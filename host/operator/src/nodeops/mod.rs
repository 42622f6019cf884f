//! GPU work on a node (docs/node-operations.md): which driver setup a node has, what its
//! GPUs are doing, and draining one GPU before the fabric takes it away.
//!
//! Everything reaches the node through [`CommandRunner`], the one seam a test replaces
//! (the test API server has no kubelets to exec into); discovery, parsing and the drain
//! order stay real.

pub(crate) mod dra;
pub(crate) mod driver;
pub(crate) mod plugins;
pub(crate) mod runner;
pub(crate) mod smi;

mod gpu;

pub use driver::running_and_ready;
pub(crate) use driver::{Discovery, Driver};
pub use gpu::ExposureMode;
pub(crate) use gpu::{DrainOptions, GpuOps};
pub use runner::{CommandRunner, ExecOutput, KubeExecRunner, PodRef};
pub use smi::SmiError;

/// Errors of node operations. Several are expected states ("still installing", "busy")
/// that the controller reports and retries.
#[derive(Debug, thiserror::Error)]
pub enum NodeOpsError {
    #[error("the NVIDIA driver on node {node} is still installing (pod {pod} not ready)")]
    DriverInstalling { node: String, pod: String },
    #[error("no nvidia driver found on node {0}")]
    NoDriver(String),
    #[error(
        "no NVIDIA GPU operator ClusterPolicy and no host driver on node {0}: install the GPU operator, or for drivers installed on the host deploy cro's node agent (chart value nodeAgent.enabled=true) and disable the ClusterPolicy's driver"
    )]
    NoGpuOperator(String),
    #[error("the node agent {agent} for host drivers is not running on node {node}")]
    NoAgent { node: String, agent: String },
    #[error(
        "the DaemonSet {namespace}/{name} was not found: with the GPU operator's driver disabled (driver on the host), the node agent DaemonSet {name} must be deployed in {namespace}"
    )]
    NoAgentDaemonSet { namespace: String, name: String },
    #[error("GPU {gpu} on node {node} is busy: {processes}")]
    GpuBusy {
        node: String,
        gpu: String,
        processes: String,
    },
    #[error("device /dev/nvidia{minor} on node {node} is held by {processes}")]
    DeviceHeld {
        node: String,
        minor: u32,
        processes: String,
    },
    #[error("command `{command}` in pod {pod} failed (exit {code}): {stderr}")]
    CommandFailed {
        pod: String,
        command: String,
        code: i32,
        stderr: String,
    },
    /// A command answered on stderr alone with exit 0 where its answer belongs on stdout:
    /// no answer to parse (an empty list read from it could skip a drain).
    #[error(
        "command `{command}` in pod {pod} exited 0 but printed nothing on stdout, only this on stderr: {stderr}"
    )]
    OnlyStderr {
        pod: String,
        command: String,
        stderr: String,
    },
    // How an exec failed (runner.rs; docs/node-operations.md, "When exec fails"). None of
    // these is an exit code: the command did not run, or did not finish, as asked.
    /// The API server or the kubelet refused the exec because the container cannot run
    /// commands now: not found, not started, restarting or exited, or not in the pod.
    #[error(
        "container {container} of pod {pod} is not running, so the command could not start: {detail}"
    )]
    ContainerNotRunning {
        pod: String,
        container: String,
        detail: String,
    },
    /// Not sent: this replica may not act for the node's provider now (its Lease expired
    /// or moved, crate::provider::tenure); the replica holding it carries on.
    #[error("`{command}` on node {node} not run: {why}")]
    Fenced {
        node: String,
        command: String,
        why: String,
    },
    /// The pod the command was meant for is gone (404 before the command started).
    #[error("pod {pod} does not exist (any more), so the command could not start: {detail}")]
    PodNotFound { pod: String, detail: String },
    /// The pod was deleted (or is being deleted) while the command ran in it.
    #[error("pod {pod} was deleted while `{command}` ran in it; its output was discarded")]
    PodDeleted { pod: String, command: String },
    /// The exec stream ended without an exit status: the kubelet restarted, a connection
    /// was lost. The command may or may not have finished.
    #[error(
        "`{command}` in pod {pod} was interrupted: the exec stream ended without an exit status ({detail}); its output was discarded"
    )]
    Interrupted {
        pod: String,
        command: String,
        detail: String,
    },
    /// No exit status within the runner's limit; the command may still run on the node.
    #[error(
        "`{command}` in pod {pod} gave no exit status within {limit:?} and was abandoned (it may still run on the node)"
    )]
    ExecTimeout {
        pod: String,
        command: String,
        limit: std::time::Duration,
    },
    /// The command was killed by a signal (exit 128+N: 137 SIGKILL, 143 SIGTERM); what it
    /// printed until then is not an answer.
    #[error(
        "`{command}` in pod {pod} was killed by {} (exit {}); its partial output was discarded",
        runner::signal_name(*.signal),
        128 + .signal
    )]
    Killed {
        pod: String,
        command: String,
        signal: i32,
    },
    /// Any other exec failure (the kubelet unreachable, exec forbidden, the program not
    /// found in the container, …), in the API server's or kubelet's words.
    #[error("exec into pod {pod}: {message}")]
    Exec { pod: String, message: String },
    #[error("unexpected output from node {node}: {source}")]
    Parse {
        node: String,
        #[source]
        source: smi::SmiError,
    },
    #[error("{what} is not served by this API server: {why}")]
    ApiUnavailable { what: &'static str, why: String },
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl NodeOpsError {
    /// Whether the error is expected to clear by itself: a state of the node that passes
    /// (a driver installing, GPU work ending) or an exec that failed on its way (the
    /// pod restarting or replaced, the kubelet restarting, a lost connection, a killed
    /// or timed-out command). The controller retries every error with backoff; the
    /// others need a person (install or fix something) before a retry can succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            NodeOpsError::DriverInstalling { .. }
            | NodeOpsError::NoAgent { .. }
            | NodeOpsError::GpuBusy { .. }
            | NodeOpsError::DeviceHeld { .. }
            | NodeOpsError::ContainerNotRunning { .. }
            | NodeOpsError::PodNotFound { .. }
            | NodeOpsError::PodDeleted { .. }
            | NodeOpsError::Interrupted { .. }
            | NodeOpsError::ExecTimeout { .. }
            | NodeOpsError::Killed { .. }
            | NodeOpsError::Exec { .. }
            | NodeOpsError::Fenced { .. }
            | NodeOpsError::Kube(_) => true,
            NodeOpsError::NoDriver(_)
            | NodeOpsError::NoGpuOperator(_)
            | NodeOpsError::NoAgentDaemonSet { .. }
            | NodeOpsError::CommandFailed { .. }
            | NodeOpsError::OnlyStderr { .. }
            | NodeOpsError::Parse { .. }
            | NodeOpsError::ApiUnavailable { .. } => false,
        }
    }
}

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
        "no NVIDIA GPU operator ClusterPolicy and no host driver on node {0}: install the GPU operator"
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

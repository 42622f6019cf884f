//! cro's DRA kubelet plugin. The kubelet calls it, under cro's driver name, to prepare a
//! Pod's ResourceClaim before the Pod's containers start and to unprepare it after they
//! stop. By then the binding controller has attached the claim's fabric GPU to this node
//! and written its UUID into the claim's device status; preparing hands that GPU to the
//! containers as a CDI device setting `NVIDIA_VISIBLE_DEVICES` to its UUID, the variable
//! the NVIDIA container toolkit selects GPUs by. See docs/dra.md.

mod authority;
mod cdi;
mod claims;
mod proto;
mod serve;

use std::future::Future;
use std::path::PathBuf;

pub use claims::ClaimError;

/// Where the plugin runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// This node's name: a claim's device must be attached here.
    pub node_name: String,
    /// The kubelet's root directory (`/var/lib/kubelet`): the plugin registers under its
    /// `plugins_registry/` and serves under `plugins/<driver>/`.
    pub kubelet_dir: PathBuf,
    /// The CDI spec directory the container runtime reads (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
}

/// Why the plugin stopped.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("cannot {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the {which} gRPC server failed: {source}")]
    Serve {
        which: &'static str,
        #[source]
        source: tonic::transport::Error,
    },
}

/// Serves the kubelet until `shutdown` completes, then unregisters (removes its sockets).
pub async fn run(
    client: kube::Client,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), PluginError> {
    serve::serve(client, config, shutdown).await
}

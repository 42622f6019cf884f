//! `cro kubelet-plugin`: the DRA kubelet plugin of cro's driver, one per node (the chart's
//! DaemonSet `cro-kubelet-plugin`). The work is in the `cro-kubelet-plugin` crate.

use std::path::PathBuf;

use anyhow::Context as _;

#[derive(Debug, clap::Args)]
pub struct KubeletPluginArgs {
    /// This node's name (the DaemonSet passes spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// The kubelet's root directory.
    #[arg(long, env = "CRO_KUBELET_DIR", default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,
    /// The CDI spec directory the container runtime reads.
    #[arg(long, env = "CRO_CDI_DIR", default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,
}

pub fn run(args: KubeletPluginArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = kube::Client::try_default()
            .await
            .context("cannot reach the cluster (in-cluster service account or KUBECONFIG)")?;
        let config = cro_kubelet_plugin::Config {
            node_name: args.node_name,
            kubelet_dir: args.kubelet_dir,
            cdi_dir: args.cdi_dir,
        };
        // SIGTERM (the kubelet stopping the pod) or SIGINT, as for the operator.
        cro_kubelet_plugin::run(client, config, cro_operator::shutdown_signal())
            .await
            .context("the kubelet plugin stopped")
    })
}

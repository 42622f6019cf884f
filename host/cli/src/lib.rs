//! The `cro` command line: `cro run` (the operator), `cro status` (requests, devices,
//! nodes and errors), `cro crds` (the CRD manifests), `cro before-uninstall` (what an
//! uninstall must do first), `cro provider ...` (provider components: `inspect`, `call`,
//! `test`, `new`).

pub mod inspect;
pub mod kubelet_plugin;
pub mod provider;
pub mod scaffold;
pub mod status;
pub mod uninstall;

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

pub use inspect::InspectArgs;

/// cro: attach composable GPUs and CXL memory to Kubernetes nodes through sandboxed
/// WebAssembly vendor providers.
#[derive(Debug, Parser)]
#[command(name = "cro", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the operator.
    ///
    /// Starts the request and resource controllers, the upstream sync, the validating
    /// webhook, metrics and probes. Uses the in-cluster service account or, outside a
    /// cluster, KUBECONFIG. Every flag can also be set by its environment variable.
    Run(Box<cro_operator::config::RunArgs>),
    /// Show every ComposabilityRequest with its devices, their nodes and errors.
    ///
    /// One line per device (ComposableResource); a request without devices gets one line,
    /// and devices no request claims are listed last. Uses KUBECONFIG or the in-cluster
    /// service account.
    Status,
    /// Print the CRDs this version serves, as YAML.
    ///
    /// Apply them with `cro crds | kubectl apply -f -`.
    Crds,
    /// Run before deleting the operator (the chart's pre-delete hook runs it): refuse
    /// while requests or devices exist, listing them, or with `--detach` delete them and
    /// wait until every device is detached; then scale the operator's Deployment to zero
    /// and wait for its pods, so the leader Lease is released. Exits 1 on a refusal or at
    /// the deadline, having changed nothing that loses work.
    BeforeUninstall(uninstall::BeforeUninstallArgs),
    /// Serve the kubelet as the DRA plugin of cro's driver on this node: prepare a Pod's
    /// claim by handing its containers the fabric GPU cro attached (a CDI device setting
    /// NVIDIA_VISIBLE_DEVICES to the GPU's UUID). The chart runs it as a DaemonSet when
    /// the fabric's pool is published (docs/dra.md).
    KubeletPlugin(kubelet_plugin::KubeletPluginArgs),
    /// Work with provider components (WebAssembly components of the cro:provider world).
    #[command(subcommand)]
    Provider(ProviderCommand),
}

#[derive(Debug, Subcommand)]
pub enum ProviderCommand {
    /// Show a component's world, contract version, imports and exports, and whether this
    /// host can load it; for contract 0.2.0 and later also what the provider declares it
    /// needs, against what a spec grants (the capability report). Exits non-zero when
    /// it cannot be loaded.
    Inspect(InspectArgs),
    /// Run one operation of a provider without a cluster, printing its outcome and a
    /// trace of every capability call it made (allowed or denied, URL or key, status,
    /// bytes, duration). Exits non-zero on an error outcome.
    ///
    /// Example: `cro provider call fti.wasm add --config endpoint=https://127.0.0.1:8443
    /// --grant http=https://127.0.0.1:8443,ca=ca.pem --grant lookup=v1/Node
    /// --node worker-0=fsas-cdi://MACHINE --name gpu-1 --model "A100 40G" --target-node worker-0`
    Call(Box<provider::CallArgs>),
    /// Run the conformance suite on a provider: against cro's simulator of its fabric
    /// (chosen from its describe(), or `--fabric`), any fabric's simulator that speaks
    /// the control protocol (`--fabric-sim URL`), or a vendor's lab fabric with
    /// `--endpoint` (non-destructive unless `--allow-attach`). One line per check, a
    /// summary, `--junit`/`--json` reports; exits non-zero when a check fails.
    Test(Box<provider::TestArgs>),
    /// Serve one of cro's simulated fabrics with the control protocol
    /// (docs/fabric-sim-protocol.md) until interrupted, printing its base URL: what
    /// `cro provider test --fabric-sim URL` drives, and a working example of the protocol
    /// for a vendor writing a simulator of its own fabric.
    Sim(provider::SimArgs),
    /// Scaffold a provider that passes `cro provider test` as generated: for a generic
    /// REST fabric (the default), with that fabric's reference simulator
    /// (`fabric_sim.py`, speaking the control protocol), in Rust on the SDK, Python or
    /// JavaScript (`--lang`); or for FTI in Rust (`--template fti`).
    New(scaffold::NewArgs),
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => run_operator(*args),
        Command::KubeletPlugin(args) => kubelet_plugin::run(args).map(|()| ExitCode::SUCCESS),
        Command::Status => status_command(),
        Command::Crds => {
            print!("{}", crds_yaml()?);
            Ok(ExitCode::SUCCESS)
        }
        Command::BeforeUninstall(args) => before_uninstall_command(&args),
        Command::Provider(ProviderCommand::Inspect(args)) => inspect::inspect_command(&args),
        Command::Provider(ProviderCommand::Call(args)) => provider::call_command(&args),
        Command::Provider(ProviderCommand::Test(args)) => provider::test_command(&args),
        Command::Provider(ProviderCommand::Sim(args)) => provider::sim_command(&args),
        Command::Provider(ProviderCommand::New(args)) => scaffold::new_command(&args),
    }
}

fn run_operator(args: cro_operator::config::RunArgs) -> anyhow::Result<ExitCode> {
    let config = args.into_config().context("invalid configuration")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime
        .block_on(cro_operator::run(config))
        .context("the operator stopped")?;
    Ok(ExitCode::SUCCESS)
}

fn status_command() -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let table = runtime.block_on(async {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = kube::Client::try_default()
            .await
            .context("cannot reach the cluster (KUBECONFIG or in-cluster)")?;
        let requests: kube::Api<cro_api::ComposabilityRequest> = kube::Api::all(client.clone());
        let resources: kube::Api<cro_api::ComposableResource> = kube::Api::all(client);
        let params = kube::api::ListParams::default();
        let requests = requests
            .list(&params)
            .await
            .map_err(|e| status::list_error(e, "ComposabilityRequests"))?;
        let resources = resources
            .list(&params)
            .await
            .map_err(|e| status::list_error(e, "ComposableResources"))?;
        anyhow::Ok(status::render(&status::rows(
            &requests.items,
            &resources.items,
        )))
    })?;
    print!("{table}");
    Ok(ExitCode::SUCCESS)
}

fn before_uninstall_command(args: &uninstall::BeforeUninstallArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let outcome = runtime.block_on(async {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = kube::Client::try_default()
            .await
            .context("cannot reach the cluster (KUBECONFIG or in-cluster)")?;
        let mut out = std::io::stdout();
        anyhow::Ok(uninstall::before_uninstall(client, args, &mut out).await?)
    })?;
    Ok(match outcome {
        uninstall::Outcome::Ready => ExitCode::SUCCESS,
        uninstall::Outcome::Refused | uninstall::Outcome::TimedOut => ExitCode::FAILURE,
    })
}

/// An error and its causes on one line. Many library errors already print their source
/// in their own message, so a cause whose text is already there is left out.
pub fn error_report(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// All CRDs as one multi-document YAML stream, the same text as the files in `crds/`.
pub fn crds_yaml() -> anyhow::Result<String> {
    let files = cro_api::crd_files().context("cannot render the CRDs")?;
    Ok(files
        .iter()
        .map(|f| f.yaml.as_str())
        .collect::<Vec<_>>()
        .join("---\n"))
}

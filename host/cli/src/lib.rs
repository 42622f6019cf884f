//! The `cro` command line: `cro run` (the operator), `cro status` (requests, devices,
//! nodes and errors), `cro crds` (the CRD manifests), `cro provider ...` (provider
//! components; `cro provider test` will join `inspect`).

pub mod status;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use cro_runtime::ComponentInfo;
use cro_runtime::inspect::{SUPPORTED_VERSIONS, inspect};

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
    /// Work with provider components (WebAssembly components of the cro:provider world).
    #[command(subcommand)]
    Provider(ProviderCommand),
}

#[derive(Debug, Subcommand)]
pub enum ProviderCommand {
    /// Show a component's world, contract version, imports and exports, and whether this
    /// host can load it. Exits non-zero when it cannot.
    Inspect(InspectArgs),
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The provider component (a `.wasm` file built for wasm32-wasip2).
    pub file: PathBuf,
    /// Print the description as JSON.
    #[arg(long)]
    pub json: bool,
    /// List the functions of every import, not only of the cro:provider ones.
    #[arg(long, short)]
    pub verbose: bool,
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => run_operator(*args),
        Command::Status => status_command(),
        Command::Crds => {
            print!("{}", crds_yaml()?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Provider(ProviderCommand::Inspect(args)) => inspect_command(&args),
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
            .context("cannot list ComposabilityRequests")?;
        let resources = resources
            .list(&params)
            .await
            .context("cannot list ComposableResources")?;
        anyhow::Ok(status::render(&status::rows(
            &requests.items,
            &resources.items,
        )))
    })?;
    print!("{table}");
    Ok(ExitCode::SUCCESS)
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

fn inspect_command(args: &InspectArgs) -> anyhow::Result<ExitCode> {
    let bytes = std::fs::read(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let info = inspect(&bytes).with_context(|| format!("{}", args.file.display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
    } else {
        print!("{}", render(&args.file, &info, args.verbose));
    }
    match verdict(&info) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(reason) => {
            eprintln!(
                "cro: {}: this host cannot load it: {reason}",
                args.file.display()
            );
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Why this host could not load the component, if it could not.
pub fn verdict(info: &ComponentInfo) -> Result<(), String> {
    let supported = SUPPORTED_VERSIONS.join(", ");
    match &info.contract_version {
        None => Err(
            "it does not export cro:provider/provider (a component of another world)".to_string(),
        ),
        Some(v) if !info.supported_version => Err(format!(
            "it targets cro:provider@{v}; this host supports {supported}"
        )),
        Some(_) if !info.unsatisfied_imports.is_empty() => Err(format!(
            "it imports what this host does not provide: {}",
            info.unsatisfied_imports.join(", ")
        )),
        Some(_) => Ok(()),
    }
}

/// The text form of `cro provider inspect`.
pub fn render(file: &Path, info: &ComponentInfo, verbose: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "component: {}", file.display());
    let _ = writeln!(
        out,
        "world:     {}",
        info.world
            .as_deref()
            .unwrap_or("unknown (no cro:provider/provider export)")
    );
    let contract = match &info.contract_version {
        Some(v) if info.supported_version => format!("cro:provider@{v} (supported)"),
        Some(v) => format!(
            "cro:provider@{v} (NOT supported; this host supports {})",
            SUPPORTED_VERSIONS.join(", ")
        ),
        None => "none".to_string(),
    };
    let _ = writeln!(out, "contract:  {contract}");
    for (title, items) in [("exports", &info.exports), ("imports", &info.imports)] {
        let _ = writeln!(out, "{title}:");
        if items.is_empty() {
            let _ = writeln!(out, "  (none)");
        }
        for item in items.iter() {
            let missing = if title == "imports" && info.unsatisfied_imports.contains(&item.name) {
                "  [not provided by this host]"
            } else {
                ""
            };
            let listed = verbose || title == "exports" || item.name.starts_with("cro:");
            let functions = if item.kind == "instance" && !item.functions.is_empty() && listed {
                format!(": {}", item.functions.join(", "))
            } else if item.kind == "instance" || item.kind == "function" {
                String::new()
            } else {
                format!(" ({})", item.kind)
            };
            let _ = writeln!(out, "  {}{functions}{missing}", item.name);
        }
    }
    out
}

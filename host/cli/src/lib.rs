//! The `cro` command line: `cro run` (the operator), `cro status` (requests, devices,
//! nodes and errors), `cro crds` (the CRD manifests), `cro provider ...` (provider
//! components: `inspect`, `call`, `test`, `new`).

pub mod provider;
pub mod scaffold;
pub mod status;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use cro_runtime::inspect::{SUPPORTED_VERSIONS, inspect, served_exports};
use cro_runtime::{CapabilityReport, ComponentInfo, ProviderInfo, ProviderSpec};

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
    /// Run the conformance suite on a provider: against the simulator of its fabric
    /// (chosen from its describe(), or `--fabric`), or a vendor's lab fabric with
    /// `--endpoint` (non-destructive unless `--allow-attach`). One line per check, a
    /// summary, `--junit`/`--json` reports; exits non-zero when a check fails.
    Test(Box<provider::TestArgs>),
    /// Scaffold a Rust provider on the SDK (Cargo.toml, src/lib.rs with unit tests, a
    /// README with the build command) that passes `cro provider test` as generated.
    New(scaffold::NewArgs),
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
    /// A provider spec (YAML or JSON) whose grants and configuration the capability
    /// report compares with what the component declares; without it, nothing is granted.
    #[arg(long)]
    pub spec: Option<PathBuf>,
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
        Command::Provider(ProviderCommand::Call(args)) => provider::call_command(&args),
        Command::Provider(ProviderCommand::Test(args)) => provider::test_command(&args),
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
    let verdict = verdict(&info);
    // Only a component this host can load can be asked what it declares.
    let declared = match &verdict {
        Ok(()) => Some(declared(args, bytes)?),
        Err(_) => None,
    };
    if args.json {
        let mut value = serde_json::to_value(&info)?;
        if let (Some((provider, report)), Some(map)) = (&declared, value.as_object_mut()) {
            map.insert("provider".into(), serde_json::to_value(provider)?);
            map.insert("capability_report".into(), serde_json::to_value(report)?);
        }
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{}", render(&args.file, &info, args.verbose));
        if let Some((provider, report)) = &declared {
            print!(
                "{}",
                render_declared(provider.as_ref(), report, args.spec.as_deref())
            );
        }
    }
    match verdict {
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

/// What the component declares (`describe`, called with nothing granted) and the
/// capability report against `--spec` (or against nothing granted).
fn declared(
    args: &InspectArgs,
    bytes: Vec<u8>,
) -> anyhow::Result<(Option<ProviderInfo>, CapabilityReport)> {
    let spec = match &args.spec {
        Some(path) => ProviderSpec::from_file(path)?,
        None => ProviderSpec::new("inspect", args.file.clone()),
    };
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let runtime = cro_runtime::Runtime::new(cro_runtime::RuntimeOptions::default())?;
    let provider = tokio
        .block_on(runtime.describe_bytes(bytes))
        .with_context(|| format!("{}", args.file.display()))?;
    let report = CapabilityReport::new(provider.as_ref(), &spec);
    Ok((provider, report))
}

/// The text form of what a provider declares and its capability report.
pub fn render_declared(
    provider: Option<&ProviderInfo>,
    report: &CapabilityReport,
    spec: Option<&Path>,
) -> String {
    let mut out = String::new();
    if let Some(p) = provider {
        let devices = p
            .devices
            .iter()
            .map(|d| {
                let t = serde_json::to_value(d.device_type)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                if d.models.is_empty() {
                    format!("{t} (any model)")
                } else {
                    format!("{t} ({})", d.models.join(", "))
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(out, "provider:  {} {} by {}", p.name, p.version, p.vendor);
        let _ = writeln!(out, "devices:   {devices}");
        let keys = p
            .config
            .iter()
            .map(|k| {
                if k.required {
                    format!("{} (required)", k.name)
                } else {
                    k.name.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(out, "config:    {keys}");
        let c = &p.capabilities;
        let lookup = c
            .lookup
            .iter()
            .map(|l| match &l.when_config {
                Some(key) => format!("{} {} (with {key})", l.api_version, l.kind),
                None => format!("{} {}", l.api_version, l.kind),
            })
            .collect::<Vec<_>>();
        let _ = writeln!(
            out,
            "wants:     http [{}]; secret keys [{}]; lookup [{}]; clocks: {}",
            c.http.join(", "),
            c.secret_keys.join(", "),
            lookup.join(", "),
            if c.clocks { "yes" } else { "no" }
        );
    }
    let against = match spec {
        Some(path) => format!("against the grants of {}", path.display()),
        None => "against nothing granted (pass --spec to compare with a spec)".to_string(),
    };
    if report.declared {
        let _ = writeln!(out, "report:    {against}");
    }
    out.push_str(&report.to_string());
    out
}

/// Why this host could not load the component, if it could not.
pub fn verdict(info: &ComponentInfo) -> Result<(), String> {
    let supported = SUPPORTED_VERSIONS.join(", ");
    match &info.contract_version {
        None => Err(format!(
            "it does not export {} (a component of another world)",
            served_exports()
        )),
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
            .unwrap_or("unknown (no cro:provider export)")
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

//! `cro provider inspect`: what a component is (its world, contract, imports and
//! exports), whether this host can load it, and what it declares against a spec's
//! grants.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use cro_runtime::inspect::{SUPPORTED_VERSIONS, inspect, served_exports};
use cro_runtime::{CapabilityReport, ComponentInfo, ProviderInfo, ProviderSpec};

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

/// `cro provider inspect`.
pub(crate) fn inspect_command(args: &InspectArgs) -> anyhow::Result<ExitCode> {
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
    // A tool's pool slots: a CPython or JavaScript component has more core instances,
    // memories and tables than the operator's defaults allow one slot.
    let runtime = cro_runtime::Runtime::new(cro_conformance::tool_runtime_options())?;
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
    let code = &info.code;
    let _ = writeln!(
        out,
        "code:      {} functions, {} KiB; at most {} locals and {} nested blocks in one \
         function (limits.compile_max_*)",
        code.functions,
        code.code_bytes.div_ceil(1024),
        code.max_locals,
        code.max_nesting
    );
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

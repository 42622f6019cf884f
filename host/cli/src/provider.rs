//! `cro provider call` and `cro provider test`: run a provider component without a
//! cluster. The provider's spec comes from `--spec` or from `--config`/`--grant` flags;
//! what it looks up comes from `--node`/`--objects`, its Secret from `--secret`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use cro_conformance::redact::Redactor;
use cro_conformance::{FabricKind, FtiApi, LabTarget, Recorder, SuiteOptions, UseRecord};
use cro_runtime::cluster::StaticCluster;
use cro_runtime::grants::{HttpGrant, LookupGrant};
use cro_runtime::{
    AddOutcome, AddRequest, CallError, CapabilityReport, Claim, ComposableResource, DeviceType,
    Provider, ProviderSpec, RemoveOutcome, Runtime,
};
use serde_json::{Value, json};

/// Where a provider's spec comes from, and the cluster objects it may look up.
#[derive(Debug, Args)]
pub struct SpecArgs {
    /// A provider spec (YAML or JSON): config, grants, limits. `--config` overrides its
    /// keys; without it the spec is made of `--config` and `--grant`.
    #[arg(long)]
    pub spec: Option<PathBuf>,
    /// A provider configuration key (repeatable): `--config endpoint=https://fabric:8443`.
    #[arg(long = "config", value_name = "KEY=VALUE")]
    pub config: Vec<String>,
    /// A grant (repeatable): `http=URL[,ca=PEM_FILE]`, `secret=NAMESPACE/NAME:KEY,KEY`,
    /// `lookup=API_VERSION/KIND` (e.g. `lookup=v1/Node`), `clocks`.
    #[arg(long = "grant", value_name = "GRANT")]
    pub grants: Vec<String>,
    /// A Node the provider may look up (repeatable): `NAME=PROVIDER_ID`.
    #[arg(long = "node", value_name = "NAME=PROVIDER_ID")]
    pub nodes: Vec<String>,
    /// More cluster objects the provider may look up (multi-document YAML or a List).
    #[arg(long)]
    pub objects: Option<PathBuf>,
    /// A key of the granted Secret (repeatable): `username=admin`.
    #[arg(long = "secret", value_name = "KEY=VALUE")]
    pub secrets: Vec<String>,
    /// The call deadline (`limits.call_timeout_ms`), overriding the spec's.
    #[arg(long)]
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Operation {
    /// What the provider declares (contract 0.2.0 and later).
    Describe,
    /// Attach a device (`add-resource`).
    #[value(alias = "add-resource")]
    Add,
    /// Detach a device (`remove-resource`).
    #[value(alias = "remove-resource")]
    Remove,
    /// Check a device's health (`check-resource`).
    #[value(alias = "check-resource")]
    Check,
    /// Every device the fabric has attached (`get-resources`).
    #[value(alias = "get-resources")]
    List,
}

#[derive(Debug, Args)]
pub struct CallArgs {
    /// The provider component (`.wasm`).
    pub component: PathBuf,
    pub operation: Operation,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// The resource as JSON or YAML (a file, or `-` for standard input) with the fields
    /// of a ComposableResource: name, device_type, model, target_node, device_id,
    /// fabric_device_id, machine_id, force_detach. The flags below override it.
    #[arg(long)]
    pub resource: Option<String>,
    /// The resource's name.
    #[arg(long)]
    pub name: Option<String>,
    /// The resource's device type.
    #[arg(long = "type", value_name = "gpu|cxlmemory")]
    pub device_type: Option<String>,
    /// The resource's model.
    #[arg(long)]
    pub model: Option<String>,
    /// The node the device is (to be) attached to.
    #[arg(long)]
    pub target_node: Option<String>,
    /// The device's id (its serial), once attached.
    #[arg(long)]
    pub device_id: Option<String>,
    /// The fabric's id of the device, once attached.
    #[arg(long)]
    pub fabric_device_id: Option<String>,
    /// The fabric machine the device was attached to, when recorded.
    #[arg(long)]
    pub machine_id: Option<String>,
    /// Detach even if the device is in use.
    #[arg(long)]
    pub force_detach: bool,
    /// The attach's attempt key (default: the resource's name).
    #[arg(long)]
    pub attempt_key: Option<String>,
    /// Bytes of memory wanted (CXL memory).
    #[arg(long)]
    pub size_bytes: Option<u64>,
    /// A device some resource holds (repeatable): `RESOURCE=DEVICE_ID[/FABRIC_DEVICE_ID]`.
    #[arg(long = "claim", value_name = "RESOURCE=DEVICE_ID")]
    pub claims: Vec<String>,
    /// Print the outcome and the trace as JSON.
    #[arg(long)]
    pub json: bool,
    /// Show each HTTP request's and reply's headers and body in the trace, with
    /// credentials taken out (credential-named headers and fields, and every `--secret`
    /// value wherever it appears).
    #[arg(long)]
    pub trace_bodies: bool,
}

#[derive(Debug, Args)]
pub struct TestArgs {
    /// The provider component (`.wasm`).
    pub component: PathBuf,
    /// The simulated fabric (default: chosen from the provider's describe()).
    #[arg(long, value_name = "fti|redfish|nec")]
    pub fabric: Option<String>,
    /// For an FTI provider: the simulated API to run against (default: `cm` when the
    /// provider declares the config key `cluster_id`, else `fm`). A provider that
    /// supports both is certified with one run each.
    #[arg(long, value_name = "fm|cm", conflicts_with = "endpoint")]
    pub fti_api: Option<String>,
    /// Any fabric's simulator that speaks the control protocol (docs/fabric-sim-protocol.md),
    /// at this base URL: the full suite runs against it, judged by its oracle.
    #[arg(long, value_name = "URL", conflicts_with_all = ["endpoint", "fabric", "fti_api"])]
    pub fabric_sim: Option<String>,
    /// A vendor's own fabric instead of a simulator: only non-destructive checks run
    /// unless `--allow-attach`. The spec comes from `--spec` or `--config`/`--grant`
    /// (`endpoint` is configured to this URL unless set).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Against `--endpoint`: also attach, check and detach a device on `--target-node`.
    #[arg(long, requires = "endpoint")]
    pub allow_attach: bool,
    /// Against `--endpoint` with `--allow-attach`: the node to attach to.
    #[arg(long)]
    pub target_node: Option<String>,
    /// Against `--endpoint` with `--allow-attach`: the type of device to attach.
    #[arg(long = "type", value_name = "gpu|cxlmemory", default_value = "gpu")]
    pub device_type: String,
    /// Against `--endpoint` with `--allow-attach`: the model to attach.
    #[arg(long)]
    pub model: Option<String>,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// The shorter deadline of the `deadline` check, in ms.
    #[arg(long, default_value_t = 2000)]
    pub deadline_ms: u64,
    /// Write a JUnit XML report here.
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Write a JSON report here.
    #[arg(long = "json")]
    pub json_file: Option<PathBuf>,
    /// Show every call and its capability trace under its check.
    #[arg(long, short)]
    pub verbose: bool,
}

fn key_value(s: &str, what: &str) -> anyhow::Result<(String, String)> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => bail!("{what} must be KEY=VALUE, not {s:?}"),
    }
}

/// The `grants:` of a spec from `--grant` flags.
pub fn grants_json(grants: &[String]) -> anyhow::Result<Value> {
    let mut http = Vec::new();
    let mut secret = Value::Null;
    let mut lookup = Vec::new();
    let mut clocks = false;
    for g in grants {
        let (kind, rest) = g.split_once('=').unwrap_or((g.as_str(), ""));
        match kind {
            "http" => {
                let mut parts = rest.split(',');
                let url = parts.next().unwrap_or_default();
                let mut grant = json!({"url": url});
                for part in parts {
                    match part.split_once('=') {
                        Some(("ca", file)) => {
                            let pem = std::fs::read_to_string(file)
                                .with_context(|| format!("cannot read the CA {file}"))?;
                            grant["ca_pem"] = pem.into();
                        }
                        _ => bail!("unknown http grant option {part:?} (only ca=PEM_FILE)"),
                    }
                }
                http.push(grant);
            }
            "secret" => {
                let (object, keys) = rest.split_once(':').unwrap_or((rest, ""));
                let Some((namespace, name)) = object.split_once('/') else {
                    bail!("--grant secret=NAMESPACE/NAME:KEY,KEY, not {g:?}");
                };
                let keys: Vec<&str> = keys.split(',').filter(|k| !k.is_empty()).collect();
                secret = json!({"namespace": namespace, "name": name, "keys": keys});
            }
            "lookup" => {
                let Some((api_version, kind)) = rest.rsplit_once('/') else {
                    bail!("--grant lookup=API_VERSION/KIND (e.g. v1/Node), not {g:?}");
                };
                lookup.push(json!({"api_version": api_version, "kind": kind}));
            }
            "clocks" => clocks = true,
            _ => bail!(
                "unknown grant {g:?}: http=URL, secret=NS/NAME:KEYS, lookup=API/KIND or clocks"
            ),
        }
    }
    let mut out = json!({"http": http, "lookup": lookup, "wasi": {"clocks": clocks}});
    if !secret.is_null() {
        out["secret"] = secret;
    }
    Ok(out)
}

impl SpecArgs {
    fn config(&self) -> anyhow::Result<BTreeMap<String, String>> {
        self.config
            .iter()
            .map(|c| key_value(c, "--config"))
            .collect()
    }

    /// The spec: `--spec` with `--config` on top, or one made of the flags.
    pub fn spec(
        &self,
        component: &Path,
        default_config: &[(&str, &str)],
    ) -> anyhow::Result<ProviderSpec> {
        let mut spec = match &self.spec {
            Some(path) => ProviderSpec::from_file(path)
                .with_context(|| format!("provider spec {}", path.display()))?,
            None => {
                let mut config: BTreeMap<String, String> = default_config
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                config.extend(self.config()?);
                let spec = json!({
                    "name": spec_name(component),
                    "component": component,
                    "config": config,
                    "grants": grants_json(&self.grants)?,
                });
                ProviderSpec::from_json(&spec.to_string(), Path::new("."))
                    .context("the provider spec made of --config and --grant")?
            }
        };
        if self.spec.is_some() {
            if !self.grants.is_empty() {
                bail!("--grant and --spec do not mix: put the grants in the spec");
            }
            spec.config.extend(self.config()?);
        }
        spec.component = component.to_path_buf();
        if let Some(ms) = self.timeout_ms {
            spec.limits.call_timeout_ms = ms;
        }
        // `--node` gives the provider Nodes to look up: it may look them up.
        let node_lookup = |g: &LookupGrant| g.api_version == "v1" && g.kind == "Node";
        if !self.nodes.is_empty() && !spec.grants.lookup.iter().any(node_lookup) {
            spec.grants.lookup.push(LookupGrant::new("v1", "Node"));
        }
        spec.validate().context("provider spec")?;
        Ok(spec)
    }

    /// The values given with `--secret` (what `--trace-bodies` takes out).
    pub fn secret_values(&self) -> Vec<String> {
        self.secrets
            .iter()
            .filter_map(|s| s.split_once('=').map(|(_, v)| v.to_owned()))
            .collect()
    }

    /// The cluster the provider sees: `--objects`, `--node` and the granted Secret.
    pub fn cluster(&self, spec: &ProviderSpec) -> anyhow::Result<StaticCluster> {
        let cluster = match &self.objects {
            Some(path) => StaticCluster::from_yaml_file(path)
                .with_context(|| format!("objects {}", path.display()))?,
            None => StaticCluster::new(),
        };
        for node in &self.nodes {
            let (name, provider_id) = key_value(node, "--node")?;
            cluster
                .insert_object(json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name},
                    "spec": {"providerID": provider_id},
                }))
                .with_context(|| format!("--node {node}"))?;
        }
        if let (Some(grant), true, None) =
            (&spec.grants.secret, self.secrets.is_empty(), &self.objects)
        {
            // Granted but given no value: the provider would only see it missing.
            eprintln!(
                "note: the spec grants Secret {}/{} but no --secret gives it a value: the \
                 provider will find it missing (pass --secret KEY=VALUE for each of its keys: {})",
                grant.namespace,
                grant.name,
                grant.keys.join(", ")
            );
        }
        if !self.secrets.is_empty() {
            let Some(grant) = &spec.grants.secret else {
                bail!("--secret needs a secret grant (--grant secret=NAMESPACE/NAME:KEYS)");
            };
            let data = self
                .secrets
                .iter()
                .map(|s| key_value(s, "--secret"))
                .collect::<anyhow::Result<Vec<_>>>()?;
            cluster.insert_secret(&grant.namespace, &grant.name, data);
        }
        Ok(cluster)
    }
}

/// A provider name (a Kubernetes-style name) from the component's file name.
fn spec_name(component: &Path) -> String {
    let stem = component
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let name: String = stem
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(63)
        .collect();
    let name = name.trim_matches('-');
    if name.is_empty() {
        "provider".to_string()
    } else {
        name.to_string()
    }
}

fn tokio() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn read_resource(source: &str) -> anyhow::Result<Value> {
    let text = if source == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("cannot read the resource from standard input")?;
        s
    } else {
        std::fs::read_to_string(source).with_context(|| format!("cannot read {source}"))?
    };
    // YAML is a superset of JSON.
    serde_yaml::from_str(&text).with_context(|| format!("the resource in {source}"))
}

fn device_type(s: &str) -> anyhow::Result<DeviceType> {
    match s.to_ascii_lowercase().as_str() {
        "gpu" => Ok(DeviceType::Gpu),
        "cxlmemory" | "cxl" => Ok(DeviceType::CxlMemory),
        _ => bail!("device type must be gpu or cxlmemory, not {s:?}"),
    }
}

impl CallArgs {
    fn resource(&self) -> anyhow::Result<ComposableResource> {
        let mut v = match &self.resource {
            Some(source) => read_resource(source)?,
            None => json!({}),
        };
        let Some(map) = v.as_object_mut() else {
            bail!("the resource must be an object");
        };
        let mut set = |k: &str, val: Option<&String>| {
            if let Some(val) = val {
                map.insert(k.to_string(), val.clone().into());
            }
        };
        set("name", self.name.as_ref());
        set("model", self.model.as_ref());
        set("target_node", self.target_node.as_ref());
        set("device_id", self.device_id.as_ref());
        set("fabric_device_id", self.fabric_device_id.as_ref());
        set("machine_id", self.machine_id.as_ref());
        if let Some(t) = &self.device_type {
            let t = serde_json::to_value(device_type(t)?)?;
            map.insert("device_type".into(), t);
        }
        if self.force_detach {
            map.insert("force_detach".into(), true.into());
        }
        map.entry("name").or_insert_with(|| "cro-call".into());
        map.entry("device_type").or_insert_with(|| "gpu".into());
        map.entry("model").or_insert_with(|| "".into());
        map.entry("target_node").or_insert_with(|| "".into());
        for k in ["device_id", "fabric_device_id", "machine_id"] {
            map.entry(k).or_insert(Value::Null);
        }
        map.entry("force_detach").or_insert(false.into());
        serde_json::from_value(v).context("the resource")
    }

    fn claims(&self) -> anyhow::Result<Vec<Claim>> {
        self.claims
            .iter()
            .map(|c| {
                let (resource, ids) = key_value(c, "--claim")?;
                let (device, fabric) = match ids.split_once('/') {
                    Some((d, f)) => (d.to_string(), Some(f.to_string())),
                    None => (ids, None),
                };
                Ok(Claim {
                    resource,
                    device_id: Some(device).filter(|d| !d.is_empty()),
                    fabric_device_id: fabric,
                })
            })
            .collect()
    }
}

/// `cro provider call`.
pub fn call_command(args: &CallArgs) -> anyhow::Result<ExitCode> {
    let spec = args.spec.spec(&args.component, &[])?;
    let rt = tokio()?;
    let recorder = Arc::new(if args.trace_bodies {
        Recorder::with_exchanges(Redactor::new(args.spec.secret_values()))
    } else {
        Recorder::new()
    });
    let provider = load_observed(args, &spec, &rt, recorder.clone())?;
    if args.operation == Operation::Describe {
        print_described(args, &spec, &provider)?;
        return Ok(ExitCode::SUCCESS);
    }
    let (op, outcome) = call(args, &rt, &provider)?;
    let text = match &outcome {
        Ok(v) => format!("ok: {v}"),
        Err(e) => format!("error: {e}"),
    };
    let trace = recorder.take_call(op, text);
    let report = CapabilityReport::new(provider.info(), &spec);
    print_call(args, op, &outcome, &trace, &report)?;
    Ok(if outcome.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The component loaded as `spec` says, seeing the cluster of the flags, every
/// capability use reported to `recorder`.
fn load_observed(
    args: &CallArgs,
    spec: &ProviderSpec,
    rt: &tokio::runtime::Runtime,
    recorder: Arc<Recorder>,
) -> anyhow::Result<Provider> {
    let cluster = args.spec.cluster(spec)?;
    let bytes = std::fs::read(&args.component)
        .with_context(|| format!("cannot read {}", args.component.display()))?;
    let runtime = Runtime::new(cro_conformance::tool_runtime_options())?;
    rt.block_on(runtime.load_observed(spec, bytes, Arc::new(cluster), recorder))
        .with_context(|| format!("{}", args.component.display()))
}

/// `cro provider call ... describe`: what the provider declares and the capability
/// report against the spec.
fn print_described(
    args: &CallArgs,
    spec: &ProviderSpec,
    provider: &Provider,
) -> anyhow::Result<()> {
    let report = CapabilityReport::new(provider.info(), spec);
    let text = crate::inspect::render_declared(provider.info(), &report, args.spec.spec.as_deref());
    if args.json {
        let v = json!({"provider": provider.info(), "capability_report": report});
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if provider.info().is_none() {
        println!("contract {} has no describe()", provider.contract_version());
    } else {
        print!("{text}");
    }
    Ok(())
}

/// Calls the operation of the command line (any but `describe`): its name in the
/// contract and its outcome as JSON.
fn call(
    args: &CallArgs,
    rt: &tokio::runtime::Runtime,
    provider: &Provider,
) -> anyhow::Result<(&'static str, Result<Value, CallError>)> {
    Ok(match args.operation {
        Operation::Describe => bail!("describe is not a call with an outcome"),
        Operation::Add => {
            let resource = args.resource()?;
            let request = AddRequest {
                attempt_key: args
                    .attempt_key
                    .clone()
                    .unwrap_or_else(|| resource.name.clone()),
                size_bytes: args.size_bytes,
                claims: args.claims()?,
                resource,
            };
            let r = rt.block_on(provider.add(&request));
            (
                "add-resource",
                r.map(|o| match o {
                    AddOutcome::Attached(d) => json!({"attached": d}),
                    AddOutcome::InProgress(w) => json!({"in_progress": w}),
                }),
            )
        }
        Operation::Remove => {
            let r = rt.block_on(provider.remove_resource(&args.resource()?));
            (
                "remove-resource",
                r.map(|o| match o {
                    RemoveOutcome::Removed => json!("removed"),
                    RemoveOutcome::InProgress(w) => json!({"in_progress": w}),
                }),
            )
        }
        Operation::Check => {
            let r = rt.block_on(provider.check_resource(&args.resource()?));
            ("check-resource", r.map(|()| json!("healthy")))
        }
        Operation::List => {
            let r = rt.block_on(provider.list(&args.claims()?));
            ("get-resources", r.map(|d| json!(d)))
        }
    })
}

/// The outcome of a call and its trace, as text or (`--json`) JSON.
fn print_call(
    args: &CallArgs,
    op: &str,
    outcome: &Result<Value, CallError>,
    trace: &cro_conformance::CallTrace,
    report: &CapabilityReport,
) -> anyhow::Result<()> {
    if args.json {
        // The capability report (wanted but not granted, granted but never wanted) beside
        // the trace, so a script sees both.
        let v = json!({
            "operation": op,
            "ok": outcome.as_ref().ok(),
            "error": outcome.as_ref().err().map(|e| json!({"kind": error_kind(e), "message": e.to_string()})),
            "trace": trace,
            "capability_report": report,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", render_call(trace, outcome));
    }
    Ok(())
}

/// The provider-error case (or the host's reason) of a failed call.
pub fn error_kind(e: &CallError) -> &'static str {
    use cro_runtime::ProviderError as P;
    match e {
        CallError::Provider(p) => match p {
            P::Fabric(_) => "fabric",
            P::MalformedReply(_) => "malformed-reply",
            P::NotFound(_) => "not-found",
            P::Warning(_) => "warning",
            P::Critical(_) => "critical",
            P::Denied(_) => "denied",
            P::Config(_) => "config",
            P::Unavailable(_) => "unavailable",
            P::NoCapacity(_) => "no-capacity",
            P::Other(_) => "other",
        },
        CallError::Trap { .. } => "trap",
        CallError::Timeout(_) => "timeout",
        CallError::OutOfMemory { .. } => "out-of-memory",
        CallError::Budget(_) => "budget",
        CallError::Instantiate(_) => "instantiate",
    }
}

/// The text form of one call: the outcome, every capability use, the cost.
pub fn render_call(
    trace: &cro_conformance::CallTrace,
    outcome: &Result<Value, CallError>,
) -> String {
    let mut out = String::new();
    match outcome {
        Ok(v) => {
            let _ = writeln!(out, "{}: ok", trace.operation);
            let pretty = serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string());
            // JSON escapes control characters but not the invisible format characters
            // (bidi overrides, zero-width) a guest's strings may carry to the terminal.
            for line in pretty.lines() {
                let _ = writeln!(out, "  {}", cro_runtime::escape_line(line, line.len()));
            }
        }
        Err(e) => {
            let _ = writeln!(out, "{}: error ({}): {e}", trace.operation, error_kind(e));
        }
    }
    let _ = writeln!(out, "trace ({} capability calls):", trace.uses.len());
    for u in &trace.uses {
        let _ = writeln!(out, "  {}", UseRecord::line(u));
        if let Some(e) = &u.exchange {
            render_exchange(&mut out, e);
        }
    }
    if trace.uses_dropped > 0 {
        let _ = writeln!(out, "  ... and {} more not recorded", trace.uses_dropped);
    }
    if !trace.logs.is_empty() || trace.logs_dropped > 0 {
        let _ = writeln!(out, "provider log ({} lines):", trace.logs.len());
        for l in &trace.logs {
            let _ = writeln!(out, "  {} {}", l.level, l.message);
        }
        if trace.logs_dropped > 0 {
            let _ = writeln!(out, "  ... and {} more not recorded", trace.logs_dropped);
        }
    }
    let _ = writeln!(
        out,
        "cost: {:.1} ms, peak memory {:.1} MiB",
        trace.duration_ms,
        trace.peak_memory_bytes as f64 / f64::from(1 << 20)
    );
    out
}

/// An HTTP exchange under its use: `>` what was sent, `<` what came back.
fn render_exchange(out: &mut String, e: &cro_conformance::redact::ExchangeRecord) {
    for (mark, headers, body) in [
        ('>', &e.request_headers, &e.request_body),
        ('<', &e.response_headers, &e.response_body),
    ] {
        for h in headers {
            let _ = writeln!(out, "    {mark} {h}");
        }
        if !body.is_empty() {
            let _ = writeln!(out, "    {mark} {body}");
        }
    }
}

/// `--endpoint` grants HTTP to its origin, unless the spec or `--grant` already grants
/// HTTP somewhere (with a CA, say).
fn grant_endpoint(spec: &mut ProviderSpec, endpoint: &str) -> anyhow::Result<()> {
    if !spec.grants.http.is_empty() {
        return Ok(());
    }
    let origin = endpoint
        .split_once("://")
        .and_then(|(scheme, rest)| {
            let authority = rest.split(['/', '?', '#']).next()?;
            (!authority.is_empty()).then(|| format!("{scheme}://{authority}"))
        })
        .with_context(|| format!("--endpoint {endpoint} is not a URL"))?;
    let target = origin
        .parse()
        .map_err(|e: String| anyhow::anyhow!("--endpoint {endpoint}: {e}"))?;
    spec.grants.http.push(HttpGrant::new(target));
    Ok(())
}

/// `cro provider test`.
pub fn test_command(args: &TestArgs) -> anyhow::Result<ExitCode> {
    let mut opts = SuiteOptions::new(args.component.clone());
    opts.fabric = match &args.fabric {
        None => None,
        Some(f) => Some(
            FabricKind::parse(f)
                .with_context(|| format!("--fabric must be fti, redfish or nec, not {f:?}"))?,
        ),
    };
    opts.fti_api = match &args.fti_api {
        None => None,
        Some(a) => Some(
            FtiApi::parse(a).with_context(|| format!("--fti-api must be fm or cm, not {a:?}"))?,
        ),
    };
    opts.config = args.spec.config()?;
    if let Some(ms) = args.spec.timeout_ms {
        opts.call_timeout_ms = ms;
    }
    opts.deadline_ms = args.deadline_ms;
    opts.fabric_sim = args.fabric_sim.clone();
    let rt = tokio()?;
    let report = match &args.endpoint {
        None => {
            if args.spec.spec.is_some() || !args.spec.grants.is_empty() {
                bail!(
                    "--spec and --grant are for --endpoint: against a simulator the suite grants what the fabric needs"
                );
            }
            rt.block_on(cro_conformance::run_simulated(&opts))?
        }
        Some(endpoint) => {
            let mut spec = args.spec.spec(&args.component, &[("endpoint", endpoint)])?;
            grant_endpoint(&mut spec, endpoint)?;
            let cluster = args.spec.cluster(&spec)?;
            let attach = match (args.allow_attach, &args.target_node) {
                (false, _) => None,
                (true, None) => bail!("--allow-attach needs --target-node"),
                (true, Some(node)) => Some(cro_conformance::suite_lab_attach(
                    node,
                    device_type(&args.device_type)?,
                    args.model.clone().unwrap_or_default(),
                )),
            };
            let lab = LabTarget {
                spec,
                cluster,
                endpoint: endpoint.clone(),
                attach,
            };
            rt.block_on(cro_conformance::run_lab(&opts, &lab))?
        }
    };
    print!("{}", report.text(args.verbose));
    if let Some(path) = &args.junit {
        std::fs::write(path, report.junit())
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.json_file {
        std::fs::write(path, report.json())
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[derive(Debug, Args)]
pub struct SimArgs {
    /// The fabric to simulate.
    #[arg(long, value_name = "fti|redfish|nec", default_value = "fti")]
    pub fabric: String,
    /// For FTI: the API a provider is configured for.
    #[arg(long, value_name = "fm|cm", default_value = "fm")]
    pub fti_api: String,
    /// The loopback port of the control protocol (0: any free port).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
}

/// `cro provider sim`: a built-in simulator behind the control protocol.
pub fn sim_command(args: &SimArgs) -> anyhow::Result<ExitCode> {
    let kind = FabricKind::parse(&args.fabric).with_context(|| {
        format!(
            "--fabric must be fti, redfish or nec, not {:?}",
            args.fabric
        )
    })?;
    let api = FtiApi::parse(&args.fti_api)
        .with_context(|| format!("--fti-api must be fm or cm, not {:?}", args.fti_api))?;
    let server = cro_conformance::control::ControlServer::start(
        cro_conformance::control::serve::factory(kind, api),
        args.port,
    )?;
    // One write, and its failure ignored: a reader that takes the first line and closes
    // the pipe (`| head -1`, a test) must not stop the simulator it was told about.
    let text = format!(
        "control protocol at {url}\ntest a provider: cro provider test COMPONENT --fabric-sim {url}\n",
        url = server.url()
    );
    let mut out = std::io::stdout().lock();
    let _ = std::io::Write::write_all(&mut out, text.as_bytes())
        .and_then(|()| std::io::Write::flush(&mut out));
    drop(out);
    tokio()?.block_on(tokio::signal::ctrl_c())?;
    drop(server);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--endpoint` grants its origin when nothing grants HTTP yet, and only then.
    #[test]
    fn the_endpoint_grants_its_origin_unless_http_is_granted() {
        let mut spec = ProviderSpec::new("lab", "p.wasm");
        grant_endpoint(&mut spec, "https://fabric.example:8443/api/v1?x=1").unwrap();
        assert_eq!(spec.grants.http.len(), 1);
        assert_eq!(
            spec.grants.http[0].url.to_string(),
            "https://fabric.example:8443"
        );
        grant_endpoint(&mut spec, "https://second.example/").unwrap();
        assert_eq!(spec.grants.http.len(), 1, "HTTP was granted already");
        let mut bare = ProviderSpec::new("lab", "p.wasm");
        assert!(grant_endpoint(&mut bare, "fabric.example").is_err());
    }

    /// What a guest returns reaches the terminal with its invisible format characters
    /// escaped: a bidi override in a device id cannot reorder the line a vendor reads.
    #[test]
    fn a_returned_value_prints_without_invisible_characters() {
        let trace = cro_conformance::CallTrace {
            operation: "get-resources".into(),
            outcome: "ok".into(),
            duration_ms: 1.0,
            peak_memory_bytes: 1 << 20,
            uses: Vec::new(),
            uses_dropped: 0,
            logs: Vec::new(),
            logs_dropped: 0,
        };
        let value =
            serde_json::json!({"devices": [{"id": "GPU-1\u{202e}fdp.exe", "note": "a\u{200b}b"}]});
        let text = render_call(&trace, &Ok(value));
        assert!(
            !text.chars().any(cro_runtime::is_invisible_format),
            "{text:?}"
        );
        assert!(text.contains("GPU-1\\u{202e}fdp.exe"), "{text}");
        assert!(text.contains("a\\u{200b}b"), "{text}");
    }
}

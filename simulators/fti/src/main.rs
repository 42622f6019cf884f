//! `fabric-sim`: serves the FTI fabric simulator until interrupted and prints how to
//! reach it.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Parser;
use fabric_sim::setup::{DeviceSetup, MachineSetup, Setup};

#[derive(Parser, Debug)]
#[command(
    name = "fabric-sim",
    about = "Simulated Fujitsu FTI fabric (identity manager, Fabric Manager, Cluster Manager) on 127.0.0.1"
)]
struct Args {
    /// YAML or JSON setup file (machines, pools, ids, credentials); flags add to it.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// A machine: `UUID[=NAME]`, or `NAME` alone for a random uuid. Repeatable.
    #[arg(long = "machine", short = 'm')]
    machines: Vec<String>,
    /// Free devices: `TYPE:MODEL[:COUNT]`, e.g. `gpu:A100 40G:4`. Repeatable.
    #[arg(long = "pool", short = 'p')]
    pools: Vec<String>,
    /// A device attached from the start: `MACHINE_UUID_OR_NAME:TYPE:MODEL`. Repeatable.
    #[arg(long = "attached")]
    attached: Vec<String>,
    /// The tenant id the fabric APIs answer to (FTI_CDI_TENANT_ID); default: a random uuid.
    #[arg(long)]
    tenant: Option<String>,
    /// The Cluster Manager's cluster id (FTI_CDI_CLUSTER_ID); default: a random uuid.
    #[arg(long)]
    cluster: Option<String>,
    /// The identity manager's realm (the `realm` key of the credentials Secret).
    #[arg(long)]
    realm: Option<String>,
    /// Lifetime of an issued access token, in seconds (the `exp` the provider caches by).
    #[arg(long)]
    token_ttl_secs: Option<u64>,
    /// How long a Cluster Manager resize stays in progress, in milliseconds.
    #[arg(long)]
    cm_delay_ms: Option<u64>,
    /// Port of the HTTPS listener (what a provider talks to); default: any free port.
    #[arg(long)]
    https_port: Option<u16>,
    /// Port of the plain-HTTP listener (for tests of a provider refusing HTTP); default:
    /// any free port.
    #[arg(long)]
    http_port: Option<u16>,
    /// Where to write the CA certificate (default: a file in the system temp dir).
    #[arg(long)]
    ca_out: Option<PathBuf>,
    /// Print the connection details as one JSON object.
    #[arg(long)]
    json: bool,
}

fn parse_machine(spec: &str) -> MachineSetup {
    match spec.split_once('=') {
        Some((uuid, name)) => MachineSetup {
            uuid: Some(uuid.to_string()),
            name: name.to_string(),
            fabric_id: None,
            devices: Vec::new(),
        },
        None if uuid_like(spec) => MachineSetup {
            uuid: Some(spec.to_string()),
            name: spec.to_string(),
            fabric_id: None,
            devices: Vec::new(),
        },
        None => MachineSetup {
            uuid: None,
            name: spec.to_string(),
            fabric_id: None,
            devices: Vec::new(),
        },
    }
}

fn uuid_like(s: &str) -> bool {
    s.len() == 36 && s.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

fn parse_pool(spec: &str) -> Result<DeviceSetup> {
    let parts: Vec<&str> = spec.split(':').collect();
    let (res_type, model, count) = match parts.as_slice() {
        [t, m] => (*t, *m, 1),
        [t, m, n] => (
            *t,
            *m,
            n.parse()
                .with_context(|| format!("count in --pool {spec:?}"))?,
        ),
        _ => bail!("--pool wants TYPE:MODEL[:COUNT], got {spec:?}"),
    };
    Ok(DeviceSetup {
        res_type: res_type.to_string(),
        model: model.to_string(),
        count,
        fabric_id: None,
    })
}

fn build_setup(args: &Args) -> Result<Setup> {
    let mut setup = match &args.config {
        Some(path) => Setup::load(path)?,
        None => Setup::default(),
    };
    setup
        .machines
        .extend(args.machines.iter().map(|m| parse_machine(m)));
    for p in &args.pools {
        setup.pools.push(parse_pool(p)?);
    }
    for spec in &args.attached {
        let Some((machine, device)) = spec.split_once(':') else {
            bail!("--attached wants MACHINE:TYPE:MODEL, got {spec:?}");
        };
        let device = parse_pool(device)?;
        let Some(m) = setup
            .machines
            .iter_mut()
            .find(|m| m.name == machine || m.uuid.as_deref() == Some(machine))
        else {
            bail!("--attached names unknown machine {machine:?}");
        };
        m.devices.push(device);
    }
    // Random uuids are fixed here so the printed table matches the simulator.
    for m in &mut setup.machines {
        m.uuid
            .get_or_insert_with(|| uuid::Uuid::new_v4().to_string());
    }
    macro_rules! set {
        ($field:ident, $value:expr) => {
            if let Some(v) = $value {
                setup.$field = Some(v);
            }
        };
    }
    set!(tenant_id, args.tenant.clone());
    set!(cluster_id, args.cluster.clone());
    set!(realm, args.realm.clone());
    set!(token_ttl_secs, args.token_ttl_secs);
    set!(cm_delay_ms, args.cm_delay_ms);
    set!(https_port, args.https_port);
    set!(http_port, args.http_port);
    Ok(setup)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let setup = build_setup(&args)?;
    let sim = setup.start().context("starting the simulator")?;

    let ca_path = args.ca_out.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("fabric-sim-ca-{}.pem", sim.https_addr().port()))
    });
    std::fs::write(&ca_path, sim.ca_pem())
        .with_context(|| format!("writing the CA to {}", ca_path.display()))?;

    let creds = sim.credentials();
    let machines: Vec<serde_json::Value> = sim
        .machines()
        .iter()
        .map(|m| {
            let devices: Vec<serde_json::Value> = sim
                .machine_devices(&m.uuid)
                .iter()
                .map(|d| serde_json::json!({"serial": d.serial, "res_uuid": d.res_uuid, "type": d.res_type, "model": d.model}))
                .collect();
            serde_json::json!({"uuid": m.uuid, "name": m.name, "devices": devices})
        })
        .collect();
    if args.json {
        let info = serde_json::json!({
            "endpoint": sim.endpoint(),
            "http_endpoint": sim.http_endpoint(),
            "tenant_id": sim.tenant_id(),
            "cluster_id": sim.cluster_id(),
            "realm": sim.realm(),
            "credentials": creds,
            "ca_file": ca_path,
            "machines": machines,
        });
        println!("{info}");
    } else {
        println!("endpoint:      {}", sim.endpoint());
        println!("http endpoint: {}", sim.http_endpoint());
        println!("tenant:        {}", sim.tenant_id());
        println!("cluster:       {}", sim.cluster_id());
        println!("realm:         {}", sim.realm());
        println!("username:      {}", creds.username);
        println!("password:      {}", creds.password);
        println!("client_id:     {}", creds.client_id);
        println!("client_secret: {}", creds.client_secret);
        println!("ca file:       {}", ca_path.display());
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        for m in &machines {
            println!("machine:       {} {}", text(&m["uuid"]), text(&m["name"]));
            for d in m["devices"].as_array().into_iter().flatten() {
                println!(
                    "  device:      {} {} {} (res_uuid {})",
                    text(&d["serial"]),
                    text(&d["type"]),
                    text(&d["model"]),
                    text(&d["res_uuid"])
                );
            }
        }
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let _ = tokio::signal::ctrl_c().await;
    });
    sim.shutdown();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_build_a_setup() {
        let args = Args::parse_from([
            "fabric-sim",
            "-m",
            "w0",
            "-m",
            "6f1c2a9e-0000-4000-8000-000000000001=w1",
            "-p",
            "gpu:A100 40G:3",
            "--attached",
            "w1:gpu:A100 40G",
            "--tenant",
            "t1",
        ]);
        let setup = build_setup(&args).unwrap();
        assert_eq!(setup.tenant_id.as_deref(), Some("t1"));
        assert_eq!(setup.pools[0].count, 3);
        assert_eq!(setup.machines[1].devices[0].model, "A100 40G");
        assert!(setup.machines[0].uuid.is_some());
        assert!(parse_pool("gpu").is_err());
        assert!(build_setup(&Args::parse_from(["fabric-sim", "--attached", "x:gpu:m"])).is_err());
    }
}

#[cfg(test)]
mod help_tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn every_flag_is_described_in_the_help() {
        let undocumented: Vec<String> = Args::command()
            .get_arguments()
            .filter(|a| a.get_help().is_none())
            .map(|a| a.get_id().to_string())
            .collect();
        assert_eq!(undocumented, Vec::<String>::new());
    }
}

//! `cdim-sim`: serves the NEC CDIM simulator until interrupted and prints how to reach
//! it, as the Go operator's environment names it.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use cdim_sim::{CdimSim, SimConfig};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "cdim-sim",
    about = "Simulated NEC CDI Manager on 127.0.0.1: configuration manager and layout-apply service (docs/nec-provider.md)"
)]
struct Args {
    /// A node, by id (a Kubernetes Node's spec.providerID names it). Repeatable.
    #[arg(long = "node", short = 'n')]
    nodes: Vec<String>,
    /// Free GPUs: `MODEL[:COUNT]`. Repeatable.
    #[arg(long = "gpu")]
    gpus: Vec<String>,
    /// How long a layout apply runs.
    #[arg(long, default_value_t = 2000)]
    apply_delay_ms: u64,
    #[arg(long, default_value_t = 0)]
    configuration_manager_port: u16,
    #[arg(long, default_value_t = 0)]
    layout_apply_port: u16,
    /// Print the connection details as one JSON object.
    #[arg(long)]
    json: bool,
}

fn model_count(spec: &str) -> Result<(String, usize)> {
    match spec.rsplit_once(':') {
        Some((model, n)) if !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) => Ok((
            model.to_string(),
            n.parse().with_context(|| format!("count in {spec}"))?,
        )),
        _ if spec.is_empty() => bail!("an empty model"),
        _ => Ok((spec.to_string(), 1)),
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let sim = CdimSim::start(SimConfig {
        apply_delay: Duration::from_millis(args.apply_delay_ms),
        configuration_manager_port: args.configuration_manager_port,
        layout_apply_port: args.layout_apply_port,
    })?;
    for n in &args.nodes {
        sim.add_node_with_id(n);
    }
    for spec in &args.gpus {
        let (model, n) = model_count(spec)?;
        for _ in 0..n {
            sim.add_gpu(&model);
        }
    }
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "NEC_CDIM_IP": sim.ip(),
                "CONFIGURATION_MANAGER_PORT": sim.configuration_manager_port(),
                "LAYOUT_APPLY_PORT": sim.layout_apply_port(),
            })
        );
    } else {
        println!(
            "CDIM at NEC_CDIM_IP={} CONFIGURATION_MANAGER_PORT={} LAYOUT_APPLY_PORT={}",
            sim.ip(),
            sim.configuration_manager_port(),
            sim.layout_apply_port()
        );
    }
    // Serves on its own threads until the process is interrupted.
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_counts() {
        assert_eq!(model_count("A100:3").unwrap(), ("A100".into(), 3));
        assert_eq!(model_count("H100:x").unwrap(), ("H100:x".into(), 1));
        assert!(model_count("").is_err());
    }
}
